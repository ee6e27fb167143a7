"""Empirical privacy audit of the missing-value route at the data frame (``missing="fill"``).

The neighbours are two *frames*: D holds a canary row at one corner of the bounds, D′ the same frame with
the canary's every value missing, which ``missing="fill"`` fills with public values at the opposite
corner. The audited output is what the default fit publishes first: the number of rows of the design
and the ``rho0`` moment release of :func:`dpivreg.estimation.working_scale.working_scale`. The auditor

* guesses D′ whenever the published ``nobs`` differs from D's (with ``missing="fill"`` it never does);
* otherwise forms the exact log-likelihood ratio S = ⟨u − mid, d⟩/σ² of the released upper triangle u
  (constant's entry excluded, it is not noised) with d, mid the difference and midpoint of the clean
  moment matrices, which it computes itself from the clipped, box-scaled rows (no package code).

With the canary's [1, v] = (1, 1, 1, 1) against (1, 1, −1, −1), half of the four coordinates flip on the
box, where the release's sensitivity D/n is attained; so the canary's μ is sqrt(2ρ) and the audit is
tight (as in ``test_moments_audit``). A broken variant that drops the filled row instead (``missing``
ignored, i.e. the default "drop") publishes nobs = n − 1 for D′ and is caught with certainty.
"""

from __future__ import annotations

import math
import warnings
from unittest import mock

import numpy as np
import pandas as pd
import pytest
from test_privacy_audit import CONF, assert_llr_law, assert_tight, mu_lower_bound

import dpivreg.data.design as design_module
from dpivreg.data.design import design_from_formula
from dpivreg.estimation.working_scale import working_scale

N_ROWS = 50
RHO = 2.5  # μ = sqrt(5), as in the other audits
RUNS = 2000
FORMULA = "y ~ 1 + [x ~ z]"
BOUNDS = {"y": (-2.0, 2.0), "x": (-1.0, 3.0), "z": (0.0, 1.0)}
FILL = {"y": 2.0, "x": -1.0, "z": 0.0}  # the filled canary is [1, v] = (1, 1, −1, −1)

#: The release's column order, [exog, instruments, endog, dependent] without the constant (documented in
#: dpivreg.estimation.working_scale.free_columns): public metadata, not a computation.
ORDER = ("z", "x", "y")

assert CONF == 5e-4


def frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    """D (canary at the upper corner, last row) and D′ (the canary's values missing)."""
    rng = np.random.default_rng(20261202)
    shared = {c: rng.uniform(lo, hi, N_ROWS - 1) for c, (lo, hi) in BOUNDS.items()}
    with_canary = pd.DataFrame({c: np.append(v, BOUNDS[c][1]) for c, v in shared.items()})
    without = with_canary.copy()
    without.iloc[-1] = np.nan
    return with_canary, without


def clean_moments(frame: pd.DataFrame) -> np.ndarray:
    """[1, v]ᵀ[1, v]/n with v the columns (z, x, y) clipped to the bounds and mapped to [−1, 1] by their
    midpoints and half-ranges; missing values take the public fill values (re-derived, not package code)."""
    v = np.column_stack([
        (np.clip(frame[c].fillna(FILL[c]).to_numpy(), lo, hi) - (lo + hi) / 2) / ((hi - lo) / 2)
        for c, (lo, hi) in ((c, BOUNDS[c]) for c in ORDER)])
    w = np.column_stack([np.ones(len(v)), v])
    return w.T @ w / len(v)


def releases(frame: pd.DataFrame, seed: int) -> tuple[np.ndarray, float, list[int]]:
    """RUNS releases (upper triangles without the constant's entry), their σ, and the published nobs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        design = design_from_formula(FORMULA, frame, missing="fill", fill_values=FILL)
    rng = np.random.default_rng(seed)
    iu = np.triu_indices(4)
    keep = [k for k, (i, j) in enumerate(zip(*iu)) if (i, j) != (0, 0)]
    out, sigma = [], None
    for _ in range(RUNS):
        scale = working_scale(design, BOUNDS, route="private", rho0=RHO, rng=rng)
        out.append(scale.moments.matrix[iu][keep])
        sigma = scale.moments.sigma
    return np.array(out), float(sigma), [design.nobs] * RUNS


def audit(nobs_of: dict, u: dict, sigma: float) -> float:
    """μ_lb of the auditor of the module docstring."""
    D, D_ = frames()
    iu = np.triu_indices(4)
    keep = [k for k, (i, j) in enumerate(zip(*iu)) if (i, j) != (0, 0)]
    g, g_ = clean_moments(D)[iu][keep], clean_moments(D_)[iu][keep]
    d, mid = g - g_, (g + g_) / 2
    S = {w: (u[w] - mid) @ d / sigma**2 if u[w] is not None else None for w in u}
    # nobs first: a published row count that differs from D's says D′; then the likelihood ratio
    guess_d = {w: (np.array(nobs_of[w]) == N_ROWS) & (S[w] > 0 if S[w] is not None else True) for w in u}
    fp = int(np.sum(guess_d["D'"]))  # said D under D′
    fn = int(np.sum(~guess_d["D"]))  # said D′ under D
    return mu_lower_bound(fp, fn, RUNS), S


@pytest.fixture(scope="module")
def fill_route():
    D, D_ = frames()
    (uD, sigma, nD), (uD_, _, nD_) = releases(D, 1), releases(D_, 2)
    return {"D": nD, "D'": nD_}, {"D": uD, "D'": uD_}, sigma


def test_fill_keeps_the_neighbours_at_one_replaced_row(fill_route):
    nobs, _, _ = fill_route
    assert nobs["D"][0] == nobs["D'"][0] == N_ROWS


def test_the_sensitivity_is_attained_exactly():
    D, D_ = frames()
    iu = np.triu_indices(4)
    diff = (clean_moments(D) - clean_moments(D_))[iu]
    assert np.linalg.norm(diff) == pytest.approx(4.0 / N_ROWS, rel=1e-12)  # D/n with D = 4 columns of [1, v]


def test_the_fill_route_is_private_and_the_audit_is_tight(fill_route):
    nobs, u, sigma = fill_route
    mu = math.sqrt(2 * RHO)
    assert sigma == pytest.approx((4.0 / N_ROWS) / math.sqrt(2 * RHO), rel=1e-12)
    mu_lb, S = audit(nobs, u, sigma)
    assert_llr_law(np.array([S["D"], S["D'"]]), mu)
    assert mu_lb <= mu
    assert_tight(mu_lb, mu, RUNS)


def test_the_audit_catches_dropping_the_filled_row():
    """The broken variant ignores the fill (the missing row is then dropped): nobs tells D′ apart."""
    D, D_ = frames()
    untouched = lambda formula, data, parts, policy: (formula, data, parts, [])  # noqa: E731
    with mock.patch.object(design_module, "apply_missing_policy", untouched):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            broken = {w: design_from_formula(FORMULA, data, missing="fill", fill_values=FILL)
                      for w, data in (("D", D), ("D'", D_))}
    nobs = {w: [design.nobs] * RUNS for w, design in broken.items()}  # what the broken variant publishes
    mu_lb, _ = audit(nobs, {"D": None, "D'": None}, 1.0)
    assert broken["D"].nobs == N_ROWS and broken["D'"].nobs == N_ROWS - 1
    assert mu_lb > math.sqrt(2 * RHO)
