"""``wald_test`` and ``t_test`` on the private estimate (post-processing of params and the private covariance).

Reference values: linearmodels' ``IV2SLS(...).fit(cov_type=...).wald_test`` on the same design with every
budget infinite (where the private fit is 2SLS), and the private fit's own ``tvalues``/``pvalues``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats
from test_covariance import BOUNDS, _heteroskedastic_frame

from dpivreg import DPIV2SLS, PrivacyLeakWarning

FORMULA = "y ~ 1 + w + [x ~ z1 + z2]"


@pytest.fixture(scope="module")
def frame():
    return _heteroskedastic_frame()


@pytest.fixture(scope="module")
def exact(frame):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        return DPIV2SLS.from_formula(FORMULA, frame).fit(rho=math.inf, seed=0, cov_type="robust")


@pytest.fixture(scope="module")
def private(frame):
    return DPIV2SLS.from_formula(FORMULA, frame).fit(rho=2.0, seed=5, bounds=BOUNDS, cov_type="robust")


@pytest.mark.parametrize("spec", ["x = 2", "x = 2, w = 0.5", ["x = 2", "w + x = 2.5"], {"x": 2, "w": 0.5}])
def test_wald_test_equals_linearmodels_at_infinite_budget(exact, frame, spec):
    from linearmodels import IV2SLS

    ours = exact.wald_test(formula=spec)
    theirs = IV2SLS.from_formula(FORMULA, frame).fit(cov_type="robust").wald_test(formula=spec)
    assert ours.stat == pytest.approx(theirs.stat, rel=1e-9)
    assert ours.pval == pytest.approx(theirs.pval, rel=1e-9, abs=1e-300)
    assert ours.df == theirs.df


def test_wald_test_by_hand_on_the_private_fit(private):
    """(Cβ − v)ᵀ(CVCᵀ)⁻¹(Cβ − v), χ²(2), from the private params and covariance; the array and formula forms agree."""
    C = np.array([[0.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    v = np.array([2.0, 2.5])
    d = C @ private.params.to_numpy() - v
    stat = float(d @ np.linalg.solve(C @ private.cov.to_numpy() @ C.T, d))
    test = private.wald_test(C, v)
    assert test.stat == pytest.approx(stat, rel=1e-12) and test.df == 2
    assert test.pval == pytest.approx(stats.chi2.sf(stat, 2), rel=1e-12)
    assert private.wald_test(formula="x = 2, w + x = 2.5").stat == pytest.approx(stat, rel=1e-12)
    # one restriction: the Wald statistic is the square of the z statistic
    z = (private.params["x"] - 2.0) / private.bse["x"]
    assert private.wald_test(formula="x = 2").stat == pytest.approx(z**2, rel=1e-12)


def test_t_test_matches_the_fits_own_z_statistics(private):
    t = private.t_test(formula="x = 0")
    assert float(t.tvalue[0]) == pytest.approx(private.tvalues["x"], rel=1e-12)
    assert float(t.pvalue) == pytest.approx(private.pvalues["x"], rel=1e-9, abs=1e-300)
    both = private.t_test(np.eye(3)[1:])
    np.testing.assert_allclose(both.effect, private.params.iloc[1:], rtol=1e-12)
    np.testing.assert_allclose(both.sd, private.bse.iloc[1:], rtol=1e-12)
    np.testing.assert_allclose(both.conf_int(0.05), private.conf_int(alpha=0.05).iloc[1:].to_numpy(), rtol=1e-12)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"formula": "q = 0"}, ValueError, "could not read the restrictions"),
    ({"restriction": [1.0, 0.0]}, ValueError, "one column per parameter"),
    ({"restriction": np.eye(3)[:2], "value": [0.0]}, ValueError, "one entry per restriction"),
    ({"restriction": [[0, 0, 1], [0, 0, 2]]}, ValueError, "linearly dependent"),
    ({"formula": "x = 2, 2*x = 4"}, ValueError, "linearly dependent"),
    ({"restriction": [[0, 0, np.nan]]}, ValueError, "finite"),
    ({}, TypeError, "need restriction"),
    ({"restriction": np.eye(3), "formula": "x = 0"}, ValueError, "not both"),
])
def test_bad_restrictions_are_clear_errors(private, kwargs, error, match):
    for method in (private.wald_test, private.t_test):
        with pytest.raises(error, match=match):
            method(**kwargs)
