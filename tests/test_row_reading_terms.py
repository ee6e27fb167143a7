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
               "np.where(w > np.median(w), 1., 0.)"]
ROW_WISE = ["w", "np.log1p(w)", "I(w ** 2)", "np.where(w > 5, 1., 0.)", "I(np.clip(w, 1, 9))", "rowwise(w)"]
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
