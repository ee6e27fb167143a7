"""The private adaptive clip (:func:`dpivreg.estimation.clipping.adaptive_clip`): exact values and an empirical audit.

The mechanism
-------------
At the public starting point (Θ⁽⁰⁾, β⁽⁰⁾, the preconditioner root W⁽⁰⁾) every row's gradient norm in each of G
clipping groups (here G = 4: stage 1's exogenous and instrument rows, stage 2's exogenous and endogenous
coordinates) is counted into a histogram over public bins; the G histograms are released with i.i.d.
N(0, σ²) noise on every count, σ = Δ/sqrt(2ρ), Δ = √(2G) (replacing one row moves one count in each
histogram). The thresholds are post-processing of the noisy counts. Claimed: ρ-zCDP (μ = sqrt(2ρ)).

The audit
---------
Neighbours share n − 1 rows; the canary row's norms fall in a low bin of every histogram in D and in a high
bin in D′, so the counts differ by ±1 in 2G places: ‖d‖ = √(2G) = Δ, the worst case. With its own norms and
histograms (no shared code), the auditor forms S = ⟨u − mid, d⟩/σ² from each released u (the exact LLR of
the claimed mechanism: N(±μ²/2, μ²)), and Clopper–Pearson bounds give μ_lb as in the DP-2S-GD audit.

A second distinguisher reads the released *thresholds* (which feed the iteration and are published): "D iff
the thresholds are those the exact rule gives on D". For the correct mechanism the thresholds are
post-processing of the noisy counts, so this cannot beat μ; a mechanism that computed them from the exact
counts (broken variant) is separated perfectly on neighbours where one row moves the exact threshold.

n = 50, ρ = 2.5 (μ = 2.236), 2,000 releases per dataset (about a second).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from unittest import mock

import numpy as np
import pandas as pd
import pytest
from test_privacy_audit import CONF, assert_llr_law, assert_tight, mu_lower_bound

import dpivreg.estimation.clipping as clipping
from dpivreg.estimation.clipping import target_clipped_rows
from dpivreg.estimation.engine import row_source
from dpivreg.privacy.mechanisms import (
    clip_from_histogram,
    isolated_bin_sigmas,
    log_grid,
    release_histogram_counts,
    seen_bins,
)

N_ROWS, Q, P, N_EXOG = 50, 3, 2, 1
G = 4
RHO = 2.5
RUNS = 2000
THETA0 = np.array([[0.1], [0.5], [-0.2]])  # public starting point (the warm start is a release: public)
BETA0 = np.array([0.2, 0.7])
RIDGE = 1e-4

assert CONF == 5e-4


def auditor_root() -> np.ndarray:
    """W = L⁻¹ for P = Θ̄ᵀΘ̄ + ridge·I (2×2, Cholesky in closed form; nothing shared with the engine)."""
    full = np.column_stack([np.eye(Q, N_EXOG), THETA0])
    Pm = full.T @ full + RIDGE * np.eye(P)
    a = math.sqrt(Pm[0, 0])
    b = Pm[1, 0] / a
    c = math.sqrt(Pm[1, 1] - b * b)
    return np.array([[1 / a, 0.0], [-b / (a * c), 1 / c]])


def auditor_norms(Z, X, Y) -> list[np.ndarray]:
    """Per-row group norms from the explicit per-sample gradients at the start."""
    W = auditor_root()
    rows = []
    for z, x, y in zip(Z, X, Y):
        r = z @ THETA0 - x[N_EXOG:]
        x_hat = np.concatenate([z[:N_EXOG], THETA0.T @ z])
        x_tilde = W @ x_hat
        e = x_hat @ BETA0 - y
        g1 = np.outer(z, r)  # stage 1 gradient (q × p_endog)
        g2 = x_tilde * e
        rows.append([np.linalg.norm(g1[:N_EXOG]), np.linalg.norm(g1[N_EXOG:]), np.linalg.norm(g2[:N_EXOG]),
                     np.linalg.norm(g2[N_EXOG:])])
    return [np.array(col) for col in zip(*rows)]


def auditor_edges() -> list[np.ndarray]:
    """Public bins: √2-wide, around √(dimension) of each group (exog rows 1·1, instrument rows 2·1, 1, 1)."""
    return [math.sqrt(d) * np.sqrt(2.0) ** np.arange(-16, 25) for d in (1, 2, 1, 1)]


def auditor_counts(data) -> np.ndarray:
    out = []
    for v, e in zip(auditor_norms(*data), auditor_edges()):
        index = np.clip(np.searchsorted(e, v, side="right") - 1, 0, len(e) - 2)
        out.append(np.bincount(index, minlength=len(e) - 1))
    return np.array(out, dtype=float)


def neighbours(sensitive: bool = False, seed: int = 11):
    """(Z, X, Y) of D and D′: shared rows near the start, the canary last (small norms in D, large in D′).

    ``sensitive=True``: three shared rows with large norms too, so that with K = ½√50 = 3.54 rows allowed above
    the threshold the canary moves the *exact* rule's thresholds (3 rows above in D, 4 in D′).
    """
    rng = np.random.default_rng(seed)
    m = N_ROWS - 1
    Z = np.column_stack([np.ones(m), rng.standard_normal((m, Q - 1))])
    X = np.column_stack([np.ones(m), Z @ THETA0 + 0.3 * rng.standard_normal((m, 1))])
    Y = X @ BETA0 + 0.3 * rng.standard_normal(m)
    if sensitive:
        Z[:3, 1], X[:3, 1], Y[:3] = 3.0, 40.0, 60.0
    small = (np.array([1.0, 0.1, 0.0]), np.array([1.0, 0.06]), 0.25)
    large = (np.array([1.0, 3.0, 0.0]), np.array([1.0, 40.0]), 60.0)
    return [(np.vstack([Z, z]), np.vstack([X, x]), np.append(Y, y)) for z, x, y in (small, large)]


def release(data, rng):
    rows, _, _ = row_source(*data, N_EXOG)
    try:
        W0 = auditor_root()  # the same public matrix the package computes (checked below)
        return clipping.adaptive_clip(rows, THETA0, BETA0, W0, N_EXOG, rho=RHO, stage_rho=(1.0, 1.0), rng=rng)
    finally:
        rows.close()


def claimed_sigma() -> float:
    return math.sqrt(2.0 * G) / math.sqrt(2.0 * RHO)


def run_audit(seed: int, *, sensitive: bool = False, patches: dict | None = None, runs: int = RUNS):
    worlds = neighbours(sensitive)
    counts = [auditor_counts(w) for w in worlds]
    d, mid = counts[0] - counts[1], (counts[0] + counts[1]) / 2.0
    exact_thresholds = tuple(_exact_rule(counts[0]))
    sigma = claimed_sigma()
    S = np.zeros((2, runs))
    same = np.zeros((2, runs), dtype=bool)
    records = set()
    with (mock.patch.multiple(clipping, **patches) if patches else contextlib.nullcontext()):
        for w, data in enumerate(worlds):
            rng = np.random.default_rng([seed, w])
            for r in range(runs):
                out = release(data, rng)
                S[w, r] = np.sum((out.noisy_counts - mid) * d) / sigma**2
                same[w, r] = _thresholds(out) == exact_thresholds
                records.add(out.release.rho)
    fp, fn = int(np.count_nonzero(S[1] > 0)), int(np.count_nonzero(S[0] <= 0))
    fp_t, fn_t = int(np.count_nonzero(same[1])), int(np.count_nonzero(~same[0]))
    return dict(S=S, mu_lb=mu_lower_bound(fp, fn, runs), mu_lb_thresholds=mu_lower_bound(fp_t, fn_t, runs),
                mu_canary=float(np.linalg.norm(d) / sigma), records=records, fp=fp, fn=fn)


def _thresholds(out) -> tuple:
    return (*out.clip1, *out.clip2)


def _exact_rule(counts: np.ndarray) -> list[float]:
    return [clip_from_histogram(c, e, target=target_clipped_rows(N_ROWS), sigma=0.0)
            for c, e in zip(counts, auditor_edges())]


# ----------------------------------------------------------------------------------------
# exact values
# ----------------------------------------------------------------------------------------
def test_histogram_release_record_is_exact():
    counts = np.arange(12.0).reshape(G, 3)
    noisy, record, sigma = release_histogram_counts(counts, rho=RHO, rng=np.random.default_rng(0), name="h",
                                                    stage="rho_clip")
    assert record.sensitivity == pytest.approx(math.sqrt(2 * G), rel=1e-15)
    assert sigma == pytest.approx(claimed_sigma(), rel=1e-15) and record.noise_std == sigma
    assert record.rho == pytest.approx(RHO, rel=1e-12) and record.stage == "rho_clip"
    exact, _, zero = release_histogram_counts(counts, rho=math.inf, rng=np.random.default_rng(0), name="h",
                                              stage="rho_clip")
    assert zero == 0.0 and np.array_equal(exact, counts)


def test_package_counts_equal_the_auditors_and_the_worst_case_is_attained():
    """The released histograms' exact part equals the auditor's (its own norms and bins), for any split of the
    rows into blocks; the canary changes 2G counts by one (‖d‖ = √(2G) = Δ, the claimed sensitivity)."""
    worlds = neighbours()
    for data in worlds:
        with mock.patch.object(clipping, "release_histogram_counts",
                               lambda counts, **kw: (counts, None, 0.0)):
            out = release(data, np.random.default_rng(0))
        np.testing.assert_array_equal(out.noisy_counts, auditor_counts(data))
        for e_pkg, e_aud in zip(out.edges, auditor_edges()):
            np.testing.assert_allclose(e_pkg, e_aud, rtol=1e-15)
        Z, X, Y = data
        whole = clipping.gradient_norm_counts(Z, X[:, N_EXOG:], Y, _M(), N_EXOG, True, out.edges)[0]
        halves = [clipping.gradient_norm_counts(Z[s], X[s, N_EXOG:], Y[s], _M(), N_EXOG, True, out.edges)[0]
                  for s in (slice(0, 17), slice(17, None))]
        np.testing.assert_array_equal(whole, halves[0] + halves[1])
    d = auditor_counts(worlds[0]) - auditor_counts(worlds[1])
    assert np.count_nonzero(d) == 2 * G and np.all(np.abs(d[d != 0]) == 1)
    assert np.linalg.norm(d) == pytest.approx(math.sqrt(2 * G))
    assert release(worlds[0], np.random.default_rng(0)).noisy_counts.shape == d.shape


def _M():
    from dpivreg.compute.kernels import pass_matrix

    return pass_matrix(THETA0, BETA0, auditor_root().T, N_EXOG)[0]


def test_threshold_rule_exact_values():
    """The smallest edge with at most K rows above it, bins at or below 3σ treated as empty (every bin above 3σ
    here is in the largest count's run, so both readings of the bins agree)."""
    edges = log_grid(1.0, below=1, above=2)  # 2^-0.5 … 2^2: 6 bins
    counts = np.array([10.0, 20.0, 5.0, 2.0, 1.0, 0.0])
    assert clip_from_histogram(counts, edges, target=3.0, sigma=0.0) == edges[3]  # 2 + 1 rows above edge 3
    assert clip_from_histogram(counts, edges, target=0.5, sigma=0.0) == edges[5]
    assert clip_from_histogram(counts, edges, target=3.0, sigma=1.0) == edges[3]  # 2 and 1 are ≤ 3σ: empty
    assert clip_from_histogram(counts, edges, target=1.0, sigma=2.0) == edges[2]  # only bins > 6 count
    assert clip_from_histogram(counts + 100.0, edges, target=1.0, sigma=0.0) == edges[-1]
    # K = ½√n up to n = 10,000, then 50 rows, for stage budgets up to 1
    assert target_clipped_rows(400) == 10.0 and target_clipped_rows(10_000) == 50.0
    assert target_clipped_rows(31_857) == 50.0 and target_clipped_rows(10**7) == 50.0
    assert target_clipped_rows(400, 0.1) == 10.0 and target_clipped_rows(10_000, 1.0) == 50.0
    # above 1, K shrinks as 1/√ρ: half at ρ = 4, none left for a noise-free stage
    assert target_clipped_rows(400, 4.0) == 5.0 and target_clipped_rows(10**6, 4.0) == 25.0
    assert target_clipped_rows(3_000, 2.0) == pytest.approx(0.5 * math.sqrt(3_000) / math.sqrt(2.0), rel=1e-15)
    assert target_clipped_rows(10_000, math.inf) == 0.0
    # a group of d coordinates keeps K up to ρ = d, then K·√(d/ρ)
    assert target_clipped_rows(10_000, 4.0, 4) == 50.0 and target_clipped_rows(10_000, 16.0, 4) == 25.0
    assert target_clipped_rows(10_000, 3.85, 25) == 50.0


def test_isolated_bin_level_exact_values():
    """z with P(N(0,1) > z) = P(N(0,1) > 3)/bins. Reference values: scipy.stats.norm.isf(norm.sf(3) / bins)."""
    assert isolated_bin_sigmas(3.0, 1) == 3.0
    assert isolated_bin_sigmas(3.0, 40) == pytest.approx(3.984948010, rel=1e-8)
    assert isolated_bin_sigmas(3.0, 48) == pytest.approx(4.028031742, rel=1e-8)
    assert isolated_bin_sigmas(2.0, 10) == pytest.approx(2.837275980, rel=1e-8)


def test_seen_bins_exact_values():
    """Resolved data (largest count above 6σ): runs above 3σ are seen when they hold the largest count, are two
    bins long or hold a bin above the isolated level (3.64σ for 10 bins, 3.55σ for 7); a lone bin between the
    levels away from the largest count is noise. Unresolved (largest count within 6σ): every bin above 3σ.
    σ = 0: every non-empty bin."""
    counts = np.array([100.0, 50.0, 3.5, 0.0, 3.5, 0.0, 3.5, 3.5, 0.0, 5.0])
    assert seen_bins(counts, 1.0).tolist() == [True, True, True, False, False, False, True, True, False, True]
    assert seen_bins(counts, 0.0).tolist() == (counts > 0).tolist()
    lone = np.array([0.0, 1.0, 60.0, 0.0, 0.0, 50.0, 0.0])  # σ = 15: 3σ = 45, 3.55σ = 53.3, 6σ = 90
    assert seen_bins(lone, 15.0).tolist() == [False, False, True, False, False, True, False]  # unresolved: both
    lone[2] = 200.0
    assert seen_bins(lone, 15.0).tolist() == [False, False, True, False, False, False, False]  # 50 is noise now
    lone[5] = 54.0
    assert seen_bins(lone, 15.0).tolist() == [False, False, True, False, False, True, False]  # above 3.55σ
    lone[5], lone[6] = 50.0, 46.0
    assert seen_bins(lone, 15.0).tolist() == [False, False, True, False, False, True, True]  # a run of two
    assert not seen_bins(np.array([0.0, 2.9, 1.0]), 1.0).any()
    # the switch is at 6σ: a largest count of exactly 6σ is unresolved (one level), just above it resolved
    peak = np.array([6.0, 0.0, 0.0, 3.2, 0.0])  # the isolated level for 5 bins is 3.46σ
    assert seen_bins(peak, 1.0).tolist() == [True, False, False, True, False]
    peak[0] = 6.01
    assert seen_bins(peak, 1.0).tolist() == [True, False, False, False, False]
    # the level follows the histogram's length: 4.0σ passes for 40 bins (3.98σ), not for 48 (4.03σ)
    grid = np.zeros(48)
    grid[5], grid[30] = 100.0, 4.0
    assert seen_bins(grid[:40], 1.0)[30] and not seen_bins(grid, 1.0)[30]


def test_a_lone_noise_bin_far_above_the_data_does_not_move_the_threshold():
    """Noise alone passes 3σ in 0.13% of bins: a lone 3.5σ count far above the data used to set the threshold
    there (the rule with one level, written out here, does); now it is ignored, and a count beyond the
    isolated level is still followed. No bin seen: the grid's top edge."""
    edges = log_grid(1.0, below=2, above=8)  # 20 bins
    counts = np.zeros(20)
    counts[3:7] = [400.0, 900.0, 300.0, 20.0]
    lone = counts.copy()
    lone[15] = 3.5
    kept = np.where(lone > 3.0, lone, 0.0)
    one_level = edges[np.nonzero(np.cumsum(kept[::-1])[::-1] <= 2.0)[0][0]]
    assert one_level == edges[16]
    assert clip_from_histogram(lone, edges, target=2.0, sigma=1.0) == clip_from_histogram(
        counts, edges, target=2.0, sigma=1.0) == edges[7]
    lone[15] = 5.0  # beyond 3.82σ (20 bins): rows seen there
    assert clip_from_histogram(lone, edges, target=2.0, sigma=1.0) == edges[16]
    # nothing seen: the top edge (clips nothing), not the bottom one (clips every row to almost nothing)
    assert clip_from_histogram(np.full(20, 2.0), edges, target=2.0, sigma=1.0) == edges[-1]
    assert clip_from_histogram(np.zeros(20), edges, target=2.0, sigma=0.0) == edges[-1]


def test_thresholds_are_the_grids_top_when_no_bin_is_seen():
    """A budget too small to see any bin (σ ≈ 2·10⁴): every group's threshold is its grid's top edge, not the bottom
    one (dpivreg 0.1's, which clipped every gradient to almost nothing), and the groups are named for the caution."""
    data = neighbours()[0]
    rows, _, _ = row_source(*data, N_EXOG)
    try:
        out = clipping.adaptive_clip(rows, THETA0, BETA0, auditor_root(), N_EXOG, rho=1e-8, stage_rho=(1.0, 1.0),
                                     rng=np.random.default_rng(1))  # (seed 3 draws a 3.3σ noise bin: 5% do)
    finally:
        rows.close()
    assert _thresholds(out) == tuple(float(e[-1]) for e in auditor_edges())
    assert out.unseen_groups == clipping.GROUP_NAMES
    assert "no bin above their noise for stage 1's exogenous rows, stage 1's instrument rows" in out.unseen_note()


def test_a_fit_whose_gradient_histograms_show_nothing_says_so():
    """n = 100 at ρ = 0.5: two groups' histograms show no bin, so DP-2S-GD runs with their thresholds at the top
    edge: a UserWarning at the fit and a CAUTION in ``res.cautions`` (every export carries them); a fit of 5,000 rows
    has neither."""
    from dpivreg import DPIV2SLS

    def fit(n):
        rng = np.random.default_rng(0)
        z, v, e = rng.standard_normal((3, n))
        frame = pd.DataFrame({"y": z + 1.5 * v + e, "x": z + v, "z": z})
        return DPIV2SLS.from_formula("y ~ 1 + [x ~ z]", frame).fit(
            rho=0.5, bounds={"y": (-8, 8), "x": (-6, 6), "z": (-4, 4)}, seed=1)

    with pytest.warns(UserWarning, match="gradient-norm histograms showed no bin above their noise for stage 1's ex"):
        small = fit(100)
    assert small.settings.adaptive_clip.unseen_groups == ("stage 1's exogenous rows", "stage 2's exogenous coordinates")
    assert small.settings.clip1[0] == small.settings.adaptive_clip.edges[0][-1]
    assert any(c.startswith("CAUTION: The gradient-norm histograms showed no bin") for c in small.cautions)
    text = " ".join(small.summary().as_text().split())
    assert "CAUTION: The gradient-norm histograms showed no bin above their noise for stage 1's exogenous" in text
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        large = fit(5_000)
    assert not any("gradient-norm histograms" in str(w.message) for w in caught)
    assert not any("gradient-norm histograms" in c for c in large.cautions)
    assert "gradient-norm histograms" not in large.summary().as_text()


def test_noise_beside_resolved_data_rarely_shows_a_bin():
    """100,000 released histograms of 40 bins (σ = 1), data in bins 5–8 (50–400σ), noise elsewhere: a bin away
    from the data (bins 0–3 and 10–39; bins 4 and 9 may join the data's run) is seen in about 34·P(N > 3.98) plus
    the adjacent pairs above 3σ ≈ 0.12% of them; the bounds are that rate ± 5 binomial standard errors (0.07–0.17%).
    One level: about 4.5%."""
    noise = np.random.default_rng(7).standard_normal((100_000, 40))
    noise[:, 5:9] += [50.0, 400.0, 300.0, 60.0]
    away = np.r_[0:4, 10:40]
    rate = np.mean([seen_bins(row, 1.0)[away].any() for row in noise])
    p_lone = 0.5 * math.erfc(isolated_bin_sigmas(3.0, 40) / math.sqrt(2.0))
    p_3 = 0.5 * math.erfc(3.0 / math.sqrt(2.0))
    expected = len(away) * p_lone + 32 * p_3**2  # lone bins above 3.98σ; adjacent pairs in bins 0–3 and 10–39
    se = math.sqrt(expected / 100_000)
    assert expected == pytest.approx(0.0012, abs=1e-4)
    assert expected - 5 * se < rate < expected + 5 * se
    assert np.mean((noise[:, away] > 3.0).any(axis=1)) > 0.04  # what one level let through


def test_each_stage_thresholds_use_that_stages_K():
    """Stage budgets above 1 shrink that stage's K only: with ρ1 = 1, ρ2 = 16 (noise-free histograms) the first
    stage's thresholds are the exact rule with K = ½√50, the second stage's with K/4."""
    data = neighbours(sensitive=True)[0]  # three shared rows far out: K = 3.54 clips them, K/4 does not
    rows, _, _ = row_source(*data, N_EXOG)
    try:
        out = clipping.adaptive_clip(rows, THETA0, BETA0, auditor_root(), N_EXOG, rho=math.inf, stage_rho=(1.0, 16.0),
                                     rng=np.random.default_rng(0))
    finally:
        rows.close()
    K = 0.5 * math.sqrt(N_ROWS)
    assert out.targets == (pytest.approx(K, rel=1e-15),) * 2 + (pytest.approx(K / 4, rel=1e-15),) * 2
    counts, edges = auditor_counts(data), auditor_edges()
    expected = [clip_from_histogram(c, e, target=k, sigma=0.0) for c, e, k in zip(counts, edges, (K, K, K / 4, K / 4))]
    assert _thresholds(out) == tuple(expected)
    # K matters here: a common K would give other second-stage thresholds
    assert expected[2:] != [clip_from_histogram(c, e, target=K, sigma=0.0) for c, e in zip(counts[2:], edges[2:])]


# ----------------------------------------------------------------------------------------
# the audit
# ----------------------------------------------------------------------------------------
def test_clipping_audit_is_sound_and_tight():
    """Soundness μ_lb ≤ 2.236; tightness μ_lb ≥ 0.8·2.236 (expected ≈ 2.0 for an exact mechanism with 2,000
    runs, delta-method sd 0.044: the floor is > 3.5 sd below). S is N(±μ²/2, μ²) (KS p > 1e-6, mean and sd
    within 5 standard errors). The threshold distinguisher stays below the claim as well."""
    a = run_audit(seed=21)
    mu = math.sqrt(2 * RHO)
    assert len(a["records"]) == 1 and a["records"].pop() == pytest.approx(RHO, rel=1e-12)
    assert a["mu_canary"] == pytest.approx(mu, rel=1e-12)
    assert_llr_law(a["S"], mu)
    assert a["mu_lb"] <= mu
    assert_tight(a["mu_lb"], mu, RUNS)
    assert a["mu_lb_thresholds"] <= mu
    sensitive = run_audit(seed=22, sensitive=True)
    assert sensitive["mu_lb"] <= mu and sensitive["mu_lb_thresholds"] <= mu


class _UnnoisedQuantile:
    """Bug: the histograms are released with noise, but the thresholds are computed from the exact counts."""

    def __init__(self) -> None:
        self.exact = None
        self.calls = 0

    def release(self, counts, **kwargs):
        self.exact, self.calls = counts.copy(), 0
        return release_histogram_counts(counts, **kwargs)

    def clip(self, noisy, edges, *, target, sigma, threshold=3.0):
        exact = self.exact[self.calls]
        self.calls += 1
        return clip_from_histogram(exact, edges, target=target, sigma=0.0, threshold=threshold)


def _one_histogram_sensitivity(counts, *, rho, rng, name, stage):
    """Bug: Δ = √2, the sensitivity of ONE histogram, for G of them (σ is √G = 2 times too small)."""
    sigma = math.sqrt(2.0) / math.sqrt(2.0 * rho)
    noisy, record, _ = release_histogram_counts(counts, rho=rho, rng=rng, name=name, stage=stage)
    return counts + (noisy - counts) * (sigma / record.noise_std), record, sigma


def broken_audit(bug: str, seed: int = 303, runs: int = RUNS) -> dict:
    """The audit of a deliberately broken release: ``"one_histogram_sensitivity"`` or ``"unnoised_quantile"``
    (on the neighbours whose replaced row moves the exact rule's thresholds)."""
    if bug == "one_histogram_sensitivity":
        return run_audit(seed=seed, runs=runs, patches={"release_histogram_counts": _one_histogram_sensitivity})
    broken = _UnnoisedQuantile()
    return run_audit(seed=seed, runs=runs, sensitive=True,
                     patches={"release_histogram_counts": broken.release, "clip_from_histogram": broken.clip})


@pytest.mark.parametrize("bug", ["one_histogram_sensitivity", "unnoised_quantile"])
def test_clipping_audit_catches_broken_releases(bug):
    """one_histogram_sensitivity: true μ = 2·2.236, the counts LLR separates the worlds (μ_lb > 2.236).
    unnoised_quantile: on neighbours where one row moves the exact rule's thresholds, the released thresholds
    identify the world every time (μ_lb = 5.34, the largest 2,000 runs can certify) although the counts are
    correctly noised (their audit stays sound)."""
    mu = math.sqrt(2 * RHO)
    a = broken_audit(bug)
    if bug == "one_histogram_sensitivity":
        assert a["mu_lb"] > mu, f"not caught: {a['mu_lb']:.3f}"
    else:
        assert a["mu_lb"] <= mu
        assert a["mu_lb_thresholds"] > mu, f"not caught: {a['mu_lb_thresholds']:.3f}"


def test_package_root_at_the_start_equals_the_auditors():
    from dpivreg.estimation.engine import preconditioner_root

    np.testing.assert_allclose(preconditioner_root(THETA0, np.eye(Q), N_EXOG, RIDGE, "cholesky"), auditor_root(),
                               rtol=1e-12)
