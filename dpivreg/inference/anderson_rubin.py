"""The Anderson–Rubin confidence set for one endogenous coefficient, from the moment release (no privacy cost).

Anderson & Rubin (1949): for a hypothesised value b of the endogenous coefficient, regress e(b) = y − x·b on
the exogenous regressors W and the m excluded instruments Z₂; under H₀: β = b the instruments' coefficients
π(b) are zero whatever the first stage's strength. The set of b not rejected at level 1 − α is a valid
confidence set when the instruments are weak, and it is bounded only when the data identify β: it may be an
interval, the complement of an interval, the whole line (the first stage cannot be told from zero) or, with
m > 1, empty (the over-identifying restrictions are rejected at every b).

Every piece is a function of the second moments of [W, Z₂, x, y] and of n (public), so the set is computed
from the moment release (``rho0`` on the DP-2S-GD route, the whole release for noisy moments):
post-processing, no further budget. With the moments partialled on W (residual Gram matrices per row),

    S = Z₂ᵀM_W Z₂/n,   Π = S⁻¹ Z₂ᵀM_W [y, x]/n,   B = [y, x]ᵀM_[W,Z₂] [y, x]/n,

so that for v = (1, −b): π̂(b) = Πv and the residual variance is σ̂²(b) = n·vᵀBv/(n − q). The classical
statistic is m times the AR F statistic,

    AR(b) = π̂(b)ᵀ [σ̂²(b) S⁻¹/n]⁻¹ π̂(b)  ~  m·F(m, n − q)  (homoskedastic normal errors, exactly).

The privacy noise: the release's noise distribution is public, so its effect on Π is simulated as for the
other diagnostics (the released moments taken as the truth, re-released with fresh noise; fixed seed, so the
set is the same every time it is computed), giving the noise covariance of π̂(b) = Πv as a quadratic form in
v, V_noise(v). The private statistic studentises by the sum,

    AR_priv(b) = π̂(b)ᵀ [σ̂²(b) S⁻¹/n + V_noise(b)]⁻¹ π̂(b),

compared with the same critical value m·F_{1−α}(m, n − q): under H₀ π̂(b) is, to first order, Gaussian with
the sum of the two covariances (the noise on Z₂ᵀe enters linearly, that on S only through a well-conditioned
inverse), so the test keeps its level however weak the first stage, as the classical one does. With ρ = ∞ the
noise term is zero and the set is the classical AR set. Homoskedastic errors are assumed (as in the
classical AR test and the first-stage F of :mod:`dpivreg.inference.diagnostics`); a heteroskedasticity-robust version
would need the meat Σ z̃z̃ᵀe(b)², a further release, and is not provided.

The set is found by inverting the test on the circle: AR is homogeneous of degree 0 in v, so with
v = (cos θ, −sin θ), b = tan θ, the whole extended line (θ = ±π/2 is b = ±∞) is a grid of angles;
the crossings of the critical value are refined by root finding. The set is unbounded exactly when the
statistic at b = ±∞, the test of a zero first stage, does not reject.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from scipy import optimize, stats

from dpivreg.estimation.moments import FLOOR, floor_spectrum, partialled_regression

__all__ = ["AndersonRubinSet", "anderson_rubin_set", "reduced_form", "GRID_POINTS"]

#: Angles in the grid over the extended line before the crossings are refined.
GRID_POINTS = 4001


@dataclass(frozen=True)
class AndersonRubinSet:
    """A confidence set for one endogenous coefficient by inverting the Anderson–Rubin test.

    Attributes
    ----------
    variable : str
        The endogenous regressor.
    level : float
        Confidence level.
    intervals : tuple of (float, float)
        Disjoint closed intervals, in increasing order, whose union is the set (±inf for unbounded ends);
        empty when every value is rejected.
    critical_value : float
        m·F_{level}(m, n − q): the set is {b : statistic(b) ≤ critical_value}.
    df : tuple of int
        (m, n − q) of the F reference distribution.
    private : bool
        Whether the moments were a noisy release (the privacy noise is then in the statistic's variance).
    """

    variable: str
    level: float
    intervals: tuple[tuple[float, float], ...]
    critical_value: float
    df: tuple[int, int]
    private: bool
    _statistic: Callable[[np.ndarray], np.ndarray] = field(repr=False, compare=False, default=None)

    @property
    def kind(self) -> str:
        """``"bounded"``, ``"unbounded"`` (the complement of a bounded set), ``"whole line"`` or ``"empty"``."""
        if not self.intervals:
            return "empty"
        if self.intervals == ((-math.inf, math.inf),):
            return "whole line"
        return "bounded" if all(map(math.isfinite, np.ravel(self.intervals))) else "unbounded"

    @property
    def bounded(self) -> bool:
        """Whether the set is a bounded (non-empty) set."""
        return self.kind == "bounded"

    @property
    def length(self) -> float:
        """Total length of the set (inf when unbounded, 0 when empty)."""
        return float(sum(hi - lo for lo, hi in self.intervals))

    def statistic(self, b) -> np.ndarray:
        """AR statistic (m × the F statistic; module docstring) at the hypothesised value(s) ``b``."""
        return self._statistic(np.asarray(b, dtype=float))

    def pvalue(self, b) -> np.ndarray:
        """p-value of H₀: coefficient = b, from F(m, n − q) of statistic/m."""
        m, dof = self.df
        return stats.f.sf(self.statistic(b) / m, m, dof)

    def __contains__(self, b: float) -> bool:
        return any(lo <= b <= hi for lo, hi in self.intervals)

    def __str__(self) -> str:
        if not self.intervals:
            return "empty"

        def end(value: float) -> str:
            return "inf" if value == math.inf else "-inf" if value == -math.inf else f"{value:.4g}"

        return " ∪ ".join(f"{'(' if lo == -math.inf else '['}{end(lo)}, {end(hi)}{')' if hi == math.inf else ']'}"
                          for lo, hi in self.intervals)


def reduced_form(G: np.ndarray, n_exog: int, q: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(S, Π, B) of the module docstring from Gram matrices G (…, 1 + q + 2, same) of [1, Z, x, y] per row,
    Z's first ``n_exog`` columns the exogenous regressors W; the columns of Π and the rows of B are (y, x)."""
    return partialled_regression(G, n_exog, q, [2 + q, 1 + q])


def _statistic_on_directions(S, Pi, B, K, v: np.ndarray, n: int, q: int) -> np.ndarray:
    """AR_priv at directions v (g, 2): the working scale's (1, −b̃) up to scale."""
    pi = v @ Pi.T  # (g, m)
    sigma2 = np.maximum(np.einsum("gi,ij,gj->g", v, B, v), 1e-300) * n / (n - q)  # B floored: positive
    V = sigma2[:, None, None] * np.linalg.inv(S)[None] / n + np.einsum("ga,gb,abij->gij", v, v, K)
    return np.einsum("gi,gi->g", pi, np.linalg.solve(V, pi[..., None])[..., 0])


def anderson_rubin_set(G: np.ndarray, G_draws: np.ndarray | None, *, variable: str, n_exog: int, q: int, n: int,
                       to_original: float, level: float = 0.95) -> AndersonRubinSet:
    """The AR set (module docstring) from the released Gram matrix G (1 + q + 2, same) of [1, Z, x, y] on a
    scale where x = to_original⁻¹ × (the original x) up to a shift absorbed by W, y likewise up to its own scale:
    the working coefficient b̃ maps to ``to_original``·b̃. ``G_draws`` (R, …): the same matrix re-released with
    simulated noise (``None`` for exact moments)."""
    if not to_original > 0:
        raise ValueError(f"to_original must be positive (a ratio of scales), got {to_original!r}.")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}.")
    m = q - n_exog
    if m < 1:
        raise ValueError("the Anderson–Rubin set needs at least one excluded instrument.")
    if n <= q:
        raise ValueError(f"the Anderson–Rubin set needs more rows than instruments (n = {n}, q = {q}).")
    S, Pi, B = reduced_form(G, n_exog, q)
    B = floor_spectrum(B, FLOOR)  # a noisy residual Gram matrix need not be positive definite
    if G_draws is None:
        K = np.zeros((2, 2, m, m))
    else:
        _, Pi_draws, _ = reduced_form(G_draws, n_exog, q)
        D = Pi_draws - Pi_draws.mean(axis=0)
        K = np.einsum("ria,rjb->abij", D, D) / (len(D) - 1)

    def on_angles(theta: np.ndarray) -> np.ndarray:
        theta = np.atleast_1d(theta)
        return _statistic_on_directions(S, Pi, B, K, np.column_stack([np.cos(theta), -np.sin(theta)]), n, q)

    critical = float(m * stats.f.ppf(level, m, n - q))
    theta = np.linspace(-math.pi / 2, math.pi / 2, GRID_POINTS)
    # a precisely estimated coefficient has a set far narrower than the grid's spacing: add the statistic's
    # minimiser and maximiser, so that no accepted (or rejected) arc can fall between grid points
    extremes = _extreme_angles(S, Pi, B, K, n, q, on_angles)
    theta = np.unique(np.concatenate([theta, extremes]))
    accepted = on_angles(theta) <= critical
    arcs = _accepted_arcs(theta, accepted, lambda t: float(on_angles(np.array([t]))[0]) - critical)
    intervals = _to_line(arcs, to_original)

    def statistic(b: np.ndarray) -> np.ndarray:
        # through the angle, so that b = ±inf is the limit (the test of a zero first stage)
        return on_angles(np.arctan(np.atleast_1d(b) / to_original)).reshape(np.shape(b))

    return AndersonRubinSet(variable=variable, level=level, intervals=intervals, critical_value=critical,
                            df=(m, n - q), private=G_draws is not None, _statistic=statistic)


def _extreme_angles(S, Pi, B, K, n: int, q: int, on_angles) -> np.ndarray:
    """Angles in (−π/2, π/2) of the statistic's minimum and maximum over the half circle.

    With one instrument the statistic is a ratio of two quadratic forms in v, vᵀMv/vᵀNv with M = ΠᵀΠ and
    N = B/(S(n − q)) + K, whose extremes are the generalised eigenvectors of (M, N); with several the same
    pencil with M = ΠᵀSΠ and N = B/(n − q) + the noise term projected on S gives starting points, refined by
    a bounded search around each (the statistic is smooth and, near its extremes, unimodal).
    """
    m = S.shape[0]
    M = Pi.T @ S @ Pi
    N = B / (n - q) + np.einsum("ij,abji->ab", S, K) / m
    N = (N + N.T) / 2.0 + 1e-300 * np.eye(2)
    try:
        _, vectors = np.linalg.eig(np.linalg.solve(N, M))
    except np.linalg.LinAlgError:
        return np.empty(0)
    angles = []
    for vector in np.real(vectors).T:
        start = math.atan2(-vector[1], vector[0])
        start = (start + math.pi / 2) % math.pi - math.pi / 2  # v and −v are one direction
        for sign in (1.0, -1.0):  # the minimum, then the maximum
            window = (max(start - 0.1, -math.pi / 2), min(start + 0.1, math.pi / 2))
            found = optimize.minimize_scalar(lambda t: sign * float(on_angles(np.array([t]))[0]), bounds=window,
                                             method="bounded", options={"xatol": 1e-14})
            angles.append(found.x)
    return np.clip(np.asarray(angles, dtype=float), -math.pi / 2, math.pi / 2)


def _accepted_arcs(theta: np.ndarray, accepted: np.ndarray, excess) -> list[tuple[float, float]]:
    """Maximal accepted runs of the grid over [−π/2, π/2] with their ends refined at the crossings
    (``excess`` = statistic − critical value, negative inside)."""
    def crossing(a: float, b: float, inside_end: float) -> float:
        try:
            return optimize.brentq(excess, a, b, xtol=1e-13)
        except ValueError:  # the grid's and the scalar evaluation's last bits disagree at a crossing
            return inside_end

    arcs, start = [], None
    for i, inside in enumerate(accepted):
        if inside and start is None:
            start = theta[0] if i == 0 else crossing(theta[i - 1], theta[i], theta[i])
        if not inside and start is not None:
            arcs.append((start, crossing(theta[i - 1], theta[i], theta[i - 1])))
            start = None
    if start is not None:
        arcs.append((start, theta[-1]))
    return arcs


def _to_line(arcs: list[tuple[float, float]], to_original: float) -> tuple[tuple[float, float], ...]:
    """Arcs of angles in [−π/2, π/2] (b̃ = tan θ; both ends of the range are b = ∞) as intervals of the
    original coefficient, the arcs at the two ends joined through infinity."""
    half = math.pi / 2
    if len(arcs) == 1 and arcs[0] == (-half, half):
        return ((-math.inf, math.inf),)
    return tuple((-math.inf if lo == -half else math.tan(lo) * to_original,
                  math.inf if hi == half else math.tan(hi) * to_original) for lo, hi in arcs)
