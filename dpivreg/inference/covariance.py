"""The sampling part of the private estimate's covariance: one small unit per ``cov_type``.

All are 2SLS covariances on the whitened working scale (Z̃ᵀZ̃/n = S = I), where the fitted regressors
are x̂ᵢ = Θ̄ᵀz̃ᵢ with Θ̄ = [I_exog | Θ] the released full first stage, so that X̂ᵀX̂/n = Θ̄ᵀΘ̄:

``"unadjusted"`` (homoskedastic errors; :func:`unadjusted_covariance`)
    σ²(Θ̄ᵀΘ̄)⁻¹/n with σ² the private residual variance (:func:`dpivreg.inference.private.residual_variance_release`,
    or read from the moment release). Stata's ``ivregress 2sls, vce(unadjusted)``, linearmodels'
    ``cov_type="unadjusted"``.

``"robust"`` (heteroskedasticity-robust sandwich; :func:`robust_covariance`)
    (Θ̄ᵀΘ̄)⁻¹ Θ̄ᵀΩΘ̄ (Θ̄ᵀΘ̄)⁻¹/n with Ω = (1/n)Σᵢ z̃ᵢz̃ᵢᵀũᵢ², ũᵢ = ỹᵢ − x̃ᵢᵀβ̃ the structural residuals at the
    released estimate: since x̂ᵢ = Θ̄ᵀz̃ᵢ, Θ̄ᵀΩΘ̄ is X̂ᵀdiag(ũ²)X̂/n, the White (1980) meat of 2SLS, and the
    whole is Stata's ``vce(robust)`` and linearmodels' ``cov_type="robust"`` (``debiased=False``; no
    degrees-of-freedom correction). Ω is a q×q release of the instrument scores sᵢ = z̃ᵢũᵢ
    (:func:`score_meat_release`), the same whatever the number of regressors.

``"clustered"`` (cluster-robust sandwich; :func:`robust_covariance` with a clustered meat)
    (Θ̄ᵀΘ̄)⁻¹ Θ̄ᵀΩ_cΘ̄ (Θ̄ᵀΘ̄)⁻¹/n with Ω_c = (1/n)Σ_c g_c g_cᵀ, g_c = Σ_{i∈c} z̃ᵢũᵢ the cluster's summed scores:
    Θ̄ᵀΩ_cΘ̄ is Σ_c ξ_c ξ_cᵀ/n with ξ_c = Σ_{i∈c} x̂ᵢũᵢ, linearmodels' ``cov_type="clustered"`` (``debiased=False``)
    and Stata's ``vce(cluster ...)``. The clusters are the privacy unit or a coarser public grouping
    (:mod:`dpivreg.privacy.units`); the release clips each cluster's summed score (:func:`score_meat_release` with
    ``clustered=True``), so a neighbour, who replaces one unit, changes one cluster's term.

With privacy units the normaliser n is n̂ = N·k̂ (:mod:`dpivreg.privacy.units`), and a release that clips rows (the robust
meat, its histogram) has ``max_rows_per_unit`` times the sensitivity stated below.

The privacy-noise part is added to each by :mod:`dpivreg.inference`.

The score release (:func:`score_meat_release`, budget ``rho_inf``)
    Two Gaussian mechanisms on the scores at the released β̃ (public), adaptively composed:

    1. a histogram of the score norms ‖sᵢ‖ over the public log grid (bins √2 wide around √q), budget
       ``HISTOGRAM_SHARE``·ρ: replacing a row moves one count, sensitivity √2
       (:func:`dpivreg.privacy.mechanisms.release_histogram_counts`); the threshold C is one bin (``MARGIN_BINS``)
       above the smallest bin edge with at most K = :func:`meat_clipped_rows` rows above it, bins not seen above
       the noise ignored (above 3σ, and a lone bin away from well-resolved data above the histogram's Bonferroni
       level, 3.98σ for 40 bins: :func:`dpivreg.privacy.mechanisms.seen_bins`); the grid's top edge when no bin is
       seen (:func:`dpivreg.privacy.mechanisms.clip_from_histogram`): post-processing. With 3σ alone a lone noise
       bin far above the data set C far too high in 1–4% of releases (the first stage's meat at n = 10⁴: 1% of
       fits, C 2⁹–2¹³ instead of about 23, whose effective F then read about 0);
    2. (1/n)Σᵢ clip_C(sᵢ)clip_C(sᵢ)ᵀ with symmetric Gaussian noise, the rest of ρ (:func:`release_score_meat`):
       the scores clipped to L2 norm C, so replacing a row changes the upper triangle by at most
       ‖ssᵀ − s′s′ᵀ‖_F ≤ √2·C² (:func:`score_meat_sensitivity`; attained by s = Ce₁, s′ = Ce₂), the bound of
       "Analyze Gauss" (:func:`dpivreg.privacy.mechanisms.ball_second_moments`).

    Clipping can only lower the meat, and a lower meat under-covers, so the meat allows fewer clipped rows
    than the gradients (K = min(√n/10, 10) rather than min(√n/2, 50)); the noise, symmetric, costs width but
    no bias. Rows in tail bins whose noisy counts are not seen are invisible to the rule and clipped
    anyway, hence the margin bin and the half of the budget on the histogram. Measured (8 seeds per cell,
    heteroskedastic design with errors ∝ (0.3 + abs(z)), total ρ 0.5–2, normal or t₃ errors): the median
    ratio of the released sampling s.e. to the exact-meat one was 0.87–0.96 with a fifth of the budget
    on the histogram and no margin, 0.91–1.09 with half and one bin, 0.88–1.31 with half and two bins;
    the heaviest tails (t₃ errors times abs(z)) stay 5–10% low at n = 2·10⁴–10⁵, where the few rows
    holding much of Σ‖sᵢ‖² are exactly the ones a private statistic must bound. The released matrix is projected onto
    the positive semi-definite cone with its eigenvalues floored at the noise's standard deviation (post-processing; a
    variance cannot be negative). ``rho = inf`` computes Ω exactly, without clipping (non-private routes and the
    reference checks).

The first stage's meat (:func:`first_stage_meat_release`, budget ``rho_diag``)
    For the robust first-stage Wald statistic of :mod:`dpivreg.inference.diagnostics`: the same two mechanisms on the
    first-stage scores sᵢ = v̂ᵢ ⊗ z̃ᵢ (q·p_endog coordinates; v̂ᵢ = x̃ᵢ,endog − Θ̃ᵀz̃ᵢ the first-stage residuals at the
    released Θ̃, public), whose norm is ‖v̂ᵢ‖·‖z̃ᵢ‖: a histogram of the norms on the grid around √(q·p_endog)
    (sensitivity √2), then (1/n)Σᵢ clip_C(sᵢ)clip_C(sᵢ)ᵀ with noise calibrated to √2·C²/n. Its block j is
    (1/n)Σᵢ z̃ᵢz̃ᵢᵀv̂ᵢⱼ², the White meat of endogenous regressor j's first stage; the off-diagonal blocks are what a
    Kleibergen–Paap statistic would need. It gets 1 − ``ENDOGENEITY_MEAT_SHARE`` of ``rho_diag``.

The robust endogeneity test's meat (:func:`endogeneity_meat_release`, ``ENDOGENEITY_MEAT_SHARE`` of ``rho_diag``)
    For Wooldridge's robust score test of exogeneity (:mod:`dpivreg.inference.iv_tests`): the same two mechanisms on
    the p-coordinate scores sᵢ = rᵢeᵢ, rᵢ = Rᵀwᵢ the first-stage residuals with the regressors partialled out and
    eᵢ = bᵀwᵢ the OLS residual, for maps R, b of the working row wᵢ = [z̃ᵢ, x̃ᵢ,endog, ỹᵢ] that the moment release
    gives (public). A quarter of ``rho_diag``: its p coordinates (one with one endogenous regressor, where the
    sensitivity is C²/n, :func:`score_meat_sensitivity`) need far less than the first stage's q·p.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpivreg._validation import check_raw_clip
from dpivreg.compute.kernels import fused_product_norm_counts, resolve_kernel
from dpivreg.privacy.accounting import Release
from dpivreg.privacy.mechanisms import (
    ball_moment_sum,
    clip_from_histogram,
    histogram_counts,
    log_grid,
    release_histogram_counts,
    release_moment_sum,
)
from dpivreg.privacy.rounding import ball_rounding
from dpivreg.privacy.units import group_sums

__all__ = ["COV_TYPES", "HISTOGRAM_SHARE", "unadjusted_covariance", "robust_covariance", "score_meat_release",
           "meat_clipped_rows", "score_norm_counts", "clipped_score_outer_sum", "resolve_cov_type",
           "release_score_meat", "score_meat_sensitivity", "score_edges", "first_stage_meat_release",
           "first_stage_score_counts", "clipped_first_stage_outer_sum", "release_first_stage_meat", "ReleasedMeat",
           "structural_scores", "first_stage_scores", "cluster_score_counts", "cluster_clipped_outer_sum",
           "endogeneity_scores", "endogeneity_score_counts", "clipped_endogeneity_outer_sum",
           "endogeneity_meat_release", "release_endogeneity_meat", "release_meat", "ENDOGENEITY_MEAT_SHARE",
           "MeatRequest", "release_meats", "many_score_counts", "many_outer_sums", "many_cluster_score_counts",
           "many_cluster_outer_sums"]

#: The sampling covariances ``fit(cov_type=...)`` offers, and linearmodels' synonyms for them.
COV_TYPES = ("robust", "unadjusted", "clustered")
_SYNONYMS = {"heteroskedastic": "robust", "homoskedastic": "unadjusted"}
#: Share of the score release's budget spent on the histogram that sets its clipping threshold.
HISTOGRAM_SHARE = 0.5
#: Bins (each a factor √2) added above the histogram rule's threshold, for the tail hidden under the noise.
MARGIN_BINS = 1
#: Share of ``rho_diag`` spent on the robust endogeneity test's meat (p coordinates); the rest buys the first stage's
#: meat (q·p coordinates).
ENDOGENEITY_MEAT_SHARE = 0.25


def resolve_cov_type(cov_type) -> str:
    """``cov_type`` checked and with linearmodels' synonyms ("heteroskedastic", "homoskedastic") mapped."""
    if not isinstance(cov_type, str):
        raise TypeError(f"cov_type must be one of {COV_TYPES} (a string), got {cov_type!r}.")
    name = _SYNONYMS.get(cov_type.lower(), cov_type.lower())
    if name not in COV_TYPES:
        raise ValueError(f"cov_type must be one of {COV_TYPES} (or linearmodels' 'heteroskedastic', "
                         f"'homoskedastic'), got {cov_type!r}. Kernel (HAC) covariances are not available.")
    return name


def _full_first_stage(theta_endog: np.ndarray, n_exog: int) -> np.ndarray:
    q = theta_endog.shape[0]
    return np.concatenate([np.eye(q, n_exog), theta_endog], axis=1)


def unadjusted_covariance(theta_endog: np.ndarray, n_exog: int, sigma2: float, n: int) -> np.ndarray:
    """Homoskedastic 2SLS covariance σ²(Θ̄ᵀΘ̄)⁻¹/n on the whitened working scale (S = I)."""
    theta_full = _full_first_stage(theta_endog, n_exog)
    return sigma2 * _bread(theta_full) / n


def _bread(theta_full: np.ndarray) -> np.ndarray:
    """(Θ̄ᵀΘ̄)⁻¹; all inf for a singular released first stage (no finite covariance: the inference says so)."""
    try:
        return np.linalg.inv(theta_full.T @ theta_full)
    except np.linalg.LinAlgError:
        return np.full((theta_full.shape[1],) * 2, np.inf)


def robust_covariance(theta_endog: np.ndarray, n_exog: int, meat: np.ndarray, n: int) -> np.ndarray:
    """The 2SLS sandwich (Θ̄ᵀΘ̄)⁻¹Θ̄ᵀΩΘ̄(Θ̄ᵀΘ̄)⁻¹/n on the whitened working scale, Ω the q×q score meat."""
    theta_full = _full_first_stage(theta_endog, n_exog)
    bread = _bread(theta_full)
    V = bread @ (theta_full.T @ meat @ theta_full) @ bread / n
    return (V + V.T) / 2.0


def score_edges(q: int, rows_per_group: float = 1.0) -> np.ndarray:
    """The score histogram's public bin edges: √2 apart around √q (the scores' unit scale), reaching ``rows_per_group``
    times higher (rounded up to a power of 2; public: a cluster's summed score grows with its rows)."""
    return log_grid(math.sqrt(q), above=12 + max(0, math.ceil(math.log2(max(rows_per_group, 1.0)))))


def meat_clipped_rows(n: int) -> float:
    """K = min(√n/10, 10): the rows the score release's threshold may leave above it (module docstring)."""
    return min(0.1 * math.sqrt(n), 10.0)


def _clipped_gram(S: np.ndarray, bound: float) -> np.ndarray:
    """Σ clip(s)clip(s)ᵀ of the rows of S clipped to L2 norm ``bound`` (inf: SᵀS, not clipped)."""
    return S.T @ S if math.isinf(bound) else ball_moment_sum(S, bound)


def structural_residuals(Z, X_endog, Y, beta, n_exog: int) -> np.ndarray:
    """ũᵢ = ỹᵢ − x̃ᵢᵀβ̃ with x̃ᵢ = [z̃ᵢ[:n_exog], x̃ᵢ,endog] (the exogenous columns lead Z)."""
    return Y - Z[:, :n_exog] @ beta[:n_exog] - X_endog @ beta[n_exog:]


def structural_scores(Z, X_endog, Y, beta, n_exog: int) -> np.ndarray:
    """The instrument scores sᵢ = z̃ᵢũᵢ of the robust and clustered meats, one row each."""
    return Z * structural_residuals(Z, X_endog, Y, beta, n_exog)[:, None]


def score_norm_counts(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, beta: np.ndarray, n_exog: int,
                      edges: np.ndarray, kernel: str = "auto") -> tuple[np.ndarray]:
    """Histogram counts of one block's score norms ‖z̃ᵢ‖·abs(ũᵢ) (a block function). ``kernel`` (as
    :func:`dpivreg.compute.kernels.resolve_kernel`; the meat release passes its row source's) "numba" bins them in the
    clipping release's compiled loop (:func:`dpivreg.compute.kernels.fused_product_norm_counts`,
    ũᵢ = (ỹᵢ − x̃ᵢ,endogᵀβ̃_endog) − z̃ᵢ[:k]ᵀβ̃_exog): the same counts up to a norm that rounding moves across a bin
    edge."""
    if resolve_kernel(kernel, Z.shape[1], Z.shape[1] + 2) == "numba":
        A = np.zeros((Z.shape[1], 1))
        A[:n_exog, 0] = beta[:n_exog]
        return (fused_product_norm_counts(Z, A, (Y - X_endog @ beta[n_exog:])[:, None], edges),)
    u = structural_residuals(Z, X_endog, Y, beta, n_exog)
    norms = np.sqrt(np.einsum("ij,ij->i", Z, Z)) * np.abs(u)
    return (histogram_counts(norms, edges),)


def clipped_score_outer_sum(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, beta: np.ndarray, n_exog: int,
                            bound: float) -> tuple[np.ndarray]:
    """Σᵢ clip(sᵢ)clip(sᵢ)ᵀ over one block, sᵢ = z̃ᵢũᵢ clipped to L2 norm ``bound`` (inf: not clipped)."""
    S = structural_scores(Z, X_endog, Y, beta, n_exog)
    return (_clipped_gram(S, bound),)


def first_stage_scores(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """sᵢ = v̂ᵢ ⊗ z̃ᵢ (coordinate j·q + l is v̂ᵢⱼz̃ᵢₗ), v̂ᵢ = x̃ᵢ,endog − Θ̃ᵀz̃ᵢ (``Y`` unused)."""
    V = X_endog - Z @ theta
    return (V[:, :, None] * Z[:, None, :]).reshape(Z.shape[0], -1)


def cluster_score_counts(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, starts: np.ndarray, scores, args: tuple,
                         edges: np.ndarray) -> tuple[np.ndarray]:
    """Histogram counts of one block's *cluster* score norms ‖Σ_{i∈c} sᵢ‖ (a grouped block function: the clusters
    start at ``starts``), the scores ``scores(Z, X_endog, Y, *args)`` (:func:`structural_scores`,
    :func:`first_stage_scores`)."""
    counts = np.zeros(edges.shape[0] - 1)

    def consume(S: np.ndarray) -> None:
        counts[:] += histogram_counts(np.sqrt(np.einsum("ij,ij->i", S, S)), edges)

    group_sums(lambda rows: scores(Z[rows], X_endog[rows], Y[rows], *args), starts, Z.shape[0], consume,
               width=Z.shape[1] * (1 + X_endog.shape[1]))
    return (counts,)


def cluster_clipped_outer_sum(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, starts: np.ndarray, scores,
                              args: tuple, bound: float) -> tuple[np.ndarray]:
    """Σ_c clip(g_c)clip(g_c)ᵀ over one block's clusters, g_c = Σ_{i∈c} sᵢ clipped to L2 norm ``bound`` (inf: not
    clipped); a grouped block function as :func:`cluster_score_counts`."""
    total: list = []

    def consume(S: np.ndarray) -> None:
        part = _clipped_gram(S, bound)
        if total:
            total[0] += part
        else:
            total.append(part)

    group_sums(lambda rows: scores(Z[rows], X_endog[rows], Y[rows], *args), starts, Z.shape[0], consume,
               width=Z.shape[1] * (1 + X_endog.shape[1]))
    return (total[0],)


def first_stage_score_counts(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, theta: np.ndarray,
                             edges: np.ndarray, kernel: str = "auto") -> tuple[np.ndarray]:
    """Histogram counts of one block's first-stage score norms ‖v̂ᵢ‖·‖z̃ᵢ‖ (a block function); ``kernel`` as for
    :func:`score_norm_counts` (numba: ‖z̃ᵢ‖·‖z̃ᵢᵀΘ̃ − x̃ᵢ,endog‖)."""
    if resolve_kernel(kernel, Z.shape[1], theta.shape[1] + 2) == "numba":
        return (fused_product_norm_counts(Z, theta, X_endog, edges),)
    V = X_endog - Z @ theta
    norms = np.sqrt(np.einsum("ij,ij->i", Z, Z) * np.einsum("ij,ij->i", V, V))
    return (histogram_counts(norms, edges),)


def clipped_first_stage_outer_sum(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, theta: np.ndarray,
                                  bound: float) -> tuple[np.ndarray]:
    """Σᵢ clip(sᵢ)clip(sᵢ)ᵀ over one block for the first-stage scores sᵢ = v̂ᵢ ⊗ z̃ᵢ (inf: not clipped)."""
    S = first_stage_scores(Z, X_endog, Y, theta)
    return (_clipped_gram(S, bound),)


def _endogeneity_parts(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, R: np.ndarray, b: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(r (n, p), e (n,)) = (WR, Wb) for the working rows W = [Z, X_endog, Y], without forming W."""
    q, p = Z.shape[1], X_endog.shape[1]
    r = Z @ R[:q] + X_endog @ R[q:q + p] + Y[:, None] * R[q + p]
    return r, Z @ b[:q] + X_endog @ b[q:q + p] + Y * b[q + p]


def endogeneity_scores(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, R: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The robust endogeneity test's scores sᵢ = rᵢeᵢ (p coordinates), rᵢ = Rᵀwᵢ and eᵢ = bᵀwᵢ for the working row
    wᵢ = [z̃ᵢ, x̃ᵢ,endog, ỹᵢ] (module docstring)."""
    r, e = _endogeneity_parts(Z, X_endog, Y, R, b)
    return r * e[:, None]


def endogeneity_score_counts(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, R: np.ndarray, b: np.ndarray,
                             edges: np.ndarray, kernel: str = "auto") -> tuple[np.ndarray]:
    """Histogram counts of one block's endogeneity score norms ‖rᵢ‖·abs(eᵢ) (a block function; ``kernel`` unused:
    the scores have p coordinates, a small fraction of the pass's cost)."""
    r, e = _endogeneity_parts(Z, X_endog, Y, R, b)
    return (histogram_counts(np.sqrt(np.einsum("ij,ij->i", r, r)) * np.abs(e), edges),)


def clipped_endogeneity_outer_sum(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, R: np.ndarray, b: np.ndarray,
                                  bound: float) -> tuple[np.ndarray]:
    """Σᵢ clip(sᵢ)clip(sᵢ)ᵀ over one block for the endogeneity scores sᵢ = rᵢeᵢ (inf: not clipped)."""
    S = endogeneity_scores(Z, X_endog, Y, R, b)
    return (_clipped_gram(S, bound),)


@dataclass(frozen=True)
class ReleasedMeat:
    """A released meat (1/n)Σᵢ clip(sᵢ)clip(sᵢ)ᵀ on the working scale, positive definite, with what a
    simulation of its noise needs: the noise's standard deviation per upper-triangle entry (0: exact) and the
    clipping threshold C (inf: not clipped); ``clustered`` when it sums the clusters' scores."""

    matrix: np.ndarray
    sigma: float
    bound: float
    releases: tuple[Release, ...]
    clustered: bool = False

    def rereleased(self, rng: np.random.Generator, replications: int) -> np.ndarray:
        """The plug-in world's re-releases (replications, d, d): the released matrix taken as the truth, fresh
        draws of the release's symmetric noise added and the result projected as the release was."""
        d = self.matrix.shape[0]
        upper = np.triu(rng.standard_normal((replications, d, d)) * self.sigma)
        return _positive_definite(self.matrix + upper + np.swapaxes(np.triu(upper, 1), 1, 2), floor=self.sigma)


def score_meat_release(rows, beta: np.ndarray, n_exog: int, *, rho: float, rng: np.random.Generator,
                       clustered: bool = False) -> tuple[np.ndarray, tuple[Release, ...], float]:
    """Release the score meat Ω = (1/n)Σᵢ z̃ᵢz̃ᵢᵀũᵢ² at the released β̃ (module docstring), or with ``clustered``
    Ω = (1/n)Σ_c g_c g_cᵀ with g_c = Σ_{i∈c} z̃ᵢũᵢ over the row source's clusters (:mod:`dpivreg.privacy.units`).

    Parameters
    ----------
    rows : RowSource
        The working arrays (:mod:`dpivreg.compute.backends`): two passes, sums over blocks.
    beta : ndarray (p,)
        The released estimate on the working scale (public).
    n_exog : int
        Exogenous columns leading Z and X.
    rho : float
        zCDP budget of the whole release (``inf``: Ω exactly, unclipped, no record).
    rng : numpy.random.Generator
        Source of the noise.
    clustered : bool
        Clip and sum the scores per cluster (the rows' ``groups``), not per row.

    Returns
    -------
    meat : ndarray (q, q)
        The released Ω, symmetric positive definite.
    releases : tuple of Release
        The histogram's and the meat's records (stage ``"rho_inf"``); empty for ``rho = inf``.
    bound : float
        The clipping threshold C (inf for ``rho = inf``).
    """
    meat = _meat_release(rows, structural_scores, (beta, n_exog), dim=rows.q, rho=rho, rng=rng,
                         what="the clustered meat" if clustered else "the robust meat", clustered=clustered)
    return meat.matrix, meat.releases, meat.bound


def first_stage_meat_release(rows, theta: np.ndarray, *, rho: float, rng: np.random.Generator,
                             clustered: bool = False) -> ReleasedMeat:
    """Release the first stage's meat (1/n)Σᵢ (v̂ᵢ ⊗ z̃ᵢ)(v̂ᵢ ⊗ z̃ᵢ)ᵀ at the released working first stage
    ``theta`` (q, p_endog), budget ``rho`` (stage ``"rho_diag"``; module docstring), per cluster with
    ``clustered``. ``rho = inf``: exact."""
    return _meat_release(rows, first_stage_scores, (theta,), dim=rows.q * theta.shape[1], rho=rho, rng=rng,
                         what="the first stage's meat", clustered=clustered)


def endogeneity_meat_release(rows, R: np.ndarray, b: np.ndarray, *, rho: float, rng: np.random.Generator,
                             clustered: bool = False) -> ReleasedMeat:
    """Release the robust endogeneity test's meat (1/n)Σᵢ rᵢrᵢᵀeᵢ² (module docstring) for the public maps ``R``
    (D, p) and ``b`` (D,) of the working row [z̃ᵢ, x̃ᵢ,endog, ỹᵢ] (D = q + p + 1), budget ``rho`` (stage
    ``"rho_diag"``), per cluster with ``clustered``. ``rho = inf``: exact."""
    return _meat_release(rows, endogeneity_scores, (R, b), dim=R.shape[1], rho=rho, rng=rng,
                         what="the endogeneity test's meat", clustered=clustered)


@dataclass(frozen=True)
class _ScoreKind:
    """What a meat release needs to know of one kind of score: its row-level block functions (norm histogram,
    clipped outer sum), its budget's stage, and the accountant's words for the meat and the scores."""

    counts: Callable
    outer_sum: Callable
    stage: str
    meat: str
    scores: str


_SCORE_KINDS = {
    structural_scores: _ScoreKind(score_norm_counts, clipped_score_outer_sum, "rho_inf", "robust meat",
                                  "instrument scores"),
    first_stage_scores: _ScoreKind(first_stage_score_counts, clipped_first_stage_outer_sum, "rho_diag",
                                   "first-stage meat", "first-stage scores"),
    endogeneity_scores: _ScoreKind(endogeneity_score_counts, clipped_endogeneity_outer_sum, "rho_diag",
                                   "endogeneity-test meat", "endogeneity scores"),
}




@dataclass(frozen=True)
class MeatRequest:
    """One meat for :func:`release_meats`: the scores ``scores(Z, X_endog, Y, *args)`` of ``dim`` coordinates,
    released with budget ``rho`` (``inf``: exactly, unclipped, no record); ``what`` names it in the records."""

    scores: Callable
    args: tuple
    dim: int
    rho: float
    what: str


@dataclass(frozen=True)
class _Job:
    """What one block function computes for one meat in a shared pass: its scores, their arguments, and the
    histogram's edges or the clipping threshold (an object, not a tuple: a graph builder may read a tuple that
    starts with a function as a task)."""

    scores: Callable
    args: tuple
    extra: Any


def many_score_counts(Z, X_endog, Y, jobs: tuple, kernel: str = "auto") -> tuple:
    """The norm histograms of several meats' scores over one block, in one pass (a block function; ``jobs`` carry
    the edges)."""
    return tuple(_SCORE_KINDS[job.scores].counts(Z, X_endog, Y, *job.args, job.extra, kernel)[0] for job in jobs)


def many_outer_sums(Z, X_endog, Y, jobs: tuple) -> tuple:
    """The clipped outer-product sums of several meats' scores over one block, in one pass (``jobs`` carry the
    thresholds)."""
    return tuple(_SCORE_KINDS[job.scores].outer_sum(Z, X_endog, Y, *job.args, job.extra)[0] for job in jobs)


def many_cluster_score_counts(Z, X_endog, Y, starts, jobs: tuple) -> tuple:
    """:func:`cluster_score_counts` of several meats over one block's clusters, in one pass."""
    return tuple(cluster_score_counts(Z, X_endog, Y, starts, job.scores, job.args, job.extra)[0] for job in jobs)


def many_cluster_outer_sums(Z, X_endog, Y, starts, jobs: tuple) -> tuple:
    """:func:`cluster_clipped_outer_sum` of several meats over one block's clusters, in one pass."""
    return tuple(cluster_clipped_outer_sum(Z, X_endog, Y, starts, job.scores, job.args, job.extra)[0]
                 for job in jobs)


def _norm_counts(rows, jobs: tuple, clustered: bool) -> tuple:
    """The score-norm histograms of ``jobs`` (edges in ``extra``) over the rows or the clusters, in one pass."""
    if clustered:
        return rows.group_sums(many_cluster_score_counts, "cluster", jobs)
    return rows.sums(many_score_counts, jobs, rows.kernel)


def _outer_sums(rows, jobs: tuple, clustered: bool) -> tuple:
    """Σ clip_C(s)clip_C(s)ᵀ of ``jobs`` (thresholds C in ``extra``) over the rows or the clusters' summed scores,
    in one pass."""
    if clustered:
        return rows.group_sums(many_cluster_outer_sums, "cluster", jobs)
    return rows.sums(many_outer_sums, jobs)


def release_meats(rows, requests, *, rng: np.random.Generator, clustered: bool = False) -> tuple[ReleasedMeat, ...]:
    """The histogram-then-meat release of the module docstring for each of ``requests`` (:class:`MeatRequest`), over
    the rows or with ``clustered`` over the clusters' summed scores, the data passes shared: one pass gives every
    histogram, whose thresholds are then released in order, and one more every clipped sum, whose noise is then
    drawn in order. Each release is recorded on its own (adaptive composition: a threshold is post-processing of its
    histogram). With one request the draws are those of a release on its own.

    Sensitivities: a cluster (which holds whole privacy units) changes one term when a unit is replaced, a row-wise
    release at most ``rows.max_rows`` terms (m with privacy units, :mod:`dpivreg.privacy.units`): the histogram's √2 and
    the meat's √2·C²/n (C²/n for one coordinate) are multiplied by that number of terms.
    """
    n = rows.n
    terms = 1 if clustered else rows.max_rows
    groups = rows.groups.count("cluster") if clustered else n
    noisy = [i for i, request in enumerate(requests) if not math.isinf(request.rho)]
    bounds = [math.inf] * len(requests)
    histograms: dict[int, Release] = {}
    if noisy:
        edges = {i: score_edges(requests[i].dim, n / groups if clustered else 1.0) for i in noisy}
        jobs = tuple(_Job(requests[i].scores, requests[i].args, edges[i]) for i in noisy)
        for i, count in zip(noisy, _norm_counts(rows, jobs, clustered)):
            bounds[i], histograms[i] = _threshold(count, edges[i], requests[i], rng=rng, terms=terms, groups=groups)
    totals = _outer_sums(rows, tuple(_Job(r.scores, r.args, bound) for r, bound in zip(requests, bounds)), clustered)
    meats = []
    for i, (request, total) in enumerate(zip(requests, totals)):
        if i not in histograms:
            meats.append(ReleasedMeat(total / n, 0.0, math.inf, (), clustered))
            continue
        meat, record, sigma = _noised_meat(rows, request.scores, total, bound=bounds[i],
                                           rho=(1.0 - HISTOGRAM_SHARE) * request.rho, rng=rng, clustered=clustered)
        meats.append(ReleasedMeat(_positive_definite(meat, floor=sigma), sigma, bounds[i], (histograms[i], record),
                                  clustered))
    return tuple(meats)


def _threshold(counts: np.ndarray, edges: np.ndarray, request: MeatRequest, *, rng: np.random.Generator,
               terms: int, groups: float) -> tuple[float, Release]:
    """The released histogram of one meat's score norms (``HISTOGRAM_SHARE`` of its budget) and the clipping
    threshold read from it (post-processing; module docstring)."""
    noisy, histogram, sigma_h = release_histogram_counts(
        counts[None, :], rho=HISTOGRAM_SHARE * request.rho, rng=rng, stage=_SCORE_KINDS[request.scores].stage,
        max_rows=terms, name=f"score-norm histogram for {request.what}'s threshold")
    # nothing seen above the noise (tiny n or budget): the top edge, a wide meat rather than a clipped-away one
    bound = clip_from_histogram(noisy[0], edges, target=meat_clipped_rows(groups), sigma=sigma_h)
    return float(edges[min(int(np.searchsorted(edges, bound)) + MARGIN_BINS, len(edges) - 1)]), histogram


def _meat_release(rows, scores, args: tuple, *, dim: int, rho: float, rng: np.random.Generator, what: str,
                  clustered: bool = False) -> ReleasedMeat:
    """One meat's :func:`release_meats`."""
    return release_meats(rows, [MeatRequest(scores, args, dim, rho, what)], rng=rng, clustered=clustered)[0]


def _meat_name(scores, clustered: bool, terms: int) -> str:
    """The accountant's name of a meat release: which scores, clipped per row (per unit of ``terms`` rows) or per
    cluster."""
    kind = _SCORE_KINDS[scores]
    if clustered:
        return f"clustered {kind.meat} (clipped cluster sums of {kind.scores})"
    return f"{kind.meat} (clipped {kind.scores})" + (f", per unit of at most {terms} rows" if terms > 1 else "")


def score_meat_sensitivity(bound: float, n: float, terms: int = 1, dim: int = 2) -> float:
    """L2 sensitivity √2·C²/n of the upper triangle of (1/n)Σᵢ clip_C(sᵢ)clip_C(sᵢ)ᵀ when a neighbour changes one
    term (a row, or a cluster's sum), ``terms``·√2·C²/n when it changes up to that many (the rows of a privacy
    unit: pair the two units' rows, an unpaired row's term has norm at most C²). Scores of ``dim`` = 1 coordinate
    have one entry, s² ∈ [0, C²]: C²/n (attained by s = C, s′ = 0)."""
    return terms * (math.sqrt(2.0) if dim > 1 else 1.0) * bound**2 / n


def release_meat(rows, scores, args: tuple, *, bound: float, rho: float, rng: np.random.Generator,
                 clustered: bool = False) -> tuple[np.ndarray, Release, float]:
    """The Gaussian mechanism of a meat at a given threshold C = ``bound``: (1/n)Σᵢ clip_C(sᵢ)clip_C(sᵢ)ᵀ of the
    scores ``scores(Z, X_endog, Y, *args)`` (or over the clusters' summed scores) with symmetric noise of standard
    deviation :func:`score_meat_sensitivity`/√(2ρ), recorded under the scores' stage. Returns the released matrix
    (not yet projected), its record and σ."""
    bound = _checked_bound(bound)
    (total,) = _outer_sums(rows, (_Job(scores, args, bound),), clustered)
    return _noised_meat(rows, scores, total, bound=bound, rho=rho, rng=rng, clustered=clustered)


def _noised_meat(rows, scores, total: np.ndarray, *, bound: float, rho: float, rng: np.random.Generator,
                 clustered: bool) -> tuple[np.ndarray, Release, float]:
    """(1/n)·``total`` (the clipped outer-product sum of ``scores`` at threshold ``bound``) with the meat's Gaussian
    noise, recorded under the scores' stage."""
    terms = 1 if clustered else rows.max_rows
    return _gaussian_meat(total, rows.n, bound=bound, rho=rho, rng=rng, stage=_SCORE_KINDS[scores].stage,
                          terms=terms, name=_meat_name(scores, clustered, terms), summed=_summed_terms(rows, clustered))


def release_score_meat(rows, beta: np.ndarray, n_exog: int, *, bound: float, rho: float,
                       rng: np.random.Generator, clustered: bool = False) -> tuple[np.ndarray, Release, float]:
    """:func:`release_meat` of the instrument scores z̃ᵢũᵢ at ``beta`` (stage ``"rho_inf"``)."""
    return release_meat(rows, structural_scores, (beta, n_exog), bound=bound, rho=rho, rng=rng, clustered=clustered)


def release_first_stage_meat(rows, theta: np.ndarray, *, bound: float, rho: float,
                             rng: np.random.Generator, clustered: bool = False) -> tuple[np.ndarray, Release, float]:
    """:func:`release_meat` of the first-stage scores v̂ᵢ ⊗ z̃ᵢ at ``theta`` (stage ``"rho_diag"``)."""
    return release_meat(rows, first_stage_scores, (theta,), bound=bound, rho=rho, rng=rng, clustered=clustered)


def release_endogeneity_meat(rows, R: np.ndarray, b: np.ndarray, *, bound: float, rho: float,
                             rng: np.random.Generator, clustered: bool = False) -> tuple[np.ndarray, Release, float]:
    """:func:`release_meat` of the endogeneity test's scores rᵢeᵢ for the maps ``R``, ``b`` (stage ``"rho_diag"``)."""
    return release_meat(rows, endogeneity_scores, (R, b), bound=bound, rho=rho, rng=rng, clustered=clustered)


def _summed_terms(rows, clustered: bool) -> int:
    """A public bound on the terms a meat sums (:mod:`dpivreg.privacy.rounding`): the G clusters, or the rows, at most
    N·m with privacy units (N units of at most m rows)."""
    if clustered:
        return rows.groups.count("cluster")
    return rows.n_units * rows.max_rows


def _checked_bound(bound) -> float:
    """A meat's clipping threshold C: ``inf`` (no clipping, not private) or a threshold of
    :func:`dpivreg._validation.check_raw_clip` (under 1e-100, C² over n rounds to 0 and the release has no noise)."""
    return math.inf if bound == math.inf else check_raw_clip(bound, "bound")


def _gaussian_meat(total: np.ndarray, n: float, *, bound: float, rho: float, rng: np.random.Generator, name: str,
                   stage: str, terms: int = 1, summed: int | None = None) -> tuple[np.ndarray, Release, float]:
    """(1/n)·``total`` (a sum of clip_C(s)clip_C(s)ᵀ of d-dimensional scores) with symmetric Gaussian noise for the
    sensitivity :func:`score_meat_sensitivity` (``terms`` changed by a neighbour) times the rounding allowance of the
    blocked sum of at most ``summed`` terms (default n; :func:`dpivreg.privacy.rounding.ball_rounding`)."""
    summed = int(math.ceil(n)) if summed is None else int(summed)
    return release_moment_sum(total, n, rho=rho, rng=rng,
                              sensitivity=score_meat_sensitivity(bound, n, terms, dim=total.shape[0]),
                              bound=bound, name=name, stage=stage,
                              rounding=ball_rounding(summed, total.shape[0], terms))


def _positive_definite(M: np.ndarray, *, floor: float) -> np.ndarray:
    """The symmetric M (…, d, d) with its eigenvalues raised to at least ``floor`` (post-processing of a
    release)."""
    values, vectors = np.linalg.eigh((M + np.swapaxes(M, -1, -2)) / 2.0)
    return (vectors * np.maximum(values, floor)[..., None, :]) @ np.swapaxes(vectors, -1, -2)
