"""Privacy accounting for DP-2S-GD: calibration, the budget object and zCDP → (ε, δ) conversions.

The privacy model
-----------------
Neighbouring datasets differ by *replacing* one row; the number of rows ``n`` is public. With a privacy unit
(``fit(privacy_unit=...)``, :mod:`dpivreg.privacy.units`) they differ by replacing all rows of one unit and the number
of units is public: every release then sums per-unit contributions (:attr:`PrivacyBudget.unit` says which unit).
Every release of dpivreg is a Gaussian mechanism applied to a mean of per-sample clipped
vectors. With clipping threshold γ the mean has L2 sensitivity ``2γ/n`` (the replaced
row's clipped vector can flip from ``+γ`` to ``−γ``), and a Gaussian mechanism with
sensitivity Δ and noise standard deviation σ is ``Δ²/(2σ²)``-zCDP (Bun & Steinke 2016,
Proposition 1.6). zCDP composes additively, also adaptively (ibid., Lemma 2.3), so the
``T`` steps of each stage and the two stages add up. The means are computed in floating point: every summed
release's Δ and σ carry the rounding allowance of its order of summation (:mod:`dpivreg.privacy.rounding`,
:attr:`Release.rounding`), which leaves ρ unchanged.

Calibration
-----------
The paper's Proposition sets ``λk = (2γk/n)·sqrt(T/ρk)``. Plugging it into the Gaussian
mechanism gives ``T·(2γk/n)²/(2λk²) = ρk/2`` per stage: the Proposition's noise is √2
larger than needed and spends only half the stated budget (its own expression
``(2T/n²)·Σ γk²/λk²`` evaluates to ``(ρ1+ρ2)/2``). ``calibration="exact"`` (default) uses
``λk = (γk/n)·sqrt(2T/ρk)``, which spends exactly ρk; ``calibration="paper"`` reproduces
the paper's noise and the budget object records what was actually spent (ρk/2).

Conversions to (ε, δ)
---------------------
``"bun-steinke"``
    ε = ρ + 2·sqrt(ρ·log(1/δ)) (Bun & Steinke 2016, Proposition 1.3; the paper's footnote),
    valid for any ρ-zCDP mechanism but loose.
``"cks"``
    Canonne, Kamath & Steinke (2020), Proposition 12, minimised over the Rényi order: the
    tightest conversion valid for *any* ρ-zCDP mechanism.
``"gaussian"``
    (default) The exact privacy profile of the Gaussian mechanism. All releases of DP-2S-GD
    are Gaussian mechanisms composed adaptively, so the whole fit is μ-GDP with
    μ = sqrt(Σ Δ²/σ²) = sqrt(2ρ) (Dong, Roth & Su 2022, Corollary 3.3) and
    δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2) (Balle & Wang 2018, Theorem 8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Literal

import numpy as np
import pandas as pd
from scipy import optimize, special

from dpivreg._validation import check_delta, check_epsilon, check_spent_rho

__all__ = [
    "Release",
    "PrivacyBudget",
    "CALIBRATIONS",
    "EPSILON_METHODS",
    "noise_std",
    "rho_from_epsilon",
    "clipped_mean_sensitivity",
    "gaussian_zcdp",
    "epsilon_from_rho",
    "delta_from_rho",
]

CALIBRATIONS = ("exact", "paper")
EPSILON_METHODS = ("gaussian", "cks", "bun-steinke")
EpsilonMethod = Literal["gaussian", "cks", "bun-steinke"]


# ----------------------------------------------------------------------------------------
# validation helpers shared by the package
# ----------------------------------------------------------------------------------------
def _check_method(method: str) -> str:
    if method not in EPSILON_METHODS:
        raise ValueError(f"method must be one of {EPSILON_METHODS}, got {method!r}.")
    return method


# ----------------------------------------------------------------------------------------
# calibration
# ----------------------------------------------------------------------------------------
def clipped_mean_sensitivity(clip: float, n: int) -> float:
    """L2 sensitivity ``2γ/n`` of a mean of ``n`` per-sample vectors clipped to norm γ (replace-one)."""
    return 2.0 * clip / n


def noise_std(clip: float | None, n: int, T: int, rho: float, calibration: str = "exact") -> float:
    """Noise standard deviation λ of one stage of DP-2S-GD.

    Parameters
    ----------
    clip : float or None
        Clipping threshold γ of the stage (``None``: no clipping, then no noise can make
        the stage private and 0 is returned only when ``rho`` is infinite).
    n : int
        Number of rows (public).
    T : int
        Number of noisy steps of the stage.
    rho : float
        zCDP budget of the stage; ``inf`` means no noise (not private).
    calibration : {"exact", "paper"}
        ``"exact"``: λ = (γ/n)·sqrt(2T/ρ), spending exactly ρ. ``"paper"``: the
        Proposition's λ = (2γ/n)·sqrt(T/ρ), which spends ρ/2.

    Returns
    -------
    float
        The standard deviation of each coordinate of the per-step Gaussian noise.
    """
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}.")
    if math.isinf(rho):
        return 0.0
    if clip is None:
        raise ValueError(
            "a finite budget rho needs a clipping threshold: without clipping the gradient's "
            "sensitivity is unbounded. Pass a clip value, or rho=numpy.inf for a non-private run."
        )
    if calibration == "exact":
        return clip / n * math.sqrt(2.0 * T / rho)
    return 2.0 * clip / n * math.sqrt(T / rho)


def gaussian_zcdp(sensitivity: float, sigma: float, steps: int = 1) -> float:
    """zCDP cost ``steps·Δ²/(2σ²)`` of ``steps`` Gaussian mechanisms (Bun & Steinke 2016, Prop. 1.6).

    Returns ``inf`` when σ = 0 or Δ is infinite (no privacy).
    """
    if sensitivity == 0.0:
        return 0.0
    if sigma == 0.0 or math.isinf(sensitivity):
        return math.inf
    return steps * (sensitivity / sigma) ** 2 / 2.0


# ----------------------------------------------------------------------------------------
# conversions
# ----------------------------------------------------------------------------------------
_SQRT2 = math.sqrt(2.0)
# exp(x) is 0.0 in double precision below this (the smallest subnormal is exp(-744.44)).
_LOG_UNDERFLOW = -746.0
# Below this μ the two terms of the Gaussian δ agree to more digits than their log-space
# difference keeps (ρ < 5e-7); _gaussian_delta_small_mu integrates their difference instead.
_SMALL_MU = 1e-3
_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(8)


def _mu_of(rho: float) -> float:
    """Gaussian-DP parameter μ = sqrt(2ρ), without overflowing 2ρ for ρ near the largest float."""
    two_rho = 2.0 * rho
    return math.sqrt(two_rho) if math.isfinite(two_rho) else _SQRT2 * math.sqrt(rho)


def _gaussian_delta_t(mu: float, t: float) -> float:
    """Exact privacy profile of μ-GDP (Balle & Wang 2018, Thm 8; Dong, Roth & Su 2022, Cor. 2.13)
    at ε = μ²/2 + μ·t, i.e. t = (ε − ρ)/μ with ρ = μ²/2.

    δ = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2) = Φ(−t) − e^ε·Φ(−(t + μ)). With
    Φ(−y) = ½·erfcx(y/√2)·e^(−y²/2) the second term is ½·erfcx((t + μ)/√2)·e^(−t²/2): the
    huge factors e^ε and e^(−(t+μ)²/2) cancel analytically, so nothing overflows or loses its
    digits for large ρ or ε. Both terms are combined in log space. Requires t + μ > 0 (ε >= 0).
    """
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    if mu < _SMALL_MU:
        return _gaussian_delta_small_mu(mu, t)
    log_first = float(special.log_ndtr(-t))
    scaled = float(special.erfcx((t + mu) / _SQRT2))
    if scaled > 0.0:
        log_second = math.log(scaled) - math.log(2.0) - 0.5 * t * t
    else:
        log_second = -math.inf
    if log_second >= log_first:  # equal up to rounding (or both zero)
        return 0.0
    return float(math.exp(log_first) * -math.expm1(log_second - log_first))


def _gaussian_delta_small_mu(mu: float, t: float) -> float:
    """The Gaussian δ at t for small μ: [Φ(−t) − Φ(−t−μ)] − (e^ε − 1)·Φ(−t−μ), ε = μ²/2 + μt.

    Φ(−t) − Φ(−t−μ) = ∫ φ over [t, t + μ] by 8-point Gauss–Legendre quadrature (exact to
    rounding on an interval this short), so nothing cancels catastrophically for tiny ρ.
    """
    if t > 40.0:  # δ <= Φ(−t) < 1e-349: zero in double precision
        return 0.0
    nodes = t + 0.5 * mu * (1.0 + _GL_NODES)
    mass = 0.5 * mu * float(np.dot(_GL_WEIGHTS, np.exp(-0.5 * nodes * nodes))) / math.sqrt(2.0 * math.pi)
    epsilon = mu * (0.5 * mu + t)
    delta = mass - math.expm1(epsilon) * float(special.ndtr(-(t + mu)))
    return min(max(delta, 0.0), 1.0)


def _gaussian_delta(rho: float, epsilon: float) -> float:
    """δ(ε) of the exact Gaussian conversion for a finite ρ > 0 and a finite ε >= 0."""
    mu = _mu_of(rho)
    return _gaussian_delta_t(mu, (epsilon - rho) / mu)


def _bun_steinke_epsilon(rho: float, delta: float) -> float:
    """ε = ρ + 2·sqrt(ρ·log(1/δ)) (Bun & Steinke 2016, Prop. 1.3), finite for every finite ρ."""
    log_inv_delta = -math.log(delta)
    product = rho * log_inv_delta
    root = math.sqrt(product) if math.isfinite(product) else math.sqrt(rho) * math.sqrt(log_inv_delta)
    return rho + 2.0 * root


def _bun_steinke_log_delta(rho: float, epsilon: float) -> float:
    """log δ of the inverse Bun–Steinke conversion: −z² with z = (ε − ρ)/(2√ρ) for ε > ρ, else 0.

    ``z * z`` (not ``z ** 2``) overflows to inf instead of raising, so δ = exp(−z²) → 0 safely.
    """
    if epsilon <= rho:
        return 0.0
    z = (epsilon - rho) / (2.0 * math.sqrt(rho))
    return -(z * z)


def _gaussian_epsilon(rho: float, delta: float) -> float:
    """Smallest ε with δ(ε) <= ``delta`` for μ-GDP, μ = sqrt(2ρ) (finite ρ > 0).

    The root is searched in t = (ε − ρ)/μ, where it lies near Φ⁻¹(1 − δ) whatever ρ (for
    large ρ, ε ≈ ρ + μ·Φ⁻¹(1 − δ)): the bracket is found by checking signs and expanding,
    and brentq works on an interval of width O(1). Should the root search fail anyway,
    the upper end of the bracket (a valid, conservative ε), or else the Bun–Steinke ε, is
    returned.
    """
    mu = _mu_of(rho)
    t_zero = -rho / mu  # t at ε = 0
    if _gaussian_delta_t(mu, t_zero) <= delta:
        return 0.0

    def excess(t: float) -> float:  # decreasing in t
        return _gaussian_delta_t(mu, t) - delta

    # δ(t) <= Φ(−t), so the upper end starts at Φ⁻¹(1 − δ); expand it in case of rounding.
    hi = max(-float(special.ndtri(delta)), t_zero)
    step = 1.0
    for _ in range(64):
        if excess(hi) <= 0.0:
            break
        hi, step = hi + step, 2.0 * step
    else:  # pragma: no cover - only with NaNs from the special functions
        return _bun_steinke_epsilon(rho, delta)
    # lower end: move down from hi by doubling widths; excess(t_zero) > 0 stops it at worst
    width = 1.0
    lo = max(t_zero, hi - width)
    while lo > t_zero and excess(lo) <= 0.0:
        hi, width = lo, 2.0 * width
        lo = max(t_zero, hi - width)
    try:
        t = optimize.brentq(excess, lo, hi, xtol=1e-14, rtol=1e-14, maxiter=500)
    except (ValueError, RuntimeError):  # pragma: no cover - defensive: hi is a valid upper bound
        t = hi
    return max(rho + mu * t, 0.0)


def _cks_epsilon(rho: float, delta: float) -> float:
    """Canonne, Kamath & Steinke (2020), Prop. 12 with Rényi order α: ε(α) minimised over α > 1.

    ε(α) = αρ + log(1/δ)/(α−1) + log(1 − 1/α) − log(α)/(α−1). With x = α − 1 and
    L = log(1/δ) its derivative is ρ − (L − log(1 + x))/x², which changes sign once, at the
    root of the increasing function ρx² + log(1 + x) − L. That root lies in
    (0, min(sqrt(L/ρ), e^L − 1)] and is found by brentq; no bounded search over α, so the
    minimum is found for any ρ (for huge ρ the optimal α − 1 ≈ sqrt(L/ρ) is tiny).
    The result never exceeds the Bun–Steinke ε, which CKS improves on for every α.
    """
    log_inv_delta = -math.log(delta)
    upper = math.sqrt(log_inv_delta) / math.sqrt(rho)
    if log_inv_delta < 700.0:
        upper = min(upper, math.expm1(log_inv_delta))

    def slope_sign(x: float) -> float:  # increasing in x; ε(x) is minimal at its root
        return rho * x * x + math.log1p(x) - log_inv_delta

    for _ in range(64):  # h(upper) >= 0 in exact arithmetic; expand in case of rounding
        if slope_sign(upper) >= 0.0:
            break
        upper *= 2.0
    x = optimize.brentq(slope_sign, 0.0, upper, xtol=1e-300, rtol=1e-15, maxiter=500)
    if not x > 0.0:  # pragma: no cover - defensive
        x = upper
    eps = (1.0 + x) * rho + log_inv_delta / x - math.log1p(1.0 / x) - math.log1p(x) / x
    return max(min(eps, _bun_steinke_epsilon(rho, delta)), 0.0)


def _cks_delta(rho: float, epsilon: float) -> float:
    """Inverse of :func:`_cks_epsilon`: δ(α) = exp((α−1)(αρ−ε))/α · (1−1/α)^(α−1), minimised over α.

    Worked in log space with x = α − 1 = e^u:
    log δ(x) = x((1+x)ρ − ε) − log(1+x) − x·log(1 + 1/x), convex in x with derivative
    (1+2x)ρ − ε − log(1 + 1/x), whose root is found by brentq in u. CKS improves on the
    Bun–Steinke δ for every α, so δ = 0 whenever the Bun–Steinke δ underflows (huge ε), and
    δ = 1 when the optimal x underflows (huge ρ). The result is clamped to [0, 1].
    """
    log_bs = _bun_steinke_log_delta(rho, epsilon)
    if log_bs < _LOG_UNDERFLOW:
        return 0.0

    def slope(u: float) -> float:  # derivative of log δ in x, written in u = log x; increasing
        growth = rho * (2.0 * math.exp(u)) if u < 700.0 else math.inf  # 2ρx, never inf·0
        if u > 0.0:
            return (rho - epsilon) + growth - math.log1p(math.exp(-u))
        return (rho - epsilon) + growth + u - math.log1p(math.exp(u))

    # slope(u) <= 3ρ − ε + u for u <= 0; slope >= 0 once x >= max(1, (ε−ρ)/ρ, 1/sqrt(ρ))
    u_lo = max(min(0.0, epsilon - 3.0 * rho) - 1.0, _LOG_UNDERFLOW)
    if slope(u_lo) >= 0.0:
        return 1.0  # optimum at x < e^-746: log δ ≈ −x rounds to 0
    u_hi = max(0.0, -0.5 * math.log(rho))
    if epsilon > rho:
        u_hi = max(u_hi, math.log(epsilon - rho) - math.log(rho))
    for _ in range(64):  # slope(u_hi) >= 0 in exact arithmetic; expand in case of rounding
        if slope(u_hi) >= 0.0:
            break
        u_hi += 1.0
    u = optimize.brentq(slope, u_lo, u_hi, xtol=1e-13, rtol=1e-15, maxiter=500)
    x = math.exp(u)
    log_one_plus_inv = math.log1p(1.0 / x) if u > 0.0 else math.log1p(x) - u
    log_delta = x * ((rho - epsilon) + x * rho) - math.log1p(x) - x * log_one_plus_inv
    return float(math.exp(min(log_delta, log_bs, 0.0)))


def epsilon_from_rho(rho: float, delta: float, method: EpsilonMethod = "gaussian") -> float:
    """ε such that a ρ-zCDP fit is (ε, δ)-DP.

    Parameters
    ----------
    rho : float
        Total zCDP budget spent, a real number >= 0 (``inf`` gives ``inf``, 0 gives 0).
    delta : float
        Target δ in (0, 1).
    method : {"gaussian", "cks", "bun-steinke"}
        ``"gaussian"`` is exact for compositions of Gaussian mechanisms (every seeded dpivreg
        release is one); ``"cks"`` holds for any ρ-zCDP mechanism, so also for the secure sampler's
        discrete Gaussians (:mod:`dpivreg.privacy.sampler`), which ``"gaussian"`` treats as the continuous
        Gaussians they approximate (their noise spans at least 2³⁰ grid steps); ``"bun-steinke"`` is the
        paper's simple bound ε = ρ + 2·sqrt(ρ·log(1/δ)).

    Returns
    -------
    float
        Finite for every finite ρ and non-decreasing in ρ.

    Raises
    ------
    TypeError
        ``rho`` or ``delta`` is not a real number (or is a bool).
    ValueError
        ``rho`` is NaN or negative, ``delta`` is not strictly between 0 and 1, or ``method``
        is unknown.
    """
    rho = check_spent_rho(rho)
    delta = check_delta(delta)
    method = _check_method(method)
    if math.isinf(rho):
        return math.inf
    if rho == 0.0:
        return 0.0
    if method == "bun-steinke":
        return _bun_steinke_epsilon(rho, delta)
    if method == "cks":
        return _cks_epsilon(rho, delta)
    return _gaussian_epsilon(rho, delta)


def rho_from_epsilon(epsilon: float, delta: float, method: EpsilonMethod = "gaussian") -> float:
    """The largest total zCDP budget ρ whose fit is (ε, δ)-DP by the chosen conversion (inverse of
    :func:`epsilon_from_rho` in ρ): what ``fit(epsilon=..., delta=...)`` spends.

    With ``"gaussian"`` (the default) this is the exact privacy profile of a composition of Gaussian mechanisms, a
    Gaussian mechanism with μ = √(2ρ) (Balle & Wang 2018; Dong, Roth & Su 2022): δ(ε) = Φ(−ε/μ + μ/2) −
    e^ε·Φ(−ε/μ − μ/2). The root is bracketed and bisected on log ρ, and the lower end returned, so that
    ``delta_from_rho(rho_from_epsilon(ε, δ), ε) <= δ`` always and ε is met to about 1e-9 relative.

    Raises
    ------
    TypeError, ValueError
        ``epsilon`` is not a positive finite number, ``delta`` not in (0, 1), or ``method`` unknown.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    method = _check_method(method)
    if not 0.0 < epsilon < math.inf:
        raise ValueError(f"epsilon must be positive and finite, got {epsilon!r}.")

    def within(rho: float) -> bool:
        return delta_from_rho(rho, epsilon, method) <= delta

    lo, hi = 1e-300, 1e-12
    while within(hi):
        lo, hi = hi, hi * 4.0
        if hi > 1e12:
            raise ValueError(f"epsilon = {epsilon!r} at delta = {delta!r} allows a budget beyond 1e12: no noise.")
    if lo == 1e-300 and not within(lo):
        raise ValueError(f"epsilon = {epsilon!r} at delta = {delta!r} allows no positive budget.")
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if within(mid):
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.0 + 1e-12:
            break
    return lo


def delta_from_rho(rho: float, epsilon: float, method: EpsilonMethod = "gaussian") -> float:
    """Smallest δ such that a ρ-zCDP fit is (ε, δ)-DP by the chosen conversion (inverse of
    :func:`epsilon_from_rho`).

    Parameters
    ----------
    rho : float
        Total zCDP budget spent, a real number >= 0 (``inf``: not private).
    epsilon : float
        A real number >= 0; ``inf`` gives δ = 0 (every mechanism is (∞, 0)-DP).
    method : {"gaussian", "cks", "bun-steinke"}
        As in :func:`epsilon_from_rho`.

    Returns
    -------
    float
        δ in [0, 1]: 1 for ``rho = inf`` and finite ε, 0 for ``rho = 0`` or ``epsilon = inf``;
        tends to 1 as ρ → ∞ and to 0 as ε → ∞.

    Raises
    ------
    TypeError
        ``rho`` or ``epsilon`` is not a real number (or is a bool).
    ValueError
        ``rho`` or ``epsilon`` is NaN or negative, or ``method`` is unknown.
    """
    rho = check_spent_rho(rho)
    epsilon = check_epsilon(epsilon)
    method = _check_method(method)
    if math.isinf(epsilon):
        return 0.0
    if math.isinf(rho):
        return 1.0
    if rho == 0.0:
        return 0.0
    if method == "gaussian":
        return _gaussian_delta(rho, epsilon)
    if method == "cks":
        return _cks_delta(rho, epsilon)
    # Bun–Steinke: ε = ρ + 2 sqrt(ρ log(1/δ))  ⇔  δ = exp(−z²), z = (ε − ρ)/(2√ρ), for ε ≥ ρ.
    return float(math.exp(_bun_steinke_log_delta(rho, epsilon)))


# ----------------------------------------------------------------------------------------
# the budget object
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Release:
    """One private release: ``steps`` Gaussian mechanisms of equal sensitivity and noise.

    Attributes
    ----------
    name : str
        What was released (e.g. ``"first stage Θ path"``).
    stage : str
        Budget line it is charged to (``"rho1"``, ``"rho2"``, ...).
    steps : int
        Number of Gaussian mechanisms (iterations).
    clip : float or None
        Clipping threshold γ (``None``: not clipped).
    sensitivity : float
        L2 sensitivity Δ of each step (``inf`` when not clipped).
    noise_std : float
        Standard deviation σ of each noise coordinate (0: no noise).
    rho : float
        zCDP spent: ``steps·Δ²/(2σ²)``; ``inf`` when not private.
    grid : float or None
        The public grid γ the release was made on by the secure sampler (the query rounded to it, exact discrete
        Gaussian noise on it; Δ and σ include the rounding, :func:`dpivreg.privacy.sampler.calibrate`); None for
        numpy's seeded sampler or no noise.
    rounding : float
        The floating-point allowance of the release's summed query (:mod:`dpivreg.privacy.rounding`): Δ and σ
        include it (before the grid's rounding, which is applied to the query as computed). 1 for a release whose
        query is exact (counts) and in records made before it existed.
    """

    name: str
    stage: str
    steps: int
    clip: float | None
    sensitivity: float
    noise_std: float
    rho: float
    grid: float | None = None
    rounding: float = 1.0

    @classmethod
    def gaussian(
        cls, name: str, stage: str, *, steps: int, clip: float | None, n: int, noise_std: float,
        grid: float | None = None, factor: float = 1.0, rounding: float = 1.0
    ) -> "Release":
        """Record ``steps`` Gaussian releases of a mean of per-sample vectors clipped to ``clip`` (``noise_std`` as
        drawn): the sensitivity 2γ/n times the sum's ``rounding`` allowance (:mod:`dpivreg.privacy.rounding`), and on
        the secure sampler's ``grid`` times its ``factor``, 1 + c, too."""
        sensitivity = math.inf if clip is None else factor * (rounding * clipped_mean_sensitivity(clip, n))
        return cls(name, stage, steps, clip, sensitivity, noise_std, gaussian_zcdp(sensitivity, noise_std, steps),
                   grid, rounding)

    @classmethod
    def unnoised(cls, name: str, stage: str) -> "Release":
        """Record a statistic of the data released without noise: not private (ρ = ∞), so that the accountant,
        ε and every record of the fit say so."""
        return cls(name, stage, 1, None, math.inf, 0.0, math.inf)

    @property
    def mu(self) -> float:
        """Gaussian-DP parameter of the release: sqrt(steps)·Δ/σ = sqrt(2ρ)."""
        return math.sqrt(2.0 * self.rho)


class PrivacyBudget:
    """The privacy spent by one fit: a record per release, their zCDP sum and (ε, δ) conversions.

    Parameters
    ----------
    releases : iterable of Release
        Everything the fit released, in order.
    target : dict, optional
        The budgets the user asked for, by stage (e.g. ``{"rho1": 1.0, "rho2": 1.0}``); kept
        for display only. The accountant always reports what was *spent*.

    Notes
    -----
    All releases are Gaussian mechanisms, so the composed fit is μ-GDP with μ = sqrt(2ρ)
    and the default ε is exact, not an upper bound.
    """

    def __init__(self, releases: Iterable[Release], target: dict[str, float] | None = None, unit=None) -> None:
        self._releases = tuple(releases)
        self._target = dict(target or {})
        self._unit = unit

    @property
    def unit(self):
        """Whom the guarantee protects: :class:`dpivreg.privacy.units.UnitFacts` (the privacy unit, the public number of
        units N and the rows each may contribute), or None for a row (neighbours replace one row)."""
        return None if self._unit is None or self._unit.row_level else self._unit

    @property
    def sampler(self) -> str:
        """Where the noise came from: ``"secure"`` (every noisy release made on its grid by the exact discrete
        Gaussian sampler, :mod:`dpivreg.privacy.sampler`), ``"seeded"`` (numpy's generator from a given seed),
        ``"mixed"``, or ``"none"`` (no noise)."""
        noisy = [r for r in self._releases if r.noise_std > 0]
        if not noisy:
            return "none"
        secure = [r.grid is not None for r in noisy]
        return "secure" if all(secure) else "seeded" if not any(secure) else "mixed"

    @property
    def protects(self) -> str:
        """The guarantee's unit in words: "each row", or "each unit of 'hh_id' (N units, at most m rows each)"."""
        return "each row" if self.unit is None else "each " + self.unit.describe()

    @property
    def releases(self) -> tuple[Release, ...]:
        """All recorded releases, in order."""
        return self._releases

    @property
    def target(self) -> dict[str, float]:
        """The budgets requested, by stage (display only)."""
        return dict(self._target)

    def rho_of(self, stage: str) -> float:
        """zCDP spent on one budget line (0 when the line has no release)."""
        return float(sum(r.rho for r in self._releases if r.stage == stage))

    @property
    def rho(self) -> float:
        """Total zCDP spent (``inf`` when any release is not private)."""
        return float(sum(r.rho for r in self._releases))

    @property
    def rho0(self) -> float:
        """zCDP spent by the private preprocessing (moments for centring, scaling, whitening)."""
        return self.rho_of("rho0")

    @property
    def rho1(self) -> float:
        """zCDP spent by the first stage (the Θ path)."""
        return self.rho_of("rho1")

    @property
    def rho2(self) -> float:
        """zCDP spent by the second stage (the β path)."""
        return self.rho_of("rho2")

    @property
    def mu(self) -> float:
        """Gaussian-DP parameter μ = sqrt(2ρ) of the whole fit."""
        return math.sqrt(2.0 * self.rho)

    @property
    def is_private(self) -> bool:
        """False when any release was made without noise or without clipping."""
        return math.isfinite(self.rho)

    def epsilon(self, delta: float = 1e-5, method: EpsilonMethod = "gaussian") -> float:
        """ε at ``delta`` for the whole fit (see :func:`epsilon_from_rho` for the methods)."""
        return epsilon_from_rho(self.rho, delta, method)

    def delta(self, epsilon: float, method: EpsilonMethod = "gaussian") -> float:
        """δ at ``epsilon`` for the whole fit (inverse of :meth:`epsilon`).

        ``epsilon = inf`` gives 0 (even for a non-private fit); a non-private fit has δ = 1 at
        every finite ε. See :func:`delta_from_rho`.
        """
        return delta_from_rho(self.rho, epsilon, method)

    def to_frame(self) -> pd.DataFrame:
        """One row per release: stage, steps, clip, sensitivity, noise std, ρ spent."""
        rows = [
            {
                "release": r.name,
                "stage": r.stage,
                "steps": r.steps,
                "clip": np.nan if r.clip is None else r.clip,
                "sensitivity": r.sensitivity,
                "noise_std": r.noise_std,
                "rho": r.rho,
            }
            for r in self._releases
        ]
        return pd.DataFrame(rows, columns=["release", "stage", "steps", "clip", "sensitivity", "noise_std", "rho"])

    def __repr__(self) -> str:
        lines = [f"PrivacyBudget(rho={self.rho:.6g}, private={self.is_private}, protects {self.protects})"]
        for r in self._releases:
            clip = "none" if r.clip is None else f"{r.clip:.4g}"
            lines.append(
                f"  {r.stage}: {r.name}: {r.steps} step(s), clip {clip}, noise std {r.noise_std:.4g}, "
                f"rho {r.rho:.6g}"
            )
        if self.is_private:
            lines.append(
                f"  epsilon at delta=1e-5: {self.epsilon(1e-5):.4f} (exact Gaussian), "
                f"{self.epsilon(1e-5, 'cks'):.4f} (CKS20), {self.epsilon(1e-5, 'bun-steinke'):.4f} (Bun-Steinke)"
            )
        else:
            lines.append("  NOT PRIVATE: a release had no noise or no clipping (rho = inf, epsilon = inf).")
        return "\n".join(lines)
