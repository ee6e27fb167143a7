"""Dask support: lazy designs, preprocessing and the 2SLS benchmark for data larger than memory.

``DPIV2SLS.from_formula(formula, ddf)`` with a ``dask.dataframe.DataFrame`` and ``DPIV2SLS(...)``
with Dask arrays, DataFrames or Series build a :class:`DaskIVDesign`: the design specification
(formulaic's ``ModelSpec``, or patsy's ``DesignInfo``) is built ONCE from a synthetic non-empty
frame with the data's column types (``dask.dataframe.utils.meta_nonempty``, no data is read) and
applied per partition; rows
with a missing value are dropped per partition (row-wise, jointly, as on the pandas path). Nothing
is collected to the driver but small reductions:

* building the design: one pass (row counts, per-column minima and maxima, non-finite counts, the
  triangular factor R of the column-scaled design by TSQR, equality of instrument columns), from
  which the pandas path's checks are repeated with the same messages where possible (the rank
  from the singular values of R, which are those of the columns);
* ``fit``: one pass for the clipped values and the Analyze-Gauss moment release (route
  "private" or "data"; only the clipping counts on route "bounds"), then the engine's passes
  (one per iteration), then one pass for the private residual variance of the inference;
* the NON-PRIVATE benchmark: one pass (the cross-products ZᵀZ, ZᵀX, Zᵀy come from the design's
  pass) for the residuals and the robust (HC0) covariance's Σ zᵢzᵢᵀeᵢ².

The privacy releases, their noise and the order of the random draws are those of the pandas
path, so for the same seed the results agree up to the summation order.

The formula builders applied to each partition are in :mod:`dpivreg.data.dask_builders`. Dask is optional:
Dask itself is imported only inside the functions that receive a Dask collection, and :func:`is_dask_collection`
detects one without importing Dask.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from dpivreg.compute.backends import add_parts, one_pass, unfused_dask
from dpivreg.compute.backends import is_dask_collection as _is_dask_collection
from dpivreg.data.arrays import _numpy_columns
from dpivreg.data.boundary import BoundaryFacts, missing_policy
from dpivreg.data.builders import FORMULA_ENGINES, _formulaic_context
from dpivreg.data.checks import (
    _check_array_dtype,
    _check_column_dtype,
    _check_counts,
    _check_data_columns,
    _check_row_count,
    _check_unique_names,
    _constant_instrument_error,
    _duplicate_instrument_error,
    _formula_variables,
    check_declared_constant,
    declared_constant,
    factor_rank_findings,
    warn_findings,
)
from dpivreg.data.columns import _as_float_blocks
from dpivreg.data.cross_products import ColumnFactor, block_factor, combine_factors, r_factor
from dpivreg.data.dask_builders import (
    _apply,
    _check_dask_columns,
    _formulaic_builder,
    _patsy_builder,
    _quiet_sample,
    _ship,
)
from dpivreg.data.design import (
    _DesignNames,
    _emit_encoded_missing,
    _warn_dropped,
    apply_missing_policy,
    block_positions,
    formula_boundary,
)
from dpivreg.data.formula import _BLOCKS, _formula_factors, _split_formula

__all__ = ["DaskIVDesign", "is_dask_collection", "dask_design_from_formula", "dask_design_from_arrays"]


def is_dask_collection(obj: Any) -> bool:
    """Whether ``obj`` is a Dask collection (array, DataFrame, Series), without importing Dask if it is not loaded."""
    return _is_dask_collection(obj)


# ---------------------------------------------------------------------------
# The design
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DesignStats:
    """Column statistics of a Dask design from its building pass (NON-PRIVATE; never released).

    Attributes
    ----------
    minimum, maximum : ndarray (d,)
        Per-column extremes over the kept rows.
    scale : ndarray (d,)
        max |value| per column over the kept rows, 1 for an all-zero column.
    r : ndarray (d, d)
        The triangular factor R of a QR decomposition of the columns divided by ``scale``
        (V = QR, by TSQR over the partitions): V[:, S] = Q R[:, S], so R[:, S] has the singular
        values of any subset S of columns, and VᵀV = RᵀR.
    """

    minimum: np.ndarray
    maximum: np.ndarray
    scale: np.ndarray
    r: np.ndarray


@dataclass(frozen=True, eq=False)
class DaskIVDesign(BoundaryFacts, _DesignNames):
    """A validated IV design held lazily in a Dask array (the counterpart of :class:`~dpivreg.data.design.IVDesign`).

    Parameters
    ----------
    values : dask.array.Array
        ``nobs`` by ``d`` float64 with known row chunks and one column chunk, the columns in the
        order [dependent, exog, endog, instruments], rows with a missing value dropped.
    names : tuple of four tuples
        Column names of the dependent variable, exog, endog and instruments.
    nobs : int
        Number of rows (public in the privacy model).
    stats : DesignStats
        Column statistics of the building pass (non-private).
    formula, formula_engine : str, optional
        The formula and engine the design was built with (None for arrays).
    n_dropped : int
        Rows dropped because of a missing value.
    constant : Hashable, optional
        The exogenous column declared as the intercept (:func:`dpivreg.data.checks.declared_constant`).
    partitions : tuple
        The source's partitions as (delayed raw design with missing values kept, kept rows) pairs, for reading a
        privacy unit's ids on the same rows (:func:`dask_units`).
    persisted : bool
        Whether ``values`` were persisted (:meth:`persist`).
    missing, data_levels, zero_allowed, n_lost, data_columns, unit_columns, stateful
        Keyword-only: the privacy boundary's facts (:class:`dpivreg.data.boundary.BoundaryFacts`).
    """

    values: Any
    names: tuple[tuple[Hashable, ...], ...]
    nobs: int
    stats: DesignStats
    formula: str | None = None
    formula_engine: str | None = None
    n_dropped: int = 0
    constant: Hashable | None = None
    partitions: tuple = dataclasses.field(default=(), repr=False)
    persisted: bool = False

    is_dask: ClassVar[bool] = True
    __eq__ = object.__eq__  # by identity, not BoundaryFacts' comparison of the facts alone
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return (f"DaskIVDesign(dependent={self.dependent_name!r}, exog={self.exog_names}, endog={self.endog_names}, "
                f"instruments={self.instrument_names}, nobs={self.nobs}, partitions={self.values.numblocks[0]})")

    @property
    def dependent_name(self) -> Hashable:
        """Name of the dependent variable."""
        return self.names[0][0]

    @property
    def exog_names(self) -> list[Hashable]:
        """Names of the exogenous regressors."""
        return list(self.names[1])

    @property
    def endog_names(self) -> list[Hashable]:
        """Names of the endogenous regressors."""
        return list(self.names[2])

    @property
    def instrument_names(self) -> list[Hashable]:
        """Names of the excluded instruments."""
        return list(self.names[3])

    @property
    def factor(self) -> ColumnFactor:
        """The columns' triangular factor from the building pass (NON-PRIVATE, :mod:`dpivreg.data.cross_products`)."""
        return ColumnFactor(self.stats.scale, self.stats.r)

    @property
    def column_range(self) -> tuple[np.ndarray, np.ndarray]:
        """NON-PRIVATE per-column minimum and maximum from the building pass."""
        return self.stats.minimum, self.stats.maximum

    def blockwise_sum(self, func: Any, *args: Any) -> Any:
        """Σ over the row blocks of ``func(block, *args)``, in ONE pass (:func:`blockwise_sum`)."""
        return blockwise_sum(self.values, func, *args)

    @property
    def constant_name(self) -> Hashable | None:
        """Name of the exog column declared as the intercept, or None."""
        return self.constant

    @property
    def constant_value(self) -> float:
        """The value of :attr:`constant_name` (1.0 without a constant)."""
        if self.constant is None:
            return 1.0
        return float(self.stats.minimum[1 + self.exog_names.index(self.constant)])

    @property
    def has_constant(self) -> bool:
        """Whether the design declares an intercept (e.g. ``Intercept``)."""
        return self.constant is not None

    def block(self, name: str) -> Any:
        """One block (``"dependent"``, ``"exog"``, ``"endog"``, ``"instruments"``) as a lazy Dask DataFrame."""
        import dask.dataframe as dd  # noqa: PLC0415

        labels = list(self.names[_BLOCKS.index(name)])
        return dd.from_dask_array(self.values[:, self.positions[name]], columns=labels)

    @property
    def dependent(self) -> Any:
        """The dependent variable (lazy Dask DataFrame)."""
        return self.block("dependent")

    @property
    def exog(self) -> Any:
        """The exogenous regressors (lazy Dask DataFrame)."""
        return self.block("exog")

    @property
    def endog(self) -> Any:
        """The endogenous regressors (lazy Dask DataFrame)."""
        return self.block("endog")

    @property
    def instruments(self) -> Any:
        """The instruments (lazy Dask DataFrame)."""
        return self.block("instruments")

    def persist(self) -> "DaskIVDesign":
        """The same design with its float64 columns computed and kept in the cluster's memory.

        Every iteration of the fit is one pass over the design; persisting evaluates the formula
        (and reads the source) once instead of once per pass. Needs nobs × d × 8 bytes of
        (distributed) memory.
        """
        with unfused_dask():
            return dataclasses.replace(self, values=self.values.persist(), persisted=True)


# ---------------------------------------------------------------------------
# Per-partition work (top-level functions: they are shipped to the workers)
# ---------------------------------------------------------------------------


def _complete_rows(raw: np.ndarray) -> np.ndarray:
    """The rows of ``raw`` without a missing value."""
    return raw[~np.isnan(raw).any(axis=1)]


def _block_stats(raw: np.ndarray, widths: tuple[int, ...], pairs: tuple[tuple[int, int], ...]) -> dict:
    """Statistics of one partition of the raw design (missing values kept), see :func:`_combine`."""
    d = raw.shape[1]
    missing = np.isnan(raw).any(axis=1)
    clean = raw[~missing]
    finite = np.isfinite(clean)
    starts = np.cumsum((0,) + widths)
    bad_rows = [int(np.count_nonzero(~finite[:, a:b].all(axis=1))) if b > a else 0
                for a, b in zip(starts[:-1], starts[1:])]
    scale, r = block_factor(np.where(finite, clean, 0.0))  # infinite values are reported, not factored
    return {
        "n_raw": raw.shape[0],
        "n": clean.shape[0],
        "raw_min": np.fmin.reduce(raw, axis=0, initial=np.inf) if raw.size else np.full(d, np.inf),
        "raw_max": np.fmax.reduce(raw, axis=0, initial=-np.inf) if raw.size else np.full(d, -np.inf),
        "min": np.min(clean, axis=0, initial=np.inf),
        "max": np.max(clean, axis=0, initial=-np.inf),
        "bad_rows": np.array(bad_rows, dtype=np.int64),
        "scale": scale,
        "r": r,
        "equal": np.array([np.array_equal(clean[:, j], clean[:, i]) for j, i in pairs], dtype=bool),
    }


def _combine(parts: list[dict]) -> dict:
    """Combine the statistics of the partitions (sums, extremes, the rescaled cross-products)."""
    unit, r = combine_factors([(p["scale"], p["r"]) for p in parts])
    return {
        "n_raw": sum(p["n_raw"] for p in parts),
        "n": sum(p["n"] for p in parts),
        "lengths": [p["n"] for p in parts],
        "raw_min": np.min([p["raw_min"] for p in parts], axis=0),
        "raw_max": np.max([p["raw_max"] for p in parts], axis=0),
        "min": np.min([p["min"] for p in parts], axis=0),
        "max": np.max([p["max"] for p in parts], axis=0),
        "bad_rows": np.sum([p["bad_rows"] for p in parts], axis=0),
        "scale": unit,
        "r": r,
        "equal": np.all([p["equal"] for p in parts], axis=0),
        "encoded": _combine_encoded(parts),
        "lost_rows": sum(p.get("lost_rows", 0) for p in parts),
    }


def _combine_encoded(parts: list[dict]) -> tuple[np.ndarray, int] | None:
    if "encoded_columns" not in parts[0]:
        return None
    return (np.any([p["encoded_columns"] for p in parts], axis=0),
            int(sum(p["encoded_rows"] for p in parts)))


# ---------------------------------------------------------------------------
# Validation from the statistics (the checks of design._validate)
# ---------------------------------------------------------------------------


def _instrument_pairs(widths: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(instrument, other) column pairs whose equality the pandas path checks, in its order."""
    pos = block_positions(widths)
    pairs = []
    for j, col in enumerate(pos["instruments"]):
        pairs.extend((col, other) for other in pos["exog"])
        pairs.extend((col, other) for other in pos["instruments"][:j])
    return tuple(pairs)


def _validate(stats: dict, names: tuple[tuple[Hashable, ...], ...], zero_allowed: tuple[Hashable, ...] = ()
              ) -> list[str]:
    """The checks of :func:`dpivreg.data.design._drop_missing` and ``_validate`` from the pass's statistics: raise
    for what they raise, return the findings of :func:`dpivreg.data.checks._instrument_findings` and
    :func:`dpivreg.data.checks.rank_findings` (which do not stop a fit)."""
    total, nobs = stats["n_raw"], stats["n"]
    if total == 0:
        raise ValueError("the data have no rows; the design needs observations.")
    if nobs == 0:
        raise ValueError(
            f"no rows left: all {total} rows have a missing value in the dependent "
            "variable, the exogenous or endogenous regressors or the instruments."
        )
    widths = tuple(len(block) for block in names)
    pos = block_positions(widths)
    for b, block in enumerate(_BLOCKS):
        if stats["bad_rows"][b]:
            lo, hi = stats["min"][pos[block]], stats["max"][pos[block]]
            bad = [names[b][j] for j in range(widths[b]) if not (np.isfinite(lo[j]) and np.isfinite(hi[j]))]
            raise ValueError(
                f"{block} column(s) {bad} contain infinite values (e.g. log of 0) in "
                f"{stats['bad_rows'][b]} row(s); remove those rows or transform the variable."
            )
    n_dropped = total - nobs
    _check_row_count(nobs, widths[1] + widths[3], n_dropped)
    labels = {c: name for block, b in zip(_BLOCKS, range(4)) for c, name in zip(pos[block], names[b])}
    equal = dict(zip(_instrument_pairs(widths), stats["equal"]))
    exog = set(pos["exog"])
    zero = {c for c, name in labels.items()  # all-zero declared levels and indicators (dpivreg.data.boundary)
            if name in zero_allowed and stats["min"][c] == 0 and stats["max"][c] == 0}
    found = []
    for col in pos["instruments"]:
        if col in zero:
            continue
        if stats["min"][col] == stats["max"][col]:
            varied = bool(stats["raw_min"][col] < stats["raw_max"][col])
            found.append(str(_constant_instrument_error(labels[col], stats["min"][col], nobs, n_dropped, varied)))
            continue
        same = [other for other in pos["exog"] + [c for c in pos["instruments"] if c < col]
                if other not in zero and equal[(col, other)]]
        if same:
            found.append(str(_duplicate_instrument_error(labels[col], labels[same[0]],
                                                         "exog" if same[0] in exog else "instruments")))
    return found + factor_rank_findings(stats["r"], nobs, labels, pos, zero)


def _finish(raw_parts: list, stats_parts: list, names: tuple[tuple[Hashable, ...], ...], *, formula: str | None,
            formula_engine: str | None, source: str, stacklevel: int,
            encoded_columns: list[Hashable] | None = None, constant: Any = None,
            boundary: dict | None = None) -> DaskIVDesign:
    """Run the building pass, validate, warn and assemble the lazy design (``boundary``: the design's
    ``missing``, ``data_levels`` and ``zero_allowed``)."""
    import dask  # noqa: PLC0415
    import dask.array as da  # noqa: PLC0415

    if not stats_parts:
        raise ValueError("the data have no partitions; the design needs observations.")
    with one_pass():
        stats = _combine(list(dask.compute(*stats_parts)))
    boundary = boundary or {}
    findings = _validate(stats, names, boundary.get("zero_allowed", ()))
    declared = declared_constant(list(names[1]), constant)
    if declared is not None:
        j = 1 + list(names[1]).index(declared)
        check_declared_constant(declared, float(stats["min"][j]), float(stats["max"][j]))
    d = sum(len(block) for block in names)
    chunks = [
        da.from_delayed(dask.delayed(_complete_rows)(raw), shape=(m, d), dtype=np.float64,
                        meta=np.empty((0, d), dtype=np.float64))
        for raw, m in zip(raw_parts, stats["lengths"]) if m > 0
    ]
    values = chunks[0] if len(chunks) == 1 else da.concatenate(chunks, axis=0)
    design = DaskIVDesign(
        values=values, names=names, nobs=int(stats["n"]),
        stats=DesignStats(stats["min"], stats["max"], stats["scale"], stats["r"]),
        formula=formula, formula_engine=formula_engine, n_dropped=int(stats["n_raw"] - stats["n"]),
        constant=declared, n_lost=int(stats["lost_rows"]), partitions=tuple(zip(raw_parts, stats["lengths"])),
        data_findings=tuple(findings), **boundary,
    )
    _warn_dropped(design, source, stacklevel=stacklevel + 1)
    warn_findings(design.data_findings, stacklevel=stacklevel + 1)
    if stats["encoded"] is not None and encoded_columns:
        flags, n_rows = stats["encoded"]
        bad = [c for c, flag in zip(encoded_columns, flags) if flag]
        if bad:
            _emit_encoded_missing(bad, n_rows, stacklevel=stacklevel + 1)
    return design


# ---------------------------------------------------------------------------
# Formulas
# ---------------------------------------------------------------------------


def _formula_stats(part: pd.DataFrame, builder: Any, used: list[Hashable],
                   widths: tuple[int, ...], pairs: tuple[tuple[int, int], ...]) -> dict:
    """:func:`_block_stats` of a partition, plus which formula variables are missing in kept rows."""
    raw = builder(part)
    stats = _block_stats(raw, widths, pairs)
    kept = ~np.isnan(raw).any(axis=1)
    missing = part[used].isna().to_numpy()[kept] if used else np.zeros((int(kept.sum()), 0), dtype=bool)
    stats["encoded_columns"] = missing.any(axis=0)
    stats["encoded_rows"] = int(missing.any(axis=1).sum())
    complete = ~part[used].isna().any(axis=1).to_numpy() if used else np.ones(part.shape[0], dtype=bool)
    stats["lost_rows"] = int(np.count_nonzero(~kept & complete))  # dropped, yet no value was missing
    return stats


def dask_design_from_formula(formula: str, data: Any, *, context: Mapping[str, Any],
                             formula_engine: str = "formulaic", missing: str = "drop",
                             fill_values: Any = None, indicators: Any = ()) -> DaskIVDesign:
    """Build a lazy, validated IV design from a formula and a Dask DataFrame.

    Parameters
    ----------
    formula : str
        ``dependent ~ exog + [endog ~ instruments]`` as for
        :func:`dpivreg.data.design.design_from_formula`.
    data : dask.dataframe.DataFrame
        The data; never modified. Columns used as categories must have known categories.
    context : Mapping
        Variables and functions of the formula (the caller's namespace); only those the formula
        names are shipped to the workers.
    formula_engine : {"formulaic", "patsy"}
        As for pandas; each process rebuilds patsy's designs once from the same synthetic sample.
    missing, fill_values, indicators
        The missing-value policy, as for :func:`dpivreg.data.design.design_from_formula` (filled lazily).

    Returns
    -------
    DaskIVDesign

    Raises
    ------
    ValueError
        As :func:`dpivreg.data.design.design_from_formula`, and for text columns, categories with
        unknown categories and stateful transforms.
    """

    if formula_engine not in FORMULA_ENGINES:
        raise ValueError(
            f"formula_engine must be one of {list(FORMULA_ENGINES)}, got {formula_engine!r}."
        )
    if not isinstance(formula, str):
        raise TypeError(f"formula must be a string, got {type(formula).__name__}.")
    if not hasattr(data, "to_delayed") or not hasattr(data, "columns"):
        raise TypeError(f"data must be a dask.dataframe.DataFrame, got {type(data).__name__}.")
    from dask import delayed  # noqa: PLC0415
    from dask.dataframe.utils import meta_nonempty  # noqa: PLC0415

    policy = missing_policy(missing, fill_values, indicators)
    parts = _split_formula(formula)
    meta = data._meta

    _check_dask_columns(meta, parts, formula_engine, _formulaic_context(context))
    _check_data_columns(meta, parts)
    formula, data, parts, added = apply_missing_policy(formula, data, parts, policy)
    meta = data._meta
    _ship(set(_formula_factors(parts)) - set(meta.columns), _formulaic_context(context))  # no arrays
    sample = meta_nonempty(meta)
    if formula_engine == "formulaic":
        builder = _formulaic_builder(sample, parts, context)
    else:
        builder = _patsy_builder(sample, parts, context)
    with _quiet_sample():
        sample_blocks = builder.frames(sample)
    _check_counts(sample_blocks)
    _as_float_blocks(sample_blocks)  # complex-valued blocks
    _check_unique_names(sample_blocks)
    names = tuple(tuple(sample_blocks[block].columns) for block in _BLOCKS)
    widths = tuple(len(block) for block in names)
    pairs = _instrument_pairs(widths)
    used = _formula_variables(parts, meta)
    partitions = list(data.to_delayed())
    # One copy of the builder in the graph, shared by all tasks (a worker unpickles it once, and
    # patsy's designs are rebuilt once per worker, not per partition).
    shared = delayed(builder, name=f"dpivreg-design-builder-{uuid.uuid4().hex}", traverse=False)
    stats = [delayed(_formula_stats)(part, shared, used, widths, pairs) for part in partitions]
    raws = [delayed(_apply)(shared, part) for part in partitions]
    return _finish(raws, stats, names, formula=formula, formula_engine=formula_engine,
                   source="design_from_formula", stacklevel=3, encoded_columns=used,
                   boundary=formula_boundary(meta, parts, policy, added, sample_blocks, sample, context,
                                            formula_engine, rows=lambda: _first_rows(data)))


def _first_rows(data: Any, rows: int = 256) -> pd.DataFrame:
    """The first rows of the first partition (read only to try the caller's own functions of a formula:
    :func:`dpivreg.data.formula_replay.row_reading_terms`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "insufficient elements for head": a short first partition
        return data.head(rows, npartitions=1, compute=True)


# ---------------------------------------------------------------------------
# Arrays
# ---------------------------------------------------------------------------


def _is_dask_array(value: Any) -> bool:
    return is_dask_collection(value) and hasattr(value, "chunks") and hasattr(value, "ndim")


def _frame_names(value: Any, name: str) -> list[Hashable]:
    """Column names of a Dask DataFrame or Series input (dtype and duplicate checks included)."""
    meta = value._meta
    if isinstance(meta, pd.Series):
        _check_column_dtype(meta.dtype, meta.name if meta.name else name, name)
        return [meta.name if meta.name else name]
    columns = list(meta.columns)
    if len(set(columns)) != len(columns):
        dupes = sorted({str(c) for c in columns if columns.count(c) > 1})
        raise ValueError(f"{name} has duplicate column names {dupes}; column names must be distinct.")
    for column, dtype in meta.dtypes.items():
        _check_column_dtype(dtype, column, name)
    return columns


def _array_names(value: Any, name: str) -> list[str]:
    """IVData-style column names of a Dask array input (dtype and shape checks included)."""
    if value.ndim not in (1, 2):
        raise ValueError(f"{name} must be 1- or 2-dimensional, got {value.ndim} dimensions.")
    _check_array_dtype(value, name)
    ncol = 1 if value.ndim == 1 else value.shape[1]
    if isinstance(ncol, float) and math.isnan(ncol):
        raise ValueError(f"{name} has an unknown number of columns; compute its shape first.")
    return _numpy_columns(int(ncol), name)


@dataclass(frozen=True)
class _ArrayBuilder:
    """Column-stack one partition of each input into the raw float64 design (missing values kept)."""

    blocks: tuple[str, ...]
    labelled: bool

    def __call__(self, *parts: Any) -> np.ndarray:
        columns = []
        reference = None
        nrows = parts[0].shape[0]
        for block, part in zip(self.blocks, parts):
            if part.shape[0] != nrows:
                raise ValueError(
                    f"{block} has {part.shape[0]} rows in a partition where dependent has {nrows}; the "
                    "inputs must be partitioned alike (same rows in every chunk or partition)."
                )
            if self.labelled:
                if reference is None:
                    reference = (block, part.index)
                elif not part.index.equals(reference[1]):
                    raise ValueError(
                        f"the index of {block} differs from the index of {reference[0]}; pandas inputs must "
                        "share the same index (same labels in the same order). Align them, e.g. take every "
                        "input from the same Dask DataFrame."
                    )
                values = part.to_numpy(dtype=np.float64, na_value=np.nan)
            else:
                values = np.asarray(part, dtype=np.float64)
            columns.append(values.reshape(nrows, -1))
        return np.column_stack(columns)


def _block_raw_stats(*parts: Any, builder: _ArrayBuilder, widths: tuple[int, ...],
                     pairs: tuple[tuple[int, int], ...]) -> dict:
    return _block_stats(builder(*parts), widths, pairs)


def _array_partitions(inputs: dict[str, Any]) -> list[list]:
    """Per input, its partitions (delayed), aligned: Dask arrays are rechunked to the dependent's rows."""
    if all(_is_dask_array(value) for value in inputs.values()):
        dep = inputs["dependent"]
        rows = dep.chunks[0]
        known = not any(math.isnan(c) for c in rows)
        out = []
        for block, value in inputs.items():
            if known and not any(math.isnan(c) for c in value.chunks[0]):
                if value.shape[0] != dep.shape[0]:
                    raise ValueError(
                        f"{block} has {value.shape[0]} rows but dependent has {dep.shape[0]}; all inputs "
                        "must have the same number of rows."
                    )
                value = value.rechunk({0: rows, 1: -1} if value.ndim == 2 else {0: rows})
            elif len(value.chunks[0]) != len(rows):
                raise ValueError(
                    f"{block} has unknown chunk sizes and {len(value.chunks[0])} row chunks where dependent "
                    f"has {len(rows)}; compute the chunk sizes first (x.compute_chunk_sizes()) or build the "
                    "inputs from the same source."
                )
            elif value.ndim == 2:
                value = value.rechunk({1: -1})
            out.append(list(value.to_delayed().ravel()))
        return out
    if all(hasattr(value, "npartitions") for value in inputs.values()):
        counts = {block: value.npartitions for block, value in inputs.items()}
        if len(set(counts.values())) != 1:
            raise ValueError(
                f"the Dask DataFrame/Series inputs have different numbers of partitions {counts}; take them "
                "from the same Dask DataFrame (or repartition them alike)."
            )
        return [list(value.to_delayed()) for value in inputs.values()]
    raise TypeError(
        "the Dask inputs mix Dask arrays with Dask DataFrames/Series; pass one kind, e.g. convert the "
        "frames with .to_dask_array(lengths=True)."
    )


def dask_design_from_arrays(dependent: Any, exog: Any, endog: Any, instruments: Any, *,
                            constant: Any = None, missing: str = "drop", fill_values: Any = None,
                            indicators: Any = ()) -> DaskIVDesign:
    """Build a lazy, validated IV design from Dask arrays, DataFrames or Series.

    The counterpart of :func:`dpivreg.data.arrays.design_from_arrays`: same naming of unnamed
    columns, rows with a missing value dropped jointly (per partition), the same checks.
    All inputs must be Dask collections of one kind (arrays, or DataFrames/Series) and
    partitioned alike; ``exog`` may be None. ``constant`` declares the intercept as there.
    ``missing`` is "drop" or "drop-public" (fill Dask arrays before, e.g. with ``da.where``).
    """
    policy = missing_policy(missing, fill_values, indicators)
    if policy.how == "fill":
        raise ValueError("missing='fill' is not available for Dask array inputs: fill them first (e.g. "
                         "dask.array.where(dask.array.isnan(x), value, x) or ddf.fillna({...})), or pass a Dask "
                         "DataFrame with a formula, which fills lazily.")
    from dask import delayed  # noqa: PLC0415

    inputs = {"dependent": dependent, "exog": exog, "endog": endog, "instruments": instruments}
    present = {}
    for block, value in inputs.items():
        if value is None:
            if block != "exog":
                raise TypeError(
                    f"{block} is required (got None); only exog may be None."
                    + (" For a model without endogenous variables use OLS." if block == "endog" else "")
                )
            continue
        if not is_dask_collection(value):
            raise TypeError(
                f"{block} is a {type(value).__name__} while other inputs are Dask collections; pass all inputs "
                "as Dask collections (e.g. dask.array.from_array(x, chunks=...)) or all in memory."
            )
        present[block] = value
    names = {block: (_array_names(v, block) if _is_dask_array(v) else _frame_names(v, block))
             for block, v in present.items()}
    names.setdefault("exog", [])
    blocks = {block: pd.DataFrame(columns=names[block], dtype=np.float64) for block in _BLOCKS}
    _check_counts(blocks)
    _check_unique_names(blocks)
    order = tuple(block for block in _BLOCKS if block in present)
    partitions = _array_partitions({block: present[block] for block in order})
    builder = _ArrayBuilder(order, labelled=not _is_dask_array(present["dependent"]))
    names_t = tuple(tuple(names[block]) for block in _BLOCKS)
    widths = tuple(len(block) for block in names_t)
    pairs = _instrument_pairs(widths)
    per_partition = list(zip(*partitions))
    stats = [delayed(_block_raw_stats)(*parts, builder=builder, widths=widths, pairs=pairs) for parts in per_partition]
    raws = [delayed(builder)(*parts) for parts in per_partition]
    return _finish(raws, stats, names_t, formula=None, formula_engine=None, source="design_from_arrays",
                   stacklevel=3, constant=constant, boundary={"missing": policy.how})


# ---------------------------------------------------------------------------
# Passes over the design
# ---------------------------------------------------------------------------


def blockwise_sum(values: Any, func: Any, *args: Any) -> Any:
    """Σ over the row blocks of ``values`` of ``func(block, *args)`` (arrays or tuples of arrays), in ONE
    pass (one ``dask.compute``); the partial results are summed at the driver."""
    import dask  # noqa: PLC0415

    with one_pass():
        blocks = values.to_delayed().ravel()
        return add_parts(list(dask.compute(*[dask.delayed(func)(block, *args) for block in blocks])))


def dask_r_factor(values: Any) -> np.ndarray:
    """The triangular factor R of a tall Dask array (values = QR), by TSQR in ONE pass: each row block's
    R is computed where the block lives and the stacked factors are factored again at the driver."""
    import dask  # noqa: PLC0415

    with one_pass():
        blocks = values.to_delayed().ravel()
        factors = dask.compute(*[dask.delayed(r_factor)(block) for block in blocks])
    return r_factor(np.vstack(factors))


