"""Derived design columns (dpivreg.data.derived_columns): a replaying formula's transformed terms computed per block of
rows instead of held. The reference is the same design with every term held (``derived_terms`` patched to offer no
recipe: the build before derived columns existed), which the parity tests compare with formulaic and linearmodels;
blocks of 97 rows make a 1,000-row frame take the block-by-block path of a large one."""

from __future__ import annotations

import pickle
import tracemalloc
import warnings

import numpy as np
import pandas as pd
import pytest
from findings import expect_finding
from test_formula_replay import LEVELS, _frame  # the replay tests' frame: numeric, integer, categorical columns

import dpivreg.data.builders as design_module
from dpivreg import DPIV2SLS
from dpivreg.data.derived_columns import DerivedColumn, same_values
from dpivreg.data.design import design_from_formula
from dpivreg.errors import EncodedMissingWarning

BLOCKS = ("dependent", "exog", "endog", "instruments")


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(design_module, "FORMULA_BLOCK_ROWS", 97)


def _held(formula: str, data: pd.DataFrame, monkeypatch, **kwargs):
    """The design with every term held (no recipe offered)."""
    with monkeypatch.context() as patch:
        patch.setattr(design_module, "derived_terms", lambda *args: {})
        return design_from_formula(formula, data, **kwargs)


def _assert_same_design(derived, held) -> None:
    for block in BLOCKS:
        pd.testing.assert_frame_equal(getattr(derived, block), getattr(held, block), check_exact=True)
    rows = slice(0, derived.nobs)
    assert same_values(derived.row_block(rows).ravel(), held.row_block(rows).ravel())
    assert np.array_equal(derived.column_checksum, held.column_checksum)
    assert (derived.n_dropped, derived.n_lost) == (held.n_dropped, held.n_lost)


# formula, the derived columns (block, position)
DERIVED = [
    ("y ~ 1 + np.log(s) + I(w ** 2) + C(g) + [x ~ z]", [("exog", j) for j in range(1, 6)]),
    # z too: a plain column in a block formulaic builds is read from the data, not copied
    ("np.log(s) ~ 1 + w + [x ~ z + I(z ** 3)]", [("dependent", 0), ("instruments", 0), ("instruments", 1)]),
    ("y ~ w + [x ~ C(g)]", [("instruments", j) for j in range(4)]),
    ("y ~ 1 + g + np.where(w > 0, w, 0) + abs(w) + [x ~ z]", [("exog", j) for j in range(1, 6)]),
    ("y ~ 1 + C(g, levels=['d', 'c', 'b', 'a']) + [x ~ z]", [("exog", j) for j in range(1, 4)]),
    ("y ~ 1 + C(g, Treatment('c')) + [x ~ z]", [("exog", j) for j in range(1, 4)]),
    ("y ~ 1 + np.log(k + 1) + I(k * w) + [I(x * 2) ~ z]", [("endog", 0), ("exog", 1), ("exog", 2)]),
    ("y ~ 1 + log(s) + exp(w) + [x ~ z]", [("exog", 1), ("exog", 2)]),  # formulaic's own transforms
]


@pytest.mark.parametrize("formula, expected", DERIVED)
def test_a_derived_design_equals_the_held_one(small_blocks, monkeypatch, formula, expected):
    data = _frame()
    derived = design_from_formula(formula, data)
    assert sorted(derived.derived) == expected
    for block, j in expected:  # a placeholder, no memory
        assert derived._stored(block).iloc[:, j].to_numpy().strides == (0,)
    _assert_same_design(derived, _held(formula, data, monkeypatch))


@pytest.mark.parametrize("formula", [
    "y ~ 1 + C(g):w + [x ~ z]",  # two columns read
    "y ~ 1 + w:s + [x ~ z]",  # two factors
    "y ~ 1 + I(`w 2` ** 2) + [x ~ z]",  # a quoted name
    "y ~ 1 + Q('w 2') + [x ~ z]",
    "y ~ 1 + center(w) + [x ~ z]",  # stateful: no replay at all
])
def test_terms_without_a_recipe_are_held(small_blocks, monkeypatch, formula):
    data = _frame()
    derived = design_from_formula(formula, data)
    assert not derived.derived
    _assert_same_design(derived, _held(formula, data, monkeypatch))


def test_dropped_rows_and_a_missing_category_read_as_when_held(small_blocks, monkeypatch):
    """NaN in a derived column's source drops the row (also in a later block); a missing category is coded as the
    reference level, with the same warning."""
    data = _frame()
    data.loc[[5, 400, 901], "s"] = np.nan
    data.loc[[7, 650], "s"] = -1.0  # log of a negative value: missing, lost by the formula
    data.loc[[3, 777], "g"] = np.nan
    formula = "y ~ 1 + np.log(s) + C(g) + [x ~ z]"
    with pytest.warns(EncodedMissingWarning):
        derived = design_from_formula(formula, data)
    with pytest.warns(EncodedMissingWarning):
        held = _held(formula, data, monkeypatch)
    assert derived.derived and derived.n_dropped == 5 and derived.n_lost == 2
    _assert_same_design(derived, held)
    rows = np.array([0, 3, 700, derived.nobs - 1])
    assert same_values(derived.reordered(rows).row_block(slice(None)).ravel(),
                       held.reordered(rows).row_block(slice(None)).ravel())


def test_errors_on_derived_columns_are_the_held_ones(small_blocks, monkeypatch):
    data = _frame()
    data.loc[600, "s"] = 0.0
    formula = "y ~ 1 + np.log(s) + [x ~ z]"
    with pytest.raises(ValueError, match=r"exog column\(s\) \['np.log\(s\)'\] contain infinite values") as derived:
        design_from_formula(formula, data)
    with pytest.raises(ValueError) as held:
        _held(formula, data, monkeypatch)
    assert str(derived.value) == str(held.value)


@pytest.mark.parametrize("formula, finding", [
    ("y ~ 1 + w + [x ~ I(z * 0) + z]", r"constant"),
    ("y ~ 1 + w + [x ~ z + I(z ** 1)]", r"same values"),
    ("y ~ 1 + I(w * 1) + [x ~ I(w + 0)]", r"same values"),
])
def test_findings_on_derived_columns_are_the_held_ones(small_blocks, monkeypatch, formula, finding):
    data = _frame()
    derived = expect_finding(design_from_formula, finding, formula, data)
    held = expect_finding(_held, finding, formula, data, monkeypatch)
    assert derived.derived and derived.data_findings == held.data_findings


def test_a_level_outside_the_declared_ones_in_a_later_block_still_raises(small_blocks):
    data = _frame()
    data["g"] = data["g"].cat.add_categories(["e"])
    data.loc[800, "g"] = "e"
    with pytest.raises(ValueError, match=r"outside the declared levels"):
        design_from_formula("y ~ 1 + C(g, levels=['a', 'b', 'c', 'd']) + [x ~ z]", data)


def test_the_callers_later_writes_do_not_reach_a_derived_design(small_blocks):
    data = _frame()
    design = design_from_formula("y ~ 1 + np.log(s) + C(g) + [x ~ z]", data)
    before = design.exog.copy()
    data.loc[10:900, "s"] = 5.0
    data.loc[10:900, "g"] = "d"
    data["s"] = data["s"] * 2
    pd.testing.assert_frame_equal(design.exog, before, check_exact=True)


def test_a_pickled_design_holds_its_derived_columns(small_blocks):
    design = design_from_formula("y ~ 1 + np.log(s) + C(g) + [x ~ z]", _frame())
    restored = pickle.loads(pickle.dumps(design))
    assert restored.derived is None
    for block in BLOCKS:
        pd.testing.assert_frame_equal(getattr(restored, block), getattr(design, block), check_exact=True)
    assert np.array_equal(restored.row_block(slice(0, 300)), design.row_block(slice(0, 300)))


def test_fits_on_a_derived_design_are_those_of_the_held_one(small_blocks, monkeypatch):
    """Same seed, same released values, also with privacy units (rows read through design.reordered)."""
    data = _frame()
    data["hh"] = np.arange(data.shape[0]) // 3
    formula = "y ~ 1 + np.log(s) + I(w ** 2) + C(g) + [x ~ z]"
    bounds = {"y": (-8.0, 8.0), "x": (-4.0, 4.0), "z": (-1.0, 1.0), "np.log(s)": (0.0, 2.31), "I(w ** 2)": (0.0, 1.0),
              **{f"C(g)[T.{level}]": (0.0, 1.0) for level in LEVELS[1:]}}
    with monkeypatch.context() as patch:
        patch.setattr(design_module, "derived_terms", lambda *args: {})
        held = DPIV2SLS.from_formula(formula, data)
    models = [DPIV2SLS.from_formula(formula, data), held]
    assert models[0].design.derived and not models[1].design.derived
    for options in ({}, {"privacy_unit": "hh", "max_rows_per_unit": 3}):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fits = [model.fit(rho1=1.0, rho2=1.0, bounds=bounds, seed=4, **options) for model in models]
        pd.testing.assert_series_equal(fits[0].params, fits[1].params, check_exact=True)
        pd.testing.assert_series_equal(fits[0].std_errors, fits[1].std_errors, check_exact=True)


def test_a_derived_design_grows_by_no_column_with_the_rows():
    """The build's peak memory grows with the rows by the checks' masks (bytes a row), not by the derived columns
    (8 bytes a row each for log(s) and w², 1 for each of C(g)'s 3 indicators): 3.9 bytes a row measured from 8.4 to
    25.2 blocks of 131,072 rows, 22 with the terms held. (The peak's fixed part, about 30 MB, is formulaic's frames
    of the first block and varies by a few MB between runs: the wide range of rows keeps the slope's noise small.)"""
    formula = "y ~ 1 + np.log(s) + I(w ** 2) + C(g) + [x ~ z]"
    design_from_formula(formula, _frame(500))  # imports and formulaic's caches outside the measurement
    peaks = []
    sizes = [int(8.4 * design_module.FORMULA_BLOCK_ROWS), int(25.2 * design_module.FORMULA_BLOCK_ROWS)]
    for n in sizes:
        data = _frame(n)
        tracemalloc.start()
        try:
            design = design_from_formula(formula, data)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert len(design.derived) == 5
    assert (peaks[1] - peaks[0]) / (sizes[1] - sizes[0]) < 8.0


def test_a_derived_column_reads_rows_by_slice_and_position():
    values = np.linspace(1, 2, 50)
    column = DerivedColumn(lambda rows: np.log(values[rows]), 50)
    assert np.array_equal(column[5:9], np.log(values[5:9]))
    assert np.array_equal(column[np.array([3, 1])], np.log(values[[3, 1]]))
    kept = column.taken(np.array([0, 10, 20]))
    assert len(kept) == 3 and np.array_equal(kept[1:3], np.log(values[[10, 20]]))
    assert np.array_equal(kept.taken(np.array([2])).values(), np.log(values[[20]]))
    assert np.array_equal(column.values(), np.log(values))


def _outcome(build):
    """What a build gives: its blocks (or its error) and its warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            design = build()
            result = {block: getattr(design, block) for block in BLOCKS}
        except ValueError as exc:
            result = str(exc)
    return result, [(record.category, str(record.message)) for record in caught]


def _same_outcome(formula: str, data: pd.DataFrame, monkeypatch) -> tuple:
    derived, warned = _outcome(lambda: design_from_formula(formula, data))
    held, held_warned = _outcome(lambda: _held(formula, data, monkeypatch))
    assert warned == held_warned
    if isinstance(held, str):
        assert derived == held
    else:
        for block in BLOCKS:
            pd.testing.assert_frame_equal(derived[block], held[block], check_exact=True)
    return derived, warned


def _integers(data: pd.DataFrame) -> pd.DataFrame:
    data = data.assign(a=data["k"] + 1, b=data["k"] + 1)
    data.loc[600, "b"] = 0
    return data


def _negative_later(data: pd.DataFrame) -> pd.DataFrame:
    return data.assign(s=np.where(np.arange(len(data)) == 600, -1.0, data["s"]))


# Found by review: each of these differed from the held design, the first rows (a block of 97) agreeing.
@pytest.mark.parametrize("formula, prepare", [
    ("y ~ 1 + I(a % b) + [x ~ z]", _integers),  # pandas: a % 0 is missing (NumPy: 0)
    ("y ~ 1 + I(a // b) + [x ~ z]", _integers),  # pandas: ±inf (NumPy: 0)
    ("y ~ 1 + np.mod(a, b) + [x ~ z]", _integers),
    ("y ~ 1 + np.clip(w, lo, 10) + [x ~ z]",  # pandas' clip ignores a missing bound
     lambda d: d.assign(lo=np.where(np.arange(len(d)) == 600, np.nan, -0.5))),
    ("y ~ 1 + C(d, levels=[0, 1]) + [x ~ z]",  # a category of a numeric column: its levels checked on every row
     lambda d: d.assign(d=np.where(np.arange(len(d)) == 600, 2, d["k"] > 1).astype(int))),
    ("y ~ const + np.log(s) + [x ~ z]", lambda d: d.assign(const=1.0)),  # the declared constant read, not a placeholder
    ("y ~ 1 + np.log(s) + [x ~ z]", _negative_later),
])
def test_later_rows_read_as_formulaic_reads_them(small_blocks, monkeypatch, formula, prepare):
    result, warned = _same_outcome(formula, prepare(_frame()), monkeypatch)
    if prepare is _negative_later:  # NumPy's warning of the later row, once, as formulaic's build of that block gave it
        assert [message for category, message in warned if category is RuntimeWarning] == [
            "invalid value encountered in log"]


def test_a_later_error_of_a_derived_term_names_its_block(small_blocks):
    """As formulaic's error did (formulaic's own wording, "FactorEvaluationError: Unable to evaluate factor", is not
    repeated: the build computes the later rows, not formulaic)."""
    data = _frame().assign(a=lambda d: np.where(np.arange(len(d)) == 600, -1, d["k"]))
    with pytest.raises(ValueError, match=r"could not build the exogenous regressors \(exog\) block .*I\(2 \*\* a\).*"
                                         r"Integers to negative integer powers"):
        design_from_formula("y ~ 1 + I(2 ** a) + [x ~ z]", data)


def test_a_term_reading_a_changeable_namespace_value_is_held(small_blocks, monkeypatch):
    """Found by review: a module's attribute (or a 0-d array) was read again at each pass, so a change after the
    build changed the design (and a fit blamed the data)."""
    import types

    config = types.ModuleType("config")
    config.k = 2.0
    factor = np.array(2.0)
    data = _frame()
    for formula in ("y ~ 1 + I(w * config.k) + [x ~ z]", "y ~ 1 + I(w * factor) + [x ~ z]"):
        design = design_from_formula(formula, data, context={"config": config, "factor": factor, "np": np})
        before = design.exog.copy()
        config.k, factor[()] = 3.0, 3.0
        assert not design.derived
        pd.testing.assert_frame_equal(design.exog, before, check_exact=True)
        config.k, factor[()] = 2.0, 2.0
    assert design_from_formula("y ~ 1 + I(w * 2.5) + np.exp(w) + log(s) + abs(w) + [x ~ z]", data).derived


def test_duplicated_derived_instruments_are_found_in_one_reading(small_blocks, monkeypatch):
    """Equal in the first block only, or equal throughout: the checks read each derived column once per block of
    rows, not once per pair of columns."""
    data = _frame().assign(v=lambda d: np.where(np.arange(len(d)) < 500, d["z"], d["z"] + 1))
    _same_outcome("y ~ 1 + w + [x ~ I(z * 1) + I(v * 1)]", data, monkeypatch)
    calls = []
    original = design_module.DerivedColumn.__getitem__
    monkeypatch.setattr(design_module.DerivedColumn, "__getitem__",
                        lambda self, rows: calls.append(rows) or original(self, rows))
    expect_finding(design_from_formula, r"same values", "y ~ 1 + w + [x ~ C(g) + I(z * 1) + I(z * 1.0)]", data)
    assert len(calls) < 40
