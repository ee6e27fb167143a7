"""Dask DataFrames and arrays: the lazy design, the fit and the benchmark equal the pandas path's."""

import warnings

import numpy as np
import pandas as pd
import pytest
from findings import expect_finding

dask = pytest.importorskip("dask")
dd = pytest.importorskip("dask.dataframe")
da = pytest.importorskip("dask.array")

from dask.callbacks import Callback  # noqa: E402
from linearmodels.iv import IV2SLS  # noqa: E402

from dpivreg import DPIV2SLS  # noqa: E402
from dpivreg.errors import DroppedRowsWarning, EncodedMissingWarning  # noqa: E402

FORMULA = "y ~ 1 + w + C(c) + [x ~ z1 + z2]"
BOUNDS = {"y": (-20, 20), "x": (-10, 10), "z1": (-5, 5), "z2": (-5, 5), "w": (-5, 5),
          "C(c)[T.b]": (0, 1), "C(c)[T.c]": (0, 1)}
FIT = dict(rho1=1.0, rho2=1.0, T=8, bounds=BOUNDS, seed=20261129)


def _frame(n: int = 3000, seed: int = 7) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    z1, z2, w, u = rng.normal(size=(4, n))
    x = 0.8 * z1 + 0.5 * z2 + 0.5 * u + rng.normal(size=n)
    y = 1 + 2 * x - w + u
    c = pd.Categorical(rng.choice(["a", "b", "c"], n), categories=["a", "b", "c"])
    df = pd.DataFrame({"y": y, "x": x, "z1": z1, "z2": z2, "w": w, "c": c, "other": rng.normal(size=n)})
    df.loc[[5, 2 * n // 5], "y"] = np.nan
    df.loc[5 * n // 6, "z2"] = np.nan
    return df


@pytest.fixture(autouse=True)
def _threads():
    with dask.config.set(scheduler="threads"):
        yield


@pytest.fixture(scope="module")
def frames():
    df = _frame()
    return df, dd.from_pandas(df, npartitions=5)


def _model(formula, data, **kwargs):
    """The model, without the DroppedRowsWarning of the fixture's missing values."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DroppedRowsWarning)
        return DPIV2SLS.from_formula(formula, data, **kwargs)


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _pandas_values(design) -> np.ndarray:
    return np.column_stack([design.dependent, design.exog, design.endog, design.instruments])


def _assert_close(a, b, rtol=1e-10):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * max(np.max(np.abs(b)), 1e-300))


# ----------------------------------------------------------------------------------------
# the design
# ----------------------------------------------------------------------------------------
def test_formula_design_equals_pandas(frames):
    df, ddf = frames
    with pytest.warns(DroppedRowsWarning, match="dropped 3 of 3000 rows"):
        lazy = DPIV2SLS.from_formula(FORMULA, ddf).design
    eager = _quiet(DPIV2SLS.from_formula, FORMULA, df).design
    assert lazy.is_dask and lazy.nobs == eager.nobs == 2997 and lazy.n_dropped == 3
    assert lazy.regressor_names == eager.regressor_names == ["Intercept", "w", "C(c)[T.b]", "C(c)[T.c]", "x"]
    assert lazy.z_names == eager.z_names and lazy.dependent_name == "y"
    assert lazy.constant_name == "Intercept" and lazy.formula == FORMULA
    assert not any(np.isnan(c) for c in lazy.values.chunks[0])  # known chunks: n is public
    np.testing.assert_array_equal(lazy.values.compute(), _pandas_values(eager))


def test_categories_are_all_levels_even_if_a_partition_lacks_some():
    df = _frame(600)
    df = df.sort_values("c", kind="stable").reset_index(drop=True)  # partitions hold one level each
    ddf = dd.from_pandas(df, npartitions=3, sort=False)
    lazy = _quiet(DPIV2SLS.from_formula, "y ~ 1 + c + [x ~ z1]", ddf).design
    eager = _quiet(DPIV2SLS.from_formula, "y ~ 1 + c + [x ~ z1]", df).design
    assert lazy.exog_names == eager.exog_names == ["Intercept", "c[T.b]", "c[T.c]"]
    np.testing.assert_array_equal(lazy.values.compute(), _pandas_values(eager))


def test_unknown_categories_and_text_columns_are_rejected(frames):
    df, _ = frames
    unknown = dd.from_pandas(df.assign(c=df["c"].astype(str)), npartitions=3)
    with pytest.raises(ValueError, match=r"column 'c' has dtype .*as_known\(\)"):
        DPIV2SLS.from_formula(FORMULA, unknown)
    unknown = unknown.assign(c=unknown["c"].astype("category"))
    assert not unknown["c"].cat.known
    with pytest.raises(ValueError, match=r"'c' is a Dask category with unknown categories.*cat.as_known\(\)"):
        DPIV2SLS.from_formula(FORMULA, unknown)
    known = unknown.assign(c=unknown["c"].cat.as_known())
    assert _quiet(DPIV2SLS.from_formula, FORMULA, known).design.nobs == 2997


def test_levels_and_stateful_transforms_that_need_the_data_are_rejected(frames):
    _, ddf = frames
    with pytest.raises(ValueError, match=r"treats column 'w' .* as a category.*ddf\['w'\] = ddf\['w'\]\.astype"):
        DPIV2SLS.from_formula("y ~ 1 + C(w) + [x ~ z1]", ddf)
    with pytest.raises(ValueError, match=r"stateful transform.*center"):
        DPIV2SLS.from_formula("y ~ 1 + center(w) + [x ~ z1]", ddf)
    with pytest.raises(ValueError, match=r"stateful transform in 'center\(w\)'"):
        DPIV2SLS.from_formula("y ~ 1 + center(w) + [x ~ z1]", ddf, formula_engine="patsy")
    with pytest.raises(ValueError, match=r"treats column 'w' .* as a category"):
        DPIV2SLS.from_formula("y ~ 1 + C(w) + [x ~ z1]", ddf, formula_engine="patsy")


@pytest.mark.filterwarnings("ignore::dpivreg.errors.DroppedRowsWarning")
def test_patsy_design_equals_pandas():
    df = _frame(800).assign(b=lambda f: f["w"] > 0.3, v=lambda f: np.abs(f["other"]))
    df.loc[[3, 11], "c"] = None  # patsy drops a missing category
    ddf = dd.from_pandas(df, npartitions=3)
    for formula in ("y ~ 1 + np.log(v) + C(c) + b + [x ~ z1 + z2]", "y ~ v:b + c + [x ~ z1 + z2]"):
        lazy = DPIV2SLS.from_formula(formula, ddf, formula_engine="patsy").design
        eager = DPIV2SLS.from_formula(formula, df, formula_engine="patsy").design
        assert lazy.formula_engine == "patsy" and lazy.regressor_names == eager.regressor_names
        assert lazy.n_dropped == eager.n_dropped >= 5
        np.testing.assert_array_equal(lazy.values.compute(), _pandas_values(eager))


def test_formula_errors_match_pandas(frames):
    df, ddf = frames
    for formula in ("y ~ 1 + nosuch + [x ~ z1]", "y ~ 1 + [x ~ z1 + z1b]", "y ~ 1 + w + [x + w2 ~ z1]"):
        with pytest.raises(ValueError) as eager:
            _quiet(DPIV2SLS.from_formula, formula, df)
        with pytest.raises(ValueError) as lazy:
            DPIV2SLS.from_formula(formula, ddf)
        assert str(lazy.value) == str(eager.value)


def test_infinite_values_are_refused_like_pandas(frames):
    df, _ = frames
    ddf = dd.from_pandas(df, npartitions=4)
    for data in (df, ddf):
        with pytest.raises(ValueError, match="contain infinite values"):
            _quiet(DPIV2SLS.from_formula, "y ~ 1 + w + [x ~ np.log(z1 - z1)]", data)


@pytest.mark.parametrize("formula, match", [
    ("y ~ 1 + w + [x ~ one]", "instrument 'one' is constant"),
    ("y ~ 1 + w + [x ~ w_copy]", "has the same values as exog column 'w'"),
    ("y ~ 1 + w + w2 + [x ~ z1]", r"regressors \[exog, endog\] does not have full column rank .*'w2'"),
    ("y ~ 1 + [x ~ z1 + z1b]", "has the same values as instrument 'z1'"),
])
def test_findings_from_one_pass_match_pandas(frames, formula, match):
    df, _ = frames
    df = df.assign(one=1.0, w_copy=df["w"], w2=2 * df["w"] - 3, z1b=df["z1"])
    ddf = dd.from_pandas(df, npartitions=4)
    eager = expect_finding(DPIV2SLS.from_formula, match, formula, df)
    lazy = expect_finding(DPIV2SLS.from_formula, match, formula, ddf)
    assert lazy.design.data_findings == eager.design.data_findings


@pytest.mark.filterwarnings("ignore::dpivreg.errors.DroppedRowsWarning")
def test_missing_category_warns_as_pandas():
    df = _frame(400)
    df["c"] = df["c"].astype(object)
    df.loc[3, "c"] = None
    df["c"] = df["c"].astype(pd.CategoricalDtype(["a", "b", "c"]))
    ddf = dd.from_pandas(df, npartitions=2)
    with pytest.warns(EncodedMissingWarning, match=r"1 row\(s\) kept .* \['c'\]"):
        lazy = DPIV2SLS.from_formula("y ~ 1 + C(c) + [x ~ z1]", ddf).design
    eager = _quiet(DPIV2SLS.from_formula, "y ~ 1 + C(c) + [x ~ z1]", df).design
    np.testing.assert_array_equal(lazy.values.compute(), _pandas_values(eager))


def test_user_frame_is_not_modified(frames):
    df, ddf = frames
    before_columns, before_dtypes = list(ddf.columns), ddf.dtypes.copy()
    _quiet(_model(FORMULA, ddf).fit, **FIT)
    assert list(ddf.columns) == before_columns and ddf.dtypes.equals(before_dtypes)
    pd.testing.assert_frame_equal(ddf.compute(), df)


def test_arrays_and_frames(frames):
    df, ddf = frames
    clean = df.dropna().drop(columns=["c", "other"])
    clean.insert(0, "const", 1.0)
    eager = DPIV2SLS(clean["y"], clean[["const", "w"]], clean["x"], clean[["z1", "z2"]]).design
    parts = dd.from_pandas(clean, npartitions=4)
    from_frames = DPIV2SLS(parts["y"], parts[["const", "w"]], parts["x"], parts[["z1", "z2"]]).design
    assert from_frames.regressor_names == ["const", "w", "x"] and from_frames.constant_name == "const"
    np.testing.assert_array_equal(from_frames.values.compute(), _pandas_values(eager))
    arr = da.from_array(clean.to_numpy(), chunks=(700, 3))
    from_arrays = DPIV2SLS(arr[:, 1], arr[:, [0, 5]], arr[:, 2].rechunk(500), arr[:, 3:5]).design
    assert from_arrays.regressor_names == ["exog.0", "exog.1", "endog"]
    assert from_arrays.instrument_names == ["instruments.0", "instruments.1"]
    np.testing.assert_array_equal(from_arrays.values.compute(), _pandas_values(eager))
    with pytest.raises(TypeError, match="pass all inputs as Dask collections"):
        DPIV2SLS(arr[:, 1], None, clean["x"].to_numpy(), arr[:, 3:5])


# ----------------------------------------------------------------------------------------
# the benchmark
# ----------------------------------------------------------------------------------------
def test_benchmark_equals_linearmodels(frames):
    df, ddf = frames
    res = _quiet(_model(FORMULA, ddf).fit, **FIT)
    eager = _quiet(DPIV2SLS.from_formula, FORMULA, df).design
    ref = IV2SLS(eager.dependent, eager.exog, eager.endog, eager.instruments).fit()
    bench = res.benchmark
    assert bench.nobs == ref.nobs and bench.cov_type == ref.cov_type == "robust"
    _assert_close(bench.params, ref.params)
    _assert_close(bench.std_errors, ref.std_errors)
    _assert_close(bench.cov, ref.cov)
    _assert_close(bench.resid_ss, ref.resid_ss)
    assert list(bench.params.index) == list(ref.params.index)
    assert "IV2SLS*" in res.summary().as_text()


# ----------------------------------------------------------------------------------------
# the fit
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("options", [
    {},
    {"preprocess": "bounds"},
    {"preprocess": "data"},
    {"method": "gd"},
    {"bounds": {k: v for k, v in BOUNDS.items() if k != "w"}, "clip": "rms"},
    {"T": None},
    {"T": None, "method": "moments"},
    {"init": "zero", "clip": "theorem"},
    {"cov_type": "robust"},
    {"T": None, "method": "moments", "cov_type": "robust"},
], ids=["private", "bounds", "data", "gd-data-steps", "leaky-bounds-rms", "default-choice", "moments", "zero-start",
        "robust", "moments-robust"])
def test_fit_equals_pandas_for_the_same_seed(frames, options):
    df, ddf = frames
    kwargs = {**FIT, **options}
    lazy = _quiet(_model(FORMULA, ddf).fit, **kwargs)
    eager = _quiet(_model(FORMULA, df).fit, **kwargs)
    _assert_close(lazy.params, eager.params)
    _assert_close(lazy.path, eager.path)
    _assert_close(lazy.first_stage, eager.first_stage)
    assert [r.rho for r in lazy.privacy.releases] == pytest.approx([r.rho for r in eager.privacy.releases],
                                                                     rel=1e-12)
    assert lazy.privacy.rho == pytest.approx(eager.privacy.rho, rel=1e-12)
    assert lazy.leaks == eager.leaks
    pd.testing.assert_series_equal(lazy.scale.clipped_values, eager.scale.clipped_values)
    pd.testing.assert_series_equal(lazy.scale.source, eager.scale.source)
    if options.get("preprocess") != "bounds":
        _assert_close(lazy.bse, eager.bse)
        _assert_close(lazy.conf_int(), eager.conf_int())
    assert lazy.nobs == eager.nobs


def test_clipped_values_are_counted(frames):
    df, ddf = frames
    tight = {**BOUNDS, "x": (-1.0, 1.0)}
    lazy = _quiet(_model(FORMULA, ddf).fit, **{**FIT, "bounds": tight})
    eager = _quiet(_model(FORMULA, df).fit, **{**FIT, "bounds": tight})
    assert lazy.scale.clipped_values["x"] == eager.scale.clipped_values["x"] > 100
    _assert_close(lazy.params, eager.params)


class _Passes(Callback):
    """Counts the passes over the data: one per ``dask.compute`` (threaded scheduler)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def _start(self, dsk):
        self.count += 1


def test_fit_makes_a_fixed_small_number_of_passes(frames):
    _, ddf = frames
    model = _quiet(DPIV2SLS.from_formula, FORMULA, ddf)
    counts = {}
    for T in (4, 7):
        with _Passes() as passes:
            _quiet(model.fit, **{**FIT, "T": T})
        counts[T] = passes.count
    # preprocessing (1) + the clipping release (1) + one per iteration + the robust meat's two releases
    # (score histogram, meat) and its row source's set-up (1), plus at most 1 set-up pass
    assert counts[7] - counts[4] == 3
    assert counts[4] <= 4 + 6
    with _Passes() as passes:
        _quiet(model.fit, **{**FIT, "T": 4, "cov_type": "unadjusted"})
    assert passes.count <= 4 + 4  # one residual-variance release instead of the meat's three passes


def test_persisted_model_gives_the_same_fit(frames):
    _, ddf = frames
    model = _quiet(DPIV2SLS.from_formula, FORMULA, ddf)
    persisted = model.persist()
    assert persisted.design.nobs == model.design.nobs
    a, b = (_quiet(m.fit, **FIT) for m in (model, persisted))
    _assert_close(a.params, b.params, rtol=1e-12)


def test_local_cluster(frames):
    distributed = pytest.importorskip("distributed")
    df, ddf = frames
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        lazy = _quiet(_model(FORMULA, ddf).fit, **FIT)
        bench = lazy.benchmark
    eager = _quiet(_model(FORMULA, df).fit, **FIT)
    _assert_close(lazy.params, eager.params)
    _assert_close(lazy.bse, eager.bse)
    _assert_close(bench.params, eager.benchmark.params)


def test_dpivreg_works_without_dask():
    """dask is optional: with its import blocked, dpivreg imports and fits in-memory data."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('dask', 'distributed'):\n"
        "            raise ImportError('dask is blocked in this test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import dpivreg, numpy as np, pandas as pd\n"
        "rng = np.random.default_rng(0); z = rng.normal(size=500); x = z + rng.normal(size=500)\n"
        "res = dpivreg.DPIV2SLS(x + rng.normal(size=500), np.ones(500), x, z).fit(\n"
        "    rho1=1, rho2=1, T=3, seed=0, bounds={'dependent': (-9, 9), 'endog': (-9, 9), 'instruments': (-9, 9)})\n"
        "assert np.isfinite(res.params).all() and np.isfinite(res.benchmark.params).all()\n"
        "assert 'dask' not in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_empty_partitions_and_unknown_chunks(frames):
    df, ddf = frames
    holes = ddf.map_partitions(lambda p: p.iloc[:0] if len(p) and p.index[0] == 0 else p)
    lazy = _model(FORMULA, holes).design
    eager = _model(FORMULA, df.iloc[600:]).design
    assert lazy.nobs == eager.nobs
    np.testing.assert_array_equal(lazy.values.compute(), _pandas_values(eager))
    clean = df.dropna().drop(columns=["c", "other"])
    arr = dd.from_pandas(clean, npartitions=3).to_dask_array()  # unknown chunk sizes
    assert np.isnan(arr.chunks[0][0])
    design = DPIV2SLS(arr[:, 0], None, arr[:, 1], arr[:, 2:4]).design
    assert design.nobs == clean.shape[0] and not np.isnan(design.values.chunks[0][0])


def _nbytes(value) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (pd.DataFrame, pd.Series)):
        return int(value.memory_usage(deep=True).sum()) if isinstance(value, pd.DataFrame) else value.nbytes
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 8


def test_no_pass_brings_the_data_to_the_driver(frames, monkeypatch):
    """Every dask.compute of the model returns small sums, never the rows (the data are 3000 × 8)."""
    _, ddf = frames
    sizes = []
    real = dask.compute

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        sizes.append(_nbytes(out))
        return out

    monkeypatch.setattr(dask, "compute", recording)
    res = _quiet(_model(FORMULA, ddf).fit, **FIT)
    res.summary()
    assert len(sizes) >= FIT["T"] + 4
    assert max(sizes) < 3000 * 8 * 8 / 10, sizes


def test_rank_is_judged_like_pandas_for_a_large_offset(frames):
    """1e8 + noise beside the intercept has full rank (pandas' SVD says so; cross-products would not)."""
    df, _ = frames
    df = df.assign(big=1e8 + df["other"])
    ddf = dd.from_pandas(df, npartitions=4)
    lazy = _model("y ~ 1 + big + [x ~ z1 + z2]", ddf).design
    eager = _model("y ~ 1 + big + [x ~ z1 + z2]", df).design
    assert lazy.regressor_names == eager.regressor_names == ["Intercept", "big", "x"]
    assert lazy.data_findings == eager.data_findings == ()
    expect_finding(_model, "column 'big2' is a linear combination", "y ~ 1 + big + big2 + [x ~ z1 + z2]",
                   dd.from_pandas(df.assign(big2=3 * df["big"] - 1), 4))


def test_array_fit_equals_numpy_fit(frames):
    df, _ = frames
    clean = df.dropna()
    values = np.column_stack([clean["y"], np.ones(len(clean)), clean["w"], clean["x"], clean["z1"], clean["z2"]])
    arr = da.from_array(values, chunks=(900, 6))
    bounds = {"dependent": (-20, 20), "exog.1": (-5, 5), "endog": (-10, 10),
              "instruments.0": (-5, 5), "instruments.1": (-5, 5)}
    kwargs = {**FIT, "bounds": bounds}
    lazy = DPIV2SLS(arr[:, 0], arr[:, 1:3], arr[:, 3], arr[:, 4:6], constant="exog.0").fit(**kwargs)
    eager = DPIV2SLS(values[:, 0], values[:, 1:3], values[:, 3], values[:, 4:6], constant="exog.0").fit(**kwargs)
    assert lazy.is_private and lazy.scale.source["exog.0"] == "constant"
    _assert_close(lazy.params, eager.params)
    _assert_close(lazy.bse, eager.bse)
    _assert_close(lazy.benchmark.params, eager.benchmark.params)


def test_formula_variables_from_the_namespace(frames):
    """Scalars and functions of the caller's namespace work per partition; arrays cannot be aligned."""
    df, ddf = frames
    k = 2.5  # noqa: F841 - read by the formula (from this frame: no helper in between)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DroppedRowsWarning)
        lazy = DPIV2SLS.from_formula("y ~ 1 + I(k * w) + [x ~ z1 + z2]", ddf).design
        eager = DPIV2SLS.from_formula("y ~ 1 + I(k * w) + [x ~ z1 + z2]", df).design
    np.testing.assert_array_equal(lazy.values.compute(), _pandas_values(eager))
    extra = np.arange(len(df), dtype=float)  # noqa: F841 - read by the formula
    with pytest.raises(ValueError, match="reads 'extra' from your namespace, a ndarray of 3000 values"):
        DPIV2SLS.from_formula("y ~ 1 + [x ~ z1 + extra]", ddf)


def test_ill_conditioned_design_benchmark_and_data_steps_match_pandas():
    """Review finding: normal equations squared the condition number (benchmark SEs off by 2e-5, the data
    step size by 5e-8). Two instruments that differ by 1e-7 of their scale (condition number ~1e7):
    the TSQR-based benchmark and step sizes now match the pandas path to 1e-9."""
    import pandas as pd

    rng = np.random.default_rng(7)
    n = 2000
    z1 = rng.normal(size=n)
    z2 = z1 + 1e-7 * rng.normal(size=n)
    u = rng.normal(size=n)
    x = z1 + 0.5 * u + rng.normal(size=n)
    df = pd.DataFrame({"y": 1 + 2 * x + u, "x": x, "z1": z1, "z2": z2})
    formula = "y ~ 1 + [x ~ z1 + z2]"
    kw = dict(rho1=1.0, rho2=1.0, T=6, seed=5, preprocess="bounds", inference=False, method="gd",
              bounds={"y": (-20, 20), "x": (-10, 10), "z1": (-5, 5), "z2": (-5, 5)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = DPIV2SLS.from_formula(formula, df).fit(**kw)
        with dask.config.set(scheduler="threads"):
            lazy = DPIV2SLS.from_formula(formula, dd.from_pandas(df, npartitions=3)).fit(**kw)
            bench = lazy.benchmark
    assert lazy.settings.alpha == pytest.approx(eager.settings.alpha, rel=1e-9)
    np.testing.assert_allclose(lazy.params, eager.params, rtol=1e-9)
    np.testing.assert_allclose(bench.params, eager.benchmark.params, rtol=1e-9)
    np.testing.assert_allclose(bench.std_errors, eager.benchmark.std_errors, rtol=1e-9)


def test_repeated_moment_release_equals_pandas(frames):
    """The default's second moment release (when noisy moments are chosen) is the same on Dask as in memory."""
    from dpivreg.estimation.working_scale import repeat_moment_release, working_scale

    df, ddf = frames
    results = []
    for data in (df, ddf):
        model = _model(FORMULA, data)
        rng = np.random.default_rng(3)
        scale = working_scale(model.design, BOUNDS, route="private", rho0=0.2, rng=rng)
        results.append(repeat_moment_release(model.design, scale, rho=1.5, rng=rng))
    lazy, eager = results
    np.testing.assert_allclose(lazy.moments.matrix, eager.moments.matrix, rtol=1e-10, atol=1e-14)
    assert lazy.moments.sigma == pytest.approx(eager.moments.sigma, rel=1e-14)
    assert [r.rho for r in lazy.releases] == pytest.approx([0.2, 1.5], rel=1e-12)


def test_first_stage_statistics_and_anderson_rubin_set_equal_the_in_memory_ones(frames):
    """Post-processing of the moment release, which the Dask pass computes to the in-memory sums' rounding."""
    df, ddf = frames
    lazy = _quiet(_model(FORMULA, ddf).fit, **FIT)
    eager = _quiet(_model(FORMULA, df).fit, **FIT)
    pd.testing.assert_frame_equal(lazy.first_stage_diagnostics, eager.first_stage_diagnostics, rtol=1e-9)
    pd.testing.assert_series_equal(lazy.cragg_donald, eager.cragg_donald, rtol=1e-9)
    np.testing.assert_allclose(lazy.anderson_rubin().intervals, eager.anderson_rubin().intervals, rtol=1e-9)


def test_diagnostic_meat_releases_equal_the_in_memory_ones(frames):
    df, ddf = frames
    lazy = _quiet(_model(FORMULA, ddf).fit, **FIT, rho_diag=0.3)
    eager = _quiet(_model(FORMULA, df).fit, **FIT, rho_diag=0.3)
    assert lazy.privacy.rho == pytest.approx(eager.privacy.rho, rel=1e-12)
    pd.testing.assert_frame_equal(lazy.first_stage_diagnostics, eager.first_stage_diagnostics, rtol=1e-8)
    assert lazy.first_stage_diagnostics["f.dist"].iloc[0].startswith("chi2")
    # the robust endogeneity test's meat, the other half of rho_diag, comes from the Dask blocks too
    assert lazy.wooldridge_score.stat == pytest.approx(eager.wooldridge_score.stat, rel=1e-8)
    np.testing.assert_allclose(lazy._endogeneity_meat.matrix, eager._endogeneity_meat.matrix, rtol=1e-8)


# ----------------------------------------------------------------------------------------
# privacy units (dpivreg.privacy.units): hashed ids, one shuffle, per-partition groups
# ----------------------------------------------------------------------------------------
def _panel_frames(n_units: int = 600, seed: int = 3):
    from dpivreg.datasets import simulate_panel

    panel = simulate_panel(n_units, seed=seed)
    df = panel.data.assign(region=panel.data["unit"] % 7)  # a grouping of the units, for coarser clusters
    return panel, df, dd.from_pandas(df, npartitions=4)


@pytest.mark.parametrize("options", [
    {"privacy_unit": "unit"},
    {"privacy_unit": "unit", "max_rows_per_unit": 3},
    {"privacy_unit": "unit", "clusters": "region"},
    {"privacy_unit": "unit", "cov_type": "robust", "method": "moments"},
    {"clusters": "unit"},
], ids=["unit", "truncated", "coarser-clusters", "robust-moments", "row-level-clusters"])
def test_unit_level_fit_equals_pandas_for_the_same_seed(options):
    """Units spread over every partition (the rows are in random order): the Dask fit groups them by a shuffle and
    must release the same numbers as pandas, to rounding (the sums are added in another order), keep the same
    rows when it truncates (the keys are a function of the seed and the row's position) and make the same
    records; the clustered benchmark is the same too."""
    panel, df, ddf = _panel_frames()
    kwargs = {"rho": 2.0, "bounds": panel.bounds, "seed": 11, **options}
    eager = _quiet(DPIV2SLS.from_formula(panel.formula, df).fit, **kwargs)
    lazy = _quiet(DPIV2SLS.from_formula(panel.formula, ddf).persist().fit, **kwargs)
    _assert_close(lazy.params, eager.params)
    _assert_close(lazy.path, eager.path)
    _assert_close(lazy.bse, eager.bse)
    assert [r.name for r in lazy.privacy.releases] == [r.name for r in eager.privacy.releases]
    assert [r.sensitivity for r in lazy.privacy.releases] == pytest.approx(
        [r.sensitivity for r in eager.privacy.releases], rel=1e-12)
    assert lazy.privacy.rho == pytest.approx(eager.privacy.rho, rel=1e-12)
    assert lazy.nobs == eager.nobs and lazy.n_units == eager.n_units
    assert lazy.scale.units == eager.scale.units
    _assert_close(lazy.benchmark.params, eager.benchmark.params)
    _assert_close(lazy.benchmark.cov, eager.benchmark.cov)


def test_unit_level_dask_fit_without_persist_warns_and_still_agrees():
    """Without persist() every pass repeats the shuffle: the fit says so, and its numbers are the same."""
    panel, df, ddf = _panel_frames(600)
    kwargs = {"rho": 2.0, "bounds": panel.bounds, "seed": 5, "privacy_unit": "unit", "inference": False}
    with pytest.warns(UserWarning, match="persist"):
        lazy = DPIV2SLS.from_formula(panel.formula, ddf).fit(**kwargs)
    eager = _quiet(DPIV2SLS.from_formula(panel.formula, df).fit, **kwargs)
    _assert_close(lazy.params, eager.params)


def test_unit_level_dask_errors_name_the_argument():
    panel, df, ddf = _panel_frames(100)
    model = DPIV2SLS.from_formula(panel.formula, ddf).persist()
    with pytest.raises(ValueError, match="privacy_unit='household'"):
        model.fit(rho=1.0, bounds=panel.bounds, privacy_unit="household")
    with pytest.raises(ValueError, match="column names of that Dask DataFrame"):
        model.fit(rho=1.0, bounds=panel.bounds, privacy_unit=df["unit"].to_numpy())
    mixed = df.assign(region=np.arange(len(df)) % 3)  # units cut across the clusters
    with pytest.raises(ValueError, match="not a grouping of the privacy unit"):
        DPIV2SLS.from_formula(panel.formula, dd.from_pandas(mixed, npartitions=3)).persist().fit(
            rho=1.0, bounds=panel.bounds, privacy_unit="unit", clusters="region")


def test_unit_columns_with_falsy_names_work_on_dask():
    """Integer column names (what dd.from_dask_array gives), 0 among them, as the unit and the clusters."""
    panel, df, _ = _panel_frames(200)
    renamed = df.rename(columns={"unit": 0, "region": 1})
    kwargs = {"rho": 2.0, "bounds": panel.bounds, "seed": 5, "privacy_unit": 0, "clusters": 1, "inference": False}
    lazy = _quiet(DPIV2SLS.from_formula(panel.formula, dd.from_pandas(renamed, npartitions=3)).persist().fit,
                  **kwargs)
    eager = _quiet(DPIV2SLS.from_formula(panel.formula, renamed).fit, **kwargs)
    _assert_close(lazy.params, eager.params)
    assert lazy.scale.units == eager.scale.units


# ----------------------------------------------------------------------------------------
# ids by value and any partition layout (issue 40, item 5)
# ----------------------------------------------------------------------------------------
def test_ids_hash_by_value_whatever_the_partition_dtype():
    """int 3, float 3.0, an object-held 3 and numpy's 3 are one id (as pd.factorize codes a pandas column); the
    string "3", 3.5 and the float whose bits equal an integer id are other ids; missing ids are counted."""
    from dpivreg.data.dask_units import _id_hashes

    def one(values):
        return _id_hashes(pd.Series(values))[0]

    three = one(np.array([3], dtype=np.int64))[0]
    assert one(np.array([3.0]))[0] == three
    assert one(np.array([3], dtype=np.uint8))[0] == three
    assert one(pd.Series([3, "a"], dtype=object))[0] == three
    assert one(pd.Series([np.float32(3.0), "a"], dtype=object))[0] == three
    assert one(np.array([True]))[0] == one(np.array([1]))[0]
    assert one(pd.Series(["3"], dtype=object))[0] != three
    bits = int(np.array([3.5]).view(np.int64)[0])
    assert len({one(np.array([3.5]))[0], one(np.array([bits]))[0], three}) == 3
    hashes, missing = _id_hashes(pd.Series([1.0, np.nan, 2.0, None], dtype=object))
    assert missing == 2 and hashes[0] == one(np.array([1]))[0]
    # exact beyond float64's integers (review: uint64 ids above 2^63 and big Python ints were merged)
    for values, dtype in [([2**63 + 5, 2**63 + 6, 5, 6], "uint64"), ([2**53, 2**53 + 1, 2**63 + 5], "uint64"),
                          ([2**53, 2**53 + 1, 0.5], object), ([2**63 + 1, 2**63 + 2, 3, 2**70], object)]:
        column = pd.Series(values, dtype=dtype)
        assert len(set(_id_hashes(column)[0])) == pd.factorize(column)[1].size == len(values)
    assert one(np.array([2**63 + 5], dtype=np.uint64))[0] == one(pd.Series([2**63 + 5], dtype=object))[0]
    assert one(np.array([2.0**63]))[0] == one(np.array([2**63], dtype=np.uint64))[0]


def _ids_across_partitions():
    """600 units whose rows lie in every partition (ids 0 … 599 repeated), and coarser clusters."""
    panel, df, _ = _panel_frames(600)
    return panel, df.sample(frac=1.0, random_state=0).reset_index(drop=True)


@pytest.mark.parametrize("layout", ["float-in-some-partitions", "from_delayed", "parquet"])
@pytest.mark.parametrize("options", [{"privacy_unit": "unit"}, {"privacy_unit": "unit", "clusters": "region"},
                                     {"clusters": "unit"}], ids=["unit", "unit+clusters", "clusters"])
def test_units_and_clusters_equal_pandas_for_any_partition_layout(layout, options, tmp_path):
    """Ids held as int64 in some partitions and float64 in others are the same units (before: 2N units and other
    clustered standard errors); a ``dd.from_delayed(verify_meta=False)`` frame, the way to hold such partitions,
    fits at all; a parquet frame whose column projection merges partitions groups its rows correctly (before: an
    IndexError). With every budget infinite the fit equals pandas: units, clusters, estimates and SEs."""
    panel, df = _ids_across_partitions()
    floats = df.assign(unit=df["unit"].astype("float64"), region=df["region"].astype("float64"))
    quarters = np.array_split(np.arange(len(df)), 4)
    if layout == "float-in-some-partitions":
        data = dd.from_pandas(df, npartitions=4).map_partitions(
            lambda part: part.astype({"unit": "float64", "region": "float64"}) if part.index[0] % 2 else part,
            meta=df.iloc[:0])
    elif layout == "from_delayed":
        parts = [(floats if i % 2 else df).iloc[rows] for i, rows in enumerate(quarters)]
        data = dd.from_delayed([dask.delayed(p) for p in parts], meta=df.iloc[:0], verify_meta=False)
    else:
        df.to_parquet(tmp_path / "panel.parquet", row_group_size=len(df) // 8)
        data = dd.read_parquet(tmp_path / "panel.parquet", split_row_groups=True)
    kwargs = {"rho1": np.inf, "rho2": np.inf, "rho0": np.inf, "rho_clip": np.inf, "rho_inf": np.inf,
              "bounds": panel.bounds, "seed": 3, **options}
    eager = _quiet(DPIV2SLS.from_formula(panel.formula, df).fit, **kwargs)
    lazy = _quiet(DPIV2SLS.from_formula(panel.formula, data).persist().fit, **kwargs)
    assert lazy.scale.units == eager.scale.units
    _assert_close(lazy.params, eager.params, rtol=1e-8)
    _assert_close(lazy.bse, eager.bse, rtol=1e-8)
