"""Empirical privacy audit of the second-moment release ``dpivreg.preprocess.analyze_gauss``.

The mechanism
-------------
``analyze_gauss(W, rho=ρ, rng=…, row_bound=B)`` clips every row of W to L2 norm B, forms
G = WᵀW/n and releases M = G + E with E symmetric: the upper triangle (diagonal included) is
i.i.d. N(0, σ²) and mirrored, σ = Δ/sqrt(2ρ), Δ = √2·B²/n. It claims ρ-zCDP, i.e. μ-GDP with
μ = sqrt(2ρ), for neighbours that differ by *replacing* one row (the package's privacy model).

The audit
---------
M is determined by its upper triangle u = triu(M) (d(d+1)/2 numbers), which is G's upper
triangle plus i.i.d. N(0, σ²) noise. Two neighbouring datasets share n − 1 rows within the bound
and differ in the canary row: w = B·e₁ (D) vs w′ = B·e₂ (D′). Then
G_D − G_D′ = (B²/n)(e₁e₁ᵀ − e₂e₂ᵀ), whose upper triangle has L2 norm exactly √2·B²/n: the
claimed sensitivity is attained, and the canary's μ = ‖triu(G_D − G_D′)‖/σ equals sqrt(2ρ).
(Diagonal differences are the worst case for the *upper triangle*: for A = wwᵀ − w′w′ᵀ,
‖triu A‖² = (‖A‖²_F + Σⱼ A²ⱼⱼ)/2 ≤ ‖A‖²_F ≤ 2B⁴, with equality iff A is diagonal.)

With its own clipping and Gram matrix (no shared code), the auditor computes triu(G_D),
triu(G_D′), d = their difference and mid = their midpoint, and forms from each release

    S = ⟨u − mid, d⟩ / σ²,

the exact log-likelihood ratio of the claimed mechanism: N(+μ²/2, μ²) under D and N(−μ²/2, μ²)
under D′ (checked: KS, mean, sd). Guess "D" iff S > 0; one-sided Clopper–Pearson upper bounds on
the false positive / negative rates at 1 − 5e-4 each give, w.p. ≥ 1 − 1e-3,
μ_lb = Φ⁻¹(1 − FPR_ub) − Φ⁻¹(FNR_ub) ≤ true μ. The audit fails when μ_lb > sqrt(2ρ).

Design: d = 4, n = 50, B = 2 (not 1, so that a B-vs-B² mix-up changes σ), ρ = 2.5
(μ = sqrt(5) = 2.236, as in the DP-2S-GD audit, so the tightness argument is the same),
2,000 releases per dataset (a release costs ~10 µs: the whole file runs in well under a second).
``python benchmarks/privacy_audit.py`` prints the table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from unittest import mock

import numpy as np
import pytest
from scipy import stats

import dpivreg.preprocess as preprocess
from test_privacy_audit import CONF, TIGHT, expected_mu_lb, mu_lower_bound

D = 4  # columns of W
N_ROWS = 50  # n, including the canary
B = 2.0  # row bound
RHO = 2.5  # zCDP budget of the release: μ = sqrt(5) = 2.236
RUNS = 2000  # releases per dataset
FAR = 10.0  # "far" canaries: rows of norm FAR·B, which the function must clip to B

assert CONF == 5e-4  # the docstrings' numbers assume the DP-2S-GD audit's confidence level


def neighbours(far: bool = False, seed: int = 20260402):
    """W for D and D′: n − 1 shared rows of norm ≤ B, and the canary B·e₁ (D) / B·e₂ (D′) last.

    ``far=True``: the canaries are FAR·B·e₁ / FAR·B·e₂ (beyond the bound; clipped they are the above).
    """
    rng = np.random.default_rng(seed)
    shared = rng.uniform(-1.0, 1.0, (N_ROWS - 1, D)) * B / math.sqrt(D)  # ‖row‖ ≤ B
    scale = FAR * B if far else B
    return [np.vstack([shared, scale * np.eye(D)[k]]) for k in (0, 1)]


def claimed_sigma(rho: float = RHO) -> float:
    """σ = Δ/sqrt(2ρ) with Δ = √2·B²/n (re-derived here, not read from the package)."""
    return math.sqrt(2.0) * B**2 / N_ROWS / math.sqrt(2.0 * rho)


# ----------------------------------------------------------------------------------------
# the auditor's own clipped Gram matrix (independent of dpivreg.preprocess)
# ----------------------------------------------------------------------------------------
def clipped_gram(W: np.ndarray) -> np.ndarray:
    """(1/n) Σᵢ CLIP_B(wᵢ) CLIP_B(wᵢ)ᵀ, row by row."""
    G = np.zeros((W.shape[1], W.shape[1]))
    for w in W:
        norm = float(np.linalg.norm(w))
        c = w * (B / norm) if norm > B else w
        G += np.outer(c, c)
    return G / W.shape[0]


IU = np.triu_indices(D)  # the released statistic: the upper triangle, diagonal included


# ----------------------------------------------------------------------------------------
# deliberately broken releases, injected into dpivreg.preprocess at call time
# ----------------------------------------------------------------------------------------
_REAL_ANALYZE_GAUSS = preprocess.analyze_gauss


class _NumpyWith:
    """``numpy`` except for the given attributes: replaces ``dpivreg.preprocess.np`` to inject a bug
    into analyze_gauss's own code (every other numpy call passes through)."""

    def __init__(self, **overrides) -> None:
        self._overrides = overrides

    def __getattr__(self, name):
        return self._overrides[name] if name in self._overrides else getattr(np, name)


def add_remove_sensitivity(W, *, rho, rng, row_bound, **kwargs):
    """Bug: Δ = B²/n, the sensitivity of WᵀW/n when a row is *added or removed*, used in the package's
    *replace-one* model (where it is √2·B²/n): σ is √2 too small and the record still says ρ.

    Exactly the buggy output: the real function at 2ρ has σ = √2B²/n/sqrt(4ρ) = (B²/n)/sqrt(2ρ); the
    record is relabelled as the buggy code would write it (Δ = B²/n, ρ = Δ²/(2σ²) = the requested ρ).
    """
    M, release, sigma = _REAL_ANALYZE_GAUSS(W, rho=2.0 * rho, rng=rng, row_bound=row_bound, **kwargs)
    sensitivity = row_bound**2 / W.shape[0]
    return M, dataclasses.replace(release, sensitivity=sensitivity, rho=sensitivity**2 / (2.0 * sigma**2)), sigma


VARIANTS = {
    "correct": {},
    # np.triu(noise, 1): the diagonal (where the attaining canary differs) is released without noise
    "diagonal_not_noised": {"np": _NumpyWith(triu=lambda m, k=0: np.triu(m, max(k, 1)))},
    # the row clipping is lost: np.minimum(1, B/‖w‖) → 1
    "no_row_clipping": {"np": _NumpyWith(minimum=lambda a, b: np.ones_like(np.asarray(b, dtype=float)))},
    "add_remove_sensitivity": {"analyze_gauss": add_remove_sensitivity},
    # i.i.d. noise on the full matrix, not mirrored: NOT a privacy bug (see its test), only asymmetric
    "independent_triangles": {"np": _NumpyWith(triu=lambda m, k=0: m if k == 0 else np.zeros_like(m))},
}


@dataclass
class Audit:
    variant: str
    far: bool
    runs: int
    fp: int  # releases on D′ with S > 0
    fn: int  # releases on D with S <= 0
    mu_lb: float
    rho_requested: float
    rho_release: float  # Release.rho, what the record says was spent
    sigma_released: float
    mu_canary: float  # ‖d‖/σ of the claimed mechanism on these neighbours
    S: np.ndarray  # (2, runs): the statistic, row 0 on D, row 1 on D′
    noise: np.ndarray  # (2, runs, d(d+1)/2): (u − triu(G_world))/σ
    symmetric: bool  # every released M equalled its transpose exactly

    @property
    def mu_requested(self) -> float:
        return math.sqrt(2.0 * self.rho_requested)

    @property
    def mu_accountant(self) -> float:
        return math.sqrt(2.0 * self.rho_release)


def run_audit(variant: str = "correct", *, seed: int, runs: int = RUNS, far: bool = False, rho: float = RHO) -> Audit:
    """``runs`` releases of ``dpivreg.preprocess.analyze_gauss`` (looked up at call time, with the
    variant's patches installed) on each neighbour, audited with the claimed mechanism's LLR."""
    worlds = neighbours(far)
    sigma = claimed_sigma(rho)
    means = [clipped_gram(W)[IU] for W in worlds]
    d, mid = means[0] - means[1], (means[0] + means[1]) / 2.0
    S = np.zeros((2, runs))
    noise = np.zeros((2, runs, len(IU[0])))
    records, sigmas, symmetric = set(), set(), True
    with contextlib.ExitStack() as stack:
        for name, value in VARIANTS[variant].items():
            stack.enter_context(mock.patch(f"dpivreg.preprocess.{name}", value))
        for w, W in enumerate(worlds):
            rng = np.random.default_rng([seed, w])
            for r in range(runs):
                M, release, sig = preprocess.analyze_gauss(W, rho=rho, rng=rng, row_bound=B)
                symmetric &= bool(np.array_equal(M, M.T))
                u = M[IU]
                S[w, r] = np.dot(u - mid, d) / sigma**2
                noise[w, r] = (u - means[w]) / sigma
            records.add(release.rho)
            sigmas.add(sig)
    assert len(records) == 1 and len(sigmas) == 1
    fp = int(np.count_nonzero(S[1] > 0))
    fn = int(np.count_nonzero(S[0] <= 0))
    return Audit(variant, far, runs, fp, fn, mu_lower_bound(fp, fn, runs), rho, records.pop(), sigmas.pop(),
                 float(np.linalg.norm(d) / sigma), S, noise, symmetric)


# for benchmarks/privacy_audit.py: table name → (variant, far); seeds as in the tests (default 303)
TABLE_CASES = {
    "correct": ("correct", False),
    "correct, rows of norm 10B": ("correct", True),
    "add/remove sensitivity": ("add_remove_sensitivity", False),
    "diagonal not noised": ("diagonal_not_noised", False),
    "no row clipping, 10B": ("no_row_clipping", True),
    "independent triangles": ("independent_triangles", False),
}
SEEDS = {"correct": 11, "correct, rows of norm 10B": 12}


# ----------------------------------------------------------------------------------------
# exact checks
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("rho", [0.05, 1.0, RHO, 40.0])
def test_release_is_symmetric_and_record_is_exact(rho):
    """The released M is exactly symmetric; the record's ρ = Δ²/(2σ²) is the requested ρ.

    Δ = √2·B²/n and σ = Δ/sqrt(2ρ) are re-derived here; the noise M − G (G the auditor's clipped
    Gram matrix) is the same for both neighbours given the same generator state (data-independent).
    """
    W, W2 = neighbours()
    M, release, sigma = preprocess.analyze_gauss(W, rho=rho, rng=np.random.default_rng(5), row_bound=B)
    M2, _, _ = preprocess.analyze_gauss(W2, rho=rho, rng=np.random.default_rng(5), row_bound=B)
    assert np.array_equal(M, M.T)
    delta = math.sqrt(2.0) * B**2 / N_ROWS
    assert release.sensitivity == pytest.approx(delta, rel=1e-15)
    assert sigma == pytest.approx(claimed_sigma(rho), rel=1e-15)
    assert release.noise_std == sigma
    assert release.rho == pytest.approx(delta**2 / (2.0 * sigma**2), rel=1e-12)
    assert release.rho == pytest.approx(rho, rel=1e-12)
    assert release.steps == 1 and release.clip == B and release.stage == "rho0"
    np.testing.assert_allclose(M - clipped_gram(W), M2 - clipped_gram(W2), rtol=0, atol=1e-12)


def test_infinite_rho_releases_the_clipped_gram_matrix():
    """ρ = ∞: no noise, M is the clipped Gram matrix, and the record says ρ = ∞ (not private)."""
    W, _ = neighbours(far=True)
    M, release, sigma = preprocess.analyze_gauss(W, rho=math.inf, rng=np.random.default_rng(0), row_bound=B)
    assert sigma == 0.0 and release.rho == math.inf
    np.testing.assert_allclose(M, clipped_gram(W), rtol=1e-13, atol=1e-15)


def test_rows_beyond_the_bound_are_clipped_so_the_sensitivity_holds():
    """Rows NOT within the bound: the release still has sensitivity √2·B²/n.

    * a row FAR·B·e₂ releases (ρ = ∞) exactly what the row B·e₂ releases;
    * for 2,000 random replaced rows w, w′ of norms up to 100·B (any direction), the noiseless
      releases differ by ‖triu(M − M′)‖ ≤ √2·B²/n, and the far canaries attain it.
    """
    W_far, W_far2 = neighbours(far=True)
    W_in, W_in2 = neighbours()

    def exact(W):
        return preprocess.analyze_gauss(W, rho=math.inf, rng=np.random.default_rng(0), row_bound=B)[0]

    np.testing.assert_array_equal(exact(W_far), exact(W_in))
    np.testing.assert_array_equal(exact(W_far2), exact(W_in2))
    delta = math.sqrt(2.0) * B**2 / N_ROWS
    assert np.linalg.norm((exact(W_far) - exact(W_far2))[IU]) == pytest.approx(delta, rel=1e-12)

    rng = np.random.default_rng(9)
    worst = 0.0
    for _ in range(2000):
        W1, W2 = W_in.copy(), W_in.copy()
        for Wk in (W1, W2):  # half the rows along a coordinate axis, where the bound is attained
            v = np.eye(D)[rng.integers(D)] * rng.choice([-1.0, 1.0]) if rng.random() < 0.5 else rng.standard_normal(D)
            Wk[-1] = v / np.linalg.norm(v) * B * rng.uniform(0.0, 100.0)
        worst = max(worst, float(np.linalg.norm((exact(W1) - exact(W2))[IU])))
    assert worst <= delta * (1 + 1e-12)
    assert worst >= 0.9 * delta  # the sampled pairs come close to the bound


# ----------------------------------------------------------------------------------------
# the audit
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("far", [False, True], ids=["canary B", "canary 10B"])
def test_moments_audit_is_sound_and_tight(far):
    """The audit must not beat the claim, and must nearly reach it.

    2,000 releases per dataset, d = 4, n = 50, B = 2, ρ = 2.5: claimed μ = sqrt(5) = 2.236, and the
    canary attains it exactly (checked: ‖triu(G_D − G_D′)‖/σ = sqrt(2ρ)). Canaries B·e₁ / B·e₂ (seed
    11) or 10B·e₁ / 10B·e₂ (seed 12, rows beyond the bound, clipped by the function). Observed:
    μ_lb = 2.046 (257 false positives, 251 false negatives) and 2.039 (261 / 250).

    Soundness: μ_lb ≤ sqrt(2·Release.rho) = 2.236, false failure ≤ 1e-3 by construction.
    Tightness: μ_lb ≥ 0.8·2.236 = 1.789. An exactly μ-GDP release audited with 2,000 runs gives on
    average μ_lb ≈ 2.001 (the Clopper–Pearson bounds at 1 − 5e-4 cost ~10 %), binomial
    (delta-method) sd 0.044: the floor is 4.8 sd below (asserted ≥ 3.5 sd). With the far canaries,
    a function that did not clip would separate the worlds perfectly (see the teeth test).
    Over 20 other seeds μ_lb ranged 1.921–2.112 (``python benchmarks/privacy_audit.py --power 20``).

    The statistic's law is verified first: S standardised is N(0, 1) in both worlds (KS p > 1e-6,
    mean and sd within 5 standard errors), and so is the released noise (u − triu(G))/σ, pooled
    over the 10 upper-triangle entries of 4,000 releases (KS p > 1e-6, per-entry sd within 5 se).
    Every released M is exactly symmetric.
    """
    a = run_audit(seed=12 if far else 11, far=far)
    mu = math.sqrt(2.0 * RHO)
    assert a.rho_release == pytest.approx(RHO, rel=1e-12)
    assert a.sigma_released == pytest.approx(claimed_sigma(), rel=1e-15)
    assert a.mu_canary == pytest.approx(mu, rel=1e-12)
    assert a.symmetric

    for w, sign in ((0, +1.0), (1, -1.0)):
        std = (a.S[w] - sign * mu**2 / 2) / mu
        assert stats.kstest(std, "norm").pvalue > 1e-6
        assert abs(std.mean()) < 5 / math.sqrt(a.runs)
        assert abs(std.std(ddof=1) - 1.0) < 5 / math.sqrt(2 * a.runs)
    assert stats.kstest(a.noise.ravel(), "norm").pvalue > 1e-6
    per_entry_sd = a.noise.reshape(-1, a.noise.shape[-1]).std(axis=0, ddof=1)
    assert np.all(np.abs(per_entry_sd - 1.0) < 5 / math.sqrt(2 * 2 * a.runs))

    assert a.mu_lb <= a.mu_accountant, f"privacy violation: mu_lb={a.mu_lb:.3f} > claimed mu={a.mu_accountant:.3f}"
    expected, sd = expected_mu_lb(mu, a.runs)
    assert TIGHT * mu <= expected - 3.5 * sd, "tolerance no longer justified by the run count"
    assert a.mu_lb >= TIGHT * mu, f"audit not tight: mu_lb={a.mu_lb:.3f} < {TIGHT}*{mu:.3f}"


@pytest.mark.parametrize("variant, far", [("add_remove_sensitivity", False), ("diagonal_not_noised", False),
                                          ("no_row_clipping", True)])
def test_moments_audit_catches_broken_releases(variant, far):
    """The audit has teeth: plausible bugs of analyze_gauss are caught (μ_lb > sqrt(2·2.5) = 2.236).

    2,000 releases per dataset, seed 303, ρ = 2.5; in every case the release record still claims
    ρ = 2.5, so the accountant is fooled and only an audit can notice.

    * add_remove_sensitivity: Δ = B²/n (the add/remove-one sensitivity) in the replace-one model,
      σ √2 too small: true μ = sqrt(10) = 3.162, expected μ_lb 2.865 ± 0.051 (12 sd above 2.236);
      observed μ_lb = 2.977 (103 / 98); over 20 other seeds 2.778–2.934, caught 20/20.
    * diagonal_not_noised: ``np.triu(noise, 1)``, the diagonal — where the attaining canary
      differs — is exact: perfect separation, μ_lb = 5.340, the largest 2,000 runs can certify.
    * no_row_clipping (``np.minimum(1, B/‖w‖)`` → 1), canaries 10B·e₁ / 10B·e₂: their Gram
      difference is 100× the claimed sensitivity: μ_lb = 5.340 (0 / 0). With canaries of norm B the
      bug is invisible (clipping is then a no-op): the far canaries are what makes it catchable.
    The last two were caught with 0 errors on each of 20 other seeds as well.

    Not tested here, because they are not privacy bugs: symmetrising a full i.i.d. N(0, σ²) matrix N
    as (N + Nᵀ)/2 (off-diagonal noise σ/√2, but it is post-processing of G + N, the Gaussian
    mechanism on the full matrix, whose Frobenius sensitivity ‖wwᵀ − w′w′ᵀ‖_F/n is ≤ √2·B²/n too)
    or as N + Nᵀ (more noise), and i.i.d. noise on both triangles (next test).
    """
    a = run_audit(variant, seed=303, far=far)
    assert a.rho_release == pytest.approx(RHO, rel=1e-12)
    assert a.mu_lb > a.mu_requested, f"{variant} not caught: mu_lb={a.mu_lb:.3f} <= {a.mu_requested:.3f}"
    if variant == "diagonal_not_noised":
        assert a.fp == 0 and a.fn == 0


def test_independent_noise_on_both_triangles_is_asymmetric_not_leaky():
    """Plausible bug: ``M + N`` with N i.i.d. N(0, σ²) on the full matrix instead of mirrored.

    This is NOT a privacy violation: the full matrix has Frobenius sensitivity
    ‖wwᵀ − w′w′ᵀ‖_F/n ≤ √2·B²/n, so i.i.d. noise σ on all d² entries is itself a ρ-zCDP Gaussian
    mechanism (and it reveals the upper triangle with exactly the claimed noise). The audit must
    therefore stay sound (μ_lb ≤ 2.236; observed 2.057); what catches the bug is the exact
    symmetry check (the releases are not symmetric), i.e. a correctness test, not the audit.
    """
    a = run_audit("independent_triangles", seed=303)
    assert not a.symmetric
    assert a.mu_lb <= a.mu_requested
