"""The working scale: bounds, (private) centring, standardisation and whitening, and the exact back-transform.

DP-2S-GD's step sizes and clipping thresholds are stated for isotropic data of unit scale
(the paper assumes E[zzᵀ] = I). dpivreg runs the engine on transformed columns and maps the
estimate back exactly, so the estimand (the 2SLS coefficient on the original data) is unchanged.

Three routes (``fit(preprocess=...)``)
--------------------------------------
``"bounds"``
    Every column is clipped to its public bounds [lo, hi] and divided by max(abs(lo), abs(hi)).
    Nothing is read from the data, no budget is spent.
``"private"``
    (default) Every column is clipped to its bounds and mapped to [−1, 1] by its midpoint and
    half-range; one Gaussian release of the second moments of these rows (with a leading constant
    when the model has an intercept or a bound is not symmetric about 0) is paid for with ρ0 (the
    box mechanism of :func:`dpivreg.privacy.mechanisms.box_second_moments`, sensitivity D/n). Its block of the
    constant and the instruments is floored at the release's noise (:meth:`ReleasedMoments.floor`,
    :func:`dpivreg.estimation.moments.floor_at_noise`), and from the floored release, by post-processing only: column
    means (used to centre when the model has an intercept, which absorbs the shift), column scales, and the
    instruments' covariance, used to whiten them so that E[z̃z̃ᵀ] ≈ I. The same floored release, mapped to the
    working scale, gives the iteration's warm start (:meth:`ReleasedMoments.solvable`).
``"data"``
    The same transformations from the exact (non-private) moments: the paper's practice, kept
    for reproduction; it raises a PrivacyLeakWarning.

The transformation
------------------
With the constant column (if any) left untouched::

    ỹ = (y − c_y)/s_y,   X̃ = (X − c_X) A_X,   Z̃ = (Z − c_Z) A_Z,

where Z = [exog, instruments], X = [exog, endog], A_Z is block upper triangular (the whitened
exogenous columns depend on the exogenous columns only, so X̃ and Z̃ still share them exactly)
and A_X acts on the exogenous block like A_Z and scales the endogenous columns. If the working
fit is ỹ ≈ X̃ b̃ and X̃_endog ≈ Z̃ Θ̃, then on the original scale::

    β = s_y A_X b̃, except the constant's coefficient, which gains (c_y − c_Xᵀβ)/v,
    Θ = A_Z Θ̃ diag(s_endog), except the constant's row, which gains (c_endog − c_Zᵀ Θ)/v,

with v the constant's value. This is exact: 2SLS is equivariant under these maps.
Centring is only done when the model has a constant; without one, a shift would change the
estimand, so only scaling and (uncentred) whitening are applied.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping

import numpy as np
import pandas as pd

from dpivreg._validation import check_rho
from dpivreg.compute.backends import BuiltRows, InMemoryRows, RowSource, is_dask_collection, map_row_blocks
from dpivreg.compute.kernels import mapped_columns, numba_available, working_rows
from dpivreg.data.bounds import resolve_bounds
from dpivreg.data.checks import CHECK_DATA_LEAK, warn_findings
from dpivreg.data.columns import column_checksum
from dpivreg.data.design import IVDesign
from dpivreg.errors import DATA_CHECK_NOTE, PrivacyLeakWarning
from dpivreg.estimation.engine import row_source
from dpivreg.estimation.moments import FLOOR, NOISE_FLOOR, floor_at_noise, floor_spectrum
from dpivreg.privacy.accounting import Release
from dpivreg.privacy.mechanisms import box_moment_sensitivity, box_moment_sum, release_moment_sum
from dpivreg.privacy.rounding import box_rounding
from dpivreg.privacy.units import PrivacyUnits, RowGroups, UnitFacts

__all__ = ["WorkingScale", "ReleasedMoments", "PREPROCESS_ROUTES", "validate_bounds", "working_scale",
           "repeat_moment_release", "free_columns", "n_free_instruments", "box_columns"]

PREPROCESS_ROUTES = ("private", "bounds", "data")
Bounds = Mapping[str, tuple[float, float]]


@dataclass(frozen=True)
class ReleasedMoments:
    """The second moments released on the box scale, and the affine map of their rows to the working scale.

    Attributes
    ----------
    matrix : ndarray (D, D)
        The released moments of the rows [1, v] (v: the non-constant columns of :func:`free_columns`
        mapped to [−1, 1] by their bounds), with the constant's own entry set to its known value 1. When
        the release had no constant column (no intercept and every bound symmetric about 0), the first
        row and column are those of the (unreleased) constant: 1 and zeros, never used.
    sigma : float
        Noise standard deviation of each released entry (0 for exact moments); public.
    released_constant : bool
        Whether the release included the constant column.
    working_map : ndarray (q + p_endog + 1, D)
        L with [Z̃, X̃_endog, Ỹ]ᵢ = L·[1, vᵢ] for every row: the released moments on the working
        scale are L M Lᵀ (:meth:`working`).
    instrument_block : int
        The size of the leading block of ``matrix`` that holds the constant and the instruments (exogenous and
        excluded): the block every solve inverts, floored at the noise (:meth:`floor`).
    rows_per_unit : float
        k̂, the mean number of rows per privacy unit: 1 at row level; with privacy units (:mod:`dpivreg.privacy.units`)
        the released constant's own entry of the per-unit sums, by which the release was divided (``matrix`` is
        then per row, its constant entry 1 and ``sigma`` the noise of the divided entries; k̂ is treated as known
        in the noise simulations, a common factor that 2SLS on the moments does not depend on).
    """

    matrix: np.ndarray
    sigma: float
    released_constant: bool
    working_map: np.ndarray = field(repr=False)
    instrument_block: int
    rows_per_unit: float = 1.0

    def working(self, moments: np.ndarray | None = None) -> np.ndarray:
        """L M Lᵀ: second moments of [Z̃, X̃_endog, Ỹ] from the released (or given, stacked (…, D, D)) box-scale
        moments, mapped as they are (linear: also for noise alone). Solves use :meth:`solvable`."""
        M = self.matrix if moments is None else moments
        L = self.working_map
        return L @ M @ L.T

    @cached_property
    def floored(self) -> np.ndarray:
        """The release with its instruments' block floored at its noise (:meth:`floor`): the moments every solve and
        the working scale's whitening use, and the centre of the plug-in worlds. Post-processing; the release
        itself when σ = 0."""
        return self.floor(self.matrix)

    def floor(self, moments: np.ndarray, sigma: float | None = None) -> np.ndarray:
        """Box-scale moments (…, D, D) released with noise ``sigma`` (default the release's σ) with the block of the
        constant and the instruments floored at the noise (:func:`dpivreg.estimation.moments.floor_at_noise`)."""
        return floor_at_noise(moments, self.sigma if sigma is None else sigma, self.instrument_block)

    def solvable(self, moments: np.ndarray | None = None, *, sigma: float | None = None) -> np.ndarray:
        """Working-scale moments to solve: L·F(M)·Lᵀ with F the floor at the noise (:meth:`floor`), of the release or
        of given box-scale moments (…, D, D) released with noise ``sigma`` (default the release's σ)."""
        if moments is None:
            return self.working(self.floored)
        return self.working(self.floor(moments, sigma))

    def plausible_instruments(self, noise: np.ndarray) -> np.ndarray:
        """Box-scale moments of the constant and the instruments (the leading :attr:`instrument_block`) the data could
        have, given the release: F − E for draws E (…, D, D) of its noise, F the release floored at it (the estimate
        every solve uses), with their eigenvalues raised to 10⁻⁶ of the largest (a Gram matrix is positive
        semi-definite; the small margin keeps each plug-in world's 2SLS solution unique). Shape (…, b, b)."""
        b = self.instrument_block
        truth = self.floored[:b, :b] - noise[..., :b, :b]
        return floor_spectrum(truth, FLOOR)

    def working_instruments(self, moments: np.ndarray, q: int) -> np.ndarray:
        """Z̃ᵀZ̃/n (…, q, q) from box-scale moments (…, b, b) of the constant and the instruments (Z̃'s q columns lead
        the working columns, and each is a combination of the constant and the instruments alone)."""
        L = self.working_map[:q, :self.instrument_block]
        return L @ moments @ L.T

    def noise_draws(self, rng: np.random.Generator, replications: int, sigma: float | None = None) -> np.ndarray:
        """Draws (replications, D, D) of the release's noise: symmetric, N(0, σ²) on the upper triangle of
        every entry the release noised (none on the constant's own entry, which is known); ``sigma``
        overrides σ (e.g. the noise a release with another budget would have)."""
        D = self.matrix.shape[0]
        sigma = self.sigma if sigma is None else sigma
        upper = np.triu(rng.standard_normal((replications, D, D)) * sigma)
        E = upper + np.swapaxes(np.triu(upper, 1), 1, 2)
        E[:, 0, 0] = 0.0
        if not self.released_constant:
            E[:, 0, :] = 0.0
            E[:, :, 0] = 0.0
        return E


@dataclass(frozen=True)
class WorkingScale:
    """The affine map from the design to the engine's working arrays, and its exact inverse.

    Attributes
    ----------
    route : str
        ``"private"``, ``"bounds"`` or ``"data"``.
    bound_scales : pandas.Series
        Per column, the divisor of the bounded scale: the half-range (hi − lo)/2 on the routes that release
        moments, max(abs(lo), abs(hi)) on route "bounds"; from the data when no bounds were given (a
        leak); 1 for the constant.
    bound_centres : pandas.Series
        Per column, the midpoint (lo + hi)/2 subtracted before dividing by ``bound_scales`` on the routes
        that release moments (0 on route "bounds", for data-derived bounds and for the constant).
    source : pandas.Series
        Where each column's bound came from: ``"bounds"``, ``"data"`` or ``"constant"``.
    clipped_values : pandas.Series
        NON-PRIVATE diagnostic: number of values clipped to the bounds, per column.
    y_center, y_scale : float
        c_y and s_y.
    x_center, A_x : ndarray
        c_X (p,) and A_X (p, p) over the regressors [exog, endog].
    z_center, A_z : ndarray
        c_Z (q,) and A_Z (q, q) over the instruments [exog, instruments].
    constant_index : int or None
        Position of the constant column among the exogenous columns.
    constant_value : float
        Its value v.
    Z, X_endog, Y : ndarray
        NON-PRIVATE: the working arrays fed to the engine, i.e. the data themselves (affinely mapped): Z̃
        (n, q), X̃'s endogenous columns (n, p − n_exog) and Ỹ (n,). X̃'s exogenous columns are Z̃'s first
        ``n_exog`` columns, so they are not held twice; :attr:`X` assembles X̃ when asked. For an in-memory
        design at row level they are not held at all (:class:`WorkingRows`): each pass builds them a block of
        rows at a time from the design's columns, and these attributes build new arrays when read.
    n_exog : int
        Number of exogenous columns leading Z and X.
    units : UnitFacts or None
        The privacy unit and clusters (public facts), None for row-level privacy without clusters.
    groups : RowGroups or None
        PRIVATE: the rows' units and clusters (contiguous in the working arrays, which are then reordered).
    n_eff : float or None
        With privacy units: n̂ = N·k̂, the public normaliser (:attr:`n`).
    releases : tuple of Release
        Privacy releases made while building the scale (the moments, on route "private").
    z_names : tuple of str
        The instruments' names, in the order of the columns of Z.
    moments : ReleasedMoments or None
        The moment release (exact on route "data") and its map to the working scale; None on route
        "bounds".
    """

    route: str
    bound_scales: pd.Series
    source: pd.Series
    clipped_values: pd.Series
    y_center: float
    y_scale: float
    x_center: np.ndarray
    A_x: np.ndarray
    z_center: np.ndarray
    A_z: np.ndarray
    constant_index: int | None
    constant_value: float
    held: tuple | None = field(repr=False)  # (Z̃, X̃_endog, Ỹ) when held whole (Dask, privacy units), else None
    streamed: WorkingRows | None = field(default=None, repr=False)  # builds them a block at a time otherwise
    n_exog: int = 0
    releases: tuple[Release, ...] = ()
    z_names: tuple[str, ...] = ()
    bound_centres: pd.Series | None = None
    moments: ReleasedMoments | None = None
    built_checked: bool = field(default=False, repr=False)  # in-memory arrays checked while they were built
    checked_data: bool = False  # fit(check_data=True): it ran because the data checks passed (a leak)
    bound_notes: tuple[str, ...] = ()  # where bounds came from besides the user's design columns (public)
    units: UnitFacts | None = None
    groups: RowGroups | None = field(default=None, repr=False)
    n_eff: float | None = None

    def rows(self) -> RowSource:
        """The working arrays as a :class:`~dpivreg.compute.backends.RowSource` for the fit's passes (call ``close()``).

        In-memory working arrays are built finite, contiguous and with X̃'s exogenous columns equal to Z̃'s
        (:func:`working_scale`), so they are not checked again on every pass; other arrays go through
        :func:`dpivreg.estimation.engine.row_source`'s checks. With privacy units or clusters the source carries the
        rows' grouping and the public normaliser :attr:`n`.
        """
        grouping = dict(groups=self.groups, n=self.n, n_units=self.n_units,
                        max_rows=self.units.max_rows if self.unit_level else 1)
        if self.streamed is not None:
            return BuiltRows(self.streamed.block, self.streamed.nobs, self.q)
        if self.built_checked:
            return InMemoryRows(self.Z, self.X_endog, self.Y, **grouping)

        return row_source(self.Z, self.X, self.Y, self.n_exog, grouping=grouping)[0]

    def arrays(self) -> tuple:
        """NON-PRIVATE: (Z̃, X̃_endog, Ỹ) whole, for reading: the held arrays, or new ones built from the design."""
        return self.held if self.streamed is None else self.streamed.arrays()

    @property
    def Z(self) -> np.ndarray:
        """NON-PRIVATE: Z̃ (n, q) (see the class docstring; built anew at every access when streamed)."""
        return self.arrays()[0]

    @property
    def X_endog(self) -> np.ndarray:
        """NON-PRIVATE: X̃'s endogenous columns (n, p − n_exog) (built anew at every access when streamed)."""
        return self.arrays()[1]

    @property
    def Y(self) -> np.ndarray:
        """NON-PRIVATE: Ỹ (n,) (built anew at every access when streamed)."""
        return self.arrays()[2]

    @property
    def nobs(self) -> int:
        """The rows of the working arrays."""
        return int(self.streamed.nobs if self.streamed is not None else self.held[0].shape[0])

    @property
    def q(self) -> int:
        """Number of instruments q (exogenous and excluded): Z̃'s columns."""
        return int(self.A_z.shape[1])

    @property
    def n(self) -> float:
        """The public normaliser of the releases' sums: the row count, or with privacy units n̂ = N·k̂ (the number of
        units times the released mean rows per unit, :mod:`dpivreg.privacy.units`), a float."""
        return float(self.n_eff) if self.n_eff is not None else self.nobs

    @property
    def n_units(self) -> int:
        """The public number of privacy units (the rows at row level)."""
        return int(self.units.n_units) if self.units is not None else self.nobs

    @property
    def unit_level(self) -> bool:
        """Whether the fit protects privacy units of several rows (not rows)."""
        return self.units is not None and not self.units.row_level

    @property
    def X(self) -> np.ndarray:
        """NON-PRIVATE: the working regressors X̃ = [Z̃'s exogenous columns, X̃_endog], (n, p), for reading: a new
        array at every access (lazy on Dask), ``X_endog`` itself without exogenous columns. The fit never
        needs it whole."""
        Z, X_endog, _ = self.arrays()
        if self.n_exog == 0:
            return X_endog
        if is_dask_collection(Z):
            import dask.array as da  # noqa: PLC0415 - dask is optional

            return da.concatenate([Z[:, :self.n_exog], X_endog], axis=1)
        return np.concatenate([Z[:, :self.n_exog], X_endog], axis=1)

    @property
    def p(self) -> int:
        """Number of regressors p (exogenous and endogenous)."""
        return int(self.A_x.shape[1])

    @property
    def leaked_columns(self) -> list[str]:
        """Columns whose bound (scale) was read from the data."""
        return list(self.source.index[self.source == "data"])

    @property
    def moment_noise_std(self) -> float:
        """Noise standard deviation σ of each entry of the moment release (0 when exact or absent)."""
        return 0.0 if self.moments is None else self.moments.sigma

    def beta_to_original(self, beta_working: np.ndarray) -> np.ndarray:
        """Map working coefficients b̃ (…, p) to the original units (see the module docstring)."""
        beta = self.y_scale * np.asarray(beta_working) @ self.A_x.T
        if self.constant_index is not None:
            shift = (self.y_center - beta @ self.x_center) / self.constant_value
            beta = beta.copy()
            beta[..., self.constant_index] += shift
        return beta

    def instrument_moment_draws(self, rng: np.random.Generator, replications: int) -> np.ndarray:
        """Plausible true values of Z̃ᵀZ̃/n given the noisy moment release, shape (replications, q, q).

        The working instruments were whitened with the *released* moments (floored at their noise), so Z̃ᵀZ̃/n = I
        only up to the release's noise: with E a draw of that noise (its distribution is public), the true moments
        on the release's scale are F − E (F the release floored at its noise), projected onto the positive
        semi-definite matrices (:meth:`ReleasedMoments.plausible_instruments`), and on the working scale L(F − E)Lᵀ.
        Post-processing. Exact (the released moments, ≈ I) when σ = 0.
        """
        q = self.A_z.shape[0]
        if self.moments is None:
            return np.broadcast_to(np.eye(q), (replications, q, q)).copy()
        truths = self.moments.plausible_instruments(self.moments.noise_draws(rng, replications))
        return self.moments.working_instruments(truths, q)

    def beta_jacobian(self) -> np.ndarray:
        """J with β = J β̃ + constant: the (affine) back-transform's linear part, (p, p)."""
        p = self.A_x.shape[0]
        origin = self.beta_to_original(np.zeros(p))
        return self.beta_to_original(np.eye(p)).T - origin[:, None]

    def theta_to_original(self, theta_working: np.ndarray) -> np.ndarray:
        """Map a working endogenous first stage Θ̃ (…, q, p_endog) to the original units."""
        k = self.n_exog
        s_endog = 1.0 / np.diag(self.A_x)[k:]
        theta = np.einsum("ij,...jk->...ik", self.A_z, np.asarray(theta_working)) * s_endog
        if self.constant_index is not None:
            endog_centers = self.x_center[k:]
            shift = (endog_centers - np.einsum("j,...jk->...k", self.z_center, theta)) / self.constant_value
            theta = theta.copy()
            theta[..., self.constant_index, :] += shift
        return theta


# ----------------------------------------------------------------------------------------
# bounds
# ----------------------------------------------------------------------------------------
def validate_bounds(bounds: Bounds | None, design: IVDesign) -> dict[str, tuple[float, float]]:
    """The (lower, upper) pair of every bounded design column (:func:`dpivreg.data.bounds.resolve_bounds`: design
    columns, a codebook over the data's columns, carried and automatic bounds).

    Raises
    ------
    TypeError
        ``bounds`` is not a mapping, or a value is not a pair of numbers.
    ValueError
        A name that is neither a design nor a data column, a non-finite bound, or lo >= hi.
    """
    return resolve_bounds(bounds, design).bounds


def box_columns(names: list, bounds: dict[str, tuple[float, float]], constant: str | None, *, centred: bool,
                data_largest: Mapping[str, float]) -> tuple[pd.Series, pd.Series, pd.Series, dict]:
    """Per column: the centre and scale of the bounded scale, where the bound came from, and (lo, hi).

    ``centred`` (routes that release moments): [lo, hi] maps to [−1, 1], centre (lo + hi)/2 and scale
    (hi − lo)/2. Otherwise (route "bounds") centre 0 and scale max(abs(lo), abs(hi)). A column without
    bounds gets centre 0 and scale ``data_largest[column]``, its largest absolute value (a leak); the
    constant centre 0 and scale 1.
    """
    centres, scales, source, limits = {}, {}, {}, {}
    for name in names:
        limits[name] = (-math.inf, math.inf)
        if name == constant and name not in bounds:
            centres[name], scales[name], source[name] = 0.0, 1.0, "constant"
        elif name in bounds:
            lo, hi = limits[name] = bounds[name]
            if centred:
                centres[name], scales[name] = (lo + hi) / 2.0, (hi - lo) / 2.0
            else:
                centres[name], scales[name] = 0.0, max(abs(lo), abs(hi))
            source[name] = "bounds"
        else:
            largest = float(data_largest[name])
            centres[name], scales[name], source[name] = 0.0, (largest if largest > 0 else 1.0), "data"
    return (pd.Series(centres, name="bound centre", dtype=float), pd.Series(scales, name="bound scale", dtype=float),
            pd.Series(source, name="source", dtype=object), limits)


# ----------------------------------------------------------------------------------------
# the moment release and its post-processing
# ----------------------------------------------------------------------------------------
def release_constant(has_constant: bool, centres: np.ndarray) -> bool:
    """Whether the moment release includes a constant column: with an intercept (for the means) or when a
    bounded column is not centred at 0 (to undo the centring at the midpoint exactly). Public."""
    return bool(has_constant or np.any(centres != 0.0))


#: The accountant's name for the exact data moments of route "data" (a release without noise, rho = inf).
EXACT_MOMENTS_RELEASE = "second moments of the columns, exact (preprocess='data'; NOT private)"


def moments_from_sum(outer_sum: np.ndarray, n: float, *, with_constant: bool, route: str, rho: float,
                     rng: np.random.Generator, max_rows: int | None = None
                     ) -> tuple[np.ndarray, Release | None, float, float]:
    """The moment matrix of [1, u] from Σ uuᵀ of the rows [1, u] (or u), released with noise on route
    "private" (box mechanism) or exact on route "data".

    ``max_rows`` (privacy units, :mod:`dpivreg.privacy.units`): ``n`` is the number of units N, replacing a unit
    replaces at most ``max_rows`` = m rows, so the sensitivity is m·D/N; the release (which must hold the constant) is
    then divided by its constant's own entry k̂ (the released mean rows per unit, clipped to [1, m]), which puts it per
    row. Returns (M, release or None, σ, k̂) with M of size (d + 1, d + 1) whatever ``with_constant`` (see
    :class:`ReleasedMoments`), M[0, 0] = 1, σ the noise of M's entries, k̂ = 1 at row level.
    """
    d = outer_sum.shape[0] - with_constant
    dim = d + with_constant
    if route == "data":
        # the exact moments are a release without noise: recorded as one (rho = inf), so that the accountant, the
        # summary and any record say the fit is not private, not "rho = 0"
        M, sigma = outer_sum / n, 0.0
        release = Release.unnoised(EXACT_MOMENTS_RELEASE, "rho0")
    else:
        name = "second moments of the bounded columns (box)"
        if max_rows is not None:
            name += f", per unit of at most {max_rows} rows"
        # the sum runs over at most N·m rows (n·1 at row level), in blocks added pairwise (dpivreg.privacy.rounding)
        changed = max_rows or 1
        M, release, sigma = release_moment_sum(outer_sum, n, rho=rho, rng=rng,
                                               sensitivity=changed * box_moment_sensitivity(dim, n), bound=1.0,
                                               name=name, rounding=box_rounding(int(n) * changed, dim, changed))
    rows_per_unit = 1.0
    if max_rows is not None:
        if not with_constant:
            raise ValueError("internal error: a per-unit moment release must hold the constant. "
                             "Please report this bug.")
        rows_per_unit = _rows_per_unit(M[0, 0], max_rows)
        M, sigma = M / rows_per_unit, sigma / rows_per_unit
    full = np.zeros((d + 1, d + 1))
    if with_constant:
        full[:, :] = M
    else:
        full[1:, 1:] = M
    full[0, 0] = 1.0
    return full, release, sigma, rows_per_unit


def _rows_per_unit(released: float, max_rows: int) -> float:
    """k̂: the released mean rows per unit (the constant's own entry of a per-unit moment release) clipped to [1, m],
    where the truth lies (post-processing)."""
    return float(min(max(released, 1.0), max_rows))


def moment_units(largest: np.ndarray, rho: float) -> np.ndarray:
    """Column units of the moment computation: 1 for a release, max |v| (or 1 if 0) when exact.

    Exact moments are computed on the columns u = v/unit (max |u| = 1) and the unit is folded into the
    column's scale, so that absurdly loose bounds (entries ~1e-200, squares underflowing) stay exact. The
    private release must use the box scale itself: its sensitivity is stated there.
    """
    if not math.isinf(rho):
        return np.ones(largest.shape[0])
    return np.where(largest > 0, largest, 1.0)


def _moment_summary(M: np.ndarray, *, has_constant: bool, offsets: np.ndarray, n_instruments: int, sigma: float):
    """Means (zeros without a constant), scales and the instruments' correlation matrix, in v-units.

    M is the moment matrix of [1, v] with the block of the constant and the instruments floored at its noise
    (:attr:`ReleasedMoments.floored`), so the instruments' covariance below has eigenvalues at or above the floor
    (a Schur complement of the floored block) and the whitening agrees with every solve on the working scale; the
    other columns' variances are floored at the same level, :data:`dpivreg.estimation.moments.NOISE_FLOOR`·σ. With a
    constant the covariance is M_vv − m mᵀ/M₀₀ and the means m/M₀₀ (M₀₀ = 1 up to the floor); without one the uncentred
    second moments of v + ``offsets`` (= w/scale, the column over its bound scale). A relative floor of 10⁻¹⁰
    guards against rounding only.
    """
    weight = M[0, 0]
    m = np.clip(M[0, 1:] / weight, -1.0, 1.0)
    if has_constant:
        means, second = m, M[1:, 1:] - weight * np.outer(m, m)
    else:
        a = offsets
        means = np.zeros_like(m)
        second = M[1:, 1:] + weight * (np.outer(m, a) + np.outer(a, m) + np.outer(a, a))
    tiny = 1e-10 * max(float(np.max(np.diag(second))) if second.size else 0.0, 1e-300)
    scales = np.sqrt(np.maximum(np.diag(second), max(NOISE_FLOOR * sigma, tiny)))
    z_cov = floor_spectrum(second[:n_instruments, :n_instruments], 1e-10) if n_instruments else second[:0, :0]
    z_scales = scales[:n_instruments]
    return means, scales, z_cov / np.outer(z_scales, z_scales)


def _whitening(cov: np.ndarray) -> np.ndarray:
    """A with Aᵀ cov A = I, block upper triangular so that each output uses only the inputs up to it
    (the exogenous columns lead): A = L⁻ᵀ from the Cholesky factor cov = L Lᵀ."""
    L = np.linalg.cholesky(cov)
    return np.linalg.solve(L.T, np.eye(cov.shape[0]))


# ----------------------------------------------------------------------------------------
# the working scale
# ----------------------------------------------------------------------------------------
def working_scale(design: IVDesign, bounds: Bounds | None, *, route: str = "bounds", rho0: float = math.inf,
                  rng: np.random.Generator | None = None, units: PrivacyUnits | None = None,
                  check_data: bool = False) -> WorkingScale:
    """Build the working arrays for the engine and the exact back-transform.

    Parameters
    ----------
    design : IVDesign
        The model's design (a Dask design gives lazy Dask working arrays, see :mod:`dpivreg.data.dask_design`).
    bounds : dict, optional
        Public (lower, upper) bounds by design column name.
    route : {"bounds", "private", "data"}
        See the module docstring.
    rho0 : float
        zCDP budget of the moment release (route "private").
    rng : numpy.random.Generator
        Source of the release's noise (route "private").
    units : PrivacyUnits, optional
        The privacy unit and clusters (:mod:`dpivreg.privacy.units`): the working arrays hold the rows it keeps, in its
        order (clusters and units contiguous); with privacy units the moment release sums per unit (sensitivity
        m·D/N, the constant always released) and is divided by its k̂, which gives the normaliser n̂ = N·k̂.
    """
    if route not in PREPROCESS_ROUTES:
        raise ValueError(f"preprocess must be one of {PREPROCESS_ROUTES}, got {route!r}.")
    unit_level = units is not None and not units.row_level
    if unit_level and route == "bounds":
        raise ValueError("preprocess='bounds' makes no moment release, and with privacy_unit the fit needs one: its "
                         "constant entry gives the mean number of rows per unit, which normalises every release. Use "
                         "preprocess='private' (the default).")
    resolved = resolve_bounds(bounds, design)
    bounds = resolved.bounds
    if route == "private":
        rho0 = check_rho(rho0, "rho0")
    rng = rng if rng is not None else np.random.default_rng()
    names = design.column_names
    constant = design.constant_name  # declared, never inferred from the values (public)
    if design.nobs == 0:
        raise ValueError("the design has no rows; the working scale needs observations.")
    # NON-PRIVATE: read only for the scale of columns without bounds (a labelled leak), the exact route's units
    # and the declared constant's value; no private release depends on them
    minimum, maximum = design.column_range
    largest = dict(zip(names, np.maximum(np.abs(minimum), np.abs(maximum))))
    centre_s, scale_s, source, limits = box_columns(names, bounds, constant, centred=route != "bounds",
                                                    data_largest=largest)
    lo = np.array([limits[c][0] for c in names])
    hi = np.array([limits[c][1] for c in names])
    _act_on_findings(design, _bounds_findings(names, minimum, maximum, lo, hi), check_data)
    centres, scales = centre_s[names].to_numpy(), scale_s[names].to_numpy()
    free = free_positions(design, constant)
    rows = design if units is None else units.rows_of(design)  # the kept rows, units contiguous
    unit, with_constant, rho, moment_scales = None, False, math.inf, scale_s
    if route != "bounds":
        # max |clip(v)| per column is reached at the column's minimum or maximum (clip is monotone)
        ends = np.stack([np.clip(minimum, lo, hi), np.clip(maximum, lo, hi)])
        largest_v = np.max(np.abs((ends - centres) / scales), axis=0)
        rho = math.inf if route == "data" else rho0
        unit = moment_units(largest_v[free], rho)
        with_constant = unit_level or release_constant(constant is not None, centres[free])
        moment_scales = _with_units(scale_s, [names[j] for j in free], unit)
    counts, outer, checksum = rows.blockwise_sum(preprocess_block, lo, hi, centres, scales, free, unit, with_constant)
    if not getattr(design, "is_dask", False):
        # privacy units: the pass above read the kept rows only, so the whole design's checksum takes a pass of its own
        _check_unchanged(design, checksum if rows is design else design.blockwise_sum(column_checksum))
    _warn_heavy_clipping(names, counts, rows.nobs)
    moments, rows_per_unit = None, 1.0
    if route != "bounds":
        M, release, sigma, rows_per_unit = moments_from_sum(
            outer, units.facts.n_units if unit_level else design.nobs, with_constant=with_constant, route=route,
            rho=rho, rng=rng, max_rows=units.facts.max_rows if unit_level else None)
        moments = (M, release, sigma, with_constant)
    constant_value = float(minimum[1 + design.exog_names.index(constant)]) if constant is not None else 1.0
    maps = affine_maps(design, constant=constant, constant_value=constant_value, centres=centre_s,
                       scales=moment_scales, moments=moments)
    if maps["moments"] is not None:
        maps["moments"] = dataclasses.replace(maps["moments"], rows_per_unit=rows_per_unit)
    streamed = WorkingRows.of(design, lo, hi, maps) if units is None else None
    held = None if streamed is not None else _working_arrays(rows, lo, hi, maps)
    return WorkingScale(
        built_checked=not getattr(design, "is_dask", False), checked_data=check_data,
        bound_notes=tuple(resolved.notes()),
        route=route, bound_scales=scale_s, bound_centres=centre_s, source=source,
        clipped_values=pd.Series(dict(zip(names, counts)), name="clipped values (non-private)", dtype=np.int64),
        held=held, streamed=streamed, n_exog=len(design.exog_names), units=None if units is None else units.facts,
        groups=None if units is None else units.groups,
        n_eff=units.facts.n_units * rows_per_unit if unit_level else None, **maps,
    )


def _check_unchanged(design: IVDesign, checksum: np.ndarray) -> None:
    """Raise if the rows a fit reads are not those the design was built and checked on (NON-PRIVATE check): a
    design that shares the caller's columns sees writes into an array the caller's frame views
    (``DataFrame(array, copy=False)``), which pandas' copy-on-write cannot intercept."""
    changed = [name for name, now, then in zip(design.column_names, checksum, design.column_checksum) if now != then]
    if changed:
        raise ValueError(f"the data of column(s) {changed} changed after the model was built (a frame made with "
                         "DataFrame(array, copy=False) shares array's memory, and writes into array bypass pandas), "
                         "so the design's checks and its 2SLS benchmark no longer describe them. Build the model "
                         f"again from the final data, or from a copy of the frame. {DATA_CHECK_NOTE}")


#: Share of a column's values outside its bounds above which :func:`working_scale` warns.
MAX_CLIPPED_SHARE = 0.01


def _warn_heavy_clipping(names: list, counts: np.ndarray, nobs: int) -> None:
    """Warn when the bounds clip more than :data:`MAX_CLIPPED_SHARE` of a column's values (a NON-PRIVATE count,
    seen only by the data holder): bounds that tight change the estimand, bounds in the wrong units too."""
    heavy = [(name, int(count)) for name, count in zip(names, counts) if count > MAX_CLIPPED_SHARE * nobs]
    if heavy:
        listed = ", ".join(f"{name!r}: {count:,} of {nobs:,} ({count / nobs:.1%})" for name, count in heavy)
        warnings.warn(f"the bounds clip more than {MAX_CLIPPED_SHARE:.0%} of the values of {listed}. Clipping that "
                      "many changes what is estimated; check the bounds (their units?) against the codebook. "
                      "(These counts read the data: they are seen only by the data holder and are not a private "
                      "release.)", UserWarning, stacklevel=4)


def _bounds_findings(names: list, minimum: np.ndarray, maximum: np.ndarray, lo: np.ndarray,
                     hi: np.ndarray) -> list[str]:
    """The message for each column whose every value lies outside its bounds on one side: clipping makes it a
    constant (NON-PRIVATE finding of the column's range, :class:`dpivreg.errors.DataCheckWarning`)."""
    return [
        f"every value of column {name!r} lies {side} its bounds ({lower:g}, {upper:g}): clipping makes it the "
        f"constant {lower if side == 'below' else upper:g}, and the fit learns nothing from it. Check the bounds "
        f"(their units, or a typo). {DATA_CHECK_NOTE}"
        for name, lower, upper, side in (
            (name, lower, upper, "below" if top < lower else "above")
            for name, bottom, top, lower, upper in zip(names, minimum, maximum, lo, hi)
            if top < lower or bottom > upper)
    ]


def _act_on_findings(design: IVDesign, bound_findings: list[str], check_data: bool) -> None:
    """With ``check_data``: announce the leak and refuse on the design's findings or those of the bounds (the
    first of them). Otherwise warn the data holder of the bounds' findings (the design's were at build) and go on:
    whether a fit runs must not depend on one row."""
    findings = [*getattr(design, "data_findings", ()), *bound_findings]
    if not check_data:
        warn_findings(bound_findings, stacklevel=5)  # the user's fit(), through _fit_* and working_scale
        return
    if findings:
        warnings.warn(CHECK_DATA_LEAK, PrivacyLeakWarning, stacklevel=5)
        raise ValueError(f"{findings[0]} (check_data=True refuses on the findings of checks that read the data"
                         + (f"; {len(findings) - 1} more, each in a DataCheckWarning" if len(findings) > 1 else "")
                         + ".)")


def preprocess_block(block: np.ndarray, lo: np.ndarray, hi: np.ndarray, centres: np.ndarray, scales: np.ndarray,
                     free: list[int], unit: np.ndarray | None, with_constant: bool
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One block of design rows [dependent, exog, endog, instruments]: the values outside the bounds per column,
    (unless ``unit`` is None) Σ uuᵀ of the moment release's rows, u = (clip(v) − centre)/scale/unit over the free
    columns (the box mechanism then clips every entry to [−1, 1], a no-op within the bounds), and the rows'
    :func:`dpivreg.data.columns.column_checksum` (NON-PRIVATE: compared with the design's, never released)."""
    counts = np.count_nonzero((block < lo) | (block > hi), axis=0).astype(np.int64)
    checksum = column_checksum(block)
    if unit is None:
        return counts, np.zeros((0, 0)), checksum
    V = (np.clip(block[:, free], lo[free], hi[free]) - centres[free]) / (scales[free] * unit)
    return counts, box_moment_sum(V, with_constant), checksum


def _working_arrays(design, lo: np.ndarray, hi: np.ndarray, maps: dict):
    """Z̃, X̃_endog, Ỹ held whole: the design's columns clipped to their bounds and mapped by the working scale's
    affine maps (lazy Dask arrays for a Dask design; for an in-memory one filled block by block by
    :meth:`WorkingRows.arrays`, without a copy of the whole design). X̃'s exogenous columns are Z̃'s first k
    (:attr:`WorkingScale.X`)."""
    rows = WorkingRows.from_maps(design, lo, hi, maps)
    if getattr(design, "is_dask", False):
        import dask.array as da  # noqa: PLC0415 - dask is optional

        return mapped_columns(da.clip(design.values, lo, hi), *rows.mapping)
    return rows.arrays()


@dataclass(frozen=True)
class WorkingRows:
    """The working arrays of an in-memory design, built a block of rows at a time
    (:func:`dpivreg.compute.kernels.working_rows`: the design's columns clipped to their bounds and mapped). Streamed
    (:meth:`of`), they are never held whole: each pass builds its blocks, so a fit holds no copy of the data (the design
    itself shares the caller's columns, :func:`dpivreg.data.builders.plain_column_block`); :meth:`arrays` fills the
    arrays of fits that hold them. Building costs about 1.8 ms per 65,536 rows at q = 3 on one thread (numba;
    28 ms per 10⁶ rows), more than the generated kernel's pass over the built rows (4.4 ms per 10⁶ rows,
    :func:`dpivreg.compute.codegen.unrolled_source`).

    Every value is finite: the design held no NaN or infinity when it was built (its checks), :meth:`block`
    refuses rows that have become so since, and :meth:`of` declines (the arrays are then built whole and
    checked) unless the map's bound on every working value, from the clipped column ranges, is finite.
    """

    design: object  # IVDesign, or ReorderedDesign for held arrays (row_block, column_range)
    lo: np.ndarray
    hi: np.ndarray
    z_columns: np.ndarray
    z_center: np.ndarray
    A_z: np.ndarray
    endog_columns: np.ndarray
    endog_center: np.ndarray
    A_endog: np.ndarray
    y_center: float
    y_scale: float

    @classmethod
    def of(cls, design, lo: np.ndarray, hi: np.ndarray, maps: dict) -> "WorkingRows | None":
        """The streamed working rows of an in-memory ``design``; None for a Dask design, without numba (numpy's
        map per block would cost more than holding the arrays saves), or when the map could overflow."""
        if getattr(design, "is_dask", False) or not numba_available():
            return None
        rows = cls.from_maps(design, lo, hi, maps)
        return rows if rows.bounded() else None

    @classmethod
    def from_maps(cls, design, lo: np.ndarray, hi: np.ndarray, maps: dict) -> "WorkingRows":
        """The working rows of ``design`` (any design with ``row_block``) under the working scale's ``maps``."""
        pos, k = design.positions, len(design.exog_names)
        return cls(design, lo, hi, np.asarray(pos["z"], dtype=np.int64), np.asarray(maps["z_center"], dtype=float),
                   np.ascontiguousarray(maps["A_z"], dtype=float), np.asarray(pos["endog"], dtype=np.int64),
                   np.asarray(maps["x_center"][k:], dtype=float),
                   np.ascontiguousarray(maps["A_x"][k:, k:], dtype=float), float(maps["y_center"]),
                   float(maps["y_scale"]))

    @property
    def mapping(self) -> tuple:
        """The maps' arguments of :func:`dpivreg.compute.kernels.working_rows` after ``lo`` and ``hi``."""
        return (self.z_columns, self.z_center, self.A_z, self.endog_columns, self.endog_center, self.A_endog,
                self.y_center, self.y_scale)

    @property
    def nobs(self) -> int:
        """The design's rows."""
        return int(self.design.nobs)

    def bounded(self) -> bool:
        """Whether every working value is finite: abs(z̃ⱼ) ≤ Σᵢ abs(A_z[i, j])·max abs(clip(zᵢ) − cᵢ) over the clipped
        column ranges (NON-PRIVATE, :attr:`dpivreg.data.design.IVDesign.column_range`), and likewise for X̃_endog and
        Ỹ."""
        low, high = self.design.column_range
        low, high = np.clip(low, self.lo, self.hi), np.clip(high, self.lo, self.hi)
        with np.errstate(over="ignore", invalid="ignore"):
            bounds = [np.abs(A).T @ np.maximum(np.abs(low[columns] - centre), np.abs(high[columns] - centre))
                      for columns, centre, A in ((self.z_columns, self.z_center, self.A_z),
                                                 (self.endog_columns, self.endog_center, self.A_endog),
                                                 ([0], [self.y_center], np.array([[1.0 / self.y_scale]])))]
        return all(np.isfinite(bound).all() for bound in bounds)

    def block(self, rows: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Z̃, X̃_endog, Ỹ) of the design's rows ``rows``, new arrays; ValueError if a design value is not finite.

        The design was checked when it was built, and a fit compares the rows it reads with the design's
        :attr:`~dpivreg.data.design.IVDesign.column_checksum` in its first pass; but the design may share the caller's
        columns (:func:`dpivreg.data.builders.plain_column_block`), and a frame made with
        ``DataFrame(array, copy=False)`` passes on writes into ``array``, which pandas cannot see, at any time. A NaN or
        infinity written so would reach the sums (clipping would turn an infinity into a bound), hence this check before
        the clip."""
        raw = self.design.row_block(rows)
        if not np.isfinite(raw).all():
            raise ValueError("the design's rows are no longer finite, although they were checked when it was built: "
                             "its data changed since (a frame made with DataFrame(array, copy=False) shares "
                             "array's memory, and writes into array bypass pandas). Build the model again from the "
                             f"final data, or from a copy of the frame. {DATA_CHECK_NOTE}")
        return working_rows(raw, self.lo, self.hi, *self.mapping)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Z̃, X̃_endog, Ỹ) whole, new arrays (NON-PRIVATE; the held arrays of a fit that holds them, or for
        reading, e.g. ``res.scale.Z``); ValueError if a value is not finite (a map that overflows float64)."""
        n = self.nobs
        Z, X_endog, Y = np.empty((n, self.A_z.shape[1])), np.empty((n, self.A_endog.shape[1])), np.empty(n)

        def fill(rows: slice) -> bool:
            Z[rows], X_endog[rows], Y[rows] = self.block(rows)
            return bool(np.isfinite(Z[rows]).all() and np.isfinite(X_endog[rows]).all() and np.isfinite(Y[rows]).all())

        if not all(map_row_blocks(fill, n)):
            raise ValueError("the working arrays are not finite: the working scale's map overflows float64 (a "
                             "column of order 1e300 without bounds, or bounds near the float64 limit). Give public "
                             "bounds of the column's real range for every column, or rescale the data.")
        return Z, X_endog, Y


def _with_units(scales: pd.Series, free: list, unit: np.ndarray) -> pd.Series:
    """The scales of the moment computation's columns u = v/unit: scale·unit for the free columns."""
    scaled = scales.copy()
    scaled[free] = scales[free].to_numpy() * unit
    return scaled


def repeat_moment_release(design: IVDesign, scale: WorkingScale, *, rho: float, rng: np.random.Generator,
                          units: PrivacyUnits | None = None) -> WorkingScale:
    """A second, independent release (budget ``rho``) of the same box moments as ``scale``'s private release,
    combined with it by inverse-variance weights.

    Two Gaussian releases of one statistic with noise σ₁, σ₂ are, after this weighting, exactly one release
    with σ = (σ₁⁻² + σ₂⁻²)^(−1/2), i.e. at ρ₁ + ρ₂ (zCDP composes additively): nothing of the first release is
    wasted. The working scale (built from the first release) is kept; 2SLS on the moments does not depend on
    it. With privacy units (``units``, as for :func:`working_scale`) both releases are per-unit sums, combined
    before they are divided by the combined k̂ (which then also gives the normaliser n̂). Returns the scale with
    the combined moments and both records.
    """
    if scale.route != "private" or scale.moments is None:
        raise ValueError("a repeated moment release needs the private route's first release.")
    rho = check_rho(rho, "rho")
    constant = design.constant_name
    first = scale.moments
    centres, scales = scale.bound_centres, scale.bound_scales
    names = design.column_names
    free = free_positions(design, constant)
    d = len(names)
    lo, hi = np.full(d, -np.inf), np.full(d, np.inf)  # the release clips to [−1, 1], i.e. to the bounds
    rows = design if units is None else units.rows_of(design)
    unit_level = scale.unit_level
    _, outer, _ = rows.blockwise_sum(preprocess_block, lo, hi, centres[names].to_numpy(), scales[names].to_numpy(),
                                     free, np.ones(len(free)), first.released_constant)
    second, record, sigma, k2 = moments_from_sum(outer, scale.n_units if unit_level else design.nobs,
                                                 with_constant=first.released_constant, route="private", rho=rho,
                                                 rng=rng, max_rows=scale.units.max_rows if unit_level else None)
    record = dataclasses.replace(record, name=record.name + ", second release")
    # per unit (undivided) scale: each release times its k̂ (1 at row level, where the constant's entry is known)
    k1 = first.rows_per_unit
    raw_first, raw_second = first.matrix * k1, second * k2
    # inverse-variance weights in overflow-free form: the second release's share is σ₁²/(σ₁² + σ₂²), the combined
    # σ = σ₁σ₂/√(σ₁² + σ₂²) (a noiseless release, σ = 0, takes all the weight)
    s1, s2 = float(first.sigma) * k1, float(sigma) * k2
    ratio = s2 / s1 if s1 else math.inf
    share = 1.0 if s2 == 0 else 1.0 / (1.0 + ratio * ratio)  # ratio * ratio overflows to inf, ** would raise
    combined = raw_first + share * (raw_second - raw_first)
    joint = 0.0 if s1 == 0 or s2 == 0 else s1 * (s2 / math.hypot(s1, s2))
    k = _rows_per_unit(combined[0, 0], scale.units.max_rows) if unit_level else 1.0
    combined, joint = combined / k, joint / k
    combined[0, 0] = 1.0
    moments = ReleasedMoments(combined, joint, first.released_constant, first.working_map, first.instrument_block, k)
    return dataclasses.replace(scale, moments=moments, releases=(*scale.releases, record),
                               n_eff=scale.n_units * k if unit_level else scale.n_eff)


def free_columns(design: IVDesign, constant: str | None) -> list:
    """The non-constant columns in the order of the moment release: [exog, instruments, endog, dependent]."""
    return ([c for c in design.exog_names if c != constant] + list(design.instrument_names)
            + list(design.endog_names) + [design.dependent_name])


def free_positions(design: IVDesign, constant: str | None) -> list[int]:
    """Positions of :func:`free_columns` in the design's rows [dependent, exog, endog, instruments]."""
    index = {name: j for j, name in enumerate(design.column_names)}
    return [index[c] for c in free_columns(design, constant)]


def n_free_instruments(design: IVDesign, constant: str | None) -> int:
    """Number of non-constant columns of Z = [exog, instruments] (they lead :func:`free_columns`)."""
    return len(design.exog_names) - (constant is not None) + len(design.instrument_names)


def affine_maps(design: IVDesign, *, constant: str | None, constant_value: float, centres: pd.Series,
                scales: pd.Series, moments: tuple | None) -> dict:
    """The centres and linear maps of the working scale (every field of :class:`WorkingScale` that does not
    hold data), from the bounded scale (``centres``, ``scales``) and, off route "bounds", the moment release
    ``(M, release, sigma, released_constant)`` of [1, v] over :func:`free_columns`."""
    exog, endog = design.exog_names, design.endog_names
    dep = design.dependent_name
    k, p_endog = len(exog), len(endog)
    z_names, x_names = design.z_names, design.regressor_names
    const_idx = exog.index(constant) if constant is not None else None
    free = free_columns(design, constant)
    offsets = centres[free].to_numpy() / scales[free].to_numpy()
    if moments is None:
        means, unit_scales, z_corr = np.zeros(len(free)), np.ones(len(free)), None
    else:
        M, _, sigma, _ = moments
        n_z = n_free_instruments(design, constant)
        means, unit_scales, z_corr = _moment_summary(floor_at_noise(M, sigma, 1 + n_z),
                                                     has_constant=constant is not None, offsets=offsets,
                                                     n_instruments=n_z, sigma=sigma)
    index = {c: i for i, c in enumerate(free)}

    def center(c: str) -> float:  # original units; 0 (no centring) without a constant
        if c == constant or constant is None:
            return 0.0
        return float(centres[c] + scales[c] * means[index[c]])

    def scale(c: str) -> float:  # original units per working unit before whitening
        return 1.0 if c == constant else float(scales[c] * unit_scales[index[c]])

    # A_Z: diag(1/scale) then whitening of the non-constant instruments (exogenous first).
    q = len(z_names)
    A_z = np.zeros((q, q))
    z_free = [i for i, c in enumerate(z_names) if c != constant]
    D = np.diag([1.0 / scale(z_names[i]) for i in z_free])
    white = np.eye(len(z_free)) if z_corr is None else _whitening(z_corr)
    A_z[np.ix_(z_free, z_free)] = D @ white
    if constant is not None:
        A_z[const_idx, const_idx] = 1.0
    A_x = np.zeros((k + p_endog, k + p_endog))
    A_x[:k, :k] = A_z[:k, :k]
    A_x[k:, k:] = np.diag([1.0 / scale(c) for c in endog])
    maps = dict(
        y_center=center(dep), y_scale=scale(dep), x_center=np.array([center(c) for c in x_names]), A_x=A_x,
        z_center=np.array([center(c) for c in z_names]), A_z=A_z, constant_index=const_idx,
        constant_value=constant_value, releases=(), z_names=tuple(z_names), moments=None,
    )
    if moments is not None:
        M, release, sigma, released_constant = moments
        maps["releases"] = () if release is None else (release,)
        maps["moments"] = ReleasedMoments(M, sigma, released_constant,
                                          _working_map(design, constant, constant_value, centres, scales, maps),
                                          1 + n_free_instruments(design, constant))
    return maps


def _working_map(design: IVDesign, constant: str | None, constant_value: float, centres: pd.Series,
                 scales: pd.Series, maps: dict) -> np.ndarray:
    """L with [Z̃, X̃_endog, Ỹ]ᵢ = L·[1, vᵢ], vᵢ the row's free columns on the box scale (raw = centre + scale·v)."""
    free = free_columns(design, constant)
    position = {c: 1 + i for i, c in enumerate(free)}
    k = len(design.exog_names)

    def raw_map(c: str) -> np.ndarray:  # raw value of column c as a linear function of [1, v]
        row = np.zeros(len(free) + 1)
        if c == constant:
            row[0] = constant_value
        else:
            row[0], row[position[c]] = centres[c], scales[c]
        return row

    Rz = np.array([raw_map(c) for c in design.z_names])
    Lz = maps["A_z"].T @ (Rz - np.outer(maps["z_center"], np.eye(len(free) + 1)[0]))
    Rx = np.array([raw_map(c) for c in design.endog_names]).reshape(-1, len(free) + 1)
    x_center = maps["x_center"][k:]
    Lx = np.diag(np.diag(maps["A_x"])[k:]) @ (Rx - np.outer(x_center, np.eye(len(free) + 1)[0]))
    ly = (raw_map(design.dependent_name) - maps["y_center"] * np.eye(len(free) + 1)[0]) / maps["y_scale"]
    return np.vstack([Lz, Lx, ly[None, :]])
