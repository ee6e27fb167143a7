"""Planned private standard errors (dpivreg.planning.se_plan.plan_se): API, validation, reproducibility,
monotonicity, the smallest budget for a target, and a small-R check against realised private SEs.

The full accuracy study (R = 100 per cell) is ``benchmarks/plan_accuracy.py``; its table is in the docs.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dpivreg
from dpivreg import SEPlan, plan_se
from dpivreg.datasets import LABSUP_BOUNDS
from dpivreg.planning.population import iv_formula, synthetic_population

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import plan_accuracy as pa

FORMULA = "y ~ 1 + w + [x ~ z]"
BOUNDS = {"y": (-10.0, 10.0), "w": (-5.0, 5.0), "x": (-6.0, 6.0), "z": (-4.0, 4.0)}
GUESS = {"sds": {"y": 2.0, "w": 1.0, "x": 1.0, "z": 1.0}, "means": {"y": 0.0, "w": 0.0, "x": 0.0, "z": 0.0},
         "first_stage_r2": 0.05}


def _plan(**kw):
    args = {"n": 10_000, "bounds": BOUNDS, "seed": 3, "draws": 1, **GUESS}
    args.update(kw)
    return plan_se(FORMULA, **args)


@pytest.fixture(scope="module")
def base():
    return _plan(rho=1.0)


def test_api_result(base):
    assert dpivreg.plan_se is plan_se and isinstance(base, SEPlan)
    assert list(base.se.index) == ["Intercept", "w", "x"] and base.se.name == "se"
    np.testing.assert_allclose(base.se**2, base.se_sampling**2 + base.se_noise**2)
    np.testing.assert_allclose(base.width, 2 * 1.959963984540054 * base.se)
    frame = base.to_frame()
    assert list(frame.columns) == ["se", "se_sampling", "se_noise", "noise_share", "width"]
    assert base.fits == 1 and base.seconds > 0 and base.attainable and base.target is None
    text = base.summary()
    assert "no data, no privacy cost" in text and "x" in text and "1 fit(s)" in text
    assert repr(base).startswith("SEPlan(n=10000, rho=1")
    # 2SLS sampling SE of x: sigma_u / sqrt(n R2 var(x)) = 2 / sqrt(10000 * 0.05) ~ 0.089
    assert 0.08 < base.se_sampling["x"] < 0.10


def test_population_moments_and_exactness():
    pop = synthetic_population("weeks ~ 1 + educ + [kids ~ samesex]", bounds=LABSUP_BOUNDS,
                               means={"weeks": 22.7, "kids": 2.75, "educ": 11.0, "samesex": 0.5},
                               sds={"weeks": 22.6, "kids": 0.98, "educ": 3.3}, first_stage_r2=0.0013,
                               corr={("educ", "kids"): -0.27})
    d = pop.draw(50_000, seed=1)
    assert set(np.unique(d.samesex)) == {0.0, 1.0} and d.samesex.mean() == 0.5
    for c, (m, s) in {"weeks": (22.7, 22.6), "kids": (2.75, 0.98), "educ": (11.0, 3.3)}.items():
        assert d[c].between(*LABSUP_BOUNDS[c]).all()
        assert abs(d[c].mean() - m) < 0.02 * s and abs(d[c].std() - s) < 0.02 * s  # clipped normal matched
    assert abs(np.corrcoef(d.educ, d.kids)[0, 1] + 0.27) < 0.01
    assert abs(np.corrcoef(d.samesex, d.kids)[0, 1] - math.sqrt(0.0013 * (1 - 0.27**2))) < 0.002
    assert iv_formula(2, 3, 1) == "y ~ 1 + w1 + [x1 + x2 ~ z1 + z2 + z3]"


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"rho": 1.0, "target_se": 0.1}, ValueError, "exactly one of rho"),
    ({}, ValueError, "exactly one of rho"),
    ({"rho": -1.0}, ValueError, "rho"),
    ({"rho": "1"}, TypeError, "rho"),
    ({"rho": 1.0, "n": 5}, ValueError, "n"),
    ({"rho": 1.0, "n": 1e4 + 0.5}, ValueError, "n"),
    ({"rho": 1.0, "draws": 0}, ValueError, "draws"),
    ({"rho": 1.0, "alpha": 1.5}, ValueError, "alpha"),
    ({"rho": 1.0, "seed": -1}, ValueError, "seed"),
    ({"rho": 1.0, "seed": "a"}, TypeError, "seed"),
    ({"rho": 1.0, "bounds": {"y": (0, 1)}}, ValueError, "bounds"),
    ({"rho": 1.0, "bounds": [1, 2]}, TypeError, "bounds"),
    ({"rho": 1.0, "bounds": {**BOUNDS, "x": (1.0, -1.0)}}, ValueError, "bounds['x']"),
    ({"rho": 1.0, "first_stage_f": 30.0}, ValueError, "first_stage_f"),
    ({"rho": 1.0, "first_stage_r2": 1.5}, ValueError, "first_stage_r2"),
    ({"rho": 1.0, "first_stage_r2": {"w": 0.1}}, ValueError, "first_stage_r2"),
    ({"rho": 1.0, "means": {"x": 9.0}}, ValueError, "means['x']"),
    ({"rho": 1.0, "means": {"q": 0.0}}, ValueError, "means"),
    ({"rho": 1.0, "means": [0.0]}, TypeError, "means"),
    ({"rho": 1.0, "sds": {"x": 7.0}}, ValueError, "sds['x']"),
    ({"rho": 1.0, "sds": {"x": -1.0}}, ValueError, "sds['x']"),
    ({"rho": 1.0, "error_sd": 1.0}, ValueError, "error_sd"),
    ({"rho": 1.0, "endogeneity": 1.0}, ValueError, "endogeneity"),
    ({"rho": 1.0, "coef": {"z": 1.0}}, ValueError, "coef"),
    ({"rho": 1.0, "corr": {("w", "z"): 0.2}}, ValueError, "corr"),
    ({"rho": 1.0, "corr": {"w": 0.2}}, TypeError, "corr"),
    ({"rho": 1.0, "corr": {("w", "x"): 1.2}}, ValueError, "corr"),
    ({"rho": 1.0, "binary": {"x": True}}, ValueError, "binary['x']"),
    ({"rho": 1.0, "fit_options": {"seed": 1}}, ValueError, "fit_options"),
    ({"target_se": -0.1}, ValueError, "target_se"),
    ({"target_se": {"q": 0.1}}, ValueError, "target_se"),
    ({"target_se": 0.1, "target_width": 0.4}, ValueError, "target_width"),
    ({"target_se": 0.1, "rtol": 0.9}, ValueError, "rtol"),
])
def test_argument_validation(kwargs, error, words):
    args = {"n": 10_000, "bounds": BOUNDS, **GUESS}
    args.update(kwargs)
    if "first_stage_f" in kwargs:
        del args["first_stage_r2"]
        args["first_stage_r2"] = 0.05  # both given
    if "error_sd" in kwargs:
        args["sds"] = GUESS["sds"]  # the outcome's SD too: ambiguous
    with pytest.raises(error, match=None) as info:
        plan_se(FORMULA, **args)
    assert words in str(info.value)


def test_formula_validation():
    with pytest.raises(TypeError, match="formula"):
        plan_se(3, n=10_000, rho=1.0, bounds=BOUNDS, first_stage_r2=0.1)
    with pytest.raises(ValueError, match="plain column name"):
        plan_se("y ~ 1 + np.log(w) + [x ~ z]", n=10_000, rho=1.0, bounds=BOUNDS, first_stage_r2=0.1)
    with pytest.raises(ValueError, match="identified"):
        plan_se("y ~ 1 + [x + w ~ z]", n=10_000, rho=1.0, bounds=BOUNDS, first_stage_r2=0.1)


def test_reproducible_with_a_seed(base):
    again = _plan(rho=1.0)
    pd.testing.assert_series_equal(base.se, again.se)
    other = _plan(rho=1.0, seed=4)
    assert not np.allclose(base.se_noise, other.se_noise)


def test_se_falls_with_rho_and_n(base):
    low, high = _plan(rho=0.1), _plan(rho=10.0)
    assert low.se["x"] > base.se["x"] > high.se["x"]
    assert low.se_noise["x"] > base.se_noise["x"] > high.se_noise["x"]
    bigger = _plan(rho=1.0, n=40_000)
    assert bigger.se["x"] < base.se["x"] and bigger.se_sampling["x"] < base.se_sampling["x"]
    # first_stage_f at this n is the same strength as the partial R2 it implies
    f = 0.05 * (10_000 - 3) / 0.95
    via_f = plan_se(FORMULA, n=10_000, rho=1.0, bounds=BOUNDS, seed=3, draws=1, means=GUESS["means"],
                    sds=GUESS["sds"], first_stage_f=f)
    np.testing.assert_allclose(via_f.se, base.se, rtol=1e-6)


def test_smallest_rho_meets_its_target(base):
    target = 1.1 * base.se_sampling["x"]
    p = _plan(target_se=target)
    assert p.attainable and math.isfinite(p.rho)
    assert p.se["x"] <= target and p.search["meets"].any()
    # the noise variance uses at least (1 - rtol)^2 of the room the target leaves it
    close = p.se_noise["x"] ** 2 >= (1 - 0.02) ** 2 * (target**2 - p.se_sampling["x"] ** 2)
    lower = p.search[p.search.rho < p.rho]
    assert close or (not lower.empty and not lower.meets.any() and p.rho / lower.rho.max() < 1.02 + 1e-12)
    assert not p.search[p.search.rho < p.rho].meets.any()  # the answer is the smallest budget that met it
    # verification: a plan at that budget, same seed, gives the same SE (common random numbers)
    check = _plan(rho=p.rho)
    np.testing.assert_allclose(check.se["x"], p.se["x"], rtol=1e-9)
    # a width target is the same target: width = 2 z SE
    w = _plan(target_width=2 * 1.959963984540054 * target)
    assert w.rho == pytest.approx(p.rho) and w.target["x"] == pytest.approx(target)


def test_smallest_rho_when_sampling_dominates(base):
    """A target 1.5% above the SE at rho = 1, where the noise is 3% of the variance, needs about half that budget
    (the SE is nearly flat in rho there: stopping once the SE is within 2% of the target returned rho = 1)."""
    assert base.noise_share["x"] < 0.05
    target = 1.015 * base.se["x"]
    p = _plan(target_se=target)
    assert p.rho < 0.7 and p.se["x"] <= target
    assert p.se_noise["x"] ** 2 >= (1 - 0.02) ** 2 * (target**2 - p.se_sampling["x"] ** 2) or \
        not p.search[p.search.rho < p.rho].meets.any()


def test_unattainable_target(base):
    p = _plan(target_se=0.9 * base.se_sampling["x"])
    assert not p.attainable and p.rho == math.inf and "NOT attainable" in p.summary()


def test_small_r_accuracy_against_realised_private_se():
    """Planned vs realised private SE (SD of the estimate over R fresh data sets and noise), R = 60.

    The realised SD's Monte Carlo standard error is about SD/sqrt(2R) (9% at R = 60), so the ratio is
    checked to within three of those (27%); the R = 100 study in the docs targets 0.75-1.25.
    """
    runs = 60
    table = pa.run_cell("strong, just-id", 10_000, 1.0, runs)
    tol = 3 / math.sqrt(2 * runs)
    assert (table.ratio - 1).abs().max() <= tol, table[["coefficient", "planned_se", "realised_sd", "ratio"]]


def test_benchmark_quick_writes_its_table(tmp_path):
    table = pa.main(["--quick", "--runs", "5", "--outdir", str(tmp_path)])
    written = pd.read_csv(tmp_path / "plan_accuracy.csv")
    assert list(pd.read_csv(tmp_path / "plan_accuracy_full.csv").columns) == pa.COLUMNS
    assert set(written.design) == {d for d, _, _ in pa.QUICK_CELLS} and (written.runs == 5).all()
    assert (table.planned_se > 0).all() and (table.realised_sd > 0).all()


def test_first_stage_weights_set_the_overlap_of_the_first_stages():
    """Shared instruments: the two endogenous regressors' fitted values are correlated as the weights say (the
    cosine of the two weight vectors), which is what makes the instruments jointly weaker."""
    formula = "y ~ 1 + [x1 + x2 ~ z1 + z2 + z3]"
    bounds = {c: (-8.0, 8.0) for c in ("y", "x1", "x2", "z1", "z2", "z3")}
    weights = {"x1": {"z1": 0.5, "z2": 0.1, "z3": 0.2}, "x2": {"z1": 0.15, "z2": 0.35, "z3": 0.15}}
    pop = synthetic_population(formula, bounds=bounds, first_stage_r2=0.3, first_stage_weights=weights)
    data = pop.draw(200_000, seed=1)
    Z = np.column_stack([np.ones(len(data)), data[["z1", "z2", "z3"]].to_numpy()])
    fitted = [Z @ np.linalg.lstsq(Z, data[x].to_numpy(), rcond=None)[0] for x in ("x1", "x2")]
    a, b = (np.array(list(weights[x].values())) for x in ("x1", "x2"))
    cosine = a @ b / np.linalg.norm(a) / np.linalg.norm(b)
    assert np.corrcoef(*fitted)[0, 1] == pytest.approx(cosine, abs=0.01)
    default = synthetic_population(formula, bounds=bounds, first_stage_r2=0.3)
    assert default.first_stage_weights == {"x1": {"z1": 1 / math.sqrt(2), "z3": 1 / math.sqrt(2)}, "x2": {"z2": 1.0}}


@pytest.mark.parametrize("weights, error, words", [
    ({"x3": {"z1": 1.0}}, ValueError, "first_stage_weights"),
    ({"x1": {"w": 1.0}}, ValueError, "first_stage_weights['x1']"),
    ({"x1": {"z1": 0.0}}, ValueError, "weight 0"),
    ({"x1": {"z1": 1.0}, "x2": {"z1": 2.0}}, ValueError, "linearly dependent"),
    ({"x1": {"z1": float("nan")}}, ValueError, "finite"),
    ({"x1": [1.0]}, TypeError, "first_stage_weights['x1']"),
])
def test_first_stage_weights_are_checked(weights, error, words):
    bounds = {c: (-8.0, 8.0) for c in ("y", "x1", "x2", "z1", "z2", "z3")}
    with pytest.raises(error) as caught:
        synthetic_population("y ~ 1 + [x1 + x2 ~ z1 + z2 + z3]", bounds=bounds, first_stage_r2=0.3,
                             first_stage_weights=weights)
    assert words in str(caught.value)
