"""The formula engines that build a design's blocks from a frame: formulaic, exactly as
``linearmodels.iv.IV2SLS.from_formula`` builds them (same names, order, values and rows, full rank where linearmodels
asks for it), block by block of rows for large frames; patsy, with statsmodels' naming and coding; and plain column
names read without either engine (the caller's float64 columns shared, not copied). Also the kinds of the formula's
factors (numeric, categorical, derived) that the missing-value boundary and the derived columns read.
"""

from __future__ import annotations

import keyword
import re
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from dpivreg.data.columns import (
    _FLOAT_BLOCK,
    _CompactColumns,
    _converted_column,
    _copy_on_write,
    _empty_block,
    _ones,
    float_values,
)
from dpivreg.data.derived_columns import DerivedColumn, derived_terms, intercept_columns
from dpivreg.data.formula import (
    _BLOCK_LABELS,
    _BLOCKS,
    _block_error,
    _block_formulas,
    _FormulaParts,
)
from dpivreg.data.formula_replay import formula_problems, replay_problems
from dpivreg.errors import DATA_CHECK_NOTE

__all__ = ["FORMULA_ENGINES"]


#: Formula engines accepted by :func:`design_from_formula`.
FORMULA_ENGINES: tuple[str, ...] = ("formulaic", "patsy")


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

    When the formula's expressions act on each row alone (:func:`dpivreg.data.formula_replay.formula_problems`, from the
    text), the first rows are built with :func:`formulaic_block_matrix`; when its model spec replays exactly too
    (:func:`dpivreg.data.formula_replay.replay_problems`: declared category levels, no stateful transform), the terms
    with a recipe that reproduces those rows (:func:`dpivreg.data.derived_columns.derived_terms`: a numeric expression
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
    refuse values that are no longer finite (:meth:`dpivreg.estimation.working_scale.WorkingRows.block`). Integer
    columns are converted (:func:`_converted_column`: a uint8 copy of a 0/1 column, a float64 copy of any other).
    Without copy-on-write (pandas 2 without the option), the block is copied into new memory.
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
