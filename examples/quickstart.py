"""Quick start: a private IV regression on the Angrist–Evans labour-supply data, then a plan for T.

The README example: the effect of the number of children on the mother's weeks worked, with
``samesex`` (first two children of the same sex) as the instrument, fitted with the default private
pipeline at ρ1 = ρ2 = 1 (plus the moment, clipping, inference and diagnostics budgets, 2.7 in total, reported in
the summary) and the public bounds of ``LABSUP_BOUNDS``: DP-2S-GD from a warm start, or noisy-moment
2SLS where the pilot releases predict it to be more accurate (``method="auto"``). Then
``dpivreg.planning.theorem_plan.plan`` tabulates the Theorem's error bound over T for this problem's size and
recommends a T (free: it reads no data).

    python examples/quickstart.py

(``--quick`` and ``--outdir`` are accepted for uniformity with the other examples; this script
writes no files.)
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from dpivreg import DPIV2SLS
from dpivreg.datasets import LABSUP_BOUNDS, load_labsup
from dpivreg.planning.theorem_plan import plan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="accepted for uniformity; the script is already quick")
    ap.add_argument("--outdir", type=Path, default=None, help="unused (this script writes no files)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the privacy noise")
    args = ap.parse_args(argv)

    df = load_labsup()
    formula = "weeks ~ 1 + [kids ~ samesex]"
    # Public bounds from the survey's definitions, not from the data. LABSUP_BOUNDS covers more
    # columns than this model uses, and fit() rejects bounds for columns outside the design.
    bounds = {column: LABSUP_BOUNDS[column] for column in ("weeks", "kids", "samesex")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a PrivacyLeakWarning here would be a bug in this example
        res = DPIV2SLS.from_formula(formula, df).fit(rho1=1, rho2=1, bounds=bounds, seed=args.seed)
    print(res.summary())
    print()
    print(f"private estimate beta(kids) = {res.params['kids']:.3f}, 95% CI "
          f"[{res.conf_int().loc['kids', 'lower']:.3f}, {res.conf_int().loc['kids', 'upper']:.3f}]; "
          f"total rho = {res.privacy.rho:.3g} (epsilon = {res.epsilon:.3g} at delta = {res.delta:g})")

    # Planning T before touching the data: n and the dimensions are public. The design has
    # p = 2 regressors (intercept, kids) and q = 2 instruments (intercept, samesex).
    n, p, q = res.nobs, len(res.design.regressor_names), len(res.design.z_names)
    print()
    pl = plan(n, p, q, rho1=1.0, rho2=1.0, init="moments")  # the default fit starts from the private moments
    print(pl.summary())
    print(f"\nplan(n={n}, p={p}, q={q}, rho1=1, rho2=1, init='moments').recommended_T = {pl.recommended_T} "
          f"(the fit chose T = {res.settings.T} from its moment release)")
    print("bound components (constants 1) around it:")
    lo, hi = max(1, pl.recommended_T - 3), pl.recommended_T + 3
    print(pl.table.loc[lo:hi].to_string(float_format=lambda v: f"{v:.4g}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
