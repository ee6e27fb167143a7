"""Private first-stage diagnostics: post-processing of the moment release (no privacy cost).

Every fit on the private route releases the second moments of the bounded columns (``rho0``; for noisy
moments the whole release). The first-stage statistics linearmodels reports in ``first_stage.diagnostics``
are functions of those moments and of n (public), so they are computed from the release:

* ``rsquared``: R² of each endogenous regressor on all instruments (exogenous included), centred when the
  model has a constant;
* ``partial.rsquared``: 1 − RSS_full/RSS_exog, the R² of the endogenous regressor on the excluded instruments
  once both are orthogonalised to the exogenous regressors;
* ``shea.rsquared``: Shea's (1997) partial R², [(XᵀX)⁻¹]ⱼⱼ / [(X̂ᵀX̂)⁻¹]ⱼⱼ (X̂ the first-stage fit), which
  with several endogenous regressors measures each one's own identification; equal to the partial R² with one;
* ``f.stat``: the homoskedastic Wald statistic of the excluded instruments' coefficients divided by their
  number m, n(RSS_exog − RSS_full)/(m·RSS_full) (linearmodels' ``cov_type="unadjusted"``, ``debiased=False``),
  with its p-value from F(m, n − q) (``f.pval``, ``f.dist``).

Invariance makes the working scale usable: each statistic is unchanged by the affine maps from the design to
the box and working scales (regressions that include the exogenous span, which contains the constant).

With robust or clustered standard errors (``rho_diag``, spent by default) the fit also releases the first stage's meat
(:func:`dpivreg.inference.covariance.first_stage_meat_release`) and ``f.stat`` is then, as linearmodels reports it for
``cov_type="robust"``, the heteroskedasticity-robust Wald statistic of the excluded instruments in each
endogenous regressor's first stage, γ̂ᵀV̂⁻¹γ̂ with V̂ the excluded block of S⁻¹Ω̂ⱼS⁻¹/n (S = Z̃ᵀZ̃/n and γ̂ from
the moment release, Ω̂ⱼ the meat's block j), referred to χ²(m) (``f.dist``; :func:`robust_first_stage_wald`).
It is invariant to the working scale's block-triangular whitening, so it equals the Wald statistic on the
original columns; its noise interval re-releases both the moments and the meat.

With several endogenous regressors the per-variable F does not measure joint identification; the
Cragg–Donald (1993) minimum eigenvalue statistic does (Stata's ``estat firststage``, to be compared with
Stock & Yogo's 2005 critical values): with the exogenous regressors partialled out,

    CD = λ_min(Σ̂_VV^{-1/2} Π̂ᵀ Z₂ᵀZ₂ Π̂ Σ̂_VV^{-1/2}) / m,   Σ̂_VV = V̂ᵀV̂/(n − q),

Π̂ the excluded instruments' first-stage coefficients and V̂ the first-stage residuals
(:func:`cragg_donald_statistic`); with one endogenous regressor it is the first-stage F with n − q degrees of
freedom, f.stat·(n − q)/n.

The privacy noise's effect (``f.lower``, ``f.upper``, and the same for the partial R²), an interval for the F
of the data's own (noise-free, bounded) moments; it describes the privacy noise only, not the sampling error
of F. The release's noise is known, so it is simulated (post-processing of public quantities, fixed seeds
``SEED``…: the table is the same every time it is printed):

* the homoskedastic F, by **test inversion**: worlds like the released one except that the endogenous
  regressor's first-stage coefficients on the excluded instruments are scaled by t ≥ 0 (its projection on the
  instruments rescaled, its residual and every other moment kept), each re-released with the same
  ``INVERSION_DRAWS`` noise draws; the interval is the F of the worlds whose central 95% range of re-released
  F contains the released one (both ends found by bisection in t; the range grows with t). The noise inflates
  F — it adds variance to the instruments' apparent fit — and the inversion accounts for that, which a
  percentile range of re-releases of the released world does not: on the weak-instrument design (n = 10³,
  first-stage F 2, default fit at ρ = 2, 60 seeds) that range contained the non-private F in 0.82 of fits, the
  inversion in 0.95. The partial R² interval is the F's mapped by R² = mF/(n + mF);
* the robust Wald statistic (``rho_diag``) and the Cragg–Donald statistic, by the (2.5%, 97.5%) percentile range
  of ``replications`` re-releases of the released world (moments and, for the robust statistic, the meat).
  Measured for the percentile range on a design with two endogenous regressors and three instruments
  (n = 2,000 and 10,000, noisy moments at total ρ = 0.5 and 2, 200 seeds): it contained the noise-free F in
  0.925–0.975 of fits at n = 2,000, ρ = 2 and n = 10⁴, ρ = 0.5, against 0.88–0.95 for the basic (reflected)
  bootstrap, and fell short at n = 2,000, ρ = 0.5 (0.875–0.91).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from dpivreg.estimation.moments import FLOOR, floor_spectrum, partialled_regression
from dpivreg.estimation.working_scale import ReleasedMoments

__all__ = ["first_stage_statistics", "first_stage_diagnostics", "cragg_donald_statistic", "cragg_donald",
           "robust_first_stage_wald", "released_gram", "released_grams", "SEED", "REPLICATIONS"]

#: Seed of the post-processing simulation of the privacy noise's effect.
SEED = 20261201
#: Re-releases simulated for the intervals.
REPLICATIONS = 2000
#: Re-releases per world, and bisection steps, of the F's test inversion.
INVERSION_DRAWS = 400
INVERSION_STEPS = 30


def _rss(G: np.ndarray, target: int, regressors: list[int]) -> np.ndarray:
    """Residual sum of squares / n of column ``target`` on ``regressors`` from Gram matrices G (…, D, D)."""
    own = G[..., target, target]
    if not regressors:
        return own
    A = floor_spectrum(G[..., regressors, :][..., :, regressors], FLOOR)
    b = G[..., regressors, target]
    return own - np.einsum("...i,...i->...", b, np.linalg.solve(A, b[..., None])[..., 0])


def _inverse_diagonal(A: np.ndarray) -> np.ndarray:
    return np.diagonal(np.linalg.inv(floor_spectrum(A, FLOOR)), axis1=-2, axis2=-1)


def first_stage_statistics(G: np.ndarray, q: int, n_exog: int, p_endog: int, n: int, *,
                           constant: bool) -> dict[str, np.ndarray]:
    """The first-stage statistics (module docstring) from Gram matrices G (…, 1 + q + p_endog + 1, same) of the
    columns [1, Z, X_endog, y] (the constant first; unused when ``constant`` is False), per n.

    Returns arrays (…, p_endog): ``rsquared``, ``partial.rsquared``, ``shea.rsquared``, ``f.stat``.
    """
    instruments = list(range(1, 1 + q))
    exog = instruments[:n_exog]
    endog = list(range(1 + q, 1 + q + p_endog))
    m = q - n_exog
    out = {name: [] for name in ("rsquared", "partial.rsquared", "f.stat")}
    for j in endog:
        full = np.maximum(_rss(G, j, instruments), 1e-300)
        restricted = np.maximum(_rss(G, j, exog), full)
        total = _rss(G, j, [0]) if constant else G[..., j, j]
        out["rsquared"].append(np.clip(1.0 - full / np.maximum(total, 1e-300), 0.0, 1.0))
        out["partial.rsquared"].append(np.clip(1.0 - full / restricted, 0.0, 1.0))
        out["f.stat"].append(n * (restricted - full) / (m * full))
    result = {name: np.stack(values, axis=-1) for name, values in out.items()}
    regressors = exog + endog
    Gxx = G[..., regressors, :][..., :, regressors]
    Gzx = G[..., instruments, :][..., :, regressors]
    Gzz = floor_spectrum(G[..., instruments, :][..., :, instruments], FLOOR)
    fitted = np.swapaxes(Gzx, -1, -2) @ np.linalg.solve(Gzz, Gzx)
    shea = _inverse_diagonal(Gxx)[..., n_exog:] / _inverse_diagonal(fitted)[..., n_exog:]
    result["shea.rsquared"] = np.clip(shea, 0.0, 1.0)
    return result


def robust_first_stage_wald(G: np.ndarray, meat: np.ndarray, q: int, n_exog: int, p_endog: int,
                            n: int) -> np.ndarray:
    """Robust Wald statistics (…, p_endog) of the excluded instruments in each first stage (module docstring)
    from Gram matrices G (…, D, D) laid out as in :func:`first_stage_statistics` and first-stage meats
    (…, q·p_endog, same) on the working scale."""
    Z = list(range(1, 1 + q))
    S = floor_spectrum(G[..., Z, :][..., :, Z], FLOOR)
    gamma = np.linalg.solve(S, G[..., Z, :][..., :, 1 + q:1 + q + p_endog])
    S_inv = np.linalg.inv(S)
    excluded = slice(n_exog, q)
    out = []
    for j in range(p_endog):
        block = meat[..., j * q:(j + 1) * q, j * q:(j + 1) * q]
        V = (S_inv @ block @ S_inv / n)[..., excluded, excluded]
        g = gamma[..., excluded, j]
        out.append(np.einsum("...i,...i->...", g, np.linalg.solve(V, g[..., None])[..., 0]))
    return np.stack(out, axis=-1)


def cragg_donald_statistic(G: np.ndarray, q: int, n_exog: int, p_endog: int, n: int) -> np.ndarray:
    """The Cragg–Donald minimum eigenvalue statistic (module docstring) from Gram matrices G (…, D, D) laid out
    as in :func:`first_stage_statistics`; shape (…)."""
    S, gamma, residual = partialled_regression(G, n_exog, q, list(range(1 + q, 1 + q + p_endog)))
    explained = np.swapaxes(gamma, -1, -2) @ S @ gamma  # Π̂ᵀZ₂ᵀZ₂Π̂ / n
    sigma_vv = floor_spectrum(residual, FLOOR) * n / (n - q)
    values, vectors = np.linalg.eigh(sigma_vv)
    inverse_root = (vectors / np.sqrt(values)[..., None, :]) @ np.swapaxes(vectors, -1, -2)
    return np.linalg.eigvalsh(inverse_root @ (n * explained) @ inverse_root)[..., 0] / (q - n_exog)


def cragg_donald(moments: ReleasedMoments, q: int, n_exog: int, p_endog: int, n: int, *,
                 level: float = 0.95, replications: int = REPLICATIONS) -> pd.Series:
    """The Cragg–Donald statistic from a moment release with its ``level`` noise interval (as for the F):
    a Series ``statistic``, ``lower``, ``upper``."""
    gram, gram_draws = released_grams(moments, replications)
    point = float(cragg_donald_statistic(gram, q, n_exog, p_endog, n))
    if gram_draws is None:
        low = high = point
    else:
        tail = (1.0 - level) / 2.0
        low, high = np.quantile(cragg_donald_statistic(gram_draws, q, n_exog, p_endog, n), [tail, 1.0 - tail])
    return pd.Series({"statistic": point, "lower": float(low), "upper": float(high)}, name="cragg_donald")


def _scaled_first_stage(G: np.ndarray, q: int, n_exog: int, column: int, t: np.ndarray) -> np.ndarray:
    """Worlds (len(t), D, D) like the Gram matrix G except that column ``column``'s first-stage coefficients on
    the excluded instruments are multiplied by t (its projection on the instruments rescaled, its residual kept)."""
    instruments = list(range(1, 1 + q))
    S = floor_spectrum(G[np.ix_(instruments, instruments)], FLOOR)
    gamma = np.linalg.solve(S, G[instruments, column])
    residual = max(G[column, column] - gamma @ S @ gamma, 0.0)
    g = np.repeat(gamma[None], len(t), axis=0)
    g[:, n_exog:] *= np.asarray(t)[:, None]
    worlds = np.repeat(G[None], len(t), axis=0)
    cross = g @ S  # (len(t), q): Z̃ᵀx/n
    worlds[:, instruments, column] = worlds[:, column, instruments] = cross
    worlds[:, column, column] = np.einsum("ti,ti->t", cross, g) + residual
    worlds[:, 0, column] = worlds[:, column, 0] = g @ G[0, instruments]  # the mean (the constant is in Z̃'s span)
    return worlds


def _f_noise_interval(moments: ReleasedMoments, G: np.ndarray, noise: np.ndarray, q: int, n_exog: int, n: int,
                      j: int, level: float) -> tuple[float, float]:
    """The noise interval of endogenous regressor j's homoskedastic F by test inversion (module docstring): each
    world (its Gram matrix from :func:`_scaled_first_stage`) is re-released on the box scale with the draws
    ``noise`` (R, D, D) and floored at the noise as the release was (:meth:`ReleasedMoments.floor`)."""
    column = 1 + q + j
    tail = (1.0 - level) / 2.0
    instruments = list(range(1, 1 + q))
    m = q - n_exog
    exog = instruments[:n_exog]
    L = _extended_map(moments)
    L_plus = np.linalg.pinv(L)  # a world's box-scale moments (its Gram matrix is L B Lᵀ, L of full column rank)

    def f_of(worlds: np.ndarray) -> np.ndarray:  # column j's F alone, as first_stage_statistics
        full = np.maximum(_rss(worlds, column, instruments), 1e-300)
        restricted = np.maximum(_rss(worlds, column, exog), full)
        with np.errstate(over="ignore", divide="ignore"):  # a re-release may leave no residual: F = inf
            return n * (restricted - full) / (m * full)

    released = float(f_of(G))
    # the worlds differ only in column j's entries, outside the instruments' block, so what the floor does to each
    # re-release (it changes only that block) is the same for every t: computed once
    rereleased = L_plus @ G @ L_plus.T + noise
    floor_change = moments.floor(rereleased) - rereleased

    def quantile(t: float, which: int) -> float:  # which 0: lower, 1: upper end of the released F's law at t
        world = L_plus @ _scaled_first_stage(G, q, n_exog, column, np.array([t]))[0] @ L_plus.T
        again = L @ (world + noise + floor_change) @ L.T
        with np.errstate(invalid="ignore"):  # worlds with an infinite F (no residual left): inf - inf is NaN
            value = float(np.quantile(f_of(again), [tail, 1.0 - tail][which]))
        return math.inf if math.isnan(value) else value

    def last_true(condition) -> float:
        """The t where ``condition`` (true at t = 0, false for large t) turns false, by doubling then bisection."""
        low, high = 0.0, 1.0
        while condition(high) and high < 1e6:
            low, high = high, 2.0 * high
        for _ in range(INVERSION_STEPS):
            mid = (low + high) / 2.0
            low, high = (mid, high) if condition(mid) else (low, mid)
        return (low + high) / 2.0

    # both quantiles grow with t: the accepted t run from where the upper quantile reaches the released F
    # to where the lower quantile passes it
    t_low = 0.0 if quantile(0.0, 1) >= released else last_true(lambda t: quantile(t, 1) < released)
    t_high = last_true(lambda t: quantile(t, 0) <= released) if quantile(0.0, 0) <= released else t_low
    ends = f_of(_scaled_first_stage(G, q, n_exog, column, np.array([t_low, max(t_high, t_low)])))
    return float(ends[0]), float(ends[1])


def _extended_map(moments: ReleasedMoments) -> np.ndarray:
    """The map of box-scale moments to the Gram matrices of [1, Z̃, X̃_endog, Ỹ]: the box scale's first row is the
    constant."""
    return np.vstack([np.eye(1, moments.working_map.shape[1]), moments.working_map])


def _with_constant(moments: ReleasedMoments, matrix: np.ndarray) -> np.ndarray:
    """Gram matrices of [1, Z̃, X̃_endog, Ỹ] from box-scale moments (…, D, D)."""
    L = _extended_map(moments)
    return L @ matrix @ L.T


def released_gram(moments: ReleasedMoments) -> np.ndarray:
    """The Gram matrix of [1, Z̃, X̃_endog, Ỹ] per row from the release floored at its noise (post-processing)."""
    return _with_constant(moments, moments.floored)


def released_grams(moments: ReleasedMoments, replications: int = REPLICATIONS) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`released_gram` and ``replications`` re-releases of it (the plug-in world of the module docstring, seed
    ``SEED``), each floored in turn (:meth:`ReleasedMoments.floor`); ``None`` for exact moments."""
    point = released_gram(moments)
    if moments.sigma == 0:
        return point, None
    draws = moments.noise_draws(np.random.default_rng(SEED), replications)
    return point, _with_constant(moments, moments.floor(moments.floored + draws))


def first_stage_diagnostics(moments: ReleasedMoments, endog_names: list[str], q: int, n_exog: int, n: int, *,
                            constant: bool, level: float = 0.95, replications: int = REPLICATIONS,
                            meat=None) -> pd.DataFrame:
    """linearmodels' ``first_stage.diagnostics`` table from a moment release, with privacy-noise intervals.

    Rows are the endogenous regressors; columns ``rsquared``, ``partial.rsquared``, ``shea.rsquared``,
    ``f.stat``, ``f.pval``, ``f.dist``, then ``f.lower``, ``f.upper``, ``partial.rsquared.lower``,
    ``partial.rsquared.upper`` (the ``level`` intervals for the privacy noise; module docstring). With
    ``meat`` (a :class:`dpivreg.inference.covariance.ReleasedMeat` of the first stage) the F columns are the robust Wald
    statistic's, referred to χ²(m).
    """
    p_endog = len(endog_names)
    m = q - n_exog
    gram = released_gram(moments)
    point = first_stage_statistics(gram, q, n_exog, p_endog, n, constant=constant)
    table = pd.DataFrame({name: point[name] for name in ("rsquared", "partial.rsquared", "shea.rsquared", "f.stat")},
                         index=pd.Index(endog_names, name="endogenous"))
    table["f.pval"] = stats.f.sf(table["f.stat"], m, n - q)
    table["f.dist"] = f"F({m},{n - q})"
    if moments.sigma > 0 and meat is None:
        # the homoskedastic F: the test inversion (module docstring), and the partial R² from it (1 at F = inf)
        noise = moments.noise_draws(np.random.default_rng(SEED + 2), INVERSION_DRAWS)
        bounds = np.array([_f_noise_interval(moments, gram, noise, q, n_exog, n, j, level) for j in range(p_endog)])
        table["f.lower"], table["f.upper"] = bounds[:, 0], bounds[:, 1]
        with np.errstate(invalid="ignore"):
            rsquared = np.where(np.isinf(bounds), 1.0, m * bounds / (n + m * bounds))
        table["partial.rsquared.lower"], table["partial.rsquared.upper"] = rsquared.T
        return table
    _, gram_draws = released_grams(moments, replications)
    if gram_draws is not None:
        again = first_stage_statistics(gram_draws, q, n_exog, p_endog, n, constant=constant)
    else:
        again = {name: np.broadcast_to(value, (1, p_endog)) for name, value in point.items()}
    if meat is not None:
        table["f.stat"] = robust_first_stage_wald(gram, meat.matrix, q, n_exog, p_endog, n)
        table["f.pval"] = stats.chi2.sf(table["f.stat"], m)
        table["f.dist"] = f"chi2({m})"
        if gram_draws is not None or meat.sigma > 0:
            meat_draws = meat.rereleased(np.random.default_rng(SEED + 1), replications)
            again["f.stat"] = robust_first_stage_wald(gram if gram_draws is None else gram_draws, meat_draws, q,
                                                      n_exog, p_endog, n)
        else:
            again["f.stat"] = table["f.stat"].to_numpy()[None, :]
    tail = (1.0 - level) / 2.0
    for name in ("f.stat", "partial.rsquared"):
        low, high = np.quantile(again[name], [tail, 1.0 - tail], axis=0)
        label = name.removesuffix(".stat")
        table[f"{label}.lower"], table[f"{label}.upper"] = low, high
    return table
