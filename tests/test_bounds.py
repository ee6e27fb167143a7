"""Codebook bounds (dpivreg.data.bounds): one mapping over a data set's variables for any formula."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pandas as pd
import pytest

from dpivreg import DPIV2SLS, PrivacyLeakWarning
from dpivreg.data.bounds import resolve_bounds
from dpivreg.datasets import LABSUP_BOUNDS, load_labsup

LABSUP = load_labsup()


def _leaks(model, bounds) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(rho1=1.0, rho2=1.0, bounds=bounds, seed=0, inference=False)
    return [str(w.message) for w in caught if issubclass(w.category, PrivacyLeakWarning)]


# the formulas of the README and the docs (weeks ~ [kids ~ samesex] declares no intercept)
@pytest.mark.parametrize("formula", ["weeks ~ 1 + [kids ~ samesex]", "weeks ~ 1 + educ + [kids ~ samesex] + age",
                                     "weeks ~ [kids ~ samesex]", "weeks ~ 1 + age + I(age**2) + [kids ~ samesex]"])
def test_the_labsup_codebook_works_for_every_documented_formula(formula):
    model = DPIV2SLS.from_formula(formula, LABSUP)
    assert _leaks(model, LABSUP_BOUNDS) == []
    resolved = resolve_bounds(LABSUP_BOUNDS, model.design)
    used = {name for name in model.design.column_names if name != model.design.constant_name}
    assert used <= set(resolved.bounds)
    assert set(resolved.unused) == set(LABSUP_BOUNDS) - used - set(resolved.carried.values())


def test_spacing_in_term_names_does_not_matter():
    model = DPIV2SLS.from_formula("weeks ~ 1 + age + I(age ** 2) + [kids ~ samesex]", LABSUP)
    resolved = resolve_bounds({**LABSUP_BOUNDS, "I(age**2)": (0.0, 1600.0)}, model.design)
    assert resolved.bounds["I(age ** 2)"] == (0.0, 1600.0) and not resolved.carried


@pytest.mark.parametrize(("term", "raw", "expected"), [
    ("np.log(w)", (1.0, 100.0), (0.0, math.log(100.0))),
    ("np.sqrt(w)", (0.0, 4.0), (0.0, 2.0)),
    ("I(w ** 2)", (-3.0, 2.0), (0.0, 9.0)),
    ("I(w ** 2)", (1.0, 2.0), (1.0, 4.0)),
])
def test_monotone_transforms_carry_the_raw_bounds(term, raw, expected):
    rng = np.random.default_rng(0)
    data = pd.DataFrame({"y": rng.normal(size=200), "x": rng.normal(size=200), "z": rng.normal(size=200),
                         "w": rng.uniform(max(raw[0], 1e-3), raw[1], 200)})
    model = DPIV2SLS.from_formula(f"y ~ 1 + {term} + [x ~ z]", data)
    name = model.design.exog_names[1]
    resolved = resolve_bounds({"y": (-5, 5), "x": (-5, 5), "z": (-5, 5), "w": raw}, model.design)
    assert resolved.bounds[name] == pytest.approx(expected) and resolved.carried == {name: "w"}
    assert "w" not in resolved.unused


def test_log_of_a_range_reaching_zero_is_not_carried_and_the_leak_names_the_term():
    data = LABSUP.assign(w=LABSUP["age"] + 0.5)
    model = DPIV2SLS.from_formula("weeks ~ 1 + np.log(w) + [kids ~ samesex]", data)
    leaks = _leaks(model, {**LABSUP_BOUNDS, "w": (0.0, 41.0)})
    assert len(leaks) == 1 and "np.log(w)" in leaks[0]


def test_dummies_booleans_and_indicators_are_in_the_unit_interval_by_construction():
    data = LABSUP.assign(b=LABSUP["black"] > 0, g=pd.Categorical(np.where(LABSUP["age"] > 30, "old", "young")))
    model = DPIV2SLS.from_formula("weeks ~ 1 + b + C(g) + [kids ~ samesex]", data)
    resolved = resolve_bounds(LABSUP_BOUNDS, model.design)
    assert set(resolved.automatic) == {"b", "C(g)[T.young]"}
    assert all(resolved.bounds[name] == (0.0, 1.0) for name in resolved.automatic)
    assert _leaks(model, LABSUP_BOUNDS) == []


def test_a_typo_is_still_an_error_naming_both_column_lists():
    model = DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", LABSUP)
    with pytest.raises(ValueError, match=r"'kidz', which is neither a column of the design nor of the data.*"
                                         r"data columns: \['kids', 'morekids'"):
        resolve_bounds({**LABSUP_BOUNDS, "kidz": (0, 12)}, model.design)


def test_the_summary_lists_the_unused_codebook_entries_in_one_note():
    res = DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", LABSUP).fit(rho1=1, rho2=1, bounds=LABSUP_BOUNDS,
                                                                            seed=0)
    notes = [line for line in str(res.summary()).splitlines() if "does not use" in line]
    assert len(notes) == 1 and re.search(r"\beduc\b", notes[0]) and not re.search(r"\bkids\b", notes[0])


def test_bounds_that_clip_many_values_warn_with_a_labelled_count():
    model = DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", LABSUP)
    with pytest.warns(UserWarning, match=r"the bounds clip more than 1% of the values of 'weeks'.*seen only by the "
                                         r"data holder"):
        model.fit(rho1=1, rho2=1, bounds={**LABSUP_BOUNDS, "weeks": (0.0, 20.0)}, seed=0, inference=False)
