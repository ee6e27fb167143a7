"""White-box privacy audit of DP-2S-GD: claimed μ vs the audited lower bound μ_lb.

Uses the audit of ``tests/test_privacy_audit.py`` (canary neighbours, Gaussian log-likelihood-ratio
statistic on the released path, Clopper–Pearson bounds at 1 − 5e-4 each; n = 50, q = 3, p = 2,
T = 10, ρ1 = 1.5, ρ2 = 1 for "exact"; the paper's calibration at nominal ρ1 = 3, ρ2 = 2).

    python benchmarks/privacy_audit.py                 # the table, 2,000 runs per dataset
    python benchmarks/privacy_audit.py --power 20      # + every case over 20 seeds
    python benchmarks/privacy_audit.py --verify 20000  # + the law of the statistic with 20,000 runs
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_privacy_audit as audit  # noqa: E402

# name, calibration, n_exog, (rho1, rho2), patch (attribute, replacement) or None,
# claimed μ = what the user asked for / was told
CASES = [
    ("exact", "exact", 0, (audit.RHO1, audit.RHO2), None),
    ("exact, n_exog=1", "exact", 1, (audit.RHO1, audit.RHO2), None),
    ("paper (nominal rho)", "paper", 0, (2 * audit.RHO1, 2 * audit.RHO2), None),
    ("halved noise", "exact", 0, (audit.RHO1, audit.RHO2), audit.BROKEN["halved_noise"]),
    ("mean clipping", "exact", 0, (audit.RHO1, audit.RHO2), audit.BROKEN["mean_clipping"]),
]


def one(case, seed: int, runs: int) -> audit.Audit:
    _, calibration, n_exog, (rho1, rho2), patch = case
    if patch is None:
        return audit.run_audit(calibration, seed=seed, n_exog=n_exog, runs=runs, rho1=rho1, rho2=rho2)
    with mock.patch(f"dpivreg.engine.{patch[0]}", patch[1]):
        return audit.run_audit(calibration, seed=seed, n_exog=n_exog, runs=runs, rho1=rho1, rho2=rho2)


def verdict(a: audit.Audit) -> str:
    if a.mu_lb > a.mu_requested:
        return "VIOLATION (mu_lb > claimed mu)"
    if a.mu_lb < audit.TIGHT * a.mu_requested:
        if a.mu_lb <= a.mu_accountant and a.mu_lb >= audit.TIGHT * a.mu_accountant:
            return "sound; not tight vs claimed, tight vs accountant"
        return "sound, not tight"
    return "sound and tight"


def table(runs: int) -> None:
    print(f"{runs} runs per dataset; claimed mu = sqrt(2 * requested rho); accountant mu = sqrt(2 * path.privacy.rho)")
    print(f"{'case':<22}{'claimed mu':>11}{'accountant mu':>15}{'canary mu':>15}{'FP':>6}{'FN':>6}"
          f"{'mu_lb':>8}  verdict")
    seeds = {"exact": 101, "exact, n_exog=1": 101, "paper (nominal rho)": 202}
    for case in CASES:
        start = time.perf_counter()
        a = one(case, seeds.get(case[0], 303), runs)
        attained = math.sqrt(float(np.mean(a.mu2[0])))
        print(f"{case[0]:<22}{a.mu_requested:>11.3f}{a.mu_accountant:>15.3f}{attained:>15.3f}{a.fp:>6d}{a.fn:>6d}"
              f"{a.mu_lb:>8.3f}  {verdict(a)}  ({time.perf_counter() - start:.1f} s)")


def power(n_seeds: int, runs: int) -> None:
    print(f"\nover {n_seeds} seeds ({runs} runs per dataset each): mu_lb min / mean / max, "
          "#(mu_lb > claimed mu), #(mu_lb > accountant mu), #(mu_lb < 0.8 claimed mu)")
    for case in CASES:
        lbs, acc = [], []
        for s in range(n_seeds):
            a = one(case, 10_000 + s, runs)
            lbs.append(a.mu_lb)
            acc.append(a.mu_accountant)
        lbs = np.array(lbs)
        claimed = a.mu_requested
        print(f"{case[0]:<22} {lbs.min():.3f} / {lbs.mean():.3f} / {lbs.max():.3f}   "
              f"caught {np.sum(lbs > claimed)}/{n_seeds}   above accountant {np.sum(lbs > np.array(acc))}/{n_seeds}"
              f"   below floor {np.sum(lbs < audit.TIGHT * claimed)}/{n_seeds}")


def verify(runs: int) -> None:
    """S ~ N(±μ²/2, μ²) for the correct mechanism, with many runs."""
    print(f"\nlaw of S with {runs} runs per dataset (exact calibration)")
    for n_exog in (0, 1):
        a = audit.run_audit("exact", seed=777, n_exog=n_exog, runs=runs)
        mu = audit.mu_attained(n_exog, audit.RHO1, audit.RHO2)
        for w, sign in ((0, 1.0), (1, -1.0)):
            s = a.S[w]
            print(f"  n_exog={n_exog} world {'D' if w == 0 else 'D′'}: mean {s.mean():+.4f} "
                  f"(theory {sign * mu * mu / 2:+.4f}, se {mu / math.sqrt(runs):.4f}), sd {s.std(ddof=1):.4f} "
                  f"(theory {mu:.4f}), KS p = {stats.kstest((s - sign * mu * mu / 2) / mu, 'norm').pvalue:.3f}")
        print(f"  error rates FPR {a.fp / runs:.4f} FNR {a.fn / runs:.4f} (theory Phi(-mu/2) = "
              f"{stats.norm.cdf(-mu / 2):.4f}); noise KS p = {stats.kstest(a.noise, 'norm').pvalue:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=audit.RUNS)
    parser.add_argument("--power", type=int, default=0, metavar="SEEDS")
    parser.add_argument("--verify", type=int, default=0, metavar="RUNS")
    args = parser.parse_args()
    table(args.runs)
    if args.power:
        power(args.power, args.runs)
    if args.verify:
        verify(args.verify)


if __name__ == "__main__":
    main()
