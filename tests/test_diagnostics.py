"""Private first-stage diagnostics (:mod:`dpivreg.inference.diagnostics`), post-processing of the moment release.

Reference values: linearmodels' ``IV2SLS(...).fit(cov_type="unadjusted").first_stage.diagnostics`` on the same
design; with every budget infinite the release is exact and the tables must agree. The privacy-noise interval
is checked against the non-private F of the bounded data over fixed seeds.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

from dpivreg import DPIV2SLS, PrivacyLeakWarning

COLUMNS = ["rsquared", "partial.rsquared", "shea.rsquared", "f.stat", "f.pval"]


def _frame(n: int = 1500, seed: int = 2) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    z1, z2, z3, w = rng.standard_normal((4, n))
    v1, v2, e = rng.standard_normal((3, n))
    x1 = 0.3 * z1 + 0.2 * z2 + 0.4 * w + v1
    x2 = 0.1 * z1 + 0.5 * z3 + v2
    y = 1 + 0.5 * w + x1 - x2 + 0.5 * v1 + e
    return pd.DataFrame({"y": y, "x1": x1, "x2": x2, "z1": z1, "z2": z2, "z3": z3, "w": w})


@pytest.mark.parametrize("formula", [
    "y ~ 1 + w + [x1 ~ z1 + z2]",
    "y ~ 1 + w + [x1 + x2 ~ z1 + z2 + z3]",
    "y ~ 1 + [x1 ~ z1]",
    "y ~ [x1 ~ z1 + z2]",  # no constant: uncentred R², as linearmodels
    "y ~ w + [x1 + x2 ~ z1 + z2 + z3]",
])
@pytest.mark.parametrize("cov_type", ["robust", "unadjusted"])
def test_infinite_budget_equals_linearmodels_first_stage_diagnostics(formula, cov_type):
    """Both defaults robust (dpivreg's F from the first stage's meat, rho_diag; linearmodels' robust Wald F), and
    both unadjusted (the homoskedastic F from the moment release)."""
    from linearmodels import IV2SLS

    frame = _frame()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        ours = DPIV2SLS.from_formula(formula, frame).fit(rho=math.inf, seed=0, cov_type=cov_type)
    ours = ours.first_stage_diagnostics
    theirs = IV2SLS.from_formula(formula, frame).fit(cov_type=cov_type).first_stage.diagnostics
    assert list(ours.index) == list(theirs.index)
    np.testing.assert_allclose(ours[COLUMNS].to_numpy(float), theirs[COLUMNS].to_numpy(float), rtol=1e-9, atol=1e-15)
    assert list(ours["f.dist"]) == [d.replace(" ", "") for d in theirs["f.dist"]]
    np.testing.assert_allclose(ours["f.lower"], ours["f.stat"], rtol=1e-12)  # no noise: the interval is a point
    np.testing.assert_allclose(ours["f.upper"], ours["f.stat"], rtol=1e-12)


def test_private_diagnostics_cost_nothing_and_are_reproducible():
    frame = _frame()
    bounds = {c: (-6.0, 6.0) for c in ("y", "w", "x1", "z1", "z2")}
    model = DPIV2SLS.from_formula("y ~ 1 + w + [x1 ~ z1 + z2]", frame)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        res = model.fit(rho=2.0, seed=3, bounds=bounds)
        releases = res.privacy.releases
        first = res.first_stage_diagnostics
        text = res.summary().as_text()
    assert res.privacy.releases == releases and res.privacy.rho == pytest.approx(2.0, rel=1e-12)
    assert "First-stage diagnostics (private" in text
    again = model.fit(rho=2.0, seed=3, bounds=bounds).first_stage_diagnostics
    pd.testing.assert_frame_equal(first, again)
    row = first.loc["x1"]
    assert 0.0 <= row["f.lower"] < row["f.upper"]  # a percentile range of the re-released F: it need not hold F̂
    assert 0.0 <= row["partial.rsquared.lower"] < row["partial.rsquared.upper"] <= 1.0


def test_noise_interval_contains_the_non_private_f_in_most_fits():
    """The 95% privacy-noise interval contains the F of the (bounded, exact) data in ≥ 90% of 100 fits (the
    noise is the only randomness given the data; binomial sd of the share at 0.95 is 0.022, so 0.90 is 2.3 sd
    below). n = 2000, total ρ = 2 on noisy moments (the whole budget on the release); 0.925 and 0.955 over 200
    seeds in the measurement the module docstring reports."""
    frame = _frame(n=2000, seed=5)
    bounds = {c: (-6.0, 6.0) for c in frame.columns}
    formula = "y ~ 1 + w + [x1 + x2 ~ z1 + z2 + z3]"
    model = DPIV2SLS.from_formula(formula, frame)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        truth = model.fit(rho=math.inf, seed=0, bounds=bounds, rho_diag=0).first_stage_diagnostics["f.stat"]
    inside = []
    widths = []
    for seed in range(100):
        table = model.fit(rho=2.0, seed=seed, bounds=bounds, method="moments", inference=False).first_stage_diagnostics
        inside.append(((table["f.lower"] <= truth) & (truth <= table["f.upper"])).to_numpy())
        widths.append((table["f.upper"] - table["f.lower"]).to_numpy())
    share = np.mean(inside, axis=0)
    assert np.all(share >= 0.90), share
    assert np.all(np.median(widths, axis=0) > 0)


def test_bounds_route_has_no_diagnostics():
    from dpivreg.errors import InferenceUnavailableError

    frame = _frame()
    bounds = {c: (-6.0, 6.0) for c in ("y", "w", "x1", "z1", "z2")}
    res = DPIV2SLS.from_formula("y ~ 1 + w + [x1 ~ z1 + z2]", frame).fit(
        rho1=1.0, rho2=1.0, seed=0, bounds=bounds, preprocess="bounds", inference=False)
    with pytest.raises(InferenceUnavailableError, match="preprocess='private'"):
        res.first_stage_diagnostics


def _canonical_cragg_donald(frame: pd.DataFrame, formula: str) -> float:
    """Reference, independent of dpivreg's moment algebra: with W partialled out of the endogenous regressors X
    and the excluded instruments Z₂ by least squares on the raw data, CD = (n − q)/m · r²/(1 − r²) with r the
    smallest canonical correlation of X and Z₂ (Cragg & Donald 1993; Stock & Yogo 2005, eq. 3.4)."""
    d = DPIV2SLS.from_formula(formula, frame).design
    W = d.exog.to_numpy()
    X, Z2 = d.endog.to_numpy(), d.instruments.to_numpy()
    if W.shape[1]:
        X = X - W @ np.linalg.lstsq(W, X, rcond=None)[0]
        Z2 = Z2 - W @ np.linalg.lstsq(W, Z2, rcond=None)[0]
    qx, _ = np.linalg.qr(X)
    qz, _ = np.linalg.qr(Z2)
    r = np.linalg.svd(qx.T @ qz, compute_uv=False).min()
    n, m, q = len(frame), Z2.shape[1], W.shape[1] + Z2.shape[1]
    return (n - q) / m * r**2 / (1 - r**2)


@pytest.mark.parametrize("formula", ["y ~ 1 + [x1 + x2 ~ z1 + z2 + z3]", "y ~ 1 + w + [x1 + x2 ~ z1 + z2 + z3]",
                                     "y ~ [x1 + x2 ~ z1 + z2 + z3]", "y ~ 1 + w + [x1 ~ z1 + z2]"])
def test_cragg_donald_equals_the_canonical_correlation_form_with_exact_moments(formula):
    frame = _frame(3000, seed=5)
    with pytest.warns(PrivacyLeakWarning):
        res = DPIV2SLS.from_formula(formula, frame).fit(rho=math.inf, seed=0, inference=False)
    cd = res.cragg_donald
    assert cd["statistic"] == pytest.approx(_canonical_cragg_donald(frame, formula), rel=1e-8)
    assert cd["lower"] == cd["upper"] == cd["statistic"]
    if len(res.design.endog_names) == 1:  # one endogenous regressor: the F with n − q degrees of freedom
        n, q = len(frame), 4
        assert cd["statistic"] == pytest.approx(res.first_stage_diagnostics["f.stat"].iloc[0] * (n - q) / n)


def test_cragg_donald_noise_interval_and_summary_line():
    frame = _frame(5000, seed=6)
    bounds = {c: (-8.0, 8.0) for c in frame.columns}
    bounds["y"] = (-30.0, 30.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        res = DPIV2SLS.from_formula("y ~ 1 + w + [x1 + x2 ~ z1 + z2 + z3]", frame).fit(
            rho=2.0, seed=0, bounds=bounds, method="moments")
    cd = res.cragg_donald
    assert cd["lower"] <= cd["statistic"] <= cd["upper"] and cd["lower"] < cd["upper"]
    text = res.summary().as_text()
    assert "Cragg-Donald minimum eigenvalue statistic" in text and "Anderson-Rubin" not in text
