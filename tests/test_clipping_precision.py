"""Clipping stays exact at the edges of float64: the sensitivity of every gradient release, one row at a time.

A row's clipped gradient must have norm at most γ in each group whatever its values. The fast kernels take a rank-one
gradient's norm as √(Σz²)·√(Σr²); three things can make that inexact, and each case below was a real escape before
the kernels flagged it (``counts[2]``) and the engine recomputed the iteration by the safe pass:

* instruments under 1e-154 square to 0, so a row whose residual is near 1e154 looked like norm 0 and was added
  unclipped (2.76 times γ here, in both stages);
* instruments near 1e-160 square to subnormals that keep a few bits, so the norm was off (1.00001 times γ here);
* a norm near 1e308 makes the factor γ/norm subnormal, rounded by up to 40% (1 + 2.6e-8 times γ here, γ = 1e-8);
* an overflowing uᵢ = zᵢᵀM has no direction: the row must add nothing (the unit pass added NaN).

Every path is checked the way the engine uses it: the fast pass, then the safe pass when the fast one flagged a row
(:func:`dpivreg.estimation.engine._clipped_gradients`, :meth:`dpivreg.compute.backends._MappedRows.safe_sums`).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpivreg import dp_2s_gd
from dpivreg.compute import kernels
from dpivreg.compute.kernels import numba_available
from dpivreg.estimation.engine import row_source
from dpivreg.inference.covariance import release_first_stage_meat, release_score_meat
from dpivreg.privacy import mechanisms

needs_numba = pytest.mark.skipif(not numba_available(), reason="numba not installed")

TINY = 1.5e-162  # squares to 0 (under half the smallest subnormal)
EDGE = 1.3e154  # squares to 1.69e308, just under the largest float

# name: (z, x, y, Θ scale, γ): Θ = (Θ scale) e₁ (q × 1), x̃ = z (the whitening is the identity), β = 0 so e = −y.
CASES = {
    "underflowing instruments": ([TINY, TINY], -EDGE, -EDGE, 0.0, 1e-8),
    "subnormal instruments": ([1e-160, 0.0], -1e154, -1e154, 0.0, 1e-8),
    "subnormal clip factor": ([EDGE / math.sqrt(2), EDGE / math.sqrt(2)], EDGE, -EDGE, 0.0, 1e-8),
    "overflowing map": ([1e200, 1e200], 0.0, 1.0, 1e200, 1.0),
    "ordinary row": ([0.3, -2.0], 1.5, 4.0, 0.7, 0.5),
}

PATHS = ["numpy", pytest.param("tiled", marks=needs_numba), pytest.param("generated columns", marks=needs_numba),
         pytest.param("generated rows", marks=needs_numba), "units numpy",
         pytest.param("units numba", marks=needs_numba)]


def _row(case: str, grouped: bool):
    """One row, the public state (Θ, x̃'s map, Θ̄β), the pass matrix and block_sums' clip arguments."""
    z, x, y, theta_scale, gamma = CASES[case]
    q = len(z)
    Z, X, Y = np.array([z]), np.array([[x]]), np.array([y])
    theta = np.zeros((q, 1))
    theta[0, 0] = theta_scale
    whitened, beta_full = np.eye(q), np.zeros(q)
    M = np.ascontiguousarray(np.concatenate([theta, whitened, beta_full[:, None]], axis=1))
    clips = ((gamma, gamma), (gamma, gamma), 1) if grouped else (gamma, gamma, None)
    return (Z, X, Y), (theta, whitened, beta_full), M, clips


def _engine_sums(path: str, data, state, M, clip1, clip2, split, monkeypatch):
    """The sums the engine releases for this one-row block by ``path``: the fast pass, or the safe pass when the fast
    one flagged the row; and whether it was flagged."""
    Z, X, Y = data
    if path.startswith("units"):
        starts = np.zeros(1, dtype=np.int64)
        S1, s2, counts = kernels.unit_block_sums(Z, X, Y, starts, M, clip1, clip2, split, path.split()[1])
        if counts[2]:
            S1, s2, _ = kernels.safe_unit_block_sums(Z, X, Y, starts, *state, clip1, clip2, split)
        return S1, s2, bool(counts[2])
    if path == "tiled":
        clips, k = kernels.group_clips(clip1, clip2, split)
        S1, s2, counts = np.zeros((Z.shape[1], 1)), np.zeros(M.shape[1] - 2), np.zeros(3, dtype=np.int64)
        kernels._numba_kernel()(Z, X, Y, M, clips, k, S1, s2, counts)
    else:
        if path.startswith("generated"):
            monkeypatch.setattr(kernels, "_UNROLLED_MIN_ROWS", 1)
            order = "F" if path.endswith("columns") else "C"
            Z, X = np.asarray(Z, order=order), np.asarray(X, order=order)
        S1, s2, counts = kernels.block_sums(Z, X, Y, M, clip1, clip2, "numpy" if path == "numpy" else "numba", split)
    if counts[2]:
        S1, s2, _ = kernels.safe_block_sums(Z, X, Y, *state, clip1, clip2, split)
    return S1, s2, bool(counts[2])


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("path", PATHS)
def test_one_row_adds_at_most_its_threshold_in_every_group(path, case, grouped, monkeypatch):
    data, state, M, (clip1, clip2, split) = _row(case, grouped)
    S1, s2, flagged = _engine_sums(path, data, state, M, clip1, clip2, split, monkeypatch)
    gamma = CASES[case][-1]
    lead = 1 if grouped else 0
    groups = [S1[:lead], S1[lead:], s2[:lead], s2[lead:]]
    assert all(np.all(np.isfinite(g)) for g in groups)
    norms = [float(np.linalg.norm(g)) for g in groups]
    assert max(norms) <= gamma * (1 + 1e-12), (norms, gamma, flagged)
    # Units form their gradient's entries zᵢrᵢᵀ before the norm: 1.5e-162 × 1.3e154 is an ordinary float, so tiny
    # instruments are no edge for them; every other edge case must reach the safe pass.
    units_exact = path.startswith("units") and case in ("underflowing instruments", "subnormal instruments")
    assert flagged == (case != "ordinary row" and not units_exact), (path, case)


@pytest.mark.parametrize("case", ["underflowing instruments", "subnormal clip factor"])
@pytest.mark.parametrize("path", ["numpy", pytest.param("tiled", marks=needs_numba),
                                  pytest.param("generated columns", marks=needs_numba)])
def test_without_the_flags_these_rows_escape(path, case, monkeypatch, lift_clip_limits):
    """The cases are not vacuous: with the limits of group_clips lifted (only non-finite norms flagged, as before),
    the same rows leave the fast pass with more than γ."""
    lift_clip_limits()
    data, state, M, (clip1, clip2, split) = _row(case, False)
    S1, s2, flagged = _engine_sums(path, data, state, M, clip1, clip2, split, monkeypatch)
    assert not flagged
    assert max(np.linalg.norm(S1), np.linalg.norm(s2)) > CASES[case][-1] * (1 + 1e-9)


def test_the_limits_follow_the_thresholds():
    """min(γ·2^480, 2^511) for the norms: γ·2^480 up to γ = 2^31, then 2^511."""
    clips, split = kernels.group_clips((1.0, 2.0 ** 50), (0.5, 2.0 ** 31), 2)
    assert split == 2
    np.testing.assert_array_equal(clips[:4], [1.0, 2.0 ** 50, 0.5, 2.0 ** 31])
    np.testing.assert_array_equal(clips[4:], [2.0 ** 480, 2.0 ** 511, 2.0 ** 479, 2.0 ** 511])


def test_the_safe_pass_clips_subnormal_rows_through_unit_vectors():
    """Rows of subnormal values: ‖a‖ itself is subnormal (few bits), so a/‖a‖ would not have norm 1; the safe pass
    forms the unit vector from the row scaled by its largest value."""
    A = np.array([[5e-324, 5e-324], [5e-324, 0.0]])
    B = np.array([[1e300], [1e300]])
    total, clipped = kernels._clipped_sum_outer(A, B, 1e-30)
    assert clipped.tolist() == [True, True]
    assert np.linalg.norm(total) <= 2e-30 * (1 + 1e-12)
    np.testing.assert_allclose(total[:, 0], [1e-30 * (1 + 1 / math.sqrt(2)), 1e-30 / math.sqrt(2)], rtol=1e-14)


def test_the_safe_unit_pass_measures_a_cancelled_sum_without_underflow():
    """A unit whose huge terms cancel: zᵢrᵢ = 1e130, 1e300 and −1e300 sum to 1e130, which the safe pass holds as the
    direction 1e-170 at the scale 1e300 (numpy's reduceat adds them in an order that keeps it). Its norm is taken from
    the direction scaled by its largest value: the square of 1e-170 is 0, and the unit was added unclipped (1e130 with
    γ = 1)."""
    Z = np.array([[1e-170], [1.0], [1.0]])
    X = np.array([[-1e300], [-1e300], [1e300]])
    theta, whitened, beta_full = np.zeros((1, 1)), np.eye(1), np.zeros(1)
    S1, s2, counts = kernels.safe_unit_block_sums(Z, X, np.zeros(3), np.zeros(1, dtype=np.int64), theta, whitened,
                                                  beta_full, 1.0, 1.0)
    assert S1[0, 0] == pytest.approx(1.0, rel=1e-12) and s2[0] == 0.0
    assert counts[0] == 1


# ---------------------------------------------------------------- the moment mechanisms
@pytest.mark.parametrize("row", [[np.inf, 1.0], [np.nan, 1.0], [1e200, 1e200], [1e-170, 0.0], [5e-324, 5e-324],
                                 [1.3e154, 0.0]])
def test_a_ball_clipped_row_adds_at_most_b_squared(row):
    """ball_moment_sum: a row of any values adds a term of norm ≤ B² (a non-finite row adds nothing; before, it added
    NaN), and a row longer than B adds exactly B²·uuᵀ."""
    B = 1e-8
    W = np.array([row])
    term = mechanisms.ball_moment_sum(W, B)
    assert np.all(np.isfinite(term))
    assert np.linalg.norm(term) <= B**2 * (1 + 1e-12)
    if np.all(np.isfinite(W)) and np.max(np.abs(W)) > B:
        unit = W[0] / (np.max(np.abs(W)) * np.linalg.norm(W[0] / np.max(np.abs(W))))
        np.testing.assert_allclose(term, B**2 * np.outer(unit, unit), rtol=1e-12, atol=1e-30 * B**2)


def test_a_ball_clipped_row_under_b_is_kept_exactly():
    W = np.array([[0.3, -0.4], [1e-170, 0.0]])
    np.testing.assert_array_equal(mechanisms.ball_moment_sum(W, 1.0), W.T @ W)


def test_the_box_clamp_is_total():
    """box_moment_sum: a NaN entry is clamped like any other (to −1), so one row moves the sum by at most D/n; before,
    the NaN reached the released matrix."""
    V = np.zeros((5, 2))
    V2 = V.copy()
    V2[0, 0] = np.nan
    change = mechanisms.box_moment_sum(V2, True) - mechanisms.box_moment_sum(V, True)
    assert np.all(np.isfinite(change))
    iu = np.triu_indices(3)
    assert np.linalg.norm(change[iu]) <= mechanisms.box_moment_sensitivity(3, 1) * (1 + 1e-12)


@pytest.mark.parametrize("call", [
    lambda: mechanisms.ball_second_moments(np.ones((4, 2)), rho=1.0, rng=np.random.default_rng(0), row_bound=1e-175),
    lambda: dp_2s_gd(np.ones((4, 1)), np.ones((4, 1)), np.ones(4), T=1, rho1=1.0, rho2=1.0, eta=0.1, alpha=0.1,
                     clip1=1e-300, clip2=1.0),
    lambda: dp_2s_gd(np.ones((4, 2)), np.ones((4, 2)), np.ones(4), T=1, rho1=1.0, rho2=1.0, eta=0.1, alpha=0.1,
                     clip1=(1.0, 1.0), clip2=(1.0, 1e-250), n_exog=1),
    lambda: release_score_meat(row_source(np.ones((4, 1)), np.ones((4, 1)), np.ones(4)), np.ones(1), 0,
                               bound=1e-160, rho=1.0, rng=np.random.default_rng(0)),
    lambda: release_first_stage_meat(row_source(np.ones((4, 1)), np.ones((4, 1)), np.ones(4)), np.ones((1, 1)),
                                     bound=1e-160, rho=1.0, rng=np.random.default_rng(0)),
], ids=["ball row_bound", "engine clip1", "engine clip2 group", "score meat", "first-stage meat"])
def test_thresholds_too_small_to_clip_exactly_are_refused(call):
    """Under 1e-100 a threshold's square over n can round to 0 (the ball release had sensitivity 0, no noise; found
    by review for the meats at 1e-160), and under 2^-900 the kernels' clipping is not exact (group_clips)."""
    with pytest.raises(ValueError, match="below 1e-100"):
        call()


def test_thresholds_whose_sums_could_overflow_are_refused():
    """Three rows of norm 7e307 under γ = 8e307 are not clipped and not flagged, yet sum to inf (found by review): the
    engine would fail on one neighbour and not the other."""
    with pytest.raises(ValueError, match="above 1e"):
        dp_2s_gd(np.ones((4, 1)), np.ones((4, 1)), np.ones(4), T=1, rho1=1.0, rho2=1.0, eta=0.1, alpha=0.1,
                 clip1=8e307, clip2=1.0)


def test_the_limits_of_large_thresholds_are_computed_without_a_warning():
    """γ·2^480 overflows for γ ≥ 2^544 (found by review for γ·2^1000, which a threshold of 1e8 overflowed): the limit
    is the smaller, finite 2^511, silently, in any thread."""
    with np.errstate(over="raise"):
        clips, _ = kernels.group_clips(1e8, 1e200, None)
    assert clips[4] == np.ldexp(1e8, 480) and clips[6] == 2.0 ** 511


@pytest.mark.parametrize("path", PATHS)
def test_a_row_whose_product_would_overflow_is_flagged(path, monkeypatch):
    """Internal callers may clip at 1e300: a row with ‖x̃‖ = 1e85 and e = 1e300 has norms adding up to under
    √(γ·2^1000) but a product of 1e385; the generated kernel multiplied x̃·e first (inf·0 = NaN, found by fuzzing).
    The cap 2^511 of the limit flags it."""
    Z, X, Y = np.array([[0.0, 1.0]]), np.zeros((1, 1)), np.array([-1e300])
    theta, whitened, beta_full = np.zeros((2, 1)), np.array([[0.0], [1e85]]), np.zeros(2)
    M = np.ascontiguousarray(np.concatenate([theta, whitened, beta_full[:, None]], axis=1))
    with np.errstate(over="ignore"):  # the safe pass's product of the norms overflows on purpose (then clipped)
        S1, s2, flagged = _engine_sums(path, (Z, X, Y), (theta, whitened, beta_full), M, 1.0, 1e300, None, monkeypatch)
    assert flagged
    assert np.all(np.isfinite(s2)) and abs(s2[0]) == pytest.approx(1e300, rel=1e-12)


def test_the_clipped_squared_residuals_are_total():
    """residual_variance_release's block function: a NaN residual adds C, like any residual beyond √C."""
    from dpivreg.inference.private import clipped_squared_residuals

    Z, X = np.ones((3, 1)), np.ones((3, 1))
    Y = np.array([np.nan, 1e200, 0.5])
    (total,) = clipped_squared_residuals(Z, X, Y, np.zeros(1), 0, 2.0)
    assert total[0] == pytest.approx(2.0 + 2.0 + 0.25)


@pytest.mark.parametrize("pair", [(0.0, 5e-324), (-2e-308, 2e-308)])
def test_bounds_whose_half_width_is_subnormal_are_refused(pair):
    """The map (v − mid)/half divides by the half-width: a subnormal one gave NaN and a LinAlgError from numpy."""
    from dpivreg.data.bounds import _pair

    with pytest.raises(ValueError, match="too close together"):
        _pair("w", pair)
