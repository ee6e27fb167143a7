"""Shared helpers of the reproduction scripts (examples/error_vs_n.py, error_vs_T.py, angrist.py).

Not a public module: imported by the scripts, which run as ``python examples/<script>.py``
(their directory is then on ``sys.path``).

Importing it first pins the BLAS thread pools to one thread (unless the caller set them): the
fits here are many small ones, for which a multi-threaded BLAS on a shared machine is up to ten
times slower than a single thread.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from dpivreg import PrivacyLeakWarning  # noqa: E402

#: Where a script writes when ``--outdir`` is not given: ``dpivreg-output/<script>`` under the current
#: directory (created if needed, git-ignored in a checkout). Never the committed figures and tables in
#: ``DOCS_OUTDIR``: regenerating those takes an explicit ``--outdir docs/_static/reproduction``.
OUTPUT_ROOT = Path("dpivreg-output")
DOCS_OUTDIR = Path("docs/_static/reproduction")

#: The paper's practice (section 5): exact data moments for centring/scaling/whitening, the plain
#: gradient iteration with step sizes read from the data's eigenvalues, the Proposition's noise
#: calibration. Each of the first two leaks (PrivacyLeakWarning); the third spends only rho/2.
PAPER_SETTING = dict(preprocess="data", method="gd", calibration="paper", inference=False)


def default_budget(rho1: float, rho2: float) -> dict:
    """The dpivreg default's budgets for a paper split (ρ1, ρ2) at the SAME total ρ1 + ρ2: the stages scaled by
    c = 1/(1 + 0.2 + 0.05) to leave room for the default's moment release (ρ0 = 0.2 c(ρ1 + ρ2)) and clipping
    release (ρ_clip = 0.05 c(ρ1 + ρ2)); no inference release (the scripts do not use it)."""
    from dpivreg.fit_options import DEFAULT_SHARES

    c = 1.0 / (1.0 + DEFAULT_SHARES["rho0"] + DEFAULT_SHARES["rho_clip"])
    stages = c * (rho1 + rho2)
    return dict(rho1=c * rho1, rho2=c * rho2, rho0=DEFAULT_SHARES["rho0"] * stages,
                rho_clip=DEFAULT_SHARES["rho_clip"] * stages)


def parser(description: str, *, name: str, runs: int, quick_runs: int) -> argparse.ArgumentParser:
    """The common command line: --quick, --outdir (default ``dpivreg-output/<name>``), --runs, --seed."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"a few-second smoke run ({quick_runs} runs per point on a small grid), as used by the tests")
    default = OUTPUT_ROOT / name
    ap.add_argument("--outdir", type=Path, default=default,
                    help=f"where the PNG and CSV files go (default: {default}/ under the current directory, "
                         "created if needed; the documentation's committed figures are regenerated only "
                         f"with an explicit --outdir {DOCS_OUTDIR})")
    ap.add_argument("--runs", type=int, default=None,
                    help=f"runs per point (default {runs}, the paper's count; {quick_runs} with --quick)")
    ap.add_argument("--seed", type=int, default=20260101, help="master seed (all data and noise derive from it)")
    ap.set_defaults(full_runs=runs, quick_runs=quick_runs)
    return ap


def resolve_runs(args) -> int:
    if args.runs is not None:
        if args.runs < 1:
            raise SystemExit("--runs must be >= 1")
        return args.runs
    return args.quick_runs if args.quick else args.full_runs


@contextlib.contextmanager
def leaks_silenced():
    """Silence PrivacyLeakWarning inside loops of repeated fits (the scripts state the leaks once)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        yield


def closed_form_2sls(Y: np.ndarray, X: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """NON-PRIVATE 2SLS β̂ = (X̂ᵀX̂)⁻¹X̂ᵀY with X̂ = Z(ZᵀZ)⁻¹ZᵀX: the benchmark of the error plots."""
    theta_hat = np.linalg.lstsq(Z, X, rcond=None)[0]
    x_hat = Z @ theta_hat
    return np.linalg.lstsq(x_hat, Y, rcond=None)[0]


def simulated_arrays(sim) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Y, X, Z) arrays of a :func:`dpivreg.datasets.simulate_iv` draw."""
    df = sim.data
    p, q = sim.theta.shape[1], sim.theta.shape[0]
    X = df[[f"x{j + 1}" for j in range(p)]].to_numpy()
    Z = df[[f"z{j + 1}" for j in range(q)]].to_numpy()
    return df["y"].to_numpy(), X, Z


def mean_se(values) -> tuple[float, float, int]:
    """Mean, standard error of the mean and count of the finite values."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan"), 0
    se = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")
    return float(v.mean()), se, int(v.size)


def loglog_slope(x, y) -> float:
    """Least-squares slope of log(y) on log(x) over the finite, positive points."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


def print_table(title: str, headers: list[str], rows: list[list]) -> None:
    """A plain fixed-width table on stdout."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join("-" * w for w in widths)
    print(f"\n{title}")
    print(line)
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print(line)
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    print(line)


def _cell(v) -> str:
    if isinstance(v, float):
        if not np.isfinite(v):
            return "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")
        return f"{v:.4g}"
    return str(v)


class Stopwatch:
    """Wall-clock timer for the 'run time' line each script prints."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def __str__(self) -> str:
        s = self.elapsed()
        return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min ({s:.0f} s)"
