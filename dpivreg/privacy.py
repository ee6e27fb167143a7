"""Privacy accounting for DP-2S-GD: calibration, the budget object and zCDP → (ε, δ) conversions.

The privacy model
-----------------
Neighbouring datasets differ by *replacing* one row; the number of rows ``n`` is public.
Every release of dpivreg is a Gaussian mechanism applied to a mean of per-sample clipped
vectors. With clipping threshold γ the mean has L2 sensitivity ``2γ/n`` (the replaced
row's clipped vector can flip from ``+γ`` to ``−γ``), and a Gaussian mechanism with
sensitivity Δ and noise standard deviation σ is ``Δ²/(2σ²)``-zCDP (Bun & Steinke 2016,
Proposition 1.6). zCDP composes additively, also adaptively (ibid., Lemma 2.3), so the
``T`` steps of each stage and the two stages add up.

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
``"bun-steinke"``  ε = ρ + 2·sqrt(ρ·log(1/δ)) (Bun & Steinke 2016, Proposition 1.3; the paper's
footnote), valid for any ρ-zCDP mechanism but loose.
``"cks"``          Canonne, Kamath & Steinke (2020), Proposition 12, minimised over the Rényi
order: the tightest conversion valid for *any* ρ-zCDP mechanism.
``"gaussian"``     (default) the exact privacy profile of the Gaussian mechanism. All releases of
DP-2S-GD are Gaussian mechanisms composed adaptively, so the whole fit is μ-GDP with
μ = sqrt(Σ Δ²/σ²) = sqrt(2ρ) (Dong, Roth & Su 2022, Corollary 3.3) and
δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2) (Balle & Wang 2018, Theorem 8).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Iterable, Literal

import numpy as np
import pandas as pd
from scipy import optimize, special

__all__ = [
    "PrivacyLeakWarning",
    "Release",
    "PrivacyBudget",
    "CALIBRATIONS",
    "EPSILON_METHODS",
    "noise_std",
    "clipped_mean_sensitivity",
    "gaussian_zcdp",
    "epsilon_from_rho",
    "delta_from_rho",
]

CALIBRATIONS = ("exact", "paper")
EPSILON_METHODS = ("gaussian", "cks", "bun-steinke")
EpsilonMethod = Literal["gaussian", "cks", "bun-steinke"]


class PrivacyLeakWarning(UserWarning):
    """A value computed from the private data fed the algorithm outside the privacy accounting.

    Raised (as a warning) whenever bounds, scales, centring, step sizes or clipping
    thresholds are read from the data instead of being public or paid for, and whenever a
    stage runs without noise or clipping so that the fit is not private at all. The
    message names what leaked; results keep the list and the summary prints it.
    """


# ----------------------------------------------------------------------------------------
# validation helpers shared by the package
# ----------------------------------------------------------------------------------------
def check_rho(value: float, name: str) -> float:
    """Return ``value`` as a float after checking it is a valid zCDP budget (> 0, inf allowed)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive number (a zCDP budget), got {value!r}.")
    value = float(value)
    if math.isnan(value) or value <= 0:
        raise ValueError(
            f"{name} must be > 0 (a zCDP budget; use numpy.inf for no noise, which is not private), "
            f"got {value!r}."
        )
    return value


def check_delta(delta: float, name: str = "delta") -> float:
    """Return ``delta`` as a float after checking 0 < δ < 1."""
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real):
        raise TypeError(f"{name} must be a number in (0, 1), got {delta!r}.")
    delta = float(delta)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"{name} must lie strictly between 0 and 1 (e.g. 1e-5 or 1/n²), got {delta!r}.")
    return delta


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
def _gaussian_delta(mu: float, epsilon: float) -> float:
    """Exact privacy profile of μ-GDP (Balle & Wang 2018, Thm 8; Dong, Roth & Su 2022, Cor. 2.13)."""
    if mu == 0.0:
        return 0.0
    # Φ(a) − e^ε Φ(b) computed with log-CDFs to stay accurate for large ε.
    a = -epsilon / mu + mu / 2.0
    b = -epsilon / mu - mu / 2.0
    log_first = special.log_ndtr(a)
    log_second = epsilon + special.log_ndtr(b)
    if log_second >= log_first:
        return 0.0
    return float(math.exp(log_first) * -math.expm1(log_second - log_first))


def _cks_epsilon(rho: float, delta: float) -> float:
    """Canonne, Kamath & Steinke (2020), Prop. 12 with Rényi order α: ε(α) minimised over α > 1.

    ε(α) = αρ + log(1/δ)/(α−1) + log(1 − 1/α) − log(α)/(α−1).
    """

    def eps_at(alpha: float) -> float:
        return (
            alpha * rho
            + math.log(1.0 / delta) / (alpha - 1.0)
            + math.log1p(-1.0 / alpha)
            - math.log(alpha) / (alpha - 1.0)
        )

    # ε(α) is convex on α > 1 in practice; bracket around the Bun–Steinke optimum 1 + sqrt(log(1/δ)/ρ).
    guess = 1.0 + math.sqrt(math.log(1.0 / delta) / rho)
    result = optimize.minimize_scalar(
        eps_at, bounds=(1.0 + 1e-9, max(10.0 * guess, 1e3)), method="bounded", options={"xatol": 1e-12}
    )
    return max(float(result.fun), 0.0)


def _cks_delta(rho: float, epsilon: float) -> float:
    """Inverse of :func:`_cks_epsilon`: δ(α) = exp((α−1)(αρ−ε))/α · (1−1/α)^(α−1), minimised over α."""

    def log_delta_at(alpha: float) -> float:
        return (alpha - 1.0) * (alpha * rho - epsilon) - math.log(alpha) + (alpha - 1.0) * math.log1p(-1.0 / alpha)

    upper = max(10.0 * (1.0 + epsilon / rho), 1e3)
    result = optimize.minimize_scalar(
        log_delta_at, bounds=(1.0 + 1e-9, upper), method="bounded", options={"xatol": 1e-12}
    )
    return float(min(1.0, math.exp(result.fun)))


def epsilon_from_rho(rho: float, delta: float, method: EpsilonMethod = "gaussian") -> float:
    """ε such that a ρ-zCDP fit is (ε, δ)-DP.

    Parameters
    ----------
    rho : float
        Total zCDP budget spent (``inf`` gives ``inf``).
    delta : float
        Target δ in (0, 1).
    method : {"gaussian", "cks", "bun-steinke"}
        ``"gaussian"`` is exact for compositions of Gaussian mechanisms (every dpivreg
        release is one); ``"cks"`` holds for any ρ-zCDP mechanism; ``"bun-steinke"`` is the
        paper's simple bound ε = ρ + 2·sqrt(ρ·log(1/δ)).
    """
    delta = check_delta(delta)
    method = _check_method(method)
    if rho < 0 or math.isnan(rho):
        raise ValueError(f"rho must be >= 0, got {rho!r}.")
    if math.isinf(rho):
        return math.inf
    if rho == 0.0:
        return 0.0
    if method == "bun-steinke":
        return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))
    if method == "cks":
        return _cks_epsilon(rho, delta)
    mu = math.sqrt(2.0 * rho)
    if _gaussian_delta(mu, 0.0) <= delta:
        return 0.0
    # δ(ε) decreases in ε; the Bun–Steinke ε is an upper bound on the exact one.
    upper = rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta)) + 1.0
    return float(optimize.brentq(lambda e: _gaussian_delta(mu, e) - delta, 0.0, upper, xtol=1e-13, rtol=1e-13))


def delta_from_rho(rho: float, epsilon: float, method: EpsilonMethod = "gaussian") -> float:
    """Smallest δ such that a ρ-zCDP fit is (ε, δ)-DP by the chosen conversion (inverse of
    :func:`epsilon_from_rho`)."""
    method = _check_method(method)
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or math.isnan(epsilon) or epsilon < 0:
        raise ValueError(f"epsilon must be a number >= 0, got {epsilon!r}.")
    epsilon = float(epsilon)
    if math.isinf(rho):
        return 1.0
    if rho == 0.0:
        return 0.0
    if method == "gaussian":
        return _gaussian_delta(math.sqrt(2.0 * rho), epsilon)
    if method == "cks":
        return _cks_delta(rho, epsilon)
    # Bun–Steinke: ε = ρ + 2 sqrt(ρ log(1/δ))  ⇔  δ = exp(−((ε − ρ)/2)² / ρ) for ε ≥ ρ.
    if epsilon <= rho:
        return 1.0
    return math.exp(-(((epsilon - rho) / 2.0) ** 2) / rho)


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
    """

    name: str
    stage: str
    steps: int
    clip: float | None
    sensitivity: float
    noise_std: float
    rho: float

    @classmethod
    def gaussian(
        cls, name: str, stage: str, *, steps: int, clip: float | None, n: int, noise_std: float
    ) -> "Release":
        """Record ``steps`` Gaussian releases of a mean of per-sample vectors clipped to ``clip``."""
        sensitivity = math.inf if clip is None else clipped_mean_sensitivity(clip, n)
        return cls(name, stage, steps, clip, sensitivity, noise_std, gaussian_zcdp(sensitivity, noise_std, steps))

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

    def __init__(self, releases: Iterable[Release], target: dict[str, float] | None = None) -> None:
        self._releases = tuple(releases)
        self._target = dict(target or {})

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
        """δ at ``epsilon`` for the whole fit (inverse of :meth:`epsilon`)."""
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
        lines = [f"PrivacyBudget(rho={self.rho:.6g}, private={self.is_private})"]
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
