"""The straightforward numpy formulation of DP-2S-GD, kept as the reference for the fast engine.

This is the Algorithm's loop written as plainly as possible (it was dpivreg's engine before the
fused kernels, issue 9): explicit fitted values, residuals and x̂ (or x̃ = x̂·P_t^(−1/2)) per
iteration, clipping through row norms. The fast engine (numba or numpy kernels, threads, Dask)
must release the same path for the same seed to 1e-12 (summation order aside).
"""

from __future__ import annotations

import numpy as np

from dpivreg.estimation.engine import _inverse_sqrt_preconditioner


def _row_norms(A):
    return np.sqrt(np.einsum("ij,ij->i", A, A))


def _clipped_mean_outer(A, B, clip):
    if clip is None:
        return A.T @ B / A.shape[0]
    with np.errstate(divide="ignore"):
        factors = np.minimum(1.0, clip / (_row_norms(A) * _row_norms(B)))
    return A.T @ (B * factors[:, None]) / A.shape[0]


def _grouped_mean_outer(A, B, clips, split):
    """Rows [:split] and [split:] of (1/n) Σ CLIP(aᵢbᵢᵀ), each group clipped with its own norm."""
    if split is None:
        return _clipped_mean_outer(A, B, clips)
    return np.vstack([_clipped_mean_outer(A[:, :split], B, clips[0]), _clipped_mean_outer(A[:, split:], B, clips[1])])


def _cholesky_root(theta_endog, n_exog, ridge):
    """W = L⁻¹ with Θ̄ᵀΘ̄ + ridge·I = LLᵀ."""
    q = theta_endog.shape[0]
    theta_full = np.concatenate([np.eye(q, n_exog), theta_endog], axis=1)
    P = theta_full.T @ theta_full + ridge * np.eye(theta_full.shape[1])
    return np.linalg.inv(np.linalg.cholesky(P))


def reference_path(Z, X, Y, *, T, eta, alpha, clip1, clip2, lambda1, lambda2, seed, n_exog=0,
                   method="gd", ridge=None, theta0=None, beta0=None, schedule=None, split=None):
    """(theta path, beta path) of the plain iteration with the engine's noise stream.

    ``lambda1``, ``lambda2``: a noise std, or a (T, 2) array of per-step [exogenous group, rest] stds;
    ``schedule``: (2, T) shares, a zero share meaning no update; ``split``: group clipping at n_exog with
    (exogenous, rest) clip pairs and the Cholesky root.
    """
    rng = np.random.default_rng(seed)
    n, q = Z.shape
    p = X.shape[1]
    pe = p - n_exog
    theta = np.zeros((T + 1, q, pe))
    beta = np.zeros((T + 1, p))
    if theta0 is not None:
        theta[0], beta[0] = theta0, beta0
    active = np.ones((2, T)) if schedule is None else np.asarray(schedule)
    noise1 = np.broadcast_to(lambda1, (T, 2)) if np.ndim(lambda1) == 0 else np.asarray(lambda1)
    noise2 = np.broadcast_to(lambda2, (T, 2)) if np.ndim(lambda2) == 0 else np.asarray(lambda2)
    lead = n_exog if split is not None else 0
    x_hat = np.empty((n, p))
    x_hat[:, :n_exog] = Z[:, :n_exog]
    for t in range(T):
        xi = rng.standard_normal((q, pe)) * np.r_[np.full(lead, noise1[t, 0]), np.full(q - lead, noise1[t, 1])][:, None]
        nu = rng.standard_normal(p) * np.r_[np.full(lead, noise2[t, 0]), np.full(p - lead, noise2[t, 1])]
        fitted = Z @ theta[t]
        grad1 = _grouped_mean_outer(Z, fitted - X[:, n_exog:], clip1, split)
        theta[t + 1] = theta[t] - eta * (grad1 - xi) if active[0, t] > 0 else theta[t]
        x_hat[:, n_exog:] = fitted
        residual = x_hat @ beta[t] - Y
        if method == "gd":
            grad2 = _grouped_mean_outer(x_hat, residual[:, None], clip2, split)[:, 0]
            step = grad2 - nu
        elif split is not None:
            W = _cholesky_root(theta[t], n_exog, ridge)
            grad2 = _grouped_mean_outer(x_hat @ W.T, residual[:, None], clip2, split)[:, 0]
            step = W.T @ (grad2 - nu)
        else:
            root = _inverse_sqrt_preconditioner(theta[t], np.eye(q), n_exog, ridge)
            grad2 = _clipped_mean_outer(x_hat @ root, residual[:, None], clip2)[:, 0]
            step = root @ (grad2 - nu)
        beta[t + 1] = beta[t] - alpha * step if active[1, t] > 0 else beta[t]
    return theta, beta
