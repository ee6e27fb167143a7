"""The privacy boundary at the data frame: what is public about the data, and what a design leaks.

Public (never protected by the budget, by declaration): the frame's row count, its column names and
dtypes, the formula, the declared intercept, the bounds, category levels that are *declared* (a pandas
``Categorical``'s categories, or ``C(x, levels=[...])``), and the missing-value policy with its fill
values. Everything else about the rows is private; a design that derives one of the public facts from
the rows carries a leak that :meth:`dpivreg.DPIV2SLS.fit` announces with a
:class:`~dpivreg.PrivacyLeakWarning` and lists in the summary:

* ``missing="drop"`` (the default, linearmodels' behaviour) with rows dropped: the number of complete
  rows, ``nobs``, is published exactly (replacing one complete row by one with a missing value changes
  it). ``missing="drop-public"`` declares which rows are complete public (e.g. a survey's published skip
  pattern) and drops without a leak; ``missing="fill"`` keeps every row (``nobs`` = the row count) by
  replacing each missing value with a public fill value, optionally with a missing-value indicator.
  A frame without missing values under ``"drop"`` is read as coming from a schema without missing
  values (a public fact): nothing is announced. With a privacy unit (``fit(privacy_unit=...)``) dropping
  is no leak: the public count is the number of units in the whole frame, and a dropped row changes only
  its own unit's contribution (:func:`dpivreg.data.unit_ids.resolve_units`).
* levels of a category read from the data (a text column, ``C(x)`` of a column that is not a pandas
  ``Categorical``, levels computed in the formula): which levels occur decides the parameters' names
  and number;
* stateful transforms (``center``, ``scale``, ``bs``, ...), whose parameters are learned from the rows, and any
  other term whose value in a row depends on other rows (``I(w - w.mean())``, ``I(w.rank())``,
  ``np.where(w > np.median(w), 1, 0)``): refused on Dask, a leak on pandas;
* rows that the formula itself makes missing (``np.log`` of 0), under every policy.

Checks that read the rows (constant, duplicate or collinear columns, infinite values, too few complete
rows) must run before anything is fitted; their verdicts are seen only by the data holder and are not
releases (their messages say so, :data:`dpivreg.errors.DATA_CHECK_NOTE`). A declared level (or a requested indicator)
that does not occur gives an all-zero column; it is exempt from those checks, so its absence does not fail
the fit and shows only through the private releases; but the noise of its (empty) moments, amplified by the
private whitening, costs every coefficient its precision (docs: the privacy boundary).
"""

from __future__ import annotations

import ast
import math
import numbers
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

__all__ = ["MISSING_POLICIES", "BoundaryFacts", "MissingPolicy", "missing_policy", "design_leaks"]

#: Values of ``missing=``: drop rows with a missing value (a leak when any is dropped), drop them with the
#: missingness declared public, or fill them with public values (every row kept).
MISSING_POLICIES: tuple[str, ...] = ("drop", "drop-public", "fill")

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


@dataclass(frozen=True, kw_only=True)
class BoundaryFacts:
    """What a design knows about the privacy boundary (public: names, dtypes, the declared policy), shared by
    the in-memory and the Dask design (which inherit these keyword-only fields).

    Attributes
    ----------
    missing : {"drop", "drop-public", "fill"}
        The missing-value policy the design was built with.
    data_levels : tuple of str
        The formula's categorical expressions whose levels were read from the data (a leak).
    zero_allowed : tuple
        Columns that may be all zero (declared levels, missing-value indicators): exempt from the
        constant, duplicate and rank checks, NaN in the benchmark when all zero.
    n_lost : int
        Dropped rows none of whose values (in the data's columns the formula reads) was missing: the
        formula made a value missing (e.g. ``np.log`` of 0), a leak under every policy.
    data_columns : tuple
        The columns of the data the formula was applied to (a codebook of bounds may name any).
    unit_columns : tuple
        Design columns in [0, 1] by construction (dummies, booleans, indicators): bounded (0, 1) by default.
    stateful : tuple of str
        The formula's stateful transforms (``center(x)``, ``bs(x)``, ...), whose parameters come from the
        rows (a leak).
    row_reading : tuple of str
        The formula's other expressions whose value in a row depends on other rows (``I(w - w.mean())``,
        ``I(w.rank())``, ``np.where(w > np.median(w), 1, 0)``), each with why
        (:func:`dpivreg.data.formula_replay.row_reading_terms`; a leak).
    data_findings : tuple of str
        What the checks that read the data found (a constant or duplicate instrument, collinear columns): NON-PRIVATE,
        seen only by the data holder (:class:`dpivreg.errors.DataCheckWarning`). A private fit runs regardless;
        ``fit(check_data=True)`` refuses on them.
    """

    missing: str = "drop"
    data_levels: tuple[str, ...] = ()
    zero_allowed: tuple[Hashable, ...] = ()
    n_lost: int = 0
    data_columns: tuple[Hashable, ...] = ()
    unit_columns: tuple[Hashable, ...] = ()
    stateful: tuple[str, ...] = ()
    row_reading: tuple[str, ...] = ()
    data_findings: tuple[str, ...] = ()


@dataclass(frozen=True)
class MissingPolicy:
    """How rows with a missing value are handled (a public choice; see the module docstring).

    Attributes
    ----------
    how : {"drop", "drop-public", "fill"}
    fill_values : dict or float or None
        ``"fill"`` only: a public value per column (a mapping over the data's columns, a codebook may
        name unused ones) or one number for every numeric column.
    indicators : tuple
        ``"fill"`` only: columns that get a 0/1 exogenous regressor ``missing_<column>`` marking the
        filled rows (public names; an indicator of a column without missing values is all zero, which
        is allowed).
    """

    how: Literal["drop", "drop-public", "fill"] = "drop"
    fill_values: Any = None
    indicators: tuple[Hashable, ...] = field(default=())


def missing_policy(missing: Any = "drop", fill_values: Any = None, indicators: Any = ()) -> MissingPolicy:
    """Check the public arguments ``missing``, ``fill_values`` and ``indicators`` (no data read)."""
    if isinstance(missing, MissingPolicy):
        return missing
    if not isinstance(missing, str) or missing not in MISSING_POLICIES:
        raise ValueError(f"missing must be one of {list(MISSING_POLICIES)}, got {missing!r}. 'drop' drops rows "
                         "with a missing value (the count of complete rows is then published); 'drop-public' does "
                         "the same with that count declared public; 'fill' keeps every row, filling with public "
                         "fill_values.")
    if isinstance(indicators, (str, bytes)) or not isinstance(indicators, Sequence):
        raise TypeError(f"indicators must be a list of column names, got {indicators!r}.")
    if missing != "fill":
        if fill_values is not None or len(indicators):
            raise ValueError(f"fill_values and indicators apply to missing='fill' only, got missing={missing!r}.")
        return MissingPolicy(missing)
    if fill_values is None:
        raise ValueError("missing='fill' needs public fill_values: one number for every numeric column, or "
                         "{column: value} (a category's value must be one of its declared categories).")
    if isinstance(fill_values, Mapping):
        fill = dict(fill_values)
    elif isinstance(fill_values, numbers.Real) and not isinstance(fill_values, bool):
        if not math.isfinite(fill_values):
            raise ValueError(f"fill_values must be a finite number, got {fill_values!r}.")
        fill = float(fill_values)
    else:
        raise TypeError(f"fill_values must be a number or a mapping {{column: value}}, got {fill_values!r}.")
    return MissingPolicy("fill", fill, tuple(indicators))


def can_hold_missing(dtype: Any) -> bool:
    """Whether a column of this dtype can hold a missing value (NumPy integers and booleans cannot)."""
    return not (isinstance(dtype, np.dtype) and dtype.kind in "biu")


def indicator_name(column: Hashable) -> str:
    """The name of the missing-value indicator of ``column``."""
    return f"missing_{column}"


def fill_frame(data: Any, used: list[Hashable], policy: MissingPolicy) -> tuple[Any, list[str]]:
    """The frame with ``used`` columns' missing values replaced by the policy's public fill values and the
    requested indicators added (a new frame, pandas or Dask; the caller's is not modified), and the
    indicators' names. Raises for a used column without a fill value, whatever its dtype: decided from names
    only, since a dtype is not public (pandas reads a column of integers as int64, but as float64 once one value is
    missing, so a rule by dtype would let one row decide whether the model can be built)."""
    values = policy.fill_values
    if isinstance(values, dict):
        unknown = [c for c in values if c not in data.columns]
        if unknown:
            raise ValueError(f"fill_values names {unknown}, which are not columns of the data (a typo?).")
    missing_value = [c for c in used if not (isinstance(values, dict) and c in values)
                     and not (isinstance(values, float) and _numeric(data[c].dtype))]
    if missing_value:
        raise ValueError(f"missing='fill' has no public fill value for column(s) {missing_value}. Every column the "
                         "formula reads needs one, whatever its dtype (an integer column becomes float64 when a value "
                         "is missing, so its dtype is not public): add them to fill_values={column: value} (for a "
                         "category, one of its declared categories), or pass one number for every numeric column.")
    fills = {c: (values[c] if isinstance(values, dict) else values) for c in used if can_hold_missing(data[c].dtype)}
    names = []
    for column in policy.indicators:
        if column not in used:
            raise ValueError(f"indicators names {column!r}, which is not a column that the formula uses {used}.")
        name = indicator_name(column)
        if not _IDENTIFIER.match(name):
            raise ValueError(f"the indicator {name!r} is not a valid formula name; rename column {column!r}.")
        if name in data.columns:
            raise ValueError(f"the indicator's name {name!r} is already a column of the data; rename that column.")
        names.append(name)
    added = {name: data[column].isna().astype(np.float64) for name, column in zip(names, policy.indicators)}
    filled = {}
    for column, value in fills.items():
        series = data[column]
        _check_fill_value(column, series.dtype, value)
        try:
            filled[column] = series.fillna(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the fill value {value!r} does not fit column {column!r} of dtype {series.dtype} "
                             f"({exc}); give a value of the column's type.") from exc
    return data.assign(**filled, **added), names


def _check_fill_value(column: Hashable, dtype: Any, value: Any) -> None:
    """A public fill value must be a value of the column: a declared category, or a finite number for a numeric
    column (never a missing value, which would leave the row to be dropped)."""
    if isinstance(dtype, pd.CategoricalDtype):
        if value not in dtype.categories:
            raise ValueError(f"the fill value {value!r} of column {column!r} is not one of its categories "
                             f"{list(dtype.categories)}; use a declared category.")
        return
    if _numeric(dtype) or pd.api.types.is_bool_dtype(dtype):
        if (isinstance(value, (bool, np.bool_)) and not pd.api.types.is_bool_dtype(dtype)) or not isinstance(
                value, (numbers.Real, np.bool_)) or not math.isfinite(float(value)):
            raise ValueError(f"the fill value of numeric column {column!r} must be a finite number, got {value!r}.")
        return
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        raise ValueError(f"the fill value of column {column!r} must be a value, not a missing one ({value!r}).")


def _numeric(dtype: Any) -> bool:
    return pd.api.types.is_numeric_dtype(dtype) and not isinstance(dtype, pd.CategoricalDtype)


def data_derived_levels(data: Any, expressions: Sequence[str]) -> tuple[str, ...]:
    """The formula's categorical factors (``expressions``, as the formula engine encodes them) whose levels
    are read from the data.

    Declared: a bare column or ``C(column, ...)`` of a pandas ``Categorical`` column, or any ``C(...)`` with a
    ``levels=`` argument. Everything else that the engine encodes as a category reads its levels from the
    data: a text column, ``C(x)`` of a non-categorical column, ``x.astype(str)``, ``pd.qcut(x, 3)``, ....
    Boolean columns have the levels (False, True) by their dtype (patsy encodes them as categories).
    """
    dtypes = dict(data.dtypes.items())
    found = []
    for expression in expressions:
        bare = _BARE_OR_C.match(expression)
        column = bare.group(1) if bare else None
        declared = (column is not None and (isinstance(dtypes.get(column), pd.CategoricalDtype)
                                            or pd.api.types.is_bool_dtype(dtypes.get(column, object)))) or (
            expression.startswith("C(") and _literal_levels(expression))
        if not declared and expression not in found:
            found.append(expression)
    return tuple(found)


_BARE_OR_C = re.compile(r"^(?:C\(\s*)?`?([A-Za-z_][A-Za-z0-9_.]*)`?\s*(?:[,)].*)?$")


def _literal_levels(expression: str) -> bool:
    """Whether ``C(..., levels=...)`` gives its levels as a literal list or tuple (declared in the formula); a
    computed one, e.g. ``levels=sorted(g.unique())``, reads them from the data."""
    try:
        call = ast.parse(expression, mode="eval").body
    except SyntaxError:
        return False
    if not isinstance(call, ast.Call):
        return False
    for keyword in call.keywords:
        if keyword.arg == "levels":
            try:
                return ast.literal_eval(keyword.value) is not None  # levels=None reads them from the data
            except ValueError:
                return False
    return False


def unit_columns(names: Sequence[Hashable], categorical: Sequence[str], data: Any,
                 indicators: Sequence[str]) -> tuple[Hashable, ...]:
    """Design columns in [0, 1] by construction (public): a category's dummies (``factor[level]`` or
    ``factor[T.level]`` of a categorical factor, not interactions), boolean columns and missing-value
    indicators."""
    booleans = {str(c) for c, dtype in data.dtypes.items() if pd.api.types.is_bool_dtype(dtype)}
    out = []
    for name in names:
        text = str(name)
        dummy = any(text.startswith(f"{factor}[") and text.endswith("]") and ":" not in text[len(factor):]
                    for factor in categorical)
        if dummy or text in booleans or text in indicators:
            out.append(name)
    return tuple(out)


def design_leaks(design: Any, units: Any = None) -> list[str]:
    """The boundary's leaks that a design carries into a fit (messages for :class:`PrivacyLeakWarning`).

    With a privacy unit (``units``, :class:`dpivreg.privacy.units.UnitFacts` of a unit-level fit) dropping rows with a
    missing value is no leak: the public count is the number of units in the whole data, and a dropped row changes only
    its own unit's contribution (:func:`dpivreg.data.unit_ids.resolve_units`)."""
    leaks = []
    how = design.missing
    # rows dropped although none of their values was missing: the formula made one missing (e.g. log of 0);
    # under "fill" every dropped row is one (no value is missing after filling)
    lost = design.n_dropped if how == "fill" else design.n_lost
    total = design.nobs + design.n_dropped
    per_unit = units is not None and not units.row_level
    if how == "drop" and design.n_dropped > 0 and not per_unit:
        leaks.append(
            f"missing='drop': {design.n_dropped} of {total} rows had a missing value and were dropped, so the "
            f"number of complete rows (nobs = {design.nobs}) is published exactly, and every release is "
            "computed on those rows. Keep every row with missing='fill' and public fill_values, declare which "
            "rows are complete public with missing='drop-public', or protect privacy units (fit(privacy_unit=...)), "
            "whose count does not depend on the dropped rows.")
    elif lost > 0 and not per_unit:
        leaks.append(
            f"missing={how!r}: {lost} of {total} rows were dropped because the formula turned one of their values "
            f"into a missing one (e.g. np.log of a value <= 0), so nobs = {design.nobs} depends on the values and "
            "is published exactly. Transform the column so that every value in its bounds stays defined (e.g. "
            "np.log1p, or clip before the log), or drop those rows by a public rule first.")
    stateful = design.stateful
    if stateful:
        leaks.append(
            f"the transform(s) {', '.join(stateful)} learned their parameters (means, scales, knots) from the rows. "
            "Compute the transformed column from public values first (e.g. df['x_c'] = df['x'] - public_mean) "
            "and use it in the formula.")
    row_reading = getattr(design, "row_reading", ())
    if row_reading:
        leaks.append(
            f"the formula term(s) {'; '.join(row_reading)}: each row's value depends on the other rows, so the "
            "row-level guarantee does not hold for any release made from them. Use the raw column with public bounds "
            "(centring and scaling are done privately by the fit), or compute the term from public values first "
            "(e.g. df['w_c'] = df['w'] - public_mean).")
    levels = design.data_levels
    if levels:
        leaks.append(
            f"the levels of {', '.join(levels)} were read from the data: which levels occur decides the "
            "parameters' names and number. Declare them: make the column a pandas Categorical with its public "
            "categories (df[c].astype(pd.CategoricalDtype([...]))) or write C(c, levels=[...]).")
    return leaks


def declared_zero_columns(names: Sequence[Hashable], declared: Sequence[str],
                          indicators: Sequence[str]) -> tuple[Hashable, ...]:
    """Design columns that may be all zero without being an error: the dummies (and their interactions) of the
    ``declared`` categorical factors (those :func:`data_derived_levels` does not flag) and the missing-value
    indicators (names only: public)."""
    return tuple(name for name in names
                 if str(name) in indicators or any(f"{factor}[" in str(name) for factor in declared))
