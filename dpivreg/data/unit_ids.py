"""Which unit and which cluster each row of a design belongs to: the ids read from the data (or given), coded, checked
and truncated to at most m rows per unit (:func:`resolve_units`; on Dask :func:`dpivreg.data.dask_units.dask_units`).

These functions read the rows' ids: the grouping stays inside the privacy boundary and only shapes the sums of the
releases (:mod:`dpivreg.privacy.units` holds what the grouping means for privacy).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import pandas as pd

from dpivreg.data.dask_units import dask_units
from dpivreg.errors import DATA_CHECK_NOTE
from dpivreg.privacy.units import (
    PrivacyUnits,
    RowGroups,
    UnitFacts,
    check_max_rows,
    row_keys,
    starts_of,
    unit_label,
)

__all__ = ["resolve_units"]


def resolve_units(design, *, privacy_unit: Any, clusters: Any, max_rows_per_unit: Any, data: Any,
                  seed: int) -> PrivacyUnits | None:
    """The fit's :class:`PrivacyUnits` for an in-memory design, or None for row-level privacy without clusters (a Dask
    design's: :func:`dpivreg.data.dask_units.dask_units`).

    The number of units N (and of clusters G) is counted over every row of the data the model was built from,
    the rows that a missing value dropped included: it is the public count. Dropping a row is a function of that
    row alone, so at unit level it changes only its unit's contribution (a unit whose rows were all dropped
    contributes nothing): no leak, unlike the row count at row level.

    Parameters
    ----------
    design : IVDesign
        The model's design (its rows are those kept by the missing-value policy).
    privacy_unit, clusters : column name, array-like or None
        A column of ``data`` (the frame the model was built from), or values with one entry per row of that
        frame (or of the arrays given to the constructor). Missing values are errors: every row must belong to a
        unit and cluster.
    max_rows_per_unit : int
        m (public).
    data : pandas.DataFrame or None
        The model's data frame, if it was built from one.
    seed : int
        The truncation's key seed (drawn from the fit's random stream).
    """
    if privacy_unit is None and clusters is None:
        return None
    m = 1 if privacy_unit is None else check_max_rows(max_rows_per_unit)
    if getattr(design, "is_dask", False):
        return dask_units(design, data=data, privacy_unit=privacy_unit, clusters=clusters, max_rows=m, seed=seed)
    n = design.nobs
    positions = getattr(design, "source_rows", None)  # the design's rows in the source (None: all, in order)
    unit_name = None if privacy_unit is None else unit_label(privacy_unit)
    n_units, unit_codes = n, np.arange(n, dtype=np.int64)  # at row level a row is the unit
    if privacy_unit is not None:
        n_units, unit_codes = _codes(_ids(privacy_unit, "privacy_unit", design, data), "privacy_unit", unit_name,
                                     positions)
    cluster_name = None if clusters is None else unit_label(clusters)
    same = clusters is not None and privacy_unit is not None and _same_column(clusters, privacy_unit)
    n_clusters, cluster_codes = (n_units, unit_codes) if same else (None, None)  # by the unit: nothing more to do
    if clusters is not None and not same:
        ids = _ids(clusters, "clusters", design, data)
        n_clusters, cluster_codes = _codes(ids, "clusters", cluster_name, positions)
        if privacy_unit is not None:
            _check_nested(_ids(privacy_unit, "privacy_unit", design, data), ids, unit_name, cluster_name)
    if n_clusters is not None and n_clusters < 2:
        raise ValueError(f"clusters {cluster_name!r} has {n_clusters} group: a clustered covariance needs at least "
                         f"two. {DATA_CHECK_NOTE}")
    primary = [unit_codes] if cluster_codes is None or same else [unit_codes, cluster_codes]
    truncated = dropped = 0
    if privacy_unit is not None and int(np.bincount(unit_codes).max()) > m:
        # the rows each unit keeps: the m with the smallest keys (independent of the data)
        order = np.lexsort([row_keys(seed, np.arange(n)), *primary])
        unit_starts = _starts(unit_codes[order])
        sizes = np.diff(unit_starts)
        kept = np.arange(n, dtype=np.int64) - np.repeat(unit_starts[:-1], sizes) < m
        truncated, dropped = int(np.count_nonzero(sizes > m)), int(n - np.count_nonzero(kept))
        order = order[kept]
    else:
        order = np.argsort(primary[0], kind="stable") if len(primary) == 1 else np.lexsort(primary)
    unit_starts = _starts(unit_codes[order]) if privacy_unit is not None else None
    cluster_starts = None
    if cluster_codes is not None:
        cluster_starts = unit_starts if same else _starts(cluster_codes[order])
    facts = UnitFacts(unit_name, int(n_units), m, cluster_name, n_clusters)
    groups = RowGroups(unit_starts, cluster_starts, int(order.size), int(n_units), n_clusters)
    return PrivacyUnits(facts, order.astype(np.int64), groups, truncated, dropped)


def _same_column(a: Any, b: Any) -> bool:
    if isinstance(a, Hashable) and isinstance(b, Hashable) and not isinstance(a, (pd.Series, np.ndarray)):
        try:
            return bool(a == b)
        except Exception:  # noqa: BLE001 - an odd label
            return False
    return a is b


def _ids(value: Any, argument: str, design, data: Any) -> np.ndarray:
    """The ids of every row of the source data (the frame the model was built from, or the arrays given to the
    constructor): a column of ``data`` or values with one entry per source row."""
    source_rows = design.nobs + design.n_dropped
    if isinstance(value, Hashable) and not isinstance(value, (np.ndarray, pd.Series, pd.Index)):
        if data is None or not hasattr(data, "columns"):
            raise TypeError(f"{argument}={value!r} names a column, but the model was not built from a data frame: "
                            f"pass the ids as an array with one entry per row (of length {source_rows}).")
        if value not in data.columns:
            raise ValueError(f"{argument}={value!r} is not a column of the data (columns: "
                             f"{list(data.columns)[:20]}{' ...' if len(data.columns) > 20 else ''}).")
        if list(data.columns).count(value) > 1:
            raise ValueError(f"{argument}={value!r} names {list(data.columns).count(value)} columns of the data "
                             "(duplicated column names): rename or drop the duplicates, e.g. "
                             "data.loc[:, ~data.columns.duplicated()].")
        values = data[value].to_numpy()
    else:
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            raise TypeError(f"{argument} must be a column name or an array with one id per row, got "
                            f"{type(value).__name__}.")
        values = np.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value)
    if values.ndim != 1 or values.shape[0] != source_rows:
        raise ValueError(f"{argument} must have one id per row of the data ({source_rows} rows), got shape "
                         f"{values.shape}.")
    return values


def _codes(values: np.ndarray, argument: str, name: str | None, positions: np.ndarray | None) -> tuple[int, np.ndarray]:
    """The number of distinct ids over every source row (public: N or G), and the integer codes 0 … N − 1 (first
    appearance order) of the design's rows (``positions`` in the source; None: all rows). A missing id is an error."""
    try:
        codes, uniques = pd.factorize(values, use_na_sentinel=True)
    except TypeError as error:  # lists, dicts, sets: not hashable, so not ids
        raise TypeError(f"{argument} {name!r} holds values that cannot be ids ({error}): each row's id must be a "
                        "number or a string (e.g. convert lists with .map(tuple) or .astype(str)).") from None
    missing = int(np.count_nonzero(codes < 0))
    if missing:
        raise ValueError(f"{argument} {name!r} is missing in {missing:,} of the data's rows: every row must belong "
                         f"to a unit (cluster). Fill the ids, or drop those rows before building the model. "
                         f"{DATA_CHECK_NOTE}")
    codes = codes.astype(np.int64)
    return len(uniques), codes if positions is None else codes[positions]


def _starts(sorted_codes: np.ndarray) -> np.ndarray:
    """Offsets of the runs of equal values in ``sorted_codes`` (grouped), with the length appended."""
    return np.append(starts_of(sorted_codes), sorted_codes.shape[0]).astype(np.int64)


def _check_nested(units: np.ndarray, clusters: np.ndarray, unit: str | None, cluster: str | None) -> None:
    """Every unit lies in one cluster, over every source row: as many distinct (unit, cluster) pairs as units
    (checked before any row is dropped or truncated, which could hide a unit's rows in a second cluster)."""
    unit_codes, cluster_codes = pd.factorize(units)[0], pd.factorize(clusters)[0]
    pairs = np.unique(unit_codes.astype(np.int64) * (int(cluster_codes.max()) + 1) + cluster_codes).shape[0]
    if pairs != int(unit_codes.max()) + 1:
        raise ValueError(f"clusters {cluster!r} is not a grouping of the privacy unit {unit!r}: some unit has rows "
                         "in several clusters. Clusters must contain whole units (e.g. households within states), or "
                         f"leave clusters out to cluster by the unit itself. {DATA_CHECK_NOTE}")
