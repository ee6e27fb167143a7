"""Exact-value tests of the calibration, the budget object and the (ε, δ) conversions.

Reference values
----------------
* Bun–Steinke column: the paper's footnote (ρ = 0.1, 1, 10 at δ = 1e-5 give 2.25, 7.79, 31.47 rounded;
  the notes in shared/notes/privacy-facts.md give 2.2460, 7.7861, 31.4597 unrounded).
* CKS20 and exact Gaussian columns: shared/notes/privacy-facts.md, themselves checked against dp-accounting
  0.6 (RDP and PLD accountants) and OpenDP 0.16; the cross-checks below redo that against the installed
  packages, independently of the hard-coded numbers.
"""

import math

import numpy as np
import pytest

from dpivreg import PrivacyBudget, Release, delta_from_rho, epsilon_from_rho
from dpivreg.privacy import clipped_mean_sensitivity, gaussian_zcdp, noise_std

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
    assert delta_from_rho(rho, eps, method) == pytest.approx(delta, rel=1e-6)


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
    assert budget.delta(budget.epsilon(1e-7, "cks"), "cks") == pytest.approx(1e-7, rel=1e-6)
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


def test_opendp_reference_from_notes():
    # shared/notes/privacy-facts.md: OpenDP 0.16 gives eps = 5.22153 at rho = 0.5, delta = 1e-6
    assert epsilon_from_rho(0.5, 1e-6, "cks") == pytest.approx(5.22153, abs=5e-5)
