"""The default pipeline's pieces: warm start, noisy moments, total budgets, the estimator choice, tuning rules.

Exact limits are checked against linearmodels (reference values computed by IV2SLS on the same data in the
test); statistical properties with fixed seeds and tolerances stated in each docstring.
"""

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from linearmodels.iv import IV2SLS

from dpivreg import DPIV2SLS, PrivacyLeakWarning
from dpivreg.datasets import LABSUP_BOUNDS, load_labsup, simulate_iv
from dpivreg.estimation import tuning
from dpivreg.estimation.moments import residual_variance_from_moments, solve_2sls
from dpivreg.estimation.selection import MAX_KAPPA, T_CANDIDATES, choose_iterations, shortest_near_best
from dpivreg.privacy.mechanisms import box_moment_sum


@pytest.fixture(scope="module")
def frame():
    rng = np.random.default_rng(5)
    n = 3000
    z1, z2, u = rng.standard_normal((3, n))
    w = rng.uniform(0, 10, n)
    x = 1.0 + z1 + 0.5 * z2 + u + rng.standard_normal(n)
    y = 2.0 + 1.5 * x + 0.3 * w + u + rng.standard_normal(n)
    return pd.DataFrame({"y": y, "x": x, "z1": z1, "z2": z2, "w": w})


FORMULAS = ["y ~ 1 + [x ~ z1 + z2]", "y ~ 1 + w + [x ~ z1 + z2]", "y ~ [x ~ z1 + z2]"]
WIDE = {"y": (-60.0, 60.0), "x": (-30.0, 30.0), "z1": (-8.0, 8.0), "z2": (-8.0, 8.0), "w": (-1.0, 11.0)}


def _bounds(model):
    d = model.design
    return {c: WIDE[c] for c in [d.dependent_name, *d.regressor_names, *d.instrument_names] if c in WIDE}


# ----------------------------------------------------------------------------------------
# 2SLS from moments, the warm start and the moment estimator: exact limits
# ----------------------------------------------------------------------------------------
def test_solve_2sls_on_exact_moments_is_2sls():
    """solve_2sls on ZᵀZ/n, ZᵀX/n, Zᵀy/n equals closed-form 2SLS (1e-10), also for a stack of moments."""
    rng = np.random.default_rng(0)
    n, q, k = 500, 4, 2
    Z = np.column_stack([np.ones(n), rng.standard_normal((n, q - 1))])
    X_endog = Z @ rng.standard_normal((q, 1)) + rng.standard_normal((n, 1))
    y = 1.0 + Z[:, 1] + 2.0 * X_endog[:, 0] + rng.standard_normal(n)
    W = np.column_stack([Z, X_endog, y])
    S = W.T @ W / n
    theta, beta = solve_2sls(S, q, k, 1)
    X = np.column_stack([Z[:, :k], X_endog])
    X_hat = Z @ np.linalg.lstsq(Z, X, rcond=None)[0]
    np.testing.assert_allclose(beta, np.linalg.lstsq(X_hat, y, rcond=None)[0], rtol=1e-10)
    np.testing.assert_allclose(theta, np.linalg.lstsq(Z, X_endog, rcond=None)[0], rtol=1e-10)
    stacked_theta, stacked_beta = solve_2sls(np.stack([S, 2 * S]), q, k, 1)
    np.testing.assert_allclose(stacked_beta, np.stack([beta, beta]), rtol=1e-10)
    residual = y - X @ beta
    assert residual_variance_from_moments(S, q, k, beta) == pytest.approx(residual @ residual / n, rel=1e-9)


@pytest.mark.parametrize("formula", FORMULAS)
def test_noiseless_moments_estimator_and_warm_start_are_2sls(frame, formula):
    """With exact moments (rho = inf) the moment estimator is 2SLS, its covariance the unadjusted 2SLS one, and
    DP-2S-GD starts at 2SLS: with no noise and no clipping its whole path stays there (to 1e-8)."""
    model = DPIV2SLS.from_formula(formula, frame)
    ref = IV2SLS.from_formula(formula, frame).fit(cov_type="unadjusted")
    with pytest.warns(PrivacyLeakWarning, match="not private"):
        moments = model.fit(rho=math.inf, method="moments", bounds=_bounds(model), seed=0, cov_type="unadjusted")
    np.testing.assert_allclose(moments.params.to_numpy(), ref.params.to_numpy(), rtol=1e-8)
    np.testing.assert_allclose(moments.cov_params().to_numpy(), ref.cov.to_numpy(), rtol=1e-6)
    assert moments.estimator == "noisy moments" and moments.path.shape[0] == 1
    with pytest.warns(PrivacyLeakWarning):
        gd = model.fit(rho1=math.inf, rho2=math.inf, rho0=math.inf, clip=False, T=4, bounds=_bounds(model), seed=0,
                       method="preconditioned", inference=False)
    assert gd.settings.init == "moments"
    for row in gd.path.to_numpy():
        np.testing.assert_allclose(row, ref.params.to_numpy(), rtol=1e-8, atol=1e-10)


def test_box_moment_sum_clips_entries_and_prepends_the_constant():
    V = np.array([[0.5, 2.0], [-3.0, 0.25]])
    expected_rows = np.array([[1.0, 0.5, 1.0], [1.0, -1.0, 0.25]])
    np.testing.assert_array_equal(box_moment_sum(V, True), expected_rows.T @ expected_rows)
    np.testing.assert_array_equal(box_moment_sum(V, False), expected_rows[:, 1:].T @ expected_rows[:, 1:])


# ----------------------------------------------------------------------------------------
# budgets
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, releases", [
    ({}, {"rho0", "rho_clip", "rho1", "rho2", "rho_inf", "rho_diag"}),
    ({"rho_diag": 0}, {"rho0", "rho_clip", "rho1", "rho2", "rho_inf"}),
    ({"method": "preconditioned", "inference": False}, {"rho0", "rho_clip", "rho1", "rho2"}),
    ({"method": "moments"}, {"rho0", "rho_inf", "rho_diag"}),  # the robust meat and the diagnostics' meats
    ({"method": "moments", "cov_type": "unadjusted"}, {"rho0"}),  # σ̂² read from the moment release
    ({"init": "zero"}, {"rho0", "rho1", "rho2", "rho_inf", "rho_diag"}),
    ({"preprocess": "bounds", "inference": False}, {"rho1", "rho2"}),
])
def test_total_budget_is_spent_exactly(frame, kwargs, releases):
    """fit(rho=ρ) spends exactly ρ, split over the releases the fit makes (default shares of rho1 + rho2:
    rho0 0.2, rho_clip 0.05, rho_inf 0.05, rho_diag 0.05 with robust standard errors), with rho1 = rho2."""
    model = DPIV2SLS.from_formula("y ~ 1 + [x ~ z1 + z2]", frame)
    res = model.fit(rho=1.7, bounds=_bounds(model), seed=1, **kwargs)
    assert res.privacy.rho == pytest.approx(1.7, rel=1e-12)
    assert {r.stage for r in res.privacy.releases} == releases
    if "rho1" in releases:
        assert res.privacy.rho1 == pytest.approx(res.privacy.rho2, rel=1e-12)
    if {"rho0", "rho_clip", "rho1", "rho2", "rho_inf"} <= releases and res.estimator == "DP-2S-GD":
        s = res.privacy.rho1 + res.privacy.rho2
        assert res.privacy.rho0 == pytest.approx(0.2 * s) and res.privacy.rho_of("rho_clip") == pytest.approx(0.05 * s)
        assert res.privacy.rho_of("rho_diag") == pytest.approx(0.05 * s if "rho_diag" in releases else 0.0)


def test_moments_with_stage_budgets_spends_what_the_default_would(frame):
    """method="moments" with rho1/rho2 spends the default fit's total (rho0 + rho_clip + rho1 + rho2 + rho_inf +
    rho_diag)."""
    model = DPIV2SLS.from_formula("y ~ 1 + [x ~ z1 + z2]", frame)
    default = model.fit(rho1=1.0, rho2=0.5, bounds=_bounds(model), seed=2, method="preconditioned")
    moments = model.fit(rho1=1.0, rho2=0.5, bounds=_bounds(model), seed=2, method="moments")
    assert default.privacy.rho == pytest.approx(1.0 + 0.5 + 0.3 + 0.075 + 0.075 + 0.075, rel=1e-12)
    assert moments.privacy.rho == pytest.approx(default.privacy.rho, rel=1e-12)


# ----------------------------------------------------------------------------------------
# the estimator choice
# ----------------------------------------------------------------------------------------
def test_choice_keeps_dp2sgd_where_it_is_far_more_accurate():
    """The paper's design, n = 10⁴, p = q = 1: DP-2S-GD's predicted error is a fraction of the moments' (in the
    benchmark 0.1–0.2 of it), so the default runs DP-2S-GD; the choice is recorded and reproducible."""
    sim = simulate_iv(10_000, 1, 1, seed=3)
    model = DPIV2SLS(sim.data["y"], None, sim.data[["x1"]], sim.data[["z1"]])
    res = model.fit(rho=2.0, bounds=sim.bounds, seed=4)
    again = model.fit(rho=2.0, bounds=sim.bounds, seed=4)
    assert res.estimator == "DP-2S-GD" and res.settings.selection.error_ratio < 0.5
    assert res.settings.method == "preconditioned" and res.settings.T >= 3
    assert res.privacy.rho == pytest.approx(2.0, rel=1e-12)
    pd.testing.assert_series_equal(res.params, again.params)
    # the prediction draws from a child stream: the fit itself is what method="preconditioned" gives
    plain = model.fit(rho=2.0, bounds=sim.bounds, seed=4, method="preconditioned")
    pd.testing.assert_series_equal(res.params, plain.params)
    assert "chosen by the default" in res.summary().as_text()


def test_choice_switches_to_moments_when_the_iteration_is_predicted_worse():
    """A labour-supply subsample of 3,000 rows (one binary instrument, an outcome filling its bounds: the case where
    noisy moments can be the more accurate estimator; ``benchmarks/estimator_comparison.py``), total ρ = 2: the
    pilot releases predict the iteration's error above the moments' (ratio 1.25 at this seed). The default then
    spends the rest of the budget on a second moment release: the records are the pilot, the clipping histograms,
    the second release, then the robust meat's and the diagnostics' two meats' records (each a histogram and a meat,
    released in two shared passes), adding up to exactly 2."""
    frame = load_labsup().sample(3000, random_state=0)
    model = DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", frame)
    bounds = {c: LABSUP_BOUNDS[c] for c in ("weeks", "kids", "samesex")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        res = model.fit(rho=2.0, bounds=bounds, seed=0)
    assert res.estimator == "noisy moments" and res.settings.selection.error_ratio > 1
    assert [r.stage for r in res.privacy.releases] == ["rho0", "rho_clip", "rho0", "rho_inf", "rho_inf", "rho_diag",
                                                       "rho_diag", "rho_diag", "rho_diag"]
    assert res.privacy.rho == pytest.approx(2.0, rel=1e-12)
    combined = res.scale.moments.sigma
    first, second = (r.noise_std for r in res.privacy.releases if r.stage == "rho0")
    assert combined == pytest.approx((first**-2 + second**-2) ** -0.5, rel=1e-12)
    assert "noisy moments" in res.summary().as_text()


def test_choice_weighs_the_tail_as_well_as_the_median():
    """The ratio the choice compares is the mean over the endogenous coefficients of √(median ratio × 90th-percentile
    ratio), from the predicted errors it records (1e-12)."""
    sim = simulate_iv(2_000, 2, 2, seed=5)
    model = DPIV2SLS(sim.data["y"], None, sim.data[["x1", "x2"]], sim.data[["z1", "z2"]])
    selection = model.fit(rho=1.0, bounds=sim.bounds, seed=2, inference=False).settings.selection
    ratios = np.sqrt(selection.predicted_error_gd / selection.predicted_error_moments
                     * selection.predicted_tail_gd / selection.predicted_tail_moments)
    assert selection.error_ratio == pytest.approx(float(np.mean(ratios)), rel=1e-12)
    assert np.all(selection.predicted_tail_gd >= selection.predicted_error_gd)


def test_explicit_iteration_options_switch_the_choice_off(frame):
    model = DPIV2SLS.from_formula("y ~ 1 + [x ~ z1 + z2]", frame)
    for kwargs in ({"T": 5}, {"eta": 0.9}, {"schedule": "uniform"}, {"clip": "rms"}, {"method": "preconditioned"}):
        res = model.fit(rho=2.0, bounds=_bounds(model), seed=0, inference=False, **kwargs)
        assert res.settings.selection is None and res.estimator == "DP-2S-GD", kwargs


@pytest.mark.parametrize("budget, named", [("rho0", "rho0 = inf"), ("rho_clip", "rho_clip = inf"),
                                           ("rho_inf", "rho_inf = inf")])
def test_an_infinite_share_is_a_named_leak_and_keeps_dp2sgd(frame, budget, named):
    """An infinite budget for any one release means that release has no noise: the fit still runs (DP-2S-GD:
    the choice is only made when every budget is finite), raises a PrivacyLeakWarning naming it, and the
    accountant reports ρ = inf (found by review: rho_inf=inf used to crash in the moment branch, rho_clip=inf
    to pass silently there, and rho_inf=inf to compute the residual variance exactly without a record)."""
    model = DPIV2SLS.from_formula("y ~ 1 + [x ~ z1 + z2]", frame)
    with pytest.warns(PrivacyLeakWarning, match=named):
        res = model.fit(rho1=1.0, rho2=1.0, bounds=_bounds(model), seed=0, **{budget: math.inf})
    assert res.estimator == "DP-2S-GD" and math.isinf(res.privacy.rho) and not res.is_private
    assert np.all(np.isfinite(res.params)) and np.all(np.isfinite(res.bse))


def test_repeated_release_equals_one_release_of_the_whole_budget_in_distribution(frame):
    """Combining the pilot (ρ_a) and a second release (ρ_b) by inverse-variance weights gives noise of
    variance σ²(ρ_a + ρ_b): checked on the combined release's recorded σ and, over 400 seeds, on the sd of one
    released entry (tolerance 4 standard errors of an sd estimate, 4·σ/sqrt(2·399))."""
    from dpivreg.estimation.working_scale import repeat_moment_release, working_scale

    model = DPIV2SLS.from_formula("y ~ 1 + [x ~ z1 + z2]", frame)
    bounds = _bounds(model)
    # the release's rows: [1, v] with v the free columns [instruments, endogenous, dependent] mapped to [-1, 1]
    columns = ["z1", "z2", "x", "y"]
    V = np.column_stack([(frame[c] - sum(bounds[c]) / 2) / ((bounds[c][1] - bounds[c][0]) / 2) for c in columns])
    exact = box_moment_sum(V, True) / len(frame)
    entries, sigma = [], None
    for seed in range(400):
        rng = np.random.default_rng(seed)
        pilot = working_scale(model.design, bounds, route="private", rho0=0.3, rng=rng)
        combined = repeat_moment_release(model.design, pilot, rho=0.9, rng=rng)
        entries.append(combined.moments.matrix[1, 2] - exact[1, 2])
        sigma = combined.moments.sigma
    alone = working_scale(model.design, bounds, route="private", rho0=1.2, rng=np.random.default_rng(0))
    assert sigma == pytest.approx(alone.moments.sigma, rel=1e-12)
    assert np.std(entries, ddof=1) == pytest.approx(sigma, abs=4 * sigma / math.sqrt(2 * 399))
    assert abs(np.mean(entries)) < 4 * sigma / math.sqrt(400)


# ----------------------------------------------------------------------------------------
# the tuning rules
# ----------------------------------------------------------------------------------------
def test_tuning_rules_exact_values():
    assert tuning.step_sizes(0.0) == 1.0 and tuning.step_sizes(0.25) == pytest.approx(0.8)
    assert tuning.contraction(0.25, 0.8) == pytest.approx(0.4)  # 2κ/(1+κ)
    assert tuning.iterations(0.4) == 1 + math.ceil(math.log(0.02) / math.log(0.4))  # 6
    assert tuning.iterations(1e-6) == 3 and tuning.iterations(0.99) == 12
    S = tuning.staggered_schedule(4, 0.2)
    np.testing.assert_allclose(S.sum(axis=1), 1.0)
    np.testing.assert_allclose(S[0], np.array([0.25, 0.5, 1.0, 0.0]) / 1.75)
    np.testing.assert_allclose(S[1], np.array([0.0, 0.25, 0.5, 1.0]) / 1.75)
    long = tuning.staggered_schedule(20, 0.2)
    assert long[1, 1:].min() == pytest.approx(long[1, -1] / 64)  # the floor: no step 8× noisier than the last
    np.testing.assert_allclose(tuning.uniform_schedule(3), np.full((2, 3), 1 / 3))


def test_default_steps_follow_the_whitening_error_and_T_is_simulated():
    """Small n (a noisy pilot release) gives a larger κ̂ and smaller steps than large n; T is the simulated
    choice among the candidates; a public clipping rule keeps the κ̂ rule for T (nothing to simulate with)."""
    fits = {}
    for n in (1_000, 100_000):
        sim = simulate_iv(n, 1, 1, seed=1)
        model = DPIV2SLS(sim.data["y"], None, sim.data[["x1"]], sim.data[["z1"]])
        fits[n] = model.fit(rho1=1, rho2=1, bounds=sim.bounds, seed=0, inference=False, method="preconditioned")
    small, large = fits[1_000].settings, fits[100_000].settings
    assert small.kappa > large.kappa > 0
    assert small.eta == pytest.approx(1 / (1 + small.kappa)) and small.eta < large.eta
    assert {small.T_source, large.T_source} == {"simulated"} and small.T in T_CANDIDATES
    assert large.T == 3  # strong instrument, n = 10⁵: the warm start is close, the shortest run is within 2%
    rms = model.fit(rho1=1, rho2=1, bounds=sim.bounds, seed=0, inference=False, method="preconditioned", clip="rms")
    kappa = rms.settings.kappa
    assert rms.settings.T_source == "from kappa"
    assert rms.settings.T == tuning.iterations(tuning.contraction(kappa, tuning.step_sizes(kappa)))


def test_a_large_whitening_error_keeps_the_kappa_rule_for_T():
    """κ̂ ≥ 0.5 (1,000 labour-supply rows with age and education, ρ = 0.5: the released first stage is mostly
    noise) keeps T from κ̂ (here 12) instead of simulating: the simulation chose T = 3 there and the intervals
    collapsed (87 of 100 contained the 2SLS estimate, 98 with the κ̂ rule; benchmark cell of the defaults page)."""
    df = load_labsup().sample(1000, random_state=12)
    model = DPIV2SLS.from_formula("weeks ~ 1 + age + educ + [kids ~ samesex]", df)
    bounds = {c: LABSUP_BOUNDS[c] for c in ("weeks", "kids", "samesex", "age", "educ")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the fit is flagged unreliable, as it should be
        res = model.fit(rho=0.5, bounds=bounds, seed=12, method="preconditioned")
    s = res.settings
    assert s.kappa >= MAX_KAPPA and s.T_source == "from kappa"
    assert s.T == tuning.iterations(tuning.contraction(s.kappa, tuning.step_sizes(s.kappa)))


def _weak_design(n: int, seed: int):
    """y = 1 + x + u, x = 1 + √(10/n)·z + v, corr(u, v) = 0.5: first-stage F ≈ 10 (the benchmark's weak design)."""
    rng = np.random.default_rng(seed)
    z, v, e = rng.standard_normal((3, n))
    x = 1.0 + math.sqrt(10.0 / n) * z + v
    y = 1.0 + x + 0.5 * v + math.sqrt(0.75) * e
    bounds = {"z": (-5.0, 5.0), "x": (1 - 5 * 1.0, 1 + 5 * 1.0), "y": (2 - 5 * math.sqrt(3), 2 + 5 * math.sqrt(3))}
    return DPIV2SLS.from_formula("y ~ 1 + [x ~ z]", pd.DataFrame({"y": y, "x": x, "z": z})), bounds


def test_choose_iterations_runs_longer_with_a_weak_first_stage():
    """With a weak first stage (F ≈ 10, n = 10⁵, ρ = 0.5) three steps leave the warm start's error in β: the
    simulation predicts a lower error for a longer run and the fit takes it (seeds fixed; in the benchmark's
    cell the median error fell from 0.16 to 0.09 2SLS s.e. over 20 seeds). On a strong design at the same n
    the shortest candidate is within the margin of the best."""
    from dpivreg.estimation.engine import iteration_plan
    from dpivreg.estimation.moments import solve_2sls as solve
    from dpivreg.estimation.working_scale import working_scale

    model, bounds = _weak_design(100_000, 3)
    res = model.fit(rho=0.5, bounds=bounds, seed=3, method="preconditioned", inference=False)
    assert res.settings.T_source == "simulated" and res.settings.T > 3
    # the rule itself, on the weak design's pilot release: the chosen T is the first within 2% of the best
    scale = working_scale(model.design, bounds, route="private", rho0=0.05, rng=np.random.default_rng(0))
    q, p, k = scale.Z.shape[1], scale.X.shape[1], scale.n_exog
    start = solve(scale.moments.solvable(), q, k, p - k)

    def make_plan(T):
        return iteration_plan(scale.Z.shape[0], q, p, k, T=T, rho1=0.2, rho2=0.2, eta=0.9, alpha=0.9,
                              clip1=(1.0, 1.0), clip2=(1.0, 1.0), schedule=tuning.staggered_schedule(T, 0.2))

    T, plan, errors = choose_iterations(scale, start, make_plan, rng=np.random.default_rng(1))
    assert plan.T == T and errors.shape == (len(T_CANDIDATES), 1)
    assert T > 3 and errors[T_CANDIDATES.index(T), 0] < 0.9 * errors[0, 0]  # longer, and predicted better
    assert res.privacy.rho == pytest.approx(0.5, rel=1e-12)  # whatever T, the stages spend their budgets


@pytest.mark.parametrize("errors, expected", [
    ([[1.0], [0.5], [0.495], [0.3]], 3),            # the best
    ([[1.0], [0.5], [0.495], [0.492]], 1),          # the shortest within 2% of the best
    ([[1.0, 1.0], [0.5, 2.0], [0.9, 0.9]], 2),      # relative to each coefficient's best: scores 1.56, 1.61, 1.40
    ([[1.0, np.inf], [0.5, np.inf]], 1),            # a coefficient diverged for every candidate is left out
    ([[np.inf, 1.0], [1.0, np.inf]], 0),            # every score infinite: the first candidate
    ([[0.0], [0.0]], 0),                            # no noise: the first candidate
])
def test_shortest_near_best_exact_choices(errors, expected):
    """The T rule's index on hand-made error tables (candidates × coefficients), computed by hand."""
    assert shortest_near_best(np.array(errors)) == expected


def test_choose_iterations_is_reproducible_and_leaves_the_fit_stream_alone(frame):
    """The T simulation draws from a child stream, so a user T equal to the simulated one reproduces the
    default's estimate to the last digit (drawing from the fit's own stream would change it)."""
    model = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z1 + z2]", frame)  # rho = 10: kappa 0.21 < 0.5
    first = model.fit(rho=10.0, bounds=_bounds(model), seed=11, method="preconditioned", inference=False)
    assert first.settings.T_source == "simulated"
    user_T = model.fit(rho=10.0, bounds=_bounds(model), seed=11, method="preconditioned", inference=False,
                       T=first.settings.T)
    np.testing.assert_array_equal(user_T.params.to_numpy(), first.params.to_numpy())


# ----------------------------------------------------------------------------------------
# accuracy at the data's own scale: labour supply (fixed seeds)
# ----------------------------------------------------------------------------------------
def test_labsup_default_is_within_a_tenth_of_a_standard_error():
    """weeks ~ 1 + [kids ~ samesex] at rho1 = rho2 = 1 (the README's call), 40 seeds: the median |kids − 2SLS|
    is at most 0.1 2SLS standard errors (measured over 100 seeds in the benchmark: about 0.02), and every
    private 95% interval contains the 2SLS estimate."""
    df = load_labsup()
    model = DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", df)
    bounds = {k: LABSUP_BOUNDS[k] for k in ("weeks", "kids", "samesex")}
    errors, covered = [], []
    for seed in range(40):
        res = model.fit(rho1=1, rho2=1, bounds=bounds, seed=seed)
        errors.append(abs(res.params["kids"] + 5.5112) / 3.5790)
        ci = res.conf_int().loc["kids"]
        covered.append(ci["lower"] <= -5.5112 <= ci["upper"])
    assert np.median(errors) <= 0.1
    assert all(covered)


def test_plan_knows_the_start():
    """plan(init="moments") scales the optimisation term by the start's error (default: the statistical term) and
    so recommends fewer steps than the Theorem's zero start; error_bound takes the same factor."""
    from dpivreg import plan
    from dpivreg.estimation.theory import error_bound, statistical_term

    zero, warm = plan(31857, 2, 2, 1, 1), plan(31857, 2, 2, 1, 1, init="moments")
    s = statistical_term(31857, 2, 2)
    assert warm.init == "moments" and warm.recommended_T < zero.recommended_T
    np.testing.assert_allclose(warm.table["optimization"], s * zero.table["optimization"], rtol=1e-12)
    assert warm.table["total"].idxmin() == warm.recommended_T
    b = error_bound(31857, 2, 2, 5, 1, 1, kappa=0.5, start_error=0.1)
    assert b.optimization == pytest.approx(0.1 * 0.5 ** 2.5) and b.total == pytest.approx(
        b.optimization + b.privacy + b.statistical)
    # the optimisation regime ends where start_error·κ^(T/2) = s: at T = 0 from a start as good as 2SLS,
    # at T = 2·log(c/s)/log 2 from a start error c > s (κ = 1/2)
    assert warm.regime_boundaries.end_optimization == 0.0 and warm.bound.regime == "statistical plateau"
    c = 0.5
    rb = plan(31857, 2, 2, 1, 1, init="moments", start_error=c).regime_boundaries
    assert rb.end_optimization == pytest.approx(2 * math.log(c / s) / math.log(2), rel=1e-12)
    assert rb.start_privacy == zero.regime_boundaries.start_privacy
    with pytest.raises(ValueError, match="init"):
        plan(1000, 1, 1, 1, 1, init="warm")
    with pytest.raises(ValueError, match="start_error"):
        plan(1000, 1, 1, 1, 1, start_error=0)


def test_the_default_fit_raises_no_leak_on_either_branch(frame):
    """fit(rho=..., bounds=...) with nothing else: no PrivacyLeakWarning whichever estimator the choice keeps
    (labour-supply data: noisy moments; the synthetic frame: DP-2S-GD), every release recorded."""
    labsup = load_labsup()
    cases = [(DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", labsup),
              {k: LABSUP_BOUNDS[k] for k in ("weeks", "kids", "samesex")}, "noisy moments")]
    model = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z1 + z2]", frame)
    cases.append((model, _bounds(model), "DP-2S-GD"))
    for model, bounds, estimator in cases:
        # the labour-supply choice is a near tie (noisy moments in about 4 of 10 seeds): take the first seed
        # of ten that runs the branch under test, each fit with leak warnings as errors
        for seed in range(20261129, 20261139):
            with warnings.catch_warnings():
                warnings.simplefilter("error", PrivacyLeakWarning)
                res = model.fit(rho=2.6, bounds=bounds, seed=seed)
            if res.estimator == estimator:
                break
        assert res.estimator == estimator and res.is_private and res.leaks == ()
        assert res.privacy.rho == pytest.approx(2.6, rel=1e-12)
        assert "No privacy leak" in res.summary().as_text()
