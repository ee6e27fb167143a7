"""The noise-aware moment solve: every released moment matrix has its instruments' block floored at its noise
before any solve.

Exact values on planted releases (the expected numbers are written out from the rule: eigenvalues of the block of
the constant and the instruments below 2√2·σ raised to 2√2·σ, the rest of the block kept, every other entry as
released), the whitening and the solve agreeing, the plug-in worlds' construction, and the central-range
covariance of simulated estimates. A variant of the rule with the earlier floor at 10⁻⁶ of the largest eigenvalue
fails the exact-value tests (checked in each: its answer is far from the expected one).
"""

import math
import warnings

import numpy as np
import pytest

from dpivreg import DPIV2SLS
from dpivreg.estimation.moments import (
    FLOOR,
    NOISE_FLOOR,
    central_covariance,
    central_in_units,
    central_scale_error,
    floor_at_noise,
    floor_spectrum,
    solve_2sls,
)
from dpivreg.estimation.simulation import plug_in_worlds
from dpivreg.estimation.working_scale import ReleasedMoments, working_scale

SIGMA = 0.01


def _planted(eigenvalues, seed=0):
    """A symmetric matrix with the given eigenvalues and a fixed random orthonormal basis."""
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((len(eigenvalues), len(eigenvalues))))
    return (Q * np.asarray(eigenvalues, dtype=float)) @ Q.T, Q


def test_noise_floor_is_two_standard_deviations_of_an_eigenvalue():
    """NOISE_FLOOR = 2√2: an eigenvalue's first-order noise uᵀEu has variance σ²(2 − Σuᵢ⁴) ≤ 2σ²; the floor is two of
    its standard deviations. The variance is checked by simulation for a spread-out u (2 − Σuᵢ⁴ = 1.75; 20,000
    draws: standard error of the variance about 1%, tolerance 5%)."""
    assert NOISE_FLOOR == pytest.approx(2.0 * math.sqrt(2.0), rel=1e-15)
    rng = np.random.default_rng(1)
    D = 4
    u = np.full(D, 0.5)
    upper = np.triu(rng.standard_normal((20_000, D, D)) * SIGMA)
    E = upper + np.swapaxes(np.triu(upper, 1), 1, 2)
    values = np.einsum("i,rij,j->r", u, E, u)
    assert values.var() == pytest.approx(SIGMA**2 * (2.0 - np.sum(u**4)), rel=0.05)


def test_floor_at_noise_exact_values():
    """Eigenvalues (1, 0.2, 0.01, −0.05) of the leading 4 × 4 block at σ = 0.01 become (1, 0.2, 0.0283, 0.0283) in the
    same basis (1e-12), the entries outside the block stay as released (bit for bit); the earlier relative floor
    (10⁻⁶ of the largest) would keep 0.01 and raise −0.05 only to 10⁻⁶."""
    block, Q = _planted([1.0, 0.2, 0.01, -0.05])
    expected = (Q * np.array([1.0, 0.2, 2 * math.sqrt(2) * SIGMA, 2 * math.sqrt(2) * SIGMA])) @ Q.T
    other = np.random.default_rng(2).standard_normal((6, 6)) * 0.1
    M = other + other.T
    M[:4, :4] = block
    out = floor_at_noise(M, SIGMA, 4)
    np.testing.assert_allclose(out[:4, :4], expected, atol=1e-12)
    assert np.array_equal(out[:, 4:], M[:, 4:]) and np.array_equal(out[4:, :], M[4:, :])
    assert np.abs(floor_spectrum(block, FLOOR) - expected).max() > 0.01  # the old rule is far from it
    stacked = floor_at_noise(np.stack([M, M]), SIGMA, 4)
    np.testing.assert_allclose(stacked[:, :4, :4], np.stack([expected, expected]), atol=1e-12)


def test_floor_at_noise_leaves_exact_and_resolved_moments_alone():
    """σ = 0 (exact moments): returned bit for bit (a copy). A release whose block's eigenvalues all exceed the floor:
    unchanged to rounding (1e-13)."""
    M, _ = _planted([1.0, 0.5, 0.01])
    out = floor_at_noise(M, 0.0, 3)
    assert out is not M and np.array_equal(out, M)
    np.testing.assert_allclose(floor_at_noise(M, 0.001, 3), M, atol=1e-13)


def _released(M, sigma, L, block):
    return ReleasedMoments(M, sigma, True, L, block)


def test_solvable_moments_and_their_2sls_solution_exact_values():
    """A planted ill-conditioned release of [1, z, w, instrument, x, y] (the controls' direction z − w nearly singular,
    released negative): ``solvable`` is L·F(M)·Lᵀ, F flooring the block of [1, z, w, instrument] only, and the warm
    start is 2SLS on it, equal to the closed form written out here (1e-10); with the earlier relative floor the same
    release gives the controls' coefficients off by more than 1."""
    rng = np.random.default_rng(3)
    n = 2000
    z = rng.uniform(-1, 1, n)
    w = np.clip(z + 0.02 * rng.standard_normal(n), -1, 1)  # w ≈ z: a direction of variance ~2e-4
    v = rng.standard_normal(n)
    instrument = rng.uniform(-1, 1, n)
    x = np.clip(0.5 * instrument + 0.3 * z + 0.2 * v, -1, 1)
    y = np.clip(0.4 * x + 0.2 * w + 0.1 * v + 0.1 * rng.standard_normal(n), -1, 1)
    V = np.column_stack([np.ones(n), z, w, instrument, x, y])
    truth = V.T @ V / n
    noise = np.zeros_like(truth)
    direction = np.array([0, 1, -1, 0, 0, 0]) / math.sqrt(2)
    noise += -0.003 * np.outer(direction, direction)  # pushes the z − w eigenvalue below zero
    M = truth + noise
    L = np.eye(6)  # the working scale is the box scale here: Z = [1, z, w, instrument], X_endog = x, y
    moments = _released(M, SIGMA, L, 4)
    floored = M.copy()
    values, vectors = np.linalg.eigh(M[:4, :4])
    floored[:4, :4] = (vectors * np.maximum(values, 2 * math.sqrt(2) * SIGMA)) @ vectors.T
    np.testing.assert_allclose(moments.solvable(), floored, atol=1e-15)
    q, k = 4, 3
    theta, beta = solve_2sls(moments.solvable(), q, k, 1)
    Szz, Szx, Szy = floored[:q, :q], np.column_stack([floored[:q, :k], floored[:q, q]]), floored[:q, q + 1]
    A = np.linalg.solve(Szz, Szx)
    expected = np.linalg.solve(Szx.T @ A, A.T @ Szy)
    np.testing.assert_allclose(beta, expected, rtol=1e-10)
    np.testing.assert_allclose(theta[:, 0], np.linalg.solve(Szz, floored[:q, q]), rtol=1e-10)
    _, old = solve_2sls(M, q, k, 1)  # the earlier rule: the 1e-6 relative floor inside the solve only
    assert np.abs(old - expected).max() > 1.0


@pytest.mark.parametrize("formula", ["y ~ 1 + w1 + w2 + [x ~ z]", "y ~ w1 + w2 + [x ~ z]"])
def test_whitening_and_solve_agree_on_a_collinear_release(formula):
    """On a design with nearly collinear controls and a small noisy release, the working scale is built from the same
    floored matrix every solve uses: the solvable moments' instrument block is the identity (but for the constant's
    own entry, 1 up to the floor; 1e-8), its smallest eigenvalue is far from 0, and the unfloored release's is not."""
    rng = np.random.default_rng(4)
    n = 600
    w1 = rng.uniform(0, 10, n)
    w2 = w1 + rng.uniform(-0.05, 0.05, n)
    z = rng.uniform(0, 1, n)
    x = z + 0.1 * w1 + rng.standard_normal(n)
    y = x + 0.1 * w2 + rng.standard_normal(n)
    frame = __import__("pandas").DataFrame({"y": y, "x": x, "z": z, "w1": w1, "w2": w2})
    bounds = {"y": (-10, 20), "x": (-5, 10), "z": (0, 1), "w1": (0, 10), "w2": (-1, 11)}
    design = DPIV2SLS.from_formula(formula, frame).design
    scale = working_scale(design, bounds, route="private", rho0=0.2, rng=np.random.default_rng(5))
    q = scale.q
    S = scale.moments.solvable()[:q, :q]
    free = [i for i in range(q) if i != scale.constant_index]
    np.testing.assert_allclose(S[np.ix_(free, free)], np.eye(len(free)), atol=1e-8)
    assert np.linalg.eigvalsh(S).min() > 0.5
    assert np.linalg.eigvalsh(scale.moments.working()[:q, :q]).min() < 0.5


def test_plug_in_worlds_have_the_plug_in_solution_and_positive_moments():
    """Every plug-in world's true moments solve to the plug-in (Θ, β) exactly (1e-9); its instruments' box-scale
    moments are positive definite and map to its S; its release is its truth plus the same noise, floored: the
    instruments' block of the release equals the fit's floored block where the projection is idle (1e-10; it is
    idle in every world of this well-resolved design)."""
    rng = np.random.default_rng(6)
    n = 800
    frame = __import__("pandas").DataFrame({"z": rng.uniform(-1, 1, n), "w": rng.uniform(-1, 1, n)})
    frame["x"] = frame.z + 0.5 * frame.w + rng.standard_normal(n)
    frame["y"] = frame.x + frame.w + rng.standard_normal(n)
    design = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z]", frame).design
    bounds = {"y": (-8, 8), "x": (-5, 5), "z": (-1, 1), "w": (-1, 1)}
    scale = working_scale(design, bounds, route="private", rho0=0.5, rng=np.random.default_rng(7))
    q, k = scale.q, scale.n_exog
    theta, beta = solve_2sls(scale.moments.solvable(), q, k, 1)
    worlds = plug_in_worlds(scale, theta, beta, replications=50, rng=np.random.default_rng(8))
    b = scale.moments.instrument_block
    floored_block = scale.moments.working_instruments(scale.moments.floored[:b, :b], q)
    for r in range(50):
        moments = np.zeros((q + 2, q + 2))
        moments[:q, :q], moments[:q, q:q + 1], moments[:q, q + 1] = worlds.S[r], worlds.g_x[r], worlds.g_y[r]
        world_theta, world_beta = solve_2sls(moments, q, k, 1)
        np.testing.assert_allclose(world_theta, theta, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(world_beta, beta, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(scale.moments.working_instruments(worlds.instruments[r], q), worlds.S[r], atol=1e-12)
        np.testing.assert_allclose(worlds.released[r, :q, :q], floored_block, atol=1e-10)
    assert np.linalg.eigvalsh(worlds.instruments).min() > 0


def test_central_covariance_is_the_covariance_of_normal_draws_and_ignores_a_few_far_ones():
    """Normal draws: scales within 4% of the true standard deviations and the correlation within 0.03 (20,000 draws:
    the scales' standard error is about 0.96/√20000 = 0.7%, the correlation's 0.005). With 1% of the draws moved 10⁶
    away the scale grows by 5% (the range's upper end becomes the other draws' 98.5% quantile: (2.165 + 1.956)/3.92
    = 1.051; tolerance 1.02-1.09) while the variance grows by a factor of about 10¹⁰; the median shift is the draws'
    median minus the centre."""
    rng = np.random.default_rng(9)
    cov = np.array([[4.0, 1.2], [1.2, 1.0]])
    draws = rng.multivariate_normal([1.0, -2.0], cov, size=20_000)
    estimate, shift = central_covariance(draws, np.array([0.0, 0.0]))
    np.testing.assert_allclose(np.sqrt(np.diag(estimate)), [2.0, 1.0], rtol=0.04)
    assert estimate[0, 1] / math.sqrt(estimate[0, 0] * estimate[1, 1]) == pytest.approx(0.6, abs=0.03)
    np.testing.assert_allclose(shift, np.median(draws, axis=0), rtol=1e-12)
    far = draws.copy()
    far[:200, 0] = 1e6
    far_estimate, _ = central_covariance(far, np.zeros(2))
    growth = np.sqrt(np.diag(far_estimate) / np.diag(estimate))
    assert 1.02 < growth[0] < 1.09 and growth[1] == pytest.approx(1.0, abs=1e-12)
    assert np.cov(far, rowvar=False)[0, 0] > 1e9
    errors = central_scale_error(draws)
    assert np.all(errors > 0) and np.all(errors / np.sqrt(np.diag(estimate)) < 0.02)


def test_central_covariance_counts_non_finite_draws_as_far():
    """NaN and infinite draws widen the range (they are the worst draws): more than 2.5% of them make the scale
    infinite, a few do not."""
    draws = np.random.default_rng(10).standard_normal((1000, 1))
    few = draws.copy()
    few[:10] = np.nan
    assert np.isfinite(central_covariance(few, np.zeros(1))[0]).all()
    many = draws.copy()
    many[:40] = np.nan
    assert central_covariance(many, np.zeros(1))[0][0, 0] == np.inf


def test_collinear_real_design_is_accurate_and_its_standard_errors_are_not_absurd():
    """Card (1995)'s schooling equation (n = 3,010, experience and its square, eight regional indicators; bounds from
    the variables' definitions) at total ρ = 2.6, six seeds: every estimate of the return to schooling is within two
    2SLS standard errors of 2SLS and every private standard error below four times 2SLS's. Before the noise-aware
    solve the same fits were 3.2 2SLS standard errors away with a private standard error 147 times 2SLS's (seed 1)."""
    from linearmodels.datasets import card
    from linearmodels.iv import IV2SLS

    controls = "exper + expersq + black + smsa + south + smsa66 + " + " + ".join(f"reg66{j}" for j in range(2, 10))
    formula = f"lwage ~ 1 + {controls} + [educ ~ nearc4]"
    data = card.load()
    reference = IV2SLS.from_formula(formula, data).fit(cov_type="robust")
    indicators = ["black", "smsa", "south", "smsa66", "nearc4"] + [f"reg66{j}" for j in range(2, 10)]
    bounds = {c: (0.0, 1.0) for c in indicators}
    bounds.update(lwage=(4.0, 8.5), exper=(0.0, 28.0), expersq=(0.0, 784.0), educ=(0.0, 20.0))
    model = DPIV2SLS.from_formula(formula, data)
    for seed in range(6):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            res = model.fit(rho=2.6, bounds=bounds, seed=seed)
        error = abs(res.params["educ"] - reference.params["educ"]) / reference.std_errors["educ"]
        assert error < 2.0, (seed, error)
        assert res.bse["educ"] < 4.0 * reference.std_errors["educ"], seed


def test_world_releases_are_the_full_release_floored_and_mapped():
    """A world's release as 2SLS reads it equals the full box-scale release of that world (its truth plus the noise),
    floored and mapped to the working scale, in every entry that 2SLS reads (1e-10): also when the floor is active
    (fresh noise, active in most of these worlds), where what it adds to the instruments' block reaches the cross
    moments through the constant. With an intercept the working map is square, so the full world is exact."""
    from dpivreg.estimation.simulation import world_releases

    rng = np.random.default_rng(11)
    n = 400
    frame = __import__("pandas").DataFrame({"z": rng.uniform(-1, 1, n), "w": rng.uniform(0, 1, n)})
    frame["w2"] = frame.w + rng.uniform(-0.01, 0.01, n)  # nearly collinear with w: the floor binds
    frame["x"] = frame.z + 0.5 * frame.w + rng.standard_normal(n)
    frame["y"] = frame.x + frame.w + rng.standard_normal(n)
    design = DPIV2SLS.from_formula("y ~ 1 + w + w2 + [x ~ z]", frame).design
    bounds = {"y": (-8, 9), "x": (-5, 6), "z": (-1, 1), "w": (0, 1), "w2": (-0.1, 1.1)}
    scale = working_scale(design, bounds, route="private", rho0=0.5, rng=np.random.default_rng(12))
    moments, q, k = scale.moments, scale.q, scale.n_exog
    theta, beta = solve_2sls(moments.solvable(), q, k, 1)
    worlds = plug_in_worlds(scale, theta, beta, replications=40, rng=np.random.default_rng(13))
    noise = moments.noise_draws(np.random.default_rng(14), 40)
    released = world_releases(moments, worlds, noise)
    L = moments.working_map
    L_inverse = np.linalg.inv(L)
    b = moments.instrument_block
    active = 0
    for r in range(40):
        W = np.zeros((q + 2, q + 2))
        W[:q, :q] = worlds.S[r]
        W[:q, q], W[:q, q + 1] = worlds.g_x[r][:, 0], worlds.g_y[r]
        W[q:, :q] = W[:q, q:].T
        W[q:, q:] = W[q:, :q] @ np.linalg.solve(worlds.S[r], W[:q, q:]) + np.eye(2)
        box = L_inverse @ W @ L_inverse.T
        np.testing.assert_allclose(box[:b, :b], worlds.instruments[r], atol=1e-10)
        expected = moments.working(moments.floor(box + noise[r]))
        np.testing.assert_allclose(released[r, :q, :], expected[:q, :], atol=1e-10)
        active += not np.allclose(moments.floor(box + noise[r]), box + noise[r])
    assert active > 20


def test_central_ranges_are_taken_in_the_reported_units():
    """With a Jacobian that mixes coefficients (as the intercept's does), the covariance mapped to the reported units,
    J C Jᵀ, has the central-range scales of the reported draws themselves (1e-12), which the working-scale ranges
    mapped through J would not (by 2.8% here, where 2.5% of the draws are far in one working coefficient)."""
    rng = np.random.default_rng(15)
    draws = rng.standard_normal((4000, 2))
    draws[:100, 1] = 50.0  # far in the second working coefficient only
    J = np.array([[1.0, -5.0], [0.0, 1.0]])
    cov, shift = central_in_units(draws, np.zeros(2), J)
    reported, reported_shift = central_covariance(draws @ J.T, np.zeros(2))
    np.testing.assert_allclose(J @ cov @ J.T, reported, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(J @ shift, reported_shift, rtol=1e-12, atol=1e-12)
    naive = J @ central_covariance(draws, np.zeros(2))[0] @ J.T
    assert abs(np.sqrt(naive[0, 0]) / np.sqrt(reported[0, 0]) - 1.0) > 0.02
