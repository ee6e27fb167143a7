"""Private inference: standard errors that account for sampling error AND privacy noise.

The private estimate differs from the true β by (i) the sampling error of 2SLS and (ii) the privacy
noise of its releases. Both are estimated from released or public quantities only:

Sampling error, ``cov_type="robust"`` (the 2SLS sandwich; :mod:`dpivreg.inference.covariance`)
    V_samp = (Θ̄ᵀΘ̄)⁻¹ Θ̄ᵀΩ̂Θ̄ (Θ̄ᵀΘ̄)⁻¹ / n with Ω̂ a private release of the instrument scores' second moments
    (1/n)Σᵢ z̃ᵢz̃ᵢᵀũᵢ² at the released β̃ (:func:`dpivreg.inference.covariance.score_meat_release`, budget ``rho_inf``,
    for DP-2S-GD and noisy moments alike).

Sampling error, ``cov_type="unadjusted"`` (homoskedastic 2SLS variance)
    V_samp = σ̂²_u · (Θ̄ᵀ S Θ̄)⁻¹ / n on the working scale, where Θ̄ = [I_exog | Θ] is the
    released first stage, S = E[z̃z̃ᵀ] = I because the working instruments are whitened by the
    private second moments, and σ̂²_u the residual variance. DP-2S-GD makes ONE extra release for it
    (budget ``rho_inf``): the mean of the squared structural residuals ũᵢ = ỹᵢ − x̃ᵢᵀβ̃⁽ᵀ⁾ (actual
    regressors, released β̃⁽ᵀ⁾), each clipped to C = 2(τ + log n)(1 + ‖β̃⁽ᵀ⁾‖₁)² — the high-probability
    bound on ũ² for standardised sub-Gaussian columns, so clipping is rarely active — with Gaussian noise
    calibrated to the sensitivity C/n (replace-one). The moment estimator reads σ̂²_u from its own release
    (:func:`dpivreg.estimation.moments.residual_variance_from_moments`).

Privacy noise (parametric bootstrap, Ferrando, Wang & Sheldon 2022)
    Without clipping, every gradient of DP-2S-GD depends on the data only through
    S = Z̃ᵀZ̃/n, Z̃ᵀX̃/n and Z̃ᵀỹ/n, and so does the warm start (2SLS on the released moments). We re-run
    the whole private computation in this moment form, in plug-in worlds whose 2SLS solution is the
    released (Θ⁽ᵀ⁾, β̃⁽ᵀ⁾) (:func:`dpivreg.estimation.simulation.plug_in_worlds`): each world draws the moment release's
    noise E from its known distribution (the world's true moments are the release floored at its noise minus E, kept
    positive semi-definite, and its release — hence its whitening error and its warm start — carries E and is floored
    as the fit's was), then runs the iteration from that warm start (or from zero) with the run's T, step
    sizes, schedule, preconditioner, clipping groups and per-step noise scales, and fresh noise. The spread of
    the simulated β̃⁽ᵀ⁾ is the privacy-noise variance; it propagates both stages' noise (the first stage's
    through Θ⁽ᵗ⁾ into β), the warm start's and the imperfect whitening, without linearisation. It is measured
    by the draws' central 95% ranges (:func:`dpivreg.estimation.moments.central_covariance`), not their variance: in the
    few worlds whose instruments the release cannot resolve the simulated estimate lands orders of magnitude
    away, which a variance would turn into standard errors hundreds of times the estimator's real spread. For
    the moment estimator the worlds re-release the floored moments and solve 2SLS
    (:func:`dpivreg.estimation.moments.moment_noise_covariance`).

Total: V = J (V_samp + V_noise) Jᵀ in original units, J the Jacobian of the exact back-transform.
Intervals, z statistics and p-values are centred at ``params``, so z = params / bse. The simulation also
estimates the estimator's bias (the simulated median minus the plug-in solution): from the warm start it is
negligible (abs(bias) ≤ 0.05 SE on the benchmark designs); a bias above 0.2 standard errors (e.g. a zero start
with too few steps or too small step sizes) raises a warning, because the interval is then not centred
where it should be (``res.bias`` holds it).

Assumptions (stated in the docs and the summary): homoskedastic structural errors (``"unadjusted"``) or
independent rows (``"robust"``); the clipping of
the gradients is inactive or negligible (the adaptive rule clips at most min(½√n, 50) rows); the plug-in world is
close enough to the data's for the noise response; normal approximation.
Everything here is post-processing of releases except σ̂²_u of DP-2S-GD and the robust meat, whose costs are
recorded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dpivreg.compute.backends import DaskRows, is_dask_collection
from dpivreg.errors import InferenceOverflowError
from dpivreg.estimation.engine import (
    DP2SGDPath,
    IterationPlan,
)
from dpivreg.estimation.moments import (
    NOISE_FLOOR,
    central_covariance,
    central_in_units,
    central_scale_error,
    moment_noise_covariance,
    residual_variance_from_moments,
)
from dpivreg.estimation.simulation import MAX_WHITENING_ERROR, simulate_fit
from dpivreg.estimation.working_scale import WorkingScale
from dpivreg.inference.covariance import (
    MeatRequest,
    release_meats,
    resolve_cov_type,
    robust_covariance,
    score_edges,
    structural_residuals,
    structural_scores,
    unadjusted_covariance,
)
from dpivreg.privacy.accounting import Release, gaussian_zcdp
from dpivreg.privacy.rounding import sum_rounding
from dpivreg.privacy.sampler import add_noise, calibrate, draw_noise

__all__ = [
    "PrivateInference",
    "near_singular_share",
    "residual_variance_release",
    "noise_covariance",
    "private_inference",
    "moment_inference",
    "sampling_release",
    "MAX_BIAS_SE",
]

#: A simulated bias above this many standard errors (of any coefficient) raises a warning.
MAX_BIAS_SE = 0.2


@dataclass(frozen=True)
class PrivateInference:
    """Covariance of the private estimate in original units, with its pieces.

    Attributes
    ----------
    cov : ndarray (p, p)
        Total covariance J (V_samp + V_noise) Jᵀ.
    cov_sampling, cov_noise : ndarray (p, p)
        The two pieces, in original units.
    bias : ndarray (p,)
        Simulated bias of the estimate in original units (the simulated median minus the plug-in
        solution). Not subtracted from anything: a diagnostic (see the module docstring).
    sigma2 : float
        The residual variance σ̂²_u on the working scale (released, or read from the moments); NaN with
        ``cov_type="robust"``, which releases the meat instead.
    releases : tuple of Release
        The sampling part's releases (budget ``rho_inf``): σ̂²_u, or the robust meat's histogram and meat;
        empty when computed without noise or read from the moment release.
    replications : int
        Number of simulated noise paths.
    first_stage_noise_ratio : float
        Spectral norm of the privacy noise left in the first stage (simulated) over the smallest singular
        value of the released full first stage Θ̄ (working scale). Near or above 1/3 the private first
        stage is weak relative to its noise, the estimate is a ratio of noisy quantities with heavy tails,
        and the normal intervals can under-cover (:attr:`reliable`).
    whitening_error : float
        Median spectral norm of Z̃ᵀZ̃/n − I over the simulated worlds: how imperfect the private
        whitening is (0 when exact).
    warnings : tuple of str
        Messages the fit raises as ``UserWarning`` (unreliable intervals, a bias above 0.2 SE).
    cov_type : str
        ``"robust"`` or ``"unadjusted"``: which sampling covariance (:mod:`dpivreg.inference.covariance`).
    meat : ndarray (q, q) or None
        The released score meat Ω̂ on the working scale (``"robust"``).
    noise_draws : ndarray (R, p) or None
        The simulated private estimates minus the plug-in solution, in original units: the privacy noise's
        distribution, heavy tails included (post-processing of releases). None when not simulated.
    near_singular : float
        Share of the simulated releases whose excluded instruments' first stage lies within its own privacy noise of
        a rank-deficient matrix (:func:`near_singular_share`): how often a release of these data makes the estimate a
        ratio over noise.
    diagnostic_meats : tuple of ReleasedMeat
        The further meats asked for (``extra=``), released in the robust meat's passes, each with its own records
        (not in ``releases``).
    """

    cov: np.ndarray
    cov_sampling: np.ndarray
    cov_noise: np.ndarray
    bias: np.ndarray
    sigma2: float
    releases: tuple[Release, ...]
    replications: int
    first_stage_noise_ratio: float = 0.0
    whitening_error: float = 0.0
    warnings: tuple[str, ...] = field(default=())
    cov_type: str = "unadjusted"
    meat: np.ndarray | None = field(default=None, repr=False)
    noise_draws: np.ndarray | None = field(default=None, repr=False)
    near_singular: float = 0.0
    diagnostic_meats: tuple = field(default=(), repr=False)

    #: Thresholds above which the intervals are flagged as unreliable (see ``reliable``).
    MAX_NOISE_RATIO = 1.0 / 3.0
    MAX_WHITENING_ERROR = MAX_WHITENING_ERROR

    @property
    def reliable(self) -> bool:
        """False when the first stage is weak relative to its privacy noise or the whitening is poor.

        Both diagnostics are post-processing of released or public quantities. In the coverage
        study (docs) the cells flagged here are those where nominal 95% intervals covered
        noticeably less (e.g. n = 1000, p = q = 5, total ρ = 0.5).
        """
        return (self.first_stage_noise_ratio < self.MAX_NOISE_RATIO
                and self.whitening_error < self.MAX_WHITENING_ERROR)


def clipped_squared_residuals(Z, X_endog, Y, beta, n_exog: int, clip: float) -> tuple[np.ndarray]:
    """Σᵢ min(ũᵢ², C) over one block of rows (a block function; :func:`residual_variance_release`)."""
    return (np.array([_clipped_squared_sum(Z, X_endog, Y, beta, n_exog, clip)]),)


def _clipped_squared_sum(Z, X_endog, Y, beta, n_exog: int, clip: float):
    """Σᵢ min(ũᵢ², C): a number for numpy rows, a lazy scalar for Dask arrays. ``fmin`` maps a NaN residual to C (the
    clamp is total: one row moves the sum by at most C whatever it holds)."""
    with np.errstate(over="ignore", invalid="ignore"):  # ũ² = inf is clamped to C like any large residual
        return np.sum(np.fmin(structural_residuals(Z, X_endog, Y, beta, n_exog) ** 2, clip))


def residual_variance_release(scale: WorkingScale, beta_working: np.ndarray, *, rho: float, tau: float,
                              rng: np.random.Generator) -> tuple[float, Release | None]:
    """Private mean of the clipped squared structural residuals on the working scale.

    ``rho = inf`` computes it exactly (no release record; only for non-private routes). With Dask
    working arrays (a Dask design) the clipped sum is one task per partition and only the partitions' sums
    reach the driver, where the noise is drawn. With privacy units (:mod:`dpivreg.privacy.units`) the sum
    is divided by the normaliser n̂ and a neighbour changes up to m rows' terms: sensitivity m·C/n̂. The sensitivity
    and the noise are times the rounding allowance of the blocked sum (:func:`dpivreg.privacy.rounding.sum_rounding`
    with r = 1/m: 1 + 1.46·10⁻³ at n = 10⁸ rows), recorded in the release.
    """
    n = scale.n
    clip = 2.0 * (tau + math.log(n)) * (1.0 + float(np.sum(np.abs(beta_working)))) ** 2
    # Summed in blocks of at most 2¹⁶ rows added pairwise (the order dpivreg.privacy.rounding's allowance assumes): on
    # Dask one task per partition, so that only the partitions' sums reach the driver; in memory the fit's row source
    # (working rows held, or built a block at a time).
    if scale.held is not None and is_dask_collection(scale.held[0]):
        rows = DaskRows(*scale.held)
    else:
        rows = scale.rows()
    try:
        (total,) = rows.sums(clipped_squared_residuals, beta_working, scale.n_exog, clip)
    finally:
        rows.close()
    mean = float(total[0]) / n
    if math.isinf(rho):
        return mean, None
    terms = scale.units.max_rows if scale.unit_level else 1
    # terms in [0, C], exact (fmin): r = C/(m·C), no slack; at most N·m rows (n at row level)
    rounding = sum_rounding(scale.n_units * terms, 1.0 / terms)
    sensitivity = rounding * terms * clip / n
    cal = calibrate(rng, sensitivity=sensitivity, sigma=sensitivity / math.sqrt(2.0 * rho), dim=1)
    released = float(add_noise(np.array(mean), draw_noise(rng, cal.sigma, cal.grid, ()), cal.grid))
    name = "residual variance for inference" + (f", per unit of at most {terms} rows" if terms > 1 else "")
    release = Release(name, "rho_inf", 1, clip, cal.sensitivity, cal.sigma,
                      gaussian_zcdp(cal.sensitivity, cal.sigma, 1), cal.grid, rounding)
    # A variance is positive: floor the noisy value at the release's own resolution.
    return max(released, sensitivity), release


@dataclass(frozen=True)
class SamplingPart:
    """The sampling covariance on the working scale and what it was computed from."""

    cov: np.ndarray
    cov_type: str
    sigma2: float
    meat: np.ndarray | None
    releases: tuple[Release, ...]
    note: str = ""
    extra: tuple = ()  # the further meats released in the same passes (covariance.ReleasedMeat)

    def overflow(self, message: str) -> InferenceOverflowError:
        """The error for a covariance that cannot be computed after these releases: they, and the further meats,
        go with it to the accountant."""
        return InferenceOverflowError(message, releases=tuple(self.releases), meats=self.extra)


def sampling_release(scale: WorkingScale, theta: np.ndarray, beta: np.ndarray, *, cov_type: str, rho: float,
                     tau: float, rng: np.random.Generator, sigma2: float | None = None,
                     extra: Sequence[MeatRequest] = ()) -> SamplingPart:
    """The sampling covariance of ``cov_type`` at the released (Θ, β̃), with its release (budget ``rho``).

    ``"unadjusted"``: σ̂²_u from ``sigma2`` when given (noisy moments read it from their release, no cost),
    else :func:`residual_variance_release`. ``"robust"``, ``"clustered"``: the score meat
    (:func:`dpivreg.inference.covariance.release_meats`), with the ``extra`` meats (the fit's diagnostics,
    ``rho_diag``) released in the same two passes over the rows. ``rho = inf``: exact (non-private routes only).
    """
    n = scale.n
    k = scale.n_exog
    cov_type = resolve_cov_type(cov_type)
    if cov_type == "unadjusted":
        if extra:
            raise ValueError("further meats are released with a robust or clustered meat, not with cov_type "
                             "'unadjusted'.")
        releases: tuple[Release, ...] = ()
        if sigma2 is None:
            sigma2, release = residual_variance_release(scale, beta, rho=rho, tau=tau, rng=rng)
            releases = () if release is None else (release,)
        return SamplingPart(unadjusted_covariance(theta, k, sigma2, n), "unadjusted", sigma2, None, releases)
    clustered = cov_type == "clustered"
    rows = scale.rows()
    try:
        what = "the clustered meat" if clustered else "the robust meat"
        released = release_meats(rows, [MeatRequest(structural_scores, (beta, k), rows.q, rho, what), *extra],
                                 rng=rng, clustered=clustered)
        meat, releases, bound = released[0].matrix, released[0].releases, released[0].bound
        top = score_edges(scale.q, n / rows.groups.count("cluster") if clustered else 1.0)[-1]
    finally:
        rows.close()
    note = ""
    if math.isfinite(bound) and bound >= top:
        note = (f"the {cov_type} meat's histogram showed no bin above its noise (tiny n or rho_inf), so its clipping "
                "threshold is the grid's top and the standard errors are very wide: raise rho_inf or use "
                "cov_type='unadjusted'.")
    # the clustered sandwich has the robust one's form: its meat is (1/n)Σ_c g_c g_cᵀ (dpivreg.inference.covariance)
    return SamplingPart(robust_covariance(theta, k, meat, n), cov_type, math.nan, meat, releases, note, released[1:])


#: The noise simulation of a fit's inference runs in batches, the first of :data:`MIN_REPLICATIONS` paths, until
#: the Monte Carlo standard error of every total standard error (sampling + noise) is at most
#: :data:`MC_TOLERANCE` of it, and at most ``replications`` (2000) paths. When the sampling part dominates,
#: few paths pin the total down; when the noise dominates, all 2000 are drawn (the error of the noise part's
#: scale, from the draws' central 95% range, is then about 0.96/√2000 ≈ 2.1% of it for normal draws).
MIN_REPLICATIONS = 250
MC_TOLERANCE = 0.01


def _total_se_mc_error(beta: np.ndarray, sampling_cov: np.ndarray) -> float:
    """Largest Monte Carlo standard error of a total SE √(sampling variance + noise scale²), relative to it, from the
    simulated β̃ draws: the noise scale's error (:func:`dpivreg.estimation.moments.central_scale_error`) propagated."""
    noise, _ = central_covariance(beta, np.zeros(beta.shape[1]))
    total = np.diag(sampling_cov) + np.diag(noise)
    if not np.all(np.isfinite(total)):  # too many non-finite draws: no error estimate (the covariance fails later)
        return math.inf
    error = np.sqrt(np.diag(noise)) * central_scale_error(beta)  # d(total variance) = 2·scale·d(scale)
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = np.where(total > 0, error / total, 0.0)
    return float(np.max(relative)) if np.all(np.isfinite(relative)) else math.inf


def noise_covariance(plan: IterationPlan, theta_T: np.ndarray, beta_T: np.ndarray, scale: WorkingScale, *,
                     replications: int, rng: np.random.Generator, warm_start: bool,
                     progress: bool | None = False,
                     sampling_cov: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray, float, float, int, np.ndarray, np.ndarray]:
    """Covariance and median shift of β̃⁽ᵀ⁾ due to the privacy noise
    (:func:`dpivreg.estimation.simulation.simulate_fit`).

    With ``sampling_cov`` (the sampling covariance on the working scale) the paths are drawn in batches until
    the total standard errors in original units (the reported ones) are known to :data:`MC_TOLERANCE` (at
    most ``replications``); without it, ``replications`` paths at once.

    Returns the covariance of the simulated β̃⁽ᵀ⁾ (:func:`dpivreg.estimation.moments.central_covariance`: scales from
    their central 95% ranges, measured in the original units, :func:`dpivreg.estimation.moments.central_in_units`),
    their median minus β_T (the simulated bias), the median spectral norm of the simulated
    first stage's deviation from its median (the privacy noise left in Θ⁽ᵀ⁾), the median whitening error
    ‖S_r − I‖₂, the number of paths drawn, and the simulated β̃⁽ᵀ⁾ (R, p) and Θ⁽ᵀ⁾ (R, q, p_endog) themselves.
    """
    adaptive = sampling_cov is not None and bool(np.all(np.isfinite(sampling_cov)))
    to_original = scale.beta_jacobian() if adaptive else None
    batch = min(MIN_REPLICATIONS, replications) if adaptive else replications
    draws: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    drawn = 0
    while True:
        draws.append(simulate_fit(plan, theta_T, beta_T, scale, replications=batch, rng=rng,
                                  warm_start=warm_start, progress=progress))
        drawn += batch
        if not adaptive or drawn >= replications:
            break
        beta = np.concatenate([d[1] for d in draws])
        # on the scale the SEs are reported in (J maps the working scale to original units; public post-processing)
        error = _total_se_mc_error(beta @ to_original.T, to_original @ sampling_cov @ to_original.T)
        if error <= MC_TOLERANCE:
            break
        # the error falls as 1/√m: the paths still needed, at least another first batch
        needed = drawn * (error / MC_TOLERANCE) ** 2 if math.isfinite(error) else replications
        batch = int(min(replications - drawn, max(MIN_REPLICATIONS, math.ceil(needed - drawn))))
    theta, beta, S = (np.concatenate([d[i] for d in draws]) for i in range(3))
    q = theta_T.shape[0]
    theta_noise = _median_deviation(theta)
    whitening = float(np.median(np.linalg.norm(S - np.eye(q), ord=2, axis=(1, 2))))
    cov, shift = central_in_units(beta, beta_T, scale.beta_jacobian())
    return cov, shift, theta_noise, whitening, drawn, beta, theta


def _median_deviation(theta: np.ndarray) -> float:
    """Median spectral norm of simulated first stages' deviations (R, q, p_endog) from their element-wise median."""
    with np.errstate(invalid="ignore"):
        deviation = theta - np.median(theta, axis=0)
    finite = np.all(np.isfinite(deviation), axis=(1, 2))
    norms = np.linalg.norm(np.where(finite[:, None, None], deviation, 0.0), ord=2, axis=(1, 2))
    return float(np.median(np.where(finite, norms, np.inf)))


def private_inference(path: DP2SGDPath, scale: WorkingScale, *, rho: float, tau: float,
                      rng: np.random.Generator, replications: int = 2000, start=None,
                      cov_type: str = "unadjusted", progress: bool | None = False,
                      extra: Sequence[MeatRequest] = ()) -> PrivateInference:
    """Covariance of the DP-2S-GD estimate in original units (see the module docstring).

    Parameters
    ----------
    path : DP2SGDPath
        The engine's released path on the working scale.
    scale : WorkingScale
        The working scale (whitened instruments: preprocess "private" or "data").
    rho : float
        Budget of the sampling part's release, σ̂²_u or the robust meat (inf: exact, only on non-private
        routes).
    tau : float
        Confidence parameter of the clipping threshold of σ̂²_u.
    rng : numpy.random.Generator
        Noise of the release and of the simulation.
    replications : int
        Largest number of simulated noise paths: they are drawn in batches until the total standard errors
        are known to :data:`MC_TOLERANCE` (:func:`noise_covariance`).
    start : (ndarray, ndarray) or None
        The warm start the run used (None: zero).
    cov_type : {"unadjusted", "robust"}
        The sampling covariance (:mod:`dpivreg.inference.covariance`).
    progress : bool or None, default False
        A progress bar over the simulation's T steps (None: automatic, as for ``fit``; True: always;
        False: never). It reads only the clock.
    extra : sequence of MeatRequest
        Further meats to release in the robust meat's passes (:func:`sampling_release`); returned as
        ``diagnostic_meats``.
    """
    _check_resolved(scale)  # before the sampling part spends rho_inf
    sampling = sampling_release(scale, path.theta_final, path.beta_final, cov_type=cov_type, rho=rho, tau=tau,
                                rng=rng, extra=extra)
    with _simulation_guard(sampling):
        v_noise, shift, theta_noise, whitening, drawn, beta_draws, theta_draws = noise_covariance(
            path.plan, path.theta_final, path.beta_final, scale, replications=replications, rng=rng,
            warm_start=start is not None, progress=progress, sampling_cov=sampling.cov)
    draws = _Draws(beta_draws, path.beta_final, theta_draws)
    return _assemble(scale, path.theta_final, path.n_exog, sampling, v_noise, shift, drawn, theta_noise,
                     whitening, draws)


def moment_inference(scale: WorkingScale, theta: np.ndarray, beta: np.ndarray, *, rng: np.random.Generator,
                     replications: int = 2000, cov_type: str = "unadjusted", rho: float = math.inf,
                     tau: float = 5.0, extra: Sequence[MeatRequest] = ()) -> PrivateInference:
    """Covariance of the noisy-moment 2SLS estimate (``method="moments"``) in original units.

    The sampling part: ``"unadjusted"`` uses σ̂²_u read from the same release (no further release);
    ``"robust"`` releases the score meat with budget ``rho``. The noise part re-releases the moments in
    plug-in worlds (:func:`dpivreg.estimation.moments.moment_noise_covariance`).
    """
    q = scale.q
    k = scale.n_exog
    moments = scale.moments
    sigma2 = None
    if resolve_cov_type(cov_type) == "unadjusted":
        sigma2 = max(residual_variance_from_moments(moments.solvable(), q, k, beta), 1e-300)
    _check_resolved(scale)  # before the sampling part spends rho_inf
    sampling = sampling_release(scale, theta, beta, cov_type=cov_type, rho=rho, tau=tau, rng=rng, sigma2=sigma2,
                                extra=extra)
    noise = moments.noise_draws(rng, replications)
    with _simulation_guard(sampling):
        v_noise, shift, theta_draws, beta_draws = moment_noise_covariance(
            moments.floored, noise, moments.solvable, q, k, theta.shape[1], scale.beta_jacobian())
        theta_noise = _median_deviation(theta_draws)
        S = moments.working_instruments(moments.plausible_instruments(noise), q)
        whitening = float(np.median(np.linalg.norm(S - np.eye(q), ord=2, axis=(1, 2))))
    return _assemble(scale, theta, k, sampling, v_noise, shift, replications, theta_noise, whitening,
                     _Draws(beta_draws, beta, theta_draws))


@contextlib.contextmanager
def _simulation_guard(sampling: SamplingPart):
    """Turn a failure of the privacy-noise simulation on non-finite draws (noise far beyond float64, e.g. a
    budget of 1e-300) into :class:`InferenceOverflowError`, keeping the sampling part's releases."""
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            yield
    except (np.linalg.LinAlgError, ValueError, FloatingPointError) as exc:
        raise sampling.overflow(
            "the privacy-noise simulation is not finite: the noise of the releases is beyond float64 (a budget "
            f"far too small for these data?); raise rho0, rho1 and rho2 ({type(exc).__name__}: {exc})") from exc


def _check_resolved(scale: WorkingScale) -> None:
    """Refuse the private inference when the moment release resolves nothing: its noise floor
    (:data:`dpivreg.estimation.moments.NOISE_FLOOR`·σ) is at or above 1, the largest second moment a column mapped into
    [−1, 1] can have, so every column's variance is below what the release can tell from noise and the plug-in worlds
    would be the floor itself. Public (σ is): decided before anything is released for the inference, which then
    spends nothing."""
    moments = scale.moments
    if moments is not None and NOISE_FLOOR * moments.sigma >= 1.0:
        raise InferenceOverflowError(
            f"the moment release resolves nothing: its noise floor 2√2·σ = {NOISE_FLOOR * moments.sigma:.3g} is above "
            "1, the largest variance a column mapped into its bounds can have, so no plug-in world can be built from "
            "it; raise rho0 (or the total rho). Nothing was spent on the inference")


@dataclass(frozen=True)
class _Draws:
    """The simulated estimates of the privacy-noise simulation on the working scale: β (R, p) around the plug-in
    solution ``centre`` (p,), and the first stages Θ (R, q, p_endog)."""

    beta: np.ndarray
    centre: np.ndarray
    theta: np.ndarray


def near_singular_share(theta_draws: np.ndarray, theta: np.ndarray, n_exog: int) -> float:
    """Share of simulated first stages that lie within their own privacy noise of a rank-deficient one.

    The full first stage [I_exog | Θ] (working scale) has full rank exactly when the excluded instruments' block
    Θ_z (rows n_exog onwards, (q − n_exog) × p_endog) has full column rank: the exogenous rows cannot make it singular.
    Θ_z,ᵢ of a simulated release is at distance σ_min(Θ_z,ᵢ) from the nearest rank-deficient matrix (Eckart–Young); its
    privacy noise is Eᵢ = Θ_z,ᵢ − Θ_z, Θ the plug-in first stage. Where σ_min(Θ_z,ᵢ) ≤ ‖Eᵢ‖₂ the release cannot be told
    from an unidentified first stage and the estimate solved from it is a ratio over noise. A non-finite draw counts
    as near-singular. Post-processing of simulated draws only.
    """
    theta_draws = np.asarray(theta_draws, dtype=float)
    if theta_draws.shape[0] == 0:
        return 0.0
    excluded = theta_draws[:, n_exog:, :]
    finite = np.all(np.isfinite(excluded), axis=(1, 2))
    safe = np.where(finite[:, None, None], excluded, theta[None, n_exog:, :])
    smallest = np.linalg.svd(safe, compute_uv=False)[:, -1]
    noise = np.linalg.norm(safe - theta[None, n_exog:, :], ord=2, axis=(1, 2))
    return float(np.mean(~finite | (smallest <= noise)))


def _assemble(scale: WorkingScale, theta: np.ndarray, n_exog: int, sampling: SamplingPart, v_noise, shift,
              replications: int, theta_noise: float, whitening: float, draws: _Draws) -> PrivateInference:
    q = theta.shape[0]
    theta_full = np.concatenate([np.eye(q, n_exog), theta], axis=1)
    first_stage_strength = float(np.linalg.svd(theta_full, compute_uv=False)[-1])
    J = scale.beta_jacobian()
    with np.errstate(over="ignore", invalid="ignore"):
        cov_sampling, cov_noise = J @ sampling.cov @ J.T, J @ v_noise @ J.T
    if not (np.all(np.isfinite(cov_sampling)) and np.all(np.isfinite(cov_noise))):
        if np.all(np.isfinite(sampling.cov)) and np.all(np.isfinite(v_noise)):
            message = ("the covariance of the estimate overflows float64 in the original units (coefficients of "
                       f"order {np.max(np.abs(J)):.1e}): rescale the data (e.g. express the outcome in thousands)")
        else:
            message = ("the covariance of the estimate is not finite: the released first stage is singular or the "
                       "privacy noise overwhelms it (raise rho0 and rho1, or check the instruments' bounds)")
        raise sampling.overflow(message)
    # a variance that is positive on the working scale and exactly 0 in original units has underflowed
    expected_positive = (np.abs(J) > 0).astype(float) @ ((np.diag(sampling.cov) + np.diag(v_noise)) > 0)
    if np.any((np.diag(cov_sampling) + np.diag(cov_noise) < np.finfo(np.float64).tiny) & (expected_positive > 0)):
        raise sampling.overflow(
            "the covariance of the estimate underflows float64 in the original units (coefficients of order "
            f"{np.max(np.abs(J)):.1e}: variances below 2.2e-308 lose their digits, down to exactly 0, which would give "
            "standard errors of 0 and p-values of 0): rescale the data (e.g. express the outcome in units where its "
            "bounds are of order 1)")
    result = PrivateInference(cov_sampling + cov_noise, cov_sampling, cov_noise, J @ shift, sampling.sigma2,
                              sampling.releases, replications, theta_noise / max(first_stage_strength, 1e-300),
                              whitening, cov_type=sampling.cov_type, meat=sampling.meat,
                              noise_draws=_in_units(draws.beta - draws.centre, J),
                              near_singular=near_singular_share(draws.theta, theta, n_exog),
                              diagnostic_meats=sampling.extra)
    messages = [sampling.note] if sampling.note else []
    if not result.reliable:
        messages.append(_unreliable_message(result))
    se = np.sqrt(np.diag(result.cov))
    ratio = np.abs(result.bias) / np.where(se > 0, se, np.inf)
    if np.max(ratio) > MAX_BIAS_SE:
        messages.append(
            f"the estimate carries a simulated bias of up to {np.max(ratio):.2g} standard errors (flag above "
            f"{MAX_BIAS_SE:g}): the iteration has not converged from its start, and the intervals, centred at "
            "the estimate, may miss. Use the warm start (init='moments'), more iterations T or the default "
            "step sizes; res.bias holds the simulated bias.")
    return dataclasses.replace(result, warnings=tuple(messages))


def _in_units(deviations: np.ndarray, jacobian: np.ndarray) -> np.ndarray:
    """Working-scale deviations (R, p) in original units (the back-transform is affine: J maps deviations)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return deviations @ jacobian.T


def _unreliable_message(inference: PrivateInference) -> str:
    return (
        "the private standard errors may be unreliable: the privacy noise left in the first stage is "
        f"{inference.first_stage_noise_ratio:.2g} of its smallest singular value (flag above "
        f"{inference.MAX_NOISE_RATIO:.2g}) and the private whitening is off by {inference.whitening_error:.2g} "
        f"(flag above {inference.MAX_WHITENING_ERROR:.2g}). The linearisation behind the intervals then need not hold, "
        "so their coverage is not known (it may be far below nominal). Increase n, rho0 (whitening) or rho1 (first "
        "stage)."
    )
