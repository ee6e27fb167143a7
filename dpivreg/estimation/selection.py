"""The default's choices made from the pilot releases (no privacy cost): T, and DP-2S-GD or noisy moments.

The number of iterations (:func:`choose_iterations`) is the shortest candidate whose planned iteration,
simulated in moment form from the warm start, has an error within about 2% of the best candidate's; the
estimator (:func:`choose_estimator`) is chosen next, with that plan, as follows.

Which private estimator is more accurate depends on the data: noisy moments pay for the declared bounds
(the box sensitivity D/n), DP-2S-GD for the gradients' actual size (its clipping thresholds). With loose
bounds or many columns DP-2S-GD is far more accurate (2–10 times lower error on the synthetic designs of
``benchmarks/estimator_comparison.py``, 2–20 times on its real-data specifications); with tight bounds on few
columns (binary instrument, an outcome filling its range) noisy moments can be as accurate or a little more
(labour-supply subsamples of 1,000–3,000 rows). The default therefore predicts both from what it has already
released — the pilot moment release (ρ0) and the clipping release — and continues with the better one. Both are
simulated in the same plug-in worlds (:func:`dpivreg.estimation.simulation.plug_in_worlds`: instruments' moments
plausible given the pilot release, the warm start as their 2SLS solution), so that a world whose instruments the release
cannot resolve counts against both:

* DP-2S-GD: the planned iteration (its schedule, step sizes, clipping groups and per-step noise,
  :class:`dpivreg.estimation.engine.IterationPlan`) from each world's warm start
  (:func:`dpivreg.estimation.simulation.simulate_fit`);
* noisy moments: 2SLS on each world's release of its moments with the budget left for it (ρ0 plus the two stages'
  and the inference budget; the clipping release is spent either way), floored at that release's noise
  (:func:`dpivreg.estimation.simulation.world_releases`).

The comparison weighs the typical error and the tail: per endogenous coefficient, the geometric mean of the ratio
of the medians of the absolute simulated errors and the ratio of their 90th percentiles. The estimates are ratios of
noisy quantities whose variance can be dominated by a few draws (a weak first stage), so a variance would compare
outliers; a median alone would ignore how often an estimator is far off, which is what near-singular releases do
(on the real specifications a median-only rule switched to noisy moments in fits whose errors were the largest).

Both are post-processing of releases and public inputs, so the choice costs nothing, and both branches
spend the same total budget. DP-2S-GD is kept unless the moment estimator's predicted error of the endogenous
coefficients is smaller on average (the mean ratio of DP-2S-GD's to the moments' above 1). If moments win, the
remaining budget buys a second release of the same moments, combined with the pilot into one release of the whole
budget (:func:`dpivreg.estimation.working_scale.repeat_moment_release`).

What the prediction leaves out
    Moment form cannot see the clipping distortion (the clipped iteration's fixed point is not 2SLS). It is
    small where clipped rows' gradients point in many directions, but on the labour-supply subsamples
    (n = 1,000–3,000, a binary instrument and skewed first-stage residuals, so that the clipped rows'
    gradients line up) it is most of DP-2S-GD's error at large budgets (0.074 of 0.076 2SLS s.e., n = 1,000,
    ρ = 10): the predicted ratio is then 0.6–1.1 where the realised one was 1.2–1.6 with 100 runs and the
    fixed K, and is 1.04–1.08 at n = 3,000 with the budget-dependent K (400 runs), so the default keeps
    DP-2S-GD where noisy moments are slightly better. The clipping histograms cannot supply the missing term:
    their mass above each threshold, weighted by the bins' excess, bounds the distortion only for aligned
    gradients, so it overstated it 7–25 times on the synthetic designs at n = 10⁵, and at n ≤ 3,000 the
    clipped tail is hidden under the histograms' noise (the bound was 0 where the distortion was 0.074 s.e.).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from dpivreg.estimation.engine import IterationPlan
from dpivreg.estimation.moments import solve_2sls
from dpivreg.estimation.simulation import MAX_WHITENING_ERROR, plug_in_worlds, simulate_fit, world_releases
from dpivreg.estimation.working_scale import WorkingScale

__all__ = ["Selection", "choose_estimator", "choose_iterations", "shortest_near_best", "REPLICATIONS",
           "T_CANDIDATES", "MAX_KAPPA"]

#: Simulated worlds per prediction.
REPLICATIONS = 400
#: The numbers of iterations the default compares (:func:`choose_iterations`).
T_CANDIDATES = (3, 4, 6, 8, 12)
#: The tail quantile of the absolute simulated error the choices weigh beside the median.
TAIL = 0.9
#: A longer run is chosen only if its predicted error is this much below the shorter runs'.
_T_MARGIN = 0.98
#: T is simulated only below this whitening error κ̂ (the reliability flag's threshold); above it the κ̂ rule
#: is kept.
MAX_KAPPA = MAX_WHITENING_ERROR


@dataclass(frozen=True)
class Selection:
    """The default's choice and what it was based on (post-processing of the pilot releases).

    Attributes
    ----------
    estimator : str
        ``"DP-2S-GD"`` or ``"noisy moments"``.
    error_ratio : float
        Mean over the endogenous coefficients of the ratio of DP-2S-GD's predicted error to that of noisy
        moments, each error the geometric mean of the median and the 90th percentile of the absolute simulated
        error; DP-2S-GD is chosen when it is at most 1.
    predicted_error_gd, predicted_error_moments : ndarray
        The predicted median absolute privacy-noise errors of the endogenous coefficients, original units.
    predicted_tail_gd, predicted_tail_moments : ndarray
        Their predicted 90th percentiles.
    """

    estimator: str
    error_ratio: float
    predicted_error_gd: np.ndarray
    predicted_error_moments: np.ndarray
    predicted_tail_gd: np.ndarray | None = None
    predicted_tail_moments: np.ndarray | None = None


def choose_estimator(scale: WorkingScale, start: tuple[np.ndarray, np.ndarray], plan: IterationPlan, *,
                     moments_sigma: float, rng: np.random.Generator,
                     replications: int = REPLICATIONS) -> Selection:
    """Predict both estimators' privacy-noise errors in the same simulated worlds and choose (module docstring).

    ``moments_sigma`` is the noise standard deviation per entry of one moment release with the whole budget
    the moment branch would have.
    """
    theta0, beta0 = start
    q, p_endog = theta0.shape
    k = plan.n_exog
    J = scale.beta_jacobian()
    worlds = plug_in_worlds(scale, theta0, beta0, replications=replications, rng=rng)
    _, beta_gd, _ = simulate_fit(plan, theta0, beta0, scale, replications=replications, rng=rng, warm_start=True,
                                 worlds=worlds)
    moments = scale.moments
    noise = moments.noise_draws(rng, replications, sigma=moments_sigma)
    _, beta_m = solve_2sls(world_releases(moments, worlds, noise, moments_sigma), q, k, p_endog)
    endog = slice(k, k + p_endog)
    error_gd = _error_quantiles(beta_gd, beta0, J)[:, endog]
    error_m = _error_quantiles(beta_m, beta0, J)[:, endog]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.sqrt(np.prod(np.where(error_m > 0, error_gd / error_m, np.inf), axis=0))
    ratio = float(np.mean(ratios)) if np.all(np.isfinite(error_gd)) else np.inf
    estimator = "DP-2S-GD" if ratio <= 1.0 else "noisy moments"
    return Selection(estimator, ratio, error_gd[0], error_m[0], error_gd[1], error_m[1])


def choose_iterations(scale: WorkingScale, start: tuple[np.ndarray, np.ndarray],
                      make_plan: Callable[[int], IterationPlan], *, rng: np.random.Generator,
                      candidates: tuple[int, ...] = T_CANDIDATES,
                      replications: int = REPLICATIONS) -> tuple[int, IterationPlan, np.ndarray]:
    """The shortest number of iterations T whose predicted privacy-noise error of the endogenous coefficients is
    within about 2% of the best candidate's.

    Each candidate's plan (``make_plan(T)``: its schedule, per-step noise and clipping groups) is simulated in
    moment form from the warm start (:func:`dpivreg.estimation.simulation.simulate_fit`), every candidate in the same
    plug-in worlds and with the same random numbers, so that their comparison is paired. A candidate's error for a
    coefficient is the geometric mean of the median and the 90th percentile of its absolute simulated error (the
    tail counts: a run too short to leave a warm start that a near-singular release threw far keeps it there);
    the criterion is the mean over the endogenous coefficients of that error relative to the best candidate's,
    and the shortest candidate whose score is at most the best's / 0.98 (about 2% above it) is chosen
    (:func:`shortest_near_best`; a longer run costs time and clips more often, for no gain).

    Why simulate instead of a rule: what T should be depends on how far the warm start is from the
    solution relative to the noise each step adds. The whitening error κ̂ alone
    (:func:`dpivreg.estimation.tuning.iterations`) sets the contraction per step, but with a weak first stage the warm
    start's error in β is large although κ̂ is small, and three steps left it there (the weak-instrument design of
    ``benchmarks/estimator_comparison.py``, n = 10⁵, ρ = 0.5: median error 0.36 2SLS s.e. with T = 3, 0.15 with
    T = 12); with a large κ̂ (instruments the release resolves poorly) the contraction is slow where the truth
    has less variance than released, and a longer run is needed. Post-processing of the pilot releases: no
    privacy cost.

    Returns T, its plan and the predicted errors (candidates, endogenous coefficients), original units.
    """
    theta0, beta0 = start
    k = scale.n_exog
    endog = slice(k, k + theta0.shape[1])
    J = scale.beta_jacobian()
    seed = int(rng.integers(2**63))
    plans = [make_plan(T) for T in candidates]
    worlds = plug_in_worlds(scale, theta0, beta0, replications=replications, rng=np.random.default_rng(seed))
    errors = np.array([
        np.sqrt(np.prod(_error_quantiles(simulate_fit(plan, theta0, beta0, scale, replications=replications,
                                                      rng=np.random.default_rng(seed + 1), warm_start=True,
                                                      worlds=worlds)[1], beta0, J)[:, endog], axis=0))
        for plan in plans
    ])
    index = shortest_near_best(errors)
    return candidates[index], plans[index], errors


def shortest_near_best(errors: np.ndarray, *, margin: float = _T_MARGIN) -> int:
    """Index of the first candidate (row of ``errors``, candidates × coefficients) whose score is at most
    the best score / ``margin``; the score is the mean over coefficients of the error relative to that
    coefficient's best. Coefficients without a finite, positive best error (diverged for every candidate,
    or no noise at all) cannot rank the candidates and are left out; with none left, the first candidate."""
    best = errors.min(axis=0)
    usable = np.isfinite(best) & (best > 0)
    if not usable.any():
        return 0
    score = np.mean(errors[:, usable] / best[usable], axis=1)
    return int(np.flatnonzero(score <= score.min() / margin)[0])


def _error_quantiles(draws: np.ndarray, centre: np.ndarray, J: np.ndarray) -> np.ndarray:
    """The median and the 90th percentile (2, p) over draws of |J(β_r − centre)| per coefficient (original units);
    non-finite draws count as infinitely far (they are the worst errors, not missing ones)."""
    with np.errstate(invalid="ignore", over="ignore"):
        error = np.abs((draws - centre) @ J.T)
    return np.quantile(np.where(np.isfinite(error), error, np.inf), [0.5, TAIL], axis=0)
