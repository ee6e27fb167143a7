"""White-box empirical privacy audit of DP-2S-GD through the public ``dp_2s_gd`` code path.

The audit
---------
Two neighbouring datasets D, D′ share n − 1 ordinary rows and differ in one *canary* row:
``z = e₁``, ``x = ±M·1``, ``y = ±M`` (D: +, D′: −) with M = 10⁸. Its per-sample gradients are
always clipped and point in opposite directions in the two datasets:

* stage 1: ``e₁(Θ[0,:] ∓ M·1)ᵀ`` has norm ≈ M√p ≫ γ1, clipped to ≈ ∓γ1·e₁1ᵀ/√p, so the two
  datasets' clipped mean gradients differ by exactly 2γ1/n at *every* released Θ⁽ᵗ⁾;
* stage 2: ``x̂(x̂ᵀβ ∓ M)`` with ``x̂ = Θ⁽ᵗ⁾ᵀe₁`` (the same in both worlds given the released
  path) is clipped to ∓γ2·x̂/‖x̂‖: difference exactly 2γ2/n at t ≥ 1. At t = 0, Θ⁽⁰⁾ = 0 gives
  x̂ = 0 for every row, the stage-2 gradient is 0 in both datasets and that step leaks nothing
  (dₜ = 0). With ``n_exog = 1`` (exogenous intercept, canary x = (1, ±M)) x̂ = (1, Θᵀz) ≠ 0
  already at t = 0 and every one of the 2T Gaussian steps is attained.

The auditor knows D and D′ and conditions on the released path. With its *own* clipped-mean
implementation (explicit per-sample gradients, no shared code with the engine) it computes at
every released iterate the two datasets' clipped mean gradients, their difference dₜ and their
midpoint midₜ; from the path it recovers the noisy mean gradients Gₜ = (θₜ − θₜ₊₁)/step and forms

    S = Σₜ Σ_stage ⟨Gₜ − midₜ, dₜ⟩ / λ²_stage,

the exact log-likelihood ratio log p_D(path)/p_D′(path) of the claimed mechanism. When the
mechanism is what it claims and ‖dₜ‖ is deterministic (checked), S is a martingale with
deterministic increments' variances, hence exactly N(+μ²/2, μ²) under D and N(−μ²/2, μ²) under
D′ with μ² = Σ ‖dₜ‖²/λ² (checked below: KS of the standardised S, its mean and sd). Guess "D"
iff S > 0 (threshold fixed in advance); one-sided Clopper–Pearson upper bounds on the false
positive and false negative rates at confidence 1 − 5e-4 each give, with probability ≥ 1 − 1e-3,

    μ_lb = Φ⁻¹(1 − FPR_ub) − Φ⁻¹(FNR_ub)  ≤  true μ.

The audit fails when μ_lb > sqrt(2ρ) for the ρ the accountant claims.

Run ``python benchmarks/privacy_audit.py`` for the table of claimed μ vs μ_lb (and power over seeds).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pytest
from scipy import stats

import dpivreg.engine as engine
from dpivreg import PrivacyLeakWarning
from dpivreg.privacy import noise_std as _true_noise_std

# ----------------------------------------------------------------------------------------
# design (public, fixed in advance)
# ----------------------------------------------------------------------------------------
N_ROWS = 50  # n, including the canary
Q = 3  # instruments
P = 2  # regressors
T = 10  # iterations
CLIP1, CLIP2 = 1.0, 2.0  # different on purpose: a clip1/clip2 mix-up in the engine shows up
RHO1, RHO2 = 1.5, 1.0  # exact calibration: ρ = 2.5, μ = sqrt(5) ≈ 2.236
ETA, ALPHA = 0.5, 0.5
M = 1e8  # canary magnitude
RUNS = 2000  # runs per dataset
CONF = 5e-4  # one-sided CP level for each of FPR and FNR: false-failure probability ≤ 1e-3
TIGHT = 0.8  # "exact" must reach μ_lb ≥ 0.8·sqrt(2ρ); see _expected_mu_lb and the tests' docstrings


def neighbours(n_exog: int = 0, seed: int = 20260401):
    """(Z, X, Y) for D and D′: n − 1 shared ordinary rows and the canary as the last row."""
    rng = np.random.default_rng(seed)
    m = N_ROWS - 1
    Z = rng.standard_normal((m, Q))
    if n_exog:
        Z[:, :n_exog] = 1.0  # exogenous intercept, its own instrument
    X = Z @ (np.eye(Q, P) + 0.3 * rng.standard_normal((Q, P))) + 0.5 * rng.standard_normal((m, P))
    X[:, :n_exog] = Z[:, :n_exog]
    Y = X @ np.array([1.0, -0.5])[:P] + rng.standard_normal(m) + 0.5 * (X[:, -1] - Z[:, -1])
    z_c = np.eye(Q)[0]
    out = []
    for sign in (+1.0, -1.0):
        x_c = np.full(P, sign * M)
        x_c[:n_exog] = z_c[:n_exog]
        out.append((np.vstack([Z, z_c]), np.vstack([X, x_c]), np.append(Y, sign * M)))
    return out


def claimed_lambdas(calibration: str, rho1: float = RHO1, rho2: float = RHO2) -> tuple[float, float]:
    """Noise std of each stage the claimed mechanism uses (re-derived here, not read from the engine)."""
    if calibration == "exact":  # Δ²/(2λ²)·T = ρ with Δ = 2γ/n
        f = lambda g, r: g / N_ROWS * math.sqrt(2.0 * T / r)  # noqa: E731
    else:  # the paper's Proposition
        f = lambda g, r: 2.0 * g / N_ROWS * math.sqrt(T / r)  # noqa: E731
    return f(CLIP1, rho1), f(CLIP2, rho2)


# ----------------------------------------------------------------------------------------
# the auditor's own clipped mean gradients (independent of dpivreg.engine)
# ----------------------------------------------------------------------------------------
def _clip_rows(g: np.ndarray, clip: float) -> np.ndarray:
    """CLIP_γ applied to every per-sample gradient g[..., i, :] (flattened), by its own norm."""
    norms = np.sqrt(np.sum(g * g, axis=-1, keepdims=True))
    return g * np.minimum(1.0, clip / np.maximum(norms, np.finfo(float).tiny))


def clipped_mean_gradients(data, theta: np.ndarray, beta: np.ndarray, n_exog: int):
    """Both stages' clipped mean gradients at a batch of iterates.

    theta (R, q, p − n_exog), beta (R, p) → g1 (R, q, p − n_exog), g2 (R, p), built from the
    explicit per-sample gradients zᵢ(zᵢᵀΘ − xᵢᵀ) and x̂ᵢ(x̂ᵢᵀβ − yᵢ), x̂ᵢ = [exogᵢ, Θᵀzᵢ].
    """
    Z, X, Y = data
    R = theta.shape[0]
    n = Z.shape[0]
    fitted = np.einsum("ni,rij->rnj", Z, theta)  # (R, n, pe)
    per1 = Z[None, :, :, None] * (fitted - X[None, :, n_exog:])[:, :, None, :]  # (R, n, q, pe)
    g1 = _clip_rows(per1.reshape(R, n, -1), CLIP1).mean(axis=1).reshape(theta.shape)
    x_hat = np.concatenate([np.broadcast_to(X[None, :, :n_exog], (R, n, n_exog)), fitted], axis=2)
    resid = np.einsum("rnj,rj->rn", x_hat, beta) - Y[None, :]
    g2 = _clip_rows(x_hat * resid[:, :, None], CLIP2).mean(axis=1)
    return g1, g2


# ----------------------------------------------------------------------------------------
# the audit
# ----------------------------------------------------------------------------------------
def cp_upper(k: int, trials: int, alpha: float = CONF) -> float:
    """One-sided Clopper–Pearson upper confidence bound (level 1 − alpha) on a binomial rate."""
    return 1.0 if k >= trials else float(stats.beta.ppf(1.0 - alpha, k + 1, trials - k))


def mu_lower_bound(fp: int, fn: int, runs: int) -> float:
    return float(stats.norm.ppf(1.0 - cp_upper(fp, runs)) - stats.norm.ppf(cp_upper(fn, runs)))


def expected_mu_lb(mu: float, runs: int = RUNS) -> tuple[float, float]:
    """μ_lb an exactly μ-GDP mechanism gives with error counts at their mean Φ(−μ/2)·runs, and its sd.

    The sd is the delta-method one: each of the two error rates has binomial sd
    sqrt(F(1−F)/runs) and enters μ_lb through Φ⁻¹, whose slope is 1/φ.
    """
    F = stats.norm.cdf(-mu / 2.0)
    k = round(F * runs)
    lb = mu_lower_bound(k, k, runs)
    sd = math.sqrt(2.0 * F * (1.0 - F) / runs) / stats.norm.pdf(lb / 2.0)
    return lb, sd


@dataclass
class Audit:
    calibration: str
    n_exog: int
    runs: int
    fp: int  # runs on D′ with S > 0
    fn: int  # runs on D with S <= 0
    mu_lb: float
    rho_accountant: float  # path.privacy.rho (what the accountant says was spent)
    rho_requested: float  # rho1 + rho2 as passed by the user
    lambdas_released: tuple[float, float]
    mu2: np.ndarray  # (2, runs): Σ ‖dₜ‖²/λ² per run, per world
    S: np.ndarray  # (2, runs): the statistic, row 0 on D, row 1 on D′
    d_norms: np.ndarray  # (2, runs, T, 2): ‖dₜ‖ per world, run, step, stage
    noise: np.ndarray  # standardised injected noise (Gₜ − g_world)/λ, pooled

    @property
    def mu_accountant(self) -> float:
        return math.sqrt(2.0 * self.rho_accountant)

    @property
    def mu_requested(self) -> float:
        return math.sqrt(2.0 * self.rho_requested)


def run_audit(calibration: str = "exact", *, seed: int, n_exog: int = 0, runs: int = RUNS,
              rho1: float = RHO1, rho2: float = RHO2) -> Audit:
    """Run DP-2S-GD ``runs`` times on each neighbour and audit the released paths.

    Calls ``dpivreg.engine.dp_2s_gd`` at call time, so monkeypatched engine internals are audited.
    """
    worlds = neighbours(n_exog)
    lam1, lam2 = claimed_lambdas(calibration, rho1, rho2)
    S = np.zeros((2, runs))
    mu2 = np.zeros((2, runs))
    d_norms = np.zeros((2, runs, T, 2))
    noise = []
    accountant, released = set(), set()
    for w, (Zw, Xw, Yw) in enumerate(worlds):
        seeds = np.random.SeedSequence([seed, w]).spawn(runs)
        thetas, betas = [], []
        for s in seeds:
            path = engine.dp_2s_gd(Zw, Xw, Yw, T=T, rho1=rho1, rho2=rho2, eta=ETA, alpha=ALPHA, clip1=CLIP1,
                                   clip2=CLIP2, calibration=calibration, seed=s, n_exog=n_exog)
            thetas.append(path.theta)
            betas.append(path.beta)
        accountant.add(path.privacy.rho)
        released.add((path.lambda1, path.lambda2))
        theta, beta = np.stack(thetas), np.stack(betas)  # (R, T+1, q, pe), (R, T+1, p)
        for t in range(T):
            gD1, gD2 = clipped_mean_gradients(worlds[0], theta[:, t], beta[:, t], n_exog)
            gE1, gE2 = clipped_mean_gradients(worlds[1], theta[:, t], beta[:, t], n_exog)
            G1 = (theta[:, t] - theta[:, t + 1]) / ETA
            G2 = (beta[:, t] - beta[:, t + 1]) / ALPHA
            d1, d2 = gD1 - gE1, gD2 - gE2
            S[w] += np.sum((G1 - (gD1 + gE1) / 2) * d1, axis=(1, 2)) / lam1**2
            S[w] += np.sum((G2 - (gD2 + gE2) / 2) * d2, axis=1) / lam2**2
            mu2[w] += np.sum(d1 * d1, axis=(1, 2)) / lam1**2 + np.sum(d2 * d2, axis=1) / lam2**2
            d_norms[w, :, t, 0] = np.sqrt(np.sum(d1 * d1, axis=(1, 2)))
            d_norms[w, :, t, 1] = np.sqrt(np.sum(d2 * d2, axis=1))
            own1, own2 = (gD1, gD2) if w == 0 else (gE1, gE2)
            noise += [((G1 - own1) / lam1).ravel(), ((G2 - own2) / lam2).ravel()]
    assert len(accountant) == 1 and len(released) == 1
    fp = int(np.count_nonzero(S[1] > 0))
    fn = int(np.count_nonzero(S[0] <= 0))
    return Audit(calibration, n_exog, runs, fp, fn, mu_lower_bound(fp, fn, runs), accountant.pop(),
                 rho1 + rho2, released.pop(), mu2, S, d_norms, np.concatenate(noise))


@functools.lru_cache(maxsize=None)
def _audit(calibration: str, n_exog: int, seed: int, rho1: float = RHO1, rho2: float = RHO2) -> Audit:
    """Correct-engine audits are shared between tests (no monkeypatching involved)."""
    return run_audit(calibration, seed=seed, n_exog=n_exog, rho1=rho1, rho2=rho2)


def mu_attained(n_exog: int, rho1: float, rho2: float) -> float:
    """μ the canary attains: every step but stage 2 at t = 0 when n_exog = 0 (x̂ = 0 there)."""
    return math.sqrt(2.0 * rho1 + 2.0 * rho2 * ((T - 1) / T if n_exog == 0 else 1.0))


# ----------------------------------------------------------------------------------------
# deliberately broken mechanisms
# ----------------------------------------------------------------------------------------
def halved_noise_std(*args, **kwargs) -> float:
    """Bug (a): half the calibrated noise."""
    return _true_noise_std(*args, **kwargs) / 2.0


def mean_clipped_mean_outer(A, B, norm_A, clip):
    """Bug (b): (1/n) Σ aᵢbᵢᵀ with the *mean's* norm clipped to γ instead of each row's."""
    mean = A.T @ B / A.shape[0]
    norm = float(np.sqrt(np.sum(mean * mean)))
    if clip is not None and norm > clip:
        mean = mean * (clip / norm)
    return mean, 0


BROKEN = {
    "halved_noise": ("noise_std", halved_noise_std),
    "mean_clipping": ("_clipped_mean_outer", mean_clipped_mean_outer),
}


# ----------------------------------------------------------------------------------------
# tests
# ----------------------------------------------------------------------------------------
def test_auditor_gradients_match_reference_and_noiseless_engine():
    """The auditor's clipped means equal a row-by-row loop and the noiseless engine's steps.

    Independent cross-check of the deterministic part: with ρ = ∞ (no noise, clipping kept) the
    engine's path increments (θₜ − θₜ₊₁)/step must be the auditor's clipped mean gradients.
    """
    for n_exog in (0, 1):
        for data in neighbours(n_exog):
            Z, X, Y = data
            with pytest.warns(PrivacyLeakWarning):
                path = engine.dp_2s_gd(Z, X, Y, T=T, rho1=math.inf, rho2=math.inf, eta=ETA, alpha=ALPHA,
                                       clip1=CLIP1, clip2=CLIP2, n_exog=n_exog)
            g1, g2 = clipped_mean_gradients(data, path.theta[:-1], path.beta[:-1], n_exog)
            np.testing.assert_allclose((path.theta[:-1] - path.theta[1:]) / ETA, g1, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose((path.beta[:-1] - path.beta[1:]) / ALPHA, g2, rtol=1e-9, atol=1e-12)
            # row-by-row reference at one iterate
            t = T // 2
            th, b = path.theta[t], path.beta[t]
            r1 = np.zeros_like(th)
            r2 = np.zeros_like(b)
            for i in range(len(Y)):
                gi = np.outer(Z[i], Z[i] @ th - X[i, n_exog:])
                r1 += gi * min(1.0, CLIP1 / np.linalg.norm(gi)) / len(Y)
                xh = np.concatenate([X[i, :n_exog], th.T @ Z[i]])
                gi = xh * (xh @ b - Y[i])
                r2 += gi * min(1.0, CLIP2 / max(np.linalg.norm(gi), 1e-300)) / len(Y)
            np.testing.assert_allclose(g1[t], r1, rtol=1e-10, atol=1e-14)
            np.testing.assert_allclose(g2[t], r2, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("n_exog", [0, 1])
def test_audit_exact_calibration_is_sound_and_tight(n_exog):
    """calibration="exact": the audit must not beat the accountant, and must nearly reach it.

    2,000 runs per dataset, n = 50, q = 3, p = 2, T = 10, ρ1 = 1.5, ρ2 = 1 (γ1 = 1, γ2 = 2):
    claimed ρ = 2.5, μ = sqrt(5) = 2.236. The canary attains μ = 2.191 (n_exog = 0: the stage-2
    step at t = 0 is data-independent, 2ρ2/T of μ² is unused) or the full 2.236 (n_exog = 1).
    Observed: μ_lb = 1.955 (n_exog = 0; 277 false positives, 272 false negatives) and 1.981
    (n_exog = 1; 269 / 268).

    Soundness: μ_lb ≤ sqrt(2·path.privacy.rho), false failure ≤ 1e-3 by construction.
    Tightness: μ_lb ≥ 0.8·2.236 = 1.789. An exactly μ-GDP mechanism audited with 2,000 runs
    gives on average μ_lb ≈ 1.961 (μ = 2.191) / 2.001 (μ = 2.236) — the Clopper–Pearson bounds
    at 1 − 5e-4 cost ~10 % — with binomial (delta-method) sd 0.044, so the floor sits 3.9 sd
    (n_exog = 0) / 4.8 sd (n_exog = 1) below the expected value (the test asserts ≥ 3.5 sd, so a
    change of run count or ρ that voids this justification fails loudly). Over 20 other seeds
    μ_lb ranged 1.849–2.000 (n_exog = 0) and 1.938–2.074 (n_exog = 1). Noise √2 too large (the
    paper's calibration judged against its nominal ρ) gives μ_lb ≈ 0.61 of the claim and is
    flagged: see the paper test.

    The statistic's law is verified first: S standardised with the per-run μ is N(0, 1) in
    both worlds (KS p > 1e-6, mean and sd within 5 standard errors), and every ‖dₜ‖ is exactly
    2γk/n (0 for stage 2 at t = 0 when n_exog = 0).
    """
    a = _audit("exact", n_exog, 101)
    mu = math.sqrt(2.0 * (RHO1 + RHO2))
    mu_eff = mu_attained(n_exog, RHO1, RHO2)

    # the accountant claims exactly what was asked, with the noise it released
    assert a.rho_accountant == pytest.approx(RHO1 + RHO2, rel=1e-12)
    np.testing.assert_allclose(a.lambdas_released, claimed_lambdas("exact"), rtol=1e-12)

    # the neighbours are worst case at every step
    want = np.broadcast_to([2 * CLIP1 / N_ROWS, 2 * CLIP2 / N_ROWS], a.d_norms.shape).copy()
    if n_exog == 0:
        want[:, :, 0, 1] = 0.0
    np.testing.assert_allclose(a.d_norms, want, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(a.mu2, mu_eff**2, rtol=1e-9)

    # S ~ N(±μ²/2, μ²)
    for w, sign in ((0, +1.0), (1, -1.0)):
        std = (a.S[w] - sign * mu_eff**2 / 2) / mu_eff
        assert stats.kstest(std, "norm").pvalue > 1e-6
        assert abs(std.mean()) < 5 / math.sqrt(a.runs)
        assert abs(std.std(ddof=1) - 1.0) < 5 / math.sqrt(2 * a.runs)

    # soundness against the accountant
    assert a.mu_lb <= a.mu_accountant, f"privacy violation: mu_lb={a.mu_lb:.3f} > claimed mu={a.mu_accountant:.3f}"

    # tightness
    expected, sd = expected_mu_lb(mu_eff, a.runs)
    assert TIGHT * mu <= expected - 3.5 * sd, "tolerance no longer justified by the run count"
    assert a.mu_lb >= TIGHT * mu, f"audit not tight: mu_lb={a.mu_lb:.3f} < {TIGHT}*{mu:.3f}"


def test_audit_paper_calibration_spends_half():
    """calibration="paper": nominal ρ1 = 3, ρ2 = 2 (ρ = 5, μ_nominal = sqrt(10) = 3.162).

    The Proposition's λ = (2γ/n)·sqrt(T/ρ) spends ρ/2 = 2.5 and the accountant must say so:
    μ_spent = sqrt(5) = 2.236 (canary attains 2.191). 2,000 runs per dataset, n_exog = 0.
    Observed μ_lb = 1.938 (256 false positives, 302 false negatives).

    * sound: μ_lb ≤ sqrt(2·ρ_spent) = 2.236 (false failure ≤ 1e-3);
    * tight for what was spent: μ_lb ≥ 0.8·2.236 = 1.789 (same noise as the exact test, so the
      same 3.9-sd margin);
    * with the nominal ρ the audit flags "not tight": μ_lb < 0.8·3.162 = 2.530 — and since
      μ_lb ≤ 2.236 w.p. ≥ 1 − 1e-3, this cannot fail by chance.
    """
    rho1, rho2 = 2 * RHO1, 2 * RHO2
    a = _audit("paper", 0, 202, rho1, rho2)
    mu_nominal = math.sqrt(2.0 * (rho1 + rho2))
    assert a.rho_accountant == pytest.approx((rho1 + rho2) / 2, rel=1e-12)
    np.testing.assert_allclose(a.lambdas_released, claimed_lambdas("paper", rho1, rho2), rtol=1e-12)
    np.testing.assert_allclose(a.mu2, mu_attained(0, rho1 / 2, rho2 / 2) ** 2, rtol=1e-9)

    assert a.mu_lb <= a.mu_accountant, f"privacy violation: mu_lb={a.mu_lb:.3f} > {a.mu_accountant:.3f}"
    assert a.mu_lb >= TIGHT * a.mu_accountant
    assert a.mu_lb < TIGHT * mu_nominal, "the paper's noise should look loose against the nominal rho"


def test_injected_noise_is_standard_normal():
    """The recovered noise (Gₜ − clipped mean on the dataset used)/λ is N(0, 1), KS p > 1e-6.

    Pooled over 2 × 2,000 runs, T = 10 steps and both stages (q·p + p = 8 coordinates a step):
    320,000 draws per calibration, "exact" and "paper" (λ re-derived from the calibration
    formula, not read from the engine). Observed p = 0.86 ("exact"); rescaling the same draws
    by 1.02 or 0.97 gives p < 1e-8, so a noise std off by 2 % is rejected at this size.
    """
    for a in (_audit("exact", 0, 101), _audit("paper", 0, 202, 2 * RHO1, 2 * RHO2)):
        assert a.noise.size == 2 * a.runs * T * (Q * P + P)
        assert stats.kstest(a.noise, "norm").pvalue > 1e-6


@pytest.mark.parametrize("bug", sorted(BROKEN))
def test_audit_catches_broken_mechanisms(bug, monkeypatch):
    """The audit has teeth: deliberately broken engines are caught (μ_lb > sqrt(2ρ_requested)).

    Same design as the exact test (2,000 runs per dataset, ρ1 = 1.5, ρ2 = 1, requested
    μ = sqrt(5) = 2.236):

    * halved_noise (``dpivreg.engine.noise_std`` returns λ/2): true μ = 4.38, observed
      μ_lb = 3.883 (33 false positives, 27 false negatives). The accountant is computed from the noise std actually used, so it reports
      ρ = 10 (μ = 4.47): it is not fooled, the *user's* requested ρ = 2.5 is violated, and the
      audit is still consistent with the accountant (μ_lb ≤ 4.47). The KS test rejects the noise.
    * mean_clipping (``_clipped_mean_outer`` clips the mean's norm, not each row's): the canary
      alone moves the mean by ~M/n, so the sensitivity is ~2γ instead of 2γ/n; D and D′ are
      perfectly separated (0 errors), μ_lb = 5.34 — the largest value 2,000 runs can certify.
      The accountant still claims ρ = 2.5.

    Power: over 20 other seeds each bug was caught 20/20 times, min μ_lb 3.811 (halved; expected
    3.92 ± 0.064, i.e. 26 sd above 2.236) and 5.340 (mean clipping) against the threshold 2.236
    (``python benchmarks/privacy_audit.py --power 20``).
    """
    name, broken = BROKEN[bug]
    monkeypatch.setattr(f"dpivreg.engine.{name}", broken)
    # The engine's own budget check would stop the halved-noise bug before any release; switch it off
    # so that the audit itself is shown to catch it.
    monkeypatch.setattr("dpivreg.engine._check_spent", lambda *args, **kwargs: None)
    a = run_audit("exact", seed=303)
    assert a.mu_lb > a.mu_requested, f"{bug} not caught: mu_lb={a.mu_lb:.3f} <= {a.mu_requested:.3f}"
    if bug == "halved_noise":
        assert a.rho_accountant == pytest.approx(4 * (RHO1 + RHO2), rel=1e-12)
        assert a.mu_lb <= a.mu_accountant
        assert stats.kstest(a.noise, "norm").pvalue < 1e-6
    else:
        assert a.rho_accountant == pytest.approx(RHO1 + RHO2, rel=1e-12)
        assert a.fp == 0 and a.fn == 0
