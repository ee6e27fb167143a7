"""Where one DP-2S-GD iteration's time goes when the pass is bound by arithmetic (p = q = 50, numpy kernel).

Issue 15, item 6 asks for an iteration at p = q = 50 within 1.5 times the arithmetic floor: its multiply-adds per
row (``engine_speed.multiply_adds_per_row``, 7,750 at p = q = 50) at the rate of a large dgemm. This script times,
on one thread (BLAS held to one thread, as each of the engine's threads runs it), over n rows in the blocks the
kernel uses (``dpivreg.compute.kernels``: sub-blocks of ``2**19 // (q + 2p + 1)`` rows):

* ``iteration``   ``kernels.block_sums(..., "numpy")``: one iteration's pass, everything included;
* ``U = Z M``     the first product, Z's rows times M = [Θ | Θ̄R | Θ̄β] (q·(2p+1) multiply-adds a row);
* ``Zᵀ W``        the first stage's sum of clipped gradients, Σ zᵢ (fᵢ rᵢ)ᵀ (q·p a row), also as ``(Wᵀ Z)ᵀ``;
* ``rest``        iteration − the two products: the residuals, three squared norms, the clip factors, the
                  scaling and the second stage's sum (a matrix-vector product), and reading X and Y from memory;
* ``read X, Y``   ``X.sum()`` and ``Y.sum()``: the least the rest can take, since the first product reads Z but
                  not X (the residuals rᵢ = Θᵀzᵢ − xᵢ) or Y;
* ``U = Z M (numba)`` the first product as a compiled loop over four rows at a time (numba, if installed): what a
                  kernel fusing the rest into the product, written in numba, would start from;

each as seconds and as a multiple of the arithmetic floor of the whole iteration. The two products and the
reading of X and Y are the least a kernel built from BLAS calls can take; the target leaves the rest
1.5 − (the products' multiple).

    python benchmarks/engine_breakdown.py              # n = 10⁶, p = q = 50
    python benchmarks/engine_breakdown.py --n 2e5      # quicker
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from bandwidth import dgemm_rate  # benchmarks/bandwidth.py, beside this script
from engine_speed import multiply_adds_per_row
from threadpoolctl import threadpool_limits


def numba_first_product():
    """U = Z M a tile of four rows at a time, each tile's U kept in a small buffer (not stored): the product as a
    fused kernel written in numba would form it. None without numba."""
    try:
        import numba
    except ImportError:
        return None

    @numba.njit(fastmath=True, nogil=True)
    def product(Z, M, out):
        n, q = Z.shape
        w = M.shape[1]
        u = np.zeros((4, w))
        total = 0.0
        for i in range(0, n - 3, 4):
            u[:] = 0.0
            for j in range(q):
                z0, z1, z2, z3 = Z[i, j], Z[i + 1, j], Z[i + 2, j], Z[i + 3, j]
                for k in range(w):
                    m = M[j, k]
                    u[0, k] += z0 * m
                    u[1, k] += z1 * m
                    u[2, k] += z2 * m
                    u[3, k] += z3 * m
            total += u[0, 0] + u[3, w - 1]  # keeps the loop from being optimised away
        out[0] = total

    return product


def best(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=float, default=1e6)
    parser.add_argument("--pq", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    from dpivreg.compute import kernels

    n, p = int(args.n), args.pq
    q = p
    rng = np.random.default_rng(0)
    Z = rng.standard_normal((n, q))
    X = Z @ (0.1 * rng.standard_normal((q, p))) + rng.standard_normal((n, p))
    Y = X.sum(axis=1) + rng.standard_normal(n)
    M, _ = kernels.pass_matrix(0.1 * rng.standard_normal((q, p)), 0.1 * rng.standard_normal(p), None, 0)
    rows = max(1024, min(kernels._SUB_BLOCK_ROWS, kernels._SUB_BLOCK_VALUES // (q + M.shape[1])))
    W = rng.standard_normal((rows, p))
    starts = range(0, n, rows)

    def first_product():
        for start in starts:
            Z[start:start + rows] @ M

    def gradient_sum():
        for start in starts:
            block = Z[start:start + rows]
            block.T @ W[:block.shape[0]]

    def gradient_sum_transposed():
        for start in starts:
            block = Z[start:start + rows]
            (W[:block.shape[0]].T @ block).T

    rate = dgemm_rate(threads=1)
    floor = n * multiply_adds_per_row(p, q) / rate
    with threadpool_limits(limits=1, user_api="blas"):
        iteration = best(lambda: kernels.block_sums(Z, X, Y, M, 30.0, 30.0, "numpy"), args.repeats)
        u = best(first_product, args.repeats)
        s1 = best(gradient_sum, args.repeats)
        s1t = best(gradient_sum_transposed, args.repeats)
        read = best(lambda: (X.sum(), Y.sum()), args.repeats)
    compiled = numba_first_product()
    if compiled is not None:
        sink = np.zeros(1)
        compiled(Z[:8], M, sink)  # compiled before it is timed
        u_numba = best(lambda: compiled(Z, M, sink), args.repeats)
    products = u + min(s1, s1t)
    print(f"n = {n:,}, p = q = {p}, sub-blocks of {rows} rows, one thread; dgemm {rate / 1e9:.1f} G multiply-adds/s, "
          f"arithmetic floor {floor:.3g} s ({multiply_adds_per_row(p, q):,} multiply-adds a row)")
    print(f"{'part':<24} {'seconds':>8} {'÷ floor':>8}")
    for name, seconds in (("iteration", iteration), ("U = Z M", u), ("Zᵀ W", s1), ("(Wᵀ Z)ᵀ", s1t),
                          ("the two products", products), ("rest", iteration - products), ("read X, Y", read),
                          *((("U = Z M (numba)", u_numba),) if compiled is not None else ())):
        print(f"{name:<24} {seconds:>8.3g} {seconds / floor:>8.2f}")


if __name__ == "__main__":
    main()
