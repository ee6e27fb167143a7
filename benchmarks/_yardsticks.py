"""The private IV estimators a user could write without dpivreg, as the real-data benchmark's yardsticks.

Not part of dpivreg: each is written here from its textbook description, on the same public bounds and at the
same total zCDP budget ρ as the fits it is compared with. Each returns the endogenous coefficients in the original
units. Neighbouring data sets replace one row; every release is a Gaussian mechanism, Δ²/(2σ²)-zCDP for L2
sensitivity Δ and noise σ (Bun & Steinke 2016), and zCDP budgets add up.

``ssp``
    Textbook sufficient-statistics perturbation (Dwork, Talwar, Thakurta & Zhang 2014; Sheffet 2017): every column
    mapped into [−1, 1] by its bounds, one Gaussian release of the second moments of the rows [1, v] with the box
    sensitivity D/n (the tightest, dpivreg's own, so the yardstick is not handicapped), eigenvalues floored at the
    release's σ, 2SLS on the result. The whole budget goes to the one release.
``adassp``
    AdaSSP (Wang 2018, "Revisiting differentially private linear regression"), for 2SLS: a third of the budget
    releases the smallest eigenvalue of the instruments' second moments (sensitivity D_z/n: replacing a row moves
    it by at most max ‖z‖² / n), two thirds the moment matrix as ``ssp``; the instruments' block gets the ridge
    λ = max(0, η − λ̂_lb), η = σ_M(2√D + 3) the high-probability size of the release's noise and λ̂_lb the released
    eigenvalue less three of its noise standard deviations (Wang's adaptive choice: as much ridge as the noise
    needs, less where the data's own smallest eigenvalue is large).
``subsample``
    Subsample and aggregate (Nissim, Raskhodnikova & Smith 2007; Smith 2011): the rows split into k = ⌈√n⌉
    disjoint blocks at random (a public permutation), 2SLS on each block, each block's endogenous coefficient
    clipped to [−R, R] and their mean released with Gaussian noise of L2 sensitivity 2‖R‖/k (one row is in one
    block). R = (half-range of y)/(half-range of x) from the public bounds, per endogenous regressor: the coefficient
    that moves y across half its range when x moves across half its range.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["box_rows", "ssp", "adassp", "subsample", "YARDSTICKS"]


def box_rows(model, bounds: dict) -> tuple[np.ndarray, dict]:
    """The rows [1, v] (n, D) of the design mapped into [−1, 1] by ``bounds`` (clipped), in the order
    [exog, instruments, endog, dependent] (the constant first), and the layout: k (constant and exogenous), q (k plus
    the instruments), the endogenous count and the half-ranges of the endogenous columns and of y."""
    d = model.design
    exog = [c for c in d.exog_names if c != d.constant_name]
    columns = exog + list(d.instrument_names) + list(d.endog_names) + [d.dependent_name]
    frame = pd.concat([d.exog, d.instruments, d.endog, d.dependent], axis=1)
    lo = np.array([bounds[c][0] for c in columns])
    hi = np.array([bounds[c][1] for c in columns])
    V = np.clip((frame[columns].to_numpy(dtype=float) - (lo + hi) / 2.0) / ((hi - lo) / 2.0), -1.0, 1.0)
    rows = np.column_stack([np.ones(len(V)), V])
    k = 1 + len(exog)
    q = k + len(d.instrument_names)
    p_endog = len(d.endog_names)
    half = (hi - lo) / 2.0
    return rows, dict(k=k, q=q, p_endog=p_endog, x_half=half[q - 1:q - 1 + p_endog], y_half=half[-1])


def _release(rows: np.ndarray, rho: float, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """[1, v]ᵀ[1, v]/n with symmetric Gaussian noise at sensitivity D/n and budget ρ; returns (M, σ)."""
    n, D = rows.shape
    sigma = (D / n) / math.sqrt(2.0 * rho)
    upper = np.triu(rng.standard_normal((D, D)) * sigma)
    return rows.T @ rows / n + upper + np.triu(upper, 1).T, sigma


def _two_sls(M: np.ndarray, layout: dict, ridge: float = 0.0) -> np.ndarray:
    """2SLS from box moments M of [Z, X_endog, y] (Z = [1, exog, instruments]), the instruments' block ridged by
    ``ridge`` (its constant excepted); the endogenous coefficients in original units."""
    k, q, p_endog = layout["k"], layout["q"], layout["p_endog"]
    Szz = M[:q, :q] + ridge * np.diag(np.r_[0.0, np.ones(q - 1)])
    Szx = np.concatenate([M[:q, :k], M[:q, q:q + p_endog]], axis=1)
    first = np.linalg.solve(Szz, Szx)
    beta = np.linalg.solve(Szx.T @ first, first.T @ M[:q, q + p_endog])
    return beta[k:] * layout["y_half"] / layout["x_half"]


def ssp(model, bounds: dict, rho: float, seed: int) -> np.ndarray:
    """Textbook sufficient-statistics perturbation (module docstring)."""
    rows, layout = box_rows(model, bounds)
    M, sigma = _release(rows, rho, np.random.default_rng(seed))
    values, vectors = np.linalg.eigh(M)
    return _two_sls((vectors * np.maximum(values, sigma)) @ vectors.T, layout)


def adassp(model, bounds: dict, rho: float, seed: int) -> np.ndarray:
    """AdaSSP for 2SLS (module docstring)."""
    rows, layout = box_rows(model, bounds)
    rng = np.random.default_rng(seed)
    n, D = rows.shape
    q = layout["q"]
    Z = rows[:, :q]
    sigma_min = (q / n) / math.sqrt(2.0 * rho / 3.0)  # max ‖z‖² = q for rows in the box
    released_min = float(np.linalg.eigvalsh(Z.T @ Z / n)[0]) + sigma_min * float(rng.standard_normal())
    lower = max(released_min - 3.0 * sigma_min, 0.0)
    M, sigma = _release(rows, 2.0 * rho / 3.0, rng)
    ridge = max(0.0, sigma * (2.0 * math.sqrt(D) + 3.0) - lower)
    values, vectors = np.linalg.eigh(M)
    return _two_sls((vectors * np.maximum(values, 0.0)) @ vectors.T, layout, ridge)


def subsample(model, bounds: dict, rho: float, seed: int) -> np.ndarray:
    """Subsample and aggregate 2SLS (module docstring)."""
    rows, layout = box_rows(model, bounds)
    rng = np.random.default_rng(seed)
    n = rows.shape[0]
    blocks = math.ceil(math.sqrt(n))
    order = rng.permutation(n)
    R = layout["y_half"] / layout["x_half"]
    estimates = []
    for part in np.array_split(order, blocks):
        block = rows[part]
        try:
            estimates.append(_two_sls(block.T @ block / len(part), layout))
        except np.linalg.LinAlgError:  # a block whose instruments are singular: its estimate is the range's centre
            estimates.append(np.zeros(layout["p_endog"]))
    clipped = np.clip(np.nan_to_num(np.array(estimates)), -R, R)
    sigma = (2.0 * float(np.linalg.norm(R)) / blocks) / math.sqrt(2.0 * rho)
    return clipped.mean(axis=0) + sigma * rng.standard_normal(layout["p_endog"])


YARDSTICKS = {"ssp": ssp, "adassp": adassp, "subsample": subsample}
