"""The rounding allowance of every release whose data part is a floating-point sum.

A release adds noise to q(D) = (1/n)·Σᵢ tᵢ, a sum of N per-row (per-unit, per-cluster) terms of L2 norm at most C,
and its sensitivity Δ is proved for exact arithmetic. What is noised is the *computed* q̂(D), and the computed sums
of two neighbours can differ by more than Δ (Casacuberta, Shoemate, Vadhan & Wagaman 2022, "Widespread
underestimation of sensitivity in differentially private libraries and how to fix it"). This module bounds by how
much, and every summed release multiplies its Δ (and its noise, so that it spends the same ρ) by the factor.

The bound (Higham 2002, *Accuracy and Stability of Numerical Algorithms*, Lemma 3.1, §3.1 and §4.2). If every term's
coordinates pass through at most k roundings (a product, the additions on its way up a summation tree, a final
division), each with relative error at most u (2⁻⁵³ in float64, round to nearest), then coordinate by coordinate

    q̂(D) = (1/n)·Σᵢ tᵢ ∘ (1 + θᵢ),   abs(θᵢ) ≤ γ_k = k·u/(1 − k·u),

whatever the order of the tree (a fused multiply-add rounds once, which only helps). Hence
‖q̂(D) − q(D)‖₂ ≤ (γ_k/n)·Σᵢ ‖tᵢ‖₂ ≤ γ_k·N·C/n, and for neighbours D, D′

    ‖q̂(D) − q̂(D′)‖₂ ≤ Δ + 2·γ_k·N·C/n = Δ·(1 + 2·γ_k·N·r),   r = C/(n·Δ),

r the largest term's norm over the exact *sum*'s sensitivity (1/2 for a clipped gradient: C = γ, n·Δ = 2γ). The
terms are the computed per-row (per-unit, per-cluster) terms, each a function of its own row (group) alone: the
order of operations depends on public counts and each group's own size, never on values or on the rows before a
group (with privacy units those are private: :func:`dpivreg.privacy.units.group_sums` cuts only where groups start),
so the exact sums of two neighbours' computed terms differ in the replaced terms only — except where a choice of
kernel made from all the rows (the gradients' fast or safe pass) moves every term within ε·C of its exact value,
which adds 2·N·r·ε (``term_error``). Where the
clipping itself is computed in floating point, a term's norm is at most C·(1 + τ) (``slack`` τ), which multiplies
both parts: the factor is (1 + τ)·(1 + 2·γ_k·N·r) (:func:`sum_rounding`).

The depth k is public because dpivreg enforces the order of summation (:mod:`dpivreg.compute.backends`,
:func:`blocked_gram`): a block function sums at most :data:`SUM_BLOCK_TERMS` = 2¹⁶ terms in whatever order its BLAS,
numba or numpy loop takes (at most 2¹⁶ − 1 additions on any term's way), and block results are added by pairwise
summation (:func:`pairwise_sum`, depth ⌈log₂ P⌉ over P ≤ N non-zero partials) on at most :data:`COMBINE_LEVELS` = 2
levels (the blocks of a thread's range or a Dask partition, then the ranges or partitions). With one rounding for the
product inside the sum and one for the division by n::

    k(N) = 1 + (min(N, 2¹⁶) − 1) + 2·⌈log₂ N⌉ + 1 (+ ``extra``) = min(N, 2¹⁶) + 2·⌈log₂ N⌉ + 1 (+ extra).

At N = 10⁸ that is 65,591, and the clipped mean's factor 1 + N·γ_k is 1 + 7.28·10⁻⁴; with whole-array sums (k = N)
it would be 2.1 (Casacuberta et al.'s point). Counts (histograms) are integers below 2⁵³ and are summed exactly.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["UNIT_ROUNDOFF", "SUM_BLOCK_TERMS", "COMBINE_LEVELS", "CLIP_SLACK", "EXACT_COUNT_LIMIT", "gamma",
           "ceil_log2", "summation_depth", "sum_rounding", "gradient_rounding", "ball_rounding", "box_rounding",
           "pairwise_sum", "blocked_gram"]

#: u, the unit roundoff of float64 with rounding to nearest (Higham 2002, §2.1).
UNIT_ROUNDOFF = 2.0**-53

#: Most terms one block function sums (in any order) before its result is combined with others'.
SUM_BLOCK_TERMS = 1 << 16

#: Levels of pairwise combination of block results above the block functions (see the module docstring).
COMBINE_LEVELS = 2

#: τ of the clipped gradients beyond the norms' relative rounding: the fast passes' 2⁻³⁷·γ for squares that
#: underflow (:func:`dpivreg.compute.kernels.group_clips`) and the safe passes' logarithmic scales (under
#: 1,500·u·γ), together under 2⁻³⁶·γ.
CLIP_SLACK = 2.0**-36

#: Integers below this are exact in float64, and so are their sums while they stay below it: counts are exact.
EXACT_COUNT_LIMIT = 2**53

# The factor is evaluated in floating point (a few roundings of about u each): rounded up by this much, it is never
# below the exact value of the closed form.
_EVALUATION_MARGIN = 1.0 + 2.0**-48


def gamma(k: int, u: float = UNIT_ROUNDOFF) -> float:
    """γ_k = k·u/(1 − k·u) (Higham 2002, Lemma 3.1): the relative error bound of k roundings."""
    if k < 0 or not k * u < 1.0:
        raise ValueError(f"gamma needs 0 <= k·u < 1, got k = {k} and u = {u}.")
    return k * u / (1.0 - k * u)


def ceil_log2(count: int) -> int:
    """⌈log₂ count⌉ for count ≥ 1 (0 for 1): the depth of pairwise summation over ``count`` items."""
    return (int(count) - 1).bit_length()


def summation_depth(terms: int, *, block_terms: int = SUM_BLOCK_TERMS, extra: int = 0) -> int:
    """k(N) = min(N, b) + 2·⌈log₂ N⌉ + 1 + ``extra``: the most roundings a term's coordinate passes through in a
    release of a sum of N = ``terms`` terms, summed in blocks of at most b = ``block_terms`` and combined pairwise
    on :data:`COMBINE_LEVELS` levels, one product and one division included (module docstring)."""
    terms = max(int(terms), 1)
    return min(terms, int(block_terms)) + COMBINE_LEVELS * ceil_log2(terms) + 1 + int(extra)


def sum_rounding(terms: int, ratio: float, *, slack: float = 0.0, term_error: float = 0.0,
                 u: float = UNIT_ROUNDOFF, block_terms: int = SUM_BLOCK_TERMS, extra: int = 0) -> float:
    """The factor (1 + τ)·(1 + 2·γ_k·N·r) + 2·N·r·ε by which a summed release's sensitivity is multiplied (module
    docstring).

    Parameters
    ----------
    terms : int
        N, a public bound on the number of terms summed (rows, units or clusters).
    ratio : float
        r = C/(n·Δ): the largest term's L2 norm over the exact sum's sensitivity.
    slack : float
        τ: the relative excess of a computed term's norm over C (floating-point clipping).
    term_error : float
        ε: where a computed term can differ from a function of its own row alone by up to ε·C (the clipped
        gradients: a pass is recomputed by the safe kernel when any row needs it, so one neighbour's row decides
        which computation every other row gets; both are within the clipping's slack of the exact clipped term),
        the untouched terms of two neighbours differ by up to 2·ε·C each: 2·N·r·ε is added.
    u : float
        The unit roundoff (2⁻⁵³; the tests also use float32's 2⁻²⁴).
    block_terms, extra : int
        See :func:`summation_depth`.

    Returns
    -------
    float
        At least the exact value of the closed form (rounded up).
    """
    k = summation_depth(terms, block_terms=block_terms, extra=extra)
    excess = 2.0 * gamma(k, u) * max(int(terms), 1) * float(ratio)
    switch = 2.0 * max(int(terms), 1) * float(ratio) * term_error
    return ((1.0 + slack) * (1.0 + excess) + switch) * _EVALUATION_MARGIN


def gradient_rounding(terms: int, q: int, p: int, p_endog: int, *, u: float = UNIT_ROUNDOFF) -> float:
    """The factor of a clipped gradient mean (both stages, rows or privacy units): r = 1/2 (C = γ, the sum's
    sensitivity 2γ) and τ = :data:`CLIP_SLACK` + γ_d with d = q·p_endog + q + p + 8, which bounds the roundings of a
    term's norms, clip factor and scaling (the norms of q and p_endog values, or of a unit's q·p_endog summed
    values: half their count each after the square root, plus the product, the division and the scaling). The same
    τ is each computed term's distance from the exact clipped term whichever kernel computed it (fast or safe), and
    which one runs is decided by all the rows of a pass: ε = τ (:func:`sum_rounding`)."""
    slack = CLIP_SLACK + gamma(q * p_endog + q + p + 8, u)
    return sum_rounding(terms, 0.5, slack=slack, term_error=slack, u=u)


def ball_rounding(terms: int, dim: int, changed: int = 1, *, u: float = UNIT_ROUNDOFF) -> float:
    """The factor of a release of Σ clip_B(wᵢ)clip_B(wᵢ)ᵀ (rows clipped to L2 norm B by
    :func:`dpivreg.privacy.mechanisms.ball_moment_sum`: the ball moments, the covariance meats) whose sum has
    sensitivity ``changed``·√2·B² (``changed``·B² for one coordinate, whose term is the one entry w² ∈ [0, B²]):
    r = 1/(√2·changed) (1/``changed`` for one coordinate), τ = γ_{dim+16} (a computed unit vector has norm at most
    1 + γ_{dim/2+5}, squared 1 + γ_{dim+10}), and three more roundings (B², its product with the clipped rows' sum,
    the addition of the kept rows' sum)."""
    spread = math.sqrt(2.0) if dim > 1 else 1.0
    return sum_rounding(terms, 1.0 / (spread * changed), slack=gamma(dim + 16, u), u=u, extra=3)


def box_rounding(terms: int, dim: int, changed: int = 1, *, u: float = UNIT_ROUNDOFF) -> float:
    """The factor of the box moment release Σ vᵢvᵢᵀ (D = ``dim`` coordinates in [−1, 1], clamped exactly), whose
    upper triangle's sum has sensitivity ``changed``·D: a term's upper triangle has norm at most √((D² + D)/2)
    (Σ_{a≤b} v_a²v_b² = (‖v‖⁴ + Σ v_a⁴)/2), so r = √((D² + D)/2)/(changed·D); no slack (the products are the one
    rounding inside the sum)."""
    return sum_rounding(terms, math.sqrt((dim * dim + dim) / 2.0) / (changed * dim), u=u)


def pairwise_sum(parts: Sequence):
    """Σ of ``parts`` (arrays, or tuples of arrays summed element-wise) by pairwise summation: any part passes
    through at most ⌈log₂ P⌉ additions, P the number of parts that are not all zero (adding an exact zero is
    exact, so those are left out; one is kept when all are). Deterministic for a given list."""
    as_tuples = isinstance(parts[0], tuple)
    items = [tuple(np.asarray(a) for a in part) if as_tuples else (np.asarray(part),) for part in parts]
    nonzero = [item for item in items if any(np.any(a) for a in item)] or items[:1]
    total = _pairwise(nonzero)
    total = tuple(np.array(a, copy=True) for a in total)
    return total if as_tuples else total[0]


def _pairwise(items: list[tuple]) -> tuple:
    if len(items) == 1:
        return items[0]
    middle = len(items) // 2
    left, right = _pairwise(items[:middle]), _pairwise(items[middle:])
    return tuple(a + b for a, b in zip(left, right))


def blocked_gram(A: np.ndarray, B: np.ndarray | None = None, *, block_terms: int = SUM_BLOCK_TERMS) -> np.ndarray:
    """AᵀB (AᵀA without ``B``) summed over blocks of at most ``block_terms`` rows, the blocks' products added by
    :func:`pairwise_sum`: the order of summation :func:`summation_depth` assumes, whatever the rows' number."""
    B = A if B is None else B
    rows = A.shape[0]
    if rows <= block_terms:
        return A.T @ B
    return pairwise_sum([A[a:a + block_terms].T @ B[a:a + block_terms] for a in range(0, rows, block_terms)])
