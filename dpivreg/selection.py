"""The default's choice between DP-2S-GD and noisy moments, made from the pilot releases (no privacy cost).

Which private estimator is more accurate depends on the data: noisy moments pay for the declared bounds
(the box sensitivity D/n), DP-2S-GD for the gradients' actual size (its clipping thresholds). With loose
bounds or many columns DP-2S-GD is far more accurate (2–10 times lower error on the synthetic designs of
``benchmarks/estimator_comparison.py``); with tight bounds on few columns (binary instrument, an outcome
filling its range) noisy moments can be up to a third more accurate (labour-supply subsamples of
1,000–3,000 rows). The default therefore predicts both from what it has already released — the pilot
moment release (ρ0) and the clipping release — and continues with the better one:

* DP-2S-GD: the planned iteration (its schedule, step sizes, clipping groups and per-step noise,
  :class:`dpivreg.engine.IterationPlan`) from the warm start, simulated in moment form
  (:func:`dpivreg.inference.simulate_fit` with the warm start as the plug-in solution);
* noisy moments: 2SLS on a release of the moments with the budget left for it (ρ0 plus the two stages'
  and the inference budget; the clipping release is spent either way), simulated by re-releasing the
  pilot moments (:func:`dpivreg.moments.moment_draws`).

The comparison is of the median absolute deviation of the simulated estimates from the plug-in solution,
coefficient by coefficient: the estimates are ratios of noisy quantities whose variance can be dominated by
a few draws (a weak first stage), so a variance would compare outliers, not typical errors.

Both are post-processing of releases and public inputs, so the choice costs nothing, and both branches
spend the same total budget. DP-2S-GD is kept unless the moment estimator's predicted median error of the
endogenous coefficients is smaller on average (the mean ratio of DP-2S-GD's to the moments' above 1). If moments win, the remaining
budget buys a second release of the same moments, combined with the pilot into one release of the whole
budget (:func:`dpivreg.preprocess.repeat_moment_release`). The prediction leaves out what moment form
cannot see (clipping distortion, which favours moments slightly); when the two are close, either is fine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .engine import IterationPlan
from .inference import simulate_fit
from .moments import moment_draws
from .preprocess import WorkingScale

__all__ = ["Selection", "choose_estimator", "REPLICATIONS"]

#: Simulated worlds per prediction.
REPLICATIONS = 400


@dataclass(frozen=True)
class Selection:
    """The default's choice and what it was based on (post-processing of the pilot releases).

    Attributes
    ----------
    estimator : str
        ``"DP-2S-GD"`` or ``"noisy moments"``.
    error_ratio : float
        Mean over the endogenous coefficients of the predicted median absolute error of DP-2S-GD over that
        of noisy moments; DP-2S-GD is chosen when it is at most 1.
    predicted_error_gd, predicted_error_moments : ndarray
        The predicted median absolute privacy-noise errors of the endogenous coefficients, original units.
    """

    estimator: str
    error_ratio: float
    predicted_error_gd: np.ndarray
    predicted_error_moments: np.ndarray


def choose_estimator(scale: WorkingScale, start: tuple[np.ndarray, np.ndarray], plan: IterationPlan, *,
                     moments_sigma: float, rng: np.random.Generator,
                     replications: int = REPLICATIONS) -> Selection:
    """Predict both estimators' typical privacy-noise error and choose (see the module docstring).

    ``moments_sigma`` is the noise standard deviation per entry of one moment release with the whole budget
    the moment branch would have.
    """
    theta0, beta0 = start
    q, p_endog = theta0.shape
    k = plan.n_exog
    J = scale.beta_jacobian()
    _, beta_gd, _ = simulate_fit(plan, theta0, beta0, scale, replications=replications, rng=rng, warm_start=True)
    moments = scale.moments
    draws = moments.noise_draws(rng, replications, sigma=moments_sigma)
    plugin, _, beta_m = moment_draws(moments.matrix, draws, moments.working, q, k, p_endog)
    endog = slice(k, k + p_endog)
    error_gd = _median_error(beta_gd, beta0, J)[endog]
    error_m = _median_error(beta_m, plugin, J)[endog]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(error_m > 0, error_gd / error_m, np.inf)
    ratio = float(np.mean(ratios)) if np.all(np.isfinite(error_gd)) else np.inf
    estimator = "DP-2S-GD" if ratio <= 1.0 else "noisy moments"
    return Selection(estimator, ratio, error_gd, error_m)


def _median_error(draws: np.ndarray, centre: np.ndarray, J: np.ndarray) -> np.ndarray:
    """Median over draws of |J(β_r − centre)| per coefficient (original units); non-finite draws count as
    infinitely far (they are the worst errors, not missing ones)."""
    with np.errstate(invalid="ignore", over="ignore"):
        error = np.abs((draws - centre) @ J.T)
    return np.median(np.where(np.isfinite(error), error, np.inf), axis=0)
