"""Test helpers: the paper's synthetic design as arrays and closed-form 2SLS."""

import numpy as np


def simulate_iv_arrays(n, p, q, *, seed, r=None):
    """The synthetic IV design of the paper's section 5.1 (z, u, noise standard normal;
    β ~ N(0, I), Θ = 5·I + E, Φ, φ standard normal). Returns Z, X, Y, β, Θ."""
    rng = np.random.default_rng(seed)
    r = p if r is None else r
    beta = rng.standard_normal(p)
    theta = 5.0 * np.eye(q, p) + rng.standard_normal((q, p))
    Phi = rng.standard_normal((r, p))
    phi = rng.standard_normal(r)
    Z = rng.standard_normal((n, q))
    U = rng.standard_normal((n, r))
    X = Z @ theta + U @ Phi + rng.standard_normal((n, p))
    Y = X @ beta + U @ phi + rng.standard_normal(n)
    return Z, X, Y, beta, theta


def two_sls(Z, X, Y):
    """Closed-form 2SLS (the paper's Definition 2SLS)."""
    theta_hat = np.linalg.solve(Z.T @ Z, Z.T @ X)
    x_hat = Z @ theta_hat
    return np.linalg.solve(x_hat.T @ x_hat, x_hat.T @ Y), theta_hat
