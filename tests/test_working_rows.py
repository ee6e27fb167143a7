"""Working rows built a block at a time (dpivreg.estimation.working_scale.WorkingRows, dpivreg.compute.backends.BuiltRows): an in-memory
row-level fit holds no copy of the data, and gives the numbers of a fit on held working arrays."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from dpivreg import DPIV2SLS
from dpivreg.compute import kernels
from dpivreg.compute.backends import BuiltRows, InMemoryRows, count_passes
from dpivreg.compute.kernels import numba_available, pass_matrix, working_rows
from dpivreg.datasets import load_labsup
from dpivreg.estimation.working_scale import WorkingRows

# a little tighter than the data (weeks reach 52, kids 12, educ 0 and 20), so that the clipping is exercised
BOUNDS = {"weeks": (0, 50), "kids": (0, 4), "samesex": (0, 1), "educ": (2, 18)}
FORMULA = "weeks ~ 1 + educ + [kids ~ samesex]"


def _fit(**options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return DPIV2SLS.from_formula(FORMULA, load_labsup()).fit(rho1=1, rho2=1, bounds=BOUNDS, seed=3, **options)


@pytest.mark.skipif(not numba_available(), reason="numba not installed")
def test_compiled_map_equals_numpy(monkeypatch):
    """The compiled clip-and-map equals numpy's (clip, centre, matrix product) to rounding, on values inside and
    outside the bounds, for row- and column-major blocks."""
    rng = np.random.default_rng(5)
    raw = rng.standard_normal((3_000, 6)) * 3
    lo, hi = np.full(6, -2.0), np.full(6, 2.5)
    args = (lo, hi, np.array([1, 2, 5]), rng.standard_normal(3), rng.standard_normal((3, 3)), np.array([3, 4]),
            rng.standard_normal(2), rng.standard_normal((2, 2)), 0.4, 1.7)
    compiled = [working_rows(block, *args) for block in (raw, np.asfortranarray(raw))]
    monkeypatch.setattr(kernels, "numba_available", lambda: False)
    reference = working_rows(raw, *args)
    for built in compiled:
        for ours, theirs in zip(built, reference):
            np.testing.assert_allclose(ours, theirs, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("n_threads", [1, 2])
def test_built_rows_give_the_sums_of_held_arrays(n_threads):
    """BuiltRows over blocks of 700 rows: the iteration's clipped sums and a block function's sums equal those of
    the same rows held in arrays (to rounding; the clipped-row counts exactly), one pass each."""
    rng = np.random.default_rng(1)
    Z, X, Y = rng.standard_normal((5_000, 4)), rng.standard_normal((5_000, 2)), rng.standard_normal(5_000)
    built = BuiltRows(lambda rows: (Z[rows], X[rows], Y[rows]), 5_000, 4, n_threads=n_threads, block_rows=700)
    held = InMemoryRows(Z, X, Y, n_threads=n_threads)
    M, _ = pass_matrix(np.full((4, 2), 0.3), np.ones(2), None, 0)
    with count_passes() as passes:
        ours = built.clipped_sums(M, 1.0, 1.5)
    assert passes.count == 1
    theirs = held.clipped_sums(M, 1.0, 1.5)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-12)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-12)
    np.testing.assert_array_equal(ours[2], theirs[2])
    np.testing.assert_allclose(built.sums(lambda z, x, y: (z.T @ y,)), held.sums(lambda z, x, y: (z.T @ y,)),
                               rtol=1e-12)
    built.close()
    held.close()


def test_row_level_fit_holds_no_working_arrays_and_equals_a_held_fit(monkeypatch):
    """The default in-memory fit builds its working rows a block at a time (nothing n-long is kept), and its
    estimates, private standard errors and released path equal those of a fit on held working arrays (1e-10)."""
    streamed = _fit()
    if numba_available():
        assert streamed.scale.held is None and streamed.scale.streamed is not None
    monkeypatch.setattr(WorkingRows, "of", classmethod(lambda cls, *args: None))
    held = _fit()
    assert held.scale.held is not None and held.scale.streamed is None
    for ours, theirs in zip(streamed.scale.arrays(), held.scale.arrays()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(streamed.params, held.params, rtol=1e-10)
    np.testing.assert_allclose(streamed.std_errors, held.std_errors, rtol=1e-10)
    np.testing.assert_allclose(streamed.path.to_numpy(), held.path.to_numpy(), rtol=1e-10, atol=1e-12)


def test_fits_with_privacy_units_hold_their_working_arrays():
    """Rows grouped into privacy units are reordered by unit and held (BuiltRows builds ungrouped rows only)."""
    frame = load_labsup().assign(household=lambda d: np.arange(len(d)) // 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = DPIV2SLS.from_formula(FORMULA, frame).fit(rho1=1, rho2=1, bounds=BOUNDS, seed=3, T=3,
                                                         privacy_unit="household")
    assert res.scale.streamed is None and res.scale.held is not None


class _Design:
    """The two things WorkingRows.bounded reads of a design."""

    def __init__(self, low, high):
        self.column_range = (np.asarray(low, dtype=float), np.asarray(high, dtype=float))
        self.positions = {"z": [1, 2], "endog": [3]}
        self.exog_names = ["Intercept"]


@pytest.mark.parametrize(("high", "A", "streams"), [
    (1e3, 2.0, True),
    (1e300, 2.0, True),  # large but representable: |2·1e300| is finite
    (1e308, 10.0, False),  # 10·1e308 overflows: the arrays are built whole and checked instead
])
def test_streaming_only_when_the_map_cannot_overflow(high, A, streams):
    """WorkingRows.of streams only if the map's bound on every working value (from the clipped column ranges) is
    finite; otherwise the held arrays are built and checked value by value, as before."""
    inf = np.full(4, np.inf)
    maps = {"z_center": np.zeros(2), "A_z": np.diag([1.0, A]), "x_center": np.zeros(2), "A_x": np.eye(2),
            "y_center": 0.0, "y_scale": 1.0}
    rows = WorkingRows.of(_Design([0, 1, 0, 0], [1, 1, high, 1]), -inf, inf, maps)
    if not numba_available():
        assert rows is None
        return
    assert (rows is not None) == streams


@pytest.mark.parametrize("value", [np.nan, np.inf, 4.0])
def test_data_changed_behind_pandas_after_the_model_is_a_clear_error(value):
    """A frame made with DataFrame(array, copy=False) shares array's memory, which the design then shares too
    (copy-on-write protects writes through pandas, not writes into array). A value written there after the model
    was built is refused wherever it is met, never summed: by a new fit, whose first pass compares the rows with
    the design's checksum (any change: NaN, an infinity that clipping would turn into a bound, a finite value),
    and, for non-finite values, by the streamed working rows of a fit already made (``res.scale``)."""
    import pandas as pd

    rng = np.random.default_rng(2)
    values = rng.standard_normal((2_000, 3))
    values[:, 0] += values[:, 1] + values[:, 2]
    frame = pd.DataFrame(values, columns=["y", "x", "z"], copy=False)
    bounds = {"y": (-10, 10), "x": (-5, 5), "z": (-5, 5)}
    model = DPIV2SLS.from_formula("y ~ 1 + [x ~ z]", frame)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = model.fit(rho1=1, rho2=1, bounds=bounds, seed=0, T=3)
        values[7, 1] = value
        with pytest.raises(ValueError, match=r"column\(s\) \['x'\] changed after the model was built"):
            model.fit(rho1=1, rho2=1, bounds=bounds, seed=0, T=3)
        with pytest.raises(ValueError, match=r"column\(s\) \['x'\] changed after the model was built"):
            model.fit(rho1=1, rho2=1, bounds=bounds, seed=0, T=3, privacy_unit=np.arange(2_000) // 2,
                      max_rows_per_unit=1)  # reads one row of two: the check covers every row
        if numba_available() and not np.isfinite(value):
            with pytest.raises(ValueError, match="no longer finite"):
                res.scale.arrays()


def test_column_checksum_is_the_same_for_any_split_and_sees_a_one_ulp_change():
    """The wrapping sum of bit patterns: blocks' checksums add (modulo 2⁶⁴) to the whole's, whatever the split,
    order or memory layout; moving one value by one ulp changes its column's checksum and no other."""
    from dpivreg.data.columns import column_checksum

    values = np.random.default_rng(4).standard_normal((1_000, 3)) * 1e3
    whole = column_checksum(values)
    assert whole.dtype == np.uint64
    np.testing.assert_array_equal(column_checksum(values[700:]) + column_checksum(values[:300])
                                  + column_checksum(values[300:700]), whole)
    np.testing.assert_array_equal(column_checksum(np.asfortranarray(values)), whole)
    changed = values.copy()
    changed[5, 1] = np.nextafter(changed[5, 1], np.inf)
    assert (column_checksum(changed) != whole).tolist() == [False, True, False]
