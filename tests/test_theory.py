"""Tests of dpivreg.estimation.theory: the Theorem's terms, conditions, regimes, contraction rates and planning.

Expected numbers are worked out by hand in each test (constants of the bound set to 1), never by
calling the function under test a second time.
"""

from __future__ import annotations

import math
import sys

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")

from dpivreg.estimation import theory as th  # noqa: E402
from dpivreg.planning import theorem_plan as tp  # noqa: E402

INF = math.inf
LN5 = math.log(5.0)


# ----------------------------------------------------------------------------------------
# 1. terms and conditions against hand computations
# ----------------------------------------------------------------------------------------
def test_terms_hand_example_paper_setting():
    # n = 1000, p = q = 5, T = 20, rho1 = rho2 = 1, tau = 5, kappa = 1/2 (the paper's Figure 3 setting)
    # optimization: (1/2)^(20/2) = 1/1024
    assert th.optimization_term(20, 0.5) == pytest.approx(1 / 1024, rel=1e-12)
    # privacy: sqrt(q) + sqrt(tau) = 2*sqrt(5), cubed = 40*sqrt(5); times sqrt(p) = sqrt(5) gives 200;
    # 200 * sqrt(20) / (1000 * sqrt(1)) = 0.2 * sqrt(20) = 0.4 * sqrt(5) = 0.894427...
    assert th.privacy_term(1000, 5, 5, 20, 1.0, 1.0, 5.0) == pytest.approx(0.4 * math.sqrt(5), rel=1e-12)
    # statistical: sqrt(25) * (5 + log 25) / sqrt(1000) = 5 * (5 + 2 log 5) / sqrt(1000) = 1.29952...
    assert th.statistical_term(1000, 5, 5, 5.0) == pytest.approx(5 * (5 + 2 * LN5) / math.sqrt(1000), rel=1e-12)
    # T condition: (2*sqrt(5))^6 = 64 * 125 = 8000, so 1 * 1000^2 / (5 * 8000) = 25
    assert th.t_condition_limit(1000, 5, 5, 1.0, 5.0) == pytest.approx(25.0, rel=1e-12)
    # n condition: max{25 (5 + 2 log 5)^2, 40 sqrt(5) / 1} = 25 * 8.2189^2 = 1688.7 (the first entry wins)
    n_min = 25 * (5 + 2 * LN5) ** 2
    assert n_min > 40 * math.sqrt(5)
    assert th.n_condition_minimum(5, 5, 1.0, 1.0, 5.0) == pytest.approx(n_min, rel=1e-12)


def test_terms_hand_example_unequal_budgets():
    # n = 10^4, p = 1, q = 4, T = 9, rho1 = 2, rho2 = 1/2, tau = 1, kappa = 1/4
    # optimization: (1/4)^(9/2) = 2^-9 = 1/512
    assert th.optimization_term(9, 0.25) == pytest.approx(1 / 512, rel=1e-12)
    # privacy uses min(rho) = 1/2: sqrt(1) * (2 + 1)^3 * sqrt(9) / (10^4 * sqrt(1/2)) = 81 sqrt(2) / 10^4
    assert th.privacy_term(1e4, 1, 4, 9, 2.0, 0.5, tau=1.0) == pytest.approx(81 * math.sqrt(2) / 1e4, rel=1e-12)
    # statistical: sqrt(4) * (1 + log 4) / 100
    assert th.statistical_term(1e4, 1, 4, tau=1.0) == pytest.approx(2 * (1 + math.log(4)) / 100, rel=1e-12)
    # T condition uses rho1 = 2: 2 * 10^8 / (1 * 3^6) = 2e8 / 729
    assert th.t_condition_limit(1e4, 1, 4, 2.0, tau=1.0) == pytest.approx(2e8 / 729, rel=1e-12)
    # n condition: max{4 (1 + log 4)^2 = 22.8, 27 / sqrt(1/2) = 27 sqrt(2) = 38.2}: the privacy entry wins
    assert 4 * (1 + math.log(4)) ** 2 < 27 * math.sqrt(2)
    assert th.n_condition_minimum(1, 4, 2.0, 0.5, tau=1.0) == pytest.approx(27 * math.sqrt(2), rel=1e-12)


def test_conditions_hold_and_violated():
    # T condition limit 25 (see above): T = 20 holds with factor 0.8, T = 80 is off by 80/25 = 3.2
    held = th.t_condition(20, 1000, 5, 5, 1.0)
    assert (held.name, held.value, held.holds) == ("T condition", 20.0, True)
    assert held.factor == pytest.approx(0.8, rel=1e-12)
    assert held.describe() == "holds"
    broken = th.t_condition(80, 1000, 5, 5, 1.0)
    assert not broken.holds and broken.factor == pytest.approx(3.2, rel=1e-12)
    assert broken.describe() == "violated by a factor 3.2"
    # n condition: 1688.7 / 1000 = 1.69
    n_cond = th.n_condition(1000, 5, 5, 1.0, 1.0)
    assert not n_cond.holds
    assert n_cond.factor == pytest.approx(25 * (5 + 2 * LN5) ** 2 / 1000, rel=1e-12)
    assert n_cond.describe() == "violated by a factor 1.69"
    assert th.n_condition(2000, 5, 5, 1.0, 1.0).holds
    # infinite rho1: no T condition
    assert th.t_condition_limit(1000, 5, 5, INF) == INF
    assert th.t_condition(10**9, 1000, 5, 5, INF).holds
    # infinite budgets: only the statistical entry of the n condition is left
    assert th.n_condition_minimum(1, 1, INF, INF, 5.0) == pytest.approx(25.0)  # 1 * 1 * (5 + log 1)^2


def test_terms_vectorise_over_T():
    T = np.array([1, 4, 9, 16])
    # kappa = 1/4: (1/4)^(T/2) = 2^-T
    np.testing.assert_allclose(th.optimization_term(T, 0.25), 2.0 ** -T.astype(float), rtol=1e-12)
    # p = q = 1, tau = 1: (1 + 1)^3 sqrt(T) / (100 * 1) = 0.08 sqrt(T) = 0.08, 0.16, 0.24, 0.32
    priv = th.privacy_term(100, 1, 1, T, 1.0, 1.0, tau=1.0)
    assert isinstance(priv, np.ndarray) and priv.shape == (4,)
    np.testing.assert_allclose(priv, [0.08, 0.16, 0.24, 0.32], rtol=1e-12)
    assert isinstance(th.optimization_term(3, 0.5), float)
    assert th.optimization_term(np.ones((2, 3)), 0.5).shape == (2, 3)


# ----------------------------------------------------------------------------------------
# scaling laws
# ----------------------------------------------------------------------------------------
def test_privacy_term_scaling():
    base = th.privacy_term(1000, 3, 7, 10, 2.0, 0.7, tau=3.0)
    assert th.privacy_term(1000, 3, 7, 40, 2.0, 0.7, tau=3.0) / base == pytest.approx(2.0, rel=1e-12)  # √T
    assert th.privacy_term(10000, 3, 7, 10, 2.0, 0.7, tau=3.0) / base == pytest.approx(0.1, rel=1e-12)  # 1/n
    # rho2 = 0.7 -> 2.8 moves min(rho) from 0.7 to rho1 = 2.0: factor sqrt(0.7 / 2.0)
    assert th.privacy_term(1000, 3, 7, 10, 2.0, 2.8, tau=3.0) / base == pytest.approx(math.sqrt(0.7 / 2.0), rel=1e-12)
    # only the smaller budget matters: quadrupling it halves the term, changing the larger one does nothing
    assert th.privacy_term(1000, 3, 7, 10, 2.0, 0.175, tau=3.0) / base == pytest.approx(2.0, rel=1e-12)
    assert th.privacy_term(1000, 3, 7, 10, 50.0, 0.7, tau=3.0) == pytest.approx(base, rel=1e-12)


def test_statistical_term_scaling():
    base = th.statistical_term(1000, 3, 7, tau=3.0)
    assert th.statistical_term(4000, 3, 7, tau=3.0) / base == pytest.approx(0.5, rel=1e-12)
    assert th.statistical_term(1e8, 3, 7, tau=3.0) / base == pytest.approx(math.sqrt(1000 / 1e8), rel=1e-12)


def test_infinite_budgets_remove_privacy_term():
    T = np.arange(1, 1001)
    np.testing.assert_array_equal(th.privacy_term(1000, 5, 5, T, INF, INF), 0.0)
    # one infinite budget: the other one counts
    assert th.privacy_term(1000, 5, 5, 20, INF, 1.0) == pytest.approx(0.4 * math.sqrt(5), rel=1e-12)


# ----------------------------------------------------------------------------------------
# growth of the recommended T with n (the paper's "sub-linear but super-logarithmic")
# ----------------------------------------------------------------------------------------
def test_recommended_T_sublinear_and_T_over_log_n_increasing_on_1e3_to_1e8():
    ns = 10.0 ** np.arange(3, 9)
    Ts = np.array([tp.recommended_T(n, 5, 5, 1.0, 1.0, kappa=0.5) for n in ns], dtype=float)
    assert np.all(np.diff(Ts) > 0)
    ratio_n = Ts / ns
    assert np.all(np.diff(ratio_n) < 0) and ratio_n[-1] < 1e-6  # sub-linear: T/n decreases to 0
    ratio_log = Ts / np.log(ns)
    assert np.all(np.diff(ratio_log) > 0)  # T/log n increases over these decades, as the brief expects


def test_recommended_T_is_logarithmic_not_super_logarithmic():
    # FINDING: with the bound as stated (constants 1) the minimiser solves
    # log(1/κ) √T κ^(T/2) = √p(√q+√τ)³/(n√ρ), so T* = (2 log n + log T* + O(1))/log(1/κ).
    # T*/log n increases only because it approaches its limit 2/log(1/κ) from below; T* gains
    # about 2 log(10)/log(1/κ) (6.64 at κ = 1/2) per decade: T* = Θ(log n), not super-logarithmic.
    L = math.log(2.0)
    ns = 10.0 ** np.arange(3, 13)
    Ts = np.array([tp.recommended_T(n, 5, 5, 1.0, 1.0, kappa=0.5) for n in ns], dtype=float)
    assert np.all(Ts / np.log(ns) < 2 / L)
    steps = np.diff(Ts)
    per_decade = 2 * math.log(10) / L
    log_growth = np.log(Ts[1:] / Ts[:-1]) / L  # the log T* part of the expansion
    assert np.all(steps >= per_decade - 1) and np.all(steps <= per_decade + log_growth + 1)
    assert np.all(steps[2:] <= 8)  # from n = 1e5 on: 7 more iterations per tenfold n


def test_claim_holds_for_the_plateau():
    # the statistical plateau runs from ~log n / log(1/κ) to ~n: any T in it keeps the bound
    # within a factor 3 of the statistical term (each term is at most the statistical one there)
    for n in (1e4, 1e6, 1e8):
        rb = th.regime_boundaries(n, 5, 5, 1.0, 1.0, 5.0, 0.5)
        # end_optimization = log(n / (25 (5 + 2 log 5)^2)) / log 2; start_privacy = n * 5 * (5 + 2 log 5)^2 / 8000
        assert rb.end_optimization == pytest.approx(math.log(n / (25 * (5 + 2 * LN5) ** 2)) / math.log(2), rel=1e-12)
        assert rb.start_privacy == pytest.approx(n * 5 * (5 + 2 * LN5) ** 2 / 8000, rel=1e-12)
        T = np.unique(np.geomspace(math.ceil(rb.end_optimization), math.floor(rb.start_privacy), 50).astype(int))
        stat = th.statistical_term(n, 5, 5)
        total = th.optimization_term(T, 0.5) + th.privacy_term(n, 5, 5, T, 1.0, 1.0) + stat
        assert np.all(total <= 3 * stat * (1 + 1e-12))
        assert rb.end_optimization <= tp.recommended_T(n, 5, 5, 1.0, 1.0, kappa=0.5) <= rb.start_privacy


# ----------------------------------------------------------------------------------------
# regimes
# ----------------------------------------------------------------------------------------
def test_regime_on_each_side_of_the_boundaries():
    # n = 10^4, p = q = 5, rho = 1, tau = 5, kappa = 1/2:
    # end_optimization = log(10^4 / 1688.7) / log 2 = 2.57; start_privacy = 10^4 * 5 * 67.55 / 8000 = 422.2;
    # T limit = 10^8 / 40000 = 2500
    args = (1e4, 5, 5, 1.0, 1.0, 5.0, 0.5)
    rb = th.regime_boundaries(*args)
    assert rb.end_optimization == pytest.approx(math.log(1e4 / (25 * (5 + 2 * LN5) ** 2)) / math.log(2), rel=1e-12)
    assert rb.start_privacy == pytest.approx(1e4 * 5 * (5 + 2 * LN5) ** 2 / 8000, rel=1e-12)
    assert rb.t_limit == pytest.approx(2500.0, rel=1e-12)
    expected = {
        1: "optimization-dominated",
        2: "optimization-dominated",
        3: "statistical plateau",
        422: "statistical plateau",
        423: "privacy-dominated",
        2500: "privacy-dominated",
        2501: "beyond the T condition",
    }
    for T, label in expected.items():
        assert th.regime(T, *args) == label
    labels = th.regime(np.array(list(expected)), *args)
    assert list(labels) == list(expected.values())


def test_regime_log_argument_below_one_and_empty_plateau():
    # n = 1000 < 25 (5 + 2 log 5)^2 = 1688.7: the log is negative, the optimization regime is empty
    rb = th.regime_boundaries(1000, 5, 5, 1.0, 1.0, 5.0, 0.5)
    assert rb.end_optimization == 0.0
    assert th.regime(1, 1000, 5, 5, 1.0, 1.0) == "statistical plateau"
    # rho2 = 1e-4: start_privacy = 10^4 * 1e-4 * 5 * 67.55 / 8000 = 0.042 < end_optimization = 2.57
    rb = th.regime_boundaries(1e4, 5, 5, 1.0, 1e-4, 5.0, 0.5)
    assert rb.start_privacy < rb.end_optimization
    assert th.regime(2, 1e4, 5, 5, 1.0, 1e-4) == "optimization-dominated"
    assert th.regime(3, 1e4, 5, 5, 1.0, 1e-4) == "privacy-dominated"


def test_regime_with_infinite_budgets():
    T = np.unique(np.geomspace(1, 1e9, 200).astype(int))
    rb = th.regime_boundaries(1e4, 5, 5, INF, INF)
    assert rb.start_privacy == INF and rb.t_limit == INF
    labels = set(th.regime(T, 1e4, 5, 5, INF, INF))
    assert labels == {"optimization-dominated", "statistical plateau"}
    # rho1 = inf only: privacy regime exists but the T condition never binds
    labels = set(th.regime(T, 1e4, 5, 5, INF, 1.0))
    assert "privacy-dominated" in labels and "beyond the T condition" not in labels


# ----------------------------------------------------------------------------------------
# 4. contraction rates and step sizes
# ----------------------------------------------------------------------------------------
def test_delta_and_eigenvalue_bounds():
    # (sqrt(4) + sqrt(1)) / sqrt(100) = 3 / 10
    assert th.delta_tau(100, 4, tau=1.0) == pytest.approx(0.3, rel=1e-12)
    theta = np.array([[2.0, 0.0], [0.0, 1.0], [0.0, 0.0]])  # q = 3, p = 2, singular values 2 and 1
    # delta = 1/2: gamma_bar = 1.5^2 * 4 = 9, gamma_under = 0.5^2 * 1 = 0.25
    assert th.eigenvalue_bounds(theta, 0.5) == pytest.approx((9.0, 0.25), rel=1e-12)
    # delta = 3/2 >= 1: the lower bound collapses to 0; gamma_bar = 2.5^2 * 4 = 25
    assert th.eigenvalue_bounds(theta, 1.5) == pytest.approx((25.0, 0.0), rel=1e-12)
    # a single regressor may be given as a vector
    assert th.eigenvalue_bounds([3.0, 4.0], 0.0) == pytest.approx((25.0, 25.0), rel=1e-12)


def test_contraction_rates_hand_examples():
    # delta = 0: L = mu = 1, kappa_theta = 0; gamma_bar = 3, gamma_under = 1: kappa_beta = 3/4
    rates = th.contraction_rates(0.0, 3.0, 1.0)
    assert rates == pytest.approx((0.75, 0.0, 0.75), abs=1e-15)
    # delta = 1/2: (2.25 - 0.25) / (2.25 + 0.25) = 0.8 = max
    rates = th.contraction_rates(0.5, 3.0, 1.0)
    assert (rates.kappa_beta, rates.kappa_theta, rates.kappa) == pytest.approx((0.75, 0.8, 0.8), rel=1e-12)
    # delta >= 1: no contraction guaranteed; gamma_under = 0: kappa_beta = 1
    assert th.contraction_rates(1.0, 3.0, 1.0).kappa_theta == 1.0
    assert th.contraction_rates(2.0, 3.0, 1.0).kappa_theta == 1.0
    assert th.contraction_rates(0.1, 3.0, 0.0).kappa_beta == 1.0
    # equal eigenvalue bounds: kappa_beta = 1/2, the smallest possible
    assert th.contraction_rates(0.0, 2.0, 2.0).kappa_beta == pytest.approx(0.5)


def test_kappa_theta_is_the_gradient_descent_contraction():
    # with eigenvalues of Z'Z/n at the ends (1 - d)^2, (1 + d)^2 and eta*, max |1 - eta * lambda| = kappa_theta
    d = 0.3
    eta = th.optimal_step_sizes(d, 1.0, 0.5).eta
    worst = max(abs(1 - eta * (1 - d) ** 2), abs(1 - eta * (1 + d) ** 2))
    assert th.contraction_rates(d, 1.0, 0.5).kappa_theta == pytest.approx(worst, rel=1e-12)


def test_step_sizes_hand_examples():
    # delta = 0: eta = 1 (paper rule) and eta* = 2 / (1 + 1) = 1
    assert th.paper_step_sizes(0.0, 3.0, 1.0) == pytest.approx((1.0, 2 / 7), rel=1e-12)
    assert th.optimal_step_sizes(0.0, 3.0, 1.0) == pytest.approx((1.0, 0.5), rel=1e-12)
    # delta = 1/2: eta = 1 / 2.25, eta* = 2 / (2.25 + 0.25) = 0.8; alpha = 2/(6 + 1), alpha* = 2/4
    assert th.paper_step_sizes(0.5, 3.0, 1.0) == pytest.approx((1 / 2.25, 2 / 7), rel=1e-12)
    assert th.optimal_step_sizes(0.5, 3.0, 1.0) == pytest.approx((0.8, 0.5), rel=1e-12)
    # both rules respect the Theorem's step-size condition eta < 2/(1+delta)^2, alpha < 4/(2 gb + gu)
    for d in (0.0, 0.2, 0.7, 1.5, 3.0):
        for rule in (th.paper_step_sizes, th.optimal_step_sizes):
            eta, alpha = rule(d, 3.0, 1.0)
            assert eta < 2 / (1 + d) ** 2 and alpha < 4 / 7


# ----------------------------------------------------------------------------------------
# 5. ErrorBound
# ----------------------------------------------------------------------------------------
def test_error_bound_object():
    eb = th.error_bound(1000, 5, 5, 20, 1.0, 1.0, kappa=0.5)
    opt, priv, stat = 1 / 1024, 0.4 * math.sqrt(5), 5 * (5 + 2 * LN5) / math.sqrt(1000)
    assert (eb.optimization, eb.privacy, eb.statistical) == pytest.approx((opt, priv, stat), rel=1e-12)
    assert eb.total == pytest.approx(opt + priv + stat, rel=1e-12)
    assert eb.dominant == "statistical"
    assert eb.regime == "statistical plateau"  # 0 < 20 <= 42.2 and 20 <= 25
    assert eb.t_condition.holds and not eb.n_condition.holds and not eb.valid
    assert (eb.kappa, eb.tau) == (0.5, 5.0)
    frame = eb.to_frame()
    assert list(frame.columns) == ["value", "note"]
    assert {"optimization", "privacy", "statistical", "total", "T condition", "n condition"} <= set(frame.index)
    assert frame.loc["total", "value"] == pytest.approx(eb.total)
    assert "violated by a factor 1.69" in frame.loc["n condition", "note"]
    rows = dict(eb.rows())
    assert all(isinstance(v, str) for v in rows.values())
    assert rows["Sum"] == "2.195"
    assert rows["Dominating term"] == "statistical"
    assert rows["Regime"] == "statistical plateau"
    assert rows["T condition (T ≲ ρ1 n²/(p(√q+√τ)⁶))"].startswith("holds")
    assert rows["n condition"].startswith("violated by a factor 1.69")
    assert rows["κ (contraction rate)"] == "0.5"
    assert "Optimization term κ^(T/2)" in rows and "Privacy term" in rows and "Statistical term" in rows
    # privacy dominates for a small budget; T beyond the limit is flagged
    eb = th.error_bound(1000, 5, 5, 20, 0.01, 0.01, kappa=0.5)
    assert eb.dominant == "privacy" and eb.regime == "beyond the T condition"


# ----------------------------------------------------------------------------------------
# 6. plan, recommended T, smallest n and rho
# ----------------------------------------------------------------------------------------
def test_plan_table_and_recommendation():
    pl = tp.plan(1000, 5, 5, 1.0, 1.0)
    # default T_max = max(100, 4 * recommended, 2 * T limit = 50) = 100
    assert pl.table.shape == (100, 4)
    assert list(pl.table.columns) == ["optimization", "privacy", "statistical", "total"]
    assert pl.table.index.name == "T" and pl.table.index[0] == 1 and pl.T_max == 100
    assert pl.recommended_T == int(pl.table["total"].idxmin()) == 6
    assert pl.t_condition_limit == pytest.approx(25.0)
    assert pl.regime_boundaries == th.regime_boundaries(1000, 5, 5, 1.0, 1.0)
    assert pl.bound.T == 6 and pl.bound.total == pytest.approx(pl.table["total"].min())
    text = repr(pl)
    assert "recommended T" in text and text == pl.summary()
    # default T_max = max(100, 4·recommended) = 100 at n = 10^4, recommended T = 14; the T condition
    # limit (2500) is more than 10 times farther, so the table does not stretch to 2·2500
    assert tp.plan(1e4, 5, 5, 1.0, 1.0).T_max == 100


@pytest.mark.parametrize(
    "n, p, q, rho1, rho2, kappa",
    [
        (1e3, 5, 5, 1.0, 1.0, 0.5),
        (1e3, 5, 5, 1.0, 1.0, 0.9),  # kappa > 1/e: total first increases, T = 1 wins here
        (1e5, 1, 5, INF, 100.0, 0.999),  # flat minimum near T = 14397
        (50.0, 2, 3, 0.05, 10.0, 0.3),
        (1e4, 3, 8, INF, INF, 0.5),  # no privacy noise: first T at which the total equals its limit
    ],
)
def test_recommended_T_matches_brute_force(n, p, q, rho1, rho2, kappa):
    pl = tp.plan(n, p, q, rho1, rho2, kappa=kappa, T_max=60000)
    brute = int(np.argmin(pl.table["total"].to_numpy())) + 1
    assert tp.recommended_T(n, p, q, rho1, rho2, kappa=kappa) == brute == pl.recommended_T


def test_plan_without_privacy_and_for_large_n():
    pl = tp.plan(1e4, 3, 8, INF, INF)
    assert pl.t_condition_limit == INF and np.all(pl.table["privacy"] == 0)
    assert pl.bound.total == pl.bound.statistical  # the optimization term has vanished in floating point
    big = tp.plan(1e8, 5, 5, 1.0, 1.0)
    assert big.T_max == 168 and big.recommended_T == 42  # 4·42: the T limit (2.5e11) is far away
    assert big.recommended_T == int(big.table["total"].idxmin())


def test_plan_with_small_T_max_keeps_global_recommendation():
    pl = tp.plan(1e6, 5, 5, 1.0, 1.0, T_max=10)
    assert pl.table.shape == (10, 4)
    assert pl.recommended_T == tp.recommended_T(1e6, 5, 5, 1.0, 1.0) > 10
    assert "beyond the table" in pl.summary()


def test_plan_plot_agg():
    import matplotlib.pyplot as plt

    ax = tp.plan(1000, 5, 5, 1.0, 1.0).plot()
    assert isinstance(ax, matplotlib.axes.Axes)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert len(ax.get_lines()) >= 5  # three terms, total, recommended-T marker
    fig, ax2 = plt.subplots()
    assert tp.plan(1e7, 5, 5, INF, INF).plot(ax=ax2) is ax2  # no privacy curve, long table subsampled
    plt.close("all")


def test_plot_without_matplotlib(monkeypatch):
    pl = tp.plan(1000, 5, 5, 1.0, 1.0)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r"pip install dpivreg\[plot\]"):
        pl.plot()


@pytest.mark.parametrize("T", [None, 20])
@pytest.mark.parametrize("target", [1.0, 0.05])
def test_smallest_n(target, T):
    n = tp.smallest_n(target, 5, 5, 1.0, 1.0, T=T)

    def bound(m):
        T_m = T if T is not None else tp.recommended_T(m, 5, 5, 1.0, 1.0)
        return th.error_bound(m, 5, 5, T_m, 1.0, 1.0, kappa=0.5).total

    assert bound(n) <= target < bound(n - 1)


@pytest.mark.parametrize("T", [None, 20])
@pytest.mark.parametrize("target, split", [(2.0, 0.5), (1.4, 0.5), (1.5, 0.9)])
def test_smallest_rho(target, split, T):
    rho = tp.smallest_rho(target, 1000, 5, 5, T=T, split=split)

    def bound(r):
        T_r = T if T is not None else tp.recommended_T(1000, 5, 5, split * r, (1 - split) * r)
        return th.error_bound(1000, 5, 5, T_r, split * r, (1 - split) * r, kappa=0.5).total

    assert bound(rho) <= target < bound(rho * (1 - 1e-9))


def test_smallest_n_and_rho_unreachable_targets():
    # at T = 10 the bound never falls below (1/2)^5 = 0.03125
    with pytest.raises(ValueError, match="optimization term"):
        tp.smallest_n(0.03, 5, 5, 1.0, 1.0, T=10)
    assert tp.smallest_n(0.032, 5, 5, 1.0, 1.0, T=10) > 1
    # n = 1000: the statistical term alone is 1.2995
    with pytest.raises(ValueError, match="even with rho = inf"):
        tp.smallest_rho(1.29, 1000, 5, 5)
    # at T = 20 the noiseless bound is 1/1024 + 1.2995
    with pytest.raises(ValueError, match="even with rho = inf"):
        tp.smallest_rho(1.3, 1000, 5, 5, T=20)


# ----------------------------------------------------------------------------------------
# 7. input validation
# ----------------------------------------------------------------------------------------
GOOD = dict(n=1000, p=5, q=5, T=20, rho1=1.0, rho2=1.0, tau=5.0, kappa=0.5)


@pytest.mark.parametrize(
    "name, value",
    [
        ("n", 0),
        ("n", 0.5),
        ("n", math.nan),
        ("p", 0),
        ("q", 4),
        ("T", 0),
        ("T", math.nan),
        ("rho1", 0.0),
        ("rho1", -1.0),
        ("rho2", math.nan),
        ("tau", 0.0),
        ("kappa", 0.0),
        ("kappa", 1.0),
    ],
)
def test_error_bound_rejects_bad_inputs(name, value):
    kwargs = dict(GOOD, **{name: value})
    with pytest.raises(ValueError, match=name):
        th.error_bound(kwargs["n"], kwargs["p"], kwargs["q"], kwargs["T"], kwargs["rho1"], kwargs["rho2"],
                       tau=kwargs["tau"], kappa=kwargs["kappa"])


def test_every_function_validates():
    with pytest.raises(ValueError, match="T"):
        th.optimization_term([1, 0.5], 0.5)
    with pytest.raises(ValueError, match="kappa"):
        th.optimization_term(3, 1.5)
    with pytest.raises(ValueError, match="n"):
        th.privacy_term(0, 5, 5, 1, 1.0, 1.0)
    with pytest.raises(ValueError, match="q"):
        th.statistical_term(100, 5, 2)
    with pytest.raises(ValueError, match="rho1"):
        th.t_condition_limit(100, 5, 5, 0.0)
    with pytest.raises(ValueError, match="rho2"):
        th.n_condition_minimum(5, 5, 1.0, -2.0)
    with pytest.raises(ValueError, match="tau"):
        th.regime_boundaries(100, 5, 5, 1.0, 1.0, tau=-1.0)
    with pytest.raises(ValueError, match="T"):
        th.regime(0, 100, 5, 5, 1.0, 1.0)
    with pytest.raises(ValueError, match="T_max"):
        tp.plan(100, 5, 5, 1.0, 1.0, T_max=0)
    with pytest.raises(ValueError, match="kappa"):
        tp.plan(100, 5, 5, 1.0, 1.0, kappa=1.0)
    with pytest.raises(ValueError, match="target"):
        tp.smallest_n(0.0, 5, 5, 1.0, 1.0)
    with pytest.raises(ValueError, match="target"):
        tp.smallest_rho(-1.0, 1000, 5, 5)
    with pytest.raises(ValueError, match="split"):
        tp.smallest_rho(2.0, 1000, 5, 5, split=1.0)
    with pytest.raises(ValueError, match="T"):
        tp.smallest_n(1.0, 5, 5, 1.0, 1.0, T=0)
    with pytest.raises(ValueError, match="delta"):
        th.contraction_rates(-0.1, 1.0, 0.5)
    with pytest.raises(ValueError, match="gamma_under"):
        th.paper_step_sizes(0.1, 1.0, 2.0)
    with pytest.raises(ValueError, match="gamma_bar"):
        th.optimal_step_sizes(0.1, 0.0, 0.0)
    with pytest.raises(ValueError, match="theta"):
        th.eigenvalue_bounds(np.ones((2, 3)), 0.1)
    with pytest.raises(ValueError, match="q"):
        th.delta_tau(100, 0)
    with pytest.raises(TypeError, match="n"):
        th.statistical_term("1000", 5, 5)


# ----------------------------------------------------------------------------------------
# 8. huge inputs: float arithmetic, never OverflowError
# ----------------------------------------------------------------------------------------
C6_Q2 = (math.sqrt(2) + math.sqrt(5)) ** 6  # (√q + √τ)⁶ at q = 2, τ = 5: 2366.07...


def test_t_condition_limit_for_huge_n_uses_float_arithmetic():
    # n = 1e155: n² = 1e310 overflows a float (and 1e155 ** 2 raised OverflowError), but
    # ρ1 n² / (p (√q+√τ)⁶) = 1e310 / 2366.07 = 4.2264e306 is finite
    expected = math.exp(2 * math.log(1e155) - math.log(C6_Q2))
    assert th.t_condition_limit(1e155, 1, 2, 1.0) == pytest.approx(expected, rel=1e-12)
    assert th.t_condition_limit(1e300, 1, 2, 1.0) == INF  # 1e600 / 2366: beyond the float range
    # the ordinary path is unchanged: 1e4² / 2366.07
    assert th.t_condition_limit(1e4, 1, 2, 1.0) == pytest.approx(1e8 / C6_Q2, rel=1e-15)


@pytest.mark.parametrize("n", [1e20, 1e155, 1e300, sys.float_info.max])
def test_plan_for_huge_n_is_finite(n):
    pl = tp.plan(n, 1, 2, 1.0, 1.0)
    # the statistical term √2 (5 + log 2) / √n dominates; the optimization term at the
    # recommended T is below it by ~1e-16 and the privacy term by ~1e-140 or less
    stat = math.sqrt(2) * (5 + math.log(2)) / math.sqrt(n)
    assert pl.bound.statistical == pytest.approx(stat, rel=1e-12)
    assert math.isfinite(pl.bound.total) and pl.bound.total == pytest.approx(stat, rel=1e-12)
    # T* ≈ (2 log n + log log n) / log 2 (module docstring), well below 4 log n / log 2
    assert 1 <= pl.recommended_T <= 4 * math.log(n) / math.log(2)
    assert pl.recommended_T == tp.recommended_T(n, 1, 2, 1.0, 1.0)
    assert pl.bound.t_condition.holds and pl.T_max <= tp.T_MAX_CAP


def test_recommended_T_keeps_growing_up_to_huge_n():
    Ts = [tp.recommended_T(n, 1, 2, 1.0, 1.0) for n in (1e10, 1e50, 1e100, 1e200, 1e300)]
    assert Ts == sorted(Ts) and len(set(Ts)) == len(Ts)


def test_plan_for_huge_q_reports_a_violated_t_condition_not_a_crash():
    # q = 1e200: (√q + √τ)⁶ = 1e600 overflows, so the T limit 1e6 / 1e600 is 0 in floats;
    # the condition is violated by an infinite factor (formerly OverflowError / ZeroDivisionError)
    pl = tp.plan(1000, 1, 1e200, 1.0, 1.0)
    assert pl.t_condition_limit == 0.0
    cond = pl.bound.t_condition
    assert not cond.holds and cond.factor == INF


@pytest.mark.parametrize("delta", [1e10, 1e200])
def test_contraction_rates_and_step_sizes_for_huge_delta(delta):
    # δ >= 1 leaves no guaranteed contraction (κ_Θ = 1); (1 + δ)² overflowed for δ = 1e200
    rates = th.contraction_rates(delta, 2.0, 1.0)
    assert rates.kappa_theta == 1.0 and rates.kappa_beta == pytest.approx(2 / 3)
    # η = 1/(1+δ)² and 2/((1+δ)² + (1−δ)²) ≈ 1/δ²: 1e-20 at δ = 1e10, 0 in floats at 1e200
    paper, optimal = th.paper_step_sizes(delta, 2.0, 1.0), th.optimal_step_sizes(delta, 2.0, 1.0)
    assert paper.eta == pytest.approx(1 / delta**2 if delta < 1e150 else 0.0, rel=1e-9, abs=0.0)
    assert optimal.eta == pytest.approx(1 / delta**2 if delta < 1e150 else 0.0, rel=1e-9, abs=0.0)
    assert paper.alpha == pytest.approx(2 / 5) and optimal.alpha == pytest.approx(2 / 3)


# ----------------------------------------------------------------------------------------
# 9. datasets.simulate_iv argument checks (the simulation feeds the planning examples; the
#    cases not already in test_bad_input.py)
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"p": 1.0}, TypeError, r"\bp\b must be a positive integer"),
        ({"q": "2"}, TypeError, r"\bq\b must be a positive integer"),
        ({"r": 2.0}, TypeError, r"\br\b must be a positive integer"),
        ({"n": True}, TypeError, r"\bn\b must be a positive integer"),
        ({"q": -3}, ValueError, r"\bq\b must be a positive integer"),
        ({"seed": None}, None, None),
        ({"n": np.int64(10), "seed": np.random.default_rng(1)}, None, None),
        ({"seed": np.random.SeedSequence(3)}, None, None),
    ],
)
def test_simulate_iv_argument_checks(kwargs, exc, match):
    from dpivreg.datasets import simulate_iv

    args = {"n": 10, "p": 1, "q": 2, "seed": 0, **kwargs}
    if exc is None:
        assert simulate_iv(**args).data.shape == (int(args["n"]), 1 + 1 + 2)
    else:
        with pytest.raises(exc, match=match):
            simulate_iv(**args)


def test_simulate_iv_int_seed_reproduces_numpy_default_rng():
    from dpivreg.datasets import simulate_iv

    a, b = simulate_iv(20, 2, 3, seed=11), simulate_iv(20, 2, 3, seed=np.random.default_rng(11))
    pd.testing.assert_frame_equal(a.data, b.data)


def test_plan_is_exported_at_the_top_level():
    import dpivreg

    assert dpivreg.plan is tp.plan and dpivreg.smallest_n is tp.smallest_n and dpivreg.smallest_rho is tp.smallest_rho
