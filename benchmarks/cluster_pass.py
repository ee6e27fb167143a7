"""One pass of DP-2S-GD over Dask arrays: a 2-worker ``distributed.LocalCluster`` against the threaded scheduler.

The data (Z n×q, X n×p, Y n; p = q = 5) is generated and persisted on the scheduler under test, in blocks of
``--block-rows`` rows, and one pass is timed: :meth:`dpivreg.compute.backends.DaskRows.clipped_sums`, the clipped
gradient sums of one iteration (binding clipping, a new public matrix each pass, as in a fit). For each
scheduler this prints the best and the median of ``--repeats`` passes; the ratio cluster ÷ threads of each;
and, for the cluster, the same pass with one task per block (the graph every unpersisted array takes)
beside the per-worker tasks that persisted arrays take (:class:`dpivreg.compute.backends.DaskRows`).

Target (issue 15, item 5): a pass on a 2-worker LocalCluster at most 1.3× the threaded scheduler's.

    python benchmarks/cluster_pass.py                 # n = 1e7, blocks of 2e5 and 1e6 rows
    python benchmarks/cluster_pass.py --quick         # n = 2e5, one block size (the tests run it)
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def persisted_data(n: int, block_rows: int, q: int = 5, p: int = 5):
    import dask
    import dask.array as da

    rng = da.random.default_rng(0)
    Z = rng.standard_normal((n, q), chunks=(block_rows, q))
    X = Z @ (np.eye(q, p) + 0.3) + rng.standard_normal((n, p), chunks=(block_rows, p))
    Y = X.sum(axis=1) + rng.standard_normal(n, chunks=block_rows)
    arrays = dask.persist(Z, X, Y)
    if "distributed" in __import__("sys").modules:
        from distributed import default_client, wait

        try:
            default_client()
        except ValueError:
            return arrays
        wait(list(arrays))
    return arrays


def blocks_per_worker(array, placed) -> str:
    """How many of a persisted array's blocks each worker holds, and how many each worker's tasks of a pass take
    (``DaskRows._placed``), e.g. ``held 7/3 -> run 5/5``."""
    from distributed import default_client, futures_of

    client = default_client()
    workers = sorted(client.nthreads())
    owners = [min(holders) for holders in client.who_has(futures_of(array)).values() if holders]
    runs = [worker for worker, share in placed.groups for _ in share]
    return (f"held {'/'.join(str(owners.count(w)) for w in workers)} -> "
            f"run {'/'.join(str(runs.count(w)) for w in workers)}")


def time_passes(rows, repeats: int) -> tuple[float, float]:
    """(best, median) seconds of a pass; the public matrix changes between passes, as in a fit."""
    from dpivreg.compute.kernels import pass_matrix

    q, p = rows.q, rows.p_endog
    M, _ = pass_matrix(np.full((q, p), 0.1), np.ones(p), np.eye(p), 0)
    rows.clipped_sums(M, 1.0, 1.0)  # warm-up: kernels loaded on every worker
    times = []
    for i in range(repeats):
        M = M * (1.0 + 1e-9 * (i + 1))
        start = time.perf_counter()
        rows.clipped_sums(M, 1.0, 1.0)
        times.append(time.perf_counter() - start)
    return min(times), float(np.median(times))


def measure(n: int, block_rows: int, repeats: int) -> list[dict]:
    import dask
    from distributed import Client, LocalCluster

    from dpivreg.compute.backends import DaskRows

    rows_out = []
    with dask.config.set(scheduler="threads"):
        rows = DaskRows(*persisted_data(n, block_rows))
        threads = time_passes(rows, repeats)
        rows.close()
    rows_out.append({"scheduler": "threads", "tasks": "per block", "best_s": threads[0], "median_s": threads[1]})
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster):
        data = persisted_data(n, block_rows)
        rows = DaskRows(*data)
        if rows._placed is None:
            raise RuntimeError("the persisted arrays did not take the per-worker tasks (DaskRows._placed is None)")
        spread = blocks_per_worker(data[0], rows._placed)
        placed = time_passes(rows, repeats)
        rows.close()
        graph_rows = DaskRows(*data)
        graph_rows._placed = None  # the per-block graph, as for arrays that are not persisted
        graph = time_passes(graph_rows, repeats)
        graph_rows.close()
    for tasks, (best, median) in (("per worker thread", placed), ("per block", graph)):
        rows_out.append({"scheduler": "LocalCluster", "tasks": tasks, "best_s": best, "median_s": median,
                         "blocks": spread if tasks == "per worker thread" else ""})
    for row in rows_out:
        row.setdefault("blocks", "")
        row.update(n=n, n_blocks=-(-n // block_rows), ratio_best=row["best_s"] / threads[0],
                   ratio_median=row["median_s"] / threads[1])
    return rows_out


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="n = 2e5 in 4 blocks, 3 passes")
    parser.add_argument("--n", type=float, default=1e7)
    parser.add_argument("--block-rows", type=float, nargs="+", default=[2e5, 1e6])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    n, sizes, repeats = (200_000, [50_000], 3) if args.quick else (int(args.n), [int(b) for b in args.block_rows],
                                                                    args.repeats)
    rows = [row for size in sizes for row in measure(n, size, repeats)]
    print(f"{'n':>8} {'blocks':>6} {'scheduler':>13} {'tasks':>18} {'best s':>8} {'median s':>9} "
          f"{'÷ threads (best)':>17} {'(median)':>9}  blocks per worker")
    for row in rows:
        print(f"{row['n']:>8.0e} {row['n_blocks']:>6} {row['scheduler']:>13} {row['tasks']:>18} {row['best_s']:>8.3f} "
              f"{row['median_s']:>9.3f} {row['ratio_best']:>17.2f} {row['ratio_median']:>9.2f}  {row['blocks']}")
    return rows


if __name__ == "__main__":
    main()
