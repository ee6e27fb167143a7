"""The memory-bandwidth yardstick shared by the benchmarks: the speed of a large numpy copy."""

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
