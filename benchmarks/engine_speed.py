"""Speed and memory of dp_2s_gd against the memory-bandwidth floor and against linearmodels' IV2SLS.

For each cell (n, p = q) of the grid n ∈ {10⁴, 10⁵, 10⁶, 10⁷} × p = q ∈ {1, 5, 50} this prints

* ``s/iter``      marginal seconds per DP-2S-GD iteration: (best T=20 fit − best T=1 fit) / 19, which
                  removes the fixed per-call costs (validation, accounting, set-up);
* ``floor``       the memory-bandwidth floor of one iteration: it must at least read Z, X and Y once,
                  (p + q + 1)·8·n bytes, at the bandwidth of a large ``np.copyto`` measured once in this
                  run (best of 5 copies of 800 MB, counting the read and the write; single-threaded, so a
                  multi-threaded kernel can in principle beat it);  ``iter/floor`` = s/iter ÷ floor;
* ``read s/iter`` the same bytes at the rate of a read-only pass on the engine's threads (numpy sums of the
                  shares of an 800 MB array, best of 5, measured once in this run): what an iteration, which
                  only reads its rows, can reach here; ``iter/read`` = s/iter ÷ read s/iter;
* ``arith s/iter`` the arithmetic floor of one iteration: its multiply-adds, n·(q·(2p+1) + q·p + p + q + 2p)
                  (uᵢ = Mᵀzᵢ, the first stage's zᵢrᵢᵀ, the second stage's x̃ᵢeᵢ and the squared norms; p
                  endogenous regressors, no exogenous ones), at the multiply-add rate of a 2048² float64 matrix
                  product (BLAS dgemm on ``--threads`` threads, best of 5) measured once in this run;
                  ``iter/arith`` = s/iter ÷ arith s/iter. Whichever floor is larger binds;
* ``fit s``       wall time of one whole ``dp_2s_gd(..., T=20, method="preconditioned")`` call,
                  validation included. Every time is the best of repeats: up to 10 (3 for IV2SLS)
                  while they fit in ``--budget`` seconds, so a slow cell runs once;
* ``IV2SLS s``    wall time of ``linearmodels.IV2SLS(Y, None, X, Z).fit()`` (construction included) on the
                  same data: p endogenous regressors, q instruments, no exogenous regressors (no
                  constant); the data are passed as pandas objects wrapping the same numpy arrays
                  without a copy (IV2SLS is a little slower given bare arrays); ``fit/IV2SLS`` = fit s ÷
                  IV2SLS s. IV2SLS is ``skipped`` when its estimated peak memory, n·(400 + 40·(p+q+1))
                  bytes, exceeds ``--iv2sls-max-gb``;
* ``peak MB``     the engine's peak resident memory above the resident memory right after generating
                  the data (VmHWM, i.e. ``ru_maxrss`` without the peak it inherits across fork; the
                  mark is reset through /proc/self/clear_refs after the data are made, so the warm-up
                  and JIT compilation do not count); ``data MB`` = (p+q+1)·8·n bytes; ``peak/data``
                  their ratio (the target is O(1): memory O(n(p+q)));
* ``RSS MB``      the cell process's peak resident memory overall (imports, data, engine and IV2SLS);
* ``kernel``      the implementation ``dp_2s_gd`` used (``dpivreg.compute.kernels.resolve_kernel``; "auto" picks
                  by the per-row work).

The CSV has the same columns plus IV2SLS's own peak memory above the data, the thread count and notes.

Each cell runs in a fresh subprocess (``--cell n p q``), so its memory figures are clean. The data
(fixed seed, float64, C-contiguous; ``--order F`` makes Z and X column-major) are generated in row chunks:
Z ~ N(0, I_q), X = Z·Π + V, Y = X·β + u with u correlated with V (X endogenous). The DP call is a realistic
one: ρ1 = ρ2 = 1, η = α = 0.5, γ1 = γ2 = the Theorem's threshold ``dpivreg.model.theorem_clip(n, q, T)``.
Cells whose data exceed ``--max-gb`` (or 1/4 of the memory available when the cell starts) are
skipped with the reason printed.

Targets (issue 9) at n = 10⁶, p = q = 5: iter/floor ≤ 3 and fit/IV2SLS ≤ 0.5; peak/data O(1). Issue 15, item 6:
iter/floor ≤ 2 at p = q = 5 and iter/arith ≤ 1.5 at p = q = 50.

    python benchmarks/engine_speed.py                  # full grid, printed (no file written)
    python benchmarks/engine_speed.py --csv docs/_static/engine_speed.csv   # ... and the docs' table
    python benchmarks/engine_speed.py --quick          # n ≤ 10⁵, p = q ≤ 5: a few seconds
    python benchmarks/engine_speed.py --max-n 1000000  # the grid up to n = 10⁶
    python benchmarks/engine_speed.py --n 1e6 1e7 --pq 5 50   # issue 15 item 6's cells
    python benchmarks/engine_speed.py --kernel numpy --threads 1 --csv /tmp/numpy1.csv

``--kernel {auto,numba,numpy}`` is passed to ``dp_2s_gd`` only when given and when the installed
``dp_2s_gd`` accepts a ``kernel`` argument. ``--threads`` sets NUMBA_NUM_THREADS in the cell
subprocesses and, when given and accepted, ``dp_2s_gd(n_threads=...)`` (default: all cores available to
this process, the engine's own default). ``--blas-threads`` sets OMP/OPENBLAS/MKL_NUM_THREADS (default:
as ``--threads``); they also govern IV2SLS. The engine's numpy kernel runs BLAS inside its own row
threads, so threads × BLAS threads can exceed the cores.
"""

from __future__ import annotations

import argparse
import csv
import inspect
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
from bandwidth import copy_bandwidth, dgemm_rate, read_bandwidth  # benchmarks/bandwidth.py, beside this script

REPO = Path(__file__).resolve().parent.parent
DOCS_CSV = REPO / "docs" / "_static" / "engine_speed.csv"  # committed: written only when --csv names it
T_FIT = 20
DATA_SEED = 20260
WARM_UP_ROWS = 70_000
FULL_N = (10**4, 10**5, 10**6, 10**7)
FULL_PQ = (1, 5, 50)
QUICK_N = (10**4, 10**5)
QUICK_PQ = (1, 5)
BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
TARGET_CELL = (10**6, 5, 5)
MB = 1e6

COLUMNS = [  # (CSV key, table header, width, format)
    ("n", "n", 9, "d"),
    ("p", "p", 3, "d"),
    ("q", "q", 3, "d"),
    ("s_per_iter", "s/iter", 9, ".2e"),
    ("floor_s_per_iter", "floor s/iter", 12, ".2e"),
    ("iter_over_floor", "iter/floor", 10, ".1f"),
    ("read_s_per_iter", "read s/iter", 11, ".2e"),
    ("iter_over_read", "iter/read", 9, ".1f"),
    ("arith_s_per_iter", "arith s/iter", 12, ".2e"),
    ("iter_over_arith", "iter/arith", 10, ".2f"),
    ("fit_s", "fit s", 8, ".3g"),
    ("iv2sls_s", "IV2SLS s", 8, ".3g"),
    ("fit_over_iv2sls", "fit/IV2SLS", 10, ".2f"),
    ("peak_mb", "peak MB", 8, ".1f"),
    ("data_mb", "data MB", 8, ".1f"),
    ("peak_over_data", "peak/data", 9, ".2f"),
    ("rss_mb", "RSS MB", 8, ".0f"),
    ("kernel_used", "kernel", 6, "s"),
]
CSV_ONLY_COLUMNS = [("iv2sls_peak_mb", "IV2SLS peak MB"), ("threads", "threads"), ("note", "note")]


# ----------------------------------------------------------------------------------------
# shared helpers
# ----------------------------------------------------------------------------------------
def data_bytes(n: int, p: int, q: int) -> int:
    """Bytes of Z (n×q), X (n×p) and Y (n) in float64: what one iteration must read."""
    return (p + q + 1) * 8 * n


def multiply_adds_per_row(p: int, q: int) -> int:
    """Multiply-adds one iteration makes per row with p endogenous regressors, no exogenous ones, q instruments:
    uᵢ = Mᵀzᵢ with M of width 2p + 1 ([Θ | Θ̄R | Θ̄β]), the first stage's zᵢrᵢᵀ, the second stage's x̃ᵢeᵢ, and the
    squared norms of zᵢ, rᵢ and x̃ᵢ (:mod:`dpivreg.compute.kernels`)."""
    return q * (2 * p + 1) + q * p + p + q + 2 * p


def iv2sls_bytes_estimate(n: int, p: int, q: int) -> int:
    """Rough peak memory of IV2SLS(...).fit(), measured at n = 10⁵–10⁶: ~400 B/row plus ~5× the data."""
    return n * (400 + 5 * 8 * (p + q + 1))


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), or a large number elsewhere."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def engine_accepts(argument: str) -> bool:
    """Whether the installed dp_2s_gd takes ``argument`` (the engine gained ``kernel``/``n_threads``)."""
    from dpivreg import dp_2s_gd

    return argument in inspect.signature(dp_2s_gd).parameters


# ----------------------------------------------------------------------------------------
# the cell (runs in its own subprocess)
# ----------------------------------------------------------------------------------------
def current_rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """This process's peak RSS: VmHWM of /proc/self/status. ``ru_maxrss`` is the same mark except that
    it also inherits the peak of the process that forked this one (here the parent, which held the
    1.6 GB of the bandwidth copy), so it is only the fallback."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (and so ru_maxrss) to the current RSS (Linux ≥ 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def make_data(n: int, p: int, q: int, seed: int = DATA_SEED,
              chunk: int = 1 << 15) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Z ~ N(0, I_q), X = ZΠ + V, Y = Xβ + u (u correlated with V), filled in row chunks so that
    the only temporaries are chunk-sized."""
    rng = np.random.default_rng(seed)
    pi = np.eye(q, p) + 0.3 * rng.standard_normal((q, p))
    beta = rng.standard_normal(p)
    Z = np.empty((n, q))
    X = np.empty((n, p))
    Y = np.empty(n)
    for start in range(0, n, chunk):
        rows = slice(start, min(start + chunk, n))
        m = rows.stop - rows.start
        rng.standard_normal(out=Z[rows])
        v = rng.standard_normal((m, p))
        np.matmul(Z[rows], pi, out=X[rows])
        X[rows] += v
        np.matmul(X[rows], beta, out=Y[rows])
        Y[rows] += 0.5 * v[:, 0] + rng.standard_normal(m)
    return Z, X, Y


def engine_call(Z: np.ndarray, X: np.ndarray, Y: np.ndarray, *, T: int, clip: float, seed: int,
                options: dict) -> float:
    """Seconds of one realistic dp_2s_gd call; ``options``: optional keywords (kernel, n_threads)."""
    from dpivreg import dp_2s_gd

    start = time.perf_counter()
    dp_2s_gd(Z, X, Y, T=T, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.5, clip1=clip, clip2=clip,
             method="preconditioned", seed=seed, **options)
    return time.perf_counter() - start


def iv2sls_call(Z: np.ndarray, X: np.ndarray, Y: np.ndarray) -> float:
    """Seconds of IV2SLS(...).fit(), construction included; pandas objects wrap the arrays without a copy."""
    import pandas as pd
    from linearmodels import IV2SLS

    start = time.perf_counter()
    dependent = pd.Series(Y, name="y", copy=False)
    endog = pd.DataFrame(X, columns=[f"x{j}" for j in range(X.shape[1])], copy=False)
    instruments = pd.DataFrame(Z, columns=[f"z{j}" for j in range(Z.shape[1])], copy=False)
    IV2SLS(dependent, None, endog, instruments).fit()
    return time.perf_counter() - start


def resolved_kernel(kernel: str, p: int, q: int) -> str:
    """The implementation dp_2s_gd picks for ``kernel`` ("auto" depends on the per-row work), or "-"
    for an engine without kernels."""
    try:
        from dpivreg.compute.kernels import resolve_kernel

        return resolve_kernel(kernel, q, 2 * p + 1)  # width of the pass matrix [Θ | Θ̄R | Θ̄β], no exog
    except (ImportError, AttributeError, TypeError, ValueError):
        return "-"


def best_of(measure: Callable[[int], float], budget_s: float, max_repeats: int) -> tuple[float, int]:
    """Smallest of repeated timings ``measure(seed)``: at least one, then more while the time spent
    stays under ``budget_s`` (so large cells run once), at most ``max_repeats``. Returns (best, count)."""
    timings = [measure(0)]
    while len(timings) < max_repeats and sum(timings) + min(timings) <= budget_s:
        timings.append(measure(len(timings)))
    return min(timings), len(timings)


def warm_up(p: int, q: int, options: dict, with_iv2sls: bool, order: str = "C") -> None:
    """Import everything and compile or load numba's kernels, before the measured part: on 2,000 rows (the tiled
    loop) and on enough rows that each of two threads takes a block of 2^15 rows, where small shapes use their
    generated kernel (dpivreg.compute.kernels)."""
    from dpivreg.model import theorem_clip

    for rows in (2000, WARM_UP_ROWS):
        Z, X, Y = make_data(rows, p, q, seed=1)
        if order == "F":
            Z, X = np.asfortranarray(Z), np.asfortranarray(X)
        engine_call(Z, X, Y, T=2, clip=theorem_clip(rows, q, 2), seed=0, options=options)
    if with_iv2sls:
        iv2sls_call(Z, X, Y)


def run_cell(n: int, p: int, q: int, *, options: dict, iv2sls: bool, budget_s: float, order: str = "C") -> dict:
    """Measure one cell; returns the raw numbers (the parent adds the floor and the ratios)."""
    from dpivreg.model import theorem_clip

    warm_up(p, q, options, iv2sls, order)
    Z, X, Y = make_data(n, p, q)
    if order == "F":  # column-major, as pandas' to_numpy() and the model's working rows give
        Z, X = np.asfortranarray(Z), np.asfortranarray(X)
    rss_data = current_rss_bytes()
    peak_before = peak_rss_bytes()
    clean = reset_peak_rss()
    clip = theorem_clip(n, q, T_FIT)
    t1, _ = best_of(lambda s: engine_call(Z, X, Y, T=1, clip=clip, seed=s, options=options), budget_s, 10)
    fit, repeats = best_of(lambda s: engine_call(Z, X, Y, T=T_FIT, clip=clip, seed=s, options=options), budget_s, 10)
    engine_peak = peak_rss_bytes()
    result = {
        "n": n, "p": p, "q": q, "repeats": repeats, "clip": clip,
        "t1_s": t1, "fit_s": fit, "s_per_iter": max(fit - t1, 0.0) / (T_FIT - 1), "fit_s_per_iter": fit / T_FIT,
        "peak_mb": (engine_peak - rss_data) / MB, "note": "" if clean else "peak not reset: includes warm-up",
        "kernel_used": resolved_kernel(options.get("kernel", "auto"), p, q),
        "iv2sls_s": None, "iv2sls_peak_mb": None,
    }
    if iv2sls:
        rss_before = current_rss_bytes()
        reset_peak_rss()
        result["iv2sls_s"], _ = best_of(lambda _: iv2sls_call(Z, X, Y), budget_s, 3)
        result["iv2sls_peak_mb"] = (peak_rss_bytes() - rss_before) / MB
    result["rss_mb"] = max(peak_before, engine_peak, peak_rss_bytes()) / MB
    return result


def cell_main(args: argparse.Namespace) -> None:
    n, p, q = args.cell
    options = {} if args.kernel is None else {"kernel": args.kernel}
    options.update({} if args.engine_threads is None else {"n_threads": args.engine_threads})
    result = run_cell(n, p, q, options=options, iv2sls=not args.no_iv2sls, budget_s=args.budget, order=args.order)
    print(json.dumps(result))


# ----------------------------------------------------------------------------------------
# the parent: bandwidth, grid, subprocesses, table, CSV
# ----------------------------------------------------------------------------------------
def grid(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    ns, pqs = (QUICK_N, QUICK_PQ) if args.quick else (FULL_N, FULL_PQ)
    ns = ns if args.n is None else [int(n) for n in args.n]
    pqs = pqs if args.pq is None else args.pq
    return [(n, k, k) for n in ns if n <= args.max_n for k in pqs]


def skip_reason(n: int, p: int, q: int, max_gb: float) -> str | None:
    size = data_bytes(n, p, q)
    if size > max_gb * 1e9:
        return f"data {size / 1e9:.3g} GB > --max-gb {max_gb:g}"
    if 4 * size > available_bytes():
        return f"data {size / 1e9:.3g} GB > 1/4 of the {available_bytes() / 1e9:.1f} GB available now"
    return None


def cell_env(threads: int, blas_threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["NUMBA_NUM_THREADS"] = str(threads)
    env.update({name: str(blas_threads) for name in BLAS_THREAD_VARS})
    return env


def launch_cell(n: int, p: int, q: int, args: argparse.Namespace, pass_kernel: bool, pass_threads: bool) -> dict:
    """Run one cell in a fresh interpreter and parse the JSON line it prints last."""
    iv2sls = iv2sls_bytes_estimate(n, p, q) <= min(args.iv2sls_max_gb * 1e9, 0.6 * available_bytes())
    command = [sys.executable, str(Path(__file__).resolve()), "--cell", str(n), str(p), str(q)]
    command += ["--kernel", args.kernel] if pass_kernel else []
    command += ["--engine-threads", str(args.threads)] if pass_threads else []
    command += [] if iv2sls else ["--no-iv2sls"]
    command += ["--budget", str(args.budget), "--order", args.order]
    done = subprocess.run(command, env=cell_env(args.threads, args.blas_threads), capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        return {"n": n, "p": p, "q": q, "note": f"cell failed (exit {done.returncode}): {tail}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def add_ratios(row: dict, bandwidth: float, madd_rate: float, read_rate: float | None = None) -> dict:
    n, p, q = row["n"], row["p"], row["q"]
    row["data_mb"] = data_bytes(n, p, q) / MB
    row["floor_s_per_iter"] = data_bytes(n, p, q) / bandwidth
    row["read_s_per_iter"] = data_bytes(n, p, q) / read_rate if read_rate else None
    row["arith_s_per_iter"] = n * multiply_adds_per_row(p, q) / madd_rate
    if "s_per_iter" in row:
        row["iter_over_floor"] = row["s_per_iter"] / row["floor_s_per_iter"]
        row["iter_over_read"] = row["s_per_iter"] / row["read_s_per_iter"] if read_rate else None
        row["iter_over_arith"] = row["s_per_iter"] / row["arith_s_per_iter"]
        row["peak_over_data"] = row["peak_mb"] / row["data_mb"]
    if row.get("iv2sls_s"):
        row["fit_over_iv2sls"] = row["fit_s"] / row["iv2sls_s"]
    return row


def format_value(value, width: int, fmt: str) -> str:
    if value is None:
        return f"{'—':>{width}}"
    return f"{value:>{width}{fmt}}"


def format_row(row: dict) -> str:
    cells = []
    for key, _, width, fmt in COLUMNS:
        if key == "iv2sls_s" and row.get("iv2sls_s") is None and "s_per_iter" in row:
            cells.append(f"{'skipped':>{width}}")
        else:
            cells.append(format_value(row.get(key), width, fmt))
    line = " ".join(cells)
    note = row.get("note")
    return f"{line}  {note}" if note else line


def header() -> str:
    return " ".join(f"{title:>{width}}" for _, title, width, _ in COLUMNS)


def write_csv(rows: list[dict], path: Path) -> None:
    """The table's columns (same headers) plus IV2SLS's own peak memory, the thread count and notes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = [(key, title) for key, title, *_ in COLUMNS] + CSV_ONLY_COLUMNS
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([title for _, title in columns])
        for row in rows:
            writer.writerow([_csv_value(row, key) for key, _ in columns])


def _csv_value(row: dict, key: str) -> str:
    value = row.get(key)
    if key == "iv2sls_s" and value is None and "s_per_iter" in row:
        return "skipped"
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def numba_version() -> str:
    try:
        import numba
    except ImportError:
        return "not installed"
    return numba.__version__


def verdict(value: float | None, limit: float) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f} (≤ {limit:g}: {'met' if value <= limit else 'NOT met'})"


def report_targets(rows: list[dict]) -> None:
    for row in rows:
        if (row["n"], row["p"], row["q"]) == TARGET_CELL and "s_per_iter" in row:
            print(f"\ntargets at n = 10^6, p = q = 5: iter/floor = {verdict(row['iter_over_floor'], 3)}; "
                  f"fit/IV2SLS = {verdict(row.get('fit_over_iv2sls'), 0.5)}; peak/data = {row['peak_over_data']:.2f}")
    for row in rows:
        if "s_per_iter" in row and row["n"] >= 10**6 and row["p"] == row["q"] in (5, 50):
            measured, limit = ("iter/floor", 2) if row["p"] == 5 else ("iter/arith", 1.5)
            key = "iter_over_floor" if row["p"] == 5 else "iter_over_arith"
            read = f" (iter/read = {row['iter_over_read']:.2f})" if row.get("iter_over_read") else ""
            print(f"issue 15 item 6 at n = {row['n']:.0e}, p = q = {row['p']}: {measured} = {verdict(row[key], limit)}"
                  + read)


def parent_main(args: argparse.Namespace) -> None:
    accepts = engine_accepts("kernel")
    pass_kernel = args.kernel is not None and accepts
    if args.kernel is not None and not accepts:
        print(f"note: this dp_2s_gd has no kernel= argument; --kernel {args.kernel} is ignored")
    pass_threads = args.threads_given and engine_accepts("n_threads")
    bandwidth = args.bandwidth * 1e9 if args.bandwidth else copy_bandwidth()
    madd_rate = dgemm_rate(threads=args.threads)
    read_rate = read_bandwidth(threads=args.threads)
    kernel_label = args.kernel if pass_kernel else ("default" if not accepts else "auto (default)")
    print(f"numpy copy bandwidth {bandwidth / 1e9:.2f} GB/s; read {read_rate / 1e9:.2f} GB/s on {args.threads} "
          f"threads; dgemm {madd_rate / 1e9:.1f} G multiply-adds/s on "
          f"{args.threads} threads; T = {T_FIT}; kernel {kernel_label}; {args.order}-order rows; "
          f"threads {args.threads} (BLAS {args.blas_threads}); numba {numba_version()}; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(header(), flush=True)
    rows = []
    for n, p, q in grid(args):
        reason = skip_reason(n, p, q, args.max_gb)
        if reason:
            row = {"n": n, "p": p, "q": q, "note": f"skipped: {reason}"}
        else:
            row = launch_cell(n, p, q, args, pass_kernel, pass_threads)
        row.update(kernel=kernel_label, threads=args.threads, blas_threads=args.blas_threads,
                   bandwidth_gb_s=bandwidth / 1e9, numba=numba_version(), load=os.getloadavg()[0])
        rows.append(add_ratios(row, bandwidth, madd_rate, read_rate))
        print(format_row(row), flush=True)
    report_targets(rows)
    print(f"load average {os.getloadavg()[0]:.2f} at the end on {os.cpu_count()} CPUs (other processes share the "
          "cores: timings are best-of-repeats but still noisy)")
    csv_path = args.csv
    if csv_path is not None:
        write_csv(rows, Path(csv_path))
        print(f"wrote {csv_path}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="n ∈ {1e4, 1e5}, p = q ∈ {1, 5}; no CSV unless --csv")
    parser.add_argument("--max-n", type=float, default=math.inf, help="largest n of the grid")
    parser.add_argument("--n", type=float, nargs="+", default=None, help="these n instead of the grid's")
    parser.add_argument("--pq", type=int, nargs="+", default=None, help="these p = q instead of the grid's")
    parser.add_argument("--max-gb", type=float, default=6.0, help="skip cells whose data exceed this (GB)")
    parser.add_argument("--iv2sls-max-gb", type=float, default=12.0,
                        help="skip IV2SLS where its estimated peak memory exceeds this (GB)")
    parser.add_argument("--kernel", choices=("auto", "numba", "numpy"), default=None,
                        help="passed to dp_2s_gd(kernel=...) if it accepts it")
    parser.add_argument("--threads", type=int, default=None,
                        help="engine threads: NUMBA_NUM_THREADS and dp_2s_gd(n_threads=) (default: all cores)")
    parser.add_argument("--blas-threads", type=int, default=None,
                        help="OMP/OPENBLAS/MKL_NUM_THREADS in the cells (default: as --threads)")
    parser.add_argument("--csv", default=None, help="write the rows to this CSV (default: none, the table is only "
                                                    f"printed; the docs' table is {DOCS_CSV.relative_to(REPO)})")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds per timed quantity and cell spent on repeats (best of up to 10; "
                             "default 4, 1 with --quick)")
    parser.add_argument("--bandwidth", type=float, default=None, help="GB/s; skip the copy measurement")
    parser.add_argument("--order", choices=("C", "F"), default="C",
                        help="memory layout of Z and X: C (row-major, numpy's default; the default) or F "
                             "(column-major: what pandas' to_numpy() and the model's working rows give)")
    parser.add_argument("--cell", type=int, nargs=3, metavar=("N", "P", "Q"), help=argparse.SUPPRESS)
    parser.add_argument("--no-iv2sls", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine-threads", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.threads_given = args.threads is not None
    if args.threads is None:
        args.threads = len(os.sched_getaffinity(0))
    if args.blas_threads is None:
        args.blas_threads = args.threads
    if args.budget is None:
        args.budget = 1.0 if args.quick else 4.0
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.cell:
        cell_main(args)
    else:
        parent_main(args)


if __name__ == "__main__":
    main()
