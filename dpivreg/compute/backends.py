"""Where the rows live: in memory (split across threads) or in a Dask array (blocks on a cluster).

The engine sees one interface, :class:`RowSource`: given the small public matrix of an iteration
it returns the clipped gradient sums over all rows (:mod:`dpivreg.compute.kernels`). Only these sums,
of fixed small size, travel back; the privacy noise is drawn once, by the engine, at the driver.
So the released path for a given seed does not depend on where the rows live, up to the order
in which the partial sums are added (rounding).

Dask is optional: this module never imports it unless it is handed a Dask array.
"""

from __future__ import annotations

import contextlib
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np

from dpivreg.compute.kernels import block_sums, resolve_kernel, safe_block_sums, safe_unit_block_sums, unit_block_sums
from dpivreg.privacy.rounding import SUM_BLOCK_TERMS, pairwise_sum
from dpivreg.privacy.units import starts_of

__all__ = ["RowSource", "InMemoryRows", "BuiltRows", "DaskRows", "is_dask_collection", "map_row_blocks", "add_parts",
           "DESIGN_BLOCK_ROWS", "row_blocks", "count_passes", "PassCounter", "balanced_owners", "task_shares"]

# Below this many rows per thread, starting threads costs more than it saves.
_MIN_ROWS_PER_THREAD = 20_000

#: Rows per block of a pass over an in-memory design's columns. Each block is copied into one contiguous
#: array, so a pass needs a few blocks of extra memory (2**16 rows × d doubles), not a copy of the data. Also the
#: most terms a block function sums before its result is combined pairwise with the others' (the order of summation
#: that the releases' rounding allowance assumes, :mod:`dpivreg.privacy.rounding`).
DESIGN_BLOCK_ROWS = SUM_BLOCK_TERMS


def is_dask_collection(value) -> bool:
    """True for a Dask array, DataFrame or Series (without importing dask)."""
    if "dask" not in sys.modules:
        return False
    import dask

    return dask.is_dask_collection(value)


def _limit_blas_to_one_thread():
    """Hold BLAS to one thread, process-wide, until ``.restore_original_limits()`` (threadpoolctl).

    Our own threads (or Dask's local ones) are the parallelism: each calling a multi-threaded BLAS
    oversubscribed the cores, measured 2.4x slower (numpy kernel, p = q = 50, two threads each way
    on two cores). Held for the whole fit, not per pass: OpenBLAS's idle threads keep spinning
    between calls.
    """
    return _blas_controller().limit(limits=1, user_api="blas")


_CONTROLLER: list = []  # [(number of imported modules when scanned, threadpoolctl.ThreadpoolController)]


def _blas_controller():
    """threadpoolctl's view of the loaded BLAS libraries, scanned again only when modules were imported since.

    A scan (``threadpool_limits``) walks every loaded shared library: 5.7 ms, against 0.04 ms to set limits
    through a kept controller (measured; a fit sets them up to four times). A BLAS is normally loaded by
    importing the extension module that links it, so the module count stands for the set of libraries; one
    loaded otherwise (ctypes) is seen at the next import, and until then only its threads are not limited
    (oversubscription, never a different number).
    """
    from threadpoolctl import ThreadpoolController

    modules = len(sys.modules)
    if not _CONTROLLER or _CONTROLLER[0][0] != modules:
        _CONTROLLER[:] = [(modules, ThreadpoolController())]
    return _CONTROLLER[0][1]


def default_threads() -> int:
    """Cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class PassCounter:
    """The number of passes over the rows made while it was active (:func:`count_passes`)."""

    def __init__(self) -> None:
        self.count = 0


_ACTIVE_COUNTERS: list[PassCounter] = []


@contextlib.contextmanager
def count_passes():
    """Count the passes over the rows (in memory or Dask) made inside the ``with`` block.

    A pass is one map of a block function over all rows: a design statistic, a release's sums, one
    iteration's gradient sums, the benchmark's residuals. For benchmarks and tests; it reads nothing.

    >>> with count_passes() as passes:  # doctest: +SKIP
    ...     res = model.fit(rho=1)
    >>> passes.count  # doctest: +SKIP
    """
    counter = PassCounter()
    _ACTIVE_COUNTERS.append(counter)
    try:
        yield counter
    finally:
        _ACTIVE_COUNTERS.remove(counter)


def _count_pass() -> None:
    for counter in _ACTIVE_COUNTERS:
        counter.count += 1


#: Callables called after each pass over the rows (a fit's progress bar over its Dask passes).
_PASS_LISTENERS: list = []


@contextlib.contextmanager
def one_pass():
    """One pass over the rows: counted (:func:`count_passes`) when it starts, reported to the listeners of
    :func:`on_passes` when it has ended (not when it fails); Dask's graphs computed in it unfused
    (:func:`unfused_dask`)."""
    _count_pass()
    with unfused_dask():
        yield
    for listener in tuple(_PASS_LISTENERS):
        listener()


@contextlib.contextmanager
def unfused_dask():
    """Dask computations without the low-level fusion of linear task chains (``optimization.fuse.active``), when
    Dask is in use. That fusion breaks graphs built on ``dd.from_delayed(..., verify_meta=False)`` frames, the way to
    hold partitions whose dtypes differ (``KeyError: 'pop from an empty set'`` or "Missing dependency", dask 2026.8.0),
    and a pass gains little from it: a few tasks per partition, each holding a block of rows."""
    dask = sys.modules.get("dask")
    if dask is None:  # nothing of Dask to compute (and Dask is optional)
        yield
        return
    with dask.config.set({"optimization.fuse.active": False}):
        yield


@contextlib.contextmanager
def on_passes(listener):
    """Call ``listener()`` after every pass over the rows made inside the ``with`` block (for progress bars;
    it reads nothing)."""
    _PASS_LISTENERS.append(listener)
    try:
        yield
    finally:
        _PASS_LISTENERS.remove(listener)


def map_row_blocks(func, n: int, *, block_rows: int = DESIGN_BLOCK_ROWS, n_threads: int | None = None,
                   blocks: list[slice] | None = None) -> list:
    """``[func(rows) for rows in (contiguous slices of range(n), block_rows each)]``, on threads, in order
    (or over the given ``blocks``, e.g. cut at the starts of groups of rows).

    The blocks do not depend on the thread count, so sums of the results added in list order
    (:func:`add_parts`) are the same whatever the number of threads. BLAS is held to one thread while
    the threads run (see :func:`_limit_blas_to_one_thread`).
    """
    with one_pass():
        blocks = (blocks or row_blocks(n, block_rows)) or [slice(0, 0)]
        threads = min(default_threads() if n_threads is None else n_threads, len(blocks),
                      max(1, n // _MIN_ROWS_PER_THREAD))
        if threads <= 1:
            return [func(rows) for rows in blocks]
        limit = _limit_blas_to_one_thread()
        try:
            with ThreadPoolExecutor(threads) as pool:
                return list(pool.map(func, blocks))
        finally:
            limit.restore_original_limits()


def add_parts(parts: list):
    """Element-wise sum of arrays or of tuples of arrays (one per block of rows), by pairwise summation in list order
    (:func:`dpivreg.privacy.rounding.pairwise_sum`: the order the releases' rounding allowance assumes)."""
    return pairwise_sum(parts)


class RowSource(Protocol):
    """The rows of the working arrays Z (n×q), X_endog (n×p_endog) and Y (n,), wherever they are.

    ``n`` is the public normaliser of the releases' sums: the row count, or with privacy units n̂ = N·k̂
    (:mod:`dpivreg.privacy.units`; a float); ``n_units`` the public number of privacy units (the rows at row level);
    ``groups`` the (private) grouping of the rows into units and clusters, or None.
    """

    n: float
    q: int
    n_units: int
    max_rows: int
    kernel: str  # the block functions' implementation: "auto", "numba" or "numpy" (compute.kernels.KERNELS)
    groups: object  # dpivreg.privacy.units.RowGroups or None

    def clipped_sums(self, M: np.ndarray, clip1, clip2, split: int | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Σ over all rows of :func:`dpivreg.compute.kernels.block_sums`: (S1, s2, counts)."""

    def safe_sums(self, theta: np.ndarray, whitened: np.ndarray, beta_full: np.ndarray, clip1, clip2,
                  split: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Σ over all rows of :func:`dpivreg.compute.kernels.safe_block_sums`: (S1, s2, counts)."""

    def sums(self, func, *args) -> tuple:
        """Σ over all rows of ``func(Z_block, X_endog_block, Y_block, *args)``, a tuple of fixed-size arrays."""

    def group_sums(self, func, level: str, *args) -> tuple:
        """Σ over pieces of whole groups of ``func(Z_piece, X_endog_piece, Y_piece, starts, *args)``, ``starts`` the
        offsets in the piece of its groups of ``level`` ("unit" or "cluster")."""

    def close(self) -> None:
        """Release threads or other resources."""


class _MappedRows:
    """The shared part of the row sources: a kernel mapped over pieces of the rows, the parts added in order."""

    n: float
    q: int
    n_units: int
    kernel: str
    groups = None  # dpivreg.privacy.units.RowGroups (privacy units or clusters) or None
    max_rows = 1  # the most rows one privacy unit holds (public): releases summing per-row terms scale by it
    _blas_limit = None  # a threadpoolctl limit held while the source is open

    def _map(self, func, *args) -> list[tuple]:
        """``func(Z_piece, X_endog_piece, Y_piece, *args)`` for every piece of the rows, in order."""
        raise NotImplementedError

    def _map_grouped(self, func, level: str, *args) -> list[tuple]:
        """``func(Z_piece, X_endog_piece, Y_piece, starts, *args)`` for every piece (whole groups), in order."""
        raise NotImplementedError

    @property
    def unit_level(self) -> bool:
        """Whether the rows are grouped into privacy units (the gradients are then summed per unit and clipped)."""
        return self.groups is not None and self.groups.unit_level

    # Every pass below sums at most DESIGN_BLOCK_ROWS terms per call of a block function (_in_blocks,
    # _in_group_blocks) and adds the results pairwise (_add) within a piece and across pieces: the order of summation
    # whose depth dpivreg.privacy.rounding.summation_depth bounds.
    def clipped_sums(self, M, clip1, clip2, split=None):
        kernel = resolve_kernel(self.kernel, self.q, M.shape[1])
        if self.unit_level:
            return _add(self._map_grouped(_in_group_blocks, "unit", unit_block_sums, M, clip1, clip2, split, kernel))
        return _add(self._map(_in_blocks, block_sums, M, clip1, clip2, kernel, split))

    def safe_sums(self, theta, whitened, beta_full, clip1, clip2, split=None):
        if self.unit_level:
            return _add(self._map_grouped(_in_group_blocks, "unit", safe_unit_block_sums, theta, whitened, beta_full,
                                          clip1, clip2, split))
        return _add(self._map(_in_blocks, safe_block_sums, theta, whitened, beta_full, clip1, clip2, split))

    def sums(self, func, *args):
        return _add(self._map(_in_blocks, func, *args))

    def group_sums(self, func, level: str, *args):
        return _add(self._map_grouped(_in_group_blocks, level, func, *args))

    def close(self) -> None:
        if self._blas_limit is not None:
            self._blas_limit.restore_original_limits()
            self._blas_limit = None


class InMemoryRows(_MappedRows):
    """Rows in numpy arrays, split into one contiguous range per thread.

    The kernels release the GIL (numba ``nogil``; numpy's ufuncs and BLAS), so the threads run
    in parallel. Partial sums are added in range order: deterministic for a given thread count.
    """

    def __init__(self, Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, *, kernel: str = "auto",
                 n_threads: int | None = None, groups=None, n: float | None = None,
                 n_units: int | None = None, max_rows: int = 1) -> None:
        """``groups`` (:class:`dpivreg.privacy.units.RowGroups`): the rows' units and clusters, contiguous; the threads'
        ranges are then cut at group starts. ``n``, ``n_units``, ``max_rows``: the public normaliser, unit count
        (default: the row count) and rows per unit."""
        self.Z, self.X_endog, self.Y = Z, X_endog, Y
        self._start(Z.shape[0], Z.shape[1], kernel, n_threads, groups, n, n_units, max_rows)

    def _start(self, rows: int, q: int, kernel: str, n_threads: int | None, groups, n, n_units, max_rows) -> None:
        """The row count's public facts, and one contiguous range of rows per thread (cut at group starts)."""
        self.q = q
        self.n = rows if n is None else n
        self.n_units = rows if n_units is None else int(n_units)
        self.kernel = kernel
        self.groups = groups
        self.max_rows = int(max_rows)
        threads = default_threads() if n_threads is None else n_threads
        threads = max(1, min(threads, rows // _MIN_ROWS_PER_THREAD))
        if groups is not None:
            self._ranges = groups.pieces(threads)
        else:
            edges = np.linspace(0, rows, threads + 1).astype(int)
            self._ranges = [slice(a, b) for a, b in zip(edges[:-1], edges[1:])]
        threads = len(self._ranges)
        self._pool = ThreadPoolExecutor(threads) if threads > 1 else None
        if threads > 1:
            self._blas_limit = _limit_blas_to_one_thread()

    def _map(self, func, *args):
        def run(rows: slice):
            return func(self.Z[rows], self.X_endog[rows], self.Y[rows], *args)

        return self._run(run)

    def _map_grouped(self, func, level, *args):
        def run(rows: slice):
            return func(self.Z[rows], self.X_endog[rows], self.Y[rows], self.groups.local(rows, level), *args)

        return self._run(run)

    def _run(self, run) -> list:
        with one_pass():
            if self._pool is None:
                return [run(rows) for rows in self._ranges]
            return list(self._pool.map(run, self._ranges))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        super().close()


class BuiltRows(InMemoryRows):
    """Rows that no array holds: ``build(rows)`` makes (Z, X_endog, Y) of a slice of rows, and every pass builds its
    rows a block of :data:`DESIGN_BLOCK_ROWS` at a time within each thread's range, the block functions' parts
    added in order (deterministic for a given thread count). Memory: a few blocks, whatever n is
    (:class:`dpivreg.estimation.working_scale.WorkingRows` builds the working rows from the design's columns). Rows
    grouped into units or clusters are not built this way (their sources hold arrays).
    """

    def __init__(self, build, rows: int, q: int, *, kernel: str = "auto", n_threads: int | None = None,
                 block_rows: int = DESIGN_BLOCK_ROWS) -> None:
        self._build, self._block_rows = build, int(block_rows)
        self._start(rows, q, kernel, n_threads, None, None, None, 1)

    def _map(self, func, *args):
        def run(rows: slice):
            blocks = row_blocks(rows.stop - rows.start, self._block_rows)
            return _add([func(*self._build(slice(rows.start + b.start, rows.start + b.stop)), *args) for b in blocks])

        return self._run(run)

    def _map_grouped(self, func, level, *args):
        raise NotImplementedError("rows grouped into units or clusters are held in arrays (InMemoryRows)")


class DaskRows(_MappedRows):
    """Rows in Dask arrays: each iteration is one ``dask.compute`` of per-block partial sums.

    The blocks are aligned on the rows of Z and kept whole along the columns. Nothing is
    persisted: each iteration re-reads the blocks from wherever the Dask graph gets them
    (memory if the user persisted the arrays, disk or a computation otherwise), so the
    driver's memory stays O(number of blocks · q · p), whatever n is. The scheduler is Dask's
    current one: the threaded default, or a ``distributed.Client`` if one is active.

    Arrays persisted on the active ``distributed.Client`` (every block a future it holds) take a shorter
    way: a pass is one task per worker thread over the blocks that worker holds (:class:`_PlacedBlocks`),
    not one task per block; the per-block sums come back in one message per task and are added in block
    order, so the numbers are the same.
    """

    def __init__(self, Z, X_endog, Y, *, kernel: str = "auto", endog_from: int = 0, groups=None,
                 n: float | None = None, n_units: int | None = None, max_rows: int = 1) -> None:
        """``X_endog``: X's endogenous columns; or, with ``endog_from = k``, X itself, whose leading k (exogenous)
        columns every task drops from its block (a numpy view), so that persisted X keeps its blocks. ``groups``
        (:class:`dpivreg.privacy.units.DaskGroups`, whole units and clusters in each block), ``n``, ``n_units``,
        ``max_rows``: as for :class:`InMemoryRows`."""
        row_chunks = Z.chunks[0]
        self.Z = Z.rechunk({0: row_chunks, 1: -1})
        self._X = X_endog.rechunk({0: row_chunks, 1: -1})
        self._endog_from = int(endog_from)
        self.Y = Y.rechunk({0: row_chunks})
        rows, self.q = (int(s) for s in self.Z.shape)
        self.n = rows if n is None else n
        self.n_units = rows if n_units is None else int(n_units)
        self.groups, self.max_rows = groups, int(max_rows)
        self.p_endog = int(self._X.shape[1]) - self._endog_from
        self.kernel = kernel
        self._placed = _PlacedBlocks.of(self.Z, self._X, self.Y, self._endog_from) if groups is None else None
        self._blas_limit = _limit_blas_to_one_thread()

    def _map(self, func, *args):
        import dask

        with one_pass():
            if self._placed is not None:
                return self._placed.map(func, args)
            task = dask.delayed(_on_block, pure=True)
            parts = [
                task(func, self._endog_from, z, x, y, *args)
                for z, x, y in zip(self.Z.to_delayed().ravel(), self._X.to_delayed().ravel(),
                                   self.Y.to_delayed().ravel())
            ]
            return list(dask.compute(*parts))


    def _map_grouped(self, func, level, *args):
        import dask

        with one_pass():
            codes = self.groups.codes(level).rechunk({0: self.Z.chunks[0]}).to_delayed().ravel()
            task = dask.delayed(_on_grouped_block, pure=True)
            parts = [
                task(func, self._endog_from, z, x, y, c, *args)
                for z, x, y, c in zip(self.Z.to_delayed().ravel(), self._X.to_delayed().ravel(),
                                      self.Y.to_delayed().ravel(), codes)
            ]
            return list(dask.compute(*parts))


def _on_grouped_block(func, endog_from: int, Z, X, Y, codes, *args):
    """:func:`_on_block` for a grouped block function: the block's groups start where its codes change."""

    return _on_block(func, endog_from, Z, X, Y, starts_of(np.asarray(codes)), *args)


class _PlacedBlocks:
    """Row blocks persisted on a distributed cluster, grouped by the worker that holds them.

    A pass submits one task per worker thread, pinned to that worker (other workers may take it if it
    leaves), over a contiguous share of the blocks whose Z the worker holds, after :func:`balanced_owners` has
    evened out the rows per worker thread (:func:`task_shares`: a share is cut further only where its task would
    fetch more than :data:`_FETCHED_BLOCKS_PER_TASK` blocks held elsewhere, which it holds in memory together;
    the blocks a worker holds cost it no memory).
    On a 2-worker LocalCluster a pass over 10⁷ rows in 50 blocks took 0.30 s this way against 0.44 s with one
    task per block (the threaded scheduler: 0.23 s; ``benchmarks/cluster_pass.py``): the scheduler's cost per
    task, not the kernels, made the difference. That cost is about 5 ms a task on a 2-core machine (8 tasks
    that do nothing: 38–45 ms a pass), so a worker's blocks are one task, not one per 8 blocks.
    """

    def __init__(self, client, blocks: list[tuple], groups: list[tuple[str, list[int]]], endog_from: int) -> None:
        self.client, self.blocks, self.groups, self.endog_from = client, blocks, groups, endog_from

    @classmethod
    def of(cls, Z, X, Y, endog_from: int = 0) -> _PlacedBlocks | None:
        """The blocks of Z, X and Y (aligned on the rows) when all three are persisted on the client that Dask's
        current scheduler is; None otherwise."""
        if "distributed" not in sys.modules:
            return None
        from dask.base import get_scheduler
        from distributed import default_client, wait

        try:
            client = default_client()
        except ValueError:  # no client
            return None
        if get_scheduler() != client.get:
            return None
        columns = [_block_futures(array) for array in (Z, X, Y)]
        if any(futures is None for futures in columns):
            return None
        blocks = list(zip(*columns))
        wait([future for block in blocks for future in block])  # persisted, perhaps not computed yet
        holders = client.who_has([future for block in blocks for future in block])
        owners = [min(holders.get(z.key, ())) if holders.get(z.key) else None for z, _, _ in blocks]
        if None in owners:
            return None
        threads = client.nthreads()
        owners = balanced_owners(owners, [int(size) for size in Z.chunks[0]], threads)
        groups = []
        for worker in sorted(set(owners)):
            mine = [i for i, owner in enumerate(owners) if owner == worker]
            fetched = {i for i in mine if any(worker not in holders.get(future.key, ()) for future in blocks[i])}
            groups += [(worker, share) for share in task_shares(mine, fetched, threads.get(worker, 1))]
        return cls(client, blocks, groups, endog_from)

    def map(self, func, args: tuple) -> list:
        """``func(Z_block, X_endog_block, Y_block, *args)`` for every block, in block order."""
        futures = [self.client.submit(_on_blocks, func, self.endog_from, [self.blocks[i] for i in share], args,
                                      workers=[worker], allow_other_workers=True, pure=False)
                   for worker, share in self.groups]
        parts: list = [None] * len(self.blocks)
        for (_, share), results in zip(self.groups, self.client.gather(futures)):
            for i, result in zip(share, results):
                parts[i] = result
        return parts


def balanced_owners(owners: list[str], rows: list[int], threads: dict[str, int]) -> list[str]:
    """The worker each block's task runs on: its holder's, except that blocks move from the most loaded worker
    (rows per thread) to the least loaded one, the holder's last blocks first, while that lowers the larger of
    the two loads.

    Persisted blocks are rarely spread evenly (a 10-block array on a 2-worker LocalCluster was held 7/3 and
    4/6), and a pass waits for its busiest worker. A moved block is fetched by the first pass that runs on its
    new worker; the cluster's active memory manager then drops one of the two replicas, the one on the worker
    with more memory, usually the one it moved from (otherwise a later pass fetches the block again, at most once per
    run of the memory manager, every 2 s by default).

    Parameters
    ----------
    owners : list of str
        The worker holding each block (its Z block).
    rows : list of int
        Each block's rows.
    threads : dict
        Threads of every worker of the cluster (workers holding no block included, so that they take some).
    """
    placed = list(owners)
    load = {worker: 0.0 for worker in threads}
    for owner, size in zip(owners, rows):
        load[owner] = load.get(owner, 0.0) + size / threads.get(owner, 1)
    for _ in range(len(placed) * len(load)):  # each move lowers the busiest load; at most this many are useful
        busiest = max(load, key=lambda w: (load[w], w))
        idlest = min(load, key=lambda w: (load[w], w))
        mine = [i for i, owner in enumerate(placed) if owner == busiest]
        if busiest == idlest or not mine:
            break
        block = mine[-1]
        after_busiest = load[busiest] - rows[block] / threads.get(busiest, 1)
        after_idlest = load[idlest] + rows[block] / threads.get(idlest, 1)
        if max(after_busiest, after_idlest) >= load[busiest]:
            break
        placed[block] = idlest
        load[busiest], load[idlest] = after_busiest, after_idlest
    return placed


def _block_futures(array) -> list | None:
    """The futures of a persisted Dask array's blocks, in row order (the array must have one block per row
    range), or None when some block is still a computation."""
    from distributed import futures_of

    by_key = {future.key: future for future in futures_of(array)}
    keys = _flat_keys(array.__dask_keys__())
    if len(keys) != array.numblocks[0] or not all(key in by_key for key in keys):
        return None
    return [by_key[key] for key in keys]


def _flat_keys(keys) -> list:
    if isinstance(keys, list):
        return [key for part in keys for key in _flat_keys(part)]
    return [keys]


#: Most blocks held by another worker that one task of :class:`_PlacedBlocks` fetches (their copies are held in
#: its memory together while it runs).
_FETCHED_BLOCKS_PER_TASK = 8


def task_shares(mine: list[int], fetched: set[int], threads: int) -> list[list[int]]:
    """The tasks of one worker in a pass of :class:`_PlacedBlocks`: its blocks ``mine`` (increasing) cut into one
    contiguous share per thread (at most one per block), each cut again before the block that would make its
    task fetch more than :data:`_FETCHED_BLOCKS_PER_TASK` of the blocks in ``fetched`` (held elsewhere)."""
    shares = []
    for share in np.array_split(np.array(mine, dtype=np.int64), min(len(mine), threads)):
        piece: list[int] = []
        count = 0
        for i in (int(i) for i in share):
            if i in fetched and count == _FETCHED_BLOCKS_PER_TASK:
                shares.append(piece)
                piece, count = [], 0
            piece.append(i)
            count += i in fetched
        shares.append(piece)
    return shares


def _on_blocks(func, endog_from: int, blocks: list[tuple], args: tuple) -> list:
    """:func:`_on_block` over several blocks in one task (in a Dask worker), the results in the blocks' order."""
    return [_on_block(func, endog_from, Z, X, Y, *args) for Z, X, Y in blocks]


def _on_block(func, endog_from: int, Z, X, Y, *args):
    """Run a kernel on one block (in a Dask worker), X's columns from ``endog_from`` on as X_endog. Blocks arrive
    as numpy arrays of any layout, often column slices of one block of rows; the kernels read strided rows, so
    they are not copied."""
    return func(np.asarray(Z, dtype=np.float64), np.asarray(X, dtype=np.float64)[:, endog_from:],
                np.asarray(Y, dtype=np.float64), *args)


def _in_blocks(Z, X_endog, Y, func, *args) -> tuple:
    """``func`` over consecutive blocks of DESIGN_BLOCK_ROWS rows of one piece, the parts added pairwise: each call
    sums at most that many rows' terms (:mod:`dpivreg.privacy.rounding`), and block functions written with numpy make
    row-length temporaries, which then stay cache-sized."""
    if Z.shape[0] <= DESIGN_BLOCK_ROWS:
        return func(Z, X_endog, Y, *args)
    return _add([func(Z[rows], X_endog[rows], Y[rows], *args) for rows in row_blocks(Z.shape[0], DESIGN_BLOCK_ROWS)])


def _in_group_blocks(Z, X_endog, Y, starts, func, *args) -> tuple:
    """A grouped block function ``func(Z, X_endog, Y, starts, *args)`` over consecutive blocks of at most
    DESIGN_BLOCK_ROWS whole groups of one piece (``starts``: the groups' offsets in the piece), the parts added
    pairwise: each call sums at most that many groups' terms (:mod:`dpivreg.privacy.rounding`)."""
    starts = np.asarray(starts, dtype=np.int64)
    if starts.shape[0] <= DESIGN_BLOCK_ROWS:
        return func(Z, X_endog, Y, starts, *args)
    cuts = np.append(starts[::DESIGN_BLOCK_ROWS], Z.shape[0])
    return _add([func(Z[a:b], X_endog[a:b], Y[a:b], starts[(starts >= a) & (starts < b)] - a, *args)
                 for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist())])


def row_blocks(n: int, block_rows: int = DESIGN_BLOCK_ROWS) -> list[slice]:
    """Consecutive slices of ``block_rows`` rows (the last one shorter) covering range(n)."""
    return [slice(a, min(a + block_rows, n)) for a in range(0, n, block_rows)]


def _add(parts: list[tuple]) -> tuple:
    """Element-wise sum of tuples of arrays, pairwise in list order (:func:`dpivreg.privacy.rounding.pairwise_sum`)."""
    return pairwise_sum(parts)
