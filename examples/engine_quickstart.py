"""A small private fit with the pure-numpy engine on the paper's synthetic design (section 5.1).

    python examples/engine_quickstart.py
"""

import numpy as np

from dpivreg import dp_2s_gd

rng = np.random.default_rng(0)
n, p, q = 20_000, 2, 3
beta = rng.standard_normal(p)
theta = 5.0 * np.eye(q, p) + rng.standard_normal((q, p))
Phi, phi = rng.standard_normal((p, p)), rng.standard_normal(p)
Z, U = rng.standard_normal((n, q)), rng.standard_normal((n, p))
X = Z @ theta + U @ Phi + rng.standard_normal((n, p))
Y = X @ beta + U @ phi + rng.standard_normal(n)

# NON-PRIVATE benchmark: closed-form 2SLS (never publish it next to a private release)
theta_hat = np.linalg.solve(Z.T @ Z, Z.T @ X)
x_hat = Z @ theta_hat
beta_2sls = np.linalg.solve(x_hat.T @ x_hat, x_hat.T @ Y)

# Public settings: Z is isotropic by design, so eta = 1; alpha from public knowledge of the design
# (first-stage coefficients of order 5, so eigenvalues of order 25); clipping from the Theorem's
# gamma = (sqrt(q) + sqrt(tau + log(n T)))^2 with tau = 5.
T = 20
clip = (np.sqrt(q) + np.sqrt(5 + np.log(n * T))) ** 2
path = dp_2s_gd(Z, X, Y, T=T, rho1=1.0, rho2=1.0, eta=1.0, alpha=1 / 40, clip1=clip, clip2=clip, seed=1)

print("true beta          ", np.round(beta, 4))
print("2SLS (non-private) ", np.round(beta_2sls, 4))
print("DP-2S-GD beta^(T)  ", np.round(path.beta_final, 4))
print(path.privacy)
