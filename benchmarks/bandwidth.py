"""The yardsticks shared by the benchmarks: the speed of a large numpy copy (memory bandwidth) and of a large
matrix product (arithmetic throughput)."""

from __future__ import annotations

import math
import time

import numpy as np


def copy_bandwidth(n_bytes: int = 800_000_000, repeats: int = 5) -> float:
    """Bytes per second moved by ``np.copyto`` (counting the read and the write), best of ``repeats``."""
    src = np.ones(n_bytes // 8)
    dst = np.zeros_like(src)  # touch the pages so the first copy does not time page faults
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best


def read_bandwidth(threads: int = 1, n_bytes: int = 800_000_000, repeats: int = 5) -> float:
    """Bytes per second read by ``threads`` threads each summing a contiguous share of one large array (numpy's
    sum releases the GIL), best of ``repeats``: what a pass that only reads its rows, as an iteration does, can reach
    on this machine. A copy moves more bytes than it counts (the destination is read before it is written), so
    this is often below :func:`copy_bandwidth`."""
    from concurrent.futures import ThreadPoolExecutor

    data = np.ones(n_bytes // 8)
    shares = np.array_split(data, threads)
    best = math.inf
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(np.sum, shares))  # warm-up: threads started
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(np.sum, shares))
            best = min(best, time.perf_counter() - start)
    return data.nbytes / best


def dgemm_rate(size: int = 2048, repeats: int = 5, threads: int | None = None) -> float:
    """Multiply-adds per second of a square float64 matrix product (BLAS dgemm, ``size`` × ``size``), best of
    ``repeats``, with BLAS held to ``threads`` threads (default: BLAS's own setting). No code doing the same
    multiply-adds on this machine can run faster than this, so it is the arithmetic floor's yardstick."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, size, size))
    out = np.empty((size, size))
    with threadpool_limits(limits=threads, user_api="blas"):
        np.matmul(a, b, out=out)  # warm-up: BLAS threads started, pages touched
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            np.matmul(a, b, out=out)
            best = min(best, time.perf_counter() - start)
    return size**3 / best
