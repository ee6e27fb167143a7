"""
Design builder: turn an IV formula or arrays into validated design blocks.

An instrumental-variable design has four blocks: the dependent variable, the
exogenous regressors, the endogenous regressors and the instruments. The
regressors are ``X = [exog, endog]`` and the first-stage regressors are
``Z = [exog, instruments]``, in that column order, which is the order of the
parameters of :class:`linearmodels.iv.IV2SLS`.

Two entry points build an :class:`IVDesign`:

* :func:`design_from_formula` parses ``dep ~ exog + [endog ~ instruments]``.
  With ``formula_engine="formulaic"`` (the default) the blocks are exactly the
  ones that ``linearmodels.iv.IV2SLS.from_formula`` builds (same column names,
  order, values and rows). With ``formula_engine="patsy"`` the blocks use
  patsy's naming and coding, as in statsmodels (``Intercept``, ``b[T.True]``).
* :func:`design_from_arrays` wraps NumPy arrays, Series or DataFrames, naming
  unnamed columns like ``linearmodels.iv.data.IVData`` (``dependent``,
  ``exog.0``, ``endog``, ``instruments.1``, ...).

Both paths drop the rows that have a missing value in any block (jointly, as
linearmodels does), warn with :class:`DroppedRowsWarning` if any row was
dropped, convert every block to numbers read as float64 and validate the design (order
condition, infinite values, enough rows; constant or duplicate instruments and the rank are findings that warn,
:mod:`dpivreg.data.checks`). The caller's data are never modified.

Memory: plain float64 columns are shared with the caller's frame (:func:`plain_column_block`); a formula whose
terms act row by row is built a block of rows at a time (:func:`_formulaic_block`), and its transformed terms
(``np.log(s)``, ``C(g)``) are computed for the rows each pass reads instead of held
(:mod:`dpivreg.data.derived_columns`); other columns the design computes are held compactly where that is exact (0/1
columns as uint8, a column of ones as one broadcast value, :class:`_CompactColumns`). Every pass reads float64 blocks of
rows (:func:`stack_rows`).
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from dpivreg.compute.backends import add_parts, map_row_blocks
from dpivreg.data.boundary import (
    BoundaryFacts,
    MissingPolicy,
    data_derived_levels,
    declared_zero_columns,
    fill_frame,
    indicator_name,
    missing_policy,
    unit_columns,
)
from dpivreg.data.builders import FORMULA_ENGINES, _factor_kinds, _formulaic_blocks, _patsy_blocks
from dpivreg.data.checks import (
    _check_counts,
    _check_data_columns,
    _encoded_missing,
    _formula_variables,
    _validate,
    check_declared_constant,
    declared_constant,
    rank_findings,
    warn_findings,
)
from dpivreg.data.columns import (
    Derived,
    _as_float_blocks,
    _placeholder,
    _zero_or_one,
    block_columns,
    column_blocks,
    column_checksum,
    stack_rows,
)
from dpivreg.data.cross_products import ColumnFactor, block_factor, combine_factors
from dpivreg.data.derived_columns import DerivedColumn
from dpivreg.data.formula import (
    _BLOCKS,
    _block_formulas,
    _FormulaParts,
    _split_formula,
)
from dpivreg.data.formula_replay import row_reading_terms
from dpivreg.errors import DATA_CHECK_NOTE, DroppedRowsWarning, EncodedMissingWarning

__all__ = ["IVDesign", "design_from_formula"]


# ---------------------------------------------------------------------------
# The design
# ---------------------------------------------------------------------------


class _DesignNames:
    """Names derived from the blocks' names, shared by the in-memory and the Dask design."""

    exog_names: list[Hashable]
    endog_names: list[Hashable]
    instrument_names: list[Hashable]

    @property
    def regressor_names(self) -> list[Hashable]:
        """Names of ``X = [exog, endog]``, the order of the parameters."""
        return self.exog_names + self.endog_names

    @property
    def z_names(self) -> list[Hashable]:
        """Names of ``Z = [exog, instruments]``, the first-stage regressors."""
        return self.exog_names + self.instrument_names

    @property
    def column_names(self) -> list[Hashable]:
        """Names of the design's rows' columns [dependent, exog, endog, instruments] (the order of
        :attr:`positions`)."""
        return [self.dependent_name, *self.exog_names, *self.endog_names, *self.instrument_names]

    @property
    def positions(self) -> dict[str, list[int]]:
        """Column positions in the design's rows [dependent, exog, endog, instruments] of each block,
        ``"x"`` (= [exog, endog]) and ``"z"`` (= [exog, instruments])."""
        return block_positions((1, len(self.exog_names), len(self.endog_names), len(self.instrument_names)))


    @property
    def zero_columns(self) -> list[int]:
        """Positions (in :attr:`column_names`) of the columns allowed to be all zero (``zero_allowed``: declared
        levels absent from the data, indicators of complete columns) that are all zero (NON-PRIVATE: from the
        design's column range; it only exempts them from the checks and the benchmark)."""
        lowest, highest = self.column_range
        return [j for j, name in enumerate(self.column_names)
                if name in self.zero_allowed and lowest[j] == 0 and highest[j] == 0]


def block_positions(widths: tuple[int, ...]) -> dict[str, list[int]]:
    """Column positions of the blocks, [exog, endog] ("x") and [exog, instruments] ("z") given the
    blocks' widths in the order [dependent, exog, endog, instruments]."""
    starts = np.cumsum((0,) + tuple(widths))
    pos = {block: list(range(starts[i], starts[i + 1])) for i, block in enumerate(_BLOCKS)}
    pos["x"] = pos["exog"] + pos["endog"]
    pos["z"] = pos["exog"] + pos["instruments"]
    return pos


@dataclass(frozen=True, eq=False)
class IVDesign(BoundaryFacts, _DesignNames):
    """
    The four blocks of a validated instrumental-variable design.

    Parameters
    ----------
    dependent : DataFrame
        Dependent variable, ``nobs`` by 1.
    exog : DataFrame
        Exogenous regressors, ``nobs`` by ``k`` (``k`` may be 0, in which case it
        is an empty DataFrame with the same index).
    endog : DataFrame
        Endogenous regressors, ``nobs`` by ``p`` with ``p >= 1``.
    instruments : DataFrame
        Excluded instruments, ``nobs`` by ``q`` with ``q >= p``. The designs built by :func:`design_from_formula`
        and :func:`design_from_arrays` hold float64 columns, and a column of 0/1 values as uint8 (one byte a
        row), which each pass and each read of a block (``design.exog``) widens to float64, so a user's
        arithmetic on a block never wraps around.
    formula : str, optional
        The formula the design was built from, None for array input.
    formula_engine : str, optional
        The engine that built the design from ``formula`` ("formulaic" or
        "patsy"), None for array input.
    n_dropped : int, optional
        Number of rows dropped because a block had a missing value.
    constant : Hashable, optional
        The exogenous column declared as the intercept.
    source_rows : ndarray of int, optional
        Positions in the data the design was built from of the design's rows, when they are not all of its rows
        in order (rows dropped): the privacy unit's and clusters' ids of a fit are read at these positions.
    derived : dict, optional
        ``{(block, position): DerivedColumn}``: the columns computed from the data for the rows a pass reads
        (:mod:`dpivreg.data.derived_columns`) instead of held; the block holds a placeholder at their position (one
        value broadcast over the rows), and reading the block (``design.exog``) computes them.
    missing, data_levels, zero_allowed, n_lost, data_columns, unit_columns, stateful
        Keyword-only: the privacy boundary's facts (:class:`dpivreg.data.boundary.BoundaryFacts`).

    Raises
    ------
    TypeError
        If a block is not a DataFrame.
    ValueError
        If the blocks have different numbers of rows, ``dependent`` does not
        have exactly one column or ``endog`` has no column.

    Notes
    -----
    The designs built by :func:`design_from_formula` and
    :func:`design_from_arrays` are fully validated. Constructing an
    ``IVDesign`` directly only checks the shapes. Designs compare by identity
    (``eq=False``), since DataFrames have no single truth value.
    """

    dependent: pd.DataFrame
    exog: pd.DataFrame
    endog: pd.DataFrame
    instruments: pd.DataFrame
    formula: str | None = None
    formula_engine: str | None = None
    n_dropped: int = 0
    constant: Hashable | None = None
    source_rows: np.ndarray | None = field(default=None, repr=False)
    derived: Mapping[tuple[str, int], DerivedColumn] | None = field(default=None, repr=False)

    # By identity, as the docstring says (eq=False alone would inherit BoundaryFacts' comparison of the facts, and
    # two designs of different data would compare equal).
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __post_init__(self) -> None:
        for name in _BLOCKS:
            block = self._stored(name)
            if not isinstance(block, pd.DataFrame):
                raise TypeError(
                    f"IVDesign.{name} must be a pandas DataFrame, got "
                    f"{type(block).__name__}."
                )
        nobs = self._stored("dependent").shape[0]
        for name in _BLOCKS[1:]:
            rows = self._stored(name).shape[0]
            if rows != nobs:
                raise ValueError(
                    f"IVDesign.{name} has {rows} rows but dependent has {nobs}; "
                    "all blocks must have the same rows."
                )
        if self._stored("dependent").shape[1] != 1:
            raise ValueError(
                "IVDesign.dependent must have exactly one column, got "
                f"{self._stored('dependent').shape[1]}."
            )
        if self._stored("endog").shape[1] == 0:
            raise ValueError("IVDesign.endog must have at least one column.")
        if self.constant is not None and self.constant not in self._stored("exog").columns:
            raise ValueError(f"IVDesign.constant {self.constant!r} is not an exogenous column {self.exog_names}.")

    def __repr__(self) -> str:
        """The design's names and size (no values: a block's repr would widen its uint8 columns)."""
        return (f"IVDesign(nobs={self.nobs}, dependent={self.dependent_name!r}, exog={self.exog_names}, "
                f"endog={self.endog_names}, instruments={self.instrument_names}, formula={self.formula!r}, "
                f"n_dropped={self.n_dropped})")

    def _stored(self, name: str) -> pd.DataFrame:
        """Block ``name`` as the design holds it (0/1 columns as uint8); ``design.<name>`` reads it as float64."""
        return self.__dict__["_blocks"][name]

    @property
    def nobs(self) -> int:
        """Number of observations (rows) used in estimation."""
        return int(self._stored("dependent").shape[0])

    @property
    def dependent_name(self) -> Hashable:
        """Name of the dependent variable."""
        return self._stored("dependent").columns[0]

    @property
    def exog_names(self) -> list[Hashable]:
        """Names of the exogenous regressors."""
        return list(self._stored("exog").columns)

    @property
    def endog_names(self) -> list[Hashable]:
        """Names of the endogenous regressors."""
        return list(self._stored("endog").columns)

    @property
    def instrument_names(self) -> list[Hashable]:
        """Names of the excluded instruments."""
        return list(self._stored("instruments").columns)

    @property
    def constant_name(self) -> Hashable | None:
        """Name of the exog column declared as the intercept (see :func:`declared_constant`), or None."""
        return self.constant

    def __getstate__(self) -> dict:
        """Pickle without the cached array views of the blocks (they would store the data twice), the derived
        columns computed into their blocks (a recipe holds the caller's namespace)."""
        state = self.__dict__.copy()
        state.pop("_columns", None)
        if self.derived:
            state["_blocks"] = {name: self._held(name) for name in _BLOCKS}
            state["derived"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        """Unpickle, also a design pickled with its blocks as attributes of their own (not in ``_blocks``)."""
        state = dict(state)
        state.setdefault("_blocks", {name: state.pop(name) for name in _BLOCKS if name in state})
        self.__dict__.update(state)

    # ------------------------------------------------------------ passes over the rows (NON-PRIVATE)
    @cached_property
    def _columns(self) -> tuple[np.ndarray | DerivedColumn, ...]:
        """The columns of [dependent, exog, endog, instruments], one 1-D array each: views of the blocks'
        values (a whole block's ``to_numpy()`` would copy a block that pandas holds in several pieces, as the
        blocks that share the caller's columns are), or the :class:`DerivedColumn` that computes the rows read."""
        return tuple(column for name in _BLOCKS for column in block_columns(self._stored(name), self.derived, name))

    def _held(self, name: str) -> pd.DataFrame:
        """Block ``name`` as held (0/1 columns as uint8), its derived columns computed, in new memory."""
        block = self._stored(name)
        mine = {j: column for (owner, j), column in (self.derived or {}).items() if owner == name}
        if not mine:
            return block
        block = block.copy(deep=False)
        for j, column in mine.items():
            values = column.values()
            block.isetitem(j, values.astype(np.uint8) if _zero_or_one(values) else values)  # held as built
        return block

    def row_block(self, rows: slice) -> np.ndarray:
        """Rows ``rows`` of [dependent, exog, endog, instruments] as one float64 array (:func:`stack_rows`)."""
        return stack_rows(self._columns, rows)

    def blockwise_sum(self, func: Any, *args: Any) -> Any:
        """Σ over the blocks of rows of ``func(block, *args)`` (an array or a tuple of arrays), in ONE pass
        (:func:`dpivreg.compute.backends.map_row_blocks`): the counterpart of the Dask design's pass."""
        return add_parts(self._map_blocks(lambda block: func(block, *args)))

    def _map_blocks(self, func: Any) -> list:
        """``func(block)`` for every block of rows (:meth:`row_block`), in order, in ONE pass."""
        self._columns  # noqa: B018 - built once here, not concurrently by the pass's threads
        return map_row_blocks(lambda rows: func(self.row_block(rows)), self.nobs)

    @cached_property
    def _pass_statistics(self) -> tuple[ColumnFactor, np.ndarray, np.ndarray, np.ndarray]:
        """The design's one NON-PRIVATE statistics pass: its column factor, per-column minima and maxima, and
        :attr:`column_checksum`."""
        def on_block(block: np.ndarray):
            return (block_factor(block), np.min(block, axis=0, initial=np.inf), np.max(block, axis=0, initial=-np.inf),
                    column_checksum(block))

        parts = self._map_blocks(on_block)
        factor = ColumnFactor(*combine_factors([part[0] for part in parts]))
        return (factor, np.min([part[1] for part in parts], axis=0), np.max([part[2] for part in parts], axis=0),
                add_parts([part[3] for part in parts]))

    @property
    def factor(self) -> ColumnFactor:
        """The columns' triangular factor (NON-PRIVATE, :mod:`dpivreg.data.cross_products`), by TSQR over the
        blocks of rows in one pass; the design's rank checks and the 2SLS benchmark read it."""
        return self._pass_statistics[0]

    @property
    def column_range(self) -> tuple[np.ndarray, np.ndarray]:
        """NON-PRIVATE per-column minimum and maximum of [dependent, exog, endog, instruments] (same pass)."""
        return self._pass_statistics[1], self._pass_statistics[2]

    @property
    def column_checksum(self) -> np.ndarray:
        """NON-PRIVATE per-column :func:`column_checksum` of the design's rows when it was built (same pass): a fit
        compares it with the rows it reads, since the design may share the caller's columns."""
        return self._pass_statistics[3]

    @property
    def has_constant(self) -> bool:
        """Whether the design declares an intercept (e.g. ``Intercept``)."""
        return self.constant is not None

    def reordered(self, order: np.ndarray, groups: Any = None) -> "ReorderedDesign":
        """The rows at positions ``order`` (a subset, in that order) as a design for passes over the rows
        (:class:`ReorderedDesign`): what the privacy units keep, units and clusters contiguous (``groups``, a
        :class:`dpivreg.privacy.units.RowGroups` of the reordered rows)."""
        return ReorderedDesign(self, np.asarray(order, dtype=np.int64), groups)


def _block_property(name: str) -> property:
    """``IVDesign.<name>``: the block with float64 columns. A column held as uint8 (0/1 values) is widened in a new
    frame (arithmetic on uint8 wraps around, 0 − 1 = 255), and derived columns are computed into
    it at each read (:meth:`IVDesign._held`); a block with neither is the block."""

    def read(design: IVDesign) -> pd.DataFrame:
        block = design._held(name)
        compact = {column: np.float64 for column, dtype in block.dtypes.items() if dtype == np.uint8}
        return block.astype(compact) if compact else block

    def store(design: IVDesign, block: pd.DataFrame) -> None:  # the dataclass's __init__ sets the blocks
        design.__dict__.setdefault("_blocks", {})[name] = block

    return property(read, store, doc=f"The {name} block, float64 columns.")


for _name in _BLOCKS:
    setattr(IVDesign, _name, _block_property(_name))


class ReorderedDesign:
    """Some of a design's rows in another order, for the passes of a fit: each block is gathered when a pass reads
    it, so the reordering costs an index array, not a copy of the design. Everything but the rows (names,
    positions, the declared constant, the boundary's facts, the column ranges) is the design's own.
    """

    def __init__(self, design: IVDesign, order: np.ndarray, groups: Any = None) -> None:
        self._design, self.order, self.groups = design, order, groups

    def __getattr__(self, name: str) -> Any:
        return getattr(self._design, name)

    @property
    def nobs(self) -> int:
        """The rows (PRIVATE with privacy units: the kept rows' count)."""
        return int(self.order.shape[0])

    def row_block(self, rows: slice) -> np.ndarray:
        """Rows ``rows`` of the reordered [dependent, exog, endog, instruments] as one float64 array
        (:func:`stack_rows`)."""
        return stack_rows(self._design._columns, self.order[rows])

    def blockwise_sum(self, func: Any, *args: Any) -> Any:
        """Σ over the blocks of reordered rows of ``func(block, *args)``, in ONE pass."""
        self._design._columns  # noqa: B018 - built once here, not concurrently by the pass's threads
        return add_parts(map_row_blocks(lambda rows: func(self.row_block(rows), *args), self.nobs))

    def grouped_sum(self, func: Any, level: str, *args: Any) -> Any:
        """Σ over blocks of whole groups of ``func(block, starts, *args)``, ``starts`` the offsets in the block of its
        groups of ``level`` ("unit" or "cluster"), in ONE pass."""
        self._design._columns  # noqa: B018
        groups = self.groups

        def run(rows: slice):
            return func(self.row_block(rows), groups.local(rows, level), *args)

        return add_parts(map_row_blocks(run, self.nobs, blocks=groups.blocks()))

    @cached_property
    def factor(self) -> ColumnFactor:
        """The kept rows' triangular factor (NON-PRIVATE; TSQR over blocks in one pass, as :attr:`IVDesign.factor`)."""
        self._design._columns  # noqa: B018
        parts = map_row_blocks(lambda rows: block_factor(self.row_block(rows)), self.nobs)
        return ColumnFactor(*combine_factors(parts))


# ---------------------------------------------------------------------------
# Formula splitting
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# Formula engines
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# Array inputs
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# Shared validation
# ---------------------------------------------------------------------------


def _drop_missing(
    blocks: dict[str, pd.DataFrame], already_dropped: int = 0, derived: Derived | None = None
) -> tuple[dict[str, pd.DataFrame], np.ndarray, Derived]:
    """
    Drop the rows with a missing value in any block (jointly).

    Parameters
    ----------
    blocks : dict of str to DataFrame
        The float64 blocks, on the same rows.
    already_dropped : int, optional
        Rows with missing values that the formula engine dropped before.
    derived : dict, optional
        The blocks' derived columns (:class:`IVDesign`'s ``derived``), read a block of rows at a time.

    Returns
    -------
    blocks : dict of str to DataFrame
        The blocks on the complete rows.
    missing : ndarray
        Boolean mask of the dropped rows among the rows of ``blocks``.
    derived : dict
        The derived columns on the complete rows.

    Raises
    ------
    ValueError
        If the data have no rows, or no row is left.
    """
    nobs = blocks["dependent"].shape[0]
    derived = dict(derived or {})
    missing = np.zeros(nobs, dtype=bool)
    for block, frame in blocks.items():
        for column in block_columns(frame, derived, block):
            for rows, values in column_blocks(column):
                missing[rows] |= np.isnan(values)
    n_dropped = int(missing.sum())
    total = nobs + already_dropped
    if total == 0:
        raise ValueError("the data have no rows; the design needs observations.")
    if n_dropped == nobs:
        raise ValueError(
            f"no rows left: all {total} rows have a missing value in the dependent "
            "variable, the exogenous or endogenous regressors or the instruments. "
            f"{DATA_CHECK_NOTE}"
        )
    if n_dropped:
        kept = np.flatnonzero(~missing)
        blocks = {block: _kept_rows(frame, ~missing, [j for owner, j in derived if owner == block])
                  for block, frame in blocks.items()}
        derived = {key: column.taken(kept) for key, column in derived.items()}
    return blocks, missing, derived


def _kept_rows(frame: pd.DataFrame, keep: np.ndarray, placeholders: list[int]) -> pd.DataFrame:
    """``frame.loc[keep]``, its derived columns' placeholders (:func:`_placeholder`) new ones of the kept length
    instead of copies."""
    if not placeholders:
        return frame.loc[keep]
    held = [j for j in range(frame.shape[1]) if j not in placeholders]
    rest = frame.iloc[:, held].loc[keep]
    n = rest.shape[0]
    arrays = {j: _placeholder(n) for j in placeholders}
    arrays.update({j: rest.iloc[:, i] for i, j in enumerate(held)})
    out = pd.DataFrame({j: arrays[j] for j in range(frame.shape[1])}, index=frame.index[keep], copy=False)
    out.columns = frame.columns
    return out


def _build(
    blocks: dict[str, pd.DataFrame],
    *,
    positions: np.ndarray,
    nrows: int,
    formula: str | None,
    formula_engine: str | None,
    constant: Any = None,
    boundary: dict | None = None,
    count_lost: Any = None,
    derived: Derived | None = None,
) -> tuple[IVDesign, np.ndarray]:
    """
    Drop missing rows, validate and assemble the design.

    Parameters
    ----------
    blocks : dict of str to DataFrame
        The four blocks on the same rows.
    positions : ndarray or None
        Positions of these rows in the caller's data, increasing; None: all ``nrows`` rows, in order.
    nrows : int
        Number of rows of the caller's data.
    formula, formula_engine : str or None
        Recorded in the design.
    constant : Hashable, None or False
        The intercept's declaration (:func:`declared_constant`).
    boundary : dict, optional
        The design's ``missing``, ``data_levels``, ``zero_allowed``, ... (:mod:`dpivreg.data.boundary`).
    count_lost : callable, optional
        ``count_lost(kept)``: the design's ``n_lost`` given the kept rows' positions (formulas only).
    derived : dict, optional
        The blocks' derived columns, ``{(block, position): DerivedColumn}`` (:func:`_formulaic_block`).

    Returns
    -------
    design : IVDesign
        The validated design.
    kept : ndarray or None
        Positions in the caller's data of the rows of the design; None when they are all its rows, in order.
    """
    _check_counts(blocks)
    full = _as_float_blocks(blocks)
    blocks, missing, kept_derived = _drop_missing(full, 0 if positions is None else nrows - positions.size, derived)
    if missing.any():
        kept = (np.arange(nrows) if positions is None else positions)[~missing]
    else:
        kept = positions  # None: all rows, in order (no n-length index array)
    n_kept = nrows if kept is None else kept.size
    boundary = boundary or {}
    findings = _validate(blocks, int(nrows - n_kept), full["instruments"], boundary.get("zero_allowed", ()),
                         kept_derived, derived)
    name = declared_constant(list(blocks["exog"].columns), constant)
    if name is not None:
        column = block_columns(blocks["exog"], kept_derived, "exog")[list(blocks["exog"].columns).index(name)]
        parts = [(values.min(), values.max()) for _, values in column_blocks(column)]
        check_declared_constant(name, float(min(low for low, _ in parts)), float(max(high for _, high in parts)))
    design = IVDesign(
        **blocks,
        formula=formula,
        formula_engine=formula_engine,
        n_dropped=int(nrows - n_kept),
        constant=name,
        source_rows=None if n_kept == nrows else kept,  # positions are increasing: all rows means all in order
        derived=kept_derived or None,
        n_lost=count_lost(kept) if count_lost is not None and n_kept < nrows else 0,
        data_findings=tuple(findings),
        **boundary,
    )
    rank = rank_findings(design)  # needs the design's factor, a pass over its rows: replace() would drop it
    if rank:
        object.__setattr__(design, "data_findings", design.data_findings + tuple(rank))
    return design, kept


def _fill_blocks(blocks: dict[str, pd.DataFrame], policy: MissingPolicy) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Array inputs under ``missing="fill"``: every column's missing values replaced by its public fill value
    (keys: the design's column names) and the indicators appended to exog; the blocks unchanged otherwise."""
    if policy.how != "fill":
        return blocks, []
    values = policy.fill_values
    columns = [name for block in _BLOCKS for name in blocks[block].columns]
    if isinstance(values, dict):
        unknown = [name for name in values if name not in columns]
        absent = [name for name in columns if name not in values]
        if unknown or absent:
            raise ValueError(f"fill_values must name every design column {columns} (the keys of array inputs are "
                             f"the design's column names); unknown {unknown}, without a value {absent}.")
    filled = {block: frame.fillna(values if isinstance(values, dict) else float(values)) if frame.shape[1] else frame
              for block, frame in blocks.items()}
    added = []
    for column in policy.indicators:
        block = next((b for b in _BLOCKS if column in blocks[b].columns), None)
        if block is None:
            raise ValueError(f"indicators names {column!r}, which is not a design column {columns}.")
        name = indicator_name(column)
        if name in columns:
            raise ValueError(f"the indicator's name {name!r} is already a design column; rename that column.")
        filled["exog"] = filled["exog"].assign(**{name: blocks[block][column].isna().astype(np.float64)})
        added.append(name)
    return filled, added


def _booleans_with_missing(data: pd.DataFrame, parts: _FormulaParts) -> pd.DataFrame:
    """``data`` with each column the formula reads whose values are all True/False or missing (dtype object) read as
    pandas' nullable ``"boolean"``: pandas reads a boolean CSV column as ``bool``, and as ``object`` once one value is
    missing, so the dtype is one row's to change; both are read as the same schema. A new frame when a column is
    converted (the caller's is not modified), ``data`` itself otherwise."""
    if not data.columns.is_unique:  # refused by _check_data_columns, naming the duplicates
        return data
    convert = [column for column in _formula_variables(parts, data)
               if data[column].dtype == np.dtype(object) and _booleans_only(data[column])]
    return data.assign(**{column: data[column].astype("boolean") for column in convert}) if convert else data


def _booleans_only(series: pd.Series) -> bool:
    present = series.dropna()
    return len(present) > 0 and all(isinstance(value, (bool, np.bool_)) for value in present)


def _warn_dropped(design: IVDesign, source: str, stacklevel: int) -> None:
    """Warn that rows with missing values were dropped."""
    if design.n_dropped == 0:
        return
    total = design.nobs + design.n_dropped
    warnings.warn(
        f"{source} dropped {design.n_dropped} of {total} rows "
        f"({100 * design.n_dropped / total:.1f}%) because they have a missing "
        "value in the dependent variable, the exogenous or endogenous regressors "
        f"or the instruments; {design.nobs} rows remain. Pass missing='fill' with public fill_values to keep "
        "every row, or missing='drop-public' if which rows are complete is public; a fit announces what this "
        "publishes. (The count is seen only by the data holder and is not a private release.)",
        DroppedRowsWarning,
        stacklevel=stacklevel + 1,
    )


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def design_from_formula(
    formula: str,
    data: pd.DataFrame,
    *,
    context: Mapping[str, Any] | None = None,
    formula_engine: str = "formulaic",
    missing: str = "drop",
    fill_values: Mapping[Hashable, Any] | float | None = None,
    indicators: list[Hashable] | tuple[Hashable, ...] = (),
) -> IVDesign:
    """
    Build a validated IV design from a formula.

    Parameters
    ----------
    formula : str
        ``dependent ~ exog + [endog ~ instruments]``. Exogenous terms may come
        before or after the bracket; the bracket may hold several endogenous
        variables and instruments. With a bracket there is no implicit
        intercept: write ``1 + ...`` to include one. Transformations such as
        ``np.log(x)``, ``I(x ** 2)``, interactions ``a:b`` and ``C(cat)`` (in
        exog) are supported.
    data : DataFrame
        The variables used in the formula. It is not modified.
    context : Mapping, optional
        Variables and functions used to evaluate the formula in addition to
        ``data``. Wrappers should pass the namespace of their caller, e.g.
        ``formulaic.utils.context.capture_context(1)``. If None, the namespace
        of the caller of this function is used.
    formula_engine : {"formulaic", "patsy"}, optional
        "formulaic" (default) builds exactly the blocks of
        ``linearmodels.iv.IV2SLS.from_formula``. "patsy" uses patsy's naming
        and coding (``Intercept``, ``b[T.True]``, terms in written order), as
        statsmodels does.
    missing : {"drop", "drop-public", "fill"}, optional
        Rows with a missing value: ``"drop"`` (default, as linearmodels) drops them jointly, and a
        fit then announces that the count of complete rows is published; ``"drop-public"`` drops
        them with that count declared public; ``"fill"`` keeps every row, replacing each missing
        value of a variable the formula reads by its public ``fill_values`` entry (see
        :mod:`dpivreg.data.boundary`). Filling changes the estimand: the regression is that of the
        filled data.
    fill_values : float or Mapping, optional
        ``missing="fill"`` only: one number for every numeric column, or ``{column: value}`` for
        the columns that the formula reads and that can hold a missing value (NumPy integer and
        boolean columns cannot); a category's value must be a declared category. A codebook may
        name columns the formula does not use.
    indicators : list, optional
        ``missing="fill"`` only: columns whose filled rows get a 0/1 exogenous regressor
        ``missing_<column>``, appended to the formula's exogenous terms.

    Returns
    -------
    IVDesign
        The float64 blocks on the rows that have no missing value.

    Raises
    ------
    TypeError
        If ``formula`` is not a string, ``data`` is not a DataFrame or
        ``context`` is not a mapping.
    ValueError
        If ``formula_engine`` is unknown, the formula is malformed or has no
        ``[endog ~ instruments]`` block, it names an unknown variable, or the
        design is invalid (under-identified, infinite values, too few rows).

    Warns
    -----
    DataCheckWarning
        For a constant or duplicate instrument or collinear columns (NON-PRIVATE findings, recorded in
        ``data_findings``: one row can change them, so they do not stop a fit; ``fit(check_data=True)`` refuses).
    DroppedRowsWarning
        If rows with a missing value in any block were dropped.
    EncodedMissingWarning
        If a column used by the formula is missing in rows that the design
        keeps, because the formula encoded the missing value (formulaic codes
        a missing category as the reference level, as linearmodels does).

    Notes
    -----
    With "formulaic", a block whose terms are only ``0``, ``1`` and numeric columns is built directly, as
    formulaic would build it (:func:`plain_column_block`), sharing the caller's float64 columns under pandas'
    copy-on-write (the design then holds no copy of them); every other block by formulaic, in new memory,
    131,072 rows at a time when its expressions act on each row alone
    (:func:`dpivreg.data.formula_replay.replay_problems`), from all rows at once otherwise. Columns of 0/1 values
    are held as uint8.

    With "patsy", ``1`` adds patsy's ``Intercept`` column and ``0 +`` or
    ``- 1`` remove it. Each patsy block is built separately with missing rows
    dropped by patsy (so a missing category is missing), and only the rows
    present in all blocks are kept.

    Examples
    --------
    >>> design = design_from_formula("weeks ~ 1 + educ + [kids ~ samesex]", df)
    >>> design.regressor_names
    ['Intercept', 'educ', 'kids']
    """
    if not isinstance(formula, str):
        raise TypeError(f"formula must be a string, got {type(formula).__name__}.")
    if not isinstance(data, pd.DataFrame):
        raise TypeError(
            f"data must be a pandas DataFrame, got {type(data).__name__}; wrap "
            "arrays with pandas.DataFrame or use design_from_arrays."
        )
    if formula_engine not in FORMULA_ENGINES:
        raise ValueError(
            f"formula_engine must be one of {list(FORMULA_ENGINES)}, got "
            f"{formula_engine!r}."
        )
    if context is None:
        from formulaic.utils.context import capture_context  # noqa: PLC0415

        context = capture_context(1)
    elif not isinstance(context, Mapping):
        raise TypeError(
            f"context must be a mapping of names to objects, got {type(context).__name__}."
        )
    policy = missing_policy(missing, fill_values, indicators)
    parts = _split_formula(formula)
    nrows = int(data.shape[0])
    if nrows == 0 and data.shape[1] > 0:
        # formulaic would build blocks without columns (e.g. from object
        # columns) and fail with a misleading message.
        raise ValueError(
            f"the data have no rows (columns {list(data.columns)[:10]}"
            f"{' ...' if data.shape[1] > 10 else ''}); the design needs observations."
        )
    data = _booleans_with_missing(data, parts)
    _check_data_columns(data, parts)
    formula, data, parts, added = apply_missing_policy(formula, data, parts, policy)
    if formula_engine == "formulaic":
        blocks, derived = _formulaic_blocks(formula, data, parts, context)
        positions = None  # every row of data, in order
    else:
        (blocks, positions), derived = _patsy_blocks(data, parts, context), {}
    design, kept = _build(
        blocks,
        positions=positions,
        nrows=nrows,
        formula=formula,
        formula_engine=formula_engine,
        boundary=formula_boundary(data, parts, policy, added, blocks, data.head(256), context, formula_engine),
        count_lost=lambda kept: lost_rows(data, parts, kept),
        derived=derived,
    )
    _warn_dropped(design, "design_from_formula", stacklevel=2)
    warn_findings(design.data_findings, stacklevel=2)
    _warn_encoded_missing(data, parts, kept, stacklevel=2)
    return design


def apply_missing_policy(formula: str, data: Any, parts: _FormulaParts, policy: MissingPolicy
                         ) -> tuple[str, Any, _FormulaParts, list[str]]:
    """With ``missing="fill"``: the formula with the indicators appended to its exogenous terms, the filled
    frame (a new one; pandas or Dask), its parts and the indicators' names; otherwise the inputs unchanged."""
    if policy.how != "fill":
        return formula, data, parts, []
    data, added = fill_frame(data, _formula_variables(parts, data), policy)
    if added:
        formula = f"{formula} + {' + '.join(added)}"
        parts = _split_formula(formula)
    return formula, data, parts, added


def formula_boundary(data: Any, parts: _FormulaParts, policy: MissingPolicy, added: list[str],
                     blocks: Mapping[str, Any], sample: pd.DataFrame, context: Mapping[str, Any],
                     engine: str = "formulaic", rows: Any = None) -> dict:
    """The design's boundary fields (:mod:`dpivreg.data.boundary`) from names, dtypes, the factors' kinds (read by
    the formula engine on ``sample``, a few rows or a synthetic frame with the data's types) and the policy."""
    names = [name for block in _BLOCKS for name in blocks[block].columns]
    categorical, stateful = _factor_kinds(parts, sample, context, engine)
    data_levels = data_derived_levels(data, categorical)
    declared = [factor for factor in categorical if factor not in data_levels]
    # the caller's own functions are tried on real rows: the sample (pandas) or ``rows()``, read only if needed (Dask)
    rows = sample if len(data) else rows
    row_reading = row_reading_terms(_block_formulas(parts).values(), data, context, sample=rows,
                                    known=stateful)
    return {"missing": policy.how, "data_levels": data_levels, "stateful": stateful, "row_reading": row_reading,
            "zero_allowed": declared_zero_columns(names, declared, added),
            "data_columns": tuple(data.columns), "unit_columns": unit_columns(names, categorical, data, added)}


def lost_rows(data: pd.DataFrame, parts: _FormulaParts, kept: np.ndarray) -> int:
    """Rows of ``data`` not in ``kept`` (positions) none of whose values in the formula's columns is missing."""
    used = _formula_variables(parts, data)
    dropped = np.ones(data.shape[0], dtype=bool)
    dropped[kept] = False
    complete = ~data[used].isna().any(axis=1).to_numpy() if used else np.ones(data.shape[0], dtype=bool)
    return int(np.count_nonzero(dropped & complete))


def _warn_encoded_missing(
    data: pd.DataFrame, parts: _FormulaParts, kept: np.ndarray | None, stacklevel: int
) -> None:
    """Warn if the design keeps rows where a variable of the formula is missing."""
    columns, n_rows = _encoded_missing(data, parts, kept)
    if columns:
        _emit_encoded_missing(columns, n_rows, stacklevel=stacklevel + 1)


def _emit_encoded_missing(columns: list[Hashable], n_rows: int, stacklevel: int) -> None:
    """Warn that ``n_rows`` kept rows have a missing value in ``columns`` that the formula encoded."""
    warnings.warn(
        f"{n_rows} row(s) kept in the design have a missing value in column(s) "
        f"{columns} of `data`: the formula turned the missing value into a number "
        "(e.g. formulaic and linearmodels code a missing category of C(...) as the "
        "reference level). If these rows should be dropped, drop them first, e.g. "
        f"data.dropna(subset={columns}). (The count is seen only by the data holder and is not a private "
        "release.)",
        EncodedMissingWarning,
        stacklevel=stacklevel + 1,
    )


