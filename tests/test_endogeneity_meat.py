"""The robust endogeneity test's meat (a share of ``fit(rho_diag=...)``;
:func:`dpivreg.inference.covariance.endogeneity_meat_release`): its exact sensitivity, its audit, and what the fit
records.

The scores are sᵢ = rᵢeᵢ with rᵢ = Rᵀwᵢ, eᵢ = bᵀwᵢ for public maps R, b of the working row wᵢ = [zᵢ, xᵢ, yᵢ]. The
auditor computes them row by row (no code shared with the package).

The audit (the meat's Gaussian mechanism :func:`dpivreg.inference.covariance.release_endogeneity_meat` at a fixed
public threshold C): n = 50 rows, q = 2 instruments, two endogenous regressors (so the scores have two coordinates
and the replace-one sensitivity √2·C²/n is attained). The neighbours share 49 rows and differ in a canary whose
score lies far beyond C along e₁ (D) or e₂ (D′), so that after clipping the upper triangles differ by exactly
√2·C²/n; μ = sqrt(2ρ). S = ⟨u − mid, d⟩/σ² is the exact log-likelihood ratio; μ_lb from Clopper–Pearson bounds on
"D iff S > 0" must not exceed sqrt(2ρ) and must reach 0.8·sqrt(2ρ), and deliberately broken variants must be
caught. With one endogenous regressor the score is a scalar and the sensitivity is C²/n (s² ∈ [0, C²]), attained by
s = C against s′ = 0.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from test_covariance import VARIANTS as SCORE_VARIANTS
from test_covariance import assert_sound_and_tight, audit_meat_release, clipped_score_mean
from test_privacy_audit import CONF

import dpivreg.inference.covariance as covariance
from dpivreg import DPIV2SLS, PrivacyLeakWarning
from dpivreg.compute.backends import InMemoryRows

N_ROWS, Q, P = 50, 2, 2
# rᵢ = xᵢ − 0.3·zᵢ₁ (two coordinates, one per endogenous regressor), eᵢ = yᵢ: columns of w = [z1, z2, x1, x2, y]
R_MAP = np.array([[-0.3, 0.0], [0.0, -0.3], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
B_MAP = np.array([0.0, 0.0, 0.0, 0.0, 1.0])
RHO = 2.5  # μ = sqrt(5), as in the other audits
RUNS = 2000
C = 1.5
FAR = 100.0

assert CONF == 5e-4


def auditor_scores(Z, X, Y, R=R_MAP, b=B_MAP):
    """sᵢ = (Rᵀwᵢ)(bᵀwᵢ), wᵢ = [zᵢ, xᵢ, yᵢ], row by row."""
    return np.array([(R.T @ w) * (b @ w) for w in np.column_stack([Z, X, Y])])


def auditor_clipped_gram(Z, X, Y, bound, R=R_MAP, b=B_MAP):
    return clipped_score_mean(auditor_scores(Z, X, Y, R, b), bound)


def neighbours(seed: int = 20261205):
    """(Z, X, Y) of D and D′: 49 shared rows, the canary last with r = FAR·e₁ (D) or FAR·e₂ (D′) and e = 1."""
    rng = np.random.default_rng(seed)
    m = N_ROWS - 1
    Z = rng.standard_normal((m, Q)) * 0.5
    X = Z @ np.array([[0.5, 0.1], [0.2, 0.6]]) + 0.3 * rng.standard_normal((m, P))
    Y = 0.2 * X[:, 0] + 0.4 * rng.standard_normal(m)
    worlds = []
    for direction in np.eye(P):
        z = np.zeros(Q)
        worlds.append((np.vstack([Z, z]), np.vstack([X, FAR * direction]), np.append(Y, 1.0)))
    return worlds


def rows_of(data):
    return InMemoryRows(*data, n_threads=1)


def test_sensitivity_is_attained_by_the_canaries():
    """The audit's premise (auditor code only): its canaries move the clipped meat by exactly the claimed √2·C²/n."""
    grams = [auditor_clipped_gram(*world, C) for world in neighbours()]
    iu = np.triu_indices(P)
    assert np.linalg.norm((grams[0] - grams[1])[iu]) == pytest.approx(math.sqrt(2) * C**2 / N_ROWS, rel=1e-12)


def test_a_scalar_score_has_sensitivity_c_squared_over_n():
    """One endogenous regressor: the meat is one entry (1/n)Σᵢ clip(sᵢ)², which a neighbour moves by at most C²/n,
    attained by s = C·FAR (clipped to C) against s′ = 0. The record says C²/n, not √2·C²/n."""
    D, _ = neighbours()
    R1, b1 = np.array([[0.0], [0.0], [1.0], [0.0], [0.0]]), B_MAP  # r = x1, e = y
    Z, X, Y = D
    X0 = X.copy()
    X0[-1] = 0.0  # the neighbour's canary has r = 0
    exact = [auditor_clipped_gram(Z, XX, Y, C, R1, b1)[0, 0] for XX in (X, X0)]
    assert exact[0] - exact[1] == pytest.approx(C**2 / N_ROWS, rel=1e-12)
    _, record, sigma = covariance.release_endogeneity_meat(rows_of(D), R1, b1, bound=C, rho=1.0,
                                                           rng=np.random.default_rng(0))
    assert record.sensitivity == pytest.approx(C**2 / N_ROWS, rel=1e-15)
    assert sigma == pytest.approx(C**2 / N_ROWS / math.sqrt(2.0), rel=1e-15)


@pytest.mark.parametrize("rho", [0.05, 1.0, RHO])
def test_release_record_is_exact(rho):
    """σ = √2·C²/n / sqrt(2ρ), stage ``rho_diag``, and the package's clipped sum is the auditor's."""
    D, D2 = neighbours()
    M, record, sigma = covariance.release_endogeneity_meat(rows_of(D), R_MAP, B_MAP, bound=C, rho=rho,
                                                           rng=np.random.default_rng(5))
    M2, _, _ = covariance.release_endogeneity_meat(rows_of(D2), R_MAP, B_MAP, bound=C, rho=rho,
                                                   rng=np.random.default_rng(5))
    delta = math.sqrt(2) * C**2 / N_ROWS
    assert sigma == pytest.approx(delta / math.sqrt(2 * rho), rel=1e-15) and record.noise_std == sigma
    assert record.sensitivity == pytest.approx(delta, rel=1e-15) and record.clip == C
    assert record.rho == pytest.approx(rho, rel=1e-12) and record.stage == "rho_diag" and record.steps == 1
    assert record.name == "endogeneity-test meat (clipped endogeneity scores)"
    np.testing.assert_allclose(M - auditor_clipped_gram(*D, C), M2 - auditor_clipped_gram(*D2, C), atol=1e-12)


def test_whole_release_two_records_and_the_exact_meat():
    """Histogram (HISTOGRAM_SHARE of ρ, sensitivity √2) then the meat; with ρ = inf the meat is (1/n)Σᵢ sᵢsᵢᵀ."""
    D, _ = neighbours()
    meat = covariance.endogeneity_meat_release(rows_of(D), R_MAP, B_MAP, rho=RHO, rng=np.random.default_rng(1))
    histogram, record = meat.releases
    assert histogram.sensitivity == pytest.approx(math.sqrt(2), rel=1e-15)
    assert histogram.rho + record.rho == pytest.approx(RHO, rel=1e-12)
    assert histogram.stage == record.stage == "rho_diag" and meat.bound == record.clip
    assert np.all(np.linalg.eigvalsh(meat.matrix) >= meat.sigma * (1 - 1e-12))
    exact = covariance.endogeneity_meat_release(rows_of(D), R_MAP, B_MAP, rho=math.inf, rng=np.random.default_rng(1))
    S = auditor_scores(*D)
    np.testing.assert_allclose(exact.matrix, S.T @ S / N_ROWS, rtol=1e-12)
    assert exact.releases == () and exact.sigma == 0.0


VARIANTS = {name: SCORE_VARIANTS[name] for name in ("correct", "no_score_clipping", "add_remove_sensitivity")}
# the scalar meat's own broken variant: the d = 1 sensitivity halved (C²/(2n)), the record unchanged
VARIANTS["half_scalar_sensitivity"] = {"dpivreg.inference.covariance.score_meat_sensitivity":
                                       lambda bound, n, terms=1, dim=2: terms * bound**2 / n / 2.0}
R_SCALAR = np.array([[0.0], [0.0], [1.0], [0.0], [0.0]])  # r = x1, e = y: one coordinate


def scalar_neighbours():
    """D: the canary's r = FAR (its score clipped to C); D′: r = 0 (score 0). The meats differ by C²/n."""
    D, _ = neighbours()
    Z, X, Y = D
    X0 = X.copy()
    X0[-1] = 0.0
    return [(Z, X, Y), (Z, X0, Y)]


def run_audit(variant: str, *, seed: int, runs: int = RUNS, scalar: bool = False):
    worlds, R, dim = (scalar_neighbours(), R_SCALAR, 1) if scalar else (neighbours(), R_MAP, P)
    means = [auditor_clipped_gram(*world, C, R, B_MAP)[np.triu_indices(dim)] for world in worlds]
    delta = (1.0 if scalar else math.sqrt(2)) * C**2 / N_ROWS
    return audit_meat_release(
        worlds, means,
        lambda rows, rng: covariance.release_endogeneity_meat(rows, R, B_MAP, bound=C, rho=RHO, rng=rng),
        VARIANTS[variant], dim=dim, seed=seed, runs=runs, sigma=delta / math.sqrt(2 * RHO))


@pytest.mark.parametrize("scalar", [False, True], ids=["two coordinates", "one coordinate"])
def test_audit_is_sound_and_tight(scalar):
    """Both claims are attained: √2·C²/n with two coordinates, C²/n with one (μ = sqrt(2ρ) either way)."""
    assert_sound_and_tight(run_audit("correct", seed=61 + 2 * scalar, scalar=scalar), rho=RHO, runs=RUNS,
                           mu_canary_expected=math.sqrt(2 * RHO))


@pytest.mark.parametrize(("variant", "scalar"), [("no_score_clipping", False), ("add_remove_sensitivity", False),
                                                ("no_score_clipping", True), ("half_scalar_sensitivity", True)])
def test_audit_catches_broken_releases(variant, scalar):
    _, mu_lb, rhos, _ = run_audit(variant, seed=62 + 2 * scalar, scalar=scalar)
    assert len(rhos) == 1 and rhos.pop() == pytest.approx(RHO, rel=1e-12)
    assert mu_lb > math.sqrt(2 * RHO)


# ----------------------------------------------------------------------------------------
# the fit
# ----------------------------------------------------------------------------------------


def _frame(n: int = 2000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    z1, z2, w, v, e = rng.standard_normal((5, n))
    x = 0.4 * z1 + 0.3 * z2 + 0.2 * w + v
    return pd.DataFrame({"y": 1 + x + 0.5 * w + e * (1 + np.abs(z1)) + 0.5 * v, "x": x, "w": w, "z1": z1, "z2": z2})


def test_infinite_rho_diag_names_both_meats_as_leaks_and_records():
    frame = _frame()
    with pytest.warns(PrivacyLeakWarning) as caught, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the small frame's unreliable-intervals note
        warnings.simplefilter("always", PrivacyLeakWarning)
        res = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z1 + z2]", frame).fit(
            rho1=1.0, rho2=1.0, rho_diag=math.inf, seed=0, bounds={c: (-12.0, 12.0) for c in frame.columns})
    messages = " ".join(str(w.message) for w in caught)
    assert "first stage's meat was computed without noise" in messages
    assert "endogeneity test's meat was computed without noise" in messages
    assert sum(r.stage == "rho_diag" for r in res.privacy.releases) == 2 and not res.privacy.is_private


@pytest.mark.parametrize("method", ["auto", "moments"])
def test_the_fit_releases_at_the_maps_of_its_released_moments(monkeypatch, method):
    """The maps R, b the meat is released at are those of the released moments the results hold (post-processing;
    recomputed from the results' Gram matrix, they agree exactly), on the DP-2S-GD route and on noisy moments."""
    from dpivreg.inference import iv_tests
    from dpivreg.inference.diagnostics import released_gram

    seen = {}
    original = covariance.release_meats

    def spy(rows, requests, **kw):
        seen.update({request.what: request.args for request in requests})
        return original(rows, requests, **kw)

    monkeypatch.setattr("dpivreg.inference.private.release_meats", spy)
    monkeypatch.setattr("dpivreg.model.release_meats", spy)
    frame = _frame()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        res = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z1 + z2]", frame).fit(
            rho=2.0, rho_diag=0.2, seed=1, bounds={c: (-12.0, 12.0) for c in frame.columns}, method=method)
    R, b = iv_tests.endogeneity_score_map(released_gram(res.scale.moments), 4, 2, 1)
    maps = seen["the endogeneity test's meat"]
    np.testing.assert_array_equal(maps[0], R[1:])
    np.testing.assert_array_equal(maps[1], b[1:])
    assert res.wooldridge_score.df == 1 and 0 < res.wooldridge_score.pval <= 1
