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

Dask is optional: this module is imported only when a Dask collection is passed, and
:func:`is_dask_collection` detects one without importing Dask.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import math
import threading
import uuid
import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from pandas.api.types import is_bool_dtype, is_numeric_dtype

from .backends import add_parts, is_dask_collection as _is_dask_collection, one_pass
from .cross_products import ColumnFactor, block_factor, check_factor_rank, combine_factors, r_factor
from .formula_replay import (ReplayProblem, expression_names, expression_problem, formula_problems, given_levels,
                             replay_problems)
from .boundary import DATA_CHECK_NOTE, BoundaryFacts, missing_policy
from .design import (
    _BLOCKS,
    apply_missing_policy,
    formula_boundary,
    formulaic_block_matrix,
    block_positions,
    check_declared_constant,
    declared_constant,
    _DesignNames,
    _FormulaParts,
    _as_float_blocks,
    float_values,
    _block_error,
    undeclared_levels_error,
    _block_formulas,
    _check_array_dtype,
    _check_column_dtype,
    _check_counts,
    _check_data_columns,
    _check_row_count,
    _check_unique_names,
    _constant_instrument_error,
    _duplicate_instrument_error,
    _emit_encoded_missing,
    _empty_block,
    _formula_factors,
    _formula_variables,
    _is_text_dtype,
    _numpy_columns,
    _split_formula,
    _warn_dropped,
)

__all__ = [
    "DaskIVDesign",
    "is_dask_collection",
    "dask_design_from_formula",
    "dask_design_from_arrays",
]

_STATEFUL_HELP = (
    "With a Dask DataFrame the design is built once from the column types, not from the data, so "
    "transforms that learn parameters from the data (center(), scale(), poly(), bs(), ...) cannot be "
    "used. Compute the transformed column with Dask first, e.g. "
    "ddf['x_c'] = ddf['x'] - ddf['x'].mean(), and use it in the formula."
)


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
    """A validated IV design held lazily in a Dask array (the counterpart of :class:`~dpivreg.design.IVDesign`).

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
        The exogenous column declared as the intercept (:func:`dpivreg.design.declared_constant`).
    partitions : tuple
        The source's partitions as (delayed raw design with missing values kept, kept rows) pairs, for reading a
        privacy unit's ids on the same rows (:func:`dask_units`).
    persisted : bool
        Whether ``values`` were persisted (:meth:`persist`).
    missing, data_levels, zero_allowed, n_lost, data_columns, unit_columns, stateful
        Keyword-only: the privacy boundary's facts (:class:`dpivreg.boundary.BoundaryFacts`).
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
        """The columns' triangular factor from the building pass (NON-PRIVATE, :mod:`dpivreg.cross_products`)."""
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


def _validate(stats: dict, names: tuple[tuple[Hashable, ...], ...], zero_allowed: tuple[Hashable, ...] = ()) -> None:
    """The checks of :func:`dpivreg.design._drop_missing` and ``_validate`` from the pass's statistics."""
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
    zero = {c for c, name in labels.items()  # all-zero declared levels and indicators (dpivreg.boundary)
            if name in zero_allowed and stats["min"][c] == 0 and stats["max"][c] == 0}
    for col in pos["instruments"]:
        if col in zero:
            continue
        if stats["min"][col] == stats["max"][col]:
            varied = bool(stats["raw_min"][col] < stats["raw_max"][col])
            raise _constant_instrument_error(labels[col], stats["min"][col], nobs, n_dropped, varied)
        for other in pos["exog"] + [c for c in pos["instruments"] if c < col]:
            if other not in zero and equal[(col, other)]:
                raise _duplicate_instrument_error(labels[col], labels[other],
                                                  "exog" if other in exog else "instruments")
    for key, label in (("x", "regressors [exog, endog]"), ("z", "instruments [exog, instruments]")):
        cols = [c for c in pos[key] if c not in zero]
        check_factor_rank(stats["r"][:, cols], nobs, [labels[c] for c in cols], label)


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
    _validate(stats, names, boundary.get("zero_allowed", ()))
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
        **boundary,
    )
    _warn_dropped(design, source, stacklevel=stacklevel + 1)
    if stats["encoded"] is not None and encoded_columns:
        flags, n_rows = stats["encoded"]
        bad = [c for c, flag in zip(encoded_columns, flags) if flag]
        if bad:
            _emit_encoded_missing(bad, n_rows, stacklevel=stacklevel + 1)
    return design


# ---------------------------------------------------------------------------
# Formulas
# ---------------------------------------------------------------------------



#: Held while a formula is evaluated on a partition. Formula engines parse expressions with the ast module
#: (formulaic's ``literal_eval``), which CPython 3.11 does not make thread-safe: two of Dask's threads parsing at
#: once failed a test with "SystemError: AST constructor recursion depth mismatch". The evaluation mostly holds the
#: GIL anyway; worker processes (distributed) still evaluate in parallel.
_FORMULA_LOCK = threading.Lock()


@dataclass(frozen=True)
class _FormulaicBuilder:
    """Apply the blocks' formulaic ``ModelSpec``s (built once) to a pandas partition.

    Calling it returns the raw float64 design (missing values kept, columns in block order).
    """

    specs: tuple[Any, ...]
    context: Mapping[str, Any]
    levels: tuple[tuple[str, str, Hashable, tuple], ...] = ()

    @property
    def categorical(self) -> tuple[Hashable, ...]:
        """The columns read as categories."""
        return tuple(dict.fromkeys(column for _, _, column, _ in self.levels))

    def check_levels(self, data: pd.DataFrame) -> None:
        """Raise, as the pandas design does, for a value of ``data`` outside the levels of a category that reads it
        (``self.levels``: block, block formula, column, levels); formulaic would code it as the reference level,
        silently (found by review). The values are compared directly: formulaic's warning of them cannot be read
        reliably in a partition's thread (the warnings filters are the process's)."""
        for block, text, column, levels in self.levels:
            present = pd.unique(data[column].dropna())
            try:
                allowed = set(levels)
                outside = [value for value in present if value not in allowed]
            except TypeError:  # unhashable levels
                outside = [value for value in present if value not in levels]
            if outside:
                raise undeclared_levels_error(block, text, "{" + ", ".join(sorted(map(repr, outside))) + "}")

    def _categories_as_levels(self, data: pd.DataFrame) -> pd.DataFrame:
        """``data`` with each category column whose categories differ from a factor's declared levels given those
        levels (its values lie in them, :meth:`check_levels`): the same coding, without the deprecation warning
        pandas gives formulaic for categories outside the levels in every partition (found by review; the pandas
        design drops that warning, which a partition's thread cannot catch safely). A column read with two sets of
        levels is left as it is."""
        wanted: dict[Hashable, tuple] = {}
        for _, _, column, levels in self.levels:
            wanted[column] = levels if wanted.get(column, levels) == levels else None
        changed = {}
        for column, levels in wanted.items():
            values = data[column]
            if (levels and isinstance(values.dtype, pd.CategoricalDtype)
                    and list(values.cat.categories) != list(levels)):
                changed[column] = values.cat.set_categories(list(levels))
        return data.assign(**changed) if changed else data

    def frames(self, data: pd.DataFrame) -> dict[str, pd.DataFrame]:
        """The four named blocks on ``data``'s rows (missing values kept), its values not checked against the levels
        (the synthetic sample the specs are built on; a partition goes through :meth:`__call__`)."""
        # A missing category is coded as the reference level, as on the pandas path (which warns
        # with EncodedMissingWarning); replaying a spec, formulaic also warns per partition. Its
        # warning is silenced only where it can occur, since catch_warnings is not thread-safe.
        missing_category = any(data[c].isna().any() for c in self.categorical if c in data.columns)
        with warnings.catch_warnings() if missing_category else contextlib.nullcontext(), _FORMULA_LOCK:
            if missing_category:
                from formulaic.errors import DataMismatchWarning  # noqa: PLC0415

                warnings.simplefilter("ignore", DataMismatchWarning)
            return {block: _empty_block(data.index) if spec is None
                    else pd.DataFrame(spec.get_model_matrix(data, context=self.context))
                    for block, spec in zip(_BLOCKS, self.specs)}

    def __call__(self, data: pd.DataFrame) -> np.ndarray:
        """A partition's raw design, after :meth:`check_levels`."""
        self.check_levels(data)
        frames = self.frames(self._categories_as_levels(data))
        parts = [float_values(frame, block) for block, frame in frames.items() if frame.shape[1]]
        return np.column_stack(parts) if parts else np.empty((data.shape[0], 0))


def _apply(builder: Any, part: pd.DataFrame) -> np.ndarray:
    """``builder(part)``: the raw design of one partition."""
    return builder(part)


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


def _check_dask_columns(meta: pd.DataFrame, parts: _FormulaParts, formula_engine: str,
                        context: Mapping[str, Any]) -> None:
    """Raise for columns whose encoding would depend on the data: text (unless formulaic reads it only as a category
    with declared levels, ``C(t, levels=[...])``), or categories not known."""
    from dask.dataframe.utils import has_known_categories  # noqa: PLC0415

    factors = _formula_factors(parts)
    for col in _formula_variables(parts, meta):
        dtype = meta[col].dtype
        fix = (f"Make it a category with known categories first, e.g. "
               f"ddf[{col!r}] = ddf[{col!r}].astype('category').cat.as_known() (or set the categories "
               f"explicitly with .cat.set_categories([...]), which also fixes their order).")
        if isinstance(dtype, pd.CategoricalDtype):
            if not has_known_categories(meta[col]):
                raise ValueError(
                    f"column {col!r} is a Dask category with unknown categories: the formula needs all "
                    f"levels to build the same dummy columns in every partition. {fix}"
                )
        elif ((_is_text_dtype(dtype) or not (is_numeric_dtype(dtype) or is_bool_dtype(dtype)))
              and not (formula_engine == "formulaic"
                       and _declared_levels_only(str(col), factors.get(str(col), []), context))):
            raise ValueError(
                f"column {col!r} has dtype {dtype}: with a Dask DataFrame the formula cannot read the levels "
                f"of a text (or other non-numeric) column from the data (they may differ between partitions). "
                f"{fix}"
            )


def _declared_levels_only(name: str, expressions: list[str], context: Mapping[str, Any]) -> bool:
    """Whether every expression reading column ``name`` is ``C(name, ..., levels=...)`` with levels that are given
    (not None; a name of the namespace is looked up in ``context``): its coding is then the same in every partition,
    and a partition's value outside the levels raises (:meth:`_FormulaicBuilder.check_levels`)."""
    def declared(expression: str) -> bool:
        call = _category_call(expression)
        return (call is not None and _category_column(expression, (name,)) == name
                and any(keyword.arg == "levels" and given_levels(keyword.value, context) for keyword in call.keywords))

    return bool(expressions) and all(declared(expression) for expression in expressions)


def _formula_context(specs: tuple[Any, ...], context: Mapping[str, Any], columns: set) -> dict[str, Any]:
    """The variables of ``context`` that the formula's expressions name (shipped to the workers)."""
    names: set[str] = set()
    for spec in specs:
        if spec is None:
            continue
        for term in spec.formula:
            for factor in term.factors:
                names |= expression_names(str(factor.expr))
    return _ship(names - columns, context)


def _ship(names: set[str], context: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``context`` for ``names`` (arrays read as row data were refused before, by
    :func:`_check_namespace_array`; a list of declared levels is shipped)."""
    out = {}
    for name in sorted(names):
        try:
            if name not in context:
                continue
            out[name] = context[name]
        except Exception:  # noqa: BLE001 - an odd mapping: the name is simply not shipped
            continue
    return out


def _check_spec(spec: Any, block: str, text: str, meta: pd.DataFrame, context: Mapping[str, Any]) -> None:
    """Raise for what would make a partition's rows differ from the pandas design's (:mod:`dpivreg.formula_replay`):
    stateful transforms, categories whose levels would be read from the sample, expressions that read other rows.
    Functions of the caller's own are trusted to act row by row (documented); arrays of the namespace read as row
    data raise (:func:`_check_namespace_array`)."""
    for problem in replay_problems(spec, meta, context):
        _check_namespace_array(problem, block)
        if problem.kind == "stateful":
            raise ValueError(
                f"the {block} block {text!r} uses the stateful transform(s) "
                f"{sorted(name for name, state in spec.transform_state.items() if state)}. "
                + _STATEFUL_HELP
            )
        if problem.kind == "levels":
            fix = (f"Make it a category with known categories first, e.g. ddf[{problem.column!r}] = "
                   f"ddf[{problem.column!r}].astype('category').cat.as_known()." if problem.column is not None else
                   "Declare the levels in the formula, C(..., levels=[...]), or compute the column with Dask first "
                   "as a category with known categories.")
            raise ValueError(
                f"{problem.expression!r} in the {block} block: {problem.why}; with a Dask DataFrame every "
                f"partition must see the same levels. {fix}"
            )
        if problem.kind == "other rows":
            raise _other_rows_error(problem, block)


def _check_namespace_array(problem: ReplayProblem, block: str) -> None:
    """Raise for an array of the namespace read as row data (``I(w * weights)``, ``I(w * cfg.weights)``): it cannot
    be aligned with the partitions."""
    if problem.kind == "namespace array":
        raise ValueError(
            f"{problem.expression!r} in the {block} block: {problem.why}. With a Dask DataFrame the formula is "
            "applied to each partition separately, so such a variable cannot be aligned with the rows. Add it as a "
            "column of the Dask DataFrame instead."
        )


def _other_rows_error(problem: ReplayProblem, block: str) -> ValueError:
    """The error for an expression that would see only its partition's rows."""
    return ValueError(
        f"{problem.expression!r} in the {block} block cannot be computed partition by partition: "
        f"{problem.why}. With a Dask DataFrame the formula is applied to each partition separately, so "
        "it would see that partition's rows only. Compute the column with Dask first, e.g. "
        "ddf['x_c'] = ddf['x'] - ddf['x'].mean(), and use it in the formula."
    )


def _formulaic_builder(sample: pd.DataFrame, parts: _FormulaParts, context: Mapping[str, Any]) -> _FormulaicBuilder:
    """Build the blocks' model specs once on ``sample`` (a frame with the data's column types)."""
    from .design import _formulaic_context  # noqa: PLC0415

    ctx = _formulaic_context(context)
    specs = []
    texts = _block_formulas(parts)
    for block, text in texts.items():
        if text is None:
            specs.append(None)
            continue
        for problem in formula_problems(text, sample, ctx):  # before the sample, which such an array fails
            _check_namespace_array(problem, block)
        with _quiet_sample():
            matrix = formulaic_block_matrix(block, text, sample, ctx)
        _check_spec(matrix.model_spec, block, text, sample, ctx)
        specs.append(matrix.model_spec if matrix.shape[1] or block != "exog" else None)
    specs_t = tuple(specs)
    levels = _category_levels(specs_t, texts, sample)
    shipped = _formula_context(specs_t, ctx, set(sample.columns))
    builder = _FormulaicBuilder(specs_t, shipped, levels)
    try:
        with _quiet_sample():
            builder.frames(sample)
    except Exception:  # noqa: BLE001 - a name we could not see in the expressions: ship everything
        builder = _FormulaicBuilder(specs_t, dict(ctx), levels)
    return builder


@contextlib.contextmanager
def _quiet_sample():
    """Building on the synthetic sample (in the caller's thread): its made-up values may lie outside a category's
    declared levels, which formulaic and pandas warn of (found by review: a pandas deprecation leaked to users)."""
    from formulaic.errors import DataMismatchWarning  # noqa: PLC0415

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", DataMismatchWarning)
        warnings.filterwarnings("ignore", message="Constructing a Categorical with a dtype")
        yield


def _category_levels(specs: tuple[Any, ...], texts: Mapping[str, str | None],
                     sample: pd.DataFrame) -> tuple[tuple[str, str, Hashable, tuple], ...]:
    """(block, block formula, column, levels) of every categorical factor of the specs, for
    :meth:`_FormulaicBuilder.check_levels`. A categorical factor must read one column as itself or as ``C(column,
    ...)``: the categories of a computed expression (``C(g == 'a', levels=[...])``) cannot be checked in a
    partition without evaluating it, and are refused (ValueError)."""
    out = []
    for block, spec in zip(_BLOCKS, specs):
        if spec is None:
            continue
        seen = set()
        for structure in spec.structure:
            for factor in structure.term.factors:
                kind, state = spec.encoder_state.get(factor.expr, (None, {}))
                if getattr(kind, "value", kind) != "categorical" or factor.expr in seen:
                    continue
                seen.add(factor.expr)
                column = _category_column(str(factor.expr), sample.columns)
                if column is None:
                    raise ValueError(
                        f"{str(factor.expr)!r} in the {block} block: with a Dask DataFrame a category must be a column, "
                        "as itself or C(column, ...), so that each partition's values can be checked against its "
                        "levels. Compute the expression with Dask first as a category with known categories, e.g. "
                        "ddf['flag'] = (ddf['g'] == 'a').astype('category').cat.set_categories([False, True]).")
                out.append((block, texts[block], column, tuple(state.get("categories", ()))))
    return tuple(out)


def _category_call(expression: str) -> ast.Call | None:
    """``expression`` parsed when it is a call ``C(first, ...)``, else None."""
    try:
        node = ast.parse(expression, mode="eval").body
    except SyntaxError:
        return None
    is_call = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "C" and node.args
    return node if is_call else None


def _category_column(expression: str, columns: Any) -> Hashable | None:
    """The column a categorical factor reads when it is the column itself or ``C(column, ...)``, else None."""
    call = _category_call(expression)
    if call is None:
        return expression if expression in columns else None
    first = call.args[0]
    return first.id if isinstance(first, ast.Name) and first.id in columns else None


class _PatsyBuilder:
    """Apply the blocks' patsy designs to a pandas partition (the patsy counterpart of
    :class:`_FormulaicBuilder`).

    patsy's ``DesignInfo`` cannot be pickled, so the builder carries what makes it (the blocks'
    formulas, the synthetic sample and the formula's variables) and every process rebuilds the
    same designs once, from the same sample. Rows that patsy drops in a block (a missing value,
    including a missing category) are missing in the raw design, so they are dropped jointly.
    """

    def __init__(self, texts: tuple[str | None, ...], sample: pd.DataFrame, context: Mapping[str, Any]) -> None:
        self.texts = texts
        self.sample = sample
        self.context = dict(context)
        self._infos: tuple[Any, ...] | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_infos"] = None
        return state

    def infos(self) -> tuple[Any, ...]:
        """The blocks' patsy ``DesignInfo`` (None for an absent block), built on first use."""
        if self._infos is None:
            import patsy  # noqa: PLC0415

            env = patsy.EvalEnvironment([self.context, {"np": np}])
            self._infos = tuple(
                None if text is None else patsy.dmatrix(
                    text, self.sample, eval_env=env, NA_action="drop", return_type="dataframe").design_info
                for text in self.texts
            )
        return self._infos

    def frames(self, data: pd.DataFrame) -> dict[str, pd.DataFrame]:
        """The four named blocks on ``data``'s rows, NaN in the rows that patsy dropped."""
        import patsy  # noqa: PLC0415

        positional = data.reset_index(drop=True)
        blocks = {}
        with _FORMULA_LOCK:  # see _FORMULA_LOCK
            infos = self.infos()
        for block, info in zip(_BLOCKS, infos):
            if info is None:
                blocks[block] = _empty_block(data.index)
                continue
            values = np.full((data.shape[0], len(info.column_names)), np.nan)
            if data.shape[0]:
                with _FORMULA_LOCK:
                    matrix = patsy.build_design_matrices([info], positional, NA_action="drop",
                                                         return_type="dataframe")[0]
                values[np.asarray(matrix.index, dtype=np.intp)] = matrix.to_numpy(dtype=np.float64)
            blocks[block] = pd.DataFrame(values, index=data.index, columns=list(info.column_names))
        return blocks

    def __call__(self, data: pd.DataFrame) -> np.ndarray:
        parts = [frame.to_numpy(dtype=np.float64) for frame in self.frames(data).values() if frame.shape[1]]
        return np.column_stack(parts) if parts else np.empty((data.shape[0], 0))


def _patsy_builder(sample: pd.DataFrame, parts: _FormulaParts, context: Mapping[str, Any]) -> _PatsyBuilder:
    """Build (and check) the blocks' patsy designs on ``sample``; ship only the variables they name."""
    from .design import _formulaic_context  # noqa: PLC0415

    texts = tuple(_block_formulas(parts).values())
    ctx = _formulaic_context(context)
    full = _PatsyBuilder(texts, sample, ctx)
    for block, text, index in zip(_BLOCKS, texts, range(len(texts))):
        if text is None:
            continue
        try:
            info = _PatsyBuilder((text,), sample, ctx).infos()[0]
        except Exception as exc:  # noqa: BLE001 - wrapped with the cause attached
            raise _block_error(block, text, "patsy", exc) from exc
        _check_patsy_info(info, block, text, sample)
        for factor in info.factor_infos:
            problem = expression_problem(factor.code, sample, ctx)
            if problem is not None:
                _check_namespace_array(problem, block)
                if problem.kind == "other rows":
                    raise _other_rows_error(problem, block)
    names: set[str] = set()
    for info in full.infos():
        if info is not None:
            for factor in info.factor_infos:
                names |= expression_names(factor.code)
    return _PatsyBuilder(texts, sample, _ship(names - set(sample.columns), ctx))


def _check_patsy_info(info: Any, block: str, text: str, meta: pd.DataFrame) -> None:
    """Raise for patsy's stateful transforms and for categories whose levels come from the data."""
    for factor, factor_info in info.factor_infos.items():
        state = factor_info.state if isinstance(factor_info.state, dict) else {}
        if state.get("transforms"):
            raise ValueError(
                f"the {block} block {text!r} uses the stateful transform in {factor.code!r}. " + _STATEFUL_HELP
            )
        if factor_info.type != "categorical":
            continue
        for col in expression_names(factor.code) & set(meta.columns):
            dtype = meta[col].dtype
            if not (isinstance(dtype, pd.CategoricalDtype) or dtype == np.dtype(bool)):
                raise ValueError(
                    f"{factor.code!r} in the {block} block treats column {col!r} (dtype {dtype}) as a "
                    "category, whose levels patsy would read from the data; with a Dask DataFrame every "
                    "partition must see the same levels. Make it a category with known categories first, "
                    f"e.g. ddf[{col!r}] = ddf[{col!r}].astype('category').cat.as_known()."
                )


def dask_design_from_formula(formula: str, data: Any, *, context: Mapping[str, Any],
                             formula_engine: str = "formulaic", missing: str = "drop",
                             fill_values: Any = None, indicators: Any = ()) -> DaskIVDesign:
    """Build a lazy, validated IV design from a formula and a Dask DataFrame.

    Parameters
    ----------
    formula : str
        ``dependent ~ exog + [endog ~ instruments]`` as for
        :func:`dpivreg.design.design_from_formula`.
    data : dask.dataframe.DataFrame
        The data; never modified. Columns used as categories must have known categories.
    context : Mapping
        Variables and functions of the formula (the caller's namespace); only those the formula
        names are shipped to the workers.
    formula_engine : {"formulaic", "patsy"}
        As for pandas; each process rebuilds patsy's designs once from the same synthetic sample.
    missing, fill_values, indicators
        The missing-value policy, as for :func:`dpivreg.design.design_from_formula` (filled lazily).

    Returns
    -------
    DaskIVDesign

    Raises
    ------
    ValueError
        As :func:`dpivreg.design.design_from_formula`, and for text columns, categories with
        unknown categories and stateful transforms.
    """
    from .design import FORMULA_ENGINES  # noqa: PLC0415

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
    from .design import _formulaic_context  # noqa: PLC0415

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
                                            formula_engine))


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

    The counterpart of :func:`dpivreg.design.design_from_arrays`: same naming of unnamed
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


# ---------------------------------------------------------------------------
# Privacy units (dpivreg.units): hash the ids, shuffle once, group per partition
# ---------------------------------------------------------------------------
def _id_hashes(ids: Any) -> tuple[np.ndarray, int]:
    """64-bit hashes of ids (pandas' ``hash_array``: the same in every process) and the number of missing ids."""
    values = np.asarray(ids.to_numpy() if hasattr(ids, "to_numpy") else ids)
    return pd.util.hash_array(values), int(pd.isna(values).sum())


def _unit_buckets(raw: np.ndarray, unit_ids: Any, cluster_ids: Any, offset: int, seed: int, buckets: int) -> list:
    """One source partition's kept design rows, with their unit's and cluster's hashes and truncation keys (the keys
    of :func:`dpivreg.units.row_keys` at the rows' positions in the design, as in memory), split into ``buckets`` by
    the hash of the cluster (which contains the unit): (values, units, clusters, keys) per bucket; then the
    partition's census over ALL its rows (the dropped ones too: the public counts N and G are over the whole data):
    its distinct unit and cluster hashes, (unit, cluster) pairs and missing ids. ``unit_ids`` None: each row is its
    own unit (its design position its id)."""
    from .units import row_keys  # noqa: PLC0415

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
            "truncated": int(np.count_nonzero(sizes > max_rows)), "dropped": int(np.sum(np.maximum(sizes - max_rows, 0)))}


def _field(result: dict, name: str):
    return result[name]


def _bucket_stats(result: dict) -> dict:
    """A grouped bucket's counts, without its rows (what reaches the driver)."""
    return {k: v for k, v in result.items() if k not in ("values", "units", "clusters")}


class DaskGroupedRows:
    """A Dask design's kept rows grouped by privacy unit and cluster (units truncated), for the passes of a fit: the
    counterpart of :class:`dpivreg.design.ReorderedDesign`. ``values`` (lazy, or persisted with the design) holds
    whole units and clusters in each block; ``groups`` the per-row hashes (:class:`dpivreg.units.DaskGroups`)."""

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
    from .units import starts_of  # noqa: PLC0415

    return func(np.asarray(block, dtype=np.float64), starts_of(np.asarray(codes)), *args)


def dask_units(design: DaskIVDesign, *, data: Any, privacy_unit: Any, clusters: Any, max_rows: int, seed: int):
    """The fit's :class:`dpivreg.units.PrivacyUnits` for a Dask design built from a formula on ``data``.

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

    from .units import DaskGroups, PrivacyUnits, UnitFacts, _label  # noqa: PLC0415

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
    if len(design.partitions) != data.npartitions:
        raise ValueError("the Dask DataFrame's partitions changed since the model was built: build the model again.")
    parts = len(design.partitions)
    none = [None] * parts
    units_of = none if unit_name is None else data[unit_name].to_delayed()
    clusters_of = none if cluster_name is None or cluster_name == unit_name else data[cluster_name].to_delayed()
    offsets = np.concatenate([[0], np.cumsum([m for _, m in design.partitions])[:-1]])
    d = len(design.column_names)
    split = [dask.delayed(_unit_buckets, nout=parts + 1)(raw, units_of[i], clusters_of[i], int(offsets[i]), seed,
                                                          parts)
             for i, (raw, _) in enumerate(design.partitions)]
    row_level = unit_name is None
    grouped = [dask.delayed(_group_bucket)([split[i][b] for i in range(parts)], max_rows, d) for b in range(parts)]
    if design.persisted:
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
    facts = UnitFacts(None if row_level else _label(unit_name), int(n_units),
                      1 if row_level else int(max_rows), None if cluster_name is None else _label(cluster_name),
                      n_clusters)
    groups = DaskGroups(column("units", (), np.uint64),
                        column("clusters", (), np.uint64) if cluster_name is not None else None,
                        facts.n_units, n_clusters, not row_level)
    return PrivacyUnits(facts, None, groups, sum(s["truncated"] for s in stats), sum(s["dropped"] for s in stats),
                        rows=DaskGroupedRows(design, values, groups, int(sum(rows))))
