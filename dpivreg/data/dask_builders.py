"""Formula builders for Dask partitions: the design specification built once, applied to each partition.

A Dask design (:mod:`dpivreg.data.dask_design`) never evaluates a formula on the whole frame. The builders here
make the specification once from a synthetic non-empty frame with the data's column types (formulaic's
``ModelSpec`` or patsy's ``DesignInfo``; no data is read), check each block's terms against what a partition
can compute on its own (no term may read other rows; text only as a category with declared levels; categories
known), and are shipped to the workers, where calling one on a pandas partition returns its raw float64 design.
"""

from __future__ import annotations

import ast
import contextlib
import threading
import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from pandas.api.types import is_bool_dtype, is_numeric_dtype

from dpivreg.data.builders import formulaic_block_matrix, undeclared_levels_error
from dpivreg.data.checks import (
    _formula_variables,
    _is_text_dtype,
)
from dpivreg.data.columns import _empty_block, float_values
from dpivreg.data.formula import _BLOCKS, _block_error, _block_formulas, _formula_factors, _FormulaParts
from dpivreg.data.formula_replay import (
    ReplayProblem,
    expression_names,
    expression_problem,
    formula_problems,
    given_levels,
    replay_problems,
)

_STATEFUL_HELP = (
    "With a Dask DataFrame the design is built once from the column types, not from the data, so "
    "transforms that learn parameters from the data (center(), scale(), poly(), bs(), ...) cannot be "
    "used. Compute the transformed column with Dask first, e.g. "
    "ddf['x_c'] = ddf['x'] - ddf['x'].mean(), and use it in the formula."
)
from dpivreg.data.builders import _formulaic_context

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
        silently. The values are compared directly: formulaic's warning of them cannot be read
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
        pandas gives formulaic for categories outside the levels in every partition (the pandas design drops that
        warning, which a partition's thread cannot catch safely). A column read with two sets of
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
                f"{fix} A column of True/False with missing values reads as text too: declare it "
                f"ddf[{col!r}] = ddf[{col!r}].astype('boolean') (or dd.read_csv(..., dtype={{{col!r}: 'boolean'}})), "
                "in every frame you fit: a declared dtype is public, one pandas infers from the values is not."
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
    """Raise for what would make a partition's rows differ from the pandas design's
    (:mod:`dpivreg.data.formula_replay`): stateful transforms, categories whose levels would be read from the sample,
    expressions that read other rows. Functions of the caller's own are trusted to act row by row (documented); arrays
    of the namespace read as row data raise (:func:`_check_namespace_array`)."""
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
    declared levels, which formulaic and pandas warn of (a pandas deprecation warning users should not see)."""
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
                        f"{str(factor.expr)!r} in the {block} block: with a Dask DataFrame a category must be a "
                        "column, as itself or C(column, ...), so that each partition's values can be checked against "
                        "its levels. Compute the expression with Dask first as a category with known categories, e.g. "
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
