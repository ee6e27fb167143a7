"""The compiled steps of the private inference's noise simulation.

:func:`dpivreg.estimation.simulation.simulate_fit` replays DP-2S-GD on simulated noise many times; there are no rows
there, only the moment-form iteration of every simulated path with q×p matrices. :func:`numba_simulation_steps`
compiles that loop (numba), fused over the paths of a chunk.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

__all__ = ["numba_simulation_steps"]


# ---------------------------------------------------------------- the privacy-noise simulation's steps (moment form)
def _fused_simulation_steps(theta, beta, S, g_x, g_y, xi, nu, active, eta, alpha, ridge, n_exog,
                            root):  # pragma: no cover - compiled by numba
    """Steps of :func:`dpivreg.estimation.simulation.simulate_fit` for every path, one path at a time, in place.

    Per path r and step c, with Θ̄ = [I_k | Θ_r]: the second-stage gradient g = Θ̄ᵀ(S_r Θ̄ β_r − g_y,r). The step
    is g − ν without a preconditioner (``root`` 0), else Wᵀ(W g − ν) for the root W of the engine's
    preconditioner P = Θ̄ᵀΘ̄ + ridge·I of the released first stage (S = I): ``root`` 1, W = L⁻¹ with P = LLᵀ
    (by forward and back substitution, not an explicit inverse); ``root`` 2, W = P^(−1/2) from P's
    eigendecomposition with the eigenvalues floored at the ridge
    (:func:`dpivreg.estimation.engine.preconditioner_root`). Then β_r −= α·step where ``active[c, 1]`` and Θ_r −=
    η((S_r Θ_r − g_x,r) − ξ) where ``active[c, 0]``. A path whose P is not finite (a diverged world) takes a NaN step,
    as the numpy steps do. Returns False, leaving the arrays part-updated, when a Cholesky pivot of a finite P is not
    positive (rounding of a very wide spectrum): the caller redoes the steps with numpy from its copies.
    """
    R, q, p_endog = theta.shape
    p = beta.shape[1]
    k = n_exog
    full = np.empty((q, p))
    v = np.empty(q)
    w = np.empty(q)
    grad = np.empty(p)
    L = np.empty((p, p))
    step = np.empty(p)
    rotated = np.empty(p)
    moved = np.empty((q, p_endog))
    for r in range(R):
        for c in range(xi.shape[0]):
            for j in range(q):
                for i in range(k):
                    full[j, i] = 1.0 if i == j else 0.0
                for i in range(p_endog):
                    full[j, k + i] = theta[r, j, i]
            for j in range(q):
                acc = 0.0
                for i in range(p):
                    acc += full[j, i] * beta[r, i]
                v[j] = acc
            for j in range(q):
                acc = 0.0
                for m in range(q):
                    acc += S[r, j, m] * v[m]
                w[j] = acc - g_y[r, j]
            for i in range(p):
                acc = 0.0
                for j in range(q):
                    acc += full[j, i] * w[j]
                grad[i] = acc
            finite = True
            if root > 0:
                for a in range(p):
                    for b in range(a + 1):
                        acc = 0.0
                        for j in range(q):
                            acc += full[j, a] * full[j, b]
                        L[a, b] = acc + (ridge if a == b else 0.0)
                        L[b, a] = L[a, b]
                        if not math.isfinite(L[a, b]):
                            finite = False
            if root == 0:
                for i in range(p):
                    step[i] = grad[i] - nu[c, r, i]
            elif not finite:
                for i in range(p):
                    step[i] = math.nan
            elif root == 1:
                for a in range(p):  # Cholesky, in place on the lower triangle
                    for b in range(a + 1):
                        acc = L[a, b]
                        for m in range(b):
                            acc -= L[a, m] * L[b, m]
                        if a == b:
                            if not acc > 0.0:
                                return False
                            L[a, a] = math.sqrt(acc)
                        else:
                            L[a, b] = acc / L[b, b]
                for a in range(p):  # step = L⁻ᵀ(L⁻¹g − ν)
                    acc = grad[a]
                    for m in range(a):
                        acc -= L[a, m] * step[m]
                    step[a] = acc / L[a, a]
                for a in range(p):
                    step[a] -= nu[c, r, a]
                for a in range(p - 1, -1, -1):
                    acc = step[a]
                    for m in range(a + 1, p):
                        acc -= L[m, a] * step[m]
                    step[a] = acc / L[a, a]
            else:
                values, vectors = np.linalg.eigh(L)
                for a in range(p):
                    values[a] = 1.0 / math.sqrt(max(values[a], ridge))
                for i in range(p):
                    step[i] = grad[i]
                for half in range(2):  # step = W(Wg − ν), W = V diag(values) Vᵀ; ν subtracted after the first
                    for a in range(p):
                        acc = 0.0
                        for i in range(p):
                            acc += vectors[i, a] * step[i]
                        rotated[a] = acc * values[a]
                    for i in range(p):
                        acc = 0.0
                        for a in range(p):
                            acc += vectors[i, a] * rotated[a]
                        step[i] = acc
                    if half == 0:
                        for i in range(p):
                            step[i] -= nu[c, r, i]
            if active[c, 1]:
                for i in range(p):
                    beta[r, i] -= alpha * step[i]
            if active[c, 0]:
                for j in range(q):
                    for i in range(p_endog):
                        acc = 0.0
                        for m in range(q):
                            acc += S[r, j, m] * theta[r, m, i]
                        moved[j, i] = (acc - g_x[r, j, i]) - xi[c, r, j, i]
                for j in range(q):
                    for i in range(p_endog):
                        theta[r, j, i] -= eta * moved[j, i]
    return True


@lru_cache(maxsize=1)
def numba_simulation_steps():
    """:func:`_fused_simulation_steps` compiled on first use (cached on disk); no fastmath, so that NaN and
    infinite draws of a diverged world propagate as in numpy."""
    import numba

    return numba.njit(nogil=True, cache=True)(_fused_simulation_steps)
