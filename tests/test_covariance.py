"""The sampling covariances (:mod:`dpivreg.inference.covariance`): formulas, the robust meat's release and its audit.

Reference values: linearmodels' ``IV2SLS(...).fit(cov_type=...)`` (``debiased=False``) on the same design,
and the auditor's own per-row score computation (no code shared with the package).

The audit (module ``dpivreg.inference.covariance``'s second mechanism, :func:`release_score_meat`, at a fixed public
threshold C): n = 50 rows, q = 3 instruments, one endogenous regressor, no exogenous column, β public. The
neighbours share 49 rows and differ in a canary whose score z·u lies far beyond C along e₁ (D) or e₂ (D′),
so that after clipping the upper triangles of their Gram matrices differ by exactly √2·C²/n, the claimed
sensitivity; μ = ‖d‖/σ = sqrt(2ρ). The statistic S = ⟨u − mid, d⟩/σ² is the exact log-likelihood ratio
(N(±μ²/2, μ²)); μ_lb from Clopper–Pearson bounds on the error rates of "D iff S > 0" must not exceed
sqrt(2ρ) (sound) and must reach 0.8·sqrt(2ρ) (tight), and deliberately broken variants must be caught.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from unittest import mock

import numpy as np
import pandas as pd
import pytest
from test_moments_audit import _NumpyWith
from test_privacy_audit import CONF, assert_llr_law, assert_tight, mu_lower_bound

import dpivreg.inference.covariance as covariance
from dpivreg import DPIV2SLS, PrivacyLeakWarning
from dpivreg.compute.backends import InMemoryRows
from dpivreg.privacy.mechanisms import clip_from_histogram, log_grid, seen_bins

N_ROWS, Q = 50, 3
BETA = np.array([0.7])
RHO = 2.5  # μ = sqrt(5), as in the other audits
RUNS = 2000
C = 1.5  # the public threshold of the audited mechanism
FAR = 100.0

assert CONF == 5e-4


# ----------------------------------------------------------------------------------------
# formulas
# ----------------------------------------------------------------------------------------
def test_sandwich_and_homoskedastic_formulas_exact():
    """(Θ̄ᵀΘ̄)⁻¹Θ̄ᵀΩΘ̄(Θ̄ᵀΘ̄)⁻¹/n and σ²(Θ̄ᵀΘ̄)⁻¹/n with Θ̄ = [I_exog | Θ]; Ω = σ²I gives the homoskedastic one."""
    rng = np.random.default_rng(3)
    theta = rng.standard_normal((4, 2))
    A = rng.standard_normal((4, 4))
    omega = A @ A.T
    full = np.column_stack([np.eye(4, 1), theta])
    bread = np.linalg.inv(full.T @ full)
    np.testing.assert_allclose(covariance.robust_covariance(theta, 1, omega, 250),
                               bread @ full.T @ omega @ full @ bread / 250, rtol=1e-12)
    np.testing.assert_allclose(covariance.unadjusted_covariance(theta, 1, 0.3, 250), 0.3 * bread / 250, rtol=1e-12)
    np.testing.assert_allclose(covariance.robust_covariance(theta, 1, 0.3 * np.eye(4), 250),
                               covariance.unadjusted_covariance(theta, 1, 0.3, 250), rtol=1e-12)


@pytest.mark.parametrize("given, name", [("robust", "robust"), ("heteroskedastic", "robust"),
                                         ("unadjusted", "unadjusted"), ("Homoskedastic", "unadjusted")])
def test_cov_type_names_follow_linearmodels(given, name):
    assert covariance.resolve_cov_type(given) == name


@pytest.mark.parametrize("bad, error", [("cluster", ValueError), ("kernel", ValueError), ("hc1", ValueError),
                                        (None, TypeError), (1, TypeError)])
def test_unknown_cov_type_is_a_clear_error(bad, error):
    with pytest.raises(error, match="cov_type"):
        covariance.resolve_cov_type(bad)


def _heteroskedastic_frame(n: int = 3000, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    z1, z2, w = rng.standard_normal(n), rng.standard_normal(n), rng.uniform(0, 2, n)
    v = rng.standard_normal(n)
    u = (0.5 * v + rng.standard_normal(n)) * (0.3 + np.abs(z1))  # error s.d. depends on an instrument
    x = 0.5 + z1 + 0.5 * z2 + 0.3 * w + v
    return pd.DataFrame({"y": 1 + 0.5 * w + 2 * x + u, "x": x, "z1": z1, "z2": z2, "w": w})


@pytest.mark.parametrize("cov_type", ["robust", "unadjusted"])
def test_infinite_budget_equals_linearmodels(cov_type):
    """ρ = ∞: the covariance is linearmodels' of the same cov_type (debiased=False), to 1e-9."""
    from linearmodels import IV2SLS

    frame = _heteroskedastic_frame()
    formula = "y ~ 1 + w + [x ~ z1 + z2]"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        res = DPIV2SLS.from_formula(formula, frame).fit(rho=math.inf, seed=0, cov_type=cov_type)
    reference = IV2SLS.from_formula(formula, frame).fit(cov_type=cov_type)
    names = list(res.params.index)
    np.testing.assert_allclose(res.params, reference.params[names], rtol=1e-9)
    np.testing.assert_allclose(res.cov.to_numpy(), reference.cov.loc[names, names].to_numpy(), rtol=1e-9)
    assert res.cov_type == cov_type
    pd.testing.assert_series_equal(res.std_errors, res.bse)
    pd.testing.assert_series_equal(res.tstats, res.tvalues)
    pd.testing.assert_frame_equal(res.conf_int(level=0.9), res.conf_int(alpha=0.1))


# ----------------------------------------------------------------------------------------
# the score release: exact values
# ----------------------------------------------------------------------------------------
def auditor_scores(Z, X, Y, beta):
    """Per-row scores zᵢ(yᵢ − xᵢᵀβ), row by row (no exogenous columns)."""
    return np.array([z * (y - x @ beta) for z, x, y in zip(Z, X, Y)])


def clipped_score_mean(S, bound):
    """The auditor's (1/n)Σᵢ clip(sᵢ)clip(sᵢ)ᵀ of per-row scores S (n, d), each clipped to L2 norm ``bound`` row by
    row (shared by the meats' audits)."""
    G = np.zeros((S.shape[1], S.shape[1]))
    for s in S:
        norm = float(np.linalg.norm(s))
        c = s * (bound / norm) if norm > bound else s
        G += np.outer(c, c)
    return G / S.shape[0]


def auditor_clipped_gram(Z, X, Y, beta, bound):
    return clipped_score_mean(np.asarray(auditor_scores(Z, X, Y, beta)), bound)


def neighbours(far: bool = True, seed: int = 20261201, off_diagonal: bool = False):
    """(Z, X, Y) of D and D′: 49 shared rows, the canary last with score FAR·e₁ (D) or FAR·e₂ (D′), or with
    ``off_diagonal`` FAR·(e₁ ± e₂)/√2, whose clipped Gram matrices differ in the (1, 2) entry only."""
    rng = np.random.default_rng(seed)
    m = N_ROWS - 1
    Z = rng.standard_normal((m, Q)) * 0.5
    X = Z @ np.array([[0.5], [0.3], [0.1]]) + 0.3 * rng.standard_normal((m, 1))
    Y = X @ BETA + 0.4 * rng.standard_normal(m)
    size = FAR if far else C
    worlds = []
    directions = ((np.eye(Q)[0] + s * np.eye(Q)[1]) / math.sqrt(2) for s in (1, -1)) if off_diagonal else np.eye(Q)[:2]
    for direction in directions:
        z = size * direction
        worlds.append((np.vstack([Z, z]), np.vstack([X, [[0.0]]]), np.append(Y, 1.0)))  # u = 1 for the canary
    return worlds


def rows_of(data):
    Z, X, Y = data
    return InMemoryRows(Z, X, Y, n_threads=1)


def test_score_meat_sensitivity_is_exact_and_attained():
    """√2·C²/n, and the far canaries move the clipped Gram matrix's upper triangle by exactly that."""
    assert covariance.score_meat_sensitivity(C, N_ROWS) == pytest.approx(math.sqrt(2) * C**2 / N_ROWS, rel=1e-15)
    grams = [auditor_clipped_gram(*w, BETA, C) for w in neighbours()]
    iu = np.triu_indices(Q)
    assert np.linalg.norm((grams[0] - grams[1])[iu]) == pytest.approx(math.sqrt(2) * C**2 / N_ROWS, rel=1e-12)
    # and no pair of single rows moves the package's clipped sum more (random rows, scores up to 3C)
    rng = np.random.default_rng(9)
    one = np.zeros((1, 1)), np.ones(1)  # x = 0, y = 1: the score is z
    for _ in range(2000):
        a, b = (v / np.linalg.norm(v) * rng.uniform(0, 3 * C) for v in rng.standard_normal((2, Q)))
        (Ga,), (Gb,) = (covariance.clipped_score_outer_sum(z[None, :], *one, BETA, 0, C) for z in (a, b))
        assert np.linalg.norm((Ga - Gb)[iu]) <= math.sqrt(2) * C**2 * (1 + 1e-12)


@pytest.mark.parametrize("rho", [0.05, 1.0, RHO])
def test_meat_release_record_is_exact(rho):
    """σ = √2·C²/n / sqrt(2ρ), the record's ρ is the requested one, and the noise does not depend on the data."""
    D, D2 = neighbours()
    M, record, sigma = covariance.release_score_meat(rows_of(D), BETA, 0, bound=C, rho=rho,
                                                     rng=np.random.default_rng(5))
    M2, _, _ = covariance.release_score_meat(rows_of(D2), BETA, 0, bound=C, rho=rho, rng=np.random.default_rng(5))
    delta = math.sqrt(2) * C**2 / N_ROWS
    assert sigma == pytest.approx(delta / math.sqrt(2 * rho), rel=1e-15) and record.noise_std == sigma
    assert record.sensitivity == pytest.approx(delta, rel=1e-15) and record.clip == C
    assert record.rho == pytest.approx(rho, rel=1e-12) and record.stage == "rho_inf" and record.steps == 1
    assert np.array_equal(M, M.T)
    np.testing.assert_allclose(M - auditor_clipped_gram(*D, BETA, C), M2 - auditor_clipped_gram(*D2, BETA, C),
                               atol=1e-12)


def test_whole_score_release_spends_its_budget_in_two_exact_records():
    """The histogram gets HISTOGRAM_SHARE of ρ with sensitivity √2 (one histogram), the meat the rest; the
    threshold is the K rule applied to the released histogram (recomputed here from a noise-free release)."""
    D, _ = neighbours(far=False)
    meat, records, bound = covariance.score_meat_release(rows_of(D), BETA, 0, rho=RHO, rng=np.random.default_rng(1))
    histogram, record = records
    assert histogram.sensitivity == pytest.approx(math.sqrt(2), rel=1e-15)
    assert histogram.rho == pytest.approx(covariance.HISTOGRAM_SHARE * RHO, rel=1e-12)
    assert record.rho == pytest.approx((1 - covariance.HISTOGRAM_SHARE) * RHO, rel=1e-12)
    assert histogram.rho + record.rho == pytest.approx(RHO, rel=1e-12)
    assert histogram.stage == record.stage == "rho_inf" and record.clip == bound
    assert bound in log_grid(math.sqrt(Q))
    assert np.all(np.linalg.eigvalsh(meat) >= record.noise_std * (1 - 1e-12))  # projected, floored at σ
    # noise-free: the K rule on the exact counts, and the meat equals the auditor's clipped Gram matrix
    exact, _, exact_bound = covariance.score_meat_release(rows_of(D), BETA, 0, rho=1e30, rng=np.random.default_rng(1))
    norms = np.linalg.norm(auditor_scores(*D, BETA), axis=1)
    edges = log_grid(math.sqrt(Q))
    counts = np.bincount(np.clip(np.searchsorted(edges, norms, side="right") - 1, 0, len(edges) - 2),
                         minlength=len(edges) - 1).astype(float)
    rule = clip_from_histogram(counts, edges, target=covariance.meat_clipped_rows(N_ROWS), sigma=0.0)
    assert exact_bound == edges[list(edges).index(rule) + covariance.MARGIN_BINS]  # one bin of margin
    np.testing.assert_allclose(exact, auditor_clipped_gram(*D, BETA, exact_bound), rtol=1e-9, atol=1e-12)


def test_threshold_is_read_from_the_released_histogram_not_the_counts():
    """Post-processing of the release only: plant a bump in the *noisy* histogram (as noise could) and the
    threshold follows it; a threshold computed from the exact counts would not move."""
    D, _ = neighbours(far=False)
    edges = log_grid(math.sqrt(Q))
    real = covariance.release_histogram_counts
    planted = {}

    def bumped(counts, **kwargs):
        noisy, record, sigma = real(counts, **kwargs)
        noisy = noisy.copy()
        noisy[0, -2] = 1e6  # the second-highest bin, far above the data and the noise
        planted["noisy"], planted["sigma"] = noisy, sigma
        return noisy, record, sigma

    with mock.patch("dpivreg.inference.covariance.release_histogram_counts", bumped):
        _, _, bound = covariance.score_meat_release(rows_of(D), BETA, 0, rho=1e30, rng=np.random.default_rng(1))
    rule = clip_from_histogram(planted["noisy"][0], edges, target=covariance.meat_clipped_rows(N_ROWS),
                               sigma=planted["sigma"], threshold=3.0)
    assert rule == edges[-2]  # the bump's upper edge
    assert bound == edges[-1]  # and one bin above


def test_a_lone_noise_bin_in_the_score_histogram_does_not_set_the_threshold():
    """A lone 3.5σ count in a high bin (what noise alone gives in 0.13% of bins, 5% of 40-bin histograms) is not
    taken for rows: the threshold is the one without it. The rule with one 3σ level (the variant here) follows
    it to the grid's top, which made the meat's C 2⁹–2¹³ in 1% of first-stage meat releases."""
    D, _ = neighbours(far=False)
    real = covariance.release_histogram_counts

    def planted(level):
        def release(counts, **kwargs):
            noisy, record, sigma = real(counts, **kwargs)
            noisy = noisy.copy()
            noisy[0, -2] = level * sigma
            return noisy, record, sigma
        return release

    def bound(level, rule=seen_bins):
        with mock.patch("dpivreg.inference.covariance.release_histogram_counts", planted(level)), \
                mock.patch("dpivreg.privacy.mechanisms.seen_bins", rule):
            return covariance.score_meat_release(rows_of(D), BETA, 0, rho=RHO, rng=np.random.default_rng(4))[2]

    edges = log_grid(math.sqrt(Q))
    clean = bound(0.0)
    assert clean < edges[-3]
    assert bound(3.5) == clean
    assert bound(6.0) == edges[-1]  # beyond the isolated level (3.98σ for 40 bins): rows seen up there
    one_level = lambda counts, sigma, threshold=3.0: counts > threshold * sigma  # noqa: E731
    assert bound(3.5, one_level) == edges[-1]


def test_infinite_budget_meat_is_exact_and_unclipped():
    D, _ = neighbours(far=True)
    meat, records, bound = covariance.score_meat_release(rows_of(D), BETA, 0, rho=math.inf,
                                                         rng=np.random.default_rng(0))
    assert records == () and bound == math.inf
    S = auditor_scores(*D, BETA)
    np.testing.assert_allclose(meat, S.T @ S / N_ROWS, rtol=1e-12)


def test_meat_clipped_rows_exact_values():
    assert covariance.meat_clipped_rows(100) == 1.0 and covariance.meat_clipped_rows(10_000) == 10.0
    assert covariance.meat_clipped_rows(10**7) == 10.0


def test_invisible_histogram_falls_back_to_the_top_edge():
    """With every bin under the noise (n = 50, a tiny budget) the threshold is the grid's top edge, not its
    bottom (which would clip every score to almost nothing and shrink the standard errors)."""
    D, _ = neighbours(far=False)
    _, _, bound = covariance.score_meat_release(rows_of(D), BETA, 0, rho=1e-6, rng=np.random.default_rng(2))
    assert bound == log_grid(math.sqrt(Q))[-1]


# ----------------------------------------------------------------------------------------
# the audit
# ----------------------------------------------------------------------------------------
def _no_score_clipping(S, bound):
    return S.T @ S


VARIANTS = {
    "correct": {},
    "no_score_clipping": {"dpivreg.inference.covariance.ball_moment_sum": _no_score_clipping},
    # Δ = C²/n, an add/remove bound, in the replace-one model: σ √2 too small, the record unchanged
    "add_remove_sensitivity": {"dpivreg.inference.covariance.score_meat_sensitivity":
                               lambda bound, n, terms=1, dim=2: terms * bound**2 / n},
    # only the diagonal noised: invisible to the diagonal canaries, caught by the off-diagonal ones
    "off_diagonal_not_noised": {"dpivreg.privacy.mechanisms.np": _NumpyWith(
        triu=lambda m, k=0: np.diag(np.diag(m)) if k == 0 else np.zeros_like(m))},
}


def audit_meat_release(worlds, means, release, patches: dict, *, dim: int, seed: int, runs: int, sigma: float):
    """The LLR audit of a (dim × dim) meat release between two neighbouring ``worlds`` (data for ``rows_of``)
    whose clipped Gram matrices' upper triangles are ``means``: ``release(rows, rng)`` returns (matrix, record,
    σ) and is run ``runs`` times per world under ``patches``. Returns S (2, runs), μ_lb, the records' ρ and the
    canary's μ."""
    iu = np.triu_indices(dim)
    d, mid = means[0] - means[1], (means[0] + means[1]) / 2.0
    S = np.zeros((2, runs))
    rhos = set()
    with contextlib.ExitStack() as stack:
        for name, value in patches.items():
            stack.enter_context(mock.patch(name, value))
        for w, data in enumerate(worlds):
            rng = np.random.default_rng([seed, w])
            rows = rows_of(data)
            for r in range(runs):
                M, record, _ = release(rows, rng)
                S[w, r] = np.dot(M[iu] - mid, d) / sigma**2
                rhos.add(record.rho)
    fp, fn = int(np.count_nonzero(S[1] > 0)), int(np.count_nonzero(S[0] <= 0))
    return S, mu_lower_bound(fp, fn, runs), rhos, float(np.linalg.norm(d) / sigma)


def assert_sound_and_tight(audit, *, rho: float, runs: int, mu_canary_expected: float) -> None:
    """An audit (:func:`audit_meat_release`'s output) of a correct release at budget ``rho``: the canary's μ is the
    expected one, one ρ recorded, the LLR has its law, and μ_lb lies below sqrt(2ρ) yet close to the canary's μ."""
    S, mu_lb, rhos, mu_canary = audit
    assert mu_canary == pytest.approx(mu_canary_expected, rel=1e-9)
    assert len(rhos) == 1 and rhos.pop() == pytest.approx(rho, rel=1e-12)
    assert_llr_law(S, mu_canary)
    assert mu_lb <= math.sqrt(2 * rho)
    assert_tight(mu_lb, mu_canary, runs)


def run_audit(variant: str, *, seed: int, runs: int = RUNS, off_diagonal: bool = False):
    worlds = neighbours(off_diagonal=off_diagonal)
    means = [auditor_clipped_gram(*w, BETA, C)[np.triu_indices(Q)] for w in worlds]
    return audit_meat_release(
        worlds, means, lambda rows, rng: covariance.release_score_meat(rows, BETA, 0, bound=C, rho=RHO, rng=rng),
        VARIANTS[variant], dim=Q, seed=seed, runs=runs, sigma=math.sqrt(2) * C**2 / N_ROWS / math.sqrt(2 * RHO))


@pytest.mark.parametrize("off_diagonal", [False, True], ids=["diagonal", "off-diagonal"])
def test_meat_audit_is_sound_and_tight(off_diagonal):
    """Diagonal canaries attain the sensitivity (μ = sqrt(2ρ)); off-diagonal ones move one entry by C²/n
    (μ = sqrt(ρ)). Either way μ_lb ≤ sqrt(2ρ), and close to the canary's μ."""
    runs = 3 * RUNS if off_diagonal else RUNS  # the smaller μ needs more runs for the tightness tolerance
    mu = math.sqrt(2 * RHO)
    assert_sound_and_tight(run_audit("correct", seed=41 + off_diagonal, off_diagonal=off_diagonal, runs=runs),
                           rho=RHO, runs=runs, mu_canary_expected=mu / math.sqrt(2) if off_diagonal else mu)


@pytest.mark.parametrize("variant, off_diagonal", [("no_score_clipping", False), ("add_remove_sensitivity", False),
                                                   ("off_diagonal_not_noised", True)])
def test_meat_audit_catches_broken_releases(variant, off_diagonal):
    _, mu_lb, rhos, _ = run_audit(variant, seed=42, off_diagonal=off_diagonal)
    assert len(rhos) == 1 and rhos.pop() == pytest.approx(RHO, rel=1e-12)  # the record still claims the budget ...
    assert mu_lb > math.sqrt(2 * RHO)  # ... but the audit shows more privacy loss


# ----------------------------------------------------------------------------------------
# the fit
# ----------------------------------------------------------------------------------------
BOUNDS = {"y": (-40, 40), "x": (-10, 10), "z1": (-5, 5), "z2": (-5, 5), "w": (0, 2)}


@pytest.mark.parametrize("method", ["auto", "preconditioned", "moments"])
def test_robust_fit_spends_exactly_the_budget_and_records_the_meat(method):
    frame = _heteroskedastic_frame()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        res = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z1 + z2]", frame).fit(
            rho=2.0, seed=4, bounds=BOUNDS, cov_type="robust", method=method)
    assert res.privacy.rho == pytest.approx(2.0, rel=1e-12)
    names = [r.name for r in res.privacy.releases if r.stage == "rho_inf"]
    assert names == ["score-norm histogram for the robust meat's threshold", "robust meat (clipped instrument scores)"]
    assert res.privacy.rho_of("rho_inf") == pytest.approx(2.0 * 0.05 / 1.35, rel=1e-12)  # rho_diag's share too
    assert res.cov_type == "robust" and res.inference.cov_type == "robust"
    text = res.summary().as_text()
    assert "Cov. Estimator:" in text and "robust (sandwich)" in text and "independent rows" in text


def test_robust_standard_errors_track_the_robust_2sls_ones_on_heteroskedastic_data():
    """At a large budget the private SE is the sampling SE: robust matches linearmodels' robust SE (within
    5%; seeds fixed), while the unadjusted private SE matches the unadjusted 2SLS SE, which is 25% too small
    here (the error s.d. grows with the instrument)."""
    from linearmodels import IV2SLS

    frame = _heteroskedastic_frame(n=20_000, seed=7)
    formula = "y ~ 1 + w + [x ~ z1 + z2]"
    model = DPIV2SLS.from_formula(formula, frame)
    bounds = {"y": (-60, 60), "x": (-12, 12), "z1": (-6, 6), "z2": (-6, 6), "w": (0, 2)}
    robust = model.fit(rho=200.0, seed=3, bounds=bounds, cov_type="robust")
    plain = model.fit(rho=200.0, seed=3, bounds=bounds, cov_type="unadjusted")
    reference = {c: IV2SLS.from_formula(formula, frame).fit(cov_type=c).std_errors["x"]
                 for c in ("robust", "unadjusted")}
    assert reference["unadjusted"] < 0.8 * reference["robust"]  # the design is heteroskedastic enough to matter
    assert robust.bse["x"] == pytest.approx(reference["robust"], rel=0.05)
    assert plain.bse["x"] == pytest.approx(reference["unadjusted"], rel=0.05)


def _discrete_frame(n: int = 800, seed: int = 0) -> pd.DataFrame:
    """Tight bounds on few columns (a binary instrument, counts): where the default switches to noisy moments."""
    rng = np.random.default_rng(seed)
    z = rng.integers(0, 2, n).astype(float)
    v = rng.standard_normal(n)
    x = np.clip(np.round(1 + 0.8 * z + v), 0, 4)
    y = np.clip(2 + x + 0.5 * v + rng.standard_normal(n), 0, 8)
    return pd.DataFrame({"y": y, "x": x, "z": z})


def test_default_switch_to_noisy_moments_splits_a_robust_budget_exactly():
    """method="auto" choosing noisy moments: the second moment release gets rho1 + rho2 (not rho_inf, which
    pays for the meat, nor rho_diag, which pays for the diagnostics' meats), and the records sum to the total."""
    res = DPIV2SLS.from_formula("y ~ 1 + [x ~ z]", _discrete_frame()).fit(
        rho=2.0, seed=1, bounds={"y": (0, 8), "x": (0, 4), "z": (0, 1)}, cov_type="robust")
    assert res.estimator == "noisy moments"
    stage = 2.0 / 2.7
    spent = {r.name: r.rho for r in res.privacy.releases}
    assert spent["second moments of the bounded columns (box), second release"] == pytest.approx(2 * stage, rel=1e-12)
    assert res.privacy.rho_of("rho_inf") == pytest.approx(0.1 * stage, rel=1e-12)
    assert res.privacy.rho == pytest.approx(2.0, rel=1e-12)
    assert res.privacy.rho_of("rho_diag") == pytest.approx(0.1 * stage, rel=1e-12)
    assert sum(res.privacy.target[name] for name in ("rho0", "rho_clip", "rho_inf", "rho_diag")) == \
        pytest.approx(2.0, rel=1e-12)


@pytest.mark.parametrize("budget", [{"rho": math.inf}, {"rho1": 1.0, "rho2": 1.0, "rho_inf": math.inf}],
                         ids=["all-infinite", "meat-infinite"])
def test_noisy_moments_with_an_infinite_meat_budget(budget):
    """The robust meat computed exactly (a leak, said so) and the moment release with the rest of the budget."""
    from linearmodels import IV2SLS

    frame = _heteroskedastic_frame()
    formula = "y ~ 1 + w + [x ~ z1 + z2]"
    with pytest.warns(PrivacyLeakWarning, match="robust meat"):
        res = DPIV2SLS.from_formula(formula, frame).fit(**budget, seed=0, bounds=BOUNDS, method="moments",
                                                          cov_type="robust")
    if "rho" in budget:
        reference = IV2SLS.from_formula(formula, frame).fit(cov_type="robust")
        np.testing.assert_allclose(res.cov.to_numpy(), reference.cov.loc[res.params.index, res.params.index], rtol=1e-9)
    else:
        assert res.privacy.rho0 == pytest.approx(1.0 + 1.0 + 0.4 + 0.1, rel=1e-12)
    assert res.privacy.rho == math.inf


@pytest.mark.parametrize("method", ["preconditioned", "moments"])
def test_the_meat_is_taken_at_the_released_estimate(method):
    """The scores use the released β̃ (working scale), never a non-private one."""
    seen = {}
    real = covariance.release_meats

    def spy(rows, requests, **kwargs):
        seen["beta"] = np.array(requests[0].args[0])  # the structural scores' request comes first
        assert requests[0].scores is covariance.structural_scores
        return real(rows, requests, **kwargs)

    with mock.patch("dpivreg.inference.private.release_meats", spy):
        res = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z1 + z2]", _heteroskedastic_frame()).fit(
            rho=2.0, seed=4, bounds=BOUNDS, cov_type="robust", method=method)
    np.testing.assert_array_equal(seen["beta"], res.engine_path.beta_final)


def test_a_meat_budget_too_small_to_see_any_bin_warns_and_the_caution_travels():
    frame = _heteroskedastic_frame(n=500)
    with pytest.warns(UserWarning, match="robust meat's histogram showed no bin"):
        res = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z1 + z2]", frame).fit(
            rho1=1.0, rho2=1.0, rho_inf=1e-7, seed=0, bounds=BOUNDS, cov_type="robust")
    # the very wide standard errors are qualified wherever they go, not only in the fit-time warning
    caution = [c for c in res.cautions if c.startswith("CAUTION: The robust meat's histogram showed no bin")]
    assert len(caution) == 1
    assert caution[0] in res.to_markdown() and caution[0] in res.release().to_json()
    assert caution[0] in " ".join(res.summary().as_text().split())  # the summary's notes carry it too


@pytest.mark.parametrize("n_exog, p_endog", [(0, 1), (2, 1), (1, 3)])
def test_score_norm_histograms_numba_equals_numpy(n_exog, p_endog):
    """The meat releases' score-norm counts binned by the clipping release's compiled loop equal numpy's, row for
    row (the robust meat's ‖z̃‖·abs(ũ) and the first stage's ‖z̃‖·‖v̂‖), with a zero row, rows beyond the grid and
    residuals whose square overflows (the robust meat's norm takes abs(ũ), not √ũ²)."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(n_exog + p_endog)
    n, q = 9000, n_exog + p_endog + 2
    Z = rng.standard_normal((n, q))
    Z[:, :n_exog] = 1.0
    X_endog, Y = rng.standard_normal((n, p_endog)), rng.standard_normal(n)
    Z[0], X_endog[0], Y[0] = 0.0, 0.0, 0.0
    Y[1:3] = [1e6, 1e300]
    Z[3], X_endog[3], Y[3] = 1e-160, 0.0, 1e160  # a score norm of 1 from a tiny z and a residual whose square overflows
    Z[4], X_endog[4], Y[4] = 0.0, 0.0, 1e200  # zero z, huge residual: norm 0
    beta, theta = rng.standard_normal(n_exog + p_endog), rng.standard_normal((q, p_endog))
    edges = covariance.score_edges(q)
    for counts, args in ((covariance.score_norm_counts, (beta, n_exog, edges)),
                         (covariance.first_stage_score_counts, (theta, edges))):
        (numpy_counts,), (numba_counts,) = (counts(Z, X_endog, Y, *args, kernel) for kernel in ("numpy", "numba"))
        np.testing.assert_array_equal(numba_counts, numpy_counts)
        assert numpy_counts.sum() == n and numpy_counts[0] >= 1
    assert covariance.score_norm_counts(Z, X_endog, Y, beta, n_exog, edges, "numpy")[0][-1] >= 2
