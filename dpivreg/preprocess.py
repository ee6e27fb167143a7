"""The working scale: bounds, (private) centring, standardisation and whitening, and the exact back-transform.

DP-2S-GD's step sizes and clipping thresholds are stated for isotropic data of unit scale
(the paper assumes E[zzᵀ] = I). dpivreg runs the engine on transformed columns and maps the
estimate back exactly, so the estimand (the 2SLS coefficient on the original data) is unchanged.

Three routes (``fit(preprocess=...)``)
--------------------------------------
``"bounds"``
    Every column is clipped to its public bounds and divided by max(abs(lo), abs(hi)).
    Nothing is read from the data, no budget is spent.
``"private"``
    (default) As ``"bounds"``, then one Gaussian release of the second-moment matrix of the
    bounded columns ("Analyze Gauss", Dwork, Talwar, Thakurta & Zhang 2014), paid for with ρ0.
    From it, by post-processing only: column means (used to centre when the model has an
    intercept, which absorbs the shift), column scales, and the instruments' covariance, used
    to whiten them so that E[z̃z̃ᵀ] ≈ I.
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

import math
import numbers
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import pandas as pd

from .design import IVDesign
from .privacy import Release, check_rho, gaussian_zcdp

__all__ = ["WorkingScale", "PREPROCESS_ROUTES", "validate_bounds", "working_scale", "analyze_gauss"]

PREPROCESS_ROUTES = ("private", "bounds", "data")
Bounds = Mapping[str, tuple[float, float]]


@dataclass(frozen=True)
class WorkingScale:
    """The affine map from the design to the engine's working arrays, and its exact inverse.

    Attributes
    ----------
    route : str
        ``"private"``, ``"bounds"`` or ``"data"``.
    bound_scales : pandas.Series
        max(abs(lo), abs(hi)) per column (from bounds, or from the data: a leak), 1 for constants.
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
    Z, X, Y : ndarray
        The working arrays fed to the engine.
    n_exog : int
        Number of exogenous columns leading Z and X.
    releases : tuple of Release
        Privacy releases made while building the scale (the moments, on route "private").
    z_names : tuple of str
        The instruments' names, in the order of the columns of Z.
    moment_noise_std : float
        Noise standard deviation σ of each entry of the moment release (0 when exact or absent),
        on the bounded scale; public (a function of n, ρ0 and the number of columns).
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
    Z: np.ndarray = field(repr=False)
    X: np.ndarray = field(repr=False)
    Y: np.ndarray = field(repr=False)
    n_exog: int = 0
    releases: tuple[Release, ...] = ()
    moment_noise_std: float = 0.0
    z_names: tuple[str, ...] = ()

    @property
    def leaked_columns(self) -> list[str]:
        """Columns whose bound (scale) was read from the data."""
        return list(self.source.index[self.source == "data"])

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

        The working instruments were whitened with the *released* moments, so Z̃ᵀZ̃/n = I only up to the
        release's noise. With E (symmetric, N(0, σ²) entries) the noise of the second moments and e that
        of the means (bounded scale), the true moments of the centred columns are Σ̂ − E + m̂eᵀ + e m̂ᵀ
        and their mean is −e, so Z̃ᵀZ̃/n ≈ I − Aᵀ(E − m̂eᵀ − e m̂ᵀ)A with A the bounded→working map of
        the non-constant instruments, and the constant's cross terms are −Aᵀe. Draws of (E, e) from
        their known distribution give draws of Z̃ᵀZ̃/n (post-processing: σ is public). Exact (all I)
        when σ = 0.
        """
        q = self.A_z.shape[0]
        draws = np.broadcast_to(np.eye(q), (replications, q, q)).copy()
        sigma = self.moment_noise_std
        if sigma == 0.0:
            return draws
        free = [i for i in range(q) if i != self.constant_index]
        bound = self.bound_scales.reindex(list(self.z_names)).to_numpy()[free]
        A = bound[:, None] * self.A_z[np.ix_(free, free)]  # bounded scale → working scale
        upper = np.triu(rng.standard_normal((replications, len(free), len(free))) * sigma)
        E = upper + np.swapaxes(np.triu(upper, 1), 1, 2)
        if self.constant_index is not None:
            e = rng.standard_normal((replications, len(free))) * sigma
            m = self.z_center[free] / bound
            E = E - m[None, :, None] * e[:, None, :] - e[:, :, None] * m[None, None, :]
            cross = -np.einsum("ij,ri->rj", A, e)
            draws[:, self.constant_index, free] = cross
            draws[:, free, self.constant_index] = cross
        draws[np.ix_(range(replications), free, free)] -= np.swapaxes(A, 0, 1)[None] @ E @ A[None]
        return draws

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
    """Check ``bounds`` against the design's columns and return them as float pairs.

    Raises
    ------
    TypeError
        ``bounds`` is not a mapping, or a value is not a pair of numbers.
    ValueError
        An unknown column, a non-finite bound, or lo >= hi.
    """
    if bounds is None:
        return {}
    if not isinstance(bounds, Mapping):
        raise TypeError(
            'bounds must be a dict mapping design column names to (lower, upper) pairs, e.g. '
            f'{{"weeks": (0, 52)}}; got {type(bounds).__name__}.'
        )
    known = _all_columns(design)
    checked: dict[str, tuple[float, float]] = {}
    for name, pair in bounds.items():
        if name not in known:
            raise ValueError(
                f"bounds were given for {name!r}, which is not a column of the design. "
                f"Design columns: {known}."
            )
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise TypeError(f"bounds[{name!r}] must be a (lower, upper) pair of numbers, got {pair!r}.")
        lo, hi = pair
        for value in (lo, hi):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"bounds[{name!r}] must be a (lower, upper) pair of numbers, got {pair!r}.")
        lo, hi = float(lo), float(hi)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"bounds[{name!r}] must be finite, got {pair!r}.")
        if not lo < hi:
            raise ValueError(f"bounds[{name!r}] must satisfy lower < upper, got {pair!r}.")
        checked[name] = (lo, hi)
    return checked


def _all_columns(design: IVDesign) -> list[str]:
    return [design.dependent_name, *design.exog_names, *design.endog_names, *design.instrument_names]


def _constant_name(design: IVDesign) -> str | None:
    """The exogenous column that is constant (a design choice, public), if any."""
    for name in design.exog_names:
        values = design.exog[name].to_numpy()
        if values.size and np.all(values == values[0]) and values[0] != 0:
            return name
    return None


def _bounded_columns(design: IVDesign, bounds: dict[str, tuple[float, float]], constant: str | None):
    """Clip each column to its bounds and divide it by max(abs(lo), abs(hi)) (or its data maximum: a leak)."""
    frame = pd.concat([design.dependent, design.exog, design.endog, design.instruments], axis=1)
    scales, source, clipped, columns = {}, {}, {}, {}
    for name in _all_columns(design):
        values = frame[name].to_numpy(dtype=np.float64)
        clipped[name] = 0
        if name == constant and name not in bounds:
            scales[name], source[name] = 1.0, "constant"
        elif name in bounds:
            lo, hi = bounds[name]
            clipped[name] = int(np.count_nonzero((values < lo) | (values > hi)))
            values = np.clip(values, lo, hi)
            scales[name], source[name] = max(abs(lo), abs(hi)), "bounds"
        else:
            largest = float(np.max(np.abs(values))) if values.size else 0.0
            scales[name], source[name] = (largest if largest > 0 else 1.0), "data"
        columns[name] = values / scales[name]
    return (
        columns,
        pd.Series(scales, name="bound scale", dtype=float),
        pd.Series(source, name="source", dtype=object),
        pd.Series(clipped, name="clipped values (non-private)", dtype=np.int64),
    )


# ----------------------------------------------------------------------------------------
# the private second-moment release
# ----------------------------------------------------------------------------------------
def analyze_gauss(W: np.ndarray, *, rho: float, rng: np.random.Generator, row_bound: float,
                  name: str = "second moments", stage: str = "rho0") -> tuple[np.ndarray, Release, float]:
    """Release WᵀW/n with symmetric Gaussian noise ("Analyze Gauss"), spending ``rho`` zCDP.

    Every row is clipped to L2 norm ``row_bound`` = B (a no-op for data within public bounds).
    Replacing one row changes WᵀW/n by (wwᵀ − w'w'ᵀ)/n, whose Frobenius norm is at most
    √2·B²/n (‖wwᵀ − w'w'ᵀ‖²_F = ‖w‖⁴ + ‖w'‖⁴ − 2(wᵀw')² ≤ 2B⁴); the upper triangle, which
    determines the matrix, has at most that L2 norm. Noise N(0, σ²) is added to each entry of
    the upper triangle and mirrored, with σ = Δ/sqrt(2ρ). ``rho = inf`` releases the exact
    matrix (not private).

    Returns
    -------
    M : ndarray (d, d)
        The released symmetric matrix.
    release : Release
        Its record for the accountant.
    sigma : float
        The noise standard deviation per entry.
    """
    n = W.shape[0]
    return release_second_moments(clipped_outer_sum(W, row_bound) / n, n, rho=rho, rng=rng, row_bound=row_bound,
                                  name=name, stage=stage)


def clipped_outer_sum(W: np.ndarray, row_bound: float) -> np.ndarray:
    """Σᵢ wᵢwᵢᵀ over the rows of W, each clipped to L2 norm ``row_bound`` (the data part of
    :func:`analyze_gauss`; a sum, so it can be accumulated block by block)."""
    norms = np.sqrt(np.einsum("ij,ij->i", W, W))
    with np.errstate(divide="ignore"):
        W = W * np.minimum(1.0, row_bound / norms)[:, None]
    return W.T @ W


def release_second_moments(M: np.ndarray, n: int, *, rho: float, rng: np.random.Generator, row_bound: float,
                           name: str = "second moments", stage: str = "rho0") -> tuple[np.ndarray, Release, float]:
    """Add the symmetric Gaussian noise of :func:`analyze_gauss` to the exact M = Σ clipped wwᵀ / n."""
    d = M.shape[0]
    sensitivity = math.sqrt(2.0) * row_bound**2 / n
    sigma = 0.0 if math.isinf(rho) else sensitivity / math.sqrt(2.0 * rho)
    upper = np.triu(rng.standard_normal((d, d)) * sigma)
    M = M + upper + np.triu(upper, 1).T
    release = Release(name, stage, 1, row_bound, sensitivity, sigma, gaussian_zcdp(sensitivity, sigma, 1))
    return M, release, sigma


def _project_psd(S: np.ndarray, floor: float) -> np.ndarray:
    """Nearest symmetric matrix with eigenvalues >= ``floor`` (clip the spectrum)."""
    eigenvalues, vectors = np.linalg.eigh((S + S.T) / 2.0)
    return (vectors * np.maximum(eigenvalues, floor)) @ vectors.T


def _moments(W: np.ndarray, *, has_constant: bool, route: str, rho0: float, rng: np.random.Generator,
             n_instruments: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[Release, ...], float]:
    """Means (zeros without a constant), scales and the instruments' correlation matrix of the
    bounded columns W (entries in [−1, 1]; the first ``n_instruments`` columns are the instruments).

    With a constant the release is of [1, W] so the means come with the second moments; the
    covariance is then M − m mᵀ. Without one the uncentred second moment is used.
    """
    n, d = W.shape
    rho = math.inf if route == "data" else rho0
    # Exact moments (non-private routes) are computed on columns rescaled to max |w| = 1 and scaled
    # back, so that absurdly loose bounds (entries ~1e-200, squares underflowing) stay exact. The
    # private release must use the bounded scale itself: its sensitivity is stated there.
    unit = _moment_units(np.max(np.abs(W), axis=0) if n else np.ones(d), rho)
    V = W / unit
    V = np.column_stack([np.ones(n), V]) if has_constant else V
    row_bound = math.sqrt(V.shape[1])  # every entry lies in [−1, 1]
    return _moments_from_sum(clipped_outer_sum(V, row_bound), n, unit=unit, has_constant=has_constant,
                             route=route, rho=rho, rng=rng, n_instruments=n_instruments)


def _moment_units(largest: np.ndarray, rho: float) -> np.ndarray:
    """Column units of the moment computation: 1 for a release, max |w| (or 1 if 0) when exact."""
    if not math.isinf(rho):
        return np.ones(largest.shape[0])
    return np.where(largest > 0, largest, 1.0)


def _moments_from_sum(outer_sum: np.ndarray, n: int, *, unit: np.ndarray, has_constant: bool, route: str,
                      rho: float, rng: np.random.Generator, n_instruments: int):
    """Release Σ vvᵀ/n of V = [1, W/unit] (or W/unit) and post-process it as :func:`_moments` says."""
    d = unit.shape[0]
    row_bound = math.sqrt(d + has_constant)
    M, release, sigma = release_second_moments(outer_sum / n, n, rho=rho, rng=rng, row_bound=row_bound,
                                               name="second moments of the bounded columns (Analyze Gauss)")
    if has_constant:
        means = np.clip(M[0, 1:], -1.0, 1.0)
        second = M[1:, 1:] - np.outer(means, means)
    else:
        means, second = np.zeros(d), M
    # Floor what the release cannot resolve, so that no direction is amplified by noise: each variance
    # at 2σ (two noise standard deviations of one entry), the instruments' block at 2σ·sqrt(q), the
    # spectral norm of its symmetric noise (a tiny relative floor when exact). Only the pieces used
    # are projected.
    tiny = 1e-10 * max(float(np.max(np.diag(second))), 1e-300)
    scales = np.sqrt(np.maximum(np.diag(second), max(2.0 * sigma, tiny)))
    z_cov = _project_psd(second[:n_instruments, :n_instruments], max(2.0 * sigma * math.sqrt(n_instruments), tiny))
    z_scales = scales[:n_instruments]
    z_corr = z_cov / np.outer(z_scales, z_scales)
    releases = () if route == "data" else (release,)
    return means * unit, scales * unit, z_corr, releases, (sigma if route != "data" else 0.0)


def _whitening(cov: np.ndarray, n_exog: int) -> np.ndarray:
    """A with Aᵀ cov A = I, block upper triangular so that the first ``n_exog`` outputs use only
    the first ``n_exog`` inputs: A = L⁻ᵀ from the Cholesky factor cov = L Lᵀ."""
    L = np.linalg.cholesky(cov)
    return np.linalg.solve(L.T, np.eye(cov.shape[0]))


# ----------------------------------------------------------------------------------------
# the working scale
# ----------------------------------------------------------------------------------------
def working_scale(design: IVDesign, bounds: Bounds | None, *, route: str = "bounds", rho0: float = math.inf,
                  rng: np.random.Generator | None = None) -> WorkingScale:
    """Build the working arrays for the engine and the exact back-transform.

    Parameters
    ----------
    design : IVDesign
        The model's design (a Dask design gives lazy Dask working arrays, see :mod:`dpivreg._dask`).
    bounds : dict, optional
        Public (lower, upper) bounds by design column name.
    route : {"bounds", "private", "data"}
        See the module docstring.
    rho0 : float
        zCDP budget of the moment release (route "private").
    rng : numpy.random.Generator
        Source of the release's noise (route "private").
    """
    if route not in PREPROCESS_ROUTES:
        raise ValueError(f"preprocess must be one of {PREPROCESS_ROUTES}, got {route!r}.")
    bounds = validate_bounds(bounds, design)
    if route == "private":
        rho0 = check_rho(rho0, "rho0")
    rng = rng if rng is not None else np.random.default_rng()
    if getattr(design, "is_dask", False):
        from ._dask import dask_working_scale  # noqa: PLC0415 - dask is optional

        return dask_working_scale(design, bounds, route=route, rho0=rho0, rng=rng)
    constant = _constant_name(design)
    columns, bound_scales, source, clipped = _bounded_columns(design, bounds, constant)
    free = free_columns(design, constant)
    W = np.column_stack([columns[c] for c in free])
    if route == "bounds":
        moments = None
    else:
        moments = _moments(W, has_constant=constant is not None, route=route,
                           rho0=rho0 if route == "private" else math.inf, rng=rng,
                           n_instruments=n_free_instruments(design, constant))
    constant_value = float(design.exog[constant].iloc[0]) if constant is not None else 1.0
    maps = affine_maps(design, route=route, constant=constant, constant_value=constant_value,
                       bound_scales=bound_scales, moments=moments)
    raw = {c: columns[c] * bound_scales[c] for c in _all_columns(design)}  # clipped, original units
    k = len(design.exog_names)
    Z = (np.column_stack([raw[c] for c in design.z_names]) - maps["z_center"]) @ maps["A_z"]
    X = (np.column_stack([raw[c] for c in design.regressor_names]) - maps["x_center"]) @ maps["A_x"]
    X[:, :k] = Z[:, :k]  # identical by construction; remove rounding differences
    Y = (raw[design.dependent_name] - maps["y_center"]) / maps["y_scale"]
    return WorkingScale(route=route, bound_scales=bound_scales, source=source, clipped_values=clipped,
                        Z=Z, X=X, Y=Y, n_exog=k, **maps)


def free_columns(design: IVDesign, constant: str | None) -> list:
    """The non-constant columns in the order of the moment release: [exog, instruments, endog, dependent]."""
    return ([c for c in design.exog_names if c != constant] + list(design.instrument_names)
            + list(design.endog_names) + [design.dependent_name])


def n_free_instruments(design: IVDesign, constant: str | None) -> int:
    """Number of non-constant columns of Z = [exog, instruments] (they lead :func:`free_columns`)."""
    return len(design.exog_names) - (constant is not None) + len(design.instrument_names)


def affine_maps(design: IVDesign, *, route: str, constant: str | None, constant_value: float,
                bound_scales: pd.Series, moments: tuple | None) -> dict:
    """The centres and linear maps of the working scale (every field of :class:`WorkingScale` that
    does not hold data), from the bound scales and, off route "bounds", the moments of
    :func:`_moments` over :func:`free_columns`."""
    exog, endog = design.exog_names, design.endog_names
    dep = design.dependent_name
    k, p_endog = len(exog), len(endog)
    z_names, x_names = design.z_names, design.regressor_names
    const_idx = exog.index(constant) if constant is not None else None
    free = free_columns(design, constant)
    if moments is None:
        means, scales = np.zeros(len(free)), np.ones(len(free))
        releases: tuple[Release, ...] = ()
        z_cov = None
        moment_sigma = 0.0
    else:
        means, scales, z_cov, releases, moment_sigma = moments
    index = {c: i for i, c in enumerate(free)}

    def center(c: str) -> float:
        return 0.0 if c == constant else float(means[index[c]]) * bound_scales[c]

    def scale(c: str) -> float:  # original units per working unit before whitening
        return 1.0 if c == constant else float(scales[index[c]]) * bound_scales[c]

    # A_Z: diag(1/scale) then whitening of the non-constant instruments (exogenous first).
    q = len(z_names)
    A_z = np.zeros((q, q))
    z_free = [i for i, c in enumerate(z_names) if c != constant]
    D = np.diag([1.0 / scale(z_names[i]) for i in z_free])
    n_exog_free = k - (constant is not None)
    white = np.eye(len(z_free)) if z_cov is None else _whitening(z_cov, n_exog_free)
    A_z[np.ix_(z_free, z_free)] = D @ white
    if constant is not None:
        A_z[const_idx, const_idx] = 1.0
    A_x = np.zeros((k + p_endog, k + p_endog))
    A_x[:k, :k] = A_z[:k, :k]
    A_x[k:, k:] = np.diag([1.0 / scale(c) for c in endog])
    return dict(
        y_center=center(dep), y_scale=scale(dep), x_center=np.array([center(c) for c in x_names]), A_x=A_x,
        z_center=np.array([center(c) for c in z_names]), A_z=A_z, constant_index=const_idx,
        constant_value=constant_value, releases=releases, moment_noise_std=moment_sigma, z_names=tuple(z_names),
    )
