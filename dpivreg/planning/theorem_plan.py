"""Planning with the Theorem's bound: the bound of Theorem 1 tabulated over T (:func:`plan`), and the smallest
sample size (:func:`smallest_n`) or budget (:func:`smallest_rho`) that brings it to a target.

All numbers are up to constants (c = 1) and functions of public quantities only (sample size, dimensions, budgets,
iterations): nothing here reads data or costs privacy. The bound's terms live in :mod:`dpivreg.estimation.theory`.

How the recommended T grows with n
----------------------------------
After the regime remark the paper says the optimal T is "sub-linear but super-logarithmic"
in n. For the bound as stated (constants 1) the minimiser T* of the total solves
``log(1/κ) √T κ^(T/2) = √p(√q+√τ)³/(n√min(ρ1, ρ2))``, which gives

    T*(n) = (2 log n + log T*(n) + O(1)) / log(1/κ) = (2 log n + log log n + O(1)) / log(1/κ),

so T* is sub-linear, but T*/log n → 2/log(1/κ): T* is Θ(log n), logarithmic, growing by
about ``2 log(10)/log(1/κ)`` per decade of n (≈ 6.6 at κ = 1/2). Over practical ranges
T*/log n does increase (it approaches its limit from below), which can look
super-logarithmic. The statement is right for the *plateau*: the statistical term
dominates for T between the end of the optimization regime (∝ log n) and the start of the
privacy regime (∝ n), so any T with log n ≪ T ≪ n keeps the bound within a factor 3 of
the statistical term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from dpivreg._validation import check_count, check_rho, check_T, check_tau
from dpivreg.estimation.theory import (
    DEFAULT_TAU,
    ErrorBound,
    RegimeBoundaries,
    _check_dims,
    _check_kappa,
    _check_n,
    _check_scalar_T,
    _check_start_error,
    _check_target,
    _fmt,
    _privacy_coef,
    _real,
    _statistical,
    _terms,
    error_bound,
    initial_error,
    regime_boundaries,
)

__all__ = ["Plan", "plan", "recommended_T", "smallest_n", "smallest_rho", "T_MAX_CAP"]

#: Largest default ``T_max`` chosen by :func:`plan`.
T_MAX_CAP = 10**6


# Largest sample size smallest_n searches before declaring a target unreachable.
_N_SEARCH_CAP = 2**62


# Relative resolution of the bisection in smallest_rho.
_RHO_RTOL = 1e-12


def _total_at(T: int, kappa: float, a: float, s: float) -> float:
    return float(_terms(np.array([float(T)]), kappa, a, s)[3][0])


def _first_true(pred: Callable[[int], bool], lo: int, hi: int) -> int:
    """Smallest integer in [lo, hi] where the monotone predicate ``pred`` holds (it holds at hi)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _argmin_T(kappa: float, a: float, s: float) -> int:
    """Smallest integer T >= 1 minimising κ^(T/2) + a√T + s as evaluated in floating point.

    With L = log(1/κ), the derivative has the sign of ``a − L·√T·κ^(T/2)``. The function
    g(T) = √T κ^(T/2) increases up to T = 1/L and decreases afterwards, so the total
    increases on [1, 1/L] (when 1/L > 1), decreases down to the root T₂ of
    ``L·g(T) = a`` on the decreasing branch of g and increases afterwards. The integer
    minimiser is therefore 1, ⌊T₂⌋ or ⌈T₂⌉; T₂ is found by bisection on
    ``log L + ½ log T − ½ L T − log a``. Ties in floating point go to the smallest T.
    With ``a = 0`` (no privacy noise) the total decreases for ever; the returned T is then the
    first one at which it equals its limit ``s`` in floating point.
    """
    total = lambda T: _total_at(T, kappa, a, s)  # noqa: E731
    if a == 0.0:
        limit = float(np.float64(0.0) + np.float64(0.0) + np.float64(s))
        hi = 1
        while total(hi) > limit and hi < _N_SEARCH_CAP:
            hi *= 2
        return _first_true(lambda T: total(T) <= limit, max(1, hi // 2), hi)
    L = -math.log(kappa)
    T_peak = 1.0 / L
    log_a = math.log(a)

    def h(T: float) -> float:  # > 0 where the total decreases
        return math.log(L) + 0.5 * math.log(T) - 0.5 * L * T - log_a

    lo = max(1.0, T_peak)
    if h(lo) <= 0.0:
        return 1  # the total never decreases on [1, inf)
    hi = 2.0 * lo
    while h(hi) > 0.0:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 0.25:
        mid = 0.5 * (lo + hi)
        if h(mid) > 0.0:
            lo = mid
        else:
            hi = mid
    # T2 lies in (lo, hi); the integer minimiser is ⌊T2⌋ or ⌈T2⌉, both in [⌊lo⌋, ⌈hi⌉]
    candidates = sorted({1, *range(max(1, math.floor(lo)), max(1, math.ceil(hi)) + 1)})
    values = [total(T) for T in candidates]
    best = min(values)
    T_best = candidates[values.index(best)]
    if total(1) <= best:
        return 1
    # smallest T reaching the same floating-point value on the decreasing stretch
    start = min(T_best, max(1, math.floor(T_peak) + 1))
    return _first_true(lambda T: total(T) <= best, start, T_best)


# ----------------------------------------------------------------------------------------
# 6. planning: recommended T, plan(), smallest n and ρ
# ----------------------------------------------------------------------------------------
def _coefficients(
    n: float, p: float, q: float, rho1: float, rho2: float, tau: float
) -> tuple[float, float]:
    """(privacy coefficient a, statistical term s) of total(T) = κ^(T/2) + a√T + s (validated inputs)."""
    return _privacy_coef(n, p, q, min(rho1, rho2), tau), _statistical(n, p, q, tau)


def recommended_T(
    n: float, p: float, q: float, rho1: float, rho2: float, *, tau: float = DEFAULT_TAU, kappa: float = 0.5
) -> int:
    """The integer T >= 1 minimising the bound of Theorem 1, eq. (e_beta(T) bound thm2), c = 1.

    Computed without a table (works for any n): the minimiser solves
    ``log(1/κ) √T κ^(T/2) = √p(√q+√τ)³/(n√min(ρ1,ρ2))`` (bisection), then the integers
    around it and T = 1 are compared; ties in floating point go to the smallest T. With both
    budgets infinite the bound decreases for ever (Corollary 1) and the first T at which it
    equals the statistical term in floating point is returned. The T condition is *not*
    imposed; check it with :func:`t_condition`.

    Asymptotically ``T* = (2 log n + log log n + O(1)) / log(1/κ)``: sub-linear and
    Θ(log n) (see "How the recommended T grows with n" in the module docstring).

    Parameters
    ----------
    n, p, q, rho1, rho2, tau, kappa
        As in :func:`error_bound`.

    Returns
    -------
    int
    """
    n = _check_n(n)
    p, q = _check_dims(p, q)
    rho1, rho2 = check_rho(rho1, "rho1"), check_rho(rho2, "rho2")
    tau, kappa = check_tau(tau), _check_kappa(kappa)
    return _argmin_T(kappa, *_coefficients(n, p, q, rho1, rho2, tau))


@dataclass(frozen=True, eq=False)
class Plan:
    """The bound of Theorem 1 as a function of T, with the recommended number of iterations.

    Built by :func:`plan`; all numbers are up to constants (c = 1).

    Attributes
    ----------
    n, p, q, rho1, rho2, tau, kappa : float
        The inputs.
    table : pandas.DataFrame
        Indexed by ``T = 1 … T_max`` (index name ``"T"``), columns ``optimization``,
        ``privacy``, ``statistical`` and ``total``.
    recommended_T : int
        The T minimising the total (ties → smallest T); equal to the table's argmin when it
        lies in the table.
    t_condition_limit : float
        Largest T allowed by the T condition (``inf`` when ``rho1`` is infinite).
    regime_boundaries : RegimeBoundaries
        Boundaries of the regimes.
    bound : ErrorBound
        The bound at ``recommended_T``.
    init : str
        The starting point planned for (``"zero"`` or ``"moments"``).
    """

    n: float
    p: float
    q: float
    rho1: float
    rho2: float
    tau: float
    kappa: float
    table: pd.DataFrame
    recommended_T: int
    t_condition_limit: float
    regime_boundaries: RegimeBoundaries
    bound: ErrorBound
    init: str = "zero"

    @property
    def T_max(self) -> int:
        """Largest T in the table."""
        return int(self.table.index[-1])

    def summary(self) -> str:
        """A few lines of text describing the plan."""
        b, rb = self.bound, self.regime_boundaries
        lines = [
            "DP-2S-GD error-bound plan (Theorem 1, up to constants, c = 1)",
            f"  n = {self.n:g}, p = {self.p:g}, q = {self.q:g}, rho1 = {self.rho1:g}, rho2 = {self.rho2:g}, "
            f"tau = {self.tau:g}, kappa = {self.kappa:g}, start = {self.init}",
            f"  recommended T     : {self.recommended_T}  (bound {_fmt(b.total)} = optimization "
            f"{_fmt(b.optimization)} + privacy {_fmt(b.privacy)} + statistical {_fmt(b.statistical)})",
            f"  regime at that T  : {b.regime}",
            f"  regime boundaries : optimization-dominated up to T ≈ {_fmt(rb.end_optimization)}, "
            f"privacy-dominated from T ≈ {_fmt(rb.start_privacy)}, T condition up to T ≈ {_fmt(rb.t_limit)}",
            f"  T condition       : {b.t_condition.describe()} at the recommended T",
            f"  n condition       : {b.n_condition.describe()} (n ≥ {_fmt(b.n_condition.limit)})",
            f"  table             : T = 1 … {self.T_max}",
        ]
        if self.recommended_T > self.T_max:
            lines.append("  note              : the recommended T lies beyond the table's T_max")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()

    def plot(self, ax=None):
        """Plot the three terms and their sum against T on log axes (the paper's Figure 1 sketch).

        The recommended T is marked; the T condition limit (when inside the table) is drawn
        as a dashed vertical line with the region beyond it shaded. Tables longer than a few
        thousand rows are subsampled on a logarithmic grid.

        Parameters
        ----------
        ax : matplotlib.axes.Axes, optional
            Axes to draw on; a new figure is created when omitted.

        Returns
        -------
        matplotlib.axes.Axes
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError as exc:  # pragma: no cover - exercised with matplotlib hidden
            raise ImportError(
                "Plan.plot needs matplotlib, which is not installed; install it with "
                "`pip install dpivreg[plot]` (or `pip install matplotlib`)."
            ) from exc
        if ax is None:
            _, ax = plt.subplots(figsize=(6.4, 4.2))
        table = self.table
        if len(table) > 4000:
            rows = np.unique(np.geomspace(1, len(table), 2000).astype(int)) - 1
            table = table.iloc[rows]
        T = table.index.to_numpy(dtype=float)
        ax.plot(T, table["optimization"], label=r"optimization $\kappa^{T/2}$", color="tab:blue")
        if np.any(table["privacy"].to_numpy() > 0):
            ax.plot(T, table["privacy"], label=r"privacy $\propto \sqrt{T}/(n\sqrt{\rho})$", color="tab:orange")
        ax.plot(T, table["statistical"], label=r"statistical $\propto 1/\sqrt{n}$", color="tab:green")
        ax.plot(T, table["total"], label="total", color="black", linewidth=2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        T_rec = self.recommended_T
        if T_rec <= self.T_max:
            ax.axvline(T_rec, color="gray", linestyle=":")
            ax.plot([T_rec], [self.bound.total], "o", color="black", label=f"recommended T = {T_rec}")
        if self.t_condition_limit <= self.T_max:
            ax.axvline(self.t_condition_limit, color="tab:red", linestyle="--", label="T condition limit")
            ax.axvspan(self.t_condition_limit, self.T_max, color="tab:red", alpha=0.08)
        positive = table[["privacy", "statistical"]].to_numpy()
        floor = positive[positive > 0].min() if np.any(positive > 0) else self.bound.statistical
        ax.set_ylim(bottom=floor / 10.0, top=float(table["total"].max()) * 2.0)
        ax.set_xlim(1, self.T_max)
        ax.set_xlabel("T (iterations)")
        ax.set_ylabel(r"bound on $\|\beta^{(T)} - \hat\beta\|$ (c = 1)")
        ax.set_title(
            f"n = {self.n:g}, p = {self.p:g}, q = {self.q:g}, "
            f"ρ1 = {self.rho1:g}, ρ2 = {self.rho2:g}, κ = {self.kappa:g}"
        )
        ax.legend(fontsize="small")
        return ax


def _default_T_max(T_rec: int, t_limit: float) -> int:
    """max(100, 4·recommended T, ⌈2·T limit⌉ when that is at most 10 times the others), capped at
    :data:`T_MAX_CAP`: the table passes the minimum and shows the T condition when it is nearby,
    without hundreds of thousands of rows when the limit is far away (n = 31,857 gives 2e5)."""
    base = max(100, 4 * T_rec)
    candidates = [base]
    if math.isfinite(t_limit) and 2.0 * t_limit <= 10 * base:
        candidates.append(math.ceil(2.0 * t_limit))
    return int(min(T_MAX_CAP, max(candidates)))


def plan(
    n: float,
    p: float,
    q: float,
    rho1: float,
    rho2: float,
    *,
    tau: float = DEFAULT_TAU,
    kappa: float = 0.5,
    T_max: int | None = None,
    init: str = "zero",
    start_error: float | None = None,
) -> Plan:
    """Tabulate the bound of Theorem 1 (eq. (e_beta(T) bound thm2)) over T and recommend a T.

    Up to constants, c = 1. The Theorem starts from zero (the Algorithm, ``fit(init="zero")``). From a warm
    start (``init="moments"``, the default fit) the optimisation term κ^(T/2) is multiplied by the start's
    distance to β̂: by default the statistical term, i.e. a start as good as 2SLS up to constants (the
    released moments are precise enough to whiten the instruments, hence to give a consistent 2SLS), so
    that far fewer steps are recommended. (The default fit chooses its T from the moment release's
    whitening error instead, see :mod:`dpivreg.estimation.tuning`; this plan shows the Theorem's view of it.)

    Parameters
    ----------
    n : float
        Sample size, ``>= 1``.
    p, q : float
        Number of regressors and of instruments (``1 <= p <= q``).
    rho1, rho2 : float
        zCDP budgets of the two stages (``> 0``; ``math.inf`` allowed).
    tau : float, default 5
        Confidence parameter τ > 0.
    kappa : float, default 0.5
        Contraction rate in (0, 1). Under this module's definitions κ ≥ 1/2, so 0.5 is the
        most optimistic value.
    T_max : int, optional
        Largest T of the table. Default: ``max(100, 4·recommended T)``, extended to
        ``⌈2·T condition limit⌉`` when that is at most ten times as far, capped at ``10**6``:
        enough to pass the minimum of the total, and the T condition limit when it is nearby.
    init : {"zero", "moments"}, default "zero"
        The starting point of the fit being planned.
    start_error : float, optional
        The optimisation term's factor (the start's distance to β̂, up to constants): 1 for ``"zero"``, the
        statistical term for ``"moments"`` unless given.

    Returns
    -------
    Plan
    """
    n = _check_n(n)
    p, q = _check_dims(p, q)
    rho1, rho2 = check_rho(rho1, "rho1"), check_rho(rho2, "rho2")
    tau, kappa = check_tau(tau), _check_kappa(kappa)
    if init not in ("zero", "moments"):
        raise ValueError(f"init must be 'zero' or 'moments', got {init!r}.")
    a, s = _coefficients(n, p, q, rho1, rho2, tau)
    start_error = _check_start_error(initial_error(init, n, p, q, tau) if start_error is None else start_error)
    # start_error·κ^(T/2) + a√T + s = start_error·(κ^(T/2) + (a/c)√T + s/c): the same argmin problem
    T_rec = _argmin_T(kappa, a / start_error, s / start_error)
    bounds = regime_boundaries(n, p, q, rho1, rho2, tau, kappa, start_error=start_error)
    if T_max is None:
        T_max = _default_T_max(T_rec, bounds.t_limit)
    else:
        T_max = check_T(check_count(T_max, "T_max", what="an integer number of iterations", integral_floats=True),
                        "T_max")
    T_grid = np.arange(1, T_max + 1, dtype=float)
    opt, priv, stat, total = _terms(T_grid, kappa, a, s)
    opt = opt * start_error
    total = opt + priv + stat
    table = pd.DataFrame(
        {"optimization": opt, "privacy": priv, "statistical": stat, "total": total},
        index=pd.RangeIndex(1, T_max + 1, name="T"),
    )
    if T_rec <= T_max:
        # the table's own argmin (first occurrence = smallest T) guards against last-ulp
        # differences between scalar and vectorised evaluation
        T_rec = int(np.argmin(total)) + 1
    return Plan(
        n=n,
        p=p,
        q=q,
        rho1=rho1,
        rho2=rho2,
        tau=tau,
        kappa=kappa,
        table=table,
        recommended_T=T_rec,
        t_condition_limit=bounds.t_limit,
        regime_boundaries=bounds,
        bound=error_bound(n, p, q, T_rec, rho1, rho2, tau=tau, kappa=kappa, start_error=start_error),
        init=init,
    )


def _bound_at(
    n: float, p: float, q: float, rho1: float, rho2: float, T: float | None, tau: float, kappa: float
) -> float:
    """Total bound at fixed T, or at the recommended T when T is None (validated inputs)."""
    a, s = _coefficients(n, p, q, rho1, rho2, tau)
    if T is None:
        T = _argmin_T(kappa, a, s)
    return _total_at(T, kappa, a, s)


def smallest_n(
    target: float,
    p: float,
    q: float,
    rho1: float,
    rho2: float,
    *,
    T: int | None = None,
    tau: float = DEFAULT_TAU,
    kappa: float = 0.5,
) -> int:
    """Smallest integer n whose bound (Theorem 1, eq. (e_beta(T) bound thm2), c = 1) is ≤ ``target``.

    The bound is evaluated at the given ``T`` or, when ``T`` is None, at the recommended T
    of each n (:func:`recommended_T`). It decreases in n, so the answer is found by
    doubling and integer bisection. The returned n is not forced to satisfy the n or T
    conditions; check them with :func:`error_bound`.

    Parameters
    ----------
    target : float
        Error level > 0.
    p, q, rho1, rho2, tau, kappa
        As in :func:`error_bound`.
    T : int, optional
        Fixed number of iterations (``>= 1``); None uses the recommended T of each n.

    Returns
    -------
    int

    Raises
    ------
    ValueError
        When no n reaches ``target``: at fixed T the bound never falls below the
        optimization term ``κ^(T/2)``.
    """
    target = _check_target(target)
    p, q = _check_dims(p, q)
    rho1, rho2 = check_rho(rho1, "rho1"), check_rho(rho2, "rho2")
    tau, kappa = check_tau(tau), _check_kappa(kappa)
    if T is not None:
        T = _check_scalar_T(T)
        floor = float(np.power(kappa, T / 2.0))
        if target <= floor:
            raise ValueError(
                f"target = {target:g} is unreachable at T = {T:g}: the bound never falls below the "
                f"optimization term κ^(T/2) = {floor:.4g}, whatever n. Increase T or the target."
            )
    reaches = lambda n: _bound_at(float(n), p, q, rho1, rho2, T, tau, kappa) <= target  # noqa: E731
    hi = 1
    while not reaches(hi):
        if hi >= _N_SEARCH_CAP:
            raise ValueError(f"target = {target:g} is not reached by any n up to {_N_SEARCH_CAP:.3g}.")
        hi *= 2
    return _first_true(reaches, max(1, hi // 2), hi)


def smallest_rho(
    target: float,
    n: float,
    p: float,
    q: float,
    *,
    T: int | None = None,
    split: float = 0.5,
    tau: float = DEFAULT_TAU,
    kappa: float = 0.5,
) -> float:
    """Smallest total budget ρ = ρ1 + ρ2 whose bound (Theorem 1, c = 1) is ≤ ``target``.

    The budget is split as ``ρ1 = split·ρ``, ``ρ2 = (1 − split)·ρ``. The bound (eq.
    (e_beta(T) bound thm2)) at the given ``T``, or at the recommended T of each ρ when ``T``
    is None, decreases in ρ; the answer is found by geometric bisection to a relative
    precision of 1e-12 and the returned ρ reaches the target. ``math.inf`` is returned when
    only infinite budgets reach it. The T condition (which involves ρ1) is not imposed.

    Parameters
    ----------
    target : float
        Error level > 0.
    n, p, q, tau, kappa
        As in :func:`error_bound`.
    T : int, optional
        Fixed number of iterations (``>= 1``); None uses the recommended T of each ρ.
    split : float, default 0.5
        Share of the budget given to the first stage, in (0, 1).

    Returns
    -------
    float

    Raises
    ------
    ValueError
        When even ρ = inf does not reach ``target`` (the optimization plus statistical
        terms at T, or the statistical term alone when T is None, are above it).
    """
    target = _check_target(target)
    n = _check_n(n)
    p, q = _check_dims(p, q)
    split = _real(split, "split")
    if not 0.0 < split < 1.0:
        raise ValueError(f"split (first-stage share of the budget) must lie strictly between 0 and 1, got {split!r}.")
    tau, kappa = check_tau(tau), _check_kappa(kappa)
    if T is not None:
        T = _check_scalar_T(T)

    def bound(rho: float) -> float:
        return _bound_at(n, p, q, split * rho, (1.0 - split) * rho, T, tau, kappa)

    best_possible = bound(math.inf)
    if best_possible > target:
        where = f"at T = {T:g}" if T is not None else "at any T"
        raise ValueError(
            f"target = {target:g} is unreachable for n = {n:g} even with rho = inf {where}: "
            f"the bound without privacy noise is {best_possible:.4g}. Increase n or the target."
        )
    lo, hi = 1.0, 1.0
    if bound(hi) <= target:
        while bound(lo) <= target:
            if lo < 1e-300:
                return lo
            hi, lo = lo, lo / 2.0
    else:
        while bound(hi) > target:
            if hi > 1e300:
                return math.inf
            lo, hi = hi, hi * 2.0
    while hi / lo - 1.0 > _RHO_RTOL:
        mid = math.sqrt(lo * hi)
        if bound(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi
