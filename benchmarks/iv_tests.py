"""Size and power of dpivreg's private IV specification tests, and coverage of the effective F's noise interval
(issue 41, item 4).

Model ``y ~ 1 + w + [x ~ z1 + z2]`` (one endogenous regressor, two instruments: over-identified by one; a control):

    z1, z2, w, e_u, e_v independent N(0, 1),  s = 1 (homoskedastic) or exp(0.5·z1 − 0.25) (heteroskedastic; E s² = 1)
    x = 0.3·z1 + 0.2·z2 + 0.2·w + s·e_v
    u = s·(γ·e_v + √(1 − γ²)·e_u) + δ·z2
    y = 1 + 0.5·x + 0.3·w + u

In the heteroskedastic design both the structural and the first-stage error have standard deviation s (so the
effective F's robust meat matters), and the homoskedastic tests (Sargan, Durbin, Wu–Hausman) are not valid there
even without privacy: they are reported beside their non-private rates, which show how far the design alone moves
them. Hypotheses:

``null``
    γ = δ = 0: valid instruments and x exogenous. One fit gives the size of the over-identification tests (Sargan,
    the robust score test ``wooldridge_overid``) and of the endogeneity tests (Wu–Hausman, Durbin, Wooldridge's
    robust score test ``wooldridge_score``).
``alt-overid``
    δ = ``INVALID`` (an invalid instrument: u contains a multiple of z2), γ = 0: power of the over-identification
    tests.
``alt-endog``
    γ = ``ENDOGENEITY`` (corr(u, v) = γ), δ = 0: power of the endogeneity tests.

The alternatives' strengths were chosen so that the non-private tests' power at n = 10⁴ is between 0.5 and 0.9 in
the homoskedastic design (measured: the power CSV's ``rejection_nonprivate`` column).

Public bounds (about the 10⁻⁶ and 1 − 10⁻⁶ quantiles of each column or wider, so that clipping is rare; the size
table reports the clipped rows per fit): w, z1, z2 in [−5, 5]; homoskedastic x in [−6, 6], y in [−6, 8];
heteroskedastic x in [−13, 16], y in [−18, 19].

Cells: n ∈ {10³, 10⁴, 10⁵} × total ρ ∈ {0.5, 2.6, 10} × {homoskedastic, heteroskedastic} × the three hypotheses.
Every fit is the default fit with the robust diagnostics' meats bought (the effective F's and the robust endogeneity
test's),
``fit(rho=ρ, rho_diag=0.05·ρ, bounds=..., seed=...)``: ``rho_diag`` is part of the total ρ (the rest is split as
``fit(rho=0.95·ρ)`` splits it), so every cell spends the same total ρ (asserted for every fit). Each cell's data
sets are the same at every ρ (seeded by n, design, hypothesis and run; the privacy noise by ρ as well), so the
non-private columns repeat across ρ.

Per cell and test, over R fits: the private rejection rate at 5% (``pval < 0.05``, the p-value against the
statistic's simulated null law with the privacy noise) with its Monte Carlo standard error √(p(1 − p)/R); the naive
private rate (``pval_nonprivate_law < 0.05``: the χ²/F law that ignores the noise); the non-private rate (the same
statistic on the raw data, by closed forms in this file that equal linearmodels 7.1's ``IV2SLS`` ``sargan``,
``wooldridge_overid``, ``wu_hausman()``, ``durbin()`` and ``wooldridge_score``: checked on the first data set of
every cell). For the
effective F (Montiel Olea–Pflueger, HC0; the non-private value by its closed form on the raw data): the share of fits
whose 95% privacy-noise interval contains the non-private value (every fit of the cell's three hypotheses: the
first stage's law does not depend on them), the shares below and above it, and the mean interval width relative to
the non-private value.

Runs per cell (:func:`runs_for`): R = 300 for the null cells with n ≥ 10⁴ (a 5% rate then has a Monte Carlo s.e.
of 1.3 points), 80 for the null cells with n = 10³ (2.4 points), 50 for the alternatives (at most 7 points). A fit
with every test costs about 0.3–0.5 s of CPU at every n (the tests' simulated null laws and noise intervals, 2,000
draws each, cost more than the data pass even at n = 10⁵): the 5,880 fits took 17.7 minutes (1,061 s of wall time)
with ``--jobs 2`` on a two-core machine when R was set, 14.8 minutes (889 s) in the run the docs show.

    python benchmarks/iv_tests.py --jobs 2 --outdir docs/_static     # the docs' tables
    python benchmarks/iv_tests.py --quick                            # a smoke run (n = 10³, ρ = 2.6, R = 5)

Writes iv_tests_size.csv (null cells), iv_tests_power.csv (alternatives) and iv_tests_effective_f.csv to ``--outdir``
(default: a fresh temporary directory) and prints them. Each worker runs with one thread (OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from dpivreg import DPIV2SLS, InferenceUnavailableError

FORMULA = "y ~ 1 + w + [x ~ z1 + z2]"
DESIGNS = ("homoskedastic", "heteroskedastic")
HYPOTHESES = ("null", "alt-overid", "alt-endog")
NS = (1_000, 10_000, 100_000)
RHOS = (0.5, 2.6, 10.0)
#: The share of the total ρ spent on the first stage's meat (the effective F's release).
RHO_DIAG_SHARE = 0.05
#: δ: the multiple of z2 in the structural error under ``alt-overid``.
INVALID = 0.03
#: γ: corr(u, v) under ``alt-endog``.
ENDOGENEITY = 0.07
LEVEL = 0.05
TARGET = (0.03, 0.08)
SEED = 20260411

_Z = {"w": (-5.0, 5.0), "z1": (-5.0, 5.0), "z2": (-5.0, 5.0)}
BOUNDS = {
    "homoskedastic": {"y": (-6.0, 8.0), "x": (-6.0, 6.0), **_Z},
    "heteroskedastic": {"y": (-18.0, 19.0), "x": (-13.0, 16.0), **_Z},
}

#: The tests: (column name, the relevant alternative).
TESTS = {"sargan": "alt-overid", "robust_overid": "alt-overid", "wu_hausman": "alt-endog", "durbin": "alt-endog",
         "robust_endog": "alt-endog"}


def runs_for(n: int, hypothesis: str) -> int:
    """R per cell (module docstring)."""
    if hypothesis != "null":
        return 50
    return 80 if n < 10_000 else 300


# --------------------------------------------------------------------------------------------------
# Data and the non-private statistics
# --------------------------------------------------------------------------------------------------


def draw(n: int, design: str, hypothesis: str, rng: np.random.Generator) -> pd.DataFrame:
    """One data set of the design under the hypothesis (module docstring)."""
    z1, z2, w, e_u, e_v = rng.standard_normal((5, n))
    gamma = ENDOGENEITY if hypothesis == "alt-endog" else 0.0
    delta = INVALID if hypothesis == "alt-overid" else 0.0
    s = np.exp(0.5 * z1 - 0.25) if design == "heteroskedastic" else 1.0
    x = 0.3 * z1 + 0.2 * z2 + 0.2 * w + s * e_v
    u = s * (gamma * e_v + math.sqrt(1.0 - gamma**2) * e_u) + delta * z2
    y = 1.0 + 0.5 * x + 0.3 * w + u
    return pd.DataFrame({"y": y, "x": x, "w": w, "z1": z1, "z2": z2})


def _quad(A: np.ndarray, b: np.ndarray) -> float:
    return float(b @ np.linalg.solve(A, b))


def nonprivate(data: pd.DataFrame) -> dict:
    """The statistics on the raw data, by closed forms (linearmodels' values; :func:`check_linearmodels`):

    2SLS residual u; Sargan = n·uᵀP_Zu/uᵀu; the robust score test = the two-step GMM J with the HC0 meat at u;
    with the OLS residual u_e and A = [Z, x], n·d = u_eᵀP_Au_e − uᵀP_Zu, Durbin = n·(n·d)/u_eᵀu_e, Wu–Hausman =
    n·d/((u_eᵀu_e − n·d)/(n − 4)); the robust endogeneity (score) test = (Σᵢsᵢ)²/Σᵢsᵢ² with sᵢ = rᵢu_e,ᵢ, r the
    first-stage residual of x with X partialled out (Wooldridge 2010, eq. 6.19); the effective F =
    π̂ᵀZ̃ᵀZ̃π̂ / tr((Z̃ᵀZ̃)⁻¹Σz̃ᵢz̃ᵢᵀv̂ᵢ²) with [1, w] partialled out."""
    n = len(data)
    one = np.ones(n)
    y, x, w = (data[c].to_numpy() for c in ("y", "x", "w"))
    Z = np.column_stack([one, w, data["z1"].to_numpy(), data["z2"].to_numpy()])
    X = np.column_stack([one, w, x])
    ZZ, ZX, Zy = Z.T @ Z, Z.T @ X, Z.T @ y
    ZZ_ZX = np.linalg.solve(ZZ, ZX)
    beta = np.linalg.solve(ZX.T @ ZZ_ZX, ZZ_ZX.T @ Zy)
    u = y - X @ beta
    Zu = Z.T @ u
    uPu = _quad(ZZ, Zu)
    sargan = n * uPu / float(u @ u)
    omega = (Z * (u**2)[:, None]).T @ Z / n
    G, m = ZX / n, Zy / n
    WG, Wm = np.linalg.solve(omega, G), np.linalg.solve(omega, m)
    b = np.linalg.solve(G.T @ WG, G.T @ Wm)
    g = m - G @ b
    robust = n * _quad(omega, g)
    beta_e = np.linalg.lstsq(X, y, rcond=None)[0]
    u_e = y - X @ beta_e
    A = np.column_stack([Z, x])
    nd = _quad(A.T @ A, A.T @ u_e) - uPu
    ss_e = float(u_e @ u_e)
    durbin = n * nd / ss_e
    dof = n - 2 - 1 - 1  # n − k1 − p − |S|
    wu_hausman = nd / ((ss_e - nd) / dof)
    v_all = x - Z @ np.linalg.lstsq(Z, x, rcond=None)[0]
    scores = (v_all - X @ np.linalg.lstsq(X, v_all, rcond=None)[0]) * u_e
    robust_endog = float(scores.sum() ** 2 / np.sum(scores**2))
    C = np.column_stack([one, w])
    Zt = Z[:, 2:] - C @ np.linalg.lstsq(C, Z[:, 2:], rcond=None)[0]
    xt = x - C @ np.linalg.lstsq(C, x, rcond=None)[0]
    Q = Zt.T @ Zt
    pi = np.linalg.solve(Q, Zt.T @ xt)
    v = xt - Zt @ pi
    S = (Zt * (v**2)[:, None]).T @ Zt
    effective_f = float(pi @ Q @ pi / np.trace(np.linalg.solve(Q, S)))
    chi2 = stats.chi2(1)
    return {"stat": {"sargan": sargan, "robust_overid": robust, "wu_hausman": wu_hausman, "durbin": durbin,
                     "robust_endog": robust_endog},
            "pval": {"sargan": float(chi2.sf(sargan)), "robust_overid": float(chi2.sf(robust)),
                     "wu_hausman": float(stats.f(1, dof).sf(wu_hausman)), "durbin": float(chi2.sf(durbin)),
                     "robust_endog": float(chi2.sf(robust_endog))},
            "effective_f": effective_f}


def check_linearmodels(data: pd.DataFrame, reference: dict, rel: float = 1e-6) -> None:
    """The closed forms equal linearmodels' ``IV2SLS`` statistics on these data (raises otherwise)."""
    from linearmodels import IV2SLS

    fit = IV2SLS.from_formula(FORMULA, data).fit(cov_type="robust")
    theirs = {"sargan": fit.sargan, "robust_overid": fit.wooldridge_overid, "wu_hausman": fit.wu_hausman(),
              "durbin": fit.durbin(), "robust_endog": fit.wooldridge_score}
    for name, ref in theirs.items():
        ours = reference["stat"][name]
        if not math.isclose(ours, ref.stat, rel_tol=rel):
            raise AssertionError(f"{name}: closed form {ours!r}, linearmodels {ref.stat!r}")
        if not math.isclose(reference["pval"][name], ref.pval, rel_tol=rel, abs_tol=1e-12):
            raise AssertionError(f"{name} p-value: closed form {reference['pval'][name]!r}, linearmodels {ref.pval!r}")


# --------------------------------------------------------------------------------------------------
# Fits
# --------------------------------------------------------------------------------------------------


def _seed(*keys: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([SEED, *keys])


def one_run(n: int, rho: float, design: str, hypothesis: str, run: int, *, check: bool = False) -> dict:
    """One data set and one private fit: every p-value the tables read, and the effective F with its interval. The
    tests that do not belong to the hypothesis (the endogeneity tests under ``alt-overid``, the over-identification
    tests under ``alt-endog``) are not computed."""
    d, h = DESIGNS.index(design), HYPOTHESES.index(hypothesis)
    data = draw(n, design, hypothesis, np.random.default_rng(_seed(n, d, h, run)))
    reference = nonprivate(data)
    if check:
        check_linearmodels(data, reference)
    bounds = BOUNDS[design]
    clipped = int(sum(np.sum((data[c] < lo) | (data[c] > hi)) for c, (lo, hi) in bounds.items()))
    fit_seed = int(_seed(n, d, h, RHOS.index(rho) if rho in RHOS else int(rho * 1000), run).generate_state(1)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = DPIV2SLS.from_formula(FORMULA, data).fit(rho=rho, rho_diag=RHO_DIAG_SHARE * rho, bounds=bounds,
                                                       seed=fit_seed)
        if not math.isclose(res.privacy.rho, rho, rel_tol=1e-9):
            raise AssertionError(f"the fit spent {res.privacy.rho}, not the total {rho}")
        tests, refused = {}, 0
        if hypothesis != "alt-endog":
            tests["robust_overid"] = res.wooldridge_overid
            try:
                tests["sargan"] = res.sargan
            except InferenceUnavailableError:  # the release cannot resolve the residual variance: no rejection
                refused += 1
        if hypothesis != "alt-overid":
            # (res.durbin(), res.wu_hausman()) from one computation: each public method computes both (the smoke
            # test checks they are the same objects' values)
            try:
                tests["durbin"], tests["wu_hausman"] = res._endogeneity(None)
            except InferenceUnavailableError:
                refused += 1
            tests["robust_endog"] = res.wooldridge_score
        ef = res.effective_f
    out = {"run": run, "clipped_rows": clipped, "refused": refused, "f_nonprivate": reference["effective_f"],
           "f_private": ef.stat, "f_lower": ef.lower, "f_upper": ef.upper, "f_weak": ef.stat < ef.critical_value}
    for name in TESTS:
        test = tests.get(name)
        out[f"{name} private"] = test.pval if test is not None else np.nan
        out[f"{name} naive"] = test.pval_nonprivate_law if test is not None else np.nan
        out[f"{name} nonprivate"] = reference["pval"][name]
    return out


def _chunk(task: tuple) -> pd.DataFrame:
    n, rho, design, hypothesis, start, stop = task
    rows = [one_run(n, rho, design, hypothesis, run, check=run == 0) for run in range(start, stop)]
    frame = pd.DataFrame(rows)
    frame.insert(0, "hypothesis", hypothesis)
    frame.insert(0, "total_rho", rho)
    frame.insert(0, "n", n)
    frame.insert(0, "design", design)
    return frame


def _single_thread() -> None:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn and scipy's test deps
        return
    threadpool_limits(1)


def simulate(*, quick: bool = False, runs: int | None = None, jobs: int = 1, chunk: int = 25,
             progress_every: int = 0) -> pd.DataFrame:
    """Every fit of the study, one row per fit (``quick``: n = 10³, ρ = 2.6, R = 5 unless ``runs`` is given), in
    chunks of ``chunk`` runs of a cell; progress to stderr every ``progress_every`` chunks (0: none)."""
    ns, rhos = ((1_000,), (2.6,)) if quick else (NS, RHOS)
    tasks = []
    for n in sorted(ns, reverse=True):  # the slow cells first: the pool ends together
        for rho in rhos:
            for design in DESIGNS:
                for hypothesis in HYPOTHESES:
                    total = runs if runs is not None else (5 if quick else runs_for(n, hypothesis))
                    tasks += [(n, rho, design, hypothesis, s, min(s + chunk, total)) for s in range(0, total, chunk)]
    parts: list = [None] * len(tasks)
    t0 = time.perf_counter()

    def progress(done: int) -> None:
        if progress_every and (done % progress_every == 0 or done == len(tasks)):
            print(f"[{done}/{len(tasks)} chunks, {time.perf_counter() - t0:.0f} s]", file=sys.stderr, flush=True)

    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs, initializer=_single_thread) as pool:
            futures = {pool.submit(_chunk, task): i for i, task in enumerate(tasks)}
            for done, future in enumerate(as_completed(futures), 1):
                parts[futures[future]] = future.result()
                progress(done)
    else:
        for i, task in enumerate(tasks):
            parts[i] = _chunk(task)
            progress(i + 1)
    return pd.concat(parts, ignore_index=True)


# --------------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------------

SIZE_COLUMNS = ["design", "n", "total_rho", "test", "runs", "rejection_private", "mc_se", "rejection_naive",
                "rejection_nonprivate", "in_target", "clipped_rows_per_fit"]
POWER_COLUMNS = ["alternative", "design", "n", "total_rho", "test", "runs", "rejection_private", "mc_se",
                 "rejection_naive", "rejection_nonprivate"]
EFFECTIVE_F_COLUMNS = ["design", "n", "total_rho", "runs", "coverage", "mc_se", "share_below", "share_above",
                       "mean_width_rel", "median_f_nonprivate", "median_f_private", "share_weak_private"]


def _rate(values: pd.Series) -> tuple[float, float]:
    p = float(np.mean(values.to_numpy() < LEVEL))
    return p, math.sqrt(p * (1 - p) / len(values))


def _rows(fits: pd.DataFrame, hypothesis: str, tests) -> list[dict]:
    rows = []
    cells = fits[fits.hypothesis == hypothesis].groupby(["design", "n", "total_rho"], sort=False)
    for (design, n, rho), cell in cells:
        for name in tests:
            p, se = _rate(cell[f"{name} private"])
            rows.append({"alternative": hypothesis, "design": design, "n": n, "total_rho": rho, "test": name,
                         "runs": len(cell), "rejection_private": round(p, 4), "mc_se": round(se, 4),
                         "rejection_naive": round(_rate(cell[f"{name} naive"])[0], 4),
                         "rejection_nonprivate": round(_rate(cell[f"{name} nonprivate"])[0], 4),
                         "in_target": bool(TARGET[0] <= p <= TARGET[1]),
                         "clipped_rows_per_fit": round(float(cell["clipped_rows"].mean()), 3)})
    return rows


def _order(table: pd.DataFrame) -> pd.DataFrame:
    keys = {"design": list(DESIGNS), "test": list(TESTS), "alternative": list(HYPOTHESES)}
    by = [k for k in ("alternative", "design", "n", "total_rho", "test") if k in table.columns]
    return table.sort_values(by, key=lambda s: s.map(keys[s.name].index) if s.name in keys else s,
                             ignore_index=True)


def size_table(fits: pd.DataFrame) -> pd.DataFrame:
    return _order(pd.DataFrame(_rows(fits, "null", TESTS), columns=["alternative", *SIZE_COLUMNS]))[SIZE_COLUMNS]


def power_table(fits: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for alternative in HYPOTHESES[1:]:
        rows += _rows(fits, alternative, [t for t, alt in TESTS.items() if alt == alternative])
    return _order(pd.DataFrame(rows, columns=[*POWER_COLUMNS, "in_target", "clipped_rows_per_fit"]))[POWER_COLUMNS]


def effective_f_table(fits: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (design, n, rho), cell in fits.groupby(["design", "n", "total_rho"], sort=False):
        truth = cell["f_nonprivate"].to_numpy()
        below = float(np.mean(truth < cell["f_lower"]))
        above = float(np.mean(truth > cell["f_upper"]))
        coverage = 1.0 - below - above
        rows.append({"design": design, "n": n, "total_rho": rho, "runs": len(cell), "coverage": round(coverage, 4),
                     "mc_se": round(math.sqrt(coverage * (1 - coverage) / len(cell)), 4),
                     "share_below": round(below, 4), "share_above": round(above, 4),
                     "mean_width_rel": round(float(np.mean((cell["f_upper"] - cell["f_lower"]) / truth)), 4),
                     "median_f_nonprivate": float(f"{np.median(truth):.4g}"),
                     "median_f_private": float(f"{np.median(cell['f_private']):.4g}"),
                     "share_weak_private": round(float(np.mean(cell["f_weak"])), 4)})
    return _order(pd.DataFrame(rows, columns=EFFECTIVE_F_COLUMNS))


def write_tables(fits: pd.DataFrame, outdir: Path) -> dict[str, pd.DataFrame]:
    tables = {"iv_tests_size.csv": size_table(fits), "iv_tests_power.csv": power_table(fits),
              "iv_tests_effective_f.csv": effective_f_table(fits)}
    for name, table in tables.items():
        table.to_csv(outdir / name, index=False)
    return tables


def main(argv=None) -> dict[str, pd.DataFrame]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="n = 1e3, rho = 2.6, R = 5 (a smoke run)")
    parser.add_argument("--runs", type=int, help="R for every cell (default: runs_for, module docstring)")
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    parser.add_argument("--outdir", help="where the three CSVs go (default: a fresh temporary directory)")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    outdir = Path(args.outdir) if args.outdir else Path(tempfile.mkdtemp(prefix="iv_tests_"))
    outdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    fits = simulate(quick=args.quick, runs=args.runs, jobs=args.jobs, progress_every=0 if args.quick else 10)
    tables = write_tables(fits, outdir)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_rows", 200):
        for name, table in tables.items():
            print(f"\n{name}\n{table.to_string(index=False)}")
    size = tables["iv_tests_size.csv"]
    large = size[size.n >= 10_000]
    outside = large[~large.in_target]
    print(f"\nsize, n >= 1e4: {len(large) - len(outside)} of {len(large)} rates in [{TARGET[0]}, {TARGET[1]}]"
          + "".join(f"\n  outside: {r.design} n={r.n} rho={r.total_rho} {r.test}: {r.rejection_private:.4f} "
                    f"(MC s.e. {r.mc_se:.4f}; non-private {r.rejection_nonprivate:.4f})" for r in outside.itertuples()))
    ef = tables["iv_tests_effective_f.csv"]
    print(f"effective F coverage: {ef.coverage.min():.4f}-{ef.coverage.max():.4f} "
          f"({int((ef.coverage >= 0.93).sum())} of {len(ef)} cells >= 0.93)")
    print(f"{time.perf_counter() - t0:.0f} s, {len(fits)} fits; written to {outdir}")
    return tables


if __name__ == "__main__":
    main()
