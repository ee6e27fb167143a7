"""DPIV2SLS: the user-facing model, glue from the design to the engine and the results."""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Mapping

import numpy as np
from formulaic.utils.context import capture_context

from ._dask import is_dask_collection
from .design import IVDesign, design_from_arrays, design_from_formula
from .engine import METHODS, DivergenceError, check_positive, check_T, dp_2s_gd, make_rng
from .inference import private_inference
from .preprocess import PREPROCESS_ROUTES, WorkingScale, working_scale
from .privacy import CALIBRATIONS, PrivacyBudget, PrivacyLeakWarning, check_delta, check_rho
from .results import DPIVResults, FitSettings
from .theory import delta_tau

__all__ = ["DPIV2SLS", "theorem_clip", "standardized_clip"]


def theorem_clip(n: int, q: int, T: int, *, tau: float = 5.0, c0: float = 1.0) -> float:
    """The Theorem's clipping threshold γ1 = γ2 = c0·(√q + √(τ + log(nT)))² (eq. "parameter settings").

    Public: it depends only on n, q, T and τ. It is stated for isotropic data of unit scale,
    so dpivreg applies it on the working scale.
    """
    return c0 * (math.sqrt(q) + math.sqrt(tau + math.log(n * T))) ** 2


def _paper_step_sizes_from_data(scale: WorkingScale) -> tuple[float, float]:
    """The experiments' rule η = 1/(1+δ)², α = 2/(2γ̄+γ̲) with δ, γ̄, γ̲ read from the data.

    The paper's appendix defining δ(τ), γ̄(τ), γ̲(τ) is unavailable; we take the tightest
    values those high-probability bounds stand for: (1+δ)² = λ_max(ZᵀZ/n) (so η = 1/λ_max, the
    isotropic η = 1/(1+δ)² when E[zzᵀ] = I), and γ̄, γ̲ = the largest and smallest eigenvalues of
    Θ̂ᵀ(ZᵀZ/n)Θ̂ with Θ̂ the first-stage least-squares fit (exogenous columns map to themselves).
    Both read the private data, so a fit that uses them raises PrivacyLeakWarning.
    """
    Z, X, k = scale.Z, scale.X, scale.n_exog
    n, q = Z.shape
    # The triangular factor of [Z, X_endog] = Q·[Rz, Rx] (one TSQR pass on Dask). Then Z·Θ̂ = Q·Rz·Θ̂ with
    # Θ̂ = lstsq(Rz, Rx), and the spectra come from singular values of small factors (no normal equations).
    if is_dask_collection(Z):
        import dask.array as da  # noqa: PLC0415

        from ._dask import dask_r_factor  # noqa: PLC0415

        R = dask_r_factor(da.concatenate([Z, X[:, k:]], axis=1).rechunk({1: -1}))
    else:
        R = np.linalg.qr(np.column_stack([Z, X[:, k:]]), mode="r")
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
    ...     rho1=1, rho2=1, T=20,
    ...     bounds={"weeks": (0, 52), "kids": (0, 12), "samesex": (0, 1)}, seed=0)
    >>> print(res.summary())  # doctest: +SKIP
    """

    def __init__(self, dependent, exog, endog, instruments) -> None:
        if any(is_dask_collection(value) for value in (dependent, exog, endog, instruments)):
            from ._dask import dask_design_from_arrays  # noqa: PLC0415 - dask is optional

            self._design = dask_design_from_arrays(dependent, exog, endog, instruments)
        else:
            self._design = design_from_arrays(dependent, exog, endog, instruments)

    @classmethod
    def _from_design(cls, design: IVDesign) -> "DPIV2SLS":
        model = cls.__new__(cls)
        model._design = design
        return model

    @classmethod
    def from_formula(cls, formula: str, data, *, formula_engine: str = "formulaic") -> "DPIV2SLS":
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
        """
        context = capture_context(1)
        if is_dask_collection(data):
            from ._dask import dask_design_from_formula  # noqa: PLC0415 - dask is optional

            return cls._from_design(
                dask_design_from_formula(formula, data, context=context, formula_engine=formula_engine))
        return cls._from_design(
            design_from_formula(formula, data, context=context, formula_engine=formula_engine)
        )

    def persist(self) -> "DPIV2SLS":
        """A model whose Dask design is computed once and kept in the (cluster's) memory.

        Each iteration of ``fit`` is one pass over the design; without persisting, every pass
        reads the source and applies the formula again. Returns ``self`` for in-memory data.
        """
        if not getattr(self._design, "is_dask", False):
            return self
        return type(self)._from_design(self._design.persist())

    @property
    def design(self) -> IVDesign:
        """The named design blocks (dependent, exog, endog, instruments)."""
        return self._design

    @property
    def formula(self) -> str | None:
        """The formula the model was built from, if any."""
        return self._design.formula

    def __repr__(self) -> str:
        d = self._design
        return (
            f"DPIV2SLS(dependent={d.dependent_name!r}, exog={d.exog_names}, endog={d.endog_names}, "
            f"instruments={d.instrument_names}, nobs={d.nobs})"
        )

    # ------------------------------------------------------------------ fit
    def fit(
        self,
        *,
        rho1: float,
        rho2: float,
        T: int,
        rho0: float | None = None,
        delta: float = 1e-5,
        preprocess: str = "private",
        method: str = "preconditioned",
        eta: float | None = None,
        alpha: float | None = None,
        clip: float | tuple[float, float] | Mapping[str, float] | str | bool | None = None,
        calibration: str = "exact",
        bounds: Mapping[str, tuple[float, float]] | None = None,
        seed=None,
        tau: float = 5.0,
        inference: bool = True,
        rho_inf: float | None = None,
    ) -> DPIVResults:
        """Fit by DP-2S-GD and return the private estimate beside the non-private 2SLS benchmark.

        Parameters
        ----------
        rho1, rho2 : float
            zCDP budgets of the first stage (Θ path) and the second stage (β path), > 0.
            ``numpy.inf`` means no noise in that stage: the fit is then NOT private.
        T : int
            Number of iterations.
        rho0 : float, optional
            zCDP budget of the private preprocessing (``preprocess="private"``): one release of
            the bounded columns' second moments, from which centring, scales and the
            instruments' whitening are computed. Default ``0.1·(rho1 + rho2)``. The fit spends
            rho0 + rho1 + rho2 in total; all three are reported.
        delta : float, default 1e-5
            δ at which ε is reported (the budget is zCDP; δ only affects the conversion).
        preprocess : {"private", "bounds", "data"}
            ``"private"`` (default): bounds, then private centring (with an intercept), scaling
            and whitening paid for with rho0. ``"bounds"``: scale by the bounds only, no
            budget. ``"data"``: the paper's practice, the same transformations from the exact
            data moments (a ``PrivacyLeakWarning``); for reproduction. See
            :mod:`dpivreg.preprocess`.
        method : {"preconditioned", "gd"}
            ``"preconditioned"`` (default): the second stage steps along P_t⁻¹·gradient with
            P_t built from the released Θ⁽ᵗ⁾, per-sample gradients clipped in the P_t-whitened
            coordinates (see :func:`dpivreg.dp_2s_gd`); post-processing of released values, so
            the privacy proof is unchanged. ``"gd"``: the paper's plain iteration.
        eta, alpha : float, optional
            Step sizes on the working scale. Defaults: with ``method="preconditioned"``,
            η = α = min(1, 6/T) (public: the contraction (1 − 6/T)^T ≈ e⁻⁶ while the noise of
            the last ≈ T/6 steps is averaged; 1 when both stages are noiseless); with ``method="gd"`` the paper's experimental
            rule η = 1/(1+δ(τ))², α = 2/(2γ̄(τ)+γ̲(τ)) with δ, γ̄, γ̲ read from the data's
            eigenvalues: (1+δ)² = λ_max(Z̃ᵀZ̃/n) and γ̄, γ̲ the extreme eigenvalues of the first-stage
            fit's Θ̂ᵀ(Z̃ᵀZ̃/n)Θ̂ on the working scale (a ``PrivacyLeakWarning``).
        clip : None, "theorem", "rms", float, (float, float), {"c0": float} or False
            Clipping thresholds on the working scale (all choices are public). ``None`` or
            ``"theorem"``: the Theorem's γ1 = γ2 = c0(√q + √(τ + log(nT)))² with c0 = 1, which
            under the paper's assumptions (isotropic sub-Gaussian rows, as the working scale
            approximates) clips no row with high probability, so it adds no bias;
            ``{"c0": c}``: the same with c0 = c. ``"rms"``: γ1 = 3·sqrt(q·p_endog),
            γ2 = 3·sqrt(p), three times the root-mean-square gradient norm of standardised,
            whitened data: less noise, but biased when the data have heavy tails or
            high-leverage rows (see the docs' pipeline benchmark). A number: both stages; a
            pair: (γ1, γ2). ``False``: no clipping, which leaves the sensitivity unbounded; only
            allowed with rho1 = rho2 = inf (a non-private run).
        calibration : {"exact", "paper"}
            Noise calibration (see :func:`dpivreg.dp_2s_gd`); the accountant always reports
            the budget actually spent.
        bounds : dict, optional
            Public ``{column: (lower, upper)}`` bounds by design column name. Data outside is
            clipped to them. Columns without bounds (other than a constant) get bounds from
            the data: a ``PrivacyLeakWarning`` naming them.
        seed : None, int, SeedSequence or Generator
            Source of all privacy noise (``None``: fresh OS entropy).
        tau : float, default 5
            Confidence parameter τ of the Theorem (clipping rule, error bound).
        inference : bool, default True
            Compute private standard errors, p-values and confidence intervals (see
            :mod:`dpivreg.inference`): one more release, the residual variance, paid for with
            ``rho_inf``; the privacy-noise variance is post-processing. ``False`` spends nothing
            and leaves ``bse``, ``conf_int`` … unavailable. Needs whitened instruments, so it is
            unavailable with ``preprocess="bounds"``.
        rho_inf : float, optional
            zCDP budget of the inference release. Default ``0.05·(rho1 + rho2)``.

        Returns
        -------
        DPIVResults
        """
        rho1 = check_rho(rho1, "rho1")
        rho2 = check_rho(rho2, "rho2")
        rho0 = 0.1 * (rho1 + rho2) if rho0 is None else check_rho(rho0, "rho0")
        rho_inf = 0.05 * (rho1 + rho2) if rho_inf is None else check_rho(rho_inf, "rho_inf")
        if not isinstance(inference, bool):
            raise TypeError(f"inference must be True or False, got {inference!r}.")
        delta = check_delta(delta)
        if calibration not in CALIBRATIONS:
            raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}.")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
        if preprocess not in PREPROCESS_ROUTES:
            raise ValueError(f"preprocess must be one of {PREPROCESS_ROUTES}, got {preprocess!r}.")
        T_checked = check_T(T)
        tau = _check_tau(tau)
        rng = make_rng(seed)
        leaks: list[str] = []

        scale = working_scale(self._design, bounds, route=preprocess, rho0=rho0, rng=rng)
        if scale.leaked_columns:
            leaks.append(
                "bounds were read from the data (no public bounds given) for: "
                + ", ".join(scale.leaked_columns)
                + ". Pass bounds={column: (lower, upper)} for each of them."
            )
        if preprocess == "data":
            leaks.append(
                "centring, scaling and whitening used the exact data moments (preprocess='data'). "
                "Use preprocess='private' to pay for them in the budget."
            )

        n, q = scale.Z.shape
        p = scale.X.shape[1]
        clip1, clip2, clip_source = _resolve_clip(
            clip, n=n, q=q, p=p, p_endog=p - scale.n_exog, T=T_checked, tau=tau, rho1=rho1, rho2=rho2,
        )
        eta_source = "user" if eta is not None else ("data" if method == "gd" else "min(1, 6/T)")
        alpha_source = "user" if alpha is not None else ("data" if method == "gd" else "min(1, 6/T)")
        if method == "preconditioned":
            default_step = 1.0 if math.isinf(rho1) and math.isinf(rho2) else min(1.0, 6.0 / T_checked)
            eta = default_step if eta is None else eta
            alpha = default_step if alpha is None else alpha
        elif eta is None or alpha is None:
            data_eta, data_alpha = _paper_step_sizes_from_data(scale)
            eta = data_eta if eta is None else eta
            alpha = data_alpha if alpha is None else alpha
            leaked = [name for name, src in (("eta", eta_source), ("alpha", alpha_source)) if src == "data"]
            leaks.append(
                f"step size(s) {', '.join(leaked)} were computed from the data's eigenvalues (the paper's rule). "
                "Pass public eta= and alpha= for a private fit."
            )

        eta, alpha = check_positive(eta, "eta"), check_positive(alpha, "alpha")
        if preprocess != "bounds":
            _check_step_stability(None if eta_source == "data" else eta, None if alpha_source == "data" else alpha,
                                  method=method, n=n, q=q, tau=tau)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", PrivacyLeakWarning)
            path = dp_2s_gd(
                scale.Z, scale.X, scale.Y, T=T_checked, rho1=rho1, rho2=rho2, eta=eta, alpha=alpha,
                clip1=clip1, clip2=clip2, calibration=calibration, seed=rng, n_exog=scale.n_exog, method=method,
            )
        for w in caught:
            if issubclass(w.category, PrivacyLeakWarning):
                leaks.append(str(w.message))
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if preprocess == "private" and math.isinf(rho0):
            leaks.append("rho0 = inf: the preprocessing moments were released without noise (not private).")
        for leak in leaks:
            warnings.warn(leak, PrivacyLeakWarning, stacklevel=2)

        inference_result, inference_note = None, "not requested (inference=False)"
        if inference and preprocess == "bounds":
            inference_note = "unavailable with preprocess='bounds' (needs privately whitened instruments)"
        elif inference:
            try:
                inference_result = private_inference(
                    path, scale, rho=math.inf if preprocess == "data" else rho_inf, tau=tau, rng=rng)
                inference_note = ""
                if not inference_result.reliable:
                    warnings.warn(_unreliable_message(inference_result), UserWarning, stacklevel=2)
            except OverflowError as exc:
                inference_note = f"unavailable: {exc}"
        inference_releases = [inference_result.release] if inference_result and inference_result.release else []

        target = {"rho1": rho1, "rho2": rho2}
        if preprocess == "private":
            target = {"rho0": rho0, **target}
        if inference_releases:
            target["rho_inf"] = rho_inf
        privacy = PrivacyBudget([*scale.releases, *path.privacy.releases, *inference_releases], target=target)
        settings = FitSettings(
            T=path.T, eta=path.eta, alpha=path.alpha, eta_source=eta_source, alpha_source=alpha_source,
            clip1=clip1, clip2=clip2, clip_source=clip_source, calibration=calibration, tau=tau,
            rho0=rho0 if preprocess == "private" else 0.0, rho1=rho1, rho2=rho2, preprocess=preprocess,
            method=method, rho_inf=rho_inf if inference_releases else 0.0,
        )
        return DPIVResults(model=self, engine_path=path, scale=scale, settings=settings, delta=delta,
                           leaks=tuple(leaks), privacy=privacy, inference=inference_result,
                           inference_note=inference_note)



def _unreliable_message(inference) -> str:
    return (
        "the private standard errors may be unreliable: the privacy noise left in the first stage is "
        f"{inference.first_stage_noise_ratio:.2g} of its smallest singular value (flag above "
        f"{inference.MAX_NOISE_RATIO:.2g}) and the private whitening is off by {inference.whitening_error:.2g} "
        f"(flag above {inference.MAX_WHITENING_ERROR:.2g}). Nominal 95% intervals then cover anywhere from "
        "about 0.8 to 1.0 (docs: coverage study). Increase n, rho0 (whitening) or rho1 (first stage)."
    )


def _check_step_stability(eta: float | None, alpha: float | None, *, method: str, n: int, q: int,
                          tau: float) -> None:
    """Reject step sizes beyond the stability limits of the whitened working scale (public quantities).

    ``None`` skips a step size derived from the data's own spectrum (the paper's rule), which
    is stable for the actual data even where the isotropic limit below would not say so.

    With E[z̃z̃ᵀ] = I the eigenvalues of Z̃ᵀZ̃/n lie in [(1−δ)², (1+δ)²], δ = (√q+√τ)/√n (see
    :func:`dpivreg.theory.delta_tau`), so the first stage diverges for η > 2/(1−δ)² and is only
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


def _check_tau(tau) -> float:
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real):
        raise TypeError(f"tau must be a number > 0 (the Theorem's confidence parameter), got {tau!r}.")
    if not math.isfinite(tau) or tau <= 0:
        raise ValueError(f"tau must be a finite number > 0 (the Theorem's confidence parameter), got {tau!r}.")
    return float(tau)


def standardized_clip(q: int, p: int, p_endog: int, *, c: float = 3.0) -> tuple[float, float]:
    """Clipping thresholds for standardised, whitened columns: (c·sqrt(q·p_endog), c·sqrt(p)).

    With E[zzᵀ] = I the instrument norm is about sqrt(q), and first-stage residuals of
    unit-variance columns have norm at most about sqrt(p_endog); in the second stage the
    P_t-whitened x̂ has norm about sqrt(p) and the residual at most about unit scale. The
    thresholds are c = 3 times those root-mean-square products: public, and tight enough
    that the noise is not wasted on a worst case that the Theorem's rule covers.
    """
    return c * math.sqrt(q * p_endog), c * math.sqrt(p)


def _resolve_clip(clip, *, n: int, q: int, p: int, p_endog: int, T: int, tau: float, rho1: float, rho2: float):
    """Turn the ``clip`` argument into (γ1, γ2, description)."""
    if clip is False:
        if math.isfinite(rho1) or math.isfinite(rho2):
            raise ValueError(
                "clip=False (no clipping) leaves the gradients' sensitivity unbounded, so no finite rho1/rho2 "
                "can be guaranteed. Use clipping, or rho1=rho2=numpy.inf for an explicitly non-private run."
            )
        return None, None, "none (NOT private)"
    if clip is True:
        raise TypeError("clip=True is ambiguous: pass None, 'theorem', 'rms', a number, a pair, {'c0': value} or False.")
    if isinstance(clip, str) and clip == "rms":
        gamma1, gamma2 = standardized_clip(q, p, p_endog)
        return gamma1, gamma2, "3 x RMS norm"
    if clip is None or (isinstance(clip, str) and clip == "theorem"):
        gamma = theorem_clip(n, q, T, tau=tau)
        return gamma, gamma, "Theorem, c0 = 1"
    if isinstance(clip, str):
        raise ValueError(f"clip as a string must be 'theorem' or 'rms', got {clip!r}.")
    if isinstance(clip, Mapping):
        if set(clip) != {"c0"}:
            raise ValueError(f'clip as a dict must be {{"c0": value}}, got keys {sorted(clip)}.')
        c0 = clip["c0"]
        if isinstance(c0, bool) or not isinstance(c0, numbers.Real):
            raise TypeError(f'clip["c0"] must be a number > 0, got {c0!r}.')
        if not math.isfinite(c0) or c0 <= 0:
            raise ValueError(f'clip["c0"] must be a finite number > 0, got {c0!r}.')
        gamma = theorem_clip(n, q, T, tau=tau, c0=float(c0))
        return gamma, gamma, f"Theorem, c0 = {c0:g}"
    if isinstance(clip, numbers.Real):
        return _positive_clip(clip, "clip"), _positive_clip(clip, "clip"), "user"
    if isinstance(clip, (tuple, list)) and len(clip) == 2:
        return _positive_clip(clip[0], "clip[0]"), _positive_clip(clip[1], "clip[1]"), "user"
    raise TypeError(
        f"clip must be None, 'theorem', 'rms', a number, a (gamma1, gamma2) pair, {{'c0': value}} or False; "
        f"got {clip!r}."
    )


def _positive_clip(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a clipping threshold (a number > 0), got {value!r}.")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite clipping threshold > 0, got {value!r}.")
    return float(value)
