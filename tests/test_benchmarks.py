"""Smoke tests of the benchmarks (``estimator_comparison.py --quick`` and one replication of each coverage study).

The full runs and their timings live in ``benchmarks/``; here the quick grid must run, spend the same total
ρ on every route (the script asserts it for every fit) and write the docs' tables with their columns.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpivreg.compute.kernels import numba_available

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import estimator_comparison as ec  # noqa: E402


@pytest.fixture(scope="module")
def quick_table():
    return ec.comparison(quick=True)


def test_quick_comparison_covers_every_route_and_design(quick_table):
    assert set(quick_table.route) == set(ec.ROUTES)
    assert set(quick_table.design) == {"paper p=q=1", "labsup"}
    endogenous = quick_table[quick_table.coefficients == "endogenous"]
    assert endogenous.median_error_se.notna().all() and (endogenous.median_error_se >= 0).all()
    assert endogenous.cover_2sls.between(0, 1).all()


def test_docs_tables_are_written(quick_table, tmp_path):
    ec.write_tables(quick_table, tmp_path)
    median = pd.read_csv(tmp_path / "estimator_comparison_median.csv")
    assert list(median.columns) == ["design", "n", "total_rho", *ec.ROUTES, "default / moments"]
    inference = pd.read_csv(tmp_path / "estimator_comparison_inference.csv")
    assert "cover_2sls (default)" in inference.columns and "mean_shift_private_se (moments)" in inference.columns


def test_bias_study_reports_both_step_counts():
    table = ec.bias_study(quick=True)
    assert set(table.T_multiple) == {1, 3} and set(table.coefficient) == {"Intercept", "x"}
    assert table.mean_shift_private_se.abs().max() < 1.0  # 5 seeds: a coarse check; the full study is in the docs


def test_coverage_replications_report_every_column():
    """One replication of each ``interval_coverage.py`` study runs and reports what its tables read."""
    import interval_coverage as ic

    weak = ic.weak_replication(2_000, 5.0, 2.0, 0)
    assert {"cover wald", "cover ar", "ar bounded", "cover 2sls", "cover ar (non-private)"} <= set(weak)
    f = ic.first_stage_f_replication(2_000, 5.0, 2.0, 0)
    assert {"f private", "f non-private", "f inside", "f interval width"} <= set(f) and f["f non-private"] > 0
    het = ic.heteroskedastic_replication("grows", 2_000, 2.0, 0)
    assert {"cover (robust)", "cover (unadjusted)", "cover 2SLS (robust)"} <= set(het)


def test_workflow_speed_quick_writes_its_table(tmp_path):
    """``workflow_speed.py --quick`` runs both formulas in their subprocesses and writes every column; a default
    fit makes T + 4 passes over the rows (the moment release, the clipping histograms, T iterations and the
    robust meat's histogram and sums: the working rows are built inside each pass, not in one of their own, when
    numba is installed; T + 5 without it), the design one and the summary one (the benchmark)."""
    import workflow_speed as ws

    out = tmp_path / "workflow.csv"
    ws.main(["--quick", "--out", str(out)])
    table = pd.read_csv(out)
    assert list(table.columns) == ws.COLUMNS
    assert set(table.formula) == set(ws.FORMULAS)
    assert (table.passes_fit == table["T"] + (4 if numba_available() else 5)).all()
    assert (table.passes_design == 1).all() and (table.passes_summary == 1).all()
    assert (table[["design_s", "fit_s", "summary_s", "iv2sls_s", "peak_over_data"]] > 0).all().all()


def test_inference_cost_quick_reports_both_fits():
    """``inference_cost.py --quick`` times each fit with and without inference and reports the paths the stopping
    rule drew (at least its first batch, at most 2000)."""
    import inference_cost as ic

    from dpivreg.inference.private import MIN_REPLICATIONS

    rows = ic.main(["--quick"])
    assert [row["rule"] for row in rows] == ["default", "fixed"] and rows[1]["T"] == 20
    for row in rows:
        assert row["with_s"] > 0 and row["without_s"] > 0 and row["ratio"] == row["with_s"] / row["without_s"]
        assert MIN_REPLICATIONS <= row["paths"] <= 2000


def test_cluster_pass_quick_reports_both_schedulers():
    """``cluster_pass.py --quick`` times a pass on threads and on a 2-worker LocalCluster (per-worker and per-block
    tasks), ratios against the threaded pass, and how the blocks are held and run on the two workers."""
    pytest.importorskip("distributed")
    import cluster_pass as cp

    rows = cp.main(["--quick"])
    assert [(row["scheduler"], row["tasks"]) for row in rows] == [
        ("threads", "per block"), ("LocalCluster", "per worker thread"), ("LocalCluster", "per block")]
    for row in rows:
        assert 0 < row["best_s"] <= row["median_s"] and row["ratio_best"] == row["best_s"] / rows[0]["best_s"]
    held, run = (part.split()[-1].split("/") for part in rows[1]["blocks"].split(" -> "))
    assert sum(map(int, held)) == sum(map(int, run)) == rows[1]["n_blocks"] == 4
    assert sorted(map(int, run)) == [2, 2]  # the 4 equal blocks' tasks are split evenly, however they are held


def test_engine_speed_floors():
    """The two floors of ``engine_speed.py``: bytes read at the copy bandwidth, and multiply-adds at the dgemm rate.
    The counts by hand from :mod:`dpivreg.compute.kernels`' docstring: at p = q = 5, uᵢ = Mᵀzᵢ is 5·11, zᵢrᵢᵀ 5·5, x̃ᵢeᵢ 5,
    the squared norms of zᵢ, rᵢ, x̃ᵢ 5 + 5 + 5: 100 (7,750 at p = q = 50)."""
    import engine_speed as es
    from bandwidth import dgemm_rate, read_bandwidth

    assert es.multiply_adds_per_row(5, 5) == 100 and es.multiply_adds_per_row(50, 50) == 7750
    row = es.add_ratios({"n": 10**6, "p": 5, "q": 5, "s_per_iter": 0.01, "peak_mb": 1.0}, 88e9, 1e10, 44e9)
    assert row["floor_s_per_iter"] == pytest.approx(1e-3) and row["iter_over_floor"] == pytest.approx(10.0)
    assert row["read_s_per_iter"] == pytest.approx(2e-3) and row["iter_over_read"] == pytest.approx(5.0)
    assert row["arith_s_per_iter"] == pytest.approx(1e-2) and row["iter_over_arith"] == pytest.approx(1.0)
    assert dgemm_rate(size=128, repeats=1, threads=1) > 1e6
    assert read_bandwidth(threads=2, n_bytes=8_000_000, repeats=1) > 1e6


def test_engine_breakdown_prints_every_part(capsys):
    """``engine_breakdown.py`` (issue 15, item 6's evidence at p = q = 50) runs on a small n and prints each part
    with its multiple of the arithmetic floor."""
    import engine_breakdown

    engine_breakdown.main(["--n", "2e4", "--pq", "8", "--repeats", "1"])
    lines = capsys.readouterr().out.splitlines()
    parts = {line[:24].strip(): [float(value) for value in line[24:].split()] for line in lines[2:]}
    assert set(parts) - {"U = Z M (numba)"} == {"iteration", "U = Z M", "Zᵀ W", "(Wᵀ Z)ᵀ", "the two products", "rest",
                                                "read X, Y"}
    assert ("U = Z M (numba)" in parts) == numba_available()
    assert all(seconds > 0 and multiple > 0 for name, (seconds, multiple) in parts.items() if name != "rest")


# ----------------------------------------------------------------------------------------
# the real-data comparison and its yardsticks
# ----------------------------------------------------------------------------------------
def test_real_quick_comparison_spends_the_same_budget_on_every_route(tmp_path):
    """Two specifications, two seeds, total ρ = 2.6: every route runs (the script asserts each dpivreg fit's total ρ),
    the summary and the docs' tables have their columns, and only dpivreg's routes have intervals."""
    fits = ec.real_comparison(seeds=2, jobs=1, quick=True)
    assert set(fits.route) == set(ec.REAL_ROUTES) and fits.total_rho.eq(2.6).all()
    table = ec.summarise_real(fits)
    assert (table.median_error_se >= 0).all()
    intervals = table.set_index("route").cover_2sls
    assert intervals[["default", "moments"]].notna().all() and intervals[list(ec.YARDSTICKS)].isna().all()
    ec.write_real_tables(table, tmp_path)
    median = pd.read_csv(tmp_path / "real_iv_median.csv")
    assert list(median.columns) == ["design", "n", "total_rho", *ec.REAL_ROUTES, "default / ssp"]
    verdict = pd.read_csv(tmp_path / "real_iv_verdict.csv")
    assert {"geometric_mean_median_ratio", "largest_p90_ratio", "smallest_cover"} <= set(verdict.columns)


def test_yardsticks_are_2sls_without_noise():
    """With ρ = ∞ (no noise) textbook SSP and AdaSSP are 2SLS on the bounded data (1e-8; the bounds contain every
    value of the Mroz wage specification), and subsample-and-aggregate is the clipped mean of the blocks' 2SLS."""
    import math

    import real_specs
    from _reference import two_sls
    from _yardsticks import adassp, box_rows, ssp, subsample

    from dpivreg import DPIV2SLS

    spec = real_specs.SPECS[0]
    model = DPIV2SLS.from_formula(spec.formula, real_specs.load(spec))
    bounds = spec.all_bounds()
    reference = two_sls(model)[0][model.design.regressor_names.index("educ")]
    assert ssp(model, bounds, math.inf, 0)[0] == pytest.approx(reference, rel=1e-8)
    assert adassp(model, bounds, math.inf, 0)[0] == pytest.approx(reference, rel=1e-8)
    rows, layout = box_rows(model, bounds)
    order = np.random.default_rng(3).permutation(len(rows))
    R = layout["y_half"] / layout["x_half"][0]
    blocks = []
    for part in np.array_split(order, math.ceil(math.sqrt(len(rows)))):
        block = rows[part]
        M = block.T @ block / len(part)
        k, q = layout["k"], layout["q"]
        Szx = np.concatenate([M[:q, :k], M[:q, q:q + 1]], axis=1)
        first = np.linalg.solve(M[:q, :q], Szx)
        beta = np.linalg.solve(Szx.T @ first, first.T @ M[:q, q + 1])
        blocks.append(np.clip(beta[k] * layout["y_half"] / layout["x_half"][0], -R, R))
    assert subsample(model, bounds, math.inf, 3)[0] == pytest.approx(np.mean(blocks), rel=1e-10)


def test_threshold_rule_quick_compares_the_rules(tmp_path):
    """The paired comparison runs and writes its table, and its variants really are other rules: on the weak
    design's first three data sets (n = 10³, ρ = 2) the one-level reading changes run 2 only (measured: error 4.31
    2SLS s.e. with one level, 0.77 with dpivreg's), and the rules agree where no threshold differs."""
    import threshold_rule

    table = threshold_rule.main(["--quick", "--out", str(tmp_path / "rule.csv")])
    assert list(pd.read_csv(tmp_path / "rule.csv").columns) == list(threshold_rule.docs_table(table).columns)
    assert table.runs.tolist() == [5, 5] and table.changed.sum() >= 1
    assert {f"median_error_{k}" for k in ("one_level", "two_levels_everywhere", "dpivreg")} <= set(table.columns)
    assert table.cover_dpivreg.between(0, 1).all()
    fits = threshold_rule.simulate(runs=3, rhos=(2.0,), cells=(7,))
    assert fits.changed.tolist() == [False, False, True]
    assert fits["error one level"].iloc[2] == pytest.approx(4.3087, abs=1e-3)
    assert fits["error dpivreg"].iloc[2] == pytest.approx(0.7671, abs=1e-3)
    same = fits[~fits.changed]
    assert (same["error one level"] == same["error dpivreg"]).all()
    # unresolved histograms (the paper's design, n = 200, ρ = 0.5): dpivreg reads them with one level, as 0.1 did
    # on these two data sets; the two levels everywhere do not (measured errors 9.09 and 1.32 against 3.29, 10.18)
    small = threshold_rule.simulate(runs=2, rhos=(0.5,), cells=(0,))
    assert (small["error dpivreg"] == small["error one level"]).all()
    assert (small["error two levels everywhere"] != small["error dpivreg"]).all()
