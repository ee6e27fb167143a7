"""Private inference: exact non-private limit, the accountant, the API, and a CI-sized coverage check."""

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from linearmodels.iv import IV2SLS
from scipy import stats

from dpivreg import DPIV2SLS, PrivacyLeakWarning
from dpivreg.datasets import simulate_iv
from dpivreg.errors import InferenceUnavailableError


@pytest.fixture(scope="module")
def sim():
    return simulate_iv(3000, 2, 3, seed=42)


def _model(sim, formula_intercept=True):
    formula = sim.formula.replace("~ [", "~ 1 + [") if formula_intercept else sim.formula
    return DPIV2SLS.from_formula(formula, sim.data)


@pytest.mark.parametrize("intercept", [True, False])
def test_non_private_limit_equals_unadjusted_2sls_covariance(sim, intercept):
    """rho = inf everywhere: no privacy noise, exact residual variance, released Θ = Θ̂, so the private
    covariance must equal linearmodels' unadjusted (homoskedastic, sigma² = e'e/n) 2SLS covariance."""
    model = _model(sim, intercept)
    wide = {k: (3 * lo, 3 * hi) for k, (lo, hi) in sim.bounds.items()}  # nothing clipped to the bounds
    with pytest.warns(PrivacyLeakWarning):
        res = model.fit(rho1=math.inf, rho2=math.inf, T=300, clip=False, bounds=wide, preprocess="data",
                        cov_type="unadjusted")
    ref = IV2SLS.from_formula(model.formula, sim.data).fit(cov_type="unadjusted")
    # no privacy noise: the noise part is rounding (the simulated paths differ in the last bits)
    np.testing.assert_allclose(res.inference.cov_noise, 0.0, atol=1e-12 * np.abs(res.inference.cov).max())
    np.testing.assert_allclose(res.cov_params().to_numpy(), ref.cov.to_numpy(), rtol=1e-6)
    np.testing.assert_allclose(res.bse.to_numpy(), ref.std_errors.to_numpy(), rtol=1e-6)
    np.testing.assert_allclose(res.conf_int().to_numpy(), ref.conf_int().to_numpy(), rtol=1e-6)
    np.testing.assert_allclose(res.pvalues.to_numpy(), ref.pvalues.to_numpy(), rtol=1e-5, atol=1e-12)


def test_inference_objects_and_accountant(sim):
    model = _model(sim)
    res = model.fit(rho1=1.0, rho2=1.0, T=20, bounds=sim.bounds, seed=3)
    cov = res.cov_params()
    names = ["Intercept", "x1", "x2"]
    assert list(cov.index) == names and list(cov.columns) == names
    np.testing.assert_allclose(cov.to_numpy(), cov.to_numpy().T)
    assert np.all(np.linalg.eigvalsh(cov.to_numpy()) > 0)
    np.testing.assert_allclose(res.bse.to_numpy(), np.sqrt(np.diag(cov.to_numpy())))
    assert ((res.pvalues >= 0) & (res.pvalues <= 1)).all()
    ci90, ci95 = res.conf_int(0.90), res.conf_int()
    assert list(ci95.columns) == ["lower", "upper"]
    assert ((ci95["upper"] - ci95["lower"]) > (ci90["upper"] - ci90["lower"])).all()
    centre = (ci95["lower"] + ci95["upper"]) / 2
    np.testing.assert_allclose(centre.to_numpy(), res.params.to_numpy())  # centred at the estimate: z = params/bse
    np.testing.assert_allclose(res.tvalues.to_numpy(), (res.params / res.bse).to_numpy())
    release = [r for r in res.privacy.releases if r.stage == "rho_inf"]
    # the robust meat (the default): its score histogram and the meat, half of rho_inf each
    assert [r.rho for r in release] == pytest.approx([0.05, 0.05], rel=1e-12)
    # rho0 = 0.2(rho1 + rho2), rho_clip = rho_inf = rho_diag = 0.05(rho1 + rho2)
    assert res.privacy.rho == pytest.approx(0.4 + 0.1 + 1.0 + 1.0 + 0.1 + 0.1, rel=1e-12)
    with pytest.raises(ValueError, match="level must lie in"):
        res.conf_int(1.5)


def test_inference_unavailable_is_explained(sim):
    model = _model(sim)
    res = model.fit(rho1=1.0, rho2=1.0, T=5, bounds=sim.bounds, seed=3, inference=False)
    with pytest.raises(InferenceUnavailableError, match="inference=False"):
        res.bse
    assert all(r.stage != "rho_inf" for r in res.privacy.releases)
    assert "not requested" in res.summary().as_text()
    bounds_only = model.fit(rho1=1.0, rho2=1.0, T=5, bounds=sim.bounds, seed=3, preprocess="bounds")
    with pytest.raises(InferenceUnavailableError, match="preprocess='bounds'"):
        bounds_only.conf_int()


def test_inference_is_reproducible(sim):
    model = _model(sim)
    a = model.fit(rho1=1.0, rho2=1.0, T=10, bounds=sim.bounds, seed=9)
    b = model.fit(rho1=1.0, rho2=1.0, T=10, bounds=sim.bounds, seed=9)
    pd.testing.assert_frame_equal(a.conf_int(), b.conf_int())


def test_coverage_needs_the_privacy_noise_term():
    """CI-sized coverage check on the paper's design (n = 1000, p = q = 1, total rho = 0.2, the defaults).

    200 replications, fixed seeds. Nominal 95%: the binomial standard error is
    sqrt(0.95·0.05/200) = 0.0154, so the private intervals must cover at least 0.95 − 3·0.0154 = 0.904
    (see benchmarks/interval_coverage.py and the docs' coverage table). At this budget the privacy noise is
    about 2/3 of the variance (median share over 100 runs: 0.69); intervals built from the sampling part
    alone covered 0.80 (100 runs); the test asserts they fall below the same threshold, so it fails if the
    noise term goes missing. (At total rho = 2 the default's noise is only a small share of the variance.)
    """
    covered, covered_without_noise = [], []
    for run in range(200):
        s = simulate_iv(1000, 1, 1, seed=run)
        model = DPIV2SLS(s.data["y"], None, s.data[["x1"]], s.data[["z1"]])
        res = model.fit(rho=0.2, bounds=s.bounds, seed=10_000 + run)
        assert res.privacy.rho == pytest.approx(0.2, rel=1e-12)
        ci = res.conf_int()
        covered.append(bool(ci["lower"].iloc[0] <= s.beta[0] <= ci["upper"].iloc[0]))
        half = 1.959964 * math.sqrt(res.inference.cov_sampling[0, 0])
        covered_without_noise.append(abs(res.params.iloc[0] - s.beta[0]) <= half)
    threshold = 0.95 - 3 * math.sqrt(0.95 * 0.05 / 200)
    assert np.mean(covered) >= threshold
    assert np.mean(covered_without_noise) < threshold


def test_unreliable_inference_is_flagged():
    """n = 1000, p = q = 5, total rho = 0.5: the private first stage is weak relative to its noise and the
    whitening is poor; the coverage study measured 0.79 for nominal 95% there. The fit must say so."""
    s = simulate_iv(1000, 5, 5, seed=0)
    model = DPIV2SLS.from_formula(s.formula, s.data)
    with pytest.warns(UserWarning, match="may be unreliable"):
        res = model.fit(rho1=0.5 / 2.3, rho2=0.5 / 2.3, T=20, bounds=s.bounds, seed=1)
    assert not res.inference.reliable
    assert "CAUTION" in res.summary().as_text()
    big = simulate_iv(100_000, 1, 1, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ok = DPIV2SLS.from_formula(big.formula, big.data).fit(rho1=1, rho2=1, T=20, bounds=big.bounds, seed=1)
    assert ok.inference.reliable and "CAUTION" not in ok.summary().as_text()


# ---------------------------------------------------------------------------------------- adaptive replications
def test_the_noise_simulation_stops_when_the_total_se_is_pinned_down():
    """The Monte Carlo error of the total SE decides the number of paths: the first batch when the sampling part
    dominates (large n, ample budget), all of them when the noise does (small n, small budget)."""
    from dpivreg.inference import private as inference

    big = simulate_iv(n=100_000, p=1, q=1, seed=3)
    res = DPIV2SLS.from_formula(big.formula, big.data).fit(rho=10, bounds=big.bounds, seed=1)
    assert res.inference.replications == inference.MIN_REPLICATIONS
    noisy = simulate_iv(n=1_000, p=2, q=3, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = DPIV2SLS.from_formula(noisy.formula, noisy.data).fit(rho=0.5, bounds=noisy.bounds, seed=1)
    assert res.inference.replications == 2000
    share = np.diag(res.inference.cov_noise) / np.diag(res.inference.cov)
    assert share.max() > 0.5


def test_the_stopping_rule_measures_the_total_se_error():
    """_total_se_mc_error on draws of known law: N(0, 1) noise, sampling variance s, m draws. The noise scale is
    (q₉₇.₅ − q₂.₅)/3.92, whose standard error is sqrt(2·t(1 − t) − 2t²)/(f·3.92·√m) with t = 0.025 (the two
    quantiles' asymptotic variances and covariance) and f the density at the quantiles, so the total SE's relative
    error is that over (s + 1). The rule estimates 1/f by the secant of the quantiles 1.25 points either side, which
    for the normal is (Φ⁻¹(0.0375) − Φ⁻¹(0.0125))/0.025, 8% above 1/φ(1.96) (conservative); the expected value uses
    the same secant (tolerance 3%: the quantiles' own error at this m). The rule is checked against the error it
    claims to measure: the spread of the scale over 400 independent sets of 2,000 draws (tolerance 20%: two
    standard errors of a standard deviation from 400 draws, and the secant's 8%)."""
    from dpivreg.estimation.moments import central_covariance
    from dpivreg.inference.private import _total_se_mc_error

    m = 200_000
    rng = np.random.default_rng(0)
    draws = rng.standard_normal((m, 1))
    t = 0.025
    inverse_density = (stats.norm.ppf(0.0375) - stats.norm.ppf(0.0125)) / 0.025
    scale_error = math.sqrt(2 * t * (1 - t) - 2 * t * t) * inverse_density / (3.919928 * math.sqrt(m))
    for s in (0.0, 1.0, 9.0):
        assert _total_se_mc_error(draws, np.array([[s]])) == pytest.approx(scale_error / (s + 1.0), rel=0.03)
    scales = [math.sqrt(central_covariance(rng.standard_normal((2000, 1)), np.zeros(1))[0][0, 0]) for _ in range(400)]
    claimed = _total_se_mc_error(rng.standard_normal((2000, 1)), np.zeros((1, 1)))
    assert np.std(scales) == pytest.approx(claimed, rel=0.2)


def test_the_stopping_rule_has_no_estimate_from_non_finite_draws():
    from dpivreg.inference.private import _total_se_mc_error

    draws = np.random.default_rng(0).standard_normal((250, 2)) * [1.0, 100.0]
    draws[3, 1] = np.nan
    assert _total_se_mc_error(draws, np.diag([1e6, 1.0])) == math.inf


# ------------------------------------------------------------------------- the simulation's two implementations
def _plan_and_scale(sim, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)  # method="gd": the paper's data-derived step sizes
        res = _model(sim).fit(rho1=1.0, rho2=1.0, T=40, bounds=sim.bounds, seed=3, inference=False,
                              **options)
    return res.engine_path, res.scale


SIMULATION_CASES = {
    "default (preconditioned, Cholesky root, groups, released moments)": {},
    "plain gradient descent": {"method": "gd"},
    "bounds only, zero start (symmetric root)": {"preprocess": "bounds", "init": "zero"},
    "one clipping group (symmetric root)": {"clip": 1.0},
}


@pytest.mark.parametrize("options", SIMULATION_CASES.values(), ids=SIMULATION_CASES.keys())
@pytest.mark.parametrize("warm_start", [True, False])
def test_the_compiled_simulation_equals_the_numpy_one(sim, options, warm_start):
    """Same seed, same noise stream: the numba loop (paths one at a time, triangular solves) gives the numpy
    steps' draws (batched, explicit inverse of the Cholesky factor) to rounding; 7.7e-16 relative was seen."""
    pytest.importorskip("numba")
    from dpivreg.estimation.simulation import simulate_fit

    path, scale = _plan_and_scale(sim, **options)
    draws = {kernel: simulate_fit(path.plan, path.theta_final, path.beta_final, scale, replications=60,
                                  rng=np.random.default_rng(11), warm_start=warm_start, kernel=kernel)
             for kernel in ("numpy", "numba")}
    for numpy_part, numba_part in zip(draws["numpy"], draws["numba"]):
        np.testing.assert_allclose(numba_part, numpy_part, rtol=1e-10, atol=1e-12 * np.abs(numpy_part).max())


def _per_step_reference(plan, theta, beta, S, g_x, g_y, rng):
    """The simulation's steps as they ran before the noise was drawn in chunks (dpivreg 3d03536): ξ_t and ν_t drawn
    inside the loop, one step at a time, numpy."""
    from dpivreg.estimation.simulation import _per_row, _stacked_root

    R, q, _ = theta.shape
    k = plan.n_exog
    exog_block = np.broadcast_to(np.eye(q, k), (R, q, k))
    for t in range(plan.T):
        xi = rng.standard_normal(theta.shape) * _per_row(plan.noise1[t], plan.split, q)[:, None]
        nu = rng.standard_normal(beta.shape) * _per_row(plan.noise2[t], plan.split, beta.shape[1])
        theta_full = np.concatenate([exog_block, theta], axis=2)
        grad2 = (np.einsum("rji,rjk,rk->ri", theta_full, S @ theta_full, beta)
                 - np.einsum("rji,rj->ri", theta_full, g_y))
        if plan.method == "preconditioned":
            W = _stacked_root(theta, q, k, plan.ridge, plan.root)
            step = np.einsum("rji,rj->ri", W, np.einsum("rij,rj->ri", W, grad2) - nu)
        else:
            step = grad2 - nu
        if plan.schedule[1, t] > 0:
            beta = beta - plan.alpha * step
        if plan.schedule[0, t] > 0:
            theta = theta - plan.eta * ((S @ theta - g_x) - xi)
    return theta, beta


@pytest.mark.parametrize("T", [1, 4, 5, 37])
@pytest.mark.parametrize("grouped", [True, False], ids=["Cholesky root", "symmetric root"])
def test_the_noise_chunks_replay_the_per_step_stream(monkeypatch, T, grouped):
    """Noise drawn ahead in chunks (here of 3 steps after the first four alone) is the per-step stream: the numpy
    steps give the old per-step loop's numbers bit for bit, over chunk boundaries and a staggered schedule."""
    from dpivreg.estimation import simulation as inference
    from dpivreg.estimation.engine import iteration_plan

    clip = (1.0, 1.0) if grouped else 1.0
    schedule = np.ones((2, T)) / T
    schedule[0, max(1, T // 2):] = 0.0  # the first stage stops halfway
    schedule[0] /= schedule[0].sum()
    plan = iteration_plan(800, 3, 3, 1, T=T, rho1=1.0, rho2=1.0, eta=0.4, alpha=0.3, clip1=clip, clip2=clip,
                          schedule=schedule)
    rng = np.random.default_rng(2)
    R, q = 9, 3
    theta, beta = 0.5 * rng.standard_normal((R, q, 2)), rng.standard_normal((R, 3))
    A = 0.1 * rng.standard_normal((R, q, q))
    S = np.eye(q) + A @ np.swapaxes(A, 1, 2)
    g_x, g_y = rng.standard_normal((R, q, 2)), rng.standard_normal((R, q))
    expected = _per_step_reference(plan, theta, beta, S, g_x, g_y, np.random.default_rng(7))
    monkeypatch.setattr(inference, "_NOISE_CHUNK_BYTES", 3 * 8 * R * (q * 2 + 3))
    assert [len(c) for c in inference._step_chunks(37, R * (q * 2 + 3))] == [1] * 4 + [3] * 11
    run = inference._simulation_steps("numpy")
    theta_c, beta_c, rng_c = theta.copy(), beta.copy(), np.random.default_rng(7)
    for steps in inference._step_chunks(T, R * (q * 2 + 3)):
        xi, nu = inference._step_noise(plan, steps, rng_c, theta.shape, beta.shape)
        active = np.ascontiguousarray(plan.schedule[:, steps].T > 0)
        theta_c, beta_c = run(theta_c, beta_c, S, g_x, g_y, xi, nu, active, plan)
    np.testing.assert_array_equal(theta_c, expected[0])
    np.testing.assert_array_equal(beta_c, expected[1])


def test_the_compiled_simulation_hands_a_failed_factorisation_to_numpy(sim, monkeypatch):
    """A Cholesky pivot that rounding made non-positive: the compiled loop says so (the real kernel, on P with a
    zero eigenvalue), and the chunk is redone by the numpy steps from the chunk's start, not from the
    part-updated arrays."""
    pytest.importorskip("numba")
    from dpivreg.compute.simulation_steps import numba_simulation_steps
    from dpivreg.estimation import simulation as inference

    R, q, k = 3, 3, 2
    theta, beta = np.zeros((R, q, 1)), np.ones((R, k + 1))  # Θ̄ = [I_2 | 0]: P = diag(1, 1, 0) + ridge
    S, g_x, g_y = np.broadcast_to(np.eye(q), (R, q, q)).copy(), np.zeros((R, q, 1)), np.ones((R, q))
    xi, nu, active = np.zeros((1, R, q, 1)), np.zeros((1, R, k + 1)), np.ones((1, 2), dtype=bool)
    # root 1 (Cholesky) with ridge 0: P keeps its zero eigenvalue
    assert not numba_simulation_steps()(theta, beta, S, g_x, g_y, xi, nu, active, 0.5, 0.5, 0.0, k, 1)

    path, scale = _plan_and_scale(sim)

    def scribble_then_fail(theta, beta, *args):
        theta[...] = np.nan
        beta[...] = np.nan
        return False

    expected = inference.simulate_fit(path.plan, path.theta_final, path.beta_final, scale, replications=20,
                                      rng=np.random.default_rng(5), warm_start=True, kernel="numpy")
    monkeypatch.setattr(inference, "numba_simulation_steps", lambda: scribble_then_fail)
    redone = inference.simulate_fit(path.plan, path.theta_final, path.beta_final, scale, replications=20,
                                    rng=np.random.default_rng(5), warm_start=True, kernel="numba")
    for a, b in zip(expected, redone):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("grouped", [True, False], ids=["Cholesky root", "symmetric root"])
def test_the_compiled_simulation_propagates_a_diverged_world_as_numpy_does(grouped):
    """A world whose first stage overflowed: P is not finite, the step is NaN in both implementations (numpy
    takes the engine's root there, NaN for that world), and the other worlds are untouched by it."""
    pytest.importorskip("numba")
    from dpivreg.estimation import simulation as inference

    rng = np.random.default_rng(0)
    R, q, k = 4, 3, 1
    theta, beta = 0.3 * rng.standard_normal((R, q, 2)), rng.standard_normal((R, k + 2))
    theta[2, 1, 0] = np.inf
    S = np.broadcast_to(np.eye(q), (R, q, q)).copy()
    g_x, g_y = rng.standard_normal((R, q, 2)), rng.standard_normal((R, q))
    xi, nu = 0.1 * rng.standard_normal((3, R, q, 2)), 0.1 * rng.standard_normal((3, R, k + 2))
    active = np.ones((3, 2), dtype=bool)
    plan = _public_plan(k, grouped)
    assert plan.root == ("cholesky" if grouped else "symmetric")
    with np.errstate(over="ignore", invalid="ignore"):
        by_numpy = inference._numpy_simulation_steps(theta.copy(), beta.copy(), S, g_x, g_y, xi, nu, active, plan)
        by_numba = inference._numba_simulation_steps(theta.copy(), beta.copy(), S, g_x, g_y, xi, nu, active, plan)
    assert np.isnan(by_numpy[1][2]).all()  # the diverged world's β
    for a, b in zip(by_numpy, by_numba):
        assert np.array_equal(np.isnan(a), np.isnan(b)) and np.isnan(a[2]).any()
        np.testing.assert_allclose(b[[0, 1, 3]], a[[0, 1, 3]], rtol=1e-12)


def _public_plan(n_exog: int, grouped: bool):
    """A public iteration plan for direct calls of the step functions (preconditioned; two clipping groups give
    the Cholesky root, one the symmetric root)."""
    from dpivreg.estimation.engine import iteration_plan

    clip = (1.0, 1.0) if grouped else 1.0
    return iteration_plan(1000, 3, n_exog + 2, n_exog, T=3, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.3,
                          clip1=clip, clip2=clip)


def test_the_simulation_kernel_choice():
    from dpivreg.compute.kernels import numba_available
    from dpivreg.estimation.simulation import simulation_kernel

    assert simulation_kernel("numpy") == "numpy"
    assert simulation_kernel("auto") == ("numba" if numba_available() else "numpy")
    with pytest.raises(ValueError, match="kernel must be one of"):
        simulation_kernel("fortran")
