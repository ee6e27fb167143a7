"""What the private inference costs: a fit with it against the same fit with ``inference=False``.

For each T (the default rule's, and fixed T), on the workflow benchmark's data (``workflow_speed.py``, plain
formula ``y ~ 1 + w + [x ~ z]``, its public bounds), this prints the wall time of
``model.fit(rho1=1, rho2=1, bounds=..., seed=1, T=T)`` with and without inference (best of ``--repeats``), their
ratio and the number of noise-simulation paths the inference drew (its
stopping rule, :data:`dpivreg.inference.private.MIN_REPLICATIONS` first, at most 2000).

Target (issue 15, item 4): ratio ≤ 1.5 at n = 10⁵ for T ≤ 1,000.

    python benchmarks/inference_cost.py             # n = 1e5, T ∈ {default, 20, 100, 1000}
    python benchmarks/inference_cost.py --quick     # n = 2e4, T ∈ {default, 20} (the tests run it)
"""

from __future__ import annotations

import argparse
import time
import warnings

from workflow_speed import _bounds_for, make_frame


def timed_fit(model, bounds, repeats: int, **options):
    """(best wall time over ``repeats`` fits, the last fit)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        res = model.fit(rho1=1, rho2=1, bounds=bounds, seed=1, **options)
        times.append(time.perf_counter() - start)
    return min(times), res


def measure(n: int, steps: list[int | None], repeats: int) -> list[dict]:
    import dpivreg

    model = dpivreg.DPIV2SLS.from_formula("y ~ 1 + w + [x ~ z]", make_frame(n))
    bounds = _bounds_for(model)
    model.fit(rho1=1, rho2=1, bounds=bounds, seed=1)  # warm-up: numba's kernels, imports
    rows = []
    for T in steps:
        options = {} if T is None else {"T": T}
        with_s, res = timed_fit(model, bounds, repeats, **options)
        without_s, _ = timed_fit(model, bounds, repeats, inference=False, **options)
        rows.append({"n": n, "T": res.engine_path.plan.T, "rule": "default" if T is None else "fixed",
                     "with_s": with_s, "without_s": without_s, "ratio": with_s / without_s,
                     "paths": res.inference.replications})
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="n = 2e4, T in {default, 20}, one repeat")
    parser.add_argument("--n", type=float, default=1e5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    n, steps, repeats = (20_000, [None, 20], 1) if args.quick else (int(args.n), [None, 20, 100, 1000], args.repeats)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the benchmark's fits announce nothing a reader of the table needs
        rows = measure(n, steps, repeats)
    print(f"{'n':>9} {'T':>6} {'rule':>8} {'with s':>9} {'without s':>10} {'ratio':>6} {'paths':>6}")
    for row in rows:
        print(f"{row['n']:9.0e} {row['T']:6d} {row['rule']:>8} {row['with_s']:9.3f} {row['without_s']:10.3f} "
              f"{row['ratio']:6.2f} {row['paths']:6d}")
    return rows


if __name__ == "__main__":
    main()
