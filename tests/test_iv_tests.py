"""Private IV specification tests (dpivreg.inference.iv_tests, issue 41): Sargan, Basmann, Durbin, Wu–Hausman, the
robust over-identification and endogeneity tests and the Montiel Olea–Pflueger effective F.

Reference values: with every budget infinite the statistics must equal linearmodels 7.1's (``IVResults.sargan``,
``basmann``, ``durbin()``, ``wu_hausman()``, ``wooldridge_overid``, which is Stata's score χ² of ``estat overid`` after
``vce(robust)``, and ``wooldridge_score``, Stata's robust score χ² of ``estat endogenous`` after ``vce(robust)``);
the cluster-robust score test equals its closed form written here; and, for the effective F, the closed form of
Montiel Olea & Pflueger (2013) computed here from the raw data with an HC0 meat. Private statistics are
post-processing: checked with the data's accessors set to raise.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from post_processing import forbid_data_reads
from scipy import stats

from dpivreg import DPIV2SLS, InferenceUnavailableError
from dpivreg.inference import iv_tests
from dpivreg.inference.diagnostics import _with_constant

linearmodels = pytest.importorskip("linearmodels")


def _frame(n: int = 3000, seed: int = 7, *, heteroskedastic: bool = True, invalid: float = 0.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    z1, z2, z3, w = rng.standard_normal((4, n))
    v1, v2 = rng.standard_normal((2, n))
    scale = np.exp(0.4 * z1) if heteroskedastic else 1.0
    u = (0.5 * v1 + rng.standard_normal(n)) * scale + invalid * z2
    x = 0.6 * z1 + 0.4 * z2 + 0.3 * z3 + 0.3 * w + v1
    x2 = 0.2 * z1 + 0.7 * z3 + 0.5 * z2 + v2
    y = 1.0 + 0.5 * x - 0.3 * x2 + 0.4 * w + u
    return pd.DataFrame({"y": y, "x": x, "x2": x2, "w": w, "z1": z1, "z2": z2, "z3": z3})


DESIGNS = [
    "y ~ 1 + w + [x ~ z1 + z2]",  # over-identified, a control, an intercept
    "y ~ [x ~ z1 + z2 + z3]",  # no intercept, no control
    "y ~ w + [x ~ z1 + z2]",  # a control, no intercept
    "y ~ 1 + [x + x2 ~ z1 + z2 + z3]",  # two endogenous regressors, three instruments
    "y ~ 1 + w + [x + x2 ~ z1 + z2 + z3]",  # and a control
]


def _exact(formula: str, frame: pd.DataFrame, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return DPIV2SLS.from_formula(formula, frame).fit(rho=math.inf, seed=0, method="moments", **kw)


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return _frame()


@pytest.mark.parametrize("formula", DESIGNS)
def test_infinite_budget_equals_linearmodels(formula, frame):
    mine = _exact(formula, frame, rho_diag=math.inf)
    theirs = linearmodels.IV2SLS.from_formula(formula, frame).fit(cov_type="robust")
    for name in ("sargan", "basmann", "wooldridge_overid", "wooldridge_score"):
        ours, ref = getattr(mine, name), getattr(theirs, name)
        assert ours.stat == pytest.approx(ref.stat, rel=1e-6), name
        assert ours.df == ref.df and ours.pval == pytest.approx(ref.pval, rel=1e-6, abs=1e-300), name
        assert ours.lower == ours.upper == ours.stat  # exact moments: no noise
    for name in ("durbin", "wu_hausman"):
        ours, ref = getattr(mine, name)(), getattr(theirs, name)()
        assert ours.stat == pytest.approx(ref.stat, rel=1e-6), name
        assert (ours.df, ours.df_denom) == (ref.df, getattr(ref, "df_denom", None)), name
        assert ours.pval == pytest.approx(ref.pval, rel=1e-6, abs=1e-300) and ours.dist_name == ref.dist_name
        assert ours.null == ref.null


def test_a_subset_of_endogenous_regressors(frame):
    formula = "y ~ 1 + w + [x + x2 ~ z1 + z2 + z3]"
    mine = _exact(formula, frame)
    theirs = linearmodels.IV2SLS.from_formula(formula, frame).fit()
    for variables in ("x2", ["x"]):
        for name in ("durbin", "wu_hausman"):
            ours, ref = getattr(mine, name)(variables), getattr(theirs, name)(variables)
            assert ours.stat == pytest.approx(ref.stat, rel=1e-6) and ours.df == ref.df == 1
            # linearmodels 7.1 joins the characters of a single name given as a string ("Variables x, 2 are ...")
            assert ours.null == f"Variables {variables if isinstance(variables, str) else variables[0]} are exogenous"


def test_the_robust_overidentification_test_is_the_two_step_gmm_j(frame):
    """Closed form written here: J = min_b n·g(b)ᵀΩ⁻¹g(b), Ω the HC0 meat of the 2SLS scores at the 2SLS residual."""
    formula = "y ~ 1 + w + [x ~ z1 + z2]"
    mine = _exact(formula, frame)
    n = len(frame)
    Z = np.column_stack([np.ones(n), frame.w, frame.z1, frame.z2])
    X = np.column_stack([np.ones(n), frame.w, frame.x])
    y = frame.y.to_numpy()
    Pz = Z @ np.linalg.solve(Z.T @ Z, Z.T)
    beta = np.linalg.solve(X.T @ Pz @ X, X.T @ Pz @ y)
    u = y - X @ beta
    omega = (Z * u[:, None] ** 2).T @ Z / n
    W = np.linalg.inv(omega)
    G, m = Z.T @ X / n, Z.T @ y / n
    b = np.linalg.solve(G.T @ W @ G, G.T @ W @ m)
    g = m - G @ b
    assert mine.wooldridge_overid.stat == pytest.approx(n * g @ W @ g, rel=1e-6)
    # the naive statistic at the 2SLS residuals is larger (it is not chi-squared under heteroskedasticity)
    g0 = Z.T @ u / n
    assert n * g0 @ W @ g0 > mine.wooldridge_overid.stat


def test_the_cluster_robust_endogeneity_test_is_its_closed_form(frame):
    """Closed form written here (Wooldridge 2010 eq. 6.19 with cluster sums): e the OLS residual of y on X, v̂ the
    residual of x on the instruments, r = M_X v̂; stat = (Σᵢrᵢeᵢ)ᵀ(Σ_c s_c s_cᵀ)⁻¹(Σᵢrᵢeᵢ), s_c = Σ_{i∈c} rᵢeᵢ. With
    one row per cluster it would be linearmodels' wooldridge_score; 60 clusters of 50 rows here."""
    data = frame.assign(g=np.arange(len(frame)) % 60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mine = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z1 + z2]", data).fit(
            rho=math.inf, rho_diag=math.inf, seed=0, method="moments", clusters="g")
    n = len(data)
    Z = np.column_stack([np.ones(n), data.w, data.z1, data.z2])
    X = np.column_stack([np.ones(n), data.w, data.x])

    def residual(A, b):
        return b - A @ np.linalg.lstsq(A, b, rcond=None)[0]

    s = residual(X, residual(Z, data.x.to_numpy())) * residual(X, data.y.to_numpy())
    sums = np.bincount(data.g, weights=s)
    test = mine.wooldridge_score
    assert test.stat == pytest.approx(s.sum() ** 2 / np.sum(sums**2), rel=1e-6)
    assert "cluster-robust" in test.name and test.df == 1 and test.pval == pytest.approx(stats.chi2(1).sf(test.stat))


def _effective_f_raw(frame: pd.DataFrame, controls: list[str], instruments: list[str]) -> float:
    """Montiel Olea–Pflueger's F_eff = π̂ᵀQπ̂ / tr(Q⁻¹S) with the controls partialled out, Q = Z̃ᵀZ̃ and S the HC0
    meat Σ z̃ᵢz̃ᵢᵀv̂ᵢ² of the first-stage residuals."""
    n = len(frame)
    C = np.column_stack([np.ones(n), *(frame[c] for c in controls)])
    Z = frame[instruments].to_numpy()
    x = frame.x.to_numpy()
    annihilate = lambda A: A - C @ np.linalg.lstsq(C, A, rcond=None)[0]  # noqa: E731
    Zt, xt = annihilate(Z), annihilate(x)
    Q = Zt.T @ Zt
    pi = np.linalg.solve(Q, Zt.T @ xt)
    v = xt - Zt @ pi
    S = (Zt * v[:, None] ** 2).T @ Zt
    return float(pi @ Q @ pi / np.trace(np.linalg.solve(Q, S)))


@pytest.mark.parametrize(("formula", "controls", "instruments"), [
    ("y ~ 1 + w + [x ~ z1 + z2]", ["w"], ["z1", "z2"]),
    ("y ~ 1 + [x ~ z1 + z2 + z3]", [], ["z1", "z2", "z3"]),
])
def test_effective_f_equals_the_closed_form(formula, controls, instruments, frame):
    mine = _exact(formula, frame, rho_diag=math.inf).effective_f
    assert mine.stat == pytest.approx(_effective_f_raw(frame, controls, instruments), rel=1e-6)
    assert mine.lower == mine.upper == mine.stat
    assert 1 <= mine.k_eff <= len(instruments) and mine.critical_value > 0


def test_effective_f_with_one_instrument_is_the_robust_first_stage_f(frame):
    formula = "y ~ 1 + w + [x ~ z1]"
    mine = _exact(formula, frame, rho_diag=math.inf)
    theirs = linearmodels.IV2SLS.from_formula(formula, frame).fit(cov_type="robust")
    assert mine.effective_f.stat == pytest.approx(theirs.first_stage.diagnostics["f.stat"].iloc[0], rel=1e-6)
    assert mine.effective_f.k_eff == pytest.approx(1.0)
    # MOP's simplified critical value for one instrument, tau = 10%: the 95% quantile of chi2(1, 10)
    assert mine.effective_f.critical_value == pytest.approx(stats.ncx2.ppf(0.95, 1, 10), rel=1e-9)
    assert mine.effective_f.critical_value == pytest.approx(23.1085, abs=1e-4)


def test_simplified_critical_value_exact_values():
    # W proportional to I: K_eff = K (the homoskedastic case)
    c, k = iv_tests.simplified_critical_value(np.ones(3))
    assert k == pytest.approx(3.0) and c == pytest.approx(stats.ncx2.ppf(0.95, 3, 30) / 3, rel=1e-12)
    # one dominant eigenvalue: K_eff -> 1
    c1, k1 = iv_tests.simplified_critical_value(np.array([1.0, 1e-12, 1e-12]))
    assert k1 == pytest.approx(1.0, rel=1e-9) and c1 == pytest.approx(stats.ncx2.ppf(0.95, 1, 10), rel=1e-6)


def test_exactly_identified_and_missing_releases_are_refused_clearly(frame):
    just = _exact("y ~ 1 + w + [x ~ z1]", frame)
    for name in ("sargan", "basmann", "wooldridge_overid"):
        with pytest.raises(InferenceUnavailableError, match="exactly identified"):
            getattr(just, name)
    assert just.durbin().df == 1  # the endogeneity tests hold for an exactly identified model
    without_diag = _exact("y ~ 1 + w + [x ~ z1 + z2]", frame, rho_diag=0)
    for name in ("effective_f", "wooldridge_score"):
        with pytest.raises(InferenceUnavailableError, match=r"rho_diag=0, cov_type="):
            getattr(without_diag, name)
    with pytest.raises(InferenceUnavailableError, match="one endogenous regressor"):
        _exact("y ~ 1 + [x + x2 ~ z1 + z2 + z3]", frame, rho_diag=math.inf).effective_f
    with pytest.raises(InferenceUnavailableError, match="cov_type='robust'"):
        _exact("y ~ 1 + w + [x ~ z1 + z2]", frame, cov_type="unadjusted").wooldridge_overid
    with pytest.raises(ValueError, match="not endogenous regressors"):
        just.durbin("w")
    with pytest.raises(TypeError, match="variables"):
        just.wu_hausman(3)


@pytest.fixture(scope="module")
def private_fit():
    frame = _frame(20_000, seed=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z1 + z2]", frame).fit(
            rho=2.0, rho_diag=0.2, seed=3, bounds={c: (-8.0, 8.0) for c in frame.columns})


def test_private_tests_are_post_processing(private_fit, monkeypatch):
    """No statistic reads the data: with the design's row accessors set to raise every one still comes, and the fit's
    budget is what it was."""
    res = private_fit
    spent = res.privacy.rho
    forbid_data_reads(monkeypatch, res.design, "an IV test")
    tests = [res.sargan, res.basmann, res.wooldridge_overid, res.durbin(), res.wu_hausman(), res.wooldridge_score]
    assert all(math.isfinite(t.stat) and 0 < t.pval <= 1 and t.lower <= t.upper for t in tests)
    assert math.isfinite(res.effective_f.stat) and res.effective_f.lower <= res.effective_f.upper
    assert res.privacy.rho == spent
    assert "free" in res.sargan.cost and "rho_diag" in res.effective_f.cost and "rho_diag" in res.wooldridge_score.cost
    text = str(res.sargan)
    assert "Privacy-noise 95% interval" in text and "H0: The model is not overidentified." in text


def test_private_pvalues_use_the_noise_not_the_large_sample_law(private_fit):
    """The released statistic carries the noise; its p-value is against its simulated law under the null with that
    noise, which is wider than the noise-free law (so the p-value is larger than the naive one)."""
    res = private_fit
    for t in (res.sargan, res.wooldridge_overid, res.wu_hausman(), res.wooldridge_score):
        assert t.null_draws is not None and t.null_draws.size == iv_tests.NULL_DRAWS
        assert np.quantile(t.null_draws, 0.95) > t.dist.ppf(0.95)
        assert t.stat >= 0 and t.lower >= 0 and np.all(t.null_draws >= 0)  # noise below 0 is reported as 0
        assert t.pval == pytest.approx((1 + np.sum(t.null_draws >= t.stat)) / (1 + t.null_draws.size))


SIZE_RUNS = 120


def test_private_tests_keep_their_size_where_the_naive_law_does_not():
    """Valid instruments and an exogenous regressor, n = 10⁴, total ρ = 2.6: rejection rates at 5% over SIZE_RUNS fits
    (fixed seeds). The binomial standard error at 5% is 2.0 points, so the private rates must lie within 0.05 ± 0.06
    (three of them); the naive chi-squared p-values, which ignore the privacy noise, reject in most fits (0.64 and
    0.68 of 300 fits when measured). The fits buy the robust diagnostics' meats (``rho_diag``, 5% of ρ) for the
    robust endogeneity test."""
    rng = np.random.default_rng(11)
    bounds = {"y": (-12.0, 14.0), "x": (-6.0, 6.0), "w": (-5.0, 5.0), "z1": (-5.0, 5.0), "z2": (-5.0, 5.0)}
    rejections = np.zeros(5)
    naive = np.zeros(2)
    for run in range(SIZE_RUNS):
        z1, z2, w, v, u = rng.standard_normal((5, 10_000))
        x = 0.3 * z1 + 0.2 * z2 + 0.2 * w + v
        data = pd.DataFrame({"y": 1 + 0.5 * x + 0.3 * w + u, "x": x, "w": w, "z1": z1, "z2": z2})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z1 + z2]", data).fit(rho=2.6, rho_diag=0.13, bounds=bounds,
                                                                               seed=run)
        tests = [res.sargan, res.wooldridge_overid, res.wu_hausman(), res.durbin(), res.wooldridge_score]
        rejections += [t.pval < 0.05 for t in tests]
        naive += [tests[0].pval_nonprivate_law < 0.05, tests[2].pval_nonprivate_law < 0.05]
    rates = rejections / SIZE_RUNS
    tolerance = 3 * math.sqrt(0.05 * 0.95 / SIZE_RUNS)
    assert np.all(np.abs(rates - 0.05) <= tolerance), rates
    assert np.all(naive / SIZE_RUNS > 0.3), naive / SIZE_RUNS


def test_monotone_twins_share_the_simulated_pvalue_and_critical_values_come_from_it(private_fit):
    res = private_fit
    assert res.basmann.pval == res.sargan.pval and res.wu_hausman().pval == res.durbin().pval
    t = res.sargan
    assert t.critical_values["5%"] == pytest.approx(np.quantile(t.null_draws, 0.95, method="inverted_cdf"))
    assert t.critical_values["5%"] > t.dist.ppf(0.95)  # the noise-free law's would reject too often
    assert "simulated law under H0 with the privacy noise" in str(t)


def test_a_residual_variance_the_release_cannot_resolve_is_refused(frame):
    """Sargan's statistic divides by σ̂²: where the noise of the re-releases is as large as σ̂² itself the tests are
    refused rather than reported as 1e301."""
    exact = _exact("y ~ 1 + w + [x ~ z1 + z2]", frame)
    moments = exact.scale.moments
    point = _with_constant(moments, moments.matrix)
    at = iv_tests._Layout(4, 2, 1)
    _, sigma2 = iv_tests._moment_and_variance(point, at.Z, at.X, at.y)
    rng = np.random.default_rng(0)
    small = point + 1e-6 * float(sigma2) * rng.standard_normal((200, 1, 1)) * np.eye(point.shape[0])
    assert iv_tests._require_resolved_variance(point, small, at.Z, at.X, at.y, "Sargan") == pytest.approx(sigma2)
    shaken = point.copy()[None].repeat(200, axis=0)
    shaken[:, at.y, at.y] += 1.5 * float(sigma2) * rng.standard_normal(200)  # a noise s.d. above σ̂²
    with pytest.raises(InferenceUnavailableError, match="cannot tell from 0"):
        iv_tests._require_resolved_variance(point, shaken, at.Z, at.X, at.y, "Sargan's and Basmann's tests")


@pytest.mark.parametrize(("lower", "upper", "weak", "possibly"), [
    (1.0, 5.0, True, True), (5.0, 40.0, False, True), (30.0, 40.0, False, False)])
def test_the_effective_f_weak_flags_read_the_noise_interval(lower, upper, weak, possibly):
    f = iv_tests.EffectiveF("x", 20.0, 23.1, 1.0, lower, upper, "cost")
    assert (f.weak, f.possibly_weak) == (weak, possibly)
    assert ("WEAK" in str(f)) == weak and ("possibly weak" in str(f)) == (possibly and not weak)
