"""Planning in the coefficients' units: the private standard error to expect, and the budget a target needs.

:func:`plan_se` answers, before any data access, the two questions an applied user asks of a private
fit: *what standard error will each coefficient have at this budget?* and *what budget meets a target
standard error (or confidence-interval width)?* It plans by simulation, the standard way
to do a power analysis:

1. From public inputs only — the formula, n, the public bounds, and a-priori guesses (each variable's
   mean and SD, the first-stage strength, the structural error SD, the endogeneity correlation and,
   optionally, the coefficients) — build a synthetic population (:class:`SyntheticPopulation`).
2. Draw ``draws`` synthetic data sets of size n from it and run the package's own default fit,
   ``DPIV2SLS.from_formula(formula, synthetic).fit(rho=..., bounds=..., seed=...)``, on each.
3. The planned variance of each coefficient is V = V_sampling + V_noise(ρ), averaged over the draws:
   V_sampling is the robust (HC0) 2SLS covariance of the synthetic sample (computed exactly: the data are
   synthetic, so nothing is private and no budget is spent), V_noise the fit's privacy-noise covariance
   (``res.inference.cov_noise``, the parametric bootstrap of the whole fit, in original units).
4. For a target, V(ρ) = V_sampling + V_noise(ρ) is solved for a total ρ by a safeguarded secant search in
   log ρ (below), each step a fit at the candidate ρ on the *same* synthetic data sets and fit seeds (common
   random numbers), so the answer's planned SE is itself a fit's; the answer lies above every evaluated
   budget that misses, and further fits with fresh seeds confirm it is out of the unreliable regime.

No private data are touched, so a plan costs no privacy budget. Its cost is computation: ``draws`` fits
per budget evaluated (one budget at a given ρ; for a target the search's budgets and 8 fits per
confirmation), a few seconds per fit at
n = 10⁶. The accuracy of the planned SE against the realised private SE (the standard deviation of the
private estimate over repeated data draws and noise) is measured by ``benchmarks/plan_accuracy.py`` and
tabulated in the docs' planning page.

The Theorem's terms with constants set to 1 (:func:`dpivreg.planning.theorem_plan.plan`) remain available as the
secondary, shape-only view.
"""

from __future__ import annotations

import math
import numbers
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import optimize, stats

from dpivreg._validation import as_real, check_count, check_rho
from dpivreg.data.cross_products import iv2sls_benchmark
from dpivreg.errors import DivergenceError, InferenceOverflowError, InferenceUnavailableError, PlanningWarning
from dpivreg.estimation.moments import IQR_NORMAL
from dpivreg.model import DPIV2SLS
from dpivreg.planning.population import SyntheticPopulation, _check_keys, _mapping, synthetic_population

__all__ = ["SEPlan", "plan_se"]

#: Search range of the total budget for a target.
RHO_SEARCH = (1e-4, 1e6)
#: A plan warns (:class:`~dpivreg.errors.PlanningWarning`) when at least this share of its releases is near-singular.
NEAR_SINGULAR_WARN = 0.01
#: Further planning fits (fresh seeds) that must all be out of the unreliable regime at a budget returned for a target.
CONFIRM_SEEDS = 8


# --------------------------------------------------------------------------------------------------
# The synthetic population
# --------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------------

def _fmt(x: float) -> str:
    return f"{x:.4g}"


@dataclass(frozen=True)
class SEPlan:
    """The planned private standard errors of a fit (from :func:`plan_se`).

    Attributes
    ----------
    se : pandas.Series
        Planned private standard error of each coefficient at :attr:`rho`, named by coefficient:
        sqrt(V_sampling + V_noise).
    se_sampling, se_noise : pandas.Series
        Its two parts: the 2SLS sampling SE (no privacy) and the privacy-noise SE.
    rho : float
        The total zCDP budget planned for (``fit(rho=...)``); with a target, the budget the search settled on
        (the smallest evaluated one meeting it above every evaluated miss, confirmed with fresh seeds); ``inf``
        when none does (:attr:`unattainable` says why).
    n : int
    formula : str
    alpha : float
        Level of the intervals whose width :attr:`width` reports.
    target : pandas.Series or None
        The target SE of each targeted coefficient (a target width is converted to an SE).
    attainable : bool
        Whether the target can be met at any budget (True without a target).
    unattainable : str
        Why not, when it cannot: the sampling SE alone is above the target, or no budget met it outside the
        unreliable regime.
    search : pandas.DataFrame or None
        Every budget evaluated for a target: ``rho`` and, per targeted coefficient, the planned SE.
    population : SyntheticPopulation
        The synthetic population drawn from (the guesses used).
    draws : int
        Synthetic data sets per budget.
    fits : int
        Number of fits the plan ran.
    seconds : float
        Its computing time.
    seed : object
        The seed given (None: not reproducible).
    notes : tuple of str
        Warnings raised by the planning fits and remarks (e.g. intervals flagged unreliable).
    spread : pandas.Series
        Planned robust spread of each private estimate, IQR/1.349 (the SD for normal estimates): the
        interquartile range of the sampling distribution (normal, V_sampling) convolved with the simulated
        privacy-noise draws of the planning fits, heavy tails included. Where a few near-singular releases
        dominate the private estimate's variance, this is the scale that describes a typical fit.
    p_near_singular : float
        Planned probability that a release is near-singular: the share of the planning fits' simulated releases
        whose excluded instruments' first stage lies within its own privacy noise of a rank-deficient matrix
        (:func:`dpivreg.inference.private.near_singular_share`). Such a release puts the estimate orders of
        magnitude away. (Fits can land far for other reasons too: see the docs' planning page.)
    reliable : bool
        Whether every planning fit at :attr:`rho` had reliable intervals
        (:attr:`dpivreg.inference.private.PrivateInference.reliable`). A target is met only at such budgets.
    """

    se: pd.Series
    se_sampling: pd.Series
    se_noise: pd.Series
    rho: float
    n: int
    formula: str
    alpha: float
    target: pd.Series | None
    attainable: bool
    search: pd.DataFrame | None
    population: SyntheticPopulation = field(repr=False)
    draws: int = 1
    fits: int = 0
    seconds: float = 0.0
    seed: object = None
    notes: tuple[str, ...] = ()
    spread: pd.Series | None = None
    p_near_singular: float = 0.0
    reliable: bool = True
    _replay: tuple | None = field(default=None, repr=False, compare=False)
    unattainable: str = ""

    @property
    def width(self) -> pd.Series:
        """Planned width of the (1 − alpha) normal confidence interval, 2·z·SE."""
        return self.conf_int_width(self.alpha)

    def conf_int_width(self, alpha: float = 0.05) -> pd.Series:
        """Planned width of the (1 − ``alpha``) normal interval of each coefficient."""
        alpha = _check_alpha(alpha)
        return (2.0 * stats.norm.ppf(1 - alpha / 2) * self.se).rename("width")

    @property
    def noise_share(self) -> pd.Series:
        """Share of the planned variance that is privacy noise."""
        return (self.se_noise**2 / self.se**2).rename("noise_share")

    def to_frame(self) -> pd.DataFrame:
        """One row per coefficient: se, se_sampling, se_noise, noise_share, width, spread (and target)."""
        frame = pd.DataFrame({"se": self.se, "se_sampling": self.se_sampling, "se_noise": self.se_noise,
                              "noise_share": self.noise_share, "width": self.width, "spread": self.spread})
        if self.target is not None:
            frame["target_se"] = self.target.reindex(frame.index)
        return frame

    def summary(self) -> str:
        """A text report: the plan's inputs, the table of planned SEs and the search (with a target)."""
        pop = self.population
        level = f"{100 * (1 - self.alpha):g}%"
        lines = [
            "Planned private standard errors (simulation from public guesses; no data, no privacy cost)",
            f"  formula : {self.formula}",
            f"  n = {self.n:,}, total rho = {_fmt(self.rho)}, {level} interval widths",
            "  first-stage partial R2 : "
            + ", ".join(f"{k} {_fmt(v)}" for k, v in pop.first_stage_r2.items())
            + f"; endogeneity {_fmt(pop.endogeneity)}; error SD "
            + (_fmt(pop.error_sd) if pop.error_sd is not None else f"from sds[{pop.dependent!r}]"),
        ]
        if self.target is not None:
            tgt = ", ".join(f"{k} {_fmt(v)}" for k, v in self.target.items())
            if self.attainable:
                lines.append(f"  target SE : {tgt} -> total rho {_fmt(self.rho)} (confirmed with fresh seeds)")
            else:
                lines.append(f"  target SE : {tgt} -> NOT attainable at n = {self.n:,}: {self.unattainable}")
        table = self.to_frame().to_string(float_format=_fmt)
        lines += ["", table, ""]
        if self.search is not None:
            lines += ["  budgets evaluated:", self.search.to_string(index=False, float_format=_fmt), ""]
        lines.append(f"  P(near-singular release) = {self.p_near_singular:.3g}; intervals "
                     + ("reliable" if self.reliable else "UNRELIABLE") + f" at rho = {_fmt(self.rho)}")
        lines.append(f"  cost: {self.fits} fit(s) on {self.draws} synthetic data set(s), {self.seconds:.1f} s; "
                     f"seed {self.seed!r}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def curve(self, rhos=None) -> pd.DataFrame:
        """Planned SE, sampling SE, spread and P(near-singular) at each total budget in ``rhos``.

        Each budget is evaluated as the plan's own were: fits on the same synthetic data sets with the same seeds
        (``draws`` fits per budget), so the curve passes through :attr:`se` at :attr:`rho`.

        Parameters
        ----------
        rhos : sequence of float, optional
            Total budgets. Default: nine from ρ/100 to 100·ρ (geometric), ρ the plan's (1 when no finite
            budget was planned).

        Returns
        -------
        pandas.DataFrame
            One row per budget and coefficient: ``rho``, ``coefficient``, ``se``, ``se_sampling``, ``spread``,
            ``p_near_singular`` and ``reliable``.
        """
        if self._replay is None:
            raise ValueError("this plan holds no replay of its synthetic data; build it with plan_se.")
        centre = self.rho if math.isfinite(self.rho) else 1.0
        grid = centre * np.logspace(-2, 2, 9) if rhos is None else rhos
        values = [check_rho(r, "rhos") for r in np.atleast_1d(np.asarray(grid, dtype=object)).tolist()]
        if not values:
            raise ValueError("rhos is empty; give at least one total budget.")
        ev = _Evaluator(*self._replay)
        rows = []
        for r in sorted(set(values)):
            e = ev.evaluate(r)
            for j, name in enumerate(ev.names):
                rows.append({"rho": r, "coefficient": name, "se": math.sqrt(e.sampling[j] + e.noise[j]),
                             "se_sampling": math.sqrt(e.sampling[j]), "spread": e.spread[j],
                             "p_near_singular": e.near_singular, "reliable": e.reliable})
        return pd.DataFrame(rows)

    def plot(self, *, rhos=None, coefficients=None, ax=None):
        """Planned private SE against the total budget, with the non-private (sampling) SE as a line.

        One panel per coefficient (default: the endogenous ones), log-log. Filled markers are budgets whose
        planning fits had reliable intervals, hollow ones budgets where they did not (there the SE describes the
        fit's spread poorly; read :attr:`spread` and :attr:`p_near_singular`); the plan's budget is marked.
        Needs matplotlib.

        Parameters
        ----------
        rhos : sequence of float, optional
            Budgets of the curve (:meth:`curve`).
        coefficients : str or sequence of str, optional
            Coefficients to draw (default: the endogenous regressors).
        ax : matplotlib Axes or sequence of Axes, optional
            Where to draw, one per coefficient; a new figure otherwise.

        Returns
        -------
        matplotlib.figure.Figure
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("SEPlan.plot needs matplotlib: pip install matplotlib (or dpivreg[plot]).") from exc
        names = list(self.se.index)
        chosen = list(self.population.endog) if coefficients is None else (
            [coefficients] if isinstance(coefficients, str) else list(coefficients))
        unknown = [c for c in chosen if c not in names]
        if unknown or not chosen:
            raise ValueError(f"coefficients must name coefficients of the plan ({names}), got {coefficients!r}.")
        if ax is None:
            fig, axes = plt.subplots(1, len(chosen), figsize=(4.2 * len(chosen), 3.4), squeeze=False)
            axes = list(axes[0])
        else:
            axes = list(np.ravel(ax))
            if len(axes) != len(chosen):
                raise ValueError(f"ax must hold one Axes per coefficient ({len(chosen)}), got {len(axes)}.")
            fig = axes[0].figure
        table = self.curve(rhos)
        for axis, name in zip(axes, chosen):
            part = table[table.coefficient == name]
            axis.plot(part.rho, part.se, color="C0", lw=1.2, label="planned private SE")
            good, bad = part[part.reliable], part[~part.reliable]
            axis.plot(good.rho, good.se, "o", color="C0", ms=4)
            axis.plot(bad.rho, bad.se, "o", mfc="none", color="C0", ms=5, label="intervals unreliable")
            axis.axhline(self.se_sampling[name], color="0.3", ls="--", lw=1,
                         label="non-private 2SLS SE (sampling only)")
            if math.isfinite(self.rho):
                axis.plot([self.rho], [self.se[name]], "*", color="C3", ms=10, label=f"plan: rho = {_fmt(self.rho)}")
            if self.target is not None and name in self.target.index:
                axis.axhline(self.target[name], color="C3", ls=":", lw=1, label="target SE")
            axis.set(xscale="log", yscale="log", xlabel="total rho (zCDP)", ylabel="standard error", title=name)
        axes[0].legend(fontsize="small", frameon=False)
        fig.tight_layout()
        return fig

    def __repr__(self) -> str:
        se = ", ".join(f"{k}={_fmt(v)}" for k, v in self.se.items())
        extra = "" if self.target is None else f", attainable={self.attainable}"
        return f"SEPlan(n={self.n}, rho={_fmt(self.rho)}, se=[{se}]{extra})"


def _check_alpha(alpha) -> float:
    alpha = as_real(alpha, "alpha", "a number in (0, 1)")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie strictly between 0 and 1 (e.g. 0.05 for 95% intervals), got {alpha!r}.")
    return alpha


@dataclass(frozen=True)
class _Evaluation:
    """The planning fits at one budget: per coefficient the sampling and noise variances (averaged over the draws)
    and the robust spread; the share of near-singular simulated releases; whether every fit's intervals were
    reliable."""

    sampling: np.ndarray
    noise: np.ndarray
    spread: np.ndarray
    near_singular: float
    reliable: bool


def mixture_spread(centres: np.ndarray, scale: float) -> float:
    """IQR/1.349 of the equal mixture of N(cᵢ, scale²) over ``centres``: the normal sampling distribution convolved
    with simulated privacy-noise deviations. An infinite centre lies beyond the quartile on its side, a NaN one
    beyond one of them (alternately below and above); inf when a quartile is. For normal centres N(0, s²) it is
    √(scale² + s²)."""
    c = np.array(centres, dtype=float).ravel()
    unsigned = np.isnan(c)  # a NaN draw has no side: alternately below and above
    c[unsigned] = np.where(np.arange(unsigned.sum()) % 2 == 0, -np.inf, np.inf)
    if not scale > 0:
        q25, q75 = np.quantile(c, [0.25, 0.75], method="inverted_cdf")
        return float((q75 - q25) / IQR_NORMAL) if np.isfinite(q25) and np.isfinite(q75) else math.inf
    finite = c[np.isfinite(c)]
    if finite.size == 0:
        return math.inf

    def cdf(t: float) -> float:
        return float(np.mean(stats.norm.cdf((t - c) / scale)))

    lo, hi = float(finite.min()) - 10 * scale, float(finite.max()) + 10 * scale
    quartiles = []
    for p in (0.25, 0.75):
        if not cdf(lo) < p < cdf(hi):
            return math.inf
        # the tolerance is the sampling scale's, not the bracket's: a far centre would otherwise coarsen it
        quartiles.append(optimize.brentq(lambda t: cdf(t) - p, lo, hi, xtol=1e-9 * scale, maxiter=500))
    return (quartiles[1] - quartiles[0]) / IQR_NORMAL


class _Evaluator:
    """The planning fits at a budget on fixed synthetic data sets and fit seeds (common random numbers)."""

    def __init__(self, population: SyntheticPopulation, n: int, draws: int, seed: np.random.SeedSequence,
                 fit_options: dict) -> None:
        # a fresh copy: spawning advances a SeedSequence, and a replay (SEPlan.curve) must draw the same children
        fresh = np.random.SeedSequence(seed.entropy, spawn_key=seed.spawn_key, pool_size=seed.pool_size,
                                       n_children_spawned=seed.n_children_spawned)
        children = fresh.spawn(2 * draws)
        self.population, self.n, self.fit_options = population, n, fit_options
        self.data = [population.draw(n, seed=np.random.default_rng(c)) for c in children[:draws]]
        self.fit_seeds = [int(np.random.default_rng(c).integers(2**63 - 1)) for c in children[draws:]]
        self.sampling: np.ndarray | None = None
        self.names: list[str] | None = None
        self.fits = 0
        self.notes: dict[float, list[str]] = {}
        self.done: dict[float, _Evaluation] = {}
        self.confirmations: dict[float, float] = {}

    def sampling_variances(self) -> np.ndarray:
        """The exact robust 2SLS variances of the synthetic samples, averaged over the draws (they are synthetic:
        nothing is private), and the coefficients' names."""
        if self.sampling is None:
            variances = []
            for data in self.data:
                benchmark = iv2sls_benchmark(DPIV2SLS.from_formula(self.population.formula, data).design)
                variances.append(np.diag(np.asarray(benchmark.cov, dtype=float)))
                self.names = list(benchmark.params.index)
            self.sampling = np.mean(variances, axis=0)
        return self.sampling

    def _fit(self, data: pd.DataFrame, rho: float, seed: int, notes: list[str]):
        """One planning fit's inference, or None where the fit or its inference fails at this budget (e.g. a moment
        release that resolves nothing): such a budget is in the unreliable regime."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                res = DPIV2SLS.from_formula(self.population.formula, data).fit(
                    rho=rho, bounds=self.population.bounds, seed=seed, **self.fit_options)
                inference = res.inference
            except (InferenceUnavailableError, InferenceOverflowError, DivergenceError) as exc:
                inference = None
                caught.append(warnings.WarningMessage(str(exc), type(exc), "", 0))
        self.fits += 1
        for w in caught:
            text = f"{w.category.__name__}: {str(w.message).split('. ')[0]}."
            if text not in notes:
                notes.append(text)
        return inference

    def evaluate(self, rho: float) -> _Evaluation:
        """The planning fits at total budget ``rho`` (once per budget)."""
        if rho in self.done:
            return self.done[rho]
        sampling = self.sampling_variances()
        notes = self.notes.setdefault(rho, [])
        inferences = [self._fit(data, rho, seed, notes) for data, seed in zip(self.data, self.fit_seeds)]
        if any(inference is None for inference in inferences):
            failed = np.full_like(sampling, np.inf)
            self.done[rho] = _Evaluation(sampling, failed, failed, 1.0, False)
            return self.done[rho]
        pooled = np.concatenate([inference.noise_draws for inference in inferences])
        spread = np.array([mixture_spread(pooled[:, j], math.sqrt(sampling[j])) for j in range(pooled.shape[1])])
        self.done[rho] = _Evaluation(
            sampling, np.mean([np.diag(inference.cov_noise) for inference in inferences], axis=0), spread,
            float(np.mean([inference.near_singular for inference in inferences])),
            all(inference.reliable for inference in inferences))
        return self.done[rho]

    def confirmed(self, rho: float, seeds: int = CONFIRM_SEEDS) -> bool:
        """Whether ``seeds`` further planning fits at ``rho``, with fresh seeds on the first synthetic data set, all
        have reliable intervals and fewer than :data:`NEAR_SINGULAR_WARN` near-singular releases (recorded in
        :attr:`confirmations`)."""
        if rho not in self.confirmations:
            rng = np.random.default_rng([*self.fit_seeds[:1], 7])
            ok = 0
            notes = self.notes.setdefault(rho, [])
            for seed in rng.integers(2**63 - 1, size=seeds):
                inference = self._fit(self.data[0], rho, int(seed), notes)
                ok += bool(inference is not None and inference.reliable
                           and inference.near_singular < NEAR_SINGULAR_WARN)
            self.confirmations[rho] = ok / seeds
        return self.confirmations[rho] == 1.0


def _targets(target_se, target_width, alpha: float, names: list[str], endog: tuple[str, ...]) -> pd.Series | None:
    if target_se is None and target_width is None:
        return None
    if target_se is not None and target_width is not None:
        raise ValueError("give target_se or target_width, not both.")
    value, label = (target_se, "target_se") if target_se is not None else (target_width, "target_width")
    if isinstance(value, Mapping):
        values = dict(value)
        _check_keys(values, names, label)
        if not values:
            raise ValueError(f"{label} is an empty mapping; name at least one coefficient.")
    else:
        values = {e: value for e in endog}
    out = {}
    for k, v in values.items():
        v = as_real(v, label, "a positive number or a mapping {coefficient: positive number}")
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{label} for {k!r} must be a finite number > 0, got {v!r}.")
        out[k] = v if label == "target_se" else v / (2.0 * stats.norm.ppf(1 - alpha / 2))
    return pd.Series(out, name="target_se", dtype=float)


def plan_se(
    formula: str,
    *,
    n: int,
    bounds: Mapping[str, tuple[float, float]],
    rho: float | None = None,
    target_se: float | Mapping[str, float] | None = None,
    target_width: float | Mapping[str, float] | None = None,
    alpha: float = 0.05,
    means: Mapping[str, float] | None = None,
    sds: Mapping[str, float] | None = None,
    binary: Mapping[str, bool] | None = None,
    first_stage_r2: float | Mapping[str, float] | None = None,
    first_stage_f: float | Mapping[str, float] | None = None,
    error_sd: float | None = None,
    endogeneity: float = 0.5,
    coef: Mapping[str, float] | None = None,
    corr: Mapping[tuple[str, str], float] | None = None,
    first_stage_weights: Mapping[str, Mapping[str, float]] | None = None,
    draws: int = 2,
    rtol: float = 0.02,
    seed=None,
    fit_options: Mapping | None = None,
) -> SEPlan:
    """Plan a private fit: the standard error of each coefficient at a budget, or the budget for a target.

    Give ``rho`` for the planned SEs at that total budget, or ``target_se`` / ``target_width`` for the
    total budget that meets the target (as statsmodels' ``solve_power`` solves for the one
    quantity left out). Only public inputs and guesses are used: the plan draws synthetic data from them
    (:class:`SyntheticPopulation`) and runs the package's default fit on it, so it touches no private data
    and costs no privacy budget. See the module docstring and the docs' planning page for the method and
    its measured accuracy.

    Parameters
    ----------
    formula : str
        The formula of the fit, ``dep ~ 1 + w + [x ~ z]``, with plain column names (see :func:`iv_formula`
        to build one from counts).
    n : int
        Number of rows of the fit, >= 10.
    bounds : mapping
        The public bounds ``{column: (lower, upper)}`` the fit will use; a codebook with extra entries
        (e.g. :data:`dpivreg.datasets.LABSUP_BOUNDS`) is fine.
    rho : float, optional
        Total zCDP budget, as ``fit(rho=...)``.
    target_se : float or mapping, optional
        Target standard error: a number for every endogenous coefficient, or ``{coefficient: se}``.
    target_width : float or mapping, optional
        Target width of the (1 − ``alpha``) interval instead, converted to SE = width / (2·z).
    alpha : float, default 0.05
        Level of the intervals (widths).
    means, sds : mapping
        Guessed mean and SD of each variable, as a public summary table would give them. **Required for every
        regressor and instrument** (a binary one: its share of ones in ``means``, its SD follows from it): a
        coefficient's planned SE scales as 1/SD of its regressor, an instrument's spread inside its bounds sets
        how much of it the privacy noise drowns, and the bounds give no lower bound on an SD, so no default is
        safe. The outcome's may be left out: its mean is then the midpoint of its bounds and its SD 99% of the
        largest the bounds allow, √((m − lo)(hi − m)) (the worst case: every planned SE scales with it).
        Continuous variables are drawn as normals clipped to their bounds with exactly these clipped mean and SD.
    binary : mapping, optional
        ``{column: bool}``. Exogenous regressors and instruments with bounds (0, 1) are binary unless marked
        False here; the outcome and the endogenous regressors are always continuous.
    first_stage_r2 : float or mapping, optional
        Partial R² of the instruments for each endogenous regressor (a number for all of them, or a
        mapping). Give exactly one of this and ``first_stage_f``.
    first_stage_f : float or mapping, optional
        The first-stage F of the instruments at this n instead; R² = qF / (qF + n − K), q instruments and K
        first-stage regressors.
    error_sd : float, optional
        SD of the structural error. Default: what the guessed coefficients leave of the outcome's guessed SD
        (all of it with the default coefficients 0).
    endogeneity : float, default 0.5
        Correlation of the structural error with each endogenous regressor's first-stage error.
    coef : mapping, optional
        Guessed coefficients of the regressors (default 0; they matter little: through the outcome's spread
        inside its bounds).
    corr : mapping, optional
        Guessed correlations ``{(a, b): r}`` between two continuous exogenous regressors or an exogenous and
        an endogenous regressor (default 0). They matter for the exogenous coefficients' SEs: a control
        correlated with the endogenous regressor inherits part of its (instrumented, hence large) variance.
    first_stage_weights : mapping, optional
        ``{endog: {instrument: weight}}``: which instruments move each endogenous regressor, and how much
        (weights of the standardised instruments; only their direction matters, the strength is
        ``first_stage_r2``/``first_stage_f``). Default: each instrument moves one endogenous regressor
        (instrument k the (k mod p)-th). With several endogenous regressors whose first stages share their
        instruments give them: the first stages' overlap makes the instruments jointly weaker, and the SEs
        larger, than their separate partial R² suggest.
    draws : int, default 2
        Synthetic data sets per budget; the planned variances are their average.
    rtol : float, default 0.02
        With a target: the search stops when the privacy-noise variance at the returned budget uses at least
        (1 − ``rtol``)² of the noise variance the target leaves beside the sampling variance (so the budget is
        within about 2·``rtol`` of the smallest under V_noise ∝ 1/ρ), or the budgets' bracket is within a
        factor 1 + ``rtol``.
    seed : None, int >= 0 or SeedSequence
        Makes the plan reproducible (the synthetic data and the fits' noise).
    fit_options : mapping, optional
        Further keyword options of ``DPIV2SLS.fit`` for the planned fit (e.g. ``{"cov_type":
        "unadjusted"}``); not ``rho``, ``bounds`` or ``seed``.

    Returns
    -------
    SEPlan
        With the planned SE, its sampling and noise parts, the robust spread (IQR/1.349) and the probability
        of a near-singular release; ``plot()`` draws the SE against ρ.

    Warns
    -----
    PlanningWarning
        When the planned budget is in the unreliable regime (the planning fits' intervals are flagged
        unreliable, or at least 1% of their releases are near-singular), and when controls are planned
        without their correlations with the endogenous regressors (``corr``), which understates their SEs.

    Raises
    ------
    TypeError
        An argument of the wrong type (the message names it).
    ValueError
        An argument out of range, a variable without bounds, guesses that no population inside the bounds
        can have, or not exactly one of ``rho`` and a target.

    Notes
    -----
    Planned variance V(ρ) = V_sampling + V_noise(ρ). V_sampling is the robust 2SLS covariance of the
    synthetic samples (exact: they are synthetic), V_noise(ρ) the fits' privacy-noise covariance
    (``res.inference.cov_noise``). For a target a ρ is found by a safeguarded secant search
    on log V_noise against log ρ (the Gaussian mechanisms make V_noise roughly proportional to 1/ρ): a
    first fit at ρ = 1, then steps to the ρ where the local power law meets the target, kept inside the
    bracket of budgets known to miss and to meet it (geometric bisection when a step falls outside), until
    the noise variance at the smallest budget meeting the targets uses at least (1 − ``rtol``)² of the room
    the target leaves it. Every step is a fit on the same synthetic data
    with the same seeds, so the returned budget's planned SE is a fit's, not an interpolation. A budget meets
    the target only outside the unreliable regime (reliable intervals and fewer than 1% near-singular
    releases); the budget returned is the smallest that meets it above every evaluated budget that misses,
    raised by half until :data:`CONFIRM_SEEDS` further fits with fresh seeds are all out of that regime.

    Examples
    --------
    >>> from dpivreg import plan_se
    >>> from dpivreg.datasets import LABSUP_BOUNDS
    >>> p = plan_se("weeks ~ 1 + [kids ~ samesex]", n=31857, rho=2.6, bounds=LABSUP_BOUNDS,
    ...             means={"weeks": 22.7, "kids": 2.75, "samesex": 0.5},
    ...             sds={"weeks": 22.6, "kids": 0.98}, first_stage_r2=0.0013, seed=1)  # doctest: +SKIP
    >>> p.se["kids"], p.spread["kids"], p.p_near_singular  # doctest: +SKIP
    >>> p.plot()  # doctest: +SKIP
    """
    started = time.perf_counter()
    n = check_count(n, "n", minimum=10, integral_floats=True)
    alpha = _check_alpha(alpha)
    draws = check_count(draws, "draws")
    rtol = as_real(rtol, "rtol", "a number in (0, 0.5)")
    if not 0 < rtol < 0.5:
        raise ValueError(f"rtol must lie strictly between 0 and 0.5, got {rtol!r}.")
    if seed is not None and not isinstance(seed, np.random.SeedSequence):
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"seed must be None, a non-negative int or a numpy.random.SeedSequence, got {seed!r}.")
        if seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed}.")
    options = _mapping(fit_options, "fit_options")
    reserved = sorted({"rho", "rho1", "rho2", "rho0", "rho_clip", "rho_inf", "rho_diag", "bounds", "seed",
                       "inference", "preprocess"} & set(options))
    if reserved:
        raise ValueError(f"fit_options must not contain {reserved}: plan_se plans the default private fit with "
                         "its inference at a total rho, so it sets the budgets, bounds, seed, inference and "
                         "preprocessing itself.")
    options.setdefault("progress", False)  # the planning fits are many and short: no bars
    has_target = target_se is not None or target_width is not None
    if (rho is None) == (not has_target):
        raise ValueError("give exactly one of rho (the SEs at that budget) and target_se / target_width "
                         "(the smallest budget meeting the target).")
    if rho is not None:
        rho = check_rho(rho, "rho")
    population = synthetic_population(
        formula, bounds=bounds, n=n, means=means, sds=sds, binary=binary, first_stage_r2=first_stage_r2,
        first_stage_f=first_stage_f, error_sd=error_sd, endogeneity=endogeneity, coef=coef, corr=corr,
        first_stage_weights=first_stage_weights)
    coef_names = (["Intercept"] if population.intercept else []) + [*population.exog, *population.endog]
    target = _targets(target_se, target_width, alpha, coef_names, population.endog)
    given = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    # a copy: the caller may spawn from their SeedSequence later, which would change a replay (SEPlan.curve)
    seed_sequence = np.random.SeedSequence(given.entropy, spawn_key=given.spawn_key, pool_size=given.pool_size,
                                           n_children_spawned=given.n_children_spawned)
    replay = (population, n, draws, seed_sequence, options)
    ev = _Evaluator(*replay)

    search = None
    unattainable = ""
    if rho is None:
        sampling = ev.sampling_variances()
        idx = [ev.names.index(k) for k in target.index]
        t2 = target.to_numpy() ** 2
        if np.any(sampling[idx] >= t2):
            rho, unattainable = math.inf, "the sampling SE alone is above it (a larger n is needed)"
        else:
            ev.evaluate(1.0)
            rho = _solve_rho(ev, idx, t2, rtol)
            if not math.isfinite(rho):
                unattainable = (f"no budget up to rho = {RHO_SEARCH[1]:g} met it outside the unreliable regime (the "
                                "SEs shown are those at the largest budget evaluated)")
        search = _search_table(ev, idx, target)
    if math.isfinite(rho):
        result = ev.evaluate(rho)
    elif unattainable.startswith("no budget"):
        result = ev.evaluate(max(ev.done))
    else:  # the sampling part alone is above the target
        sampling = ev.sampling_variances()
        result = _Evaluation(sampling, np.zeros_like(sampling), np.sqrt(sampling), 0.0, True)
    notes = [f"at rho = {_fmt(rho)} the planning fits raised {text}" for text in ev.notes.get(rho, [])]
    if unattainable:
        notes.append(f"the target is NOT attainable: {unattainable}.")
    elif has_target and rho <= RHO_SEARCH[0] * (1.0 + 1e-9):
        notes.append(f"the target is met already at the search's smallest budget, rho = {RHO_SEARCH[0]:g}: the "
                     "smallest rho that meets it may be smaller still.")
    notes += _flattery_warnings(population, result, rho if not unattainable else max(ev.done, default=rho))
    index = pd.Index(ev.names)
    return SEPlan(
        se=pd.Series(np.sqrt(result.sampling + result.noise), index=index, name="se"),
        se_sampling=pd.Series(np.sqrt(result.sampling), index=index, name="se_sampling"),
        se_noise=pd.Series(np.sqrt(result.noise), index=index, name="se_noise"),
        rho=float(rho), n=n, formula=formula, alpha=alpha, target=target, attainable=not unattainable,
        search=search, population=population, draws=draws, fits=ev.fits, seconds=time.perf_counter() - started,
        seed=seed, notes=tuple(notes), spread=pd.Series(result.spread, index=index, name="spread"),
        p_near_singular=result.near_singular, reliable=result.reliable, _replay=replay, unattainable=unattainable,
    )


def _flattery_warnings(population: SyntheticPopulation, result: _Evaluation, rho: float) -> list[str]:
    """Warn (:class:`PlanningWarning`) where the plan would flatter the fit; return the messages as notes."""
    messages = []
    if not result.reliable or result.near_singular >= NEAR_SINGULAR_WARN:
        messages.append(
            f"at rho = {_fmt(rho)} the planned fits are in the unreliable regime: "
            + ("their intervals are flagged unreliable and " if not result.reliable else "")
            + f"{100 * result.near_singular:.3g}% of their releases are near-singular (their excluded instruments' "
            "first stage lies within its own noise of a rank-deficient one). Such a release puts the estimate orders "
            "of magnitude away, so the fit's SD has a heavy tail that no standard error describes; read the plan's "
            "spread (IQR/1.349) and p_near_singular, and plan a larger rho.")
    given = population.corr
    pairs = [(w, e) for w in population.exog for e in population.endog if (w, e) not in given and (e, w) not in given]
    if pairs:
        listed = ", ".join(f"({w!r}, {e!r})" for w, e in pairs)
        messages.append(
            f"corr gives no correlation for the control(s) and endogenous regressor(s) {listed}: their SEs are "
            "planned as if uncorrelated. A control correlated with an endogenous regressor inherits part of its "
            "instrumented variance, so its planned SE can be far too small (labour supply at rho = 2.6, educ and "
            "age: 8.8 and 6.2 times); give the guessed correlations, e.g. corr={(" + repr(pairs[0][0]) + ", "
            + repr(pairs[0][1]) + "): -0.3}, or 0 where a control is known to be uncorrelated.")
    for message in messages:
        warnings.warn(message, PlanningWarning, stacklevel=3)
    return messages


def _search_table(ev: _Evaluator, idx: list[int], target: pd.Series) -> pd.DataFrame:
    """Every budget the search evaluated: the targeted coefficients' planned SEs, whether they meet the target, and the
    share of the further fits with fresh seeds out of the unreliable regime where that was checked."""
    rows = []
    for r in sorted(ev.done):
        e = ev.done[r]
        se = np.sqrt(e.sampling[idx] + e.noise[idx])
        rows.append({"rho": r, **{k: v for k, v in zip(target.index, se)}, "reliable": e.reliable,
                     "p_near_singular": e.near_singular, "meets": _meets(e, idx, target.to_numpy() ** 2),
                     "confirmed": ev.confirmations.get(r, math.nan)})
    return pd.DataFrame(rows)


def _meets(e: _Evaluation, idx: list[int], t2: np.ndarray) -> bool:
    """The planned SEs are within their targets AND the planning fits are out of the unreliable regime (reliable
    intervals, fewer than :data:`NEAR_SINGULAR_WARN` near-singular releases): there the SE does not describe the fit,
    and a plan that ignored it would return a budget whose real fits report SEs many times the target."""
    return bool(e.reliable and e.near_singular < NEAR_SINGULAR_WARN and np.all(e.sampling[idx] + e.noise[idx] <= t2))


def _solve_rho(ev: _Evaluator, idx: list[int], t2: np.ndarray, rtol: float, max_steps: int = 12) -> float:
    """A budget whose planned SEs meet every target outside the unreliable regime (safeguarded secant in log ρ,
    then :func:`_settled`); inf if none does within :data:`RHO_SEARCH`.

    The evaluator holds the fit at ρ = 1 on entry and receives every step.
    """
    room = t2 - ev.done[1.0].sampling[idx]  # the noise variance each target allows (> 0)

    def g(e: _Evaluation) -> float:
        """Largest log(noise variance / allowed noise variance) over the targets: <= 0 meets them all."""
        with np.errstate(divide="ignore"):
            return float(np.max(np.log(np.maximum(e.noise[idx], 1e-300) / room)))

    def close(e: _Evaluation) -> bool:
        """The binding target's noise variance uses all but a share of about 2·rtol of the room it has.

        (A criterion on the SE itself would stop far above the smallest budget when the sampling SE is
        most of the target: the SE is then nearly flat in ρ.)"""
        return g(e) >= 2.0 * math.log(1 - rtol)

    def slope(budgets: list[float]) -> float:
        """The local power law's slope of g against log ρ through two budgets (-1 with one; at most -0.25)."""
        if len(budgets) < 2:
            return -1.0
        value = (g(ev.done[budgets[1]]) - g(ev.done[budgets[0]])) / math.log(budgets[1] / budgets[0])
        return min(value, -0.25) if math.isfinite(value) else -1.0

    x_min, x_max = math.log(RHO_SEARCH[0]), math.log(RHO_SEARCH[1])
    for _ in range(max_steps):
        meet = [r for r, e in ev.done.items() if _meets(e, idx, t2)]
        miss = [r for r, e in ev.done.items() if not _meets(e, idx, t2)]
        hi, lo = (min(meet) if meet else None), (max(miss) if miss else None)
        if hi is not None and (close(ev.done[hi]) or (lo is not None and math.log(hi / lo) < math.log1p(rtol))):
            break
        g_hi = None if hi is None else g(ev.done[hi])
        g_lo = None if lo is None else g(ev.done[lo])
        if hi is not None and lo is not None and lo < hi:  # regula falsi inside the bracket, bisection if it strays
            a, b = math.log(lo), math.log(hi)
            x_new = 0.5 * (a + b)
            if math.isfinite(g_lo) and g_lo > 0 and g_hi < g_lo:
                x_new = a - g_lo * (b - a) / (g_hi - g_lo)
                if not a + 0.1 * (b - a) <= x_new <= b - 0.1 * (b - a):
                    x_new = 0.5 * (a + b)
        elif hi is None and not (math.isfinite(g_lo) and g_lo > 0):  # unreliable (or failed) only: four times more
            if math.log(lo) >= x_max:
                return math.inf
            x_new = math.log(lo) + math.log(4.0)
        elif hi is None:  # every budget misses: a power law through the two largest budgets
            x0 = math.log(lo)
            if x0 >= x_max:
                return math.inf
            x_new = min(max(x0 - g_lo / slope(sorted(ev.done)[-2:]), x0 + math.log(1.25)), x0 + math.log(100.0))
        else:  # every evaluated budget meets (or misses lie above): a smaller one, through the two smallest
            x0 = math.log(hi)
            if x0 <= x_min:
                break
            x_new = max(min(x0 - g_hi / slope(sorted(ev.done)[:2]), x0 - math.log(1.25)), x0 - math.log(100.0))
        x_new = min(max(x_new, x_min), x_max)
        if any(abs(x_new - math.log(r)) < 1e-9 for r in ev.done):
            break
        ev.evaluate(math.exp(x_new))
    return _settled(ev, idx, t2)


def _settled(ev: _Evaluator, idx: list[int], t2: np.ndarray, tries: int = 8) -> float:
    """The budget a target search returns: the smallest evaluated one that meets the targets and lies above every
    evaluated budget that misses them (meeting them need not be monotone in ρ: the fit's own choice of estimator
    changes with ρ), raised by half until :meth:`_Evaluator.confirmed` (further fits with fresh seeds all out of
    the unreliable regime): two planning fits on one side of the regime's edge are a coin flip for a real fit."""
    misses = [r for r, e in ev.done.items() if not _meets(e, idx, t2)]
    floor = max(misses, default=0.0)
    above = sorted(r for r, e in ev.done.items() if r > floor and _meets(e, idx, t2))
    rho = above[0] if above else 4.0 * floor
    for _ in range(tries):
        if rho > RHO_SEARCH[1]:
            return math.inf
        if _meets(ev.evaluate(rho), idx, t2) and ev.confirmed(rho):
            return rho
        rho *= 1.5
    return math.inf
