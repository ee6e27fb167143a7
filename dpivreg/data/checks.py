"""The checks a design must pass before any statistic is computed from it, each raising a ``ValueError`` or
``TypeError`` that names the column or block and what to do: the frame's column types (text, dates, complex numbers,
values encoded as missing), the declared intercept, the blocks' sizes and names, finite values, enough rows, the order
condition. What one row can change — an instrument that is constant or a copy of another column, collinear
[exog, endog] or [exog, instruments] — is a *finding* instead (:func:`_instrument_findings`, :func:`rank_findings`):
a refusal would make whether a fit runs depend on one row, so the design records it (``data_findings``) and warns
the data holder (:class:`~dpivreg.errors.DataCheckWarning`); ``fit(check_data=True)`` refuses on it, announced as a
leak.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable
from typing import Any

import numpy as np
import pandas as pd
from pandas.api.types import is_bool_dtype, is_complex_dtype, is_numeric_dtype

from dpivreg.compute.backends import row_blocks
from dpivreg.data.columns import (
    Derived,
    _complex_message,
    block_columns,
    column_blocks,
    whole_column,
)
from dpivreg.data.cross_products import factor_rank_finding
from dpivreg.data.derived_columns import DerivedColumn
from dpivreg.data.formula import (
    _BLOCK_LABELS,
    _formula_factors,
    _formula_names,
    _FormulaParts,
    _only_in_categorical,
)
from dpivreg.errors import DATA_CHECK_NOTE, DataCheckWarning

#: Appended to each :class:`~dpivreg.errors.DataCheckWarning`.
FINDING_NOTE = ("The fit runs anyway: whether it runs must not depend on one row. The releases then carry no "
                "signal for that column and the summary says what they resolve; fix the design, or pass "
                "fit(check_data=True) to refuse instead (announced as a privacy leak).")

#: The leak of ``fit(check_data=True)``: announced when it refuses, recorded in the results when it runs.
CHECK_DATA_LEAK = ("check_data=True: the fit would have refused on the findings of checks that read the data (a "
                   "constant, duplicate or collinear column, a column outside its bounds), so that it ran depends on "
                   "the data. Leave check_data out for a fit to publish.")

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


def _instrument_findings(
    blocks: dict[str, pd.DataFrame],
    n_dropped: int = 0,
    full_instruments: pd.DataFrame | None = None,
    zero_allowed: tuple[Hashable, ...] = (),
    derived: Derived | None = None,
    full_derived: Derived | None = None,
) -> list[str]:
    """
    What the instruments' checks find: the message for each constant instrument and each one that duplicates
    another column (NON-PRIVATE findings: :class:`dpivreg.errors.DataCheckWarning`; a private fit runs regardless).

    ``n_dropped`` rows with a missing value were dropped before; if the
    instruments on all rows (``full_instruments``) are known and an
    instrument varies only in the dropped rows, the message says so.
    Columns in ``zero_allowed`` (declared levels, indicators) that are all zero
    are exempt (:mod:`dpivreg.data.boundary`). ``derived`` and ``full_derived``: the derived columns of ``blocks``
    and of ``full_instruments``' blocks, read a block of rows at a time.
    """
    instruments = blocks["instruments"]
    exog = blocks["exog"]
    z, x = block_columns(instruments, derived, "instruments"), block_columns(exog, derived, "exog")
    exempt_z = [name in zero_allowed and _all_zero(z[j]) for j, name in enumerate(instruments.columns)]
    exempt_x = [name in zero_allowed and _all_zero(x[i]) for i, name in enumerate(exog.columns)]
    constant, same = _constant_and_same(z, x, exempt_z, exempt_x)
    found = []
    for j, name in enumerate(instruments.columns):
        if constant.get(j):
            varied = (
                full_instruments is not None
                and _varies(whole_column(block_columns(full_instruments, full_derived, "instruments")[j]))
            )
            found.append(str(_constant_instrument_error(name, float(z[j][0:1][0]), len(z[j]), n_dropped, varied)))
            continue
        duplicated = [(other, "exog") for i, other in enumerate(exog.columns) if same.get((j, "exog", i))]
        duplicated += [(instruments.columns[i], "instruments") for i in range(j) if same.get((j, "instruments", i))]
        if duplicated:
            found.append(str(_duplicate_instrument_error(name, *duplicated[0])))
    return found


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


def rank_findings(design: Any) -> list[str]:
    """The messages for [exog, endog] and [exog, instruments] if collinear, from the design's column factor
    (:func:`factor_rank_findings`)."""
    return factor_rank_findings(design.factor.r, design.nobs, design.column_names, design.positions,
                                set(design.zero_columns))


def factor_rank_findings(r: np.ndarray, nobs: int, names: Any, positions: dict[str, list[int]],
                         zero: set[int]) -> list[str]:
    """The messages for [exog, endog] and [exog, instruments] (``positions["x"]``, ``["z"]``, without the all-zero
    ``zero`` columns) if collinear, from the columns' triangular factor ``r``
    (:func:`dpivreg.data.cross_products.factor_rank_finding`: columns scaled to a largest absolute value of 1 first;
    NON-PRIVATE findings, :class:`dpivreg.errors.DataCheckWarning`), for the in-memory and the Dask design alike."""
    found = []
    for key, label in (("x", "regressors [exog, endog]"), ("z", "instruments [exog, instruments]")):
        cols = [c for c in positions[key] if c not in zero]
        finding = factor_rank_finding(r[:, cols], nobs, [names[c] for c in cols], label)
        found += [] if finding is None else [finding]
    return found


def warn_findings(findings: list[str] | tuple[str, ...], stacklevel: int) -> None:
    """One :class:`dpivreg.errors.DataCheckWarning` per finding, saying that the fit will run anyway."""
    for finding in findings:
        warnings.warn(f"{finding} {FINDING_NOTE}", DataCheckWarning, stacklevel=stacklevel + 1)


def _validate(
    blocks: dict[str, pd.DataFrame],
    n_dropped: int = 0,
    full_instruments: pd.DataFrame | None = None,
    zero_allowed: tuple[Hashable, ...] = (),
    derived: Derived | None = None,
    full_derived: Derived | None = None,
) -> list[str]:
    """
    Run every check of a design that has no missing values, except its rank (:func:`rank_findings`, on the
    assembled design's column factor): raise for what public facts decide (names, the row count) and for infinite
    values; return what the instruments' checks find (:func:`_instrument_findings`), which does not stop a fit.

    ``n_dropped`` rows with a missing value were dropped before, and
    ``full_instruments`` are the instruments before that (if known); both only
    refine the messages. ``zero_allowed``, ``derived``, ``full_derived``: see :func:`_instrument_findings`.
    """
    _check_unique_names(blocks)
    _check_finite(blocks, derived)
    _check_enough_rows(blocks, n_dropped)
    return _instrument_findings(blocks, n_dropped, full_instruments, zero_allowed, derived, full_derived)
