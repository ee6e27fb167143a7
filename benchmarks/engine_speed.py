"""Time dp_2s_gd per iteration against the memory-bandwidth floor.

One iteration must at least read Z, X and Y once: (p + q + 1)·8·n bytes. The floor is that
traffic divided by the bandwidth of a large numpy copy measured on this machine.

    python benchmarks/engine_speed.py            # n = 10^6, p = q = 5 and n = 10^5, p = q = 50
    python benchmarks/engine_speed.py --quick    # smaller sizes, a smoke run
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dpivreg import dp_2s_gd


def copy_bandwidth(n_bytes: int = 800_000_000, repeats: int = 5) -> float:
    """Bytes per second moved by ``np.copyto`` (counting the read and the write)."""
    src = np.ones(n_bytes // 8)
    dst = np.empty_like(src)
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best


def time_engine(n: int, p: int, q: int, T: int, repeats: int = 3) -> float:
    rng = np.random.default_rng(0)
    Z = rng.standard_normal((n, q))
    X = Z @ (np.eye(q, p) + 0.1 * rng.standard_normal((q, p))) + rng.standard_normal((n, p))
    Y = X @ rng.standard_normal(p) + rng.standard_normal(n)
    best = np.inf
    for seed in range(repeats):
        start = time.perf_counter()
        dp_2s_gd(Z, X, Y, T=T, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.01, clip1=50.0, clip2=50.0, seed=seed)
        best = min(best, time.perf_counter() - start)
    return best / T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    args = parser.parse_args()
    sizes = [(10**5, 5, 5), (10**4, 50, 50)] if args.quick else [(10**6, 5, 5), (10**5, 50, 50)]
    bandwidth = copy_bandwidth(80_000_000 if args.quick else 800_000_000)
    print(f"numpy copy bandwidth: {bandwidth / 1e9:.2f} GB/s")
    print(f"{'n':>9} {'p':>3} {'q':>3} {'T':>3} {'s/iter':>10} {'floor s/iter':>13} {'ratio':>7}")
    for n, p, q in sizes:
        per_iter = time_engine(n, p, q, T=20)
        floor = (p + q + 1) * 8 * n / bandwidth
        print(f"{n:>9} {p:>3} {q:>3} {20:>3} {per_iter:>10.4f} {floor:>13.5f} {per_iter / floor:>7.1f}")


if __name__ == "__main__":
    main()
