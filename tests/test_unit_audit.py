"""Empirical privacy audit with worst-case *unit* neighbours (``fit(privacy_unit=...)``, :mod:`dpivreg.privacy.units`).

The privacy model
-----------------
Neighbouring data sets replace ALL rows of one privacy unit by the rows of any other unit (after truncation to
m = ``max_rows_per_unit`` rows); the number of units N is public, the row count is not. The releases audited here
claim, for that model:

* the gradient steps of DP-2S-GD (``InMemoryRows(..., groups=RowGroups(unit_starts, …), n=n̂)`` and
  :func:`dpivreg.estimation.engine.run_on_rows`): each unit's rows are summed and the *unit's* gradient is clipped to γ, so
  the released mean (1/n̂)·Σᵤ CLIP_γ(Σ_{i∈u} gᵢ) has sensitivity 2γ/n̂ (n̂ public; in a fit N·k̂ from the moment
  release) and the noise λ = (γ/n̂)·sqrt(2T/ρ) spends ρ;
* the moment release of the working scale (:func:`dpivreg.estimation.working_scale.working_scale` with the units of
  :func:`dpivreg.data.unit_ids.resolve_units`, i.e. :func:`dpivreg.estimation.working_scale.moments_from_sum` with ``max_rows = m`` on
  the truncated rows' per-unit sum): units truncated to m rows, then the upper triangle of Σ [1, v][1, v]ᵀ/N with
  sensitivity m·D/N (D columns of [1, v], every entry in [−1, 1]), divided afterwards by its constant's entry k̂
  (post-processing), which also gives the normaliser n̂ = N·k̂;
* the clustered meat at a given threshold C (:func:`dpivreg.inference.covariance.release_score_meat` with
  ``clustered=True``, the clusters being the units): each cluster's summed score g_c = Σ_{i∈c} z̃ᵢũᵢ is clipped to
  L2 norm C, and the upper triangle of (1/n̂)Σ_c clip(g_c)clip(g_c)ᵀ has sensitivity √2·C²/n̂ (one cluster changes).

The audit (as in ``test_privacy_audit.py``)
-------------------------------------------
D and D′ share N − 1 ordinary units (1 to m rows each, drawn once) and differ in one *canary unit* of several
rows, placed at the claimed worst case:

* gradients: the canary unit has 4 rows in D and 2 in D′ (the row count may differ between neighbours), with
  x_endog = y = ±M (M = 10⁸; D: +, D′: −) and instruments whose sums over the unit point the same way in both
  worlds (Σz = (4, 2, 2) and (2, 1, 1)). Its *summed* gradients in both stages are clipped and flipped, so at
  every step and stage the two worlds' clipped means differ by exactly 2γ/n̂; with an exogenous intercept
  (n_exog = 1) x̂ ≠ 0 already at t = 0 and all 2T Gaussian steps are attained: μ = sqrt(2(ρ1 + ρ2)).
* moments: the canary unit holds 12 rows at the corner [1, v] = (1, 1, 1, 1) in D and 8 rows at
  (1, 1, −1, −1) in D′, both truncated to m = 4: the per-unit sums differ by 4·(aaᵀ − bbᵀ), whose upper
  triangle has norm m·D = 16 (half of the D = 4 coordinates flipped, the box's worst case).
* clustered meat: the canary cluster (unit) has 4 rows; its summed score is ≈ 4M·e₁ in D and ≈ 4M·e₂ in D′ (rows
  z = (1, ±1, 0) with residuals ±M cancel in the intercept's coordinate), clipped to C·e₁ vs C·e₂:
  ‖triu(C²(e₁e₁ᵀ − e₂e₂ᵀ))‖ = √2·C².

With its own code (explicit per-row gradients and scores, its own grouping, sums and clipping; nothing shared
with the package) the auditor computes, for each release (and for the gradients at every released iterate), both
worlds' exact means, their difference d and midpoint mid, and forms S = Σ⟨u − mid, d⟩/σ², the exact
log-likelihood ratio of the claimed mechanism: N(+μ²/2, μ²) under D and N(−μ²/2, μ²) under D′ (checked: KS,
mean, sd). Guess "D" iff S > 0; one-sided Clopper–Pearson bounds at 1 − 5e-4 on both error rates give, w.p.
≥ 1 − 1e-3, μ_lb = Φ⁻¹(1 − FPR_ub) − Φ⁻¹(FNR_ub) ≤ true μ. Each audit must have μ_lb ≤ the claimed μ and, as the
canaries attain the claim, μ_lb ≥ 0.8·μ (tightness, the tolerance justified by the run count as in
``test_privacy_audit.assert_tight``).

The white-box parts (checked exactly, not statistically): the grouped row source's clipped means equal a
unit-by-unit reference loop for both kernels, with group clipping and a whitening, also when a unit's summed
gradient overflows float64 (the overflow-safe kernel); the end-to-end moment release (``resolve_units`` then
``working_scale``) is bit for bit ``moments_from_sum`` on the auditor's truncated per-unit sum, so its statistical
audit runs on that function (about 20 µs a release instead of 6 ms).

Broken variants (the audit's teeth), each leaving every release record at the claimed ρ:

* rows clipped instead of units: the per-row kernel :func:`dpivreg.compute.kernels.block_sums` in place of
  :func:`dpivreg.compute.kernels.unit_block_sums` (what a row-level engine does with a unit-level accountant);
* truncation skipped: the canary units keep all their rows while the release still claims m rows per unit;
* rows clipped instead of clusters in the clustered meat.

A broken mechanism also moves the ordinary units' contribution, equally in both worlds; that shifts S and can
put both worlds on the same side of the claimed threshold 0 (it does for the two clipping bugs). The broken
variants are therefore also judged by :func:`held_out_bound`, the same S with a threshold fitted on half of the
runs and the errors counted on the other half (valid whatever the mechanism); for the correct mechanisms it must
stay below the claim as well.

ρ = 2.5 everywhere (μ = sqrt(5) = 2.236, as in the other audits), 2,000 runs per dataset. The whole file takes
about 25 s on two cores (the two DP-2S-GD audits of 4,000 paths each are most of it).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from unittest import mock

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from test_privacy_audit import CONF, add_step_llr, assert_llr_law, assert_tight, mu_lower_bound

import dpivreg.compute.backends as backends
import dpivreg.estimation.engine as engine
from dpivreg import PrivacyLeakWarning
from dpivreg.compute.backends import InMemoryRows
from dpivreg.compute.kernels import block_sums, numba_available
from dpivreg.data.design import design_from_formula
from dpivreg.data.unit_ids import resolve_units
from dpivreg.estimation.working_scale import moments_from_sum, working_scale
from dpivreg.inference.covariance import release_score_meat
from dpivreg.privacy.rounding import ball_rounding, box_rounding, gradient_rounding
from dpivreg.privacy.units import MAX_MAX_ROWS, RowGroups

# ----------------------------------------------------------------------------------------
# design (public, fixed in advance)
# ----------------------------------------------------------------------------------------
N_UNITS = 40  # N, including the canary unit (public)
M_ROWS = 4  # max_rows_per_unit = m (public); the ordinary units have 1 … m rows
N_HAT = 100.0  # the public normaliser n̂ handed to the row source (a fit takes N·k̂ from its moment release)
Q, P, K = 3, 2, 1  # instruments (intercept first), regressors, exogenous (the intercept)
T = 5  # iterations
CLIP1, CLIP2 = 1.0, 2.0  # different on purpose: a clip1/clip2 mix-up shows up
RHO1, RHO2 = 1.5, 1.0  # ρ = 2.5, μ = sqrt(5)
ETA, ALPHA = 0.5, 0.5
CANARY = 1e8  # canary magnitude: the canary unit's summed gradients are always clipped
FAR = 1e300  # a canary whose summed gradient's norm overflows float64 (the overflow-safe kernel)
THETA_TRUE = np.array([[0.2], [0.8], [-0.3]])
BETA_TRUE = np.array([0.4, 1.1])
#: The canary unit's instruments in D (4 rows) and D′ (2 rows): Σz = (4, 2, 2) and (2, 1, 1), the same direction.
CANARY_Z = (np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]),
            np.array([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))
RHO = 2.5  # the moment and meat releases' budget: μ = sqrt(5)
RUNS = 2000  # runs per dataset
TINY = np.finfo(float).tiny

assert CONF == 5e-4  # the docstrings' numbers assume the DP-2S-GD audit's confidence level


@dataclass(frozen=True)
class World:
    """One dataset: rows grouped into units (consecutive), and per row the scale s the auditor divides the row's
    residuals by before summing (1, or the canary's magnitude: its sums are formed without overflow)."""

    Z: np.ndarray
    X_endog: np.ndarray
    Y: np.ndarray
    starts: np.ndarray  # unit offsets, last = rows
    scale: np.ndarray  # (rows,)

    def rows(self, **kwargs) -> InMemoryRows:
        n_rows = int(self.starts[-1])
        groups = RowGroups(self.starts, kwargs.pop("cluster_starts", None), n_rows)
        return InMemoryRows(self.Z, self.X_endog, self.Y, groups=groups, n=N_HAT, n_units=N_UNITS,
                            max_rows=M_ROWS, **kwargs)


def ordinary_units(seed: int = 20260601):
    """N − 1 ordinary units of 1 … m rows from an IV model with an intercept: (Z, X_endog, Y, sizes)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, M_ROWS + 1, N_UNITS - 1)
    n = int(sizes.sum())
    Z = np.column_stack([np.ones(n), rng.standard_normal((n, Q - 1))])
    X_endog = Z @ THETA_TRUE + 0.5 * rng.standard_normal((n, 1))
    Y = BETA_TRUE[0] + BETA_TRUE[1] * X_endog[:, 0] + rng.standard_normal(n)
    return Z, X_endog, Y, sizes


def _world(canary_z: np.ndarray, canary_x: np.ndarray, canary_y: np.ndarray, scale: float) -> World:
    Z, X_endog, Y, sizes = ordinary_units()
    k = canary_z.shape[0]
    starts = np.concatenate([[0], np.cumsum(np.append(sizes, k))]).astype(np.int64)
    return World(np.vstack([Z, canary_z]), np.vstack([X_endog, canary_x[:, None]]), np.append(Y, canary_y), starts,
                 np.append(np.ones(Z.shape[0]), np.full(k, scale)))


def gradient_neighbours(magnitude: float = CANARY) -> tuple[World, World]:
    """D and D′ of the gradient audit: the canary unit (last) of 4 rows at +M in D, of 2 rows at −M in D′."""
    return tuple(_world(z, np.full(len(z), sign * magnitude), np.full(len(z), sign * magnitude), magnitude)
                 for z, sign in zip(CANARY_Z, (1.0, -1.0)))


def claimed_lambdas() -> tuple[float, float]:
    """Noise std of each stage: sensitivity 2γ/n̂ per step, T steps spending ρk (re-derived, not read), as released:
    times the N units' sums' rounding allowance (:func:`dpivreg.privacy.rounding.gradient_rounding`, 1 + 1.5e-11)."""
    allowance = gradient_rounding(N_UNITS, Q, P, P - K)
    return tuple(clip / N_HAT * math.sqrt(2.0 * T / rho) * allowance for clip, rho in ((CLIP1, RHO1), (CLIP2, RHO2)))


# ----------------------------------------------------------------------------------------
# the auditor's own per-unit clipped mean gradients (independent of dpivreg)
# ----------------------------------------------------------------------------------------
def _clip_unit_sums(per_row: np.ndarray, world: World, clip: float) -> np.ndarray:
    """(1/n̂)·Σᵤ CLIP_γ(Σ_{i∈u} gᵢ) from per-row terms divided by the rows' scales, (R, rows, d) → (R, d).

    A unit's true sum is s·Ĝ (Ĝ the sum of the divided terms), so its clipped value is Ĝ·min(s, γ/‖Ĝ‖)."""
    sums = np.add.reduceat(per_row, world.starts[:-1], axis=1)  # (R, N, d)
    norms = np.sqrt(np.sum(sums * sums, axis=-1, keepdims=True))
    factor = np.minimum(world.scale[world.starts[:-1]][None, :, None], clip / np.maximum(norms, TINY))
    return np.sum(sums * factor, axis=1) / N_HAT


def unit_clipped_means(world: World, theta: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both stages' per-unit clipped mean gradients at a batch of iterates, theta (R, q, 1), beta (R, p).

    Per row: zᵢ(zᵢᵀΘ − xᵢ) and x̂ᵢ(x̂ᵢᵀβ − yᵢ) with x̂ᵢ = (zᵢ[0], Θᵀzᵢ), their residuals divided by the row's scale;
    summed over each unit, clipped (:func:`_clip_unit_sums`) and averaged over n̂."""
    Z, s = world.Z, world.scale
    R, n = theta.shape[0], Z.shape[0]
    fitted = np.einsum("ni,rij->rnj", Z, theta)  # Θᵀzᵢ: (R, n, 1)
    r1 = fitted / s[None, :, None] - (world.X_endog / s[:, None])[None]
    per1 = (Z[None, :, :, None] * r1[:, :, None, :]).reshape(R, n, -1)
    x_hat = np.concatenate([np.broadcast_to(Z[None, :, :K], (R, n, K)), fitted], axis=2)
    e = np.einsum("rnj,rj->rn", x_hat, beta) / s[None, :] - (world.Y / s)[None, :]
    per2 = x_hat * e[:, :, None]
    return (_clip_unit_sums(per1, world, CLIP1).reshape(theta.shape), _clip_unit_sums(per2, world, CLIP2))


def reference_unit_means(world: World, theta: np.ndarray, beta: np.ndarray, W: np.ndarray | None, clip1, clip2,
                         split: int | None) -> tuple[np.ndarray, np.ndarray]:
    """A unit-by-unit, row-by-row loop: the clipped means with x̃ᵢ = W x̂ᵢ and, with ``split``, the leading rows of
    the first stage's gradient (coordinates of the second stage's) clipped to their own threshold (clip pairs)."""
    W = np.eye(P) if W is None else W
    clips1 = (clip1, clip1) if split is None else clip1
    clips2 = (clip2, clip2) if split is None else clip2
    k = 0 if split is None else split
    g1, g2 = np.zeros((Q, P - K)), np.zeros(P)
    for a, b in zip(world.starts[:-1], world.starts[1:]):
        s = world.scale[a]
        G1, G2 = np.zeros((Q, P - K)), np.zeros(P)
        for i in range(a, b):
            z = world.Z[i]
            G1 += np.outer(z, (theta.T @ z) / s - world.X_endog[i] / s)
            x_hat = np.concatenate([z[:K], theta.T @ z])
            G2 += W @ x_hat * ((x_hat @ beta) / s - world.Y[i] / s)
        for G, out, clips in ((G1, g1, clips1), (G2, g2, clips2)):
            for part, clip in ((slice(0, k), clips[0]), (slice(k, None), clips[1])):
                norm = float(np.sqrt(np.sum(G[part] ** 2)))
                out[part] += G[part] * min(s, clip / norm if norm > 0 else math.inf)
    return g1 / N_HAT, g2 / N_HAT


# ----------------------------------------------------------------------------------------
# the gradient audit
# ----------------------------------------------------------------------------------------
@dataclass
class GradientAudit:
    runs: int
    fp: int  # runs on D′ with S > 0
    fn: int  # runs on D with S <= 0
    mu_lb: float
    rho_accountant: float
    lambdas_released: tuple[float, float]
    mu2: np.ndarray  # (2, runs): Σ ‖dₜ‖²/λ²
    S: np.ndarray  # (2, runs): row 0 on D, row 1 on D′
    d_norms: np.ndarray  # (2, runs, T, 2)
    noise: np.ndarray  # (Gₜ − own clipped mean)/λ, pooled

    @property
    def mu_accountant(self) -> float:
        return math.sqrt(2.0 * self.rho_accountant)


def run_gradient_audit(seed: int, runs: int = RUNS) -> GradientAudit:
    """``runs`` DP-2S-GD paths on each neighbour's grouped rows (``engine.run_on_rows``, looked up at call time so
    that patched internals are audited), audited with the claimed mechanism's LLR."""
    worlds = gradient_neighbours()
    lam1, lam2 = claimed_lambdas()
    S, mu2 = np.zeros((2, runs)), np.zeros((2, runs))
    d_norms = np.zeros((2, runs, T, 2))
    noise, accountant, released = [], set(), set()
    for w, world in enumerate(worlds):
        rows = world.rows()
        thetas, betas = [], []
        try:
            for s in np.random.SeedSequence([seed, w]).spawn(runs):
                path = engine.run_on_rows(rows, P, K, T=T, rho1=RHO1, rho2=RHO2, eta=ETA, alpha=ALPHA, clip1=CLIP1,
                                          clip2=CLIP2, seed=s)
                thetas.append(path.theta)
                betas.append(path.beta)
        finally:
            rows.close()
        accountant.add(round(path.privacy.rho, 12))
        released.add((path.lambda1, path.lambda2))
        theta, beta = np.stack(thetas), np.stack(betas)  # (R, T+1, q, 1), (R, T+1, p)
        for t in range(T):
            gD1, gD2 = unit_clipped_means(worlds[0], theta[:, t], beta[:, t])
            gE1, gE2 = unit_clipped_means(worlds[1], theta[:, t], beta[:, t])
            G1 = (theta[:, t] - theta[:, t + 1]) / ETA
            G2 = (beta[:, t] - beta[:, t + 1]) / ALPHA
            add_step_llr(S, mu2, d_norms, noise, w, t, (G1, G2), (gD1, gD2), (gE1, gE2), (lam1, lam2))
    assert len(accountant) == 1 and len(released) == 1
    fp, fn = int(np.count_nonzero(S[1] > 0)), int(np.count_nonzero(S[0] <= 0))
    return GradientAudit(runs, fp, fn, mu_lower_bound(fp, fn, runs), accountant.pop(), released.pop(), mu2, S,
                         d_norms, np.concatenate(noise))


class RowClipping:
    """Bug: the per-unit kernel replaced by the per-row one (:func:`dpivreg.compute.kernels.block_sums`, each ROW's gradient
    clipped), the unit grouping ignored, while the noise and the accountant stay those of unit-level privacy.
    Injected where the grouped row source looks the kernel up (``dpivreg.compute.backends.unit_block_sums``); ``calls``
    counts the altered passes, so that an injection that no longer lands fails loudly."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, Z, X_endog, Y, starts, M, clip1, clip2, split=None, *rest):
        self.calls += 1
        return block_sums(Z, X_endog, Y, M, clip1, clip2, "numpy", split)  # ``starts`` ignored: rows, not units


# ----------------------------------------------------------------------------------------
# the moment release audit
# ----------------------------------------------------------------------------------------
FORMULA = "y ~ 1 + [x ~ z]"
BOUNDS = {"y": (-2.0, 2.0), "x": (-1.0, 3.0), "z": (0.0, 1.0)}
#: The release's column order, [exog, instruments, endog, dependent] without the constant (as in
#: test_boundary_audit: public metadata, not a computation).
ORDER = ("z", "x", "y")
#: The canary unit: (rows, values) in D and D′, before truncation; [1, v] = (1, 1, 1, 1) and (1, 1, −1, −1).
MOMENT_CANARY = ((12, {"z": 1.0, "x": 3.0, "y": 2.0}), (8, {"z": 1.0, "x": -1.0, "y": -2.0}))
D_COLUMNS = 4  # columns of [1, v]
IU = np.triu_indices(D_COLUMNS)
KEEP = np.array([(i, j) != (0, 0) for i, j in zip(*IU)])  # the constant's own entry is overwritten (k̂ divides)


def moment_frames(seed: int = 20260602) -> tuple[pd.DataFrame, pd.DataFrame]:
    """D and D′ as data frames with a unit column ``hh``: N − 1 ordinary units of 1 … m rows with values inside the
    bounds, and the canary unit; the rows are shuffled (a unit's rows are not consecutive in the frame)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, M_ROWS + 1, N_UNITS - 1)
    hh = np.repeat(np.arange(N_UNITS - 1), sizes)
    shared = {c: rng.uniform(lo, hi, hh.size) for c, (lo, hi) in BOUNDS.items()}
    frames = []
    for rows, values in MOMENT_CANARY:
        frame = pd.DataFrame({"hh": np.append(hh, np.full(rows, N_UNITS - 1)),
                              **{c: np.append(v, np.full(rows, values[c])) for c, v in shared.items()}})
        frames.append(frame.iloc[rng.permutation(len(frame))].reset_index(drop=True))
    return frames[0], frames[1]


def clean_unit_moments(frame: pd.DataFrame, max_rows: int = M_ROWS) -> np.ndarray:
    """Σ [1, v][1, v]ᵀ/N over each unit's first ``max_rows`` rows (all the canary's rows are equal and the ordinary
    units have at most m, so which rows a truncation keeps does not matter), v the columns clipped to the bounds and
    mapped to [−1, 1] by their midpoints and half-ranges (re-derived, not package code)."""
    total = np.zeros((D_COLUMNS, D_COLUMNS))
    for _, unit in frame.groupby("hh", sort=False):
        v = np.column_stack([(np.clip(unit[c].to_numpy(), *BOUNDS[c]) - sum(BOUNDS[c]) / 2)
                             / ((BOUNDS[c][1] - BOUNDS[c][0]) / 2) for c in ORDER])[:max_rows]
        w = np.column_stack([np.ones(len(v)), v])
        total += w.T @ w
    return total / N_UNITS


def no_truncation(design, *, max_rows_per_unit, **kwargs):
    """Bug: the truncation is skipped (every unit keeps all its rows) while the facts, and so the release's
    sensitivity m·D/N, still say m rows per unit."""
    units = resolve_units(design, max_rows_per_unit=MAX_MAX_ROWS, **kwargs)
    return dataclasses.replace(units, facts=dataclasses.replace(units.facts, max_rows=max_rows_per_unit))


def unit_moment_inputs(frame: pd.DataFrame, seed: int, units_of=resolve_units):
    """(design, units): the frame's design and its privacy units (``units_of``: :func:`resolve_units`, or a
    broken variant) with truncation seed ``seed``, as a fit builds them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        design = design_from_formula(FORMULA, frame)
    units = units_of(design, privacy_unit="hh", clusters=None, max_rows_per_unit=M_ROWS, data=frame, seed=seed)
    return design, units


def released_moments(design, units, rho: float, rng: np.random.Generator):
    """The fit's moment release: ``working_scale`` on the private route with the units."""
    return working_scale(design, BOUNDS, route="private", rho0=rho, rng=rng, units=units)


def package_unit_sum(frame: pd.DataFrame, seed: int = 0, units_of=resolve_units) -> np.ndarray:
    """The per-unit sum Σ [1, v][1, v]ᵀ over the kept rows that the package's moment release adds its noise to: its
    release at ρ0 = ∞ (no noise; the box scale itself, the bounds being the columns' ends) times N·k̂, the
    constant's entry (overwritten by 1 after the division by k̂) put back as N·k̂."""
    design, units = unit_moment_inputs(frame, seed, units_of)
    moments = released_moments(design, units, math.inf, np.random.default_rng(0)).moments
    total = moments.matrix * moments.rows_per_unit * N_UNITS
    total[0, 0] = moments.rows_per_unit * N_UNITS
    return total


def run_moment_audit(seed: int, runs: int = RUNS, units_of=resolve_units) -> dict:
    """``runs`` releases per neighbour of :func:`dpivreg.estimation.working_scale.moments_from_sum` with ``max_rows = m`` on the
    package's per-unit sum of the truncated rows (``units_of``; the end-to-end release through ``working_scale``
    is exactly this, checked in :func:`test_the_unit_moment_release_is_moments_from_sum_of_the_truncated_units`,
    and costs ~6 ms a release against ~20 µs), audited with the claimed LLR over the released upper triangle
    times k̂ (the constant's entry, overwritten after the division by k̂, left out: the canaries keep the same
    number of rows, so it carries no signal)."""
    frames = moment_frames()
    means = [clean_unit_moments(f)[IU][KEEP] for f in frames]
    d, mid = means[0] - means[1], (means[0] + means[1]) / 2
    sigma = M_ROWS * D_COLUMNS / N_UNITS / math.sqrt(2 * RHO) * MOMENT_ALLOWANCE
    S, noise = np.zeros((2, runs)), np.zeros((2, runs, int(KEEP.sum())))
    records, k_hats = set(), []
    for w, frame in enumerate(frames):
        total = package_unit_sum(frame, seed, units_of)
        rng = np.random.default_rng([seed, w])
        for r in range(runs):
            M, record, sig, k_hat = moments_from_sum(total, N_UNITS, with_constant=True, route="private", rho=RHO,
                                                     rng=rng, max_rows=M_ROWS)
            u = (M * k_hat)[IU][KEEP]  # the per-unit release before the division by k̂
            S[w, r] = (u - mid) @ d / sigma**2
            noise[w, r] = (u - means[w]) / sigma
            records.add((round(record.sensitivity, 15), round(record.noise_std, 15), round(record.rho, 12),
                         round(sig * k_hat / sigma, 12)))
            k_hats.append(k_hat)
    fp, fn = int(np.count_nonzero(S[1] > 0)), int(np.count_nonzero(S[0] <= 0))
    return dict(S=S, noise=noise, fp=fp, fn=fn, mu_lb=mu_lower_bound(fp, fn, runs), sigma=sigma, records=records,
                k_hat=np.array(k_hats), mu_canary=float(np.linalg.norm(d) / sigma), runs=runs)


# ----------------------------------------------------------------------------------------
# the clustered meat audit
# ----------------------------------------------------------------------------------------
MEAT_BOUND = 2.0  # C (not 1, so that a C-vs-C² mix-up changes σ)
MEAT_BETA = BETA_TRUE  # the released estimate the scores are taken at (public)


def meat_neighbours() -> tuple[World, World]:
    """D and D′ of the meat audit (clusters = units): the canary unit of 4 rows, z = (1, 0, 0) with y = +M in D;
    z = (1, ±1, 0) with y = ±M in D′ (its intercept coordinate cancels): summed scores ≈ 4M·e₁ and ≈ 4M·e₂."""
    d_z = np.tile([1.0, 0.0, 0.0], (4, 1))
    e_z = np.array([[1.0, 1.0, 0.0], [1.0, -1.0, 0.0]] * 2)
    return (_world(d_z, np.zeros(4), np.full(4, CANARY), CANARY),
            _world(e_z, np.zeros(4), np.array([1.0, -1.0, 1.0, -1.0]) * CANARY, CANARY))


def cluster_meat(world: World) -> np.ndarray:
    """(1/n̂)Σ_c clip_C(g_c)clip_C(g_c)ᵀ with g_c = Σ_{i∈c} zᵢ(yᵢ − zᵢ[0]β₀ − xᵢβ₁) (clusters = units), the scores
    divided by the rows' scale and clipped as in :func:`_clip_unit_sums`."""
    u = (world.Y - world.Z[:, 0] * MEAT_BETA[0] - world.X_endog[:, 0] * MEAT_BETA[1]) / world.scale
    sums = np.add.reduceat(world.Z * u[:, None], world.starts[:-1], axis=0)
    norms = np.sqrt(np.sum(sums * sums, axis=1, keepdims=True))
    clipped = sums * np.minimum(world.scale[world.starts[:-1]][:, None], MEAT_BOUND / np.maximum(norms, TINY))
    return clipped.T @ clipped / N_HAT


MEAT_IU = np.triu_indices(Q)


#: The rounding allowances of the N·m rows' box moment sum and of the N clusters' meat (dpivreg.privacy.rounding):
#: the released Δ and σ are times them (1 + 1e-12, 1 + 5e-13), ρ is not.
MOMENT_ALLOWANCE = box_rounding(N_UNITS * M_ROWS, D_COLUMNS, M_ROWS)
MEAT_ALLOWANCE = ball_rounding(N_UNITS, Q)


def meat_sigma() -> float:
    return math.sqrt(2.0) * MEAT_BOUND**2 / N_HAT / math.sqrt(2.0 * RHO) * MEAT_ALLOWANCE


class RowClippedMeat:
    """Bug: the clustered meat clips each ROW's score (Σᵢ clip(sᵢ)clip(sᵢ)ᵀ), not each cluster's sum, while the
    record still claims one cluster's √2·C²/n̂. Injected at ``dpivreg.inference.covariance.cluster_clipped_outer_sum``."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, Z, X_endog, Y, starts, scores, args, bound):
        self.calls += 1
        S = scores(Z, X_endog, Y, *args)
        norms = np.sqrt(np.einsum("ij,ij->i", S, S))
        S = S * np.minimum(1.0, bound / np.maximum(norms, TINY))[:, None]
        return (S.T @ S,)


def run_meat_audit(seed: int, runs: int = RUNS) -> dict:
    worlds = meat_neighbours()
    means = [cluster_meat(w)[MEAT_IU] for w in worlds]
    d, mid = means[0] - means[1], (means[0] + means[1]) / 2
    sigma = meat_sigma()
    S, noise = np.zeros((2, runs)), np.zeros((2, runs, len(MEAT_IU[0])))
    records = set()
    for w, world in enumerate(worlds):
        rows = world.rows(cluster_starts=world.starts)
        rng = np.random.default_rng([seed, w])
        try:
            for r in range(runs):
                released, record, sig = release_score_meat(rows, MEAT_BETA, K, bound=MEAT_BOUND, rho=RHO, rng=rng,
                                                           clustered=True)
                u = released[MEAT_IU]
                S[w, r] = (u - mid) @ d / sigma**2
                noise[w, r] = (u - means[w]) / sigma
                records.add((round(record.sensitivity, 15), round(sig, 15), round(record.rho, 12)))
        finally:
            rows.close()
    fp, fn = int(np.count_nonzero(S[1] > 0)), int(np.count_nonzero(S[0] <= 0))
    return dict(S=S, noise=noise, fp=fp, fn=fn, mu_lb=mu_lower_bound(fp, fn, runs), records=records,
                mu_canary=float(np.linalg.norm(d) / sigma), runs=runs)


def held_out_bound(S: np.ndarray, runs: int) -> float:
    """μ_lb of "D iff S > τ" with τ the midpoint of the two worlds' median S over the first half of the runs, the
    errors counted on the second half: a valid lower bound whatever the mechanism (τ is fixed before the held-out
    runs, independent of them, are seen). The claimed mechanism's threshold 0 assumes the claimed midpoint; a
    broken mechanism also moves the ordinary units' contribution (equally in both worlds), which shifts S and
    can put both worlds on one side of 0 — this statistic is not fooled by such a shift."""
    half = runs // 2
    tau = (np.median(S[0, :half]) + np.median(S[1, :half])) / 2.0
    fp, fn = int(np.count_nonzero(S[1, half:] > tau)), int(np.count_nonzero(S[0, half:] <= tau))
    return mu_lower_bound(fp, fn, runs - half)




# ----------------------------------------------------------------------------------------
# exact checks
# ----------------------------------------------------------------------------------------
def test_neighbours_are_unit_neighbours_at_the_worst_case():
    """D and D′ share the N − 1 ordinary units exactly and differ in the last (canary) unit only; N is the same,
    the row counts differ. The canary's clipped contributions differ by 2γ/n̂ (gradients, at any iterate), m·D/N
    (moments) and √2·C²/n̂ (clustered meat)."""
    for worlds in (gradient_neighbours(), meat_neighbours()):
        (a, b) = worlds
        assert len(a.starts) == len(b.starts) == N_UNITS + 1
        shared = a.starts[-2]
        assert b.starts[-2] == shared and np.array_equal(a.starts[:-1], b.starts[:-1])
        for name in ("Z", "X_endog", "Y"):
            np.testing.assert_array_equal(getattr(a, name)[:shared], getattr(b, name)[:shared])
        assert np.all(np.diff(a.starts[:-1]) <= M_ROWS)
    a, b = gradient_neighbours()
    assert (a.starts[-1] - a.starts[-2], b.starts[-1] - b.starts[-2]) == (4, 2)
    rng = np.random.default_rng(1)
    theta, beta = 0.5 * rng.standard_normal((50, Q, 1)), rng.standard_normal((50, P))
    gD, gE = unit_clipped_means(a, theta, beta), unit_clipped_means(b, theta, beta)
    for stage, clip in ((0, CLIP1), (1, CLIP2)):
        diff = (gD[stage] - gE[stage]).reshape(50, -1)
        np.testing.assert_allclose(np.linalg.norm(diff, axis=1), 2 * clip / N_HAT, rtol=1e-9)

    frames = moment_frames()
    assert [f["hh"].nunique() for f in frames] == [N_UNITS, N_UNITS]
    assert frames[0].groupby("hh").size().max() == 12 and frames[1].groupby("hh").size().max() == 8
    diff = (clean_unit_moments(frames[0]) - clean_unit_moments(frames[1]))[IU]
    assert np.linalg.norm(diff) == pytest.approx(M_ROWS * D_COLUMNS / N_UNITS, rel=1e-12)
    assert diff[~KEEP] == pytest.approx(0.0, abs=1e-15)

    mD, mE = (cluster_meat(w)[MEAT_IU] for w in meat_neighbours())
    assert np.linalg.norm(mD - mE) == pytest.approx(math.sqrt(2.0) * MEAT_BOUND**2 / N_HAT, rel=1e-9)


KERNELS = ["numpy", pytest.param("numba", marks=pytest.mark.skipif(not numba_available(), reason="numba missing"))]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("magnitude", [CANARY, FAR], ids=["canary 1e8", "canary 1e300 (overflow-safe kernel)"])
def test_package_unit_gradients_equal_the_auditors(magnitude, kernel):
    """The grouped row source's clipped means (``engine._clipped_gradients``, the one pass per iteration) equal a
    unit-by-unit reference loop at random iterates, with and without group clipping and a whitening W, for either
    kernel, and equal the auditor's vectorised means; the far canary (summed gradient beyond float64) goes through
    :func:`dpivreg.compute.kernels.safe_unit_block_sums`, which must clip the unit's sum too. Then the noiseless engine
    (ρ = ∞, clipping kept) steps by exactly the auditor's clipped means along its path."""
    real_safe = backends.safe_unit_block_sums
    rng = np.random.default_rng(5)
    clip_pairs = [(CLIP1, CLIP2, None), ((0.5, 1.5), (0.4, 2.5), K)]  # single thresholds; group clipping
    for world in gradient_neighbours(magnitude):
        rows = world.rows(kernel=kernel)
        try:
            for _ in range(3):
                theta, beta = 0.5 * rng.standard_normal((Q, 1)), rng.standard_normal(P)
                A = rng.standard_normal((P, P))
                W = np.linalg.cholesky(np.linalg.inv(A @ A.T + np.eye(P)))  # a lower-triangular whitening
                for clip1, clip2, split in clip_pairs:
                    for root in (None, W):
                        with mock.patch.object(backends, "safe_unit_block_sums", wraps=real_safe) as safe:
                            g1, g2, counts = engine._clipped_gradients(rows, theta, beta, root, K, clip1, clip2, split)
                        assert safe.called == (magnitude == FAR)
                        r1, r2 = reference_unit_means(world, theta, beta, root, clip1, clip2, split)
                        np.testing.assert_allclose(g1, r1, rtol=1e-9, atol=1e-13)
                        np.testing.assert_allclose(g2, r2, rtol=1e-9, atol=1e-13)
                        assert counts[0] >= 1 and counts[1] >= 1  # the canary unit is clipped in both stages
                a1, a2 = unit_clipped_means(world, theta[None], beta[None])
                r1, r2 = reference_unit_means(world, theta, beta, None, CLIP1, CLIP2, None)
                np.testing.assert_allclose(a1[0], r1, rtol=1e-10, atol=1e-14)
                np.testing.assert_allclose(a2[0], r2, rtol=1e-10, atol=1e-14)
            with pytest.warns(PrivacyLeakWarning):
                path = engine.run_on_rows(rows, P, K, T=T, rho1=math.inf, rho2=math.inf, eta=ETA, alpha=ALPHA,
                                          clip1=CLIP1, clip2=CLIP2)
        finally:
            rows.close()
        g1, g2 = unit_clipped_means(world, path.theta[:-1], path.beta[:-1])
        np.testing.assert_allclose((path.theta[:-1] - path.theta[1:]) / ETA, g1, rtol=1e-9, atol=1e-13)
        np.testing.assert_allclose((path.beta[:-1] - path.beta[1:]) / ALPHA, g2, rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_unit_with_a_zero_gradient_is_not_clipped(kernel):
    """A unit whose gradient is exactly zero (here: rows with x = y = 0 at Θ = 0, β = 0, as at a zero start) has
    clip factor 1 and adds nothing; the other units are clipped as usual (reference loop). Regression: the numba
    unit kernel used to raise ZeroDivisionError on γ/0 (compiled without numpy's error model), which crashed e.g.
    every ``fit(privacy_unit=..., method="gd", init="zero")`` without exogenous columns (x̂ = 0 at t = 0)."""
    world = gradient_neighbours()[0]
    first = slice(world.starts[0], world.starts[1])
    X_endog, Y = world.X_endog.copy(), world.Y.copy()
    X_endog[first], Y[first] = 0.0, 0.0
    world = dataclasses.replace(world, X_endog=X_endog, Y=Y)
    theta, beta = np.zeros((Q, 1)), np.zeros(P)
    rows = world.rows(kernel=kernel)
    try:
        for clip1, clip2, split in [(CLIP1, CLIP2, None), ((0.5, 1.5), (0.4, 2.5), K)]:
            g1, g2, _ = engine._clipped_gradients(rows, theta, beta, None, K, clip1, clip2, split)
            r1, r2 = reference_unit_means(world, theta, beta, None, clip1, clip2, split)
            np.testing.assert_allclose(g1, r1, rtol=1e-9, atol=1e-13)
            np.testing.assert_allclose(g2, r2, rtol=1e-9, atol=1e-13)
    finally:
        rows.close()


# ----------------------------------------------------------------------------------------
# the audits
# ----------------------------------------------------------------------------------------
def test_unit_gradient_audit_is_sound_and_tight():
    """DP-2S-GD on grouped rows with a canary UNIT: the audit must not beat the accountant, and must nearly reach it.

    2,000 runs per dataset, N = 40 units (n̂ = 100), q = 3, p = 2 (intercept exogenous), T = 5, ρ1 = 1.5, ρ2 = 1
    (γ1 = 1, γ2 = 2): claimed ρ = 2.5, μ = sqrt(5) = 2.236, attained by the canary unit at every step (checked:
    ‖dₜ‖ = 2γk/n̂ exactly, μ² = 5 in every run). The released noise is the claimed λk = (γk/n̂)·sqrt(2T/ρk) and
    the recovered noise (Gₜ − own clipped mean)/λ is N(0, 1) (KS p > 1e-6 over 2 × 2,000 × 5 × 5 draws).

    Soundness: μ_lb ≤ sqrt(2·path.privacy.rho) (false failure ≤ 1e-3). Tightness: μ_lb ≥ 0.8·2.236 = 1.789, 4.8
    binomial sd below the expected 2.001 of an exactly μ-GDP mechanism (``assert_tight``). Observed (seed 71):
    μ_lb = 2.100 (221 false positives, 265 false negatives), held-out statistic 2.070; seeds 1–4 gave 1.940–2.081.
    The engine runs with its default kernel (numba when installed, else numpy; both are checked exactly above).
    """
    a = run_gradient_audit(71)
    mu = math.sqrt(2.0 * (RHO1 + RHO2))
    assert a.rho_accountant == pytest.approx(RHO1 + RHO2, rel=1e-12)
    np.testing.assert_allclose(a.lambdas_released, claimed_lambdas(), rtol=1e-12)
    want = np.broadcast_to([2 * CLIP1 / N_HAT, 2 * CLIP2 / N_HAT], a.d_norms.shape)
    np.testing.assert_allclose(a.d_norms, want, rtol=1e-9)
    # the canary attains the exact-arithmetic sensitivity; the rounding allowance is the slack above it
    np.testing.assert_allclose(a.mu2, mu**2 / gradient_rounding(N_UNITS, Q, P, P - K) ** 2, rtol=1e-9)
    assert a.noise.size == 2 * a.runs * T * (Q * (P - K) + P)
    assert stats.kstest(a.noise, "norm").pvalue > 1e-6
    assert_llr_law(a.S, mu)
    assert a.mu_lb <= a.mu_accountant, f"privacy violation: mu_lb={a.mu_lb:.3f} > claimed mu={a.mu_accountant:.3f}"
    assert held_out_bound(a.S, a.runs) <= a.mu_accountant  # the broken variants' statistic is sound too
    assert_tight(a.mu_lb, mu, a.runs)


def test_unit_gradient_audit_catches_row_clipping():
    """The audit has teeth: clipping each ROW's gradient instead of each unit's sum (the row-level kernel behind a
    unit-level accountant) is caught, μ_lb > sqrt(2·2.5) = 2.236, although the accountant still claims ρ = 2.5.

    With row clipping the canary unit contributes ∓γ·Σᵢ zᵢ/‖zᵢ‖-like sums of up to 4 clipped rows: in stage 1 the
    two worlds' means differ by ‖Σ_D ẑᵢ + Σ_D′ ẑᵢ‖·γ1/n̂ = 5.27·γ1/n̂ instead of 2γ1/n̂, in stage 2 by up to
    6γ2/n̂ (x̂ = (1, 0) at the start). The ordinary units, clipped less as rows than as units, shift S by about +15
    in both worlds (observed, seed 303: mean S +20.5 on D, +9.0 on D′, sd 1.9), so the claimed threshold 0 calls
    every run "D" (μ_lb = −inf); the held-out threshold separates the worlds (6 sd apart): μ_lb = 4.686 (seeds
    1–3: 4.59–4.86; 0 errors in 1,000 held-out runs certify 4.86).
    """
    bug = RowClipping()
    with mock.patch.object(backends, "unit_block_sums", bug):
        a = run_gradient_audit(303)
    assert bug.calls == 2 * a.runs * T, "the injection did not land"
    assert a.rho_accountant == pytest.approx(RHO1 + RHO2, rel=1e-12)
    np.testing.assert_allclose(a.lambdas_released, claimed_lambdas(), rtol=1e-12)
    best = max(a.mu_lb, held_out_bound(a.S, a.runs))
    assert best > math.sqrt(2.0 * (RHO1 + RHO2)), f"row clipping not caught: mu_lb={best:.3f}"


def test_the_unit_moment_release_is_moments_from_sum_of_the_truncated_units():
    """End to end (``resolve_units`` with a fresh truncation seed, then ``working_scale``), for 20 seeds per world:
    the exact release (ρ0 = ∞) is the auditor's per-unit sum over the first m rows of each unit (the canaries of 12
    and 8 rows keep 4), so N·k̂ is the kept rows' count and k̂ ≤ m; and the noisy release (ρ0 = 2.5) is, bit for bit,
    :func:`moments_from_sum` with ``max_rows = m`` applied to that sum with the same generator, its record
    sensitivity m·D/N = 0.4, σ = 0.4/sqrt(2ρ), ρ = 2.5, and its normaliser n̂ = N·k̂."""
    for frame in moment_frames():
        clean = clean_unit_moments(frame) * N_UNITS
        kept = sum(min(size, M_ROWS) for size in frame.groupby("hh").size())
        for seed in range(20):
            total = package_unit_sum(frame, seed)
            np.testing.assert_allclose(total, clean, rtol=1e-12, atol=1e-12)
            assert total[0, 0] == pytest.approx(kept, rel=1e-12) and kept <= M_ROWS * N_UNITS
            if seed % 4:
                continue
            design, units = unit_moment_inputs(frame, seed)
            assert units.facts.n_units == N_UNITS and units.facts.max_rows == M_ROWS
            scale = released_moments(design, units, RHO, np.random.default_rng(seed))
            M, record, sigma, k_hat = moments_from_sum(total, N_UNITS, with_constant=True, route="private", rho=RHO,
                                                       rng=np.random.default_rng(seed), max_rows=M_ROWS)
            np.testing.assert_allclose(scale.moments.matrix, M, rtol=1e-12, atol=1e-14)
            assert scale.moments.rows_per_unit == pytest.approx(k_hat, rel=1e-12) and 1.0 <= k_hat <= M_ROWS
            assert scale.n == pytest.approx(N_UNITS * k_hat, rel=1e-12)
            (released,) = scale.releases
            assert released.sensitivity == pytest.approx(M_ROWS * D_COLUMNS / N_UNITS, rel=1e-15)
            assert released.noise_std == pytest.approx(0.4 / math.sqrt(2 * RHO), rel=1e-12)
            assert released.rho == pytest.approx(RHO, rel=1e-12)
            assert scale.moments.sigma == pytest.approx(released.noise_std / k_hat, rel=1e-12)


def test_unit_moment_release_audit_is_sound_and_tight():
    """The unit-level moment release (m = 4): canary units of 12 and 8 rows, truncated to 4, at the box's worst
    case. Claimed: sensitivity m·D/N = 16/40, ρ = 2.5 (μ = 2.236), attained exactly (checked: ‖d‖/σ = sqrt(2ρ)).

    The released matrix is divided by k̂ (its constant's entry clipped to [1, m]): the auditor multiplies k̂ back
    and checks 1 ≤ k̂ ≤ m and that σ/k̂ is the claimed σ over k̂. 2,000 releases per dataset. The LLR law and the
    noise's normality (KS p > 1e-6 over 2 × 2,000 × 9 entries) are checked first; then μ_lb ≤ 2.236 and
    ≥ 0.8·2.236 (``assert_tight``). Observed (seed 83): μ_lb = 2.060 (250 / 252 errors); seeds 1–20 gave
    1.839–2.080 (held-out statistic 1.762–2.050).
    """
    a = run_moment_audit(83)
    mu = math.sqrt(2.0 * RHO)
    assert a["records"] == {(round(M_ROWS * D_COLUMNS / N_UNITS * MOMENT_ALLOWANCE, 15), round(a["sigma"], 15),
                             round(RHO, 12), 1.0)}
    assert np.all((a["k_hat"] >= 1.0) & (a["k_hat"] <= M_ROWS))
    # the canaries attain the exact-arithmetic sensitivity m·D/N; the rounding allowance is the slack above it
    assert a["mu_canary"] == pytest.approx(mu / MOMENT_ALLOWANCE, rel=1e-12)
    assert_sound_and_tight(a, mu)


def assert_sound_and_tight(a: dict, mu: float) -> None:
    """An audit of a correct release: S follows the claimed law, the noise is normal, μ_lb (and the held-out
    statistic) at most the claimed μ, and μ_lb tight (≥ 0.8·μ at this run count)."""
    assert_llr_law(a["S"], mu)
    assert stats.kstest(a["noise"].ravel(), "norm").pvalue > 1e-6
    assert a["mu_lb"] <= mu, f"privacy violation: mu_lb={a['mu_lb']:.3f} > claimed mu={mu:.3f}"
    assert held_out_bound(a["S"], a["runs"]) <= mu
    assert_tight(a["mu_lb"], mu, a["runs"])


def test_unit_moment_audit_catches_skipped_truncation():
    """Teeth: without the truncation the canary units keep 12 and 8 rows while the release still claims m = 4
    (σ for 4 rows): the per-unit sums differ by 12aaᵀ − 8bbᵀ instead of 4(aaᵀ − bbᵀ), and the constant-free
    entries of D (D′) move by 8aaᵀ/N (4bbᵀ/N) along d, away from the midpoint: under the claimed LLR the worlds' S
    have means +7.5 and −5.0 (sd 2.2), error rates Φ(−3.3) and Φ(−2.3). Observed (seed 303, 2,000 releases per
    dataset): μ_lb = 4.679 (24 false positives, 0 false negatives) against 2.236; seeds 1–20: 4.47–4.75. The record
    still claims sensitivity 0.4 and ρ = 2.5.
    """
    a = run_moment_audit(303, units_of=no_truncation)
    assert a["records"] == {(round(M_ROWS * D_COLUMNS / N_UNITS * MOMENT_ALLOWANCE, 15), round(a["sigma"], 15),
                             round(RHO, 12), 1.0)}
    best = max(a["mu_lb"], held_out_bound(a["S"], a["runs"]))
    assert best > math.sqrt(2.0 * RHO), f"skipped truncation not caught: mu_lb={best:.3f}"


def test_clustered_meat_audit_is_sound_and_tight():
    """The clustered meat at a given threshold C = 2 (``release_score_meat(..., clustered=True)``, clusters = the
    units): the canary cluster's clipped sum moves from C·e₁ to C·e₂, attaining the claimed √2·C²/n̂ (checked:
    ‖d‖/σ = sqrt(2ρ)). The record says sensitivity √2·C²/n̂ and ρ = 2.5; the law of S and the noise's normality
    are checked; then μ_lb ≤ 2.236 and ≥ 0.8·2.236. Observed (seed 97): μ_lb = 1.966 (269 / 275 errors); seeds
    1–20 gave 1.950–2.102 (held-out statistic 1.784–2.037)."""
    a = run_meat_audit(97)
    mu = math.sqrt(2.0 * RHO)
    assert a["records"] == {(round(math.sqrt(2.0) * MEAT_BOUND**2 / N_HAT * MEAT_ALLOWANCE, 15),
                             round(meat_sigma(), 15),
                             round(RHO, 12))}
    assert a["mu_canary"] == pytest.approx(mu, rel=1e-9)
    assert_sound_and_tight(a, mu)


def test_clustered_meat_audit_catches_row_clipping():
    """Teeth: clipping the rows' scores instead of the cluster's sum (with the claimed √2·C²/n̂). The canary's 4
    rows then contribute 4C²·e₁e₁ᵀ in D and 2C²·(e₁e₁ᵀ + e₂e₂ᵀ) in D′: the difference 2C²·(e₁e₁ᵀ − e₂e₂ᵀ) is twice
    the claimed sensitivity, true μ ≈ 4.5. The ordinary clusters' meat changes too, equally in both worlds (S
    shifted by about +13: mean +18.3 on D, +8.1 on D′, sd 2.2, seed 303), so only the held-out threshold
    separates them: μ_lb = 4.026 (seeds 1–20: 3.68–4.03) against 2.236."""
    bug = RowClippedMeat()
    with mock.patch("dpivreg.inference.covariance.cluster_clipped_outer_sum", bug):
        a = run_meat_audit(303)
    assert bug.calls == 2 * a["runs"], "the injection did not land"
    assert a["records"] == {(round(math.sqrt(2.0) * MEAT_BOUND**2 / N_HAT * MEAT_ALLOWANCE, 15),
                             round(meat_sigma(), 15),
                             round(RHO, 12))}
    best = max(a["mu_lb"], held_out_bound(a["S"], a["runs"]))
    assert best > math.sqrt(2.0 * RHO), f"row clipping not caught: mu_lb={best:.3f}"
