"""Test helpers: the paper's synthetic design as arrays and closed-form 2SLS."""

import numpy as np

from dpivreg.datasets import simulate_iv


def simulate_iv_arrays(n, p, q, *, seed, r=None):
    """The paper's synthetic design (:func:`dpivreg.datasets.simulate_iv`) as arrays Z, X, Y, β, Θ."""
    sim = simulate_iv(n, p, q, r, seed=seed)
    data = sim.data
    X = data[[f"x{j + 1}" for j in range(p)]].to_numpy()
    Z = data[[f"z{j + 1}" for j in range(q)]].to_numpy()
    return Z, X, data["y"].to_numpy(), sim.beta, sim.theta


def two_sls(Z, X, Y):
    """Closed-form 2SLS (the paper's Definition 2SLS)."""
    theta_hat = np.linalg.solve(Z.T @ Z, Z.T @ X)
    x_hat = Z @ theta_hat
    return np.linalg.solve(x_hat.T @ x_hat, x_hat.T @ Y), theta_hat
