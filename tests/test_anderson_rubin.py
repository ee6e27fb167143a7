"""The Anderson–Rubin confidence set (``res.anderson_rubin``; :mod:`dpivreg.inference.anderson_rubin`).

Reference values: with ρ = ∞ the set must be the classical AR set. The reference here is computed
independently of the package, from the raw data: least-squares residual matrices of (y, x) on the exogenous
regressors and on all instruments give the AR inequality as a quadratic in b, solved in closed form
(``classical_ar_set``); the statistic at single points is checked against statsmodels' OLS ``f_test`` of the
instruments in the regression of y − x·b (times m).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats

from dpivreg import DPIV2SLS, PrivacyLeakWarning
from dpivreg.errors import InferenceUnavailableError
from dpivreg.inference.anderson_rubin import AndersonRubinSet, anderson_rubin_set


def _design(n: int, *, strength: float, seed: int, exog: bool = True, m: int = 1, direct: float = 0.0,
            constant: bool = True, endogeneity: float = 0.8):
    """y = 1 + 0.5w + 2x + u (+ direct·z₂: an invalid instrument), x = strength·Σz + 0.3w + v, corr(u, v) =
    ``endogeneity``, unit variances."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, m))
    w = rng.standard_normal(n)
    u = rng.standard_normal(n)
    v = endogeneity * u + math.sqrt(1.0 - endogeneity**2) * rng.standard_normal(n)
    x = strength * z.sum(axis=1) + (0.3 * w if exog else 0.0) + v
    y = (1.0 if constant else 0.0) + (0.5 * w if exog else 0.0) + 2.0 * x + u + direct * z[:, -1]
    frame = pd.DataFrame({"y": y, "x": x, "w": w, **{f"z{j + 1}": z[:, j] for j in range(m)}})
    instruments = " + ".join(f"z{j + 1}" for j in range(m))
    formula = f"y ~ {'1 + ' if constant else '0 + '}{'w + ' if exog else ''}[x ~ {instruments}]"
    if not constant and not exog:
        formula = f"y ~ 0 + [x ~ {instruments}]"
    return frame, formula


def classical_ar_set(frame: pd.DataFrame, formula: str, level: float) -> tuple[tuple[float, float], ...]:
    """The classical AR set from the raw data: {b : (n − q)·vᵀ(A − B)v / vᵀBv ≤ m·F_level(m, n − q)} with
    v = (1, −b), A and B the residual cross-products of (y, x) on W and on [W, Z₂]; a quadratic in b."""
    model = DPIV2SLS.from_formula(formula, frame)
    d = model.design
    W = d.exog.to_numpy()
    Z2 = d.instruments.to_numpy()
    yx = np.column_stack([d.dependent.to_numpy()[:, 0], d.endog.to_numpy()[:, 0]])
    n, m = len(frame), Z2.shape[1]
    q = W.shape[1] + m

    def residual_products(R):
        if R.shape[1] == 0:
            E = yx
        else:
            E = yx - R @ np.linalg.lstsq(R, yx, rcond=None)[0]
        return E.T @ E

    A, B = residual_products(W), residual_products(np.column_stack([W, Z2]))
    k = m * stats.f.ppf(level, m, n - q) / (n - q)
    Q = (A - B) - k * B  # AR(b) ≤ c  ⟺  vᵀQv ≤ 0
    a, h, c = Q[1, 1], -Q[0, 1], Q[0, 0]  # vᵀQv = c + 2hb + ab²
    disc = h * h - a * c
    if a > 0:
        if disc < 0:
            return ()
        r = math.sqrt(disc)
        return (((-h - r) / a, (-h + r) / a),)
    if disc < 0:
        return ((-math.inf, math.inf),)
    r = math.sqrt(disc)
    lo, hi = sorted(((-h - r) / a, (-h + r) / a))
    return ((-math.inf, lo), (hi, math.inf))


def _exact_fit(frame, formula, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        return DPIV2SLS.from_formula(formula, frame).fit(rho=math.inf, seed=0, **kwargs)


@pytest.mark.parametrize("formula", ["y ~ 0 + [x ~ z1 + z2]", "y ~ 0 + w + [x ~ z1 + z2]", "y ~ 1 + w + [x ~ z1]"])
def test_asymmetric_bounds_without_an_intercept_are_the_classical_set(formula):
    """Bounds not centred at 0 make the release's box scale shift the columns; without an intercept the working
    scale must not shift them (the AR regression has no constant to absorb a shift)."""
    frame, _ = _design(n=3000, strength=0.2, seed=21, m=2, constant=False)
    frame = frame + {"y": 6.0, "x": 2.0, "w": 1.0, "z1": 1.5, "z2": 1.0}  # off zero: the regressions need no constant
    bounds = {"y": (-15.0, 40.0), "x": (-5.0, 12.0), "w": (-4.0, 6.0), "z1": (-3.0, 6.0), "z2": (-4.0, 5.5)}
    assert all((frame[c].between(*b)).all() for c, b in bounds.items())  # nothing clipped: the raw data's set
    ar = _exact_fit(frame, formula, method="moments",
                    bounds={c: b for c, b in bounds.items() if c in formula}).anderson_rubin()
    reference = classical_ar_set(frame, formula, 0.95)
    assert len(ar.intervals) == len(reference)
    for mine, theirs in zip(ar.intervals, reference):
        np.testing.assert_allclose(mine, theirs, rtol=1e-7, atol=1e-9)


# strength: the first-stage coefficient; the kinds are what the classical set is on these seeds
CASES = {
    "strong, with w": dict(n=4000, strength=0.3, seed=1),
    "weak: unbounded": dict(n=4000, strength=0.02, seed=2),
    "no exogenous, no constant": dict(n=3000, strength=0.2, seed=3, exog=False, constant=False),
    "two instruments": dict(n=4000, strength=0.05, seed=4, m=2),
    "invalid instrument: empty": dict(n=4000, strength=0.2, seed=5, m=2, direct=0.5),
    "irrelevant: whole line": dict(n=3000, strength=0.0, seed=11, m=2),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("level", [0.9, 0.95])
def test_infinite_budget_is_the_classical_set(case, level):
    frame, formula = _design(**CASES[case])
    ar = _exact_fit(frame, formula).anderson_rubin(level=level)
    reference = classical_ar_set(frame, formula, level)
    assert len(ar.intervals) == len(reference), (ar, reference)
    for mine, theirs in zip(ar.intervals, reference):
        np.testing.assert_allclose(mine, theirs, rtol=1e-7, atol=1e-9)
    assert not ar.private


def test_the_cases_cover_every_shape():
    kinds = {case: _exact_fit(*_design(**spec)).anderson_rubin().kind for case, spec in CASES.items()}
    assert set(kinds.values()) == {"bounded", "unbounded", "empty", "whole line"}, kinds
    assert kinds["weak: unbounded"] == "unbounded"
    assert kinds["invalid instrument: empty"] == "empty"
    assert kinds["irrelevant: whole line"] == "whole line"


@pytest.mark.parametrize("case", ["strong, with w", "two instruments", "no exogenous, no constant"])
def test_statistic_is_m_times_the_ols_f_test(case):
    frame, formula = _design(**CASES[case])
    ar = _exact_fit(frame, formula).anderson_rubin()
    d = DPIV2SLS.from_formula(formula, frame).design
    R = np.column_stack([d.exog.to_numpy(), d.instruments.to_numpy()])
    m = d.instruments.shape[1]
    restriction = np.hstack([np.zeros((m, d.exog.shape[1])), np.eye(m)])
    for b in (-1.0, 1.7, 2.0, 3.5):
        e = frame["y"].to_numpy() - b * frame["x"].to_numpy()
        f = sm.OLS(e, R).fit().f_test(restriction)
        assert float(ar.statistic(b)) == pytest.approx(m * float(np.squeeze(f.fvalue)), rel=1e-8)
        assert float(ar.pvalue(b)) == pytest.approx(float(f.pvalue), rel=1e-6, abs=1e-12)


def test_set_is_where_the_test_does_not_reject():
    frame, formula = _design(**CASES["strong, with w"])
    ar = _exact_fit(frame, formula).anderson_rubin()
    (lo, hi), = ar.intervals
    assert ar.pvalue(lo) == pytest.approx(0.05, rel=1e-6) and ar.pvalue(hi) == pytest.approx(0.05, rel=1e-6)
    inside, outside = (lo + hi) / 2, hi + (hi - lo)
    assert inside in ar and ar.pvalue(inside) > 0.05
    assert outside not in ar and ar.pvalue(outside) < 0.05
    assert ar.length == pytest.approx(hi - lo)
    assert str(ar) == f"[{lo:.4g}, {hi:.4g}]"


BOUNDS = {"y": (-25.0, 27.0), "x": (-7.0, 7.0), "w": (-5.0, 5.0), "z1": (-5.0, 5.0), "z2": (-5.0, 5.0)}


def _private_fit(frame, formula, rho, seed, **kwargs):
    bounds = {c: b for c, b in BOUNDS.items() if c in frame}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return DPIV2SLS.from_formula(formula, frame).fit(rho=rho, seed=seed, bounds=bounds, **kwargs)


def test_the_noise_widens_the_set_pointwise():
    """The privacy noise enters the statistic's variance only: at every b the private statistic is at most the
    classical one computed from the same released moments (noise term set to zero)."""
    from dpivreg.inference.diagnostics import released_grams

    frame, formula = _design(**CASES["two instruments"])
    res = _private_fit(frame, formula, 2.0, 0, method="moments", inference=False)
    ar = res.anderson_rubin()
    assert ar.private
    gram, _ = released_grams(res.scale.moments)
    k = res.scale.n_exog
    plain = anderson_rubin_set(gram, None, variable="x", n_exog=k, q=res.scale.Z.shape[1], n=len(frame),
                               to_original=float(res.scale.beta_jacobian()[k, k]))
    grid = np.linspace(-20, 20, 401)
    assert np.all(ar.statistic(grid) <= plain.statistic(grid) * (1 + 1e-12))
    assert np.any(ar.statistic(grid) < 0.9 * plain.statistic(grid))


def test_calling_it_releases_nothing_and_gives_the_same_set_every_time():
    frame, formula = _design(**CASES["strong, with w"])
    res = _private_fit(frame, formula, 1.0, 3)
    before = (res.privacy.rho, len(res.privacy.releases))
    ar = res.anderson_rubin()
    assert (res.privacy.rho, len(res.privacy.releases)) == before
    del res.__dict__["_released_grams"]  # recompute the simulation: its seed is fixed, so the set is the same
    assert res.anderson_rubin() == ar


def test_simulated_noise_variance_matches_independent_releases():
    """The noise term is the right size: the simulated variance of π̂(b₀) = Π̂(1, −b₀) over re-releases of one
    release matches its variance over 300 independent releases of the same data (ratio within [0.75, 1.33],
    about four Monte Carlo standard errors of a variance from 300 draws)."""
    from dpivreg.inference.anderson_rubin import reduced_form
    from dpivreg.inference.diagnostics import released_grams

    frame, formula = _design(n=3000, strength=0.1, seed=31, m=2)
    model = DPIV2SLS.from_formula(formula, frame)
    bounds = {c: b for c, b in BOUNDS.items() if c in frame}
    k, q = 2, 4

    def pi_at_truth(res, grams):
        v = np.array([1.0, -2.0 / res.scale.beta_jacobian()[k, k]])
        return reduced_form(grams, k, q)[1] @ v  # (…, m)

    released = []
    for seed in range(300):
        res = model.fit(rho=0.5, seed=seed, bounds=bounds, method="moments", inference=False)
        released.append(pi_at_truth(res, released_grams(res.scale.moments)[0]))
    independent = np.cov(np.array(released), rowvar=False)
    res = model.fit(rho=0.5, seed=999, bounds=bounds, method="moments", inference=False)
    simulated = np.cov(pi_at_truth(res, released_grams(res.scale.moments)[1]), rowvar=False)
    ratio = np.diag(simulated) / np.diag(independent)
    assert np.all((0.75 < ratio) & (ratio < 1.33)), ratio


def test_coverage_under_a_weak_first_stage():
    """Weak instrument (population first-stage F ≈ 2), strong endogeneity (0.95), n = 20,000, noisy moments at
    ρ = 10: over 200 seeds the private AR set covers the true β in at least 0.95 − 3·√(0.95·0.05/200) ≈ 0.904
    (measured: 0.93; the classical AR set on the same data sets 0.925), while most sets are unbounded, as they
    must be when the first stage cannot be told from zero. The Wald intervals' shortfall in such designs is
    the benchmark's (``interval_coverage.py --weak``)."""
    runs, covered, bounded = 200, 0, 0
    for seed in range(runs):
        frame, formula = _design(n=20_000, strength=math.sqrt(1.0 / 20_000), seed=1000 + seed, exog=False,
                                 endogeneity=0.95)
        res = _private_fit(frame.drop(columns="w"), formula, 10.0, seed, method="moments", inference=False)
        ar = res.anderson_rubin()
        covered += 2.0 in ar
        bounded += ar.bounded
    assert covered / runs >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / runs)
    assert bounded / runs < 0.5


def test_summary_reports_the_set_and_a_weak_instrument_warning():
    frame, formula = _design(n=3000, strength=0.02, seed=7)
    res = _private_fit(frame, formula, 2.0, 1)
    text = res.summary().as_text()
    assert "Anderson-Rubin 95% set for x" in text and str(res.anderson_rubin()) in text
    assert "WEAK INSTRUMENTS" in text
    strong = _private_fit(*_design(n=20_000, strength=0.5, seed=8), 10.0, 1)
    assert "WEAK INSTRUMENTS" not in strong.summary().as_text()


def test_needs_one_endogenous_regressor_and_the_moment_release():
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.standard_normal((500, 5)), columns=["y", "x1", "x2", "z1", "z2"])
    res = _exact_fit(frame, "y ~ 1 + [x1 + x2 ~ z1 + z2]")
    with pytest.raises(ValueError, match="one endogenous regressor.*x1, x2"):
        res.anderson_rubin()
    frame, formula = _design(**CASES["strong, with w"])
    bounds = {c: b for c, b in BOUNDS.items() if c in frame}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        plain = DPIV2SLS.from_formula(formula, frame).fit(rho=1.0, seed=0, bounds=bounds, preprocess="bounds",
                                                          inference=False)
    with pytest.raises(InferenceUnavailableError, match="Anderson–Rubin set: not available without the moment release"):
        plain.anderson_rubin()


def test_exact_moments_are_labelled_not_private():
    frame, formula = _design(**CASES["strong, with w"])
    text = _exact_fit(frame, formula).summary().as_text()
    assert "from exact moments: NOT private" in text and "noise interval" not in text


def test_as_many_instruments_as_rows_is_a_clear_error():
    G = np.eye(5)
    with pytest.raises(ValueError, match="more rows than instruments"):
        anderson_rubin_set(G, None, variable="x", n_exog=1, q=2, n=2, to_original=1.0)


def test_statistic_at_infinity_is_the_first_stage_test():
    frame, formula = _design(**CASES["weak: unbounded"])
    ar = _exact_fit(frame, formula).anderson_rubin()
    assert np.isfinite(ar.statistic(math.inf)) and ar.statistic(math.inf) == pytest.approx(ar.statistic(-math.inf))
    assert ar.statistic(math.inf) == pytest.approx(float(ar.statistic(1e12)), rel=1e-6)
    assert ar.statistic(math.inf) <= ar.critical_value  # unbounded: the zero first stage is not rejected


@pytest.mark.parametrize("level", [0.0, 1.0, 95, True, "0.95"])
def test_bad_level_is_a_clear_error(level):
    frame, formula = _design(**CASES["strong, with w"])
    with pytest.raises(ValueError, match="level must lie in"):
        _exact_fit(frame, formula).anderson_rubin(level=level)


def test_set_type_reports_its_shape():
    empty = AndersonRubinSet("x", 0.95, (), 3.84, (1, 100), True)
    line = AndersonRubinSet("x", 0.95, ((-math.inf, math.inf),), 3.84, (1, 100), True)
    outer = AndersonRubinSet("x", 0.95, ((-math.inf, -1.0), (2.0, math.inf)), 3.84, (1, 100), True)
    assert (empty.kind, line.kind, outer.kind) == ("empty", "whole line", "unbounded")
    assert str(empty) == "empty" and str(line) == "(-inf, inf)" and str(outer) == "(-inf, -1] ∪ [2, inf)"
    assert 5.0 in outer and 0.0 not in outer and not outer.bounded and outer.length == math.inf


@pytest.mark.parametrize("case", ["strong, with w", "weak: unbounded", "two instruments"])
def test_sets_narrower_than_the_grid_are_found(monkeypatch, case):
    """A precisely estimated coefficient's set can be far narrower than the angle grid's spacing: with a grid
    of 9 angles the set must still be the classical one (the statistic's extremes join the grid)."""
    import dpivreg.inference.anderson_rubin as module

    monkeypatch.setattr(module, "GRID_POINTS", 9)
    frame, formula = _design(**CASES[case])
    ar = _exact_fit(frame, formula).anderson_rubin()
    reference = classical_ar_set(frame, formula, 0.95)
    assert len(ar.intervals) == len(reference)
    for mine, theirs in zip(ar.intervals, reference):
        np.testing.assert_allclose(mine, theirs, rtol=1e-7, atol=1e-9)
