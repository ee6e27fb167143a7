"""2SLS from second moments: the warm start of DP-2S-GD and the noisy-moment estimator (``method="moments"``).

Everything here is post-processing of a moment release (:class:`dpivreg.preprocess.ReleasedMoments`): the
second moments of the working columns [Z̃, X̃_endog, Ỹ] determine the 2SLS solution

    Θ = S_zz⁻¹ S_zx,   Θ̄ = [I_exog | Θ],   β = (Θ̄ᵀ S_zz Θ̄)⁻¹ Θ̄ᵀ S_zy,

because 2SLS depends on the data only through ZᵀZ, ZᵀX and Zᵀy (exogenous regressors are their own
instruments, so their columns of Θ̄ are unit vectors). A released (noisy) matrix need not be positive
definite: the two matrices that are inverted have their spectra floored (:func:`solve_2sls`), which
changes nothing when they are well conditioned. With noiseless moments the result is exactly 2SLS.

The noisy-moment estimator ("sufficient-statistics perturbation", Dwork, Talwar, Thakurta & Zhang 2014;
Sheffet 2017) spends its whole budget on one release and solves 2SLS on it; its private inference is a
parametric bootstrap over the release's noise (:func:`moment_noise_covariance`) plus the homoskedastic
2SLS sampling variance with σ̂²ᵤ read from the same moments (:func:`residual_variance_from_moments`), so it
needs no other release.
"""

from __future__ import annotations

import numpy as np

__all__ = ["solve_2sls", "residual_variance_from_moments", "moment_draws", "moment_noise_covariance", "floor_spectrum",
           "partialled_regression", "FLOOR"]

#: Relative floor of the spectra inverted by :func:`solve_2sls` (of the largest eigenvalue).
FLOOR = 1e-6


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


def moment_draws(released: np.ndarray, noise: np.ndarray, to_working, q: int, n_exog: int,
                 p_endog: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The plug-in world's solution and draws of the noisy-moment 2SLS estimate (working scale): the released
    moments are the world's truth, each draw re-releases them with a fresh draw of the noise (``noise``,
    (R, D, D), on the release's scale). Returns (β_plugin (p,), Θ draws (R, q, p_endog), β draws (R, p))."""
    _, beta_plugin = solve_2sls(to_working(released), q, n_exog, p_endog)
    theta, beta = solve_2sls(to_working(released + noise), q, n_exog, p_endog)
    return beta_plugin, theta, beta


def moment_noise_covariance(released: np.ndarray, noise: np.ndarray, to_working, q: int, n_exog: int,
                            p_endog: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Covariance and mean shift of the noisy-moment 2SLS estimate on the working scale, by simulation.

    The plug-in world's moments are the released ones; each replication releases them again with a fresh
    draw of the release's noise (``noise``, (R, D, D), on the release's scale) and solves 2SLS on the
    working scale (``to_working`` maps release-scale moments to it). Returns the covariance of the simulated
    β (p, p), their mean minus the plug-in solution (the estimator's simulated bias) and the simulated first
    stages (R, q, p_endog).
    """
    beta_plugin, theta, beta = moment_draws(released, noise, to_working, q, n_exog, p_endog)
    p = beta.shape[-1]
    return np.cov(beta, rowvar=False, ddof=1).reshape(p, p), beta.mean(axis=0) - beta_plugin, theta
