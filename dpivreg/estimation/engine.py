"""The numerical engine: noisy two-stage gradient descent (Algorithm DP-2S-GD).

This module knows nothing of pandas, formulas or scaling: it takes arrays ``Z`` (n×q),
``X`` (n×p), ``Y`` (n,) on the scale the caller chose (numpy, or Dask for data larger than
memory) and returns the released paths. The pass over the rows that each iteration makes is in
:mod:`dpivreg.compute.kernels` (numba or numpy) and :mod:`dpivreg.compute.backends` (threads or Dask blocks).
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass, field

import numpy as np

from dpivreg._validation import check_positive, check_raw_clip, check_rho, check_T
from dpivreg.compute.backends import DaskRows, InMemoryRows, RowSource, is_dask_collection, one_pass, unfused_dask
from dpivreg.compute.kernels import KERNELS, pass_matrix
from dpivreg.errors import DivergenceError, PrivacyLeakWarning
from dpivreg.privacy.accounting import CALIBRATIONS, PrivacyBudget, Release, clipped_mean_sensitivity, noise_std
from dpivreg.privacy.rounding import gradient_rounding
from dpivreg.privacy.sampler import add_noise, draw_noise, grid_for, make_rng, sampler_of
from dpivreg.progress import RunTimeForecast, check_progress

__all__ = ["dp_2s_gd", "run_on_rows", "row_source", "DP2SGDPath", "METHODS", "preconditioner_root", "check_schedule",
           "IterationPlan", "iteration_plan"]

METHODS = ("gd", "preconditioned")


@dataclass(frozen=True)
class DP2SGDPath:
    """Everything one run of DP-2S-GD released, plus labelled non-private diagnostics.

    Attributes
    ----------
    theta : ndarray, shape (T+1, q, p - n_exog)
        The released first-stage path Θ⁽⁰⁾ … Θ⁽ᵀ⁾ (endogenous block only when ``n_exog > 0``).
    beta : ndarray, shape (T+1, p)
        The released second-stage path β⁽⁰⁾ … β⁽ᵀ⁾.
    lambda1, lambda2 : float
        Noise standard deviations of the two stages (0: no noise): the largest per-step value, which
        with the uniform schedule and one clipping group is every step's.
    clip1, clip2 : float, (float, float) or None
        Clipping thresholds γ1, γ2 (``None``: no clipping); pairs (exogenous group, rest) with
        group clipping.
    eta, alpha : float
        Step sizes of the two stages.
    n_exog : int
        Number of leading columns of X that are their own instruments.
    calibration : str
        ``"exact"`` or ``"paper"``.
    method : str
        ``"gd"`` or ``"preconditioned"``.
    privacy : PrivacyBudget
        The accountant: one record per stage with the zCDP actually spent.
    clipped_rows : ndarray, shape (T, 2)
        NON-PRIVATE diagnostic: number of rows whose gradient was clipped, per step and
        stage. Computed from the raw data; never publish it.
    ridge : float or None
        Regularisation of the preconditioner (``method="preconditioned"``).
    schedule : ndarray, shape (2, T)
        Share of each stage's budget spent at each step (rows: stages); 0 where the stage does
        not update.
    noise1, noise2 : ndarray, shape (T, 2)
        Per-step noise standard deviation of each stage, for the exogenous group and the rest
        (equal without group clipping; 0 where the stage does not update).
    split : int or None
        ``n_exog`` with group clipping, else None.
    group_share : float
        Share of each stage's per-step budget spent on the exogenous group (group clipping).
    root : str or None
        The preconditioner's square root: ``"symmetric"`` (P^(−1/2)), ``"cholesky"`` (L⁻¹ with
        P = LLᵀ, exogenous coordinates first; used with group clipping) or None (``method="gd"``).
    """

    theta: np.ndarray
    beta: np.ndarray
    lambda1: float
    lambda2: float
    clip1: float | None
    clip2: float | None
    eta: float
    alpha: float
    n_exog: int
    calibration: str
    method: str
    privacy: PrivacyBudget
    clipped_rows: np.ndarray = field(repr=False)

    ridge: float | None = None
    schedule: np.ndarray | None = field(default=None, repr=False)
    noise1: np.ndarray | None = field(default=None, repr=False)
    noise2: np.ndarray | None = field(default=None, repr=False)
    split: int | None = None
    group_share: float = 0.0
    root: str | None = None

    @property
    def T(self) -> int:
        """Number of iterations."""
        return self.beta.shape[0] - 1

    @property
    def beta_final(self) -> np.ndarray:
        """β⁽ᵀ⁾, the private estimate."""
        return self.beta[-1]

    @property
    def theta_final(self) -> np.ndarray:
        """Θ⁽ᵀ⁾, the private first-stage estimate."""
        return self.theta[-1]

    @property
    def plan(self) -> "IterationPlan":
        """The run's public settings as an :class:`IterationPlan` (uniform, ungrouped when not recorded)."""
        T = self.T
        schedule = self.schedule if self.schedule is not None else np.full((2, T), 1.0 / max(T, 1))
        noise1 = self.noise1 if self.noise1 is not None else np.full((T, 2), self.lambda1)
        noise2 = self.noise2 if self.noise2 is not None else np.full((T, 2), self.lambda2)
        return IterationPlan(T, self.eta, self.alpha, self.method, self.n_exog, schedule, noise1, noise2, self.split,
                             self.ridge, self.root or ("symmetric" if self.method == "preconditioned" else None))


@dataclass(frozen=True)
class IterationPlan:
    """Everything about a run of the iteration that is public before it runs: the steps, the schedule, the
    per-step noise of each stage and clipping group, the preconditioner. The privacy-noise simulation
    (:func:`dpivreg.inference.private.noise_covariance`) replays a plan in moment form; :func:`iteration_plan`
    makes one without data, which is how the default chooses between DP-2S-GD and noisy moments.

    Attributes are those of :class:`DP2SGDPath` of the same names.
    """

    T: int
    eta: float
    alpha: float
    method: str
    n_exog: int
    schedule: np.ndarray
    noise1: np.ndarray
    noise2: np.ndarray
    split: int | None
    ridge: float | None
    root: str | None


def iteration_plan(n: int, q: int, p: int, n_exog: int, *, T: int, rho1: float, rho2: float, eta: float,
                   alpha: float, clip1, clip2, calibration: str = "exact", method: str = "preconditioned",
                   schedule=None, group_share: float = 0.2, ridge: float | None = None) -> IterationPlan:
    """The :class:`IterationPlan` of a run with these (checked) settings: per-step noise stds of every stage and
    group (step t of stage k spends ρk·schedule[k, t], split between the groups by ``group_share``), the
    default ridge q·(η·λ̄1)² + 1e-4 (λ̄1 the uniform schedule's first-stage noise) and the root."""
    schedule = check_schedule(schedule, T)
    split = n_exog if isinstance(clip1, tuple) else None
    share = group_share if split is not None else 0.0
    noise1 = _stage_noise(clip1, n, rho1, schedule[0], split, share, calibration, "1")
    noise2 = _stage_noise(clip2, n, rho2, schedule[1], split, share, calibration, "2")
    root = None
    if method == "preconditioned":
        if ridge is None:
            ridge = default_ridge(q, eta, noise_std(_rest(clip1), n, T, rho1, calibration))
            if not math.isfinite(ridge):
                raise ValueError(f"the default ridge q·(η·λ1)² overflows (eta={eta:g}, the first stage's noise λ1 "
                                 f"from clip={_rest(clip1)!r} and rho1={rho1:g}): lower eta or the clipping threshold, "
                                 "or raise rho1.")
        ridge = check_positive(ridge, "ridge")
        root = "cholesky" if split is not None else "symmetric"
    return IterationPlan(T, eta, alpha, method, n_exog, schedule, noise1, noise2, split, ridge, root)


# ----------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------
def _as_float_matrix(a, name: str, *, ndim: int) -> np.ndarray:
    """``a`` as a contiguous float64 array of ``ndim`` dimensions, checked finite: no copy when it already is one, in
    either order (the kernels read both at the same speed, measured, and pandas' ``to_numpy()`` of a float block is
    column-major: copying it to row-major doubled a fit's memory); any other array is copied, row-major."""
    try:
        arr = np.asarray(a)
    except Exception as exc:  # pragma: no cover - numpy raises many types here
        raise TypeError(f"{name} must be array-like of numbers: {exc}") from exc
    _check_number_dtype(arr.dtype, name)
    arr = _fix_ndim(arr, name, ndim)
    arr = np.asarray(arr, dtype=np.float64)
    if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
        arr = np.ascontiguousarray(arr)
    if not _all_finite(arr):
        raise ValueError(f"{name} contains NaN or infinite values: drop or impute those rows first.")
    return arr


def _check_number_dtype(dtype, name: str) -> None:
    if np.issubdtype(dtype, np.complexfloating):
        raise TypeError(f"{name} holds complex numbers; pass real values (e.g. the real part, if that is meant).")
    if dtype == object or not (np.issubdtype(dtype, np.number) or dtype == bool):
        raise TypeError(f"{name} must hold numbers, got dtype {dtype}. Encode categories as numeric columns first.")


def _fix_ndim(arr, name: str, ndim: int):
    if ndim == 2 and arr.ndim == 1:
        arr = arr[:, None]
    if ndim == 1 and arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-dimensional, got shape {arr.shape}.")
    return arr


def _all_finite(arr: np.ndarray, rows: int = 1 << 16) -> bool:
    """np.isfinite(arr).all() in row blocks, without an array-sized temporary."""
    return all(np.isfinite(arr[start:start + rows]).all() for start in range(0, arr.shape[0], rows))


def row_source(Z, X, Y, n_exog: int = 0, *, kernel: str = "auto", n_threads: int | None = None,
               grouping: dict | None = None) -> tuple[RowSource, int, int]:
    """The checked working arrays as a :class:`~dpivreg.compute.backends.RowSource` (in memory or Dask), with p and
    n_exog, for a fit that makes several passes over the same rows (:func:`run_on_rows`). ``grouping``: the
    source's ``groups``, ``n``, ``n_units`` and ``max_rows`` (privacy units, :mod:`dpivreg.privacy.units`). Call
    ``close()`` on the source when done."""
    return _validate_data(Z, X, Y, n_exog, kernel=kernel, n_threads=n_threads, grouping=grouping)


def _validate_data(Z, X, Y, n_exog, *, kernel: str = "auto", n_threads: int | None = None,
                   grouping: dict | None = None) -> tuple[RowSource, int, int]:
    """Check the data and wrap it as a :class:`~dpivreg.compute.backends.RowSource`; returns (rows, p, n_exog)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}.")
    if n_threads is not None and (isinstance(n_threads, bool) or not isinstance(n_threads, numbers.Integral)
                                  or n_threads < 1):
        raise ValueError(f"n_threads must be None or an integer >= 1, got {n_threads!r}.")
    dask_inputs = [is_dask_collection(a) for a in (Z, X, Y)]
    if any(dask_inputs):
        if not all(dask_inputs):
            raise TypeError("Z, X and Y must be all Dask arrays or all in-memory arrays, not a mix: "
                            "wrap the in-memory ones with dask.array.from_array(...).")
        return _validate_dask_data(Z, X, Y, n_exog, kernel=kernel, grouping=grouping)
    Z = _as_float_matrix(Z, "Z", ndim=2)
    X = _as_float_matrix(X, "X", ndim=2)
    Y = _as_float_matrix(Y, "Y", ndim=1)
    n_exog = _check_shapes(Z.shape, X.shape, Y.shape, n_exog)
    if n_exog and not np.array_equal(X[:, :n_exog], Z[:, :n_exog]):
        raise ValueError(_exog_mismatch_message(n_exog))
    return InMemoryRows(Z, X[:, n_exog:], Y, kernel=kernel, n_threads=n_threads, **(grouping or {})), X.shape[1], n_exog


def _check_shapes(z_shape, x_shape, y_shape, n_exog) -> int:
    n, q = z_shape
    p = x_shape[1]
    if x_shape[0] != n or y_shape[0] != n:
        raise ValueError(f"Z, X and Y must have the same number of rows, got {n}, {x_shape[0]} and {y_shape[0]}.")
    if n < 1:
        raise ValueError("the data has no rows.")
    if n < max(2, q):
        raise ValueError(f"only n = {n} rows for q = {q} instruments (columns of Z): DP-2S-GD needs at least "
                         "2 rows and as many rows as instruments. Pass more data.")
    if q < p:
        raise ValueError(
            f"the model is not identified: q = {q} instruments (columns of Z) < p = {p} regressors (columns of X). "
            "Add instruments or drop regressors."
        )
    if isinstance(n_exog, bool) or not isinstance(n_exog, numbers.Integral) or not 0 <= n_exog < p:
        raise ValueError(f"n_exog must be an integer in [0, p) = [0, {p}), got {n_exog!r}.")
    return int(n_exog)


def _exog_mismatch_message(n_exog: int) -> str:
    return (
        f"n_exog={n_exog} says the first {n_exog} columns of X are exogenous, but they differ from the "
        f"first {n_exog} columns of Z: put each exogenous regressor first in both X and Z."
    )


def _validate_dask_data(Z, X, Y, n_exog, *, kernel: str, grouping: dict | None = None) -> tuple[RowSource, int, int]:
    """The checks of the in-memory path on Dask arrays, in one pass over the data."""
    import dask
    import dask.array as da

    arrays = {}
    for name, a, ndim in (("Z", Z, 2), ("X", X, 2), ("Y", Y, 1)):
        if not isinstance(a, da.Array):
            a = a.to_dask_array(lengths=True) if hasattr(a, "to_dask_array") else a
        if not isinstance(a, da.Array):
            raise TypeError(f"{name} must be a dask.array.Array (or a Dask DataFrame/Series), got {type(a).__name__}.")
        _check_number_dtype(a.dtype, name)
        a = _fix_ndim(a, name, ndim)
        if any(math.isnan(c) for c in a.chunks[0]):
            with unfused_dask():
                a = a.compute_chunk_sizes()
        arrays[name] = a.astype(np.float64)
    Z, X, Y = arrays["Z"], arrays["X"], arrays["Y"]
    n_exog = _check_shapes(Z.shape, X.shape, Y.shape, n_exog)
    X = X.rechunk({0: Z.chunks[0]})
    checks = [da.isfinite(Z).all(), da.isfinite(X).all(), da.isfinite(Y).all()]
    if n_exog:
        checks.append((X[:, :n_exog] == Z[:, :n_exog]).all())
    with one_pass():
        results = dask.compute(*checks)
    for ok, name in zip(results[:3], "ZXY"):
        if not ok:
            raise ValueError(f"{name} contains NaN or infinite values: drop or impute those rows first.")
    if n_exog and not results[3]:
        raise ValueError(_exog_mismatch_message(n_exog))
    return DaskRows(Z, X, Y, kernel=kernel, endog_from=n_exog, **(grouping or {})), X.shape[1], n_exog


# ----------------------------------------------------------------------------------------
# the iteration
# ----------------------------------------------------------------------------------------
def default_ridge(q: int, eta: float, lambda1: float) -> float:
    """Regularisation of the second-stage preconditioner: the first stage's per-step noise level
    q·(η·λ1)² plus a floor of 1e-4, on the working scale."""
    return q * (eta * lambda1) * (eta * lambda1) + 1e-4


def _check_second_moment(second_moment, q: int) -> np.ndarray:
    if second_moment is None:
        return np.eye(q)
    S = _as_float_matrix(second_moment, "second_moment", ndim=2)
    if S.shape != (q, q) or not np.allclose(S, S.T):
        raise ValueError(f"second_moment must be a symmetric ({q}, {q}) matrix, got shape {S.shape}.")
    return S


def _inverse_sqrt_preconditioner(theta_endog: np.ndarray, S: np.ndarray, n_exog: int, ridge: float) -> np.ndarray:
    """P^(−1/2) for P = Θ̄ᵀ S Θ̄ + ridge·I with Θ̄ = [I_exog | Θ_endog] (q × p); also for a stack of Θ (…, q, pe)."""
    return preconditioner_root(theta_endog, S, n_exog, ridge, "symmetric")


def preconditioner_matrix(theta_endog: np.ndarray, S: np.ndarray, n_exog: int, ridge: float) -> np.ndarray:
    """P = Θ̄ᵀ S Θ̄ + ridge·I (symmetrised) with Θ̄ = [I_exog | Θ_endog] (q × p); also for a stack of Θ."""
    q = S.shape[0]
    exog_block = np.broadcast_to(np.eye(q, n_exog), theta_endog.shape[:-1] + (n_exog,))
    theta_full = np.concatenate([exog_block, theta_endog], axis=-1)
    P = np.swapaxes(theta_full, -1, -2) @ S @ theta_full
    return (P + np.swapaxes(P, -1, -2)) / 2.0 + ridge * np.eye(P.shape[-1])


def preconditioner_root(theta_endog: np.ndarray, S: np.ndarray, n_exog: int, ridge: float, kind: str) -> np.ndarray:
    """W with W P Wᵀ = I for P = Θ̄ᵀ S Θ̄ + ridge·I, Θ̄ = [I_exog | Θ_endog] (q × p); also for a stack of Θ.

    ``kind="symmetric"``: W = P^(−1/2). ``kind="cholesky"``: W = L⁻¹ with P = LLᵀ, lower triangular, so that
    the first ``n_exog`` whitened coordinates depend only on the exogenous regressors and the endogenous
    ones are the endogenous fitted values after partialling out the exogenous (Frisch–Waugh–Lovell).
    """
    P = preconditioner_matrix(theta_endog, S, n_exog, ridge)
    broken = ~np.all(np.isfinite(P), axis=(-2, -1))  # a diverged iterate (e.g. in a simulated world): NaN root
    P = np.where(broken[..., None, None], np.eye(P.shape[-1]), P)
    eigenvalues, vectors = np.linalg.eigh(P)
    eigenvalues = np.maximum(eigenvalues, ridge)  # the ridge is the floor whatever the rounding of P
    if kind == "cholesky":
        # L from the QR factor of the symmetric square root S (P = SSᵀ = RᵀR): no loss of definiteness to
        # rounding, whatever the spread of the spectrum
        S = (vectors * np.sqrt(eigenvalues)[..., None, :]) @ np.swapaxes(vectors, -1, -2)
        R = np.linalg.qr(S, mode="r")
        R = R * np.sign(np.diagonal(R, axis1=-2, axis2=-1))[..., :, None]
        root = np.linalg.solve(np.swapaxes(R, -1, -2), np.broadcast_to(np.eye(P.shape[-1]), P.shape))
    else:
        root = (vectors / np.sqrt(eigenvalues)[..., None, :]) @ np.swapaxes(vectors, -1, -2)
    return np.where(broken[..., None, None], np.nan, root)


def _check_bouncing(path: np.ndarray, step: float, clip: float | None, what: str, name: str) -> None:
    """Detect a step size too large for clipped gradients: the iterates stay finite but bounce.

    With clipping, a divergent iteration cannot overflow: each step moves at most step·γ. It then
    flips direction at (nearly) full, steady length. We flag four consecutive reversals (cosine < −0.5
    between successive moves) of steady length (successive ratios within [0.6, 1/0.6]), each
    ≥ step·γ/2, i.e. with at least half the rows clipped in one direction: a converging iteration
    does not do this, and privacy noise (random directions and lengths) practically never does.
    Reads only the released path.
    """
    if clip is None or path.shape[0] < 6:
        return
    moves = np.diff(path.reshape(path.shape[0], -1), axis=0)[-5:]
    lengths = np.linalg.norm(moves, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cosines = np.einsum("ij,ij->i", moves[1:], moves[:-1]) / (lengths[1:] * lengths[:-1])
        ratios = lengths[1:] / lengths[:-1]
    steady = np.all((ratios > 0.6) & (ratios < 1.0 / 0.6))
    if np.all(cosines < -0.5) and steady and np.all(lengths >= 0.5 * step * clip):
        raise DivergenceError(
            f"the {what} iterates bounce back and forth by the largest clipped step: the step size {name}={step:g} "
            f"is too large for the data's scale. Lower {name} (e.g. to {step / 10:g}) or rescale the data."
        )


def _first_stage_exploding(theta_path: np.ndarray) -> bool:
    """True when ‖Θ‖ grew by more than 1.5× in each of the last three steps (a too-large eta)."""
    norms = np.linalg.norm(theta_path[-4:].reshape(min(4, len(theta_path)), -1), axis=1)
    return len(norms) == 4 and bool(np.all(norms[1:] > 1.5 * norms[:-1]))


def _check_finite(value: np.ndarray, what: str, step: int, name: str, size: float) -> None:
    if not np.all(np.isfinite(value)):
        raise DivergenceError(
            f"the {what} became non-finite at step {step}: the step size {name}={size:g} is too large "
            f"for the data's scale. Lower {name} (e.g. to {size / 10:g}) or rescale the data."
        )


def dp_2s_gd(
    Z,
    X,
    Y,
    *,
    T: int,
    rho1: float,
    rho2: float,
    eta: float,
    alpha: float,
    clip1: float | None,
    clip2: float | None,
    calibration: str = "exact",
    seed=None,
    n_exog: int = 0,
    method: str = "gd",
    second_moment=None,
    ridge: float | None = None,
    kernel: str = "auto",
    n_threads: int | None = None,
    theta0=None,
    beta0=None,
    schedule=None,
    group_share: float = 0.2,
    progress: bool | None = None,
) -> DP2SGDPath:
    """Noisy two-stage gradient descent (Algorithm DP-2S-GD), releasing the whole path.

    Θ⁽⁰⁾ = 0, β⁽⁰⁾ = 0, and for t = 0, …, T−1::

        Θ⁽ᵗ⁺¹⁾ = Θ⁽ᵗ⁾ − η [ (1/n) Σᵢ CLIP_γ1( zᵢ (zᵢᵀΘ⁽ᵗ⁾ − xᵢᵀ) ) − Ξ⁽ᵗ⁾ ],   vec Ξ⁽ᵗ⁾ ~ N(0, λ1² I)
        β⁽ᵗ⁺¹⁾ = β⁽ᵗ⁾ − α [ (1/n) Σᵢ CLIP_γ2( x̂ᵢ (x̂ᵢᵀβ⁽ᵗ⁾ − yᵢ) ) − ν⁽ᵗ⁾ ],       ν⁽ᵗ⁾ ~ N(0, λ2² I)

    with x̂ᵢ = Θ⁽ᵗ⁾ᵀzᵢ (the β step uses Θ⁽ᵗ⁾, not Θ⁽ᵗ⁺¹⁾) and CLIP_γ(g) = g·min(1, γ/‖g‖)
    (Frobenius norm for the q×p first-stage gradient).

    Parameters
    ----------
    Z : array_like, shape (n, q)
        Instruments (exogenous regressors first when ``n_exog > 0``).
    X : array_like, shape (n, p)
        Regressors, q >= p.
    Y : array_like, shape (n,)
        Outcome.
    T : int
        Number of iterations (>= 1).
    rho1, rho2 : float
        zCDP budgets of the first (Θ) and second (β) stage, > 0. ``numpy.inf`` means no
        noise in that stage: the fit is then NOT private (the accountant reports
        ρ = inf) and a :class:`~dpivreg.PrivacyLeakWarning` is raised. A noiseless first
        stage does not leave β private at ρ2 either: Θ⁽ᵗ⁾ would be an unreleased function of
        the data feeding the second stage, whose sensitivity is then no longer 2γ2/n.
    eta, alpha : float
        Step sizes of the two stages (> 0).
    clip1, clip2 : float, (float, float) or None
        Clipping thresholds γ1, γ2, in [1e-100, 1e100] (:func:`dpivreg._validation.check_raw_clip`: float64 clips
        exactly there, see :ref:`the privacy boundary <method-boundary>`). ``None`` disables clipping, which leaves the
        gradient's sensitivity unbounded: only allowed with the matching ρ = inf. A pair
        (γ_exog, γ_rest) (both stages, with ``n_exog > 0``) clips by groups: the rows of the
        first-stage gradient zᵢrᵢᵀ that belong to the exogenous instruments, and the exogenous
        coordinates of the second-stage gradient, are clipped to γ_exog with their own norm; the
        rest to γ_rest. Each group is then a Gaussian mechanism of its own (sensitivity 2γ/n),
        noised with its share of the budget (``group_share``). High-leverage rows in the controls
        (rare categories) then inflate only the exogenous group's noise; with the Cholesky
        preconditioner below the endogenous coefficients do not depend on that noise (the
        exogenous and endogenous coordinates are orthogonal in the whitened basis).
    calibration : {"exact", "paper"}
        ``"exact"`` (default): λk = (γk/n)·sqrt(2T/ρk), spending exactly ρk.
        ``"paper"``: the Proposition's λk = (2γk/n)·sqrt(T/ρk), which spends ρk/2; the
        accountant records ρk/2.
    seed : None, int, numpy.random.SeedSequence or numpy.random.Generator
        Source of the privacy noise. Same seed, same path, bit for bit; ``None`` draws
        fresh entropy from the operating system.
    n_exog : int, default 0
        The first ``n_exog`` columns of X are exogenous and equal the first ``n_exog``
        columns of Z. Their first-stage block is the identity (2SLS projects an exogenous
        column onto itself exactly) and is not estimated: Θ holds only the endogenous
        block (q × (p − n_exog)) and x̂ᵢ = [exogᵢ, Θᵀzᵢ].
    method : {"gd", "preconditioned"}
        ``"gd"`` (default): the paper's Algorithm as written. ``"preconditioned"``: the second
        stage works in the coordinates whitened by P_t = Θ̄⁽ᵗ⁾ᵀ S Θ̄⁽ᵗ⁾ + ridge·I, with
        Θ̄⁽ᵗ⁾ = [I_exog | Θ⁽ᵗ⁾] the full first stage and S the public ``second_moment``::

            β⁽ᵗ⁺¹⁾ = β⁽ᵗ⁾ − α P_t^(−1/2) [ (1/n) Σᵢ CLIP_γ2( P_t^(−1/2) x̂ᵢ (x̂ᵢᵀβ⁽ᵗ⁾ − yᵢ) ) − ν⁽ᵗ⁾ ]

        i.e. a Newton-like step P_t⁻¹·gradient in which each per-sample gradient is mapped
        by the public matrix P_t^(−1/2) *before* clipping, and the noise is added before the
        second P_t^(−1/2). With group clipping the square root is the Cholesky one, W = L⁻¹
        with P_t = LLᵀ (exogenous coordinates first): β ← β − α Wᵀ[(1/n)Σ CLIP(W x̂ᵢeᵢ) − ν]. P_t is a function of the
        released Θ⁽ᵗ⁾ and public inputs only, so the clipped mean still has sensitivity 2γ2/n and the privacy proof is
        unchanged. The first stage is unchanged: whiten Z beforehand (E[zzᵀ] ≈ I) to precondition it.
    second_moment : array_like, shape (q, q), optional
        Public (or privately released) estimate of ZᵀZ/n used in P_t; identity when None
        (right for whitened instruments). Only with ``method="preconditioned"``.
    ridge : float, optional
        Regularisation of P_t while Θ⁽ᵗ⁾ is still near 0 (at t = 0 the endogenous block of
        P_t is 0). Default: q·(η·λ1)² + 1e-4, the first stage's per-step noise level plus a
        floor, on the working scale. Only with ``method="preconditioned"``.
    theta0, beta0 : array_like, optional
        Starting point Θ⁽⁰⁾ (q × (p − n_exog)) and β⁽⁰⁾ (p); zeros (the Algorithm) when None. A
        start computed from private releases (e.g. 2SLS on released second moments) is
        post-processing and costs no privacy.
    schedule : array_like, shape (2, T), optional
        Share of each stage's budget spent at each step (row 0: first stage, row 1: second stage),
        non-negative, each row summing to 1. A zero share means the stage does not update at
        that step (no release, no noise). Step t of stage k then spends ρk·schedule[k, t] and its
        noise is calibrated to that share. None: the uniform schedule 1/T (the Algorithm).
    group_share : float, default 0.2
        With group clipping (``clip1``/``clip2`` given as pairs): the share of each stage's per-step
        budget spent on the exogenous group; the rest goes to the instruments' rows (stage 1) and the
        endogenous coordinates (stage 2).
    kernel : {"auto", "numba", "numpy"}
        Implementation of the pass over the rows (:mod:`dpivreg.compute.kernels`); all give the same
        path to rounding (1e-12 relative). ``"auto"``: numba when installed (``pip install
        "dpivreg[fast]"``) and the per-row work q·(p_endog + p + 1) is at most 800
        multiply-adds, otherwise numpy with BLAS on cache-sized blocks.
    n_threads : int, optional
        Threads for in-memory data (default: every core this process may use), at most one per
        20,000 rows. Partial sums are added in a fixed order, so a given thread count gives the
        same path bit for bit. Ignored for Dask arrays, whose blocks run on Dask's scheduler.
        While a fit runs on several threads (ours or Dask's local ones), BLAS is held to one
        thread (threadpoolctl, process-wide) so that the cores are not oversubscribed.
    progress : bool or None, default None
        A progress bar over the iterations (tqdm; on stderr, or a widget in a notebook), labelled
        "DP-2S-GD iterations". ``None``: only when the run, projected from its steps so far, will take more
        than :data:`PROGRESS_SECONDS` (5 s) and stderr is a terminal or the code runs in a notebook;
        ``True``: always; ``False``: never. The bar reads only the clock: the path is the same bit for bit
        with and without it. It is closed when the run ends or fails.

    Returns
    -------
    DP2SGDPath
        The released paths ``theta`` (T+1, q, p − n_exog) and ``beta`` (T+1, p), the noise
        scales, clipping thresholds, step sizes and the accountant ``privacy``.

    Raises
    ------
    ValueError, TypeError
        Invalid arguments (the message names the argument).
    DivergenceError
        An iterate became non-finite (step size too large).

    Notes
    -----
    Per-sample clipping uses ‖zᵢ(zᵢᵀΘ − xᵢᵀ)‖_F = ‖zᵢ‖·‖rᵢ‖ and ‖x̂ᵢ eᵢ‖ = ‖x̂ᵢ‖·abs(eᵢ), so
    one step is one pass over the rows (:mod:`dpivreg.compute.kernels`): O(n·q·p) flops, no n-length
    temporaries and no loop over rows in Python.

    Floating point: each pass sums at most 2¹⁶ rows per kernel call (a thread's range and a Dask partition are cut
    into such blocks) and adds the blocks' sums pairwise, so every term of the clipped sums passes through at most
    k(n) = min(n, 2¹⁶) + 2·⌈log₂ n⌉ + 1 roundings, whatever the layout. The sensitivity 2γk/n and the noise λk are both
    multiplied by the rounding allowance (1 + τ)·(1 + n·γ_k(n)) of :func:`dpivreg.privacy.rounding.gradient_rounding`
    (1 + 7.3·10⁻⁴ at n = 10⁸), recorded as ``Release.rounding``: the computed clipped means of neighbouring data sets
    differ by at most the recorded sensitivity, and ρ is what was asked.

    ``Z``, ``X`` and ``Y`` may be Dask arrays (all three): each iteration then computes the
    per-block clipped sums on Dask's current scheduler, adds them at the driver and draws the
    noise there, so the path for a given seed equals the in-memory one up to the order of
    summation. The arrays are not persisted: call ``.persist()`` first if they fit in the
    cluster's memory, otherwise every iteration reads them again from their source.
    """
    progress = check_progress(progress)
    rows, p, n_exog = _validate_data(Z, X, Y, n_exog, kernel=kernel, n_threads=n_threads)
    try:
        return run_on_rows(rows, p, n_exog, T=T, rho1=rho1, rho2=rho2, eta=eta, alpha=alpha, clip1=clip1,
                           clip2=clip2, calibration=calibration, seed=seed, method=method,
                           second_moment=second_moment, ridge=ridge, theta0=theta0, beta0=beta0, schedule=schedule,
                           group_share=group_share, progress=progress)
    finally:
        rows.close()


def run_on_rows(rows: RowSource, p: int, n_exog: int, *, T, rho1, rho2, eta, alpha, clip1, clip2,
                calibration: str = "exact", seed=None, method: str = "gd", second_moment=None, ridge=None,
                theta0=None, beta0=None, schedule=None, group_share: float = 0.2,
                progress: bool | None = None) -> DP2SGDPath:
    """:func:`dp_2s_gd` on a checked :class:`~dpivreg.compute.backends.RowSource` (:func:`row_source`), so that a fit
    can make other passes (e.g. the clipping release) over the same rows; the caller closes ``rows``."""
    progress = check_progress(progress)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
    T = check_T(T)
    rho1 = check_rho(rho1, "rho1")
    rho2 = check_rho(rho2, "rho2")
    eta = check_positive(eta, "eta")
    alpha = check_positive(alpha, "alpha")
    clip1, clip2, grouped = _check_clips(clip1, clip2)
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}.")
    schedule = check_schedule(schedule, T)
    if grouped and not (isinstance(group_share, numbers.Real) and 0.0 < group_share < 1.0):
        raise ValueError(f"group_share must be a number in (0, 1), got {group_share!r}.")
    rng = make_rng(seed)
    if grouped and n_exog == 0:
        raise ValueError("clip1/clip2 as (exogenous, rest) pairs need exogenous columns (n_exog > 0); pass "
                         "single thresholds instead.")
    start = _check_start(theta0, beta0, rows.q, p, n_exog)
    return _run(rows, p, n_exog, T=T, rho1=rho1, rho2=rho2, eta=eta, alpha=alpha, clip1=clip1, clip2=clip2,
                calibration=calibration, rng=rng, method=method, second_moment=second_moment, ridge=ridge,
                start=start, schedule=schedule, split=n_exog if grouped else None,
                group_share=float(group_share) if grouped else 0.0, progress=progress)


def _check_clips(clip1, clip2):
    """Both thresholds single (or None), or both (exogenous, rest) pairs; returns them and whether grouped."""
    pairs = [isinstance(c, (tuple, list)) for c in (clip1, clip2)]
    if any(pairs) and not all(pairs):
        raise TypeError("clip1 and clip2 must both be single thresholds or both (exogenous, rest) pairs.")
    if not all(pairs):
        return (check_raw_clip(clip1, "clip1", allow_none=True), check_raw_clip(clip2, "clip2", allow_none=True),
                False)
    checked = []
    for c, name in ((clip1, "clip1"), (clip2, "clip2")):
        if len(c) != 2:
            raise ValueError(f"{name} as a pair must be (exogenous, rest), got {c!r}.")
        checked.append((check_raw_clip(c[0], f"{name}[0]"), check_raw_clip(c[1], f"{name}[1]")))
    return checked[0], checked[1], True


def check_schedule(schedule, T: int) -> np.ndarray:
    """The (2, T) budget schedule (uniform when None): non-negative rows summing to 1."""
    if schedule is None:
        return np.full((2, T), 1.0 / T)
    try:
        S = np.array(schedule, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"schedule must be a (2, T) array of budget shares: {exc}") from exc
    if S.shape != (2, T):
        raise ValueError(f"schedule must have shape (2, T) = (2, {T}), got {S.shape}.")
    if not np.all(np.isfinite(S)) or np.any(S < 0):
        raise ValueError("schedule must hold finite, non-negative budget shares.")
    if not np.allclose(S.sum(axis=1), 1.0, rtol=0, atol=1e-12):
        raise ValueError(f"each row of schedule must sum to 1 (the stage's whole budget), got {S.sum(axis=1)}.")
    return S


def _check_start(theta0, beta0, q: int, p: int, n_exog: int) -> tuple[np.ndarray, np.ndarray]:
    theta = np.zeros((q, p - n_exog)) if theta0 is None else _as_float_matrix(theta0, "theta0", ndim=2)
    beta = np.zeros(p) if beta0 is None else _as_float_matrix(beta0, "beta0", ndim=1)
    if theta.shape != (q, p - n_exog):
        raise ValueError(f"theta0 must have shape (q, p - n_exog) = ({q}, {p - n_exog}), got {theta.shape}.")
    if beta.shape != (p,):
        raise ValueError(f"beta0 must have shape ({p},), got {beta.shape}.")
    return theta, beta


def _run(rows: RowSource, p: int, n_exog: int, *, T: int, rho1: float, rho2: float, eta: float, alpha: float,
         clip1, clip2, calibration: str, rng: np.random.Generator, method: str, second_moment, ridge: float | None,
         start: tuple[np.ndarray, np.ndarray], schedule: np.ndarray, split: int | None,
         group_share: float, progress: bool | None = None) -> DP2SGDPath:
    """The iteration of :func:`dp_2s_gd` on checked arguments."""

    n, q = rows.n, rows.q
    if method != "preconditioned" and (second_moment is not None or ridge is not None):
        raise ValueError('second_moment and ridge only apply to method="preconditioned".')
    plan = iteration_plan(n, q, p, n_exog, T=T, rho1=rho1, rho2=rho2, eta=eta, alpha=alpha, clip1=clip1,
                          clip2=clip2, calibration=calibration, method=method, schedule=schedule,
                          group_share=group_share, ridge=ridge)
    ridge, root_kind = plan.ridge, plan.root
    p_endog = p - n_exog
    # The clipped sums as computed differ between neighbours by up to the rounding allowance of their order of
    # summation (dpivreg.privacy.rounding: blocks of 2¹⁶ terms, added pairwise): sensitivity and noise are both
    # times it (the same ρ). On the secure sampler each step's release of a group is then made on that group's grid,
    # its noise and sensitivity both times the grid's factor (the same ρ; dpivreg.privacy.sampler.calibrate).
    rounding = gradient_rounding(rows.n_units, q, p, p_endog)
    grids1, factors1 = _group_grids(rng, clip1, n, split, q, p_endog, rounding)
    grids2, factors2 = _group_grids(rng, clip2, n, split, p, 1, rounding)
    noise1, noise2 = plan.noise1 * (rounding * factors1), plan.noise2 * (rounding * factors2)
    per_unit = " of per-unit gradients" if getattr(rows, "unit_level", False) else ""  # dpivreg.privacy.units
    privacy = PrivacyBudget(
        [*_stage_releases(f"first stage: Θ path{per_unit}", "rho1", clip1, noise1, schedule[0], n, split,
                          ("exogenous rows", "instrument rows"), grids1, factors1, rounding),
         *_stage_releases(f"second stage: β path{per_unit}", "rho2", clip2, noise2, schedule[1], n, split,
                          ("exogenous coordinates", "endogenous coordinates"), grids2, factors2, rounding)],
        target={"rho1": rho1, "rho2": rho2},
    )
    _check_spent(privacy, rho1, rho2, calibration)
    _warn_if_not_private(privacy)

    theta = np.zeros((T + 1, q, p_endog))
    beta = np.zeros((T + 1, p))
    theta[0], beta[0] = start
    clipped_rows = np.zeros((T, 2), dtype=np.int64)
    preconditioner = None
    if method == "preconditioned":
        S = _check_second_moment(second_moment, q)

        def preconditioner(theta_t: np.ndarray) -> np.ndarray:
            return preconditioner_root(theta_t, S, n_exog, ridge, root_kind)

    forecast = RunTimeForecast("DP-2S-GD", T, "Interrupt and choose a smaller T (the default picks T from "
                               "the releases), or let it run.", progress=progress, desc="DP-2S-GD iterations")
    with forecast, np.errstate(over="ignore", invalid="ignore"):
        for t in range(T):
            forecast.step(t)
            # Draw both stages' noise up front so the random stream does not depend on the data.
            sigma1, grid1 = _entries(noise1[t], grids1, split, (q, p_endog))
            sigma2, grid2 = _entries(noise2[t], grids2, split, (p,))
            xi = draw_noise(rng, sigma1, grid1)
            nu = draw_noise(rng, sigma2, grid2)

            # One pass over the rows gives both stages' clipped sums; the root comes from the released Θ⁽ᵗ⁾ only.
            W = None if preconditioner is None else preconditioner(theta[t])
            grad1, grad2, clipped_rows[t] = _clipped_gradients(rows, theta[t], beta[t], W, n_exog, clip1, clip2,
                                                               split)
            released1, released2 = add_noise(grad1, -xi, grid1), add_noise(grad2, -nu, grid2)
            theta[t + 1] = theta[t] - eta * released1 if schedule[0, t] > 0 else theta[t]
            _check_finite(theta[t + 1], "first-stage (Θ) iterate", t + 1, "eta", eta)
            step = released2
            beta[t + 1] = (beta[t] - alpha * (step if W is None else W.T @ step)) if schedule[1, t] > 0 else beta[t]
            if not np.all(np.isfinite(beta[t + 1])) and _first_stage_exploding(theta[: t + 2]):
                _check_finite(beta[t + 1], "second-stage (β) iterate, driven by an exploding first stage (Θ),",
                              t + 1, "eta", eta)
            _check_finite(beta[t + 1], "second-stage (β) iterate", t + 1, "alpha", alpha)

    _check_bouncing(theta, eta, _largest(clip1), "first-stage (Θ)", "eta")
    _check_bouncing(beta, alpha, _largest(clip2), "second-stage (β)", "alpha")
    return DP2SGDPath(
        theta=theta,
        beta=beta,
        lambda1=float(np.max(noise1)),
        lambda2=float(np.max(noise2)),
        clip1=clip1,
        clip2=clip2,
        eta=eta,
        alpha=alpha,
        n_exog=n_exog,
        calibration=calibration,
        method=method,
        privacy=privacy,
        ridge=ridge if method == "preconditioned" else None,
        clipped_rows=clipped_rows,
        schedule=schedule,
        noise1=noise1,
        noise2=noise2,
        split=split,
        group_share=group_share,
        root=root_kind,
    )


def _rest(clip):
    """The threshold of the non-exogenous group (the only one without group clipping)."""
    return clip[1] if isinstance(clip, tuple) else clip


def _largest(clip):
    return None if clip is None else (max(clip) if isinstance(clip, tuple) else clip)


def _per_row(noise_t: np.ndarray, split: int | None, size: int) -> np.ndarray:
    """Noise std of each row of Θ (or coordinate of β) at one step: the exogenous group's for the first
    ``split`` rows, the rest's after."""
    stds = np.full(size, noise_t[1])
    if split is not None:
        stds[:split] = noise_t[0]
    return stds


def _group_grids(rng: np.random.Generator, clip, n: int, split: int | None, rows: int,
                 width: int, rounding: float = 1.0) -> tuple[tuple[float, float] | None, np.ndarray]:
    """Each clipping group's grid and noise factor Δ′/Δ on the secure sampler (:func:`dpivreg.privacy.sampler.grid_for`
    for the group's per-step sensitivity Δ = 2γ/n times the sum's ``rounding`` allowance and its d = rows × width
    entries); (None, ones) on a seeded generator. A group without clipping (a non-private run) gets grid 0 (no
    rounding) and factor 1."""
    if sampler_of(rng) == "seeded":
        return None, np.ones(2)
    thresholds = (clip, clip) if split is None else clip
    counts = (rows, rows) if split is None else (split, rows - split)
    grids, factors = [0.0, 0.0], np.ones(2)
    for g, (threshold, count) in enumerate(zip(thresholds, counts)):
        if threshold is not None and count > 0:
            sensitivity = rounding * clipped_mean_sensitivity(threshold, n)
            grids[g], accounted = grid_for(sensitivity, count * width)
            factors[g] = accounted / sensitivity
    return (grids[0], grids[1]), factors


def _entries(noise_t: np.ndarray, grids: tuple[float, float] | None, split: int | None,
             shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-entry noise std and grid of one step's release (rows of Θ, or coordinates of β): the exogenous group's
    for the first ``split`` rows, the rest's after; no grid where the step adds no noise."""
    def per_entry(groups) -> np.ndarray:
        rows = _per_row(np.asarray(groups), split, shape[0])
        return np.broadcast_to(rows.reshape(-1, *([1] * (len(shape) - 1))), shape)

    sigma = per_entry(noise_t)
    return (sigma, None) if grids is None else (sigma, np.where(sigma > 0, per_entry(grids), 0.0))


def _stage_noise(clip, n: int, rho: float, shares: np.ndarray, split: int | None, group_share: float,
                 calibration: str, stage: str) -> np.ndarray:
    """(T, 2) noise stds [exogenous group, rest] of one stage: step t spends ρ·shares[t], split between the
    groups as ``group_share`` : 1 − ``group_share``; 0 where the stage does not update."""
    noise = np.zeros((shares.shape[0], 2))
    group_shares = (1.0, 1.0) if split is None else (group_share, 1.0 - group_share)
    thresholds = (clip, clip) if split is None else clip
    for t, share in enumerate(shares):
        if share > 0:
            for g in (0, 1):
                noise[t, g] = _stage_noise_std(thresholds[g], n, 1, rho * share * group_shares[g], calibration, stage)
    return noise


def _stage_releases(name: str, stage: str, clip, noise: np.ndarray, shares: np.ndarray, n: int,
                    split: int | None, group_names: tuple[str, str], grids: tuple[float, float] | None = None,
                    factors: np.ndarray | None = None, rounding: float = 1.0) -> list[Release]:
    """One record per run of consecutive active steps with equal noise, per clipping group (``noise`` as drawn, the
    sums' ``rounding`` allowance included; on the secure sampler each group's ``grids`` and the sensitivity's
    ``factor``)."""
    groups = [(None, clip, 1)] if split is None else [(group_names[0], clip[0], 0), (group_names[1], clip[1], 1)]
    uniform = np.allclose(shares, shares[0])
    records = []
    for group, threshold, g in groups:
        active = [t for t in range(len(shares)) if shares[t] > 0]
        runs: list[list[int]] = []
        for t in active:
            if runs and runs[-1][-1] == t - 1 and noise[t, g] == noise[runs[-1][-1], g]:
                runs[-1].append(t)
            else:
                runs.append([t])
        for run in runs:
            label = name + (f" ({group})" if group else "")
            if not uniform:
                label += f", step {run[0] + 1}" if len(run) == 1 else f", steps {run[0] + 1}-{run[-1] + 1}"
            grid = None if grids is None or noise[run[0], g] == 0 else grids[g]
            records.append(Release.gaussian(label, stage, steps=len(run), clip=threshold, n=n,
                                            noise_std=noise[run[0], g], grid=grid or None,
                                            factor=float(factors[g]) if grid else 1.0,
                                            rounding=rounding if threshold is not None else 1.0))
    return records


def _clipped_gradients(rows: RowSource, theta: np.ndarray, beta: np.ndarray, W: np.ndarray | None, n_exog: int,
                       clip1, clip2, split: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(1/n)·Σᵢ CLIP_γ1(zᵢrᵢᵀ), (1/n)·Σᵢ CLIP_γ2(x̃ᵢeᵢ) and the clipped-row counts of one iteration.

    x̃ᵢ = W x̂ᵢ (W = I for ``method="gd"``). The fused pass (:func:`dpivreg.compute.kernels.block_sums`) is exact
    unless it flags a row whose norm overflows float64 or nears the limits where it would be inexact
    (:func:`dpivreg.compute.kernels.group_clips`); then the iteration is recomputed by the safe pass. With privacy units
    the sums run over units of summed row gradients, n is the public normaliser n̂ = N·k̂ and the counts count units
    (:mod:`dpivreg.privacy.units`).
    """
    gamma1 = _no_clip_as_inf(clip1)
    gamma2 = _no_clip_as_inf(clip2)
    M, whitened = pass_matrix(theta, beta, None if W is None else W.T, n_exog)
    S1, s2, counts = rows.clipped_sums(M, gamma1, gamma2, split)
    if counts[2]:
        S1, s2, counts = rows.safe_sums(theta, whitened, M[:, -1], gamma1, gamma2, split)
    return S1 / rows.n, s2 / rows.n, counts[:2]


def _no_clip_as_inf(clip):
    return math.inf if clip is None else clip


def _stage_noise_std(clip: float | None, n: int, T: int, rho: float, calibration: str, stage: str) -> float:
    if clip is None and math.isfinite(rho):
        raise ValueError(
            f"clip{stage}=None (no clipping) leaves the stage-{stage} gradient's sensitivity unbounded, so no "
            f"finite rho{stage} can be guaranteed. Pass a clipping threshold clip{stage} > 0, or rho{stage}=numpy.inf "
            "for an explicitly non-private run."
        )
    return noise_std(clip, n, T, rho, calibration)


def _check_spent(privacy: PrivacyBudget, rho1: float, rho2: float, calibration: str) -> None:
    """Guard against calibration bugs: the accountant (computed from the noise actually used) must spend
    exactly what was asked (``"exact"``) or half of it (``"paper"``)."""
    share = 1.0 if calibration == "exact" else 0.5
    for spent, asked, name in ((privacy.rho1, rho1, "rho1"), (privacy.rho2, rho2, "rho2")):
        if math.isfinite(asked) and not math.isclose(spent, share * asked, rel_tol=1e-9):
            raise RuntimeError(
                f"internal error: the {name} noise spends {spent!r} zCDP but {share * asked!r} was intended. "
                "Please report this bug."
            )


def _warn_if_not_private(privacy: PrivacyBudget) -> None:
    leaks = [f"{r.stage} ({r.name}): " + ("no noise" if r.noise_std == 0 else "no clipping")
             for r in privacy.releases if not math.isfinite(r.rho)]
    if leaks:
        warnings.warn(
            "this DP-2S-GD run is NOT differentially private: " + "; ".join(leaks)
            + ". The accountant reports rho = inf and epsilon = inf. (A noiseless first stage also voids "
            "the second stage's guarantee: the paper's remark that rho1 = inf keeps β private is wrong.)",
            PrivacyLeakWarning,
            stacklevel=4,
        )
