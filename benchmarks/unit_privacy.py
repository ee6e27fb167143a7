"""Person-level privacy (``fit(privacy_unit=...)``, issue 18): coverage of the clustered private intervals, and the
evidence for the default ``max_rows_per_unit``.

Data: :func:`dpivreg.datasets.simulate_panel`, ``y ~ 1 + w + [x ~ z]`` with a unit effect in the error (within-unit
correlation 0.5) and in x, units of 1–10 rows unless a design says otherwise; public bounds at ±5 population
standard deviations. Every fit is the default ``fit(rho=ρ, bounds=..., seed=..., privacy_unit="unit")`` (clustered
by the unit), at the same total ρ.

``--coverage`` (default): for N ∈ {10³, 10⁴, 10⁵} units, R fresh data sets and fresh noise each, the coverage of the
true coefficients by the private 95% intervals (each coefficient, and x alone), beside the coverage of linearmodels'
clustered 2SLS interval on the same data (the data draws' own luck) and of the row-level fit's robust private
interval on the same data (which ignores the within-unit correlation and under-covers), the median ratio of the
private s.e. to the clustered 2SLS one and the median noise share of the private variance.

    python benchmarks/unit_privacy.py --coverage --runs 500 --jobs 2 --out docs/_static/unit_coverage.csv
    python benchmarks/unit_privacy.py --quick

``--max-rows``: the default's evidence. For each design and budget, the fits with max_rows_per_unit m ∈
{1, 2, 5, 10, 20}: the root mean squared error of the estimate of x around the truth (in units of the clustered
2SLS s.e. on the full data), its mean error (bias) and the coverage of its private interval, over R runs with
fresh data; ``--out`` gets the compact "RMSE (bias)" table the docs show, ``*_full.csv`` every column. Designs: units of
1–10 rows (the issue's); a balanced panel of 5 rows; units of 1–30 rows; and 1–10 rows whose effect grows with the
unit's size (``heterogeneity`` 0.3: truncating large units then shifts the estimand, which the RMSE around the full
data's mean effect shows).

    python benchmarks/unit_privacy.py --max-rows --runs 50 --jobs 2 --out docs/_static/unit_max_rows.csv
"""

from __future__ import annotations

import argparse
import itertools
import time
import warnings
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pandas as pd

from dpivreg import DPIV2SLS
from dpivreg.datasets import simulate_panel

Z95 = 1.959963984540054
RHO = 2.0


def coverage_replication(n_units: int, rho: float, seed: int) -> dict:
    """One data set: the unit-level fit's intervals, the row-level fit's, and linearmodels' clustered 2SLS."""
    from linearmodels.iv import IV2SLS

    panel = simulate_panel(n_units, seed=seed)
    data, truth = panel.data, panel.beta
    model = DPIV2SLS.from_formula(panel.formula, data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unit = model.fit(rho=rho, bounds=panel.bounds, seed=10_000 + seed, privacy_unit="unit")
        row = model.fit(rho=rho, bounds=panel.bounds, seed=10_000 + seed)
    benchmark = IV2SLS.from_formula(panel.formula, data).fit(cov_type="clustered", clusters=data["unit"])
    out = {"N": n_units, "rho": rho, "seed": seed}
    for name, params, se in (("private", unit.params, unit.bse), ("row-level", row.params, row.bse),
                             ("2SLS clustered", benchmark.params, benchmark.std_errors)):
        covered = (params - truth).abs() <= Z95 * se
        out[f"cover {name}"] = float(covered.mean())
        out[f"cover x {name}"] = float(covered["x"])
    out["se ratio x"] = float(unit.bse["x"] / benchmark.std_errors["x"])
    out["noise share x"] = float(unit.inference.cov_noise[-1, -1] / unit.inference.cov[-1, -1])
    out["reliable"] = float(unit.inference.reliable)
    return out


DESIGNS = {
    "1-10 rows": dict(rows=(1, 10)),
    "5 rows (balanced)": dict(rows=5),
    "1-30 rows": dict(rows=(1, 30)),
    "1-10 rows, effect grows with size": dict(rows=(1, 10), heterogeneity=0.3),
}
MAX_ROWS = (1, 2, 5, 10, 20)


def max_rows_replication(design: str, n_units: int, rho: float, seed: int) -> list[dict]:
    """One data set of ``design``: the fits with each m, their errors in clustered 2SLS standard errors."""
    from linearmodels.iv import IV2SLS

    panel = simulate_panel(n_units, seed=seed, **DESIGNS[design])
    data = panel.data
    scale = float(IV2SLS.from_formula(panel.formula, data).fit(cov_type="clustered",
                                                                clusters=data["unit"]).std_errors["x"])
    model = DPIV2SLS.from_formula(panel.formula, data)
    rows = []
    for m in MAX_ROWS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = model.fit(rho=rho, bounds=panel.bounds, seed=10_000 + seed, privacy_unit="unit",
                            max_rows_per_unit=m)
        error = float(res.params["x"] - panel.beta["x"])
        rows.append({"design": design, "N": n_units, "rho": rho, "m": m, "seed": seed, "error_se": error / scale,
                     "covered": float(abs(error) <= Z95 * res.bse["x"])})
    return rows


def _run(jobs: int, function, cells: list[tuple]) -> list:
    if jobs <= 1:
        return [function(*cell) for cell in cells]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(function, *zip(*cells), chunksize=max(1, len(cells) // (8 * jobs))))


def coverage_study(*, runs: int, sizes=(1_000, 10_000, 100_000), rho: float = RHO, jobs: int = 1) -> pd.DataFrame:
    """The coverage table (one row per N)."""
    rows = []
    for n_units in sizes:
        start = time.perf_counter()
        results = pd.DataFrame(_run(jobs, coverage_replication, [(n_units, rho, seed) for seed in range(runs)]))
        summary = {"N units": n_units, "rows (mean)": round(5.5 * n_units), "total rho": rho, "runs": runs}
        for name in ("private", "2SLS clustered", "row-level"):
            summary[f"cover x ({name})"] = results[f"cover x {name}"].mean()
            summary[f"cover all ({name})"] = results[f"cover {name}"].mean()
        summary["mc se"] = float(np.sqrt(0.95 * 0.05 / runs))
        summary["median se / clustered 2SLS se (x)"] = results["se ratio x"].median()
        summary["median noise share (x)"] = results["noise share x"].median()
        summary["reliable"] = results["reliable"].mean()
        print(pd.Series(summary).to_string(), f"\n({time.perf_counter() - start:.0f} s)", flush=True)
        rows.append(summary)
    return pd.DataFrame(rows)


def max_rows_study(*, runs: int, sizes=(1_000, 10_000), rhos=(0.5, 2.0), jobs: int = 1) -> pd.DataFrame:
    """The default's evidence (one row per design, N, ρ and m)."""
    cells = [(design, n_units, rho, seed) for design, n_units, rho in itertools.product(DESIGNS, sizes, rhos)
             for seed in range(runs)]
    results = pd.DataFrame([row for rows in _run(jobs, max_rows_replication, cells) for row in rows])
    table = results.groupby(["design", "N", "rho", "m"], sort=False).agg(
        rmse_se=("error_se", lambda e: float(np.sqrt(np.mean(np.square(e))))),
        median_abs_error_se=("error_se", lambda e: float(np.median(np.abs(e)))),
        bias_se=("error_se", "mean"), coverage=("covered", "mean"), runs=("seed", "size")).reset_index()
    best = table.groupby(["design", "N", "rho"], sort=False)["rmse_se"].transform("min")
    table["rmse / best"] = table["rmse_se"] / best
    return table


def compact(table: pd.DataFrame) -> pd.DataFrame:
    """The docs' view of :func:`max_rows_study`: per design, N and ρ, "RMSE (bias)" of x in clustered 2SLS standard
    errors for each m, and the m with the smallest RMSE."""
    cells = table.assign(cell=[f"{r:.3g} ({b:+.2g})" for r, b in zip(table["rmse_se"], table["bias_se"])])
    wide = cells.pivot_table(index=["design", "N", "rho"], columns="m", values="cell", aggfunc="first", sort=False)
    wide.columns = [f"m = {m}" for m in wide.columns]
    best = table.loc[table.groupby(["design", "N", "rho"], sort=False)["rmse_se"].idxmin()]
    wide["best m"] = best.set_index(["design", "N", "rho"])["m"].reindex(wide.index).to_numpy()
    return wide.reset_index().rename(columns={"rho": "total rho"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--coverage", action="store_true", help="the coverage study (the default)")
    parser.add_argument("--max-rows", action="store_true", help="the evidence for the default max_rows_per_unit")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--sizes", type=str, default=None, help="numbers of units, comma-separated")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out")
    args = parser.parse_args()
    sizes = None if args.sizes is None else tuple(int(s) for s in args.sizes.split(","))
    if args.max_rows:
        runs = args.runs or (3 if args.quick else 100)
        table = max_rows_study(runs=runs, sizes=sizes or ((500,) if args.quick else (1_000, 10_000)),
                               rhos=(2.0,) if args.quick else (0.5, 2.0), jobs=args.jobs)
        with pd.option_context("display.width", 200, "display.max_rows", 500):
            print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        if args.out:  # the full table beside the docs' compact one
            table.to_csv(args.out.replace(".csv", "_full.csv"), index=False, float_format="%.4g")
        table = compact(table)
    else:
        runs = args.runs or (3 if args.quick else 1000)
        table = coverage_study(runs=runs, sizes=sizes or ((500,) if args.quick else (1_000, 10_000, 100_000)),
                               jobs=args.jobs)
    if args.out:
        table.to_csv(args.out, index=False, float_format="%.4g")


if __name__ == "__main__":
    main()
