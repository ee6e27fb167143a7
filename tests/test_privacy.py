"""Exact-value tests of the calibration, the budget object and the (ε, δ) conversions.

Reference values
----------------
* Bun–Steinke column: ρ + 2√(ρ log 1/δ), the conversion of the paper (Liang, Balasubramanian & Lai,
  arXiv 2509.22794), whose footnote gives 2.25, 7.79, 31.47 for ρ = 0.1, 1, 10 at δ = 1e-5 (rounded; the
  formula gives 2.2460, 7.7861, 31.4597).
* CKS20 column: Canonne, Kamath & Steinke (2020), as computed by dp-accounting 0.6 (its RDP accountant, or a
  zCDP event) and OpenDP 0.16 (``make_zCDP_to_approxDP``). Exact Gaussian column: the μ-GDP privacy profile
  with μ = √(2ρ) (Balle & Wang 2018), as computed by dp-accounting 0.6 (its PLD accountant and
  ``get_epsilon_gaussian``). The cross-checks below redo both against the installed packages,
  independently of the hard-coded numbers.
"""

import math
import sys

import numpy as np
import pytest

from dpivreg import PrivacyBudget, Release, delta_from_rho, epsilon_from_rho, rho_from_epsilon
from dpivreg.privacy.accounting import clipped_mean_sensitivity, gaussian_zcdp, noise_std

TABLE = [  # rho, bun-steinke, cks, gaussian at delta = 1e-5
    (0.1, 2.2460, 1.9142, 1.7601),
    (1.0, 7.7861, 7.0772, 6.5730),
    (2.0, 11.5971, 10.7248, 9.9973),
    (10.0, 31.4597, 30.1109, 28.3735),
]


@pytest.mark.parametrize("rho, bs, cks, gauss", TABLE)
def test_epsilon_table(rho, bs, cks, gauss):
    assert epsilon_from_rho(rho, 1e-5, "bun-steinke") == pytest.approx(bs, abs=5e-5)
    assert epsilon_from_rho(rho, 1e-5, "cks") == pytest.approx(cks, abs=5e-5)
    assert epsilon_from_rho(rho, 1e-5, "gaussian") == pytest.approx(gauss, abs=5e-5)
    assert epsilon_from_rho(rho, 1e-5) == epsilon_from_rho(rho, 1e-5, "gaussian")


def test_paper_footnote_rounded():
    assert [round(epsilon_from_rho(r, 1e-5, "bun-steinke"), 2) for r in (0.1, 1, 10)] == [2.25, 7.79, 31.46]


@pytest.mark.parametrize("method", ["gaussian", "cks", "bun-steinke"])
@pytest.mark.parametrize("rho", [0.01, 0.5, 3.0, 40.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10])
def test_delta_inverts_epsilon(method, rho, delta):
    eps = epsilon_from_rho(rho, delta, method)
    assert delta_from_rho(rho, eps, method) == pytest.approx(delta, rel=1e-6, abs=0.0)


def test_conversions_are_ordered():
    for rho in (0.05, 1.0, 25.0):
        g, c, b = (epsilon_from_rho(rho, 1e-6, m) for m in ("gaussian", "cks", "bun-steinke"))
        assert g < c < b


def test_infinite_and_zero_rho():
    assert epsilon_from_rho(math.inf, 1e-5) == math.inf
    assert delta_from_rho(math.inf, 10.0) == 1.0
    assert epsilon_from_rho(0.0, 1e-5) == 0.0


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, 2.0, float("nan")])
def test_bad_delta(delta):
    with pytest.raises(ValueError, match="delta"):
        epsilon_from_rho(1.0, delta)


def test_bad_method():
    with pytest.raises(ValueError, match="method"):
        epsilon_from_rho(1.0, 1e-5, "rdp")


# --- calibration -----------------------------------------------------------------------------
@pytest.mark.parametrize("clip, n, T, rho", [(1.0, 1000, 20, 1.0), (32.5, 31857, 20, 0.5), (3.0, 100, 1, 10.0)])
def test_exact_calibration_spends_rho(clip, n, T, rho):
    lam = noise_std(clip, n, T, rho, "exact")
    assert lam == pytest.approx(clip / n * math.sqrt(2 * T / rho), rel=1e-15)
    assert gaussian_zcdp(clipped_mean_sensitivity(clip, n), lam, T) == pytest.approx(rho, rel=1e-12)


@pytest.mark.parametrize("clip, n, T, rho", [(1.0, 1000, 20, 1.0), (32.5, 31857, 20, 0.5)])
def test_paper_calibration_spends_half(clip, n, T, rho):
    lam = noise_std(clip, n, T, rho, "paper")
    assert lam == pytest.approx(2 * clip / n * math.sqrt(T / rho), rel=1e-15)
    spent = gaussian_zcdp(clipped_mean_sensitivity(clip, n), lam, T)
    assert spent == pytest.approx(rho / 2, rel=1e-12)
    # the Proposition's own expression (2T/n²)·γ²/λ² also gives ρ/2 for one stage
    assert 2 * T / n**2 * clip**2 / lam**2 == pytest.approx(rho / 2, rel=1e-12)


def test_budget_object():
    n, T = 500, 10
    budget = PrivacyBudget(
        [
            Release.gaussian("first", "rho1", steps=T, clip=2.0, n=n, noise_std=noise_std(2.0, n, T, 0.7)),
            Release.gaussian("second", "rho2", steps=T, clip=1.0, n=n, noise_std=noise_std(1.0, n, T, 0.3)),
        ]
    )
    assert budget.rho1 == pytest.approx(0.7)
    assert budget.rho2 == pytest.approx(0.3)
    assert budget.rho == pytest.approx(1.0)
    assert budget.mu == pytest.approx(math.sqrt(2.0))
    assert budget.epsilon(1e-5) == pytest.approx(6.5730, abs=5e-5)
    assert budget.delta(budget.epsilon(1e-7, "cks"), "cks") == pytest.approx(1e-7, rel=1e-6, abs=0.0)
    assert budget.is_private
    frame = budget.to_frame()
    assert list(frame["rho"].round(12)) == [0.7, 0.3]
    text = repr(budget)
    assert "rho1" in text and "rho2" in text and "6.5730" in text


def test_budget_not_private():
    budget = PrivacyBudget([Release.gaussian("x", "rho1", steps=3, clip=None, n=10, noise_std=1.0)])
    assert budget.rho == math.inf and not budget.is_private
    assert budget.epsilon(1e-5) == math.inf
    assert "NOT PRIVATE" in repr(budget)


# --- independent accountants ---------------------------------------------------------------
def _dp_accounting_events(clips, rhos, n, T, calibration):
    """The composed mechanism of DP-2S-GD as dp-accounting events: per stage T Gaussian steps with
    noise multiplier λ/Δ, Δ = 2γ/n (default ADD_OR_REMOVE_ONE relation; see privacy-facts.md)."""
    dpa = pytest.importorskip("dp_accounting")
    events = []
    for clip, rho in zip(clips, rhos):
        multiplier = noise_std(clip, n, T, rho, calibration) / clipped_mean_sensitivity(clip, n)
        events.append(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(multiplier), T))
    return dpa.ComposedDpEvent(events)


@pytest.mark.parametrize("calibration, factor", [("exact", 1.0), ("paper", 0.5)])
@pytest.mark.parametrize("rhos", [(1.0, 1.0), (0.05, 0.05), (1.0, 9.0)])
def test_against_dp_accounting(calibration, factor, rhos):
    pytest.importorskip("dp_accounting")
    from dp_accounting import pld, rdp

    n, T, clips = 1000, 20, (3.0, 5.0)
    event = _dp_accounting_events(clips, rhos, n, T, calibration)
    spent = factor * sum(rhos)
    pld_acc = pld.PLDAccountant(value_discretization_interval=1e-4)
    pld_acc.compose(event)
    rdp_acc = rdp.RdpAccountant()
    rdp_acc.compose(event)
    for delta in (1e-5, 1e-8):
        # PLD is exact up to its discretisation (pessimistic, so >= ours); RDP uses a grid of orders (>= CKS).
        ours_exact = epsilon_from_rho(spent, delta, "gaussian")
        assert pld_acc.get_epsilon(delta) == pytest.approx(ours_exact, rel=2e-4)
        assert pld_acc.get_epsilon(delta) >= ours_exact - 1e-9
        ours_cks = epsilon_from_rho(spent, delta, "cks")
        assert rdp_acc.get_epsilon(delta) == pytest.approx(ours_cks, rel=2e-3)
        assert rdp_acc.get_epsilon(delta) >= ours_cks - 1e-9


@pytest.mark.parametrize("rho", [0.125, 0.5, 2.0, 10.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-6])
def test_against_opendp(rho, delta):
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l2_distance(T=float)
    # a Gaussian mechanism with sensitivity 1 and scale sigma is 1/(2 sigma²)-zCDP
    sigma = 1.0 / math.sqrt(2 * rho)
    meas = dp.m.make_gaussian(*space, scale=sigma)
    assert meas.map(1.0) == pytest.approx(rho, rel=1e-9)
    curve = dp.c.make_zCDP_to_approxDP(meas).map(1.0)
    assert epsilon_from_rho(rho, delta, "cks") == pytest.approx(curve.epsilon(delta), rel=1e-6)


def test_opendp_reference_value():
    # OpenDP 0.16: make_zCDP_to_approxDP of a 0.5-zCDP Gaussian measurement gives eps = 5.22153 at delta = 1e-6
    assert epsilon_from_rho(0.5, 1e-6, "cks") == pytest.approx(5.22153, abs=5e-5)


# --- validation of the conversions ------------------------------------------------------------
METHODS = ["gaussian", "cks", "bun-steinke"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("convert", [epsilon_from_rho, delta_from_rho], ids=["epsilon", "delta"])
@pytest.mark.parametrize("rho", [True, None, "1", 1 + 0j, [1.0]], ids=["bool", "None", "str", "complex", "list"])
def test_conversions_reject_non_real_rho_with_a_type_error(convert, rho, method):
    with pytest.raises(TypeError, match=r"\brho\b"):
        convert(rho, 1e-5 if convert is epsilon_from_rho else 1.0, method)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("convert", [epsilon_from_rho, delta_from_rho], ids=["epsilon", "delta"])
@pytest.mark.parametrize("rho", [-1.0, -1e-300, -math.inf, math.nan, np.float64("nan")])
def test_conversions_reject_negative_or_nan_rho_with_a_value_error(convert, rho, method):
    with pytest.raises(ValueError, match=r"\brho\b"):
        convert(rho, 1e-5 if convert is epsilon_from_rho else 1.0, method)


@pytest.mark.parametrize("delta", [None, "1e-5", True, [1e-5]])
def test_epsilon_from_rho_rejects_non_real_delta_with_a_type_error(delta):
    with pytest.raises(TypeError, match=r"\bdelta\b"):
        epsilon_from_rho(1.0, delta)


@pytest.mark.parametrize("epsilon", [None, "1", True, [1.0]])
def test_delta_from_rho_rejects_non_real_epsilon_with_a_type_error(epsilon):
    with pytest.raises(TypeError, match=r"\bepsilon\b"):
        delta_from_rho(1.0, epsilon)


@pytest.mark.parametrize("epsilon", [-1e-9, -math.inf, math.nan])
def test_delta_from_rho_rejects_negative_or_nan_epsilon_with_a_value_error(epsilon):
    with pytest.raises(ValueError, match=r"\bepsilon\b"):
        delta_from_rho(1.0, epsilon)


def test_conversions_accept_numpy_scalars_and_python_ints():
    assert epsilon_from_rho(np.float64(1.0), np.float64(1e-5)) == epsilon_from_rho(1.0, 1e-5)
    assert delta_from_rho(np.int64(1), np.float32(6.5)) == delta_from_rho(1.0, float(np.float32(6.5)))
    assert delta_from_rho(0, 1) == 0.0
    # an int beyond the float range is an infinite budget, not an OverflowError
    assert epsilon_from_rho(10**400, 1e-5) == math.inf


# --- limits and extreme values ----------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("rho", [0.0, 1e-300, 1.0, 1e300, math.inf])
def test_delta_at_infinite_epsilon_is_zero_for_any_rho(method, rho):
    # every mechanism, even a non-private one, is (inf, 0)-DP
    assert delta_from_rho(rho, math.inf, method) == 0.0


@pytest.mark.parametrize("method", METHODS)
def test_delta_of_an_infinite_rho_is_one_and_of_zero_rho_is_zero(method):
    assert delta_from_rho(math.inf, 0.0, method) == 1.0
    assert delta_from_rho(math.inf, 1e300, method) == 1.0
    assert delta_from_rho(0.0, 0.0, method) == 0.0


def test_budget_delta_limits():
    private = PrivacyBudget([Release.gaussian("x", "rho1", steps=5, clip=1.0, n=100, noise_std=0.1)])
    assert private.delta(math.inf) == 0.0
    assert private.delta(math.inf, "cks") == 0.0
    not_private = PrivacyBudget([Release.gaussian("x", "rho1", steps=3, clip=None, n=10, noise_std=1.0)])
    assert not_private.delta(5.0) == 1.0
    assert not_private.delta(math.inf) == 0.0


HUGE_RHOS = [1e3, 1e6, 1e9, 1e12, 1e15, 1e20, 1e50, 1e100, 1e200, 1e300, 1e307, sys.float_info.max]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("delta", [0.5, 1e-5, 1e-100, 5e-324])
def test_epsilon_of_huge_rho_is_finite_and_monotone(method, delta):
    eps = [epsilon_from_rho(rho, delta, method) for rho in HUGE_RHOS]
    assert all(math.isfinite(e) for e in eps)
    assert all(a <= b for a, b in zip(eps, eps[1:]))
    # ε >= ρ for δ < 1/2 (every conversion has ε ≈ ρ + O(sqrt(ρ)) with a positive O-term there)
    if delta < 0.5:
        assert all(e >= rho for e, rho in zip(eps, HUGE_RHOS))


@pytest.mark.parametrize("delta", [1e-5, 1e-10])
def test_epsilon_is_monotone_in_rho_on_a_dense_grid(delta):
    rhos = np.geomspace(1e-10, 1e300, 600)
    for method in METHODS:
        eps = [epsilon_from_rho(float(r), delta, method) for r in rhos]
        assert np.all(np.diff(eps) >= 0.0), method


@pytest.mark.parametrize("rho", [1e6, 1e12, 1e20, 1e100])
def test_conversions_stay_ordered_for_huge_rho(rho):
    g, c, b = (epsilon_from_rho(rho, 1e-6, m) for m in METHODS)
    assert g <= c <= b


@pytest.mark.parametrize("rho", [1e6, 1e12, 1e20, 1e100])
def test_gaussian_epsilon_of_huge_rho_matches_the_asymptotic(rho):
    # ε = ρ + μ·t with μ = sqrt(2ρ): the second term of δ(ε) is ½·erfcx((t+μ)/√2)·e^(−t²/2) ≈
    # φ(t)/(t+μ), negligible for huge μ, so t → Φ⁻¹(1 − δ) from below.
    from scipy import special

    delta = 1e-5
    z = -special.ndtri(delta)  # 4.264890793922825
    mu = math.sqrt(2 * rho)
    eps = epsilon_from_rho(rho, delta)
    assert eps <= rho + mu * z * (1 + 1e-12)
    assert eps >= rho + mu * (z - 1e-3) * (1 - 1e-15)
    # the former search in ε lost digits there (1e20 gave ρ + 5.8e9 instead of ρ + 6.03e10)
    if rho == 1e20:
        assert eps - rho == pytest.approx(6.0314664e10, rel=1e-6)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("rho", [1e6, 1e9, 1e12])
def test_delta_inverts_epsilon_for_large_rho(method, rho):
    eps = epsilon_from_rho(rho, 1e-8, method)
    assert delta_from_rho(rho, eps, method) == pytest.approx(1e-8, rel=1e-5, abs=0.0)


EXTREMES = [0.0, 5e-324, 1e-300, 1e-8, 0.3, 1.0, 7.5, 1e12, 1e300, sys.float_info.max]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("rho", EXTREMES[1:])
def test_delta_is_a_probability_non_increasing_in_epsilon_at_extremes(method, rho):
    deltas = [delta_from_rho(rho, eps, method) for eps in EXTREMES + [math.inf]]
    assert all(0.0 <= d <= 1.0 for d in deltas)
    assert all(a >= b for a, b in zip(deltas, deltas[1:]))


def test_bun_steinke_and_cks_delta_of_huge_values():
    # formerly OverflowError (bun-steinke, ((ε−ρ)/2)**2) and math range error / 1.0 (cks)
    for method in ("bun-steinke", "cks"):
        assert delta_from_rho(1.0, 1e300, method) == 0.0
        assert delta_from_rho(1e-300, 1e10, method) == 0.0
        assert delta_from_rho(1e300, 1.0, method) == 1.0
        assert delta_from_rho(sys.float_info.max, sys.float_info.max, method) == 1.0
    # bun-steinke at z = (ε − ρ)/(2√ρ) = 0.5: δ = exp(−1/4), also when ρ is tiny
    assert delta_from_rho(1e-300, 1e-150, "bun-steinke") == pytest.approx(math.exp(-0.25), rel=1e-12)


def _cks_log_delta_grid(rho, eps):
    """Brute force: log δ(α) of CKS Prop. 12 on a dense logarithmic grid of α − 1."""
    x = np.geomspace(1e-12, 1e12, 200001)
    return np.min(x * ((1 + x) * rho - eps) - np.log1p(x) + x * np.log(x / (1 + x)))


def _cks_epsilon_grid(rho, delta):
    x = np.geomspace(1e-12, 1e12, 200001)
    L = -math.log(delta)
    return np.min((1 + x) * rho + L / x + np.log(x / (1 + x)) - np.log1p(x) / x)


@pytest.mark.parametrize("rho, eps", [(1e-8, 0.0), (1e-4, 0.01), (0.5, 0.2), (1.0, 3.0), (10.0, 40.0), (1e4, 1e4)])
def test_cks_delta_is_the_minimum_over_the_order(rho, eps):
    # the former bounded search missed the optimum at small rho (1e-8, 0: 3.7e-4 instead of 8.58e-5)
    ours = math.log(delta_from_rho(rho, eps, "cks"))
    brute = _cks_log_delta_grid(rho, eps)
    assert ours <= brute + 1e-9
    assert ours == pytest.approx(brute, abs=1e-6)


@pytest.mark.parametrize("rho, delta", [(1e-8, 1e-5), (0.01, 1e-10), (1.0, 1e-5), (40.0, 1e-3), (1e6, 1e-6)])
def test_cks_epsilon_is_the_minimum_over_the_order(rho, delta):
    ours = epsilon_from_rho(rho, delta, "cks")
    brute = _cks_epsilon_grid(rho, delta)
    assert ours <= brute + 1e-9 * max(1.0, brute)
    assert ours == pytest.approx(brute, rel=1e-6)  # the grid resolves the optimum to ~1e-7


@pytest.mark.parametrize("rho", [1e-300, 1e-100, 1e-20, 1e-12, 1e-8, 1e-6, 1e-4, 0.01, 1.0, 100.0])
@pytest.mark.parametrize("k", [0.0, 0.5, 1.0, 3.0, 8.0])
def test_gaussian_delta_never_exceeds_cks_nor_bun_steinke(rho, k):
    # CKS holds for every ρ-zCDP mechanism, the Gaussian one included, so the exact Gaussian δ
    # is the smallest; Bun–Steinke is the loosest. Checked down to tiny ρ, where the two terms of
    # the Gaussian δ agree to more than 16 digits.
    eps = rho + k * math.sqrt(2 * rho)
    g, c, b = (delta_from_rho(rho, eps, m) for m in METHODS)
    assert g <= c * (1 + 1e-9) and c <= b * (1 + 1e-12)


def test_gaussian_delta_for_tiny_rho():
    # δ(0) = Φ(μ/2) − Φ(−μ/2) = μ·φ(0)·(1 − μ²/24 + …) with μ = sqrt(2ρ); formerly 0 for ρ = 1e-300
    for rho in (1e-300, 1e-40, 1e-12):
        mu = math.sqrt(2 * rho)
        assert delta_from_rho(rho, 0.0) == pytest.approx(mu / math.sqrt(2 * math.pi), rel=1e-9, abs=0.0)


def test_an_unnoised_release_makes_the_whole_fit_not_private():
    record = Release.unnoised("exact statistic", "rho0")
    assert (record.steps, record.clip, record.noise_std) == (1, None, 0.0)
    assert math.isinf(record.sensitivity) and math.isinf(record.rho)
    budget = PrivacyBudget([Release.gaussian("m", "rho1", steps=1, clip=1.0, n=100, noise_std=0.1), record])
    assert not budget.is_private and math.isinf(budget.epsilon(1e-5))


# ---------------------------------------------------------------------------------------- budgets in epsilon
@pytest.mark.parametrize(("epsilon", "delta"), [(1.0, 1e-5), (0.1, 1e-6), (3.0, 1e-5), (8.0, 1e-9)])
def test_rho_from_epsilon_inverts_the_exact_gaussian_profile(epsilon, delta):
    """The largest ρ with δ(ε; μ = √(2ρ)) ≤ δ: ε is met from below to 1e-9, and dp-accounting's PLD accountant (an
    independent oracle, pessimistic by its discretisation) gives the same ε for a Gaussian mechanism of that ρ."""
    rho = rho_from_epsilon(epsilon, delta)
    assert delta_from_rho(rho, epsilon) <= delta
    assert epsilon * (1 - 1e-9) <= epsilon_from_rho(rho, delta) <= epsilon
    assert delta_from_rho(rho * (1 + 1e-9), epsilon) > delta * (1 - 1e-6)  # not much below the largest
    dpa = pytest.importorskip("dp_accounting")
    from dp_accounting import pld

    accountant = pld.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dpa.GaussianDpEvent(1.0 / math.sqrt(2.0 * rho)))  # sensitivity 1, σ = 1/μ
    assert accountant.get_epsilon(delta) == pytest.approx(epsilon, rel=2e-4)


def test_rho_from_epsilon_checks_its_arguments():
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            rho_from_epsilon(bad, 1e-5)
    with pytest.raises(ValueError):
        rho_from_epsilon(1.0, 1.5)
    with pytest.raises(TypeError):
        rho_from_epsilon("1", 1e-5)
