"""Coverage of dpivreg's private 95% confidence intervals (issue: private inference).

For each cell, over R replications (a fresh data set and fresh privacy noise each time):

* coverage of the true β and of the non-private 2SLS estimate β̂ by the private intervals
  ``res.conf_int(0.95)`` (all coefficients pooled), beside the coverage of the true β by the
  non-private 2SLS interval on the same data sets (the data draws' own luck: with R = 500 a cell's
  2SLS coverage itself varies by about ±0.01 around 0.95),
* the same for "naive" intervals that ignore the privacy noise (the private sampling part only),
  to show what the noise term buys,
* the median width of the private interval relative to the (non-private) 2SLS robust interval,
* the median share of the privacy noise in the private variance,
* the share of fits whose intervals were flagged unreliable (``res.inference.reliable``) and the
  coverage among the fits that were not,
* the share of fits in which the default (``method="auto"``) chose noisy moments over DP-2S-GD.

Designs: the paper's synthetic design (section 5.1; ``dpivreg.datasets.simulate_iv``) with
n ∈ {10³, 10⁴, 10⁵}, p = q ∈ {1, 5}, total ρ ∈ {0.5, 2, 10}, the default fit ``fit(rho=ρ)`` (ρ1 = ρ2 =
ρ/2.6, ρ0 = 0.2(ρ1 + ρ2), ρ_clip = ρ_inf = 0.05(ρ1 + ρ2) when the tables were measured; ρ/2.7 with ρ_diag =
0.05(ρ1 + ρ2) since the diagnostics' meats are spent by default; T, step sizes and clipping from the releases),
public bounds at ±4 population standard deviations; and a weak-instrument design (p = q = 1, first-stage coefficient
0.1, i.e. about 0.07 of the first-stage noise scale).

    python benchmarks/interval_coverage.py                    # R = 500 per cell
    python benchmarks/interval_coverage.py --quick            # a smoke run
    python benchmarks/interval_coverage.py --out docs/_static/coverage.csv

``--heteroskedastic``: the robust and unadjusted private intervals (``cov_type``) on y = 1 + 0.5w + x + u,
x = 1 + z + 0.5w + v, z ~ N(0, 1), w ~ U(0, 1), corr(u, v) = 0.5 before scaling, with the error's s.d.
homoskedastic, growing with abs(z) and w (``"grows"``: the unadjusted 2SLS s.e. is too small) or shrinking
with abs(z) (``"shrinks"``: too large), scaled to unit mean variance; coverage of the true β of x (the
endogenous coefficient) beside that of linearmodels' robust and unadjusted 2SLS intervals on the same data.

    python benchmarks/interval_coverage.py --heteroskedastic --out docs/_static/coverage_robust.csv

``--weak``: weak instruments, y = 1 + 2x + u, x = πz + v with corr(u, v) = 0.95 and π such that the first-stage
F is 2, 5 or 10 on average, n ∈ {10³ … 10⁶}, the default fit at total ρ = 2 (robust intervals): coverage of the
true β by the private Wald interval and the private Anderson–Rubin set (``res.anderson_rubin()``) beside the
non-private robust 2SLS interval and AR test on the same data, the share of bounded AR sets and their median
length relative to the robust 2SLS interval.

    python benchmarks/interval_coverage.py --weak --out docs/_static/coverage_weak.csv

``--first-stage-f``: on the same designs and seeds, the private first-stage F (``res.first_stage_diagnostics``,
from the default fit's moment release) against the non-private F: medians, the share of data sets whose
non-private F lies inside the private F's noise interval, and the interval's median width.

    python benchmarks/interval_coverage.py --first-stage-f --out docs/_static/first_stage_f.csv
"""

from __future__ import annotations

import argparse
import itertools
import time
import warnings

import numpy as np
import pandas as pd
from scipy import stats

from dpivreg import DPIV2SLS
from dpivreg.datasets import simulate_iv

Z95 = 1.959963984540054


def weak_iv(n: int, *, seed: int, strength: float = 0.1):
    """p = q = 1: x = strength·z + u + e_x, y = β x + u + e_y with β = 1; bounds at ±4 sd."""
    rng = np.random.default_rng(seed)
    z, u, ex, ey = rng.standard_normal((4, n))
    x = strength * z + u + ex
    y = x + u + ey
    sd_x = np.sqrt(strength**2 + 2.0)
    sd_y = np.sqrt((strength**2 + 2.0) + 2.0 + 2.0 + 1.0)  # var(x + u + e_y) = var x + 2 cov(x,u) + 1 + 1
    data = pd.DataFrame({"y": y, "x1": x, "z1": z})
    bounds = {"y": (-4 * sd_y, 4 * sd_y), "x1": (-4 * sd_x, 4 * sd_x), "z1": (-4.0, 4.0)}
    return data, np.array([1.0]), bounds


HETEROSKEDASTIC = ("homoskedastic", "grows", "shrinks")


def heteroskedastic_iv(n: int, *, seed: int, kind: str):
    """The ``--heteroskedastic`` designs (module docstring); bounds at about ±5 population s.d. (x, y)."""
    rng = np.random.default_rng(seed)
    z, v, e = rng.standard_normal((3, n))
    w = rng.uniform(0.0, 1.0, n)
    if kind == "grows":
        scale = (0.3 + np.abs(z)) * (0.5 + w)
        mean_square = (0.09 + 0.6 * np.sqrt(2 / np.pi) + 1.0) * (0.25 + 0.5 + 1 / 3)  # E[(0.3+|z|)²]E[(0.5+w)²]
    elif kind == "shrinks":
        scale = 1.0 / (0.5 + np.abs(z))
        mean_square = float(np.mean(1.0 / (0.5 + np.abs(np.random.default_rng(0).standard_normal(10**6))) ** 2))
    else:
        scale, mean_square = np.ones(n), 1.0
    u = (0.5 * v + np.sqrt(0.75) * e) * scale / np.sqrt(mean_square)
    x = 1.0 + z + 0.5 * w + v
    y = 1.0 + 0.5 * w + x + u
    data = pd.DataFrame({"y": y, "w": w, "x": x, "z": z})
    bounds = {"y": (-16.0, 20.0), "w": (0.0, 1.0), "x": (-7.0, 9.0), "z": (-5.5, 5.5)}
    return data, bounds


def heteroskedastic_replication(kind: str, n: int, rho: float, run: int) -> dict:
    from linearmodels import IV2SLS

    data, bounds = heteroskedastic_iv(n, seed=run, kind=kind)
    formula = "y ~ 1 + w + [x ~ z]"
    model = DPIV2SLS.from_formula(formula, data)
    out = {}
    for cov_type in ("robust", "unadjusted"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            res = model.fit(rho=rho, bounds=bounds, seed=10_000 + run, cov_type=cov_type)
        assert abs(res.privacy.rho - rho) < 1e-9 * rho
        lo, hi = res.conf_int(0.95).loc["x"]
        out[f"cover ({cov_type})"] = lo <= 1.0 <= hi
        out[f"width ({cov_type})"] = hi - lo
        out[f"flagged ({cov_type})"] = not res.inference.reliable
    for cov_type in ("robust", "unadjusted"):
        fit = IV2SLS.from_formula(formula, data).fit(cov_type=cov_type)
        out[f"cover 2SLS ({cov_type})"] = abs(fit.params["x"] - 1.0) <= Z95 * fit.std_errors["x"]
        out[f"width 2SLS ({cov_type})"] = 2 * Z95 * fit.std_errors["x"]
    return out


def run_heteroskedastic_cell(kind: str, n: int, rho: float, runs: int) -> dict:
    frame = pd.DataFrame([heteroskedastic_replication(kind, n, rho, run) for run in range(runs)])
    row = {"design": kind, "n": n, "total_rho": rho, "runs": runs}
    for cov_type in ("robust", "unadjusted"):
        coverage = frame[f"cover ({cov_type})"].mean()
        row[f"coverage ({cov_type})"] = round(coverage, 4)
        row[f"binomial_se ({cov_type})"] = round(float(np.sqrt(coverage * (1 - coverage) / runs)), 4)
    row["coverage 2SLS (robust)"] = round(frame["cover 2SLS (robust)"].mean(), 4)
    row["coverage 2SLS (unadjusted)"] = round(frame["cover 2SLS (unadjusted)"].mean(), 4)
    for cov_type in ("robust", "unadjusted"):
        row[f"median width vs robust 2SLS ({cov_type})"] = round(
            float(np.median(frame[f"width ({cov_type})"] / frame["width 2SLS (robust)"])), 3)
    row["share flagged (robust)"] = round(frame["flagged (robust)"].mean(), 3)
    return row


WEAK_F = (2.0, 5.0, 10.0)


def weak_first_stage_iv(n: int, *, seed: int, f: float, endogeneity: float = 0.95):
    """The ``--weak`` design: y = 1 + 2x + u, x = π z + v, z, u, v standard normal, corr(u, v) = ``endogeneity``,
    π = √((f − 1)/n) so that the first-stage F is f on average (concentration parameter f − 1); bounds at
    ±6 population s.d."""
    rng = np.random.default_rng(seed)
    z, u, e = rng.standard_normal((3, n))
    v = endogeneity * u + np.sqrt(1.0 - endogeneity**2) * e
    pi = np.sqrt((f - 1.0) / n)
    x = pi * z + v
    y = 1.0 + 2.0 * x + u
    sd_x = np.sqrt(pi**2 + 1.0)
    sd_y = np.sqrt(4.0 * sd_x**2 + 1.0 + 4.0 * endogeneity)
    bounds = {"y": (1.0 - 6 * sd_y, 1.0 + 6 * sd_y), "x": (-6 * sd_x, 6 * sd_x), "z": (-6.0, 6.0)}
    return pd.DataFrame({"y": y, "x": x, "z": z}), bounds


def _ols_rss(target: np.ndarray, regressors: np.ndarray) -> float:
    resid = target - regressors @ np.linalg.lstsq(regressors, target, rcond=None)[0]
    return float(resid @ resid)


def weak_replication(n: int, f: float, rho: float, run: int) -> dict:
    """One data set of the ``--weak`` design: the default private fit's robust Wald interval and AR set beside the
    non-private robust 2SLS interval and AR test on the same data."""
    from _reference import two_sls  # the benchmarks' non-private 2SLS (linearmodels' values)

    data, bounds = weak_first_stage_iv(n, seed=run, f=f)
    model = DPIV2SLS.from_formula("y ~ 1 + [x ~ z]", data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        res = model.fit(rho=rho, bounds=bounds, seed=10_000 + run)
    assert abs(res.privacy.rho - rho) < 1e-9 * rho and res.cov_type == "robust"
    lo, hi = res.conf_int(0.95).loc["x"]
    ar = res.anderson_rubin(0.95)
    beta, se = two_sls(model)
    ones = np.ones((n, 1))
    Z = np.column_stack([ones, data["z"].to_numpy()])
    e = data["y"].to_numpy() - 2.0 * data["x"].to_numpy()  # the non-private AR test at the true β
    ar_data = (n - 2) * (_ols_rss(e, ones) - _ols_rss(e, Z)) / _ols_rss(e, Z)
    return {
        "cover wald": lo <= 2.0 <= hi, "cover ar": 2.0 in ar, "ar bounded": ar.bounded,
        "ar length vs 2sls": ar.length / (2 * Z95 * se[1]) if ar.bounded else np.nan,
        "cover 2sls": abs(beta[1] - 2.0) <= Z95 * se[1],
        "cover ar (non-private)": ar_data <= stats.f.ppf(0.95, 1, n - 2),
    }


def first_stage_f_replication(n: int, f: float, rho: float, run: int) -> dict:
    """The private first-stage F of the ``--weak`` design's default fit and its noise interval, beside the
    non-private F on the same data. The fit makes the default's moment release as it was when the table was
    measured (ρ0 = 0.2·2ρ/2.6, the same seed, the fit's first release; 0.2·2ρ/2.7 since the diagnostics' share)
    without the inference the F does not use."""
    data, bounds = weak_first_stage_iv(n, seed=run, f=f)
    stage = rho / 2.6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        res = DPIV2SLS.from_formula("y ~ 1 + [x ~ z]", data).fit(
            rho1=stage, rho2=stage, rho0=0.4 * stage, bounds=bounds, seed=10_000 + run, inference=False)
    diagnostics = res.first_stage_diagnostics.loc["x"]
    ones = np.ones((n, 1))
    Z = np.column_stack([ones, data["z"].to_numpy()])
    x = data["x"].to_numpy()
    full, restricted = _ols_rss(x, Z), _ols_rss(x, ones)
    f_data = n * (restricted - full) / full  # linearmodels' (and dpivreg's) convention: n, not n − q
    return {"f private": diagnostics["f.stat"], "f non-private": f_data,
            "f inside": diagnostics["f.lower"] <= f_data <= diagnostics["f.upper"],
            "f interval width": diagnostics["f.upper"] - diagnostics["f.lower"],
            "weak flagged": diagnostics["f.lower"] < 10.0}


def run_weak_cell(n: int, f: float, rho: float, runs: int) -> dict:
    frame = pd.DataFrame([weak_replication(n, f, rho, run) for run in range(runs)])
    row = {"first_stage_F": f, "n": n, "total_rho": rho, "runs": runs}
    for name, column in (("wald (robust)", "cover wald"), ("AR", "cover ar")):
        coverage = frame[column].mean()
        row[f"coverage {name}"] = round(coverage, 4)
        row[f"binomial_se {name}"] = round(float(np.sqrt(coverage * (1 - coverage) / runs)), 4)
    row["coverage 2SLS (robust, non-private)"] = round(frame["cover 2sls"].mean(), 4)
    row["coverage AR (non-private)"] = round(frame["cover ar (non-private)"].mean(), 4)
    row["share AR bounded"] = round(frame["ar bounded"].mean(), 3)
    row["median AR length vs robust 2SLS (bounded)"] = round(float(frame["ar length vs 2sls"].median()), 3)
    return row


def run_first_stage_f_cell(n: int, f: float, rho: float, runs: int) -> dict:
    frame = pd.DataFrame([first_stage_f_replication(n, f, rho, run) for run in range(runs)])
    inside = frame["f inside"].mean()
    return {"first_stage_F": f, "n": n, "total_rho": rho, "runs": runs,
            "median F (private)": round(float(frame["f private"].median()), 3),
            "median F (non-private)": round(float(frame["f non-private"].median()), 3),
            "share non-private F inside private interval": round(inside, 3),
            "binomial_se": round(float(np.sqrt(inside * (1 - inside) / runs)), 4),
            "median interval width": round(float(frame["f interval width"].median()), 3),
            "share flagged weak": round(frame["weak flagged"].mean(), 3)}


def weak_main(args) -> None:
    """R = 300 per cell at n ≤ 10⁵ and 100 at n = 10⁶ (``--runs`` overrides the former), total ρ = 2."""
    _run_grid(WEAK_F, lambda f, n, runs: run_weak_cell(n, f, 2.0, runs), args, runs_at_million=100)


def first_stage_f_main(args) -> None:
    """R = 300 per cell at n ≤ 10⁵ and 100 at n = 10⁶ (``--runs`` overrides the former), total ρ = 2."""
    _run_grid(WEAK_F, lambda f, n, runs: run_first_stage_f_cell(n, f, 2.0, runs), args, runs_at_million=100)


def _run_grid(kinds, run_one, args, *, runs_at_million: int) -> None:
    """Every (kind, n) cell, n ∈ {10³ … 10⁶}: R = 300 at n ≤ 10⁵ (``--runs`` overrides), ``runs_at_million`` at
    10⁶; rows printed as they finish and written to ``--out``."""
    ns = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000, 1_000_000]
    start = time.perf_counter()
    rows = []
    for kind, n in itertools.product(kinds, ns):
        runs = 10 if args.quick else (runs_at_million if n >= 1_000_000 else (args.runs if args.runs != 500 else 300))
        rows.append(run_one(kind, n, runs))
        print(pd.DataFrame([rows[-1]]).to_string(index=False, header=len(rows) == 1), flush=True)
    print(f"\n{time.perf_counter() - start:.0f} s")
    if args.out:
        pd.DataFrame(rows).to_csv(args.out, index=False)


def one_replication(design: str, n: int, p: int, rho: float, run: int) -> dict:
    if design == "weak":
        data, beta, bounds = weak_iv(n, seed=run)
    else:
        sim = simulate_iv(n, p, p, seed=run)
        data, beta, bounds = sim.data, sim.beta, sim.bounds
    x_names = [c for c in data.columns if c.startswith("x")]
    z_names = [c for c in data.columns if c.startswith("z")]
    model = DPIV2SLS(data["y"], None, data[x_names], data[z_names])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the reliability flag is recorded below instead
        # the homoskedastic intervals this table has always measured (the robust ones: --heteroskedastic)
        res = model.fit(rho=rho, bounds=bounds, seed=10_000 + run, cov_type="unadjusted")
    assert abs(res.privacy.rho - rho) < 1e-9 * rho
    ci = res.conf_int(0.95)
    lo, hi = ci["lower"].to_numpy(), ci["upper"].to_numpy()
    est = res.params.to_numpy()
    naive_half = Z95 * np.sqrt(np.diag(res.inference.cov_sampling))
    bench = res.benchmark
    beta_hat = bench.params.to_numpy()
    se_2sls = bench.std_errors.to_numpy()
    width_2sls = 2 * Z95 * se_2sls
    return {
        "cover_true": np.mean((lo <= beta) & (beta <= hi)),
        "cover_true_2sls": np.mean(np.abs(beta_hat - beta) <= Z95 * se_2sls),
        "cover_2sls": np.mean((lo <= beta_hat) & (beta_hat <= hi)),
        "naive_cover_true": np.mean(np.abs(est - beta) <= naive_half),
        "width_ratio": float(np.median((hi - lo) / width_2sls)),
        "noise_share": float(np.median(np.diag(res.inference.cov_noise) / np.diag(res.inference.cov))),
        "flagged": not res.inference.reliable,
        "moments": res.estimator == "noisy moments",
    }


def run_cell(design, n, p, rho, runs):
    rows = [one_replication(design, n, p, rho, run) for run in range(runs)]
    frame = pd.DataFrame(rows)
    coverage = frame["cover_true"].mean()
    return {
        "design": design, "n": n, "p=q": p, "total_rho": rho, "runs": runs,
        "coverage_true": round(coverage, 4),
        "binomial_se": round(float(np.sqrt(coverage * (1 - coverage) / (runs * p))), 4),
        "coverage_true_by_2sls": round(frame["cover_true_2sls"].mean(), 4),
        "coverage_2sls": round(frame["cover_2sls"].mean(), 4),
        "coverage_ignoring_noise": round(frame["naive_cover_true"].mean(), 4),
        "median_width_vs_2sls": round(frame["width_ratio"].median(), 3),
        "median_noise_share": round(frame["noise_share"].median(), 3),
        "share_flagged_unreliable": round(frame["flagged"].mean(), 3),
        "coverage_when_not_flagged": round(frame.loc[~frame["flagged"], "cover_true"].mean(), 4)
        if (~frame["flagged"]).any() else float("nan"),
        "share_noisy_moments": round(frame["moments"].mean(), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--out")
    parser.add_argument("--heteroskedastic", action="store_true",
                        help="robust vs unadjusted intervals on heteroskedastic designs (module docstring)")
    parser.add_argument("--weak", action="store_true",
                        help="Wald and Anderson-Rubin coverage with weak instruments")
    parser.add_argument("--first-stage-f", action="store_true",
                        help="the private first-stage F and its noise interval against the non-private F")
    args = parser.parse_args()
    if args.heteroskedastic:
        heteroskedastic_main(args)
        return
    if args.weak:
        weak_main(args)
        return
    if args.first_stage_f:
        first_stage_f_main(args)
        return
    runs = 20 if args.quick else args.runs
    ns = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    rhos = [2.0] if args.quick else [0.5, 2.0, 10.0]
    cells = [("synthetic", n, p, rho) for n, p, rho in itertools.product(ns, [1, 5], rhos)]
    cells += [("weak", n, 1, rho) for n, rho in itertools.product(ns, rhos)]
    start = time.perf_counter()
    rows = []
    for cell in cells:
        rows.append(run_cell(*cell, runs))
        print(pd.DataFrame([rows[-1]]).to_string(index=False, header=len(rows) == 1), flush=True)
    table = pd.DataFrame(rows)
    print(f"\n{time.perf_counter() - start:.0f} s")
    if args.out:
        table.to_csv(args.out, index=False)


def heteroskedastic_main(args) -> None:
    """R = 300 per cell at n ≤ 10⁵ and 200 at n = 10⁶ (``--runs`` overrides the former), total ρ = 2."""
    _run_grid(HETEROSKEDASTIC, lambda kind, n, runs: run_heteroskedastic_cell(kind, n, 2.0, runs), args,
              runs_at_million=200)


if __name__ == "__main__":
    main()
