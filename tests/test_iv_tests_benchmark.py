"""Smoke test of ``benchmarks/iv_tests.py`` (issue 41, item 4): the quick configuration runs, checks its closed forms
against linearmodels on the first data set of every cell, spends the same total ρ in every fit (the script asserts
both) and writes the three tables with the docs' columns. The full run's numbers are in the user guide."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("linearmodels")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import iv_tests as bench  # noqa: E402


def test_quick_run_writes_the_three_tables(tmp_path, capsys):
    bench.main(["--quick", "--runs", "2", "--outdir", str(tmp_path)])
    size = pd.read_csv(tmp_path / "iv_tests_size.csv")
    power = pd.read_csv(tmp_path / "iv_tests_power.csv")
    effective_f = pd.read_csv(tmp_path / "iv_tests_effective_f.csv")
    assert list(size.columns) == bench.SIZE_COLUMNS
    assert list(power.columns) == bench.POWER_COLUMNS
    assert list(effective_f.columns) == bench.EFFECTIVE_F_COLUMNS
    assert len(size) == len(bench.DESIGNS) * len(bench.TESTS) and (size.runs == 2).all()
    assert set(power.alternative) == {"alt-overid", "alt-endog"} and len(power) == len(bench.DESIGNS) * len(bench.TESTS)
    assert set(power[power.alternative == "alt-overid"].test) == {"sargan", "robust_overid"}
    assert len(effective_f) == len(bench.DESIGNS) and (effective_f.runs == 2 * len(bench.HYPOTHESES)).all()
    for table, columns in ((size, ["rejection_private", "rejection_naive", "rejection_nonprivate"]),
                           (power, ["rejection_private", "rejection_naive", "rejection_nonprivate"]),
                           (effective_f, ["coverage", "share_below", "share_above"])):
        assert table[columns].apply(lambda c: c.between(0, 1)).all().all()
    assert (effective_f.mean_width_rel > 0).all()
    assert "effective F coverage" in capsys.readouterr().out


def test_the_closed_forms_are_linearmodels():
    """The non-private reference equals linearmodels' statistics in both designs under every hypothesis."""
    import numpy as np

    for design in bench.DESIGNS:
        for hypothesis in bench.HYPOTHESES:
            data = bench.draw(1_500, design, hypothesis, np.random.default_rng(3))
            bench.check_linearmodels(data, bench.nonprivate(data), rel=1e-8)


def test_the_endogeneity_shortcut_is_the_public_methods():
    """one_run reads Durbin's and Wu–Hausman's tests from one computation; they are what the public methods give."""
    import math
    import warnings

    import numpy as np

    from dpivreg import DPIV2SLS

    data = bench.draw(2_000, "homoskedastic", "null", np.random.default_rng(4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = DPIV2SLS.from_formula(bench.FORMULA, data).fit(rho=2.6, rho_diag=0.13, seed=1,
                                                             bounds=bench.BOUNDS["homoskedastic"])
    durbin, wu_hausman = res._endogeneity(None)
    for ours, public in ((durbin, res.durbin()), (wu_hausman, res.wu_hausman())):
        assert ours.name == public.name and ours.stat == public.stat
        assert ours.pval == public.pval and ours.pval_nonprivate_law == public.pval_nonprivate_law
        assert math.isfinite(ours.stat)
