"""
Design columns computed from the data a block of rows at a time, instead of held.

A formula's transformed terms (``np.log(s)``, ``I(w ** 2)``, ``C(g)``'s indicators) are new columns: held in memory,
they cost the design eight bytes a row each (one for an indicator), half the size of the data at 10⁷ rows for
``1 + np.log(s) + I(w ** 2) + C(g)``. A :class:`DerivedColumn` holds a recipe instead, and a pass computes the
rows it reads (:func:`dpivreg.data.columns.stack_rows`); the design then costs no more memory than its plain columns.

Two recipes, each for a term of one block's formula whose values on a row depend on that row alone (the spec
replays, :mod:`dpivreg.data.formula_replay`):

* :class:`ExpressionRecipe`: a term of one numeric factor (formulaic's kind), one column, whose expression reads
  only numeric columns of the data (``np.log(s)``, ``I(w ** 2)``, ``np.where(a > 0, a, 0)``) and names of the
  namespace that cannot change (NumPy, formulaic's and Python's element-wise functions, numbers): the expression
  evaluated as formulaic evaluates it, on pandas Series of the block's rows (pandas' own rules then apply:
  ``a % 0`` is missing, ``np.clip`` ignores a missing bound; NumPy's would differ);
* :class:`CategoryRecipe`: a term whose factors read one categorical column and nothing else of the data
  (``C(g)``, ``g``, ``C(g, levels=...)``): its columns depend on the row's category alone, so formulaic's own
  coding of each category (and of a missing one) is read once into a small table, and a block's values are the
  table's rows at the block's category codes.

:func:`derived_terms` offers a recipe only when it reproduces formulaic's matrix on the rows formulaic built
(the design's first rows) bit for bit; every other term is built by formulaic and held. The recipe keeps the data's
columns through a pandas lazy copy (copy-on-write), so a later write into the caller's frame copies *their*
column and leaves the design's values as they were. Writes into a NumPy array that the caller's frame itself
views bypass pandas and reach the recipe, as they reach the shared plain columns
(:func:`dpivreg.data.builders.plain_column_block`): a fit compares the rows it reads with the design's checksum and
refuses changed data.
"""

from __future__ import annotations

import ast
import builtins
import warnings
from collections import ChainMap
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from dpivreg.compute.backends import row_blocks
from dpivreg.data.formula_replay import _ROWWISE_BUILTINS, _ROWWISE_NUMPY, expression_names

__all__ = ["DerivedColumn", "ExpressionRecipe", "CategoryRecipe", "derived_terms", "intercept_columns", "same_values"]


class DerivedColumn:
    """
    One design column computed from the data for the rows read (float64), never held whole.

    Parameters
    ----------
    recipe : callable
        ``recipe(positions)``: the column's values at ``positions`` (a slice or an integer array) of the data,
        float64.
    size : int
        The design's rows.
    positions : ndarray of int, optional
        The positions in the data of the design's rows, when rows were dropped (None: all, in order).

    Notes
    -----
    The values read may be a read-only view of the caller's column (a plain column that formulaic would copy):
    readers copy them (:func:`dpivreg.data.columns.stack_rows`) or only compare them.
    """

    __slots__ = ("recipe", "size", "positions")

    def __init__(self, recipe: Callable[[Any], np.ndarray], size: int, positions: np.ndarray | None = None) -> None:
        self.recipe, self.size, self.positions = recipe, int(size), positions

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, rows: slice | np.ndarray) -> np.ndarray:
        """The values at the design's rows ``rows`` (a slice or positions), NumPy's warnings quiet: the design's
        build computed every row once with them (:func:`dpivreg.data.builders._formulaic_block`)."""
        if self.positions is not None:
            rows = self.positions[rows]
        elif isinstance(rows, slice):
            rows = slice(*rows.indices(self.size))
        with np.errstate(all="ignore"):
            return self.recipe(rows)

    def taken(self, kept: np.ndarray) -> "DerivedColumn":
        """The column on the design's rows at positions ``kept`` (the rows left after dropping some)."""
        positions = kept if self.positions is None else self.positions[kept]
        return DerivedColumn(self.recipe, kept.shape[0], np.asarray(positions, dtype=np.int64))

    def values(self) -> np.ndarray:
        """The whole column, in new memory (a user's read of a block, a pickle)."""
        out = np.empty(self.size)
        for rows in row_blocks(self.size):
            out[rows] = self[rows]
        return out


class ExpressionRecipe:
    """A numeric factor's expression evaluated as formulaic evaluates it: on pandas Series of the block's rows of the
    data's columns, its other names those of the namespace, looked up once (:func:`_namespace`)."""

    def __init__(self, expression: str, sources: pd.DataFrame, context: Mapping[str, Any]) -> None:
        self.expression = expression
        self._code = compile(ast.parse(expression, mode="eval"), "<formula>", "eval")
        self._sources = sources  # pandas' lazy copy of the caller's columns: keeps copy-on-write's protection
        self._arrays = {name: sources[name].to_numpy() for name in sources.columns}
        self._namespace = _namespace(expression, sources.columns, context)

    def __call__(self, rows: slice | np.ndarray) -> np.ndarray:
        columns = {name: pd.Series(array[rows], copy=False) for name, array in self._arrays.items()}
        value = eval(self._code, {"__builtins__": builtins}, self._namespace.new_child(columns))  # noqa: S307
        out = np.asarray(value, dtype=np.float64)
        length = len(next(iter(columns.values())))
        return out if out.shape == (length,) else np.broadcast_to(out, (length,)).copy()


class CategoryRecipe:
    """One column of a term that depends on a categorical column alone: formulaic's value for each category (and
    for a missing one, code −1, the table's last entry) looked up at the block's category codes."""

    def __init__(self, table: np.ndarray, sources: pd.DataFrame) -> None:
        self.table = np.ascontiguousarray(table, dtype=np.float64)
        self._sources = sources
        self._codes = sources.iloc[:, 0].cat.codes.to_numpy()

    def __call__(self, rows: slice | np.ndarray) -> np.ndarray:
        return self.table.take(self._codes[rows])


def _namespace(expression: str, columns: Any, context: Mapping[str, Any]) -> ChainMap:
    """The names ``expression`` reads that are not ``columns``, looked up in formulaic's order after the data's
    columns: ``context``, then formulaic's transforms, then Python's built-ins. Only those names are kept (not the
    caller's whole namespace), and only values that cannot change between the build and a pass
    (:func:`_unchanging`): a module of the caller's or an array would be read again at each pass. NameError for
    any other name (the term then has no recipe)."""
    from formulaic.transforms import TRANSFORMS  # noqa: PLC0415 - formulaic is imported with the formula

    scope = ChainMap(context, TRANSFORMS, vars(builtins))
    names = {}
    for name in expression_names(expression) - set(columns):
        if name not in scope or not _unchanging(scope[name], TRANSFORMS):
            raise NameError(name)
        names[name] = scope[name]
    return ChainMap(names)


def _unchanging(value: Any, transforms: Mapping[str, Any]) -> bool:
    """Whether a namespace value reads the same at every pass: NumPy (its attributes are its functions and
    constants), an element-wise function of NumPy, formulaic or Python's, or a number (not a 0-d array, which can
    be written into)."""
    if value is np or isinstance(value, (np.ufunc, bool, int, float, complex, str, np.generic)) or value is None:
        return True
    return (any(value is known for known in _ROWWISE_NUMPY + _ROWWISE_BUILTINS)
            or any(value is known for known in transforms.values()))


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two float64 columns are equal bit for bit (missing values wherever either is missing)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    missing = np.isnan(a)
    return bool(np.array_equal(missing, np.isnan(b))
                and np.array_equal(a[~missing].view(np.uint64), b[~missing].view(np.uint64)))


def derived_terms(matrix: Any, data: pd.DataFrame, context: Mapping[str, Any]) -> dict[int, Callable]:
    """
    Recipes for the columns of formulaic's model matrix ``matrix`` (built on the first rows of ``data``, its spec
    replaying exactly on the later ones) that :mod:`dpivreg.data.derived_columns` can compute per block.

    Returns
    -------
    dict of int to callable
        ``{position of the column in matrix: recipe}`` for the columns of the terms with a recipe that gives
        ``matrix``'s values on its rows bit for bit; other columns are absent.
    """
    spec = matrix.model_spec
    position = _positions(matrix)
    first = pd.DataFrame(matrix)
    recipes: dict[int, Callable] = {}
    for structure in spec.structure:
        if not structure.term.factors or any(_literal(factor) for factor in structure.term.factors):
            continue  # the intercept: held as one value broadcast over the rows
        names = [name for factor in structure.term.factors for name in _read_columns(factor.expr, data)]
        found = _term_recipes(structure, names, spec, data, context)
        columns = [position[column] for column in structure.columns]
        if found is None or len(found) != len(columns):
            continue
        if all(_reproduces(recipe, first.iloc[:, j].to_numpy(dtype=np.float64)) for recipe, j in zip(found, columns)):
            recipes.update(zip(columns, found))
    return recipes


def _reproduces(recipe: Callable, built: np.ndarray) -> bool:
    """Whether ``recipe`` gives formulaic's values ``built`` of the first rows bit for bit (False if it fails)."""
    try:
        return same_values(recipe(slice(0, built.shape[0])), built)
    except Exception:  # noqa: BLE001 - a recipe that fails is no recipe: formulaic builds the term
        return False


def intercept_columns(matrix: Any) -> list[int]:
    """Positions in formulaic's model matrix ``matrix`` of the columns of literal terms (``1``: the intercept), ones
    on every row."""
    position = _positions(matrix)
    return [position[column] for structure in matrix.model_spec.structure
            if structure.term.factors and all(_literal(factor) for factor in structure.term.factors)
            for column in structure.columns]


def _positions(matrix: Any) -> dict[str, int]:
    """Each column's position in a model matrix, by name."""
    return {name: j for j, name in enumerate(matrix.columns)}


def _literal(factor: Any) -> bool:
    return getattr(factor.eval_method, "value", factor.eval_method) == "literal"


def _read_columns(expression: str, data: pd.DataFrame) -> list[str]:
    """The data's columns that a factor's expression reads."""
    return sorted(name for name in expression_names(expression) if name in data.columns)


def _term_recipes(structure: Any, names: list[str], spec: Any, data: pd.DataFrame,
                  context: Mapping[str, Any]) -> list[Callable] | None:
    """The recipes of one term's columns, or None when the term has none (:func:`derived_terms`)."""
    unique = sorted(set(names))
    if any(int(np.count_nonzero(data.columns == name)) != 1 for name in unique):
        return None
    if len(unique) == 1 and isinstance(data[unique[0]].dtype, pd.CategoricalDtype):
        return _category_recipes(structure, unique[0], spec, data, context)
    factors = structure.term.factors
    if (len(factors) != 1 or len(structure.columns) != 1 or not unique or not _numerical(spec, factors[0])
            or any(not _plain_number(data[name].dtype) for name in unique)):
        return None
    expression = factors[0].expr
    if "`" in expression or "Q(" in expression:
        return None
    try:
        return [ExpressionRecipe(expression, data[unique], context)]
    except (SyntaxError, NameError):
        return None


def _numerical(spec: Any, factor: Any) -> bool:
    """Whether formulaic encoded ``factor`` as a number (``C(d)`` of a numeric column is a category: its
    levels are checked on every block, so it is not computed by an expression)."""
    kind = spec.encoder_state.get(factor.expr, (None,))[0]
    return getattr(kind, "value", kind) == "numerical"


def _plain_number(dtype: Any) -> bool:
    return isinstance(dtype, np.dtype) and dtype.kind in "fiu"


def _category_recipes(structure: Any, name: str, spec: Any, data: pd.DataFrame,
                      context: Mapping[str, Any]) -> list[Callable] | None:
    """Formulaic's coding of every category of ``data[name]`` (rows of one category each, the other columns of the
    data at their first row's values), and of a missing category, as one table per column of the term; None when
    a category lies outside the term's declared levels (the build then checks the rows it meets)."""
    dtype = data[name].dtype
    k = len(dtype.categories)
    table = np.empty((k + 1, len(structure.columns)))
    for codes, rows in ((np.arange(k), slice(0, k)), (np.array([-1]), slice(k, k + 1))):
        sample = data.iloc[np.zeros(codes.size, dtype=np.intp)].copy()
        sample[name] = pd.Categorical.from_codes(codes, dtype=dtype)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                built = spec.get_model_matrix(sample, context=context)
            except Exception:  # noqa: BLE001 - no recipe: the term is built by formulaic
                return None
        if codes[0] >= 0 and any("outside of the nominated levels" in str(record.message) for record in caught):
            return None
        table[rows] = pd.DataFrame(built)[list(structure.columns)].to_numpy(dtype=np.float64)
    sources = data[[name]]
    return [CategoryRecipe(table[:, j], sources) for j in range(table.shape[1])]
