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
condition, constant or duplicate instruments, rank, infinite values, enough
rows). The caller's data are never modified.

Memory: plain float64 columns are shared with the caller's frame (:func:`plain_column_block`); a formula whose
terms act row by row is built a block of rows at a time (:func:`_formulaic_block`), and its transformed terms
(``np.log(s)``, ``C(g)``) are computed for the rows each pass reads instead of held (:mod:`dpivreg.derived_columns`);
other columns the design computes are held compactly where that is exact (0/1 columns as uint8, a column of ones
as one broadcast value, :class:`_CompactColumns`). Every pass reads float64 blocks of rows (:func:`stack_rows`).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
import keyword
import re
from typing import Any
import warnings

import numpy as np
import pandas as pd
from pandas.api.types import is_bool_dtype, is_complex_dtype, is_numeric_dtype

from .backends import add_parts, map_row_blocks, row_blocks
from .boundary import (DATA_CHECK_NOTE, BoundaryFacts, MissingPolicy, data_derived_levels, declared_zero_columns, fill_frame,
                       indicator_name, missing_policy, unit_columns)
from .cross_products import ColumnFactor, block_factor, check_factor_rank, combine_factors
from .derived_columns import DerivedColumn, derived_terms, intercept_columns
from .formula_replay import formula_problems, replay_problems

__all__ = [
    "FORMULA_ENGINES",
    "DroppedRowsWarning",
    "EncodedMissingWarning",
    "IVDesign",
    "design_from_arrays",
    "design_from_formula",
]

#: Formula engines accepted by :func:`design_from_formula`.
FORMULA_ENGINES: tuple[str, ...] = ("formulaic", "patsy")

_BLOCKS: tuple[str, ...] = ("dependent", "exog", "endog", "instruments")
_BLOCK_LABELS: dict[str, str] = {
    "dependent": "dependent variable",
    "exog": "exogenous regressors (exog)",
    "endog": "endogenous regressors (endog)",
    "instruments": "instruments",
}
_FORMULA_HELP = (
    "An IV formula has the form 'dependent ~ exog + [endog ~ instruments]', "
    "e.g. 'weeks ~ 1 + educ + [kids ~ samesex]'."
)
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_UNKNOWN_NAME = (
    re.compile(r"`([^`]+)` is not present in the dataset"),
    re.compile(r"name '([^']+)' is not defined"),
)


class DroppedRowsWarning(UserWarning):
    """Rows with a missing value in any design block were dropped."""


class EncodedMissingWarning(UserWarning):
    """
    A variable used by the formula is missing in rows that the design keeps.

    This happens when the formula turns a missing value into a number, e.g.
    formulaic (and therefore linearmodels) codes a missing category of
    ``C(cat)`` as the reference level.
    """


# ---------------------------------------------------------------------------
# The design
# ---------------------------------------------------------------------------


#: Exogenous column names that declare the intercept: the formula's intercept term (formulaic and patsy name it
#: "Intercept") and statsmodels' ``add_constant`` ("const"). The intercept is part of the design, hence public;
#: dpivreg never infers it from the values, which would let one row decide what is released.
CONSTANT_NAMES: tuple[str, ...] = ("Intercept", "const")


def declared_constant(exog_names: list[Hashable], constant: Any = None) -> Hashable | None:
    """The exogenous column declared as the intercept: ``constant`` if a name, none if ``False``, otherwise the
    first exogenous column named as in :data:`CONSTANT_NAMES`. Depends on names only (public)."""
    if constant is False:
        return None
    if constant is None:
        return next((name for name in exog_names if isinstance(name, str) and name in CONSTANT_NAMES), None)
    if isinstance(constant, bool) or constant not in exog_names:
        raise ValueError(f"constant must be the name of an exogenous column {exog_names}, None (a column named "
                         f"{' or '.join(CONSTANT_NAMES)}) or False (no intercept), got {constant!r}.")
    return constant


def check_declared_constant(name: Hashable | None, lowest: float, highest: float) -> None:
    """Raise unless the declared intercept holds one nonzero value (``lowest``/``highest``: its range)."""
    if name is None or (lowest == highest and lowest != 0):
        return
    raise ValueError(
        f"the exogenous column {name!r} is declared as the intercept (by its name or constant=) but its values "
        f"are not one nonzero number (they range over [{lowest:g}, {highest:g}]). Rename the column, or pass "
        "constant=False to DPIV2SLS(...) to treat it as an ordinary regressor (it then needs bounds). "
        f"{DATA_CHECK_NOTE}"
    )


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
        """Names of the design's rows' columns [dependent, exog, endog, instruments] (the order of :attr:`positions`)."""
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
        (:mod:`dpivreg.derived_columns`) instead of held; the block holds a placeholder at their position (one
        value broadcast over the rows), and reading the block (``design.exog``) computes them.
    missing, data_levels, zero_allowed, n_lost, data_columns, unit_columns, stateful
        Keyword-only: the privacy boundary's facts (:class:`dpivreg.boundary.BoundaryFacts`).

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
    # two designs of different data compared equal; found by review).
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
        """Unpickle, also a design pickled before the blocks moved to ``_blocks`` (dpivreg 0.1)."""
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
        (:func:`dpivreg.backends.map_row_blocks`): the counterpart of the Dask design's pass."""
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
        """The columns' triangular factor (NON-PRIVATE, :mod:`dpivreg.cross_products`), by TSQR over the
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
        :class:`dpivreg.units.RowGroups` of the reordered rows)."""
        return ReorderedDesign(self, np.asarray(order, dtype=np.int64), groups)


#: A design's derived columns: ``{(block, position): DerivedColumn}``.
Derived = Mapping[tuple[str, int], DerivedColumn]


def _block_property(name: str) -> property:
    """``IVDesign.<name>``: the block with float64 columns. A column held as uint8 (0/1 values) is widened in a new
    frame (arithmetic on uint8 wraps around, 0 − 1 = 255; found by review), and derived columns are computed into
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


def frame_columns(frame: pd.DataFrame) -> list[np.ndarray]:
    """Each column of a design block as a 1-D array, a view of pandas' values where pandas allows (it always does
    for float64 columns and for the uint8 columns of 0/1 values of :class:`_CompactColumns`, which stay uint8):
    reading a block column by column never consolidates it into a copy."""
    columns = (frame.iloc[:, j] for j in range(frame.shape[1]))
    return [column.to_numpy() if column.dtype == np.uint8 else column.to_numpy(dtype=np.float64) for column in columns]


def block_columns(frame: pd.DataFrame, derived: Derived | None, block: str) -> list[np.ndarray | DerivedColumn]:
    """:func:`frame_columns` of design block ``block``, each derived column (``derived``, keyed by (block,
    position)) in place of its placeholder."""
    columns: list[np.ndarray | DerivedColumn] = list(frame_columns(frame))
    for (owner, j), column in (derived or {}).items():
        if owner == block:
            columns[j] = column
    return columns


def column_blocks(column: np.ndarray | DerivedColumn):
    """``(rows, values)`` covering a column: the whole array at once, a derived column a block of rows at a time
    (its values are never held whole)."""
    if isinstance(column, DerivedColumn):
        return ((rows, column[rows]) for rows in row_blocks(column.size))
    return iter(((slice(None), column),))


def whole_column(column: np.ndarray | DerivedColumn) -> np.ndarray:
    """A column's values as one array (computed, for a derived column: only for error messages)."""
    return column.values() if isinstance(column, DerivedColumn) else column


def column_checksum(block: np.ndarray) -> np.ndarray:
    """Per column of a float64 block, the sum of its values' bit patterns as unsigned 64-bit integers, wrapping
    (exact modular arithmetic: the same for any split into blocks and any order of adding them). Any change of one
    value changes it; the design records it to detect data changed behind pandas' back (:func:`plain_column_block`)."""
    return np.asarray(block, dtype=np.float64).view(np.uint64).sum(axis=0, dtype=np.uint64)


def stack_rows(columns: tuple[np.ndarray, ...], rows: slice | np.ndarray) -> np.ndarray:
    """Rows ``rows`` (a slice or positions) of 1-D columns as one (rows × columns) float64 array in column-major
    order: each column a contiguous copy, and LAPACK's QR of the block (:func:`dpivreg.cross_products.block_factor`)
    reads it in place (on a row-major block it took three times as long, measured)."""
    first = columns[0][rows]
    out = np.empty((first.shape[0], len(columns)), order="F")
    out[:, 0] = first
    for j, column in enumerate(columns[1:], start=1):
        out[:, j] = column[rows]
    return out


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
        """Rows ``rows`` of the reordered [dependent, exog, endog, instruments] as one float64 array (:func:`stack_rows`)."""
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


@dataclass(frozen=True)
class _FormulaParts:
    """The text of the four blocks of an IV formula (``exog`` may be empty)."""

    dependent: str
    exog: str
    endog: str
    instruments: str


def _check_count(text: str, char: str, expected: int, where: str) -> None:
    """Raise if ``text`` does not contain ``char`` exactly ``expected`` times."""
    found = text.count(char)
    if found != expected:
        raise ValueError(
            f"formula must have exactly {expected} '{char}' {where}, found "
            f"{found}. {_FORMULA_HELP}"
        )


def _check_term_block(text: str, label: str) -> None:
    """Raise if a block of the bracket is empty or starts or ends with '+'."""
    if not text:
        raise ValueError(
            f"the {label} block of the formula is empty: name at least one "
            f"variable. {_FORMULA_HELP}"
        )
    if text[0] == "+" or text[-1] == "+":
        raise ValueError(
            f"the {label} block must not start or end with '+', got {text!r}."
        )


def _top_level_brackets(text: str) -> tuple[list[int], list[int]]:
    """Positions of the '[' and ']' outside parentheses and quotes: the IV block's, not those of a list
    argument such as ``C(g, levels=['a', 'b'])``. With unbalanced parentheses every bracket counts (the
    formula engine then reports the parenthesis)."""
    if text.count("(") != text.count(")"):
        return ([i for i, c in enumerate(text) if c == "["], [i for i, c in enumerate(text) if c == "]"])
    opens, closes, depth, quote = [], [], 0, None
    for i, char in enumerate(text):
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "'\"`":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif depth == 0 and char == "[":
            opens.append(i)
        elif depth == 0 and char == "]":
            closes.append(i)
    return opens, closes


def _split_formula(formula: str) -> _FormulaParts:
    """
    Split and check the structure of an IV formula.

    Parameters
    ----------
    formula : str
        Formula of the form ``dep ~ exog + [endog ~ instruments]``; exogenous
        terms may also follow the bracket (``dep ~ 1 + [x ~ z] + w``).

    Returns
    -------
    _FormulaParts
        The text of the blocks, with the exogenous terms before and after the
        bracket joined as linearmodels joins them.

    Raises
    ------
    ValueError
        If the formula has no bracket, several or unbalanced brackets, the
        wrong number of '~', or an empty block.
    """
    text = formula.strip()
    if not text:
        raise ValueError(f"formula is empty. {_FORMULA_HELP}")
    opens, closes = _top_level_brackets(text)
    n_open, n_close = len(opens), len(closes)
    if n_open != n_close:
        raise ValueError(
            f"formula has unbalanced brackets ({n_open} '[' and {n_close} ']'). "
            f"{_FORMULA_HELP}"
        )
    if n_open == 0:
        if "~" not in text:
            raise ValueError(f"formula has no '~'. {_FORMULA_HELP}")
        raise ValueError(
            "formula has no [endog ~ instruments] block, so there is no "
            "endogenous variable to instrument. For a model without endogenous "
            "variables use OLS (e.g. statsmodels.formula.api.ols or "
            f"linearmodels.OLS). {_FORMULA_HELP}"
        )
    if n_open > 1:
        raise ValueError(
            f"formula has {n_open} bracket blocks; only one [endog ~ instruments] "
            "block is allowed. Put all endogenous variables and all instruments "
            "in one block, e.g. '[x1 + x2 ~ z1 + z2 + z3]'."
        )
    lb, rb = opens[0], closes[0]
    if rb < lb:
        raise ValueError(f"formula has unbalanced brackets (']' before '['). {_FORMULA_HELP}")
    before, inside, after = text[:lb], text[lb + 1 : rb], text[rb + 1 :]
    _check_count(before, "~", 1, "before the bracket block")
    _check_count(inside, "~", 1, "inside the bracket block")
    _check_count(after, "~", 0, "after the bracket block")

    dependent, left = (part.strip() for part in before.split("~"))
    endog, instruments = (part.strip() for part in inside.split("~"))
    right = after.strip()
    if not dependent:
        raise ValueError(
            f"the dependent variable (left of the first '~') is empty. {_FORMULA_HELP}"
        )
    _check_term_block(endog, "endogenous (left of '~' inside [...])")
    _check_term_block(instruments, "instruments (right of '~' inside [...])")
    if left.endswith("+"):
        left = left[:-1].strip()
    if left and right and right[0] not in "+-":
        raise ValueError(
            "exogenous terms after the bracket block must be joined with '+', "
            f"e.g. '... [endog ~ instruments] + {right}', got '] {right}'."
        )
    exog = f"{left} {right}".strip()
    return _FormulaParts(dependent, exog, endog, instruments)


def _block_formulas(parts: _FormulaParts) -> dict[str, str | None]:
    """Right-hand-side formula of every block, without an implicit intercept."""
    return {
        "dependent": f"0 + {parts.dependent}",
        "exog": f"0 + {parts.exog}" if parts.exog else None,
        "endog": f"0 + {parts.endog}",
        "instruments": f"0 + {parts.instruments}",
    }


def _unknown_name(exc: BaseException) -> str | None:
    """Name that a formula engine could not find, read from its error chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for pattern in _UNKNOWN_NAME:
            match = pattern.search(str(current))
            if match:
                return match.group(1)
        current = current.__cause__ or current.__context__
    return None


def _block_error(block: str, text: str, engine: str, exc: Exception) -> ValueError:
    """A ValueError that says which block failed and why, for ``raise ... from``."""
    message = _ANSI_ESCAPE.sub("", str(exc)).strip()
    name = _unknown_name(exc)
    label = _BLOCK_LABELS[block]
    if name is not None:
        return ValueError(
            f"unknown column or name {name!r} in the {label} block {text!r}: it "
            "is neither a column of `data` nor a variable of the formula's "
            f"context. Check the spelling or pass it in `context`. ({engine}: "
            f"{message})"
        )
    return ValueError(
        f"could not build the {label} block {text!r} with {engine}: "
        f"{type(exc).__name__}: {message}"
    )


# ---------------------------------------------------------------------------
# Formula engines
# ---------------------------------------------------------------------------


def _formulaic_context(context: Mapping[str, Any]) -> Mapping[str, Any]:
    """
    A non-empty context for formulaic: an empty mapping becomes ``{"np": numpy}``,
    so that ``np.log(x)`` resolves whatever namespace the caller passed.
    """
    return context if len(context) > 0 else {"np": np}


#: Per block: does linearmodels' parser ask formulaic for a full-rank block (``IVFormulaParser``)?
FULL_RANK_BLOCKS: dict[str, bool] = {"dependent": False, "exog": True, "endog": False, "instruments": False}


def formulaic_block_matrix(block: str, text: str, data: pd.DataFrame, context: Mapping[str, Any]):
    """One block's formulaic model matrix with linearmodels' settings (:data:`FULL_RANK_BLOCKS`, missing
    values kept); an error names the block (:func:`_block_error`)."""
    from formulaic import Formula  # noqa: PLC0415

    try:
        return Formula(text).get_model_matrix(data, context=_formulaic_context(context),
                                              ensure_full_rank=FULL_RANK_BLOCKS[block], na_action="ignore")
    except Exception as exc:  # noqa: BLE001 - wrapped with the cause attached
        raise _block_error(block, text, "formulaic", exc) from exc


def _formulaic_blocks(
    formula: str, data: pd.DataFrame, parts: _FormulaParts, context: Mapping[str, Any]
) -> tuple[dict[str, pd.DataFrame], dict[tuple[str, int], DerivedColumn]]:
    """
    Materialise the blocks with formulaic as linearmodels' ``IVFormulaParser`` does.

    Each block's formula (:func:`_block_formulas`) is built with
    ``Formula(text).get_model_matrix(data, ensure_full_rank=..., na_action="ignore")``, the
    settings of linearmodels' parser (:data:`FULL_RANK_BLOCKS`); the split is ours, so a list
    argument such as ``C(g, levels=['a', 'b'])`` is not read as the IV block.

    Parameters
    ----------
    formula : str
        The IV formula, already checked by :func:`_split_formula`.
    data : DataFrame
        The caller's data.
    parts : _FormulaParts
        The split formula, used in error messages.
    context : Mapping
        Variables used to evaluate the formula in addition to ``data``.

    Returns
    -------
    blocks : dict of str to DataFrame
        Every block with all rows of ``data`` (missing values kept).
    derived : dict
        ``{(block, position): DerivedColumn}``: the columns computed per block of rows (:func:`_formulaic_block`),
        placeholders in ``blocks``.
    """
    blocks: dict[str, pd.DataFrame] = {}
    derived: dict[tuple[str, int], DerivedColumn] = {}
    for block, text in _block_formulas(parts).items():
        if text is None:
            blocks[block] = _empty_block(data.index)
            continue
        plain = plain_column_block(text, data)
        if plain is not None:
            blocks[block] = plain
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            frame, computed = _formulaic_block(block, text, data, context)
        _check_undeclared_levels(caught, block, text)
        blocks[block] = frame
        derived.update({(block, j): column for j, column in computed.items()})
    return blocks, derived


#: Rows per block when a formula is built block by block (:func:`_formulaic_block`): formulaic costs about 12 ms a
#: call plus 0.1 µs a row (measured at 10⁶ rows), and a block's intermediate frames are a few times its size.
FORMULA_BLOCK_ROWS = 1 << 17


def _formulaic_block(block: str, text: str, data: pd.DataFrame,
                     context: Mapping[str, Any]) -> tuple[pd.DataFrame, dict[int, DerivedColumn]]:
    """
    One block built by formulaic, :data:`FORMULA_BLOCK_ROWS` rows at a time when that gives the same matrix, and
    the columns of that block computed per block of rows instead of held (``{position: DerivedColumn}``).

    When the formula's expressions act on each row alone (:func:`dpivreg.formula_replay.formula_problems`, from the
    text), the first rows are built with :func:`formulaic_block_matrix`; when its model spec replays exactly too
    (:func:`dpivreg.formula_replay.replay_problems`: declared category levels, no stateful transform), the terms
    with a recipe that reproduces those rows (:func:`dpivreg.derived_columns.derived_terms`: a numeric expression
    of numeric columns, a categorical column's coding) become :class:`DerivedColumn` s, held as a placeholder in
    the frame, and the spec is applied to each later block of rows for the other columns, their values written
    into the design's columns (:class:`_CompactColumns`), so formulaic's intermediate frames never hold more than
    a block. Without pandas' copy-on-write no column is derived (a recipe shares the caller's columns, as
    :func:`plain_column_block` does). Otherwise (a function of the caller's own, ``np.mean``, an array of the
    namespace, levels read from a text column, ``center()``, ...) formulaic builds the block from all rows at
    once, as linearmodels does, and the first rows' own build (which might fail or warn on those rows alone) is
    dropped. Either way the design holds the columns compactly (0/1 columns as uint8).
    """
    rows = FORMULA_BLOCK_ROWS
    n = data.shape[0]
    ctx = _formulaic_context(context)
    first = _replaying_first_rows(block, text, data, context, ctx)
    replay = first is not None
    if not replay:
        first = formulaic_block_matrix(block, text, data, context)
    recipes = derived_terms(first, data, ctx) if replay and _copy_on_write() else {}
    values = float_values(pd.DataFrame(first), block)
    columns = _CompactColumns(n, values, skip=recipes, ones=intercept_columns(first) if replay else ())
    for start in range(rows, n, rows) if replay else ():
        try:
            if columns.replayed:
                part = first.model_spec.get_model_matrix(data.iloc[start:start + rows], context=ctx)
                columns.write(start, float_values(pd.DataFrame(part), block))
            for recipe in recipes.values():  # every row computed once, as formulaic would: its warnings, its errors
                recipe(slice(start, min(start + rows, n)))
        except Exception as exc:  # noqa: BLE001 - wrapped with the cause attached, as for the first rows
            raise _block_error(block, text, "formulaic", exc) from exc
    frame = columns.frame(data.index, list(first.columns))
    frame.attrs[_FLOAT_BLOCK] = True  # already the design's block: _as_float_blocks keeps it
    return frame, {j: DerivedColumn(recipe, n) for j, recipe in recipes.items()}


def _replaying_first_rows(block: str, text: str, data: pd.DataFrame, context: Mapping[str, Any],
                          ctx: Mapping[str, Any]):
    """formulaic's matrix of the first :data:`FORMULA_BLOCK_ROWS` rows when its spec replays exactly on the later
    ones (with its warnings), else None: fewer rows, expressions that do not act row by row (checked from the text
    first: the first rows alone might not even build), a build of the first rows that fails (all rows at once then
    say whether the formula does), or a spec with problems (its warnings dropped)."""
    rows = FORMULA_BLOCK_ROWS
    if data.shape[0] <= rows or formula_problems(text, data, ctx):
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            first = formulaic_block_matrix(block, text, data.iloc[:rows], context)
        except ValueError:
            return None
    if replay_problems(first.model_spec, data, ctx):
        return None
    for record in caught:
        warnings.warn_explicit(record.message, record.category, record.filename, record.lineno)
    return first


class _CompactColumns:
    """A design block's n-long columns in new memory, filled a block of rows at a time: a column whose values so far
    are all 0 or 1 (dummies, indicators) is held as uint8, one byte a row instead of eight, and becomes float64 at its
    first other value (a NaN, a −0.0 too), so every value reads back exactly; a column of ones (the intercept) is one
    value broadcast over the rows, as in :func:`plain_column_block`. Every pass reads the columns as float64
    (:func:`stack_rows`). The columns at positions ``skip`` (derived columns) are not held: a placeholder, one value
    broadcast over the rows, stands in their place."""

    def __init__(self, n: int, first: np.ndarray, skip: Collection[int] = (), ones: Collection[int] = ()) -> None:
        ones = {j for j in ones if np.all(first[:, j] == 1.0)}
        self.skip = frozenset(skip) | ones
        self.arrays = [_placeholder(n) if j in skip else _ones(n) if j in ones
                       else np.empty(n, dtype=np.uint8 if _zero_or_one(column) else np.float64)
                       for j, column in enumerate(first.T)]
        self.write(0, first)

    @property
    def replayed(self) -> bool:
        """Whether a column needs formulaic's values for the later rows: one neither derived nor ``ones``, the
        intercept's positions (a term ``1`` is ones on every row)."""
        return len(self.skip) < len(self.arrays)

    def write(self, start: int, values: np.ndarray) -> None:
        """Rows ``start:start + len(values)`` of every column (but the skipped ones)."""
        stop = start + values.shape[0]
        for j, column in enumerate(values.T):
            if j in self.skip:
                continue
            target = self.arrays[j]
            if target.dtype == np.uint8 and not _zero_or_one(column):
                widened = np.empty(target.shape[0])
                widened[:start] = target[:start]
                target = self.arrays[j] = widened
            target[start:stop] = column

    def frame(self, index: pd.Index, names: list) -> pd.DataFrame:
        """The columns as a design block, without copying them."""
        arrays = [_ones(array.shape[0]) if array.dtype == np.uint8 and array.all() else array
                  for array in self.arrays]
        frame = pd.DataFrame(dict(enumerate(arrays)), index=index, copy=False)
        frame.columns = names
        return frame


def _ones(n: int) -> np.ndarray:
    """The intercept's column: 1.0 broadcast over the rows, no memory."""
    return np.broadcast_to(np.float64(1.0), (n,))


def _placeholder(n: int) -> np.ndarray:
    """What a block holds in place of a derived column: one value (NaN) broadcast over the rows, no memory."""
    return np.broadcast_to(np.float64(np.nan), (n,))


def _zero_or_one(values: np.ndarray) -> bool:
    """Whether every value is exactly +0.0 or 1.0 (a uint8 holds it exactly)."""
    return bool(np.all((values == 1.0) | ((values == 0.0) & ~np.signbit(values))))


_PLAIN_TERM = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def plain_column_block(text: str, data: pd.DataFrame) -> pd.DataFrame | None:
    """The block formulaic would build from ``text`` when its terms are only ``0``, ``1`` and numeric columns
    of ``data`` joined by ``+``, without running formulaic; None for any other block (formulaic builds it).
    The block is already the design's float64 block.

    formulaic's rules for such a block (checked column for column by the parity tests): the last ``0`` or
    ``1`` decides the intercept, which comes first as ``Intercept``, a float column of ones; the columns
    follow in the order they are first named, each once, with their own values and dtype (missing values
    kept). Formulaic spends most of a plain design's build time on this (0.1 s at 10⁶ rows, measured).

    Memory: with pandas' copy-on-write (pandas ≥ 3) the block shares the caller's float64 columns, and the
    intercept is one value broadcast over the rows, so the design costs no copy of the data; a later write by
    the caller into their frame copies *their* column and leaves the design's values as they were (pandas
    tracks the shared memory; tested). Writes into a NumPy array that the caller's frame itself views
    (``DataFrame(array, copy=False)``) bypass pandas and reach the design too: a fit compares the rows it reads
    with the design's :attr:`IVDesign.column_checksum` and refuses changed data, and its streamed working rows
    refuse values that are no longer finite (:meth:`dpivreg.preprocess.WorkingRows.block`). Integer columns are
    converted (:func:`_converted_column`: a uint8 copy of a 0/1 column, a float64 copy of any other). Without
    copy-on-write (pandas 2 without the option), the block is copied into new memory.
    """
    intercept, names = False, []
    for term in (token.strip() for token in text.split("+")):
        if term in ("0", "1"):
            intercept = term == "1"
        elif (_PLAIN_TERM.fullmatch(term) and not keyword.iskeyword(term) and term != "Intercept"
              and _is_plain_number_column(data, term)):
            if term not in names:
                names.append(term)
        else:
            return None
    columns = ["Intercept", *names] if intercept else names
    if not columns:
        return None
    if _copy_on_write():
        parts: dict[str, Any] = {"Intercept": _ones(data.shape[0])} if intercept else {}
        shared = data[names]  # pandas' lazy copy: the caller's columns, their memory tracked
        for name in names:
            column = shared[name]
            parts[name] = column if column.dtype == np.float64 else _converted_column(column.to_numpy())
        block = pd.DataFrame(parts, index=data.index, copy=False)
    else:
        values = np.empty((len(columns), data.shape[0]))  # pandas' own layout: one row per column
        for row, name in enumerate(columns):
            values[row] = 1.0 if name == "Intercept" else data[name].to_numpy()  # no data term is named Intercept
        block = pd.DataFrame(values.T, index=data.index, columns=columns, copy=False)
    block.attrs[_FLOAT_BLOCK] = True
    return block


def _converted_column(values: np.ndarray) -> np.ndarray:
    """An integer column in new memory as the design holds it (:class:`_CompactColumns`): uint8 for 0/1 values,
    float64 otherwise."""
    as_float = values.astype(np.float64)
    return values.astype(np.uint8) if _zero_or_one(as_float) else as_float


def _copy_on_write() -> bool:
    """Whether pandas protects a frame that shares a caller's columns from the caller's later writes: always from
    pandas 3, behind ``pd.options.mode.copy_on_write = True`` in pandas 2."""
    if int(pd.__version__.split(".")[0]) >= 3:
        return True
    return pd.get_option("mode.copy_on_write") is True


def _is_plain_number_column(data: pd.DataFrame, name: str) -> bool:
    """A column of ``data`` named once, holding real numbers in a NumPy dtype (not bool, not complex)."""
    if int(np.count_nonzero(data.columns == name)) != 1:
        return False
    dtype = data[name].dtype
    return isinstance(dtype, np.dtype) and dtype.kind in "fiu"


_OUTSIDE_LEVELS = re.compile(r"categories outside of the nominated levels.*?: (\{.*?\})")


def _outside_values(values: str) -> str:
    """formulaic's set of values outside the levels without its missing values (``nan``, ``<NA>`` of a string
    column: coded as the reference level, with :class:`EncodedMissingWarning`); empty if only those."""
    items = [item.strip() for item in values.strip("{}").split(",")]
    kept = [item for item in items if item not in ("nan", "<NA>", "None", "NaT") and not item.endswith("(nan)")]
    return "{" + ", ".join(kept) + "}" if kept else ""


def undeclared_levels_error(block: str, text: str, outside: str) -> ValueError:
    """The error for values ``outside`` (a set's text) of block ``block`` outside a category's declared levels."""
    return ValueError(
        f"the {_BLOCK_LABELS[block]} block {text!r} has values {outside} outside the declared "
        "levels of a category (C(x, levels=...) or a Categorical's categories); formulaic would code "
        "them as the reference level, silently. Declare every level, or recode or drop those rows "
        f"first. {DATA_CHECK_NOTE}")


def _check_undeclared_levels(caught: list, block: str, text: str) -> None:
    """Raise if formulaic met values outside a category's declared levels (it would code them as the
    reference level, silently); re-emit every other warning."""
    seen = set()  # a formula built block by block warns once per block
    for record in caught:
        if (record.category, str(record.message)) in seen:
            continue
        seen.add((record.category, str(record.message)))
        match = _OUTSIDE_LEVELS.search(str(record.message))
        outside = _outside_values(match.group(1)) if match else ""
        if outside:
            raise undeclared_levels_error(block, text, outside)
        if match is None and "Constructing a Categorical with a dtype" not in str(record.message):
            warnings.warn_explicit(record.message, record.category, record.filename, record.lineno)


def _patsy_blocks(
    data: pd.DataFrame, parts: _FormulaParts, context: Mapping[str, Any]
) -> tuple[dict[str, pd.DataFrame], np.ndarray]:
    """
    Materialise the blocks with patsy and keep the rows complete in all blocks.

    Each block is built with patsy's ``NA_action="drop"`` on a positional copy
    of the index, so that missing values of categorical variables count as
    missing, and the rows that survive in every block are kept.

    Parameters
    ----------
    data : DataFrame
        The caller's data.
    parts : _FormulaParts
        The split formula.
    context : Mapping
        Variables used to evaluate the formula in addition to ``data``.

    Returns
    -------
    blocks : dict of str to DataFrame
        Every block on the jointly kept rows, indexed by the labels of ``data``.
    rows : ndarray
        Positions in ``data`` of the rows that are kept.
    """
    import patsy  # noqa: PLC0415

    positional = data.reset_index(drop=True)
    env = patsy.EvalEnvironment([context, {"np": np}])
    keep = np.ones(data.shape[0], dtype=bool)
    raw: dict[str, pd.DataFrame] = {}
    for block, text in _block_formulas(parts).items():
        if text is None:
            continue
        try:
            frame = patsy.dmatrix(
                text, positional, eval_env=env, NA_action="drop", return_type="dataframe"
            )
        except Exception as exc:  # noqa: BLE001 - wrapped with the cause attached
            raise _block_error(block, text, "patsy", exc) from exc
        present = np.zeros(data.shape[0], dtype=bool)
        present[np.asarray(frame.index, dtype=np.intp)] = True
        keep &= present
        raw[block] = frame
    rows = np.flatnonzero(keep)
    index = data.index[rows]
    blocks = {block: _empty_block(index) for block in _BLOCKS}
    for block, frame in raw.items():
        values = frame.loc[rows].to_numpy(dtype=np.float64)
        blocks[block] = pd.DataFrame(values, index=index, columns=list(frame.columns))
    return blocks, rows


def _formula_names(parts: _FormulaParts) -> set[str]:
    """Names that the formula reads (best effort: a block that fails to parse is skipped)."""
    return set(_formula_factors(parts))


def _formula_factors(parts: _FormulaParts) -> dict[str, list[str]]:
    """
    Names that the formula reads, each with the expressions of the factors that read it.

    Best effort: a block that fails to parse is skipped (the formula engine
    reports it when the blocks are built).
    """
    from formulaic import Formula  # noqa: PLC0415

    factors: dict[str, list[str]] = {}
    for text in _block_formulas(parts).values():
        if text is None:
            continue
        try:
            terms = list(Formula(text))
            for term in terms:
                for factor in term.factors:
                    for name in factor.required_variables:
                        factors.setdefault(str(name), []).append(str(factor.expr))
        except Exception:  # noqa: BLE001 - the engine reports malformed blocks later
            continue
    return factors


def _only_in_categorical(name: str, expressions: list[str]) -> bool:
    """Whether every expression reading ``name`` is ``C(name)`` or ``C(name, ...)``."""
    pattern = re.compile(rf"C\(\s*{re.escape(name)}\s*[,)]")
    return bool(expressions) and all(
        pattern.match(e) is not None and e.endswith(")") for e in expressions
    )


def _formula_variables(parts: _FormulaParts, data: pd.DataFrame) -> list[Hashable]:
    """Columns of ``data`` that the formula uses (best effort, may be empty)."""
    names = _formula_names(parts)
    return [col for col in data.columns if col in names]


def _is_text_dtype(dtype: Any) -> bool:
    """Whether a pandas dtype holds Python objects or strings (not categories)."""
    return dtype == np.dtype(object) or isinstance(dtype, pd.StringDtype)


def _check_data_columns(data: pd.DataFrame, parts: _FormulaParts) -> None:
    """
    Check the columns of ``data`` that the formula uses, before building blocks.

    Raises
    ------
    ValueError
        If a used name labels several columns of ``data``.
    TypeError
        If a used column is complex, or holds numbers stored as text (object
        or string dtype whose values all convert with ``pd.to_numeric``),
        which the formula engines would silently one-hot encode as a category
        with one level per distinct number. A column that the formula only
        reads as ``C(col)`` is an explicit category and is not checked for
        numbers stored as text.
    """
    factors = _formula_factors(parts)
    used = [col for col in data.columns if col in factors]
    if not used:
        return
    dupes = sorted({str(col) for col in used if used.count(col) > 1})
    if dupes:
        raise ValueError(
            f"data has duplicate column names {dupes} among the variables the "
            "formula uses; the formula cannot tell which one is meant. Rename or "
            "drop the duplicates, e.g. data.loc[:, ~data.columns.duplicated()] or "
            "data.rename(columns=...)."
        )
    for col in used:
        dtype = data[col].dtype
        if is_complex_dtype(dtype):
            raise TypeError(_complex_message(col, dtype))
        if _is_time_dtype(dtype):
            raise TypeError(
                f"column {col!r} has dtype {dtype}, a date, time span or interval, which is not a number for a "
                "regression (formulaic would fail on it or read it as raw nanoseconds). Convert it to the number "
                f"you mean first, e.g. data[{col!r}].dt.year, (data[{col!r}] - pd.Timestamp('2000-01-01')).dt.days "
                f"or data[{col!r}].dt.total_seconds() / 86400 (days), and give bounds in those units."
            )
        if not _is_text_dtype(dtype) or _only_in_categorical(str(col), factors[col]):
            # C(col) asks for a category explicitly, e.g. codes such as '01001'
            continue
        try:
            converted = pd.to_numeric(data[col])
        except (ValueError, TypeError):
            continue  # genuine text: the formula engine encodes it as a category
        if is_complex_dtype(converted.dtype):
            raise TypeError(_complex_message(col, dtype))
        if is_bool_dtype(converted.dtype) or converted.notna().sum() == 0:
            continue  # True/False objects or an all-missing column: not numbers
        if not any(isinstance(value, str) for value in data[col].dropna()):
            raise TypeError(
                f"column {col!r} has dtype {dtype} and holds numbers as Python objects (e.g. floats with None "
                "for a missing value); the formula would treat it as a category with one dummy per distinct "
                f"value. Convert it first: data[{col!r}] = pd.to_numeric(data[{col!r}]) (None becomes NaN, a "
                f"missing value). {DATA_CHECK_NOTE}"
            )
        raise TypeError(
            f"column {col!r} has dtype {dtype} but holds numbers stored as text; "
            "the formula would treat it as a category with one dummy per distinct "
            f"value. Convert it first, e.g. data[{col!r}] = data[{col!r}].astype(float) "
            f"(or pd.to_numeric(data[{col!r}])); if the values are category codes, "
            f"make them a pandas category first: data[{col!r}].astype('category')."
        )


def _is_time_dtype(dtype: Any) -> bool:
    """Whether a pandas dtype holds dates, time spans, periods or intervals."""
    from pandas.api.types import is_datetime64_any_dtype, is_timedelta64_dtype  # noqa: PLC0415

    return (is_datetime64_any_dtype(dtype) or is_timedelta64_dtype(dtype)
            or isinstance(dtype, (pd.PeriodDtype, pd.IntervalDtype)))


def _complex_message(column: Hashable, dtype: Any) -> str:
    """Message of the TypeError for a complex-valued column."""
    return (
        f"column {column!r} has dtype {dtype}: complex values are not supported "
        "(not numeric for a regression). Use the real part or the modulus, e.g. "
        f"np.real(data[{column!r}]) or np.abs(data[{column!r}])."
    )


def _encoded_missing(
    data: pd.DataFrame, parts: _FormulaParts, kept: np.ndarray | None
) -> tuple[list[Hashable], int]:
    """
    Columns used by the formula that are missing in rows that the design keeps.

    Parameters
    ----------
    data : DataFrame
        The caller's data.
    parts : _FormulaParts
        The split formula.
    kept : ndarray or None
        Positions in ``data`` of the rows of the design (None: all of them, in order).

    Returns
    -------
    columns : list
        The columns of ``data`` with such missing values.
    n_rows : int
        The number of kept rows with a missing value in one of them.
    """
    columns = _formula_variables(parts, data)
    if not columns:
        return [], 0
    bad, rows = [], None  # column by column: a mask of the rows at a time, not one per column
    for col in columns:
        missing = data[col].isna().to_numpy()
        if kept is not None:
            missing = missing[kept]
        if missing.any():
            bad.append(col)
            rows = missing if rows is None else rows | missing
    return bad, 0 if rows is None else int(np.count_nonzero(rows))


# ---------------------------------------------------------------------------
# Array inputs
# ---------------------------------------------------------------------------


def _empty_block(index: pd.Index) -> pd.DataFrame:
    """A DataFrame with no columns on ``index``."""
    return pd.DataFrame(index=index, columns=pd.Index([], dtype=object), dtype=np.float64)


def _numpy_columns(ncol: int, name: str) -> list[str]:
    """IVData's names of the columns of an array: ``name`` or ``name.i``."""
    return [name] if ncol == 1 else [f"{name}.{i}" for i in range(ncol)]


def _check_array_dtype(values: np.ndarray, name: str) -> None:
    """Raise TypeError unless an array holds booleans, integers or floats."""
    if values.dtype.kind not in "biuf":
        raise TypeError(
            f"{name} has dtype {values.dtype}, which is not numeric. Pass "
            "numbers (bool, int or float); encode text or categories first, e.g. "
            "with pandas.get_dummies, or convert numbers stored as objects with "
            "np.asarray(..., dtype=float)."
        )


def _check_column_dtype(dtype: Any, column: Hashable, name: str) -> None:
    """Raise TypeError unless a pandas column is boolean or real numeric."""
    if is_bool_dtype(dtype) or (is_numeric_dtype(dtype) and not is_complex_dtype(dtype)):
        return
    raise TypeError(
        f"{name} column {column!r} has dtype {dtype}, which is not numeric. "
        "design_from_arrays does not encode categories: encode it first (e.g. "
        f"pandas.get_dummies({name}, columns=[{column!r}], drop_first=True, "
        f"dtype=float)) or use design_from_formula with C({column}); if it holds "
        "numbers, convert it with .astype(float)."
    )


def _array_frame(value: Any, name: str) -> tuple[pd.DataFrame, bool]:
    """
    Convert one array input to a float64 DataFrame.

    Parameters
    ----------
    value : ndarray, Series, DataFrame, list or tuple
        The input. 1-D input is one column.
    name : str
        The argument name, used for unnamed columns and in messages.

    Returns
    -------
    frame : DataFrame
        The values as float64, on the input's index (pandas) or a RangeIndex.
    labelled : bool
        Whether the input is a pandas object, whose index must match the
        other pandas inputs.

    Raises
    ------
    TypeError
        If the input is not array-like or not numeric.
    ValueError
        If it has more than 2 dimensions or duplicate column names.
    """
    if isinstance(value, pd.Series):
        label = value.name if value.name else name
        value = value.to_frame(name=label)
    if isinstance(value, pd.DataFrame):
        columns = list(value.columns)
        if len(set(columns)) != len(columns):
            dupes = sorted({str(c) for c in columns if columns.count(c) > 1})
            raise ValueError(
                f"{name} has duplicate column names {dupes}; column names must be "
                "distinct."
            )
        for column, dtype in value.dtypes.items():
            _check_column_dtype(dtype, column, name)
        values = value.to_numpy(dtype=np.float64, na_value=np.nan, copy=True)
        return pd.DataFrame(values, index=value.index, columns=columns), True
    if isinstance(value, (list, tuple)):
        try:
            value = np.asarray(value)
        except ValueError as exc:
            raise ValueError(f"{name} could not be converted to an array: {exc}") from exc
    if not isinstance(value, np.ndarray):
        raise TypeError(
            f"{name} must be a NumPy array, pandas Series or DataFrame, got "
            f"{type(value).__name__}."
        )
    if value.ndim not in (1, 2):
        raise ValueError(f"{name} must be 1- or 2-dimensional, got {value.ndim} dimensions.")
    _check_array_dtype(value, name)
    values = value.reshape(-1, 1) if value.ndim == 1 else value
    frame = pd.DataFrame(
        values.astype(np.float64, copy=True),
        columns=_numpy_columns(values.shape[1], name),
    )
    return frame, False


def _align_arrays(
    frames: dict[str, tuple[pd.DataFrame, bool]],
) -> dict[str, pd.DataFrame]:
    """
    Check the row counts and indexes of the array inputs and share one index.

    Pandas inputs must all have the same index; NumPy inputs are paired by
    position and take that index.

    Raises
    ------
    ValueError
        If the inputs have different numbers of rows or pandas indexes differ.
    """
    nobs = frames["dependent"][0].shape[0]
    for block, (frame, _) in frames.items():
        if frame.shape[0] != nobs:
            raise ValueError(
                f"{block} has {frame.shape[0]} rows but dependent has {nobs}; all "
                "inputs must have the same number of rows."
            )
    reference: tuple[str, pd.Index] | None = None
    for block, (frame, labelled) in frames.items():
        if not labelled:
            continue
        if reference is None:
            reference = (block, frame.index)
        elif not frame.index.equals(reference[1]):
            raise ValueError(
                f"the index of {block} differs from the index of {reference[0]}; "
                "pandas inputs must share the same index (same labels in the "
                "same order). Align them, e.g. with .loc[...] or "
                ".reset_index(drop=True)."
            )
    index = reference[1] if reference is not None else pd.RangeIndex(nobs)
    return {block: frame.set_axis(index, axis=0) for block, (frame, _) in frames.items()}


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


def _as_float_blocks(blocks: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The design's blocks with plain column indexes: float64 columns, held compactly where that is exact
    (:class:`_CompactColumns`: uint8 for 0/1 columns, one broadcast value for a column of ones); a block already
    built as a design block (:func:`plain_column_block`, :func:`_formulaic_block`) is kept as it is."""
    out = {}
    for block, frame in blocks.items():
        if frame.shape[1] == 0:
            out[block] = _empty_block(frame.index)
            continue
        if frame.attrs.pop(_FLOAT_BLOCK, False):  # the marker does not reach the design
            out[block] = frame
            continue
        out[block] = _CompactColumns(frame.shape[0], float_values(frame, block)).frame(frame.index, list(frame.columns))
    return out


#: Set in ``DataFrame.attrs`` of a block built as the design's float64 block already (new memory).
_FLOAT_BLOCK = "dpivreg_float_block"


def float_values(frame: pd.DataFrame, block: str) -> np.ndarray:
    """A block's values as a new float64 (rows × columns) array whose columns are each contiguous (pandas' own
    layout, so that the design's column views read memory in order); ``pd.NA`` of nullable and object columns
    becomes NaN (missing). TypeError naming the block for values that are not numbers."""
    for column, dtype in frame.dtypes.items():
        if is_complex_dtype(dtype):
            raise TypeError(f"{block} " + _complex_message(column, dtype))
    out = np.empty((frame.shape[1], frame.shape[0]))  # one row per column
    try:
        for j in range(frame.shape[1]):
            column = frame.iloc[:, j]
            if isinstance(column.dtype, pd.api.extensions.ExtensionDtype) or column.dtype == object:
                column = column.astype(object).where(column.notna(), np.nan)
            out[j] = column.to_numpy(dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the {_BLOCK_LABELS[block]} block {list(frame.columns)} holds values that are not numbers "
                        f"({exc}). Convert the columns to numbers, or to a pandas Categorical for categories.") from exc
    return out.T


def _check_counts(blocks: dict[str, pd.DataFrame]) -> None:
    """Check one dependent column, at least one endog, the order condition."""
    ndep = blocks["dependent"].shape[1]
    if ndep != 1:
        raise ValueError(
            f"the dependent variable must be a single column, got {ndep}: "
            f"{list(blocks['dependent'].columns)}."
        )
    endog = list(blocks["endog"].columns)
    instr = list(blocks["instruments"].columns)
    if not endog:
        raise ValueError(
            "the design has no endogenous variable. For a model without "
            "endogenous variables use OLS (e.g. statsmodels.formula.api.ols or "
            "linearmodels.OLS)."
        )
    if len(instr) < len(endog):
        raise ValueError(
            f"the model is under-identified: {len(instr)} instrument(s) {instr} "
            f"for {len(endog)} endogenous variable(s) {endog}. At least as many "
            "instruments as endogenous variables are needed."
        )


def _check_unique_names(blocks: dict[str, pd.DataFrame]) -> None:
    """
    Column names must be unique in X = [exog, endog] and Z = [exog, instruments],
    and the dependent variable's name must not be a regressor's or an instrument's.
    """
    exog = list(blocks["exog"].columns)
    for other in ("endog", "instruments"):
        seen: dict[Hashable, str] = {name: "exog" for name in exog}
        for name in blocks[other].columns:
            if name in seen:
                raise ValueError(
                    f"column {name!r} appears in both {seen[name]} and {other}; a "
                    "variable cannot be in both blocks. Remove or rename one of them."
                )
            seen[name] = other
    both = [name for name in blocks["endog"].columns if name in list(blocks["instruments"].columns)]
    if both:
        raise ValueError(
            f"{both} appear both as endogenous regressors and among their instruments; an endogenous "
            "variable cannot instrument itself (the fit would be OLS presented as IV). Remove it from the "
            "instruments, e.g. '[x ~ z1 + z2]'."
        )
    dependent = blocks["dependent"].columns[0]
    for other in ("exog", "endog", "instruments"):
        if dependent in list(blocks[other].columns):
            raise ValueError(
                f"the dependent variable {dependent!r} has the same name as a column "
                f"of {other} ({_BLOCK_LABELS[other]}); the dependent variable cannot "
                f"also be a regressor or an instrument. Remove {dependent!r} from "
                f"{other}, or, if they are different variables, rename one of them "
                "(e.g. dependent.rename('y') or frame.rename(columns={...}))."
            )


def _check_finite(blocks: dict[str, pd.DataFrame], derived: Derived | None = None) -> None:
    """Raise if a column contains an infinite value (``derived``: the blocks' derived columns)."""
    for block, frame in blocks.items():
        columns = block_columns(frame, derived, block)
        if all(np.isfinite(values).all() for column in columns for _, values in column_blocks(column)):
            continue
        finite = np.isfinite(np.column_stack([whole_column(column) for column in columns]))  # only for the message
        bad = np.flatnonzero(~finite.all(axis=0))
        names = [frame.columns[j] for j in bad]
        rows = np.flatnonzero(~finite.all(axis=1))
        labels = ", ".join(repr(label) for label in frame.index[rows[:5]].tolist())
        more = ", ..." if rows.size > 5 else ""
        raise ValueError(
            f"{block} column(s) {names} contain infinite values (e.g. log of 0) in "
            f"{rows.size} row(s) (row labels [{labels}{more}]); remove those rows or "
            f"transform the variable. {DATA_CHECK_NOTE}"
        )


def _check_enough_rows(blocks: dict[str, pd.DataFrame], n_dropped: int = 0) -> None:
    """Raise if there are fewer than 2 rows or fewer rows than columns of Z = [exog, instruments]."""
    nobs = blocks["dependent"].shape[0]
    ncol = blocks["exog"].shape[1] + blocks["instruments"].shape[1]
    _check_row_count(nobs, ncol, n_dropped)


def _check_row_count(nobs: int, ncol: int, n_dropped: int = 0) -> None:
    """Raise if ``nobs`` rows are fewer than 2 or fewer than the ``ncol`` columns of Z."""
    noun = "row" if nobs == 1 else "rows"
    left = (
        f" (left after dropping {n_dropped} row(s) with a missing value)" if n_dropped else ""
    )
    note = f" {DATA_CHECK_NOTE}" if n_dropped else ""  # without dropped rows, nobs is the public row count
    if nobs < 2:
        raise ValueError(
            f"only {nobs} {noun}{left}: a regression needs at least 2 rows "
            "(observations), and at least as many rows as columns in "
            f"[exog, instruments] ({ncol}). Pass more data.{note}"
        )
    if nobs < ncol:
        raise ValueError(
            f"only {nobs} {noun}{left} for {ncol} columns in [exog, instruments]; "
            f"the design needs at least as many rows as columns.{note}"
        )


def _varies(values: np.ndarray) -> bool:
    """Whether the non-missing values of a column take more than one value."""
    present = values[~np.isnan(values)]
    return present.size > 0 and not np.all(present == present[0])


def _check_instruments(
    blocks: dict[str, pd.DataFrame],
    n_dropped: int = 0,
    full_instruments: pd.DataFrame | None = None,
    zero_allowed: tuple[Hashable, ...] = (),
    derived: Derived | None = None,
    full_derived: Derived | None = None,
) -> None:
    """
    Raise for a constant instrument or one that duplicates another column.

    ``n_dropped`` rows with a missing value were dropped before; if the
    instruments on all rows (``full_instruments``) are known and an
    instrument varies only in the dropped rows, the message says so.
    Columns in ``zero_allowed`` (declared levels, indicators) that are all zero
    are exempt (:mod:`dpivreg.boundary`). ``derived`` and ``full_derived``: the derived columns of ``blocks``
    and of ``full_instruments``' blocks, read a block of rows at a time.
    """
    instruments = blocks["instruments"]
    exog = blocks["exog"]
    z, x = block_columns(instruments, derived, "instruments"), block_columns(exog, derived, "exog")
    exempt_z = [name in zero_allowed and _all_zero(z[j]) for j, name in enumerate(instruments.columns)]
    exempt_x = [name in zero_allowed and _all_zero(x[i]) for i, name in enumerate(exog.columns)]
    constant, same = _constant_and_same(z, x, exempt_z, exempt_x)
    for j, name in enumerate(instruments.columns):
        if constant.get(j):
            varied = (
                full_instruments is not None
                and _varies(whole_column(block_columns(full_instruments, full_derived, "instruments")[j]))
            )
            raise _constant_instrument_error(name, float(z[j][0:1][0]), len(z[j]), n_dropped, varied)
        for i, other in enumerate(exog.columns):
            if same.get((j, "exog", i)):
                raise _duplicate_instrument_error(name, other, "exog")
        for i in range(j):
            if same.get((j, "instruments", i)):
                raise _duplicate_instrument_error(name, instruments.columns[i], "instruments")


def _constant_and_same(z: list, x: list, exempt_z: list[bool], exempt_x: list[bool]) -> tuple[dict, dict]:
    """Which instruments (not exempt) take one value, ``{j: bool}``, and which equal an exogenous column or an
    earlier instrument (neither exempt), ``{(j, "exog" | "instruments", i): bool}``: in one reading of the rows, a
    block at a time when a column is derived (each column computed once per block, and no more once every pair
    differs), all rows at once otherwise."""
    derived = any(isinstance(column, DerivedColumn) for column in (*z, *x))
    n = len(z[0])
    constant = {j: True for j in range(len(z)) if not exempt_z[j]}
    same = {(j, "exog", i): True for j in constant for i in range(len(x)) if not exempt_x[i]}
    same.update({(j, "instruments", i): True for j in constant for i in range(j) if not exempt_z[i]})
    first = {j: z[j][0:1] for j in constant}
    for rows in row_blocks(n) if derived else [slice(0, n)]:
        open_z = {j for j in constant if constant[j]} | {key[0] for key, equal in same.items() if equal}
        open_z |= {key[2] for key, equal in same.items() if equal and key[1] == "instruments"}
        open_x = {key[2] for key, equal in same.items() if equal and key[1] == "exog"}
        if not open_z:
            break
        zb = {j: z[j][rows] for j in open_z}
        xb = {i: x[i][rows] for i in open_x}
        for j in constant:
            constant[j] = constant[j] and bool(np.all(zb[j] == first[j]))
        for (j, other, i), equal in same.items():
            if equal:
                same[(j, other, i)] = bool(np.array_equal(zb[j], (xb if other == "exog" else zb)[i]))
    return constant, same


def _all_zero(column: np.ndarray | DerivedColumn) -> bool:
    return not any(values.any() for _, values in column_blocks(column))


def _constant_instrument_error(
    name: Hashable, value: float, size: int, n_dropped: int, varied: bool
) -> ValueError:
    """The error for an instrument that takes one value in all ``size`` kept rows."""
    if n_dropped == 0:
        return ValueError(
            f"instrument {name!r} is constant ({value:g} in every row); a "
            "constant instrument does not identify anything. Remove it (the "
            f"intercept belongs in exog, e.g. '1 + ...'). {DATA_CHECK_NOTE}"
        )
    detail = "; it varies only in rows that were dropped" if varied else ""
    return ValueError(
        f"instrument {name!r} is constant ({value:g}) in the {size} "
        f"rows left after dropping {n_dropped} row(s) with a missing value in "
        f"the dependent variable, regressors or instruments{detail}. A constant "
        "instrument does not identify anything: fill the missing values "
        "(missing='fill') or fix them so that more rows are kept, or remove the "
        f"instrument. {DATA_CHECK_NOTE}"
    )


def _duplicate_instrument_error(name: Hashable, other: Hashable, block: str) -> ValueError:
    """The error for an instrument equal to an exog column or an earlier instrument."""
    if block == "exog":
        return ValueError(
            f"instrument {name!r} has the same values as exog column "
            f"{other!r}; an exogenous regressor is already its own "
            f"instrument. Remove the duplicate. {DATA_CHECK_NOTE}"
        )
    return ValueError(
        f"instrument {name!r} has the same values as instrument "
        f"{other!r}. Remove the duplicate. {DATA_CHECK_NOTE}"
    )


def check_design_rank(design: "IVDesign") -> None:
    """Raise if [exog, endog] or [exog, instruments] is collinear, from the design's column factor
    (:func:`dpivreg.cross_products.check_factor_rank`: columns scaled to a largest absolute value of 1 first)."""
    names = design.column_names
    pos = design.positions
    zero = set(design.zero_columns)
    for key, label in (("x", "regressors [exog, endog]"), ("z", "instruments [exog, instruments]")):
        cols = [c for c in pos[key] if c not in zero]
        check_factor_rank(design.factor.r[:, cols], design.nobs, [names[c] for c in cols], label)


def _validate(
    blocks: dict[str, pd.DataFrame],
    n_dropped: int = 0,
    full_instruments: pd.DataFrame | None = None,
    zero_allowed: tuple[Hashable, ...] = (),
    derived: Derived | None = None,
    full_derived: Derived | None = None,
) -> None:
    """
    Run every check of a design that has no missing values, except its rank
    (:func:`check_design_rank`, on the assembled design's column factor).

    ``n_dropped`` rows with a missing value were dropped before, and
    ``full_instruments`` are the instruments before that (if known); both only
    refine the messages. ``zero_allowed``, ``derived``, ``full_derived``: see :func:`_check_instruments`.
    """
    _check_unique_names(blocks)
    _check_finite(blocks, derived)
    _check_enough_rows(blocks, n_dropped)
    _check_instruments(blocks, n_dropped, full_instruments, zero_allowed, derived, full_derived)


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
        The design's ``missing``, ``data_levels``, ``zero_allowed``, ... (:mod:`dpivreg.boundary`).
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
    _validate(blocks, int(nrows - n_kept), full["instruments"], boundary.get("zero_allowed", ()), kept_derived,
              derived)
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
        **boundary,
    )
    check_design_rank(design)
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
        :mod:`dpivreg.boundary`). Filling changes the estimand: the regression is that of the
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
        design is invalid (under-identified, constant or duplicate
        instruments, rank deficient, infinite values, too few rows).

    Warns
    -----
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
    (:func:`dpivreg.formula_replay.replay_problems`), from all rows at once otherwise. Columns of 0/1 values
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
                     engine: str = "formulaic") -> dict:
    """The design's boundary fields (:mod:`dpivreg.boundary`) from names, dtypes, the factors' kinds (read by
    the formula engine on ``sample``, a few rows or a synthetic frame with the data's types) and the policy."""
    names = [name for block in _BLOCKS for name in blocks[block].columns]
    categorical, stateful = _factor_kinds(parts, sample, context, engine)
    data_levels = data_derived_levels(data, categorical)
    declared = [factor for factor in categorical if factor not in data_levels]
    return {"missing": policy.how, "data_levels": data_levels, "stateful": stateful,
            "zero_allowed": declared_zero_columns(names, declared, added),
            "data_columns": tuple(data.columns), "unit_columns": unit_columns(names, categorical, data, added)}


def lost_rows(data: pd.DataFrame, parts: _FormulaParts, kept: np.ndarray) -> int:
    """Rows of ``data`` not in ``kept`` (positions) none of whose values in the formula's columns is missing."""
    used = _formula_variables(parts, data)
    dropped = np.ones(data.shape[0], dtype=bool)
    dropped[kept] = False
    complete = ~data[used].isna().any(axis=1).to_numpy() if used else np.ones(data.shape[0], dtype=bool)
    return int(np.count_nonzero(dropped & complete))


def _factor_kinds(parts: _FormulaParts, sample: pd.DataFrame, context: Mapping[str, Any],
                  engine: str) -> tuple[list[str], tuple[str, ...]]:
    """The expressions of the factors that the engine encodes as categories, and of the stateful transforms
    (``center``, ``scale``, ``bs``, ...: parameters learned from the rows), read on ``sample``. A block the
    engine cannot build on the sample counts as categorical (fail closed: its levels are announced)."""
    categorical: list[str] = []
    stateful: list[str] = []
    for block, text in _block_formulas(parts).items():
        if text is None:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                kinds = (_formulaic_kinds if engine == "formulaic" else _patsy_kinds)(block, text, sample, context)
        except Exception:  # noqa: BLE001 - the engine built the block on the data; announce it unread
            kinds = ([f"the {_BLOCK_LABELS[block]} block {text!r}"], [])
        categorical += [e for e in kinds[0] if e not in categorical]
        stateful += [e for e in kinds[1] if e not in stateful]
    return categorical, tuple(stateful)


def _formulaic_kinds(block: str, text: str, sample: pd.DataFrame,
                     context: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    from formulaic.parser.types import Factor  # noqa: PLC0415

    spec = formulaic_block_matrix(block, text, sample, context).model_spec
    return ([str(f) for f, (kind, _) in spec.encoder_state.items() if kind is Factor.Kind.CATEGORICAL],
            [str(name) for name, state in spec.transform_state.items() if state])


def _patsy_kinds(block: str, text: str, sample: pd.DataFrame,
                 context: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    import patsy  # noqa: PLC0415

    env = patsy.EvalEnvironment([context, {"np": np}])
    info = patsy.dmatrix(text, sample.reset_index(drop=True), eval_env=env, NA_action="drop",
                         return_type="dataframe").design_info
    return ([f.name() for f, fi in info.factor_infos.items() if fi.type == "categorical"],
            [f.name() for f, fi in info.factor_infos.items() if fi.state.get("transforms")])


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


def design_from_arrays(dependent: Any, exog: Any, endog: Any, instruments: Any, *, constant: Any = None,
                       missing: str = "drop", fill_values: Mapping[Hashable, Any] | float | None = None,
                       indicators: list[Hashable] | tuple[Hashable, ...] = ()) -> IVDesign:
    """
    Build a validated IV design from arrays, Series or DataFrames.

    Parameters
    ----------
    dependent : array_like
        Dependent variable (nobs, or nobs by 1).
    exog : array_like or None
        Exogenous regressors (nobs by k), None if there are none. Include a
        column of ones for an intercept and declare it (``constant``).
    endog : array_like
        Endogenous regressors (nobs by p, p >= 1).
    instruments : array_like
        Excluded instruments (nobs by q, q >= p).
    constant : str, None or False
        The exogenous column that is the intercept: its name (e.g. ``"exog.0"``
        for the first column of a NumPy array), ``None`` (default) for a column
        named ``"Intercept"`` or ``"const"`` (``statsmodels.add_constant``), or
        ``False`` for none. The declaration is public; the column must hold one
        nonzero value. A column of ones that is not declared is an ordinary
        regressor.
    missing, fill_values, indicators
        The missing-value policy, as for :func:`design_from_formula`, with the design's column
        names (``exog.0``, ...) as the keys of ``fill_values`` and the entries of ``indicators``.

    Returns
    -------
    IVDesign
        The float64 blocks on the rows that have no missing value. Columns of
        NumPy arrays and unnamed Series are named like linearmodels' IVData:
        ``dependent``, ``exog.0``, ``exog.1``, ``endog``, ``instruments``, ...
        (a single column takes the argument name).

    Raises
    ------
    TypeError
        If an input is missing, not array-like, or not numeric (bool, integer
        and float data are accepted; text and categories must be encoded
        first).
    ValueError
        If the inputs have different numbers of rows or pandas indexes, or the
        design is invalid (under-identified, constant or duplicate
        instruments, rank deficient, infinite values, too few rows).

    Warns
    -----
    DroppedRowsWarning
        If rows with a missing value (NaN) in any input were dropped, jointly,
        as ``linearmodels.iv.IV2SLS`` does.

    Notes
    -----
    NumPy inputs are paired by position; pandas inputs must all have the same
    index, which the design keeps.
    """
    inputs = {"dependent": dependent, "exog": exog, "endog": endog, "instruments": instruments}
    frames: dict[str, tuple[pd.DataFrame, bool]] = {}
    for block, value in inputs.items():
        if value is None and block != "exog":
            raise TypeError(
                f"{block} is required (got None); only exog may be None."
                + (" For a model without endogenous variables use OLS." if block == "endog" else "")
            )
        if value is not None:
            frames[block] = _array_frame(value, block)
    if exog is None:
        frames["exog"] = (_empty_block(pd.RangeIndex(frames["dependent"][0].shape[0])), False)
    policy = missing_policy(missing, fill_values, indicators)
    aligned, added = _fill_blocks(_align_arrays({block: frames[block] for block in _BLOCKS}), policy)
    nrows = int(aligned["dependent"].shape[0])
    design, _ = _build(
        aligned,
        positions=None,
        nrows=nrows,
        formula=None,
        formula_engine=None,
        constant=constant,
        boundary={"missing": policy.how, "zero_allowed": tuple(added), "unit_columns": tuple(added)},
    )
    _warn_dropped(design, "design_from_arrays", stacklevel=2)
    return design
