"""Privacy units and clusters of a Dask design: each partition's ids hashed, counted and bucketed on the workers, the
units truncated to at most m rows by the same seed-keyed rule as in memory, and the grouped rows the passes read
(:func:`dask_units`, the Dask counterpart of :func:`dpivreg.data.unit_ids.resolve_units`). Reads the ids (raw
data): only counts and sums leave the workers.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Hashable
from typing import Any

import numpy as np
import pandas as pd

from dpivreg.compute.backends import add_parts, one_pass, unfused_dask
from dpivreg.data.cross_products import ColumnFactor
from dpivreg.data.dask_design import DaskIVDesign, blockwise_sum, dask_r_factor
from dpivreg.errors import DATA_CHECK_NOTE
from dpivreg.privacy.units import DaskGroups, PrivacyUnits, UnitFacts, row_keys, starts_of, unit_label


# ---------------------------------------------------------------------------
# Privacy units (dpivreg.privacy.units): hash the ids, shuffle once, group per partition
# ---------------------------------------------------------------------------
def _id_hashes(ids: Any) -> tuple[np.ndarray, int]:
    """64-bit hashes of ids by value (pandas' ``hash_array``: the same in every process) and the number of missing
    ids. Equal values hash alike whatever a partition's dtype, as ``pd.factorize`` codes a pandas column: an id
    read as int64 in one partition and as float64 in another (a CSV column with a missing value in that partition
    only), or held as a Python int in an object column, is one unit (3, 3.0 and True are one id; the string "3",
    3.5 and 2⁶³ + 1 as an exact integer are others)."""
    values = np.asarray(ids.to_numpy() if hasattr(ids, "to_numpy") else ids)
    missing = np.asarray(pd.isna(values), dtype=bool)
    hashes = np.zeros(values.shape[0], dtype=np.uint64)
    present = values[~missing]
    if values.dtype.kind in "biu":
        hashes[~missing] = _integer_hashes(present)
    elif values.dtype.kind == "f":
        hashes[~missing] = _float_hashes(present)
    else:
        hashes[~missing] = _object_hashes(present.astype(object))
    return hashes, int(missing.sum())


#: Added to the hashes of ids in the other domains, so that an integer, a non-integral number and an integer
#: beyond int64 cannot share a hash by sharing their 64 bits (different constants, arbitrary odd numbers).
_UINT_DOMAIN, _FLOAT_DOMAIN, _BIG_DOMAIN = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F),
                                            np.uint64(0x165667B19E3779F9))


def _integer_hashes(values: np.ndarray) -> np.ndarray:
    """Hashes of integers (booleans included) by value: int64's range as int64, the rest of uint64's apart."""
    values = np.asarray(values)
    if values.dtype.kind != "u":
        return pd.util.hash_array(values.astype(np.int64))
    small = values <= np.iinfo(np.int64).max
    out = np.empty(values.shape[0], dtype=np.uint64)
    out[small] = pd.util.hash_array(values[small].astype(np.int64))
    out[~small] = pd.util.hash_array(values[~small].astype(np.uint64)) + _UINT_DOMAIN
    return out


def _float_hashes(values: np.ndarray) -> np.ndarray:
    """Hashes of floats by value: an integral one as that integer (:func:`_python_int_hashes`), the others (fractions,
    infinities) by their float64 bits in a domain of their own."""
    values = np.asarray(values, dtype=np.float64)
    integral = np.isfinite(values) & (values == np.round(values))
    small = integral & (np.abs(values) < 2.0**63)
    out = np.empty(values.shape[0], dtype=np.uint64)
    out[small] = pd.util.hash_array(values[small].astype(np.int64))
    out[integral & ~small] = _python_int_hashes([int(v) for v in values[integral & ~small]])
    out[~integral] = pd.util.hash_array(values[~integral]) + _FLOAT_DOMAIN
    return out


def _python_int_hashes(values: list[int]) -> np.ndarray:
    """Hashes of Python ints of any size, equal to :func:`_integer_hashes` of the same values."""
    out = np.empty(len(values), dtype=np.uint64)
    if not values:
        return out
    low, high = -(2**63), 2**64 - 1
    fits = np.array([low <= v <= high for v in values], dtype=bool)
    if fits.any():
        kept = [v for v, f in zip(values, fits) if f]
        signed = np.array([v if v < 2**63 else 0 for v in kept], dtype=np.int64)
        unsigned = np.array([v if v >= 2**63 else 0 for v in kept], dtype=np.uint64)
        big = unsigned > 0
        hashed = pd.util.hash_array(signed)
        hashed[big] = pd.util.hash_array(unsigned[big]) + _UINT_DOMAIN
        out[fits] = hashed
    if (~fits).any():
        out[~fits] = pd.util.hash_array(np.array([str(v) for v, f in zip(values, fits) if not f], dtype=object)) \
            + _BIG_DOMAIN
    return out


def _object_hashes(values: np.ndarray) -> np.ndarray:
    """Hashes of an object column's ids: integers (bool, numpy and Python ints) and integral floats by their
    integer value, other floats by their bits, anything else (strings, dates, …) by pandas' hash of the value."""
    if pd.api.types.infer_dtype(values, skipna=True) not in ("integer", "floating", "mixed-integer-float",
                                                             "mixed-integer", "mixed", "boolean", "decimal"):
        return pd.util.hash_array(values)  # no number among them (strings, dates, …)
    out = np.empty(values.shape[0], dtype=np.uint64)
    integer = np.array([isinstance(v, (bool, np.bool_, numbers.Integral)) for v in values], dtype=bool)
    floating = np.array([isinstance(v, (float, np.floating)) for v in values], dtype=bool) & ~integer
    other = ~integer & ~floating
    if integer.any():
        out[integer] = _python_int_hashes([int(v) for v in values[integer]])
    if floating.any():
        out[floating] = _float_hashes(np.array([float(v) for v in values[floating]]))
    if other.any():
        out[other] = pd.util.hash_array(values[other])
    return out


def _unit_buckets(raw: np.ndarray, part: pd.DataFrame, unit_name: Hashable | None, cluster_name: Hashable | None,
                  offset: int, seed: int, buckets: int) -> list:
    """One source partition's kept design rows, with their unit's and cluster's hashes and truncation keys (the keys
    of :func:`dpivreg.privacy.units.row_keys` at the rows' positions in the design, as in memory), split into
    ``buckets`` by the hash of the cluster (which contains the unit): (values, units, clusters, keys) per bucket; then
    the partition's census over ALL its rows (the dropped ones too: the public counts N and G are over the whole data):
    its distinct unit and cluster hashes, (unit, cluster) pairs and missing ids. The ids are the partition's columns
    ``unit_name`` and ``cluster_name``; ``unit_name`` None: each row is its own unit (its design position its id)."""
    unit_ids = None if unit_name is None else part[unit_name]
    cluster_ids = None if cluster_name is None else part[cluster_name]

    kept = ~np.isnan(raw).any(axis=1)
    values = raw[kept]
    positions = offset + np.arange(values.shape[0])
    census = {"units": np.zeros(0, np.uint64), "clusters": np.zeros(0, np.uint64), "pairs": np.zeros((0, 2), np.uint64),
              "missing": 0}
    if unit_ids is None:
        units = pd.util.hash_array(positions)
    else:
        all_units, census["missing"] = _id_hashes(unit_ids)
        units = all_units[kept]
        census["units"] = np.unique(all_units)
    clusters = units
    if cluster_ids is not None:
        all_clusters, missing_clusters = _id_hashes(cluster_ids)
        clusters = all_clusters[kept]
        census["missing"] += missing_clusters
        census["clusters"] = np.unique(all_clusters)
        if unit_ids is not None:
            census["pairs"] = np.unique(np.column_stack([all_units, all_clusters]), axis=0)
    keys = row_keys(seed, positions)
    target = clusters % np.uint64(buckets)
    return [*[(values[target == b], units[target == b], clusters[target == b], keys[target == b])
              for b in range(buckets)], census]


def _group_bucket(pieces: list, max_rows: int, d: int) -> dict:
    """One bucket of every source partition, grouped: rows sorted by (cluster, unit, key), each unit's first
    ``max_rows`` kept (the truncation); with its counts of rows, truncated units and dropped rows."""
    values = np.concatenate([p[0] for p in pieces]) if pieces else np.empty((0, d))
    units, clusters, keys = (np.concatenate([p[i] for p in pieces]) for i in (1, 2, 3))
    order = np.lexsort([keys, units, clusters])
    values, units, clusters = values[order], units[order], clusters[order]
    change = np.concatenate([[True], (units[1:] != units[:-1]) | (clusters[1:] != clusters[:-1])]) if units.size \
        else np.zeros(0, dtype=bool)
    starts = np.flatnonzero(change)
    sizes = np.diff(np.append(starts, units.size))
    kept = np.arange(units.size) - np.repeat(starts, sizes) < max_rows
    return {"values": values[kept], "units": units[kept], "clusters": clusters[kept], "rows": int(kept.sum()),
            "truncated": int(np.count_nonzero(sizes > max_rows)),
            "dropped": int(np.sum(np.maximum(sizes - max_rows, 0)))}


def _field(result: dict, name: str):
    return result[name]


def _bucket_stats(result: dict) -> dict:
    """A grouped bucket's counts, without its rows (what reaches the driver)."""
    return {k: v for k, v in result.items() if k not in ("values", "units", "clusters")}


class DaskGroupedRows:
    """A Dask design's kept rows grouped by privacy unit and cluster (units truncated), for the passes of a fit: the
    counterpart of :class:`dpivreg.data.design.ReorderedDesign`. ``values`` (lazy, or persisted with the design) holds
    whole units and clusters in each block; ``groups`` the per-row hashes
    (:class:`dpivreg.privacy.units.DaskGroups`)."""

    def __init__(self, design: DaskIVDesign, values: Any, groups: Any, nobs: int) -> None:
        self._design, self.values, self.groups, self._nobs = design, values, groups, nobs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._design, name)

    @property
    def nobs(self) -> int:
        """The kept rows (PRIVATE with privacy units)."""
        return self._nobs

    def blockwise_sum(self, func: Any, *args: Any) -> Any:
        """Σ over the grouped blocks of ``func(block, *args)``, in ONE pass."""
        return blockwise_sum(self.values, func, *args)

    def grouped_sum(self, func: Any, level: str, *args: Any) -> Any:
        """Σ over the grouped blocks of ``func(block, starts, *args)``, ``starts`` the block's groups of ``level``."""
        import dask  # noqa: PLC0415

        with one_pass():
            blocks = self.values.to_delayed().ravel()
            codes = self.groups.codes(level).to_delayed().ravel()
            return add_parts(list(dask.compute(*[dask.delayed(_on_grouped_rows)(func, block, code, *args)
                                                 for block, code in zip(blocks, codes)])))

    @property
    def factor(self) -> ColumnFactor:
        """The kept rows' triangular factor (NON-PRIVATE; TSQR in one pass)."""
        scale = self._design.stats.scale
        return ColumnFactor(scale, dask_r_factor(self.values / scale))


def _on_grouped_rows(func: Any, block: np.ndarray, codes: np.ndarray, *args: Any) -> Any:

    return func(np.asarray(block, dtype=np.float64), starts_of(np.asarray(codes)), *args)


def dask_units(design: DaskIVDesign, *, data: Any, privacy_unit: Any, clusters: Any, max_rows: int, seed: int):
    """The fit's :class:`dpivreg.privacy.units.PrivacyUnits` for a Dask design built from a formula on ``data``.

    The units' (and clusters') ids are read on the design's rows and hashed (pandas' ``hash_array``, the same in every
    process; two ids of equal hash, about one chance in 10⁸ for 10⁵ units, would be grouped as one unit, which
    protects both); the rows are shuffled by the cluster's hash (the unit's without clusters) into as many blocks as
    the design has partitions, so that every unit and cluster lies in one block, then sorted and truncated per block:
    the grouping is built once, persisted when the design is (``model.persist()``; otherwise every pass recomputes
    the shuffle, and a warning says so). The counts are the in-memory ones; the truncation keeps the same rows (the
    keys are a function of the seed and the row's position in the design).
    """
    import dask  # noqa: PLC0415
    import dask.array as da  # noqa: PLC0415


    if not design.partitions or data is None or not hasattr(data, "columns"):
        raise ValueError("privacy_unit and clusters on Dask need a model built with DPIV2SLS.from_formula(formula, "
                         "ddf) and column names of that Dask DataFrame; for Dask arrays, build the frame first.")
    names = []
    for argument, value in (("privacy_unit", privacy_unit), ("clusters", clusters)):
        if value is None:
            names.append(None)
            continue
        if not isinstance(value, Hashable):
            raise ValueError(f"{argument} on Dask must be one of the column names of that Dask DataFrame, got "
                             f"{type(value).__name__} (ids as arrays are for in-memory models).")
        if value not in data.columns:
            raise ValueError(f"{argument}={value!r} must name a column of the Dask DataFrame (columns: "
                             f"{list(data.columns)[:20]}).")
        names.append(value)
    unit_name, cluster_name = names
    # the frame's own partitions, those the design was built from (a column's to_delayed() may merge partitions: a
    # projected parquet read does)
    frames = list(data.to_delayed())
    if len(design.partitions) != len(frames):
        raise ValueError("the Dask DataFrame's partitions changed since the model was built: build the model again.")
    parts = len(design.partitions)
    other_clusters = None if cluster_name is None or cluster_name == unit_name else cluster_name
    offsets = np.concatenate([[0], np.cumsum([m for _, m in design.partitions])[:-1]])
    d = len(design.column_names)
    split = [dask.delayed(_unit_buckets, nout=parts + 1)(raw, frames[i], unit_name, other_clusters, int(offsets[i]),
                                                          seed, parts)
             for i, (raw, _) in enumerate(design.partitions)]
    row_level = unit_name is None
    grouped = [dask.delayed(_group_bucket)([split[i][b] for i in range(parts)], max_rows, d) for b in range(parts)]
    if design.persisted:
        with unfused_dask():
            grouped = list(dask.persist(*grouped))
    else:
        warnings.warn("grouping the rows by privacy unit on Dask shuffles them, and every pass of the fit repeats the "
                      "shuffle unless the model is persisted first: model.persist().fit(...) groups them once (it "
                      "needs the data's size in the cluster's memory).", UserWarning, stacklevel=4)
    with one_pass():
        stats, census = dask.compute([dask.delayed(_bucket_stats)(g) for g in grouped],
                                     [split[i][parts] for i in range(parts)])
    if any(c["missing"] for c in census):
        which = "privacy_unit" if unit_name is not None else "clusters"
        raise ValueError(f"{which} has missing ids in the data's rows: every row must belong to a unit (cluster). "
                         f"Fill the ids, or drop those rows before building the model. {DATA_CHECK_NOTE}")
    n_units = design.nobs if row_level else len(np.unique(np.concatenate([c["units"] for c in census])))
    n_clusters = None
    if cluster_name is not None:
        n_clusters = n_units if cluster_name == unit_name else len(np.unique(np.concatenate([c["clusters"]
                                                                                            for c in census])))
    if not row_level and cluster_name not in (None, unit_name):
        if len(np.unique(np.concatenate([c["pairs"] for c in census]), axis=0)) != n_units:
            raise ValueError(f"clusters {cluster_name!r} is not a grouping of the privacy unit {unit_name!r}: some "
                             "unit has rows in several clusters. Clusters must contain whole units, or leave clusters "
                             f"out to cluster by the unit itself. {DATA_CHECK_NOTE}")
    if n_clusters is not None and n_clusters < 2:
        raise ValueError(f"clusters {cluster_name!r} has {n_clusters} group: a clustered covariance needs at least "
                         f"two. {DATA_CHECK_NOTE}")
    rows = [s["rows"] for s in stats]
    blocks = [(g, int(m)) for g, m in zip(grouped, rows) if m > 0]

    def column(name: str, shape_tail: tuple, dtype) -> Any:
        pieces = [da.from_delayed(dask.delayed(_field)(g, name), shape=(m, *shape_tail), dtype=dtype)
                  for g, m in blocks]
        return pieces[0] if len(pieces) == 1 else da.concatenate(pieces, axis=0)

    values = column("values", (d,), np.float64)
    facts = UnitFacts(None if row_level else unit_label(unit_name), int(n_units),
                      1 if row_level else int(max_rows), None if cluster_name is None else unit_label(cluster_name),
                      n_clusters)
    groups = DaskGroups(column("units", (), np.uint64),
                        column("clusters", (), np.uint64) if cluster_name is not None else None,
                        facts.n_units, n_clusters, not row_level)
    return PrivacyUnits(facts, None, groups, sum(s["truncated"] for s in stats), sum(s["dropped"] for s in stats),
                        rows=DaskGroupedRows(design, values, groups, int(sum(rows))))
