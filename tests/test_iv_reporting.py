"""The IV tests in the summary and every export (issue 41, item 5): ``res.iv_tests`` (one row per test that applies),
the summary's IV tests block (text, LaTeX within the text width, HTML), the Markdown and CSV tables,
``to_frame().attrs``, the release record (in its digest) and ``compare``; and the WEAK INSTRUMENTS note, which uses the
effective F against Montiel Olea and Pflueger's critical value when the fit released the first stage's meat.

Every number is matched against ``res.iv_tests`` (itself against the test objects ``res.sargan`` and friends, which
tests/test_iv_tests.py checks against linearmodels). The fits are small (n = 5,000; the weak-instrument ones 20,000).
"""

from __future__ import annotations

import io
import json
import math
import warnings

import numpy as np
import pandas as pd
import pytest
from latex import ARTICLE, compile_latex, overfull_hboxes

from dpivreg import DPIV2SLS, FitRelease, PrivacyLeakWarning, compare, load_release
from dpivreg.reporting.release import record_digest
from dpivreg.reporting.summary import WEAK_F
from dpivreg.reporting.tables import IV_TEST_COLUMNS, format_number, iv_test_frame

N = 5000
BOUNDS = {c: (-8.0, 8.0) for c in ("y", "x", "x2", "w", "z1", "z2", "z3")}
OVER = "y ~ 1 + w + [x ~ z1 + z2]"
JUST = "y ~ 1 + w + [x ~ z1]"
ROWS = ["Wooldridge overid (robust)", "Sargan overid", "Wooldridge exogeneity (robust)", "Wu-Hausman exogeneity",
        "Durbin exogeneity", "Effective F (MOP)"]
HOMOSKEDASTIC = ["Sargan overid", "Wu-Hausman exogeneity", "Durbin exogeneity"]
TITLE = "IV tests (private: post-processing of releases)"


def _frame(n: int = N, seed: int = 5) -> pd.DataFrame:
    """Valid instruments, an endogenous x (its first-stage error in the outcome's), heteroskedastic errors."""
    rng = np.random.default_rng(seed)
    z1, z2, z3, w, v, v2, e = rng.standard_normal((7, n))
    x = 0.5 * z1 + 0.4 * z2 + 0.3 * w + v
    x2 = 0.4 * z1 - 0.3 * z2 + 0.6 * z3 + v2
    u = (0.6 * v + e) * np.exp(0.3 * z1)
    return pd.DataFrame({"y": 1 + 0.5 * x + 0.3 * w + u, "x": x, "x2": x2, "w": w, "z1": z1, "z2": z2, "z3": z3})


def _fit(formula: str, frame: pd.DataFrame, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # unreliable-SE and unused-bounds warnings: not tested here
        return DPIV2SLS.from_formula(formula, frame).fit(**{"rho": 2.0, "seed": 3, "bounds": BOUNDS, **kw})


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return _frame()


@pytest.fixture(scope="module")
def over(frame):
    """Over-identified, robust standard errors and the first stage's meat: every test applies."""
    return _fit(OVER, frame, rho_diag=0.2)


@pytest.fixture(scope="module")
def just(frame):
    """Exactly identified, without the diagnostics' meats (rho_diag=0): the homoskedastic endogeneity tests only."""
    return _fit(JUST, frame, rho_diag=0)


def _cells(line: str) -> list[str]:
    """The cells of a Markdown table row."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


# ---------------------------------------------------------------------------------------- the table
def test_a_row_per_test_that_applies_in_order_with_the_tests_numbers(over):
    table = over.iv_tests
    assert list(table.index) == ROWS and table.index.name == "test"
    assert list(table.columns) == ["statistic", "pval", "dist", "lower", "upper", "critical_value", "cost", "null"]
    tests = [over.wooldridge_overid, over.sargan, over.wooldridge_score, over.wu_hausman(), over.durbin()]
    for name, test in zip(ROWS, tests):
        row = table.loc[name]
        assert (row["statistic"], row["pval"], row["lower"], row["upper"]) == (test.stat, test.pval, test.lower,
                                                                               test.upper)
        assert (row["dist"], row["cost"], row["null"]) == (test.dist_name, test.cost, test.null)
        assert math.isnan(row["critical_value"])
    effective = over.effective_f
    row = table.loc["Effective F (MOP)"]
    assert (row["statistic"], row["lower"], row["upper"], row["critical_value"]) == (
        effective.stat, effective.lower, effective.upper, effective.critical_value)
    assert math.isnan(row["pval"]) and row["dist"] == "" and row["cost"] == effective.cost
    assert "rho_diag" in row["cost"] and table.loc["Sargan overid", "cost"].startswith("free")


def test_tests_that_do_not_apply_are_left_out(frame, just):
    assert list(just.iv_tests.index) == ["Wu-Hausman exogeneity", "Durbin exogeneity"]  # exactly identified
    # by default (robust errors) the diagnostics' meats add the robust endogeneity test and the effective F
    assert list(_fit(JUST, frame).iv_tests.index) == ["Wooldridge exogeneity (robust)", "Wu-Hausman exogeneity",
                                                      "Durbin exogeneity", "Effective F (MOP)"]
    text = just.summary(benchmark=False).as_text()
    assert "overid" not in text and "Crit. value" not in text  # no effective F: no column for its critical value
    unadjusted = _fit(OVER, frame, cov_type="unadjusted")  # no robust meat, no first-stage meat
    assert list(unadjusted.iv_tests.index) == ["Sargan overid", "Wu-Hausman exogeneity", "Durbin exogeneity"]
    two = _fit("y ~ 1 + [x + x2 ~ z1 + z2 + z3]", frame, rho_diag=0.2)  # the effective F is for one regressor
    assert list(two.iv_tests.index) == ROWS[:5]
    assert two.iv_tests.loc["Wooldridge exogeneity (robust)", "dist"] == "chi2(2)"
    assert two.iv_tests.loc["Wu-Hausman exogeneity", "dist"] == two.wu_hausman().dist_name == "F(2,4995)"
    bounds_only = _fit(OVER, frame, preprocess="bounds", inference=False)  # no moment release: no test
    assert bounds_only.iv_tests.empty and list(bounds_only.iv_tests.columns) == list(IV_TEST_COLUMNS)
    assert "IV tests" not in bounds_only.summary(benchmark=False).as_text()
    assert "IV tests" not in bounds_only.to_markdown() and "#" not in bounds_only.to_csv()


def test_clustered_errors_give_the_cluster_robust_test(frame):
    clustered = frame.assign(g=np.arange(len(frame)) % 250)  # a public grouping of the rows: 250 clusters of 20
    res = _fit(OVER, clustered, clusters="g", rho_diag=0)
    assert res.cov_type == "clustered" and list(res.iv_tests.index) == ["Wooldridge overid (cluster-robust)",
                                                                        *HOMOSKEDASTIC]
    assert res.iv_tests.iloc[0]["statistic"] == res.wooldridge_overid.stat
    assert "(cluster-robust)" in res.wooldridge_overid.name
    assert "correlation within clusters" in res.summary(benchmark=False).as_text()
    table = compare({"g": res}, benchmark=False).summary.as_text()
    assert f"{res.wooldridge_overid.pval:.4f} (cluster-robust)" in table


def test_the_robust_endogeneity_row_follows_its_meat(frame):
    """The endogeneity test's meat is clustered with clustered errors, and bought by rho_diag even without the fit's
    own inference: the row, its kind and compare's row follow the meat, not the standard errors' cov_type."""
    clustered = frame.assign(g=np.arange(len(frame)) % 250)
    res = _fit(OVER, clustered, clusters="g", rho_diag=0.2)
    assert list(res.iv_tests.index) == ["Wooldridge overid (cluster-robust)", "Sargan overid",
                                        "Wooldridge exogeneity (cluster-robust)", *HOMOSKEDASTIC[1:],
                                        "Effective F (MOP)"]
    assert "(cluster-robust)" in res.wooldridge_score.name
    text = res.summary(benchmark=False).as_text()
    assert ("Wooldridge's over-identification and exogeneity score tests are robust to heteroskedasticity and to "
            "correlation within clusters") in " ".join(text.split())
    no_inference = _fit(OVER, clustered, clusters="g", rho_diag=0.2, inference=False)
    assert no_inference.cov_type == "none" and "Wooldridge exogeneity (cluster-robust)" in no_inference.iv_tests.index
    assert "(cluster-robust)" in no_inference.wooldridge_score.name
    both = compare({"g": res, "robust": _fit(OVER, frame, rho_diag=0.2)}, benchmark=False)
    brief = both.iv_tests
    assert list(brief["robust_endogeneity_test"]) == ["cluster-robust", "robust"]
    assert brief.loc["g", "robust_endogeneity_pval"] == res.wooldridge_score.pval
    assert f"{res.wooldridge_score.pval:.4f} (cluster-robust)" in both.summary.as_text()


def test_the_clustered_note_names_the_statistics_that_assume_independent_rows(frame):
    """With several endogenous regressors the clustered summary qualifies the Cragg-Donald statistic (no
    Anderson-Rubin set, no effective F: the review found the note naming them); with one, the Anderson-Rubin set."""
    clustered = frame.assign(g=np.arange(len(frame)) % 250)
    two = " ".join(_fit("y ~ 1 + [x + x2 ~ z1 + z2 + z3]", clustered, clusters="g").summary(benchmark=False)
                   .as_text().split())
    assert "The Cragg-Donald statistic assumes independent, homoskedastic rows" in two
    assert "Anderson-Rubin set assumes" not in two and "effective F above" not in two
    one = " ".join(_fit(OVER, clustered, clusters="g").summary(benchmark=False).as_text().split())
    assert "The Anderson-Rubin set assumes independent rows" in one and "effective F above are clustered" in one
    assert "robust to heteroskedasticity and within-cluster correlation" in one


def test_the_table_and_its_exports_are_post_processing(frame, monkeypatch):
    """With the design's row accessors set to raise, the table, the summary and every export still come, and the
    budget is what it was (the pattern of tests/test_iv_tests.py)."""
    res = _fit(OVER, frame, rho_diag=0.2)
    spent = res.privacy.rho

    def forbidden(*args, **kwargs):
        raise AssertionError("an IV-tests report read the data")

    for name in ("row_block", "blockwise_sum", "map_blocks"):
        if hasattr(type(res.design), name):
            monkeypatch.setattr(type(res.design), name, forbidden)
    for name in ("column_range", "factor", "values"):
        monkeypatch.setattr(type(res.design), name, property(forbidden), raising=False)
    assert list(res.iv_tests.index) == ROWS and res.iv_tests[["statistic", "lower", "upper"]].notna().all(axis=None)
    assert TITLE in res.summary(benchmark=False).as_text()
    for export in (res.to_markdown(), res.to_csv(), res.release().to_json(),
                   compare({"a": res}, benchmark=False).summary.as_text()):
        assert "Wu-Hausman" in export
    assert res.privacy.rho == spent


# ---------------------------------------------------------------------------------------- the summary
def test_the_summary_block_in_text_and_html(over):
    table = over.iv_tests
    text = over.summary(benchmark=False).as_text()
    assert text.index("First-stage diagnostics") < text.index(TITLE) < text.index("Error bound components")
    lines = text.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("Statistic"))
    assert header.split() == ["Statistic", "95%", "(noise)", "P-value", "Crit.", "value", "Dist.", "Cost"]
    html = over.summary(benchmark=False).as_html()
    assert f"<caption>{TITLE}</caption>" in html
    for name, row in table.iterrows():
        line = next(line for line in lines if line.startswith(name))
        interval = f"[{format_number(row['lower'])}, {format_number(row['upper'])}]"
        expected = [format_number(row["statistic"]), interval]
        expected += [format_number(row["critical_value"])] if name == "Effective F (MOP)" else [f"{row['pval']:.4f}",
                                                                                              row["dist"]]
        assert all(cell in line for cell in expected), (line, expected)
        assert f"<th>{name}</th>" in html and all(f"<td>{cell}</td>" in html for cell in expected)
    assert "free (moment release, rho0)" in text and "rho_diag (first-stage meat)" in text
    assert "free (moment release, ρ<sub>0</sub>)" in html  # the budgets as mathematics
    note = next(line for line in lines if line.startswith("IV tests: each p-value"))
    assert f"here {format_number(table.loc['Effective F (MOP)', 'critical_value'])}" in note
    full = over.summary().as_text()  # the validation view holds the same block
    assert text[text.index(TITLE):text.index("Error bound")] == full[full.index(TITLE):full.index("Error bound")]


@pytest.mark.parametrize("which", ["fit", "record"])
def test_the_latex_compiles_within_the_text_width(over, which, tmp_path):
    summary = over.summary(benchmark=False) if which == "fit" else over.release().summary()
    tex = summary.as_latex()
    assert r"\textbf{Effective F (MOP)}" in tex and r"$\rho_{\mathrm{diag}}$ (first-stage meat)" in tex
    assert f"[{format_number(over.iv_tests.loc['Sargan overid', 'lower'])}," in tex
    pdf = compile_latex(tex, tmp_path, f"iv_tests_{which}", preamble=ARTICLE)
    assert overfull_hboxes(pdf) == []


def test_exact_moments_are_labelled_not_private(frame):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exact = _fit(OVER, frame, rho=math.inf, rho_diag=math.inf, method="moments")
        record = exact.release()
    assert list(exact.iv_tests.index) == ROWS
    for text in (exact.summary().as_text(), record.summary().as_text()):
        assert "IV tests (from exact moments: NOT private)" in text and TITLE not in text
        assert "p-values against the law under Dist. (exact moments: no privacy noise)" in text
    row = exact.iv_tests.loc["Sargan overid"]
    assert row["lower"] == row["upper"] == row["statistic"]  # no noise: a point
    assert row["pval"] == exact.sargan.dist.sf(row["statistic"])


# ---------------------------------------------------------------------------------------- the exports
def test_the_markdown_has_an_iv_tests_table_between_the_coefficients_and_the_notes(over):
    md = over.to_markdown()
    heading = "IV tests (post-processing of the releases):"
    assert md.index("| Intercept") < md.index(heading) < md.index("Private estimates (DP-2S-GD)")
    lines = md[md.index(heading):].splitlines()
    assert _cells(lines[2]) == ["test", *IV_TEST_COLUMNS]
    for name, row in over.iv_tests.iterrows():
        line = next(line for line in lines if line.startswith(f"| {name} "))
        expected = [name] + ["" if column in ("pval", "critical_value") and math.isnan(row[column]) else
                             format(row[column], ".4g") if column not in ("dist", "cost", "null") else row[column]
                             for column in IV_TEST_COLUMNS]
        assert _cells(line) == expected


def test_the_csv_carries_the_iv_tests_as_comment_lines_at_full_precision(over):
    csv = over.to_csv()
    pd.testing.assert_frame_equal(pd.read_csv(io.StringIO(csv), index_col=0, comment="#"), over.to_frame(),
                                  check_exact=True)  # the coefficient table reads back as before
    comments = [line[2:] for line in csv.splitlines() if line.startswith("# ")]
    assert comments[0] == "IV tests (post-processing of the releases), as CSV:"
    block = "\n".join(comments[1:2 + len(over.iv_tests)])
    back = pd.read_csv(io.StringIO(block), index_col=0, keep_default_na=False,
                       na_values={"pval": [""], "critical_value": [""]})
    pd.testing.assert_frame_equal(back, over.iv_tests, check_exact=True)


def test_to_frame_carries_the_iv_tests_as_records(over):
    records = over.to_frame().attrs["iv_tests"]
    assert [r["test"] for r in records] == ROWS and all(list(r) == ["test", *IV_TEST_COLUMNS] for r in records)
    pd.testing.assert_frame_equal(pd.DataFrame(records).set_index("test"), over.iv_tests, check_exact=True)


def test_the_record_keeps_the_iv_tests_through_a_round_trip(over, tmp_path):
    over.release().save(tmp_path / "fit.json")
    record = load_release(tmp_path / "fit.json")
    assert [test["test"] for test in record.iv_tests] == ROWS
    pd.testing.assert_frame_equal(iv_test_frame(record.iv_tests), over.iv_tests, check_exact=True)
    assert record.to_markdown() == over.to_markdown() and record.to_csv() == over.to_csv()
    pd.testing.assert_frame_equal(pd.DataFrame(record.to_frame().attrs["iv_tests"]),
                                  pd.DataFrame(over.to_frame().attrs["iv_tests"]), check_exact=True)
    text = record.summary().as_text()
    fit = over.summary(benchmark=False).as_text()
    assert text[text.index(TITLE):].split("\n=")[0] == fit[fit.index(TITLE):].split("\n=")[0]  # the same block


def test_an_edited_iv_test_fails_the_digest_check(over):
    data = json.loads(over.release().to_json())
    assert data["iv_tests"][1]["test"] == "Sargan overid" and data["iv_tests"][5]["pval"] == "nan"
    edited = json.loads(json.dumps(data))
    edited["iv_tests"][1]["pval"] = 0.5  # a well-formed number: only the digest can tell
    with pytest.raises(ValueError, match="do not match its digest"):
        FitRelease.from_json(json.dumps(edited))
    dropped = json.loads(json.dumps(data))
    dropped["iv_tests"].pop(0)  # a test left out
    with pytest.raises(ValueError, match="do not match its digest"):
        FitRelease.from_json(json.dumps(dropped))
    broken = json.loads(json.dumps(data))
    broken["iv_tests"][0]["statistic"] = "large"
    with pytest.raises(ValueError, match="not a number"):
        FitRelease.from_json(json.dumps(broken))
    broken["iv_tests"][0].pop("statistic")
    with pytest.raises(ValueError, match="must be a list of tests"):
        FitRelease.from_json(json.dumps(broken))


def test_a_record_from_before_the_iv_tests_loads_without_them(over):
    data = json.loads(over.release().to_json())
    data.pop("iv_tests")
    data["digest"] = record_digest(data)  # as an earlier version wrote it
    record = FitRelease.from_json(json.dumps(data))
    assert record.iv_tests == () and "IV tests" not in record.summary().as_text()
    assert "#" not in record.to_csv() and record.to_frame().attrs["iv_tests"] == []


def test_compare_shows_each_fits_tests_among_the_settings(over, just):
    table = compare({"over": over, "just": just, "record": over.release()}, benchmark=False)
    brief = table.iv_tests
    tests = over.iv_tests
    assert brief.loc["over", "overid_test"] == "Wooldridge overid (robust)" and brief.loc["just", "overid_test"] == ""
    assert brief.loc["over", "overid_pval"] == brief.loc["record", "overid_pval"] == tests.loc[
        "Wooldridge overid (robust)", "pval"]
    assert math.isnan(brief.loc["just", "overid_pval"]) and math.isnan(brief.loc["just", "effective_f"])
    assert brief.loc["just", "wu_hausman_pval"] == just.iv_tests.loc["Wu-Hausman exogeneity", "pval"]
    assert brief.loc["over", "effective_f"] == tests.loc["Effective F (MOP)", "statistic"]
    lines = table.summary.as_text().splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("Intercept")) - 1
    expected = {
        "Overid. p-value": [f"{tests.loc['Wooldridge overid (robust)', 'pval']:.4f} (robust)"] * 2,
        "Wu-Hausman p-value": [f"{tests.loc['Wu-Hausman exogeneity', 'pval']:.4f}",
                               f"{just.iv_tests.loc['Wu-Hausman exogeneity', 'pval']:.4f}"],
        "Effective F": [f"{format_number(tests.loc['Effective F (MOP)', 'statistic'])} "
                        f"(c {format_number(tests.loc['Effective F (MOP)', 'critical_value'], 3)})"] * 2}
    for label, cells in expected.items():
        at = next(i for i, line in enumerate(lines) if line.startswith(label))
        assert at < rule and all(cell in lines[at] for cell in cells), (lines[at], cells)
    assert any(line.startswith("IV tests (post-processing of each fit's releases)") for line in lines)


def test_compare_leaves_out_rows_no_fit_has(just):
    text = compare({"just": just}, benchmark=False).summary.as_text()
    assert "Wu-Hausman p-value" in text and "Overid. p-value" not in text and "Effective F" not in text


# ---------------------------------------------------------------------------------------- weak instruments
def _weak_frame(n: int, strength: float, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    z, w, v, e = rng.standard_normal((4, n))
    x = strength * z + 0.3 * w + v
    return pd.DataFrame({"y": 1 + 0.5 * x + 0.3 * w + 0.5 * v + e, "x": x, "w": w, "z": z})


WEAK_BOUNDS = {"y": (-10.0, 10.0), "x": (-6.0, 6.0), "w": (-5.0, 5.0), "z": (-5.0, 5.0)}
MOP = "the effective F (Montiel Olea-Pflueger, robust to heteroskedasticity)"


def _weak_fit(strength: float, rho: float, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z]", _weak_frame(20_000, strength)).fit(
            rho=rho, seed=1, bounds=WEAK_BOUNDS, **kw)


def _noise(row) -> str:
    return f"(95% noise interval [{format_number(row['lower'], 3)}, {format_number(row['upper'], 3)}])"


def test_the_weak_instrument_note_uses_the_effective_f_and_its_critical_value(tmp_path):
    """A first stage whose effective F is about 30: the rule of thumb (10) would not warn, since the F's noise
    interval lies above 10; MOP's critical value (23.1 with one instrument) lies inside it: possibly weak."""
    res = _weak_fit(0.04, 10.0, rho_diag=2.0)
    row = res.iv_tests.loc["Effective F (MOP)"]
    assert row["lower"] < row["critical_value"] <= row["upper"]
    assert res.first_stage_diagnostics["f.lower"].iloc[0] >= WEAK_F  # the old rule: no note
    note = next(c for c in res.cautions if c.startswith("WEAK INSTRUMENTS"))
    assert note.startswith(
        f"WEAK INSTRUMENTS (possibly): {MOP} is {format_number(row['statistic'], 3)} {_noise(row)}, reaching below "
        f"MOP's critical value {format_number(row['critical_value'], 3)} for a worst-case bias of 10%: the Wald "
        "intervals above may under-cover; the Anderson-Rubin set below")
    assert note in res.summary(benchmark=False).as_text() and note in res.to_markdown()
    assert any(c.startswith("Anderson-Rubin 95% set") for c in res.cautions)  # the set travels with the note
    pdf = compile_latex(res.summary(benchmark=False).as_latex(), tmp_path, "weak", preamble=ARTICLE)
    assert overfull_hboxes(pdf) == []  # the note and the block with the effective F typeset within the line


def test_an_effective_f_whose_interval_lies_below_the_critical_value_is_certainly_weak():
    """No first stage: the effective F's noise interval lies below 23.1 (certain), while it reaches above 10 (the
    rule of thumb would have said 'possibly')."""
    res = _weak_fit(0.0, 2.0, rho_diag=0.2)
    row = res.iv_tests.loc["Effective F (MOP)"]
    assert row["upper"] < row["critical_value"] and res.first_stage_diagnostics["f.upper"].iloc[0] >= WEAK_F
    assert (f"WEAK INSTRUMENTS: {MOP} is {format_number(row['statistic'], 3)} {_noise(row)}, below MOP's critical "
            f"value {format_number(row['critical_value'], 3)} for a worst-case bias of 10%") in res.cautions[1]


def test_without_the_first_stage_meat_the_rule_of_thumb_stays():
    res = _weak_fit(0.0, 2.0, rho_diag=0)
    assert "Effective F (MOP)" not in res.iv_tests.index
    note = next(c for c in res.cautions if c.startswith("WEAK INSTRUMENTS"))
    assert "the first-stage F of x is" in note and "10 (Staiger and Stock's rule of thumb)" in note
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        res.to_markdown()


def test_a_refused_test_is_left_out_and_the_summary_says_why(frame, monkeypatch):
    """Where the release cannot resolve the residual variance the homoskedastic tests are refused: their rows are left
    out of the table (never a stub row) and the summary's note gives the reason."""
    from dpivreg.errors import InferenceUnavailableError
    from dpivreg.inference import iv_tests as module

    def refuse(*args, **kwargs):
        raise InferenceUnavailableError(f"{args[-1]} divide by the residual variance, which the moment release "
                                        "cannot tell from 0 here")

    monkeypatch.setattr(module, "_require_resolved_variance", refuse)
    res = _fit("y ~ 1 + w + [x ~ z1 + z2]", frame, rho_diag=0)
    assert list(res.iv_tests.index) == ["Wooldridge overid (robust)"]
    assert len(res.iv_tests.attrs["refused"]) == 2
    text = res.summary(benchmark=False).as_text()
    assert text.count("Not shown:") == 2 and "cannot tell from 0" in text
