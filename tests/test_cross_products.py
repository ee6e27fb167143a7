"""The NON-PRIVATE column factor and the 2SLS benchmark from cross-products (dpivreg.data.cross_products).

Reference values: linearmodels' IV2SLS on the same frame (robust HC0 and unadjusted, debiased=False).
"""

import numpy as np
import pandas as pd
import pytest
from linearmodels.iv import IV2SLS

from dpivreg import DPIV2SLS
from dpivreg.compute.backends import DESIGN_BLOCK_ROWS, add_parts, map_row_blocks
from dpivreg.data.cross_products import (
    block_factor,
    check_factor_rank,
    combine_factors,
    factor_rank,
    iv2sls_benchmark,
    r_factor,
)
from dpivreg.data.design import design_from_formula


@pytest.fixture(scope="module")
def frame():
    """More rows than one block of a pass (so the TSQR combines several), covariates of different scales."""
    rng = np.random.default_rng(5)
    n = DESIGN_BLOCK_ROWS * 2 + 1234
    z1, z2, z3, u = rng.standard_normal((4, n))
    w = rng.uniform(0, 1e4, n)
    x1 = 1.0 + z1 + 0.5 * z2 + u + rng.standard_normal(n)
    x2 = -2.0 + 0.7 * z3 - 0.4 * z1 + 0.5 * u + rng.standard_normal(n)
    y = 3.0 + 1.5 * x1 - 0.8 * x2 + 2e-4 * w + (1 + np.abs(z1)) * u
    return pd.DataFrame({"y": y, "x1": x1, "x2": x2, "z1": z1, "z2": z2, "z3": z3, "w": w})


FORMULAS = [
    "y ~ [x1 ~ z1 + z2]",
    "y ~ 1 + [x1 ~ z1]",
    "y ~ 1 + w + [x1 ~ z1 + z2]",
    "y ~ 1 + [x1 + x2 ~ z1 + z2 + z3] + w",
]


@pytest.mark.parametrize("formula", FORMULAS)
def test_benchmark_equals_linearmodels(frame, formula):
    """params, robust and unadjusted covariances equal linearmodels' to 1e-10 (relative)."""
    bench = iv2sls_benchmark(design_from_formula(formula, frame))
    robust = IV2SLS.from_formula(formula, frame).fit()
    unadjusted = IV2SLS.from_formula(formula, frame).fit(cov_type="unadjusted")
    pd.testing.assert_index_equal(bench.params.index, robust.params.index)
    np.testing.assert_allclose(bench.params, robust.params, rtol=1e-10)
    np.testing.assert_allclose(bench.cov, robust.cov, rtol=1e-10, atol=1e-10 * np.abs(robust.cov.to_numpy()).max())
    np.testing.assert_allclose(bench.std_errors, robust.std_errors, rtol=1e-10)
    np.testing.assert_allclose(bench.unadjusted_std_errors, unadjusted.std_errors, rtol=1e-10)
    np.testing.assert_allclose(bench.tstats, robust.tstats, rtol=1e-9)
    np.testing.assert_allclose(bench.conf_int(), robust.conf_int(), rtol=1e-9)
    assert bench.nobs == robust.nobs
    assert bench.resid_ss == pytest.approx(robust.resid_ss, rel=1e-10)


def test_results_benchmark_and_linearmodels_object(frame):
    """res.benchmark is the cross-product benchmark; res.benchmark_linearmodels linearmodels' own object."""
    formula = "y ~ 1 + [x1 ~ z1 + z2]"
    res = DPIV2SLS.from_formula(formula, frame).fit(rho=1, seed=0, bounds={
        "y": (-20, 20), "x1": (-8, 8), "z1": (-4, 4), "z2": (-4, 4)})
    lm = res.benchmark_linearmodels
    assert lm.first_stage is not None  # linearmodels' methods are there
    np.testing.assert_allclose(res.benchmark.params, lm.params, rtol=1e-10)
    np.testing.assert_allclose(res.benchmark.std_errors, lm.std_errors, rtol=1e-10)


def test_factor_does_not_depend_on_threads(frame):
    """The blocks are fixed, so the factor and the sums are bitwise the same on one thread or two."""
    design = design_from_formula("y ~ 1 + w + [x1 ~ z1 + z2]", frame)

    def factor(threads):
        return combine_factors(map_row_blocks(lambda rows: block_factor(design.row_block(rows)), design.nobs,
                                              n_threads=threads))

    (u1, r1), (u2, r2) = factor(1), factor(2)
    np.testing.assert_array_equal(r1, r2)
    np.testing.assert_array_equal(u1, u2)
    sums = [add_parts(map_row_blocks(lambda rows: design.row_block(rows).sum(axis=0), design.nobs, n_threads=t))
            for t in (1, 2)]
    np.testing.assert_array_equal(sums[0], sums[1])
    np.testing.assert_allclose(sums[0], frame[["y"]].assign(c=1.0, w=frame.w, x1=frame.x1, z1=frame.z1,
                                                            z2=frame.z2).sum().to_numpy(), rtol=1e-12)


def test_factor_has_the_columns_singular_values(frame):
    """R of the scaled columns has their singular values (so the rank checks can read it)."""
    values = frame.to_numpy()
    unit, r = combine_factors([block_factor(values[:1000]), block_factor(values[1000:])])
    scaled = values / np.abs(values).max(axis=0)
    np.testing.assert_allclose(unit, np.abs(values).max(axis=0))
    np.testing.assert_allclose(np.linalg.svd(r, compute_uv=False), np.linalg.svd(scaled, compute_uv=False),
                               rtol=1e-10)
    assert r_factor(values[:2]).shape == (values.shape[1], values.shape[1])  # fewer rows than columns


def test_rank_verdict_matches_matrix_rank():
    """Collinear columns: the same rank as numpy.linalg.matrix_rank on the columns, the first culprit named."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 500))
    values = np.column_stack([a, b, 2 * a - 3 * b, rng.standard_normal(500)])
    unit, r = combine_factors([block_factor(values)])
    assert factor_rank(r, 500) == np.linalg.matrix_rank(values / unit) == 3
    with pytest.raises(ValueError, match=r"column 'c' is a linear combination .* not a private release"):
        check_factor_rank(r, 500, ["a", "b", "c", "d"], "regressors")
    check_factor_rank(r[:, [0, 1, 3]], 500, ["a", "b", "d"], "regressors")


def test_design_pickles_without_its_cached_views(frame):
    """The cached array views of the blocks are not pickled (they would store the data twice); the factor is."""
    import pickle

    design = design_from_formula("y ~ 1 + w + [x1 ~ z1 + z2]", frame)
    design.factor  # noqa: B018 - cache the pass
    restored = pickle.loads(pickle.dumps(design))
    assert "_columns" not in restored.__dict__ and "_pass_statistics" in restored.__dict__
    np.testing.assert_array_equal(restored.row_block(slice(0, 5)), design.row_block(slice(0, 5)))


def test_working_scale_rejects_an_empty_hand_built_design():
    from dpivreg.data.design import IVDesign
    from dpivreg.estimation.working_scale import working_scale

    empty = pd.DataFrame({"y": []}, dtype=float)
    design = IVDesign(dependent=empty, exog=pd.DataFrame(index=empty.index), endog=empty.rename(columns={"y": "x"}),
                      instruments=empty.rename(columns={"y": "z"}))
    with pytest.raises(ValueError, match="no rows"):
        working_scale(design, {"y": (-1, 1), "x": (-1, 1), "z": (-1, 1)}, route="bounds")
