"""Clipping thresholds of DP-2S-GD: public rules and the private adaptive default.

Public rules (no data read)
    ``"theorem"``: the Theorem's γ1 = γ2 = c0(√q + √(τ + log nT))² (:func:`theorem_clip`), stated for
    isotropic data of unit scale; ``"rms"``: 3 times the root-mean-square gradient norm of standardised,
    whitened data (:func:`standardized_clip`).

The private adaptive rule (``"adaptive"``, the default with a warm start)
    One Gaussian release (budget ``rho_clip``) of histograms of the per-row gradient norms at the warm
    start, one per clipping group (:func:`gradient_norm_counts`; groups as in :func:`dpivreg.dp_2s_gd`:
    stage 1's exogenous and instrument rows, stage 2's exogenous and endogenous coordinates), over a public
    log grid of bins a factor √2 wide around each group's unit scale on the working scale. Replacing one row
    moves one count in each of the G histograms: sensitivity √(2G) (:func:`dpivreg.privacy.mechanisms.histograms`).
    Each group's threshold is then the smallest bin edge above which the noisy counts of the bins seen above the
    noise add up to at most K = min(½√n, 50)·min(1, √(d/ρ)) rows, ρ the budget of the stage the threshold is for
    and d the group's number of coordinates (:func:`target_clipped_rows`,
    :func:`dpivreg.privacy.mechanisms.clip_from_histogram`): post-processing. A bin is seen when its count is above
    3 noise standard deviations, except that where the histogram resolves its data (largest count above 6σ) a lone
    bin below the histogram's Bonferroni level (3.98σ for 40 bins) is taken for noise
    (:func:`dpivreg.privacy.mechanisms.seen_bins`); with no bin seen the threshold is the grid's top edge.

    Why two levels. With 3σ alone, noise passes it in 0.13% of bins, so one of the four histograms' 160 bins shows
    a lone count far above the data in about 20% of fits; at n ≤ 10⁴ that count often exceeds K and moved the
    group's threshold up to 2¹² times too high, with the gradients' noise. Paired on the same data and seeds
    (``benchmarks/threshold_rule.py``, 39 cells of 200 data sets, n = 200–10⁴, total ρ 0.5–10), the reading changed
    4.5–34% of the fits at n = 10³; the 90th percentile of the error in 2SLS standard errors was lower or equal in 37
    of the 39 cells (strictly lower in 32; the weak instrument at n = 10³, ρ = 0.5: 2.66 → 1.63; heavy-tailed, ρ = 2:
    1.78 → 1.00; the paper's design, ρ = 0.5: 1.86 → 1.37) and the median in 34 (29; no median rose by more than
    0.001 at n ≥ 3,000). The top
    edge instead of the bottom one when nothing is seen (n = 200, ρ = 0.5, where the bottom edge clipped every row to
    almost nothing): median error 12.2 → 9.2, coverage of β̂_2SLS 0.52 → 0.78.

    Why K = min(½√n, 50). Clipping k of n rows moves the clipped mean gradient by at most k·(excess)/n in
    one direction; in units of the 2SLS standard error (∝ 1/√n) that is at most about (k/√n)·(excess/rms):
    at most a bounded multiple of K/√n ≤ ½ whatever n, and far less when the clipped rows' directions do not
    line up (symmetric errors: about √k·excess/n). Fixed quantiles do not have this property: at n ≥ 10⁵
    clipping 1% of rows (q99) left a distortion of 0.25 2SLS standard errors on a normal design and clipping
    10% of rows 0.25 on the labour-supply data, where K = ½√n left < 0.05; the Theorem's rule, which clips
    nothing, has 10–30 times the noise. The privacy noise of the clipped mean is ∝ γ/(n√ρ), the symmetric
    distortion ∝ √K·excess/n: balancing the two gives a K that does not grow with n, so K is capped. Measured
    on the designs of ``benchmarks/estimator_comparison.py`` with K ∈ {0.3, 0.5, 1}·√n, ½√n was within 10% of
    the best of the three in almost every cell; at n ≥ 10⁵ a cap of 50 rows lowered the median error by up to
    40% (e.g. 0.041 → 0.025 2SLS s.e. on the paper's design, p = q = 1, n = 10⁵, ρ = 10), while caps of 20
    (worse at n = 10⁴, 0.15 → 0.23) and 100 (worse on the heavy-tailed design) did not.

    Why K falls as √(d/ρ) above a stage budget of d. The distortion of the K clipped rows does not depend on
    the budget, the noise it is traded against falls as 1/√ρ, so to keep their ratio K must fall as 1/√ρ too
    (up to ρ = d the rule above, calibrated over total budgets 0.5–10, is kept). The noise is spread over
    the group's d coordinates while the clipped rows' excess need not be, so its share in any one coefficient
    is about 1/√d of the noise's norm: hence the factor √d. Measured at a total ρ of 10
    (stage budgets 3.85, so K/1.96), 100–200 runs per cell: K/2 lowered the median error on the labour-supply
    subsamples (n = 1,000: 0.062 → 0.054; n = 3,000: 0.032 → 0.029 2SLS s.e.), the paper's design (n = 10⁴,
    0.063 → 0.052), the heavy-tailed (0.20 → 0.17) and the weak-instrument design (0.082 → 0.069); at a total
    ρ of 2 (stage budgets 0.77, K unchanged by the rule) K/2 or K/4 raised it by up to 43% on the weak and 21% on
    the paper's design. On the paper's design with p = q = 5 (groups of 25 and 5 coordinates), where the
    rule without √d halved K as well, the median error rose by 4–17% at every n (0.041 → 0.046 at n = 10⁶,
    0.082 → 0.091 at n = 10⁵); with √d, K is unchanged there. With an infinite stage budget K = 0: nothing
    visible is clipped.

    With privacy units (:mod:`dpivreg.privacy.units`) the histograms count units: each unit's summed gradient, normed as
    a row's is (:func:`unit_gradient_norm_counts`), one count per unit in each histogram (sensitivity √(2G) as
    before); the grid reaches ``max_rows_per_unit`` times higher and K counts units (N for n).

    Why groups. The whitened instruments of a rare category (e.g. the 196 mothers coded both black and
    Hispanic among 31,857) have norms of 13 where the rest have 2–3; clipping every row's gradient as a whole
    either clips those rows (distorting the controls' coefficients) or spends 5 times the noise on every
    coordinate. Clipped by groups, their norms raise only the exogenous group's threshold, and with the
    Cholesky preconditioner (:func:`dpivreg.estimation.engine.preconditioner_root`) the endogenous coefficients do not
    depend on that group's noise.
"""

from __future__ import annotations

import math
import numbers
from typing import Mapping

import numpy as np

from dpivreg._validation import check_clip
from dpivreg.compute.kernels import (
    fused_norm_counts,
    pass_matrix,
    resolve_kernel,
    unit_gradient_groups,
    unit_gradient_terms,
)
from dpivreg.privacy.accounting import Release
from dpivreg.privacy.mechanisms import (
    clip_from_histogram,
    histogram_counts,
    log_grid,
    release_histogram_counts,
    seen_bins,
)
from dpivreg.privacy.units import group_sums

__all__ = ["theorem_clip", "standardized_clip", "gradient_norm_counts", "unit_gradient_norm_counts", "adaptive_clip",
           "AdaptiveClip",
           "target_clipped_rows", "resolve_public_clip", "CLIP_RULES", "MAX_CLIPPED_ROWS",
           "REFERENCE_STAGE_RHO"]

CLIP_RULES = ("adaptive", "theorem", "rms")
#: The clipping groups, in the order of the histograms (stage 1's first), grouped and not.
GROUP_NAMES = ("stage 1's exogenous rows", "stage 1's instrument rows", "stage 2's exogenous coordinates",
               "stage 2's endogenous coordinates")
STAGE_NAMES = ("stage 1", "stage 2")


def theorem_clip(n: int, q: int, T: int, *, tau: float = 5.0, c0: float = 1.0) -> float:
    """The Theorem's clipping threshold γ1 = γ2 = c0·(√q + √(τ + log(nT)))² (eq. "parameter settings").

    Public: it depends only on n, q, T and τ. It is stated for isotropic data of unit scale,
    so dpivreg applies it on the working scale.
    """
    return c0 * (math.sqrt(q) + math.sqrt(tau + math.log(n * T))) ** 2


def standardized_clip(q: int, p: int, p_endog: int, *, c: float = 3.0) -> tuple[float, float]:
    """Clipping thresholds for standardised, whitened columns: (c·sqrt(q·p_endog), c·sqrt(p)).

    With E[zzᵀ] = I the instrument norm is about sqrt(q), and first-stage residuals of
    unit-variance columns have norm at most about sqrt(p_endog); in the second stage the
    P_t-whitened x̂ has norm about sqrt(p) and the residual at most about unit scale. The
    thresholds are c = 3 times those root-mean-square products: public, and tight enough
    that the noise is not wasted on a worst case that the Theorem's rule covers.
    """
    return c * math.sqrt(q * p_endog), c * math.sqrt(p)


#: The most rows the adaptive rule lets a threshold clip, whatever n (see the module docstring).
MAX_CLIPPED_ROWS = 50.0
#: Stage budget (zCDP) up to which K = min(½√n, 50); above it K shrinks as 1/√ρ (module docstring).
REFERENCE_STAGE_RHO = 1.0


def target_clipped_rows(n: int, rho: float = REFERENCE_STAGE_RHO, dim: int = 1) -> float:
    """K = min(½√n, 50)·min(1, √(d/ρ)): the number of rows the adaptive rule allows above the threshold of a
    clipping group of ``dim`` = d coordinates in a stage with budget ``rho`` (module docstring). Public: n,
    the budget and the dimension are."""
    base = min(0.5 * math.sqrt(n), MAX_CLIPPED_ROWS)
    if rho <= REFERENCE_STAGE_RHO * dim:
        return base
    return base * math.sqrt(REFERENCE_STAGE_RHO * dim / rho)


def _group_dimensions(q: int, p: int, n_exog: int, p_endog: int, grouped: bool) -> list[int]:
    """Coordinates of each clipping group's gradient: stage 1's (exogenous, instrument) rows × p_endog, stage
    2's exogenous and endogenous coordinates; or the two stages' whole gradients."""
    if grouped:
        return [n_exog * p_endog, (q - n_exog) * p_endog, n_exog, p - n_exog]
    return [q * p_endog, p]


def _group_edges(dims: list[int], max_rows: int = 1) -> list[np.ndarray]:
    """Public bin edges per group, around each group's unit scale on the working scale (√(dimension)); with privacy
    units of up to ``max_rows`` rows reaching higher by a factor ``max_rows`` (rounded up to a power of 2: a unit's
    summed gradient is at most that many rows' gradients)."""
    above = 12 + math.ceil(math.log2(max_rows))  # log_grid's above counts doublings (two bins each)
    return [log_grid(math.sqrt(dim), above=above) for dim in dims]


def gradient_norm_counts(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, M: np.ndarray, n_exog: int,
                         grouped: bool, edges: list[np.ndarray], kernel: str = "numpy") -> tuple[np.ndarray]:
    """Histogram counts (G, bins) of one block's per-row gradient norms by group (a block function).

    ``M`` is the pass matrix at the starting point (:func:`dpivreg.compute.kernels.pass_matrix`): uᵢ = zᵢᵀM gives
    the first-stage residual rᵢ, the whitened regressors x̃ᵢ and the second-stage residual eᵢ. Norms:
    ‖zᵢ[g]‖·‖rᵢ‖ and ‖x̃ᵢ[g]‖·abs(eᵢ) for the groups g (split at ``n_exog``), or the whole vectors.
    ``kernel="numba"`` counts them in one compiled loop (:func:`dpivreg.compute.kernels.fused_norm_counts`; 4 ms instead
    of 20 ms per 65,536 rows at q = 3, measured), with the same counts up to a norm that rounding moves across a
    bin edge.
    """
    if kernel == "numba":
        return (fused_norm_counts(Z, X_endog, Y, M, n_exog if grouped else -1, np.array(edges)),)
    p_endog = X_endog.shape[1]
    U = Z @ M
    norm_r = np.sqrt(np.sum((U[:, :p_endog] - X_endog) ** 2, axis=1))
    X_tilde = U[:, p_endog:-1]
    abs_e = np.abs(U[:, -1] - Y)
    k = n_exog if grouped else 0
    parts = [(Z[:, :k], norm_r), (Z[:, k:], norm_r), (X_tilde[:, :k], abs_e), (X_tilde[:, k:], abs_e)]
    if not grouped:
        parts = [parts[1], parts[3]]
    norms = [np.sqrt(np.einsum("ij,ij->i", A, A)) * b for A, b in parts]
    return (np.array([histogram_counts(v, e) for v, e in zip(norms, edges)]),)


def unit_gradient_norm_counts(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, starts: np.ndarray, M: np.ndarray,
                              n_exog: int, grouped: bool, edges: list[np.ndarray]) -> tuple[np.ndarray]:
    """Histogram counts (G, bins) of one block's per-*unit* gradient norms by group (a grouped block function, the
    units starting at ``starts``; :mod:`dpivreg.privacy.units`): the norms of each unit's summed gradients
    (:func:`dpivreg.compute.kernels.unit_gradient_terms`), split into groups as :func:`gradient_norm_counts` splits a
    row's. Each unit is counted once in each histogram, as a row is at row level."""
    q, p_endog = Z.shape[1], X_endog.shape[1]
    k = n_exog if grouped else 0
    counts = np.zeros((len(edges), edges[0].shape[0] - 1))

    def consume(G: np.ndarray) -> None:
        parts = unit_gradient_groups(G, q, p_endog, k)
        for c, part, e in zip(counts, parts if grouped else parts[1::2], edges):
            c += histogram_counts(np.sqrt(np.einsum("ij,ij->i", part, part)), e)

    group_sums(lambda rows: unit_gradient_terms(Z[rows], X_endog[rows], Y[rows], M), starts, Z.shape[0], consume,
               width=q * p_endog + M.shape[1] - p_endog - 1)
    return (counts,)


class AdaptiveClip:
    """The outcome of :func:`adaptive_clip`: thresholds, the release and what they came from.

    Attributes
    ----------
    clip1, clip2 : float or (float, float)
        The thresholds of the two stages (pairs (exogenous group, rest) when ``grouped``).
    grouped : bool
        Whether the groups were clipped separately.
    release : Release
        The histograms' record (budget line ``"rho_clip"``).
    targets : tuple of float
        K of each group (stage 1's first): the number of rows allowed above its threshold.
    noisy_counts : ndarray (G, bins)
        The released histograms (private releases; published with the fit).
    edges : list of ndarray
        Their public bin edges.
    """

    def __init__(self, clip1, clip2, grouped: bool, release: Release, targets: tuple[float, ...],
                 noisy_counts: np.ndarray, edges: list[np.ndarray]) -> None:
        self.clip1, self.clip2, self.grouped = clip1, clip2, grouped
        self.release, self.targets = release, targets
        self.noisy_counts, self.edges = noisy_counts, edges

    @property
    def unseen_groups(self) -> tuple[str, ...]:
        """The clipping groups whose histogram showed no bin above its noise, so that their threshold is the grid's
        top edge (post-processing of the release)."""
        names = GROUP_NAMES if self.grouped else STAGE_NAMES
        sigma = self.release.noise_std
        return tuple(name for name, counts in zip(names, self.noisy_counts)
                     if not seen_bins(counts, sigma).any())

    def unseen_note(self) -> str:
        """A caution when some group's threshold is the grid's top edge (:attr:`unseen_groups`), else "" (the test
        to use: it reads the groups once)."""
        groups = self.unseen_groups
        if not groups:
            return ""
        return (f"the gradient-norm histograms showed no bin above their noise for {', '.join(groups)} (tiny n or "
                "rho_clip), so those clipping thresholds are their grids' top edge: those gradients are barely clipped "
                "and carry much noise, which the standard errors include. Raise rho_clip, or give a public rule "
                "(clip='rms').")


def adaptive_clip(rows, theta0: np.ndarray, beta0: np.ndarray, W0: np.ndarray | None, n_exog: int, *, rho: float,
                  stage_rho: tuple[float, float], rng: np.random.Generator) -> AdaptiveClip:
    """Choose γ1, γ2 privately from one release of gradient-norm histograms at the start (Θ⁽⁰⁾, β⁽⁰⁾).

    Parameters
    ----------
    rows : RowSource
        The working arrays (:mod:`dpivreg.compute.backends`): one pass, the counts summed over blocks.
    theta0, beta0 : ndarray
        The starting point (a warm start from released moments: public).
    W0 : ndarray or None
        The second stage's preconditioner root at the start (x̃ = W0 x̂), None for ``method="gd"``.
    n_exog : int
        Exogenous columns leading Z and X; groups are clipped separately when > 0.
    rho : float
        zCDP budget of the release.
    stage_rho : (float, float)
        The budgets ρ1, ρ2 of the two stages the thresholds are for (public): with each group's dimension
        they set its K (:func:`target_clipped_rows`).
    rng : numpy.random.Generator
        Source of the noise.
    """
    q, p_endog = theta0.shape
    p = beta0.shape[0]
    grouped = n_exog > 0
    dims = _group_dimensions(q, p, n_exog, p_endog, grouped)
    unit_level = getattr(rows, "unit_level", False)
    edges = _group_edges(dims, rows.max_rows if unit_level else 1)
    M, _ = pass_matrix(theta0, beta0, None if W0 is None else W0.T, n_exog)
    name = "gradient-norm histograms for the clipping thresholds"
    if unit_level:  # one count per unit in each histogram: the units' summed gradients
        (counts,) = rows.group_sums(unit_gradient_norm_counts, "unit", M, n_exog, grouped, edges)
        name += " (per-unit gradients)"
    else:
        kernel = resolve_kernel(rows.kernel, q, M.shape[1])
        (counts,) = rows.sums(gradient_norm_counts, M, n_exog, grouped, edges, kernel)
    noisy, release, sigma = release_histogram_counts(counts, rho=rho, rng=rng, stage="rho_clip", name=name)
    stages = [stage_rho[0]] * (len(dims) // 2) + [stage_rho[1]] * (len(dims) // 2)  # stage 1's groups first
    targets = tuple(target_clipped_rows(rows.n_units, r, d) for r, d in zip(stages, dims))
    thresholds = [clip_from_histogram(c, e, target=K, sigma=sigma) for c, e, K in zip(noisy, edges, targets)]
    if grouped:
        clip1, clip2 = (thresholds[0], thresholds[1]), (thresholds[2], thresholds[3])
    else:
        clip1, clip2 = thresholds
    return AdaptiveClip(clip1, clip2, grouped, release, targets, noisy, edges)


def resolve_public_clip(clip, *, n: int, q: int, p: int, p_endog: int, T: int, tau: float, rho1: float,
                        rho2: float):
    """The ``clip`` argument of ``fit`` other than ``"adaptive"`` as (γ1, γ2, description)."""
    if clip is False:
        if math.isfinite(rho1) or math.isfinite(rho2):
            raise ValueError(
                "clip=False (no clipping) leaves the gradients' sensitivity unbounded, so no finite rho1/rho2 "
                "can be guaranteed. Use clipping, or rho1=rho2=numpy.inf for an explicitly non-private run."
            )
        return None, None, "none (NOT private)"
    if clip is True:
        raise TypeError("clip=True is ambiguous: pass None, 'adaptive', 'theorem', 'rms', a number, a pair, "
                        "{'c0': value} or False.")
    if isinstance(clip, str) and clip == "rms":
        gamma1, gamma2 = standardized_clip(q, p, p_endog)
        return gamma1, gamma2, "3 x RMS norm"
    if isinstance(clip, str) and clip == "theorem":
        gamma = theorem_clip(n, q, T, tau=tau)
        return gamma, gamma, "Theorem, c0 = 1"
    if isinstance(clip, str):
        raise ValueError(f"clip as a string must be one of {CLIP_RULES}, got {clip!r}.")
    if isinstance(clip, Mapping):
        if set(clip) != {"c0"}:
            raise ValueError(f'clip as a dict must be {{"c0": value}}, got keys {sorted(clip)}.')
        c0 = clip["c0"]
        if isinstance(c0, bool) or not isinstance(c0, numbers.Real):
            raise TypeError(f'clip["c0"] must be a number > 0, got {c0!r}.')
        if not math.isfinite(c0) or c0 <= 0:
            raise ValueError(f'clip["c0"] must be a finite number > 0, got {c0!r}.')
        gamma = theorem_clip(n, q, T, tau=tau, c0=float(c0))
        return gamma, gamma, f"Theorem, c0 = {c0:g}"
    if isinstance(clip, numbers.Real):
        return check_clip(clip, "clip"), check_clip(clip, "clip"), "user"
    if isinstance(clip, (tuple, list)) and len(clip) == 2:
        return check_clip(clip[0], "clip[0]"), check_clip(clip[1], "clip[1]"), "user"
    raise TypeError(
        f"clip must be None, 'adaptive', 'theorem', 'rms', a number, a (gamma1, gamma2) pair, {{'c0': value}} or "
        f"False; got {clip!r}."
    )
