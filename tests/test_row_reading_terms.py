"""Formula terms whose value in a row depends on other rows (issue 40, item 2): announced on pandas with either
formula engine (a PrivacyLeakWarning naming the term, recorded in ``res.leaks``), refused on Dask.

The row-level guarantee assumes that each row's design values are a function of that row alone: a term such as
``I(w - w.mean())`` makes every row's value depend on all the others, so a neighbour changes every row, not one.
The terms below are those an independent audit found reported as private before.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from dpivreg import DPIV2SLS, PrivacyLeakWarning
from dpivreg.data.formula_replay import _depends_on_other_rows, row_reading_terms

ROW_READING = ["I(w - w.mean())", "I(w / w.std())", "I(w > w.median())", "I(w.rank())", "I(w.cumsum())",
               "I(w.shift(1).fillna(0))", "I(w.clip(w.quantile(0.05), w.quantile(0.95)))",
               "np.where(w > np.median(w), 1., 0.)", "I(w.fillna(w.mean()))", "I(w.ffill())"]
ROW_WISE = ["w", "np.log1p(w)", "I(w ** 2)", "np.where(w > 5, 1., 0.)", "I(np.clip(w, 1, 9))", "rowwise(w)",
            # methods of a column that act row by row (review: these were announced as leaks at first)
            "I(w.clip(1, 9))", "I(w.abs())", "I(w.fillna(0))", "I(w.round(1))", "I(w.astype(float))",
            "I(w.between(2, 8) * 1.0)", "I(w.pow(2))", "I(w.fillna(0).round(1))", "np.nan_to_num(w)",
            "pd.to_numeric(w)"]
BOUNDS = {"y": (-30.0, 30.0), "x": (-9.0, 9.0), "z": (-9.0, 9.0), "w": (0.0, 10.0)}


def demean(v):  # reads every row
    return v - v.mean()


def rowwise(v):  # a function of each row alone
    return np.log1p(v) * 2.0


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    rng = np.random.default_rng(7)
    n = 1500
    w, z = rng.uniform(0, 10, n), rng.normal(size=n)
    x = z + rng.normal(size=n)
    return pd.DataFrame({"y": x + 0.1 * w + rng.normal(size=n), "x": x, "z": z, "w": w})


def _fit(formula: str, data: pd.DataFrame, engine: str):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = DPIV2SLS.from_formula(formula, data, formula_engine=engine).fit(
            rho=2.0, bounds=BOUNDS, seed=1, inference=False)
    leaks = [str(w.message) for w in caught if issubclass(w.category, PrivacyLeakWarning)]
    return res, leaks


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
@pytest.mark.parametrize("term", ROW_READING + ["demean(w)"])
def test_a_term_that_reads_other_rows_is_a_leak_named_in_the_warning_and_the_results(frame, term, engine):
    res, leaks = _fit(f"y ~ 1 + {term} + [x ~ z]", frame, engine)
    assert any("depends on the other rows" in leak for leak in leaks), leaks
    assert any("depends on the other rows" in leak for leak in res.leaks)
    assert not res.is_private
    assert "No privacy leak" not in res.summary().as_text()


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
@pytest.mark.parametrize("term", ROW_WISE)
def test_row_wise_terms_are_not_announced(frame, term, engine):
    res, leaks = _fit(f"y ~ 1 + {term} + [x ~ z]", frame, engine)
    assert not any("depends on the other rows" in leak for leak in leaks), leaks
    assert not any("depends on the other rows" in leak for leak in res.leaks)  # (unbounded new columns leak apart)


def test_a_row_reading_instrument_or_outcome_is_announced_too(frame):
    for formula in ["y ~ 1 + [x ~ I(z - z.mean())]", "I(y - y.mean()) ~ 1 + [x ~ z]", "y ~ 1 + [I(x.rank()) ~ z]"]:
        _, leaks = _fit(formula, frame, "formulaic")
        assert any("depends on the other rows" in leak for leak in leaks), formula


@pytest.mark.parametrize("engine", ["formulaic", "patsy"])
@pytest.mark.parametrize("term", ROW_READING)
def test_dask_refuses_a_term_that_reads_other_rows(frame, term, engine):
    dd = pytest.importorskip("dask.dataframe")
    with pytest.raises(ValueError, match="cannot be computed partition by partition|as a category"):
        DPIV2SLS.from_formula(f"y ~ 1 + {term} + [x ~ z]", dd.from_pandas(frame, npartitions=3),
                              formula_engine=engine)


def test_the_behavioural_check_of_a_callers_function(frame):
    """Cut in half or reversed, a row-wise function gives every row the same value; a function of other rows does
    not; one that fails on part of the rows (an array of the data's length) reads them; too few rows to cut: no
    verdict against it."""
    sample = frame.head(64)
    weights = np.ones(64)
    context = {"demean": demean, "rowwise": rowwise, "weighted": lambda v: v * weights, "np": np}
    assert _depends_on_other_rows("demean(w)", sample, context)
    assert not _depends_on_other_rows("rowwise(w)", sample, context)
    assert _depends_on_other_rows("weighted(w)", sample, context)
    assert not _depends_on_other_rows("demean(w)", sample.head(3), context)
    texts = ["0 + demean(w) + rowwise(w) + center(w)"]
    found = row_reading_terms(texts, frame, context, sample=sample, known=("center(w)",))
    assert [entry.split(":")[0] for entry in found] == ["demean(w)"]


def test_dask_builds_row_wise_methods_partition_by_partition(frame):
    """A row-wise method of a column is computed per partition on Dask, equal to pandas."""
    dd = pytest.importorskip("dask.dataframe")
    formula = "y ~ 1 + I(w.clip(1, 9)) + I(w.fillna(0).round(1)) + [x ~ z]"
    lazy = DPIV2SLS.from_formula(formula, dd.from_pandas(frame, npartitions=3)).design
    eager = DPIV2SLS.from_formula(formula, frame).design
    np.testing.assert_allclose(np.asarray(lazy.values.compute()), np.column_stack(
        [eager.dependent, eager.exog, eager.endog, eager.instruments]), rtol=1e-12)


def test_dask_tries_the_callers_own_functions_on_its_first_rows(frame):
    """A function of the caller's own is computed per partition on Dask, where it would read the partition's other
    rows: it is tried on the first partition's rows, as on pandas, and announced (review: Dask reported it
    private)."""
    dd = pytest.importorskip("dask.dataframe")
    lazy = DPIV2SLS.from_formula("y ~ 1 + demean(w) + [x ~ z]", dd.from_pandas(frame, npartitions=3))
    assert [entry.split(":")[0] for entry in lazy.design.row_reading] == ["demean(w)"]
    assert DPIV2SLS.from_formula("y ~ 1 + rowwise(w) + [x ~ z]", dd.from_pandas(frame, npartitions=3)
                                 ).design.row_reading == ()
