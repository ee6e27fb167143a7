"""The privacy boundary at the data frame (dpivreg.data.boundary): missing rows, category levels, data checks.

Neighbours replace one row of the caller's frame; its row count, column names and dtypes, declared levels
and bounds are public. Each test pins one route: what it publishes, whether the fit announces a leak, and
that the private alternatives announce none.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from findings import finding_text
from latex import compile_latex, require_pdflatex

from dpivreg import DPIV2SLS, InferenceUnavailableError, PrivacyLeakWarning
from dpivreg.data.boundary import design_leaks
from dpivreg.data.design import design_from_formula
from dpivreg.errors import DATA_CHECK_NOTE, DroppedRowsWarning
from dpivreg.reporting.results import _fmt

N = 600
F = "y ~ 1 + [x ~ z]"
BOUNDS = {"y": (-15.0, 15.0), "x": (-6.0, 6.0), "z": (-4.0, 4.0)}
FIT = dict(rho1=1.0, rho2=1.0, seed=0, bounds=BOUNDS)


def _frame(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    z = np.clip(rng.standard_normal(N), -3.9, 3.9)
    u = rng.standard_normal(N)
    x = np.clip(z + 0.5 * u + rng.standard_normal(N), -5.9, 5.9)
    g = rng.choice(["a", "b"], N)
    y = np.clip(1 + 2 * x + (g == "b") + u, -14.9, 14.9)
    return pd.DataFrame({"y": y, "x": x, "z": z, "g": g,
                         "gc": pd.Categorical(g, categories=["a", "b", "c"])})


@pytest.fixture
def frame() -> pd.DataFrame:
    return _frame()


@pytest.fixture
def holed(frame) -> pd.DataFrame:
    """The frame with x missing in 5 rows."""
    out = frame.copy()
    out.loc[out.index[:5], "x"] = np.nan
    return out


def _fit_leaks(model, **kwargs) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = model.fit(**{**FIT, **kwargs})
    return res, [str(w.message) for w in caught if issubclass(w.category, PrivacyLeakWarning)]


# ---------------------------------------------------------------------------------------- missing values
def test_drop_publishes_the_complete_row_count_and_says_so(holed):
    with pytest.warns(DroppedRowsWarning):
        model = DPIV2SLS.from_formula(F, holed)
    res, leaks = _fit_leaks(model)
    assert res.nobs == N - 5
    assert len(leaks) == 1 and "nobs = 595" in leaks[0] and "missing='fill'" in leaks[0]
    assert res.leaks == tuple(leaks)
    assert "No privacy leak" not in str(res.summary())
    assert not res.is_private


def test_drop_public_declares_the_count_public(holed):
    with pytest.warns(DroppedRowsWarning):
        model = DPIV2SLS.from_formula(F, holed, missing="drop-public")
    res, leaks = _fit_leaks(model)
    assert res.nobs == N - 5 and leaks == []
    assert "No privacy leak" in str(res.summary())


def test_a_frame_without_missing_values_announces_nothing(frame):
    res, leaks = _fit_leaks(DPIV2SLS.from_formula(F, frame))
    assert res.nobs == N and leaks == []


def test_fill_keeps_every_row_and_equals_filling_by_hand(holed):
    model = DPIV2SLS.from_formula(F, holed, missing="fill", fill_values={"y": 0.0, "x": 0.0, "z": 0.0})
    by_hand = design_from_formula(F, holed.fillna({"x": 0.0}), missing="drop-public")
    assert model.design.nobs == N and model.design.missing == "fill"
    for block in ("dependent", "exog", "endog", "instruments"):
        pd.testing.assert_frame_equal(getattr(model.design, block), getattr(by_hand, block))
    res, leaks = _fit_leaks(model)
    assert leaks == [] and res.nobs == N
    ref = DPIV2SLS._from_design(by_hand).fit(**FIT)
    np.testing.assert_allclose(res.params, ref.params, rtol=1e-12)


def test_fill_with_indicators_adds_a_regressor(holed):
    model = DPIV2SLS.from_formula(F, holed, missing="fill", fill_values=0.0, indicators=["x", "z"])
    d = model.design
    assert d.exog_names == ["Intercept", "missing_x", "missing_z"]
    assert d.exog["missing_x"].sum() == 5 and d.exog["missing_z"].sum() == 0
    res, leaks = _fit_leaks(model, bounds={**BOUNDS, "missing_x": (0, 1), "missing_z": (0, 1)})
    assert leaks == []
    # z is complete, so its indicator is all zero: allowed (declared), not identified in the benchmark
    assert math.isnan(res.benchmark.params["missing_z"])
    assert np.isfinite(res.benchmark.params.drop("missing_z")).all()
    assert np.isfinite(res.params).all()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"missing": "impute"}, ValueError, r"missing must be one of"),
        ({"missing": "fill"}, ValueError, r"needs public fill_values"),
        ({"missing": "fill", "fill_values": {"y": 0.0, "x": 0.0}}, ValueError, r"no public fill value for .*'z'"),
        ({"missing": "fill", "fill_values": {"y": 0, "x": 0, "z": 0, "nosuch": 1}}, ValueError, r"'nosuch'.*typo"),
        ({"missing": "fill", "fill_values": "0"}, TypeError, r"fill_values must be a number or a mapping"),
        ({"missing": "fill", "fill_values": math.nan}, ValueError, r"finite"),
        ({"missing": "drop", "fill_values": 0.0}, ValueError, r"apply to missing='fill' only"),
        ({"missing": "fill", "fill_values": 0.0, "indicators": "x"}, TypeError, r"indicators must be a list"),
        ({"missing": "fill", "fill_values": 0.0, "indicators": ["g"]}, ValueError, r"not a column that the formula"),
    ],
)
def test_bad_missing_arguments_name_the_argument(holed, kwargs, error, match):
    with pytest.raises(error, match=match):
        DPIV2SLS.from_formula(F, holed, **kwargs)


def test_a_category_is_filled_with_a_declared_level(frame):
    data = frame.assign(gc=frame["gc"].where(frame.index >= 3))
    formula = "y ~ 1 + C(gc) + [x ~ z]"
    fill = {"y": 0.0, "x": 0.0, "z": 0.0}
    with pytest.raises(ValueError, match=r"not one of its categories"):
        DPIV2SLS.from_formula(formula, data, missing="fill", fill_values={**fill, "gc": "zzz"})
    model = DPIV2SLS.from_formula(formula, data, missing="fill", fill_values={**fill, "gc": "a"})
    assert model.design.nobs == N
    assert frame["gc"].isna().sum() == 0  # the caller's frame is not modified


def test_arrays_fill_by_design_column_names(holed):
    model = DPIV2SLS(holed["y"], None, holed["x"], holed["z"], missing="fill",
                     fill_values={"y": 0.0, "x": 0.0, "z": 0.0}, indicators=["x"])
    assert model.design.nobs == N and model.design.exog_names == ["missing_x"]
    with pytest.raises(ValueError, match=r"fill_values must name every design column"):
        DPIV2SLS(holed["y"], None, holed["x"], holed["z"], missing="fill", fill_values={"x": 0.0})


def test_arrays_drop_announces_the_leak(holed):
    with pytest.warns(DroppedRowsWarning):
        model = DPIV2SLS(holed["y"], None, holed["x"], holed["z"])
    res, leaks = _fit_leaks(model)
    assert len(leaks) == 1 and "nobs = 595" in leaks[0] and res.leaks == tuple(leaks)


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
@pytest.mark.parametrize("missing", ["fill", "drop-public"])
def test_rows_the_formula_makes_missing_are_a_leak_under_every_policy(frame, missing, engine):
    data = frame.assign(w=np.where(frame.index < 4, -1.0, 1.0 + np.abs(frame["z"])))  # log(-1) is NaN
    options = {"missing": missing, "fill_values": 0.0} if missing == "fill" else {"missing": missing}
    with pytest.warns(DroppedRowsWarning):
        model = DPIV2SLS.from_formula("y ~ 1 + np.log(w) + [x ~ z]", data, formula_engine=engine, **options)
    res, leaks = _fit_leaks(model, bounds={**BOUNDS, model.design.exog_names[1]: (0.0, 2.0)})
    assert res.nobs == N - 4
    assert len(leaks) == 1 and "4 of 600 rows were dropped because the formula turned" in leaks[0]
    assert "No privacy leak" not in str(res.summary())


@pytest.mark.parametrize("lazy", [False, True])
def test_fill_makes_replace_one_neighbours_with_the_same_public_facts(frame, lazy):
    """D and D′ differ in one row (all its values missing in D′): every public fact of the design agrees."""
    other = frame.copy()
    other.loc[other.index[7], ["y", "x", "z", "gc"]] = np.nan
    fill = {"y": 0.0, "x": 0.0, "z": 0.0, "gc": "a"}
    facts = []
    for data in (frame, other):
        data = data.drop(columns="g")
        if lazy:
            data = pytest.importorskip("dask.dataframe").from_pandas(data, npartitions=2)
        d = DPIV2SLS.from_formula("y ~ 1 + C(gc) + [x ~ z]", data, missing="fill", fill_values=fill,
                                  indicators=["x"]).design
        facts.append((d.nobs, d.n_dropped, d.n_lost, d.column_names, d.zero_allowed, d.data_levels, d.missing,
                      design_leaks(d)))
    assert facts[0] == facts[1]
    assert facts[0][0] == N and facts[0][-1] == []


# ---------------------------------------------------------------------------------------- category levels
@pytest.mark.parametrize("formula", ["y ~ 1 + C(g) + [x ~ z]", "y ~ 1 + g + [x ~ z]",
                                     "y ~ 1 + C(g, levels=None) + [x ~ z]"])  # found by review: None read as declared
def test_levels_read_from_the_data_are_a_leak(frame, formula):
    model = DPIV2SLS.from_formula(formula, frame)
    name = model.design.exog_names[1]
    _, leaks = _fit_leaks(model, bounds={**BOUNDS, name: (0, 1)})
    assert len(leaks) == 1 and "were read from the data" in leaks[0]


@pytest.mark.parametrize("formula", ["y ~ 1 + C(gc) + [x ~ z]", "y ~ 1 + C(g, levels=['a', 'b', 'c']) + [x ~ z]"])
def test_declared_levels_are_public_and_an_absent_one_does_not_fail(frame, formula):
    model = DPIV2SLS.from_formula(formula, frame)
    names = model.design.exog_names[1:]
    assert len(names) == 2 and names[1].endswith("[T.c]")
    res, leaks = _fit_leaks(model, bounds={**BOUNDS, **{name: (0, 1) for name in names}})
    assert leaks == []
    assert math.isnan(res.benchmark.params[names[1]]) and np.isfinite(res.benchmark.params[names[0]])
    assert np.isfinite(res.params).all() and np.isfinite(res.std_errors).all()


def test_an_absent_declared_level_among_the_instruments_is_not_a_constant_instrument(frame):
    data = frame.assign(q=pd.Categorical(np.where(frame["z"] > 0, "hi", "lo"), categories=["lo", "hi", "none"]))
    model = DPIV2SLS.from_formula("y ~ 0 + [x ~ C(q)]", data)  # instruments: one dummy per level
    assert model.design.instrument_names == ["C(q)[lo]", "C(q)[hi]", "C(q)[none]"]
    assert model.design.zero_columns == [len(model.design.column_names) - 1]
    res = model.fit(**{**FIT, "bounds": {"y": BOUNDS["y"], "x": BOUNDS["x"], **{n: (0, 1) for n in model.design.instrument_names}}})
    assert np.isfinite(res.params).all() and np.isfinite(res.benchmark.params).all()


def test_values_outside_declared_levels_are_an_error_not_the_reference_level(frame):
    for levels in ("['a']", "('a',)"):
        with pytest.raises(ValueError, match=r"outside the declared levels") as info:
            DPIV2SLS.from_formula(f"y ~ 1 + C(g, levels={levels}) + [x ~ z]", frame)
        assert DATA_CHECK_NOTE in str(info.value)


def test_a_levels_list_is_not_read_as_the_iv_block(frame):
    design = design_from_formula("y ~ 1 + C(g, levels=['b', 'a']) + [x ~ z]", frame)
    assert design.exog_names == ["Intercept", "C(g, levels=['b', 'a'])[T.a]"]


# ---------------------------------------------------------------------------------------- data checks
DATA_CHANGES = {"z": lambda d: d["z"], "z2x": lambda d: d["z"] * 2 + 1, "3z": lambda d: 3 * d["z"],
                "zero": lambda d: np.abs(d["z"]).where(d.index > 0, 0.0)}


def _changed(frame, change):
    data = frame.copy()
    for column, how in change.items():
        data[column] = DATA_CHANGES[how](data) if how in DATA_CHANGES else how
    return data


def test_data_dependent_errors_say_they_are_not_releases(frame):
    with pytest.raises(ValueError, match=r"infinite values") as info:
        DPIV2SLS.from_formula("y ~ 1 + [x ~ np.log(zp)]", _changed(frame, {"zp": "zero"}))
    assert DATA_CHECK_NOTE in str(info.value)


@pytest.mark.parametrize(
    ("formula", "change", "match"),
    [
        ("y ~ 1 + [x ~ c]", {"c": 1.0}, r"instrument 'c' is constant"),
        ("y ~ 1 + [x ~ z + z2]", {"z2": "z"}, r"same values as instrument"),
        ("y ~ 1 + w + [x ~ z + w2]", {"w": "z2x", "w2": "z2x"}, r"same values as exog"),
        ("y ~ 1 + [x ~ z + z3]", {"z3": "3z"}, r"full column rank"),
    ],
)
def test_data_dependent_findings_say_they_are_not_releases(frame, formula, change, match):
    """One row can flip these: the model is built and warns (the warning says it is not a release)."""
    assert DATA_CHECK_NOTE in finding_text(DPIV2SLS.from_formula, match, formula, _changed(frame, change))


def test_the_endogenous_variable_is_not_its_own_instrument(frame):
    with pytest.raises(ValueError, match=r"cannot instrument itself"):
        DPIV2SLS.from_formula("y ~ 1 + [x ~ x + z]", frame)


def test_the_endogenous_variable_is_not_its_own_instrument_on_dask(frame):
    dd = pytest.importorskip("dask.dataframe")
    with pytest.raises(ValueError, match=r"cannot instrument itself"):
        DPIV2SLS.from_formula("y ~ 1 + [x ~ x + z]", dd.from_pandas(frame.drop(columns="g"), npartitions=2))


# ---------------------------------------------------------------------------------------- Dask
def test_dask_routes_match_pandas(holed):
    dd = pytest.importorskip("dask.dataframe")
    data = holed.drop(columns="g")
    lazy = dd.from_pandas(data, npartitions=3)
    fill = {"y": 0.0, "x": 0.0, "z": 0.0}
    with pytest.warns(DroppedRowsWarning):
        dropped = DPIV2SLS.from_formula(F, lazy)
    assert any("nobs = 595" in leak for leak in design_leaks(dropped.design))
    _, leaks = _fit_leaks(dropped)
    assert len(leaks) == 1 and "nobs = 595" in leaks[0]
    filled = DPIV2SLS.from_formula(F, lazy, missing="fill", fill_values=fill, indicators=["x"])
    memory = DPIV2SLS.from_formula(F, data, missing="fill", fill_values=fill, indicators=["x"])
    assert filled.design.nobs == N and filled.design.column_names == memory.design.column_names
    bounds = {**BOUNDS, "missing_x": (0, 1)}
    a, b = filled.fit(**{**FIT, "bounds": bounds}), memory.fit(**{**FIT, "bounds": bounds})
    np.testing.assert_allclose(a.params, b.params, rtol=1e-10)
    declared = DPIV2SLS.from_formula("y ~ 1 + C(gc) + [x ~ z]", lazy, missing="drop-public")
    assert declared.design.data_levels == () and declared.design.zero_columns


# ---------------------------------------------------------------------------------------- accounting
def test_the_accountant_records_the_inference_release_when_the_covariance_overflows(frame):
    big = frame.assign(y=frame["y"] * 1e160)
    bounds = {**BOUNDS, "y": (-15e160, 15e160)}
    for method, cov_type in (("auto", "robust"), ("moments", "robust"), ("auto", "unadjusted"),
                             ("preconditioned", "unadjusted")):
        res = DPIV2SLS.from_formula(F, big).fit(**{**FIT, "bounds": bounds, "method": method, "cov_type": cov_type})
        with pytest.raises(InferenceUnavailableError, match=r"not finite|overflows"):
            res.conf_int()
        assert any(r.stage == "rho_inf" for r in res.privacy.releases), (method, cov_type)
        # with robust errors the diagnostics' meats were released in the same passes: recorded, and kept
        robust = cov_type == "robust"
        assert sum(r.stage == "rho_diag" for r in res.privacy.releases) == (4 if robust else 0), (method, cov_type)
        assert res.privacy.rho == pytest.approx(2.7 if robust else 2.6, rel=1e-12), (method, cov_type)
        if robust:
            assert np.isfinite(res.effective_f.stat)


# ---------------------------------------------------------------------------------------- publishing
def test_the_publishable_summary_holds_no_non_private_number(frame):
    res = DPIV2SLS.from_formula(F, frame).fit(**{**FIT, "bounds": {**BOUNDS, "x": (-2.0, 2.0)}})  # clips some x
    assert int(res.scale.clipped_values.sum()) > 0
    full, public = res.summary(), res.summary(benchmark=False)
    assert "IV2SLS" in full.as_text() and "non-private count" in full.as_text()
    benchmark_numbers = [_fmt(v) for v in (*res.benchmark.params, *res.benchmark.std_errors)]  # as the table prints
    for text in (public.as_text(), public.as_latex(), public.as_html()):
        assert "IV2SLS" not in text and "NON-PRIVATE" not in text and "non-private count" not in text
        assert not any(number in text for number in benchmark_numbers)
        assert _fmt(res.params["x"]) in text  # the private estimate is there
    with pytest.raises(TypeError, match=r"benchmark must be True or False"):
        res.summary(benchmark="no")


# ---------------------------------------------------------------------------------------- second review
@pytest.mark.parametrize("value", [np.nan, None, pd.NA, "0", True])
def test_a_fill_value_must_be_a_value_of_the_column(holed, value):
    with pytest.raises(ValueError, match=r"fill value of numeric column 'x' must be a finite number"):
        DPIV2SLS.from_formula(F, holed, missing="fill", fill_values={"y": 0.0, "x": value, "z": 0.0})


def test_a_fill_value_that_does_not_fit_the_dtype_names_the_column(holed):
    data = holed.assign(k=pd.array([1, None] * (N // 2), dtype="Int64"))
    with pytest.raises(ValueError, match=r"does not fit column 'k' of dtype Int64"):
        DPIV2SLS.from_formula("y ~ 1 + k + [x ~ z]", data, missing="fill", fill_values={"y": 0, "x": 0, "z": 0, "k": 1.5})


def test_drop_public_still_announces_rows_the_formula_dropped_beside_missing_ones(frame):
    data = frame.assign(w=1.0 + np.abs(frame["z"]), v=frame["z"])
    data.loc[data.index[0], "v"] = np.nan  # missing, but kept (nan_to_num)
    data.loc[data.index[1], "w"] = -1.0  # present, but dropped (log of -1)
    with pytest.warns(DroppedRowsWarning):
        model = DPIV2SLS.from_formula("y ~ 1 + np.log(w) + np.nan_to_num(v) + [x ~ z]", data, missing="drop-public")
    assert model.design.n_dropped == 1 and model.design.n_lost == 1
    assert any("1 of 600 rows were dropped because the formula" in leak for leak in design_leaks(model.design))


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
def test_stateful_transforms_are_a_leak(frame, engine):
    data = frame.assign(w=frame["z"] ** 2)
    model = DPIV2SLS.from_formula("y ~ 1 + center(w) + [x ~ z]", data, formula_engine=engine)
    assert model.design.stateful == ("center(w)",)
    assert any("learned their parameters" in leak for leak in design_leaks(model.design))


@pytest.mark.parametrize(("formula", "engine"), [
    ("y ~ 1 + np.where(z > 0, 'hi', 'lo') + [x ~ z]", "patsy"),
    ("y ~ 1 + C(g, levels=sorted(g.unique())) + [x ~ z]", "formulaic"),
    ("y ~ 1 + C(nlevels) + [x ~ z]", "formulaic"),
])
def test_levels_computed_from_the_data_are_flagged(frame, formula, engine):
    data = frame.assign(nlevels=frame["g"])
    model = DPIV2SLS.from_formula(formula, data, formula_engine=engine)
    assert len(model.design.data_levels) == 1


def test_a_nullable_boolean_with_na_is_a_missing_value_on_dask(frame):
    dd = pytest.importorskip("dask.dataframe")
    data = frame.drop(columns="g").assign(b=pd.array([True, False, None] * (N // 3), dtype="boolean"))
    with pytest.warns(DroppedRowsWarning):
        model = DPIV2SLS.from_formula("y ~ 1 + b + [x ~ z]", dd.from_pandas(data, npartitions=2))
    assert model.design.nobs == N - N // 3


def test_the_latex_summary_is_ascii_with_its_symbols_in_math_mode(frame):
    """Compiles with plain LaTeX plus booktabs and amssymb: no raw Unicode, no ^ outside math mode."""
    model = DPIV2SLS.from_formula("y ~ 1 + [x ~ zé]", frame.rename(columns={"z": "zé"}))  # a non-ASCII name
    res = model.fit(**{**FIT, "bounds": {"y": BOUNDS["y"], "x": BOUNDS["x"], "zé": BOUNDS["z"]}})
    for benchmark in (True, False):
        tex = res.summary(benchmark=benchmark).as_latex()
        assert tex.isascii()
        outside_math = "".join(part for k, part in enumerate(tex.split("$")) if k % 2 == 0)
        assert "^" not in outside_math and tex.count("$") % 2 == 0
        assert r"$\kappa$" in tex and r"$T \lesssim" in tex and r"\toprule" in tex
        assert "z[LATIN SMALL LETTER E WITH ACUTE]" in tex


def test_the_publishable_latex_compiles(frame, tmp_path):
    """pdflatex on the summary in a minimal article with booktabs and amssymb (tests/latex.py)."""
    require_pdflatex()
    res = DPIV2SLS.from_formula(F, frame).fit(**FIT)
    for benchmark in (False, True):
        compile_latex(res.summary(benchmark=benchmark).as_latex(), tmp_path, f"summary_{benchmark}")
