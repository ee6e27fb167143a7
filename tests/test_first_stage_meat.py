"""The first stage's robust meat (``fit(rho_diag=...)``; :func:`dpivreg.inference.covariance.first_stage_meat_release`),
its audit and the robust first-stage Wald statistic it buys.

Reference values: linearmodels' ``IV2SLS(...).fit(cov_type="robust").first_stage.diagnostics`` on the same
design (with every budget infinite), and the auditor's own per-row first-stage scores v̂ᵢ ⊗ zᵢ (no code shared
with the package).

The audit (the meat's Gaussian mechanism :func:`dpivreg.inference.covariance.release_first_stage_meat` at a fixed public
threshold C): n = 50 rows, q = 3 instruments, one endogenous regressor, Θ public. The neighbours share 49 rows
and differ in a canary whose first-stage score v·z lies far beyond C along e₁ (D) or e₂ (D′), so that after
clipping the upper triangles differ by exactly √2·C²/n, the claimed sensitivity; μ = sqrt(2ρ). S = ⟨u − mid,
d⟩/σ² is the exact log-likelihood ratio; μ_lb from Clopper–Pearson bounds on "D iff S > 0" must not exceed
sqrt(2ρ) and must reach 0.8·sqrt(2ρ), and deliberately broken variants must be caught.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from test_covariance import VARIANTS as SCORE_VARIANTS
from test_covariance import assert_sound_and_tight, audit_meat_release, clipped_score_mean
from test_privacy_audit import CONF

import dpivreg.inference.covariance as covariance
from dpivreg import DPIV2SLS, PrivacyLeakWarning
from dpivreg.compute.backends import InMemoryRows

N_ROWS, Q = 50, 3
THETA = np.array([[0.5], [0.3], [0.1]])
RHO = 2.5  # μ = sqrt(5), as in the other audits
RUNS = 2000
C = 1.5
FAR = 100.0

assert CONF == 5e-4


def auditor_scores(Z, X):
    """Per-row first-stage scores (xᵢ − Θᵀzᵢ) ⊗ zᵢ, row by row (coordinate j·q + l is v̂ᵢⱼzᵢₗ)."""
    return np.array([np.kron(x - THETA.T @ z, z) for z, x in zip(Z, X)])


def auditor_clipped_gram(Z, X, bound):
    return clipped_score_mean(auditor_scores(Z, X), bound)


def neighbours(seed: int = 20261201):
    """(Z, X, Y) of D and D′: 49 shared rows, the canary last with z = FAR·e₁ (D) or FAR·e₂ (D′) and first-stage
    residual 1, so its score is FAR·e₁ or FAR·e₂."""
    rng = np.random.default_rng(seed)
    m = N_ROWS - 1
    Z = rng.standard_normal((m, Q)) * 0.5
    X = Z @ THETA + 0.3 * rng.standard_normal((m, 1))
    Y = 0.7 * X[:, 0] + 0.4 * rng.standard_normal(m)
    worlds = []
    for direction in np.eye(Q)[:2]:
        z = FAR * direction
        worlds.append((np.vstack([Z, z]), np.vstack([X, THETA.T @ z + 1.0]), np.append(Y, 0.0)))
    return worlds


def rows_of(data):
    return InMemoryRows(*data, n_threads=1)


def test_sensitivity_is_attained_by_the_canaries():
    grams = [auditor_clipped_gram(Z, X, C) for Z, X, _ in neighbours()]
    iu = np.triu_indices(Q)
    assert np.linalg.norm((grams[0] - grams[1])[iu]) == pytest.approx(math.sqrt(2) * C**2 / N_ROWS, rel=1e-12)


@pytest.mark.parametrize("rho", [0.05, 1.0, RHO])
def test_release_record_is_exact(rho):
    """σ = √2·C²/n / sqrt(2ρ), stage ``rho_diag``, and the package's clipped sum is the auditor's."""
    D, D2 = neighbours()
    M, record, sigma = covariance.release_first_stage_meat(rows_of(D), THETA, bound=C, rho=rho,
                                                           rng=np.random.default_rng(5))
    M2, _, _ = covariance.release_first_stage_meat(rows_of(D2), THETA, bound=C, rho=rho,
                                                   rng=np.random.default_rng(5))
    delta = math.sqrt(2) * C**2 / N_ROWS
    assert sigma == pytest.approx(delta / math.sqrt(2 * rho), rel=1e-15) and record.noise_std == sigma
    assert record.sensitivity == pytest.approx(delta, rel=1e-15) and record.clip == C
    assert record.rho == pytest.approx(rho, rel=1e-12) and record.stage == "rho_diag" and record.steps == 1
    np.testing.assert_allclose(M - auditor_clipped_gram(*D[:2], C), M2 - auditor_clipped_gram(*D2[:2], C),
                               atol=1e-12)


def test_whole_release_two_records_and_kronecker_blocks():
    """Histogram (HISTOGRAM_SHARE of ρ, sensitivity √2) then the meat; with two endogenous regressors the exact
    meat's block j is (1/n)Σ zᵢzᵢᵀv̂ᵢⱼ² and its off-diagonal block (1/n)Σ zᵢzᵢᵀv̂ᵢ₁v̂ᵢ₂."""
    D, _ = neighbours()
    meat = covariance.first_stage_meat_release(rows_of(D), THETA, rho=RHO, rng=np.random.default_rng(1))
    histogram, record = meat.releases
    assert histogram.sensitivity == pytest.approx(math.sqrt(2), rel=1e-15)
    assert histogram.rho + record.rho == pytest.approx(RHO, rel=1e-12)
    assert histogram.stage == record.stage == "rho_diag" and meat.bound == record.clip
    assert np.all(np.linalg.eigvalsh(meat.matrix) >= meat.sigma * (1 - 1e-12))
    rng = np.random.default_rng(3)
    Z = rng.standard_normal((200, Q))
    theta = rng.standard_normal((Q, 2))
    X = Z @ theta + rng.standard_normal((200, 2)) * (1 + np.abs(Z[:, :1]))
    exact = covariance.first_stage_meat_release(InMemoryRows(Z, X, X[:, 0], n_threads=1), theta, rho=math.inf,
                                                rng=rng)
    V = X - Z @ theta
    for a in range(2):
        for b in range(2):
            block = (Z * (V[:, a] * V[:, b])[:, None]).T @ Z / 200
            np.testing.assert_allclose(exact.matrix[a * Q:(a + 1) * Q, b * Q:(b + 1) * Q], block, rtol=1e-12)
    assert exact.releases == () and exact.sigma == 0.0


# the same broken variants as the second stage's meat (both meats share the mechanism's code)
VARIANTS = {name: SCORE_VARIANTS[name] for name in ("correct", "no_score_clipping", "add_remove_sensitivity")}


def run_audit(variant: str, *, seed: int, runs: int = RUNS):
    worlds = neighbours()
    means = [auditor_clipped_gram(Z, X, C)[np.triu_indices(Q)] for Z, X, _ in worlds]
    return audit_meat_release(
        worlds, means, lambda rows, rng: covariance.release_first_stage_meat(rows, THETA, bound=C, rho=RHO, rng=rng),
        VARIANTS[variant], dim=Q, seed=seed, runs=runs, sigma=math.sqrt(2) * C**2 / N_ROWS / math.sqrt(2 * RHO))


def test_audit_is_sound_and_tight():
    assert_sound_and_tight(run_audit("correct", seed=51), rho=RHO, runs=RUNS, mu_canary_expected=math.sqrt(2 * RHO))


@pytest.mark.parametrize("variant", ["no_score_clipping", "add_remove_sensitivity"])
def test_audit_catches_broken_releases(variant):
    _, mu_lb, rhos, _ = run_audit(variant, seed=52)
    assert len(rhos) == 1 and rhos.pop() == pytest.approx(RHO, rel=1e-12)
    assert mu_lb > math.sqrt(2 * RHO)


# ----------------------------------------------------------------------------------------
# the fit
# ----------------------------------------------------------------------------------------
def _frame(n: int = 3000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    z1, z2, w, v, e, v2 = rng.standard_normal((6, n))
    x = 0.2 * z1 + 0.1 * z2 + 0.3 * w + v * (0.5 + np.abs(z1))
    x2 = 0.3 * z2 - 0.2 * z1 + v2 * (1 + np.abs(z2))
    y = 1 + x + 0.5 * w - x2 + e + 0.5 * v
    return pd.DataFrame({"y": y, "x": x, "x2": x2, "w": w, "z1": z1, "z2": z2})


BOUNDS = {"y": (-40.0, 40.0), "x": (-15.0, 15.0), "x2": (-15.0, 15.0), "w": (-5.0, 5.0), "z1": (-5.0, 5.0),
          "z2": (-5.0, 5.0)}


@pytest.mark.parametrize("formula", ["y ~ 1 + w + [x ~ z1 + z2]", "y ~ 1 + w + [x + x2 ~ z1 + z2]",
                                     "y ~ [x ~ z1 + z2]"])
@pytest.mark.parametrize("method", ["auto", "moments"])
def test_infinite_budget_equals_linearmodels_robust_first_stage(formula, method):
    from linearmodels import IV2SLS

    frame = _frame()
    with pytest.warns(PrivacyLeakWarning, match="first stage's meat was computed without noise"):
        res = DPIV2SLS.from_formula(formula, frame).fit(rho=math.inf, rho_diag=math.inf, seed=0, method=method)
    theirs = IV2SLS.from_formula(formula, frame).fit(cov_type="robust").first_stage.diagnostics
    mine = res.first_stage_diagnostics
    np.testing.assert_allclose(mine["f.stat"], theirs["f.stat"], rtol=1e-9)
    np.testing.assert_allclose(mine["f.pval"], theirs["f.pval"], rtol=1e-7, atol=1e-300)
    assert list(mine["f.dist"]) == list(theirs["f.dist"])
    np.testing.assert_allclose(mine["f.lower"], mine["f.stat"]) and np.testing.assert_allclose(mine["f.upper"],
                                                                                             mine["f.stat"])


@pytest.mark.parametrize("method", ["auto", "preconditioned", "moments"])
def test_total_budget_includes_rho_diag_and_its_four_records(method):
    """rho_diag buys two meats, each a histogram and a meat: the first stage's (1 − ENDOGENEITY_MEAT_SHARE of it)
    and the robust endogeneity test's (the rest)."""
    frame = _frame()
    model = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z1 + z2]", frame)
    bounds = {c: b for c, b in BOUNDS.items() if c != "x2"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        warnings.simplefilter("ignore", UserWarning)
        res = model.fit(rho=2.0, rho_diag=0.2, seed=4, bounds=bounds, method=method)
        plain = model.fit(rho=1.8, rho_diag=0, seed=4, bounds=bounds, method=method)
    assert res.privacy.rho == pytest.approx(2.0, rel=1e-12)
    assert res.privacy.rho_of("rho_diag") == pytest.approx(0.2, rel=1e-12)
    names = [r.name for r in res.privacy.releases if r.stage == "rho_diag"]
    assert names == ["score-norm histogram for the first stage's meat's threshold",
                     "first-stage meat (clipped first-stage scores)",
                     "score-norm histogram for the endogeneity test's meat's threshold",
                     "endogeneity-test meat (clipped endogeneity scores)"]
    spent = [r.rho for r in res.privacy.releases if r.stage == "rho_diag"]
    share = covariance.ENDOGENEITY_MEAT_SHARE
    assert sum(spent[:2]) == pytest.approx((1 - share) * 0.2, rel=1e-12)
    assert sum(spent[2:]) == pytest.approx(share * 0.2, rel=1e-12)
    # the rest of the total is split as fit(rho=1.8, rho_diag=0) splits it, and the estimate does not see the meat
    pd.testing.assert_series_equal(res.params, plain.params)
    assert "rho_diag (zCDP, diagnostics' meats):" in res.summary().as_text()
    assert res.first_stage_diagnostics["f.dist"].iloc[0] == "chi2(2)"
    table = res.first_stage_diagnostics.iloc[0]
    assert table["f.lower"] < table["f.stat"] < table["f.upper"]
    assert plain.first_stage_diagnostics["f.dist"].iloc[0] == "F(2,2996)"  # homoskedastic without rho_diag


@pytest.mark.parametrize("kwargs, match", [
    ({"rho": 2.0, "rho_diag": 0.2, "cov_type": "unadjusted"}, "cov_type 'robust' or 'clustered'"),
    ({"rho1": 1.0, "rho2": 1.0, "rho_diag": 0.2, "preprocess": "bounds", "inference": False}, "moment release"),
    ({"rho": 1.0, "rho_diag": 1.0}, "smaller than the total"),
    ({"rho": 1.0, "rho_diag": -0.1}, "rho_diag"),
])
def test_bad_rho_diag_is_a_clear_error(kwargs, match):
    frame = _frame(500)
    with pytest.raises(ValueError, match=match):
        DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z1 + z2]", frame).fit(
            seed=0, bounds={c: b for c, b in BOUNDS.items() if c != "x2"}, **kwargs)


def test_the_diagnostics_meats_cost_no_pass_of_their_own():
    """rho_diag's two meats are released in the robust meat's two passes (three histograms from one pass, three
    clipped sums from the next): a fit with them reads the rows as often as one without; without the inference they
    take their own row source and two passes."""
    from dpivreg.compute.backends import on_passes

    frame = _frame()
    model = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z1 + z2]", frame)
    bounds = {c: b for c, b in BOUNDS.items() if c != "x2"}

    def passes(**kw) -> int:
        count = [0]
        with warnings.catch_warnings(), on_passes(lambda: count.__setitem__(0, count[0] + 1)):
            warnings.simplefilter("ignore", UserWarning)
            model.fit(rho=2.0, seed=0, bounds=bounds, T=4, **kw)
        return count[0]

    assert passes(rho_diag=0.2) == passes()
    assert passes(rho_diag=0.2, inference=False) == passes(inference=False) + 2


def test_rho_diag_is_spent_by_default_and_zero_turns_it_off():
    """With robust errors the default spends 0.05·(rho1 + rho2) on the diagnostics' meats, on top of the stages'
    budgets, without changing the estimate; rho_diag=0 makes neither meat (and the total is the old 2.6 at
    rho1 = rho2 = 1); unadjusted errors and inference=False make none by default."""
    from dpivreg import InferenceUnavailableError

    frame = _frame()
    model = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z1 + z2]", frame)
    bounds = {c: b for c, b in BOUNDS.items() if c != "x2"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        default = model.fit(rho1=1, rho2=1, seed=2, bounds=bounds)
        off = model.fit(rho1=1, rho2=1, seed=2, bounds=bounds, rho_diag=0)
        unadjusted = model.fit(rho1=1, rho2=1, seed=2, bounds=bounds, cov_type="unadjusted")
        silent = model.fit(rho1=1, rho2=1, seed=2, bounds=bounds, inference=False)
    assert default.privacy.rho == pytest.approx(2.7, rel=1e-12)
    assert default.privacy.rho_of("rho_diag") == pytest.approx(0.1, rel=1e-12)
    assert off.privacy.rho == pytest.approx(2.6, rel=1e-12) and off.privacy.rho_of("rho_diag") == 0.0
    pd.testing.assert_series_equal(default.params, off.params)
    assert default.first_stage_diagnostics["f.dist"].iloc[0] == "chi2(2)" and math.isfinite(default.effective_f.stat)
    for res in (off, unadjusted, silent):
        assert not any(r.stage == "rho_diag" for r in res.privacy.releases)
        with pytest.raises(InferenceUnavailableError, match="rho_diag"):
            res.effective_f


def test_the_data_route_announces_the_diagnostics_meats_and_booleans_are_refused():
    """preprocess='data' computes the meats from the exact data whatever rho_diag: each is a named leak (review
    finding); a boolean rho_diag is a TypeError before any other check."""
    frame = _frame(1000)
    model = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z1 + z2]", frame)
    with pytest.warns(PrivacyLeakWarning) as caught:
        model.fit(rho1=1, rho2=1, preprocess="data", method="gd", T=5, seed=0)
    messages = [str(w.message) for w in caught]
    for meat in ("first stage's meat", "endogeneity test's meat"):
        assert f"preprocess='data': the {meat} was computed from the exact data, without noise" in " ".join(messages)
    for value in (True, False):
        with pytest.raises(TypeError, match="rho_diag must be a number"):
            model.fit(rho=2.0, rho_diag=value, cov_type="unadjusted", bounds=BOUNDS)
