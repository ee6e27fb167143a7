"""2SLS from second moments: the warm start of DP-2S-GD and the noisy-moment estimator (``method="moments"``).

Everything here is post-processing of a moment release (:class:`dpivreg.estimation.working_scale.ReleasedMoments`): the
second moments of the working columns [Z̃, X̃_endog, Ỹ] determine the 2SLS solution

    Θ = S_zz⁻¹ S_zx,   Θ̄ = [I_exog | Θ],   β = (Θ̄ᵀ S_zz Θ̄)⁻¹ Θ̄ᵀ S_zy,

because 2SLS depends on the data only through ZᵀZ, ZᵀX and Zᵀy (exogenous regressors are their own
instruments, so their columns of Θ̄ are unit vectors). With noiseless moments the result is exactly 2SLS.

The noise-aware floor (:func:`floor_at_noise`)
----------------------------------------------
A released matrix M̂ = M + E (box scale: the rows [1, v] with every v in [−1, 1], E symmetric with i.i.d.
N(0, σ²) entries on and above the diagonal) need not be positive definite, and where M has eigenvalues at or
below the noise (collinear controls, such as experience and its square, or regional indicators) the released
ones are noise, of either sign: solving with them amplifies the noise without limit. Before any solve, the block
of M̂ that every solve inverts — the constant and the instruments (exogenous and excluded) — is therefore replaced
by the nearest symmetric matrix (in Frobenius norm) whose eigenvalues are at least

    f = NOISE_FLOOR·σ = 2√2·σ,

and the other entries (the cross moments and those of X_endog and y) are kept as released.

Why this level: to first order an eigenvalue λ of M with unit eigenvector u is released as λ + uᵀEu, and
Var(uᵀEu) = σ²(2 − Σᵢuᵢ⁴) ≤ 2σ² (E's diagonal entries have variance σ², its off-diagonal pairs enter
twice). An eigenvalue released below 2√2σ, two standard deviations of its own noise, cannot be told from
zero, so the floor bounds the amplification at 1/f exactly where the release cannot resolve the matrix, and
leaves every eigenvalue it can resolve (and so every well-conditioned release) unchanged. The box scale is
where σ is the same for every entry, so one level fits every direction. Why this block: 2SLS inverts only the
instruments' moments (S_zz, and Θ̄ᵀS_zzΘ̄, positive definite when S_zz is); the diagnostics' partialled regressions
invert principal blocks and Schur complements of it, which inherit the floor (Cauchy interlacing; the inverse of
a Schur complement is a block of the inverse). Flooring the whole matrix would also treat a strong first stage
(x nearly collinear with z) as noise and shrink it. The measurements behind both choices are on the method page
of the documentation ("Solving with released moments"). The floor is post-processing of the release and of its
public σ: it costs no privacy. Exact moments (σ = 0) are not changed.

The same rule is applied wherever a release is solved — the whitening of the working scale
(:mod:`dpivreg.estimation.working_scale`), the warm start, noisy moments, the default's choices
(:mod:`dpivreg.estimation.selection`), the first-stage diagnostics, the Anderson–Rubin set and the privacy-noise
simulations, whose plug-in worlds re-release their moments and floor them as the fit did — so that the projection and
every solve agree.

The noisy-moment estimator ("sufficient-statistics perturbation", Dwork, Talwar, Thakurta & Zhang 2014;
Sheffet 2017) spends its whole budget on one release and solves 2SLS on it; its private inference is a
parametric bootstrap over the release's noise (:func:`moment_noise_covariance`) plus the homoskedastic
2SLS sampling variance with σ̂²ᵤ read from the same moments (:func:`residual_variance_from_moments`), so it
needs no other release.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["unresolved_directions", "means_at_bounds",
           "solve_2sls", "residual_variance_from_moments", "moment_draws", "moment_noise_covariance", "floor_spectrum",
           "floor_at_noise", "partialled_regression", "central_covariance", "central_in_units", "central_scale_error",
           "FLOOR",
           "NOISE_FLOOR", "CENTRAL_LEVEL", "IQR_NORMAL", "iqr_scale"]

#: Relative floor of the spectra inverted by :func:`solve_2sls` (of the largest eigenvalue): a guard against
#: rounding only; the noise is handled before any solve (:func:`floor_at_noise`).
FLOOR = 1e-6
#: Released moment matrices have their eigenvalues floored at this multiple of their noise σ (module docstring).
NOISE_FLOOR = 2.0 * math.sqrt(2.0)


def floor_at_noise(M: np.ndarray, sigma: float, block: int) -> np.ndarray:
    """Box-scale moments M (…, D, D) released with noise σ per entry, with the eigenvalues of their leading
    ``block`` × ``block`` block (the constant and the instruments: the block every solve inverts) floored at
    :data:`NOISE_FLOOR`·σ, the nearest such block in Frobenius norm, and every other entry as released (module
    docstring). A new array; the release itself when σ = 0.

    The block is floored as released, uncentred, where the noise is the same σ in every entry and direction. Its
    covariance (the Schur complement on the constant) is not: the means' noise enters it, more for columns whose box
    means are near ±1, and flooring the covariance at one level instead was measured worse on the real
    specifications of ``benchmarks/estimator_comparison.py`` (geometric-mean error 0.51, 0.38 and 0.33 of textbook
    SSP's against 0.47, 0.25 and 0.22 at ρ = 0.5, 2.6 and 10, 30 seeds). The constant's own entry, 1 as released,
    can rise by the floor (by a few hundredths where many columns are unresolved)."""
    M = np.array(M, dtype=float)
    if sigma == 0:
        return M
    Z = M[..., :block, :block]
    M[..., :block, :block] = _floor_eigenvalues((Z + np.swapaxes(Z, -1, -2)) / 2.0, NOISE_FLOOR * sigma)
    return M


def unresolved_directions(M: np.ndarray, sigma: float, columns: Sequence[int]) -> list[np.ndarray]:
    """Unit vectors (over ``columns``, positions in the released box-scale moments M) of the directions of M's block on
    ``columns`` whose eigenvalues lie below :data:`NOISE_FLOOR`·σ, which the release cannot tell from zero: on the
    constant and the instruments (the leading block), exactly what :func:`floor_at_noise` floors. A constant column
    (collinear with the constant), a duplicate column, exactly collinear columns or bounds that every value lies
    beyond give such a direction whatever n; so does a column with too little variation for the budget.
    Post-processing of the release and its public σ; none when σ = 0."""
    if sigma == 0:
        return []
    S = np.asarray(M, dtype=float)[np.ix_(columns, columns)]
    eigenvalues, vectors = np.linalg.eigh((S + S.T) / 2.0)
    return [vectors[:, i] for i in np.flatnonzero(eigenvalues < NOISE_FLOOR * sigma)]


def means_at_bounds(M: np.ndarray, sigma: float) -> np.ndarray:
    """Per column of the released box-scale moments (the constant first, released or known), −1 or +1 where its
    released mean M[0, j] lies within two noise standard deviations of that bound of the box [−1, 1], else 0: every
    value of the column may lie at or beyond that bound (a column the bounds exclude is clipped to a constant
    there). Post-processing of the release; all 0 when σ = 0 (exact moments: the design's checks say it)."""
    means = np.asarray(M, dtype=float)[0, :]
    if sigma == 0:
        return np.zeros_like(means)
    side = np.sign(means) * (np.abs(means) >= 1.0 - 2.0 * sigma)
    side[0] = 0.0  # the constant itself
    return side


def _floor_eigenvalues(S: np.ndarray, floor) -> np.ndarray:
    """Symmetric S (…, k, k) with its eigenvalues raised to at least ``floor`` (a number, or (…, 1))."""
    eigenvalues, vectors = np.linalg.eigh(S)
    eigenvalues = np.maximum(eigenvalues, floor)
    return (vectors * eigenvalues[..., None, :]) @ np.swapaxes(vectors, -1, -2)


def floor_spectrum(S: np.ndarray, floor: float) -> np.ndarray:
    """S (…, k, k) symmetrised, eigenvalues floored at ``floor`` times the largest (and at 1e-300)."""
    S = (S + np.swapaxes(S, -1, -2)) / 2.0
    eigenvalues, vectors = np.linalg.eigh(S)
    top = np.max(np.abs(eigenvalues), axis=-1, keepdims=True)
    eigenvalues = np.maximum(eigenvalues, np.maximum(floor * top, 1e-300))
    return (vectors * eigenvalues[..., None, :]) @ np.swapaxes(vectors, -1, -2)


def partialled_regression(G: np.ndarray, n_exog: int, q: int,
                          columns: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The regression of ``columns`` on the excluded instruments once both are partialled on the exogenous
    regressors W, from Gram matrices G (…, D, D) of [1, Z, …] per row (Z's first ``n_exog`` columns W, index 0
    the constant, not used): S = Z₂ᵀM_W Z₂/n (floored), the coefficients S⁻¹Z₂ᵀM_W C/n and the residuals'
    Gram matrix CᵀM_[W,Z₂]C/n, C the ``columns``."""
    W = list(range(1, 1 + n_exog))
    excluded = list(range(1 + n_exog, 1 + q))
    targets = excluded + list(columns)
    R = G[..., targets, :][..., :, targets]
    if W:
        GWT = G[..., W, :][..., :, targets]
        R = R - np.swapaxes(GWT, -1, -2) @ np.linalg.solve(floor_spectrum(G[..., W, :][..., :, W], FLOOR), GWT)
    m = len(excluded)
    S = floor_spectrum(R[..., :m, :m], FLOOR)
    cross = R[..., :m, m:]
    coefficients = np.linalg.solve(S, cross)
    return S, coefficients, R[..., m:, m:] - np.swapaxes(cross, -1, -2) @ coefficients


#: The simulated estimates' spread is measured over their central range of this probability
#: (:func:`central_covariance`).
CENTRAL_LEVEL = 0.95
_Z_CENTRAL = 1.959963984540054  # the standard normal's 97.5% quantile


def central_covariance(draws: np.ndarray, centre: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Covariance (p, p) of simulated estimates ``draws`` (R, p) whose scales match their central 95% ranges, and
    their median minus ``centre`` (the estimator's simulated shift).

    Each coefficient's scale is (q₉₇.₅ − q₂.₅)/(2·1.96), the standard deviation for normal draws; the correlations
    are those of the draws winsorised at the same quantiles. Simulated estimates are ratios of noisy quantities: in
    the few plug-in worlds where the release cannot resolve the first stage they land orders of magnitude away,
    and would dominate a variance (and a mean) while leaving the 95% range, which the intervals are for, almost
    unchanged. Non-finite draws count as infinitely far (a scale is then infinite only if more than 2.5% are).
    """
    draws = np.where(np.isnan(draws), np.inf, draws)
    tail = (1.0 - CENTRAL_LEVEL) / 2.0
    with np.errstate(invalid="ignore"):
        lo, median, hi = np.quantile(draws, [tail, 0.5, 1.0 - tail], axis=0)
        scales = (hi - lo) / (2.0 * _Z_CENTRAL)
    # quantiles interpolated between infinite draws are NaN: the scale (or the median) is then infinite
    scales = np.where(np.isnan(scales), np.inf, scales)
    median = np.where(np.isnan(median), np.inf, median)
    p = draws.shape[1]
    kept = np.clip(draws, lo, hi)
    with np.errstate(invalid="ignore", divide="ignore"):
        deviation = kept - kept.mean(axis=0)
        norms = np.sqrt(np.sum(deviation * deviation, axis=0))
        correlation = (deviation.T @ deviation) / np.outer(norms, norms)
    correlation = np.where(np.isfinite(correlation), correlation, 0.0)
    np.fill_diagonal(correlation, 1.0)
    with np.errstate(invalid="ignore", over="ignore"):
        cov = correlation * np.outer(scales, scales)
    return cov.reshape(p, p), median - centre


#: The interquartile range of the standard normal: IQR/1.349 is the standard deviation of normal draws.
IQR_NORMAL = 2.0 * 0.6744897501960817


def iqr_scale(draws: np.ndarray, axis: int = 0) -> np.ndarray:
    """The robust scale IQR/1.349 of ``draws`` along ``axis``: their standard deviation when normal, and untouched by a
    few draws far away (simulated re-releases whose first stage the noise nearly destroys)."""
    q25, q75 = np.quantile(draws, [0.25, 0.75], axis=axis)
    return (q75 - q25) / IQR_NORMAL


def central_scale_error(draws: np.ndarray) -> np.ndarray:
    """Monte Carlo standard error (p,) of :func:`central_covariance`'s scales from R draws (R, p): the asymptotic
    (co)variances of the two quantiles, t(1 − t)/(R·f²) each and t²/(R·f_lo·f_hi) between them (t = 2.5%), with the
    density f at each quantile from the quantiles 1.25 percentage points either side of it."""
    R = draws.shape[0]
    tail, step = (1.0 - CENTRAL_LEVEL) / 2.0, 0.0125
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.quantile(draws, [tail - step, tail + step, 1.0 - tail - step, 1.0 - tail + step], axis=0)
        inverse_lo, inverse_hi = (q[1] - q[0]) / (2.0 * step), (q[3] - q[2]) / (2.0 * step)  # 1/f at each quantile
        variance = (tail * (1.0 - tail) * (inverse_lo**2 + inverse_hi**2) - 2.0 * tail**2 * inverse_lo * inverse_hi) / R
    return np.sqrt(variance) / (2.0 * _Z_CENTRAL)


def solve_2sls(S: np.ndarray, q: int, n_exog: int, p_endog: int, *,
               floor: float = FLOOR) -> tuple[np.ndarray, np.ndarray]:
    """2SLS (Θ, β) from second moments S (…, q + p_endog + 1, same) of the columns [Z, X_endog, y].

    Returns Θ (…, q, p_endog), the endogenous block of the first stage, and β (…, n_exog + p_endog).
    """
    Szz = floor_spectrum(S[..., :q, :q], floor)
    Szx = S[..., :q, q:q + p_endog]
    Szy = S[..., :q, q + p_endog]
    theta = np.linalg.solve(Szz, Szx)
    exog = np.broadcast_to(np.eye(q, n_exog), theta.shape[:-1] + (n_exog,))
    theta_full = np.concatenate([exog, theta], axis=-1)
    H = floor_spectrum(np.swapaxes(theta_full, -1, -2) @ Szz @ theta_full, floor)
    g = np.einsum("...ji,...j->...i", theta_full, Szy)
    return theta, np.linalg.solve(H, g[..., None])[..., 0]


def residual_variance_from_moments(S: np.ndarray, q: int, n_exog: int, beta: np.ndarray) -> float:
    """E[(y − xᵀβ)²] from the second moments of [Z, X_endog, y], with x = [Z_exog, X_endog]; floored at 0."""
    index = list(range(n_exog)) + list(range(q, S.shape[-1] - 1))
    x_y = S[np.ix_(index, [S.shape[-1] - 1])][:, 0]
    S_xx = S[np.ix_(index, index)]
    value = S[-1, -1] - 2.0 * beta @ x_y + beta @ S_xx @ beta
    return float(max(value, 0.0))


def moment_draws(truth: np.ndarray, noise: np.ndarray, solvable, q: int, n_exog: int,
                 p_endog: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The plug-in world's solution and draws of the noisy-moment 2SLS estimate (working scale): ``truth`` (the
    release floored at its noise, box scale) is the world's moment matrix, each draw re-releases it with a fresh
    draw of the noise (``noise``, (R, D, D), on the box scale) and solves as the fit did (``solvable`` floors a
    box-scale release at its noise and maps it to the working scale). Returns (β_plugin (p,), Θ draws
    (R, q, p_endog), β draws (R, p))."""
    _, beta_plugin = solve_2sls(solvable(truth), q, n_exog, p_endog)
    theta, beta = solve_2sls(solvable(truth + noise), q, n_exog, p_endog)
    return beta_plugin, theta, beta


def moment_noise_covariance(truth: np.ndarray, noise: np.ndarray, solvable, q: int, n_exog: int, p_endog: int,
                            jacobian: np.ndarray | None = None
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Covariance and median shift of the noisy-moment 2SLS estimate on the working scale, by simulation.

    The plug-in world's moments are the released ones floored at their noise (``truth``); each replication
    releases them again with a fresh draw of the release's noise (``noise``, (R, D, D), on the box scale), floors
    the re-release and solves 2SLS on the working scale (``solvable``, as :func:`moment_draws`). Returns the
    covariance of the simulated β (p, p) and their median minus the plug-in solution (the estimator's simulated
    bias), both measured in the units ``jacobian`` maps to (:func:`central_in_units`; the working scale without it),
    the simulated first stages (R, q, p_endog) and the simulated β (R, p) on the working scale.
    """
    beta_plugin, theta, beta = moment_draws(truth, noise, solvable, q, n_exog, p_endog)
    cov, shift = central_in_units(beta, beta_plugin, jacobian)
    return cov, shift, theta, beta


def central_in_units(draws: np.ndarray, centre: np.ndarray,
                     jacobian: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`central_covariance` of working-scale draws (R, p) measured in the units that ``jacobian`` J maps them to
    (the reported ones), returned on the working scale: J⁻¹ C J⁻ᵀ and J⁻¹ shift. Quantile ranges do not carry over
    through a J that mixes coefficients (the intercept and the whitened exogenous ones), so they are taken where the
    standard errors are reported."""
    if jacobian is None:
        return central_covariance(draws, centre)
    with np.errstate(invalid="ignore", over="ignore"):
        cov, shift = central_covariance(draws @ jacobian.T, centre @ jacobian.T)
    inverse = np.linalg.inv(jacobian)
    with np.errstate(invalid="ignore", over="ignore"):
        return inverse @ cov @ inverse.T, inverse @ shift
