"""Accuracy of the three preprocessing routes at equal total budget (issue: fully private default pipeline).

For each cell, the median and 90th percentile over runs of ‖β⁽ᵀ⁾ − β̂_2SLS‖ (original units), where
β̂_2SLS is the non-private 2SLS estimate on the same data, for

* ``paper``   the paper's practice: exact data moments and the plain iteration with the data's
              eigenvalue step sizes (leaky; ``preprocess="data", method="gd"``),
* ``data``    the leaky oracle: exact data moments, preconditioned iteration,
* ``bounds``  public bounds only, no budget for preprocessing (preconditioned iteration),
* ``private`` the default: rho0 pays for the moments (preconditioned iteration),
* ``private_rms`` the same with ``clip="rms"`` (3 × the RMS gradient norm instead of the Theorem's rule).

Equal total budget: ``data``/``bounds``/``paper`` use rho1 = rho2 = rho/2; ``private`` uses the default
share rho0 = 0.2(rho1 + rho2), i.e. rho1 = rho2 = rho/2.4 and rho0 = rho/6. Only the preprocessing differs:
every route runs the Algorithm's iteration (zero start, the Theorem's clip, uniform schedule, T = 20), so
that the warm start and the adaptive clipping of the default, which the preprocessing also feeds, do not
enter (``benchmarks/estimator_comparison.py`` measures the whole default).

(a) the paper's synthetic design (section 5.1), p = q = 5, a fresh data set per run, with public
    bounds at ±4 population standard deviations (:func:`dpivreg.datasets.simulate_iv`);
(b) the labour-supply data, weeks ~ 1 + age + educ + black + hispan + [kids ~ samesex], with the
    public bounds of :data:`dpivreg.datasets.LABSUP_BOUNDS` (covariates on very different scales).

    python benchmarks/private_pipeline.py                 # the full table (200 runs per cell; ~30 min alone)
    python benchmarks/private_pipeline.py --quick         # a smoke run
    python benchmarks/private_pipeline.py --out docs/_static/private_pipeline.csv
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pandas as pd
from _reference import two_sls  # the benchmarks' non-private 2SLS

from dpivreg import DPIV2SLS, PrivacyLeakWarning
from dpivreg.datasets import LABSUP_BOUNDS, load_labsup, simulate_iv

ROUTES = {
    "paper": dict(preprocess="data", method="gd"),
    "data": dict(preprocess="data", method="preconditioned"),
    "bounds": dict(preprocess="bounds", method="preconditioned"),
    "private": dict(preprocess="private", method="preconditioned"),
    "private_rms": dict(preprocess="private", method="preconditioned", clip="rms"),
}
#: the Algorithm's iteration for every route (the routes differ in their preprocessing only)
ITERATION = dict(T=20, init="zero", schedule="uniform")
LABSUP_FORMULA = "weeks ~ 1 + age + educ + black + hispan + [kids ~ samesex]"


def budget(route: str, rho: float) -> dict:
    if route.startswith("private"):
        return dict(rho1=rho / 2.4, rho2=rho / 2.4, rho0=rho / 6)
    return dict(rho1=rho / 2, rho2=rho / 2)


def fit_error(model: DPIV2SLS, reference: np.ndarray, route: str, rho: float, bounds: dict, seed: int) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        res = model.fit(bounds=bounds, seed=seed, inference=False, **ITERATION, **budget(route, rho), **ROUTES[route])
    assert abs(res.privacy.rho - rho) <= 1e-9 * rho or route in ("paper", "data"), (route, res.privacy.rho)
    return float(np.linalg.norm(res.params.to_numpy() - reference))


def synthetic_cells(ns, rhos, runs):
    rows = []
    for n in ns:
        for rho in rhos:
            errors = {route: [] for route in ROUTES}
            for run in range(runs):
                sim = simulate_iv(n, 5, 5, seed=run)
                model = DPIV2SLS(sim.data["y"], None, sim.data[[f"x{j}" for j in range(1, 6)]],
                                 sim.data[[f"z{j}" for j in range(1, 6)]])
                reference = two_sls(model)[0]
                for route in ROUTES:
                    errors[route].append(fit_error(model, reference, route, rho, sim.bounds, seed=10_000 + run))
            rows.extend(_summarise("synthetic p=q=5", n, rho, errors))
            print(pd.DataFrame(rows[-len(ROUTES):]).to_string(index=False, header=len(rows) == len(ROUTES)), flush=True)
    return rows


def labsup_cells(rhos, runs):
    df = load_labsup()
    model = DPIV2SLS.from_formula(LABSUP_FORMULA, df)
    bounds = {c: LABSUP_BOUNDS[c] for c in ("weeks", "kids", "samesex", "age", "educ", "black", "hispan")}
    reference = two_sls(model)[0]
    rows = []
    for rho in rhos:
        errors = {route: [fit_error(model, reference, route, rho, bounds, seed=run) for run in range(runs)]
                  for route in ROUTES}
        rows.extend(_summarise("labsup + covariates", len(df), rho, errors))
        print(pd.DataFrame(rows[-len(ROUTES):]).to_string(index=False, header=False), flush=True)
    return rows


def _summarise(design, n, rho, errors):
    return [
        {"design": design, "n": n, "total_rho": rho, "route": route, "runs": len(e),
         "median_error": float(np.median(e)), "p90_error": float(np.quantile(e, 0.9))}
        for route, e in errors.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="few runs, small n (a smoke run)")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--out", help="write the table as CSV here")
    args = parser.parse_args()
    runs = 5 if args.quick else args.runs
    ns = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    rhos = [2.0] if args.quick else [0.5, 2.0, 10.0]
    start = time.perf_counter()
    rows = synthetic_cells(ns, rhos, runs) + labsup_cells(rhos, runs)
    table = pd.DataFrame(rows)
    wide = table.pivot_table(index=["design", "n", "total_rho"], columns="route",
                             values=["median_error", "p90_error"]).round(4)
    print()
    print(wide.to_string())
    ratio = (table[table.route == "private"].set_index(["design", "n", "total_rho"]).median_error
             / table[table.route == "data"].set_index(["design", "n", "total_rho"]).median_error)
    print("\nmedian error, private / leaky oracle ('data'):")
    print(ratio.round(3).to_string())
    print(f"\n{time.perf_counter() - start:.0f} s")
    if args.out:
        table.round(4).to_csv(args.out, index=False)  # the docs show the CSV as a table


if __name__ == "__main__":
    main()
