"""Which private IV estimator is most accurate at the same total budget? (issue: a default that wins on accuracy)

Every route spends the same TOTAL zCDP ρ (checked on ``res.privacy.rho`` for every fit):

* ``default``    dpivreg's default (``fit(rho=ρ)``, ``method="auto"``): DP-2S-GD from a warm start on the private
                 moments, with private adaptive clipping by groups, a staggered schedule, step sizes and T from
                 the whitening error — or noisy moments when its pilot releases predict those to be more
                 accurate (:mod:`dpivreg.estimation.selection`);
* ``dp2sgd``     the same DP-2S-GD without the choice (``method="preconditioned"``): the algorithm itself;
* ``moments``    noisy-moment 2SLS, the whole budget on one release (``fit(rho=ρ, method="moments")``),
                 the estimator a user could write in 20 lines, with the tight box sensitivity;
* ``previous``   dpivreg 0.1's default: zero start, the Theorem's clip, η = α = min(1, 6/T), T = 20,
                 uniform schedule, rho0 = 0.1(ρ1 + ρ2), rho_inf = 0.05(ρ1 + ρ2);
* ``rms``        the same with ``clip="rms"`` (3 × the RMS gradient norm of standardised data);
* ``paper``      the paper's practice: exact data moments for centring/whitening and the plain iteration with
                 the data's eigenvalue step sizes, T = 20 (``preprocess="data", method="gd"``: NOT private, a
                 leak of the moments and the step sizes; shown as the paper's own setting).

Designs: the labour-supply data (``weeks ~ 1 + [kids ~ samesex]`` and with age, educ, black, hispan),
noise only (the data are fixed); random subsamples of it (a fresh one per run) of 1,000 and 3,000 rows,
with and without age and educ, as small real surveys with tight bounds; the paper's synthetic design (section 5.1, no
intercept, bounds at ±4 sd) with p = q ∈ {1, 5}, n ∈ {1e3, 1e4, 1e5, 1e6}; a heavy-tailed variant (y = 1 + x + u,
x = 1 + z + v with t₃ errors and 0.2% high-leverage rows |z| ∈ [4, 6]); a weak instrument (first-stage F ≈ 10);
ρ ∈ {0.5, 2, 10}. The synthetic designs draw a fresh data set per run.

Reported per cell and route, over the endogenous coefficients (the causal effects; ``--all`` adds every
coefficient): the median and 90th percentile of |β̂ − β̂_2SLS| in 2SLS (robust) standard errors; the mean of
(β̂ − β̂_2SLS)/private SE (the mean shift); the share of private 95% intervals containing β̂_2SLS and (synthetic
designs) the true β.

Real data (``--real``): nine classic IV specifications on survey data that ship with linearmodels
(``benchmarks/real_specs.py``: Mroz's wage and labour-supply equations, Card's college proximity with one and two
instruments, Sander's fertility, smoking and birth weight, insurance and drug spending with one and two
instruments, returns to schooling in the NLS; n = 428 … 10,089, public bounds from the variables' definitions), the
data fixed and the privacy noise drawn afresh, total ρ ∈ {0.5, 2.6, 10}, 100 seeds per cell. Routes: the default,
``method="moments"``, and three estimators a user could write without dpivreg (``benchmarks/_yardsticks.py``):
textbook sufficient-statistics perturbation with eigenvalues floored at its σ (``ssp``, the yardstick), AdaSSP
(``adassp``) and subsample-and-aggregate 2SLS (``subsample``). Reported per cell and route: the median and 90th
percentile of |β̂ − β̂_2SLS| in 2SLS standard errors and, for dpivreg's routes, the share of private 95% intervals
containing β̂_2SLS, the median private SE over the 2SLS SE, the realised spread of the private estimates
(IQR/1.349, in 2SLS SEs) and the median private SE over 3·√(1 + spread²) (at most 1: the SE is at most three
times the estimator's real error scale).

    python benchmarks/estimator_comparison.py --quick                 # a smoke run (tests run it)
    python benchmarks/estimator_comparison.py --real --out docs/_static/real_iv.csv --tables docs/_static \
        --plot docs/_static/real_iv.png                                  # the real-data tables (about an hour)
    python benchmarks/estimator_comparison.py --out docs/_static/estimator_comparison.csv \
        --tables docs/_static --plot docs/_static/estimator_comparison.png    # the docs' tables (hours)
    python benchmarks/estimator_comparison.py --from-csv docs/_static/estimator_comparison.csv --tables docs/_static
    python benchmarks/estimator_comparison.py --bias --out-bias docs/_static/large_n_bias.csv
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import real_specs
from _reference import two_sls  # the benchmarks' non-private 2SLS
from _yardsticks import YARDSTICKS  # private IV estimators written without dpivreg

from dpivreg import DPIV2SLS, PrivacyLeakWarning
from dpivreg.datasets import LABSUP_BOUNDS, load_labsup, simulate_iv

ROUTES = ("default", "dp2sgd", "moments", "previous", "rms", "paper")
RHOS = (0.5, 2.0, 10.0)
Z95 = 1.959963984540054


@dataclass
class Data:
    """One data set: the model, public bounds, the true β (None for real data) and the 2SLS benchmark."""

    model: DPIV2SLS
    bounds: dict
    beta: np.ndarray | None
    endog: list


# ----------------------------------------------------------------------------------------
# designs
# ----------------------------------------------------------------------------------------
def labsup(covariates: bool) -> Data:
    df = load_labsup()
    extra = ["age", "educ", "black", "hispan"] if covariates else []
    formula = "weeks ~ 1 + " + "".join(f"{c} + " for c in extra) + "[kids ~ samesex]"
    columns = ["weeks", "kids", "samesex", *extra]
    return Data(DPIV2SLS.from_formula(formula, df), {c: LABSUP_BOUNDS[c] for c in columns}, None, ["kids"])


def labsup_subsample(n: int, covariates: bool, seed: int) -> Data:
    df = load_labsup().sample(n, random_state=seed)
    extra = ["age", "educ"] if covariates else []
    formula = "weeks ~ 1 + " + "".join(f"{c} + " for c in extra) + "[kids ~ samesex]"
    columns = ["weeks", "kids", "samesex", *extra]
    return Data(DPIV2SLS.from_formula(formula, df), {c: LABSUP_BOUNDS[c] for c in columns}, None, ["kids"])


def paper(n: int, p: int, seed: int) -> Data:
    sim = simulate_iv(n, p, p, seed=seed)
    x = [f"x{j + 1}" for j in range(p)]
    model = DPIV2SLS(sim.data["y"], None, sim.data[x], sim.data[[f"z{j + 1}" for j in range(p)]])
    return Data(model, sim.bounds, sim.beta, x)


def _intercept_design(n: int, seed: int, *, strength: float, heavy: bool, sd_bound: float) -> Data:
    """y = 1 + x + u, x = 1 + strength·z + v, corr(u, v) = 0.5; normal or t₃ errors (unit variance)."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(n)
    if heavy:
        m = max(1, int(0.002 * n))  # high-leverage rows, still inside the bounds
        z[:m] = rng.choice([-1.0, 1.0], m) * rng.uniform(4.0, 6.0, m)
        draw = lambda: rng.standard_t(3, n) / math.sqrt(3.0)  # noqa: E731
    else:
        draw = lambda: rng.standard_normal(n)  # noqa: E731
    v = draw()
    u = 0.5 * v + math.sqrt(0.75) * draw()
    x = 1.0 + strength * z + v
    y = 1.0 + x + u
    sd_z = 1.0 if not heavy else 1.5
    sd_x = math.sqrt(strength**2 * sd_z**2 + 1.0)
    sd_y = math.sqrt(sd_x**2 + 1.0 + 1.0)
    data = pd.DataFrame({"y": y, "x": x, "z": z})
    bounds = {"z": (-sd_bound * sd_z, sd_bound * sd_z), "x": (1 - sd_bound * sd_x, 1 + sd_bound * sd_x),
              "y": (2 - sd_bound * sd_y, 2 + sd_bound * sd_y)}
    return Data(DPIV2SLS.from_formula("y ~ 1 + [x ~ z]", data), bounds, np.array([1.0, 1.0]), ["x"])


def heavy(n: int, seed: int) -> Data:
    return _intercept_design(n, seed, strength=1.0, heavy=True, sd_bound=6.0)


def weak(n: int, seed: int) -> Data:
    """First-stage F ≈ n·strength² = 10."""
    return _intercept_design(n, seed, strength=math.sqrt(10.0 / n), heavy=False, sd_bound=5.0)


def strong(n: int, seed: int) -> Data:
    """The issue's strong design: y = 1 + x + u, x = 1 + z + v, bounds at ±5 sd."""
    return _intercept_design(n, seed, strength=1.0, heavy=False, sd_bound=5.0)


# ----------------------------------------------------------------------------------------
# routes
# ----------------------------------------------------------------------------------------
def fit(data: Data, route: str, rho: float, seed: int):
    kw = dict(bounds=data.bounds, seed=seed)
    if route == "default":
        return data.model.fit(rho=rho, **kw)
    if route == "dp2sgd":
        return data.model.fit(rho=rho, method="preconditioned", **kw)
    if route == "moments":
        return data.model.fit(rho=rho, method="moments", **kw)
    if route == "paper":
        return data.model.fit(rho=rho, preprocess="data", method="gd", T=20, **kw)
    # dpivreg 0.1's default, with its shares rho0 = 0.1 (rho1 + rho2), rho_inf = 0.05 (rho1 + rho2), and no
    # diagnostics' meats
    stage = rho / 2.3
    return data.model.fit(rho1=stage, rho2=stage, rho0=0.2 * stage, rho_inf=0.1 * stage, rho_diag=0, T=20,
                          init="zero", clip="theorem" if route == "previous" else "rms", **kw)


def one_run(data: Data, rho: float, seed: int, routes=ROUTES) -> list[dict]:
    reference, se = two_sls(data.model)
    names = data.model.design.regressor_names
    rows = []
    for route in routes:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PrivacyLeakWarning)
            warnings.simplefilter("ignore", UserWarning)
            res = fit(data, route, rho, seed)
        assert route == "paper" or math.isclose(res.privacy.rho, rho, rel_tol=1e-9), (route, res.privacy.rho)
        est, bse = res.params.to_numpy(), res.bse.to_numpy()
        lower, upper = est - Z95 * bse, est + Z95 * bse
        for j, name in enumerate(names):
            rows.append({
                "route": route, "coefficient": name, "endogenous": name in data.endog,
                "error_se": abs(est[j] - reference[j]) / se[j], "shift_private_se": (est[j] - reference[j]) / bse[j],
                "covers_2sls": bool(lower[j] <= reference[j] <= upper[j]),
                "covers_true": (bool(lower[j] <= data.beta[j] <= upper[j]) if data.beta is not None else np.nan),
                "width_ratio": 2 * Z95 * bse[j] / (2 * Z95 * se[j]),
            })
    return rows


def summarise(rows: list[dict], design: str, n: int, rho: float, runs: int) -> list[dict]:
    frame = pd.DataFrame(rows)
    out = []
    for (route, endog), part in frame.groupby(["route", "endogenous"]):
        out.append({
            "design": design, "n": n, "total_rho": rho, "route": route,
            "coefficients": "endogenous" if endog else "exogenous", "runs": runs,
            "median_error_se": part.error_se.median(), "p90_error_se": part.error_se.quantile(0.9),
            "mean_shift_private_se": part.shift_private_se.mean(), "cover_2sls": part.covers_2sls.mean(),
            "cover_true": part.covers_true.mean() if part.covers_true.notna().any() else np.nan,
            "median_width_ratio": part.width_ratio.median(),
        })
    return out


def designs(quick: bool):
    """(name, n, maker(run) -> Data, runs, fixed data?) for every design of the comparison."""
    if quick:
        yield "paper p=q=1", 1_000, (lambda r: paper(1_000, 1, r)), 3
        yield "labsup", 31_857, (lambda r, d=labsup(False): d), 3
        return
    yield "labsup", 31_857, (lambda r, d=labsup(False): d), 100
    yield "labsup + covariates", 31_857, (lambda r, d=labsup(True): d), 100
    # 400 runs: the subsamples vary from run to run as well as the noise, and with 100 runs the ratio of two
    # routes' medians moved by ±20% between blocks of runs (n = 3,000, rho = 10: 1.56, 1.01, 1.54, 0.96)
    for n in (1_000, 3_000):
        yield "labsup subsample", n, (lambda r, n=n: labsup_subsample(n, False, r)), 400
        yield "labsup subsample + age, educ", n, (lambda r, n=n: labsup_subsample(n, True, r)), 400
    for p in (1, 5):
        for n, runs in ((1_000, 100), (10_000, 100), (100_000, 50), (1_000_000, 20)):
            yield f"paper p=q={p}", n, (lambda r, n=n, p=p: paper(n, p, r)), runs
    for n, runs in ((1_000, 100), (10_000, 100), (100_000, 50)):
        yield "heavy-tailed", n, (lambda r, n=n: heavy(n, r)), runs
        yield "weak (F = 10)", n, (lambda r, n=n: weak(n, r)), runs


def comparison(quick: bool) -> pd.DataFrame:
    rhos = (2.0,) if quick else RHOS
    records = []
    for name, n, maker, runs in designs(quick):
        start = time.perf_counter()
        rows = {rho: [] for rho in rhos}
        for run in range(runs):
            data = maker(run)
            for rho in rhos:
                rows[rho].extend(one_run(data, rho, seed=10_000 + run))
        for rho in rhos:
            records.extend(summarise(rows[rho], name, n, rho, runs))
        print(f"{name}, n = {n}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return pd.DataFrame(records)


def wide(table: pd.DataFrame, value: str = "median_error_se", coefficients: str = "endogenous") -> pd.DataFrame:
    part = table[table.coefficients == coefficients]
    out = part.pivot_table(index=["design", "n", "total_rho"], columns="route", values=value, sort=False)
    return out[[r for r in ROUTES if r in out.columns]]


# ----------------------------------------------------------------------------------------
# the bias study: fixed data, many seeds, n up to 1e7
# ----------------------------------------------------------------------------------------
def bias_study(quick: bool) -> pd.DataFrame:
    """Mean of (β̂ − β̂_2SLS) in private SEs over seeds with the data fixed, at the default T and at 3× it,
    and how often the private interval contains β̂_2SLS (the privacy noise is the only randomness).

    The fits use ``method="preconditioned"``: the DP-2S-GD branch of the default, whose optimisation bias
    is the question (noisy moments, which ``method="auto"`` may pick instead, have no iteration)."""
    ns = (100_000,) if quick else (100_000, 1_000_000, 10_000_000)
    seeds = 5 if quick else 40
    records = []
    for n in ns:
        data = strong(n, seed=7)
        reference, se = two_sls(data.model)
        runs: dict[int, list] = {1: [], 3: []}
        for s in range(seeds):
            T = None
            for multiple in (1, 3):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    res = data.model.fit(rho1=1, rho2=1, T=None if T is None else multiple * T,
                                         bounds=data.bounds, method="preconditioned", seed=s)
                T = res.settings.T if T is None else T
                runs[multiple].append((res.settings.T, res.params.to_numpy(), res.bse.to_numpy()))
        for multiple, fits in runs.items():
            Ts = sorted({t for t, _, _ in fits})
            est = np.array([e for _, e, _ in fits])
            bse = np.array([b for _, _, b in fits])
            shifts, errors = (est - reference) / bse, np.abs(est - reference) / se
            covers = np.abs(est - reference) <= Z95 * bse
            for j, name in enumerate(data.model.design.regressor_names):
                records.append({
                    "n": n, "T": "/".join(map(str, Ts)), "T_multiple": multiple, "coefficient": name,
                    "seeds": seeds, "mean_shift_private_se": shifts[:, j].mean(),
                    "se_of_mean_shift": shifts[:, j].std(ddof=1) / math.sqrt(seeds),
                    "median_error_2sls_se": float(np.median(errors[:, j])), "cover_2sls": covers[:, j].mean(),
                })
        print(f"bias study n = {n} done", file=sys.stderr, flush=True)
    return pd.DataFrame(records)


def write_tables(table: pd.DataFrame, directory: Path) -> None:
    """The docs' tables: median and 90th-percentile error (endogenous coefficients) by cell and route, and
    the intervals' coverage and mean shift for the default and noisy moments."""
    directory.mkdir(parents=True, exist_ok=True)
    for value, name in (("median_error_se", "median"), ("p90_error_se", "p90")):
        out = wide(table, value).round(4)
        out["default / moments"] = (out["default"] / out["moments"]).round(3)
        out.reset_index().to_csv(directory / f"estimator_comparison_{name}.csv", index=False)
    part = table[(table.coefficients == "endogenous") & table.route.isin(["default", "moments", "dp2sgd"])]
    cover = part.pivot_table(index=["design", "n", "total_rho"], columns="route", sort=False,
                             values=["cover_2sls", "cover_true", "mean_shift_private_se"])
    cover.columns = [f"{value} ({route})" for value, route in cover.columns]
    cover.round(3).reset_index().to_csv(directory / "estimator_comparison_inference.csv", index=False)


def plot(table: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    synthetic = table[(table.coefficients == "endogenous") & table.design.str.startswith("paper")]
    fig, axes = plt.subplots(2, 3, figsize=(12, 7), sharex=True, sharey="row")
    for row, design in enumerate(("paper p=q=1", "paper p=q=5")):
        for col, rho in enumerate(RHOS):
            ax = axes[row, col]
            cell = synthetic[(synthetic.design == design) & (synthetic.total_rho == rho)]
            for route in ROUTES:
                line = cell[cell.route == route].sort_values("n")
                ax.loglog(line.n, line.median_error_se, marker="o", label=route)
            ax.set_title(f"{design}, total rho = {rho:g}")
            ax.grid(True, which="both", alpha=0.3)
            if col == 0:
                ax.set_ylabel("median |beta - 2SLS| / 2SLS s.e.")
            if row == 1:
                ax.set_xlabel("n")
    axes[0, 0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ----------------------------------------------------------------------------------------
# real data: classic specifications, the data fixed, the privacy noise drawn afresh
# ----------------------------------------------------------------------------------------
REAL_RHOS = (0.5, 2.6, 10.0)
REAL_ROUTES = ("default", "moments", *YARDSTICKS)
REAL_SEEDS = 100
_REAL_CACHE: dict = {}


def real_data(name: str):
    """(model, bounds, endogenous positions, 2SLS estimate and robust SE of the endogenous coefficients)."""
    if name not in _REAL_CACHE:
        spec = next(s for s in real_specs.SPECS if s.name == name)
        model = DPIV2SLS.from_formula(spec.formula, real_specs.load(spec))
        reference, se = two_sls(model)
        endog = [model.design.regressor_names.index(c) for c in model.design.endog_names]
        _REAL_CACHE[name] = (model, spec.all_bounds(), endog, reference[endog], se[endog])
    return _REAL_CACHE[name]


def real_run(job: tuple) -> list[dict]:
    """Every route on one specification at one total ρ and seed."""
    name, rho, seed, routes = job
    model, bounds, endog, reference, se = real_data(name)
    rows = []
    for route in routes:
        bse = np.full(len(endog), np.nan)
        if route in YARDSTICKS:
            estimate = YARDSTICKS[route](model, bounds, rho, seed)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                options = {"method": "moments"} if route == "moments" else {}
                res = model.fit(rho=rho, bounds=bounds, seed=seed, **options)
            assert math.isclose(res.privacy.rho, rho, rel_tol=1e-9), (route, res.privacy.rho)
            estimate, bse = res.params.to_numpy()[endog], res.bse.to_numpy()[endog]
        for j in range(len(endog)):
            shift = (estimate[j] - reference[j]) / se[j]
            rows.append({"design": name, "n": model.design.nobs, "total_rho": rho, "seed": seed, "route": route,
                         "shift_2sls_se": shift, "error_se": abs(shift), "se_ratio": bse[j] / se[j],
                         "covers_2sls": abs(shift) <= Z95 * bse[j] / se[j] if np.isfinite(bse[j]) else np.nan})
    return rows


def real_comparison(*, seeds: int = REAL_SEEDS, jobs: int = 2, quick: bool = False) -> pd.DataFrame:
    """Per fit: every specification × total ρ × seed × route (in ``jobs`` processes)."""
    names = [s.name for s in real_specs.SPECS][:2] if quick else [s.name for s in real_specs.SPECS]
    rhos = (2.6,) if quick else REAL_RHOS
    work = [(name, rho, 20_000 + seed, REAL_ROUTES) for name in names for rho in rhos for seed in range(seeds)]
    if jobs > 1:
        from multiprocessing import Pool

        with Pool(jobs) as pool:
            rows = [row for part in pool.imap_unordered(real_run, work, chunksize=4) for row in part]
    else:
        rows = [row for job in work for row in real_run(job)]
    return pd.DataFrame(rows)


def summarise_real(fits: pd.DataFrame) -> pd.DataFrame:
    """Per specification, ρ and route: the error's median and 90th percentile, and for dpivreg's routes the
    intervals' coverage of β̂_2SLS, the median SE over the 2SLS SE, the realised spread (IQR/1.349) and the median SE
    over 3·√(1 + spread²), all in 2SLS SEs."""
    def cell(part: pd.DataFrame) -> pd.Series:
        spread = (part.shift_2sls_se.quantile(0.75) - part.shift_2sls_se.quantile(0.25)) / 1.349
        se = part.se_ratio.median()
        return pd.Series({"seeds": part.seed.nunique(), "median_error_se": part.error_se.median(),
                          "p90_error_se": part.error_se.quantile(0.9), "cover_2sls": part.covers_2sls.mean(),
                          "median_se_over_2sls_se": se, "spread_se": spread, "median_se_over_spread": se / spread,
                          "se_criterion": se / (3.0 * math.sqrt(1.0 + spread**2))})

    table = fits.groupby(["design", "n", "total_rho", "route"], sort=False).apply(cell, include_groups=False)
    return table.reset_index()


def real_verdict(table: pd.DataFrame) -> pd.DataFrame:
    """Per ρ, the default against the yardstick: geometric mean and largest ratio of the median errors, the
    specifications on which the default's median is at most the yardstick's, the largest ratio of the 90th
    percentiles, and the default's smallest coverage and largest SE criterion."""
    wide = table.pivot_table(index=["design", "total_rho"], columns="route", sort=False,
                             values=["median_error_se", "p90_error_se", "cover_2sls", "se_criterion"])
    ratio = wide["median_error_se"]["default"] / wide["median_error_se"]["ssp"]
    tail = wide["p90_error_se"]["default"] / wide["p90_error_se"]["ssp"]
    by = ratio.groupby(level="total_rho")
    return pd.DataFrame({"geometric_mean_median_ratio": np.exp(np.log(ratio).groupby(level="total_rho").mean()),
                         "largest_median_ratio": by.max(),
                         "specs_at_most_ssp": (ratio <= 1).groupby(level="total_rho").sum(),
                         "specs": by.size(), "largest_p90_ratio": tail.groupby(level="total_rho").max(),
                         "smallest_cover": wide["cover_2sls"]["default"].groupby(level="total_rho").min(),
                         "largest_se_criterion": wide["se_criterion"]["default"].groupby(level="total_rho").max()})


def write_real_tables(table: pd.DataFrame, directory: Path) -> None:
    """The docs' real-data tables: median and 90th-percentile error by specification, ρ and route, with the
    default's ratio to the yardstick; the inference columns of dpivreg's routes; the verdict per ρ."""
    directory.mkdir(parents=True, exist_ok=True)
    for value, name in (("median_error_se", "median"), ("p90_error_se", "p90")):
        out = table.pivot_table(index=["design", "n", "total_rho"], columns="route", values=value, sort=False)
        out = out[list(REAL_ROUTES)].round(3)
        out["default / ssp"] = (out["default"] / out["ssp"]).round(3)
        out.reset_index().to_csv(directory / f"real_iv_{name}.csv", index=False)
    columns = ["cover_2sls", "median_se_over_2sls_se", "spread_se", "median_se_over_spread", "se_criterion"]
    part = table[table.route.isin(["default", "moments"])]
    part[["design", "n", "total_rho", "route", *columns]].round(3).to_csv(directory / "real_iv_inference.csv",
                                                                         index=False)
    real_verdict(table).round(3).reset_index().to_csv(directory / "real_iv_verdict.csv", index=False)


def plot_real(table: pd.DataFrame, path: Path) -> None:
    """Median error (2SLS SEs, log scale) by specification, one panel per ρ, a marker per route."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    names = list(dict.fromkeys(table.design))
    rhos = sorted(table.total_rho.unique())
    fig, axes = plt.subplots(1, len(rhos), figsize=(5 * len(rhos), 5.5), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, rho in zip(axes, rhos):
        cell = table[table.total_rho == rho]
        for offset, route in enumerate(REAL_ROUTES):
            values = cell[cell.route == route].set_index("design").reindex(names).median_error_se
            ax.scatter(values, np.arange(len(names)) + 0.12 * (offset - 2), label=route, s=22)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"total rho = {rho:g}")
        ax.set_xlabel("median |beta - 2SLS| / 2SLS s.e.")
        ax.grid(True, which="both", axis="x", alpha=0.3)
    axes[0].set_yticks(np.arange(len(names)), names)
    axes[0].invert_yaxis()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: two small designs, 3 runs")
    parser.add_argument("--out", help="write the comparison table as CSV here")
    parser.add_argument("--plot", help="write the synthetic designs' figure (PNG) here")
    parser.add_argument("--tables", help="write the docs' summary tables (CSV) into this directory")
    parser.add_argument("--from-csv", help="summarise an earlier run's --out CSV instead of running")
    parser.add_argument("--bias", action="store_true", help="run the large-n bias study instead")
    parser.add_argument("--out-bias", help="write the bias study as CSV here")
    parser.add_argument("--real", action="store_true", help="the real-data specifications instead")
    parser.add_argument("--seeds", type=int, default=REAL_SEEDS, help="seeds per real-data cell")
    parser.add_argument("--jobs", type=int, default=2, help="processes for the real-data runs")
    args = parser.parse_args()
    pd.set_option("display.width", 200)
    if args.real:
        start = time.perf_counter()
        fits = pd.read_csv(args.from_csv) if args.from_csv else real_comparison(seeds=args.seeds, jobs=args.jobs,
                                                                                 quick=args.quick)
        table = summarise_real(fits)
        for value in ("median_error_se", "p90_error_se"):
            print(f"\n{value} (endogenous coefficients)")
            print(table.pivot_table(index=["design", "total_rho"], columns="route", values=value,
                                    sort=False)[list(REAL_ROUTES)].round(3).to_string())
        print("\ninference (dpivreg's routes)")
        print(table[table.route.isin(["default", "moments"])].set_index(["design", "total_rho", "route"])[
            ["cover_2sls", "median_se_over_2sls_se", "spread_se", "se_criterion"]].round(3).to_string())
        print("\nthe default against textbook SSP, per total rho")
        print(real_verdict(table).round(3).to_string())
        print(f"\n{time.perf_counter() - start:.0f} s")
        _write_outputs(args, fits, table, write_real_tables, plot_real)
        return
    if args.bias:
        table = bias_study(args.quick)
        print(table.round(3).to_string(index=False))
        if args.out_bias:
            table.round(4).to_csv(args.out_bias, index=False)  # the docs show the CSV as a table
        return
    start = time.perf_counter()
    table = pd.read_csv(args.from_csv) if args.from_csv else comparison(args.quick)
    for value in ("median_error_se", "p90_error_se", "mean_shift_private_se", "cover_2sls", "cover_true"):
        print(f"\n{value} (endogenous coefficients)")
        print(wide(table, value).round(3).to_string())
    ratio = wide(table)["default"] / wide(table)["moments"]
    print("\nmedian error, default / moments:")
    print(ratio.round(3).to_string())
    print(f"\n{time.perf_counter() - start:.0f} s")
    _write_outputs(args, table, table, write_tables, plot)


def _write_outputs(args, raw: pd.DataFrame, table: pd.DataFrame, write, draw) -> None:
    """``--out`` (the raw results), ``--tables`` and ``--plot``, as asked."""
    if args.out:
        raw.to_csv(args.out, index=False)
    if args.tables:
        write(table, Path(args.tables))
    if args.plot:
        draw(table, Path(args.plot))


if __name__ == "__main__":
    main()
