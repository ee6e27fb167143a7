"""The straightforward numpy formulation of DP-2S-GD, kept as the reference for the fast engine.

This is the Algorithm's loop written as plainly as possible (it was dpivreg's engine before the
fused kernels, issue 9): explicit fitted values, residuals and x̂ (or x̃ = x̂·P_t^(−1/2)) per
iteration, clipping through row norms. The fast engine (numba or numpy kernels, threads, Dask)
must release the same path for the same seed to 1e-12 (summation order aside).
"""

from __future__ import annotations

import numpy as np

from dpivreg.engine import _inverse_sqrt_preconditioner


def _row_norms(A):
    return np.sqrt(np.einsum("ij,ij->i", A, A))


def _clipped_mean_outer(A, B, clip):
    if clip is None:
        return A.T @ B / A.shape[0]
    with np.errstate(divide="ignore"):
        factors = np.minimum(1.0, clip / (_row_norms(A) * _row_norms(B)))
    return A.T @ (B * factors[:, None]) / A.shape[0]


def reference_path(Z, X, Y, *, T, eta, alpha, clip1, clip2, lambda1, lambda2, seed, n_exog=0,
                   method="gd", ridge=None):
    """(theta path, beta path) of the plain iteration with the engine's noise stream."""
    rng = np.random.default_rng(seed)
    n, q = Z.shape
    p = X.shape[1]
    pe = p - n_exog
    theta = np.zeros((T + 1, q, pe))
    beta = np.zeros((T + 1, p))
    x_hat = np.empty((n, p))
    x_hat[:, :n_exog] = Z[:, :n_exog]
    for t in range(T):
        xi = rng.standard_normal((q, pe)) * lambda1
        nu = rng.standard_normal(p) * lambda2
        fitted = Z @ theta[t]
        grad1 = _clipped_mean_outer(Z, fitted - X[:, n_exog:], clip1)
        theta[t + 1] = theta[t] - eta * (grad1 - xi)
        x_hat[:, n_exog:] = fitted
        residual = x_hat @ beta[t] - Y
        if method == "gd":
            grad2 = _clipped_mean_outer(x_hat, residual[:, None], clip2)[:, 0]
            beta[t + 1] = beta[t] - alpha * (grad2 - nu)
        else:
            root = _inverse_sqrt_preconditioner(theta[t], np.eye(q), n_exog, ridge)
            grad2 = _clipped_mean_outer(x_hat @ root, residual[:, None], clip2)[:, 0]
            beta[t + 1] = beta[t] - alpha * (root @ (grad2 - nu))
    return theta, beta
