"""
Whether a formula can be built a block of rows at a time.

formulaic builds a model matrix from a *model spec*, which it can replay on other rows
(``spec.get_model_matrix(rows)``). Replaying the spec of a formula on blocks of rows and stacking the results
gives the matrix of the whole frame only when every value of a row depends on that row alone. The in-memory
design (:func:`dpivreg.design.design_from_formula`) replays a spec block by block to avoid holding formulaic's
intermediate frames, and the Dask design replays it on each partition; both ask :func:`replay_problems` first.

A spec replays exactly when

* no transform is stateful (``center()``, ``scale()``, ``poly()``, ``bs()`` learn parameters from the rows they
  see);
* every categorical factor reads a pandas ``Categorical`` column, whose levels are declared (formulaic would read
  the levels of a text, boolean or numeric column from the rows it sees);
* every expression is built from columns, numbers, arithmetic, comparisons, NumPy's element-wise functions
  (``np.log``, ``np.exp``, ..., every ``numpy.ufunc``; also ``np.where``, ``np.clip``, ``np.round``), ``I(...)``
  and ``C(...)``. A method of a column (``x.mean()``, ``x.shift()``), any other NumPy or pandas function
  (``np.mean``, ``pd.qcut``) or formulaic transform (``lag()``), and a subscript read other rows; an array from
  the caller's namespace cannot be split with the rows. Functions of the caller's own are "unknown": the Dask
  design trusts them to act row by row (its documentation says so), the in-memory design builds such formulas
  on all rows at once instead.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Number
from types import ModuleType
from typing import Any, Literal

import numpy as np
import pandas as pd

__all__ = ["ReplayProblem", "expression_problem", "replay_problems"]

#: formulaic's transforms that act on each row alone: ``I`` is the identity, ``Q`` reads a column by its quoted name,
#: ``C`` codes a category (its levels are checked separately, from the spec's encoders).
_ROWWISE_TRANSFORMS = ("I", "Q", "C")

#: NumPy functions that are not ufuncs but act element by element on arrays of one shape.
_ROWWISE_NUMPY = (np.where, np.clip, np.round, np.around)

#: Modules whose functions are known: only their element-wise ones are row-wise.
_KNOWN_MODULES = ("numpy", "pandas", "formulaic", "scipy")

_ALLOWED_NODES = (ast.Expression, ast.Name, ast.Load, ast.Constant, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call,
                  ast.Attribute, ast.keyword, ast.List, ast.Tuple, ast.operator, ast.unaryop, ast.cmpop)

ProblemKind = Literal["stateful", "levels", "other rows", "namespace array", "unknown function"]


@dataclass(frozen=True)
class ReplayProblem:
    """Why one expression of a spec may not replay block by block: ``kind``, a sentence saying why, and for "levels"
    the column read as a category."""

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
                for name in sorted(spec.transform_state)]
    reads: dict[str, set] = {}
    for term in spec.formula:
        for factor in term.factors:
            expression = str(factor.expr)
            reads[expression] = set(getattr(factor, "required_variables", set()) or set())
            if getattr(factor.eval_method, "value", factor.eval_method) == "literal":
                continue
            problem = expression_problem(expression, data, context)
            if problem is not None and problem not in problems:
                problems.append(problem)
    for expression, (kind, _state) in spec.encoder_state.items():
        if getattr(kind, "value", kind) != "categorical":
            continue
        for column in sorted(map(str, reads.get(str(expression), set()))):
            if column in data.columns and not isinstance(data[column].dtype, pd.CategoricalDtype):
                problems.append(ReplayProblem(
                    "levels", str(expression),
                    f"it treats column {column!r} (dtype {data[column].dtype}) as a category, whose levels formulaic "
                    "would read from the rows it sees", column))
    return problems


def expression_problem(expression: str, data: pd.DataFrame, context: Mapping[str, Any]) -> ReplayProblem | None:
    """The first reason why the Python expression ``expression`` (a factor of formulaic or patsy) may read other rows
    than its own, or None. A function of the caller's own is reported ("unknown function") only when nothing worse
    is found."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        return ReplayProblem("other rows", expression, "it is not a Python expression that could be checked")
    unknown = None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            return ReplayProblem("other rows", expression,
                                 f"it uses {type(node).__name__.lower()} syntax, which may read other rows")
        if isinstance(node, ast.Name) and node.id not in data.columns and _is_array(_lookup(node.id, context)):
            return ReplayProblem("namespace array", expression,
                                 f"it reads {node.id!r}, an array from your namespace, which cannot be split with "
                                 "the rows")
        if isinstance(node, ast.Attribute) and not _resolves_in_namespace(node, data, context):
            return ReplayProblem("other rows", expression,
                                 f"it reads the attribute {node.attr!r} of a column or value (a method such as "
                                 "x.mean() or x.shift() sees every row)")
        if isinstance(node, ast.Call):
            verdict = _call_verdict(node.func, data, context)
            if verdict == "other rows":
                return ReplayProblem("other rows", expression,
                                     f"it calls {ast.unparse(node.func)}, which is not an element-wise function")
            if verdict == "unknown" and unknown is None:
                unknown = ReplayProblem("unknown function", expression,
                                        f"it calls your function {ast.unparse(node.func)}, which may read other rows")
    return unknown


_MISSING = object()


def _lookup(name: str, context: Mapping[str, Any]) -> Any:
    """What ``name`` (not a column) means to formulaic: ``context[name]``, else formulaic's own transform of that
    name (``np``, ``log``, ``C``, ``center``, ...; formulaic looks in the data, then the context, then its
    transforms), else a sentinel."""
    from formulaic.transforms import TRANSFORMS  # noqa: PLC0415 - formulaic is imported with the formula

    try:
        if name in context:
            return context[name]
    except Exception:  # noqa: BLE001 - an odd mapping: treated as absent
        pass
    return TRANSFORMS.get(name, _MISSING)


def _is_array(value: Any) -> bool:
    """A value with more than one element along an axis (it would have to be split with the rows)."""
    return isinstance(value, (np.ndarray, pd.Series, pd.Index, list, tuple)) and np.ndim(value) > 0


def _resolve(node: ast.AST, data: pd.DataFrame, context: Mapping[str, Any]) -> Any:
    """The object a dotted name (``np.log``) names in ``context``; the sentinel for a column or anything else."""
    if isinstance(node, ast.Name):
        return _MISSING if node.id in data.columns else _lookup(node.id, context)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, data, context)
        return _MISSING if base is _MISSING else getattr(base, node.attr, _MISSING)
    return _MISSING


def _resolves_in_namespace(node: ast.Attribute, data: pd.DataFrame, context: Mapping[str, Any]) -> bool:
    """Whether ``node`` is an attribute of a module or of a scalar of the namespace (``np.log``, ``np.pi``)."""
    root = node.value
    while isinstance(root, ast.Attribute):
        root = root.value
    if not isinstance(root, ast.Name) or root.id in data.columns:
        return False
    value = _lookup(root.id, context)
    return isinstance(value, (ModuleType, Number)) and _resolve(node, data, context) is not _MISSING


def _call_verdict(func: ast.AST, data: pd.DataFrame, context: Mapping[str, Any]) -> Literal["rowwise", "unknown",
                                                                                            "other rows"]:
    """Whether calling ``func`` is element-wise ("rowwise"), a function of the caller's own ("unknown"), or may read
    other rows."""
    from formulaic.transforms import TRANSFORMS  # noqa: PLC0415

    target = _resolve(func, data, context)
    if target is _MISSING or not callable(target):
        return "other rows"
    if (isinstance(target, np.ufunc) or any(target is known for known in _ROWWISE_NUMPY)
            or any(target is TRANSFORMS[name] for name in _ROWWISE_TRANSFORMS)):
        return "rowwise"
    module = getattr(target, "__module__", None) or ""
    return "other rows" if module.split(".")[0] in _KNOWN_MODULES else "unknown"
