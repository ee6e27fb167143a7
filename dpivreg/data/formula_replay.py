"""
Whether a formula can be built a block of rows at a time.

formulaic builds a model matrix from a *model spec*, which it can replay on other rows
(``spec.get_model_matrix(rows)``). Replaying the spec of a formula on blocks of rows and stacking the results
gives the matrix of the whole frame only when every value of a row depends on that row alone. The in-memory
design (:func:`dpivreg.data.design.design_from_formula`) replays a spec block by block to avoid holding formulaic's
intermediate frames, and the Dask design replays it on each partition; both ask :func:`replay_problems` first.

A spec replays exactly when

* no transform is stateful (``center()``, ``scale()``, ``poly()``, ``bs()`` learn parameters from the rows they
  see; ``Q('a b')``, stateful to formulaic, learns nothing);
* every categorical factor reads a pandas ``Categorical`` column, whose levels are declared, as the column itself
  or ``C(column)``, or declares its levels, ``C(..., levels=[...])`` (formulaic would read the levels of a text,
  boolean or numeric column, or of an expression such as ``C(g == 'a')``, from the rows it sees);
* every expression is built from columns (also quoted, ```a b```), numbers, arithmetic, comparisons, NumPy's
  element-wise functions (``np.log``, ``np.exp``, ..., every ``numpy.ufunc`` with no core dimensions; also
  ``np.where``, ``np.clip``, ``np.round``), ``abs``, ``round``, ``I(...)`` and ``C(...)`` (whose contrasts and
  levels, ``C(g, Treatment('b'), levels=LEVELS)``, may be any values of the namespace but not read a column). A
  method of a column (``x.mean()``, ``x.shift()``) or of a ufunc (``np.add.reduce``), a generalised ufunc
  (``np.matmul``, ``np.vecdot``) or ``@``, ``in`` and ``is``, any other function of NumPy, pandas, SciPy, patsy,
  formulaic (``lag()``) or Python's standard library (``sum``, ``statistics.fmean``), and a subscript read other
  rows; an array from the caller's namespace cannot be split with the rows. Functions of the caller's own are
  "unknown": the Dask design trusts them to act row by row (its documentation says so), the in-memory design
  builds such formulas on all rows at once instead.

:func:`formula_problems` checks a formula's expressions from its text alone, before anything is built;
:func:`replay_problems` checks a built spec (its stateful transforms and categories too).
"""

from __future__ import annotations

import array
import ast
import builtins
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from numbers import Number
from types import ModuleType
from typing import Any, Literal

import numpy as np
import pandas as pd

__all__ = ["ReplayProblem", "expression_names", "expression_problem", "formula_problems", "replay_problems",
           "row_reading_terms"]

#: formulaic's transforms that act on each row alone: ``I`` is the identity, ``Q`` reads a column by its quoted name,
#: ``C`` codes a category (its levels are checked separately, from the spec's encoders).
_ROWWISE_TRANSFORMS = ("I", "Q", "C")

#: NumPy (and pandas) functions that are not ufuncs but act element by element on arrays of one shape.
_ROWWISE_NUMPY = (np.where, np.clip, np.round, np.around, np.nan_to_num, np.asarray, np.asanyarray, pd.to_numeric)

#: Methods of a pandas Series that compute each row from that row alone (given arguments that do too; the
#: arguments are checked as any other part of the expression): ``w.clip(0, 9)``, ``w.fillna(0)``, ``w.astype(float)``.
_ROWWISE_METHODS = frozenset((
    "abs", "add", "astype", "between", "clip", "copy", "div", "eq", "fillna", "floordiv", "ge", "gt", "isin",
    "isna", "isnull", "le", "lt", "mask", "mod", "mul", "ne", "notna", "notnull", "pow", "radd", "rdiv",
    "replace", "rfloordiv", "rmod", "rmul", "round", "rpow", "rsub", "rtruediv", "sub", "to_numpy", "truediv",
    "where",
))

#: Keywords that make a row-wise method read other rows (``w.fillna(method="ffill")``, ``limit=``).
_OTHER_ROW_KEYWORDS = frozenset(("method", "limit", "axis"))

#: Accessors of a Series whose listed methods and properties act row by row (``w.str.len()``, ``d.dt.year``).
_ROWWISE_ACCESSORS = {
    "str": frozenset(("capitalize", "casefold", "contains", "count", "endswith", "find", "fullmatch", "get",
                      "isalnum", "isalpha", "isdecimal", "isdigit", "islower", "isnumeric", "isspace", "istitle",
                      "isupper", "len", "lower", "lstrip", "match", "pad", "removeprefix", "removesuffix",
                      "replace", "rstrip", "slice", "startswith", "strip", "swapcase", "title", "upper", "zfill")),
    "dt": frozenset(("date", "day", "day_of_week", "day_of_year", "dayofweek", "dayofyear", "days",
                     "days_in_month", "hour", "is_leap_year", "is_month_end", "is_month_start", "microsecond",
                     "minute", "month", "nanosecond", "quarter", "second", "seconds", "total_seconds", "weekday",
                     "year")),
}

#: Python's built-in functions that act element by element on a column (``abs(x)``, ``round(x, 2)``).
_ROWWISE_BUILTINS = (builtins.abs, builtins.round)

#: Modules whose functions are known: only their element-wise ones are row-wise. Python's standard library too
#: (``sum``, ``max``, ``statistics.fmean``, ``math.fsum`` read every row).
_KNOWN_MODULES = frozenset(("numpy", "pandas", "formulaic", "scipy", "patsy", "builtins",
                            *getattr(sys, "stdlib_module_names", ())))

#: A name quoted in backticks (```a b```), which formulaic reads as a column or a variable of that name.
_QUOTED = re.compile(r"`([^`]*)`")

_ALLOWED_NODES = (ast.Expression, ast.Name, ast.Load, ast.Constant, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call,
                  ast.Attribute, ast.keyword, ast.List, ast.Tuple, ast.operator, ast.unaryop, ast.cmpop)

#: Operators that combine whole columns, not rows: ``w @ w`` sums over the rows, ``5 in w`` searches the index.
_WHOLE_COLUMN_OPERATORS = {ast.MatMult: "@", ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}

ProblemKind = Literal["stateful", "levels", "other rows", "namespace array", "unknown function"]


@dataclass(frozen=True)
class ReplayProblem:
    """Why one expression of a spec may not replay block by block: ``kind``, a sentence saying why, and for "levels"
    the column read as a category (None for an expression's values)."""

    kind: ProblemKind
    expression: str
    why: str
    column: str | None = None


def replay_problems(spec: Any, data: pd.DataFrame, context: Mapping[str, Any]) -> list[ReplayProblem]:
    """
    What stops formulaic's ``spec`` from giving, block by block, the matrix it gives on all rows.

    Parameters
    ----------
    spec : formulaic.ModelSpec
        The spec of a block's formula, built on some rows of ``data`` (or a frame with its column types).
    data : DataFrame
        The data (only its column names and types are read).
    context : Mapping
        The namespace the formula is evaluated in.

    Returns
    -------
    list of ReplayProblem
        Empty when replaying is exact (see the module's docstring).
    """
    problems = [ReplayProblem("stateful", name, "a stateful transform learns its parameters from the rows it sees")
                for name, state in sorted(spec.transform_state.items()) if state]  # Q('a b') learns nothing
    for problem in _factor_problems((factor for term in spec.formula for factor in term.factors), data, context):
        if problem not in problems:
            problems.append(problem)
    for expression, (kind, _state) in spec.encoder_state.items():
        if getattr(kind, "value", kind) == "categorical":
            problem = _levels_problem(str(expression), data, context)
            if problem is not None and problem not in problems:
                problems.append(problem)
    return problems


def formula_problems(text: str, data: pd.DataFrame, context: Mapping[str, Any]) -> list[ReplayProblem]:
    """The problems of the expressions of formula ``text`` (one block's right-hand side), found from the text alone
    (stateful transforms show as calls that read other rows; categories need a built spec,
    :func:`replay_problems`). Empty also when formulaic cannot parse ``text``: building it then says why."""
    from formulaic import Formula  # noqa: PLC0415 - formulaic is imported with the formula

    try:
        terms = list(Formula(text))
    except Exception:  # noqa: BLE001 - the build reports the formula's error
        return []
    return list(dict.fromkeys(_factor_problems((factor for term in terms for factor in term.factors), data,
                                               context)))


def row_reading_terms(texts: Iterable[str | None], data: pd.DataFrame, context: Mapping[str, Any], *,
                      sample: pd.DataFrame | Callable[[], pd.DataFrame] | None = None,
                      known: Iterable[str] = ()) -> tuple[str, ...]:
    """The expressions of a formula's blocks whose value in a row depends on other rows, each with why: a privacy
    leak, since the row-level guarantee assumes each row's design values are a function of that row alone.

    From the text (:func:`formula_problems`): methods of a column (``w.mean()``, ``w.rank()``, ``w.shift(1)``),
    functions that are not element-wise (``np.median(w)``, ``sum``), and the other kinds of :func:`expression_problem`.
    With ``sample`` (real rows of the data, or a function that reads them, called only when a caller's function
    needs it: a Dask frame's first rows), a call of the caller's own function is also tried on it: if its values
    change when the sample is cut in half or reversed (:func:`_depends_on_other_rows`), it reads other rows. Not
    listed: expressions in ``known`` (the stateful transforms, announced on their own), categories whose levels come
    from the data (announced as ``data_levels``) and arrays of the caller's namespace.
    """
    known = set(known)
    found: dict[str, str] = {}
    for text in texts:
        if text is None:
            continue
        for problem in formula_problems(text, data, context):
            expression = problem.expression
            if expression in known or expression in found:
                continue
            if problem.kind == "other rows":
                found[expression] = problem.why
            elif problem.kind == "unknown function" and sample is not None:
                sample = sample() if callable(sample) else sample
                if not _depends_on_other_rows(expression, sample, context):
                    continue
                found[expression] = (f"{problem.why.removesuffix(', which may read other rows')}, whose values on the "
                                     "data's first rows change when other rows are left out or reordered")
    return tuple(f"{expression}: {why}" for expression, why in found.items())


def _depends_on_other_rows(expression: str, sample: pd.DataFrame, context: Mapping[str, Any]) -> bool:
    """Whether ``expression``'s values on ``sample`` change when it is evaluated on the sample's first half or on
    the sample reversed (a row-wise expression gives each row the same value either way). An expression that fails
    on a part of the sample (an array of the data's length, say) reads other rows too. Too few rows to cut: False."""
    from formulaic import model_matrix  # noqa: PLC0415 - formulaic is imported with the formula

    rows = sample.shape[0]
    if rows < 4:
        return False

    def values(frame: pd.DataFrame) -> np.ndarray:
        matrix = model_matrix(f"0 + {expression}", frame, context=dict(context), na_action="ignore")
        return np.asarray(matrix, dtype=np.float64)

    try:
        whole, half, reverse = values(sample), values(sample.iloc[: rows // 2]), values(sample.iloc[::-1])[::-1]
    except Exception:  # noqa: BLE001 - failing on part of the rows is reading the others
        return True
    return not (whole.shape == reverse.shape and whole[: rows // 2].shape == half.shape
                and np.allclose(whole[: rows // 2], half, rtol=1e-12, atol=0.0, equal_nan=True)
                and np.allclose(whole, reverse, rtol=1e-12, atol=0.0, equal_nan=True))


def _factor_problems(factors: Any, data: pd.DataFrame, context: Mapping[str, Any]) -> list[ReplayProblem]:
    """The problem of each of formulaic's factors that has one: an expression's (:func:`expression_problem`), or
    for a name looked up (a column, perhaps quoted in backticks), an array of the namespace of that name."""
    problems = []
    for factor in factors:
        method = getattr(factor.eval_method, "value", factor.eval_method)
        expression = str(factor.expr)
        if method == "literal" or (method == "lookup" and expression in data.columns):
            continue
        if method == "lookup":
            problem = _namespace_array_problem(expression, _lookup(expression, context), expression)
        else:
            problem = expression_problem(expression, data, context)
        if problem is not None:
            problems.append(problem)
    return problems


def _namespace_array_problem(name: str, value: Any, expression: str) -> ReplayProblem | None:
    """The problem of reading ``name`` (not a column; dotted when reached through a module, ``cfg.weights``) when its
    ``value`` is an array of the namespace, else None."""
    if not _is_array(value):
        return None
    return ReplayProblem("namespace array", expression,
                         f"it reads {name!r} from your namespace, a {type(value).__name__} of {len(value)} values, "
                         "which cannot be split with the rows")


def _levels_problem(expression: str, data: pd.DataFrame, context: Mapping[str, Any]) -> ReplayProblem | None:
    """None when the categorical factor ``expression`` has declared levels: a ``Categorical`` column, as itself or
    in ``C(column, ...)``, or ``C(..., levels=...)``; else the "levels" problem (naming the column it reads, if
    it is one column)."""
    scope = _Scope.of(expression, data.columns)
    node = scope.tree.body if scope.tree is not None else None
    if isinstance(node, ast.Call) and _is_categorical_call(node, scope, context):
        if any(k.arg == "levels" and given_levels(k.value, context) for k in node.keywords):
            return None
        node = node.args[0] if node.args else node
    column = scope.column(node) if isinstance(node, ast.Name) else (expression if expression in data.columns
                                                                     else None)
    if column is not None and isinstance(data[column].dtype, pd.CategoricalDtype):
        return None
    if column is not None:
        why = (f"it treats column {column!r} (dtype {data[column].dtype}) as a category, whose levels formulaic would "
               "read from the rows it sees")
    else:
        why = ("it treats the values of an expression as a category, whose levels formulaic would read from the "
               "rows it sees (declare them: C(..., levels=[...]))")
    return ReplayProblem("levels", expression, why, column)


def given_levels(node: ast.expr, context: Mapping[str, Any]) -> bool:
    """Whether ``C(..., levels=<node>)`` gives its levels: not ``None``, as written or as the value of the expression in
    ``context`` (``levels=L`` with ``L = None`` reads the levels from the rows; so does ``levels=F(L)`` returning
    None). An expression that cannot be evaluated in
    ``context`` (it reads a column: checked elsewhere) is taken as given."""
    if isinstance(node, ast.Constant):
        return node.value is not None
    try:
        value = eval(compile(ast.Expression(node), "<levels>", "eval"), {"__builtins__": builtins}, dict(context))  # noqa: S307
    except Exception:  # noqa: BLE001 - not resolvable here: formulaic reports it when it builds the formula
        return True
    return value is not None


@dataclass(frozen=True)
class _Scope:
    """An expression parsed as formulaic reads it: names quoted in backticks replaced by placeholders
    (``quoted``: placeholder -> name), and the data's columns."""

    tree: ast.Expression | None
    quoted: dict[str, str]
    columns: Any

    @classmethod
    def of(cls, expression: str, columns: Any = ()) -> "_Scope":
        quoted: dict[str, str] = {}

        def placeholder(match: re.Match) -> str:
            key = f"_dpivreg_quoted_{len(quoted)}"
            quoted[key] = match.group(1)
            return key

        try:
            tree = ast.parse(_QUOTED.sub(placeholder, expression), mode="eval")
        except SyntaxError:
            tree = None
        return cls(tree, quoted, columns)

    def name(self, node: ast.Name) -> str:
        """The name a Name node reads (a quoted name unquoted)."""
        return self.quoted.get(node.id, node.id)

    def column(self, node: ast.AST) -> str | None:
        """The column a Name node reads, or None."""
        if isinstance(node, ast.Name) and self.name(node) in self.columns:
            return self.name(node)
        return None


def expression_problem(expression: str, data: pd.DataFrame, context: Mapping[str, Any]) -> ReplayProblem | None:
    """The first reason why the Python expression ``expression`` (a factor of formulaic or patsy) may read other rows
    than its own, or None. A function of the caller's own is reported ("unknown function") only when nothing worse
    is found."""
    scope = _Scope.of(expression, data.columns)
    if scope.tree is None:
        return ReplayProblem("other rows", expression, "it is not a Python expression that could be checked")
    unknown = None
    for node, declared in _row_nodes(scope.tree, scope, context):
        if declared:  # C()'s contrasts and levels: any values of the namespace, but not computed from a column
            if scope.column(node) is not None:
                return ReplayProblem("other rows", expression,
                                     f"its category's levels or contrasts read the column {scope.column(node)!r}")
            continue
        if type(node) in _WHOLE_COLUMN_OPERATORS:
            return ReplayProblem("other rows", expression,
                                 f"it uses the operator {_WHOLE_COLUMN_OPERATORS[type(node)]!r}, which reads whole "
                                 "columns")
        if not isinstance(node, _ALLOWED_NODES):
            return ReplayProblem("other rows", expression,
                                 f"it uses {type(node).__name__.lower()} syntax, which may read other rows")
        if isinstance(node, ast.Name) and scope.column(node) is None:
            problem = _namespace_array_problem(scope.name(node), _lookup(scope.name(node), context), expression)
            if problem is not None:
                return problem
        if isinstance(node, ast.Attribute) and _rowwise_attribute(node, scope):
            continue  # w.clip, w.str, w.str.len: its call's arguments are checked as nodes of their own
        if isinstance(node, ast.Attribute) and not _resolves_in_namespace(node, scope, context):
            return ReplayProblem("other rows", expression,
                                 f"it reads the attribute {node.attr!r} of a column or value (a method such as "
                                 "x.mean() or x.shift() sees every row)")
        if isinstance(node, ast.Attribute):  # an array reached through a module, cfg.weights
            problem = _namespace_array_problem(_unparse(node, scope), _resolve(node, scope, context), expression)
            if problem is not None:
                return problem
        if isinstance(node, ast.Call) and _rowwise_attribute(node.func, scope):
            if any(keyword.arg in _OTHER_ROW_KEYWORDS for keyword in node.keywords):
                return ReplayProblem("other rows", expression,
                                     f"it calls {_unparse(node.func, scope)} with a keyword that reads other rows")
            continue
        if isinstance(node, ast.Call):
            verdict = _call_verdict(node.func, scope, context)
            if verdict == "other rows":
                return ReplayProblem("other rows", expression,
                                     f"it calls {_unparse(node.func, scope)}, which is not an element-wise function")
            if verdict == "unknown" and unknown is None:
                unknown = ReplayProblem("unknown function", expression,
                                        f"it calls your function {_unparse(node.func, scope)}, which may read other "
                                        "rows")
    return unknown


def _rowwise_attribute(node: ast.AST, scope: _Scope) -> bool:
    """Whether ``node`` is a row-wise method or accessor of a row-wise value (:data:`_ROWWISE_METHODS`,
    :data:`_ROWWISE_ACCESSORS`): of a column, or of such a method's result (``w.fillna(0).round(1)``)."""
    if not isinstance(node, ast.Attribute):
        return False
    owner = node.value
    if isinstance(owner, ast.Attribute) and owner.attr in _ROWWISE_ACCESSORS:
        return node.attr in _ROWWISE_ACCESSORS[owner.attr] and _rowwise_value(owner.value, scope)
    return (node.attr in _ROWWISE_METHODS or node.attr in _ROWWISE_ACCESSORS) and _rowwise_value(owner, scope)


def _rowwise_value(node: ast.AST, scope: _Scope) -> bool:
    """A column, or the result of a row-wise method called on one."""
    if scope.column(node) is not None:
        return True
    return isinstance(node, ast.Call) and _rowwise_attribute(node.func, scope)


def _row_nodes(node: ast.AST, scope: _Scope, context: Mapping[str, Any], declared: bool = False):
    """Every node of an expression, with whether it belongs to a declaration of ``C()`` (its contrasts and levels,
    every argument but the first: values of the namespace such as ``Treatment('b')`` or a list of levels, not row
    data)."""
    yield node, declared
    if not declared and isinstance(node, ast.Call) and node.args and _is_categorical_call(node, scope, context):
        for child in (node.func, node.args[0]):
            yield from _row_nodes(child, scope, context)
        for child in (*node.args[1:], *node.keywords):
            yield from _row_nodes(child, scope, context, declared=True)
        return
    for child in ast.iter_child_nodes(node):
        yield from _row_nodes(child, scope, context, declared)


def _is_categorical_call(node: ast.Call, scope: _Scope, context: Mapping[str, Any]) -> bool:
    """Whether ``node`` calls formulaic's ``C``."""
    return _resolve(node.func, scope, context) is _lookup("C", {})


def expression_names(expression: str) -> set[str]:
    """The names an expression reads (a name quoted in backticks unquoted; empty if it does not parse): what the
    Dask design ships of the caller's namespace."""
    scope = _Scope.of(expression)
    if scope.tree is None:
        return set()
    return {scope.name(node) for node in ast.walk(scope.tree) if isinstance(node, ast.Name)}


def _unparse(node: ast.AST, scope: _Scope) -> str:
    """``node`` as written (quoted names quoted again)."""
    text = ast.unparse(node)
    for key, name in scope.quoted.items():
        text = text.replace(key, f"`{name}`")
    return text


_MISSING = object()


def _lookup(name: str, context: Mapping[str, Any]) -> Any:
    """What ``name`` (not a column) means to formulaic: ``context[name]``, else formulaic's own transform of that
    name (``np``, ``log``, ``C``, ``center``, ...; formulaic looks in the data, then the context, then its
    transforms), else Python's built-in of that name (``abs``, ``sum``), else a sentinel."""
    from formulaic.transforms import TRANSFORMS  # noqa: PLC0415 - formulaic is imported with the formula

    try:
        if name in context:
            return context[name]
    except Exception:  # noqa: BLE001 - an odd mapping: treated as absent
        pass
    return TRANSFORMS.get(name, getattr(builtins, name, _MISSING))


def _is_array(value: Any) -> bool:
    """A sequence of values (it would have to be split with the rows): a NumPy array of one or more dimensions, a
    pandas Series, Index or extension array (``pd.array``), a list, tuple, range or ``array.array``."""
    if isinstance(value, np.ndarray):
        return value.ndim > 0
    return isinstance(value, (pd.Series, pd.Index, pd.api.extensions.ExtensionArray, list, tuple, range, array.array))


def _resolve(node: ast.AST, scope: _Scope, context: Mapping[str, Any]) -> Any:
    """The object a dotted name (``np.log``) names in ``context``; the sentinel for a column or anything else."""
    if isinstance(node, ast.Name):
        return _MISSING if scope.column(node) is not None else _lookup(scope.name(node), context)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, scope, context)
        return _MISSING if base is _MISSING else getattr(base, node.attr, _MISSING)
    return _MISSING


def _resolves_in_namespace(node: ast.Attribute, scope: _Scope, context: Mapping[str, Any]) -> bool:
    """Whether ``node`` is an attribute of a module or of a scalar of the namespace (``np.log``, ``np.pi``)."""
    root = node.value
    while isinstance(root, ast.Attribute):
        root = root.value
    if not isinstance(root, ast.Name) or scope.column(root) is not None:
        return False
    value = _lookup(scope.name(root), context)
    return isinstance(value, (ModuleType, Number)) and _resolve(node, scope, context) is not _MISSING


def _call_verdict(func: ast.AST, scope: _Scope, context: Mapping[str, Any]) -> Literal["rowwise", "unknown",
                                                                                       "other rows"]:
    """Whether calling ``func`` is element-wise ("rowwise"), a function of the caller's own ("unknown"), or may read
    other rows."""
    from formulaic.transforms import TRANSFORMS  # noqa: PLC0415

    target = _resolve(func, scope, context)
    if target is _MISSING or not callable(target):
        return "other rows"
    if isinstance(target, np.ufunc):  # a generalised ufunc (np.matmul, np.vecdot) works on whole axes
        return "rowwise" if target.signature is None else "other rows"
    if (any(target is known for known in (*_ROWWISE_NUMPY, *_ROWWISE_BUILTINS))
            or any(target is TRANSFORMS[name] for name in _ROWWISE_TRANSFORMS)):
        return "rowwise"
    module = getattr(target, "__module__", None)
    if module is None or isinstance(getattr(target, "__self__", None), np.ufunc):  # np.add.reduce, .accumulate
        return "other rows"
    return "other rows" if module.split(".")[0] in _KNOWN_MODULES else "unknown"
