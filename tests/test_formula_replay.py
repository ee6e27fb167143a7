"""A formula built a block of rows at a time: which formulas replay exactly (dpivreg.data.formula_replay), the in-memory
design's block-by-block build and compact columns (dpivreg.data.design), and the Dask design's refusal of expressions
that read other rows."""

from __future__ import annotations

import statistics
import tracemalloc
import types
import warnings

import numpy as np
import pandas as pd
import pytest
from formulaic import Formula
from linearmodels.iv import IV2SLS

import dpivreg.data.builders as design_module
from dpivreg import DPIV2SLS
from dpivreg.data.columns import _CompactColumns
from dpivreg.data.design import design_from_formula
from dpivreg.data.formula_replay import replay_problems
from dpivreg.errors import EncodedMissingWarning

LEVELS = ["a", "b", "c", "d"]


def _frame(n: int = 1000, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    z, w = rng.uniform(-1, 1, (2, n))
    x = 0.5 * z + 0.3 * w + rng.standard_normal(n)
    return pd.DataFrame({"y": 1 + 2 * x + w + rng.standard_normal(n), "x": x, "z": z, "w": w,
                         "s": rng.uniform(1, 10, n), "k": rng.integers(0, 4, n),
                         "g": pd.Categorical.from_codes(rng.integers(0, 4, n), categories=LEVELS),
                         "t": rng.choice(LEVELS, n), "w 2": w + 1})


#: An array of the namespace, as long as _frame()'s rows (formulas read it by name).
WEIGHTS = np.linspace(1.0, 2.0, 1000)


def _halve(values):
    return values / 2


# expression (right-hand side) -> the kinds of problem replay_problems reports
CLASSIFIED = {
    "np.log(s) + I(w ** 2) + C(g)": [],
    "log(s) + exp(w)": [],  # formulaic's own ufuncs, found without the namespace
    "C(g):w + w:z": [],
    "np.where(w > 0, w, 0) + np.round(w, 2) + np.clip(w, 0, 1)": [],
    "C(g, levels=['a', 'b', 'c', 'd'])": [],
    "I(w * scale)": [],  # a scalar of the namespace
    "I(w - w.mean())": ["other rows"],
    "np.mean(w) + w": ["other rows"],
    "w.shift(1)": ["other rows"],
    "lag(w)": ["other rows"],
    "I(w[::-1])": ["other rows"],
    "center(w)": ["stateful", "other rows"],
    "C(t)": ["levels"],  # text: formulaic reads the levels from the rows it sees
    "C(k)": ["levels"],
    "_halve(w)": ["unknown function"],
    "w + weights": ["namespace array"],
    "I(w * weights)": ["namespace array"],
    "I(w * config.weights)": ["namespace array"],  # an array reached through a module
    # found by review: generalised ufuncs and ufuncs' methods work on whole columns, as do the standard library's
    "I(w * np.matmul(w, w))": ["other rows"],  # np.vecdot (NumPy 2) too
    "I(w - np.dot(w, w))": ["other rows"],
    "I(w - np.add.reduce(w))": ["other rows"],
    "np.maximum.accumulate(w)": ["other rows"],
    "I(w - sum(w))": ["other rows"],
    "I(w - statistics.fmean(w))": ["other rows"],
    "abs(w) + round(w, 2)": [],
    "`w 2` + np.log(`w 2` + 1)": [],  # a quoted column, looked up and in an expression
    "C(g == 'a')": ["levels"],  # the levels of an expression's values are read from the rows seen
    "C(t, levels=['a', 'b', 'c', 'd']) + C(g, levels=['a', 'b', 'c', 'd'])": [],
    # found by a second review: operators on whole columns; C()'s declarations are values, not row data
    "I(w / (w @ w))": ["other rows"],
    "I(w * (5 in w))": ["other rows"],
    "C(g, Treatment('b')) + C(g, contr.sum) + C(g, levels=config.levels)": [],
    "C(t, levels=list(t.unique()))": ["other rows"],  # levels computed from a column: from the rows seen
    "Q('w 2')": [],  # stateful to formulaic, but it learns nothing
}


@pytest.mark.parametrize("rhs", list(CLASSIFIED))
def test_replay_problems_classify_expressions(rhs: str) -> None:
    data = _frame(200)
    config = types.ModuleType("config")
    config.weights = np.ones(200)
    config.levels = LEVELS
    context = {"np": np, "_halve": _halve, "scale": 3.0, "weights": np.ones(200), "statistics": statistics,
               "config": config}
    spec = Formula(rhs).get_model_matrix(data, context=context).model_spec
    assert [problem.kind for problem in replay_problems(spec, data, context)] == CLASSIFIED[rhs]


# formulas that replay (built block by block) and formulas that do not (built from all rows at once)
FORMULAS = [
    "y ~ 1 + np.log(s) + I(w ** 2) + C(g) + [x ~ z]",
    "y ~ 1 + C(g):w + np.exp(w) + [x ~ z + I(z > 0)]",
    "y ~ 1 + I(w - w.mean()) + [x ~ z]",
    "y ~ 1 + C(t) + k + [x ~ z]",
    "y ~ 1 + _halve(w) + [x ~ z]",
    "y ~ 1 + I(w * np.matmul(w, w) / 1000) + [x ~ z]",  # a sum of all rows: built from all rows at once
    "y ~ 1 + I(w * WEIGHTS) + [x ~ z]",  # an array of the namespace: all rows at once (its first rows fail alone)
    "y ~ 1 + `w 2` + [x ~ z]",
]


@pytest.mark.parametrize("formula", FORMULAS)
@pytest.mark.parametrize("block_rows", [64, 999, 1 << 17])
def test_design_built_by_blocks_equals_linearmodels(formula: str, block_rows: int, monkeypatch) -> None:
    """Blocks of 64 rows (16 blocks, the last one shorter), 999 (a block of 1 row at the end), one block: the same
    columns, values and rows as linearmodels, also with missing values (a category, a number) in later blocks."""
    monkeypatch.setattr(design_module, "FORMULA_BLOCK_ROWS", block_rows)
    data = _frame()
    data.loc[[700, 999], "g"] = np.nan
    data.loc[[650], "s"] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = design_from_formula(formula, data)
        theirs = IV2SLS.from_formula(formula, data)
    for block in ("dependent", "exog", "endog", "instruments"):
        expected = getattr(theirs, block).pandas
        pd.testing.assert_frame_equal(getattr(ours, block).astype(np.float64), expected.astype(np.float64))


def test_levels_of_an_expression_are_read_from_all_rows(monkeypatch) -> None:
    """C(g == 'a') takes its levels from the values it sees: the first block (g only 'a') alone would make it one
    level, and the later blocks' False outside the levels (found by review)."""
    monkeypatch.setattr(design_module, "FORMULA_BLOCK_ROWS", 64)
    data = _frame()
    data["g"] = pd.Categorical(np.where(np.arange(1000) < 100, "a", data["g"].astype(str)), categories=LEVELS)
    formula = "y ~ 1 + C(g == 'a') + [x ~ z]"
    ours, theirs = design_from_formula(formula, data), IV2SLS.from_formula(formula, data)
    pd.testing.assert_frame_equal(ours.exog.astype(np.float64), theirs.exog.pandas.astype(np.float64))


def test_a_stateful_transform_is_not_built_from_the_first_rows_alone(monkeypatch) -> None:
    """scale(w) with w = 0 in the first block: built on its own, that block divides by a zero standard deviation and
    warns; the formula is built from all rows at once without a warning, as linearmodels builds it."""
    monkeypatch.setattr(design_module, "FORMULA_BLOCK_ROWS", 64)
    data = _frame()
    data.loc[:63, "w"] = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = design_from_formula("y ~ 1 + scale(w) + [x ~ z]", data)
    theirs = IV2SLS.from_formula("y ~ 1 + scale(w) + [x ~ z]", data)
    pd.testing.assert_frame_equal(ours.exog.astype(np.float64), theirs.exog.pandas.astype(np.float64))


def test_values_outside_declared_levels_in_a_later_block_are_refused(monkeypatch) -> None:
    monkeypatch.setattr(design_module, "FORMULA_BLOCK_ROWS", 100)
    data = _frame()
    with pytest.raises(ValueError, match=r"outside the declared levels"):
        design_from_formula("y ~ 1 + C(g, levels=['a', 'b', 'c']) + [x ~ z]", data.sort_values("g"))


def test_compact_columns_hold_every_value_exactly() -> None:
    first = np.array([[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 1.0]])
    columns = _CompactColumns(6, first)
    assert [a.dtype for a in columns.arrays] == [np.uint8] * 4
    columns.write(2, np.array([[1.0, 1.0, 2.5, 0.0], [0.0, 1.0, 0.0, 1.0]]))
    columns.write(4, np.array([[1.0, 1.0, 1.0, np.nan], [1.0, 1.0, 1.0, -0.0]]))
    frame = columns.frame(pd.RangeIndex(6), ["dummy", "ones", "widened", "late"])
    assert frame.dtypes.to_dict() == {"dummy": np.uint8, "ones": np.float64, "widened": np.float64, "late": np.float64}
    assert frame["ones"].to_numpy().strides == (0,)  # one value broadcast over the rows
    np.testing.assert_array_equal(frame["widened"], [1, 0, 2.5, 0, 1, 1])
    late = frame["late"].to_numpy()
    np.testing.assert_array_equal(late, [0, 1, 0, 1, np.nan, 0])
    assert np.signbit(late[5]) and not np.signbit(late[0])  # −0.0 stays −0.0: it is not held as uint8


def _build_peak(formula: str, data: pd.DataFrame):
    """The design, and the most memory its build held at once (tracemalloc, which sees NumPy's buffers)."""
    design_from_formula(formula, data.iloc[:500])  # imports and formulaic's caches outside the measurement
    tracemalloc.start()
    try:
        design = design_from_formula(formula, data)
        return design, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_design_from_a_large_frame_holds_formulaic_frames_of_one_block_at_a_time(monkeypatch) -> None:
    """8.4 blocks of rows, the terms held (no recipe, as without copy-on-write or for an interaction): the build's
    peak memory is the design's new columns (log(s) and w² as float64, the dummies as uint8) plus a few of
    formulaic's frames of one block: a third of the peak of building from all rows at once (51.6 MB against
    152 MB, measured). With the terms derived (the default) the design holds none of them: 33 MB, mostly formulaic's
    frames of the first block (the peak's growth with the rows: test_derived_columns)."""
    data = _frame(int(8.4 * design_module.FORMULA_BLOCK_ROWS))
    formula = "y ~ 1 + np.log(s) + I(w ** 2) + C(g) + [x ~ z]"
    derived, derived_peak = _build_peak(formula, data)
    monkeypatch.setattr(design_module, "derived_terms", lambda *args: {})
    design, by_blocks = _build_peak(formula, data)
    monkeypatch.setattr(design_module, "FORMULA_BLOCK_ROWS", data.shape[0])
    _, at_once = _build_peak(formula, data)
    assert design._stored("exog").dtypes.to_dict() == {
        "Intercept": np.float64, "np.log(s)": np.float64, "I(w ** 2)": np.float64,
        **{f"C(g)[T.{level}]": np.uint8 for level in LEVELS[1:]}}
    assert set(design.exog.dtypes) == {np.dtype(np.float64)}  # as users read the block
    assert by_blocks < 0.5 * at_once
    assert sorted(derived.derived) == [("exog", j) for j in range(1, 6)]
    assert derived_peak < 0.7 * by_blocks
    for block in ("dependent", "exog", "endog", "instruments"):
        pd.testing.assert_frame_equal(getattr(derived, block), getattr(design, block))


@pytest.mark.parametrize("expression", ["I(w - np.add.reduce(w) / 1000)", "np.maximum.accumulate(w)",
                                        "I(w - statistics.fmean(w))", "I(w * np.matmul(w, w))", "I(w - sum(w))",
                                        "I(w / (w @ w))", "I(w * (5 in w))"])
@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
def test_dask_refuses_whole_column_functions(expression: str, engine: str) -> None:
    """Found by review: each of these was applied per partition, silently (another design than pandas')."""
    dd = pytest.importorskip("dask.dataframe")
    ddf = dd.from_pandas(_frame(), npartitions=3)
    with pytest.raises(ValueError, match=r"cannot be computed partition by partition: it (calls|uses the operator)"):
        DPIV2SLS.from_formula(f"y ~ 1 + {expression} + [x ~ z]", ddf, formula_engine=engine)


def test_dask_reads_quoted_columns_and_refuses_levels_of_an_expression() -> None:
    dd = pytest.importorskip("dask.dataframe")
    ddf = dd.from_pandas(_frame(), npartitions=3)
    config = types.ModuleType("config")
    config.weights = WEIGHTS
    with pytest.raises(ValueError, match=r"reads 'config.weights' from your namespace, a ndarray of 1000 values"):
        DPIV2SLS.from_formula("y ~ 1 + I(w * config.weights) + [x ~ z]", ddf)
    assert DPIV2SLS.from_formula("y ~ 1 + `w 2` + [x ~ z]", ddf).design.exog_names == ["Intercept", "w 2"]
    with pytest.raises(ValueError, match=r"every partition must see the same levels\. Declare the levels"):
        DPIV2SLS.from_formula("y ~ 1 + C(g == 'a') + [x ~ z]", ddf)


def test_dask_takes_declared_levels_and_contrasts_and_ships_only_the_names_read() -> None:
    """Found by a second review: C()'s levels and contrasts were refused as arrays or functions reading other rows,
    Q() as a stateful transform; a quoted column made the design ship the caller's whole namespace."""
    dd = pytest.importorskip("dask.dataframe")
    from dpivreg.data.dask_builders import _formulaic_builder
    from dpivreg.data.formula import _split_formula

    data = _frame()
    ddf = dd.from_pandas(data, npartitions=3)
    levels, factor = LEVELS, 2.0
    for formula in ["y ~ 1 + C(g, levels=levels) + [x ~ z]", "y ~ 1 + C(g, Treatment('b')) + [x ~ z]",
                    "y ~ 1 + C(g, contr.sum) + Q('w 2') + [x ~ z]", "y ~ 1 + I(`w 2` * factor) + [x ~ z]"]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lazy = DPIV2SLS.from_formula(formula, ddf).design
            eager = design_from_formula(formula, data)
        assert lazy.exog_names == eager.exog_names
        np.testing.assert_array_equal(lazy.values.compute(scheduler="synchronous"),
                                      np.column_stack([eager.dependent, eager.exog, eager.endog, eager.instruments]))
    namespace = {"factor": 2.0, "big": np.ones(50_000), "np": np}  # big: not in the formula, never shipped
    builder = _formulaic_builder(data.head(50), _split_formula("y ~ 1 + I(`w 2` * factor) + [x ~ z]"), namespace)
    assert set(builder.context) == {"factor"}


@pytest.mark.parametrize("where", ["first", "later"])
def test_dask_refuses_values_outside_the_declared_levels_as_pandas_does(where) -> None:
    """Found by review: a partition's category outside C(g, levels=...) was coded as the reference level, silently,
    where the pandas design raises (formulaic warns per partition; the warning was not read)."""
    dd = pytest.importorskip("dask.dataframe")
    data = _frame()
    rows = data.index[:10] if where == "first" else data.index[-10:]
    data.loc[rows, "g"] = "d"
    data.loc[data.index[~data.index.isin(rows)], "g"] = data["g"].where(data["g"] != "d", "a")
    formula = "y ~ 1 + C(g, levels=['a', 'b', 'c']) + [x ~ z]"
    with pytest.raises(ValueError, match=r"has values \{'d'\} outside the declared levels") as eager:
        design_from_formula(formula, data)
    with pytest.raises(ValueError, match=r"has values \{'d'\} outside the declared levels") as lazy:
        DPIV2SLS.from_formula(formula, dd.from_pandas(data, npartitions=3))
    assert str(lazy.value) == str(eager.value)


def test_dask_reads_a_text_column_as_a_category_with_declared_levels() -> None:
    """C(t, levels=[...]) codes a text column the same in every partition (a value outside the levels raises, as in
    pandas), so the Dask design takes it; bare t or C(t) would read the levels from each partition and is refused.
    A missing text value (<NA> in Dask's string columns) is coded as the reference level in both, with the same
    warning."""
    dd = pytest.importorskip("dask.dataframe")
    data = _frame()
    data.loc[data.index[[7, 900]], "t"] = None
    ddf = dd.from_pandas(data, npartitions=3)
    for formula in ["y ~ 1 + C(t, levels=['c', 'a', 'b', 'd']) + [x ~ z]",
                    "y ~ 0 + w + [x ~ C(t, levels=['a', 'b', 'c', 'd'])]"]:
        with pytest.warns(EncodedMissingWarning):
            lazy = DPIV2SLS.from_formula(formula, ddf).design
        with pytest.warns(EncodedMissingWarning):
            eager = design_from_formula(formula, data)
        assert lazy.exog_names == eager.exog_names and lazy.instrument_names == eager.instrument_names
        np.testing.assert_array_equal(lazy.values.compute(scheduler="synchronous"),
                                      np.column_stack([eager.dependent, eager.exog, eager.endog, eager.instruments]))
    for formula in ["y ~ 1 + t + [x ~ z]", "y ~ 1 + C(t) + [x ~ z]", "y ~ 1 + C(t, levels=['a', 'b', 'c', 'd']) + t:w + "
                    "[x ~ z]"]:
        with pytest.raises(ValueError, match=r"column 't' has dtype .*as_known\(\)"):
            DPIV2SLS.from_formula(formula, ddf)
    with pytest.raises(ValueError, match=r"has values \{'d'\} outside the declared levels"):
        DPIV2SLS.from_formula("y ~ 1 + C(t, levels=['a', 'b', 'c']) + [x ~ z]", ddf)


def test_dask_checks_the_levels_from_the_values_not_from_warnings() -> None:
    """Found by review: the check read formulaic's warning in each partition's thread, which the process's
    warnings filters decide (an "ignore" filter, or another thread's catch_warnings, let the value through)."""
    dd = pytest.importorskip("dask.dataframe")
    data = _frame()
    data.loc[data.index[-3], "g"] = "d"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"has values \{'d'\} outside the declared levels"):
            DPIV2SLS.from_formula("y ~ 1 + C(g, levels=['a', 'b', 'c']) + [x ~ z]", dd.from_pandas(data, npartitions=4))


def test_dask_declared_levels_edge_cases_match_pandas() -> None:
    """Found by review: levels=L with L = None counted as declared (Dask then checked the data against the synthetic
    sample's levels); a float column's NaN was reported as a value outside the levels; pandas' deprecation of
    categories outside the levels leaked from every partition; a computed category could not be checked."""
    dd = pytest.importorskip("dask.dataframe")
    data = _frame().assign(d=lambda f: f["k"].astype(float))
    data.loc[data.index[5], "d"] = np.nan
    data["g"] = data["g"].cat.add_categories(["e"])  # categories beyond the declared levels, none used
    ddf = dd.from_pandas(data, npartitions=3)
    for formula in ["y ~ 1 + C(d, levels=[0, 1, 2, 3]) + [x ~ z]", "y ~ 1 + C(g, levels=['d', 'c', 'b', 'a']) + [x ~ z]"]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lazy = DPIV2SLS.from_formula(formula, ddf).design
            values = lazy.values.compute(scheduler="synchronous")
        with warnings.catch_warnings(record=True) as eager_caught:
            warnings.simplefilter("always")
            eager = design_from_formula(formula, data)
        np.testing.assert_array_equal(values, np.column_stack([eager.dependent, eager.exog, eager.endog,
                                                               eager.instruments]))
        assert {w.category for w in caught} == {w.category for w in eager_caught}
    L = None  # noqa: N806, F841 - read by the formula from this namespace
    with pytest.raises(ValueError, match=r"column 't' has dtype .*as_known"):
        DPIV2SLS.from_formula("y ~ 1 + C(t, levels=L) + [x ~ z]", ddf)
    with pytest.raises(ValueError, match=r"a category must be a column, as itself or C\(column, \.\.\.\)"):
        DPIV2SLS.from_formula("y ~ 1 + C(g == 'a', levels=[False, True]) + [x ~ z]", ddf)


def test_dask_refuses_an_expression_that_reads_other_rows() -> None:
    dd = pytest.importorskip("dask.dataframe")
    ddf = dd.from_pandas(_frame(), npartitions=3)
    for engine in ("formulaic", "patsy"):
        with pytest.raises(ValueError, match=r"'I\(w - w.mean\(\)\)' in the exog block cannot be computed partition by "
                                             r"partition: it calls w.mean"):
            DPIV2SLS.from_formula("y ~ 1 + I(w - w.mean()) + [x ~ z]", ddf, formula_engine=engine)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = DPIV2SLS.from_formula("y ~ 1 + _halve(w) + np.log(s) + [x ~ z]", ddf)  # trusted: documented
    assert model.design.exog_names == ["Intercept", "_halve(w)", "np.log(s)"]
