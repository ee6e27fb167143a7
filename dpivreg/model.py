"""DPIV2SLS: the user-facing model, glue from the design to the engine and the results."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from typing import Mapping

import numpy as np
from formulaic.utils.context import capture_context

from dpivreg._validation import check_positive, check_T
from dpivreg.compute.backends import on_passes
from dpivreg.data.arrays import design_from_arrays
from dpivreg.data.boundary import design_leaks
from dpivreg.data.checks import CHECK_DATA_LEAK
from dpivreg.data.dask_design import (
    dask_design_from_arrays,
    dask_design_from_formula,
    dask_r_factor,
    is_dask_collection,
)
from dpivreg.data.design import IVDesign, design_from_formula
from dpivreg.data.unit_ids import resolve_units
from dpivreg.errors import (
    ConvergenceWarning,
    DivergenceError,
    InferenceOverflowError,
    PrivacyLeakWarning,
    TConditionWarning,
)
from dpivreg.estimation import tuning
from dpivreg.estimation.clipping import adaptive_clip, resolve_public_clip, standardized_clip, theorem_clip
from dpivreg.estimation.engine import DP2SGDPath, iteration_plan, preconditioner_root, run_on_rows
from dpivreg.estimation.moments import solve_2sls
from dpivreg.estimation.selection import MAX_KAPPA, choose_estimator, choose_iterations
from dpivreg.estimation.theory import delta_tau, t_condition
from dpivreg.estimation.working_scale import WorkingScale, repeat_moment_release, working_scale
from dpivreg.fit_options import (
    DEFAULT_SHARES,
    FIT_METHODS,
    INITS,
    FitOptions,
    _resolve_schedule,
    default_shares,
    fit_docstring,
    resolve_fit_options,
)
from dpivreg.inference.covariance import (
    ENDOGENEITY_MEAT_SHARE,
    MeatRequest,
    ReleasedMeat,
    endogeneity_scores,
    first_stage_scores,
    release_meats,
)
from dpivreg.inference.diagnostics import released_gram
from dpivreg.inference.iv_tests import endogeneity_score_map
from dpivreg.inference.private import moment_inference, private_inference
from dpivreg.privacy.accounting import PrivacyBudget, Release
from dpivreg.privacy.sampler import make_rng
from dpivreg.privacy.units import PrivacyUnits
from dpivreg.progress import ProgressBar
from dpivreg.reporting.results import DPIVResults, FitSettings

# FIT_METHODS, INITS, DEFAULT_SHARES and default_shares live in dpivreg.fit_options; named here as in 0.1.
__all__ = ["DPIV2SLS", "theorem_clip", "standardized_clip", "FIT_METHODS", "INITS", "DEFAULT_SHARES", "default_shares"]


def _paper_step_sizes_from_data(scale: WorkingScale) -> tuple[float, float]:
    """The experiments' rule η = 1/(1+δ)², α = 2/(2γ̄+γ̲) with δ, γ̄, γ̲ read from the data.

    The paper's appendix defining δ(τ), γ̄(τ), γ̲(τ) is unavailable; we take the tightest
    values those high-probability bounds stand for: (1+δ)² = λ_max(ZᵀZ/n) (so η = 1/λ_max, the
    isotropic η = 1/(1+δ)² when E[zzᵀ] = I), and γ̄, γ̲ = the largest and smallest eigenvalues of
    Θ̂ᵀ(ZᵀZ/n)Θ̂ with Θ̂ the first-stage least-squares fit (exogenous columns map to themselves).
    Both read the private data, so a fit that uses them raises PrivacyLeakWarning.
    """
    (Z, X_endog, _), k = scale.arrays(), scale.n_exog
    n, q = Z.shape
    # The triangular factor of [Z, X_endog] = Q·[Rz, Rx] (one TSQR pass on Dask). Then Z·Θ̂ = Q·Rz·Θ̂ with
    # Θ̂ = lstsq(Rz, Rx), and the spectra come from singular values of small factors (no normal equations).
    if is_dask_collection(Z):
        import dask.array as da  # noqa: PLC0415


        R = dask_r_factor(da.concatenate([Z, X_endog], axis=1).rechunk({1: -1}))
    else:
        R = np.linalg.qr(np.column_stack([Z, X_endog]), mode="r")
    Rz, Rx = R[:, :q], R[:, q:]
    eta = 1.0 / (np.linalg.svd(Rz, compute_uv=False)[0] ** 2 / n)
    W = np.column_stack([Rz[:, :k], Rz @ np.linalg.lstsq(Rz, Rx, rcond=None)[0]])  # x̂ = Q·W
    eigenvalues = np.sort(np.linalg.svd(W, compute_uv=False) ** 2 / n)
    gamma_under, gamma_bar = max(eigenvalues[0], 0.0), eigenvalues[-1]
    if not gamma_bar > 0:
        raise ValueError(
            "the paper's step-size rule needs a non-zero first-stage fit, but the instruments explain none of "
            "the regressors here. Pass public eta= and alpha=, or check the instruments."
        )
    return float(eta), float(2.0 / (2.0 * gamma_bar + gamma_under))


class DPIV2SLS:
    """Instrumental-variable regression by differentially private two-stage gradient descent.

    Parameters
    ----------
    dependent : array_like
        Outcome (n,) or (n, 1).
    exog : array_like or None
        Exogenous regressors (n, k), their own instruments; include a constant column for an
        intercept. ``None`` for none.
    endog : array_like
        Endogenous regressors (n, p_endog).
    instruments : array_like
        Excluded instruments (n, q_instr), q_instr >= p_endog.
    constant : str, None or False
        Which exogenous column is the intercept: its name (``"exog.0"`` for the first column of a
        NumPy array, ``"exog"`` for a single one), ``None`` (default) for a column named
        ``"Intercept"`` or ``"const"`` (``statsmodels.add_constant``), ``False`` for none. It is a
        declaration, hence public: dpivreg never infers the intercept from the values, because one
        row could then change what the fit releases. An undeclared column of ones is an ordinary
        regressor that needs bounds. Formulas declare it with ``1 +``.
    missing : {"drop", "drop-public", "fill"}
        Rows with a missing value. ``"drop"`` (default, as linearmodels, so the 2SLS benchmark uses the
        same rows): dropped jointly; when any is dropped, the fit raises a ``PrivacyLeakWarning``, since
        the number of complete rows is then published exactly. ``"drop-public"``: dropped, with which
        rows are complete declared public (no warning). ``"fill"``: every row kept, each missing value
        replaced by its public ``fill_values`` entry (the estimand becomes that of the filled data).
        Under ``"drop"``, a frame without missing values announces nothing: it is read as coming from a
        schema without missing values, a fact the data holder asserts by using it. Rows that the formula
        itself makes missing (``np.log`` of 0) are a leak under every policy.
        See :mod:`dpivreg.data.boundary` and the docs' "What may be published".
    fill_values : float or dict, optional
        ``missing="fill"``: one number for every column, or ``{column: value}`` (keys: the design's
        column names for arrays, the data's columns for formulas).
    indicators : list, optional
        ``missing="fill"``: columns whose filled rows get a 0/1 exogenous regressor ``missing_<column>``.

    Notes
    -----
    Exogenous regressors are their own instruments: 2SLS projects an exogenous column onto
    itself exactly, so only the endogenous block of the first stage Θ is estimated by the
    private first stage and the second stage uses x̂ = [exog, Z·Θ_endog] with
    Z = [exog, instruments]. Arguments follow ``linearmodels.iv.IV2SLS``.

    Examples
    --------
    >>> from dpivreg import DPIV2SLS
    >>> from dpivreg.datasets import load_labsup
    >>> df = load_labsup()
    >>> res = DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", df).fit(
    ...     rho1=1, rho2=1,  # the stages' budgets: with the default shares of the other releases, total rho 2.7
    ...     bounds={"weeks": (0, 52), "kids": (0, 12), "samesex": (0, 1)}, seed=0)
    >>> print(res.summary())  # doctest: +SKIP
    """

    def __init__(self, dependent, exog, endog, instruments, *, constant=None, missing: str = "drop",
                 fill_values=None, indicators=()) -> None:
        options = {"constant": constant, "missing": missing, "fill_values": fill_values, "indicators": indicators}
        self._data = None
        if any(is_dask_collection(value) for value in (dependent, exog, endog, instruments)):

            self._design = dask_design_from_arrays(dependent, exog, endog, instruments, **options)
        else:
            self._design = design_from_arrays(dependent, exog, endog, instruments, **options)

    @classmethod
    def _from_design(cls, design: IVDesign, data=None) -> "DPIV2SLS":
        model = cls.__new__(cls)
        model._design = design
        model._data = data  # the frame a formula was applied to: fit(privacy_unit=...) reads a column of it
        if data is not None and not is_dask_collection(data):  # its rows as they were (see _checked_data)
            model._index, model._shape = data.index.copy(), data.shape
        return model

    @classmethod
    def from_formula(cls, formula: str, data, *, formula_engine: str = "formulaic", missing: str = "drop",
                     fill_values=None, indicators=()) -> "DPIV2SLS":
        """Build the model from a linearmodels-style formula ``dep ~ exog + [endog ~ instruments]``.

        Parameters
        ----------
        formula : str
            E.g. ``"weeks ~ 1 + educ + [kids ~ samesex]"``. With a bracket there is no implicit
            intercept: write ``1 +`` for one. Functions and variables of the caller's namespace
            (``np.log``, user functions) resolve as in linearmodels.
        data : pandas.DataFrame or dask.dataframe.DataFrame
            The data; never modified. Rows with a missing value in any part are dropped jointly.
            A Dask DataFrame gives a lazy design (see the docs' Dask page): the design
            specification is built once and applied per partition, and categories must be
            known.
        formula_engine : {"formulaic", "patsy"}
            ``"formulaic"`` builds exactly linearmodels' ``IV2SLS.from_formula`` design;
            ``"patsy"`` uses patsy's naming and coding (statsmodels users).
        missing, fill_values, indicators
            The missing-value policy, as for the constructor; ``fill_values`` keys are the data's
            columns (a codebook may name unused ones), a category's fill value one of its categories.

        Notes
        -----
        Category levels are public only when declared: a pandas ``Categorical`` column's categories
        or ``C(x, levels=[...])``. Levels read from the data (a text column, ``C(x)`` of a column that
        is not a Categorical) make the fit raise a ``PrivacyLeakWarning``. A declared level that does
        not occur does not fail the fit, but the noise of its empty moments costs every coefficient
        its precision: merge rare levels by a public rule (docs: the privacy boundary).
        """
        context = capture_context(1)
        options = {"context": context, "formula_engine": formula_engine, "missing": missing,
                   "fill_values": fill_values, "indicators": indicators}
        if is_dask_collection(data):

            return cls._from_design(dask_design_from_formula(formula, data, **options), data)
        return cls._from_design(design_from_formula(formula, data, **options), data)

    def persist(self) -> "DPIV2SLS":
        """A model whose Dask design is computed once and kept in the (cluster's) memory.

        Each iteration of ``fit`` is one pass over the design; without persisting, every pass
        reads the source and applies the formula again. Returns ``self`` for in-memory data.
        """
        if not getattr(self._design, "is_dask", False):
            return self
        return type(self)._from_design(self._design.persist(), self._data)

    @property
    def design(self) -> IVDesign:
        """The named design blocks (dependent, exog, endog, instruments)."""
        return self._design

    def _checked_data(self):
        """The frame the model was built from, for reading a privacy unit's or clusters' column, refused when its
        rows changed since (sorted, filtered, appended in place): the ids would no longer line up with the design's
        rows, and a person's rows could be split over several units."""
        data = self._data
        if data is not None and not is_dask_collection(data):
            if data.shape[0] != self._shape[0] or not data.index.equals(self._index):
                raise ValueError("the data frame's rows changed since the model was built (sorted, filtered or "
                                 "appended in place?): build the model again from the frame as it is now, so that "
                                 "privacy_unit and clusters line up with the design's rows.")
        return data

    @property
    def formula(self) -> str | None:
        """The formula the model was built from, if any."""
        return self._design.formula

    @property
    def exog_names(self) -> list:
        """statsmodels' ``exog_names``: the names of the regressors [exog, endog], the order of ``params`` (what
        ``statsmodels.iolib.summary2.summary_col`` reads). In linearmodels' terms the exogenous ones are
        ``design.exog_names``."""
        return list(self._design.regressor_names)

    @property
    def endog_names(self) -> str:
        """statsmodels' ``endog_names``: the dependent variable's name (statsmodels calls the dependent variable
        endog; the endogenous regressors are ``design.endog_names``)."""
        return str(self._design.dependent_name)

    def __repr__(self) -> str:
        d = self._design
        return (
            f"DPIV2SLS(dependent={d.dependent_name!r}, exog={d.exog_names}, endog={d.endog_names}, "
            f"instruments={d.instrument_names}, nobs={d.nobs})"
        )

    # ------------------------------------------------------------------ fit
    @fit_docstring
    def fit(
        self,
        *,
        rho1: float | None = None,
        rho2: float | None = None,
        T: int | None = None,
        rho: float | None = None,
        rho0: float | None = None,
        rho_clip: float | None = None,
        rho_inf: float | None = None,
        rho_diag: float | None = None,
        delta: float = 1e-5,
        preprocess: str = "private",
        method: str = "auto",
        init: str | None = None,
        schedule: str | None = None,
        eta: float | None = None,
        alpha: float | None = None,
        clip: float | tuple[float, float] | Mapping[str, float] | str | bool | None = None,
        exog_share: float = 0.2,
        calibration: str = "exact",
        bounds: Mapping[str, tuple[float, float]] | None = None,
        seed=None,
        tau: float = 5.0,
        inference: bool = True,
        cov_type: str | None = None,
        progress: bool | None = None,
        privacy_unit=None,
        max_rows_per_unit: int | None = None,
        clusters=None,
        check_data: bool = False,
        epsilon: float | None = None,
    ) -> DPIVResults:
        options = resolve_fit_options(
            rho=rho, rho1=rho1, rho2=rho2, rho0=rho0, rho_clip=rho_clip, rho_inf=rho_inf, rho_diag=rho_diag, T=T,
            delta=delta, preprocess=preprocess, method=method, init=init, schedule=schedule, eta=eta, alpha=alpha,
            clip=clip, calibration=calibration, tau=tau, inference=inference, cov_type=cov_type, progress=progress,
            privacy_unit=privacy_unit, max_rows_per_unit=max_rows_per_unit, clusters=clusters, check_data=check_data,
            epsilon=epsilon, exog_share=exog_share)
        rng = make_rng(seed)
        units = self._privacy_units(options, privacy_unit, rng)
        with _pass_progress(self._design, options.progress) as passes:
            if options.method == "moments":
                return self._fit_moments(options.budget, bounds=bounds, preprocess=options.preprocess,
                                         inference=options.inference, delta=options.delta, tau=options.tau, rng=rng,
                                         cov_type=options.cov_type, units=units, check_data=options.check_data)
            return self._fit_dp2sgd(options.budget, T=T, preprocess=options.preprocess, method=options.method,
                                    init=options.init, schedule=schedule, eta=eta, alpha=alpha, clip=options.clip,
                                    exog_share=options.exog_share, calibration=calibration, bounds=bounds,
                                    tau=options.tau,
                                    inference=options.inference, delta=options.delta, rng=rng, select=options.select,
                                    cov_type=options.cov_type, progress=options.progress, passes=passes, units=units,
                                    check_data=options.check_data)

    def _privacy_units(self, options: FitOptions, privacy_unit, rng: np.random.Generator) -> PrivacyUnits | None:
        """The privacy units and clusters of the fit, or None at row level without clusters. The truncation's keys
        come from a child stream (privacy units only: a row-level fit with clusters truncates nothing, and its later
        children must stay those of the same fit without clusters)."""
        if privacy_unit is None and options.clusters is None:
            return None
        seed = int(_child(rng).integers(2**63)) if privacy_unit is not None else 0
        return resolve_units(self._design, privacy_unit=privacy_unit, clusters=options.clusters,
                              max_rows_per_unit=options.max_rows_per_unit, data=self._checked_data(), seed=seed)

    def _fit_dp2sgd(self, budget: dict, *, T, preprocess, method, init, schedule, eta, alpha, clip, exog_share,
                    calibration, bounds, tau, inference, delta, rng, select: bool = False,
                    cov_type: str = "unadjusted", progress: bool | None = False,
                    passes: ProgressBar | None = None, units: PrivacyUnits | None = None,
                    check_data: bool = False) -> DPIVResults:
        rho1, rho2, rho0 = budget["rho1"], budget["rho2"], budget["rho0"]
        leaks: list[str] = []
        scale = working_scale(self._design, bounds, route=preprocess, rho0=rho0, rng=rng, units=units,
                              check_data=check_data)
        leaks += design_leaks(self._design, scale.units) + _scale_leaks(scale, preprocess)
        n, q = scale.n, scale.q  # n: the public normaliser (n̂ = N·k̂ with privacy units)
        p = scale.p
        k = scale.n_exog
        start, kappa = None, 0.0
        if init == "moments":
            theta0, beta0 = solve_2sls(scale.moments.solvable(), q, k, p - k)
            start = (theta0, beta0)
            if scale.moments.sigma > 0:
                kappa = tuning.whitening_error(scale.instrument_moment_draws(rng, 200))
        noiseless = math.isinf(rho1) and math.isinf(rho2)
        steps = _resolve_steps(eta, alpha, T, method=method, init=init, kappa=kappa, noiseless=noiseless,
                               scale=scale, leaks=leaks)
        eta, alpha, T_checked = steps["eta"], steps["alpha"], steps["T"]
        if preprocess != "bounds":
            _check_step_stability(None if steps["eta_source"] == "data" else eta,
                                  None if steps["alpha_source"] == "data" else alpha, method=method, n=n, q=q, tau=tau)
        schedule = _resolve_schedule(schedule, init)
        contraction = tuning.contraction(kappa, min(eta, alpha))
        shares = _schedule_shares(schedule, T_checked, contraction)
        if preprocess != "bounds":
            _warn_slow_progress(eta, alpha, np.count_nonzero(shares > 0, axis=1))
        rows = scale.rows()
        try:
            clip_choice = None
            if isinstance(clip, str) and clip == "adaptive":
                clip_choice = _adaptive_clip(rows, scale, start, method, rho=budget["rho_clip"],
                                             stage_rho=(rho1, rho2), rng=rng)
                clip1, clip2, clip_source = clip_choice.clip1, clip_choice.clip2, "adaptive (private)"
            else:
                clip1, clip2, clip_source = resolve_public_clip(clip, n=n, q=q, p=p, p_endog=p - k, T=T_checked,
                                                                tau=tau, rho1=rho1, rho2=rho2)
            if preprocess == "private" and math.isinf(rho0):
                leaks.append("rho0 = inf: the preprocessing moments were released without noise (not private).")
            if clip_choice is not None and math.isinf(budget["rho_clip"]):
                leaks.append("rho_clip = inf: the clipping histograms were released without noise (not private).")
            selection = None
            finite = all(math.isfinite(budget[name]) for name in ("rho0", "rho_clip", "rho1", "rho2", "rho_inf"))

            def make_plan(T_plan: int):
                return iteration_plan(n, q, p, k, T=T_plan, rho1=rho1, rho2=rho2, eta=eta, alpha=alpha, clip1=clip1,
                                      clip2=clip2, calibration=calibration, method=method,
                                      schedule=_schedule_shares(schedule, T_plan, contraction), group_share=exog_share)

            plan = None
            if steps["T_source"] == "from kappa" and clip_choice is not None and finite and 0 < kappa < MAX_KAPPA:
                # T from simulating each candidate's noise (post-processing of the releases; see choose_iterations)
                T_checked, plan, _ = choose_iterations(scale, start, make_plan, rng=_child(rng))
                shares, steps["T_source"] = plan.schedule, "simulated"
            if select and start is not None and finite:
                plan = make_plan(T_checked) if plan is None else plan  # the simulated T's plan is the one that runs
                # the robust meat is released at the estimate either way, with rho_inf; σ̂² is in the moments
                rest = rho1 + rho2 + (budget["rho_inf"] if inference and cov_type == "unadjusted" else 0.0)
                # the prediction's Monte Carlo draws come from a child stream: the fit's own noise stream, and so
                # the DP-2S-GD branch, is then exactly what method="preconditioned" draws for the same seed
                selection = choose_estimator(scale, start, plan, rng=_child(rng),
                                             moments_sigma=scale.moments.sigma * math.sqrt(rho0 / (rho0 + rest)))
                if selection.estimator == "noisy moments":
                    scale = repeat_moment_release(self._design, scale, rho=rest, rng=rng, units=units)
                    return self._moments_results(scale, [clip_choice.release], leaks, budget, preprocess=preprocess,
                                                 inference=inference, delta=delta, tau=tau, rng=rng,
                                                 selection=selection, total=rho0 + rest, cov_type=cov_type,
                                                 units=units)
            unseen = clip_choice.unseen_note() if clip_choice is not None else ""
            if unseen:  # DP-2S-GD runs with a top-edge threshold
                warnings.warn(unseen, UserWarning, stacklevel=3)
            if (method == "gd" or init == "zero") and not scale.unit_level:  # the Theorem is for row-level privacy
                _warn_t_condition(T_checked, n=n, p=p, q=q, rho1=rho1 if calibration == "exact" else rho1 / 2.0,
                                  tau=tau)
            if passes is not None:  # on Dask: the iteration's passes, then the inference's (an estimate)
                passes.set_total(passes.done + T_checked + _passes_after_iteration(inference, preprocess, cov_type,
                                                                                   budget["rho_diag"]))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", PrivacyLeakWarning)
                path = run_on_rows(
                    rows, p, k, T=T_checked, rho1=rho1, rho2=rho2, eta=eta, alpha=alpha, clip1=clip1, clip2=clip2,
                    calibration=calibration, seed=rng, method=method,
                    theta0=None if start is None else start[0], beta0=None if start is None else start[1],
                    schedule=shares, group_share=exog_share,
                    progress=False if passes is not None else progress,  # on Dask the bar over the passes counts them
                )
        finally:
            rows.close()
        for w in caught:
            if issubclass(w.category, PrivacyLeakWarning):
                leaks.append(str(w.message))
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        # without noise on the data route too (its moments were exact): recorded, so the accountant lists it
        exact_inference = inference and (preprocess == "data" or math.isinf(budget["rho_inf"]))
        if exact_inference:
            leaks.append(_unnoised_sampling(cov_type, preprocess)[0])
        leaks += _diagnostic_meat_leaks(budget, preprocess)
        _announce_leaks(leaks, stacklevel=4)

        requests = _diagnostic_requests(scale, path.theta_final, budget, preprocess)
        inference_result, inference_note, drawn, fused = _run_inference(
            inference, preprocess, lambda: private_inference(
                path, scale, rho=math.inf if preprocess == "data" else budget["rho_inf"], tau=tau, rng=rng,
                start=start, cov_type=cov_type, progress=progress, extra=requests))
        releases = [*scale.releases, *([clip_choice.release] if clip_choice else []), *path.privacy.releases]
        if drawn is not None:
            releases += drawn
        if drawn is not None and exact_inference:
            releases.append(_unnoised_sampling(cov_type)[1])
        diagnostic_meats = _diagnostic_meats(scale, requests, fused, rng, cov_type)
        releases += [r for meat in diagnostic_meats if meat is not None for r in meat.releases]
        target = {name: budget[name] for name in ("rho0", "rho_clip", "rho1", "rho2", "rho_inf", "rho_diag")
                  if any(r.stage == name for r in releases)}
        privacy = PrivacyBudget(releases, target=target, unit=scale.units)
        settings = FitSettings(
            T=path.T, eta=path.eta, alpha=path.alpha, eta_source=steps["eta_source"],
            alpha_source=steps["alpha_source"], clip1=clip1, clip2=clip2, clip_source=clip_source,
            calibration=calibration, tau=tau, rho0=privacy.rho0 if preprocess == "private" else 0.0, rho1=rho1,
            rho2=rho2, preprocess=preprocess, method=method, rho_inf=privacy.rho_of("rho_inf"), init=init,
            schedule=schedule, T_source=steps["T_source"], rho_clip=privacy.rho_of("rho_clip"), kappa=kappa,
            exog_share=exog_share if path.split is not None else 0.0, adaptive_clip=clip_choice,
            selection=selection, cov_type=cov_type if inference_result is not None else "none",
        )
        return DPIVResults(model=self, engine_path=path, scale=scale, settings=settings, delta=delta,
                           leaks=tuple(leaks), privacy=privacy, inference=inference_result,
                           inference_note=inference_note, first_stage_meat=diagnostic_meats[0],
                           endogeneity_meat=diagnostic_meats[1], units=units)

    def _fit_moments(self, budget: dict, *, bounds, preprocess, inference, delta, tau, rng,
                     cov_type: str, units: PrivacyUnits | None = None, check_data: bool = False) -> DPIVResults:
        """Noisy-moment 2SLS: the whole budget on one moment release (see :mod:`dpivreg.estimation.moments`), less the
        meat's ``rho_inf`` with ``cov_type`` "robust" or "clustered"."""
        meat = budget["rho_inf"] if inference and cov_type != "unadjusted" else 0.0
        meat += budget["rho_diag"] or 0.0
        # the moment release gets the rest (rho0 + rho1 + rho2 + rho_clip, as _budgets added them up)
        total = budget["total"] - meat if math.isfinite(meat) else sum(
            budget[name] for name in ("rho0", "rho1", "rho2", "rho_clip") if name != "rho0" or preprocess == "private")
        leaks: list[str] = []
        scale = working_scale(self._design, bounds, route=preprocess, rho0=total, rng=rng, units=units,
                              check_data=check_data)
        leaks += design_leaks(self._design, scale.units) + _scale_leaks(scale, preprocess)
        if preprocess == "private" and math.isinf(total):
            leaks.append("rho = inf: the moments were released without noise (not private).")
        return self._moments_results(scale, [], leaks, budget, preprocess=preprocess, inference=inference,
                                     delta=delta, tau=tau, rng=rng, selection=None, total=total, cov_type=cov_type,
                                     units=units)

    def _moments_results(self, scale: WorkingScale, extra_releases: list, leaks: list[str], budget: dict, *,
                         preprocess: str, inference: bool, delta: float, tau: float, rng: np.random.Generator,
                         selection, total: float, cov_type: str, units: PrivacyUnits | None = None) -> DPIVResults:
        """Announce the leaks, then 2SLS on the scale's (released) moments, its inference and the results."""

        q = scale.q
        k = scale.n_exog
        p = scale.p
        theta, beta = solve_2sls(scale.moments.solvable(), q, k, p - k)
        path = _single_estimate_path(theta, beta, k, scale.releases)
        robust = inference and cov_type != "unadjusted"  # a meat release (robust or clustered)
        rho_meat = math.inf if preprocess == "data" else budget["rho_inf"]
        exact_meat = robust and math.isinf(rho_meat)
        if exact_meat:
            leaks.append(_unnoised_sampling(cov_type, preprocess)[0])
        leaks += _diagnostic_meat_leaks(budget, preprocess)
        _announce_leaks(leaks, stacklevel=5)  # the caller of fit(), through _fit_* and this method
        requests = _diagnostic_requests(scale, theta, budget, preprocess)
        inference_result, inference_note, drawn, fused = _run_inference(
            inference, preprocess, lambda: moment_inference(scale, theta, beta, rng=rng, cov_type=cov_type,
                                                            rho=rho_meat, tau=tau, extra=requests))
        releases = [*scale.releases[:1], *extra_releases, *scale.releases[1:]]
        target = {"rho0": total} if preprocess == "private" else {}
        if extra_releases:  # the default's switch: ``total`` is the moments' (both releases), the clipping apart
            target = {"rho0": total, "rho_clip": budget["rho_clip"]}
        if drawn is not None and robust:
            releases += drawn
            if drawn:  # refused before its release (a moment release that resolves nothing): nothing spent
                target["rho_inf"] = budget["rho_inf"]
            if exact_meat:
                releases.append(_unnoised_sampling(cov_type)[1])
        diagnostic_meats = _diagnostic_meats(scale, requests, fused, rng, cov_type)
        if diagnostic_meats[0] is not None:
            releases += [r for meat in diagnostic_meats for r in meat.releases]
            target["rho_diag"] = budget["rho_diag"]
        privacy = PrivacyBudget(releases, target=target, unit=scale.units)
        settings = FitSettings(
            T=0, eta=0.0, alpha=0.0, eta_source="none", alpha_source="none", clip1=None, clip2=None,
            clip_source="entries of the bounded columns in [-1, 1]", calibration="exact", tau=tau,
            rho0=privacy.rho0, rho1=0.0, rho2=0.0, preprocess=preprocess, method="moments",
            rho_inf=privacy.rho_of("rho_inf"),
            init="none", schedule="none", T_source="none", rho_clip=privacy.rho_of("rho_clip"), selection=selection,
            cov_type=cov_type if inference_result is not None else "none",
        )
        return DPIVResults(model=self, engine_path=path, scale=scale, settings=settings, delta=delta,
                           leaks=tuple(leaks), privacy=privacy, inference=inference_result,
                           inference_note=inference_note, first_stage_meat=diagnostic_meats[0],
                           endogeneity_meat=diagnostic_meats[1], units=units)


@contextlib.contextmanager
def _pass_progress(design, progress: bool | None):
    """On a Dask design, one progress bar over the fit's passes over the data (:class:`~dpivreg.progress.ProgressBar`,
    as ``progress`` says), advanced after each pass (:func:`dpivreg.compute.backends.on_passes`); None in memory, where
    the loops have their own bars."""
    if not getattr(design, "is_dask", False) or progress is False:
        yield None
        return
    with ProgressBar("passes over the Dask data", None, unit="pass", progress=progress) as bar, \
            on_passes(lambda: bar.update(bar.done + 1)):
        yield bar


#: Passes over the rows after the iteration (the bar's estimate, corrected when the fit ends): the robust meat's
#: row source, histogram and meat (with the meats of ``rho_diag`` in the same passes), or the residual variance; the
#: meats of ``rho_diag`` without the inference (row source, histograms, meats).
_INFERENCE_PASSES = {"robust": 3, "clustered": 3, "unadjusted": 1}
_DIAGNOSTIC_MEAT_PASSES = 3


def _passes_after_iteration(inference: bool, preprocess: str, cov_type: str, rho_diag) -> int:
    passes = _INFERENCE_PASSES[cov_type] if inference and preprocess != "bounds" else 0
    return passes + (_DIAGNOSTIC_MEAT_PASSES if rho_diag is not None and not passes else 0)


def _warn_t_condition(T: int, *, n: int, p: int, q: int, rho1: float, tau: float) -> None:
    """Warn (:class:`~dpivreg.TConditionWarning`) when T exceeds the T condition of the paper's Theorem 1 (as the
    summary's bound block evaluates it: constants 1, ρ1 as spent). Public inputs only: costs no privacy."""
    condition = t_condition(T, n, p, q, rho1, tau)
    if condition.holds:
        return
    limit = condition.limit
    change = (f"Use T <= {math.floor(limit)}, raise rho1 (or n)" if limit >= 1 else
              "No T >= 1 meets it at this n and rho1: raise rho1 (or n)")
    warnings.warn(
        f"T = {T} exceeds the T condition of the paper's Theorem 1, T <~ rho1·n²/(p(√q+√τ)⁶) = {limit:.4g} here "
        f"(n = {n}, p = {p}, q = {q}, rho1 = {rho1:g} spent by the first stage, tau = {tau:g}; constants set to 1), "
        f"by a factor {condition.factor:.3g}. The Theorem's error bound (res.bound, the summary's bound block) does "
        "not cover this fit: past the limit the first stage's accumulated privacy noise can swamp Θ and the error "
        f"grows with T. {change}, or use the default warm start (preprocess='private', the default, with init "
        "and method left out; other preprocess routes start from zero), whose T is chosen by simulating the fit's "
        "own noise. The condition reads only public inputs (n, p, q, rho1, tau, T): this "
        "warning costs no privacy.", TConditionWarning, stacklevel=4)


def _diagnostic_meat_leaks(budget: dict, preprocess: str) -> list[str]:
    """The leaks of the diagnostics' meats computed without noise: an infinite ``rho_diag``, or the data route
    (which computes them from the exact data whatever ``rho_diag``)."""
    if budget["rho_diag"] is None:
        return []
    if preprocess == "data":
        return [f"preprocess='data': the {meat} was computed from the exact data, without noise (not private), "
                "whatever rho_diag." for meat in _DIAGNOSTIC_MEATS]
    if math.isinf(budget["rho_diag"]):
        return [_unnoised(meat, "rho_diag")[0] for meat in _DIAGNOSTIC_MEATS]
    return []


#: The meats ``rho_diag`` buys, as the leak messages and the records of an infinite ``rho_diag`` name them.
_DIAGNOSTIC_MEATS = ("first stage's meat", "endogeneity test's meat")


def _diagnostic_requests(scale: WorkingScale, theta: np.ndarray, budget: dict, preprocess: str) -> list:
    """The meats ``rho_diag`` buys, as requests (none when not asked for): the first stage's at the released working
    first stage ``theta`` (``1 − ENDOGENEITY_MEAT_SHARE`` of it), and the robust endogeneity test's at the maps the
    released moments give (the rest; :mod:`dpivreg.inference.iv_tests`). Exact on the data route."""
    if budget["rho_diag"] is None:
        return []
    rho = math.inf if preprocess == "data" else budget["rho_diag"]
    p = scale.p - scale.n_exog
    R, b = endogeneity_score_map(released_gram(scale.moments), scale.q, scale.n_exog, p)
    return [MeatRequest(first_stage_scores, (theta,), scale.q * p, (1.0 - ENDOGENEITY_MEAT_SHARE) * rho,
                        f"the {_DIAGNOSTIC_MEATS[0]}"),
            MeatRequest(endogeneity_scores, (R[1:], b[1:]), p, ENDOGENEITY_MEAT_SHARE * rho,
                        f"the {_DIAGNOSTIC_MEATS[1]}")]


def _diagnostic_meats(scale: WorkingScale, requests: list, fused: tuple, rng: np.random.Generator,
                      cov_type: str = "robust") -> tuple[ReleasedMeat, ReleasedMeat] | tuple[None, None]:
    """The meats of ``requests`` (None, None when there are none): those the inference released in its passes
    (``fused``), or, when it did not run or stopped before its release, released here in two passes of their own
    (per cluster with ``cov_type="clustered"``)."""
    if not requests:
        return None, None
    meats = tuple(fused)
    if not meats:
        rows = scale.rows()
        try:
            meats = release_meats(rows, requests, rng=rng, clustered=cov_type == "clustered")
        finally:
            rows.close()
    if math.isinf(requests[0].rho):  # infinite rho_diag or the data route: recorded, not private (leak announced)
        meats = tuple(dataclasses.replace(meat, releases=(_unnoised(name, "rho_diag")[1],))
                      for meat, name in zip(meats, _DIAGNOSTIC_MEATS))
    return meats


def _unnoised_sampling(cov_type: str, preprocess: str = "private") -> tuple[str, Release]:
    """The leak message and the (not private) record of the sampling part computed without noise (rho_inf = inf,
    or the data route, whose inference reads the exact data)."""
    statistic = {"robust": "robust meat", "clustered": "clustered meat"}.get(cov_type, "residual variance")
    message, record = _unnoised(f"{statistic} for inference", "rho_inf")
    if preprocess == "data":
        message = (f"preprocess='data': the {statistic} for inference was computed from the exact data, without "
                   "noise (not private), whatever rho_inf.")
    return message, record


def _unnoised(statistic: str, stage: str) -> tuple[str, Release]:
    """The leak message and the (not private) record of ``statistic`` computed without noise (``stage`` = inf)."""
    return (f"{stage} = inf: the {statistic} was computed without noise (not private).",
            Release.unnoised(f"{statistic} (no noise)", stage))


def _announce_leaks(leaks: list[str], *, stacklevel: int) -> None:
    """One PrivacyLeakWarning per leak, attributed to the user's call of fit() (``stacklevel`` counts from
    here)."""
    for leak in leaks:
        warnings.warn(leak, PrivacyLeakWarning, stacklevel=stacklevel)


def _schedule_shares(schedule: str, T: int, contraction: float) -> np.ndarray:
    """(2, T) budget shares of the named schedule (:mod:`dpivreg.estimation.tuning`)."""
    return tuning.staggered_schedule(T, contraction) if schedule == "staggered" else tuning.uniform_schedule(T)


def _child(rng: np.random.Generator) -> np.random.Generator:
    """An independent generator that leaves ``rng``'s own stream untouched (numpy's spawn)."""
    try:
        return rng.spawn(1)[0]
    except (AttributeError, TypeError, ValueError):  # numpy < 1.25, or no seed sequence: draw a seed instead
        return np.random.default_rng(int(rng.integers(2**63)))


def _adaptive_clip(rows, scale: WorkingScale, start, method: str, *, rho: float, stage_rho: tuple[float, float],
                   rng: np.random.Generator):
    """The private clipping release at the starting point (zeros without a warm start)."""
    q, p, k = scale.q, scale.p, scale.n_exog
    theta0, beta0 = start if start is not None else (np.zeros((q, p - k)), np.zeros(p))
    W0 = None
    if method == "preconditioned":
        W0 = preconditioner_root(theta0, np.eye(q), k, 1e-4, "cholesky" if k else "symmetric")
    return adaptive_clip(rows, theta0, beta0, W0, k, rho=rho, stage_rho=stage_rho, rng=rng)


def _scale_leaks(scale: WorkingScale, preprocess: str) -> list[str]:
    leaks = [CHECK_DATA_LEAK] if scale.checked_data else []
    if scale.leaked_columns:
        leaks.append("bounds were read from the data (no public bounds given) for: " + ", ".join(scale.leaked_columns)
                     + ". Pass bounds={column: (lower, upper)} for each of them (an intercept column is declared "
                     "instead: a formula's 1 +, a column named 'const', or DPIV2SLS(..., constant=name)).")
    if preprocess == "data":
        leaks.append("centring, scaling and whitening used the exact data moments (preprocess='data'). "
                     "Use preprocess='private' to pay for them in the budget.")
    return leaks


def _resolve_steps(eta, alpha, T, *, method: str, init: str, kappa: float, noiseless: bool, scale: WorkingScale,
                   leaks: list[str]) -> dict:
    """Step sizes and T, with where each came from (see the ``fit`` docstring)."""
    T_checked = None if T is None else check_T(T)
    sources = {"eta": "user" if eta is not None else None, "alpha": "user" if alpha is not None else None}
    if method == "preconditioned" and init == "moments":
        default = tuning.step_sizes(kappa)
        eta = default if eta is None else eta
        alpha = default if alpha is None else alpha
        sources = {name: src or "1/(1+kappa)" for name, src in sources.items()}
    elif method == "preconditioned":
        T_for_steps = 20 if T_checked is None else T_checked
        default = 1.0 if noiseless else min(1.0, 6.0 / T_for_steps)
        eta = default if eta is None else eta
        alpha = default if alpha is None else alpha
        sources = {name: src or "min(1, 6/T)" for name, src in sources.items()}
    elif eta is None or alpha is None:
        data_eta, data_alpha = _paper_step_sizes_from_data(scale)
        leaked = [name for name in ("eta", "alpha") if sources[name] is None]
        eta = data_eta if eta is None else eta
        alpha = data_alpha if alpha is None else alpha
        sources = {name: src or "data" for name, src in sources.items()}
        leaks.append(f"step size(s) {', '.join(leaked)} were computed from the data's eigenvalues (the paper's rule). "
                     "Pass public eta= and alpha= for a private fit.")
    eta, alpha = check_positive(eta, "eta"), check_positive(alpha, "alpha")
    T_source = "user"
    if T_checked is None:
        if init == "moments":
            T_checked = tuning.iterations(max(tuning.contraction(kappa, eta), tuning.contraction(kappa, alpha)))
            T_source = "from kappa"
        else:
            T_checked, T_source = 20, "paper's experiments"
    return {"eta": eta, "alpha": alpha, "T": T_checked, "eta_source": sources["eta"],
            "alpha_source": sources["alpha"], "T_source": T_source}


def _run_inference(requested: bool, preprocess: str, compute):
    """(result, note, releases, meats): the private inference or why there is none, the releases it drew (None
    when it did not run), which the accountant records even when the covariance then overflows, and the diagnostics'
    meats it released in its passes (empty when it released none)."""
    if not requested:
        return None, "not requested (inference=False)", None, ()
    if preprocess == "bounds":
        return None, "unavailable with preprocess='bounds' (needs privately whitened instruments)", None, ()
    try:
        result = compute()
    except InferenceOverflowError as exc:
        return None, f"unavailable: {exc}", exc.releases, tuple(exc.meats)
    for message in result.warnings:
        warnings.warn(message, UserWarning, stacklevel=4)
    return result, "", result.releases, tuple(result.diagnostic_meats)


def _single_estimate_path(theta: np.ndarray, beta: np.ndarray, n_exog: int, releases) -> DP2SGDPath:
    """The moment estimate as a path of length 0 (T = 0), so that the results object reads it like a fit."""
    return DP2SGDPath(theta=theta[None], beta=beta[None], lambda1=0.0, lambda2=0.0, clip1=None, clip2=None, eta=0.0,
                      alpha=0.0, n_exog=n_exog, calibration="exact", method="moments",
                      privacy=PrivacyBudget(list(releases)), clipped_rows=np.zeros((0, 2), dtype=np.int64))


#: The share of the start's error that a run may leave (on the whitened scale, by its step sizes and steps) before
#: :func:`_warn_slow_progress` warns.
MAX_REMAINING_START_ERROR = 0.5


def _warn_slow_progress(eta: float, alpha: float, steps: np.ndarray) -> None:
    """Warn (:class:`~dpivreg.ConvergenceWarning`) when the step sizes are too small for the iteration to move
    far from its start in T steps (public quantities only).

    On the whitened working scale the first stage's Hessian is about I and the preconditioned second stage's
    about P_t, so each step leaves a share abs(1 − η) (abs(1 − α)) of the error; after the stage's steps that share
    is abs(1 − η)^steps. The plain ``"gd"`` second stage contracts more slowly still, so the rule is lenient there.
    """
    stages = [("eta", eta, int(steps[0])), ("alpha", alpha, int(steps[1]))]
    slow = [(name, value, count, abs(1.0 - min(value, 1.0)) ** count) for name, value, count in stages
            if count > 0 and abs(1.0 - min(value, 1.0)) ** count > MAX_REMAINING_START_ERROR]
    for name, value, count, remaining in slow:
        warnings.warn(
            f"{name}={value:g} over {count} steps leaves about {remaining:.0%} of the start's error on the "
            f"whitened working scale: the iteration cannot converge, so the estimate stays near its start and the "
            f"intervals, centred at it, may miss. Use the default step sizes (leave {name} out), or raise {name} "
            f"(about 1 on the whitened scale) or T.", ConvergenceWarning, stacklevel=4)


def _check_step_stability(eta: float | None, alpha: float | None, *, method: str, n: int, q: int,
                          tau: float) -> None:
    """Reject step sizes beyond the stability limits of the whitened working scale (public quantities).

    ``None`` skips a step size derived from the data's own spectrum (the paper's rule), which
    is stable for the actual data even where the isotropic limit below would not say so.

    With E[z̃z̃ᵀ] = I the eigenvalues of Z̃ᵀZ̃/n lie in [(1−δ)², (1+δ)²], δ = (√q+√τ)/√n (see
    :func:`dpivreg.estimation.theory.delta_tau`), so the first stage diverges for η > 2/(1−δ)² and is only
    guaranteed to converge below 2/(1+δ)²; the preconditioned second stage has Hessian ≈ P_t, so it
    diverges for α ≥ 2. Clipped gradients would hide the divergence (the iterates bounce instead of
    overflowing), hence the up-front check.
    """
    limit = 2.0 / max(1.0 - delta_tau(n, q, tau), 1e-12) ** 2
    if eta is not None and eta > limit:
        raise DivergenceError(
            f"the step size eta={eta:g} is too large: the first stage diverges on the whitened working scale "
            f"(stability limit about 2/(1-δ)² = {limit:.3g}). Lower eta (e.g. to 1)."
        )
    if method == "preconditioned" and alpha is not None and alpha >= 2.0:
        raise DivergenceError(
            f"the step size alpha={alpha:g} is too large: the preconditioned second stage diverges for "
            "alpha >= 2. Lower alpha (e.g. to 1)."
        )
