"""How a design holds and reads its columns: each block's float64 values shared with the caller's frame where they
already are float64, held compactly where that is exact (0/1 columns as uint8, a column of ones as one broadcast value:
:class:`_CompactColumns`), or derived from a source column for the rows a pass reads (a
:class:`~dpivreg.data.derived_columns.DerivedColumn`); and the stacking of any rows of them into the float64 array a
pass reads (:func:`stack_rows`).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from typing import Any

import numpy as np
import pandas as pd
from pandas.api.types import is_complex_dtype

from dpivreg.compute.backends import row_blocks
from dpivreg.data.derived_columns import DerivedColumn
from dpivreg.data.formula import (
    _BLOCK_LABELS,
)

#: A design's derived columns: ``{(block, position): DerivedColumn}``.
Derived = Mapping[tuple[str, int], DerivedColumn]


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
    order: each column a contiguous copy, and LAPACK's QR of the block
    (:func:`dpivreg.data.cross_products.block_factor`) reads it in place (on a row-major block it took three times as
    long, measured)."""
    first = columns[0][rows]
    out = np.empty((first.shape[0], len(columns)), order="F")
    out[:, 0] = first
    for j, column in enumerate(columns[1:], start=1):
        out[:, j] = column[rows]
    return out


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


def _complex_message(column: Hashable, dtype: Any) -> str:
    """Message of the TypeError for a complex-valued column."""
    return (
        f"column {column!r} has dtype {dtype}: complex values are not supported "
        "(not numeric for a regression). Use the real part or the modulus, e.g. "
        f"np.real(data[{column!r}]) or np.abs(data[{column!r}])."
    )


def _empty_block(index: pd.Index) -> pd.DataFrame:
    """A DataFrame with no columns on ``index``."""
    return pd.DataFrame(index=index, columns=pd.Index([], dtype=object), dtype=np.float64)
