"""Systematic bad-input suite over the public API.

Every case goes through a public entry point (``DPIV2SLS(...)``, ``DPIV2SLS.from_formula``,
``.fit``, ``dp_2s_gd``, ``epsilon_from_rho``/``delta_from_rho``, ``PrivacyBudget``, ``plan``,
``simulate_iv``) and checks three things:

* bad input raises the right exception TYPE with a message that names the problem (the
  argument or the column): a wrong type is a ``TypeError``, a bad value a ``ValueError``, a
  step size too large a ``DivergenceError``;
* the caller's data are never modified (deep copy before, exact comparison after);
* a fit that succeeds never returns NaN or inf in ``params``, ``path`` or ``first_stage``.

Tests already in test_design.py / test_engine.py / test_model.py are not repeated one for
one; the cases here are either new or exercise the public constructors and ``fit`` end to end.
The hypothesis properties at the end throw random finite data (scales 1e-6 … 1e6, integer and
boolean columns) at the whole pipeline.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
import warnings

import numpy as np
import pandas as pd
import pytest
from findings import expect_finding
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dpivreg import (
    DPIV2SLS,
    DivergenceError,
    PrivacyBudget,
    PrivacyLeakWarning,
    Release,
    delta_from_rho,
    dp_2s_gd,
    epsilon_from_rho,
)
from dpivreg.datasets import simulate_iv
from dpivreg.errors import DroppedRowsWarning
from dpivreg.planning.theorem_plan import plan

METHODS = ["gaussian", "cks", "bun-steinke"]
F = "y ~ 1 + w + [x1 ~ z1 + z2]"
FIT = dict(rho1=1.0, rho2=1.0, T=8, seed=0)


# ----------------------------------------------------------------------------------------
# helpers and shared data
# ----------------------------------------------------------------------------------------
def _base_frame() -> tuple[pd.DataFrame, dict]:
    sim = simulate_iv(400, 1, 2, seed=7)
    rng = np.random.default_rng(8)
    data = sim.data.assign(w=rng.uniform(0.0, 10.0, 400))
    data["y"] = data["y"] + 0.3 * data["w"]
    bounds = {**sim.bounds, "w": (0.0, 10.0)}
    bounds["y"] = (bounds["y"][0] - 3.0, bounds["y"][1] + 3.0)
    return data, bounds


_FRAME, BOUNDS = _base_frame()


@pytest.fixture
def frame() -> pd.DataFrame:
    """A fresh copy of the synthetic frame (y, x1, z1, z2, w) for every test."""
    return _FRAME.copy()


def _same(old, new) -> None:
    if isinstance(old, pd.DataFrame):
        pd.testing.assert_frame_equal(new, old, check_exact=True)
    elif isinstance(old, pd.Series):
        pd.testing.assert_series_equal(new, old, check_exact=True)
    elif isinstance(old, np.ndarray):
        assert new.dtype == old.dtype and new.shape == old.shape
        np.testing.assert_array_equal(new, old)
    else:
        assert new == old


@contextlib.contextmanager
def unchanged(*objects):
    """Assert that the objects (frames, arrays, dicts) are not modified by the block."""
    before = [copy.deepcopy(obj) for obj in objects]
    yield
    for old, new in zip(before, objects):
        _same(old, new)


def assert_finite(res) -> None:
    """No NaN or inf in the released estimates."""
    for name in ("params", "path", "first_stage"):
        values = np.asarray(getattr(res, name), dtype=float)
        assert np.isfinite(values).all(), f"{name} holds non-finite values:\n{getattr(res, name)}"


def fit(model, **kwargs):
    """``model.fit`` with small defaults; privacy-leak warnings (data-derived bounds) silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        return model.fit(**{**FIT, **kwargs})


# ========================================================================================
# 1. Missing and infinite values
# ========================================================================================
@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
def test_nan_rows_are_dropped_jointly_with_a_warning(frame, engine):
    data = frame.copy()
    data.loc[3, "y"] = np.nan
    data.loc[7, ["x1", "z1"]] = np.nan  # two NaN in one row: the row counts once
    data.loc[11, "w"] = np.nan
    with unchanged(data):
        with pytest.warns(DroppedRowsWarning, match=r"dropped 3 of 400 rows"):
            model = DPIV2SLS.from_formula(F, data, formula_engine=engine)
        assert model.design.nobs == 397
        assert not model.design.dependent.index.isin([3, 7, 11]).any()
        res = fit(model, bounds=BOUNDS)
    assert_finite(res)
    # Dropping jointly is the same as the user dropping those rows first.
    reference = fit(DPIV2SLS.from_formula(F, data.drop(index=[3, 7, 11]), formula_engine=engine), bounds=BOUNDS)
    pd.testing.assert_series_equal(res.params, reference.params)


def test_nan_in_a_column_the_formula_does_not_use_drops_nothing(frame):
    data = frame.assign(unused=np.nan)
    with unchanged(data), warnings.catch_warnings():
        warnings.simplefilter("error", DroppedRowsWarning)
        model = DPIV2SLS.from_formula(F, data)
    assert model.design.nobs == len(data)


def test_nullable_na_rows_are_dropped_with_a_warning(frame):
    data = frame.assign(xi=frame["x1"].round().astype("Int64"))
    data.loc[[1, 2], "xi"] = pd.NA
    with unchanged(data):
        with pytest.warns(DroppedRowsWarning, match=r"dropped 2 of 400"):
            model = DPIV2SLS.from_formula("y ~ 1 + w + [xi ~ z1 + z2]", data)
        bounds = {k: v for k, v in BOUNDS.items() if k != "x1"} | {"xi": (-40, 40)}
        assert_finite(fit(model, bounds=bounds))


def test_array_constructor_drops_nan_rows_jointly(frame):
    y = frame["y"].to_numpy().copy()
    y[0] = np.nan
    Z = frame[["z1", "z2"]].to_numpy().copy()
    Z[5, 1] = np.nan
    x = frame["x1"].to_numpy().copy()
    exog = np.column_stack([np.ones(400), frame["w"].to_numpy()])
    with unchanged(y, Z, x, exog):
        with pytest.warns(DroppedRowsWarning, match=r"dropped 2 of 400"):
            model = DPIV2SLS(y, exog, x, Z)
        res = fit(model)
    assert model.design.nobs == 398
    assert_finite(res)


@pytest.mark.parametrize("entry", ["formula", "arrays"])
@pytest.mark.parametrize("value", [np.inf, -np.inf])
@pytest.mark.parametrize(
    "column, block", [("y", "dependent"), ("w", "exog"), ("x1", "endog"), ("z2", "instruments")]
)
def test_infinite_value_is_an_error_naming_the_column(frame, entry, value, column, block):
    data = frame.copy()
    data.loc[17, column] = value
    match = rf"{block} column\(s\) \['{column}'\] contain infinite values"
    with unchanged(data), pytest.raises(ValueError, match=match):
        if entry == "formula":
            DPIV2SLS.from_formula(F, data)
        else:
            DPIV2SLS(data["y"], data[["w"]], data["x1"], data[["z1", "z2"]])


def test_infinite_value_created_by_the_formula_names_the_term(frame):
    data = frame.copy()
    data.loc[5, "z1"] = 0.0
    with unchanged(data), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "divide by zero in log"
        with pytest.raises(ValueError, match=r"\['np\.log\(np\.abs\(z1\)\)'\] contain infinite values"):
            DPIV2SLS.from_formula("y ~ 1 + [x1 ~ np.log(np.abs(z1)) + z2]", data)


# ========================================================================================
# 2. Empty data, a single row
# ========================================================================================
@pytest.mark.parametrize(
    "make",
    [
        lambda f: DPIV2SLS.from_formula(F, f.iloc[:0]),
        lambda f: DPIV2SLS.from_formula(F, f.iloc[:0], formula_engine="patsy"),
        lambda f: DPIV2SLS.from_formula(F, pd.DataFrame(columns=f.columns, dtype=float)),
        lambda f: DPIV2SLS.from_formula(F, pd.DataFrame(columns=f.columns)),  # object dtype, as users write it
        lambda f: DPIV2SLS(f["y"].iloc[:0], None, f["x1"].iloc[:0], f[["z1", "z2"]].iloc[:0]),
        lambda f: DPIV2SLS(np.empty(0), None, np.empty(0), np.empty((0, 2))),
    ],
    ids=["formulaic", "patsy", "typed-columns-no-rows", "object-columns-no-rows", "series", "numpy"],
)
def test_empty_data_is_a_clear_error(frame, make):
    with unchanged(frame), pytest.raises(ValueError, match=r"no rows"):
        make(frame)


def test_frame_without_columns_names_the_missing_variable():
    with pytest.raises(ValueError, match=r"unknown column or name 'y'"):
        DPIV2SLS.from_formula(F, pd.DataFrame())


@pytest.mark.parametrize(
    "make",
    [
        lambda one: DPIV2SLS.from_formula("y ~ [x1 ~ z1]", one),
        lambda one: DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1]", one),
        lambda one: DPIV2SLS.from_formula(F, one),
        lambda one: DPIV2SLS(one["y"].to_numpy(), None, one["x1"].to_numpy(), one["z1"].to_numpy()),
    ],
    ids=["no-intercept", "intercept", "intercept+exog", "numpy-no-intercept"],
)
def test_single_row_is_a_clear_error(frame, make):
    """One observation: the message must say so (not blame a 'constant instrument' and advise removing it)."""
    one = frame.iloc[:1].copy()
    with unchanged(one), pytest.raises(ValueError, match=r"\b1 row"):
        make(one)


# ========================================================================================
# 3. Identification: constant / collinear instruments, too few instruments
# ========================================================================================
def _constant_after_drop(f):
    data = f.assign(z3=1.0)
    data.loc[:9, "z3"] = np.arange(10.0)  # varies only in rows dropped for a missing y
    data.loc[:9, "y"] = np.nan
    return data


DESIGN_CASES = {
    "under-identified": ("y ~ 1 + [x1 + w ~ z1]", lambda f: f,
                         r"under-identified: 1 instrument\(s\) \['z1'\] for 2 endogenous variable\(s\) \['x1', 'w'\]"),
    "constant-after-nan-drop": ("y ~ 1 + [x1 ~ z1 + z3]", _constant_after_drop, r"instrument 'z3' is constant"),
    "scaled-duplicate-instrument": ("y ~ 1 + [x1 ~ z1 + z3]", lambda f: f.assign(z3=1e6 * f["z1"]),
                                    r"instruments \[exog, instruments\].*column 'z3' is a linear combination"),
    "instrument-affine-in-exog": ("y ~ 1 + w + [x1 ~ z1 + z3]", lambda f: f.assign(z3=2.0 * f["w"] + 1.0),
                                  r"instruments \[exog, instruments\].*column 'z3'"),
    "endog-affine-in-exog": ("y ~ 1 + w + [x3 ~ z1 + z2]", lambda f: f.assign(x3=3.0 * f["w"] - 2.0),
                             r"regressors \[exog, endog\].*column 'x3'"),
    "two-identical-endog": ("y ~ 1 + [x1 + x1b ~ z1 + z2]", lambda f: f.assign(x1b=f["x1"]),
                            r"regressors \[exog, endog\].*column 'x1b'"),
}


def test_under_identification_is_an_error(frame):
    formula, modify, match = DESIGN_CASES["under-identified"]
    with unchanged(frame), pytest.raises(ValueError, match=match):
        DPIV2SLS.from_formula(formula, modify(frame))


@pytest.mark.parametrize("case", [case for case in DESIGN_CASES if case != "under-identified"])
def test_identification_findings_name_the_column(frame, case):
    """Findings one row can flip: the model is built (warned), the fit runs, check_data=True refuses."""
    formula, modify, match = DESIGN_CASES[case]
    data = modify(frame)
    with unchanged(data):
        model = expect_finding(DPIV2SLS.from_formula, match, formula, data)
        bounds = {name: (-50.0, 50.0) for name in model.design.column_names if name != "Intercept"}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DroppedRowsWarning)
            with pytest.warns(PrivacyLeakWarning, match=r"check_data=True"), pytest.raises(ValueError, match=match):
                model.fit(bounds=bounds, check_data=True, **FIT)
            assert np.isfinite(model.fit(bounds=bounds, **FIT).params).all()


def test_collinear_instruments_via_array_constructor(frame):
    Z = np.column_stack([frame["z1"], 1e6 * frame["z1"]])
    with unchanged(Z):
        expect_finding(DPIV2SLS, r"column 'instruments\.1' is a linear combination", frame["y"].to_numpy(),
                       np.ones(400), frame["x1"].to_numpy(), Z)


def test_nearly_collinear_instruments_fit_finitely(frame):
    """Full rank but ill-conditioned (z3 = z1 + 1e-9·noise): every route returns finite estimates."""
    data = frame.assign(z3=frame["z1"] + 1e-9 * np.random.default_rng(1).standard_normal(400))
    model = DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + z3]", data)
    bounds = {k: v for k, v in BOUNDS.items() if k in ("y", "x1", "z1")} | {"z3": BOUNDS["z1"]}
    with unchanged(data):
        for preprocess, method in [("private", "preconditioned"), ("data", "gd"), ("bounds", "gd")]:
            assert_finite(fit(model, bounds=bounds, preprocess=preprocess, method=method))


# ========================================================================================
# 4. Bounds
# ========================================================================================
@pytest.mark.parametrize(
    "bounds, exc, match",
    [
        # 'w' is a column of the data, not of this design: a codebook entry, accepted (tests/test_bounds.py)
        ({"Y": (0, 10)}, ValueError,
         r"bounds were given for 'Y', which is neither a column of the design nor of the data \(a typo\?\)\. "
         r"Design columns: \['y', 'Intercept', 'x1', 'z1', 'z2'\]"),
        ({"y": (None, 1)}, TypeError, r"bounds\['y'\] must be a \(lower, upper\) pair of numbers"),
        ({"y": (0, "1")}, TypeError, r"bounds\['y'\] must be a \(lower, upper\) pair of numbers"),
        ({"z1": (np.True_, 2)}, TypeError, r"bounds\['z1'\] must be a \(lower, upper\) pair"),
        ({"z1": np.array([0.0, 1.0, 2.0])}, TypeError, r"bounds\['z1'\] must be a \(lower, upper\) pair"),
        ({"z1": 4.0}, TypeError, r"bounds\['z1'\] must be a \(lower, upper\) pair"),
        ({"y": (np.nan, 1)}, ValueError, r"bounds\['y'\] must be finite"),
        ({"x1": (3.0, -3.0)}, ValueError, r"bounds\['x1'\] must satisfy lower < upper"),
        (pd.Series({"y": (0, 1)}), TypeError, r"bounds must be a dict"),
    ],
    ids=["wrong-case", "None-lower", "str-upper", "numpy-bool", "three-values", "scalar",
         "nan", "lo>hi", "Series"],
)
def test_bad_bounds_name_the_column(frame, bounds, exc, match):
    model = DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + z2]", frame)
    with unchanged(frame), pytest.raises(exc, match=match):
        fit(model, bounds=bounds)


def test_fit_does_not_modify_the_bounds_dict(frame):
    bounds = {**BOUNDS, "x1": [-40, 40]}  # a list pair, ints
    with unchanged(frame, bounds):
        assert_finite(fit(DPIV2SLS.from_formula(F, frame), bounds=bounds))


# ========================================================================================
# 5. Non-numeric columns, duplicate and clashing names
# ========================================================================================
@pytest.mark.parametrize(
    "convert", [lambda s: s.astype(str), lambda s: s.astype(object)], ids=["str", "object-floats"]
)
def test_numbers_stored_as_text_are_a_clear_error(frame, convert):
    """A numeric column stored as text is silently one-hot encoded (400 levels); the error must name it."""
    data = frame.assign(zs=convert(frame["z2"]))
    with unchanged(data), pytest.raises((TypeError, ValueError), match=r"'zs'.*(numeric|dtype|astype|categor|text)"):
        DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + zs]", data)


def test_complex_column_is_rejected_in_a_formula(frame):
    data = frame.assign(zc=frame["z2"] + 1j)
    with unchanged(data), pytest.raises(TypeError, match=r"'zc'.*(complex|not numeric)"):
        DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + zc]", data)


def test_complex_array_is_rejected_by_the_array_constructor(frame):
    Z = frame[["z1", "z2"]].to_numpy() + 0j
    with unchanged(Z), pytest.raises(TypeError, match=r"instruments has dtype complex128, which is not numeric"):
        DPIV2SLS(frame["y"].to_numpy(), None, frame["x1"].to_numpy(), Z)


def test_complex_array_is_rejected_by_the_engine(frame):
    Z = frame[["z1", "z2"]].to_numpy() + 0j
    with pytest.raises(TypeError, match=r"\bZ\b"):
        dp_2s_gd(Z, frame[["x1"]].to_numpy(), frame["y"].to_numpy(), T=3, rho1=1.0, rho2=1.0, eta=0.1,
                 alpha=0.1, clip1=1.0, clip2=1.0, seed=0)


def test_datetime_column_error_names_it(frame):
    data = frame.assign(zd=pd.date_range("2000-01-01", periods=400))
    with unchanged(data), pytest.raises((TypeError, ValueError), match=r"zd"):
        DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + zd]", data)


def test_text_dependent_variable_error_names_it(frame):
    data = frame.assign(ys=np.where(frame["z1"] > 0, "a", "b"))
    with unchanged(data), pytest.raises(ValueError, match=r"ys"):
        DPIV2SLS.from_formula("ys ~ 1 + [x1 ~ z1 + z2]", data)


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
def test_duplicate_column_names_in_data_are_a_clear_error(frame, engine):
    data = pd.concat([frame, 2.0 * frame[["z1"]]], axis=1)  # two columns named 'z1'
    with unchanged(data), pytest.raises(ValueError, match=r"(?i)duplicate.*'z1'|'z1'.*duplicate"):
        DPIV2SLS.from_formula(F, data, formula_engine=engine)


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
def test_duplicate_names_of_unused_columns_are_harmless(frame, engine):
    extra = pd.DataFrame(np.ones((400, 2)), columns=["junk", "junk"], index=frame.index)
    data = pd.concat([frame, extra], axis=1)
    with unchanged(data):
        assert DPIV2SLS.from_formula(F, data, formula_engine=engine).design.nobs == 400


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda f: DPIV2SLS.from_formula("z1 ~ 1 + [x1 ~ z1 + z2]", f), "z1"),
        (lambda f: DPIV2SLS.from_formula("x1 ~ 1 + [x1 ~ z1 + z2]", f), "x1"),
        (lambda f: DPIV2SLS.from_formula("w ~ 1 + w + [x1 ~ z1 + z2]", f), "w"),
        (lambda f: DPIV2SLS(f["y"].rename("x1"), None, f["x1"], f[["z1", "z2"]]), "x1"),
    ],
    ids=["dependent-is-instrument", "dependent-is-endog", "dependent-is-exog", "arrays-name-clash"],
)
def test_dependent_sharing_a_name_with_a_regressor_or_instrument(frame, make, name):
    """Either a finite fit or a ValueError that names the clashing column — never a numpy broadcast error."""
    with unchanged(frame):
        try:
            res = fit(make(frame))
        except ValueError as exc:
            assert f"'{name}'" in str(exc), f"the error does not name the clashing column {name!r}: {exc}"
        else:
            assert_finite(res)


# ========================================================================================
# 6. Formula errors
# ========================================================================================
@pytest.mark.parametrize(
    "formula, exc, match",
    [
        ("y ~ 1 + [x1 ~ z1 z2]", ValueError, r"instruments block '0 \+ z1 z2'.*Missing operator"),
        ("y ~ 1 + [x1 ~ (z1]", ValueError, r"instruments block '0 \+ \(z1'"),
        ("y ~ 1 + [x1 ~ z1 +* z2]", ValueError, r"Operator `\+\*`"),
        ("y ~ 1 + [x1 ~ z1 + I(z2 ** )]", ValueError, r"I\(z2 \*\* \)"),
        ("y ~ 1 + [x1 ~ z1 + z2] +", ValueError, r"exog.*Operator `\+`"),
        ("y ~ 1 + [x1 ~ z1 + nosuch]", ValueError, r"unknown column or name 'nosuch' in the instruments"),
        ("y ~ 1 + nofun(w) + [x1 ~ z1]", ValueError, r"unknown column or name 'nofun' in the exogenous"),
        ("y ~ 1 + np.nofun(w) + [x1 ~ z1]", ValueError, r"np\.nofun"),
        ("y ~ 1 + w", ValueError, r"no \[endog ~ instruments\] block"),
        (None, TypeError, r"formula must be a string, got NoneType"),
    ],
)
def test_formula_errors_name_the_offending_part(frame, formula, exc, match):
    with unchanged(frame), pytest.raises(exc, match=match):
        DPIV2SLS.from_formula(formula, frame)


def test_formula_with_numpy_data_is_a_type_error(frame):
    with pytest.raises(TypeError, match=r"data must be a pandas DataFrame, got ndarray"):
        DPIV2SLS.from_formula(F, frame.to_numpy())


# ========================================================================================
# 7. Huge and tiny values
# ========================================================================================
@pytest.mark.parametrize("column", ["y", "x1", "z1", "w"])
def test_huge_outlier_is_clipped_to_the_public_bounds(frame, column):
    """A value of 1e300 beyond public bounds is clipped to them: the fit equals the fit on the capped data."""
    data = frame.copy()
    data.loc[0, column] = 1e300
    capped = frame.copy()
    capped.loc[0, column] = BOUNDS[column][1]
    with unchanged(data, BOUNDS):
        res = fit(DPIV2SLS.from_formula(F, data), bounds=BOUNDS)
    assert_finite(res)
    assert res.scale.clipped_values[column] >= 1
    reference = fit(DPIV2SLS.from_formula(F, capped), bounds=BOUNDS)
    np.testing.assert_allclose(res.params.to_numpy(), reference.params.to_numpy(), rtol=1e-9)


@pytest.mark.parametrize("column", ["y", "x1", "z1", "w"])
def test_huge_outlier_without_bounds_is_finite_or_a_clear_error(frame, column):
    data = frame.copy()
    data.loc[0, column] = 1e300
    with unchanged(data):
        try:
            res = fit(DPIV2SLS.from_formula(F, data))
        except ValueError as exc:
            message = str(exc)
            assert column in message and re.search(r"large|huge|magnitude|scale|1e\+300|outlier|bounds", message), (
                f"unclear error for a 1e300 value in {column!r}: {message}"
            )
        else:
            assert_finite(res)


@pytest.mark.parametrize("scale", [1e-300, 1e13, 1e300])
@pytest.mark.parametrize("column", ["y", "x1", "z1"])
def test_data_derived_scale_works_at_extreme_magnitudes(frame, column, scale):
    """Without bounds the scale comes from the data; 2SLS is equivariant, so rescaling a column rescales β."""
    data = frame.assign(**{column: frame[column] * scale})
    with unchanged(data):
        res = fit(DPIV2SLS.from_formula(F, data))
    assert_finite(res)
    expected = fit(DPIV2SLS.from_formula(F, frame)).params.copy()
    if column == "y":
        expected *= scale
    elif column == "x1":
        expected["x1"] /= scale
    np.testing.assert_allclose(res.params.to_numpy(), expected.to_numpy(), rtol=1e-6)


@pytest.mark.parametrize("preprocess", ["data", "private"])
@pytest.mark.parametrize("width", [1e100, 1e200])
def test_very_loose_public_bounds_keep_the_non_private_limit(frame, preprocess, width):
    """Bounds far wider than the data only change the working scale: with rho = inf and no clipping the
    centring, scaling and whitening are exact, so the fit must still equal the 2SLS benchmark."""
    bounds = {c: (-width, width) for c in BOUNDS}
    with unchanged(frame, bounds):
        res = fit(DPIV2SLS.from_formula(F, frame), rho1=math.inf, rho2=math.inf, clip=False, T=300,
                  bounds=bounds, preprocess=preprocess, inference=False)
    assert_finite(res)
    np.testing.assert_allclose(res.params.to_numpy(), res.benchmark.params.to_numpy(), rtol=1e-6, atol=1e-8)


def test_engine_handles_huge_data_with_clipping(frame):
    Z = frame[["z1", "z2"]].to_numpy() * 1e300
    X = frame[["x1"]].to_numpy() * 1e300
    Y = frame["y"].to_numpy() * 1e300
    with unchanged(Z, X, Y):
        for method in ("gd", "preconditioned"):
            path = dp_2s_gd(Z, X, Y, T=5, rho1=1.0, rho2=1.0, eta=0.1, alpha=0.1, clip1=1.0, clip2=1.0, seed=0,
                            method=method)
            assert np.isfinite(path.beta).all() and np.isfinite(path.theta).all()


# ========================================================================================
# 8. Integer and boolean dtypes
# ========================================================================================
def _discrete_frame() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    n = 300
    z1 = rng.integers(0, 5, n)
    zb = rng.random(n) < 0.5
    u = rng.standard_normal(n)
    w = rng.integers(0, 11, n).astype(np.uint8)
    x = (z1 + 2 * zb + u + rng.standard_normal(n)).round().astype(np.int64)
    y = (2 * x + 0.5 * w + u + rng.standard_normal(n)).round().astype(np.int32)
    return pd.DataFrame({"y": y, "x": x, "z1": z1, "zb": zb, "w": w})


_DISCRETE = _discrete_frame()
_DISCRETE_F = "y ~ 1 + w + [x ~ z1 + zb]"
_DISCRETE_BOUNDS = {"y": (-60, 60), "x": (-20, 20), "z1": (0, 5), "zb": (0, 1), "w": (0, 10)}


@pytest.mark.parametrize("use_bounds", [True, False])
@pytest.mark.parametrize("preprocess, method", [("private", "preconditioned"), ("bounds", "gd"), ("data", "gd")])
def test_integer_and_boolean_columns_equal_the_float_fit(use_bounds, preprocess, method):
    data = _DISCRETE.copy()
    kwargs = dict(preprocess=preprocess, method=method, bounds=_DISCRETE_BOUNDS if use_bounds else None)
    with unchanged(data, _DISCRETE_BOUNDS):
        res = fit(DPIV2SLS.from_formula(_DISCRETE_F, data), **kwargs)
    # a boolean column is bounded [0, 1] by construction (dpivreg.data.bounds); its float copy needs it said
    float_kwargs = {**kwargs, "bounds": kwargs["bounds"] or {"zb": (0.0, 1.0)}}
    reference = fit(DPIV2SLS.from_formula(_DISCRETE_F, data.astype(float)), **float_kwargs)
    assert_finite(res)
    pd.testing.assert_series_equal(res.params, reference.params)


@pytest.mark.parametrize("dtypes", [{"x": "Int64"}, {"zb": "boolean"}, {"x": "int8", "z1": "uint16"},
                                    {"z1": "Float32"}])
def test_nullable_and_small_integer_dtypes_equal_the_float_fit(dtypes):
    data = _DISCRETE.astype(dtypes)
    with unchanged(data):
        res = fit(DPIV2SLS.from_formula(_DISCRETE_F, data), bounds=_DISCRETE_BOUNDS)
    reference = fit(DPIV2SLS.from_formula(_DISCRETE_F, _DISCRETE.astype(float)), bounds=_DISCRETE_BOUNDS)
    pd.testing.assert_series_equal(res.params, reference.params)


def test_integer_and_boolean_numpy_arrays_equal_the_float_fit():
    d = _DISCRETE
    y, x, Z = d["y"].to_numpy(), d["x"].to_numpy(), np.column_stack([d["z1"], d["zb"]])  # Z: int64
    zb = d["zb"].to_numpy()  # bool
    with unchanged(y, x, Z, zb):
        res = fit(DPIV2SLS(y, np.ones(300, dtype=int), x, Z))
        res_bool = fit(DPIV2SLS(y, None, x, zb))
    ref = fit(DPIV2SLS(y.astype(float), np.ones(300), x.astype(float), Z.astype(float)))
    ref_bool = fit(DPIV2SLS(y.astype(float), None, x.astype(float), zb.astype(float)))
    np.testing.assert_array_equal(res.params.to_numpy(), ref.params.to_numpy())
    np.testing.assert_array_equal(res_bool.params.to_numpy(), ref_bool.params.to_numpy())


def test_engine_accepts_integer_and_boolean_arrays():
    d = _DISCRETE
    Z, X, Y = np.column_stack([d["z1"], d["zb"]]), d[["x"]].to_numpy(), d["y"].to_numpy()
    kwargs = dict(T=5, rho1=1.0, rho2=1.0, eta=0.1, alpha=0.1, clip1=1.0, clip2=1.0, seed=0)
    a = dp_2s_gd(Z, X, Y, **kwargs)
    b = dp_2s_gd(Z.astype(float), X.astype(float), Y.astype(float), **kwargs)
    np.testing.assert_array_equal(a.beta, b.beta)


# ========================================================================================
# 9. fit() arguments
# ========================================================================================
FIT_ARGUMENT_CASES = [
    # budgets
    ({"rho1": "1"}, TypeError, r"rho1"),
    ({"rho1": None}, TypeError, r"rho1"),
    ({"rho1": np.array([1.0])}, TypeError, r"rho1"),
    ({"rho2": -math.inf}, ValueError, r"rho2 must be > 0"),
    ({"rho0": 0}, ValueError, r"rho0 must be > 0"),
    ({"rho0": "a"}, TypeError, r"rho0"),
    ({"rho0": math.nan}, ValueError, r"rho0"),
    ({"delta": "x"}, TypeError, r"delta"),
    ({"delta": None}, TypeError, r"delta"),
    ({"delta": math.nan}, ValueError, r"delta must lie strictly between 0 and 1"),
    ({"delta": -1e-5}, ValueError, r"delta must lie strictly between 0 and 1"),
    # iterations
    ({"T": 5.0}, TypeError, r"T must be an integer"),
    ({"T": "5"}, TypeError, r"T must be an integer"),
    ({"T": -1}, ValueError, r"T must be >= 1"),
    # clipping
    ({"clip": math.nan}, ValueError, r"clip must be a finite clipping threshold > 0"),
    ({"clip": math.inf}, ValueError, r"clip must be a finite clipping threshold > 0"),
    ({"clip": 0}, ValueError, r"clip must be a finite clipping threshold > 0"),
    ({"clip": (1.0, math.nan)}, ValueError, r"clip\[1\]"),
    ({"clip": {"c0": -1}}, ValueError, r'clip\["c0"\]'),
    ({"clip": "Theorem"}, ValueError, r"clip as a string must be one of \('adaptive', 'theorem', 'rms'\)"),
    ({"clip": True}, TypeError, r"clip=True is ambiguous"),
    ({"clip": (1.0, 2.0, 3.0)}, TypeError, r"clip must be None"),
    ({"clip": np.array([1.0, 2.0])}, TypeError, r"clip must be None"),
    ({"clip": (1.0, "a")}, TypeError, r"clip\[1\]"),          # wrong type: TypeError like rho/T/eta/seed
    ({"clip": {"c0": "x"}}, TypeError, r'clip\["c0"\]'),      # wrong type: TypeError like rho/T/eta/seed
    # step sizes
    ({"eta": "0.1"}, TypeError, r"eta"),
    ({"eta": True}, TypeError, r"eta"),
    ({"eta": math.nan}, ValueError, r"eta must be a finite number > 0"),
    ({"eta": math.inf}, ValueError, r"eta must be a finite number > 0"),
    ({"eta": math.nan, "method": "gd"}, ValueError, r"eta must be a finite number > 0"),
    ({"alpha": "x"}, TypeError, r"alpha"),
    ({"alpha": math.nan}, ValueError, r"alpha must be a finite number > 0"),
    ({"alpha": -1.0, "method": "gd"}, ValueError, r"alpha must be a finite number > 0"),
    # tau
    ({"tau": math.nan}, ValueError, r"tau must be a number in \(0, 700\]"),
    ({"tau": -1}, ValueError, r"tau must be a number in \(0, 700\]"),
    ({"tau": math.inf}, ValueError, r"tau must be a number in \(0, 700\]"),
    ({"tau": "5"}, TypeError, r"tau"),                          # wrong type: TypeError like rho/T/eta/seed
    ({"tau": None}, TypeError, r"tau"),                         # wrong type: TypeError like rho/T/eta/seed
    # inference
    ({"inference": "yes"}, TypeError, r"inference must be True or False"),
    ({"inference": 1}, TypeError, r"inference must be True or False"),
    ({"rho_inf": 0}, ValueError, r"rho_inf must be > 0"),
    ({"rho_inf": "a"}, TypeError, r"rho_inf"),
    # seeds
    ({"seed": 1.5}, TypeError, r"seed must be None, a non-negative int"),
    ({"seed": "x"}, TypeError, r"seed must be None, a non-negative int"),
    ({"seed": [1, 2]}, TypeError, r"seed must be None, a non-negative int"),
    ({"seed": True}, TypeError, r"seed must be None, a non-negative int"),
    ({"seed": np.random.RandomState(0)}, TypeError, r"seed .*got RandomState"),
    ({"seed": -1}, ValueError, r"seed must be a non-negative integer"),
    # option strings
    ({"preprocess": "Private"}, ValueError, r"preprocess must be one of \('private', 'bounds', 'data'\), got 'Private'"),
    ({"preprocess": None}, ValueError, r"preprocess must be one of"),
    ({"method": None}, ValueError, r"method must be one of"),
    ({"method": "GD"}, ValueError, r"method must be one of \('auto', 'preconditioned', 'gd', 'moments'\), got 'GD'"),
    ({"init": "warm"}, ValueError, r"init must be one of \('moments', 'zero'\)"),
    ({"init": "moments", "preprocess": "bounds"}, ValueError, r'init="moments" needs the moment release'),
    ({"schedule": "geometric"}, ValueError, r"schedule must be one of \('staggered', 'uniform'\)"),
    ({"rho_clip": 0}, ValueError, r"rho_clip must be > 0"),
    ({"rho": 2.0}, ValueError, r"pass either rho .* or the individual budgets"),
    ({"rho1": None, "rho2": None, "rho": "2"}, TypeError, r"rho"),
    ({"rho1": None, "rho2": None, "rho": -1}, ValueError, r"rho must be > 0"),
    ({"rho2": None}, TypeError, r"needs the budgets rho1 and rho2"),
    ({"method": "moments", "clip": "rms"}, ValueError, r'method="moments" runs no iteration, so T, clip do not apply'),
    ({"method": "moments", "eta": 0.5, "T": None}, ValueError, r'method="moments" runs no iteration, so eta'),
    ({"method": "moments", "preprocess": "bounds", "T": None}, ValueError, r'method="moments" needs the moment'),
    ({"calibration": None}, ValueError, r"calibration must be one of"),
    ({"calibration": "Exact"}, ValueError, r"calibration must be one of \('exact', 'paper'\)"),
]


def _case_id(kwargs) -> str | None:
    if not isinstance(kwargs, dict):
        return None  # let pytest name the exception type / pattern
    return ",".join(f"{k}={type(v).__name__ if isinstance(v, np.random.RandomState) else repr(v)}"
                    for k, v in kwargs.items())


@pytest.mark.parametrize("kwargs, exc, match", FIT_ARGUMENT_CASES, ids=[_case_id(c[0]) for c in FIT_ARGUMENT_CASES])
def test_bad_fit_arguments_name_the_argument(frame, kwargs, exc, match):
    model = DPIV2SLS.from_formula(F, frame)
    with unchanged(frame), pytest.raises(exc, match=match):
        fit(model, bounds=BOUNDS, **kwargs)


@pytest.mark.parametrize("kwargs", [{"T": np.int64(3)}, {"seed": np.int64(3)}, {"rho1": np.float32(1.0)},
                                    {"seed": np.random.SeedSequence(1)}, {"seed": np.random.default_rng(2)},
                                    {"clip": np.float64(2.0)}, {"tau": np.float32(3.0)}])
def test_numpy_scalars_are_accepted(frame, kwargs):
    assert_finite(fit(DPIV2SLS.from_formula(F, frame), bounds=BOUNDS, **kwargs))


# ========================================================================================
# 10. Divergent step sizes
# ========================================================================================
@pytest.mark.parametrize("method", ["gd", "preconditioned"])
def test_divergent_eta_with_public_bounds_raises(frame, method):
    """eta = 1e6 on the unit working scale cannot converge. Per-sample clipping bounds every step, so the
    iterates stay finite, the non-finite check never fires and an oscillating estimate is returned."""
    model = DPIV2SLS.from_formula(F, frame)
    with unchanged(frame), pytest.raises(DivergenceError, match=r"Lower eta"):
        fit(model, eta=1e6, alpha=0.1, method=method, bounds=BOUNDS, T=50)


@pytest.mark.parametrize("method", ["gd", "preconditioned"])
def test_divergent_alpha_with_public_bounds_raises(frame, method):
    model = DPIV2SLS.from_formula(F, frame)
    with unchanged(frame), pytest.raises(DivergenceError, match=r"Lower alpha"):
        fit(model, eta=0.5, alpha=1e6, method=method, bounds=BOUNDS, T=50)


def test_divergent_eta_without_clipping_raises(frame):
    model = DPIV2SLS.from_formula(F, frame)
    with pytest.raises(DivergenceError, match=r"step size eta=1e\+06 is too large.*Lower eta"):
        fit(model, rho1=math.inf, rho2=math.inf, clip=False, eta=1e6, alpha=0.1, method="gd", bounds=BOUNDS, T=200)


def test_astronomical_step_size_is_a_clear_error(frame):
    model = DPIV2SLS.from_formula(F, frame)
    with pytest.raises((DivergenceError, ValueError), match=r"eta"):
        fit(model, eta=1e300, alpha=1e300, bounds=BOUNDS)


def test_engine_astronomical_step_size_is_a_clear_error(frame):
    Z, X, Y = frame[["z1", "z2"]].to_numpy() / 4, frame[["x1"]].to_numpy() / 40, frame["y"].to_numpy() / 100
    with pytest.raises((DivergenceError, ValueError), match=r"eta"):
        dp_2s_gd(Z, X, Y, T=5, rho1=1.0, rho2=1.0, eta=1e300, alpha=0.1, clip1=1.0, clip2=1.0, seed=0,
                 method="preconditioned")


def test_engine_divergent_eta_with_clipping_raises(frame):
    Z, X, Y = frame[["z1", "z2"]].to_numpy() / 4, frame[["x1"]].to_numpy() / 40, frame["y"].to_numpy() / 100
    with pytest.raises(DivergenceError, match=r"Lower eta"):
        dp_2s_gd(Z, X, Y, T=50, rho1=1.0, rho2=1.0, eta=1e6, alpha=0.1, clip1=1.0, clip2=1.0, seed=0)


# ========================================================================================
# 11. Privacy conversions
# ========================================================================================
@pytest.mark.parametrize(
    "rho, exc",
    [("1", TypeError), (None, TypeError), (True, TypeError), (np.array([1.0, 2.0]), TypeError),
     (-1.0, ValueError), (math.nan, ValueError)],
    ids=["str", "None", "bool", "array", "negative", "nan"],
)
def test_epsilon_from_rho_rejects_bad_rho(rho, exc):
    with pytest.raises(exc, match=r"\brho\b"):
        epsilon_from_rho(rho, 1e-5)


@pytest.mark.parametrize("delta, exc", [("x", TypeError), (0.0, ValueError), (1.0, ValueError), (math.nan, ValueError)])
def test_epsilon_from_rho_rejects_bad_delta(delta, exc):
    with pytest.raises(exc, match=r"\bdelta\b"):
        epsilon_from_rho(1.0, delta)


@pytest.mark.parametrize("method", METHODS)
def test_epsilon_of_a_huge_rho_is_finite(method):
    eps = epsilon_from_rho(1e300, 1e-5, method=method)
    assert math.isfinite(eps) and eps >= 1e299


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("rho, exc", [("1", TypeError), (-1.0, ValueError), (math.nan, ValueError)],
                         ids=["str", "negative", "nan"])
def test_delta_from_rho_rejects_bad_rho(method, rho, exc):
    with pytest.raises(exc, match=r"\brho\b"):
        delta_from_rho(rho, 1.0, method=method)


@pytest.mark.parametrize("epsilon, exc", [("x", TypeError), (None, TypeError), (-1.0, ValueError), (math.nan, ValueError)],
                         ids=["str", "None", "negative", "nan"])
def test_delta_from_rho_rejects_bad_epsilon(epsilon, exc):
    with pytest.raises(exc, match=r"\bepsilon\b"):
        delta_from_rho(1.0, epsilon)


@pytest.mark.parametrize("method", METHODS)
def test_delta_at_infinite_epsilon_is_zero(method):
    assert delta_from_rho(1.0, math.inf, method=method) == 0.0


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("rho, epsilon, expected", [(1e300, 1.0, 1.0), (1.0, 1e300, 0.0)],
                         ids=["huge-rho", "huge-epsilon"])
def test_delta_at_extreme_values_is_the_limiting_probability(method, rho, epsilon, expected):
    """No privacy (rho → inf) gives δ → 1; an unbounded ε gives δ → 0 (δ is non-increasing in ε)."""
    assert delta_from_rho(rho, epsilon, method=method) == pytest.approx(expected, abs=1e-12)


def _budget() -> PrivacyBudget:
    return PrivacyBudget([Release.gaussian("first stage", "rho1", steps=10, clip=1.0, n=100, noise_std=0.5)])


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda b: b.epsilon("x"), TypeError, r"delta"),
        (lambda b: b.epsilon(0.0), ValueError, r"delta"),
        (lambda b: b.epsilon(1.5), ValueError, r"delta"),
        (lambda b: b.epsilon(1e-5, method="rdp"), ValueError, r"method must be one of"),
        (lambda b: b.delta(-1.0), ValueError, r"epsilon"),
        (lambda b: b.delta(math.nan), ValueError, r"epsilon"),
        (lambda b: b.delta("x"), TypeError, r"epsilon"),
        (lambda b: b.delta(1.0, method="rdp"), ValueError, r"method must be one of"),
    ],
    ids=["eps-str", "eps-0", "eps-1.5", "eps-method", "delta-neg", "delta-nan", "delta-str", "delta-method"],
)
def test_privacy_budget_conversions_reject_bad_arguments(call, exc, match):
    with pytest.raises(exc, match=match):
        call(_budget())


def test_privacy_budget_delta_at_infinite_epsilon_is_zero():
    assert _budget().delta(math.inf) == 0.0


@settings(max_examples=50, deadline=None)
@given(rho=st.floats(1e-6, 1e6), epsilon=st.floats(0.0, 1e3), log_delta=st.floats(-12.0, -0.1),
       method=st.sampled_from(METHODS))
def test_conversions_are_valid_for_any_valid_input(rho, epsilon, log_delta, method):
    delta = delta_from_rho(rho, epsilon, method=method)
    assert 0.0 <= delta <= 1.0
    eps = epsilon_from_rho(rho, 10.0**log_delta, method=method)
    assert math.isfinite(eps) and eps >= 0.0


# ========================================================================================
# 12. theory.plan and datasets.simulate_iv
# ========================================================================================
PLAN = dict(n=1000, p=1, q=2, rho1=1.0, rho2=1.0)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"n": "1000"}, TypeError, r"\bn\b"),
        ({"n": 0}, ValueError, r"\bn\b"),
        ({"n": math.nan}, ValueError, r"\bn\b"),
        ({"q": 0.5}, ValueError, r"\bq\b"),
        ({"p": 3}, ValueError, r"q \(number of instruments\) must be finite and >= p = 3"),
        ({"rho1": -1}, ValueError, r"rho1"),
        ({"rho2": None}, TypeError, r"rho2"),
        ({"tau": "5"}, TypeError, r"tau"),
        ({"kappa": 1.0}, ValueError, r"kappa"),
        ({"T_max": 2.5}, ValueError, r"T_max"),
        ({"T_max": "10"}, TypeError, r"T_max"),
    ],
    ids=_case_id,
)
def test_plan_rejects_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        plan(**{**PLAN, **kwargs})


def test_plan_for_a_huge_n_is_finite_or_a_clear_error():
    try:
        result = plan(**{**PLAN, "n": 1e300})
    except ValueError as exc:
        assert re.search(r"\bn\b", str(exc)), str(exc)
    else:
        assert math.isfinite(result.bound.total) and result.recommended_T >= 1


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"n": 0}, ValueError, r"\bn\b must be a positive integer"),
        ({"p": 2, "q": 1}, ValueError, r"q must be >= p"),
        ({"r": 0}, ValueError, r"\br\b must be a positive integer"),
        ({"n": "10"}, TypeError, r"\bn\b"),   # wrong type: TypeError like fit(T=...)
        ({"n": 10.0}, TypeError, r"\bn\b"),   # wrong type: TypeError like fit(T=5.0)
        ({"seed": "x"}, TypeError, r"\bseed\b"),
        ({"seed": 1.5}, TypeError, r"\bseed\b"),
        ({"seed": -1}, ValueError, r"\bseed\b"),
    ],
    ids=_case_id,
)
def test_simulate_iv_rejects_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        simulate_iv(**{"n": 10, "p": 1, "q": 1, "seed": 0, **kwargs})


# ========================================================================================
# 13. Properties: random finite data never yields NaN or an unexpected exception
# ========================================================================================
# Messages that leak numpy/scipy internals instead of naming the problem.
_RAW_MESSAGE = re.compile(
    r"matmul|could not be broadcast|truth value of|math domain error|must have different signs|"
    r"Singular matrix|not positive definite|SVD did not converge|index \d+ is out of bounds|"
    r"Optimization bounds"
)
_ROUTES = [("private", "preconditioned"), ("bounds", "preconditioned"), ("data", "gd"), ("private", "gd")]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(3, 60),
    p_endog=st.integers(1, 2),
    extra_instruments=st.integers(0, 1),
    has_const=st.booleans(),
    has_w=st.booleans(),
    kinds=st.lists(st.sampled_from(["float", "float", "int", "bool"]), min_size=7, max_size=7),
    log_scales=st.lists(st.floats(-6.0, 6.0), min_size=7, max_size=7),
    data_seed=st.integers(0, 2**32 - 1),
    route=st.sampled_from(_ROUTES),
    use_bounds=st.booleans(),
    entry=st.sampled_from(["formula", "arrays"]),
)
def test_random_finite_data_gives_a_clear_error_or_finite_estimates(
    n, p_endog, extra_instruments, has_const, has_w, kinds, log_scales, data_seed, route, use_bounds, entry
):
    rng = np.random.default_rng(data_seed)
    q = p_endog + extra_instruments
    z = rng.standard_normal((n, q))
    u = rng.standard_normal(n)
    x = z[:, :p_endog] + 0.3 * z[:, -1:] + u[:, None] + rng.standard_normal((n, p_endog))
    w = rng.standard_normal(n)
    y = x.sum(axis=1) + 0.5 * w + u + rng.standard_normal(n)
    x_names = [f"x{j}" for j in range(p_endog)]
    z_names = [f"z{j}" for j in range(q)]
    columns = {"y": y, **dict(zip(x_names, x.T)), **dict(zip(z_names, z.T))}
    if has_w:
        columns["w"] = w
    data = pd.DataFrame(columns)
    for (name, values), kind, log_scale in zip(list(data.items()), kinds, log_scales):
        scaled = values * 10.0**log_scale
        if kind == "int":
            data[name] = scaled.round().astype(np.int64)
        elif kind == "bool":
            data[name] = values > 0
        else:
            data[name] = scaled
    exog_terms = (["1"] if has_const else []) + (["w"] if has_w else [])
    formula = f"y ~ {' + '.join(exog_terms) + ' + ' if exog_terms else ''}[{' + '.join(x_names)} ~ {' + '.join(z_names)}]"
    preprocess, method = route
    snapshot = copy.deepcopy(data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PrivacyLeakWarning)
            warnings.simplefilter("ignore", DroppedRowsWarning)
            if entry == "formula":
                model = DPIV2SLS.from_formula(formula, data)
            else:
                exog = pd.DataFrame(index=data.index)
                if has_const:
                    exog["const"] = 1.0
                if has_w:
                    exog["w"] = data["w"]
                model = DPIV2SLS(data["y"], exog if exog.shape[1] else None, data[x_names], data[z_names])
            bounds = None
            if use_bounds:
                d = model.design
                bounds = {}
                for block in (d.dependent, d.endog, d.instruments, d.exog):
                    for name in block.columns:
                        if name != d.constant_name:
                            m = float(np.abs(block[name]).max())
                            bounds[name] = (-2.0 * m - 1.0, 2.0 * m + 1.0)
            res = model.fit(rho1=1.0, rho2=1.0, T=5, seed=0, preprocess=preprocess, method=method, bounds=bounds)
    except (ValueError, TypeError, DivergenceError) as exc:  # DivergenceError names the step size and a value to try
        event(f"{type(exc).__name__}: {str(exc)[:40]}")
        assert not _RAW_MESSAGE.search(str(exc)), f"unclear error message: {type(exc).__name__}: {exc}"
    else:
        event("fitted")
        assert_finite(res)
    pd.testing.assert_frame_equal(data, snapshot, check_exact=True)


_EQUIV_SIM = simulate_iv(300, 1, 2, seed=5)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    log_sy=st.floats(-6.0, 6.0),
    log_sx=st.floats(-6.0, 6.0),
    log_sz=st.floats(-6.0, 6.0),
    preprocess=st.sampled_from(["private", "bounds", "data"]),
)
def test_rescaling_data_and_public_bounds_rescales_the_estimate(log_sy, log_sx, log_sz, preprocess):
    """Scales 1e-6 … 1e6: the working scale removes the units, so β scales exactly like 2SLS."""
    sy, sx, sz = 10.0**log_sy, 10.0**log_sx, 10.0**log_sz
    data, bounds = _EQUIV_SIM.data, _EQUIV_SIM.bounds
    factor = {"y": sy, "x1": sx, "z1": sz, "z2": sz}
    scaled = data.assign(**{c: data[c] * s for c, s in factor.items()})
    scaled_bounds = {c: (lo * factor[c], hi * factor[c]) for c, (lo, hi) in bounds.items()}
    formula = "y ~ 1 + [x1 ~ z1 + z2]"
    res = fit(DPIV2SLS.from_formula(formula, scaled), bounds=scaled_bounds, preprocess=preprocess)
    ref = fit(DPIV2SLS.from_formula(formula, data), bounds=bounds, preprocess=preprocess)
    assert_finite(res)
    expected = ref.params.to_numpy() * np.array([sy, sy / sx])
    np.testing.assert_allclose(res.params.to_numpy(), expected, rtol=1e-6)
