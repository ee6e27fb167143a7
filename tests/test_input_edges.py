"""The fuzz round's edges (issue: reporting without traps, item 8): each a clear error of our own naming the fix,
never a traceback from inside Python, numpy or pandas, never a silent wrong number."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from dpivreg import DPIV2SLS, FitRelease, InferenceUnavailableError, load_release

N = 600
BOUNDS = {"y": (-5.0, 5.0), "x": (-5.0, 5.0), "z": (0.0, 1.0)}


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    z = rng.integers(0, 2, N).astype(float)
    x = z + rng.normal(size=N)
    return pd.DataFrame({"y": np.clip(x + rng.normal(size=N), -5, 5), "x": np.clip(x, -5, 5), "z": z,
                         "hh": np.arange(N) // 3})


@pytest.fixture(scope="module")
def model(frame):
    return DPIV2SLS.from_formula("y ~ 1 + [x ~ z]", frame)


@pytest.mark.parametrize("scale", [1e-160, 1e-170])
def test_subnormal_variances_are_refused_too(frame, scale):
    """At 1e-160 the variances are subnormal (about 1e-320): digits lost, not yet 0; refused like an exact 0."""
    data = frame.assign(y=frame["y"] * scale)
    res = DPIV2SLS.from_formula("y ~ 1 + [x ~ z]", data).fit(rho=2.6, bounds={**BOUNDS, "y": (-5 * scale, 5 * scale)},
                                                              seed=1)
    with pytest.raises(InferenceUnavailableError, match=r"variances below 2.2e-308 lose their digits"):
        res.bse


@pytest.mark.parametrize("share", [1.5, 0.0, -1.0, 1.0])
def test_exog_share_outside_the_open_unit_interval(model, share):
    with pytest.raises(ValueError, match=r"exog_share must lie strictly between 0 and 1"):
        model.fit(rho=2.6, bounds=BOUNDS, seed=1, exog_share=share)


def test_exog_share_of_the_wrong_type(model):
    with pytest.raises(TypeError, match=r"exog_share must be a number"):
        model.fit(rho=2.6, bounds=BOUNDS, seed=1, exog_share="0.2")


def test_max_rows_per_unit_as_text(model):
    with pytest.raises(TypeError, match=r"max_rows_per_unit must be a positive integer .* got '3'"):
        model.fit(rho=2.6, bounds=BOUNDS, seed=1, privacy_unit="hh", max_rows_per_unit="3")


def test_bounds_wider_than_float64(model):
    with pytest.raises(ValueError, match=r"bounds\['x'\] = \(-1e\+308, 1e\+308\) span more than float64 can hold"):
        model.fit(rho=2.6, bounds={**BOUNDS, "x": (-1e308, 1e308)}, seed=1)


def test_a_duplicated_column_name_as_privacy_unit(frame):
    data = pd.concat([frame, frame[["hh"]]], axis=1)
    with pytest.raises(ValueError, match=r"privacy_unit='hh' names 2 columns of the data \(duplicated column names\)"):
        DPIV2SLS.from_formula("y ~ 1 + [x ~ z]", data).fit(rho=2.6, bounds=BOUNDS, seed=1, privacy_unit="hh")


def test_ids_that_are_lists(frame):
    data = frame.assign(hh=[[i // 3] for i in range(N)])
    with pytest.raises(TypeError, match=r"privacy_unit 'hh' holds values that cannot be ids .* a number or a string"):
        DPIV2SLS.from_formula("y ~ 1 + [x ~ z]", data).fit(rho=2.6, bounds=BOUNDS, seed=1, privacy_unit="hh")


def test_an_outcome_so_small_that_its_variances_underflow(frame):
    """1e-170 units: the variances (1e-340) underflow to 0; standard errors of exactly 0 would give p = 0."""
    data = frame.assign(y=frame["y"] * 1e-170)
    res = DPIV2SLS.from_formula("y ~ 1 + [x ~ z]", data).fit(
        rho=2.6, bounds={**BOUNDS, "y": (-5e-170, 5e-170)}, seed=1)
    assert np.isfinite(res.params).all()
    with pytest.raises(InferenceUnavailableError, match=r"underflows float64 in the original units"):
        res.bse


def test_a_record_that_is_not_utf8(tmp_path):
    (tmp_path / "bad.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match=r"not a dpivreg release record: .* is not UTF-8 text"):
        load_release(tmp_path / "bad.json")


def test_a_record_nested_too_deeply(tmp_path):
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"nested too deeply"):
        load_release(tmp_path / "deep.json")


@pytest.fixture(scope="module")
def record(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return json.loads(model.fit(rho=2.6, bounds=BOUNDS, seed=1).release().to_json())


@pytest.mark.parametrize("edit", [
    lambda d: d.update(nobs=d["nobs"] + 1),
    lambda d: d["releases"][0].update(noise_std=d["releases"][0]["noise_std"] * 2),
    lambda d: d.update(leaks=["a leak the fit did not have"]),
    lambda d: d.update(formula="y ~ 1 + [x ~ w]"),
], ids=["nobs", "noise_std", "leaks", "formula"])
def test_an_edited_record_is_refused_by_its_digest(record, edit):
    data = json.loads(json.dumps(record))
    edit(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a record with leaks warns before it is checked
        with pytest.raises(ValueError, match=r"its fields do not match its digest, so the file was edited"):
            FitRelease.from_json(json.dumps(data))


def test_a_record_without_a_digest_loads_with_a_warning(record):
    data = {key: value for key, value in record.items() if key != "digest"}
    with pytest.warns(UserWarning, match=r"has no digest"):
        back = FitRelease.from_json(json.dumps(data))
    assert back.nobs == record["nobs"]
