"""Accuracy of the planned private standard errors (``dpivreg.plan_se``; issues 16 and 42).

For each cell (a design, n and a total ρ) the plan of every coefficient, from public inputs and guesses only, is
compared with R repeated private fits ``DPIV2SLS.from_formula(...).fit(rho=ρ, bounds=..., seed=...)``, each with a
fresh data draw and fresh privacy noise:

* the planned robust spread against the realised IQR/1.349 of the R estimates (``spread_ratio``; target 0.75–1.25;
  the realised spread's Monte Carlo standard error is 1.166·spread/√R, 5.8% of it at R = 400);
* the planned SE against the realised standard deviation (``ratio``; its Monte Carlo error about SD/√(2R) for
  normal estimates, more with heavy tails);
* the plan with only what ``plan_se`` requires (bounds, each regressor's and instrument's mean and SD, the
  first-stage F) against the median SE the real fits report (``bounds_ratio``; target at least 0.8).

Designs (the data generators below are written independently of the planner's synthetic population; the
guesses passed to the planner are the population's moments, read off a pilot draw of 2·10⁶ rows, i.e. what
a user who knew the population's summary statistics would pass):

``strong, just-id``
    The paper's design with p = q = 1 (no intercept, as in the paper): x = 5z + c + e_x, y = x + c + e_y,
    c, e standard normal; bounds at ±4 population SDs. First-stage partial R² 0.93.
``moderate, exog``
    y ~ 1 + w1 + w2 + [x ~ z]: w1 uniform on [0, 10] (the planner draws normals), w2 binary (share 0.3),
    x = 1 + 0.1·w1 + 0.15z + v (partial R² about 0.02; x correlated with w1, which the planner ignores),
    y = 1 + 0.5x + 0.2w1 + w2 + 2u, corr(u, v) = 0.5.
``over-id, binary z``
    y ~ 1 + w1 + [x ~ z1 + z2 + z3]: three binary instruments with shares 0.5, 0.3, 0.5 and unequal
    first-stage coefficients (0.2, 0.1, 0.05; the planner spreads the strength equally), partial R² about
    0.02, w1 normal, t₅ structural errors (the planner draws normal ones).
``two endog``
    y ~ 1 + [x1 + x2 ~ z1 + z2 + z3]: a full first-stage matrix with cross-loadings (the planner assigns
    each instrument to one endogenous regressor), partial R² about 0.2 and 0.1.
``labsup``
    ``weeks ~ 1 + educ + age + [kids ~ samesex]`` on the Angrist–Evans labour-supply data; each run
    resamples its 31,857 rows with replacement (the empirical distribution is the population). The guesses
    are what a user has before access: the public bounds (``LABSUP_BOUNDS``), the published summary table's
    means and SDs (weeks 22.7 / 22.6, kids 2.75 / 0.98, educ 11.0 / 3.3, age 29.7 / 3.6, a same-sex share of
    0.50), the regressors' correlations (educ–kids −0.27, age–kids 0.17, educ–age 0.12, rounded from the
    data set's published summary; a census tabulation would give them too) and a first-stage coefficient of samesex on
    kids of about 0.07 children (the order of magnitude Angrist and Evans report), i.e. a partial R² of
    0.07²·0.25/0.98² = 0.0013.

    python benchmarks/plan_accuracy.py                                # R = 400 per cell, CSV to a temp dir
    python benchmarks/plan_accuracy.py --jobs 2 --outdir docs/_static # the docs' table (plan_accuracy.csv)
    python benchmarks/plan_accuracy.py --quick                        # a smoke run (R = 20, two small cells)
    python benchmarks/plan_accuracy.py --jobs 2                       # cells on two processes

Each worker runs with one thread (set OMP_NUM_THREADS=1 for the parent).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dpivreg import DPIV2SLS, PlanningWarning, plan_se
from dpivreg.datasets import LABSUP_BOUNDS, load_labsup
from dpivreg.estimation.moments import iqr_scale

COLUMNS = ["design", "n", "rho", "coefficient", "endogenous", "planned_se", "planned_sampling", "planned_noise",
           "planned_spread", "p_near_singular", "planned_se_bounds", "realised_sd", "mc_se", "ratio", "ratio_mc_se",
           "within_25pct", "realised_spread", "spread_mc_se", "spread_ratio", "spread_within_25pct",
           "median_reported_se", "bounds_ratio", "realised_far", "mean_reported_se", "runs", "plan_seconds",
           "run_seconds"]


# --------------------------------------------------------------------------------------------------
# The data generating processes (independent of dpivreg.planning)
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Design:
    name: str
    formula: str
    exog: tuple[str, ...]
    endog: tuple[str, ...]
    instruments: tuple[str, ...]
    dependent: str = "y"

    def draw(self, n: int, rng: np.random.Generator) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
        """Data, the structural error and the first-stage errors (the last two only for the guesses)."""
        raise NotImplementedError

    def bounds(self) -> dict:
        raise NotImplementedError


class Strong(Design):
    def draw(self, n, rng):
        z, c, ex, ey = (rng.standard_normal(n) for _ in range(4))
        x = 5.0 * z + c + ex
        y = x + c + ey
        return pd.DataFrame({"y": y, "x": x, "z": z}), c + ey, (c + ex)[:, None]

    def bounds(self):
        sx = math.sqrt(27.0)
        sy = math.sqrt(27.0 + 2 * 1 + 1 + 1)  # var(x) + 2cov(x, c) + var(c) + var(e_y)
        return {"y": (-4 * sy, 4 * sy), "x": (-4 * sx, 4 * sx), "z": (-4.0, 4.0)}


class Moderate(Design):
    def draw(self, n, rng):
        w1 = rng.uniform(0, 10, n)
        w2 = (rng.random(n) < 0.3).astype(float)
        z = rng.standard_normal(n)
        v = rng.standard_normal(n)
        u = 0.5 * v + math.sqrt(0.75) * rng.standard_normal(n)
        x = 1 + 0.1 * w1 + 0.15 * z + v
        y = 1 + 0.5 * x + 0.2 * w1 + w2 + 2 * u
        return pd.DataFrame({"y": y, "w1": w1, "w2": w2, "x": x, "z": z}), 2 * u, v[:, None]

    def bounds(self):
        return {"y": (-10.0, 16.0), "w1": (0.0, 10.0), "w2": (0.0, 1.0), "x": (-5.0, 7.0), "z": (-5.0, 5.0)}


class OverId(Design):
    def draw(self, n, rng):
        shares, gammas = (0.5, 0.3, 0.5), (0.2, 0.1, 0.05)
        zs = [(rng.random(n) < s).astype(float) for s in shares]
        w1 = 5 + 2 * rng.standard_normal(n)
        v = rng.standard_normal(n)
        t5 = rng.standard_t(5, n) / math.sqrt(5 / 3)
        u = 0.5 * v + math.sqrt(0.75) * t5
        x = 2 + sum(g * z for g, z in zip(gammas, zs)) + v
        y = 3 - 1.0 * x + 0.3 * w1 + 1.5 * u
        frame = pd.DataFrame({"y": y, "w1": w1, "x": x, "z1": zs[0], "z2": zs[1], "z3": zs[2]})
        return frame, 1.5 * u, v[:, None]

    def bounds(self):
        return {"y": (-10.0, 14.0), "w1": (-5.0, 15.0), "x": (-3.0, 7.0), "z1": (0.0, 1.0), "z2": (0.0, 1.0),
                "z3": (0.0, 1.0)}


class TwoEndog(Design):
    THETA = np.array([[0.5, 0.15], [0.1, 0.35], [0.2, 0.15]])

    def draw(self, n, rng):
        Z = rng.standard_normal((n, 3))
        V = rng.standard_normal((n, 2))
        u = 0.4 * V[:, 0] + 0.4 * V[:, 1] + math.sqrt(1 - 0.32) * rng.standard_normal(n)
        X = Z @ self.THETA + V
        y = 1 + X[:, 0] - 0.5 * X[:, 1] + u
        frame = pd.DataFrame({"y": y, "x1": X[:, 0], "x2": X[:, 1], "z1": Z[:, 0], "z2": Z[:, 1], "z3": Z[:, 2]})
        return frame, u, V

    def bounds(self):
        return {"y": (-8.0, 10.0), "x1": (-6.0, 6.0), "x2": (-6.0, 6.0), "z1": (-5.0, 5.0), "z2": (-5.0, 5.0),
                "z3": (-5.0, 5.0)}


DESIGNS = {
    "strong, just-id": Strong("strong, just-id", "y ~ [x ~ z]", (), ("x",), ("z",)),
    "moderate, exog": Moderate("moderate, exog", "y ~ 1 + w1 + w2 + [x ~ z]", ("w1", "w2"), ("x",), ("z",)),
    "over-id, binary z": OverId("over-id, binary z", "y ~ 1 + w1 + [x ~ z1 + z2 + z3]", ("w1",), ("x",),
                                ("z1", "z2", "z3")),
    "two endog": TwoEndog("two endog", "y ~ 1 + [x1 + x2 ~ z1 + z2 + z3]", (), ("x1", "x2"), ("z1", "z2", "z3")),
}

LABSUP_FORMULA = "weeks ~ 1 + educ + age + [kids ~ samesex]"
LABSUP_GUESSES = {
    "means": {"weeks": 22.7, "kids": 2.75, "samesex": 0.50, "educ": 11.0, "age": 29.7},
    "sds": {"weeks": 22.6, "kids": 0.98, "educ": 3.3, "age": 3.6},
    "first_stage_r2": 0.07**2 * 0.25 / 0.98**2,
    "corr": {("educ", "kids"): -0.27, ("age", "kids"): 0.17, ("educ", "age"): 0.12},
}

#: An estimate "lands far" when it is more than FAR realised spreads from the realised median.
FAR = 5.0
#: Monte Carlo standard error of a sample IQR/1.349 of normal draws, in units of σ/√R (asymptotic quantile variance:
#: √(0.25 / φ(0.6745)²) / 1.349).
SPREAD_MC = 1.166

CELLS = [
    ("strong, just-id", 10_000, 0.1), ("strong, just-id", 10_000, 1.0), ("strong, just-id", 100_000, 10.0),
    ("strong, just-id", 1_000_000, 1.0),
    ("moderate, exog", 10_000, 1.0), ("moderate, exog", 100_000, 0.1), ("moderate, exog", 100_000, 10.0),
    ("moderate, exog", 1_000_000, 1.0),
    ("over-id, binary z", 10_000, 10.0), ("over-id, binary z", 100_000, 1.0), ("over-id, binary z", 1_000_000, 0.1),
    ("two endog", 10_000, 1.0), ("two endog", 100_000, 0.1), ("two endog", 100_000, 10.0),
    ("labsup", 31_857, 0.1), ("labsup", 31_857, 1.0), ("labsup", 31_857, 10.0),
]
QUICK_CELLS = [("moderate, exog", 10_000, 1.0), ("labsup", 31_857, 2.6)]


def population_guesses(design: Design, *, pilot: int = 2_000_000, seed: int = 12345) -> dict:
    """The guesses a user who knew the population would pass: its moments, read off a large pilot draw."""
    data, u, V = design.draw(pilot, np.random.default_rng(seed))
    names = (design.dependent, *design.exog, *design.endog, *design.instruments)
    bounds = design.bounds()
    binary = {c for c in names if bounds[c] == (0.0, 1.0) and set(np.unique(data[c])) <= {0.0, 1.0}}
    means = {c: float(data[c].mean()) for c in names}
    sds = {c: float(data[c].std()) for c in names if c not in binary}
    # partial R² of the instruments for each endogenous regressor, given the exogenous ones
    W = np.column_stack([np.ones(pilot), *(data[c].to_numpy() for c in design.exog)])
    Zf = np.column_stack([W, *(data[c].to_numpy() for c in design.instruments)])
    r2, weights = {}, {}
    for e in design.endog:
        x = data[e].to_numpy()
        fits = [np.linalg.lstsq(M, x, rcond=None)[0] for M in (W, Zf)]
        rss = [np.sum((x - M @ b) ** 2) for M, b in zip((W, Zf), fits)]
        r2[e] = float(1 - rss[1] / rss[0])
        # the first stage's direction in the standardised instruments: coefficient × the instrument's SD
        weights[e] = {z: float(b * data[z].std()) for z, b in zip(design.instruments, fits[1][W.shape[1]:])}
    endogeneity = float(np.mean([np.corrcoef(u, V[:, j])[0, 1] for j in range(V.shape[1])]))
    # the true coefficients, from the structural equation: regress y - u on the regressors
    R = np.column_stack([np.ones(pilot), *(data[c].to_numpy() for c in (*design.exog, *design.endog))])
    beta = np.linalg.lstsq(R, data[design.dependent].to_numpy() - u, rcond=None)[0]
    coef = dict(zip((*design.exog, *design.endog), map(float, beta[1:])))
    corr = {}
    for i, a in enumerate(design.exog):
        for b in (*design.exog[i + 1:], *design.endog):
            if b in design.exog and (a in binary or b in binary):
                continue
            corr[(a, b)] = float(np.corrcoef(data[a], data[b])[0, 1])
    return {"means": means, "sds": {k: v for k, v in sds.items() if k != design.dependent}, "first_stage_r2": r2,
            "error_sd": float(np.std(u)), "endogeneity": endogeneity, "coef": coef, "corr": corr,
            "first_stage_weights": weights}


# --------------------------------------------------------------------------------------------------
# One cell
# --------------------------------------------------------------------------------------------------

def _fit(formula: str, data: pd.DataFrame, rho: float, bounds: dict, seed: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return DPIV2SLS.from_formula(formula, data).fit(rho=rho, bounds=bounds, seed=seed)


def bounds_only_guesses(guesses: dict, population, n: int) -> dict:
    """The least a plan accepts: each regressor's and instrument's mean and SD (a binary one's share), the public
    bounds and the first-stage F; the outcome's moments, correlations, first-stage directions and endogeneity left
    to plan_se's defaults (the outcome at the largest SD its bounds allow)."""
    exog, endog, instruments = population.exog, population.endog, population.instruments
    intercept = population.intercept
    required = [*exog, *endog, *instruments]
    r2 = guesses["first_stage_r2"]
    r2 = r2 if isinstance(r2, dict) else {e: r2 for e in endog}
    dof = n - len(instruments) - len(exog) - int(intercept)
    f = {e: value * dof / (len(instruments) * (1 - value)) for e, value in r2.items()}
    return {"means": {v: m for v, m in guesses["means"].items() if v in required},
            "sds": {v: m for v, m in guesses["sds"].items() if v in required}, "first_stage_f": f}


def run_cell(design_name: str, n: int, rho: float, runs: int, seed: int = 20260101, draws: int = 2) -> pd.DataFrame:
    """Planned against realised private SE and spread for one cell (one row per coefficient)."""
    rng = np.random.default_rng([seed, n, int(rho * 1000), len(design_name)])
    if design_name == "labsup":
        df = load_labsup()
        formula, bounds = LABSUP_FORMULA, LABSUP_BOUNDS
        guesses = LABSUP_GUESSES

        def draw():
            return df.iloc[rng.integers(0, len(df), n)].reset_index(drop=True)
    else:
        design = DESIGNS[design_name]
        formula, bounds = design.formula, design.bounds()
        guesses = population_guesses(design)

        def draw():
            return design.draw(n, rng)[0]

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanningWarning)  # the table reports what the warnings are about
        planned = plan_se(formula, n=n, rho=rho, bounds=bounds, draws=draws, seed=seed, **guesses)
        worst = plan_se(formula, n=n, rho=rho, bounds=bounds, draws=draws, seed=seed,
                        **bounds_only_guesses(guesses, planned.population, n))
    plan_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    estimates, reported = [], []
    for r in range(runs):
        res = _fit(formula, draw(), rho, bounds, seed + 1 + r)
        estimates.append(res.params.to_numpy())
        reported.append(res.bse.to_numpy())
    run_seconds = time.perf_counter() - t0
    estimates, reported = np.array(estimates), np.array(reported)
    sd = estimates.std(axis=0, ddof=1)
    mc = sd / math.sqrt(2 * runs)
    spread = iqr_scale(estimates)
    q50 = np.median(estimates, axis=0)
    far = np.mean(np.abs(estimates - q50) > FAR * spread, axis=0)
    median_se = np.median(reported, axis=0)
    endog = set(planned.population.endog)
    rows = []
    for j, name in enumerate(planned.se.index):
        ratio = planned.se[name] / sd[j]
        spread_ratio = planned.spread[name] / spread[j]
        rows.append({
            "design": design_name, "n": n, "rho": rho, "coefficient": name, "endogenous": name in endog,
            "planned_se": planned.se[name], "planned_sampling": planned.se_sampling[name],
            "planned_noise": planned.se_noise[name], "planned_spread": planned.spread[name],
            "p_near_singular": planned.p_near_singular, "planned_se_bounds": worst.se[name],
            "realised_sd": sd[j], "mc_se": mc[j], "ratio": ratio, "ratio_mc_se": ratio / math.sqrt(2 * runs),
            "within_25pct": bool(0.75 <= ratio <= 1.25), "realised_spread": spread[j],
            "spread_mc_se": SPREAD_MC * spread[j] / math.sqrt(runs), "spread_ratio": spread_ratio,
            "spread_within_25pct": bool(0.75 <= spread_ratio <= 1.25), "median_reported_se": median_se[j],
            "bounds_ratio": worst.se[name] / median_se[j], "realised_far": far[j],
            "mean_reported_se": float(np.sqrt(np.mean(reported[:, j] ** 2))),
            "runs": runs, "plan_seconds": plan_seconds, "run_seconds": run_seconds,
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def _run(args):
    return run_cell(*args)


def accuracy(*, quick: bool = False, runs: int | None = None, jobs: int = 1, cells=None) -> pd.DataFrame:
    """Every cell of the study (``quick``: two small cells, R = 20)."""
    cells = list(cells if cells is not None else (QUICK_CELLS if quick else CELLS))
    runs = runs if runs is not None else (20 if quick else 400)
    tasks = [(d, n, rho, runs) for d, n, rho in cells]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            parts = list(pool.map(_run, tasks))
    else:
        parts = [_run(t) for t in tasks]
    return pd.concat(parts, ignore_index=True)


def docs_table(table: pd.DataFrame) -> pd.DataFrame:
    """The docs' columns, rounded."""
    out = table[["design", "n", "rho", "coefficient", "planned_se", "realised_sd", "ratio", "planned_spread",
                 "realised_spread", "spread_ratio", "spread_mc_se", "p_near_singular", "realised_far",
                 "planned_se_bounds", "median_reported_se", "bounds_ratio", "runs"]].copy()
    for c in ("planned_se", "realised_sd", "planned_spread", "realised_spread", "spread_mc_se", "planned_se_bounds",
              "median_reported_se"):
        out[c] = out[c].map(lambda v: float(f"{v:.4g}"))
    for c in ("ratio", "spread_ratio", "bounds_ratio", "p_near_singular", "realised_far"):
        out[c] = out[c].round(3)
    return out


def main(argv=None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two small cells with R = 20")
    parser.add_argument("--runs", type=int, help="R, fits per cell (default 400; 20 with --quick)")
    parser.add_argument("--jobs", type=int, default=1, help="processes (cells run in parallel)")
    parser.add_argument("--outdir", help="where plan_accuracy_full.csv (every column) and plan_accuracy.csv "
                        "(the docs' table) go (default: a fresh temporary directory)")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    outdir = Path(args.outdir) if args.outdir else Path(tempfile.mkdtemp(prefix="plan_accuracy_"))
    outdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    table = accuracy(quick=args.quick, runs=args.runs, jobs=args.jobs)
    table.to_csv(outdir / "plan_accuracy_full.csv", index=False)
    docs_table(table).to_csv(outdir / "plan_accuracy.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(docs_table(table).to_string(index=False))
    endog = table[table.endogenous]
    print(f"\nSE against the realised SD: {int(table.within_25pct.sum())} of {len(table)} within 25% "
          f"(ratios {table.ratio.min():.3f}-{table.ratio.max():.3f})")
    print(f"spread against the realised IQR/1.349: {int(table.spread_within_25pct.sum())} of {len(table)} within 25% "
          f"(ratios {table.spread_ratio.min():.3f}-{table.spread_ratio.max():.3f}; Monte Carlo error "
          f"{SPREAD_MC / math.sqrt(table.runs.min()):.1%} of a realised spread)")
    print(f"bounds-only plan against the median reported SE: endogenous coefficients {endog.bounds_ratio.min():.3f}-"
          f"{endog.bounds_ratio.max():.3f} (>= 0.8: {int((endog.bounds_ratio >= 0.8).sum())} of {len(endog)}); "
          f"all coefficients {table.bounds_ratio.min():.3f}-{table.bounds_ratio.max():.3f} "
          f"(>= 0.8: {int((table.bounds_ratio >= 0.8).sum())} of {len(table)})")
    print(f"{time.perf_counter() - t0:.0f} s; written to {outdir}")
    return table


if __name__ == "__main__":
    main()
