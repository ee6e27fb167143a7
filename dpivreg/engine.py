"""The numerical engine: noisy two-stage gradient descent (Algorithm DP-2S-GD).

This module knows nothing of pandas, formulas or scaling: it takes arrays ``Z`` (n×q),
``X`` (n×p), ``Y`` (n,) on the scale the caller chose (numpy, or Dask for data larger than
memory) and returns the released paths. The pass over the rows that each iteration makes is in
:mod:`dpivreg.kernels` (numba or numpy) and :mod:`dpivreg.backends` (threads or Dask blocks).
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass, field

import numpy as np

from .backends import DaskRows, InMemoryRows, RowSource, is_dask_collection
from .kernels import KERNELS, pass_matrix
from .privacy import PrivacyBudget, PrivacyLeakWarning, Release, check_rho, noise_std, CALIBRATIONS

__all__ = ["dp_2s_gd", "DP2SGDPath", "DivergenceError", "METHODS"]

METHODS = ("gd", "preconditioned")


class DivergenceError(ArithmeticError):
    """An iterate of DP-2S-GD became non-finite: the step size is too large for the data's scale."""


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
        Noise standard deviations of the two stages (0: no noise).
    clip1, clip2 : float or None
        Clipping thresholds γ1, γ2 (``None``: no clipping).
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


# ----------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------
def _as_float_matrix(a, name: str, *, ndim: int) -> np.ndarray:
    """``a`` as a C-contiguous float64 array of ``ndim`` dimensions, checked finite (no copy when it already is one)."""
    try:
        arr = np.asarray(a)
    except Exception as exc:  # pragma: no cover - numpy raises many types here
        raise TypeError(f"{name} must be array-like of numbers: {exc}") from exc
    _check_number_dtype(arr.dtype, name)
    arr = _fix_ndim(arr, name, ndim)
    arr = np.ascontiguousarray(arr, dtype=np.float64)
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


def check_positive(value, name: str, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive number, got {value!r}.")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}.")
    return value


def check_T(T) -> int:
    if isinstance(T, bool) or not isinstance(T, numbers.Integral):
        raise TypeError(f"T must be an integer number of iterations >= 1, got {T!r}.")
    if T < 1:
        raise ValueError(f"T must be >= 1, got {T}.")
    return int(T)


def make_rng(seed) -> np.random.Generator:
    """A numpy Generator from ``seed``: None (fresh OS entropy), an int >= 0, a SeedSequence or a Generator."""
    if seed is None or isinstance(seed, (np.random.SeedSequence,)):
        return np.random.default_rng(seed)
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        if seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed}.")
        return np.random.default_rng(int(seed))
    raise TypeError(
        f"seed must be None, a non-negative int, a numpy.random.SeedSequence or a numpy.random.Generator, "
        f"got {type(seed).__name__}."
    )


def _validate_data(Z, X, Y, n_exog, *, kernel: str = "auto", n_threads: int | None = None) -> tuple[RowSource, int, int]:
    """Check the data and wrap it as a :class:`~dpivreg.backends.RowSource`; returns (rows, p, n_exog)."""
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
        return _validate_dask_data(Z, X, Y, n_exog, kernel=kernel)
    Z = _as_float_matrix(Z, "Z", ndim=2)
    X = _as_float_matrix(X, "X", ndim=2)
    Y = _as_float_matrix(Y, "Y", ndim=1)
    n_exog = _check_shapes(Z.shape, X.shape, Y.shape, n_exog)
    if n_exog and not np.array_equal(X[:, :n_exog], Z[:, :n_exog]):
        raise ValueError(_exog_mismatch_message(n_exog))
    return InMemoryRows(Z, X[:, n_exog:], Y, kernel=kernel, n_threads=n_threads), X.shape[1], n_exog


def _check_shapes(z_shape, x_shape, y_shape, n_exog) -> int:
    n, q = z_shape
    p = x_shape[1]
    if x_shape[0] != n or y_shape[0] != n:
        raise ValueError(f"Z, X and Y must have the same number of rows, got {n}, {x_shape[0]} and {y_shape[0]}.")
    if n < 1:
        raise ValueError("the data has no rows.")
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


def _validate_dask_data(Z, X, Y, n_exog, *, kernel: str) -> tuple[RowSource, int, int]:
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
            a = a.compute_chunk_sizes()
        arrays[name] = a.astype(np.float64)
    Z, X, Y = arrays["Z"], arrays["X"], arrays["Y"]
    n_exog = _check_shapes(Z.shape, X.shape, Y.shape, n_exog)
    X = X.rechunk({0: Z.chunks[0]})
    checks = [da.isfinite(Z).all(), da.isfinite(X).all(), da.isfinite(Y).all()]
    if n_exog:
        checks.append((X[:, :n_exog] == Z[:, :n_exog]).all())
    results = dask.compute(*checks)
    for ok, name in zip(results[:3], "ZXY"):
        if not ok:
            raise ValueError(f"{name} contains NaN or infinite values: drop or impute those rows first.")
    if n_exog and not results[3]:
        raise ValueError(_exog_mismatch_message(n_exog))
    return DaskRows(Z, X[:, n_exog:], Y, kernel=kernel), X.shape[1], n_exog


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
    q = S.shape[0]
    exog_block = np.broadcast_to(np.eye(q, n_exog), theta_endog.shape[:-1] + (n_exog,))
    theta_full = np.concatenate([exog_block, theta_endog], axis=-1)
    P = np.swapaxes(theta_full, -1, -2) @ S @ theta_full
    P = (P + np.swapaxes(P, -1, -2)) / 2.0 + ridge * np.eye(P.shape[-1])
    eigenvalues, vectors = np.linalg.eigh(P)
    return (vectors / np.sqrt(np.maximum(eigenvalues, ridge))[..., None, :]) @ np.swapaxes(vectors, -1, -2)


def _check_bouncing(path: np.ndarray, step: float, clip: float | None, what: str, name: str) -> None:
    """Detect a step size too large for clipped gradients: the iterates stay finite but bounce.

    With clipping, a divergent iteration cannot overflow: each step moves at most step·γ. It then
    flips direction at (nearly) full, steady length. We flag four consecutive reversals (cosine < −0.5
    between successive moves) of steady length (successive ratios within [0.8, 1.25]), each
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
    steady = np.all((ratios > 0.8) & (ratios < 1.25))
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
    clip1, clip2 : float or None
        Clipping thresholds γ1, γ2 (> 0). ``None`` disables clipping, which leaves the
        gradient's sensitivity unbounded: only allowed with the matching ρ = inf.
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
        second P_t^(−1/2). P_t is a function of the released Θ⁽ᵗ⁾ and public inputs only, so the
        clipped mean still has sensitivity 2γ2/n and the privacy proof is unchanged. The
        first stage is unchanged: whiten Z beforehand (E[zzᵀ] ≈ I) to precondition it.
    second_moment : array_like, shape (q, q), optional
        Public (or privately released) estimate of ZᵀZ/n used in P_t; identity when None
        (right for whitened instruments). Only with ``method="preconditioned"``.
    ridge : float, optional
        Regularisation of P_t while Θ⁽ᵗ⁾ is still near 0 (at t = 0 the endogenous block of
        P_t is 0). Default: q·(η·λ1)² + 1e-4, the first stage's per-step noise level plus a
        floor, on the working scale. Only with ``method="preconditioned"``.
    kernel : {"auto", "numba", "numpy"}
        Implementation of the pass over the rows (:mod:`dpivreg.kernels`); all give the same
        path to rounding (1e-12 relative). ``"auto"``: numba when installed (``pip install
        "dpivreg[fast]"``) and the per-row work q·(p_endog + p + 1) is at most 800
        multiply-adds, otherwise numpy with BLAS on cache-sized blocks.
    n_threads : int, optional
        Threads for in-memory data (default: every core this process may use), at most one per
        20,000 rows. Partial sums are added in a fixed order, so a given thread count gives the
        same path bit for bit. Ignored for Dask arrays, whose blocks run on Dask's scheduler.
        While a fit runs on several threads (ours or Dask's local ones), BLAS is held to one
        thread (threadpoolctl, process-wide) so that the cores are not oversubscribed.

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
    one step is one pass over the rows (:mod:`dpivreg.kernels`): O(n·q·p) flops, no n-length
    temporaries and no loop over rows in Python.

    ``Z``, ``X`` and ``Y`` may be Dask arrays (all three): each iteration then computes the
    per-block clipped sums on Dask's current scheduler, adds them at the driver and draws the
    noise there, so the path for a given seed equals the in-memory one up to the order of
    summation. The arrays are not persisted: call ``.persist()`` first if they fit in the
    cluster's memory, otherwise every iteration reads them again from their source.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
    T = check_T(T)
    rho1 = check_rho(rho1, "rho1")
    rho2 = check_rho(rho2, "rho2")
    eta = check_positive(eta, "eta")
    alpha = check_positive(alpha, "alpha")
    clip1 = check_positive(clip1, "clip1", allow_none=True)
    clip2 = check_positive(clip2, "clip2", allow_none=True)
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}.")
    rng = make_rng(seed)
    rows, p, n_exog = _validate_data(Z, X, Y, n_exog, kernel=kernel, n_threads=n_threads)
    try:
        return _run(rows, p, n_exog, T=T, rho1=rho1, rho2=rho2, eta=eta, alpha=alpha, clip1=clip1, clip2=clip2,
                    calibration=calibration, rng=rng, method=method, second_moment=second_moment, ridge=ridge)
    finally:
        rows.close()


def _run(rows: RowSource, p: int, n_exog: int, *, T: int, rho1: float, rho2: float, eta: float, alpha: float,
         clip1: float | None, clip2: float | None, calibration: str, rng: np.random.Generator, method: str,
         second_moment, ridge: float | None) -> DP2SGDPath:
    """The iteration of :func:`dp_2s_gd` on checked arguments."""

    n, q = rows.n, rows.q
    lambda1 = _stage_noise_std(clip1, n, T, rho1, calibration, "1")
    lambda2 = _stage_noise_std(clip2, n, T, rho2, calibration, "2")
    privacy = PrivacyBudget(
        [
            Release.gaussian("first stage: Θ path", "rho1", steps=T, clip=clip1, n=n, noise_std=lambda1),
            Release.gaussian("second stage: β path", "rho2", steps=T, clip=clip2, n=n, noise_std=lambda2),
        ],
        target={"rho1": rho1, "rho2": rho2},
    )
    _check_spent(privacy, rho1, rho2, calibration)
    _warn_if_not_private(privacy)

    p_endog = p - n_exog
    theta = np.zeros((T + 1, q, p_endog))
    beta = np.zeros((T + 1, p))
    clipped_rows = np.zeros((T, 2), dtype=np.int64)
    preconditioner = None
    if method == "preconditioned":
        S = _check_second_moment(second_moment, q)
        if ridge is None:
            ridge = default_ridge(q, eta, lambda1)
            if not math.isfinite(ridge):
                raise ValueError(f"eta={eta:g} is too large: the default ridge q·(η·λ1)² overflows. Lower eta.")
        ridge = check_positive(ridge, "ridge")

        def preconditioner(theta_t: np.ndarray) -> np.ndarray:
            return _inverse_sqrt_preconditioner(theta_t, S, n_exog, ridge)
    elif second_moment is not None or ridge is not None:
        raise ValueError('second_moment and ridge only apply to method="preconditioned".')

    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(T):
            # Draw both stages' noise up front so the random stream does not depend on the data.
            xi = rng.standard_normal((q, p_endog)) * lambda1
            nu = rng.standard_normal(p) * lambda2

            # One pass over the rows gives both stages' clipped sums; P_t^(-1/2) comes from the released Θ⁽ᵗ⁾ only.
            root = None if preconditioner is None else preconditioner(theta[t])
            grad1, grad2, clipped_rows[t] = _clipped_gradients(rows, theta[t], beta[t], root, n_exog, clip1, clip2)
            theta[t + 1] = theta[t] - eta * (grad1 - xi)
            _check_finite(theta[t + 1], "first-stage (Θ) iterate", t + 1, "eta", eta)
            step = grad2 - nu
            beta[t + 1] = beta[t] - alpha * (step if root is None else root @ step)
            if not np.all(np.isfinite(beta[t + 1])) and _first_stage_exploding(theta[: t + 2]):
                _check_finite(beta[t + 1], "second-stage (β) iterate, driven by an exploding first stage (Θ),",
                              t + 1, "eta", eta)
            _check_finite(beta[t + 1], "second-stage (β) iterate", t + 1, "alpha", alpha)

    _check_bouncing(theta, eta, clip1, "first-stage (Θ)", "eta")
    _check_bouncing(beta, alpha, clip2, "second-stage (β)", "alpha")
    return DP2SGDPath(
        theta=theta,
        beta=beta,
        lambda1=lambda1,
        lambda2=lambda2,
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
    )


def _clipped_gradients(rows: RowSource, theta: np.ndarray, beta: np.ndarray, root: np.ndarray | None, n_exog: int,
                       clip1: float | None, clip2: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(1/n)·Σᵢ CLIP_γ1(zᵢrᵢᵀ), (1/n)·Σᵢ CLIP_γ2(x̃ᵢeᵢ) and the clipped-row counts of one iteration.

    The fused pass (:func:`dpivreg.kernels.block_sums`) is exact unless a row's gradient norm
    overflows float64; then the iteration is recomputed by the overflow-safe pass.
    """
    gamma1 = math.inf if clip1 is None else clip1
    gamma2 = math.inf if clip2 is None else clip2
    M, whitened = pass_matrix(theta, beta, root, n_exog)
    S1, s2, counts = rows.clipped_sums(M, gamma1, gamma2)
    if counts[2]:
        S1, s2, counts = rows.safe_sums(theta, whitened, M[:, -1], gamma1, gamma2)
    return S1 / rows.n, s2 / rows.n, counts[:2]


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
