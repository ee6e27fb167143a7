"""DPIV2SLS end to end: the non-private limit against linearmodels IV2SLS, scaling, leaks, results, summary."""

import math
import re
import warnings

import numpy as np
import pandas as pd
import pytest
from linearmodels.iv import IV2SLS

from dpivreg import DPIV2SLS, PrivacyLeakWarning
from dpivreg.__main__ import main as cli_main
from dpivreg.datasets import LABSUP_BOUNDS, load_labsup
from dpivreg.model import theorem_clip


@pytest.fixture(scope="module")
def frame():
    """Synthetic frame: two endogenous variables, covariates of different scales, strong instruments."""
    rng = np.random.default_rng(11)
    n = 2000
    z1, z2, z3 = rng.standard_normal((3, n))
    u = rng.standard_normal(n)
    w = rng.uniform(0, 10, n)
    x1 = 1.0 + z1 + 0.5 * z2 + u + rng.standard_normal(n)
    x2 = -2.0 + 0.7 * z3 - 0.4 * z1 + 0.5 * u + rng.standard_normal(n)
    y = 3.0 + 1.5 * x1 - 0.8 * x2 + 0.2 * w + u + rng.standard_normal(n)
    return pd.DataFrame({"y": y, "x1": x1, "x2": x2, "z1": z1, "z2": z2, "z3": z3, "w": w})


NONPRIVATE_FORMULAS = [
    "y ~ [x1 ~ z1 + z2]",
    "y ~ 1 + [x1 ~ z1 + z2]",
    "y ~ 1 + w + [x1 ~ z1 + z2]",
    "y ~ 1 + [x1 + x2 ~ z1 + z2 + z3] + w",
]


def _wide_bounds(model):
    d = model.design
    return {c: (-30.0, 30.0) for c in [d.dependent_name, *d.regressor_names, *d.instrument_names] if c != "Intercept"}


@pytest.mark.parametrize("formula", NONPRIVATE_FORMULAS)
@pytest.mark.parametrize("preprocess, method", [("private", "preconditioned"), ("data", "preconditioned"),
                                                ("data", "gd")])
def test_non_private_limit_equals_iv2sls(frame, formula, preprocess, method):
    """rho = inf, no clipping: params equal IV2SLS to 1e-6 relative (also checks the back-transform)."""
    model = DPIV2SLS.from_formula(formula, frame)
    with pytest.warns(PrivacyLeakWarning):
        res = model.fit(rho1=math.inf, rho2=math.inf, T=300, clip=False, bounds=_wide_bounds(model),
                        preprocess=preprocess, method=method)
    ref = IV2SLS.from_formula(formula, frame).fit().params
    pd.testing.assert_index_equal(res.params.index, ref.index)
    np.testing.assert_allclose(res.params.to_numpy(), ref.to_numpy(), rtol=1e-6)
    np.testing.assert_allclose(res.benchmark.params.to_numpy(), ref.to_numpy(), rtol=1e-12)
    assert res.privacy.rho == math.inf and not res.is_private
    assert "NOT differentially private" in " ".join(res.leaks)


def test_non_private_limit_paper_iteration_on_bounds(frame):
    """The paper's plain iteration on the bounds-only scale also reaches IV2SLS, slowly (no whitening)."""
    formula = "y ~ 1 + [x1 + x2 ~ z1 + z2 + z3] + w"
    model = DPIV2SLS.from_formula(formula, frame)
    with pytest.warns(PrivacyLeakWarning):
        res = model.fit(rho1=math.inf, rho2=math.inf, T=80000, clip=False, bounds=_wide_bounds(model),
                        preprocess="bounds", method="gd")
    ref = IV2SLS.from_formula(formula, frame).fit().params
    np.testing.assert_allclose(res.params.to_numpy(), ref.to_numpy(), rtol=1e-6)


@pytest.mark.parametrize("formula", NONPRIVATE_FORMULAS)
def test_private_transform_is_undone_exactly(frame, formula):
    """Centring, scaling and whitening from NOISY private moments are still an exact affine reparametrisation:
    closed-form 2SLS on the working arrays, mapped back, equals IV2SLS on the original data to 1e-9."""
    model = DPIV2SLS.from_formula(formula, frame)
    res = model.fit(rho1=1.0, rho2=1.0, rho0=0.01, T=2, bounds=_wide_bounds(model), seed=8)
    sc = res.scale
    assert sc.releases and sc.releases[0].noise_std > 0
    theta_w = np.linalg.lstsq(sc.Z, sc.X, rcond=None)[0]
    x_hat = sc.Z @ theta_w
    beta_w = np.linalg.solve(x_hat.T @ x_hat, x_hat.T @ sc.Y)
    ref = IV2SLS.from_formula(formula, frame).fit().params.to_numpy()
    np.testing.assert_allclose(sc.beta_to_original(beta_w), ref, rtol=1e-9)
    d = model.design
    Z = np.column_stack([d.exog.to_numpy(), d.instruments.to_numpy()])
    ols = np.linalg.lstsq(Z, d.endog.to_numpy(), rcond=None)[0]
    np.testing.assert_allclose(sc.theta_to_original(theta_w[:, sc.n_exog:]), ols, rtol=1e-9, atol=1e-12)
    # With rho0 = 0.01 and bounds ±30 on roughly standard normal columns the release is mostly noise;
    # with a large rho0 the working instruments are whitened (up to the release's noise).
    sharp = model.fit(rho1=1.0, rho2=1.0, rho0=1e6, T=2, bounds=_wide_bounds(model), seed=8).scale
    np.testing.assert_allclose(sharp.Z.T @ sharp.Z / len(frame), np.eye(sc.Z.shape[1]), atol=0.05)


def test_back_transform_of_first_stage(frame):
    """Θ⁽ᵀ⁾ in original units equals the first-stage OLS coefficients in the non-private limit."""
    model = DPIV2SLS.from_formula("y ~ 1 + w + [x1 ~ z1 + z2]", frame)
    bounds = {"y": (-40, 40), "x1": (-20, 20), "z1": (-8, 8), "z2": (-8, 8), "w": (0, 10)}
    with pytest.warns(PrivacyLeakWarning):
        res = model.fit(rho1=math.inf, rho2=math.inf, T=300, clip=False, bounds=bounds)
    Z = np.column_stack([np.ones(len(frame)), frame[["w", "z1", "z2"]].to_numpy()])
    ols = np.linalg.lstsq(Z, frame["x1"].to_numpy(), rcond=None)[0]
    np.testing.assert_allclose(res.first_stage["x1"].to_numpy(), ols, rtol=1e-8)
    assert list(res.first_stage.index) == ["Intercept", "w", "z1", "z2"]
    assert res.first_stage_path.shape == (301, 4, 1)


def test_data_route_leaks(frame):
    model = DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + z2]", frame)
    with pytest.warns(PrivacyLeakWarning, match="exact data moments"):
        res = model.fit(rho1=1, rho2=1, T=5, bounds=_wide_bounds(model), seed=0, preprocess="data")
    # the exact moments are recorded as a release without noise: the accountant says "not private", not "rho0 = 0"
    assert res.privacy.rho0 == math.inf and not res.privacy.is_private and math.isinf(res.epsilon)
    assert "data moments (LEAK)" in res.summary().as_text()


def test_default_fit_with_bounds_has_no_leak(frame):
    model = DPIV2SLS.from_formula("y ~ 1 + w + [x1 ~ z1 + z2]", frame)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        res = model.fit(rho1=0.4, rho2=0.6, rho0=0.25, T=20, bounds={**_wide_bounds(model), "w": (0, 10)}, seed=1)
    # rho_clip, rho_inf and rho_diag default to 0.05·(rho1 + rho2) = 0.05 (the clipping, the inference and the
    # diagnostics' releases)
    assert res.privacy.rho == pytest.approx(0.25 + 0.05 + 0.4 + 0.6 + 0.05 + 0.05, rel=1e-12)
    assert (res.privacy.rho0, res.privacy.rho_of("rho_clip"), res.privacy.rho1, res.privacy.rho2,
            res.privacy.rho_of("rho_inf"), res.privacy.rho_of("rho_diag")) == pytest.approx(
        (0.25, 0.05, 0.4, 0.6, 0.05, 0.05), rel=1e-12)
    assert res.privacy.target == pytest.approx({"rho0": 0.25, "rho_clip": 0.05, "rho1": 0.4, "rho2": 0.6,
                                                "rho_inf": 0.05, "rho_diag": 0.05})
    no_inference = model.fit(rho1=0.4, rho2=0.6, rho0=0.25, T=20, bounds={**_wide_bounds(model), "w": (0, 10)},
                             seed=1, inference=False)
    assert no_inference.privacy.rho == pytest.approx(1.30, rel=1e-12)


def test_private_fit_with_bounds_and_public_steps_has_no_leak(frame):
    model = DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + z2]", frame)
    bounds = {"y": (-40, 40), "x1": (-20, 20), "z1": (-8, 8), "z2": (-8, 8)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        res = model.fit(rho1=1, rho2=1, T=20, eta=1.0, alpha=0.5, bounds=bounds, seed=3)
        theorem = model.fit(rho1=1, rho2=1, T=20, eta=1.0, alpha=0.5, bounds=bounds, seed=3, clip="theorem")
    assert res.leaks == () and res.is_private and theorem.leaks == ()
    # rho0 = 0.2·(rho1 + rho2), rho_clip = rho_inf = rho_diag = 0.05·(rho1 + rho2)
    assert res.privacy.rho == pytest.approx(2.7) and theorem.privacy.rho == pytest.approx(2.6)
    stages = [r.stage for r in res.privacy.releases]
    # the three meats' releases come last, each a histogram and a meat (the robust meat's, the first stage's and the
    # endogeneity test's; released in two shared passes over the rows)
    meats = ["rho_inf"] * 2 + ["rho_diag"] * 4
    assert stages[:2] == ["rho0", "rho_clip"] and stages[-6:] == meats
    assert set(stages[2:-6]) == {"rho1", "rho2"}
    assert [r.stage for r in theorem.privacy.releases if r.stage != "rho1" and r.stage != "rho2"] == ["rho0", *meats]
    assert theorem.settings.clip1 == pytest.approx(theorem_clip(len(frame), 3, 20))
    assert model.fit(rho1=1, rho2=1, T=20, eta=1.0, alpha=0.5, bounds=bounds, seed=3, clip="rms").settings.clip1 == \
        pytest.approx(3 * math.sqrt(3 * 1))  # q = 3, p_endog = 1
    assert "No privacy leak" in res.summary().as_text()


def test_missing_bounds_raise_exactly_one_leak_on_the_default_path(frame):
    model = DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + z2]", frame)
    with pytest.warns(PrivacyLeakWarning) as record:
        model.fit(rho1=1, rho2=1, T=5, bounds={"y": (-40, 40)}, seed=0)
    messages = [str(w.message) for w in record if issubclass(w.category, PrivacyLeakWarning)]
    assert len(messages) == 1 and "x1, z1, z2" in messages[0]


def test_paper_step_sizes_leak(frame):
    model = DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + z2]", frame)
    with pytest.warns(PrivacyLeakWarning) as record:
        res = model.fit(rho1=1, rho2=1, T=5, bounds={"y": (-40, 40)}, seed=0, method="gd")
    messages = [str(w.message) for w in record if issubclass(w.category, PrivacyLeakWarning)]
    assert any("x1, z1, z2" in m for m in messages)
    assert any("step size(s) eta, alpha" in m for m in messages)
    assert list(res.scale.source[["y", "x1", "Intercept"]]) == ["bounds", "data", "constant"]
    text = res.summary().as_text()
    assert "PRIVACY LEAK" in text and "Scaled from the data" in text


def test_bounds_clip_data_and_scale(frame):
    model = DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + z2]", frame)
    bounds = {"y": (-5, 5), "x1": (-20, 20), "z1": (-1, 1), "z2": (-8, 8)}
    res = model.fit(rho1=1, rho2=1, T=3, eta=1.0, alpha=0.5, bounds=bounds, seed=0, preprocess="bounds")
    assert res.scale.bound_scales["y"] == 5 and res.scale.bound_scales["z1"] == 1
    assert res.scale.clipped_values["y"] == int(((frame.y < -5) | (frame.y > 5)).sum()) > 0
    assert np.abs(res.scale.Y).max() <= 1 and np.abs(res.scale.Z).max() <= 1
    assert res.privacy.rho0 == 0 and res.privacy.rho == pytest.approx(2.0)
    assert "clipped to them (non-private count)" in res.summary().as_text()


@pytest.mark.parametrize(
    "bounds, exc, match",
    [
        ({"nope": (0, 1)}, ValueError, "neither a column of the design nor of the data"),
        ({"y": (1, 1)}, ValueError, "lower < upper"),
        ({"y": (2, 1)}, ValueError, "lower < upper"),
        ({"y": (0, np.inf)}, ValueError, "finite"),
        ({"y": (0,)}, TypeError, "pair"),
        ({"y": ("a", "b")}, TypeError, "pair"),
        ([("y", (0, 1))], TypeError, "dict"),
    ],
)
def test_bad_bounds(frame, bounds, exc, match):
    model = DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + z2]", frame)
    with pytest.raises(exc, match=match):
        model.fit(rho1=1, rho2=1, T=3, eta=1.0, alpha=0.5, bounds=bounds)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"rho1": 0}, ValueError, "rho1"),
        ({"rho2": float("nan")}, ValueError, "rho2"),
        ({"T": 0}, ValueError, "T must be"),
        ({"delta": 1.0}, ValueError, "delta"),
        ({"delta": 0}, ValueError, "delta"),
        ({"clip": False}, ValueError, "clip=False"),
        ({"clip": -1}, ValueError, "clip"),
        ({"clip": (1.0, 0.0)}, ValueError, r"clip\[1\]"),
        ({"clip": {"c": 1}}, ValueError, "c0"),
        ({"clip": "big"}, ValueError, "one of \\('adaptive', 'theorem', 'rms'\\)"),
        ({"clip": [1.0]}, TypeError, "clip"),
        ({"rho0": -1}, ValueError, "rho0"),
        ({"preprocess": "none"}, ValueError, "preprocess"),
        ({"method": "newton"}, ValueError, "method"),
        ({"eta": 0}, ValueError, "eta"),
        ({"alpha": -1}, ValueError, "alpha"),
        ({"calibration": "tight"}, ValueError, "calibration"),
        ({"seed": "x"}, TypeError, "seed"),
        ({"tau": 0}, ValueError, "tau"),
    ],
)
def test_bad_fit_arguments(frame, kwargs, exc, match):
    model = DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + z2]", frame)
    args = dict(rho1=1, rho2=1, T=3, eta=1.0, alpha=0.5, bounds={"y": (-40, 40), "x1": (-20, 20),
                                                                   "z1": (-8, 8), "z2": (-8, 8)})
    with pytest.raises(exc, match=match):
        model.fit(**{**args, **kwargs})


def test_clip_options(frame):
    model = DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + z2]", frame)
    args = dict(rho1=1, rho2=1, T=4, eta=1.0, alpha=0.5, bounds={"y": (-40, 40), "x1": (-20, 20),
                                                                   "z1": (-8, 8), "z2": (-8, 8)}, seed=0,
                schedule="uniform")
    assert model.fit(clip=(2.0, 3.0), **args).settings.clip2 == 3.0
    res = model.fit(clip={"c0": 0.5}, **args)
    assert res.settings.clip1 == pytest.approx(0.5 * (math.sqrt(3) + math.sqrt(5 + math.log(2000 * 4))) ** 2)
    assert res.engine_path.lambda1 == pytest.approx(res.settings.clip1 / 2000 * math.sqrt(2 * 4 / 1))


def test_results_objects(frame):
    model = DPIV2SLS.from_formula("y ~ 1 + w + [x1 + x2 ~ z1 + z2 + z3]", frame)
    bounds = {"y": (-40, 40), "x1": (-20, 20), "x2": (-20, 20), "z1": (-8, 8), "z2": (-8, 8), "z3": (-8, 8),
              "w": (0, 10)}
    res = model.fit(rho1=2, rho2=3, T=7, eta=1.0, alpha=0.3, bounds=bounds, seed=1, delta=1e-6)
    names = ["Intercept", "w", "x1", "x2"]
    assert list(res.params.index) == names and res.params.name == "parameter"
    assert res.path.shape == (8, 4) and list(res.path.columns) == names and res.path.index.name == "iteration"
    pd.testing.assert_series_equal(res.path.iloc[-1], res.params, check_names=False)
    assert list(res.first_stage.columns) == ["x1", "x2"]
    assert res.nobs == 2000 and res.model is model
    assert res.privacy.rho == pytest.approx(6.75)  # + rho0 = 0.2·5, rho_clip = rho_inf = rho_diag = 0.05·5
    assert res.epsilon == pytest.approx(res.privacy.epsilon(1e-6))
    assert res.clipped_rows.shape == (7, 2)
    assert "DPIVResults" in repr(res)
    assert str(res) == res.summary().as_text()
    assert "<table" in res._repr_html_()


def test_paper_calibration_reports_spent_budget(frame):
    model = DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + z2]", frame)
    res = model.fit(rho1=1, rho2=1, T=5, eta=1.0, alpha=0.5, calibration="paper", seed=0, preprocess="bounds",
                    bounds={"y": (-40, 40), "x1": (-20, 20), "z1": (-8, 8), "z2": (-8, 8)})
    assert res.privacy.rho == pytest.approx(1.0)
    assert "0.5 (asked 1)" in res.summary().as_text()


def test_summary_content(frame):
    model = DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + z2]", frame)
    res = model.fit(rho1=0.5, rho2=1.5, T=5, eta=1.0, alpha=0.5, seed=0, delta=1e-6,
                    bounds={"y": (-40, 40), "x1": (-20, 20), "z1": (-8, 8), "z2": (-8, 8)})
    text = res.summary().as_text()
    for fragment in ["DP-2S-GD", "rho0 (zCDP, preprocessing):", "0.4", "rho1 (zCDP):", "0.5", "rho2 (zCDP):",
                     "1.5", "rho_inf (zCDP, inference):", "0.1", "rho_clip (zCDP, clipping):", "Total rho (spent):",
                     "2.7", "delta:", "warm (private moments)", "staggered", "adaptive (private)",
                     "private moments", "preconditioned", "Std. Err.", "P>|z|", "Lower CI",
                     "epsilon (exact Gauss.):", f"{res.privacy.epsilon(1e-6):.4g}",
                     f"{res.privacy.epsilon(1e-6, 'bun-steinke'):.4g}", "IV2SLS*", "NON-PRIVATE",
                     "Endogenous: x1", "Instruments: z1, z2", "public bounds"]:
        assert fragment in text, fragment
    from statsmodels.iolib.summary import Summary

    assert isinstance(res.summary(), Summary)
    assert "tabular" in res.summary().as_latex()
    assert "<table" in res.summary().as_html()


def test_caller_frame_not_modified(frame):
    before = frame.copy(deep=True)
    DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + z2]", frame).fit(
        rho1=1, rho2=1, T=3, eta=1.0, alpha=0.5, seed=0, bounds={"y": (-1, 1), "x1": (-1, 1), "z1": (-1, 1),
                                                                  "z2": (-1, 1)})
    pd.testing.assert_frame_equal(frame, before)


def test_array_constructor_matches_formula(frame):
    exog = pd.DataFrame({"const": np.ones(len(frame))}, index=frame.index)
    by_arrays = DPIV2SLS(frame["y"], exog, frame[["x1"]], frame[["z1", "z2"]])
    by_formula = DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + z2]", frame)
    kw = dict(rho1=1, rho2=1, T=6, eta=1.0, alpha=0.5, seed=9,
              bounds={"y": (-40, 40), "x1": (-20, 20), "z1": (-8, 8), "z2": (-8, 8)})
    a, b = by_arrays.fit(**kw), by_formula.fit(**kw)
    np.testing.assert_array_equal(a.params.to_numpy(), b.params.to_numpy())
    assert list(a.params.index) == ["const", "x1"]


def test_seed_reproducible(frame):
    model = DPIV2SLS.from_formula("y ~ 1 + [x1 ~ z1 + z2]", frame)
    kw = dict(rho1=1, rho2=1, T=6, eta=1.0, alpha=0.5,
              bounds={"y": (-40, 40), "x1": (-20, 20), "z1": (-8, 8), "z2": (-8, 8)})
    pd.testing.assert_series_equal(model.fit(seed=4, **kw).params, model.fit(seed=4, **kw).params)


def test_labsup_demo_numbers():
    """The demo's design on the full labsup data: the benchmark equals linearmodels' IV2SLS (reference values)."""
    df = load_labsup()
    assert len(df) == 31857 and "citation" in df.attrs
    res = DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", df).fit(
        rho1=1, rho2=1, T=20, seed=0,
        bounds={k: LABSUP_BOUNDS[k] for k in ("weeks", "kids", "samesex")})
    # linearmodels 7.1, IV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", load_labsup()).fit():
    # kids -5.5112 (robust SE 3.5790), Intercept 37.842
    assert res.benchmark.params["kids"] == pytest.approx(-5.5112, abs=1e-4)
    assert res.benchmark.std_errors["kids"] == pytest.approx(3.5790, abs=1e-4)
    assert res.benchmark.params["Intercept"] == pytest.approx(37.842, abs=1e-3)
    assert res.privacy.rho == pytest.approx(2.7)


def test_labsup_default_pipeline_is_unbiased_and_tight():
    """30 seeds of the demo fit: the privacy error of kids is centred on 2SLS and well below its std. error.

    Measured over 200 seeds (default pipeline): mean error -0.11, sd 1.75 (2SLS robust SE 3.58).
    Tolerances: |mean| < 4·sd/sqrt(30) and sd < 0.75·SE, i.e. > 4 standard errors of the sample sd
    (≈ sd/sqrt(2·29) = 0.23) above the measured 1.75.
    """
    df = load_labsup()
    model = DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", df)
    bounds = {k: LABSUP_BOUNDS[k] for k in ("weeks", "kids", "samesex")}
    fits = [model.fit(rho1=1, rho2=1, T=20, bounds=bounds, seed=s) for s in range(30)]
    errors = np.array([r.params["kids"] for r in fits]) - (-5.5112)
    assert abs(errors.mean()) < 4 * errors.std(ddof=1) / math.sqrt(30)
    assert errors.std(ddof=1) < 0.75 * 3.5790


def test_demo_command(capsys):
    assert cli_main(["demo", "-T", "5"]) == 0
    out = capsys.readouterr().out
    assert "DP-2S-GD Estimation Summary" in out and "weeks" in out and "IV2SLS*" in out


def test_readme_shows_the_demo_real_output(capsys):
    """The README says its demo block is ``python -m dpivreg demo``'s real output: keep it so."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert cli_main(["demo"]) == 0
    out = capsys.readouterr().out
    block = out[out.index("dpivreg demo:"):out.index("No privacy leak")]
    assert block in readme, "README.md's demo output is stale: paste `python -m dpivreg demo`'s output"


def test_bound_block_is_free_post_processing(frame):
    """The bound uses only public quantities and the released Θ⁽ᵀ⁾; computing it raises no leak warning."""
    from dpivreg.estimation import theory

    model = DPIV2SLS.from_formula("y ~ 1 + w + [x1 ~ z1 + z2]", frame)
    bounds = {"y": (-40, 40), "x1": (-20, 20), "z1": (-8, 8), "z2": (-8, 8), "w": (0, 10)}
    res = model.fit(rho1=0.5, rho2=2.0, T=12, eta=1.0, alpha=0.3, seed=2, bounds=bounds, method="gd")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bound, text = res.bound, res.summary().as_text()
    # hand computation: p = 3 regressors, q = 4 instruments (Intercept, w, z1, z2), δ = (√q+√τ)/√n
    n, p, q, tau = 2000, 3, 4, 5.0
    delta = (math.sqrt(q) + math.sqrt(tau)) / math.sqrt(n)
    theta_full = np.column_stack([np.eye(4, 2), res.engine_path.theta_final])
    s = np.linalg.svd(theta_full, compute_uv=False)
    g_bar, g_under = (1 + delta) ** 2 * s[0] ** 2, (1 - delta) ** 2 * s[-1] ** 2
    kappa_beta = g_bar / (g_bar + g_under)
    kappa_theta = ((1 + delta) ** 2 - (1 - delta) ** 2) / ((1 + delta) ** 2 + (1 - delta) ** 2)
    assert res.contraction.kappa == pytest.approx(max(kappa_beta, kappa_theta), rel=1e-12)
    assert bound.optimization == pytest.approx(max(kappa_beta, kappa_theta) ** 6, rel=1e-10)
    assert bound.privacy == pytest.approx(
        math.sqrt(p) * (math.sqrt(q) + math.sqrt(tau)) ** 3 * math.sqrt(12) / (n * math.sqrt(0.5)), rel=1e-12)
    assert bound.statistical == pytest.approx(math.sqrt(p * q) * (tau + math.log(p * q)) / math.sqrt(n), rel=1e-12)
    expected = theory.error_bound(n, p, q, 12, 0.5, 2.0, tau=tau, kappa=res.contraction.kappa)
    assert bound.total == pytest.approx(expected.total, rel=1e-12) and bound.regime == expected.regime
    pre = model.fit(rho1=0.5, rho2=2.0, T=12, eta=0.5, alpha=0.3, seed=2, bounds=bounds, init="zero")
    upper, lower = (1 + delta) ** 2, (1 - delta) ** 2
    expected_theta = max(abs(1 - 0.5 * upper), abs(1 - 0.5 * lower)) ** 2
    assert pre.contraction.kappa == pytest.approx(max(0.7**2, expected_theta), rel=1e-12)
    # from the warm start: the contraction implied by the whitening error κ̂ of the release (dpivreg.estimation.tuning)
    warm = model.fit(rho1=0.5, rho2=2.0, T=12, eta=0.5, alpha=0.3, seed=2, bounds=bounds)
    kappa = warm.settings.kappa
    assert 0 < kappa < 1
    expected = max(abs(1 - 0.5 * (1 - kappa)), abs(0.5 * (1 + kappa) - 1)) ** 2, \
        max(abs(1 - 0.3 * (1 - kappa)), abs(0.3 * (1 + kappa) - 1)) ** 2
    assert (warm.contraction.kappa_theta, warm.contraction.kappa_beta) == pytest.approx(expected, rel=1e-12)
    for fragment in ["Error bound components (Theorem, up to constants)", "Optimization term", "Privacy term",
                     "Statistical term", "Dominating term", "Regime", "T condition", "n condition", "κ"]:
        assert fragment in text, fragment


LABSUP_BOUNDS_FOR_TEST = {"weeks": (0, 52), "kids": (0, 12), "samesex": (0, 1), "educ": (0, 20)}


def test_working_arrays_hold_the_exogenous_columns_once():
    """The working X̃'s exogenous columns are Z̃'s leading ones: X_endog holds X̃'s endogenous columns only and X
    assembles X̃ on access (a fit at row level holds no working arrays at all, tests/test_working_rows.py)."""
    df = load_labsup()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = DPIV2SLS.from_formula("weeks ~ 1 + educ + [kids ~ samesex]", df).fit(
            rho1=1, rho2=1, bounds=LABSUP_BOUNDS_FOR_TEST, seed=0)
    scale = res.scale
    assert scale.n_exog == 2 and scale.X_endog.shape == (df.shape[0], 1) and scale.p == 3
    np.testing.assert_array_equal(scale.X, np.column_stack([scale.Z[:, :2], scale.X_endog]))
    assert not np.shares_memory(scale.X_endog, scale.Z)


def test_paper_data_step_sizes_equal_the_eigenvalue_formula():
    """method="gd" without eta/alpha: η = 1/λ_max(Z̃ᵀZ̃/n) and α = 2/(2γ̄+γ̲) with γ the eigenvalues of x̂ᵀx̂/n,
    x̂ = [exog, Z̃Θ̂] (Θ̂ by least squares). The model computes them from a QR factor; here they are
    re-derived from the Gram matrices on the fit's working arrays."""
    df = load_labsup()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = DPIV2SLS.from_formula("weeks ~ 1 + educ + [kids ~ samesex]", df).fit(
            rho1=1, rho2=1, T=5, method="gd", bounds=LABSUP_BOUNDS_FOR_TEST, seed=0, inference=False)
    Z, X, k = res.scale.Z, res.scale.X, res.scale.n_exog
    n = Z.shape[0]
    theta = np.linalg.lstsq(Z, X[:, k:], rcond=None)[0]
    x_hat = np.column_stack([X[:, :k], Z @ theta])
    gammas = np.linalg.eigvalsh(x_hat.T @ x_hat / n)
    assert res.settings.eta == pytest.approx(1.0 / np.linalg.eigvalsh(Z.T @ Z / n)[-1], rel=1e-10)
    assert res.settings.alpha == pytest.approx(2.0 / (2.0 * gammas[-1] + max(gammas[0], 0.0)), rel=1e-10)



def test_long_runs_are_announced_with_their_expected_time(monkeypatch):
    """A loop projected (from its first steps) to run longer than LONG_RUN_SECONDS says so, once, with the
    expected time and what to change: the iteration and the inference's simulation each (threshold lowered to 0
    here; 60 s by default, which no test reaches)."""
    from dpivreg import LongRunWarning
    from dpivreg import progress as progress_bars

    monkeypatch.setattr(progress_bars, "LONG_RUN_SECONDS", 0.0)
    frame = load_labsup().iloc[:20000]
    model = DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", frame)
    with pytest.warns(LongRunWarning) as caught:
        model.fit(rho=1, T=8, seed=0, bounds={k: v for k, v in LABSUP_BOUNDS.items() if k in ("weeks", "kids", "samesex")})
    texts = [str(w.message) for w in caught if issubclass(w.category, LongRunWarning)]
    assert len(texts) == 2
    assert texts[0].startswith("DP-2S-GD: 8 steps at ") and "smaller T" in texts[0]
    # the simulation's first batch (dpivreg.inference.private.MIN_REPLICATIONS paths) announces itself
    assert re.match(r"the privacy-noise simulation \(\d+ replications", texts[1]) and "inference=False" in texts[1]
    assert all("will take about" in t for t in texts)


def test_short_fits_are_not_announced():
    frame = load_labsup().iloc[:20000]
    model = DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", frame)
    with warnings.catch_warnings():
        from dpivreg import LongRunWarning

        warnings.simplefilter("error", LongRunWarning)
        model.fit(rho=1, T=8, seed=0, bounds={k: v for k, v in LABSUP_BOUNDS.items() if k in ("weeks", "kids", "samesex")})
