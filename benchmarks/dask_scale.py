"""DP-2S-GD on data that does not sit in memory: Dask arrays read from disk at every iteration.

The data (Z n×q, X n×p, Y n) is written once, block by block, as ``.npy`` stacks under
``--dir`` (the layout of :func:`dask.array.to_npy_stack`); the fit then reads it with
:func:`dask.array.from_npy_stack` and never holds more than a few blocks. Each fit runs in a
fresh subprocess so that its peak resident memory (``ru_maxrss``) is its own. The same data is
then fitted in memory (numpy arrays, when they fit) for comparison, and the two released paths
are compared.

    python benchmarks/dask_scale.py                       # n = 5·10^7, p = q = 5 (4.4 GB on disk)
    python benchmarks/dask_scale.py --quick               # n = 2·10^6, a smoke run
    python benchmarks/dask_scale.py --scheduler distributed   # a LocalCluster instead of threads

Columns: seconds per iteration (marginal: (T=20 fit − T=1 fit)/19), the whole T = 20 fit,
the bandwidth floor ((p+q+1)·8·n bytes per iteration over a large numpy copy's bandwidth),
peak RSS, and its part above the process's baseline (interpreter and libraries, before any
data is read) against the data's size. With a LocalCluster the peak adds the workers'. Notes: after the first pass the
files sit in the OS page cache (not counted in the process's RSS), so "disk" reads run at memory speed here; on a
cluster they come from the workers' own storage. Z, X and Y are separate stacks on purpose:
column slices of one Dask array are copied by Dask's slicing tasks, block by block at every
iteration (seen in a profile: 30 copies per pass of 10 blocks), which here doubled a pass's time.
"""

from __future__ import annotations

import argparse
import json
import pickle
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from bandwidth import copy_bandwidth  # benchmarks/bandwidth.py, beside this script

SEED = 20261129


def write_stacks(directory: Path, n: int, q: int, p: int, block_rows: int) -> None:
    """Write Z, X, Y as npy stacks, one block at a time (X = ZΠ + noise, Y = Xβ + noise, q >= p)."""
    marker = directory / "done.json"
    if marker.exists() and json.loads(marker.read_text()) == {"n": n, "q": q, "p": p, "block_rows": block_rows}:
        return
    rng = np.random.default_rng(SEED)
    Pi = np.eye(q, p) + 0.3 * rng.standard_normal((q, p))
    beta = rng.standard_normal(p)
    edges = list(range(0, n, block_rows)) + [n]
    chunks = tuple(b - a for a, b in zip(edges[:-1], edges[1:]))
    for name, cols in (("Z", q), ("X", p), ("Y", None)):
        (directory / name).mkdir(parents=True, exist_ok=True)
        shape_chunks = (chunks,) if cols is None else (chunks, (cols,))
        with open(directory / name / "info", "wb") as f:
            pickle.dump({"chunks": shape_chunks, "dtype": np.dtype(np.float64), "axis": 0}, f)
    for i, rows in enumerate(chunks):
        block_rng = np.random.default_rng([SEED, i])
        Z = block_rng.standard_normal((rows, q))
        X = Z @ Pi + block_rng.standard_normal((rows, p))
        Y = X @ beta + block_rng.standard_normal(rows)
        for name, values in (("Z", Z), ("X", X), ("Y", Y)):
            np.save(directory / name / f"{i}.npy", values)
    marker.write_text(json.dumps({"n": n, "q": q, "p": p, "block_rows": block_rows}))


def _current_rss() -> int:
    """Resident set size of this process now, in bytes (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def fit_kwargs(n: int, q: int, T: int) -> dict:
    from dpivreg.model import theorem_clip

    gamma = theorem_clip(n, q, T)
    return dict(T=T, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.5, clip1=gamma, clip2=gamma, seed=7,
                method="preconditioned")


def run_cell(directory: Path, mode: str, scheduler: str, T: int) -> dict:
    """One fit in this process (called in a subprocess): timings, peak RSS and the released β path."""
    import dask
    import dask.array as da

    from dpivreg import dp_2s_gd

    baseline = _current_rss()  # interpreter, numpy, dask, numba: before any data
    Z, X, Y = (da.from_npy_stack(str(directory / name)) for name in ("Z", "X", "Y"))
    n, q = Z.shape
    if mode == "memory":
        Z, X, Y = (np.ascontiguousarray(a.compute()) for a in (Z, X, Y))
    client = None
    if scheduler == "distributed" and mode == "dask":
        from distributed import Client, LocalCluster

        client = Client(LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None))
    timings = {}
    with dask.config.set(scheduler="threads" if scheduler == "threads" else None):
        small = [a[:1000] for a in (Z, X, Y)]
        dp_2s_gd(*small, **fit_kwargs(1000, q, 1))  # warm-up: the numba kernel is compiled or loaded from its cache
        for steps in (1, T):
            start = time.perf_counter()
            path = dp_2s_gd(Z, X, Y, **fit_kwargs(n, q, steps))
            timings[steps] = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    workers_peak = None
    if client is not None:
        workers_peak = max(client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024).values())
        client.close()
    return {"fit_s": timings[T], "fit1_s": timings[1], "per_iter_s": (timings[T] - timings[1]) / (T - 1),
            "peak_rss": peak, "baseline_rss": baseline, "workers_peak_rss": workers_peak,
            "beta": path.beta.tolist()}


def _cell(args: argparse.Namespace, n: int, mode: str, scheduler: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--cell", mode, scheduler, "--n", str(n), "--q", str(args.q),
                          "--p", str(args.p), "--T", str(args.T), "--dir", str(args.dir)],
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"the {mode} cell failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="n = 2e6 (seconds)")
    parser.add_argument("--n", type=float, default=5e7)
    parser.add_argument("--q", type=int, default=5)
    parser.add_argument("--p", type=int, default=5)
    parser.add_argument("--T", type=int, default=20)
    parser.add_argument("--block-rows", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/dpivreg_dask_scale"))
    parser.add_argument("--scheduler", choices=["threads", "distributed"], default="threads")
    parser.add_argument("--skip-memory", action="store_true", help="do not fit in memory for comparison")
    parser.add_argument("--csv", type=Path, default=None, help="append the rows to this CSV")
    parser.add_argument("--cell", nargs=2, metavar=("MODE", "SCHEDULER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    n = int(2e6) if args.quick else int(args.n)
    directory = args.dir / f"n{n}_q{args.q}_p{args.p}"
    if args.cell:
        if args.cell[0] == "bandwidth":
            print(json.dumps({"bandwidth": copy_bandwidth()}))
        else:
            print(json.dumps(run_cell(directory, args.cell[0], args.cell[1], args.T)))
        return

    start = time.perf_counter()
    write_stacks(directory, n, args.q, args.p, min(args.block_rows, n))
    print(f"data: n = {n:,}, q = {args.q}, p = {args.p}: {(args.p + args.q + 1) * 8 * n / 1e9:.2f} GB in "
          f"{directory} (written or checked in {time.perf_counter() - start:.0f} s)")
    # Every measurement runs in its own subprocess: a child's peak RSS starts from its parent's size.
    bandwidth = _cell(args, n, "bandwidth", "-")["bandwidth"]
    floor = (args.p + args.q + 1) * 8 * n / bandwidth
    data_bytes = (args.p + args.q + 1) * 8 * n
    print(f"numpy copy bandwidth {bandwidth / 1e9:.1f} GB/s; floor {floor:.3f} s per iteration")
    modes = [("dask", args.scheduler)] + ([] if args.skip_memory else [("memory", "threads")])
    results = {}
    for mode, scheduler in modes:
        results[mode] = _cell(args, n, mode, scheduler)
    header = (f"{'data':>7} {'scheduler':>11} {'n':>11} {'p':>2} {'q':>2} {'s/iter':>7} {'floor':>6} {'ratio':>6} "
              f"{'fit s':>7} {'peak RSS GB':>11} {'above base':>10} {'data GB':>7} {'above/data':>10}")
    print(header)
    rows = []
    for mode, scheduler in modes:
        r = results[mode]
        peak = r["peak_rss"] if r["workers_peak_rss"] is None else r["peak_rss"] + 2 * r["workers_peak_rss"]
        above = r["peak_rss"] - r["baseline_rss"]
        row = dict(data="disk/Dask" if mode == "dask" else "memory", scheduler=scheduler if mode == "dask" else "-",
                   n=n, p=args.p, q=args.q, per_iter_s=r["per_iter_s"], floor_s=floor,
                   ratio=r["per_iter_s"] / floor, fit_s=r["fit_s"], peak_rss_gb=peak / 1e9,
                   above_baseline_gb=above / 1e9, data_gb=data_bytes / 1e9, above_over_data=above / data_bytes)
        rows.append(row)
        print(f"{row['data']:>7} {row['scheduler']:>11} {n:>11,} {args.p:>2} {args.q:>2} {row['per_iter_s']:>7.3f} "
              f"{floor:>6.3f} {row['ratio']:>6.1f} {row['fit_s']:>7.1f} {row['peak_rss_gb']:>11.2f} "
              f"{row['above_baseline_gb']:>10.2f} {row['data_gb']:>7.2f} {row['above_over_data']:>10.3f}")
    if "memory" in results:
        a, b = np.array(results["dask"]["beta"]), np.array(results["memory"]["beta"])
        print("released β path, Dask vs in memory: max relative difference "
              f"{np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)):.1e}")
    if args.csv:
        import csv

        new = not args.csv.exists()
        with open(args.csv, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            if new:
                writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
