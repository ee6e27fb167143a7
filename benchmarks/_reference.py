"""The non-private 2SLS reference the benchmarks measure private estimates against (not part of dpivreg).

A fast closed form instead of ``res.benchmark`` (linearmodels' IV2SLS), which would dominate the run time of
thousands of fits; the values are linearmodels' (2SLS and its robust, HC0, standard errors).
"""

from __future__ import annotations

import numpy as np

from dpivreg import DPIV2SLS


def two_sls(model: DPIV2SLS) -> tuple[np.ndarray, np.ndarray]:
    """2SLS and its robust (HC0) standard errors, by least squares on QR factors (linearmodels' values)."""
    d = model.design
    Z = np.column_stack([d.exog.to_numpy(), d.instruments.to_numpy()])
    X = np.column_stack([d.exog.to_numpy(), d.endog.to_numpy()])
    y = d.dependent.to_numpy()[:, 0]
    Q, _ = np.linalg.qr(Z)
    X_hat = Q @ (Q.T @ X)
    beta = np.linalg.lstsq(X_hat, y, rcond=None)[0]
    e = y - X @ beta
    bread = np.linalg.inv(X_hat.T @ X_hat)
    meat = (X_hat * e[:, None] ** 2).T @ X_hat
    return beta, np.sqrt(np.diag(bread @ meat @ bread))
