"""Empirical privacy audit of the second-moment releases of :mod:`dpivreg.privacy.mechanisms`.

The mechanisms
--------------
``box_second_moments(V, rho=ρ, rng=…, has_constant=True)`` (the default pipeline's ρ0 release, and
``method="moments"``'s only release) clips every entry of V to [−1, 1], prepends a constant column and
releases the upper triangle of [1, V]ᵀ[1, V]/n plus i.i.d. N(0, σ²), mirrored, with σ = Δ/sqrt(2ρ) and
Δ = D/n (D = d + 1 columns; the proof is in the module docstring). ``ball_second_moments(W, rho=ρ, rng=…,
row_bound=B)`` ("Analyze Gauss") clips every row of W to L2 norm B and uses Δ = √2·B²/n. Both claim
ρ-zCDP, i.e. μ-GDP with μ = sqrt(2ρ), for neighbours that differ by *replacing* one row.

The audit
---------
Each release is determined by its upper triangle u (diagonal included), the clipped Gram matrix's upper
triangle plus i.i.d. N(0, σ²) noise. Two neighbouring datasets share n − 1 rows and differ in a canary
row at the worst case of the claimed sensitivity:

* box, D = 4 (even, where Δ = D/n is attained): v = (1, 1, 1) (D) vs v′ = (1, −1, −1) (D′), i.e. half of
  the D coordinates of [1, v] flipped: ‖triu([1, v][1, v]ᵀ − [1, v′][1, v′]ᵀ)‖ = 4 = D;
* ball: w = B·e₁ (D) vs w′ = B·e₂ (D′): ‖triu(wwᵀ − w′w′ᵀ)‖ = √2·B².

So the canary's μ = ‖triu(G_D − G_D′)‖/σ equals sqrt(2ρ). With its own clipping and Gram matrix (no shared
code), the auditor computes triu(G_D), triu(G_D′), d = their difference and mid = their midpoint, and forms
from each release

    S = ⟨u − mid, d⟩ / σ²,

the exact log-likelihood ratio of the claimed mechanism: N(+μ²/2, μ²) under D and N(−μ²/2, μ²) under D′
(checked: KS, mean, sd). Guess "D" iff S > 0; one-sided Clopper–Pearson upper bounds on the false
positive / negative rates at 1 − 5e-4 each give, w.p. ≥ 1 − 1e-3, μ_lb = Φ⁻¹(1 − FPR_ub) − Φ⁻¹(FNR_ub) ≤
true μ. The audit fails when μ_lb > sqrt(2ρ).

Design: n = 50, ρ = 2.5 (μ = sqrt(5) = 2.236, as in the DP-2S-GD audit, so the tightness argument is the
same), 2,000 releases per dataset (a release costs ~10 µs: the whole file runs in about a second). Ball:
d = 4, B = 2 (not 1, so that a B-vs-B² mix-up changes σ). Box: d = 3 free columns plus the constant.
``far``: canaries beyond the bounds (box: entries ×10; ball: norm 10B), which the mechanism must clip.
``python benchmarks/privacy_audit.py`` prints the table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from unittest import mock

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from test_privacy_audit import CONF, assert_llr_law, assert_tight, mu_lower_bound

import dpivreg.privacy.mechanisms as mechanisms
from dpivreg.privacy.rounding import ball_rounding, box_rounding

D = 4  # columns of W (ball); columns of [1, V] (box)
N_ROWS = 50  # n, including the canary
B = 2.0  # row bound (ball)
RHO = 2.5  # zCDP budget of the release: μ = sqrt(5) = 2.236
RUNS = 2000  # releases per dataset
FAR = 10.0  # "far" canaries: beyond the bounds by this factor, which the function must clip

assert CONF == 5e-4  # the docstrings' numbers assume the DP-2S-GD audit's confidence level


def neighbours(mechanism: str, far: bool = False, seed: int = 20260402):
    """The data of D and D′: n − 1 shared rows within the bounds and the canary last (module docstring)."""
    rng = np.random.default_rng(seed)
    scale = FAR if far else 1.0
    if mechanism == "box":
        shared = rng.uniform(-1.0, 1.0, (N_ROWS - 1, D - 1))
        canaries = (np.ones(D - 1), np.array([1.0] + [-1.0] * (D - 2)))
        return [np.vstack([shared, scale * c]) for c in canaries]
    shared = rng.uniform(-1.0, 1.0, (N_ROWS - 1, D)) * B / math.sqrt(D)  # ‖row‖ ≤ B
    return [np.vstack([shared, scale * B * np.eye(D)[k]]) for k in (0, 1)]


def claimed_sensitivity(mechanism: str) -> float:
    """Δ re-derived here, not read from the package: D/n (box) or √2·B²/n (ball)."""
    return D / N_ROWS if mechanism == "box" else math.sqrt(2.0) * B**2 / N_ROWS


def claimed_sigma(mechanism: str, rho: float = RHO) -> float:
    """σ = Δ/sqrt(2ρ)."""
    return claimed_sensitivity(mechanism) / math.sqrt(2.0 * rho)


# ----------------------------------------------------------------------------------------
# the auditor's own clipped Gram matrices (independent of dpivreg.privacy.mechanisms)
# ----------------------------------------------------------------------------------------
def clipped_gram(W: np.ndarray, mechanism: str) -> np.ndarray:
    """(1/n) Σᵢ cᵢcᵢᵀ, row by row: cᵢ = [1, entries of wᵢ clipped to [−1, 1]] (box) or CLIP_B(wᵢ) (ball)."""
    dim = W.shape[1] + (mechanism == "box")
    G = np.zeros((dim, dim))
    for w in W:
        if mechanism == "box":
            c = np.array([1.0] + [min(1.0, max(-1.0, x)) for x in w])
        else:
            norm = float(np.linalg.norm(w))
            c = w * (B / norm) if norm > B else w
        G += np.outer(c, c)
    return G / W.shape[0]


IU = np.triu_indices(D)  # the released statistic: the upper triangle, diagonal included


def release(mechanism: str, W: np.ndarray, rho: float, rng: np.random.Generator):
    """One release by the package's mechanism (looked up at call time, so that patches apply)."""
    if mechanism == "box":
        return mechanisms.box_second_moments(W, rho=rho, rng=rng, has_constant=True)
    return mechanisms.ball_second_moments(W, rho=rho, rng=rng, row_bound=B)


# ----------------------------------------------------------------------------------------
# deliberately broken releases, injected into dpivreg.privacy.mechanisms at call time
# ----------------------------------------------------------------------------------------
_REAL_BALL = mechanisms.ball_second_moments


class _NumpyWith:
    """``numpy`` except for the given attributes: replaces ``dpivreg.privacy.mechanisms.np`` to inject a bug
    into the mechanisms' own code (every other numpy call passes through)."""

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
    M, record, sigma = _REAL_BALL(W, rho=2.0 * rho, rng=rng, row_bound=row_bound, **kwargs)
    sensitivity = record.rounding * row_bound**2 / W.shape[0]  # with the sums' rounding allowance, as released
    return M, dataclasses.replace(record, sensitivity=sensitivity, rho=sensitivity**2 / (2.0 * sigma**2)), sigma


VARIANTS = {
    "correct": {},
    # np.triu(noise, 1): the diagonal (where the ball's attaining canary differs) is released without noise
    "diagonal_not_noised": {"np": _NumpyWith(triu=lambda m, k=0: np.triu(m, max(k, 1)))},
    # the ball's row clipping is lost: Σᵢ wᵢwᵢᵀ of the rows as they are
    "no_row_clipping": {"ball_moment_sum": lambda W, row_bound: W.T @ W},
    "add_remove_sensitivity": {"ball_second_moments": add_remove_sensitivity},
    # i.i.d. noise on the full matrix, not mirrored: NOT a privacy bug (see its test), only asymmetric
    "independent_triangles": {"np": _NumpyWith(triu=lambda m, k=0: m if k == 0 else np.zeros_like(m))},
    # box: the constant column left out of D (Δ = d/n = 3/n instead of 4/n): σ 3/4 of the claim
    "constant_not_counted": {"box_moment_sensitivity": lambda dim, n: (dim - 1) / n},
    # box: the √2-smaller sensitivity of a norm ball's Frobenius bound misapplied (Δ = D/(√2·n))
    "half_frobenius": {"box_moment_sensitivity": lambda dim, n: dim / (math.sqrt(2.0) * n)},
    # box: entries not clipped to [−1, 1]
    "no_entry_clipping": {"np": _NumpyWith(fmax=lambda a, lo: np.asarray(a, dtype=float),
                                           fmin=lambda a, hi: np.asarray(a, dtype=float))},
}
MECHANISM_OF = {"add_remove_sensitivity": "ball", "no_row_clipping": "ball", "diagonal_not_noised": "ball",
                "independent_triangles": "ball", "constant_not_counted": "box",
                "half_frobenius": "box", "no_entry_clipping": "box"}


@dataclass
class Audit:
    mechanism: str
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


def run_audit(variant: str = "correct", *, seed: int, runs: int = RUNS, far: bool = False, rho: float = RHO,
              mechanism: str | None = None) -> Audit:
    """``runs`` releases of the mechanism (looked up at call time, with the variant's patches installed) on
    each neighbour, audited with the claimed mechanism's LLR."""
    mechanism = mechanism or MECHANISM_OF.get(variant, "box")
    worlds = neighbours(mechanism, far)
    sigma = claimed_sigma(mechanism, rho)
    means = [clipped_gram(W, mechanism)[IU] for W in worlds]
    d, mid = means[0] - means[1], (means[0] + means[1]) / 2.0
    S = np.zeros((2, runs))
    noise = np.zeros((2, runs, len(IU[0])))
    records, sigmas, symmetric = set(), set(), True
    with contextlib.ExitStack() as stack:
        for name, value in VARIANTS[variant].items():
            stack.enter_context(mock.patch(f"dpivreg.privacy.mechanisms.{name}", value))
        for w, W in enumerate(worlds):
            rng = np.random.default_rng([seed, w])
            for r in range(runs):
                M, record, sig = release(mechanism, W, rho, rng)
                symmetric &= bool(np.array_equal(M, M.T))
                u = M[IU]
                S[w, r] = np.dot(u - mid, d) / sigma**2
                noise[w, r] = (u - means[w]) / sigma
            records.add(record.rho)
            sigmas.add(sig)
    assert len(records) == 1 and len(sigmas) == 1
    fp = int(np.count_nonzero(S[1] > 0))
    fn = int(np.count_nonzero(S[0] <= 0))
    return Audit(mechanism, variant, far, runs, fp, fn, mu_lower_bound(fp, fn, runs), rho, records.pop(),
                 sigmas.pop(), float(np.linalg.norm(d) / sigma), S, noise, symmetric)


# for benchmarks/privacy_audit.py: table name → (mechanism, variant, far); seeds as in the tests (default 303)
TABLE_CASES = {
    "box: correct": ("box", "correct", False),
    "box: correct, entries 10x": ("box", "correct", True),
    "box: constant not counted": ("box", "constant_not_counted", False),
    "box: half Frobenius": ("box", "half_frobenius", False),
    "box: no entry clipping": ("box", "no_entry_clipping", True),
    "ball: correct": ("ball", "correct", False),
    "ball: correct, rows 10B": ("ball", "correct", True),
    "ball: add/remove sensitivity": ("ball", "add_remove_sensitivity", False),
    "ball: diagonal not noised": ("ball", "diagonal_not_noised", False),
    "ball: no row clipping, 10B": ("ball", "no_row_clipping", True),
    "ball: independent triangles": ("ball", "independent_triangles", False),
}
SEEDS = {"box: correct": 13, "box: correct, entries 10x": 14, "ball: correct": 11, "ball: correct, rows 10B": 12}


# ----------------------------------------------------------------------------------------
# exact checks
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mechanism", ["box", "ball"])
@pytest.mark.parametrize("rho", [0.05, 1.0, RHO, 40.0])
def test_release_is_symmetric_and_record_is_exact(mechanism, rho):
    """The released M is exactly symmetric; the record's ρ = Δ²/(2σ²) is the requested ρ.

    Δ (D/n, or √2·B²/n) and σ = Δ/sqrt(2ρ) are re-derived here; the noise M − G (G the auditor's clipped
    Gram matrix) is the same for both neighbours given the same generator state (data-independent).
    """
    W, W2 = neighbours(mechanism)
    M, record, sigma = release(mechanism, W, rho, np.random.default_rng(5))
    M2, _, _ = release(mechanism, W2, rho, np.random.default_rng(5))
    assert np.array_equal(M, M.T)
    # Δ and σ as released: times the blocked sum's rounding allowance (dpivreg.privacy.rounding, whose closed form
    # test_float_sums.py checks; 1 + 4e-13 here), which leaves ρ unchanged
    allowance = box_rounding(N_ROWS, D) if mechanism == "box" else ball_rounding(N_ROWS, D)
    delta = claimed_sensitivity(mechanism) * allowance
    assert record.rounding == allowance
    assert record.sensitivity == pytest.approx(delta, rel=1e-15)
    assert sigma == pytest.approx(claimed_sigma(mechanism, rho) * allowance, rel=1e-15)
    assert record.noise_std == sigma
    assert record.rho == pytest.approx(delta**2 / (2.0 * sigma**2), rel=1e-12)
    assert record.rho == pytest.approx(rho, rel=1e-12)
    assert record.steps == 1 and record.clip == (1.0 if mechanism == "box" else B) and record.stage == "rho0"
    np.testing.assert_allclose(M - clipped_gram(W, mechanism), M2 - clipped_gram(W2, mechanism), rtol=0, atol=1e-12)


@pytest.mark.parametrize("mechanism", ["box", "ball"])
def test_infinite_rho_releases_the_clipped_gram_matrix(mechanism):
    """ρ = ∞: no noise, M is the clipped Gram matrix, and the record says ρ = ∞ (not private)."""
    W, _ = neighbours(mechanism, far=True)
    M, record, sigma = release(mechanism, W, math.inf, np.random.default_rng(0))
    assert sigma == 0.0 and record.rho == math.inf
    np.testing.assert_allclose(M, clipped_gram(W, mechanism), rtol=1e-13, atol=1e-15)


def _exact(mechanism: str, W: np.ndarray) -> np.ndarray:
    return release(mechanism, W, math.inf, np.random.default_rng(0))[0]


def test_box_sensitivity_is_d_over_n_and_attained_for_even_d():
    """The box mechanism's Δ = D/n (D columns with the constant): exact values.

    * The proof's identity ‖triu(aaᵀ − bbᵀ)‖² = 4[‖s‖²‖t‖² + (sᵀt)² + 2Σsᵢ²tᵢ²] (s, t the half sum and half
      difference) holds for random pairs (to 1e-12).
    * The worst case: for D = 2 … 8, a = (1, …, 1) and b with ⌊D/2⌋ non-constant coordinates negated give
      ‖triu‖² = 4⌊D/2⌋⌈D/2⌉, i.e. exactly D² for even D and D² − 1 for odd D, never more than D².
    * 20,000 random replaced canaries (entries up to 100 beyond the bounds, half at box vertices) move the
      noiseless release by at most D/n, and the vertex canaries attain it.
    """
    rng = np.random.default_rng(4)
    for _ in range(200):
        a, b = np.r_[1.0, rng.uniform(-1, 1, 5)], np.r_[1.0, rng.uniform(-1, 1, 5)]
        s, t = (a + b) / 2, (a - b) / 2
        lhs = np.sum(np.triu(np.outer(a, a) - np.outer(b, b)) ** 2)
        rhs = 4 * (s @ s * (t @ t) + (s @ t) ** 2 + 2 * np.sum(s**2 * t**2))
        assert lhs == pytest.approx(rhs, rel=1e-12)
    for dim in range(2, 9):
        a = np.ones(dim)
        b = a.copy()
        b[1:1 + dim // 2] = -1.0
        value = np.sum(np.triu(np.outer(a, a) - np.outer(b, b)) ** 2)
        assert value == 4 * (dim // 2) * (dim - dim // 2) <= dim**2
        assert value == (dim**2 if dim % 2 == 0 else dim**2 - 1)

    W, W2 = neighbours("box")
    delta = D / N_ROWS
    assert np.linalg.norm((_exact("box", W) - _exact("box", W2))[IU]) == pytest.approx(delta, rel=1e-12)
    worst = 0.0
    for _ in range(20_000):
        W1, W2 = W.copy(), W.copy()
        for Wk in (W1, W2):
            Wk[-1] = (rng.choice([-1.0, 1.0], D - 1) if rng.random() < 0.5
                      else rng.uniform(-1.0, 1.0, D - 1)) * rng.choice([1.0, 100.0])
        worst = max(worst, float(np.linalg.norm((_exact("box", W1) - _exact("box", W2))[IU])))
    assert worst <= delta * (1 + 1e-12)
    assert worst >= (1 - 1e-12) * delta  # vertex pairs with half the coordinates flipped are sampled


def test_ball_rows_beyond_the_bound_are_clipped_so_the_sensitivity_holds():
    """Rows NOT within the bound: the ball release still has sensitivity √2·B²/n.

    * a row FAR·B·e₂ releases (ρ = ∞) exactly what the row B·e₂ releases;
    * for 2,000 random replaced rows w, w′ of norms up to 100·B (any direction), the noiseless
      releases differ by ‖triu(M − M′)‖ ≤ √2·B²/n, and the far canaries attain it.
    """
    W_far, W_far2 = neighbours("ball", far=True)
    W_in, W_in2 = neighbours("ball")
    np.testing.assert_array_equal(_exact("ball", W_far), _exact("ball", W_in))
    np.testing.assert_array_equal(_exact("ball", W_far2), _exact("ball", W_in2))
    delta = math.sqrt(2.0) * B**2 / N_ROWS
    assert np.linalg.norm((_exact("ball", W_far) - _exact("ball", W_far2))[IU]) == pytest.approx(delta, rel=1e-12)

    rng = np.random.default_rng(9)
    worst = 0.0
    for _ in range(2000):
        W1, W2 = W_in.copy(), W_in.copy()
        for Wk in (W1, W2):  # half the rows along a coordinate axis, where the bound is attained
            v = np.eye(D)[rng.integers(D)] * rng.choice([-1.0, 1.0]) if rng.random() < 0.5 else rng.standard_normal(D)
            Wk[-1] = v / np.linalg.norm(v) * B * rng.uniform(0.0, 100.0)
        worst = max(worst, float(np.linalg.norm((_exact("ball", W1) - _exact("ball", W2))[IU])))
    assert worst <= delta * (1 + 1e-12)
    assert worst >= 0.9 * delta  # the sampled pairs come close to the bound


# ----------------------------------------------------------------------------------------
# the audit
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mechanism, far, seed", [("box", False, 13), ("box", True, 14), ("ball", False, 11),
                                                  ("ball", True, 12)],
                         ids=["box", "box entries 10x", "ball canary B", "ball canary 10B"])
def test_moments_audit_is_sound_and_tight(mechanism, far, seed):
    """The audit must not beat the claim, and must nearly reach it.

    2,000 releases per dataset, n = 50, ρ = 2.5: claimed μ = sqrt(5) = 2.236, and the canary attains it
    exactly (checked: ‖triu(G_D − G_D′)‖/σ = sqrt(2ρ)). ``far``: canaries beyond the bounds, clipped by the
    function.

    Soundness: μ_lb ≤ sqrt(2·Release.rho) = 2.236, false failure ≤ 1e-3 by construction.
    Tightness: μ_lb ≥ 0.8·2.236 = 1.789. An exactly μ-GDP release audited with 2,000 runs gives on
    average μ_lb ≈ 2.001 (the Clopper–Pearson bounds at 1 − 5e-4 cost ~10 %), binomial
    (delta-method) sd 0.044: the floor is 4.8 sd below (asserted ≥ 3.5 sd). With the far canaries,
    a function that did not clip would separate the worlds perfectly (see the teeth test).
    ``python benchmarks/privacy_audit.py --power 20`` shows the spread over seeds.

    The statistic's law is verified first: S standardised is N(0, 1) in both worlds (KS p > 1e-6,
    mean and sd within 5 standard errors), and so is the released noise (u − triu(G))/σ, pooled
    over the 10 upper-triangle entries of 4,000 releases (KS p > 1e-6, per-entry sd within 5 se).
    Every released M is exactly symmetric.
    """
    a = run_audit(seed=seed, far=far, mechanism=mechanism)
    mu = math.sqrt(2.0 * RHO)
    assert a.rho_release == pytest.approx(RHO, rel=1e-12)
    assert a.sigma_released == pytest.approx(claimed_sigma(mechanism), rel=1e-15)
    assert a.mu_canary == pytest.approx(mu, rel=1e-12)
    assert a.symmetric

    assert_llr_law(a.S, mu)
    noise = a.noise[:, :, 1:] if mechanism == "box" else a.noise  # entry (0, 0) of the box is the constant's 1
    assert stats.kstest(noise.ravel(), "norm").pvalue > 1e-6
    per_entry_sd = noise.reshape(-1, noise.shape[-1]).std(axis=0, ddof=1)
    assert np.all(np.abs(per_entry_sd - 1.0) < 5 / math.sqrt(2 * 2 * a.runs))

    assert a.mu_lb <= a.mu_accountant, f"privacy violation: mu_lb={a.mu_lb:.3f} > claimed mu={a.mu_accountant:.3f}"
    assert_tight(a.mu_lb, mu, a.runs)


@pytest.mark.parametrize("variant, far", [("constant_not_counted", False), ("half_frobenius", False),
                                          ("no_entry_clipping", True), ("add_remove_sensitivity", False),
                                          ("diagonal_not_noised", False), ("no_row_clipping", True)])
def test_moments_audit_catches_broken_releases(variant, far):
    """The audit has teeth: plausible bugs of the mechanisms are caught (μ_lb > sqrt(2·2.5) = 2.236).

    2,000 releases per dataset, seed 303, ρ = 2.5; in every case the release record still claims
    ρ = 2.5, so the accountant is fooled and only an audit can notice.

    Box (canary (1, 1, 1) vs (1, −1, −1)):

    * constant_not_counted: Δ = d/n = 3/n instead of D/n = 4/n: true μ = (4/3)·2.236 = 2.981;
    * half_frobenius: Δ = D/(√2·n): true μ = √2·2.236 = 3.162;
    * no_entry_clipping (the clamp ``np.fmin(np.fmax(V, -1), 1)`` a no-op), canaries with entries 10: their Gram
      difference is 100× the claimed sensitivity: perfect separation (μ_lb = 5.340, the largest 2,000 runs can certify).

    Ball (canary B·e₁ vs B·e₂):

    * add_remove_sensitivity: Δ = B²/n (the add/remove-one sensitivity) in the replace-one model,
      σ √2 too small: true μ = sqrt(10) = 3.162, expected μ_lb 2.865 ± 0.051 (12 sd above 2.236);
    * diagonal_not_noised: ``np.triu(noise, 1)``, the diagonal — where the attaining canary
      differs — is exact: perfect separation;
    * no_row_clipping (``np.minimum(1, B/‖w‖)`` → 1), canaries 10B·e₁ / 10B·e₂: perfect separation.
      With canaries of norm B the bug is invisible (clipping is then a no-op): the far canaries are what
      makes it catchable.

    Not tested here, because they are not privacy bugs: symmetrising a full i.i.d. N(0, σ²) matrix N
    as (N + Nᵀ)/2 or as N + Nᵀ, and i.i.d. noise on both triangles (next test).
    """
    a = run_audit(variant, seed=303, far=far)
    assert a.rho_release == pytest.approx(RHO, rel=1e-12)
    assert a.mu_lb > a.mu_requested, f"{variant} not caught: mu_lb={a.mu_lb:.3f} <= {a.mu_requested:.3f}"
    if variant in ("diagonal_not_noised", "no_entry_clipping", "no_row_clipping"):
        assert a.fp == 0 and a.fn == 0


def test_independent_noise_on_both_triangles_is_asymmetric_not_leaky():
    """Plausible bug: ``M + N`` with N i.i.d. N(0, σ²) on the full matrix instead of mirrored.

    This is NOT a privacy violation: the full matrix has Frobenius sensitivity
    ‖wwᵀ − w′w′ᵀ‖_F/n ≤ √2·B²/n, so i.i.d. noise σ on all d² entries is itself a ρ-zCDP Gaussian
    mechanism (and it reveals the upper triangle with exactly the claimed noise). The audit must
    therefore stay sound (μ_lb ≤ 2.236); what catches the bug is the exact symmetry check (the releases
    are not symmetric), i.e. a correctness test, not the audit.
    """
    a = run_audit("independent_triangles", seed=303, mechanism="ball")
    assert not a.symmetric
    assert a.mu_lb <= a.mu_requested


# ----------------------------------------------------------------------------------------
# what is released must not depend on the values: the intercept is declared, never inferred
# ----------------------------------------------------------------------------------------
def _neighbours_with_a_nearly_constant_column(n: int = 400, seed: int = 3):
    """D: an exogenous column g of ones; D′: the same with one row's g replaced by 0 (a neighbour)."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(n)
    x = z + rng.standard_normal(n)
    frame = pd.DataFrame({"y": x + rng.standard_normal(n), "g": np.ones(n), "w": rng.standard_normal(n),
                          "x": x, "z": z})
    other = frame.copy()
    other.loc[0, "g"] = 0.0
    return frame, other


@pytest.mark.parametrize("backend", ["pandas", "dask"])
def test_the_released_moments_have_the_same_shape_and_noise_on_neighbours(backend):
    """A constant column that is not declared as the intercept is an ordinary regressor: replacing one row so
    that it stops being constant changes neither D, nor the sensitivity D/n, nor σ of the moment release, nor
    the list of releases (found by an independent review: the intercept used to be detected from the values,
    which let one row change D and σ, both published). The meats' records may differ in their thresholds, which
    are released from noisy histograms of the data (post-processing), so only their names and budgets are
    compared."""
    from dpivreg import DPIV2SLS

    records = []
    for frame in _neighbours_with_a_nearly_constant_column():
        data = frame
        if backend == "dask":
            dd = pytest.importorskip("dask.dataframe")
            data = dd.from_pandas(frame, npartitions=2)
        model = DPIV2SLS(data["y"], data[["g", "w"]], data["x"], data[["z"]])
        assert not model.design.has_constant
        res = model.fit(rho=2.0, bounds={"y": (-8, 8), "g": (0, 1), "w": (-4, 4), "x": (-6, 6), "z": (-4, 4)},
                        seed=1, method="moments")
        moments = res.scale.moments
        records.append((moments.matrix.shape, moments.sigma,
                        [(r.name, r.rho) + ((r.sensitivity, r.noise_std) if r.stage == "rho0" else ())
                         for r in res.privacy.releases]))
    assert records[0] == records[1]


def test_the_intercept_is_declared_by_name_or_argument():
    from dpivreg import DPIV2SLS

    frame, _ = _neighbours_with_a_nearly_constant_column()
    named = frame.rename(columns={"g": "const"})
    assert DPIV2SLS(named["y"], named[["const", "w"]], named["x"], named[["z"]]).design.constant_name == "const"
    as_arrays = DPIV2SLS(frame["y"].to_numpy(), frame[["g", "w"]].to_numpy(), frame["x"].to_numpy(),
                         frame["z"].to_numpy(), constant="exog.0")
    assert as_arrays.design.constant_name == "exog.0"
    assert not DPIV2SLS(named["y"], named[["const", "w"]], named["x"], named[["z"]],
                        constant=False).design.has_constant
    varying = named.assign(const=np.arange(len(named)) % 3 + 1.0)
    with pytest.raises(ValueError, match=r"'const' is declared as the intercept.*constant=False"):
        DPIV2SLS(varying["y"], varying[["const", "w"]], varying["x"], varying[["z"]])
    with pytest.raises(ValueError, match=r"constant must be the name of an exogenous column"):
        DPIV2SLS(frame["y"], frame[["g", "w"]], frame["x"], frame[["z"]], constant="nope")
