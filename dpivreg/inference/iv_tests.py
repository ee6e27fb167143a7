"""Private IV specification tests: over-identification, endogeneity and the effective first-stage F.

Every statistic here is a function of the released second moments of [1, Z̃, X̃_endog, Ỹ] (the moment release,
``rho0``) and, for the heteroskedasticity-robust ones, of a released meat; so each is post-processing of releases
the fit already made and costs no budget. The statistics are invariant to the affine maps from the design to the
working scale (each depends on the column spaces of the exogenous regressors and the instruments, and on the
outcome and the endogenous regressors up to those spaces), so they are computed on the working scale and equal
the statistics of the original columns. Notation (per row, uncentred): M_AB the Gram block of the column sets A
and B; X1 the exogenous regressors (the constant included), X2 the p endogenous ones, Z = [X1, Z2] the q
instruments, X = [X1, X2], β the 2SLS solution of the moments, g = M_Zy − M_ZX β and σ² = M_yy − 2βᵀM_Xy + βᵀM_XXβ.

``sargan``, ``basmann`` (linearmodels ``IVResults.sargan``/``basmann``; Stata ``estat overid``)
    Sargan = n·gᵀM_ZZ⁻¹g/σ² (n times the uncentred R² of the 2SLS residuals on the instruments), Basmann =
    Sargan·(n − q)/(n − Sargan), both χ²(q − p). Homoskedastic errors.

``wooldridge_overid`` (linearmodels ``IVResults.wooldridge_overid``; Stata's score χ² of ``estat overid`` after
``vce(robust)``; Wooldridge 1995)
    The heteroskedasticity-robust test: J = n·mᵀ[Ω⁻¹ − Ω⁻¹G(GᵀΩ⁻¹G)⁻¹GᵀΩ⁻¹]m with m = M_Zy, G = M_ZX and Ω the
    released structural meat (1/n)Σᵢz̃ᵢz̃ᵢᵀũᵢ² of the robust standard errors, χ²(q − p). It is the J of two-step
    efficient GMM from 2SLS; the bracket annihilates G, so m may be taken at any β and the estimate enters only
    through Ω (at the private β̃; at the 2SLS β̂ with an infinite budget). The naive n·ĝᵀΩ⁻¹ĝ at the 2SLS residuals
    is not χ²(q − p) under heteroskedasticity (it over-rejects) and is not used.

``durbin``, ``wu_hausman`` (linearmodels ``IVResults.durbin``/``wu_hausman``; Stata ``estat endogenous``)
    For the tested endogenous regressors S (all by default): the efficient model treats X_S as exogenous (2SLS with
    the instruments A = [Z, X_S]; OLS when S is all of X2), β_e its solution, g_e = M_Ay − M_AXβ_e and σ_e² its mean
    squared residual; d = g_eᵀM_AA⁻¹g_e − gᵀM_ZZ⁻¹g. Durbin = n·d/σ_e², χ²(|S|); Wu–Hausman =
    (n·d/|S|)/((n·σ_e² − n·d)/(n − k1 − p − |S|)), F(|S|, n − k1 − p − |S|), k1 the exogenous regressors (the
    constant included). Homoskedastic errors.

``wooldridge_score`` (linearmodels ``IVResults.wooldridge_score``; Stata's robust score χ² of ``estat endogenous``
after ``vce(robust)``; Wooldridge 1995, Wooldridge 2010 eq. 6.19)
    The heteroskedasticity-robust test that all endogenous regressors are exogenous: e the OLS residual of y on X,
    v̂ the first-stage residuals of X2 on Z and r = M_X v̂ (v̂ with X partialled out); the statistic is
    n·s̄ᵀΩ_s⁻¹s̄, χ²(p), with s̄ = (1/n)Σᵢrᵢeᵢ and Ω_s = (1/n)Σᵢrᵢrᵢᵀeᵢ² (n minus the residual sum of squares of
    the regression of 1 on rᵢeᵢ). Since r ⊥ X, s̄ = (1/n)Σᵢv̂ᵢeᵢ = g_X2 − Πᵀg_Z with g = M_Ay − M_AXβ the OLS moments on
    A = [Z, X2] and Π = M_ZZ⁻¹M_ZX2: post-processing of the moment release. Ω_s is a p×p release of the scores
    rᵢeᵢ at the maps r = Rᵀw, e = bᵀw that the released moments give (:func:`endogeneity_score_map`,
    :func:`dpivreg.inference.covariance.endogeneity_meat_release`, a share of ``rho_diag``); per cluster with
    ``cov_type="clustered"`` (Stata's ``vce(cluster ...)`` version). Under the null, Σᵢrᵢeᵢ = Σᵢrᵢuᵢ exactly
    (r ⊥ X), so the simulated null law draws s̄ from N(0, Ω_s/n) (:func:`_null_worlds` with a covariance on A whose
    image under R is Ω_s) and re-releases Ω_s with its noise.

``effective_f`` (Montiel Olea & Pflueger 2013, "A robust test for weak instruments", JBES 31, 358–369)
    With one endogenous regressor x and the exogenous regressors partialled out: F_eff = n·π̂ᵀM̃π̂ / tr(M̃⁻¹S̃),
    π̂ the excluded instruments' first-stage coefficients, M̃ = M_{Z2Z2} − M_{Z2X1}M_{X1X1}⁻¹M_{X1Z2} and S̃ = TSTᵀ
    the first stage's meat S = (1/n)Σᵢz̃ᵢz̃ᵢᵀv̂ᵢ² with X1 partialled out (T = [−M_{Z2X1}M_{X1X1}⁻¹, I]); HC0 (the
    clustered meat with ``cov_type="clustered"``), no degrees-of-freedom factor (Stata's ``weakivtest`` reports it
    times (n − q)/n). The meat is released at the fit's first stage Θ̃ (DP-2S-GD's, or the noisy moments'), whose
    residuals v̂ it uses. With one instrument it is the
    robust first-stage Wald statistic. Its critical value is MOP's **simplified** procedure for a worst-case
    2SLS Nagar bias of τ = 10% of the benchmark at 5% level: with w the eigenvalues of M̃⁻¹S̃ over their sum and
    x = 1/τ, K_eff = (1 + 2x)/(Σw² + 2x·max w) and c = F⁻¹_{χ²(K_eff, x·K_eff)}(0.95)/K_eff (23.11 with one
    instrument; the generalized procedure, which also needs the outcome's reduced-form meat, gives a smaller c).

Noise intervals (every function below takes ``grams``, the re-releases a fit already holds, so that one fit's tests
share them): each statistic of the plug-in world's re-releases (the released moments taken as the truth,
re-released with fresh noise and floored as the release was; the meats re-released likewise), their central
``level`` range (:func:`dpivreg.inference.diagnostics.released_grams`, fixed seeds: the same every time). Like the
first-stage F's, an interval describes the privacy noise only, not the sampling error.

P-values (:attr:`TestStatistic.pval`) are simulated: the released statistic carries the noise, which inflates it
(the χ²/F law rejected a true null in 64–68% of fits at n = 10⁴, ρ = 2.6). Its law under the null is simulated in
worlds where the null holds (:func:`_null_worlds`): the released moments with the outcome's moments on the test's
instruments A set to M_AXβ, plus a draw of their sampling error (N(0, σ²M_AA/n), or N(0, Ω/n) with the released meat
for the robust test) and of the privacy noise the release puts on g; the p-value is the share of
:data:`NULL_DRAWS` such statistics at or above the released one, and :attr:`TestStatistic.critical_values` are their
quantiles. The homoskedastic tests are refused when the release cannot tell the residual variance from 0
(:func:`_require_resolved_variance`). All of this is post-processing of the releases and public inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from dpivreg.errors import InferenceUnavailableError
from dpivreg.estimation.moments import FLOOR, floor_spectrum, iqr_scale
from dpivreg.estimation.working_scale import ReleasedMoments
from dpivreg.inference.covariance import ReleasedMeat
from dpivreg.inference.diagnostics import REPLICATIONS, SEED, _extended_map, released_grams
from dpivreg.privacy.accounting import Release

__all__ = ["TestStatistic", "EffectiveF", "MOP_TAU", "sargan_statistic", "basmann_statistic", "endogeneity_statistics",
           "robust_overid_statistic", "effective_f_statistic", "simplified_critical_value", "overidentification_tests",
           "robust_overidentification_test", "endogeneity_tests", "effective_f", "structural_meat",
           "endogeneity_score_map", "endogeneity_score_statistic", "robust_endogeneity_test"]

#: The worst-case bias MOP's critical value guards against (τ), and the test's level.
MOP_TAU = 0.10
MOP_LEVEL = 0.05


# --------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TestStatistic:
    """A private specification test, named as linearmodels' ``WaldTestStatistic``: ``stat``, ``pval``, ``dist``,
    ``dist_name``, ``null``, ``df``, ``df_denom``, ``critical_values``; with ``lower``/``upper`` the ``level``
    interval of the statistic for the privacy noise, and ``cost`` (what paid for it: "free, from the moment
    release", or the release that was bought)."""

    __test__ = False  # not a pytest class

    name: str
    null: str
    stat: float
    df: int
    df_denom: int | None
    lower: float
    upper: float
    cost: str
    level: float = 0.95
    null_draws: np.ndarray | None = field(default=None, repr=False, compare=False)
    shared_pval: float | None = None

    def __post_init__(self) -> None:
        for name in ("stat", "lower", "upper"):
            object.__setattr__(self, name, float(_at_least_zero(getattr(self, name))))
        if self.null_draws is not None:
            object.__setattr__(self, "null_draws", _at_least_zero(self.null_draws))

    @property
    def dist(self):
        """The statistic's large-sample law under the null (scipy frozen distribution)."""
        return stats.chi2(self.df) if self.df_denom is None else stats.f(self.df, self.df_denom)

    @property
    def dist_name(self) -> str:
        return f"chi2({self.df})" if self.df_denom is None else f"F({self.df},{self.df_denom})"

    @property
    def pval(self) -> float:
        """P-value of the released statistic: against its simulated law under the null with the privacy noise
        (module docstring, :attr:`null_draws`), or, for exact moments, against :attr:`dist`."""
        if self.shared_pval is not None:
            return self.shared_pval
        if self.null_draws is None:
            return float(self.dist.sf(self.stat))
        draws = self.null_draws
        return float((1 + np.sum(~(draws < self.stat))) / (1 + draws.size))

    @property
    def pval_nonprivate_law(self) -> float:
        """P-value against :attr:`dist`, the law without privacy noise (it ignores the noise, which inflates the
        statistic: shown for comparison, not for inference)."""
        return float(self.dist.sf(self.stat))

    @property
    def critical_values(self) -> dict[str, float]:
        """The 10%, 5% and 1% critical values (linearmodels' keys) of the law the p-value uses: the quantiles of the
        simulated law under the null with the privacy noise (:attr:`null_draws`), or of :attr:`dist` for exact
        moments. (The noise-free law's would reject a true null in most private fits.)"""
        levels = (("10%", 0.10), ("5%", 0.05), ("1%", 0.01))
        if self.null_draws is None:
            return {key: float(self.dist.ppf(1 - level)) for key, level in levels}
        return {key: float(np.quantile(self.null_draws, 1 - level, method="inverted_cdf")) for key, level in levels}

    def __str__(self) -> str:
        level = f"{100 * self.level:g}%"
        return "\n".join([
            self.name, f"H0: {self.null}", f"Statistic: {self.stat:0.4f}", f"P-value: {self.pval:0.4f}"
            + ("" if self.null_draws is None else " (simulated law under H0 with the privacy noise)"),
            f"Distributed: {self.dist_name}" + ("" if self.null_draws is None else " without noise"),
            f"Privacy-noise {level} interval: [{self.lower:0.4g}, {self.upper:0.4g}]",
            f"Cost: {self.cost}"])

    def __repr__(self) -> str:
        return (f"TestStatistic(name={self.name!r}, stat={self.stat:.4g}, pval={self.pval:.4g}, "
                f"dist={self.dist_name!r}, interval=[{self.lower:.4g}, {self.upper:.4g}])")


@dataclass(frozen=True)
class EffectiveF:
    """Montiel Olea–Pflueger's effective first-stage F of one endogenous regressor, with its critical value.

    ``stat`` (HC0 meat, or the clustered meat with ``cov_type="clustered"``), ``critical_value`` (simplified
    procedure, worst-case bias ``tau`` at 5%), ``k_eff`` (the effective degrees of freedom), ``lower``/``upper``
    (the ``level`` interval for the privacy noise), ``weak`` (the whole noise interval below the critical value),
    ``possibly_weak`` (its lower end below it: the released F cannot exclude weak instruments) and ``cost``.

    The noise interval is the percentile range of re-releases, which under-covers when the instruments are weak
    against the noise (the noise inflates the statistic): with three instruments at n = 5,000, ρ = 1 it held the
    noise-free value in 0.73 of fits, the rest below it; read ``possibly_weak``, not the point."""

    variable: str
    stat: float
    critical_value: float
    k_eff: float
    lower: float
    upper: float
    cost: str
    tau: float = MOP_TAU
    level: float = 0.95
    procedure: str = "simplified"

    @property
    def weak(self) -> bool:
        """The whole privacy-noise interval lies below the critical value."""
        return bool(self.upper < self.critical_value)

    @property
    def possibly_weak(self) -> bool:
        """The interval's lower end lies below the critical value: weak instruments cannot be excluded."""
        return bool(self.lower < self.critical_value)

    def __str__(self) -> str:
        return (f"Effective F (Montiel Olea-Pflueger) of {self.variable}: {self.stat:0.4g}, privacy-noise "
                f"{100 * self.level:g}% interval [{self.lower:0.4g}, {self.upper:0.4g}]; critical value "
                f"{self.critical_value:0.4g} ({self.procedure}, worst-case bias {100 * self.tau:g}% at 5%, K_eff "
                f"{self.k_eff:0.3g}): " + ("WEAK" if self.weak else "possibly weak" if self.possibly_weak else
                                            "not weak") + f". Cost: {self.cost}")


# --------------------------------------------------------------------------------------------------
# The statistics from Gram matrices G (…, D, D) of [1, Z̃, X̃_endog, Ỹ] per row
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    """Positions in the Gram matrix: instruments Z (exogenous X1 first), endogenous X2, the outcome y."""

    q: int
    n_exog: int
    p: int

    @property
    def Z(self) -> list[int]:
        return list(range(1, 1 + self.q))

    @property
    def X1(self) -> list[int]:
        return list(range(1, 1 + self.n_exog))

    @property
    def Z2(self) -> list[int]:
        return list(range(1 + self.n_exog, 1 + self.q))

    @property
    def X2(self) -> list[int]:
        return list(range(1 + self.q, 1 + self.q + self.p))

    @property
    def X(self) -> list[int]:
        return self.X1 + self.X2

    @property
    def y(self) -> int:
        return 1 + self.q + self.p


def _block(G: np.ndarray, rows: Sequence[int], cols: Sequence[int]) -> np.ndarray:
    return G[..., list(rows), :][..., :, list(cols)]


def _solve(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A⁻¹b for symmetric positive semi-definite A (…, k, k) floored against rounding (:data:`FLOOR`), b (…, k, m)."""
    return np.linalg.solve(floor_spectrum(A, FLOOR), b)


def _quad(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """bᵀA⁻¹b for b (…, k)."""
    return np.einsum("...i,...i->...", b, _solve(A, b[..., None])[..., 0])


def _tsls(G: np.ndarray, instruments: list[int], regressors: list[int], y: int) -> np.ndarray:
    """2SLS of y on the regressors with the instruments, from the Gram matrix (…, k)."""
    Gzx = _block(G, instruments, regressors)
    Gzz = _block(G, instruments, instruments)
    fitted = np.swapaxes(Gzx, -1, -2) @ _solve(Gzz, Gzx)
    return _solve(fitted, np.swapaxes(Gzx, -1, -2) @ _solve(Gzz, G[..., instruments, y][..., None]))[..., 0]


def _moment_and_variance(G: np.ndarray, instruments: list[int], regressors: list[int], y: int
                         ) -> tuple[np.ndarray, np.ndarray]:
    """g = M_Zy − M_ZXβ and σ² at the 2SLS β of these instruments."""
    beta = _tsls(G, instruments, regressors, y)
    g = G[..., instruments, y] - np.einsum("...ij,...j->...i", _block(G, instruments, regressors), beta)
    Gxx = _block(G, regressors, regressors)
    sigma2 = (G[..., y, y] - 2 * np.einsum("...i,...i->...", beta, G[..., regressors, y])
              + np.einsum("...i,...ij,...j->...", beta, Gxx, beta))
    return g, sigma2  # raw: noisy moments can put it at or below 0 (_require_resolved_variance refuses that)


def sargan_statistic(G: np.ndarray, q: int, n_exog: int, p: int, n: int) -> np.ndarray:
    """Sargan's statistic n·gᵀM_ZZ⁻¹g/σ² (module docstring), shape (…)."""
    at = _Layout(q, n_exog, p)
    g, sigma2 = _moment_and_variance(G, at.Z, at.X, at.y)
    return n * _quad(_block(G, at.Z, at.Z), g) / sigma2


def basmann_statistic(sargan: np.ndarray, q: int, n: int) -> np.ndarray:
    """Basmann's statistic from Sargan's: S(n − q)/(n − S); infinite where noisy moments put S at or above n."""
    sargan = np.asarray(sargan, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sargan < n, sargan * (n - q) / (n - sargan), np.inf)


def endogeneity_statistics(G: np.ndarray, q: int, n_exog: int, p: int, n: int, tested: Sequence[int]
                           ) -> tuple[np.ndarray, np.ndarray]:
    """(Durbin, Wu–Hausman) for the endogenous regressors at positions ``tested`` (0-based among X2), module
    docstring; each of shape (…)."""
    at = _Layout(q, n_exog, p)
    S = [at.X2[j] for j in tested]
    g, _ = _moment_and_variance(G, at.Z, at.X, at.y)
    A = at.Z + S
    g_e, sigma2_e = _moment_and_variance(G, A, at.X, at.y)
    d = _quad(_block(G, A, A), g_e) - _quad(_block(G, at.Z, at.Z), g)
    durbin = n * d / sigma2_e
    k = len(S)
    with np.errstate(divide="ignore", invalid="ignore"):
        wu_hausman = np.where(d < sigma2_e, (n * d / k) / ((n * sigma2_e - n * d) / (n - n_exog - p - k)), np.inf)
    return durbin, wu_hausman


def robust_overid_statistic(G: np.ndarray, meat: np.ndarray, q: int, n_exog: int, p: int, n: int) -> np.ndarray:
    """The heteroskedasticity-robust over-identification statistic n·mᵀ[Ω⁻¹ − Ω⁻¹G(GᵀΩ⁻¹G)⁻¹GᵀΩ⁻¹]m (module
    docstring) from Gram matrices and structural meats (…, q, q) on the working scale."""
    at = _Layout(q, n_exog, p)
    m = G[..., at.Z, at.y]
    Gzx = _block(G, at.Z, at.X)
    omega = floor_spectrum(meat, FLOOR)
    om = np.linalg.solve(omega, m[..., None])  # Ω⁻¹m
    oG = np.linalg.solve(omega, Gzx)  # Ω⁻¹G
    a = np.swapaxes(Gzx, -1, -2) @ om  # GᵀΩ⁻¹m
    B = np.swapaxes(Gzx, -1, -2) @ oG  # GᵀΩ⁻¹G
    total = np.einsum("...i,...i->...", m, om[..., 0])
    return n * (total - _quad(B, a[..., 0]))


def endogeneity_score_map(G: np.ndarray, q: int, n_exog: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """(R (D, p), b (D,)) with rᵢ = Rᵀwᵢ = M_X v̂ᵢ and eᵢ = bᵀwᵢ the OLS residual, wᵢ the row [1, z̃ᵢ, x̃ᵢ,endog, ỹᵢ]
    of the Gram matrix G (D, D) (module docstring, ``wooldridge_score``): the maps the endogeneity test's meat is
    released at (R and b put no weight on the box constant)."""
    at = _Layout(q, n_exog, p)
    V = np.zeros((G.shape[-1], p))  # v̂ = x2 − zᵀΠ
    V[at.X2, :] = np.eye(p)
    V[at.Z, :] = -_solve(_block(G, at.Z, at.Z), _block(G, at.Z, at.X2))
    R = V.copy()  # r = v̂ − xᵀΓ, Γ = M_XX⁻¹M_X v̂
    R[at.X, :] -= _solve(_block(G, at.X, at.X), G[at.X, :] @ V)
    b = np.zeros(G.shape[-1])
    b[at.y] = 1.0
    b[at.X] = -_solve(_block(G, at.X, at.X), G[at.X, at.y][:, None])[:, 0]
    return R, b


def _score_moment(G: np.ndarray, at: _Layout) -> np.ndarray:
    """s̄ = g_X2 − Πᵀg_Z (…, p): (1/n)Σᵢv̂ᵢeᵢ from the Gram matrices (module docstring, ``wooldridge_score``)."""
    A = at.Z + at.X2
    g, _ = _moment_and_variance(G, A, at.X, at.y)  # OLS: the instruments A span the regressors
    pi = _solve(_block(G, at.Z, at.Z), _block(G, at.Z, at.X2))
    return g[..., len(at.Z):] - np.einsum("...ij,...i->...j", pi, g[..., :len(at.Z)])


def endogeneity_score_statistic(G: np.ndarray, meat: np.ndarray, q: int, n_exog: int, p: int, n: int) -> np.ndarray:
    """The robust score statistic n·s̄ᵀΩ_s⁻¹s̄ (module docstring) from Gram matrices (…, D, D) and the endogeneity
    test's meats Ω_s (…, p, p), on the working scale."""
    return n * _quad(meat, _score_moment(G, _Layout(q, n_exog, p)))


def _partialled(G: np.ndarray, at: _Layout) -> tuple[np.ndarray, np.ndarray]:
    """M̃ (the excluded instruments' Gram with X1 partialled out) and T = [−M_{Z2X1}M_{X1X1}⁻¹, I] (…, m, q)."""
    m = at.q - at.n_exog
    if at.n_exog:
        coef = np.swapaxes(_solve(_block(G, at.X1, at.X1), _block(G, at.X1, at.Z2)), -1, -2)  # M_{Z2X1}M_{X1X1}⁻¹
    else:
        coef = np.zeros(G.shape[:-2] + (m, 0))
    T = np.concatenate([-coef, np.broadcast_to(np.eye(m), coef.shape[:-2] + (m, m))], axis=-1)
    Gzz = _block(G, at.Z, at.Z)
    return T @ Gzz @ np.swapaxes(T, -1, -2), T


def effective_f_statistic(G: np.ndarray, meat: np.ndarray, q: int, n_exog: int, n: int, column: int = 0
                          ) -> tuple[np.ndarray, np.ndarray]:
    """(F_eff, eigenvalues of M̃⁻¹S̃) of endogenous regressor ``column`` (module docstring) from Gram matrices and the
    first stage's meat block (…, q, q) of that regressor, on the working scale."""
    at = _Layout(q, n_exog, 1)
    x = 1 + q + column
    pi = _solve(_block(G, at.Z, at.Z), G[..., at.Z, x][..., None])[..., n_exog:, 0]
    M_tilde, T = _partialled(G, at)
    S_tilde = T @ meat @ np.swapaxes(T, -1, -2)
    ratio = _solve(M_tilde, S_tilde)
    explained = np.einsum("...i,...ij,...j->...", pi, M_tilde, pi)
    trace = np.trace(ratio, axis1=-2, axis2=-1)
    eigenvalues = np.sort(np.real(np.linalg.eigvals(ratio)), axis=-1)
    return n * explained / trace, eigenvalues


def simplified_critical_value(eigenvalues: np.ndarray, tau: float = MOP_TAU, level: float = MOP_LEVEL
                              ) -> tuple[float, float]:
    """(critical value, K_eff) of MOP's simplified procedure from the eigenvalues of M̃⁻¹S̃ (module docstring)."""
    w = np.asarray(eigenvalues, dtype=float)
    w = w / w.sum()
    x = 1.0 / tau
    k_eff = (1 + 2 * x) / (float(np.sum(w**2)) + 2 * x * float(np.max(w)))
    return float(stats.ncx2.ppf(1 - level, k_eff, x * k_eff) / k_eff), k_eff


def _at_least_zero(values):
    """Statistics the privacy noise drives below 0 (a difference or quadratic form of noisy moments that exact ones
    keep non-negative) are reported as 0: post-processing, monotone, so the p-values against simulated draws
    treated alike are unchanged (ties at 0 count as at or above)."""
    return np.maximum(values, 0.0)


def central_range(draws: np.ndarray, level: float) -> tuple[float, float]:
    """The central ``level`` range of simulated statistics (a non-finite draw, from a re-release with no residual
    left, counts as above the upper end)."""
    tail = (1.0 - level) / 2.0
    values = np.where(np.isfinite(draws), draws, np.inf)
    low, high = np.quantile(values, [tail, 1.0 - tail], method="inverted_cdf")  # no interpolation between infinities
    return float(low), float(high)



# --------------------------------------------------------------------------------------------------
# The tests from the releases, with their privacy-noise intervals
# --------------------------------------------------------------------------------------------------

#: What each test costs.
FREE = "free: post-processing of the moment release (rho0)"
FREE_WITH_MEAT = "free: post-processing of the moment release and the robust standard errors' meat (rho_inf)"
FIRST_STAGE_MEAT = "post-processing of the moment release and the first stage's meat (rho_diag)"
ENDOGENEITY_MEAT = "post-processing of the moment release and the endogeneity test's meat (rho_diag)"


def _require_overidentified(q: int, n_exog: int, p: int, name: str) -> None:
    if q - n_exog <= p:
        raise InferenceUnavailableError(
            f"{name} needs more excluded instruments than endogenous regressors; this model has {q - n_exog} for "
            f"{p}, so it is exactly identified and has no over-identifying restriction to test.")


def _require_resolved_variance(point: np.ndarray, draws: np.ndarray, instruments: list[int], regressors: list[int],
                               y: int, what: str, instead: str = "the heteroskedasticity-robust over-identification "
                                                                  "test (res.wooldridge_overid)") -> float:
    """The released residual variance σ̂² of the 2SLS with these instruments, refused when the release cannot tell it
    from 0: at or below its own noise, the spread (IQR/1.349) of σ² over the plug-in re-releases. A homoskedastic
    test divides by it, and a σ̂² that the noise put at or near 0 made Sargan's statistic 1e301. (The noise floor of
    the moment solves, 2√2 noise s.d.s, refused 83–97% of the heteroskedastic benchmark design's fits at n = 10⁴,
    whose sizes were within 0.035–0.065 without a rule.) Decided from released quantities only."""
    _, sigma2 = _moment_and_variance(point, instruments, regressors, y)
    _, again = _moment_and_variance(draws, instruments, regressors, y)
    noise = float(iqr_scale(again))  # robust: a few re-releases whose first stage the noise nearly destroys
    if not float(sigma2) > noise:
        raise InferenceUnavailableError(
            f"{what} divide by the residual variance, which the moment release cannot tell from 0 here "
            f"(σ̂² = {float(sigma2):.3g} on the working scale against a noise s.d. of {noise:.3g}): raise rho0 (or the "
            f"total rho), or use {instead}.")
    return float(sigma2)


def _grams(moments: ReleasedMoments, replications: int, grams=None) -> tuple[np.ndarray, np.ndarray]:
    """The released Gram matrix and its plug-in re-releases (the point itself, once, for exact moments): ``grams``
    when the caller holds them already (:func:`~dpivreg.inference.diagnostics.released_grams`' output), else made."""
    point, draws = released_grams(moments, replications) if grams is None else grams
    return point, (point[None] if draws is None else draws)


def _meat_draws(meat: ReleasedMeat, seed_offset: int, replications: int) -> np.ndarray:
    if meat.sigma == 0:
        return meat.matrix[None]
    return meat.rereleased(np.random.default_rng(SEED + seed_offset), replications)


def _gram_noise(moments: ReleasedMoments, replications: int, seed: int) -> np.ndarray | None:
    """Draws (R, D′, D′) of the moment release's noise mapped to the Gram matrices of [1, Z̃, X̃_endog, Ỹ]; None for
    exact moments."""
    if moments.sigma == 0:
        return None
    L = _extended_map(moments)
    return L @ moments.noise_draws(np.random.default_rng(seed), replications) @ L.T


def _null_worlds(G: np.ndarray, instruments: list[int], regressors: list[int], y: int, n: float, cov: np.ndarray,
                 noise: np.ndarray | None, *, seed: int, replications: int) -> np.ndarray:
    """Worlds (R, D′, D′) of the released statistic under the null.

    The released moments with the outcome's moments on the ``instruments`` A set to M_AXβ (β the 2SLS of the
    released moments with these instruments: its residual orthogonal to them), plus a draw of their sampling
    error, N(0, ``cov``/n), plus the privacy noise the release puts on g = M_Ay − M_AXβ, Nᵢ[A, y] − Nᵢ[A, X]β for
    draws Nᵢ of the release's noise (``noise``); the outcome's mean square keeps the released σ²(β). Only the
    outcome's column moves: the noise already in the released M_AA and M_AX is the world's truth, and adding it
    again (re-releasing the whole world) would count it twice, which made the null law of Sargan's statistic 1.4
    times too wide (n = 10⁴, ρ = 2.6). (The Gram matrix's first row, the box constant, is read by no statistic and
    is left as released.)"""
    beta = _tsls(G, instruments, regressors, y)
    _, sigma2 = _moment_and_variance(G, instruments, regressors, y)
    rng = np.random.default_rng(seed)
    values, vectors = np.linalg.eigh((cov + cov.T) / 2.0)
    draws = rng.standard_normal((replications, len(instruments))) @ (vectors * np.sqrt(np.maximum(values, 0.0) / n)).T
    if noise is not None:
        draws = draws + noise[:, instruments, y] - noise[:, instruments, :][:, :, regressors] @ beta
    new = _block(G, instruments, regressors) @ beta + draws
    worlds = np.repeat(G[None], replications, axis=0)
    worlds[:, instruments, y] = new
    worlds[:, y, instruments] = new
    cross = worlds[:, regressors, y]
    worlds[:, y, y] = sigma2 + 2.0 * cross @ beta - beta @ _block(G, regressors, regressors) @ beta
    return worlds


#: Simulated draws of a test's law under its null.
NULL_DRAWS = 2000


def overidentification_tests(moments: ReleasedMoments, q: int, n_exog: int, p: int, n: int, *, level: float = 0.95,
                             replications: int = REPLICATIONS, grams=None) -> tuple[TestStatistic, TestStatistic]:
    """Sargan's and Basmann's tests (module docstring) from the moment release, with ``level`` noise intervals."""
    _require_overidentified(q, n_exog, p, "Sargan's test")
    at = _Layout(q, n_exog, p)
    point, draws = _grams(moments, replications, grams)
    sigma2 = _require_resolved_variance(point, draws, at.Z, at.X, at.y, "Sargan's and Basmann's tests")
    sargan = float(sargan_statistic(point, q, n_exog, p, n))
    again = sargan_statistic(draws, q, n_exog, p, n)
    under_null = None
    if moments.sigma > 0:
        worlds = _null_worlds(point, at.Z, at.X, at.y, n, sigma2 * _block(point, at.Z, at.Z),
                              _gram_noise(moments, NULL_DRAWS, SEED + 6), seed=SEED + 5, replications=NULL_DRAWS)
        under_null = sargan_statistic(worlds, q, n_exog, p, n)
    null, df = "The model is not overidentified.", q - n_exog - p
    first = TestStatistic("Sargan's test of overidentification", null, sargan, df, None, *central_range(again, level),
                          FREE, level, under_null)
    # Basmann's statistic is an increasing function of Sargan's: the same test, so the same simulated p-value (with
    # exact moments each has its own large-sample law, as linearmodels reports them)
    second = TestStatistic("Basmann's test of overidentification", null, float(basmann_statistic(sargan, q, n)), df,
                           None, *central_range(basmann_statistic(again, q, n), level), FREE, level,
                           None if under_null is None else basmann_statistic(under_null, q, n),
                           None if under_null is None else first.pval)
    return first, second


def robust_overidentification_test(moments: ReleasedMoments, meat: ReleasedMeat, q: int, n_exog: int, p: int, n: int,
                                   *, level: float = 0.95, replications: int = REPLICATIONS,
                                   clustered: bool = False, grams=None) -> TestStatistic:
    """The heteroskedasticity-robust (or, with a clustered meat, cluster-robust) over-identification test (module
    docstring) from the moment release and the structural meat, with a ``level`` noise interval."""
    _require_overidentified(q, n_exog, p, "The robust over-identification test")
    at = _Layout(q, n_exog, p)
    point, draws = _grams(moments, replications, grams)
    stat = float(robust_overid_statistic(point, meat.matrix, q, n_exog, p, n))
    meats = _meat_draws(meat, 3, replications)
    again = robust_overid_statistic(draws, meats, q, n_exog, p, n)  # (1 or R) and (1 or R) draws broadcast
    under_null = None
    if moments.sigma > 0:
        worlds = _null_worlds(point, at.Z, at.X, at.y, n, meat.matrix, _gram_noise(moments, NULL_DRAWS, SEED + 8),
                              seed=SEED + 7, replications=NULL_DRAWS)
        under_null = robust_overid_statistic(worlds, meat.matrix, q, n_exog, p, n)
    kind = "cluster-robust" if clustered else "heteroskedasticity-robust"
    return TestStatistic(f"Wooldridge's score test of overidentification ({kind})", "Model is not overidentified.",
                         stat, q - n_exog - p, None, *central_range(again, level), FREE_WITH_MEAT, level, under_null)


def _tested_positions(variables, endog_names: Sequence[str]) -> list[int]:
    if variables is None:
        return list(range(len(endog_names)))
    names = [variables] if isinstance(variables, str) else variables
    if not isinstance(names, (list, tuple)) or not all(isinstance(v, str) for v in names) or not names:
        raise TypeError(f"variables must be None, a name or a list of names of endogenous regressors "
                        f"({list(endog_names)}), got {variables!r}.")
    unknown = [v for v in names if v not in endog_names]
    if unknown:
        raise ValueError(f"variables names {unknown}, which are not endogenous regressors of the model "
                         f"({list(endog_names)}).")
    return sorted({list(endog_names).index(v) for v in names})


def endogeneity_tests(moments: ReleasedMoments, endog_names: Sequence[str], q: int, n_exog: int, n: int,
                      variables=None, *, level: float = 0.95, replications: int = REPLICATIONS, grams=None
                      ) -> tuple[TestStatistic, TestStatistic]:
    """(Durbin, Wu–Hausman) for ``variables`` (all endogenous regressors by default; module docstring) from the
    moment release, with ``level`` noise intervals."""
    tested = _tested_positions(variables, endog_names)
    p = len(endog_names)
    at = _Layout(q, n_exog, p)
    point, draws = _grams(moments, replications, grams)
    A = at.Z + [at.X2[j] for j in tested]  # the efficient model's instruments: the tested regressors exogenous
    sigma2 = _require_resolved_variance(point, draws, A, at.X, at.y, "The Durbin and Wu-Hausman tests",
                                        "the heteroskedasticity-robust endogeneity test (res.wooldridge_score, which "
                                        "the default robust fit makes), which does not divide by it")
    durbin, wu_hausman = (float(v) for v in endogeneity_statistics(point, q, n_exog, p, n, tested))
    again = endogeneity_statistics(draws, q, n_exog, p, n, tested)
    under_null = (None, None)
    if moments.sigma > 0:
        worlds = _null_worlds(point, A, at.X, at.y, n, sigma2 * _block(point, A, A),
                              _gram_noise(moments, NULL_DRAWS, SEED + 11), seed=SEED + 10,
                              replications=NULL_DRAWS)
        under_null = endogeneity_statistics(worlds, q, n_exog, p, n, tested)
    null = ("All endogenous variables are exogenous" if len(tested) == p
            else "Variables {} are exogenous".format(", ".join(endog_names[j] for j in tested)))
    k = len(tested)
    first = TestStatistic("Durbin test of exogeneity", null, durbin, k, None, *central_range(again[0], level), FREE,
                          level, under_null[0])
    # Wu-Hausman's statistic is an increasing function of Durbin's: the same test, so the same simulated p-value
    return first, TestStatistic("Wu-Hausman test of exogeneity", null, wu_hausman, k, n - n_exog - p - k,
                                *central_range(again[1], level), FREE, level, under_null[1],
                                None if under_null[1] is None else first.pval)


def robust_endogeneity_test(moments: ReleasedMoments, meat: ReleasedMeat, q: int, n_exog: int, p: int, n: int, *,
                            level: float = 0.95, replications: int = REPLICATIONS, clustered: bool = False,
                            grams=None) -> TestStatistic:
    """Wooldridge's heteroskedasticity-robust (or, with a clustered meat, cluster-robust) score test that every
    endogenous regressor is exogenous (module docstring) from the moment release and the endogeneity test's
    released meat, with a ``level`` noise interval."""
    at = _Layout(q, n_exog, p)
    point, draws = _grams(moments, replications, grams)
    stat = float(endogeneity_score_statistic(point, meat.matrix, q, n_exog, p, n))
    again = endogeneity_score_statistic(draws, _meat_draws(meat, 12, replications), q, n_exog, p, n)
    under_null = None
    if moments.sigma > 0 or meat.sigma > 0:
        A = at.Z + at.X2
        D = endogeneity_score_map(point, q, n_exog, p)[0][A, :]  # rᵢ = Dᵀaᵢ
        lift = D @ np.linalg.pinv(D.T @ D)
        worlds = _null_worlds(point, A, at.X, at.y, n, lift @ meat.matrix @ lift.T,
                              _gram_noise(moments, NULL_DRAWS, SEED + 14), seed=SEED + 13, replications=NULL_DRAWS)
        under_null = endogeneity_score_statistic(worlds, _meat_draws(meat, 15, NULL_DRAWS), q, n_exog, p, n)
    kind = "cluster-robust" if clustered else "heteroskedasticity-robust"
    return TestStatistic(f"Wooldridge's score test of exogeneity ({kind})", "Endogenous variables are exogenous", stat,
                         p, None, *central_range(again, level), ENDOGENEITY_MEAT, level, under_null)


def effective_f(moments: ReleasedMoments, meat: ReleasedMeat, variable: str, q: int, n_exog: int, n: int, *,
                level: float = 0.95, replications: int = REPLICATIONS, tau: float = MOP_TAU, grams=None) -> EffectiveF:
    """Montiel Olea–Pflueger's effective F of the one endogenous regressor ``variable`` with its simplified critical
    value (module docstring), from the moment release and the first stage's meat, with a ``level`` noise
    interval."""
    point, draws = _grams(moments, replications, grams)
    stat, eigenvalues = effective_f_statistic(point, meat.matrix, q, n_exog, n)
    critical, k_eff = simplified_critical_value(eigenvalues, tau)
    meats = _meat_draws(meat, 4, replications)
    again, _ = effective_f_statistic(draws, meats, q, n_exog, n)
    return EffectiveF(variable, float(stat), critical, k_eff, *central_range(again, level), FIRST_STAGE_MEAT, tau,
                      level)


def structural_meat(meat: np.ndarray, releases: Sequence[Release]) -> ReleasedMeat:
    """The robust standard errors' released meat (``PrivateInference.meat`` and its records) as a
    :class:`~dpivreg.inference.covariance.ReleasedMeat`: the meat record's noise and clipping threshold (exact and
    unclipped when there is no record)."""
    if not releases:
        return ReleasedMeat(meat, 0.0, math.inf, ())
    record = releases[-1]
    return ReleasedMeat(meat, float(record.noise_std), float(record.clip), tuple(releases))
