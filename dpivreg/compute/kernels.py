"""One pass over a block of rows: the clipped gradient sums of one DP-2S-GD iteration.

Both stages of an iteration read every row once. With Θ̄ = [I_exog | Θ] (q × p) the full first
stage, x̂ᵢ = Θ̄ᵀzᵢ, and R = P_t^(−1/2) (R = I for ``method="gd"``), everything a row needs is
``uᵢ = zᵢᵀ M`` with the small public matrix::

    M = [ Θ | Θ̄R | Θ̄β ]        (q × (p_endog + p + 1))

    first-stage residual   rᵢ = uᵢ[:p_endog] − xᵢ,endog        gradient zᵢ rᵢᵀ,  norm ‖zᵢ‖·‖rᵢ‖
    whitened regressors    x̃ᵢ = uᵢ[p_endog:p_endog+p]          (= R x̂ᵢ)
    second-stage residual  eᵢ = uᵢ[−1] − yᵢ                     gradient x̃ᵢ eᵢ,   norm ‖x̃ᵢ‖·abs(eᵢ)

and the clipped sums are ``S1 = Σᵢ zᵢ (rᵢ·f1ᵢ)ᵀ`` (q × p_endog) and ``s2 = Σᵢ x̃ᵢ (eᵢ·f2ᵢ)`` (p)
with fᵢ = min(1, γ/norm).

Group clipping (``split = k``): the gradient's leading k rows (stage 1: the rows of zᵢrᵢᵀ that belong
to the exogenous instruments) and leading k coordinates (stage 2: the exogenous coordinates of x̃ᵢeᵢ)
form one group, the rest another, and each group is clipped to its own threshold with its own
norm: ‖zᵢ[:k]‖·‖rᵢ‖ and ‖zᵢ[k:]‖·‖rᵢ‖, ‖x̃ᵢ[:k]‖·abs(eᵢ) and ‖x̃ᵢ[k:]‖·abs(eᵢ). Each group's summed term is
formed from the very vectors whose norm was clipped. Each row's term is formed from exactly the vectors whose norms were
clipped, so it has norm at most γ up to rounding relative to γ (summing zᵢeᵢ and projecting
afterwards would not: a row with x̃ᵢ ≈ 0 and a huge eᵢ would escape clipping and swamp the
others). One pass, no n-length temporaries beyond a cache-sized block, no n×p×q tensor.

Two implementations give the same numbers (to rounding): a numba kernel that fuses the per-row
work into one loop (fastest for small p, q), and numpy on cache-sized sub-blocks with BLAS
(no compiler; fastest for large p, q). For small shapes on large blocks numba's loop is generated
for the shape (:func:`dpivreg.compute.codegen.unrolled_source`: every row's work written out over scalars held in
registers), about three times faster than the general loop at p = q = 5. Rows whose clip factor
float64 could make inexact (a norm that overflows, or one at the limits of :func:`group_clips`, where
squares underflow or the factor would be subnormal) are flagged, and the caller recomputes that
iteration with :func:`safe_block_sums`, which measures every row scaled by its largest value and clips
through unit vectors.

The per-unit sums of privacy units (:func:`unit_block_sums`) and the working-scale row map
(:func:`working_rows`) are here too; the noise simulation's compiled steps are in
:mod:`dpivreg.compute.simulation_steps`.
"""

from __future__ import annotations

import math
import threading
from functools import lru_cache

import numpy as np

from dpivreg.compute import codegen
from dpivreg.privacy.mechanisms import max_scaled_rows, unit_rows
from dpivreg.privacy.units import GROUP_CHUNK_VALUES, _cut, group_sums

__all__ = ["KERNELS", "numba_available", "resolve_kernel", "block_sums", "safe_block_sums", "pass_matrix",
           "working_rows", "mapped_columns", "fused_norm_counts", "fused_product_norm_counts", "unit_gradient_terms",
           "unit_gradient_groups", "unit_block_sums", "safe_unit_block_sums"]

KERNELS = ("auto", "numba", "numpy")

# Rows per numpy sub-block: at most 8,192, and about 4 MB of the block's instruments and uᵢ = Mᵀzᵢ (2^19 values over
# q + width columns), which stay in the cache between the two products. Measured on one thread, 10⁶ rows: at
# p = q = 50, 0.59-0.60 s with 2,048 or 4,096 rows against 0.74-0.77 s with 8,192; at p = q = 20, 8,192 rows
# was best (0.18 s; 2,048: 0.19).
_SUB_BLOCK_ROWS = 8192
_SUB_BLOCK_VALUES = 1 << 19
# Above this many multiply-adds per row (q·(p_endog + p + 1)) BLAS on sub-blocks beats the fused loop
# (measured, one thread: numba 2-4x faster at q·width <= 210, even at 820, 1.7x slower at 5050).
_NUMBA_MAX_ROW_WORK = 800


@lru_cache(maxsize=1)
def numba_available() -> bool:
    """True when numba can be imported (the optional ``fast`` extra); checked once per process."""
    try:
        import numba  # noqa: F401
    except Exception:  # ImportError, or a broken install (e.g. a local coverage.py shadowing numba's import)
        return False
    return True


def resolve_kernel(kernel: str, q: int, width: int) -> str:
    """The implementation to use: ``"numba"`` or ``"numpy"``.

    ``"auto"`` takes numba when it is installed and the per-row work q·width is small enough for
    the fused loop to beat BLAS; ``"numba"`` without numba installed is an ImportError.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}.")
    if kernel == "numba" and not numba_available():
        raise ImportError('kernel="numba" needs numba: pip install "dpivreg[fast]" (or pip install numba).')
    if kernel == "auto":
        return "numba" if numba_available() and q * width <= _NUMBA_MAX_ROW_WORK else "numpy"
    return kernel


def pass_matrix(theta: np.ndarray, beta: np.ndarray, root: np.ndarray | None,
                n_exog: int) -> tuple[np.ndarray, np.ndarray]:
    """M = [Θ | Θ̄R | Θ̄β] (C-contiguous) and Θ̄R, from the released Θ⁽ᵗ⁾, β⁽ᵗ⁾ and R (None: identity)."""
    q = theta.shape[0]
    theta_full = np.concatenate([np.eye(q, n_exog), theta], axis=1)
    whitened = theta_full if root is None else theta_full @ root
    M = np.ascontiguousarray(np.concatenate([theta, whitened, (theta_full @ beta)[:, None]], axis=1))
    return M, whitened


def block_sums(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, M: np.ndarray, clip1, clip2,
               kernel: str, split: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """S1 = Σᵢ CLIP_γ1(zᵢrᵢᵀ) and s2 = Σᵢ CLIP_γ2(x̃ᵢeᵢ) over the rows of one block, and counts.

    Parameters
    ----------
    Z, X_endog, Y : ndarray
        The block's rows: (m, q), (m, p_endog), (m,).
    M : ndarray, shape (q, p_endog + p + 1)
        See :func:`pass_matrix`.
    clip1, clip2 : float or (float, float)
        Clipping thresholds; ``inf`` for none. With ``split`` a pair (leading group, rest).
    kernel : {"numba", "numpy"}
        A resolved kernel (see :func:`resolve_kernel`).
    split : int, optional
        Group clipping at this row of S1 / coordinate of s2 (see the module docstring); None: the
        whole gradient of each stage is one group.

    Returns
    -------
    S1 : ndarray, shape (q, p_endog)
    s2 : ndarray, shape (p,)
    counts : ndarray of int64, shape (3,)
        Rows clipped in stage 1, in stage 2 (in any group), and rows flagged because float64 could make their clip
        factor inexact: a norm that is not finite, or one at the limits of :func:`group_clips` (then the sums are
        not valid: use :func:`safe_block_sums` for this iteration).
    """
    q, p_endog = Z.shape[1], X_endog.shape[1]
    if not Z.shape[0] == X_endog.shape[0] == Y.shape[0]:  # the compiled loops would read past the shorter ones
        raise ValueError(f"Z, X_endog and Y must have the same rows, got {Z.shape[0]}, {X_endog.shape[0]} and "
                         f"{Y.shape[0]}.")
    clips, k = group_clips(clip1, clip2, split)
    S1 = np.zeros((q, p_endog))
    s2 = np.zeros(M.shape[1] - p_endog - 1)
    counts = np.zeros(3, dtype=np.int64)
    if kernel == "numba":
        if not _generated_sums(Z, X_endog, Y, M, clips, k, S1, s2, counts):
            with _COMPILE_LOCK:  # threads starting together make one dispatcher (numba's own lock guards compiling)
                kernel_function = _numba_kernel()
            kernel_function(Z, X_endog, Y, M, clips, k, S1, s2, counts)
    else:
        rows = max(1024, min(_SUB_BLOCK_ROWS, _SUB_BLOCK_VALUES // (q + M.shape[1])))
        with np.errstate(over="ignore", invalid="ignore"):  # overflowing rows are flagged, as the compiled loops do
            for start in range(0, Z.shape[0], rows):
                stop = start + rows
                _numpy_sub_block(Z[start:stop], X_endog[start:stop], Y[start:stop], M, clips, k, S1, s2, counts)
    return S1, s2, counts


def group_clips(clip1, clip2, split: int | None) -> tuple[np.ndarray, int]:
    """The kernels' clip vector and the split (−1: no groups).

    The vector holds 8 values: the thresholds [γ1 lead, γ1 rest, γ2 lead, γ2 rest], then each group's norm limit
    L = min(γ·2^480, 2^511). A row's clip factor min(1, γ/(‖a‖·‖b‖)) and its clipped terms are exact to
    rounding while both norms are under L; the kernels flag rows whose norms add up to L or more (one addition and one
    comparison a group, which also flags norms that are not finite), and the caller recomputes the iteration by the
    safe pass, which takes every row's norms scaled by its largest value.

    Why this limit: a sum of m squares loses at most m·2^−1074 to gradual underflow (components under 1e-154 square
    to subnormals or to 0), so a computed norm can be short by √m·2^−537 (a row of such tiny instruments looks like
    norm 0 and would escape clipping); times a partner norm under γ·2^480 that is at most √m·2^−57·γ, under 2^−37·γ
    for m ≤ 2^40 terms. Two norms under L have a product under L², which is under γ·2^1000 (γ·2^480 is the smaller
    term up to γ = 2^31, and γ²·2^960 ≤ γ·2^1000 there; beyond, 2^1022 ≤ γ·2^1000), so the factor γ/norm stays above
    2^−1000, a normal float (a subnormal factor is rounded by up to 40%); and L² ≤ 2^1022, so no product of a
    row's values overflows, in whatever order the compiler multiplies them (x̃·e·f as (x̃·e)·f: inf·0 was NaN, found
    by fuzzing a threshold of 1e300). Both hold for thresholds ≥ 2^−900 (the public functions take at least
    :data:`dpivreg._validation.MIN_RAW_CLIP`, 1e-100); an infinite threshold clips and flags nothing.
    """
    if split is None:
        gammas = np.array([clip1, clip1, clip2, clip2], dtype=np.float64)
    else:
        gammas = np.array([clip1[0], clip1[1], clip2[0], clip2[1]], dtype=np.float64)
    with np.errstate(over="ignore"):  # a limit beyond float64 is inf, and the others are smaller
        limits = np.minimum(np.ldexp(gammas, NORM_LIMIT_SCALE), 2.0 ** 511)
    return np.concatenate([gammas, limits]), -1 if split is None else int(split)


#: Binary exponent of the clip vector's norm limit min(γ·2^480, 2^511) (:func:`group_clips`).
NORM_LIMIT_SCALE = 480


def _clip_factor(norm_a: np.ndarray, norm_b: np.ndarray, clips: np.ndarray, g: int, counts: np.ndarray,
                 slot: int) -> np.ndarray:
    """min(1, γ/(‖a‖·‖b‖)) of group ``g`` per row; counts clipped rows in ``counts[slot]``, and rows whose factor may
    be inexact (the norms adding up to the limit of :func:`group_clips`, or not finite) in ``counts[2]``."""
    norms = norm_a * norm_b
    clip = clips[g]
    if math.isinf(clip):
        norms.fill(1.0)
        return norms
    exact = norm_a + norm_b < clips[4 + g]
    counts[2] += norms.size - np.count_nonzero(exact)
    counts[slot] += np.count_nonzero(norms > clip)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.divide(clip, norms, out=norms)
    return np.minimum(norms, 1.0, out=norms)


def _group_factors(lead: np.ndarray, rest: np.ndarray, scale: np.ndarray, clips: np.ndarray, g: int, split: int,
                   counts: np.ndarray, slot: int) -> tuple[np.ndarray, np.ndarray]:
    """Clip factors of groups ``g`` (lead) and ``g + 1`` (rest) from their squared norms ``lead``, ``rest`` times
    ``scale``, the norm of the other factor of the rank-one gradient; one shared factor (group ``g``'s threshold)
    when ``split`` < 0. Its callers hold overflow quiet (an overflowing row is flagged, not an error)."""
    if split < 0:
        factor = _clip_factor(np.sqrt(lead + rest), scale, clips, g, counts, slot)
        return factor, factor
    scratch = np.zeros(3, dtype=np.int64)
    f_lead = _clip_factor(np.sqrt(lead), scale, clips, g, scratch, 0)
    f_rest = _clip_factor(np.sqrt(rest), scale, clips, g + 1, scratch, 1)
    counts[slot] += np.count_nonzero((f_lead < 1.0) | (f_rest < 1.0))
    counts[2] += scratch[2]
    return f_lead, f_rest


def _numpy_sub_block(Z, X_endog, Y, M, clips, split, S1, s2, counts) -> None:
    p_endog = X_endog.shape[1]
    k = max(split, 0)
    U = Z @ M
    R1 = U[:, :p_endog]
    R1 -= X_endog
    norm_r = _row_norms(R1)
    f1_lead, f1_rest = _group_factors(np.einsum("ij,ij->i", Z[:, :k], Z[:, :k]),
                                      np.einsum("ij,ij->i", Z[:, k:], Z[:, k:]), norm_r, clips, 0, split,
                                      counts, 0)
    X_tilde = U[:, p_endog:-1]
    e = U[:, -1]
    e -= Y
    f2_lead, f2_rest = _group_factors(np.einsum("ij,ij->i", X_tilde[:, :k], X_tilde[:, :k]),
                                      np.einsum("ij,ij->i", X_tilde[:, k:], X_tilde[:, k:]), np.abs(e), clips, 2,
                                      split, counts, 1)
    if split < 0:
        S1 += Z.T @ (R1 * f1_rest[:, None])
        s2 += X_tilde.T @ (e * f2_rest)
        return
    S1[:k] += Z[:, :k].T @ (R1 * f1_lead[:, None])
    S1[k:] += Z[:, k:].T @ (R1 * f1_rest[:, None])
    s2[:k] += X_tilde[:, :k].T @ (e * f2_lead)
    s2[k:] += X_tilde[:, k:].T @ (e * f2_rest)


_TILE_ROWS = 128


def _fused_rows(Z, X_endog, Y, M, clips, split, S1, s2, counts):  # pragma: no cover - compiled by numba
    """The per-row work of :func:`block_sums` in one pass, compiled by numba.

    Rows are taken a tile at a time and transposed into small buffers, so that every inner loop
    runs over the tile's rows with unit stride (SIMD), and everything between reading a row and
    adding its clipped gradients to the sums stays in the L1 cache. The sums over the q instruments are
    taken up to four terms at a time in registers (measured 10-20% faster than one term per pass over the tile).
    The gradient norms and the clip factors are computed in loops of their own, without branches in the loop
    body, so that they vectorise too (square roots and divisions were a fifth of the kernel's time as scalars).
    Same arithmetic as the numpy path: the clip factors scale the tile's instruments (stage 1, per row of
    S1's group) and its residuals (stage 2, one copy per group).
    """
    n, q = Z.shape
    p_endog = X_endog.shape[1]
    width = M.shape[1]
    last = width - 1
    tile = _TILE_ROWS
    grouped = split >= 0
    k_lead = split if grouped else 0
    Zt = np.empty((q, tile))
    U = np.empty((width, tile))
    zz_lead = np.empty(tile)
    zz_rest = np.empty(tile)
    rr = np.empty(tile)
    xx_lead = np.empty(tile)
    xx_rest = np.empty(tile)
    # Per group g (stage 1 lead, stage 1 rest, stage 2 lead, stage 2 rest), the norms of the rows' ‖z‖ or ‖x̃‖ part,
    # then in place their clip factors; without groups only g = 0 and 2 are used and stand for the rest too.
    factors = np.empty((4, tile))
    rest1 = 1 if grouped else 0
    rest2 = 3 if grouped else 2
    e_lead = np.empty(tile)
    e_rest = np.empty(tile)
    clipped1 = 0
    clipped2 = 0
    overflow = 0
    for start in range(0, n, tile):
        m = min(tile, n - start)
        Z_tile = Z[start:start + m]
        X_tile = X_endog[start:start + m]
        zz_lead[:m] = 0.0
        zz_rest[:m] = 0.0
        for k in range(q):  # transpose the tile, and ‖z‖² of each group
            column = Z_tile[:, k]
            if k < k_lead:
                for i in range(m):
                    v = column[i]
                    Zt[k, i] = v
                    zz_lead[i] += v * v
            else:
                for i in range(m):
                    v = column[i]
                    Zt[k, i] = v
                    zz_rest[i] += v * v
        for j in range(width):  # U = Mᵀ z, up to four terms of the sum over k at a time (kept in registers)
            k = 0
            while k < q:
                terms = min(4, q - k)
                m0 = M[k, j]
                m1 = M[k + 1, j] if terms > 1 else 0.0
                m2 = M[k + 2, j] if terms > 2 else 0.0
                m3 = M[k + 3, j] if terms > 3 else 0.0
                if terms == 4:
                    if k == 0:
                        for i in range(m):
                            U[j, i] = m0 * Zt[k, i] + m1 * Zt[k + 1, i] + m2 * Zt[k + 2, i] + m3 * Zt[k + 3, i]
                    else:
                        for i in range(m):
                            U[j, i] += m0 * Zt[k, i] + m1 * Zt[k + 1, i] + m2 * Zt[k + 2, i] + m3 * Zt[k + 3, i]
                elif terms == 3:
                    if k == 0:
                        for i in range(m):
                            U[j, i] = m0 * Zt[k, i] + m1 * Zt[k + 1, i] + m2 * Zt[k + 2, i]
                    else:
                        for i in range(m):
                            U[j, i] += m0 * Zt[k, i] + m1 * Zt[k + 1, i] + m2 * Zt[k + 2, i]
                elif terms == 2:
                    if k == 0:
                        for i in range(m):
                            U[j, i] = m0 * Zt[k, i] + m1 * Zt[k + 1, i]
                    else:
                        for i in range(m):
                            U[j, i] += m0 * Zt[k, i] + m1 * Zt[k + 1, i]
                elif k == 0:
                    for i in range(m):
                        U[j, i] = m0 * Zt[k, i]
                else:
                    for i in range(m):
                        U[j, i] += m0 * Zt[k, i]
                k += terms
        rr[:m] = 0.0
        for j in range(p_endog):  # first-stage residuals r and ‖r‖²
            column = X_tile[:, j]
            for i in range(m):
                r = U[j, i] - column[i]
                U[j, i] = r
                rr[i] += r * r
        xx_lead[:m] = 0.0
        xx_rest[:m] = 0.0
        for j in range(p_endog, p_endog + k_lead):  # ‖x̃‖² of each group
            for i in range(m):
                xx_lead[i] += U[j, i] * U[j, i]
        for j in range(p_endog + k_lead, last):
            for i in range(m):
                xx_rest[i] += U[j, i] * U[j, i]
        for i in range(m):
            U[last, i] -= Y[start + i]  # second-stage residual e
        for i in range(m):
            rr[i] = np.sqrt(rr[i])  # ‖r‖
        if grouped:  # the other factor's norms per group: ‖z‖ (stage 1) and ‖x̃‖ (stage 2)
            for i in range(m):
                factors[0, i] = np.sqrt(zz_lead[i])
                factors[1, i] = np.sqrt(zz_rest[i])
                factors[2, i] = np.sqrt(xx_lead[i])
                factors[3, i] = np.sqrt(xx_rest[i])
        else:
            for i in range(m):
                factors[0, i] = np.sqrt(zz_lead[i] + zz_rest[i])
                factors[2, i] = np.sqrt(xx_lead[i] + xx_rest[i])
        for g in range(0, 4, 1 if grouped else 2):  # clip factors min(1, γ/norm); inexact rows flagged (group_clips)
            clip = clips[g]
            norm_limit = clips[4 + g]
            if clip < np.inf:
                for i in range(m):
                    a = factors[g, i]
                    b = rr[i] if g < 2 else abs(U[last, i])
                    norm = a * b
                    overflow += not a + b < norm_limit
                    factors[g, i] = min(1.0, clip / norm)
            else:
                factors[g, :m] = 1.0
        for i in range(m):
            clipped1 += (factors[0, i] < 1.0) | (factors[rest1, i] < 1.0)
            clipped2 += (factors[2, i] < 1.0) | (factors[rest2, i] < 1.0)
            e_lead[i] = U[last, i] * factors[2, i]
            e_rest[i] = U[last, i] * factors[rest2, i]
        for k in range(q):  # instruments scaled by their group's factor: S1 = Σ (z·f)(r)ᵀ
            g = 0 if k < k_lead else rest1
            for i in range(m):
                Zt[k, i] *= factors[g, i]
        for j in range(p_endog):  # S1 += Zᵀ r, four rows of S1 at a time (accumulators in registers)
            k = 0
            while k < q:
                if k + 4 <= q:
                    a0 = 0.0
                    a1 = 0.0
                    a2 = 0.0
                    a3 = 0.0
                    for i in range(m):
                        v = U[j, i]
                        a0 += Zt[k, i] * v
                        a1 += Zt[k + 1, i] * v
                        a2 += Zt[k + 2, i] * v
                        a3 += Zt[k + 3, i] * v
                    S1[k, j] += a0
                    S1[k + 1, j] += a1
                    S1[k + 2, j] += a2
                    S1[k + 3, j] += a3
                    k += 4
                else:
                    a0 = 0.0
                    for i in range(m):
                        a0 += Zt[k, i] * U[j, i]
                    S1[k, j] += a0
                    k += 1
        for j in range(p_endog, last):  # s2 += X̃ᵀ (e·f2), each coordinate with its group's factor
            acc = 0.0
            if j < p_endog + k_lead:
                for i in range(m):
                    acc += U[j, i] * e_lead[i]
            else:
                for i in range(m):
                    acc += U[j, i] * e_rest[i]
            s2[j - p_endog] += acc
    counts[0] += clipped1
    counts[1] += clipped2
    counts[2] += overflow


def _fused_norm_counts(Z, X_endog, Y, M, split, edges, counts):  # pragma: no cover - compiled by numba
    """:func:`dpivreg.estimation.clipping.gradient_norm_counts` in one loop over the rows, compiled by numba.

    Per row the same norms as the numpy path (uᵢ = zᵢᵀM; ‖zᵢ[g]‖·‖rᵢ‖ and ‖x̃ᵢ[g]‖·abs(eᵢ) for the groups
    split at ``split``, or the whole vectors when ``split`` < 0), each counted in the bin of its group's
    edges that numpy's ``searchsorted(edges, v, "right") − 1`` finds, clipped to the end bins (NaN: last).
    The bin is guessed from the first bin's width ratio (the grids are geometric,
    :func:`dpivreg.privacy.mechanisms.log_grid`) and a fast log2 (the float's exponent and mantissa), then moved until
    it is exactly the bin whose edges hold v, so any increasing edges give numpy's bin (a binary search over the 41
    edges took 2x as long). No fastmath: a norm on a bin edge falls on the same side as in numpy, up to the rounding of
    the sums. The norms are formed a tile of rows at a time, transposed into small buffers (as in :func:`_fused_rows`),
    so that their loops run over rows with SIMD; each row's sums are added in the same order as one row at a time (the
    same bits). 3.6 ms per 65,536 rows at q = 3 (8.9 ms one row at a time with ``np.log`` for the guess).
    """
    n, q = Z.shape
    p_endog = X_endog.shape[1]
    width = M.shape[1]
    last = width - 1
    grouped = split >= 0
    k = split if grouped else 0
    bins = edges.shape[1] - 1
    tile = _TILE_ROWS
    Zt = np.empty((q, tile))
    U = np.empty((width, tile))
    zz_lead = np.empty(tile)
    zz_rest = np.empty(tile)
    rr = np.empty(tile)
    xx_lead = np.empty(tile)
    xx_rest = np.empty(tile)
    abs_e = np.empty(tile)
    groups = 4 if grouped else 2
    norms = np.empty((groups, tile))
    ratio = np.empty(tile)
    ratio_bits = ratio.view(np.int64)
    guess = np.empty(tile)
    inverse_log2_ratio = np.zeros(edges.shape[0])  # 0 (guess bin 1, then walk) unless the grid starts above 0
    inverse_first_edge = np.zeros(edges.shape[0])
    for g in range(edges.shape[0]):
        if edges[g, 0] > 0.0 and edges[g, 1] > edges[g, 0]:
            inverse_log2_ratio[g] = 1.0 / np.log2(edges[g, 1] / edges[g, 0])
            inverse_first_edge[g] = 1.0 / edges[g, 0]
    for start in range(0, n, tile):
        m = min(tile, n - start)
        for c in range(q):
            for i in range(m):
                Zt[c, i] = Z[start + i, c]
        zz_lead[:m] = 0.0
        zz_rest[:m] = 0.0
        for c in range(k):
            for i in range(m):
                zz_lead[i] += Zt[c, i] * Zt[c, i]
        for c in range(k, q):
            for i in range(m):
                zz_rest[i] += Zt[c, i] * Zt[c, i]
        for j in range(width):  # U = Mᵀz, the terms over c added in order (as one row at a time would)
            U[j, :m] = 0.0
            for c in range(q):
                coefficient = M[c, j]
                for i in range(m):
                    U[j, i] += Zt[c, i] * coefficient
        rr[:m] = 0.0
        for j in range(p_endog):
            for i in range(m):
                r = U[j, i] - X_endog[start + i, j]
                rr[i] += r * r
        xx_lead[:m] = 0.0
        xx_rest[:m] = 0.0
        for j in range(p_endog, p_endog + k):
            for i in range(m):
                xx_lead[i] += U[j, i] * U[j, i]
        for j in range(p_endog + k, last):
            for i in range(m):
                xx_rest[i] += U[j, i] * U[j, i]
        for i in range(m):
            abs_e[i] = abs(U[last, i] - Y[start + i])
            norm_r = np.sqrt(rr[i])
            if grouped:
                norms[0, i] = np.sqrt(zz_lead[i]) * norm_r
                norms[1, i] = np.sqrt(zz_rest[i]) * norm_r
                norms[2, i] = np.sqrt(xx_lead[i]) * abs_e[i]
                norms[3, i] = np.sqrt(xx_rest[i]) * abs_e[i]
            else:
                norms[0, i] = np.sqrt(zz_rest[i]) * norm_r
                norms[1, i] = np.sqrt(xx_rest[i]) * abs_e[i]
        for g in range(groups):
            # the guess: log2 of v/edges[0] from its float's exponent and mantissa f (log2(1 + f) by a cubic, within
            # 0.001), over the tile at once; only used below for v inside the grid, where v/edges[0] is normal
            for i in range(m):
                ratio[i] = norms[g, i] * inverse_first_edge[g]
            for i in range(m):
                exponent = ((ratio_bits[i] >> 52) & 0x7FF) - 1023
                f = (ratio_bits[i] & 0xFFFFFFFFFFFFF) * 2.220446049250313e-16
                guess[i] = (exponent + f + f * (1.0 - f) * (0.42086454 - 0.15638611 * f)) * inverse_log2_ratio[g]
            for i in range(m):
                v = norms[g, i]
                if not v >= edges[g, 1]:  # zero, NaN or in the first bin (numpy's bin 1 starts at edges[1] itself)
                    index = bins - 1 if v != v else 0
                elif not v < edges[g, bins - 1]:  # in the last bin or beyond (inf)
                    index = bins - 1
                else:  # the guess, made exact against the edges themselves
                    index = min(max(int(guess[i]), 1), bins - 2)
                    while v < edges[g, index]:
                        index -= 1
                    while v >= edges[g, index + 1]:
                        index += 1
                counts[g, index] += 1.0


_COMPILE_LOCK = threading.Lock()


def fused_norm_counts(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, M: np.ndarray, split: int,
                      edges: np.ndarray) -> np.ndarray:
    """Histogram counts (G, bins) of a block's gradient norms by group, by the numba loop
    :func:`_fused_norm_counts` (``edges`` (G, bins + 1), ``split`` < 0 for no groups)."""
    counts = np.zeros((edges.shape[0], edges.shape[1] - 1))
    with _COMPILE_LOCK:
        function = _numba_norm_counts()
    function(Z, X_endog, Y, M, split, edges, counts)
    return counts


def fused_product_norm_counts(Z: np.ndarray, A: np.ndarray, R: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Histogram counts (bins,) of ‖zᵢ‖·‖zᵢᵀA − Rᵢ‖ over a block's rows, by the numba loop :func:`_fused_norm_counts`,
    binned as the gradient norms are: the score norms of the inference's meat releases
    (:mod:`dpivreg.inference.covariance`). ``A`` (q, d), ``R`` (m, d), ``edges`` (bins + 1,). With d = 1 the loop's
    second-stage norm computes it (M = [0 | I_q | A], Y = R: ‖x̃ᵢ‖·abs(eᵢ) with x̃ᵢ = zᵢ, no square of the residual to
    overflow); with d > 1 its ungrouped first-stage norm (M = [A | 0 | 0], X_endog = R)."""
    q, d = A.shape
    m = Z.shape[0]
    if d == 1:
        M = np.concatenate([np.zeros((q, 1)), np.eye(q), A], axis=1)
        counts = fused_norm_counts(Z, np.zeros((m, 1)), np.ascontiguousarray(R[:, 0]), M, -1, np.array([edges, edges]))
        return counts[1]
    M = np.zeros((q, d + 2))
    M[:, :d] = A
    counts = fused_norm_counts(Z, R, np.zeros(m), M, -1, np.array([edges, edges]))
    return counts[0]


@lru_cache(maxsize=1)
def _numba_norm_counts():
    """Compile :func:`_fused_norm_counts` on first use (cached on disk)."""
    import numba

    return numba.njit(nogil=True, cache=True)(_fused_norm_counts)


@lru_cache(maxsize=1)
def _numba_kernel():
    """Compile :func:`_fused_rows` on first use (cached on disk), so that importing dpivreg never needs numba."""
    import numba

    # Reassociation and FMA contraction let the row loops vectorise (rounding-level changes only); no
    # "nnan"/"ninf": the overflow test must see infinities.
    return numba.njit(nogil=True, cache=True, error_model="numpy",
                      fastmath={"reassoc", "contract", "nsz"})(_fused_rows)


# The fused loop for one shape, generated: every row's work written out term by term over scalars that stay in
# registers, so the compiler vectorises the whole row loop with no buffers between its steps. Measured on one
# thread, 10⁶ rows, p = q = 5, against :func:`_fused_rows` (21-23 ms in either layout): 6.5-6.9 ms on column-major
# rows, 8.7-8.9 ms on row-major rows (2.6-3.2 ms is a read-only pass). Column-major: 4.4 times faster at q = 2,
# 2.3 at q = 8, but 1.2 at q = 10 (its q·p_endog accumulators no longer fit the registers) while compiling takes
# 4 s: hence the limit on q·width. It compiles for each shape (0.5-2 s), so it is used on blocks large enough to
# repay that once, and its source is written to a file so that numba caches the compiled kernel on disk
# (:func:`kernel_cache_directory`).
_UNROLLED_MAX_ROW_WORK = 136
_UNROLLED_MIN_ROWS = 1 << 15


def _generated_sums(Z, X_endog, Y, M, clips, split, S1, s2, counts) -> bool:
    """Add the block's sums by the generated kernel that reads its layout (:func:`unrolled_source`): ``columns`` when
    every column has unit stride, ``rows`` when every row's values are contiguous. False, adding nothing, for blocks
    under :data:`_UNROLLED_MIN_ROWS` rows, shapes over :data:`_UNROLLED_MAX_ROW_WORK`, other dtypes and other layouts
    (the tiled loop takes them)."""
    q, p_endog, width = Z.shape[1], X_endog.shape[1], M.shape[1]
    if Z.shape[0] < _UNROLLED_MIN_ROWS or q * width > _UNROLLED_MAX_ROW_WORK:
        return False
    if Z.dtype != np.float64 or X_endog.dtype != np.float64 or Y.dtype != np.float64:
        return False
    if Z.strides[0] == X_endog.strides[0] == Y.strides[0] == 8:
        variant, strides, blocks = 0, (), (tuple(Z.T), tuple(X_endog.T))
    elif all(a.strides[1] == 8 and a.strides[0] > 0 and a.strides[0] % 8 == 0 for a in (Z, X_endog)):
        variant, strides, blocks = 1, (Z.strides[0] // 8, X_endog.strides[0] // 8), (_rows_as_flat(Z),
                                                                                  _rows_as_flat(X_endog))
    else:
        return False
    with _COMPILE_LOCK:
        kernel_function = codegen.unrolled_kernel(q, p_endog, width, max(split, 0), split >= 0, *strides)[variant]
    kernel_function(*blocks, Y, M, clips, S1, s2, counts)
    return True


def _rows_as_flat(A: np.ndarray) -> np.ndarray:
    """A block whose rows are each contiguous as one 1-D view from its first value to its last: row i starts at
    i·(row stride). The values between rows belong to the parent array, and the kernel does not read them."""
    m, k = A.shape
    length = (m - 1) * (A.strides[0] // 8) + k if m else 0
    return np.lib.stride_tricks.as_strided(A, shape=(length,), strides=(8,), writeable=False)


def safe_block_sums(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, theta: np.ndarray,
                    whitened: np.ndarray, beta_full: np.ndarray, clip1, clip2,
                    split: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The clipped sums of one block, exact for every row (:func:`_clipped_sum_outer`).

    Slower than :func:`block_sums` (it forms the block's x̃ explicitly and scales every row); used only for an
    iteration in which :func:`block_sums` flagged a row: a non-finite norm, or one at the limits of
    :func:`group_clips`, where the fast kernels' squared norms could underflow or their clip factor be subnormal.
    Clipped rows are added through their unit vectors, γ·(aᵢ/‖aᵢ‖)(bᵢ/‖bᵢ‖)ᵀ. ``clip1``, ``clip2`` and ``split`` as
    in :func:`block_sums`.

    Returns
    -------
    S1 : ndarray (q, p_endog)
        Σᵢ CLIP_γ1(zᵢrᵢᵀ).
    s2 : ndarray (p,)
        Σᵢ CLIP_γ2(x̃ᵢeᵢ).
    counts : ndarray of int64 (3,)
        Rows clipped per stage (rows with an infinite or NaN value count as clipped), and 0.
    """
    counts = np.zeros(3, dtype=np.int64)
    with np.errstate(over="ignore", invalid="ignore"):  # a row that overflows adds nothing (_clipped_sum_outer)
        R1 = Z @ theta - X_endog
        X_tilde = Z @ whitened
        e = (Z @ beta_full - Y)[:, None]
    if split is None:
        S1, clipped1 = _clipped_sum_outer(Z, R1, clip1)
        s2, clipped2 = _clipped_sum_outer(X_tilde, e, clip2)
        counts[:2] = clipped1.sum(), clipped2.sum()
        return S1, s2[:, 0], counts
    k = split
    S1_lead, lead1 = _clipped_sum_outer(Z[:, :k], R1, clip1[0])
    S1_rest, rest1 = _clipped_sum_outer(Z[:, k:], R1, clip1[1])
    s2_lead, lead2 = _clipped_sum_outer(X_tilde[:, :k], e, clip2[0])
    s2_rest, rest2 = _clipped_sum_outer(X_tilde[:, k:], e, clip2[1])
    counts[:2] = np.count_nonzero(lead1 | rest1), np.count_nonzero(lead2 | rest2)
    return np.vstack([S1_lead, S1_rest]), np.concatenate([s2_lead[:, 0], s2_rest[:, 0]]), counts


def _clipped_sum_outer(A: np.ndarray, B: np.ndarray, clip: float) -> tuple[np.ndarray, np.ndarray]:
    """Σᵢ CLIP_γ(aᵢbᵢᵀ) via ‖aᵢbᵢᵀ‖_F = ‖aᵢ‖·‖bᵢ‖, exact for every row; and which rows were clipped.

    Each row's norms are taken from the row scaled by its largest value (:func:`dpivreg.privacy.mechanisms.unit_rows`),
    so neither tiny components (whose squares underflow) nor huge ones (whose squares overflow) make them inexact. The
    product is compared with γ as (max|aᵢ|·max|bᵢ|)·(‖aᵢ/max|aᵢ|‖·‖bᵢ/max|bᵢ|‖), and a clipped row adds
    γ·(aᵢ/‖aᵢ‖)(bᵢ/‖bᵢ‖)ᵀ, formed from unit vectors. A row with an infinite or NaN value (uᵢ = zᵢᵀM overflowed) adds
    nothing and counts as clipped: its direction is not defined, and nothing is a term of norm ≤ γ.
    """
    if math.isinf(clip):
        return A.T @ B, np.zeros(A.shape[0], dtype=bool)
    (a_largest, a_unit, a_norm), (b_largest, b_unit, b_norm) = unit_rows(A), unit_rows(B)
    with np.errstate(over="ignore", invalid="ignore"):
        norms = (a_largest * b_largest) * (a_norm * b_norm)
    broken = ~(np.isfinite(a_largest) & np.isfinite(b_largest))
    clipped = ~broken & (norms > clip)
    kept = ~broken & ~clipped
    total = A[kept].T @ B[kept] + a_unit[clipped].T @ (clip * b_unit[clipped])
    return total, clipped | broken


def _row_norms(A: np.ndarray) -> np.ndarray:
    return np.sqrt(np.einsum("ij,ij->i", A, A))


# ---------------------------------------------------------------- per-unit gradients (privacy units)
def unit_gradient_terms(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, M: np.ndarray) -> np.ndarray:
    """Both stages' per-row gradients side by side, (m, q·p_endog + p): vec(zᵢrᵢᵀ) (row-major: instrument by
    instrument) then x̃ᵢeᵢ, from uᵢ = zᵢᵀM (module docstring)."""
    m, q = Z.shape
    p_endog = X_endog.shape[1]
    U = Z @ M
    R1 = U[:, :p_endog] - X_endog
    e = U[:, -1] - Y
    terms = np.empty((m, q * p_endog + M.shape[1] - p_endog - 1))
    terms[:, :q * p_endog] = (Z[:, :, None] * R1[:, None, :]).reshape(m, q * p_endog)
    np.multiply(U[:, p_endog:-1], e[:, None], out=terms[:, q * p_endog:])
    return terms


def unit_gradient_groups(G: np.ndarray, q: int, p_endog: int, lead: int) -> tuple[np.ndarray, ...]:
    """Per-unit summed gradients G (u, q·p_endog + p; :func:`unit_gradient_terms` summed by unit) split into the
    clipping groups, each flattened to (u, ·): stage 1's leading ``lead`` (exogenous) rows of Σ zᵢrᵢᵀ and its other
    rows, stage 2's leading ``lead`` coordinates of Σ x̃ᵢeᵢ and its others (``lead`` 0: each stage whole, second)."""
    units = G.shape[0]
    G1, g2 = G[:, :q * p_endog].reshape(units, q, p_endog), G[:, q * p_endog:]
    return G1[:, :lead].reshape(units, -1), G1[:, lead:].reshape(units, -1), g2[:, :lead], g2[:, lead:]


def unit_block_sums(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, starts: np.ndarray, M: np.ndarray, clip1,
                    clip2, split: int | None = None,
                    kernel: str = "numpy") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """S1 = Σᵤ CLIP_γ1(Σ_{i∈u} zᵢrᵢᵀ) and s2 = Σᵤ CLIP_γ2(Σ_{i∈u} x̃ᵢeᵢ) over the privacy units of one block, and
    counts: the per-unit counterpart of :func:`block_sums` (:mod:`dpivreg.privacy.units`).

    The units are runs of consecutive rows starting at ``starts`` (offsets in the block, the first 0). Each
    unit's gradient is the sum of its rows' gradients, clipped as a whole (a sum of rank-one terms is not rank
    one: its norm is taken from the summed matrix); with ``split`` its leading rows (coordinates) and the rest
    are clipped separately, as for rows. ``counts``: units clipped in stage 1, in stage 2, and units flagged because
    their norm is not finite or at the limits of :func:`group_clips` (then use :func:`safe_unit_block_sums` for the
    iteration). ``kernel``: ``"numba"`` (one compiled
    loop over the units' rows, :func:`_fused_units`) or ``"numpy"`` (per-row gradients of a chunk of rows summed
    by unit with ``reduceat``); the same numbers to rounding.
    """

    q, p_endog = Z.shape[1], X_endog.shape[1]
    width = q * p_endog + M.shape[1] - p_endog - 1
    clips, k = group_clips(clip1, clip2, split)
    lead = max(k, 0)
    S1 = np.zeros((q, p_endog))
    s2 = np.zeros(width - q * p_endog)
    counts = np.zeros(3, dtype=np.int64)
    if kernel == "numba":
        with _COMPILE_LOCK:
            function = _numba_unit_kernel()
        function(Z, X_endog, Y, M, clips, k, np.asarray(starts, dtype=np.int64), S1, s2, counts)
        return S1, s2, counts

    def consume(G: np.ndarray) -> None:
        ones = np.ones(G.shape[0])
        groups = unit_gradient_groups(G, q, p_endog, lead)
        squares = [np.einsum("ui,ui->u", part, part) for part in groups]
        factors = (*_group_factors(squares[0], squares[1], ones, clips, 0, k, counts, 0),
                   *_group_factors(squares[2], squares[3], ones, clips, 2, k, counts, 1))
        S1[:lead] += (factors[0] @ groups[0]).reshape(lead, p_endog)
        S1[lead:] += (factors[1] @ groups[1]).reshape(q - lead, p_endog)
        s2[:lead] += factors[2] @ groups[2]
        s2[lead:] += factors[3] @ groups[3]

    with np.errstate(over="ignore", invalid="ignore"):  # overflowing units are flagged, as the compiled loop does
        group_sums(lambda rows: unit_gradient_terms(Z[rows], X_endog[rows], Y[rows], M), starts, Z.shape[0], consume,
                   width=width)
    return S1, s2, counts


def _fused_units(Z, X_endog, Y, M, clips, split, starts, S1, s2, counts):  # pragma: no cover - compiled by numba
    """The per-unit work of :func:`unit_block_sums` in one loop, compiled by numba: each unit's rows are read once,
    uᵢ = zᵢᵀM formed, the unit's gradients Σ zᵢrᵢᵀ and Σ x̃ᵢeᵢ accumulated in small buffers, then normed, clipped (by
    groups with ``split`` ≥ 0) and added to the sums."""
    n, q = Z.shape
    p_endog = X_endog.shape[1]
    width = M.shape[1]
    p = width - p_endog - 1
    grouped = split >= 0
    k = split if grouped else 0
    c1_lead, c1_rest, c2_lead, c2_rest = clips[0], clips[1], clips[2], clips[3]
    # A unit's norm is flagged (counts[2]) at its group's limits (group_clips: the partner norm is 1, so a
    # threshold under 2^-480 flags every unit), or when it is not finite.
    limits = np.empty(4)
    for g in range(4):
        limits[g] = clips[4 + g] if clips[4 + g] > 1.0 else 0.0
    limit1_lead, limit1_rest, limit2_lead, limit2_rest = limits[0], limits[1], limits[2], limits[3]
    G1 = np.empty((q, p_endog))
    g2 = np.empty(p)
    u = np.empty(width)
    units = starts.shape[0]
    for g in range(units):
        a = starts[g]
        b = starts[g + 1] if g + 1 < units else n
        G1[:, :] = 0.0
        g2[:] = 0.0
        for i in range(a, b):
            for j in range(width):
                acc = 0.0
                for c in range(q):
                    acc += Z[i, c] * M[c, j]
                u[j] = acc
            for j in range(p_endog):
                u[j] -= X_endog[i, j]
            e = u[width - 1] - Y[i]
            for c in range(q):
                zc = Z[i, c]
                for j in range(p_endog):
                    G1[c, j] += zc * u[j]
            for j in range(p):
                g2[j] += u[p_endog + j] * e
        n1l = 0.0
        n1r = 0.0
        for c in range(q):
            for j in range(p_endog):
                if c < k:
                    n1l += G1[c, j] * G1[c, j]
                else:
                    n1r += G1[c, j] * G1[c, j]
        n2l = 0.0
        n2r = 0.0
        for j in range(p):
            if j < k:
                n2l += g2[j] * g2[j]
            else:
                n2r += g2[j] * g2[j]
        if grouped:
            n1l, n1r, n2l, n2r = np.sqrt(n1l), np.sqrt(n1r), np.sqrt(n2l), np.sqrt(n2r)
        else:
            n1l = np.sqrt(n1l + n1r)
            n1r = n1l
            n2l = np.sqrt(n2l + n2r)
            n2r = n2l
        fl = 1.0
        fr = 1.0
        if c1_lead < np.inf:
            counts[2] += not n1l < limit1_lead
            fl = min(1.0, c1_lead / n1l)
        if c1_rest < np.inf:
            counts[2] += grouped and not n1r < limit1_rest
            fr = min(1.0, c1_rest / n1r)
        counts[0] += (fl < 1.0) or (fr < 1.0)
        for c in range(q):
            f = fl if c < k else fr
            for j in range(p_endog):
                S1[c, j] += f * G1[c, j]
        fl = 1.0
        fr = 1.0
        if c2_lead < np.inf:
            counts[2] += not n2l < limit2_lead
            fl = min(1.0, c2_lead / n2l)
        if c2_rest < np.inf:
            counts[2] += grouped and not n2r < limit2_rest
            fr = min(1.0, c2_rest / n2r)
        counts[1] += (fl < 1.0) or (fr < 1.0)
        for j in range(p):
            s2[j] += (fl if j < k else fr) * g2[j]


@lru_cache(maxsize=1)
def _numba_unit_kernel():
    """Compile :func:`_fused_units` on first use (cached on disk); no fastmath, so that overflowing norms show, and
    numpy's error model, so that a zero norm gives min(1, γ/0) = 1 as in numpy."""
    import numba

    return numba.njit(nogil=True, cache=True, error_model="numpy")(_fused_units)


def _scaled(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of A as (A / max|aᵢ|, log max|aᵢ|): bounded directions and logarithmic scales (−inf, direction 0, for a
    zero row, and for a row with an infinite or NaN value, whose direction is not defined: it adds nothing)."""
    largest, scaled = max_scaled_rows(A)
    usable = (largest > 0) & np.isfinite(largest)
    return scaled, np.where(usable, np.log(np.where(usable, largest, 1.0)), -np.inf)


def safe_unit_block_sums(Z: np.ndarray, X_endog: np.ndarray, Y: np.ndarray, starts: np.ndarray, theta: np.ndarray,
                         whitened: np.ndarray, beta_full: np.ndarray, clip1, clip2,
                         split: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`unit_block_sums` exact for every unit (the counterpart of :func:`safe_block_sums`): each row's term is
    held as a logarithmic scale and a bounded direction, so that a unit's sum, its norm (scaled by its largest value,
    so neither overflow nor underflow) and its clipped value are formed exactly; a unit whose norm exceeds γ
    contributes γ times its unit vector. A row with an infinite or NaN value adds nothing. Slower; used only for an
    iteration in which :func:`unit_block_sums` flagged a unit (a non-finite norm, or one at the limits of
    :func:`group_clips`). The block is taken a chunk of whole units at a time (a unit
    holds at most ``max_rows_per_unit`` rows)."""

    n, q = Z.shape
    p_endog, p = X_endog.shape[1], whitened.shape[1]
    clips, k = group_clips(clip1, clip2, split)
    lead = max(k, 0)
    sums = (np.zeros((q, p_endog)), np.zeros(p))
    counts = np.zeros(3, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    bounds = starts[starts < n]
    for rows in _cut(np.append(bounds, n), n, max(1, -(-n * (q * p_endog + p) // GROUP_CHUNK_VALUES))):
        local = bounds[(bounds >= rows.start) & (bounds < rows.stop)] - rows.start
        sizes = np.diff(np.append(local, rows.stop - rows.start))
        z = Z[rows]
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            (zd, zs), (rd, rs) = _scaled(z), _scaled(z @ theta - X_endog[rows])
            (xd, xs), (ed, es) = _scaled(z @ whitened), _scaled((z @ beta_full - Y[rows])[:, None])
            stages = ((zd[:, :, None] * rd[:, None, :], zs + rs), (xd * ed, xs + es))
            for stage, (terms, log_scale) in enumerate(stages):
                ceiling = np.maximum.reduceat(log_scale, local)
                ceiling = np.where(np.isfinite(ceiling), ceiling, 0.0)  # a unit of zero terms
                weight = np.exp(log_scale - np.repeat(ceiling, sizes)).reshape((-1,) + (1,) * (terms.ndim - 1))
                clipped = np.zeros(local.size, dtype=bool)
                for group, part in enumerate((slice(0, lead), slice(lead, None))):
                    if terms[:, part].shape[1] == 0:
                        continue
                    direction = np.add.reduceat(weight * terms[:, part], local, axis=0)
                    flat = direction.reshape(local.size, -1)
                    largest, unit, scaled_norm = unit_rows(flat)  # the unit's norm without underflow
                    log_norm = np.log(largest) + np.log(scaled_norm) + ceiling  # −inf for a zero sum
                    gamma = clips[2 * stage + group]
                    over = (log_norm > math.log(gamma)) if math.isfinite(gamma) else np.zeros(local.size, dtype=bool)
                    plain = np.exp(ceiling)  # the unit's scale; inf when huge terms cancelled to a small sum
                    kept = np.where(np.isfinite(plain)[:, None], flat * plain[:, None],
                                    unit * np.exp(log_norm)[:, None])
                    values = np.where(over[:, None], gamma * unit, kept)
                    sums[stage][part] += values.sum(axis=0).reshape(direction.shape[1:])
                    clipped |= over
                counts[stage] += int(np.count_nonzero(clipped))
    return sums[0], sums[1], counts


def working_rows(raw: np.ndarray, lo: np.ndarray, hi: np.ndarray, z_columns: np.ndarray, z_center: np.ndarray,
                 A_z: np.ndarray, endog_columns: np.ndarray, endog_center: np.ndarray, A_endog: np.ndarray,
                 y_center: float, y_scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The working rows of a block of design rows ``raw`` ([dependent, exog, endog, instruments]): every value
    clipped to its column's [lo, hi], then Z̃ = (clip(z) − c_Z) A_Z, X̃_endog = (clip(x_endog) − c) A and
    Ỹ = (clip(y) − c_y)/s_y (:class:`dpivreg.estimation.working_scale.WorkingScale`), z and x_endog the columns at
    ``z_columns`` and ``endog_columns``. Compiled by numba (one loop per output column, so that the row loops
    vectorise); numpy without it. New arrays (m, q), (m, p_endog), (m,), column-major when compiled (each
    output column is then written in order: 10 times faster than row-major at q = 8, measured)."""
    if not numba_available():
        return mapped_columns(np.clip(raw, lo, hi), z_columns, z_center, A_z, endog_columns, endog_center, A_endog,
                              y_center, y_scale)
    m = raw.shape[0]
    Z, X_endog, Y = np.empty((m, A_z.shape[1]), order="F"), np.empty((m, A_endog.shape[1]), order="F"), np.empty(m)
    with _COMPILE_LOCK:
        kernel_function = _numba_working_rows()
    kernel_function(raw, lo, hi, z_columns, z_center, A_z, Z)
    kernel_function(raw, lo, hi, endog_columns, endog_center, A_endog, X_endog)
    kernel_function(raw, lo, hi, np.zeros(1, dtype=np.int64), np.array([y_center]), np.array([[1.0 / y_scale]]),
                    Y.reshape(m, 1))
    return Z, X_endog, Y


def mapped_columns(clipped, z_columns, z_center, A_z, endog_columns, endog_center, A_endog, y_center: float,
                   y_scale: float) -> tuple:
    """:func:`working_rows`'s affine maps of rows already clipped, in numpy operations (so also on Dask arrays)."""
    return ((clipped[:, z_columns] - z_center) @ A_z, (clipped[:, endog_columns] - endog_center) @ A_endog,
            (clipped[:, 0] - y_center) / y_scale)


def _fused_mapped_columns(raw, lo, hi, columns, center, A, out):  # pragma: no cover - compiled by numba
    """out = (clip(raw[:, columns]) − center) @ A, one output column at a time, summing over the inputs in order
    (each inner loop runs down a column: it vectorises; tiles of rows made it 3 times slower, measured)."""
    m = raw.shape[0]
    for a in range(A.shape[1]):
        for i in range(m):
            out[i, a] = 0.0
        for b in range(columns.shape[0]):
            j = columns[b]
            low, high, shift, weight = lo[j], hi[j], center[b], A[b, a]
            for i in range(m):
                out[i, a] += (min(max(raw[i, j], low), high) - shift) * weight


@lru_cache(maxsize=1)
def _numba_working_rows():
    """Compile :func:`_fused_mapped_columns` on first use (cached on disk); no fastmath: the map's rounding is
    numpy's but for the order of the sum over the inputs."""
    import numba

    return numba.njit(nogil=True, cache=True)(_fused_mapped_columns)
