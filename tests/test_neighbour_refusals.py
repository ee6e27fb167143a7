"""No refusal that one row can flip (issue: privacy hardening, item 1).

Whether a fit runs is an output. A check whose verdict one row can change — a constant or duplicate instrument,
collinear columns, every value of a column outside its bounds, a dtype that a missing value changes — must not decide
it: each neighbour pair below differs in one row, and both sides build, fit and publish the same public facts (row
count, budget, releases' ρ, leaks). The design warns the data holder (:class:`dpivreg.DataCheckWarning`, NON-PRIVATE),
the NON-PRIVATE benchmark omits collinear columns as Stata's ``ivregress`` does, the summary says what the *releases*
cannot resolve, and ``fit(check_data=True)`` refuses instead, announced as a leak.

The audit at the end treats the refusal as an output: its auditor guesses D′ whenever D′'s model is refused, and
otherwise uses the exact likelihood ratio of the moment release (as ``test_boundary_audit``). The fixed code is sound
and tight; the broken variant that refuses again is caught with certainty.
"""

from __future__ import annotations

import io
import math
import warnings

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from linearmodels.iv import IV2SLS
from post_processing import forbid_data_reads
from test_privacy_audit import CONF, assert_llr_law, assert_tight, mu_lower_bound

import dpivreg.data.checks as checks_module
from dpivreg import DPIV2SLS, DataCheckWarning, PrivacyLeakWarning
from dpivreg.data.design import design_from_formula
from dpivreg.estimation.moments import NOISE_FLOOR, means_at_bounds, unresolved_directions
from dpivreg.estimation.working_scale import working_scale
from dpivreg.reporting.summary import SummaryWriter

N = 600
BOUNDS = {"y": (-5.0, 5.0), "x": (-5.0, 5.0), "z": (0.0, 1.0), "z2": (0.0, 1.0), "w": (0.0, 1.0), "k": (0.0, 2.0)}
FIT = dict(rho=2.6, seed=3)


def _base(n: int = N, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    z = rng.integers(0, 2, n).astype(float)
    x = z + rng.normal(size=n)
    y = x + rng.normal(size=n)
    return pd.DataFrame({"y": np.clip(y, -5, 5), "x": np.clip(x, -5, 5), "z": z,
                         "w": rng.integers(0, 2, n).astype(float), "k": rng.integers(0, 3, n)})


def _one_row_instrument() -> tuple[pd.DataFrame, pd.DataFrame]:
    """z2 is 1 in one row (D) or 0 in every row (D′: that row replaced)."""
    D = _base().assign(z2=0.0)
    D.loc[0, "z2"] = 1.0
    return D, D.assign(z2=0.0)


def _near_duplicate() -> tuple[pd.DataFrame, pd.DataFrame]:
    """z2 equals z but in one row (D), or everywhere (D′)."""
    D_ = _base().assign(z2=lambda f: f["z"])
    D = D_.copy()
    D.loc[0, "z2"] = 1.0 - D.loc[0, "z"]
    return D, D_


def _all_out_of_bounds() -> tuple[pd.DataFrame, pd.DataFrame]:
    """At n = 40 every value of w lies above its bounds (0, 1) (D′), or all but one (D)."""
    D_ = _base(40).assign(w=3.0)
    D = D_.copy()
    D.loc[0, "w"] = 0.5
    return D, D_


def _constant_endogenous() -> tuple[pd.DataFrame, pd.DataFrame]:
    """The endogenous regressor x is 0 but in one row (D), or 0 everywhere (D′)."""
    D_ = _base().assign(x=0.0)
    D = D_.copy()
    D.loc[0, "x"] = 4.0
    return D, D_


PAIRS = {
    "one-row instrument vs constant": (_one_row_instrument, "y ~ 1 + [x ~ z + z2]"),
    "one-row control vs constant": (_one_row_instrument, "y ~ 1 + z2 + [x ~ z]"),
    "near-duplicate vs duplicate instruments": (_near_duplicate, "y ~ 1 + [x ~ z + z2]"),
    "all values out of bounds at small n": (_all_out_of_bounds, "y ~ 1 + w + [x ~ z]"),
    "one-row vs constant endogenous regressor": (_constant_endogenous, "y ~ 1 + [x ~ z]"),
}


def _bounds(data: pd.DataFrame) -> dict:
    return {c: b for c, b in BOUNDS.items() if c in data.columns}


def _fit(data, formula: str, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataCheckWarning)  # the data holder's warning: asserted separately
        model = DPIV2SLS.from_formula(formula, data, **kwargs.pop("build", {}))
        return model.fit(bounds=kwargs.pop("bounds", _bounds(data)), **FIT, **kwargs)


def public_facts(res) -> tuple:
    """What a fit decides from public inputs alone: the row count, the budget it spent and by which releases
    (names, stages, sensitivities: T and the clipping thresholds are chosen from releases, so the steps and
    σ may differ), the leaks, the sampler, the estimator's names."""
    table = res.privacy.to_frame()
    return (res.nobs, round(res.privacy.rho, 12), tuple(sorted(set(table.index))), res.leaks, res.is_private,
            res.privacy.sampler, tuple(res.params.index))


def _to_dask(frame: pd.DataFrame) -> dd.DataFrame:
    return dd.from_pandas(frame, npartitions=3)


@pytest.mark.parametrize("backend", ["pandas", "dask"])
@pytest.mark.parametrize("pair", list(PAIRS))
def test_neighbours_both_fit_with_the_same_public_facts(pair, backend):
    make, formula = PAIRS[pair]
    D, D_ = make()
    convert = _to_dask if backend == "dask" else (lambda f: f)
    res, res_ = _fit(convert(D), formula), _fit(convert(D_), formula)
    assert np.isfinite(res.params).all() and np.isfinite(res_.params).all()
    assert np.isfinite(res.bse).all() and np.isfinite(res_.bse).all()
    assert public_facts(res) == public_facts(res_)
    assert res.is_private and res_.is_private
    for r in (res, res_):  # the publishable summary renders on both sides
        assert "No privacy leak" in r.summary(benchmark=False).as_text()


@pytest.mark.parametrize("pair", list(PAIRS))
def test_the_data_holder_is_warned_on_the_side_with_the_finding(pair):
    make, formula = PAIRS[pair]
    D, D_ = make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(D, formula)
    assert not [w for w in caught if issubclass(w.category, DataCheckWarning)]
    with pytest.warns(DataCheckWarning, match=r"reads the data.*The fit runs anyway"):
        DPIV2SLS.from_formula(formula, D_).fit(bounds=_bounds(D_), **FIT)


@pytest.mark.parametrize("pair", list(PAIRS))
def test_check_data_refuses_and_announces_the_leak(pair):
    make, formula = PAIRS[pair]
    D, D_ = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataCheckWarning)
        model_ = DPIV2SLS.from_formula(formula, D_)
    with pytest.warns(PrivacyLeakWarning, match=r"check_data=True"), pytest.raises(ValueError, match=r"check_data"):
        model_.fit(bounds=_bounds(D_), check_data=True, **FIT)
    with pytest.warns(PrivacyLeakWarning, match=r"check_data=True"):
        res = DPIV2SLS.from_formula(formula, D).fit(bounds=_bounds(D), check_data=True, **FIT)
    assert not res.is_private and any("check_data=True" in leak for leak in res.leaks)


def test_check_data_is_a_flag():
    D, _ = _one_row_instrument()
    with pytest.raises(TypeError, match=r"check_data"):
        DPIV2SLS.from_formula("y ~ 1 + [x ~ z + z2]", D).fit(bounds=_bounds(D), check_data="yes", **FIT)


@pytest.mark.parametrize("backend", ["pandas", "dask"])
def test_an_integer_column_read_with_a_missing_value_needs_no_different_declaration(backend):
    """pandas reads a CSV column of integers as int64, as float64 once one value is missing: which columns need a
    fill value is decided from names alone, so both neighbours need the same fill_values and both fit."""
    D = _base()
    D_ = D.assign(k=D["k"].astype(float))
    D_.loc[3, "k"] = np.nan
    read = [pd.read_csv(io.StringIO(frame.to_csv(index=False))) for frame in (D, D_)]
    assert [frame["k"].dtype for frame in read] == [np.dtype("int64"), np.dtype("float64")]
    convert = _to_dask if backend == "dask" else (lambda f: f)
    formula = "y ~ 1 + k + [x ~ z]"
    partial = {"y": 0.0, "x": 0.0, "z": 0.0}
    for frame in read:  # a schema that forgets k is refused on both sides, with the same message
        with pytest.raises(ValueError, match=r"no public fill value for column\(s\) \['k'\]"):
            DPIV2SLS.from_formula(formula, convert(frame), missing="fill", fill_values=partial)
    schema = {**partial, "k": 0}
    fits = [_fit(convert(frame), formula, build={"missing": "fill", "fill_values": schema}) for frame in read]
    assert public_facts(fits[0]) == public_facts(fits[1])
    assert fits[0].nobs == fits[1].nobs == N


@pytest.mark.parametrize("missing", ["fill", "drop"])
def test_a_boolean_column_read_with_a_missing_value_is_the_same_schema(missing):
    """pandas reads a boolean CSV column as bool, as object (True/False/NaN) once one value is missing: both are read
    as pandas' nullable "boolean", so under "fill" both neighbours fit with the same public facts; under "drop" the
    dropped row is the announced leak of that policy, not a refusal."""
    D = _base().assign(b=lambda f: f["w"] > 0)
    D_ = D.astype({"b": object})
    D_.loc[3, "b"] = np.nan
    read = [pd.read_csv(io.StringIO(frame.to_csv(index=False))) for frame in (D, D_)]
    assert [frame["b"].dtype for frame in read] == [np.dtype(bool), np.dtype(object)]
    untouched = read[1].copy()
    build = {"missing": "fill", "fill_values": {"y": 0.0, "x": 0.0, "z": 0.0, "b": False}} if missing == "fill" else {}
    fits = [_fit(frame, "y ~ 1 + b + [x ~ z]", build=dict(build)) for frame in read]
    pd.testing.assert_frame_equal(read[1], untouched)  # the caller's frame is not modified
    if missing == "fill":
        assert public_facts(fits[0]) == public_facts(fits[1])
    else:
        assert fits[1].nobs == N - 1 and any("missing='drop'" in leak for leak in fits[1].leaks)
    assert tuple(fits[0].params.index) == tuple(fits[1].params.index) == ("Intercept", "b", "x")


# ---------------------------------------------------------------------------------------- the benchmark
@pytest.mark.parametrize(("make", "formula", "omitted"), [
    (_near_duplicate, "y ~ 1 + [x ~ z + z2]", ("z2",)),
    (_one_row_instrument, "y ~ 1 + z2 + [x ~ z]", ("z2",)),
])
def test_the_benchmark_omits_collinear_columns_as_stata_does(make, formula, omitted):
    """The NON-PRIVATE benchmark equals linearmodels' IV2SLS on the design without the omitted column (Stata's
    ivregress: "omitted because of collinearity"); the omitted coefficient is NaN."""
    _, D_ = make()
    res = _fit(D_, formula)
    bench = res.benchmark
    assert bench.omitted == omitted
    reduced = formula.replace(" + z2", "")
    reference = IV2SLS.from_formula(reduced, D_).fit(cov_type="robust", debiased=False)
    kept = [name for name in bench.params.index if name not in omitted]
    np.testing.assert_allclose(bench.params[kept], reference.params[kept], rtol=1e-8)
    np.testing.assert_allclose(bench.std_errors[kept], reference.std_errors[kept], rtol=1e-6)
    assert bench.params.reindex(list(omitted)).isna().all()  # a regressor's coefficient NaN, an instrument absent
    assert f"IV2SLS* omits {', '.join(omitted)}" in res.summary().as_text()


def test_an_unidentified_benchmark_is_nan_not_an_error():
    D = _base().assign(z2=1.0)
    res = _fit(D, "y ~ 1 + [x ~ z2]")
    assert res.benchmark.params.isna().all() and res.benchmark.omitted == ("z2",)
    assert np.isfinite(res.params).all()
    res.summary()


# ---------------------------------------------------------------------------------------- release-based notes
def test_unresolved_directions_exact_values():
    """A duplicate pair (z, z2) on the box scale: M's leading block has the null vector (0, 1, −1)/√2."""
    v = np.array([[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0]])
    rows = np.column_stack([np.ones(4), v])
    M = rows.T @ rows / 4
    (direction,) = unresolved_directions(M, 0.01, [0, 1, 2])
    np.testing.assert_allclose(np.abs(direction), [0.0, 1 / math.sqrt(2), 1 / math.sqrt(2)], atol=1e-12)
    assert direction[1] == pytest.approx(-direction[2])
    assert unresolved_directions(M, 0.0, [0, 1, 2]) == []
    (other,) = unresolved_directions(M, 0.01, [0, 2, 1])  # any subset and order of the columns
    np.testing.assert_allclose(np.abs(other), np.abs(direction), atol=1e-12)
    assert unresolved_directions(M, 0.01, [0, 1]) == []  # without its duplicate, z is resolved
    # an eigenvalue at the floor is resolved, just below it is not
    M2 = np.diag([1.0, 0.5, NOISE_FLOOR * 0.1])
    assert len(unresolved_directions(M2, 0.1 * (1 + 1e-9), [0, 1, 2])) == 1
    assert unresolved_directions(M2, 0.1 * (1 - 1e-9), [0, 1, 2]) == []


def test_means_at_bounds_exact_values():
    M = np.zeros((4, 4))
    M[0] = [1.0, 0.999, -0.95, -0.9995]
    np.testing.assert_array_equal(means_at_bounds(M, 0.0005), [0.0, 1.0, 0.0, -1.0])
    np.testing.assert_array_equal(means_at_bounds(M, 0.0), [0.0, 0.0, 0.0, 0.0])


@pytest.mark.parametrize("pair", list(PAIRS))
def test_the_summary_says_what_the_release_cannot_resolve_on_both_sides(pair):
    """The notes are post-processing of the release: shown on both neighbours alike (one row moves the release by
    far less than its noise), and absent on a well-posed design."""
    make, formula = PAIRS[pair]
    for data in make():
        assert "UNRESOLVED" in _fit(data, formula).summary(benchmark=False).as_text()


def test_the_regressors_note_names_a_constant_endogenous_regressor():
    _, D_ = _constant_endogenous()
    text = _fit(D_, "y ~ 1 + [x ~ z]").summary(benchmark=False).as_text()
    assert "UNRESOLVED: the released second moments of the constant and the regressors" in text
    assert "first-stage statistics are not meaningful" in text


def test_without_a_moment_release_the_summary_says_nothing_released_can_tell():
    D, D_ = _one_row_instrument()
    for data in (D, D_):
        res = _fit(data, "y ~ 1 + [x ~ z + z2]", preprocess="bounds", T=5)
        assert "No moment release (preprocess='bounds'): nothing released shows" in res.summary().as_text()


def test_no_resolution_note_on_a_well_posed_design():
    D = _base()
    text = _fit(D, "y ~ 1 + w + [x ~ z]").summary(benchmark=False).as_text()
    assert "UNRESOLVED" not in text and "released mean lies" not in text


def test_the_notes_read_no_data(monkeypatch):
    """The resolution notes use the release only: with the design's rows and range set to raise they still come."""
    _, D_ = _one_row_instrument()
    res = _fit(D_, "y ~ 1 + [x ~ z + z2]")
    forbid_data_reads(monkeypatch, res.design, "the summary's resolution notes")
    notes = SummaryWriter(res)._resolution_notes()
    assert any(note.startswith("UNRESOLVED") for note in notes)
    assert any("Column 'z2': its released mean lies at its lower bound" in note for note in notes)


# ---------------------------------------------------------------------------------------- the audit
AUDIT_N = 50
AUDIT_RHO = 2.5  # μ = sqrt(5), as in the other audits
AUDIT_RUNS = 2000
AUDIT_FORMULA = "y ~ 1 + [x ~ z2]"
AUDIT_BOUNDS = {"y": (-2.0, 2.0), "x": (-1.0, 3.0), "z2": (0.0, 1.0)}
#: the release's column order, [instruments, endog, dependent] (dpivreg.estimation.working_scale.free_columns)
ORDER = ("z2", "x", "y")


def audit_frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    """D: z2 is 1 only in the canary (last) row, at box (1, 1, 1, 1); D′: the canary replaced by a row with z2 = 0
    (z2 now constant) and x at its lower bound, box (1, −1, −1, 1): two of the three free coordinates flip, where the
    release's sensitivity D/n (D = 4) is attained."""
    rng = np.random.default_rng(20261205)
    shared = {"y": rng.uniform(-2, 2, AUDIT_N - 1), "x": rng.uniform(-1, 3, AUDIT_N - 1), "z2": np.zeros(AUDIT_N - 1)}
    D = pd.DataFrame({c: np.append(v, AUDIT_BOUNDS[c][1]) for c, v in shared.items()})
    D_ = D.copy()
    D_.iloc[-1] = [2.0, -1.0, 0.0]  # y, x, z2
    return D, D_


def clean_moments(frame: pd.DataFrame) -> np.ndarray:
    """[1, v]ᵀ[1, v]/n with v the columns clipped and mapped to [−1, 1] (re-derived here, not package code)."""
    v = np.column_stack([(np.clip(frame[c].to_numpy(), lo, hi) - (lo + hi) / 2) / ((hi - lo) / 2)
                         for c, (lo, hi) in ((c, AUDIT_BOUNDS[c]) for c in ORDER)])
    w = np.column_stack([np.ones(len(v)), v])
    return w.T @ w / len(v)


def audited_outputs(frame: pd.DataFrame, seed: int) -> tuple[np.ndarray | None, float]:
    """AUDIT_RUNS moment releases (upper triangles without the constant's entry) and σ; None if refused."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DataCheckWarning)
            design = design_from_formula(AUDIT_FORMULA, frame)
    except ValueError:
        return None, math.nan
    rng = np.random.default_rng(seed)
    iu = np.triu_indices(4)
    keep = [k for k, (i, j) in enumerate(zip(*iu)) if (i, j) != (0, 0)]
    out, sigma = [], math.nan
    for _ in range(AUDIT_RUNS):
        scale = working_scale(design, AUDIT_BOUNDS, route="private", rho0=AUDIT_RHO, rng=rng)
        out.append(scale.moments.matrix[iu][keep])
        sigma = scale.moments.sigma
    return np.array(out), float(sigma)


def audit(outputs: dict) -> tuple[float, dict]:
    """μ_lb of an auditor that says D′ whenever the model is refused, else by the exact likelihood ratio."""
    D, D_ = audit_frames()
    iu = np.triu_indices(4)
    keep = [k for k, (i, j) in enumerate(zip(*iu)) if (i, j) != (0, 0)]
    g, g_ = clean_moments(D)[iu][keep], clean_moments(D_)[iu][keep]
    d, mid = g - g_, (g + g_) / 2
    S, says_d = {}, {}
    for world, (u, sigma) in outputs.items():
        if u is None:  # refused: the auditor says D′ every time
            S[world], says_d[world] = None, np.zeros(AUDIT_RUNS, dtype=bool)
        else:
            S[world] = (u - mid) @ d / sigma**2
            says_d[world] = S[world] > 0
    fp = int(np.sum(says_d["D'"]))
    fn = int(np.sum(~says_d["D"]))
    return mu_lower_bound(fp, fn, AUDIT_RUNS), S


def test_the_audit_pair_attains_the_sensitivity():
    D, D_ = audit_frames()
    iu = np.triu_indices(4)
    assert np.linalg.norm((clean_moments(D) - clean_moments(D_))[iu]) == pytest.approx(4.0 / AUDIT_N, rel=1e-12)
    assert (D_["z2"] == 0).all() and D["z2"].sum() == 1


def test_the_one_row_instrument_pair_is_private_and_the_audit_is_tight():
    D, D_ = audit_frames()
    outputs = {"D": audited_outputs(D, 1), "D'": audited_outputs(D_, 2)}
    assert all(u is not None for u, _ in outputs.values())  # both fit: no refusal to read
    mu = math.sqrt(2 * AUDIT_RHO)
    sigma = outputs["D"][1]
    assert sigma == pytest.approx((4.0 / AUDIT_N) / mu, rel=1e-12)
    mu_lb, S = audit(outputs)
    assert_llr_law(np.array([S["D"], S["D'"]]), mu)
    assert mu_lb <= mu
    assert_tight(mu_lb, mu, AUDIT_RUNS)


def test_the_audit_catches_a_refusal_one_row_can_flip(monkeypatch):
    """The broken variant refuses on the design's findings again (0.1's behaviour): D′ is never fitted, the auditor
    says D′ with certainty there and the lower bound exceeds the claim."""
    def refuse(findings, stacklevel):
        if findings:
            raise ValueError(findings[0])

    monkeypatch.setattr(checks_module, "warn_findings", refuse)
    import dpivreg.data.design as design_module  # noqa: PLC0415 - the name the design builder calls
    monkeypatch.setattr(design_module, "warn_findings", refuse)
    D, D_ = audit_frames()
    outputs = {"D": audited_outputs(D, 1), "D'": audited_outputs(D_, 2)}
    assert outputs["D'"][0] is None and outputs["D"][0] is not None
    mu_lb, _ = audit(outputs)
    assert mu_lb > math.sqrt(2 * AUDIT_RHO)


assert CONF == 5e-4
