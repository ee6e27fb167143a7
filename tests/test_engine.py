"""Tests of the DP-2S-GD engine: the non-private limit, the noise, clipping, sensitivity, determinism, errors."""

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ivsim import simulate_iv_arrays, two_sls
from scipy import stats

from dpivreg import DivergenceError, PrivacyLeakWarning, dp_2s_gd
from dpivreg.compute.kernels import block_sums, numba_available, safe_block_sums
from dpivreg.privacy.rounding import gradient_rounding


def _optimal_alpha(Z, X, n_exog=0):
    """2/(λmin+λmax) of Ĥ = Θ̂ᵀ(ZᵀZ/n)Θ̂ — fastest plain GD step on the 2SLS objective."""
    n = Z.shape[0]
    theta_hat = np.linalg.solve(Z.T @ Z, Z.T @ X)
    ev = np.linalg.eigvalsh((Z @ theta_hat).T @ (Z @ theta_hat) / n)
    return 2.0 / (ev[0] + ev[-1])


def _non_private(Z, X, Y, T, **kw):
    with pytest.warns(PrivacyLeakWarning, match="NOT differentially private"):
        return dp_2s_gd(Z, X, Y, T=T, rho1=math.inf, rho2=math.inf, clip1=None, clip2=None, **kw)


@pytest.mark.parametrize("p, q", [(1, 1), (3, 4), (5, 8)])
def test_noise_free_limit_is_2sls(p, q):
    Z, X, Y, _, _ = simulate_iv_arrays(3000, p, q, seed=p * 10 + q)
    beta_hat, theta_hat = two_sls(Z, X, Y)
    eta = 2.0 / sum(np.linalg.eigvalsh(Z.T @ Z / len(Z))[[0, -1]])
    path = _non_private(Z, X, Y, 1500, eta=eta, alpha=_optimal_alpha(Z, X))
    np.testing.assert_allclose(path.theta_final, theta_hat, rtol=1e-10, atol=1e-12)
    assert np.linalg.norm(path.beta_final - beta_hat) <= 1e-8 * np.linalg.norm(beta_hat)
    assert path.privacy.rho == math.inf and path.privacy.epsilon(1e-5) == math.inf


def test_noise_free_limit_with_exogenous_columns():
    rng = np.random.default_rng(7)
    n = 3000
    Z, X, Y, _, _ = simulate_iv_arrays(n, 2, 3, seed=3)
    exog = np.column_stack([np.ones(n), rng.uniform(-1, 1, n)])
    Y = Y + exog @ np.array([0.5, -2.0])
    Zf, Xf = np.column_stack([exog, Z]), np.column_stack([exog, X])
    beta_hat, _ = two_sls(Zf, Xf, Y)
    eta = 2.0 / sum(np.linalg.eigvalsh(Zf.T @ Zf / n)[[0, -1]])
    path = _non_private(Zf, Xf, Y, 4000, eta=eta, alpha=_optimal_alpha(Zf, Xf), n_exog=2)
    assert path.theta.shape == (4001, 5, 2)
    assert np.linalg.norm(path.beta_final - beta_hat) <= 1e-8 * np.linalg.norm(beta_hat)


def test_beta_step_uses_previous_theta(iv_data):
    """β⁽¹⁾ must be computed with Θ⁽⁰⁾ = 0: its gradient is zero, so β⁽¹⁾ = α ν⁽⁰⁾ exactly."""
    Z, X, Y = iv_data
    path = dp_2s_gd(Z, X, Y, T=2, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.1, clip1=5.0, clip2=5.0, seed=11)
    rng = np.random.default_rng(11)
    rng.standard_normal((Z.shape[1], X.shape[1]))
    nu0 = rng.standard_normal(X.shape[1]) * path.lambda2
    np.testing.assert_array_equal(path.beta[1], 0.1 * nu0)


def test_matches_loop_reference(iv_data):
    """The vectorised iteration equals a literal transcription of the Algorithm with a loop over rows."""
    Z, X, Y = iv_data
    Z, X, Y = Z[:60], X[:60], Y[:60]
    T, eta, alpha, g1, g2 = 5, 0.7, 0.02, 3.0, 4.0
    path = dp_2s_gd(Z, X, Y, T=T, rho1=0.5, rho2=2.0, eta=eta, alpha=alpha, clip1=g1, clip2=g2, seed=5)

    def clip(g, gamma):
        norm = np.linalg.norm(g)
        return g if norm <= gamma else g * (gamma / norm)

    rng = np.random.default_rng(5)
    n, q = Z.shape
    p = X.shape[1]
    theta, beta = np.zeros((q, p)), np.zeros(p)
    for t in range(T):
        xi = rng.standard_normal((q, p)) * path.lambda1
        nu = rng.standard_normal(p) * path.lambda2
        g_theta = sum(clip(np.outer(Z[i], Z[i] @ theta - X[i]), g1) for i in range(n)) / n
        g_beta = sum(clip(theta.T @ Z[i] * (Z[i] @ theta @ beta - Y[i]), g2) for i in range(n)) / n
        theta, beta = theta - eta * g_theta + eta * xi, beta - alpha * g_beta + alpha * nu
        np.testing.assert_allclose(path.theta[t + 1], theta, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(path.beta[t + 1], beta, rtol=1e-12, atol=1e-14)


# --- the noise -----------------------------------------------------------------------------
def test_noise_std_equals_calibrated_lambda():
    """With X = 0 and Θ⁽⁰⁾ = 0 the first gradient is zero, so Θ⁽¹⁾/η is pure noise Ξ⁽⁰⁾.

    8 runs × 40×30 entries = 9,600 draws: the sample std has relative SE 1/sqrt(2N) ≈ 0.0072;
    we allow 5 SE. The standardised draws must also pass a KS test against N(0, 1) at p = 1e-6.
    """
    n, q, p, T, rho, clip = 400, 40, 30, 20, 0.8, 2.0
    rng = np.random.default_rng(2024)
    Z = rng.standard_normal((n, q))
    draws = []
    for seed in range(8):
        path = dp_2s_gd(Z, np.zeros((n, p)), np.zeros(n), T=T, rho1=rho, rho2=rho, eta=0.3, alpha=0.2,
                        clip1=clip, clip2=clip, seed=seed)
        # times the floating-point sums' rounding allowance (dpivreg.privacy.rounding; 1 + 1.5e-11 here)
        assert path.lambda1 == pytest.approx(clip / n * math.sqrt(2 * T / rho) * gradient_rounding(n, q, p, p),
                                             rel=1e-15)
        draws.append(path.theta[1].ravel() / 0.3)
    draws = np.concatenate(draws)
    lam = clip / n * math.sqrt(2 * T / rho)
    assert abs(draws.std() / lam - 1) < 5 / math.sqrt(2 * draws.size)
    assert stats.kstest(draws / lam, "norm").pvalue > 1e-6


def test_second_stage_noise_std():
    """β⁽¹⁾/α = ν⁽⁰⁾ (zero gradient at Θ⁽⁰⁾ = 0): pooled over 400 seeds × p = 10 entries."""
    n, q, p, T, rho, clip = 200, 10, 10, 5, 2.0, 1.5
    rng = np.random.default_rng(1)
    Z, X, Y = rng.standard_normal((n, q)), rng.standard_normal((n, p)), rng.standard_normal(n)
    draws = np.concatenate([
        dp_2s_gd(Z, X, Y, T=T, rho1=rho, rho2=rho, eta=0.1, alpha=0.25, clip1=clip, clip2=clip, seed=s).beta[1]
        / 0.25 for s in range(400)
    ])
    lam = clip / n * math.sqrt(2 * T / rho)
    assert abs(draws.std() / lam - 1) < 5 / math.sqrt(2 * draws.size)


def test_paper_calibration_noise_and_accounting(iv_data):
    Z, X, Y = iv_data
    kw = dict(T=20, rho1=1.0, rho2=3.0, eta=0.5, alpha=0.05, clip1=5.0, clip2=7.0, seed=0)
    exact = dp_2s_gd(Z, X, Y, **kw)
    paper = dp_2s_gd(Z, X, Y, calibration="paper", **kw)
    assert paper.lambda1 == pytest.approx(math.sqrt(2) * exact.lambda1, rel=1e-14)
    assert paper.lambda2 == pytest.approx(2 * 7.0 / len(Y) * math.sqrt(20 / 3.0)  # and the rounding allowance
                                          * gradient_rounding(len(Y), Z.shape[1], X.shape[1], X.shape[1]), rel=1e-14)
    assert exact.privacy.rho1 == pytest.approx(1.0) and exact.privacy.rho2 == pytest.approx(3.0)
    assert paper.privacy.rho1 == pytest.approx(0.5) and paper.privacy.rho2 == pytest.approx(1.5)
    assert paper.privacy.target == {"rho1": 1.0, "rho2": 3.0}


# --- clipping and sensitivity ----------------------------------------------------------------
PASSES = ["numpy", pytest.param("numba", marks=pytest.mark.skipif(not numba_available(), reason="numba not installed")),
          "safe"]


def _clipped_mean_outer(A, B, clip, which="numpy"):
    """(1/n) Σᵢ CLIP_γ(aᵢbᵢᵀ) through the engine's first-stage pass: Θ = 0 makes the residual −x = B."""
    n, q = A.shape
    p_endog = B.shape[1]
    if which == "safe":
        S1, _, counts = safe_block_sums(A, -B, np.zeros(n), np.zeros((q, p_endog)), np.zeros((q, 1)), np.zeros(q),
                                        clip, math.inf)
        return S1 / n, counts[0]
    S1, _, counts = block_sums(np.ascontiguousarray(A), -B, np.zeros(n), np.zeros((q, p_endog + 2)), clip, math.inf,
                               which)
    assert counts[2] == 0, "a finite norm was flagged as overflowing"
    return S1 / n, counts[0]


@pytest.mark.parametrize("which", PASSES)
def test_clipping_bounds_each_row(which):
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((50, 4)) * 10, rng.standard_normal((50, 3)) * 10
    mean, n_clipped = _clipped_mean_outer(A, B, 1.0, which)
    per_row = [np.outer(a, b) * min(1, 1.0 / (np.linalg.norm(a) * np.linalg.norm(b))) for a, b in zip(A, B)]
    np.testing.assert_allclose(mean, np.mean(per_row, axis=0), rtol=1e-12)
    assert n_clipped == 50


@pytest.mark.parametrize("which", PASSES)
def test_worst_case_neighbour_attains_sensitivity(which):
    """A canary whose clipped gradient flips sign moves the clipped mean by exactly 2γ/n."""
    rng = np.random.default_rng(4)
    n, gamma, M = 100, 2.5, 1e6
    A = rng.standard_normal((n, 3))
    B = rng.standard_normal((n, 2))
    A[0], B[0] = np.array([1.0, 0, 0]), np.array([M, 0])
    B2 = B.copy()
    B2[0] = -B[0]
    g, _ = _clipped_mean_outer(A, B, gamma, which)
    g2, _ = _clipped_mean_outer(A, B2, gamma, which)
    assert np.linalg.norm(g - g2) == pytest.approx(2 * gamma / n, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    gamma=st.floats(0.01, 100.0),
    scale=st.floats(1e-3, 1e4),
    row=st.integers(0, 19),
)
def test_replacing_one_row_moves_mean_by_at_most_2gamma_over_n(seed, gamma, scale, row):
    """Each implementation of the pass (numpy, numba when installed, overflow-safe) has sensitivity 2γ/n."""
    rng = np.random.default_rng(seed)
    n = 20
    A, B = rng.standard_normal((n, 4)) * scale, rng.standard_normal((n, 3)) * scale
    A2, B2 = A.copy(), B.copy()
    A2[row], B2[row] = rng.standard_normal(4) * scale * 100, rng.standard_normal(3) * scale * 100
    for which in ["numpy", "safe"] + (["numba"] if numba_available() else []):
        g, _ = _clipped_mean_outer(A, B, gamma, which)
        g2, _ = _clipped_mean_outer(A2, B2, gamma, which)
        assert np.linalg.norm(g - g2) <= 2 * gamma / n * (1 + 1e-12), which


@pytest.mark.parametrize("which", PASSES)
def test_zero_gradient_rows_are_not_nan(which):
    A = np.zeros((3, 2))
    B = np.ones((3, 1))
    mean, n_clipped = _clipped_mean_outer(A, B, 1.0, which)
    assert np.all(mean == 0) and n_clipped == 0


# --- determinism ---------------------------------------------------------------------------
def test_same_seed_same_path(iv_data):
    Z, X, Y = iv_data
    kw = dict(T=10, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.05, clip1=5.0, clip2=5.0)
    a, b = dp_2s_gd(Z, X, Y, seed=42, **kw), dp_2s_gd(Z, X, Y, seed=42, **kw)
    np.testing.assert_array_equal(a.theta, b.theta)
    np.testing.assert_array_equal(a.beta, b.beta)
    c = dp_2s_gd(Z, X, Y, seed=np.random.default_rng(42), **kw)
    np.testing.assert_array_equal(a.beta, c.beta)
    d = dp_2s_gd(Z, X, Y, seed=43, **kw)
    assert not np.array_equal(a.beta, d.beta)
    e, f = dp_2s_gd(Z, X, Y, seed=None, **kw), dp_2s_gd(Z, X, Y, seed=None, **kw)
    assert not np.array_equal(e.beta, f.beta)


def test_input_arrays_untouched(iv_data):
    Z, X, Y = iv_data
    copies = [a.copy() for a in (Z, X, Y)]
    dp_2s_gd(Z, X, Y, T=3, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.05, clip1=1.0, clip2=1.0, seed=0)
    for a, b in zip((Z, X, Y), copies):
        np.testing.assert_array_equal(a, b)


# --- not private ---------------------------------------------------------------------------
def test_infinite_rho1_alone_is_not_private(iv_data):
    Z, X, Y = iv_data
    with pytest.warns(PrivacyLeakWarning, match="rho1"):
        path = dp_2s_gd(Z, X, Y, T=3, rho1=math.inf, rho2=1.0, eta=0.5, alpha=0.05, clip1=1.0, clip2=1.0, seed=0)
    assert path.privacy.rho == math.inf and path.lambda1 == 0.0 and path.lambda2 > 0


def test_private_run_raises_no_leak_warning(iv_data):
    Z, X, Y = iv_data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dp_2s_gd(Z, X, Y, T=3, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.05, clip1=1.0, clip2=1.0, seed=0)


# --- bad input -----------------------------------------------------------------------------
GOOD = dict(T=5, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.05, clip1=1.0, clip2=1.0, seed=0)


@pytest.mark.parametrize(
    "override, exc, match",
    [
        ({"rho1": 0.0}, ValueError, "rho1"),
        ({"rho2": -1.0}, ValueError, "rho2"),
        ({"rho1": float("nan")}, ValueError, "rho1"),
        ({"rho2": "1"}, TypeError, "rho2"),
        ({"T": 0}, ValueError, "T must be"),
        ({"T": 2.5}, TypeError, "T must be"),
        ({"T": True}, TypeError, "T must be"),
        ({"eta": 0.0}, ValueError, "eta"),
        ({"alpha": -0.1}, ValueError, "alpha"),
        ({"alpha": float("inf")}, ValueError, "alpha"),
        ({"clip1": 0.0}, ValueError, "clip1"),
        ({"clip2": -2.0}, ValueError, "clip2"),
        ({"clip1": None}, ValueError, "clip1=None"),
        ({"calibration": "loose"}, ValueError, "calibration"),
        ({"seed": "abc"}, TypeError, "seed"),
        ({"seed": 1.5}, TypeError, "seed"),
        ({"seed": -3}, ValueError, "seed"),
        ({"n_exog": 3}, ValueError, "n_exog"),
        ({"n_exog": 1}, ValueError, "n_exog=1"),
    ],
)
def test_bad_arguments(iv_data, override, exc, match):
    Z, X, Y = iv_data
    with pytest.raises(exc, match=match):
        dp_2s_gd(Z, X, Y, **{**GOOD, **override})


def test_bad_data(iv_data):
    Z, X, Y = iv_data
    with pytest.raises(ValueError, match="q = 2 instruments"):
        dp_2s_gd(Z[:, :2], X, Y, **GOOD)
    with pytest.raises(ValueError, match="same number of rows"):
        dp_2s_gd(Z, X[:-1], Y, **GOOD)
    bad = Z.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="Z contains NaN"):
        dp_2s_gd(bad, X, Y, **GOOD)
    badY = Y.copy()
    badY[0] = np.inf
    with pytest.raises(ValueError, match="Y contains NaN or infinite"):
        dp_2s_gd(Z, X, badY, **GOOD)
    with pytest.raises(TypeError, match="X must hold numbers"):
        dp_2s_gd(Z, X.astype(str), Y, **GOOD)
    with pytest.raises(ValueError, match="Z must be 2-dimensional"):
        dp_2s_gd(Z[None], X, Y, **GOOD)


def test_divergence_is_reported(iv_data):
    """eta far above 2/λ_max(ZᵀZ/n) makes the first stage explode: the error names the step to lower."""
    Z, X, Y = iv_data
    with pytest.warns(PrivacyLeakWarning), pytest.raises(DivergenceError, match="Lower eta"):
        dp_2s_gd(Z, X, Y, T=2000, rho1=math.inf, rho2=math.inf, eta=10.0, alpha=0.05, clip1=None, clip2=None)
    with pytest.warns(PrivacyLeakWarning), pytest.raises(DivergenceError, match="Lower alpha"):
        dp_2s_gd(Z, X, Y, T=2000, rho1=math.inf, rho2=math.inf, eta=0.5, alpha=50.0, clip1=None, clip2=None)


def test_overflowing_gradient_rows_are_clipped_not_dropped():
    """A residual of 1e200 overflows ‖z‖·‖r‖; the row must still contribute its clipped gradient of norm γ."""
    A = np.array([[1.0, 0.0], [0.0, 1.0]])
    B = np.array([[1e200], [1e150]])
    for which in ["numpy"] + (["numba"] if numba_available() else []):
        *_, counts = block_sums(A, -B, np.zeros(2), np.zeros((2, 3)), 2.0, math.inf, which)
        # row 0's norm overflows; row 1's residual 1e150 is above the norm limit 2·2^480 ≈ 6e144 (group_clips)
        assert counts[2] == 2, f"the {which} pass must flag both rows for the safe pass"
    mean, n_clipped = _clipped_mean_outer(A, B, 2.0, "safe")
    np.testing.assert_allclose(mean, [[1.0], [1.0]])  # each row clipped to norm 2, mean over n = 2
    assert n_clipped == 2


def test_engine_checks_the_budget_it_spends(iv_data, monkeypatch):
    """A calibration bug (noise halved) is caught by the engine's own budget check."""
    import dpivreg.estimation.engine as engine

    original = engine.noise_std
    monkeypatch.setattr(engine, "noise_std", lambda *a, **k: original(*a, **k) / 2)
    Z, X, Y = iv_data
    with pytest.raises(RuntimeError, match="internal error"):
        dp_2s_gd(Z, X, Y, **GOOD)


# --- stage-2 sensitivity (the fused pass forms x̃ᵢ·eᵢ·f2ᵢ from the clipped vectors themselves) -----
def _stage2_sum(Z, Y, B, clip, which):
    """(1/n) Σᵢ CLIP_γ(x̃ᵢeᵢ) with x̃ᵢ = Bᵀzᵢ and eᵢ = −yᵢ (Θ = 0, β = 0): M = [0 | B | 0]."""
    n, q = Z.shape
    M = np.concatenate([np.zeros((q, 1)), B, np.zeros((q, 1))], axis=1)
    _, s2, counts = block_sums(Z, np.zeros((n, 1)), Y, M, math.inf, clip, which)
    if counts[2]:  # a row at the limits of group_clips: the engine recomputes the iteration by the safe pass
        _, s2, _ = safe_block_sums(Z, np.zeros((n, 1)), Y, np.zeros((q, 1)), B, np.zeros(q), math.inf, clip)
    return s2 / n


@pytest.mark.parametrize("which", ["numpy"] + (["numba"] if numba_available() else []))
def test_a_row_whose_whitened_regressors_cancel_cannot_swamp_the_others(which):
    """x̃ = Bᵀz = 0 by cancellation with a huge residual: its gradient is 0 and the other rows keep theirs.

    Summing zᵢeᵢ first and projecting by Bᵀ afterwards would add ~1e208 into the sum and wipe out the
    other rows' contributions (absorption): one row would move the release by far more than 2γ/n.
    """
    rng = np.random.default_rng(8)
    n, gamma = 40, 2.0
    Z, Y = rng.standard_normal((n, 2)), rng.standard_normal(n)
    B = np.array([[1.0], [-1.0]])
    base = _stage2_sum(Z, Y, B, gamma, which)
    Z2, Y2 = Z.copy(), Y.copy()
    Z2[0], Y2[0] = [1e8, 1e8], 1e200
    moved = _stage2_sum(Z2, Y2, B, gamma, which)
    assert np.all(np.isfinite(moved))
    assert np.linalg.norm(moved - base) <= 2 * gamma / n * (1 + 1e-9)


@pytest.mark.parametrize("which", ["numpy"] + (["numba"] if numba_available() else []))
@pytest.mark.parametrize("seed", range(20))
def test_replacing_one_row_moves_the_stage2_sum_by_at_most_2gamma_over_n(seed, which):
    """Random whitening maps B, scales from 1e-100 to 1e100 and a replaced row of any size."""
    rng = np.random.default_rng(seed)
    n, q, p = 30, 3, 2
    gamma = float(10 ** rng.uniform(-2, 2))
    scale = float(10 ** rng.uniform(-100, 100))
    Z, Y = rng.standard_normal((n, q)) * scale, rng.standard_normal(n) * scale
    B = rng.standard_normal((q, p)) * 10 ** rng.uniform(-3, 3)
    Z2, Y2 = Z.copy(), Y.copy()
    Z2[3] = rng.standard_normal(q) * scale * 10 ** rng.uniform(-50, 50)
    Y2[3] = rng.standard_normal() * scale * 10 ** rng.uniform(-50, 50)
    moved = _stage2_sum(Z2, Y2, B, gamma, which) - _stage2_sum(Z, Y, B, gamma, which)
    assert np.linalg.norm(moved) <= 2 * gamma / n * (1 + 1e-9)


def test_a_finite_row_overflowing_zy_does_not_break_the_fit():
    """Review finding: z = (1e150, 1e150), y = 1e200 at t = 0 (x̃ = 0) once turned β into NaN."""
    rng = np.random.default_rng(0)
    Z = rng.standard_normal((50, 2))
    X = Z[:, :1] + rng.standard_normal((50, 1))
    Y = X[:, 0] + rng.standard_normal(50)
    Z[0], X[0], Y[0] = [1e150, 1e150], 1.0, 1e200
    path = dp_2s_gd(Z, X, Y, T=3, eta=0.5, alpha=0.5, clip1=1.0, clip2=1.0, rho1=1.0, rho2=1.0, seed=1)
    assert np.all(np.isfinite(path.beta))
