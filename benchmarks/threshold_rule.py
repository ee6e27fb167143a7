"""Which bins of a released norm histogram hold rows: dpivreg 0.1's one noise level (3σ) against two levels, for
the clipping thresholds of DP-2S-GD's gradients and of the standard errors' meats.

The histograms behind every private clipping threshold (:mod:`dpivreg.estimation.clipping`,
:mod:`dpivreg.inference.covariance`) have 40 or more bins, most of them far above the data. With one level every bin
whose noisy count passes 3σ is taken to hold rows; noise alone does that in 0.13% of bins, so in about 5% of
histograms (20% of the four gradient histograms of a fit) a lone bin far above the data appears and, when its count
exceeds the K rows a threshold may leave above it, moves the threshold up to 2¹² times too high. Rules compared,
each on the same data set and seed with the default ``fit(rho=ρ, bounds=...)`` (the releases, their noise and
budgets are identical; only the post-processing of the histograms differs):

``one level``
    dpivreg 0.1: every bin above 3σ; a gradient threshold at the grid's bottom edge when no bin passes (a meat's at
    its top edge).
``two levels everywhere``
    a run of adjacent bins above 3σ is seen when it is two bins long or holds a bin above the histogram's Bonferroni
    level (3.98σ for 40 bins), whatever the histogram resolves; the top edge when no bin is seen.
``dpivreg``
    :func:`dpivreg.privacy.mechanisms.seen_bins`: the two levels where the largest count exceeds 6σ, one level
    below (data that fill bins only a little above 3σ cannot be told from noise); the top edge when no bin is seen.

Designs of ``benchmarks/estimator_comparison.py``: the paper's design (p = q = 1 at n = 200–10⁴, p = q = 5 at
n = 10³), the weak-instrument design (n = 300, 10³), the heavy-tailed design (n = 10³, 10⁴) and labour-supply
subsamples (n = 500 and 3,000; 1,000 with age and education); total ρ ∈ {0.5, 2, 10}; 200 data sets per cell.
Errors are \|β̂ − β̂_2SLS\| of the endogenous coefficient in 2SLS (robust) standard errors; ``changed`` counts the
fits whose estimate or standard error differs between ``one level`` and ``dpivreg``; ``cover`` is the share of 95%
private intervals containing β̂_2SLS and ``se_ratio`` the median private s.e. over the 2SLS s.e.

    python benchmarks/threshold_rule.py --jobs 2 --out docs/_static/threshold_rule.csv   # the docs' table
    python benchmarks/threshold_rule.py --quick                                           # a smoke run

Each worker runs with one thread (OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd

import dpivreg.privacy.mechanisms as mechanisms

sys.path.insert(0, str(Path(__file__).resolve().parent))
import estimator_comparison as designs  # noqa: E402

_seen_bins = mechanisms.seen_bins

RHOS = (0.5, 2.0, 10.0)
RUNS = 200
Z95 = 1.959963984540054
#: (design, n, data set of run r)
CELLS = (
    ("paper p=q=1", 200, lambda r: designs.paper(200, 1, r)),
    ("paper p=q=1", 300, lambda r: designs.paper(300, 1, r)),
    ("paper p=q=1", 500, lambda r: designs.paper(500, 1, r)),
    ("paper p=q=1", 1_000, lambda r: designs.paper(1_000, 1, r)),
    ("paper p=q=1", 10_000, lambda r: designs.paper(10_000, 1, r)),
    ("paper p=q=5", 1_000, lambda r: designs.paper(1_000, 5, r)),
    ("weak (F = 10)", 300, lambda r: designs.weak(300, r)),
    ("weak (F = 10)", 1_000, lambda r: designs.weak(1_000, r)),
    ("heavy-tailed", 1_000, lambda r: designs.heavy(1_000, r)),
    ("heavy-tailed", 10_000, lambda r: designs.heavy(10_000, r)),
    ("labsup subsample", 500, lambda r: designs.labsup_subsample(500, False, r)),
    ("labsup subsample + age, educ", 1_000, lambda r: designs.labsup_subsample(1_000, True, r)),
    ("labsup subsample", 3_000, lambda r: designs.labsup_subsample(3_000, False, r)),
)


def one_level(noisy_counts, sigma, *, threshold=3.0):
    """dpivreg 0.1's reading: every bin above ``threshold``·σ holds rows."""
    return np.asarray(noisy_counts) > threshold * sigma


def one_level_gradient_clip(noisy_counts, edges, *, target, sigma, threshold=3.0):
    """dpivreg 0.1's gradient threshold: one level, and the grid's bottom edge when no bin is seen."""
    kept = np.where(one_level(noisy_counts, sigma, threshold=threshold), noisy_counts, 0.0)
    above = np.cumsum(kept[::-1])[::-1]
    ok = np.nonzero(above <= target)[0]
    return float(edges[ok[0]] if ok.size else edges[-1])


def two_levels_everywhere(noisy_counts, sigma, *, threshold=3.0):
    """The two-level reading at every resolution (no ``RESOLVED_PEAK_SIGMAS`` condition)."""
    counts = np.asarray(noisy_counts, dtype=np.float64)
    with mock.patch.object(mechanisms, "RESOLVED_PEAK_SIGMAS", -np.inf):
        return _seen_bins(counts, sigma, threshold=threshold)


#: name -> the patches that make a fit use that rule (none: dpivreg's)
RULES = {
    "one level": {"dpivreg.privacy.mechanisms.seen_bins": one_level,
                  "dpivreg.estimation.clipping.clip_from_histogram": one_level_gradient_clip},
    "two levels everywhere": {"dpivreg.privacy.mechanisms.seen_bins": two_levels_everywhere},
    "dpivreg": {},
}


def _fit(data, rho: float, seed: int, rule: str):
    patches = [mock.patch(target, new) for target, new in RULES[rule].items()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for patch in patches:
            patch.start()
        try:
            return designs.fit(data, "default", rho, seed)
        finally:
            for patch in patches:
                patch.stop()


def _cell(task: tuple) -> list[dict]:
    cell, rho, start, stop = task
    name, n, make = CELLS[cell]
    rows = []
    for run in range(start, stop):
        data = make(run)
        reference, se = designs.two_sls(data.model)
        j = list(data.model.design.regressor_names).index(data.endog[0])
        fits = {rule: _fit(data, rho, 1_000 + run, rule) for rule in RULES}
        row = {"design": name, "n": n, "total_rho": rho, "run": run}
        for rule, res in fits.items():
            est, bse = float(res.params.iloc[j]), float(res.bse.iloc[j])
            row[f"error {rule}"] = abs(est - reference[j]) / se[j]
            row[f"covers {rule}"] = abs(est - reference[j]) <= Z95 * bse
            row[f"se_ratio {rule}"] = bse / se[j]
        row["changed"] = not (np.array_equal(fits["one level"].params, fits["dpivreg"].params)
                              and np.array_equal(fits["one level"].bse, fits["dpivreg"].bse))
        rows.append(row)
    return rows


def _single_thread() -> None:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        return
    threadpool_limits(1)


def simulate(*, runs: int = RUNS, rhos=RHOS, cells=range(len(CELLS)), jobs: int = 1, chunk: int = 25) -> pd.DataFrame:
    """One row per data set and ρ of the ``cells`` (indices into ``CELLS``): both rules' errors, coverage, s.e."""
    tasks = [(cell, rho, s, min(s + chunk, runs)) for cell in cells for rho in rhos for s in range(0, runs, chunk)]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs, initializer=_single_thread) as pool:
            parts = list(pool.map(_cell, tasks))
    else:
        parts = [_cell(task) for task in tasks]
    return pd.DataFrame([row for part in parts for row in part])


def _key(rule: str) -> str:
    return rule.replace(" ", "_")


def summarise(fits: pd.DataFrame) -> pd.DataFrame:
    """Per cell: fits whose estimate or s.e. the rule changed (dpivreg against one level); each rule's median,
    90th percentile and largest error, coverage of β̂_2SLS and median s.e. ratio."""
    out = []
    for (design, n, rho), part in fits.groupby(["design", "n", "total_rho"], sort=False):
        row = {"design": design, "n": n, "total_rho": rho, "runs": len(part), "changed": int(part.changed.sum())}
        for stat, f in (("median", lambda e: e.median()), ("p90", lambda e: e.quantile(0.9)), ("max", np.max)):
            for rule in RULES:
                row[f"{stat}_error_{_key(rule)}"] = f(part[f"error {rule}"])
        for rule in RULES:
            row[f"cover_{_key(rule)}"] = part[f"covers {rule}"].mean()
            row[f"se_ratio_{_key(rule)}"] = part[f"se_ratio {rule}"].median()
        out.append(row)
    return pd.DataFrame(out)


def docs_table(table: pd.DataFrame) -> pd.DataFrame:
    """The docs' columns: the cell, the fits changed, each rule's median and 90th-percentile error, and the
    intervals' coverage and s.e. ratio under one level and dpivreg's rule (rounded to 4 digits)."""
    keys = [_key(rule) for rule in RULES]
    columns = ["design", "n", "total_rho", "runs", "changed",
               *[f"{stat}_error_{k}" for stat in ("median", "p90") for k in keys],
               *[f"{what}_{k}" for what in ("cover", "se_ratio") for k in ("one_level", "dpivreg")]]
    return table[columns].round(4)


def main(argv=None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two cells, rho = 2, 5 runs (a smoke run)")
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    parser.add_argument("--out", help="write the docs' table (docs_table) as CSV here")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    if args.quick:
        fits = simulate(runs=5, rhos=(2.0,), cells=(3, 7), jobs=args.jobs)
    else:
        fits = simulate(jobs=args.jobs)
    table = summarise(fits)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(table.round(3).to_string(index=False))
    print(f"{time.perf_counter() - t0:.0f} s, {len(RULES) * len(fits)} fits")
    if args.out:
        docs_table(table).to_csv(args.out, index=False)
    return table


if __name__ == "__main__":
    main()
