"""The fast engine against the straightforward numpy formulation (tests/reference_engine.py).

Every implementation of the pass over the rows (numpy on cache-sized blocks, numba, threads, Dask
blocks) must release the same path for the same seed as the plain loop, to 1e-12 relative: only
the order of summation differs. The grid covers both methods, exogenous columns, clipping that
binds on many rows, and the noiseless, unclipped limit.
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
from reference_engine import reference_path

from dpivreg import dp_2s_gd
from dpivreg.compute import codegen, kernels
from dpivreg.compute.kernels import numba_available
from dpivreg.privacy.rounding import gradient_rounding

KERNELS = ["numpy", pytest.param("numba", marks=pytest.mark.skipif(not numba_available(), reason="numba not installed"))]


def _data(n: int, q: int, p: int, n_exog: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((n, q))
    Z[:, :n_exog] = 1.0 if n_exog else Z[:, :n_exog]
    Pi = np.eye(q, p) + 0.3 * rng.standard_normal((q, p))
    X = Z @ Pi + rng.standard_normal((n, p))
    X[:, :n_exog] = Z[:, :n_exog]
    Y = X @ rng.standard_normal(p) + rng.standard_normal(n) * (1 + np.abs(Z[:, -1]))  # heavy-ish tails: rows clip
    return Z, X, Y


def _assert_same_path(path, theta, beta, rtol=1e-12):
    scale_t = max(1.0, float(np.max(np.abs(theta))))
    scale_b = max(1.0, float(np.max(np.abs(beta))))
    np.testing.assert_allclose(path.theta, theta, rtol=rtol, atol=rtol * scale_t)
    np.testing.assert_allclose(path.beta, beta, rtol=rtol, atol=rtol * scale_b)


CASES = {
    # name: (q, p, n_exog, method, private)
    "gd": (3, 2, 0, "gd", True),
    "gd-exog": (4, 3, 1, "gd", True),
    "preconditioned": (3, 2, 0, "preconditioned", True),
    "preconditioned-exog": (5, 3, 2, "preconditioned", True),
    "noiseless-unclipped": (3, 2, 1, "preconditioned", False),
}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fast_engine_equals_the_plain_loop(case, n_threads, kernel):
    q, p, n_exog, method, private = CASES[case]
    Z, X, Y = _data(45_000, q, p, n_exog)  # >= 2 × 20,000 rows: two threads really split the rows
    T, eta, alpha = 12, 0.5, 0.3 if method == "preconditioned" else 0.05
    clip = 3.0 if private else None  # binds on a large share of rows
    rho = 1.0 if private else math.inf
    with pytest.warns() if not private else _no_warning():
        path = dp_2s_gd(Z, X, Y, T=T, rho1=rho, rho2=rho, eta=eta, alpha=alpha, clip1=clip, clip2=clip, seed=7,
                        n_exog=n_exog, method=method, kernel=kernel, n_threads=n_threads)
    theta, beta = reference_path(Z, X, Y, T=T, eta=eta, alpha=alpha, clip1=clip, clip2=clip, lambda1=path.lambda1,
                                 lambda2=path.lambda2, seed=7, n_exog=n_exog, method=method, ridge=path.ridge)
    _assert_same_path(path, theta, beta)
    if private:
        assert path.clipped_rows[1:].min() > 1000, "the test must exercise clipping"


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.skipif(not numba_available(), reason="numba not installed")
def test_numba_and_numpy_count_the_same_clipped_rows():
    Z, X, Y = _data(30_000, 4, 2, 1, seed=3)
    kw = dict(T=8, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.3, clip1=3.0, clip2=3.0, seed=1, n_exog=1,
              method="preconditioned")
    a = dp_2s_gd(Z, X, Y, kernel="numpy", **kw)
    b = dp_2s_gd(Z, X, Y, kernel="numba", **kw)
    np.testing.assert_array_equal(a.clipped_rows, b.clipped_rows)


@pytest.mark.parametrize("kernel", KERNELS)
def test_large_p_q_uses_the_same_numbers(kernel):
    """p = q = 20: the numpy kernel's BLAS blocks and numba's fused loop agree with the plain loop."""
    Z, X, Y = _data(5_000, 20, 20, 0, seed=5)
    kw = dict(T=6, eta=0.5, alpha=0.3, clip1=20.0, clip2=20.0, seed=2, method="preconditioned")
    path = dp_2s_gd(Z, X, Y, rho1=1.0, rho2=1.0, kernel=kernel, **kw)
    theta, beta = reference_path(Z, X, Y, T=6, eta=0.5, alpha=0.3, clip1=20.0, clip2=20.0, lambda1=path.lambda1,
                                 lambda2=path.lambda2, seed=2, method="preconditioned", ridge=path.ridge)
    _assert_same_path(path, theta, beta)


@pytest.mark.parametrize("order, kernel", [("C", "numpy"), ("F", "numpy"), ("F", "auto")])
def test_no_n_length_temporaries(order, kernel):
    """Memory beyond the data is O(block), not O(n): the traced peak during a fit stays far below 8·n bytes.

    numpy reports its allocations to tracemalloc; an n-length float64 temporary (8 MB here) or a
    per-iteration copy of the data would show, and so would a row-major copy of column-major input (what
    pandas' ``to_numpy()`` gives), which the fit reads in place.
    """
    n = 1_000_000
    Z, X, Y = (np.asarray(a, order=order) for a in _data(n, 2, 2, 0, seed=9))
    kw = dict(T=3, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.3, clip1=5.0, clip2=5.0, seed=0, method="preconditioned",
              kernel=kernel)
    dp_2s_gd(Z, X, Y, **kw)  # numba compiles (or loads) this layout's kernel first: its code is not the data's
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        dp_2s_gd(Z, X, Y, **kw)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak < 8 * n / 2, f"peak {peak / 1e6:.1f} MB during the fit: an n-length temporary?"


def test_overflowing_rows_take_the_safe_pass():
    """A row whose gradient norm overflows is clipped through its unit vectors, as by the plain loop's rule."""
    Z, X, Y = _data(2_000, 3, 2, 0, seed=4)
    Y = Y.copy()
    Y[5] = 1e300
    path = dp_2s_gd(Z, X, Y, T=4, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.05, clip1=3.0, clip2=3.0, seed=0)
    assert np.all(np.isfinite(path.beta))
    assert path.clipped_rows[1:, 1].min() >= 1


def test_kernel_and_threads_are_checked():
    Z, X, Y = _data(100, 3, 2, 0)
    kw = dict(T=2, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.05, clip1=3.0, clip2=3.0)
    with pytest.raises(ValueError, match="kernel must be one of"):
        dp_2s_gd(Z, X, Y, kernel="cuda", **kw)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="n_threads"):
            dp_2s_gd(Z, X, Y, n_threads=bad, **kw)


def test_fortran_ordered_and_integer_input_give_the_same_path():
    Z, X, Y = _data(3_000, 3, 2, 0, seed=6)
    kw = dict(T=5, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.05, clip1=3.0, clip2=3.0, seed=3)
    a = dp_2s_gd(Z, X, Y, **kw)
    b = dp_2s_gd(np.asfortranarray(Z), np.asfortranarray(X), Y, **kw)
    np.testing.assert_array_equal(a.beta, b.beta)
    Zi = np.round(Z * 10).astype(np.int32)
    c = dp_2s_gd(Zi, X, Y, **kw)
    d = dp_2s_gd(Zi.astype(float), X, Y, **kw)
    np.testing.assert_array_equal(c.beta, d.beta)


# ----------------------------------------------------------------------------------------
# group clipping, budget schedules and warm starts (the default pipeline's iteration)
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("method", ["gd", "preconditioned"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_group_clipping_schedule_and_start_equal_the_plain_loop(kernel, method, n_threads):
    q, p, n_exog = 5, 3, 2
    Z, X, Y = _data(45_000, q, p, n_exog, seed=3)
    Z[:40, 1] = 25.0  # a rare, high-leverage exogenous category: the exogenous group clips, the rest does not
    X[:, :n_exog] = Z[:, :n_exog]
    T = 5
    schedule = np.array([[0.1, 0.2, 0.3, 0.4, 0.0], [0.0, 0.1, 0.2, 0.3, 0.4]])
    theta0 = 0.3 * np.ones((q, p - n_exog))
    beta0 = np.array([0.5, -0.2, 0.1])
    alpha = 0.3 if method == "preconditioned" else 0.05
    path = dp_2s_gd(Z, X, Y, T=T, rho1=2.0, rho2=2.0, eta=0.5, alpha=alpha, clip1=(4.0, 2.0), clip2=(3.0, 1.5),
                    seed=5, n_exog=n_exog, method=method, kernel=kernel, n_threads=n_threads, theta0=theta0,
                    beta0=beta0, schedule=schedule, group_share=0.25)
    assert path.split == n_exog and path.root == ("cholesky" if method == "preconditioned" else None)
    assert np.all(path.clipped_rows[:, 0] > 0)  # the groups bind
    theta, beta = reference_path(Z, X, Y, T=T, eta=0.5, alpha=alpha, clip1=(4.0, 2.0), clip2=(3.0, 1.5),
                                 lambda1=path.noise1, lambda2=path.noise2, seed=5, n_exog=n_exog, method=method,
                                 ridge=path.ridge, theta0=theta0, beta0=beta0, schedule=schedule, split=n_exog)
    _assert_same_path(path, theta, beta)
    np.testing.assert_array_equal(path.theta[-1], path.theta[-2])  # stage 1 has no share at the last step
    np.testing.assert_array_equal(path.beta[1], path.beta[0])  # stage 2 none at the first


def test_schedule_and_groups_are_calibrated_per_step_and_group():
    """Step t of stage k spends ρk·s[k, t], split group_share : 1 − group_share between the groups: the noise
    std of each is γ_g/n·sqrt(2/(ρk·s[k, t]·share_g)), and the accountant's records add up to ρk exactly."""
    Z, X, Y = _data(2_000, 4, 2, 1, seed=1)
    schedule = np.array([[0.25, 0.75, 0.0], [0.0, 0.5, 0.5]])
    path = dp_2s_gd(Z, X, Y, T=3, rho1=1.5, rho2=0.7, eta=0.5, alpha=0.5, clip1=(2.0, 3.0), clip2=(4.0, 5.0),
                    seed=0, n_exog=1, method="preconditioned", schedule=schedule, group_share=0.2)
    n = 2_000
    for noise, rho, clips, shares in ((path.noise1, 1.5, (2.0, 3.0), schedule[0]),
                                      (path.noise2, 0.7, (4.0, 5.0), schedule[1])):
        for t in range(3):
            for g, share_g in enumerate((0.2, 0.8)):
                expected = 0.0 if shares[t] == 0 else clips[g] / n * math.sqrt(2 / (rho * shares[t] * share_g))
                expected *= gradient_rounding(n, 4, 2, 1)  # the sums' rounding allowance (dpivreg.privacy.rounding)
                assert noise[t, g] == pytest.approx(expected, rel=1e-15)
    assert path.privacy.rho1 == pytest.approx(1.5, rel=1e-12) and path.privacy.rho2 == pytest.approx(0.7, rel=1e-12)
    # stage 1: 2 steps of different shares × 2 groups; stage 2: its 2 equal steps share one record per group
    assert len(path.privacy.releases) == 6
    assert [r.steps for r in path.privacy.releases if r.stage == "rho2"] == [2, 2]
    assert {r.stage for r in path.privacy.releases} == {"rho1", "rho2"}


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(clip1=(1.0, 2.0), clip2=3.0), TypeError, "both"),
    (dict(clip1=(1.0, 2.0, 3.0), clip2=(1.0, 2.0, 3.0)), ValueError, "pair"),
    (dict(clip1=(1.0, -2.0), clip2=(1.0, 2.0)), ValueError, "clip1"),
    (dict(schedule=[[1.0, 0.0], [0.5, 0.5]]), ValueError, "shape"),
    (dict(schedule=[[0.5, 0.5, 0.5], [0.5, 0.5, 0.0]]), ValueError, "sum to 1"),
    (dict(schedule=[[1.5, -0.5, 0.0], [0.5, 0.5, 0.0]]), ValueError, "non-negative"),
    (dict(theta0=np.zeros((2, 2))), ValueError, "theta0"),
    (dict(theta0=np.zeros((4, 1)), beta0=np.zeros(3)), ValueError, "beta0"),
    (dict(clip1=(1.0, 2.0), clip2=(1.0, 2.0), group_share=1.0), ValueError, "group_share"),
])
def test_new_engine_options_reject_bad_values(kwargs, exc, match):
    Z, X, Y = _data(200, 4, 2, 1, seed=1)
    args = dict(T=3, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.5, clip1=1.0, clip2=1.0, n_exog=1, seed=0)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        dp_2s_gd(Z, X, Y, **args)


def test_group_clipping_needs_exogenous_columns():
    Z, X, Y = _data(200, 3, 2, 0, seed=1)
    with pytest.raises(ValueError, match="n_exog > 0"):
        dp_2s_gd(Z, X, Y, T=2, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.5, clip1=(1.0, 2.0), clip2=(1.0, 2.0))


@pytest.mark.skipif(not numba_available(), reason="numba not installed")
@pytest.mark.parametrize("q, p_endog, n_exog, grouped", [(3, 1, 2, True), (3, 1, 2, False), (6, 2, 1, True),
                                                         (4, 2, 0, False), (1, 1, 0, False)])
def test_gradient_norm_histograms_numba_equals_numpy(q, p_endog, n_exog, grouped):
    """The clipping release's counts (adaptive clip) are the same with the compiled loop as with numpy, row for
    row: on random rows, a zero row (norm 0: first bin), rows beyond the grid (last bin) and an overflowing one."""
    from dpivreg.compute.kernels import pass_matrix
    from dpivreg.estimation.clipping import _group_dimensions, _group_edges, gradient_norm_counts

    p = n_exog + p_endog
    Z, X, Y = _data(5000, q, p, n_exog, seed=q + p_endog)
    Z[0], X[0, n_exog:], Y[0] = 0.0, 0.0, 0.0
    Y[1:4] = [1e3, -1e6, 1e300]
    rng = np.random.default_rng(1)
    M = pass_matrix(rng.standard_normal((q, p_endog)), rng.standard_normal(p), None, n_exog)[0]
    edges = _group_edges(_group_dimensions(q, p, n_exog, p_endog, grouped))
    args = (Z, X[:, n_exog:], Y, M, n_exog, grouped, edges)
    (numpy_counts,), (numba_counts,) = gradient_norm_counts(*args), gradient_norm_counts(*args, kernel="numba")
    np.testing.assert_array_equal(numba_counts, numpy_counts)
    second_stage = numpy_counts[len(edges) // 2:]
    assert numpy_counts.sum() == len(edges) * Z.shape[0] and second_stage[:, -1].min() >= 2  # e = 1e6, 1e300


@pytest.mark.skipif(not numba_available(), reason="numba not installed")
def test_gradient_norm_histograms_on_the_edges():
    """Norms exactly on every bin edge and one ulp either side are binned as numpy's searchsorted bins them (a
    norm equal to the second edge was once counted in the first bin): with M = 0 and z = 1 the first-stage norm
    of a row is exactly abs(x)."""
    from dpivreg.estimation.clipping import _group_edges, gradient_norm_counts

    edges = _group_edges([1, 1])
    values = np.concatenate([edges[0], np.nextafter(edges[0], 0.0), np.nextafter(edges[0], np.inf),
                             [0.0, 5e-324, np.inf]])
    for value in values:
        Z, X, Y = np.ones((1, 1)), np.array([[-value]]), np.zeros(1)
        args = (Z, X, Y, np.zeros((1, 3)), 0, False, edges)
        (numpy_counts,), (numba_counts,) = gradient_norm_counts(*args), gradient_norm_counts(*args, kernel="numba")
        np.testing.assert_array_equal(numba_counts, numpy_counts, err_msg=f"norm {value!r}")


@pytest.mark.skipif(not numba_available(), reason="numba not installed")
def test_gradient_norm_histograms_on_irregular_edges():
    """The compiled loop's bin guess assumes a geometric grid, but the bin is then made exact against the edges:
    increasing edges of any spacing give numpy's searchsorted bins, over several tiles of rows."""
    from dpivreg.compute.kernels import fused_norm_counts
    from dpivreg.privacy.mechanisms import histogram_counts

    rng = np.random.default_rng(4)
    edges = np.sort(np.concatenate([[0.0], rng.lognormal(0.0, 3.0, 40)]))
    values = np.concatenate([rng.lognormal(0.0, 3.0, 3000), edges, np.nextafter(edges, np.inf)])
    Z, X, Y = np.ones((len(values), 1)), -values[:, None], np.zeros(len(values))  # M = 0: first-stage norm abs(x)
    counts = fused_norm_counts(Z, X, Y, np.zeros((1, 3)), -1, np.array([edges, edges]))
    np.testing.assert_array_equal(counts[0], histogram_counts(values, edges))


# ---------------------------------------------------------------------------------------------------------------
# The generated kernels (dpivreg.compute.codegen.unrolled_source): every row's work written out for one shape
# ---------------------------------------------------------------------------------------------------------------
needs_numba = pytest.mark.skipif(not numba_available(), reason="numba not installed")
# (q, p_endog, n_exog, grouped): one instrument; the workflow's y ~ 1 + w + [x ~ z] with and without groups;
# p = q = 5 (issue 15's cell); groups with more exogenous than endogenous columns.
GENERATED_SHAPES = [(1, 1, 0, False), (3, 1, 2, False), (3, 1, 2, True), (5, 5, 0, False), (6, 2, 3, True)]
CLIPS = {"finite": ((1.0, 2.0), (0.7, 3.0)), "infinite": ((math.inf,) * 2, (math.inf,) * 2),
         "mixed": ((math.inf, 2.0), (0.5, math.inf))}


@pytest.fixture
def generated_everywhere(monkeypatch):
    """Blocks of any size take the generated kernels (they are used from 2^15 rows on)."""
    monkeypatch.setattr(kernels, "_UNROLLED_MIN_ROWS", 1)


def _block(q: int, p_endog: int, n_exog: int, grouped: bool, clips: str, *, n: int = 3_000, seed: int = 0,
           order: str = "C"):
    """A block of rows whose gradients clip often, M from a random Θ, β and a preconditioner root, and the
    block_sums arguments for ``clips`` (group pairs when ``grouped``)."""
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((n, q)) * rng.exponential(1.0, (n, 1))
    X = Z[:, :p_endog] * 0.5 + rng.standard_normal((n, p_endog))
    Y = rng.standard_normal(n) * (1 + np.abs(Z[:, -1]))
    p = n_exog + p_endog
    root = np.linalg.cholesky(np.eye(p) + 0.1 * np.ones((p, p)))
    M, _ = kernels.pass_matrix(rng.standard_normal((q, p_endog)), rng.standard_normal(p), root, n_exog)
    clip1, clip2 = CLIPS[clips]
    if not grouped:
        clip1, clip2 = clip1[0], clip2[0]
    return (*_laid_out(Z, X, order), Y, M, clip1, clip2, (n_exog if grouped else None))


def _laid_out(Z: np.ndarray, X: np.ndarray, order: str) -> tuple[np.ndarray, np.ndarray]:
    """Z and X in a memory layout: "C" or "F"; "rows": row-major column slices of wider arrays (each row contiguous,
    rows further apart, as X[:, n_exog:] of a row-major X); "strided": every other column of a wider array (the tiled
    loop takes it)."""
    if order in ("C", "F"):
        return np.asarray(Z, order=order), np.asarray(X, order=order)
    if order == "rows":
        pad = np.zeros((Z.shape[0], 2))
        return np.column_stack([Z, pad[:, :1]])[:, :-1], np.column_stack([pad, X])[:, 2:]
    wide_z, wide_x = np.zeros((Z.shape[0], 2 * Z.shape[1])), np.zeros((X.shape[0], 2 * X.shape[1]))
    wide_z[:, ::2], wide_x[:, ::2] = Z, X
    return wide_z[:, ::2], wide_x[:, ::2]


def _tiled_sums(Z, X, Y, M, clip1, clip2, split):
    """The tiled loop (dpivreg.compute.kernels._fused_rows), called directly."""
    clips, k = kernels.group_clips(clip1, clip2, split)
    out = (np.zeros((Z.shape[1], X.shape[1])), np.zeros(M.shape[1] - X.shape[1] - 1), np.zeros(3, dtype=np.int64))
    kernels._numba_kernel()(Z, X, Y, M, clips, k, *out)
    return out


@needs_numba
@pytest.mark.parametrize("clips", sorted(CLIPS))
@pytest.mark.parametrize("order", ["C", "F", "rows", "strided"])
@pytest.mark.parametrize("q, p_endog, n_exog, grouped", GENERATED_SHAPES)
def test_generated_kernel_equals_the_tiled_loop_and_numpy(q, p_endog, n_exog, grouped, order, clips,
                                                          generated_everywhere):
    """The generated kernels (``columns`` for column-major blocks, ``rows`` for blocks with contiguous rows, also
    further apart than their width) give the tiled loop's and numpy's sums to 1e-12 relative and the same counts,
    for every grouping and finite, infinite and mixed thresholds; other layouts go to the tiled loop."""
    Z, X, Y, M, clip1, clip2, split = _block(q, p_endog, n_exog, grouped, clips, order=order)
    S1, s2, counts = kernels.block_sums(Z, X, Y, M, clip1, clip2, "numba", split)
    for want in (_tiled_sums(Z, X, Y, M, clip1, clip2, split), kernels.block_sums(Z, X, Y, M, clip1, clip2, "numpy",
                                                                                  split)):
        np.testing.assert_array_equal(counts, want[2])
        np.testing.assert_allclose(S1, want[0], rtol=1e-12, atol=1e-12 * np.abs(want[0]).max())
        np.testing.assert_allclose(s2, want[1], rtol=1e-12, atol=1e-12 * np.abs(want[1]).max())
    assert counts[2] == 0 and (clips == "infinite") == (counts[:2].sum() == 0)


@needs_numba
@pytest.mark.parametrize("order", ["C", "F", "rows"])
@pytest.mark.parametrize("q, p_endog, n_exog, grouped", GENERATED_SHAPES)
def test_generated_kernel_flags_overflowing_and_nan_rows(q, p_endog, n_exog, grouped, order, generated_everywhere):
    """Rows whose gradient norm overflows or is NaN are counted (the caller then takes the safe pass), as by the tiled
    loop, in every layout; with infinite thresholds nothing is counted. Rows of zeros and rows with a zero residual
    (norm 0, γ/0 = inf) add nothing and are not clipped."""
    for clips in ("finite", "infinite"):
        Z, X, Y, M, clip1, clip2, split = _block(q, p_endog, n_exog, grouped, clips, n=500, seed=1)
        Z[3] = 0.0
        Y[4] = Z[4] @ M[:, -1]  # e = 0
        Z[7] = 1e200
        Y[11] = 1e300
        Y[13] = np.nan
        Z, X = _laid_out(Z, X, order)
        got = kernels.block_sums(Z, X, Y, M, clip1, clip2, "numba", split)
        np.testing.assert_array_equal(got[2], _tiled_sums(Z, X, Y, M, clip1, clip2, split)[2])
        assert (got[2][2] > 0) == (clips == "finite")
        clean = np.setdiff1d(np.arange(500), [7, 11, 13])
        S1, s2, counts = kernels.block_sums(Z[clean], X[clean], Y[clean], M, clip1, clip2, "numba", split)
        want = kernels.block_sums(Z[clean], X[clean], Y[clean], M, clip1, clip2, "numpy", split)
        np.testing.assert_array_equal(counts, want[2])
        np.testing.assert_allclose(S1, want[0], rtol=1e-12, atol=1e-12 * np.abs(want[0]).max())
        np.testing.assert_allclose(s2, want[1], rtol=1e-12, atol=1e-12 * np.abs(want[1]).max())


@needs_numba
def test_block_sums_refuses_rows_of_different_lengths(generated_everywhere):
    """The compiled loops run over Y's rows: a shorter or longer Y (or X_endog) is an error, not a read past the end
    (found by review)."""
    Z, X, Y, M, clip1, clip2, split = _block(3, 1, 0, False, "finite", n=50)
    for kernel in ("numba", "numpy"):
        with pytest.raises(ValueError, match="same rows"):
            kernels.block_sums(Z, X, Y[:40], M, clip1, clip2, kernel, split)
        with pytest.raises(ValueError, match="same rows"):
            kernels.block_sums(Z, X[:40], Y, M, clip1, clip2, kernel, split)


@needs_numba
@pytest.mark.parametrize("order", ["C", "F", "rows"])
@pytest.mark.parametrize("q, p_endog, n_exog, grouped", GENERATED_SHAPES)
def test_generated_kernel_clips_every_row_to_its_threshold(q, p_endog, n_exog, grouped, order, generated_everywhere):
    """The release's sensitivity, exactly: one row's clipped gradient has norm at most γ in each group (so replacing
    a row moves each sum by at most 2γ), and a row far outside is clipped to exactly γ (1e-12)."""
    Z, X, Y, M, clip1, clip2, split = _block(q, p_endog, n_exog, grouped, "finite", n=60, seed=2, order=order)
    Z[0] *= 1e6
    Y[0] = 1e8
    lead = n_exog if grouped else 0
    gammas1, gammas2 = (clip1, clip2) if grouped else ((0.0, clip1), (0.0, clip2))
    for i in range(Z.shape[0]):
        S1, s2, _ = kernels.block_sums(Z[i:i + 1], X[i:i + 1], Y[i:i + 1], M, clip1, clip2, "numba", split)
        norms = [np.linalg.norm(S1[:lead]), np.linalg.norm(S1[lead:]), np.linalg.norm(s2[:lead]),
                 np.linalg.norm(s2[lead:])]
        bounds = [gammas1[0], gammas1[1], gammas2[0], gammas2[1]]
        assert all(norm <= bound * (1 + 1e-12) for norm, bound in zip(norms, bounds)), (i, norms, bounds)
        if i == 0:  # the far row: every non-empty group is clipped to its threshold
            for norm, bound, size in zip(norms, bounds, (lead, q - lead, lead, len(s2) - lead)):
                if size:
                    assert norm == pytest.approx(bound, rel=1e-12)


@needs_numba
def test_large_blocks_of_small_shapes_take_the_generated_kernel(monkeypatch):
    """From 2^15 rows and up to 136 multiply-adds a row (q·width), the generated kernel for the block's layout (its
    row strides written into the row-major kernel); not below, nor for larger shapes, nor for other layouts."""
    shapes = []
    real = codegen.unrolled_kernel

    def spy(*shape):
        shapes.append(shape)
        return real(*shape)

    monkeypatch.setattr(codegen, "unrolled_kernel", spy)
    for n, q, p_endog, n_exog, order in [(1 << 15, 3, 1, 0, "F"), (1 << 15, 3, 1, 0, "C"), (1 << 15, 3, 1, 0, "rows"),
                                         (1 << 15, 3, 1, 2, "F"), (1 << 15, 3, 1, 0, "strided"),
                                         ((1 << 15) - 1, 3, 1, 0, "F"), (1 << 15, 10, 10, 0, "F")]:
        Z, X, Y, M, clip1, clip2, split = _block(q, p_endog, n_exog, n_exog > 0, "finite", n=n, order=order)
        kernels.block_sums(Z, X, Y, M, clip1, clip2, "numba", split)
    assert shapes == [(3, 1, 3, 0, False), (3, 1, 3, 0, False, 3, 1), (3, 1, 3, 0, False, 4, 3), (3, 1, 5, 2, True)]


@needs_numba
def test_generated_kernels_are_written_once_and_cached(tmp_path, monkeypatch):
    """The source goes to $DPIVREG_CACHE_DIR/kernels under a name with its hash, numba caches the compiled code
    beside it; a file that was changed is written again; an undecodable file or a directory in its place, or an
    unusable cache directory, falls back to the process's temporary directory (review: they crashed the fit)."""
    monkeypatch.setenv("DPIVREG_CACHE_DIR", str(tmp_path))
    codegen.unrolled_kernel.cache_clear()
    try:
        Z, X, Y, M, clip1, clip2, split = _block(2, 1, 1, True, "finite", n=300, order="F")
        shape = (2, 1, M.shape[1], 1, True)
        want = kernels.block_sums(Z, X, Y, M, clip1, clip2, "numpy", split)
        clips, _ = kernels.group_clips(clip1, clip2, split)

        def run():
            out = (np.zeros((2, 1)), np.zeros(2), np.zeros(3, dtype=np.int64))
            codegen.unrolled_kernel(*shape)[0](tuple(Z.T), tuple(X.T), Y, M, clips, *out)
            np.testing.assert_allclose(out[0], want[0], rtol=1e-12)
            np.testing.assert_array_equal(out[2], want[2])

        run()
        (source,) = (tmp_path / "kernels").glob("fused_q2_p1_w4_k1g_*.py")
        assert source.read_text() == codegen.unrolled_source(*shape)
        assert list((tmp_path / "kernels" / "__pycache__").glob(f"{source.stem}.columns-*.nbi"))
        source.write_text("def columns(*args):\n    raise RuntimeError('tampered')\n")
        codegen.unrolled_kernel.cache_clear()
        run()
        assert source.read_text() == codegen.unrolled_source(*shape)
        source.write_bytes(b"\xff\xfe not UTF-8")  # an undecodable file, then a directory in the source's place
        codegen.unrolled_kernel.cache_clear()
        run()
        source.unlink()
        source.mkdir()
        codegen.unrolled_kernel.cache_clear()
        run()
        assert not list((tmp_path / "kernels").glob("*.tmp"))
        monkeypatch.setenv("DPIVREG_CACHE_DIR", str(tmp_path / "kernels" / "__init__.txt"))
        (tmp_path / "kernels" / "__init__.txt").write_text("a file: no directory can be made there")
        assert codegen.kernel_cache_directory() is None
        codegen.unrolled_kernel.cache_clear()
        run()
    finally:
        codegen.unrolled_kernel.cache_clear()
