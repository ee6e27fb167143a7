"""From fit to paper: the publishable exports, the release record and side-by-side comparisons.

A publishable output holds private releases, their post-processing and public settings only: none of the
NON-PRIVATE benchmark's numbers, no non-private count and no row of data. The release record is standard JSON
that round-trips exactly.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
import warnings

import numpy as np
import pandas as pd
import pytest
from latex import compile_latex
from scipy import stats

from dpivreg import DPIV2SLS, FitRelease, PrivacyLeakWarning, compare, load_release, rho_from_epsilon
from dpivreg.reporting.comparison import DPIVComparison
from dpivreg.reporting.results import _fmt

N = 1500
F = "y ~ 1 + w + [x ~ z]"
BOUNDS = {"y": (-15.0, 15.0), "x": (-6.0, 6.0), "z": (-4.0, 4.0), "w": (-4.0, 4.0)}
FIT = dict(rho1=1.0, rho2=1.0, seed=3, bounds=BOUNDS)


def _frame(n: int = N, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    z, w, u = rng.standard_normal((3, n))
    x = np.clip(z + 0.5 * u + rng.standard_normal(n), -5.9, 5.9)
    y = np.clip(1 + 2 * x - w + u, -14.9, 14.9)
    # values with many digits, so that a row copied into an export would be found by its text
    return pd.DataFrame({"y": y, "x": x, "z": np.clip(z, -3.9, 3.9), "w": np.clip(w, -3.9, 3.9)})


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return _frame()


@pytest.fixture(scope="module")
def res(frame):
    return DPIV2SLS.from_formula(F, frame).fit(**FIT)


def _nonprivate_numbers(res) -> list[str]:
    """The benchmark's estimates and standard errors as the summary formats them."""
    bench = res.benchmark
    return [_fmt(v) for v in (*bench.params, *bench.std_errors)]


# ---------------------------------------------------------------------------------------- exports
def test_the_frame_holds_the_private_table_and_no_benchmark_by_default(res):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        table = res.to_frame()
    assert list(table.columns) == ["parameter", "std_error", "zstat", "pvalue", "lower", "upper"]
    assert list(table.index) == ["Intercept", "w", "x"]
    pd.testing.assert_series_equal(table["parameter"], res.params, check_names=False)
    pd.testing.assert_series_equal(table["std_error"], res.bse, check_names=False)
    pd.testing.assert_frame_equal(table[["lower", "upper"]], res.conf_int(), check_names=False)
    ninety = res.to_frame(level=0.9)
    assert (ninety["upper"] - ninety["lower"] < table["upper"] - table["lower"]).all()


def test_benchmark_columns_in_an_export_raise_a_privacy_leak_warning(res):
    with pytest.warns(PrivacyLeakWarning, match="NON-PRIVATE IV2SLS benchmark"):
        table = res.to_frame(benchmark=True)
    np.testing.assert_array_equal(table["IV2SLS (NON-PRIVATE)"], res.benchmark.params[table.index])
    np.testing.assert_array_equal(table["std_error (NON-PRIVATE)"], res.benchmark.std_errors[table.index])
    with pytest.warns(PrivacyLeakWarning) as caught:
        res.to_csv(benchmark=True)
    assert caught[0].filename == __file__  # the warning points at the caller's line


def test_markdown_and_csv_carry_the_budget_and_round_trip(res, tmp_path):
    md = res.to_markdown()
    assert md.splitlines()[0].startswith("| regressor")
    assert f"rho = {_fmt(res.privacy.rho)} (zCDP)" in md and f"n = {res.nobs}" in md
    assert "NON-PRIVATE" not in md and "IV2SLS" not in md
    # the IV tests follow the table as comment lines (tests/test_iv_reporting.py): read with comment="#"
    back = pd.read_csv(io.StringIO(res.to_csv()), index_col=0, comment="#")
    pd.testing.assert_frame_equal(back, res.to_frame(), check_exact=True)
    res.to_csv(tmp_path / "table.csv")
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "table.csv", index_col=0, comment="#"), res.to_frame())


def test_publishable_outputs_hold_no_nonprivate_number(res):
    """The benchmark's numbers appear in the validation summary and in none of the publishable outputs."""
    full = res.summary().as_text()
    hidden = _nonprivate_numbers(res)
    assert all(s in full for s in hidden)  # the check can fail: the numbers are there when asked for
    smry = res.summary(benchmark=False)
    for text in (smry.as_text(), smry.as_latex(), smry.as_html(), res.to_markdown()):
        assert not [s for s in hidden if s in text]
        assert "non-private count" not in text


def test_the_publishable_latex_compiles_and_holds_no_nonprivate_number(res, tmp_path):
    tex = res.summary(benchmark=False).as_latex()
    assert not [s for s in _nonprivate_numbers(res) if s in tex]
    compile_latex(tex, tmp_path, "publishable")


def test_export_arguments_are_checked(res):
    with pytest.raises(TypeError, match="benchmark"):
        res.to_frame(benchmark="no")
    with pytest.raises(ValueError, match="level"):
        res.to_markdown(level=95)


def test_a_fit_without_inference_exports_its_estimate(frame):
    res = DPIV2SLS.from_formula(F, frame).fit(**FIT, inference=False)
    assert list(res.to_frame().columns) == ["parameter"]
    record = FitRelease.from_json(res.release().to_json())
    assert record.cov is None and record.bse.isna().all()
    assert record.equals(res.release())


# ---------------------------------------------------------------------------------------- the release record
def test_the_release_round_trips_exactly(res, tmp_path):
    record = res.release()
    back = FitRelease.from_json(record.to_json())
    assert back.equals(record)
    pd.testing.assert_series_equal(back.params, res.params, check_exact=True, check_names=False)
    pd.testing.assert_frame_equal(back.cov, res.cov_params(), check_exact=True)
    pd.testing.assert_frame_equal(back.path, res.path, check_exact=True)
    np.testing.assert_array_equal(back.first_stage_path, res.first_stage_path)
    assert back.privacy.rho == res.privacy.rho and back.epsilon == res.epsilon
    assert back.privacy.epsilon(1e-8) == res.privacy.epsilon(1e-8)  # the accountant's releases, not a number
    assert back.settings["T"] == res.settings.T and back.settings["cov_type"] == "robust"
    pd.testing.assert_frame_equal(back.conf_int(), res.conf_int(), check_exact=True)
    record.save(tmp_path / "fit.json")
    assert load_release(tmp_path / "fit.json").equals(record)


def test_the_release_is_standard_json_with_named_fields(res):
    text = res.release().to_json()

    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")

    data = json.loads(text, parse_constant=refuse)
    assert set(data) == {
        "format", "dependent", "formula", "endog_names", "instrument_names", "exog_names", "regressor_names", "nobs",
        "estimator", "params", "std_errors", "conf_int_95", "cov", "cov_type", "path", "first_stage_path", "releases",
        "budget_asked", "rho", "sampler", "delta", "epsilon", "settings", "scaling", "leaks", "inference_note",
        "version", "created", "unit", "cautions", "iv_tests", "digest"}  # "sampler": where the noise came from (issue
    # 40), also in each release's grid; "iv_tests": the IV tests (issue 41); "digest": the SHA-256 of every other field,
    # checked when read
    assert data["scaling"]["x"] == {"centre": 0.0, "scale": 6.0, "source": "bounds"}


def test_the_release_holds_no_row_of_data(frame):
    """Its size does not grow with n, and no value of the data appears in it."""
    small = DPIV2SLS.from_formula(F, frame).fit(**FIT, T=4).release().to_json()
    large_frame = _frame(10 * N, seed=1)
    large = DPIV2SLS.from_formula(F, large_frame).fit(**FIT, T=4).release().to_json()
    assert abs(len(large) - len(small)) < 200  # a digit or two more in n and in the numbers, not rows
    for value in large_frame.to_numpy().ravel()[:2000]:
        assert repr(float(value))[:12] not in large


def test_a_non_private_fit_records_infinity_as_text(frame):
    with pytest.warns(PrivacyLeakWarning):
        res = DPIV2SLS.from_formula(F, frame).fit(**{**FIT, "rho1": math.inf})
    with pytest.warns(PrivacyLeakWarning, match="privacy leaks"):
        record = res.release()
    data = json.loads(record.to_json())
    assert data["rho"] == "inf" and data["leaks"]
    back = FitRelease.from_json(record.to_json())
    assert back.privacy.rho == math.inf and not back.is_private and back.equals(record)


@pytest.mark.parametrize("text, match", [
    ("not json", "invalid JSON"),
    ('{"format": "something else"}', "format"),
    ("[1, 2]", "format"),
])
def test_a_file_that_is_not_a_record_is_refused(text, match):
    with pytest.raises(ValueError, match=match):
        FitRelease.from_json(text)


def test_load_release_names_a_missing_file(tmp_path):
    with pytest.raises(ValueError, match="no release record"):
        load_release(tmp_path / "absent.json")


# ---------------------------------------------------------------------------------------- compare
@pytest.fixture(scope="module")
def three(frame, res):
    model = DPIV2SLS.from_formula(F, frame)
    other = DPIV2SLS.from_formula("y ~ 1 + [x ~ z]", frame)
    return {"rho = 2.6": res, "rho = 0.5": model.fit(rho=0.5, bounds=BOUNDS, seed=4),
            "no w": other.fit(rho=2.6, bounds=BOUNDS, seed=5)}


def test_compare_prints_three_fits_and_the_benchmark(three):
    cmp = compare(three)
    assert isinstance(cmp, DPIVComparison)
    text = str(cmp.summary)
    header = text.splitlines()[2]
    for name in three:
        assert name in header
    assert "NON-PRIVATE IV2SLS (rho = 2.6)" in header and "NON-PRIVATE IV2SLS (no w)" in header
    assert list(cmp.params.columns) == list(three)
    assert list(cmp.params.index) == ["Intercept", "w", "x"]
    assert np.isnan(cmp.params.loc["w", "no w"])
    np.testing.assert_array_equal(cmp.std_errors["rho = 0.5"], three["rho = 0.5"].bse)
    np.testing.assert_array_equal(cmp.rho, [r.privacy.rho for r in three.values()])
    bench = cmp.benchmark_params
    np.testing.assert_array_equal(bench["NON-PRIVATE IV2SLS (rho = 2.6)"], three["rho = 2.6"].benchmark.params)
    for name, fit in three.items():
        assert _fmt(fit.params["x"]) in text and f"({_fmt(fit.bse['x'])})" in text


def test_compare_without_benchmark_is_publishable(three, tmp_path):
    cmp = compare(three, benchmark=False, stars=True)
    text = cmp.summary.as_text()
    assert "IV2SLS" not in text and "NON-PRIVATE" not in text
    hidden = [s for fit in three.values() for s in _nonprivate_numbers(fit)]
    assert not [s for s in hidden if s in text]
    assert "***" in text  # x is strongly significant in every fit
    compile_latex(cmp.summary.as_latex(), tmp_path, "compare")
    assert "<table" in cmp._repr_html_()


def test_compare_takes_a_list_and_saved_releases(three, frame, tmp_path):
    three["rho = 2.6"].release().save(tmp_path / "a.json")
    loaded = load_release(tmp_path / "a.json")
    no_inference = DPIV2SLS.from_formula(F, frame).fit(**FIT, inference=False)
    cmp = compare([loaded, three["rho = 0.5"], no_inference], precision="tstats")
    assert list(cmp.params.columns) == ["Model 0", "Model 1", "Model 2"]
    np.testing.assert_array_equal(cmp.params["Model 0"], three["rho = 2.6"].params)
    assert cmp.std_errors["Model 2"].isna().all()
    assert "NON-PRIVATE IV2SLS" in str(cmp)  # one benchmark: the two DPIVResults share the design


@pytest.mark.parametrize("args, kwargs, error, match", [
    (({},), {}, ValueError, "empty"),
    (("fit",), {}, TypeError, "dict"),
    (([1.0],), {}, TypeError, "not a dpivreg fit"),
])
def test_compare_refuses_what_is_not_a_fit(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        compare(*args, **kwargs)


def test_compare_checks_its_options(three):
    with pytest.raises(ValueError, match="precision"):
        compare(three, precision="se")
    with pytest.raises(TypeError, match="stars"):
        compare(three, stars="yes")


def test_fits_of_other_data_with_the_same_formula_and_n_get_their_own_benchmark(res):
    """A formula and n do not identify the data: another frame of the same shape gets its own column."""
    other = DPIV2SLS.from_formula(F, _frame(seed=7)).fit(**FIT)
    cmp = compare({"a": res, "b": other})
    assert list(cmp.benchmark_params.columns) == ["NON-PRIVATE IV2SLS (a)", "NON-PRIVATE IV2SLS (b)"]
    assert not np.allclose(cmp.benchmark_params.iloc[:, 0], cmp.benchmark_params.iloc[:, 1])


def test_a_dask_fit_exports_and_shares_the_in_memory_benchmark(frame, res):
    dd = pytest.importorskip("dask.dataframe")
    fit = DPIV2SLS.from_formula(F, dd.from_pandas(frame, npartitions=3)).fit(**FIT)
    record = fit.release()
    assert FitRelease.from_json(record.to_json()).equals(record)
    cmp = compare({"memory": res, "dask": fit})
    # the benchmark from cross-products agrees to the last bits or nearly so; one or two columns, never wrong ones
    for column in cmp.benchmark_params:
        np.testing.assert_allclose(cmp.benchmark_params[column], res.benchmark.params, rtol=1e-10)


# ---------------------------------------------------------------------------------------- after the review
def test_a_loaded_record_exports_its_own_table(res):
    record = FitRelease.from_json(res.release().to_json())
    pd.testing.assert_frame_equal(record.to_frame(), res.to_frame(), check_exact=True)
    assert record.to_markdown() == res.to_markdown()
    pd.testing.assert_frame_equal(record.cov_params(), res.cov_params(), check_exact=True)
    pd.testing.assert_frame_equal(record.conf_int(level=0.9), res.conf_int(level=0.9), check_exact=True)
    with pytest.raises(ValueError, match="no benchmark"):
        record.to_frame(benchmark=True)


def test_records_made_at_different_times_are_equal(res):
    first = res.release()
    second = FitRelease.from_json(dataclasses.replace(first, created="2000-01-01T00:00:00+00:00").to_json())
    assert first.equals(second)
    with pytest.raises(ValueError, match="do not match its digest"):  # the time is a field too: not to be edited
        FitRelease.from_json(first.to_json().replace(first.created, "2000-01-01T00:00:00+00:00"))


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.pop("params"), "'params' is missing"),
    (lambda d: d.update(scaling=[1]), "must be objects"),
    (lambda d: d.update(nobs=1500.7), "positive integer"),
    (lambda d: d.update(leaks="abc"), "list of messages"),
    (lambda d: d.update(epsilon=0.1), "'epsilon' does not follow"),
    (lambda d: d.update(rho=0.0001), "'rho' does not follow"),
    (lambda d: d.update(params=[1.0]), "not a valid"),
    (lambda d: d["releases"][0].update(rho=-1.0), "'rho' does not follow|negative"),
])
def test_an_edited_or_broken_record_is_refused(res, edit, match):
    data = json.loads(res.release().to_json())
    edit(data)
    with pytest.raises(ValueError, match=match):
        FitRelease.from_json(json.dumps(data))


def test_non_standard_json_tokens_are_refused(res):
    text = res.release().to_json().replace('"cov_type": "robust"', '"cov_type": NaN')
    with pytest.raises(ValueError, match="non-standard JSON token NaN"):
        FitRelease.from_json(text)


def test_exact_data_moments_are_recorded_as_not_private(frame):
    """preprocess='data' with noisy moments is IV2SLS under another name: the record must say rho = inf."""
    with pytest.warns(PrivacyLeakWarning):
        res = DPIV2SLS.from_formula(F, frame).fit(**FIT, method="moments", preprocess="data")
    assert math.isinf(res.privacy.rho) and math.isinf(res.epsilon) and not res.is_private
    with pytest.warns(PrivacyLeakWarning):
        record = res.release()
    assert json.loads(record.to_json())["rho"] == "inf"
    with pytest.warns(PrivacyLeakWarning, match="privacy leaks"):
        text = res.to_markdown()
    assert "rho = inf" in text and "PRIVACY LEAKS" in text
    with pytest.warns(PrivacyLeakWarning, match="do not publish it"):
        res.summary(benchmark=False)


def test_step_sizes_from_the_data_are_not_copied_into_the_record(frame):
    with pytest.warns(PrivacyLeakWarning):
        res = DPIV2SLS.from_formula(F, frame).fit(**FIT, method="gd", init="zero", T=5)
    assert res.settings.eta_source == "data"
    with pytest.warns(PrivacyLeakWarning):
        settings = res.release().settings
    assert settings["eta"] == settings["alpha"] == "data (not recorded)"
    assert repr(res.settings.eta)[:10] not in res.release().to_json()


def test_compare_warns_of_leaky_fits_and_refuses_clashing_names(three, frame):
    with pytest.warns(PrivacyLeakWarning):
        leaky = DPIV2SLS.from_formula(F, frame).fit(**{**FIT, "rho1": math.inf})
    with pytest.warns(PrivacyLeakWarning, match="leaky"):
        compare({"ok": three["rho = 2.6"], "leaky": leaky}, benchmark=False)
    with pytest.raises(ValueError, match="same once written as text"):
        compare({1: three["rho = 2.6"], "1": three["rho = 0.5"]})


def test_compare_shows_the_instruments_and_reads_linearmodels_spellings(three):
    text = str(compare(three, precision="T-Stats").summary)
    row = next(line for line in text.splitlines() if line.startswith("Instruments"))
    assert row.split() == ["Instruments"] + ["z"] * 5  # three fits and two benchmark columns
    assert f"({_fmt(three['rho = 2.6'].tvalues['x'], 4)})" in text


# ---------------------------------------------------------------------------------------- conf_int without traps
@pytest.mark.parametrize("level", [0.5, 0.9, 0.95, 0.99])
def test_conf_int_takes_linearmodels_positional_level(res, level):
    """conf_int(0.9) is a 90% interval, as in linearmodels: half-width z_(0.95)·bse (the reference quantile
    written out), and statsmodels' alpha= keyword gives the same interval."""
    ci = res.conf_int(level)
    z = {0.5: 0.6744897501960817, 0.9: 1.6448536269514722, 0.95: 1.959963984540054, 0.99: 2.5758293035489004}[level]
    np.testing.assert_allclose((ci["upper"] - ci["lower"]).to_numpy(), 2 * z * res.bse.to_numpy(), rtol=1e-12)
    pd.testing.assert_frame_equal(ci, res.conf_int(alpha=1 - level))
    pd.testing.assert_frame_equal(ci, res.conf_int(level=level))
    if level == 0.95:
        pd.testing.assert_frame_equal(ci, res.conf_int())


@pytest.mark.parametrize("level", [0.3, 0.05])
def test_a_level_below_one_half_by_keyword_is_a_level(res, level):
    """Only a positional value below 0.5 is refused (it reads as an alpha); level= means what it says, in conf_int
    and in the exports."""
    ci = res.conf_int(level=level)
    np.testing.assert_allclose((ci["upper"] - ci["lower"]).to_numpy(),
                               2 * stats.norm.ppf(0.5 + level / 2) * res.bse.to_numpy(), rtol=1e-12)
    table = res.to_frame(level=level)
    np.testing.assert_allclose(table["lower"].to_numpy(), ci["lower"].to_numpy(), rtol=1e-12)


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.01])
def test_a_positional_alpha_is_refused_not_silently_inverted(res, alpha):
    with pytest.raises(ValueError, match=rf"reads as statsmodels' alpha.*conf_int\({1 - alpha:g}\) or conf_int\(alpha"):
        res.conf_int(alpha)


def test_conf_int_arguments_are_checked(res):
    with pytest.raises(TypeError, match="pass the level once"):
        res.conf_int(0.9, alpha=0.1)
    with pytest.raises(TypeError, match="not both"):
        res.conf_int(level=0.9, alpha=0.1)
    for bad in (1.0, 0.0, True, "0.9"):
        with pytest.raises(ValueError, match="level must lie"):
            res.conf_int(bad)
        with pytest.raises(ValueError, match="alpha must lie"):
            res.conf_int(alpha=bad)


# ---------------------------------------------------------------------------------------- budgets in epsilon
@pytest.mark.parametrize("options", [{}, {"method": "moments"}, {"cov_type": "unadjusted"}])
def test_a_fit_given_epsilon_spends_it_at_delta(frame, options):
    """fit(epsilon=1, delta=1e-5) spends ε in [0.95, 1] at δ = 1e-5 (exact Gaussian profile): its total ρ is
    rho_from_epsilon's, split by the default shares, and the summary's budget block shows ε, δ and that ρ."""
    res = DPIV2SLS.from_formula(F, frame).fit(epsilon=1.0, delta=1e-5, seed=3, bounds=BOUNDS, **options)
    assert 0.95 <= res.privacy.epsilon(1e-5) <= 1.0
    assert res.privacy.rho == pytest.approx(rho_from_epsilon(1.0, 1e-5), rel=1e-9)
    text = res.summary(benchmark=False).as_text()
    assert re.search(r"delta:\s+1e-05", text) and re.search(r"epsilon \(exact Gauss\.\):\s+1\b", text)
    assert re.search(r"Total rho \(spent\):\s+0\.0359", text)


def test_epsilon_and_rho_together_are_refused(frame):
    model = DPIV2SLS.from_formula(F, frame)
    for other in ({"rho": 1.0}, {"rho1": 1.0, "rho2": 1.0}, {"rho0": 0.1}):
        with pytest.raises(ValueError, match=r"pass the budget once: epsilon="):
            model.fit(epsilon=1.0, bounds=BOUNDS, seed=3, **other)
    with pytest.raises(ValueError, match="epsilon must be positive"):
        model.fit(epsilon=0.0, bounds=BOUNDS, seed=3)


# ---------------------------------------------------------------------------------------- interop
def test_statsmodels_summary_col_takes_the_private_results(res, frame):
    """summary_col reads params, bse and p-values (and calls conf_int(0.05) positionally, statsmodels' alpha):
    the table holds the private estimates and standard errors, one column per fit."""
    from statsmodels.iolib.summary2 import summary_col

    other = DPIV2SLS.from_formula("y ~ 1 + [x ~ z]", frame).fit(**FIT)
    table = summary_col([res, other], float_format="%.4f").tables[0]
    assert list(table.columns) == ["y I", "y II"]
    assert table.loc["x", "y I"].strip() == f"{res.params['x']:.4f}"
    assert f"({res.bse['x']:.4f})" in table["y I"].tolist()
    assert table.loc["w", "y II"].strip() == ""  # not in the second model
    with pytest.raises(ValueError, match="reads as statsmodels' alpha"):
        res.conf_int(0.05)  # the user's own positional alpha is still refused


def test_a_loaded_release_has_the_publishable_summary(res, tmp_path):
    res.release().save(tmp_path / "fit.json")
    record = load_release(tmp_path / "fit.json")
    text = record.summary().as_text()
    assert "release record" in text and "Total rho (spent)" in text
    for name in res.params.index:
        assert re.search(rf"{re.escape(name)}\s+{re.escape(_fmt(res.params[name]))}\s", text)
    assert "IV2SLS" not in text  # no benchmark in a record
    assert str(record.summary) == str(record.summary())
    with pytest.raises(ValueError, match="holds no NON-PRIVATE benchmark"):
        record.summary(benchmark=True)


def test_the_summary_is_printable_as_an_attribute_and_callable(res):
    assert str(res.summary) == str(res.summary())
    assert repr(res.summary) == res.summary().as_text()
    assert res.summary.as_latex() == res.summary().as_latex()
    assert res.summary(benchmark=False).as_text() != res.summary().as_text()


@pytest.mark.parametrize("spec", ["x = 0", ["x = 0"], {"x": 0}])
def test_t_test_and_wald_test_take_statsmodels_positional_strings(res, spec):
    assert float(res.t_test(spec).pvalue) == pytest.approx(res.pvalues["x"], rel=1e-9)
    assert res.wald_test(spec).pval == pytest.approx(res.wald_test(formula="x = 0").pval, rel=1e-12)
    assert res.wald_test("x = 0, w = 0").df == 2


# ---------------------------------------------------------------------------------------- cautions travel
@pytest.fixture(scope="module")
def weak(frame):
    """A fit whose instrument is weak: the summary says WEAK INSTRUMENTS (computed from the moment release)."""
    data = frame.assign(z=np.random.default_rng(9).standard_normal(len(frame)).clip(-3.9, 3.9))
    res = DPIV2SLS.from_formula(F, data).fit(**FIT)
    assert any(c.startswith("WEAK INSTRUMENTS") for c in res.cautions)
    return res


def test_cautions_travel_with_every_export(weak, tmp_path):
    first = weak.cautions[0]
    assert first[:60] in weak.summary(benchmark=False).as_text()
    assert first in weak.to_markdown()
    csv = weak.to_csv()
    assert f"# {first}" in csv
    back = pd.read_csv(io.StringIO(csv), index_col=0, comment="#")
    pd.testing.assert_frame_equal(back, weak.to_frame(), check_exact=True)
    assert weak.to_frame().attrs["cautions"] == list(weak.cautions)
    weak.release().save(tmp_path / "weak.json")
    record = load_release(tmp_path / "weak.json")
    assert record.cautions == weak.cautions and first in record.to_markdown()
    assert first[:60] in record.summary().as_text()
    assert f"weak: {first}"[:70] in compare({"weak": weak}, benchmark=False).summary.as_text().replace("\n", " ")


def test_a_fit_without_cautions_exports_plain_csv(res, frame):
    """A fit without cautions or leaks: the only comment lines are its IV tests; without the moment release (no IV
    test either) the CSV is plain."""
    comments = res.to_csv().splitlines()[len(res.params) + 1:]  # after the header and a line per coefficient
    assert res.cautions == () and comments[0] == "# IV tests (post-processing of the releases), as CSV:"
    assert len(comments) == 2 + len(res.iv_tests) and list(res.iv_tests.index) == [
        "Wooldridge exogeneity (robust)", "Wu-Hausman exogeneity", "Durbin exogeneity", "Effective F (MOP)"]
    bounds_only = DPIV2SLS.from_formula(F, frame).fit(**FIT, preprocess="bounds", inference=False)
    assert bounds_only.cautions == () and bounds_only.iv_tests.empty and "#" not in bounds_only.to_csv()


@pytest.mark.parametrize("export", ["as_latex", "as_html", "as_csv"])
def test_exporting_the_benchmark_in_any_paper_format_warns(res, three, export):
    with pytest.warns(PrivacyLeakWarning, match="NON-PRIVATE IV2SLS benchmark"):
        getattr(res.summary(), export)()
    with pytest.warns(PrivacyLeakWarning, match="NON-PRIVATE IV2SLS benchmark"):
        getattr(compare(three).summary, export)()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        getattr(res.summary(benchmark=False), export)()
        getattr(compare(three, benchmark=False).summary, export)()
        res.summary().as_text()  # the data holder's validation view
