"""White-box privacy audits: claimed μ vs the audited lower bound μ_lb.

DP-2S-GD: the audit of ``tests/test_privacy_audit.py`` (canary neighbours, Gaussian
log-likelihood-ratio statistic on the released path, Clopper–Pearson bounds at 1 − 5e-4 each;
n = 50, q = 3, p = 2, T = 10, ρ1 = 1.5, ρ2 = 1 for "exact"; the paper's calibration at nominal
ρ1 = 3, ρ2 = 2), for ``method="gd"`` and ``method="preconditioned"`` (the auditor rebuilds
P_t^(−1/2) from the released Θ⁽ᵗ⁾), and deliberately broken engines.

Second moments (``dpivreg.privacy.mechanisms.box_second_moments``, the pipeline's release, and
``ball_second_moments``, "Analyze Gauss"): the audit of ``tests/test_moments_audit.py`` (neighbours
differing in one worst-case row, LLR on the released upper triangle), correct and broken variants.

Clipping thresholds (``dpivreg.estimation.clipping.adaptive_clip``): the audit of ``tests/test_clipping_audit.py`` (LLR
on the released histogram counts; and a distinguisher on the released thresholds). Grouped, scheduled
iteration: the audit of ``tests/test_grouped_audit.py`` (per-group LLR on every active step; a Gaussian model
fitted on half the runs; the exogenous group alone).

    python benchmarks/privacy_audit.py                 # the tables, 2,000 runs per dataset
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
import test_clipping_audit as clipping  # noqa: E402
import test_grouped_audit as grouped  # noqa: E402
import test_moments_audit as moments  # noqa: E402
import test_privacy_audit as audit  # noqa: E402


def _case(name, calibration="exact", n_exog=0, rhos=(audit.RHO1, audit.RHO2), bug=None, method="gd",
          second_moment="identity", blank=None, seed=None):
    """A DP-2S-GD audit case; ``bug`` names an entry of ``audit.BROKEN`` (which fixes the method and, unless
    given, the neighbours)."""
    if bug is not None:
        method = audit.BROKEN[bug].method
        blank = audit.BROKEN[bug].blank if blank is None else blank
    blank = bool(blank)
    return dict(name=name, calibration=calibration, n_exog=n_exog, rhos=rhos, bug=bug, method=method,
                second_moment=second_moment, blank=blank, seed=seed)


# claimed μ = what the user asked for / was told; seeds are those of the tests (303 for the bugs)
CASES = [
    _case("exact", seed=101),
    _case("exact, n_exog=1", n_exog=1, seed=101),
    _case("paper (nominal rho)", "paper", rhos=(2 * audit.RHO1, 2 * audit.RHO2), seed=202),
    _case("precond", method="preconditioned", seed=404),
    _case("precond, n_exog=1, S", n_exog=1, method="preconditioned", second_moment="skewed", seed=404),
    _case("precond, blank rows", method="preconditioned", blank=True, seed=404),
    _case("halved noise", bug="halved_noise"),
    _case("mean clipping", bug="mean_clipping"),
    _case("whiten after clip", bug="whiten_after_clipping"),
    # the same bug on the ordinary neighbours: it leaks more (true μ ≈ 3.3) but is NOT caught, because the
    # ordinary rows' clipped means differ from the claimed ones and shift S (see the teeth test's docstring)
    _case("whiten after clip, ordinary", bug="whiten_after_clipping", blank=False),
]


def one(case, seed: int, runs: int) -> audit.Audit:
    kwargs = dict(seed=seed, n_exog=case["n_exog"], runs=runs, rho1=case["rhos"][0], rho2=case["rhos"][1],
                  method=case["method"], second_moment=case["second_moment"], blank=case["blank"])
    if case["bug"] is None:
        return audit.run_audit(case["calibration"], **kwargs)
    # same injection as the test, including switching off the engine's budget self-check
    with mock.patch.multiple("dpivreg.estimation.engine", **audit.BROKEN[case["bug"]].patches(),
                             _check_spent=lambda *args, **kw: None):
        return audit.run_audit(case["calibration"], **kwargs)


def verdict(a: audit.Audit) -> str:
    if a.mu_lb > a.mu_requested:
        return "VIOLATION (mu_lb > claimed mu)"
    if a.mu_lb < audit.TIGHT * a.mu_requested:
        if a.mu_lb <= a.mu_accountant and a.mu_lb >= audit.TIGHT * a.mu_accountant:
            return "sound; not tight vs claimed, tight vs accountant"
        return "sound, not tight"
    return "sound and tight"


HEADER = (f"{'case':<26}{'claimed mu':>11}{'accountant mu':>15}{'canary mu':>11}{'FP':>6}{'FN':>6}"
          f"{'mu_lb':>8}  verdict")


def table(runs: int) -> None:
    print(f"DP-2S-GD: {runs} runs per dataset; claimed mu = sqrt(2 * requested rho); "
          "accountant mu = sqrt(2 * path.privacy.rho); canary mu = the claimed mechanism's mu on these neighbours")
    print(HEADER)
    for case in CASES:
        start = time.perf_counter()
        a = one(case, case["seed"] if case["seed"] is not None else 303, runs)
        attained = math.sqrt(float(np.mean(a.mu2[0])))
        print(f"{case['name']:<26}{a.mu_requested:>11.3f}{a.mu_accountant:>15.3f}{attained:>11.3f}{a.fp:>6d}"
              f"{a.fn:>6d}{a.mu_lb:>8.3f}  {verdict(a)}  ({time.perf_counter() - start:.1f} s)")


def moments_table(runs: int) -> None:
    print(f"\nSecond moments: {runs} runs per dataset, D = {moments.D}, n = {moments.N_ROWS}, B = {moments.B} (ball), "
          f"rho = {moments.RHO}; claimed mu = sqrt(2 * requested rho); accountant mu = sqrt(2 * Release.rho)")
    print(HEADER)
    for name, (mechanism, variant, far) in moments.TABLE_CASES.items():
        start = time.perf_counter()
        a = moments.run_audit(variant, seed=moments.SEEDS.get(name, 303), runs=runs, far=far, mechanism=mechanism)
        print(f"{name:<26}{a.mu_requested:>11.3f}{a.mu_accountant:>15.3f}{a.mu_canary:>11.3f}{a.fp:>6d}{a.fn:>6d}"
              f"{a.mu_lb:>8.3f}  {verdict(a)}  ({time.perf_counter() - start:.2f} s)")


def _row(name: str, claimed: float, lbs: dict, start: float) -> None:
    shown = "  ".join(f"{k} {v:.3f}" for k, v in lbs.items())
    best = max(lbs.values())
    word = "VIOLATION (mu_lb > claimed mu)" if best > claimed else (
        "sound and tight" if best >= audit.TIGHT * claimed else "sound, not tight")
    print(f"{name:<26}{claimed:>11.3f}  {shown}  {word}  ({time.perf_counter() - start:.1f} s)")


def clipping_table(runs: int) -> None:
    print(f"\nClipping thresholds: {runs} runs per dataset, G = {clipping.G} histograms, n = {clipping.N_ROWS}, "
          f"rho = {clipping.RHO}; mu_lb from the counts' LLR and from the released thresholds")
    claimed = math.sqrt(2 * clipping.RHO)
    for name, thunk in (("correct", lambda: clipping.run_audit(seed=21, runs=runs)),
                        ("correct, sensitive rows", lambda: clipping.run_audit(seed=22, runs=runs, sensitive=True)),
                        ("one-histogram sensitivity", lambda: clipping.broken_audit("one_histogram_sensitivity",
                                                                                     runs=runs)),
                        ("unnoised quantile", lambda: clipping.broken_audit("unnoised_quantile", runs=runs))):
        start = time.perf_counter()
        a = thunk()
        _row(name, claimed, {"counts": a["mu_lb"], "thresholds": a["mu_lb_thresholds"]}, start)


def grouped_table(runs: int) -> None:
    print(f"\nGrouped, scheduled iteration: {runs} runs per dataset, T = {grouped.T}, rho1 + rho2 = "
          f"{grouped.RHO1 + grouped.RHO2}; mu_lb from the claimed LLR, the fitted model, the exogenous group")
    claimed = math.sqrt(2 * (grouped.RHO1 + grouped.RHO2))
    for method in ("gd", "preconditioned"):
        start = time.perf_counter()
        a = grouped.run_audit(method, seed=61, runs=runs)
        _row(f"correct, {method}", claimed, {"LLR": a["mu_lb"], "fitted": a["mu_lb_fitted"],
                                             "exog": a["mu_lb_exog1"]}, start)
    for bug, (patch, exogenous_canary) in grouped.BROKEN.items():
        start = time.perf_counter()
        with mock.patch.multiple("dpivreg.estimation.engine", _check_spent=lambda *a, **k: None, **patch):
            a = grouped.run_audit("preconditioned", seed=303, runs=runs, exogenous_canary=exogenous_canary)
        _row(bug, claimed, {"LLR": a["mu_lb"], "fitted": a["mu_lb_fitted"], "exog": a["mu_lb_exog1"]}, start)


def power(n_seeds: int, runs: int) -> None:
    print(f"\nover {n_seeds} seeds ({runs} runs per dataset each): mu_lb min / mean / max, "
          "#(mu_lb > claimed mu), #(mu_lb > accountant mu), #(mu_lb < 0.8 claimed mu)")

    def line(name, audits):
        lbs = np.array([a.mu_lb for a in audits])
        acc = np.array([a.mu_accountant for a in audits])
        claimed = audits[0].mu_requested
        print(f"{name:<36} {lbs.min():.3f} / {lbs.mean():.3f} / {lbs.max():.3f}   "
              f"caught {np.sum(lbs > claimed)}/{n_seeds}   above accountant {np.sum(lbs > acc)}/{n_seeds}"
              f"   below floor {np.sum(lbs < audit.TIGHT * claimed)}/{n_seeds}")

    for case in CASES:
        line(case["name"], [one(case, 10_000 + s, runs) for s in range(n_seeds)])
    for name, (mechanism, variant, far) in moments.TABLE_CASES.items():
        line("moments: " + name, [moments.run_audit(variant, seed=10_000 + s, runs=runs, far=far, mechanism=mechanism)
                                  for s in range(n_seeds)])


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
    moments_table(args.runs)
    clipping_table(args.runs)
    grouped_table(args.runs)
    if args.power:
        power(args.power, args.runs)
    if args.verify:
        verify(args.verify)


if __name__ == "__main__":
    main()
