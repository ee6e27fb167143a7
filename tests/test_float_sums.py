"""Floating-point soundness of the summed releases (:mod:`dpivreg.privacy.rounding`).

Every release whose data part is a sum of N bounded terms is computed in blocks of at most 2¹⁶ terms whose results
are added pairwise, and its sensitivity (and noise) carries the rounding allowance of that order of summation:
(1 + τ)·(1 + 2·γ_k·N·r) with γ_k = k·u/(1 − k·u) (Higham 2002, Lemma 3.1 and §4.2) and
k(N) = min(N, 2¹⁶) + 2·⌈log₂ N⌉ + 1 (one product, at most 2¹⁶ − 1 additions in a block, two levels of pairwise
combination of at most N partial sums, one division by n). Casacuberta, Shoemate, Vadhan & Wagaman (2022) showed
that sensitivities proved in exact arithmetic are exceeded by the computed sums; the tests below pin the allowance's
values at scale, show an adversarial pair whose computed sums do exceed the exact sensitivity (so a variant without
the allowance fails) but never the allowed one, and check that the passes sum in the order the allowance assumes.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

import dpivreg.compute.backends as backends
import dpivreg.compute.kernels as kernels
from dpivreg import DPIV2SLS, FitRelease, dp_2s_gd
from dpivreg.compute.backends import InMemoryRows, add_parts
from dpivreg.privacy import rounding
from dpivreg.privacy.accounting import noise_std
from dpivreg.privacy.mechanisms import (
    ball_second_moments,
    box_moment_sum,
    box_second_moments,
    histograms,
    release_histogram_counts,
)
from dpivreg.privacy.rounding import (
    CLIP_SLACK,
    ball_rounding,
    blocked_gram,
    box_rounding,
    gradient_rounding,
    pairwise_sum,
    sum_rounding,
    summation_depth,
)

U = Fraction(1, 2**53)


def _gamma(k: int, u: Fraction = U) -> Fraction:
    """γ_k = k·u/(1 − k·u), exactly."""
    return k * u / (1 - k * u)


def _within(value: float, exact: Fraction) -> bool:
    """The float factor is never below the exact closed form and above it by at most 2⁻⁴⁷ relative."""
    return exact <= Fraction(value) <= exact * (1 + Fraction(1, 2**47))


# ---------------------------------------------------------------------------------------- exact values at scale
# k(N) = min(N, 2¹⁶) + 2·⌈log₂ N⌉ + 1 written out: ⌈log₂ 10⁶⌉ = 20, ⌈log₂ 5·10⁷⌉ = 26, ⌈log₂ 10⁸⌉ = 27.
DEPTHS = {10**6: 65_536 + 40 + 1, 5 * 10**7: 65_536 + 52 + 1, 10**8: 65_536 + 54 + 1}
# 1 + N·γ_k of a clipped mean (r = 1/2), to 5 digits: the relative excess the allowance adds to 2γ/n.
CLIPPED_MEAN_EXCESS = {10**6: 7.2805e-6, 5 * 10**7: 3.6409e-4, 10**8: 7.2821e-4}


@pytest.mark.parametrize("n", sorted(DEPTHS))
def test_the_depth_is_the_blocked_pairwise_order(n):
    assert summation_depth(n) == DEPTHS[n]


@pytest.mark.parametrize("n", sorted(DEPTHS))
def test_the_clipped_mean_allowance_is_the_closed_form(n):
    """A clipped mean's computed neighbours differ by at most 2γ/n + 2·γ_k·n·γ/n = (2γ/n)·(1 + n·γ_k)."""
    k = DEPTHS[n]
    factor = sum_rounding(n, 0.5)
    assert _within(factor, 1 + n * _gamma(k))
    assert factor - 1 == pytest.approx(CLIPPED_MEAN_EXCESS[n], rel=1e-4)


@pytest.mark.parametrize("n", sorted(DEPTHS))
def test_whole_array_sums_would_need_more_than_the_sensitivity(n):
    """Casacuberta et al.'s point: with one whole-array block (k ≈ n) the excess is about n²·u, 28% at 5·10⁷ and
    111% at 10⁸; the blocked order keeps it under 10⁻³ (15 times less at 10⁶, 1,500 times at 10⁸)."""
    whole = sum_rounding(n, 0.5, block_terms=n) - 1
    assert _within(whole + 1, 1 + n * _gamma(n + 2 * math.ceil(math.log2(n)) + 1))
    assert whole > 15 * (sum_rounding(n, 0.5) - 1)
    if n == 10**8:
        assert whole > 1.0 > 1e-3 > sum_rounding(n, 0.5) - 1


@pytest.mark.parametrize("n", sorted(DEPTHS))
def test_the_gradient_allowance_includes_the_clipping_slack(n):
    """τ = 2⁻³⁶ + γ_d, d = q·p_endog + q + p + 8 (here q = 3, p = 2, p_endog = 1: d = 16), and the same τ as the
    distance ε of a computed term from the exact clipped one (fast or safe kernel, chosen by all rows of a pass):
    (1 + τ)(1 + n·γ_k) + n·τ (2·N·r·ε with r = 1/2)."""
    factor = gradient_rounding(n, 3, 2, 1)
    tau = Fraction(CLIP_SLACK) + _gamma(16)
    assert _within(factor, (1 + tau) * (1 + n * _gamma(DEPTHS[n])) + n * tau)
    if n == 10**8:  # 2⁻³⁶·10⁸ = 1.46e-3 for the kernel switch, 7.3e-4 for the sums
        assert factor - 1 == pytest.approx(1.4552e-3 + 7.2821e-4, rel=1e-3)


@pytest.mark.parametrize("n", sorted(DEPTHS))
def test_the_moment_and_meat_allowances_are_their_closed_forms(n):
    """Box (D = 3): a term's upper triangle has norm at most √((D² + D)/2) = √6, the sum's sensitivity D = 3, so
    1 + 2·γ_k·n·√6/3 (the square root evaluated in floats: compared to 1e-15). Ball / meat (d = 4, m = 1):
    (1 + γ_{d+16})·(1 + 2·γ_{k+3}·n/√2)."""
    box = 1 + 2 * _gamma(DEPTHS[n]) * n * Fraction(math.sqrt(6.0) / 3)
    assert float(box) == pytest.approx(box_rounding(n, 3), rel=1e-15)
    assert box_rounding(n, 3) >= float(box)
    ball = (1 + _gamma(20)) * (1 + 2 * _gamma(DEPTHS[n] + 3) * n * Fraction(1 / math.sqrt(2.0)))
    assert float(ball) == pytest.approx(ball_rounding(n, 4), rel=1e-15)
    assert ball_rounding(n, 4) >= float(ball)
    # one coordinate: the term is w² ∈ [0, B²] and the sensitivity B², so r = 1 (not 1/√2), τ = γ_17
    scalar = (1 + _gamma(17)) * (1 + 2 * _gamma(DEPTHS[n] + 3) * n)
    assert float(scalar) == pytest.approx(ball_rounding(n, 1), rel=1e-15)
    assert ball_rounding(n, 1) >= float(scalar)
    # per unit of m rows: r and the number of terms scale together
    assert box_rounding(10 * n, 3, 10) == pytest.approx(1 + 2 * float(_gamma(summation_depth(10 * n))) * n
                                                        * math.sqrt(6.0) / 3, rel=1e-12)


def test_histogram_counts_are_exact_and_carry_no_allowance():
    """Counts are integers: float64 holds them and their sums exactly below 2⁵³ (no rounding), and above it the
    release refuses them."""
    values = np.random.default_rng(0).standard_normal(200_003)
    _, release, _ = histograms([values], [np.linspace(-4, 4, 9)], rho=1.0, rng=np.random.default_rng(1))
    assert release.rounding == 1.0 and release.sensitivity == math.sqrt(2.0)
    counts = [np.bincount(np.arange(70_000) % 5, minlength=5).astype(np.float64)] * 3
    assert add_parts(counts).tolist() == [42_000.0] * 5  # blocks' counts add exactly
    assert add_parts([np.full(3, 2.0**52 - 1.0), np.ones(3)])[0] == 2.0**52  # exact up to 2⁵³
    with pytest.raises(ValueError, match="2\\*\\*53"):
        release_histogram_counts(np.full((1, 4), 2.0**53), rho=1.0, rng=np.random.default_rng(0), name="h",
                                 stage="s")


# ---------------------------------------------------------------------------------------- an adversarial pair
F32 = np.float32
U32 = 2.0**-24  # float32's unit roundoff: the proof is the same with u = 2⁻²⁴


def _float32_mean(terms: list[np.ndarray], n: int) -> float:
    """(1/n)·Σ in float32 in the package's order: each block summed sequentially (a summation tree of the block),
    the blocks' sums added by :func:`pairwise_sum`, then the division by n."""
    parts = [np.add.accumulate(block, dtype=F32)[-1:] for block in terms]
    return float((pairwise_sum(parts) / F32(n))[0])


def test_a_computed_mean_exceeds_the_exact_sensitivity_but_not_the_allowed_one():
    """N = 2¹² terms in [−1, 1] (C = 1), blocks of 2¹⁰: every term 0.7651099, but the first, +1 in D and −1 in D′.
    The exact means differ by 2C/N; the computed ones by more (the accumulators' roundings differ once the first
    term differs), so a release calibrated to 2C/N alone understates its sensitivity. The allowance
    (1 + N·γ_k), k = 2¹⁰ + 2·12 + 1, with u = 2⁻²⁴, covers it."""
    n, block = 1 << 12, 1 << 10
    base = np.full(n, F32(0.7651099), dtype=F32)
    first, second = base.copy(), base.copy()
    first[0], second[0] = F32(1.0), F32(-1.0)
    blocks = [slice(a, a + block) for a in range(0, n, block)]
    difference = abs(_float32_mean([first[b] for b in blocks], n) - _float32_mean([second[b] for b in blocks], n))
    exact = 2.0 / n
    assert difference > exact * (1 + 2e-4)  # without the allowance: violated
    assert difference <= exact * sum_rounding(n, 0.5, u=U32, block_terms=block)


def test_rounding_at_the_top_of_the_tree_doubles_the_sensitivity():
    """2²⁶ terms of 1 in blocks of 2¹⁶ (the package's block), the last block with two zeros, the first term +1 in D and
    −1 in D′: at the top of the pairwise tree float32's spacing is 8, and the computed sums differ by 4, twice the
    exact 2C. (Identical blocks have identical sums, so only the distinct blocks are formed.)"""
    block, count = 1 << 16, 1 << 10

    def computed(first_value: float) -> float:
        first, last = np.ones(block, dtype=F32), np.ones(block, dtype=F32)
        first[0], last[:2] = F32(first_value), F32(0.0)
        ones = np.add.accumulate(np.ones(block, dtype=F32), dtype=F32)[-1:]
        parts = ([np.add.accumulate(first, dtype=F32)[-1:]] + [ones] * (count - 2)
                 + [np.add.accumulate(last, dtype=F32)[-1:]])
        return float(pairwise_sum(parts)[0])

    difference = abs(computed(1.0) - computed(-1.0))
    assert difference == 4.0 > 2.0
    assert difference <= 2.0 * sum_rounding(block * count, 0.5, u=U32)


# ---------------------------------------------------------------------------------------- the order is enforced
@pytest.fixture
def block_sizes(monkeypatch):
    """The rows each call of the gradient kernel sees."""
    sizes: list[int] = []
    original = backends.block_sums

    def recording(Z, *args, **kwargs):
        sizes.append(Z.shape[0])
        return original(Z, *args, **kwargs)

    monkeypatch.setattr(backends, "block_sums", recording)
    return sizes


def _rows(n: int, q: int = 2, seed: int = 0):
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((n, q))
    X = Z[:, :1] + rng.standard_normal((n, 1))
    return Z, X, X[:, 0] + rng.standard_normal(n)


def test_in_memory_passes_sum_at_most_a_block_per_kernel_call(block_sizes):
    """One thread holds all 200,000 rows, but each kernel call sums at most 2¹⁶ of them (``dp_2s_gd`` on raw arrays
    runs on this source)."""
    Z, X, Y = _rows(200_000)
    rows = InMemoryRows(Z, X, Y, n_threads=1, kernel="numpy")
    try:
        M = np.zeros((2, 1 + 1 + 1))
        rows.clipped_sums(M, 1.0, 1.0)
    finally:
        rows.close()
    assert max(block_sizes) <= rounding.SUM_BLOCK_TERMS and sum(block_sizes) == 200_000


def test_dask_partitions_are_summed_a_block_at_a_time(block_sizes):
    da = pytest.importorskip("dask.array")
    Z, X, Y = _rows(150_000)
    path = dp_2s_gd(da.from_array(Z, chunks=(150_000, -1)), da.from_array(X, chunks=(150_000, -1)),
                    da.from_array(Y, chunks=150_000), T=1, rho1=1.0, rho2=1.0, eta=0.1, alpha=0.1, clip1=1.0,
                    clip2=1.0, seed=0, kernel="numpy")
    assert max(block_sizes) <= rounding.SUM_BLOCK_TERMS and sum(block_sizes) == 150_000
    assert path.privacy.releases[0].rounding == gradient_rounding(150_000, 2, 1, 1)


def test_pairwise_combination_depth():
    """P partial sums pass through at most ⌈log₂ P⌉ additions: with P = 2^j parts of value 1 in float32, no partial
    exceeds 2^j and the sum is exact; exact zero parts are left out."""
    parts = [np.ones(1, dtype=F32)] * 1000 + [np.zeros(1, dtype=F32)] * 24
    assert pairwise_sum(parts)[0] == 1000.0
    # the order itself: after a 1, each 2⁻²⁴ is half an ulp and vanishes when added in sequence (ties to even), while
    # a tree adds the small parts to each other first
    small = [np.ones(1, dtype=F32)] + [np.full(1, 2.0**-24, dtype=F32)] * 1023
    sequential = small[0].copy()
    for part in small[1:]:
        sequential = sequential + part
    assert sequential[0] == 1.0
    assert pairwise_sum(small)[0] >= 1.0 + 1000 * 2.0**-24
    A = np.random.default_rng(0).standard_normal((200_000, 3))
    assert np.allclose(blocked_gram(A), A.T @ A, rtol=1e-12, atol=1e-9)


def test_grouped_passes_sum_at_most_a_block_of_groups_per_call():
    """Privacy units and clusters: each grouped block function sums at most 2¹⁶ whole groups (70,000 units here, of
    one to three rows), every row and group once."""
    rng = np.random.default_rng(1)
    sizes = rng.integers(1, 4, 70_000)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    n = int(sizes.sum())
    Z, X, Y = _rows(n)
    calls = []

    def block(Zb, Xb, Yb, starts_b):
        calls.append((Zb.shape[0], starts_b.shape[0]))
        assert starts_b[0] == 0 and (starts_b < Zb.shape[0]).all()
        return (np.array([float(Zb.shape[0])]),)

    (total,) = backends._in_group_blocks(Z, X, Y, starts, block)
    assert max(groups for _, groups in calls) <= rounding.SUM_BLOCK_TERMS
    assert sum(groups for _, groups in calls) == 70_000 and sum(r for r, _ in calls) == n == total[0]


def test_a_unit_level_meat_counts_every_row_of_every_unit():
    """With privacy units the robust meat sums at most N·m rows' terms, m of which a neighbour changes: its
    allowance is the ball sum's of N·m terms with r = 1/(√2·m)."""
    frame = _frame(3_000).assign(hh=np.arange(3_000) // 3)
    res = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z]", frame).fit(
        rho=1.0, seed=3, bounds=BOUNDS, privacy_unit="hh", max_rows_per_unit=4, cov_type="robust")
    (meat,) = [r for r in res.privacy.releases if r.stage == "rho_inf" and r.name.startswith("robust meat")]
    N, m, d = 1_000, 4, 3
    k = summation_depth(N * m, extra=3)
    r = 1 / (math.sqrt(2) * m)
    tau = _gamma(d + 16)
    exact = (1 + tau) * (1 + 2 * _gamma(k) * N * m * Fraction(r))
    assert _within(meat.rounding, exact)


class _Products(np.ndarray):
    """An array that records the inner dimension of every matrix product it takes part in."""

    inner: list[int] = []

    def __matmul__(self, other):
        _Products.inner.append(self.shape[-1])
        return np.asarray(self) @ np.asarray(other)


def test_blocked_products_sum_at_most_a_block():
    A = np.random.default_rng(0).standard_normal((150_000, 3)).view(_Products)
    _Products.inner = []
    blocked_gram(A)
    assert _Products.inner and max(_Products.inner) <= rounding.SUM_BLOCK_TERMS
    assert sum(_Products.inner) == 150_000


def test_the_raw_moment_releases_block_their_sums(monkeypatch):
    """``box_second_moments`` and ``ball_second_moments`` on 150,000 rows take their sums by :func:`blocked_gram`,
    and the records carry the allowance for n = 150,000."""
    seen: list[int] = []

    def recording(A, B=None, **kwargs):
        seen.append(A.shape[0])
        return blocked_gram(A, B, **kwargs)

    monkeypatch.setattr("dpivreg.privacy.mechanisms.blocked_gram", recording)
    V = np.random.default_rng(0).uniform(-1, 1, (150_000, 2))
    _, box, _ = box_second_moments(V, rho=1.0, rng=np.random.default_rng(0), has_constant=True)
    _, ball, _ = ball_second_moments(V, rho=1.0, rng=np.random.default_rng(0), row_bound=1.0)
    assert box.rounding == box_rounding(150_000, 3) and box.sensitivity == pytest.approx(3 / 150_000 * box.rounding)
    assert ball.rounding == ball_rounding(150_000, 2)
    assert box.rho == pytest.approx(1.0, rel=1e-12) and ball.rho == pytest.approx(1.0, rel=1e-12)
    assert 150_000 in seen
    W = np.column_stack([np.ones(150_000), V])
    np.testing.assert_allclose(box_moment_sum(V, True), W.T @ W, rtol=1e-12)


# ---------------------------------------------------------------------------------------- the accounting
def test_dp_2s_gd_records_the_allowance_and_spends_the_budget():
    Z, X, Y = _rows(5_000, q=3)
    X2 = np.column_stack([Z[:, 0], X])  # one exogenous column, its own instrument
    for seed in (0, None):  # seeded and secure samplers
        path = dp_2s_gd(Z, X2, Y, T=3, rho1=0.4, rho2=0.6, eta=0.1, alpha=0.1, clip1=2.0, clip2=3.0, seed=seed,
                        n_exog=1)
        factor = gradient_rounding(5_000, 3, 2, 1)
        for release, clip in zip(path.privacy.releases, (2.0, 3.0)):
            assert release.rounding == factor
            if seed == 0:
                assert release.sensitivity == factor * (2 * clip / 5_000)
            else:  # the grid's factor on top (at most 1 + 2⁻³⁰)
                assert factor * (2 * clip / 5_000) < release.sensitivity <= factor * (2 * clip / 5_000) * (1 + 2**-29)
            if seed == 0:  # the noise is the exact calibration times the allowance
                assert path.lambda1 == pytest.approx(noise_std(2.0, 5_000, 3, 0.4) * factor, rel=1e-15)
        assert path.privacy.rho1 == pytest.approx(0.4, rel=1e-12)
        assert path.privacy.rho2 == pytest.approx(0.6, rel=1e-12)
        assert path.privacy.rho == pytest.approx(1.0, rel=1e-12)


def _frame(n: int = 3_000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    z, w, u = rng.standard_normal((3, n))
    x = np.clip(z + 0.5 * u + rng.standard_normal(n), -5.9, 5.9)
    return pd.DataFrame({"y": np.clip(1 + 2 * x - w + u, -14.9, 14.9), "x": x, "z": np.clip(z, -3.9, 3.9),
                         "w": np.clip(w, -3.9, 3.9)})


BOUNDS = {"y": (-15.0, 15.0), "x": (-6.0, 6.0), "z": (-4.0, 4.0), "w": (-4.0, 4.0)}


@pytest.mark.parametrize("cov_type", ["robust", "unadjusted"])
def test_a_fit_records_an_allowance_on_every_summed_release(cov_type):
    res = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z]", _frame()).fit(rho=1.0, seed=3, bounds=BOUNDS,
                                                                      cov_type=cov_type)
    releases = res.privacy.releases
    assert res.privacy.rho == pytest.approx(sum(r.rho for r in releases), rel=1e-12)
    assert res.privacy.rho == pytest.approx(1.0, rel=1e-9)
    for release in releases:
        if "histogram" in release.name:
            assert release.rounding == 1.0  # counts are exact
        else:
            assert 1.0 < release.rounding < 1.0 + 1e-5, release.name
    assert any("moments" in r.name for r in releases) and any("path" in r.name for r in releases)
    back = FitRelease.from_json(res.release().to_json())
    assert [r.rounding for r in back.privacy.releases] == [r.rounding for r in releases]


def test_records_without_the_field_load_with_no_allowance():
    """A record written before the allowance existed (no "rounding" field) still loads, with rounding 1."""
    import json

    res = DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z]", _frame(800)).fit(rho=1.0, seed=3, bounds=BOUNDS,
                                                                        inference=False)
    data = json.loads(res.release().to_json())
    for record in data["releases"]:
        record.pop("rounding")
    data.pop("digest")  # records of that time had no digest either
    with pytest.warns(UserWarning, match="has no digest"):
        back = FitRelease.from_json(json.dumps(data))
    assert all(r.rounding == 1.0 for r in back.privacy.releases)


def test_kernels_module_is_untouched_by_the_order():
    """The block functions themselves are unchanged: one call on ≤ 2¹⁶ rows gives the whole pass's sums to
    rounding."""
    Z, X, Y = _rows(50_000)
    M = np.full((2, 3), 0.1)
    S1, s2, _ = kernels.block_sums(Z, X, Y, M, 1.0, 1.0, "numpy")
    rows = InMemoryRows(Z, X, Y, n_threads=1, kernel="numpy")
    try:
        T1, t2, _ = rows.clipped_sums(M, 1.0, 1.0)
    finally:
        rows.close()
    np.testing.assert_allclose(T1, S1, rtol=1e-12)
    np.testing.assert_allclose(t2, s2, rtol=1e-12)
