"""The privacy-noise simulation of a fit: re-running DP-2S-GD in its moment form, with fresh noise, in plug-in worlds.

Without clipping, every gradient of DP-2S-GD depends on the data only through S = Z̃ᵀZ̃/n, Z̃ᵀX̃/n and Z̃ᵀỹ/n, and so
does the warm start (2SLS on the released moments). :func:`plug_in_worlds` builds worlds whose 2SLS solution is a
released (Θ, β̃) and whose instruments' moments are plausible given the moment release and its known noise;
:func:`simulate_fit` runs the fit's iteration plan in each (its T, step sizes, schedule, preconditioner, clipping
groups and per-step noise scales); :func:`world_releases` re-releases each world's moments as the moment estimator
reads them. The estimator's and T's choice (:mod:`dpivreg.estimation.selection`) and the noise part of the private
standard errors (:mod:`dpivreg.inference.private`) both read these simulations. Everything here is post-processing
of releases and public settings: it reads no data and costs no privacy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from dpivreg.compute.kernels import resolve_kernel
from dpivreg.compute.simulation_steps import numba_simulation_steps
from dpivreg.estimation.engine import IterationPlan, _per_row, preconditioner_matrix, preconditioner_root
from dpivreg.estimation.moments import solve_2sls
from dpivreg.estimation.working_scale import ReleasedMoments, WorkingScale
from dpivreg.progress import RunTimeForecast

__all__ = ["MAX_WHITENING_ERROR", "Worlds", "plug_in_worlds", "simulate_fit", "simulation_kernel", "world_releases"]

#: Median spectral norm of Z̃ᵀZ̃/n − I over simulated worlds above which the private whitening is too poor for the
#: normal intervals (:attr:`dpivreg.inference.private.PrivateInference.reliable`) and for DP-2S-GD's contraction
#: (the estimator choice's cap, :data:`dpivreg.estimation.selection.MAX_KAPPA`).
MAX_WHITENING_ERROR = 0.5


def _stacked_root(theta: np.ndarray, q: int, k: int, ridge: float, kind: str) -> np.ndarray:
    """:func:`dpivreg.estimation.engine.preconditioner_root` for a stack of first stages (S = I), faster for the
    Cholesky root: one batched Cholesky factorisation and inverse of P = Θ̄ᵀΘ̄ + ridge·I instead of an eigendecomposition,
    a QR and a solve (equal up to rounding: P's eigenvalues are ≥ ridge). Falls back to the engine's root
    when a factorisation fails (a spectrum too wide for Cholesky in floating point) or for the symmetric root.
    """
    S = np.eye(q)
    if kind != "cholesky":
        return preconditioner_root(theta, S, k, ridge, kind)
    P = preconditioner_matrix(theta, S, k, ridge)
    if not np.all(np.isfinite(P)):
        return preconditioner_root(theta, S, k, ridge, kind)
    try:
        return np.linalg.inv(np.linalg.cholesky(P))
    except np.linalg.LinAlgError:
        return preconditioner_root(theta, S, k, ridge, kind)


@dataclass(frozen=True)
class Worlds:
    """Plug-in worlds of the privacy-noise simulation (:func:`plug_in_worlds`), on the working scale unless said.

    Attributes
    ----------
    S : ndarray (R, q, q)
        Each world's true Z̃ᵀZ̃/n.
    g_x, g_y : ndarray (R, q, p_endog), (R, q)
        Its true Z̃ᵀX̃_endog/n and Z̃ᵀỸ/n (its 2SLS solution is the plug-in one).
    released : ndarray (R, q + p_endog + 1, same) or None
        Its moment release as 2SLS reads it (the rows of Z̃: its instruments' block floored at the noise as the fit's
        was, and its cross moments), ready to solve; None without a release.
    instruments : ndarray (R, b, b) or None
        Its true moments of the constant and the instruments on the box scale (to re-release with another noise
        level, :func:`world_releases`); None without a release.
    """

    S: np.ndarray
    g_x: np.ndarray
    g_y: np.ndarray
    released: np.ndarray | None
    instruments: np.ndarray | None

    def __len__(self) -> int:
        return int(self.S.shape[0])


def plug_in_worlds(scale: WorkingScale, theta: np.ndarray, beta: np.ndarray, *, replications: int,
                   rng: np.random.Generator) -> Worlds:
    """The plug-in worlds of the privacy-noise simulation: their true working moments and their releases.

    World r's instruments are plausible given the release: their box-scale moments (with the constant's) are
    F − E_r, the release's block floored at its noise
    (:attr:`~dpivreg.estimation.working_scale.ReleasedMoments.floored`, what every solve uses) less a draw E_r of the
    noise, kept positive semi-definite
    (:meth:`~dpivreg.estimation.working_scale.ReleasedMoments.plausible_instruments`); on the working scale, S_r. Its
    reduced form is the plug-in solution, Z̃ᵀ[X̃_endog, Ỹ]/n = S_r Π with Π = [Θ, Θ̄β], so that the world's 2SLS solution
    is (Θ, β) (the released estimate, or the warm start when predicting before a run). The world's release adds the same
    E_r to its moments (so that its instruments' block is, where the projection is idle, the floored one the working
    scale was built from, as the fit's) and is floored as the fit's was (:func:`world_releases`). Without a release
    (route "bounds") every world is the plug-in one, S = I, with no release.
    """
    q, p_endog = theta.shape
    k = beta.shape[0] - p_endog
    R = replications
    moments = scale.moments
    Pi = np.concatenate([theta, (np.concatenate([np.eye(q, k), theta], axis=1) @ beta)[:, None]], axis=1)
    if moments is None:
        S = np.broadcast_to(np.eye(q), (R, q, q))
        cross = S @ Pi
        return Worlds(S, cross[..., :p_endog], cross[..., -1], None, None)
    noise = moments.noise_draws(rng, R)
    instruments = moments.plausible_instruments(noise)
    S = moments.working_instruments(instruments, q)
    cross = S @ Pi
    worlds = Worlds(S, cross[..., :p_endog], cross[..., -1], None, instruments)
    return dataclasses.replace(worlds, released=world_releases(moments, worlds, noise))


def world_releases(moments: ReleasedMoments, worlds: Worlds, noise: np.ndarray,
                   sigma: float | None = None) -> np.ndarray:
    """The worlds' moment releases as 2SLS reads them, on the working scale (R, q + p_endog + 1, same; the rows of Z̃):
    their true moments plus ``noise`` (R, D, D, box scale) of standard deviation ``sigma`` (default the release's),
    the instruments' block floored at it (:meth:`~dpivreg.estimation.working_scale.ReleasedMoments.floor`)."""
    q, p_endog = worlds.g_x.shape[1:]
    b = moments.instrument_block
    released = np.zeros((len(worlds), q + p_endog + 1, q + p_endog + 1))
    raw = worlds.instruments + noise[:, :b, :b]
    floored = moments.floor(raw, sigma)
    released[:, :q, :q] = moments.working_instruments(floored, q)
    cross = np.concatenate([worlds.g_x, worlds.g_y[..., None]], axis=2)
    # what the floor adds to the block also reaches Z̃ᵀ[X̃, Ỹ] through the constant, on which X̃ and Ỹ load
    L = moments.working_map
    floor_cross = L[:q, :b] @ (floored - raw) @ L[q:, :b].T
    released[:, :q, q:] = cross + moments.working(noise)[:, :q, q:] + floor_cross
    return released


def simulate_fit(plan: IterationPlan, theta_T: np.ndarray, beta_T: np.ndarray, scale: WorkingScale, *,
                 replications: int, rng: np.random.Generator, warm_start: bool,
                 progress: bool | None = False, kernel: str = "auto",
                 worlds: Worlds | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draws of (Θ⁽ᵀ⁾, β̃⁽ᵀ⁾) under the privacy noise, by re-running the fit in moment form.

    Replication r is run in plug-in world r (:func:`plug_in_worlds` at (Θ_T, β_T), unless ``worlds`` are given):
    from its warm start (2SLS on its floored release, ``warm_start``; else from zero), the plan's iteration
    (:class:`dpivreg.estimation.engine.IterationPlan`) on the world's true moments: same T, step sizes, schedule,
    method, preconditioner root and ridge, clipping groups and per-step noise scales, fresh noise.

    Returns the simulated Θ⁽ᵀ⁾ (R, q, p_endog) and β̃⁽ᵀ⁾ (R, p), and the worlds' Z̃ᵀZ̃/n (R, q, q).

    ``progress``: a progress bar over the T steps (:class:`dpivreg.progress.ProgressBar`; None automatic, True
    always, False never, the default). It reads only the clock: the draws are the same with and without it.

    ``kernel``: the steps' implementation, ``"numba"`` (one compiled loop over paths and steps,
    :func:`dpivreg.compute.simulation_steps.numba_simulation_steps`), ``"numpy"`` (batched over the paths, a step at
    a time) or ``"auto"`` (:func:`simulation_kernel`). Both consume the same noise, drawn in the same order, and give
    the same draws to rounding.
    """
    k = plan.n_exog
    q, p_endog = theta_T.shape
    p = beta_T.shape[0]
    if worlds is None:
        worlds = plug_in_worlds(scale, theta_T, beta_T, replications=replications, rng=rng)
    R = len(worlds)
    if warm_start and worlds.released is None:  # exact moments: the world's 2SLS solution
        theta, beta = np.repeat(theta_T[None], R, axis=0), np.repeat(beta_T[None], R, axis=0)
    elif warm_start:
        theta, beta = solve_2sls(worlds.released, q, k, p_endog)
    else:
        theta, beta = np.zeros((R, q, p_endog)), np.zeros((R, p))
    forecast = RunTimeForecast(f"the privacy-noise simulation ({R} replications of the iteration)", plan.T,
                               "fit(inference=False) skips it; a smaller T shortens it.", progress=progress,
                               desc=f"privacy-noise simulation ({R} paths)")
    run = _simulation_steps(kernel)
    theta, beta = np.ascontiguousarray(theta, dtype=np.float64), np.ascontiguousarray(beta, dtype=np.float64)
    S, g_x, g_y = (np.ascontiguousarray(a, dtype=np.float64) for a in (worlds.S, worlds.g_x, worlds.g_y))
    with forecast, np.errstate(over="ignore", invalid="ignore"):
        for steps in _step_chunks(plan.T, R * (q * p_endog + p)):
            forecast.step(steps.start)
            xi, nu = _step_noise(plan, steps, rng, theta.shape, beta.shape)
            active = np.ascontiguousarray(plan.schedule[:, steps].T > 0)
            theta, beta = run(theta, beta, S, g_x, g_y, xi, nu, active, plan)
    return theta, beta, S


#: Bytes of privacy noise drawn ahead for a chunk of the simulation's steps (:func:`_step_chunks`).
_NOISE_CHUNK_BYTES = 1 << 21


def simulation_kernel(kernel: str) -> str:
    """The simulation's implementation, ``"numba"`` or ``"numpy"`` (see :func:`simulate_fit`): ``"auto"`` takes numba
    when it is installed (the compiled loop was 5 times faster per step at q = p = 6 and 2.7 times at
    q = p = 50, 250 paths, one thread); ``"numba"`` without numba is an ImportError."""
    return resolve_kernel(kernel, 1, 1)


def _simulation_steps(kernel: str):
    """``run(theta, beta, S, g_x, g_y, xi, nu, active, plan) -> (theta, beta)`` for a chunk of steps."""
    if simulation_kernel(kernel) == "numpy":
        return _numpy_simulation_steps
    return _numba_simulation_steps


def _step_chunks(T: int, per_step: int) -> list[range]:
    """The steps 0..T−1 in chunks whose noise takes at most :data:`_NOISE_CHUNK_BYTES` (``per_step`` draws a
    step); the first four steps alone, so that :class:`~dpivreg.progress.RunTimeForecast` sees its rate early."""
    size = max(1, _NOISE_CHUNK_BYTES // (8 * max(per_step, 1)))
    starts = list(range(min(T, 4))) + list(range(min(T, 4), T, size))
    return [range(a, min(b, T)) for a, b in zip(starts, starts[1:] + [T])]


def _step_noise(plan: IterationPlan, steps: range, rng: np.random.Generator, theta_shape: tuple,
                beta_shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The privacy noise of the steps ``steps`` for every path: ξ (steps, R, q, p_endog) and ν (steps, R, p), drawn
    step by step in the order ξ_t, ν_t (the stream the simulation has always used)."""
    q, p = theta_shape[1], beta_shape[1]
    xi = np.empty((len(steps), *theta_shape))
    nu = np.empty((len(steps), *beta_shape))
    for i, t in enumerate(steps):
        xi[i] = rng.standard_normal(theta_shape) * _per_row(plan.noise1[t], plan.split, q)[:, None]
        nu[i] = rng.standard_normal(beta_shape) * _per_row(plan.noise2[t], plan.split, p)
    return xi, nu


def _numpy_simulation_steps(theta, beta, S, g_x, g_y, xi, nu, active, plan: IterationPlan):
    """The steps of a chunk, batched over the paths (numpy); see :func:`simulate_fit`."""
    R, q, _ = theta.shape
    k = plan.n_exog
    exog_block = np.broadcast_to(np.eye(q, k), (R, q, k))
    for c in range(xi.shape[0]):
        theta_full = np.concatenate([exog_block, theta], axis=2)
        grad2 = (np.einsum("rji,rjk,rk->ri", theta_full, S @ theta_full, beta)
                 - np.einsum("rji,rj->ri", theta_full, g_y))
        if plan.method == "preconditioned":
            W = _stacked_root(theta, q, k, plan.ridge, plan.root)
            step = np.einsum("rji,rj->ri", W, np.einsum("rij,rj->ri", W, grad2) - nu[c])
        else:
            step = grad2 - nu[c]
        if active[c, 1]:
            beta = beta - plan.alpha * step
        if active[c, 0]:
            theta = theta - plan.eta * ((S @ theta - g_x) - xi[c])
    return theta, beta


def _numba_simulation_steps(theta, beta, S, g_x, g_y, xi, nu, active, plan: IterationPlan):
    """The steps of a chunk in the compiled loop (:func:`dpivreg.compute.simulation_steps.numba_simulation_steps`),
    in place; redone with numpy from copies when the loop meets a Cholesky pivot that rounding made non-positive."""
    start = theta.copy(), beta.copy()
    ridge = 0.0 if plan.ridge is None else float(plan.ridge)
    root = 0 if plan.method != "preconditioned" else 1 if plan.root == "cholesky" else 2
    done = numba_simulation_steps()(theta, beta, S, g_x, g_y, xi, nu, active, float(plan.eta), float(plan.alpha),
                                    ridge, int(plan.n_exog), root)
    if done:
        return theta, beta
    return _numpy_simulation_steps(*start, S, g_x, g_y, xi, nu, active, plan)
