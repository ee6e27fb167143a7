"""Designs from arrays: NumPy arrays, Series or DataFrames for the four blocks, aligned on their index, their unnamed
columns named as ``linearmodels.iv.data.IVData`` names them (``dependent``, ``exog.0``, ``endog``,
``instruments.1``, ...), checked and built into an :class:`~dpivreg.data.design.IVDesign` like a formula's.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from dpivreg.data.boundary import (
    missing_policy,
)
from dpivreg.data.checks import (
    _check_array_dtype,
    _check_column_dtype,
    warn_findings,
)
from dpivreg.data.columns import (
    _empty_block,
)
from dpivreg.data.design import IVDesign, _build, _fill_blocks, _warn_dropped
from dpivreg.data.formula import (
    _BLOCKS,
)

__all__ = ["design_from_arrays"]


def _numpy_columns(ncol: int, name: str) -> list[str]:
    """IVData's names of the columns of an array: ``name`` or ``name.i``."""
    return [name] if ncol == 1 else [f"{name}.{i}" for i in range(ncol)]


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
        design is invalid (under-identified, infinite values, too few rows).

    Warns
    -----
    DataCheckWarning
        For a constant or duplicate instrument or collinear columns (NON-PRIVATE findings, recorded in
        ``data_findings``: one row can change them, so they do not stop a fit; ``fit(check_data=True)`` refuses).
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
    warn_findings(design.data_findings, stacklevel=2)
    return design
