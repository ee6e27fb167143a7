"""The finite-sample theory of DP-2S-GD: error-bound terms, validity conditions, regimes, contraction rates.

Everything here is a pure function of public quantities (sample size, dimensions, budgets,
iteration count). Nothing reads data, so nothing here costs privacy.

The bound
---------
The Theorem of the paper (Section 3, eq. ``(e_beta(T) bound thm2)``) states that, with
probability at least ``1 − c2·exp(−τ)``::

    ‖β⁽ᵀ⁾ − β̂‖ ≲ κ(τ)^(T/2)                                   (optimization term)
               + √p (√q + √τ)³ √T / (n √min(ρ1, ρ2))            (privacy term)
               + √(pq) (τ + log(pq)) / √n                       (statistical term)

provided ``T ≲ ρ1 n^(2−ε) / (p (√q + √τ)⁶)`` (eq. ``(T condition thm 1)``) and
``n ≥ c1 max{pq(τ + log pq)², (√q + √τ)³ / √min(ρ1, ρ2)}`` (eq. ``(n condition)``).
Here ``n`` is the sample size, ``p`` the number of regressors (all of them, exogenous and
endogenous), ``q`` the number of instruments (all of them, the exogenous regressors
included), ``T`` the number of iterations, ``ρ1, ρ2`` the zCDP budgets of the two stages
and ``τ`` the confidence parameter (default 5, as in the paper's experiments).

Conventions of this module
--------------------------
* **Constants.** The constants hidden by ``≲`` (and ``c1``) depend on β, Θ and the
  sub-Gaussian parameters, which are unknown. They are all set to 1 ("up to constants,
  c = 1"): the numbers returned here describe *shapes and trade-offs* (how the bound moves
  with n, T, ρ), not calibrated error levels.
* **The T condition** is evaluated in the limit ε → 0: ``T ≤ ρ1 n² / (p (√q + √τ)⁶)``.
* **Infinite budgets.** ``ρ = math.inf`` means no noise in that stage. The privacy term uses
  ``min(ρ1, ρ2)`` and is 0 only when both are infinite; the T condition involves ``ρ1`` only
  and disappears when ``ρ1`` is infinite (the paper's last remark of Section 3). Whether a
  noiseless first stage really leaves β⁽ᵗ⁾ ``ρ2``-private is a privacy question this module
  does not address; it only evaluates the bound.
* **Regimes** follow the remark after the Theorem literally: the optimization regime ends at
  ``T = log(n / (pq(τ + log pq)²)) / log(1/κ)`` (the crossing of the optimization and
  statistical terms), the privacy regime starts at ``T = n min(ρ1, ρ2) q (τ + log pq)² /
  (√q + √τ)⁶`` (the crossing of the privacy and statistical terms), and a T above the T
  condition limit is reported as "beyond the T condition". :attr:`ErrorBound.dominant`
  reports which term is actually the largest.

Definitions chosen for δ(τ), γ̄(τ), γ̲(τ) and κ(τ)
-------------------------------------------------
The paper defers these definitions to an appendix (eq. ``(definitions of parameters)``)
that is not available to us. This module uses the following definitions, chosen to be
consistent with everything the main text says about them:

* ``δ(τ) = (√q + √τ) / √n`` (:func:`delta_tau`): the high-probability bound on the
  deviation from 1 of the singular values of ``Z/√n`` for isotropic sub-Gaussian rows
  (Vershynin 2018, *High-Dimensional Probability*, Theorem 4.6.1, with its constant set
  to 1 and ``t = √τ``), so that the eigenvalues of ``ZᵀZ/n`` lie in
  ``[(1 − δ)², (1 + δ)²]``. With this choice the paper's step-size condition
  ``η < 2/(1 + δ)²`` (eq. ``(learning rates condition)``) is exactly the gradient-descent
  stability limit ``2/λ_max``, and κ_Θ below is exactly ``(L − μ)/(L + μ)``.
* ``γ̄ = (1 + δ)² σ_max(Θ)²`` and ``γ̲ = max(1 − δ, 0)² σ_min(Θ)²``
  (:func:`eigenvalue_bounds`): bounds on the eigenvalues of ``Θᵀ(ZᵀZ/n)Θ`` under
  isotropy, computed from a (released, hence public) ``q × p`` matrix Θ.
* ``κ_β = γ̄/(γ̄ + γ̲)``, ``κ_Θ = ((1 + δ)² − (1 − δ)²₊)/((1 + δ)² + (1 − δ)²₊)`` and
  ``κ = max(κ_β, κ_Θ)`` (:func:`contraction_rates`): the rates the paper's remark on
  optimal step sizes (eq. ``(optimum step sizes)``) attaches to the step sizes
  ``η* = 2/((1 + δ)² + (1 − δ)²)`` and ``α* = 2/(γ̄ + γ̲)``. Note that ``κ_β ≥ 1/2``
  always, so under these definitions κ is never below 1/2; and ``δ ≥ 1`` gives
  ``κ_Θ = 1`` (no contraction guaranteed).

Using a κ computed from a *released* Θ (for example the last iterate of a private fit) is
post-processing and costs no privacy; using the 2SLS Θ̂ of the raw data is not private.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from dpivreg._validation import as_real, check_count, check_rho, check_tau

__all__ = [
    "DEFAULT_TAU",
    "REGIMES",
    "optimization_term",
    "privacy_term",
    "statistical_term",
    "initial_error",
    "t_condition_limit",
    "n_condition_minimum",
    "Condition",
    "t_condition",
    "n_condition",
    "RegimeBoundaries",
    "regime_boundaries",
    "regime",
    "delta_tau",
    "eigenvalue_bounds",
    "ContractionRates",
    "contraction_rates",
    "StepSizes",
    "paper_step_sizes",
    "optimal_step_sizes",
    "ErrorBound",
    "error_bound",
]

#: Default confidence parameter τ (the paper's experiments use τ = 5).
DEFAULT_TAU = 5.0

REGIME_OPTIMIZATION = "optimization-dominated"
REGIME_PLATEAU = "statistical plateau"
REGIME_PRIVACY = "privacy-dominated"
REGIME_BEYOND = "beyond the T condition"
#: The four regime labels returned by :func:`regime`, in increasing order of T.
REGIMES = (REGIME_OPTIMIZATION, REGIME_PLATEAU, REGIME_PRIVACY, REGIME_BEYOND)

TERM_NAMES = ("optimization", "privacy", "statistical")

# Relative slack of boundary comparisons (T = 2500 against a limit computed as 2499.999999999999).
_BOUNDARY_RTOL = 1e-12


# ----------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------
def _real(value: object, name: str) -> float:
    """Return ``value`` as a float, raising TypeError for non-numbers and ValueError for NaN."""
    value = as_real(value, name, "a real number")
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN.")
    return value


def _check_n(n: float) -> float:
    n = _real(n, "n")
    if not (math.isfinite(n) and n >= 1):
        raise ValueError(f"n (sample size) must be a finite number >= 1, got {n!r}.")
    return n


def _check_dims(p: float, q: float) -> tuple[float, float]:
    p = float(check_count(p, "p", what="a whole number of regressors", integral_floats=True))
    q = float(check_count(q, "q", what="a whole number of instruments", integral_floats=True))
    if q < p:
        raise ValueError(f"q (number of instruments) must be finite and >= p = {p:g}, got {q!r}.")
    return p, q


def _check_kappa(kappa: float) -> float:
    kappa = _real(kappa, "kappa")
    if not 0.0 < kappa < 1.0:
        raise ValueError(f"kappa (contraction rate) must lie strictly between 0 and 1, got {kappa!r}.")
    return kappa


def _check_scalar_T(T: float, name: str = "T") -> float:
    T = _real(T, name)
    if not (math.isfinite(T) and T >= 1):
        raise ValueError(f"{name} (number of iterations) must be a finite number >= 1, got {T!r}.")
    return T


def _check_T_array(T: ArrayLike) -> tuple[np.ndarray, bool]:
    """Return T as a float array and whether it was a scalar; every entry must be finite and >= 1."""
    if isinstance(T, (numbers.Real, np.number)) and not isinstance(T, bool):
        return np.asarray(_check_scalar_T(T), dtype=float), True
    try:
        arr = np.asarray(T, dtype=float)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"T must be a number or an array of numbers, got {T!r}.") from exc
    if arr.size and not (np.all(np.isfinite(arr)) and np.all(arr >= 1)):
        raise ValueError("T (number of iterations) must be finite and >= 1 in every entry.")
    return arr, arr.ndim == 0


def initial_error(init: str, n: float, p: float, q: float, tau: float = DEFAULT_TAU) -> float:
    """The optimisation term's factor for a starting point (up to constants, c = 1): 1 from the Algorithm's
    zero start; from the warm start (``init="moments"``) the statistical term, capped at 1, i.e. a start as
    good as 2SLS (the released moments whiten the instruments well enough for a consistent 2SLS)."""
    return min(statistical_term(n, p, q, tau), 1.0) if init == "moments" else 1.0


def _check_start_error(value: float) -> float:
    value = _real(value, "start_error")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"start_error must be a finite number > 0, got {value!r}.")
    return value


def _check_target(target: float) -> float:
    target = _real(target, "target")
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"target (error level) must be a finite number > 0, got {target!r}.")
    return target


def _at_most(value: float, limit: float) -> bool:
    """``value <= limit`` up to a relative rounding slack (so exact boundaries count as inside)."""
    return value <= limit * (1.0 + _BOUNDARY_RTOL)


def _out(arr: np.ndarray, scalar: bool) -> float | np.ndarray:
    return float(arr) if scalar else arr


# ----------------------------------------------------------------------------------------
# building blocks (unvalidated scalars; every public function funnels through these so that
# the same float operations give the same numbers everywhere, e.g. in plan() and smallest_n())
# ----------------------------------------------------------------------------------------
def _pow(x: float, k: int) -> float:
    """``x ** k`` for a float x and an integer k >= 1, but ``inf`` instead of OverflowError.

    Python floats raise OverflowError on ``**`` (``1e300 ** 2``) where products such as
    ``n * n`` overflow to inf quietly. Every power of a possibly huge input in this module
    goes through here or through a product, so huge but finite n, q, δ or step sizes give
    inf or 0 where the formulas overflow, never an OverflowError. (The value is ``x ** k``
    itself whenever that is finite, so no number changes.)
    """
    try:
        return x**k
    except OverflowError:
        return math.inf


def _c(q: float, tau: float) -> float:
    """√q + √τ, the factor of the privacy term and of both conditions."""
    return math.sqrt(q) + math.sqrt(tau)


def _log_factor(p: float, q: float, tau: float) -> float:
    """τ + log(pq), the factor of the statistical term and of the n condition."""
    return tau + math.log(p * q)


def _privacy_coef(n: float, p: float, q: float, rho_min: float, tau: float) -> float:
    """The privacy term divided by √T: √p (√q+√τ)³ / (n √min(ρ1, ρ2)); 0 for rho_min = inf."""
    if math.isinf(rho_min):
        return 0.0
    return math.sqrt(p) * _pow(_c(q, tau), 3) / (n * math.sqrt(rho_min))


def _statistical(n: float, p: float, q: float, tau: float) -> float:
    return math.sqrt(p * q) * _log_factor(p, q, tau) / math.sqrt(n)


def _terms(T: np.ndarray, kappa: float, a: float, s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The three terms and their sum at iteration counts ``T`` (float array)."""
    opt = np.power(kappa, T / 2.0)
    priv = a * np.sqrt(T)
    stat = np.full_like(opt, s)
    return opt, priv, stat, opt + priv + stat


# ----------------------------------------------------------------------------------------
# 1. terms of the bound
# ----------------------------------------------------------------------------------------
def optimization_term(T: ArrayLike, kappa: float) -> float | np.ndarray:
    """Optimization term ``κ^(T/2)`` of the Theorem (Theorem 1, eq. (e_beta(T) bound thm2)).

    Up to constants, c = 1.

    Parameters
    ----------
    T : int or array_like
        Number(s) of iterations, each ``>= 1``.
    kappa : float
        Contraction rate κ(τ) in (0, 1) (see :func:`contraction_rates`).

    Returns
    -------
    float or numpy.ndarray
        ``κ^(T/2)``, a float for scalar ``T`` and an array of the shape of ``T`` otherwise.
    """
    T_arr, scalar = _check_T_array(T)
    kappa = _check_kappa(kappa)
    return _out(np.power(kappa, T_arr / 2.0), scalar)


def privacy_term(
    n: float, p: float, q: float, T: ArrayLike, rho1: float, rho2: float, tau: float = DEFAULT_TAU
) -> float | np.ndarray:
    """Privacy term ``√p (√q+√τ)³ √T / (n √min(ρ1, ρ2))`` (Theorem 1, eq. (e_beta(T) bound thm2)).

    Up to constants, c = 1. It is 0 when both budgets are infinite (no noise).

    Parameters
    ----------
    n : float
        Sample size, ``>= 1``.
    p, q : float
        Number of regressors and of instruments (``1 <= p <= q``).
    T : int or array_like
        Number(s) of iterations, each ``>= 1``.
    rho1, rho2 : float
        zCDP budgets of the first and second stage (``> 0``; ``math.inf`` allowed).
    tau : float, default 5
        Confidence parameter τ > 0.

    Returns
    -------
    float or numpy.ndarray
        The privacy term, a float for scalar ``T`` and an array otherwise.
    """
    n = _check_n(n)
    p, q = _check_dims(p, q)
    T_arr, scalar = _check_T_array(T)
    rho_min = min(check_rho(rho1, "rho1"), check_rho(rho2, "rho2"))
    tau = check_tau(tau)
    return _out(_privacy_coef(n, p, q, rho_min, tau) * np.sqrt(T_arr), scalar)


def statistical_term(n: float, p: float, q: float, tau: float = DEFAULT_TAU) -> float:
    """Statistical term ``√(pq) (τ + log(pq)) / √n`` (Theorem 1, eq. (e_beta(T) bound thm2)).

    Up to constants, c = 1. This is also the whole bound of the non-private algorithm once
    the optimization term has decayed (Corollary 1, eq. (e_beta(T) bound ordinary)).

    Parameters
    ----------
    n : float
        Sample size, ``>= 1``.
    p, q : float
        Number of regressors and of instruments (``1 <= p <= q``).
    tau : float, default 5
        Confidence parameter τ > 0.

    Returns
    -------
    float
        The statistical term.
    """
    n = _check_n(n)
    p, q = _check_dims(p, q)
    return _statistical(n, p, q, check_tau(tau))


# ----------------------------------------------------------------------------------------
# 2. validity conditions
# ----------------------------------------------------------------------------------------
def t_condition_limit(n: float, p: float, q: float, rho1: float, tau: float = DEFAULT_TAU) -> float:
    """Largest T allowed by the T condition, ``ρ1 n² / (p (√q+√τ)⁶)`` (Theorem 1, eq. (T condition thm 1)).

    The condition ``T ≲ ρ1 n^(2−ε) / (p (√q+√τ)⁶)`` is evaluated with ε → 0 and the
    constant set to 1 (up to constants, c = 1).

    Parameters
    ----------
    n : float
        Sample size, ``>= 1``.
    p, q : float
        Number of regressors and of instruments (``1 <= p <= q``).
    rho1 : float
        zCDP budget of the first stage; ``math.inf`` removes the condition.
    tau : float, default 5
        Confidence parameter τ > 0.

    Returns
    -------
    float
        The limit; ``math.inf`` when ``rho1`` is infinite.
    """
    n = _check_n(n)
    p, q = _check_dims(p, q)
    rho1 = check_rho(rho1, "rho1")
    tau = check_tau(tau)
    if math.isinf(rho1):
        return math.inf
    limit = rho1 * (n * n) / (p * _pow(_c(q, tau), 6))
    if limit == 0.0 or math.isinf(limit):
        # n² or (√q+√τ)⁶ overflowed: redo the ratio in log space (finite n, q, ρ1 > 0)
        log_limit = math.log(rho1) + 2.0 * math.log(n) - math.log(p) - 6.0 * math.log(_c(q, tau))
        limit = math.exp(log_limit) if log_limit < 709.0 else math.inf
    return limit


def n_condition_minimum(p: float, q: float, rho1: float, rho2: float, tau: float = DEFAULT_TAU) -> float:
    """Smallest n allowed by the n condition (Theorem 1, eq. (n condition)), with c1 = 1.

    ``max{pq (τ + log pq)², (√q+√τ)³ / √min(ρ1, ρ2)}``; the second entry is 0 when both
    budgets are infinite.

    Parameters
    ----------
    p, q : float
        Number of regressors and of instruments (``1 <= p <= q``).
    rho1, rho2 : float
        zCDP budgets of the two stages (``> 0``; ``math.inf`` allowed).
    tau : float, default 5
        Confidence parameter τ > 0.

    Returns
    -------
    float
        The minimum sample size (up to constants, c = 1).
    """
    p, q = _check_dims(p, q)
    rho_min = min(check_rho(rho1, "rho1"), check_rho(rho2, "rho2"))
    tau = check_tau(tau)
    statistical_part = p * q * _log_factor(p, q, tau) ** 2
    privacy_part = 0.0 if math.isinf(rho_min) else _pow(_c(q, tau), 3) / math.sqrt(rho_min)
    return max(statistical_part, privacy_part)


@dataclass(frozen=True)
class Condition:
    """A validity condition of the Theorem evaluated at given parameters.

    Attributes
    ----------
    name : str
        ``"T condition"`` or ``"n condition"``.
    value : float
        The value being checked (T or n).
    limit : float
        The limit it is checked against (upper limit for T, lower limit for n).
    holds : bool
        Whether the condition holds.
    factor : float
        How far the value is from holding: ``T/limit`` for the T condition and
        ``limit/n`` for the n condition, so the condition holds when ``factor <= 1``
        (up to a relative rounding slack of 1e-12) and a violated condition is off by
        ``factor``.
    """

    name: str
    value: float
    limit: float
    holds: bool
    factor: float

    def describe(self) -> str:
        """Return ``"holds"`` or ``"violated by a factor 3.2"``."""
        return "holds" if self.holds else f"violated by a factor {self.factor:.3g}"


def t_condition(T: float, n: float, p: float, q: float, rho1: float, tau: float = DEFAULT_TAU) -> Condition:
    """The T condition ``T ≤ ρ1 n² / (p (√q+√τ)⁶)`` at ``T`` (Theorem 1, eq. (T condition thm 1)), c = 1."""
    T = _check_scalar_T(T)
    limit = t_condition_limit(n, p, q, rho1, tau)
    factor = 0.0 if math.isinf(limit) else (T / limit if limit > 0.0 else math.inf)
    return Condition("T condition", T, limit, _at_most(T, limit), factor)


def n_condition(n: float, p: float, q: float, rho1: float, rho2: float, tau: float = DEFAULT_TAU) -> Condition:
    """The n condition ``n ≥ max{pq(τ+log pq)², (√q+√τ)³/√min(ρ1, ρ2)}`` at ``n``.

    Theorem 1, eq. (n condition), with c1 = 1.
    """
    n = _check_n(n)
    limit = n_condition_minimum(p, q, rho1, rho2, tau)
    factor = limit / n
    return Condition("n condition", n, limit, _at_most(limit, n), factor)


# ----------------------------------------------------------------------------------------
# 3. regimes
# ----------------------------------------------------------------------------------------
class RegimeBoundaries(NamedTuple):
    """Boundaries in T of the regimes of the remark after the Theorem (all up to constants, c = 1).

    Attributes
    ----------
    end_optimization : float
        ``log(n / (pq(τ+log pq)²)) / log(1/κ)``, where the optimization term falls to the
        statistical term (0 when the log is negative: the statistical term dominates from T = 1).
    start_privacy : float
        ``n min(ρ1, ρ2) q (τ+log pq)² / (√q+√τ)⁶``, where the privacy term rises to the
        statistical term (``inf`` when both budgets are infinite).
    t_limit : float
        The T condition limit (:func:`t_condition_limit`).
    """

    end_optimization: float
    start_privacy: float
    t_limit: float


def regime_boundaries(
    n: float, p: float, q: float, rho1: float, rho2: float, tau: float = DEFAULT_TAU, kappa: float = 0.5,
    *, start_error: float = 1.0,
) -> RegimeBoundaries:
    """Boundaries of the T regimes (remark after Theorem 1 on the dominating terms), c = 1.

    The optimisation regime ends where start_error·κ^(T/2) falls to the statistical term; from a warm start
    as good as 2SLS (``start_error`` equal to the statistical term) it is empty.

    Parameters
    ----------
    n : float
        Sample size, ``>= 1``.
    p, q : float
        Number of regressors and of instruments (``1 <= p <= q``).
    rho1, rho2 : float
        zCDP budgets of the two stages (``> 0``; ``math.inf`` allowed).
    tau : float, default 5
        Confidence parameter τ > 0.
    kappa : float, default 0.5
        Contraction rate in (0, 1).
    start_error : float, default 1
        The optimisation term's factor (see :func:`error_bound`).

    Returns
    -------
    RegimeBoundaries
        ``(end_optimization, start_privacy, t_limit)``, a named tuple.
    """
    n = _check_n(n)
    p, q = _check_dims(p, q)
    rho1 = check_rho(rho1, "rho1")
    rho_min = min(rho1, check_rho(rho2, "rho2"))
    tau = check_tau(tau)
    kappa = _check_kappa(kappa)
    log_factor_sq = _log_factor(p, q, tau) ** 2
    # start_error·κ^(T/2) = √(pq)·log/√n  ⇔  κ^T = 1/ratio
    ratio = _check_start_error(start_error) ** 2 * n / (p * q * log_factor_sq)
    end_optimization = math.log(ratio) / -math.log(kappa) if ratio > 1.0 else 0.0
    start_privacy = math.inf if math.isinf(rho_min) else n * rho_min * q * log_factor_sq / _pow(_c(q, tau), 6)
    return RegimeBoundaries(end_optimization, start_privacy, t_condition_limit(n, p, q, rho1, tau))


def _classify(T: float, bounds: RegimeBoundaries) -> str:
    if not _at_most(T, bounds.t_limit):
        return REGIME_BEYOND
    if _at_most(T, bounds.end_optimization):
        return REGIME_OPTIMIZATION
    if _at_most(T, bounds.start_privacy):
        return REGIME_PLATEAU
    return REGIME_PRIVACY


def regime(
    T: ArrayLike,
    n: float,
    p: float,
    q: float,
    rho1: float,
    rho2: float,
    tau: float = DEFAULT_TAU,
    kappa: float = 0.5,
    *,
    start_error: float = 1.0,
) -> str | np.ndarray:
    """Regime of the bound at ``T`` (remark after Theorem 1 on the dominating terms), c = 1.

    The remark's case order is applied literally: beyond the T condition limit first, then
    ``T <= end_optimization`` → "optimization-dominated", ``T <= start_privacy`` →
    "statistical plateau", otherwise "privacy-dominated". When ``start_privacy <
    end_optimization`` the plateau is empty. With both budgets infinite the privacy regime
    never starts; with ``rho1`` infinite the T condition never binds.

    Parameters
    ----------
    T : int or array_like
        Number(s) of iterations, each ``>= 1``.
    n, p, q, rho1, rho2, tau, kappa, start_error
        As in :func:`regime_boundaries`.

    Returns
    -------
    str or numpy.ndarray
        One of :data:`REGIMES` for scalar ``T``; an object array of labels otherwise.
    """
    T_arr, scalar = _check_T_array(T)
    bounds = regime_boundaries(n, p, q, rho1, rho2, tau, kappa, start_error=start_error)
    if scalar:
        return _classify(float(T_arr), bounds)
    labels = np.empty(T_arr.shape, dtype=object)
    for index, value in np.ndenumerate(T_arr):
        labels[index] = _classify(float(value), bounds)
    return labels


# ----------------------------------------------------------------------------------------
# 4. contraction rate and step sizes (definitions chosen here, see the module docstring)
# ----------------------------------------------------------------------------------------
def _check_delta(delta: float) -> float:
    delta = _real(delta, "delta")
    if not (math.isfinite(delta) and delta >= 0):
        raise ValueError(f"delta must be a finite number >= 0, got {delta!r}.")
    return delta


def _check_gammas(gamma_bar: float, gamma_under: float) -> tuple[float, float]:
    gamma_bar = _real(gamma_bar, "gamma_bar")
    gamma_under = _real(gamma_under, "gamma_under")
    if not (math.isfinite(gamma_bar) and gamma_bar > 0):
        raise ValueError(f"gamma_bar must be a finite number > 0, got {gamma_bar!r}.")
    if not (0 <= gamma_under <= gamma_bar):
        raise ValueError(f"gamma_under must lie in [0, gamma_bar = {gamma_bar:g}], got {gamma_under!r}.")
    return gamma_bar, gamma_under


def delta_tau(n: float, q: float, tau: float = DEFAULT_TAU) -> float:
    """δ(τ) = (√q + √τ)/√n: deviation bound of the singular values of Z/√n from 1.

    Definition chosen by this module (the paper's eq. (definitions of parameters) is in an
    unavailable appendix): Vershynin (2018), Theorem 4.6.1 for isotropic sub-Gaussian rows,
    with its constant set to 1 and ``t = √τ``, so that with probability ``≥ 1 − 2e^(−τ)`` the
    eigenvalues of ``ZᵀZ/n`` lie in ``[(1−δ)², (1+δ)²]``. It enters the step-size condition
    ``η < 2/(1+δ(τ))²`` of Theorem 1, eq. (learning rates condition).

    Parameters
    ----------
    n : float
        Sample size, ``>= 1``.
    q : float
        Number of instruments, ``>= 1``.
    tau : float, default 5
        Confidence parameter τ > 0.

    Returns
    -------
    float
        δ(τ) ≥ 0 (may exceed 1 for small n, then no contraction is guaranteed).
    """
    n = _check_n(n)
    q = _real(q, "q")
    if not (math.isfinite(q) and q >= 1):
        raise ValueError(f"q (number of instruments) must be a finite number >= 1, got {q!r}.")
    return _c(q, check_tau(tau)) / math.sqrt(n)


def eigenvalue_bounds(theta: ArrayLike, delta: float) -> tuple[float, float]:
    """(γ̄, γ̲) = ((1+δ)² σ_max(Θ)², max(1−δ, 0)² σ_min(Θ)²).

    Definition chosen by this module for the γ̄(τ), γ̲(τ) of Theorem 1 (eq. (learning rates
    condition)): bounds on the eigenvalues of ``Θᵀ(ZᵀZ/n)Θ`` when the eigenvalues of
    ``ZᵀZ/n`` lie in ``[(1−δ)², (1+δ)²]`` (see :func:`delta_tau`). Computing them from a
    released Θ is post-processing.

    Parameters
    ----------
    theta : array_like, shape (q, p)
        First-stage coefficient matrix with ``q >= p``.
    delta : float
        δ(τ) >= 0.

    Returns
    -------
    tuple of float
        ``(gamma_bar, gamma_under)``.
    """
    theta_arr = np.asarray(theta, dtype=float)
    if theta_arr.ndim == 1:
        theta_arr = theta_arr[:, None]
    if theta_arr.ndim != 2 or theta_arr.size == 0:
        raise ValueError(f"theta must be a non-empty q x p matrix, got shape {theta_arr.shape}.")
    if theta_arr.shape[0] < theta_arr.shape[1]:
        raise ValueError(f"theta must be q x p with q >= p, got shape {theta_arr.shape}.")
    if not np.all(np.isfinite(theta_arr)):
        raise ValueError("theta must contain only finite values.")
    delta = _check_delta(delta)
    singular_values = np.linalg.svd(theta_arr, compute_uv=False)
    sigma_max, sigma_min = float(singular_values[0]), float(singular_values[-1])
    return _pow(1.0 + delta, 2) * sigma_max**2, _pow(max(1.0 - delta, 0.0), 2) * sigma_min**2


class ContractionRates(NamedTuple):
    """Contraction rates at the (approximately) optimal step sizes; all in [0, 1]."""

    kappa_beta: float
    kappa_theta: float
    kappa: float


def contraction_rates(delta: float, gamma_bar: float, gamma_under: float) -> ContractionRates:
    """κ_β = γ̄/(γ̄+γ̲), κ_Θ = (L−μ)/(L+μ) with L = (1+δ)², μ = max(1−δ, 0)², κ = max.

    The remark on optimal step sizes after Theorem 1 (eq. (optimum step sizes)), with the
    definitions of δ, γ̄, γ̲ chosen by this module (see the module docstring). Results are
    clamped to [0, 1]. ``δ = 0`` gives ``κ_Θ = 0``; ``δ >= 1`` gives ``κ_Θ = 1``: no
    contraction is guaranteed, and the bound's optimization term does not decay. Note that
    ``κ_β >= 1/2`` always.

    Parameters
    ----------
    delta : float
        δ(τ) >= 0 (:func:`delta_tau`).
    gamma_bar, gamma_under : float
        Eigenvalue bounds with ``0 <= gamma_under <= gamma_bar`` and ``gamma_bar > 0``
        (:func:`eigenvalue_bounds`).

    Returns
    -------
    ContractionRates
        ``(kappa_beta, kappa_theta, kappa)``.
    """
    delta = _check_delta(delta)
    gamma_bar, gamma_under = _check_gammas(gamma_bar, gamma_under)
    upper, lower = _pow(1.0 + delta, 2), _pow(max(1.0 - delta, 0.0), 2)
    # lower = 0 (δ >= 1): no contraction guaranteed; also avoids inf/inf for a huge δ
    kappa_theta = 1.0 if lower == 0.0 else min(max((upper - lower) / (upper + lower), 0.0), 1.0)
    kappa_beta = min(max(gamma_bar / (gamma_bar + gamma_under), 0.0), 1.0)
    return ContractionRates(kappa_beta, kappa_theta, max(kappa_beta, kappa_theta))


def preconditioned_contraction_rates(delta: float, eta: float, alpha: float) -> ContractionRates:
    """Contraction of the preconditioned iteration (``method="preconditioned"``), in the κ^(T/2) form.

    Not from the paper, whose Theorem is proved for the plain iteration: with whitened
    instruments the first stage contracts per step by max abs(1 − η·λ) over the eigenvalues
    λ ∈ [(1−δ)², (1+δ)²] of ZᵀZ/n, and the second stage, stepping along P_t⁻¹·gradient with
    P_t ≈ the second-stage Hessian, by abs(1 − α). Since the optimization term is κ^(T/2), each
    per-step factor enters squared: κ_Θ = max abs(1 − ηλ)², κ_β = (1 − α)², κ = max (clamped to [0, 1]).
    """
    delta = _check_delta(delta)
    upper, lower = _pow(1.0 + delta, 2), _pow(max(1.0 - delta, 0.0), 2)
    kappa_theta = min(_pow(max(abs(1.0 - eta * upper), abs(1.0 - eta * lower)), 2), 1.0)
    kappa_beta = min(_pow(1.0 - alpha, 2), 1.0)
    return ContractionRates(kappa_beta, kappa_theta, max(kappa_beta, kappa_theta))


class StepSizes(NamedTuple):
    """Step sizes η (first stage) and α (second stage)."""

    eta: float
    alpha: float


def paper_step_sizes(delta: float, gamma_bar: float, gamma_under: float) -> StepSizes:
    """η = 1/(1+δ)², α = 2/(2γ̄+γ̲): the rule of the paper's experiments (Section 5).

    Both lie inside the step-size condition of Theorem 1, eq. (learning rates condition),
    ``η < 2/(1+δ)²`` and ``α < 4/(2γ̄+γ̲)``, by a factor 2.

    Parameters
    ----------
    delta : float
        δ(τ) >= 0.
    gamma_bar, gamma_under : float
        Eigenvalue bounds (``0 <= gamma_under <= gamma_bar``, ``gamma_bar > 0``).

    Returns
    -------
    StepSizes
        ``(eta, alpha)``.
    """
    delta = _check_delta(delta)
    gamma_bar, gamma_under = _check_gammas(gamma_bar, gamma_under)
    return StepSizes(1.0 / _pow(1.0 + delta, 2), 2.0 / (2.0 * gamma_bar + gamma_under))


def optimal_step_sizes(delta: float, gamma_bar: float, gamma_under: float) -> StepSizes:
    """η* = 2/((1+δ)² + (1−δ)²), α* = 2/(γ̄+γ̲) (Theorem 1 remark, eq. (optimum step sizes)).

    The paper's formula is used as written (``(1−δ)²`` unclamped), which keeps η* below
    the stability limit ``2/(1+δ)²`` for every δ ≠ 1. The corresponding rates are given by
    :func:`contraction_rates`.

    Parameters
    ----------
    delta : float
        δ(τ) >= 0.
    gamma_bar, gamma_under : float
        Eigenvalue bounds (``0 <= gamma_under <= gamma_bar``, ``gamma_bar > 0``).

    Returns
    -------
    StepSizes
        ``(eta, alpha)``.
    """
    delta = _check_delta(delta)
    gamma_bar, gamma_under = _check_gammas(gamma_bar, gamma_under)
    return StepSizes(2.0 / (_pow(1.0 + delta, 2) + _pow(1.0 - delta, 2)), 2.0 / (gamma_bar + gamma_under))


# ----------------------------------------------------------------------------------------
# 5. the bound at one T
# ----------------------------------------------------------------------------------------
def _fmt(value: float) -> str:
    if math.isinf(value):
        return "inf"
    return f"{value:.4g}"


@dataclass(frozen=True)
class ErrorBound:
    """The Theorem's bound on ‖β⁽ᵀ⁾ − β̂‖ at one parameter setting (up to constants, c = 1).

    Built by :func:`error_bound`. ``total`` is the sum of the three terms (Theorem 1,
    eq. (e_beta(T) bound thm2)); ``dominant`` names the largest term; ``regime`` is the
    remark's classification (:func:`regime`).
    """

    n: float
    p: float
    q: float
    T: float
    rho1: float
    rho2: float
    optimization: float
    privacy: float
    statistical: float
    total: float
    dominant: str
    regime: str
    t_condition: Condition
    n_condition: Condition
    kappa: float
    tau: float

    @property
    def valid(self) -> bool:
        """Whether both conditions of the Theorem hold (with constants 1)."""
        return self.t_condition.holds and self.n_condition.holds

    def to_frame(self) -> pd.DataFrame:
        """The bound as a DataFrame indexed by term/condition name, columns ``value`` and ``note``."""
        t_cond, n_cond = self.t_condition, self.n_condition
        records = {
            "optimization": (self.optimization, "κ^(T/2)"),
            "privacy": (self.privacy, "√p(√q+√τ)³√T / (n√min(ρ1,ρ2))"),
            "statistical": (self.statistical, "√(pq)(τ+log pq) / √n"),
            "total": (self.total, f"dominated by the {self.dominant} term; regime: {self.regime}"),
            "T condition": (t_cond.value, f"T ≤ {_fmt(t_cond.limit)}: {t_cond.describe()}"),
            "n condition": (n_cond.value, f"n ≥ {_fmt(n_cond.limit)}: {n_cond.describe()}"),
            "kappa": (self.kappa, "contraction rate κ(τ)"),
            "tau": (self.tau, "confidence: probability ≥ 1 − c₂e^(−τ)"),
        }
        frame = pd.DataFrame.from_dict(records, orient="index", columns=["value", "note"])
        frame.index.name = "quantity"
        return frame

    def rows(self) -> list[tuple[str, str]]:
        """(label, formatted value) pairs for a two-column summary table."""
        t_cond, n_cond = self.t_condition, self.n_condition
        t_relation = "≤" if t_cond.holds else ">"
        n_relation = "≥" if n_cond.holds else "<"
        return [
            ("Optimization term κ^(T/2)", _fmt(self.optimization)),
            ("Privacy term", _fmt(self.privacy)),
            ("Statistical term", _fmt(self.statistical)),
            ("Sum", _fmt(self.total)),
            ("Dominating term", self.dominant),
            ("Regime", self.regime),
            (
                "T condition (T ≲ ρ1 n²/(p(√q+√τ)⁶))",
                f"{t_cond.describe()} (T = {self.T:g} {t_relation} {_fmt(t_cond.limit)})",
            ),
            ("n condition", f"{n_cond.describe()} (n = {self.n:g} {n_relation} {_fmt(n_cond.limit)})"),
            ("κ (contraction rate)", _fmt(self.kappa)),
            ("τ (confidence)", _fmt(self.tau)),
        ]


def error_bound(
    n: float,
    p: float,
    q: float,
    T: float,
    rho1: float,
    rho2: float,
    *,
    tau: float = DEFAULT_TAU,
    kappa: float,
    start_error: float = 1.0,
) -> ErrorBound:
    """Evaluate the Theorem's bound, its regime and its conditions at one T.

    Theorem 1, eq. (e_beta(T) bound thm2), with the conditions eq. (T condition thm 1) and
    eq. (n condition); up to constants, c = 1.

    Parameters
    ----------
    n : float
        Sample size, ``>= 1``.
    p, q : float
        Number of regressors and of instruments (``1 <= p <= q``).
    T : float
        Number of iterations, ``>= 1``.
    rho1, rho2 : float
        zCDP budgets of the two stages (``> 0``; ``math.inf`` allowed).
    tau : float, default 5
        Confidence parameter τ > 0.
    kappa : float
        Contraction rate in (0, 1).
    start_error : float, default 1
        The optimisation term's factor: the starting point's distance to β̂ (1 for the Algorithm's zero
        start, up to constants; a warm start's smaller error, see :func:`plan`).

    Returns
    -------
    ErrorBound
    """
    n = _check_n(n)
    p, q = _check_dims(p, q)
    T = _check_scalar_T(T)
    rho1, rho2 = check_rho(rho1, "rho1"), check_rho(rho2, "rho2")
    tau, kappa = check_tau(tau), _check_kappa(kappa)
    start_error = _check_start_error(start_error)
    a = _privacy_coef(n, p, q, min(rho1, rho2), tau)
    opt, priv, stat, total = (float(x[0]) for x in _terms(np.array([T]), kappa, a, _statistical(n, p, q, tau)))
    opt *= start_error
    total = opt + priv + stat
    values = (opt, priv, stat)
    return ErrorBound(
        n=n,
        p=p,
        q=q,
        T=T,
        rho1=rho1,
        rho2=rho2,
        optimization=opt,
        privacy=priv,
        statistical=stat,
        total=total,
        dominant=TERM_NAMES[values.index(max(values))],
        regime=regime(T, n, p, q, rho1, rho2, tau, kappa, start_error=start_error),
        t_condition=t_condition(T, n, p, q, rho1, tau),
        n_condition=n_condition(n, p, q, rho1, rho2, tau),
        kappa=kappa,
        tau=tau,
    )


