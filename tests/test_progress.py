"""What a fit tells the user while it runs (issue 16, items 5 and 4): progress bars for long loops
(``progress=``) and the warning for a T beyond the T condition of the paper's Theorem 1."""

import re
import warnings

import numpy as np
import pytest
from ivsim import simulate_iv_arrays
from tqdm.std import tqdm as std_tqdm

from dpivreg import DPIV2SLS, DivergenceError, TConditionWarning, dp_2s_gd
from dpivreg import progress as progress_bars
from dpivreg.compute.backends import count_passes
from dpivreg.datasets import simulate_iv

FIT = {"rho1": 1.0, "rho2": 1.0, "T": 8, "seed": 20261129}


@pytest.fixture(scope="module")
def sim():
    return simulate_iv(3000, 2, 3, seed=3)


def _fit(sim, **options):
    model = DPIV2SLS.from_formula(sim.formula, sim.data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.fit(bounds=sim.bounds, **{**FIT, **options})


def _assert_same(a, b):
    np.testing.assert_array_equal(a.params, b.params)
    np.testing.assert_array_equal(a.bse, b.bse)
    np.testing.assert_array_equal(a.engine_path.beta, b.engine_path.beta)
    np.testing.assert_array_equal(a.engine_path.theta, b.engine_path.theta)


# ------------------------------------------------------------------ progress bars
def test_progress_true_writes_bars_naming_what_they_count(sim, capsys):
    _fit(sim, progress=True)
    err = capsys.readouterr().err
    assert "DP-2S-GD iterations" in err and "8/8" in err and "step" in err
    assert re.search(r"privacy-noise simulation \(\d+ paths\)", err)
    assert "100%" in err


def test_progress_false_and_the_default_on_a_short_fit_write_nothing(sim, capsys):
    _fit(sim, progress=False)
    _fit(sim)  # None: a short fit, and stderr is not a terminal here
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_results_are_identical_with_and_without_progress(sim, capsys):
    with_bar, without, default = _fit(sim, progress=True), _fit(sim, progress=False), _fit(sim)
    _assert_same(with_bar, without)
    _assert_same(default, without)
    assert with_bar.privacy.rho == without.privacy.rho


def test_automatic_bar_appears_only_for_a_long_loop_someone_can_see(sim, capsys, monkeypatch):
    """progress=None: a bar once the loop's projected time exceeds PROGRESS_SECONDS (lowered to 0 here) and only
    on an interactive stream (pretended here; pytest's capture is not a terminal)."""
    monkeypatch.setattr(progress_bars, "PROGRESS_SECONDS", 0.0)
    _fit(sim)
    assert capsys.readouterr().err == ""  # not interactive: nothing
    monkeypatch.setattr(progress_bars, "_interactive", lambda: True)
    res = _fit(sim)
    err = capsys.readouterr().err
    assert "DP-2S-GD iterations" in err and "privacy-noise simulation" in err
    _assert_same(res, _fit(sim, progress=False))


@pytest.mark.parametrize("bad", ["yes", 1, 0, 0.5, "auto"])
def test_bad_progress_values_are_a_type_error_naming_progress(sim, bad):
    model = DPIV2SLS.from_formula(sim.formula, sim.data)
    with pytest.raises(TypeError, match=r"progress must be True .*False .*None"):
        model.fit(bounds=sim.bounds, **FIT, progress=bad)
    Z, X, Y, *_ = simulate_iv_arrays(200, 1, 1, seed=0)
    with pytest.raises(TypeError, match="progress"):
        dp_2s_gd(Z, X, Y, T=3, rho1=1, rho2=1, eta=0.5, alpha=0.5, clip1=5, clip2=5, progress=bad)


def test_numpy_booleans_are_accepted(sim, capsys):
    _fit(sim, progress=np.bool_(False))
    assert capsys.readouterr().err == ""


def test_engine_progress_and_same_path(capsys):
    Z, X, Y, *_ = simulate_iv_arrays(2000, 2, 3, seed=1)
    options = {"T": 6, "rho1": 1, "rho2": 1, "eta": 0.5, "alpha": 0.5, "clip1": 20, "clip2": 20, "seed": 5}
    shown = dp_2s_gd(Z, X, Y, **options, progress=True)
    err = capsys.readouterr().err
    assert "DP-2S-GD iterations" in err and "6/6" in err
    hidden = dp_2s_gd(Z, X, Y, **options, progress=False)
    assert capsys.readouterr().err == ""
    np.testing.assert_array_equal(shown.beta, hidden.beta)
    np.testing.assert_array_equal(shown.theta, hidden.theta)


@pytest.mark.filterwarnings("ignore::dpivreg.PrivacyLeakWarning")
def test_bar_is_closed_when_the_run_fails(capsys):
    Z, X, Y, *_ = simulate_iv_arrays(500, 1, 1, seed=2)
    with pytest.raises(DivergenceError) as failure:  # its traceback keeps the run's frame, and so the bar, alive
        dp_2s_gd(Z, X, Y * 1e6, T=50, rho1=np.inf, rho2=np.inf, eta=50.0, alpha=50.0, clip1=None, clip2=None,
                 progress=True)
    assert failure.traceback and len(std_tqdm._instances) == 0
    err = capsys.readouterr().err
    assert "DP-2S-GD iterations" in err and "/50" in err and err.endswith("\n")  # closed where it stopped


def test_dask_fit_shows_one_bar_over_its_passes(sim, capsys):
    dask = pytest.importorskip("dask")
    dd = pytest.importorskip("dask.dataframe")
    ddf = dd.from_pandas(sim.data, npartitions=4)
    with dask.config.set(scheduler="threads"):
        model = DPIV2SLS.from_formula(sim.formula, ddf)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with count_passes() as passes:
                lazy = model.fit(bounds=sim.bounds, **FIT, progress=True)
            err = capsys.readouterr().err
            quiet = model.fit(bounds=sim.bounds, **FIT, progress=False)
            assert capsys.readouterr().err == ""
    assert "passes over the Dask data" in err and "pass/s" in err
    assert f"{passes.count}/{passes.count}" in err  # the bar ends at the fit's number of passes
    assert "DP-2S-GD iterations" not in err  # the iterations are among the passes: one bar, not two
    _assert_same(lazy, quiet)
    np.testing.assert_allclose(lazy.params, _fit(sim).params, rtol=1e-10)


# ------------------------------------------------------------------ the T condition
@pytest.fixture(scope="module")
def small():
    """n = 1000, p = q = 5: the T condition's limit is ρ1·10⁶/(5·(2√5)⁶) = 25·ρ1 (τ = 5)."""
    return simulate_iv(1000, 5, 5, seed=0)


def _fit_small(small, **options):
    model = DPIV2SLS.from_formula(small.formula, small.data)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = model.fit(bounds=small.bounds, seed=1, inference=False, **options)
    return res, [w for w in caught if issubclass(w.category, TConditionWarning)]


def test_t_beyond_the_t_condition_warns_on_the_papers_algorithm(small):
    res, caught = _fit_small(small, rho1=0.5, rho2=1, T=20, init="zero")
    assert len(caught) == 1 and issubclass(TConditionWarning, UserWarning)
    text = str(caught[0].message)
    condition = res.bound.t_condition  # what the summary's bound block reports
    assert not condition.holds and condition.limit == pytest.approx(12.5)
    assert "T = 20 exceeds the T condition of the paper's Theorem 1" in text
    assert "= 12.5 here" in text and f"by a factor {condition.factor:.3g}" in text and "factor 1.6" in text
    assert "does not cover this fit" in text and "Use T <= 12" in text and "raise rho1" in text
    assert "costs no privacy" in text
    assert "violated by a factor 1.6" in res.summary().as_text()
    assert caught[0].filename == __file__  # attributed to the caller of fit()


def test_no_warning_when_the_t_condition_holds(small):
    res, caught = _fit_small(small, rho1=0.5, rho2=1, T=12, init="zero")
    assert caught == [] and res.bound.t_condition.holds


def test_the_condition_uses_rho1_as_spent(small):
    """calibration="paper" spends rho1/2 (the accountant's and the summary's rho1), which halves the limit."""
    _, exact = _fit_small(small, rho1=1, rho2=1, T=20, init="zero", method="gd", eta=0.5, alpha=0.5)
    res, paper = _fit_small(small, rho1=1, rho2=1, T=20, init="zero", method="gd", eta=0.5, alpha=0.5,
                            calibration="paper")
    assert exact == [] and len(paper) == 1
    assert "= 12.5 here" in str(paper[0].message) and res.bound.t_condition.limit == pytest.approx(12.5)


def test_the_warm_started_default_is_not_checked_against_the_t_condition(small):
    """The default pipeline (warm start, preconditioned): the Theorem is not its guarantee; the summary still
    shows the condition, and the private inference flags the first stage swamped by noise."""
    res, caught = _fit_small(small, rho1=0.5, rho2=1, T=20)
    assert res.settings.init == "moments" and res.settings.method == "preconditioned"
    assert caught == [] and not res.bound.t_condition.holds
    model = DPIV2SLS.from_formula(small.formula, small.data)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(bounds=small.bounds, seed=1, rho=0.5)  # every default, T simulated
    assert not any(issubclass(w.category, TConditionWarning) for w in caught)
    assert any("may be unreliable" in str(w.message) for w in caught)
