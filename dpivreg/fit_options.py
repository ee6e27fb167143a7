"""The options of :meth:`dpivreg.DPIV2SLS.fit`: their documentation, their checks and defaults, and the budget split.

:func:`resolve_fit_options` turns the keyword arguments a user passes into one frozen :class:`FitOptions` (every
default filled in, every combination that cannot run refused with a message naming the argument), and
:func:`budgets` splits the privacy budget over the releases the fit will make (:data:`DEFAULT_SHARES`,
:func:`default_shares`). Nothing here reads the data: every choice is a function of public inputs.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from dpivreg._validation import MAX_RHO, check_delta, check_flag, check_rho, check_tau
from dpivreg.estimation import tuning
from dpivreg.estimation.working_scale import PREPROCESS_ROUTES
from dpivreg.inference.covariance import resolve_cov_type
from dpivreg.privacy.accounting import CALIBRATIONS, rho_from_epsilon
from dpivreg.privacy.units import DEFAULT_MAX_ROWS, check_max_rows
from dpivreg.progress import check_progress

__all__ = ["FIT_METHODS", "INITS", "DEFAULT_SHARES", "default_shares", "FitOptions", "resolve_fit_options",
           "fit_docstring"]


#: Estimators of :meth:`DPIV2SLS.fit`: the default's choice, the DP-2S-GD iterations, and noisy-moment 2SLS.
FIT_METHODS = ("auto", "preconditioned", "gd", "moments")


#: Starting points of the iteration.
INITS = ("moments", "zero")


#: Default budgets of the releases besides the two stages, as shares of rho1 + rho2. ``rho_diag`` (the robust
#: diagnostics' meats: the first stage's, for the robust first-stage F and the effective F, and the robust endogeneity
#: test's) is spent by default where it applies (robust or clustered standard errors with the moment release).
DEFAULT_SHARES = {"rho0": 0.2, "rho_clip": 0.05, "rho_inf": 0.05, "rho_diag": 0.05}


def _resolve_grouping(cov_type, privacy_unit, clusters, max_rows_per_unit) -> tuple[str, object, int | None]:
    """(cov_type, clusters, max_rows_per_unit) with their defaults: ``"clustered"`` by the privacy unit when one is
    given, else ``"robust"``; m = :data:`dpivreg.privacy.units.DEFAULT_MAX_ROWS` with a privacy unit."""
    if cov_type is None:
        cov_type = "clustered" if privacy_unit is not None or clusters is not None else "robust"
    cov_type = resolve_cov_type(cov_type)
    if clusters is not None and cov_type != "clustered":
        raise ValueError(f"clusters= groups the scores of cov_type='clustered', but cov_type={cov_type!r}: pass "
                         "cov_type='clustered' (or leave it out), or drop clusters.")
    if cov_type == "clustered" and clusters is None:
        if privacy_unit is None:
            raise ValueError("cov_type='clustered' needs the clusters: clusters=<column> (a public grouping of the "
                             "rows), or privacy_unit=<column> to protect and cluster by the same unit.")
        clusters = privacy_unit
    if privacy_unit is None:
        if max_rows_per_unit is not None:
            raise ValueError("max_rows_per_unit bounds the rows of a privacy unit: give privacy_unit=<column> too (at "
                             "row level every unit is one row).")
    elif max_rows_per_unit is None:
        max_rows_per_unit = DEFAULT_MAX_ROWS
    else:
        max_rows_per_unit = check_max_rows(max_rows_per_unit)
    return cov_type, clusters, max_rows_per_unit


def _check_moments_options(**options) -> None:
    """method="moments" runs no iteration: options of the iteration are errors, not silently ignored."""
    if options.pop("preprocess") == "bounds":
        raise ValueError('method="moments" needs the moment release: use preprocess="private" (or "data").')
    defaults = {"T": None, "init": None, "schedule": None, "eta": None, "alpha": None, "clip": None,
                "calibration": "exact"}
    given = [name for name, value in options.items() if value is not defaults[name]
             and not (name == "calibration" and value == "exact")]
    if given:
        raise ValueError(f'method="moments" runs no iteration, so {", ".join(given)} do not apply; drop them '
                         '(the budget is set with rho, or with the same rho1/rho2/... as the default fit).')


def _resolve_init(init: str | None, preprocess: str, method: str) -> str:
    if init is None:
        return "moments" if preprocess != "bounds" and method == "preconditioned" else "zero"
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}.")
    if init == "moments" and preprocess == "bounds":
        raise ValueError('init="moments" needs the moment release: use preprocess="private" (or "data"), '
                         'or init="zero".')
    return init


def _resolve_schedule(schedule: str | None, init: str) -> str:
    if schedule is None:
        return "staggered" if init == "moments" else "uniform"
    if schedule not in tuning.SCHEDULES:
        raise ValueError(f"schedule must be one of {tuning.SCHEDULES}, got {schedule!r}.")
    return schedule


#: Most the moment release's default share is multiplied by with privacy units (:func:`default_shares`): beyond
#: it the two stages' budgets would shrink for the moments' sake (and an m in the hundreds would multiply the total
#: budget of a fit given rho1 and rho2).
MAX_MOMENT_WEIGHT = 10


def default_shares(max_rows: int = 1) -> dict:
    """The default budgets of the releases besides the two stages, as shares of rho1 + rho2: :data:`DEFAULT_SHARES`,
    with the moment release's share times m = ``max_rows`` for privacy units (:mod:`dpivreg.privacy.units`).

    Why: the moment release sums rows, so its sensitivity is m times the row-level one, while the per-unit clipped
    gradients' is not; with the row-level share its noise grows m-fold against theirs, and the whitening and warm
    start it feeds become the weak link. Measured on simulated panels (``benchmarks/unit_privacy.py``; units of 1-10
    rows, m = 10, total rho = 2, the endogenous coefficient's error in clustered 2SLS standard errors): with N =
    1,000 units the median reported s.e. was 198 times the clustered 2SLS one with the share 0.2, 9.3 with 0.5, 4.0
    with 1, 1.9 with 2 and 1.5 with 4 (median errors 0.96, 0.93, 0.82, 0.99, 0.87; 20-30 data sets each); with N =
    10,000 it was 1.03 with 0.2 and 1.09 with 2, the errors alike. The share m·0.2 (2 at m = 10) is that
    compromise, and the row level's at m = 1; the factor is capped at :data:`MAX_MOMENT_WEIGHT` (share 2), the
    largest measured.
    """
    shares = dict(DEFAULT_SHARES)
    shares["rho0"] *= min(max_rows, MAX_MOMENT_WEIGHT)
    return shares


def _budgets(*, rho, rho1, rho2, rho0, rho_clip, rho_inf, preprocess: str, method: str, adaptive: bool,
             inference: bool, rho_diag=None, max_rows: int = 1, diagnostics: bool = False) -> dict:
    """Every release's budget: the given ones, defaults as shares of rho1 + rho2 (:data:`DEFAULT_SHARES`),
    or a total ``rho`` split by those shares over the releases the fit makes; and their total. ``rho_diag`` (the
    robust diagnostics' meats) left out takes its default share when ``diagnostics`` (the fit can make them), a given
    ``rho_diag`` is taken from ``rho`` first, and 0 makes none; ``budget["rho_diag"]`` is None when there is none.

    With privacy units of up to ``max_rows`` = m rows the moment release's default share is m times the row-level
    one (:func:`default_shares`).

    ``method="moments"`` spends on its one release the total that the default DP-2S-GD fit would spend with
    the same arguments (its moments, clipping, two stages and inference releases), or ``rho``.
    """
    if method == "moments":
        adaptive = True  # the default fit's clip
    shares = default_shares(max_rows)
    given_diag = None if rho_diag is None or _is_zero(rho_diag) else check_rho(rho_diag, "rho_diag")
    used = {"rho0": preprocess == "private", "rho_clip": adaptive, "rho_inf": inference,
            "rho_diag": diagnostics and rho_diag is None}
    if rho is not None:
        if any(v is not None for v in (rho1, rho2, rho0, rho_clip, rho_inf)):
            raise ValueError("pass either rho (the total budget, split by the default shares) or the individual "
                             "budgets rho1, rho2 (and optionally rho0, rho_clip, rho_inf), not both.")
        rho = check_rho(rho, "rho")
        diag = 0.0 if given_diag is None else given_diag
        if math.isfinite(rho) and diag >= rho:
            raise ValueError(f"rho_diag ({diag:g}) must be smaller than the total rho ({rho:g}), which also pays "
                             "for the estimate.")
        weight = 1.0 + sum(shares[name] for name, on in used.items() if on)
        stage = (rho - diag) / (2.0 * weight) if math.isfinite(rho) else rho
        budget = {"rho1": stage, "rho2": stage}
        budget.update({name: 2.0 * stage * shares[name] for name in shares})
        if given_diag is not None or not used["rho_diag"]:
            budget["rho_diag"] = given_diag
    else:
        if rho1 is None or rho2 is None:
            raise TypeError("fit() needs the budgets rho1 and rho2 (zCDP of the two stages), or rho (the total).")
        budget = {"rho1": check_rho(rho1, "rho1"), "rho2": check_rho(rho2, "rho2")}
        for name, value in (("rho0", rho0), ("rho_clip", rho_clip), ("rho_inf", rho_inf)):
            budget[name] = (shares[name] * (budget["rho1"] + budget["rho2"]) if value is None
                            else check_rho(value, name))
        budget["rho_diag"] = (shares["rho_diag"] * (budget["rho1"] + budget["rho2"]) if used["rho_diag"]
                              else given_diag)
    budget["total"] = rho if rho is not None else (
        budget["rho1"] + budget["rho2"] + sum(budget[name] for name, on in used.items() if on and name != "rho_diag")
        + (budget["rho_diag"] or 0.0))
    if math.isfinite(budget["total"]) and budget["total"] > MAX_RHO / 10:
        raise ValueError(f"the total budget ({budget['total']:g}, rho1 + rho2 and the releases' shares) is beyond "
                         f"{MAX_RHO / 10:g}, where the releases' noise underflows float64; use numpy.inf for no "
                         "noise, which is not private.")
    return budget


@dataclass(frozen=True)
class FitOptions:
    """The options of one fit after :func:`resolve_fit_options`: checked, with every default filled in.

    ``method`` is the estimator that runs ("preconditioned", "gd" or "moments"; "auto" resolved), ``select`` whether
    the default's private choice between DP-2S-GD and noisy moments is made (only on the default path), and
    ``budget`` every release's zCDP budget and their ``"total"`` (:func:`_budgets`)."""

    method: str
    select: bool
    preprocess: str
    init: str
    clip: Any
    inference: bool
    delta: float
    tau: float
    cov_type: str
    clusters: Any
    max_rows_per_unit: int | None
    progress: bool | None
    budget: dict
    check_data: bool = False
    exog_share: float = 0.2


def resolve_fit_options(*, rho, rho1, rho2, rho0, rho_clip, rho_inf, rho_diag, T, delta, preprocess: str, method: str,
                        init, schedule, eta, alpha, clip, calibration: str, tau, inference, cov_type, progress,
                        privacy_unit, max_rows_per_unit, clusters, check_data=False, epsilon=None,
                        exog_share=0.2) -> FitOptions:
    """:meth:`dpivreg.DPIV2SLS.fit`'s keyword arguments checked and resolved (public inputs only: no data is read).

    Raises ``ValueError`` or ``TypeError`` naming the argument for a value or a combination the fit cannot run."""
    progress = check_progress(progress)
    if method not in FIT_METHODS:
        raise ValueError(f"method must be one of {FIT_METHODS}, got {method!r}.")
    if preprocess not in PREPROCESS_ROUTES:
        raise ValueError(f"preprocess must be one of {PREPROCESS_ROUTES}, got {preprocess!r}.")
    inference, check_data = check_flag(inference, "inference"), check_flag(check_data, "check_data")
    exog_share = _check_exog_share(exog_share)
    delta, tau = check_delta(delta), check_tau(tau)
    cov_type, clusters, max_rows_per_unit = _resolve_grouping(cov_type, privacy_unit, clusters, max_rows_per_unit)
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}.")
    if method == "moments":
        _check_moments_options(preprocess=preprocess, T=T, init=init, schedule=schedule, eta=eta, alpha=alpha,
                               clip=clip, calibration=calibration)
    select = (method == "auto" and preprocess == "private" and init in (None, "moments") and clip is None
              and T is None and eta is None and alpha is None and schedule is None and calibration == "exact")
    method = "preconditioned" if method == "auto" else method
    init = _resolve_init(init, preprocess, method)
    clip = ("adaptive" if init == "moments" else "theorem") if clip is None else clip
    diagnostics = cov_type != "unadjusted" and preprocess != "bounds"
    if isinstance(rho_diag, bool):
        raise TypeError(f"rho_diag must be a number (a zCDP budget, or 0 for no diagnostics' meats), got {rho_diag!r}.")
    if rho_diag is not None and not _is_zero(rho_diag) and not diagnostics:
        raise ValueError("rho_diag buys the robust diagnostics' meats: it needs cov_type 'robust' or 'clustered' "
                         "and the moment release (preprocess 'private' or 'data'), got cov_type="
                         f"{cov_type!r}, preprocess={preprocess!r}. Leave rho_diag out otherwise.")
    rho = _rho_of_epsilon(epsilon, delta, rho=rho, rho1=rho1, rho2=rho2, rho0=rho0, rho_clip=rho_clip,
                          rho_inf=rho_inf)
    budget = _budgets(max_rows=1 if privacy_unit is None else max_rows_per_unit,
                      rho=rho, rho1=rho1, rho2=rho2, rho0=rho0, rho_clip=rho_clip, rho_inf=rho_inf,
                      rho_diag=rho_diag, preprocess=preprocess, method=method,
                      adaptive=isinstance(clip, str) and clip == "adaptive", inference=inference,
                      diagnostics=diagnostics and inference)  # by default only with the fit's inference
    return FitOptions(method=method, select=select, preprocess=preprocess, init=init, clip=clip, inference=inference,
                      delta=delta, tau=tau, cov_type=cov_type, clusters=clusters, max_rows_per_unit=max_rows_per_unit,
                      progress=progress, budget=budget, check_data=check_data, exog_share=exog_share)


def _is_zero(value) -> bool:
    """``rho_diag=0``: no diagnostics' meats (a number equal to 0; booleans are not budgets)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value == 0


def _check_exog_share(value) -> float:
    """``exog_share``: the exogenous group's share of each stage's per-step budget, strictly between 0 and 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"exog_share must be a number strictly between 0 and 1 (the exogenous group's share of each "
                        f"stage's budget), got {value!r}.")
    if not 0.0 < float(value) < 1.0:
        raise ValueError(f"exog_share must lie strictly between 0 and 1 (the exogenous group's share of each stage's "
                         f"budget; the rest goes to the instruments' rows and the endogenous coordinates), got "
                         f"{value!r}.")
    return float(value)


def _rho_of_epsilon(epsilon, delta: float, **budgets) -> float | None:
    """The total ρ of ``fit(epsilon=ε, delta=δ)``: the largest whose fit is (ε, δ)-DP by the exact Gaussian privacy
    profile (:func:`dpivreg.privacy.accounting.rho_from_epsilon`; every release is a Gaussian mechanism, so their
    composition is one); ``budgets["rho"]`` when no ε is given."""
    if epsilon is None:
        return budgets["rho"]
    given = [name for name, value in budgets.items() if value is not None]
    if given:
        raise ValueError(f"pass the budget once: epsilon= (with delta=) or {', '.join(given)}, not both (epsilon is "
                         "turned into the total rho by the exact Gaussian privacy profile and split by the default "
                         "shares).")
    return rho_from_epsilon(epsilon, delta)


def fit_docstring(fit):
    """Give :meth:`dpivreg.DPIV2SLS.fit` its numpydoc documentation (:data:`FIT_DOCSTRING`), kept beside the checks
    of the options it documents so that the two are read and changed together."""
    fit.__doc__ = FIT_DOCSTRING
    return fit


#: The documentation of :meth:`dpivreg.DPIV2SLS.fit`: what each option does, its default and why.
FIT_DOCSTRING = """Fit privately and return the estimate, its private inference and the NON-PRIVATE 2SLS benchmark.

The default is DP-2S-GD from a private warm start (see the docs' method page): one release of the
bounded columns' second moments (``rho0``) gives the working scale and the starting point (2SLS on
the released moments); one release of gradient-norm histograms (``rho_clip``) gives the clipping
thresholds; then ``T`` noisy steps of the two stages (``rho1``, ``rho2``) on a staggered schedule,
with step sizes, T and the schedule chosen from the release's public noise level; then one release
for the standard errors (``rho_inf``). ``init="zero"`` (and ``method="gd"``) run the paper's
Algorithm as written.

Parameters
----------
rho1, rho2 : float
    zCDP budgets of the first stage (Θ path) and the second stage (β path), > 0.
    ``numpy.inf`` means no noise in that stage: the fit is then NOT private. Give both, or
    ``rho`` instead. They are not the fit's total: the fit's other releases (``rho0``, ``rho_clip``,
    ``rho_inf``, ``rho_diag`` below) get their default shares of rho1 + rho2 on top, 0.35·(rho1 + rho2) at row
    level with robust standard errors, so ``rho1=1, rho2=1`` spends ρ = 2.7 in total (``res.privacy.rho``; more
    with a privacy unit, see ``rho0``).
    ``rho=`` or ``epsilon=`` with ``delta=`` set the total instead.
T : int, optional
    Number of iterations. Default, from the warm start with the adaptive clipping and finite
    budgets: the shortest of the candidates 3, 4, 6, 8 and 12 whose simulated privacy-noise error of
    the endogenous coefficients is within about 2% of the best candidate's
    (:func:`dpivreg.estimation.selection.choose_iterations`, post-processing of the releases); otherwise from
    the warm start (a public clipping rule, an infinite budget, a whitening error κ̂ ≥ 0.5)
    T = 1 + ⌈log 0.02 / log c⌉ in [3, 12], c the per-step contraction implied by κ̂
    (:mod:`dpivreg.estimation.tuning`); 20 (the paper's experiments) from a zero start.
    A fit whose iteration or inference simulation will run for more than a minute (projected from
    its first steps) says so with a :class:`~dpivreg.LongRunWarning` naming the expected time.
    A fit that runs the paper's Algorithm (``init="zero"`` or ``method="gd"``) with a T beyond the T
    condition of its Theorem 1, T ≲ ρ1·n²/(p(√q+√τ)⁶) (constants 1, ρ1 as spent; the summary's bound
    block), warns with a :class:`~dpivreg.TConditionWarning`: the Theorem's bound does not cover it.
    The warm-started default is not checked against it: the Theorem is not its guarantee (its T is
    chosen by simulating its own noise, and the private inference flags a first stage swamped by noise).
    The condition reads only public inputs, so the warning costs no privacy.
rho : float, optional
    The total zCDP budget instead of ``rho1``, ``rho2``: split as rho1 = rho2 and the default shares
    below of the releases that the fit makes (e.g. rho1 = rho2 = rho/2.7 on the default path).
    ``method="moments"`` spends all of it on its one release.
rho0 : float, optional
    Budget of the moment release (``preprocess="private"``). Default ``0.2·(rho1 + rho2)``, times
    ``max_rows_per_unit`` (at most 10) with a privacy unit (the release's sensitivity is that many times
    the row level's; :func:`default_shares`).
rho_clip : float, optional
    Budget of the clipping release (``clip="adaptive"``). Default ``0.05·(rho1 + rho2)``.
rho_inf : float, optional
    Budget of the inference release: the residual variance (``cov_type="unadjusted"``) or the robust
    meat (``"robust"``). Default ``0.05·(rho1 + rho2)``.
rho_diag : float, optional
    Budget of the robust diagnostics' meats (``cov_type="robust"`` or ``"clustered"``): the fit releases the
    first stage's meat (1/n)Σᵢ(v̂ᵢ ⊗ z̃ᵢ)(v̂ᵢ ⊗ z̃ᵢ)ᵀ at the released first stage (three quarters of
    ``rho_diag``), so that ``first_stage_diagnostics`` reports the heteroskedasticity-robust first-stage Wald
    statistic (linearmodels' for ``cov_type="robust"``) instead of the homoskedastic F and ``effective_f`` the
    effective F; and the p×p meat of the robust endogeneity test's scores (a quarter), for
    ``wooldridge_score``. Default ``0.05·(rho1 + rho2)`` (with ``rho``, its share of the total) when the fit
    has robust or clustered standard errors and the moment release (with ``inference=True``); ``0`` makes no
    such release. A given ``rho_diag`` is taken from ``rho`` first (the rest is split as usual).
delta : float, default 1e-5
    δ at which ε is reported (the budget is zCDP; δ only affects the conversion), and with ``epsilon`` the δ of
    the (ε, δ) budget.
preprocess : {"private", "bounds", "data"}
    ``"private"`` (default): bounds, then private centring (with an intercept), scaling
    and whitening paid for with rho0. ``"bounds"``: scale by the bounds only, no
    budget. ``"data"``: the paper's practice, the same transformations from the exact
    data moments (a ``PrivacyLeakWarning``); for reproduction. See
    :mod:`dpivreg.estimation.working_scale`.
method : {"auto", "preconditioned", "gd", "moments"}
    ``"auto"`` (default): DP-2S-GD with ``method="preconditioned"``, unless the releases it makes
    first (the moments and the clipping thresholds) predict that noisy moments would be more accurate
    for the endogenous coefficients; then the rest of the budget buys a second release of the
    moments instead of the iteration, and the estimate is noisy-moment 2SLS on both releases
    (:mod:`dpivreg.estimation.selection`; no privacy cost, the same total budget either way, the summary says
    which ran). The choice is only made on the default path (private preprocessing, the warm start,
    the adaptive clip and no explicit T, eta, alpha or schedule); otherwise "auto" is
    "preconditioned". ``"preconditioned"``: the second stage steps along P_t⁻¹·gradient with
    P_t built from the released Θ⁽ᵗ⁾, per-sample gradients clipped in the P_t-whitened
    coordinates (see :func:`dpivreg.dp_2s_gd`); post-processing of released values, so
    the privacy proof is unchanged. ``"gd"``: the paper's plain iteration (with a zero start, the
    Theorem's clip and the data's step sizes unless given). ``"moments"``: noisy-moment 2SLS, the
    whole budget on one release of the second moments (the yardstick a user could write
    themselves; :mod:`dpivreg.estimation.moments`); it spends what the default fit would spend with the same
    arguments (rho0 + rho1 + rho2 + rho_clip + rho_inf, or ``rho``).
init : {"moments", "zero"}, optional
    Starting point: ``"moments"`` (default with ``preprocess`` "private" or "data" and
    ``method="preconditioned"``), 2SLS on the released moments (post-processing, free);
    ``"zero"``: Θ⁽⁰⁾ = 0, β⁽⁰⁾ = 0, the paper's Algorithm.
schedule : {"staggered", "uniform"}, optional
    How each stage's budget is spread over the steps. ``"staggered"`` (default with the warm start):
    the first stage at steps 0 … T−2, the second at 1 … T−1, shares growing towards the end
    (:func:`dpivreg.estimation.tuning.staggered_schedule`). ``"uniform"``: 1/T at every step (the Algorithm).
eta, alpha : float, optional
    Step sizes on the working scale. Defaults: from the warm start η = α = 1/(1 + κ̂), κ̂ the 90th
    percentile of the whitening error simulated from the moment release's public noise (1 when the
    moments are exact); from a zero start with ``method="preconditioned"`` η = α = min(1, 6/T)
    (1 when both stages are noiseless); with ``method="gd"`` the paper's experimental rule
    η = 1/(1+δ(τ))², α = 2/(2γ̄(τ)+γ̲(τ)) with δ, γ̄, γ̲ read from the data's eigenvalues (a
    ``PrivacyLeakWarning``).
clip : None, "adaptive", "theorem", "rms", float, (float, float), {"c0": float} or False
    Clipping thresholds on the working scale. ``None``: ``"adaptive"`` with the warm start, else
    ``"theorem"``. ``"adaptive"``: chosen privately from one release of gradient-norm histograms
    at the start (budget ``rho_clip``), each clipping group's threshold the private quantile that
    leaves at most K = min(½√n, 50) rows above it (K·√(d/ρ) for a group of d coordinates and a stage budget ρ above d);
    with exogenous regressors the exogenous rows and coordinates are clipped as a group of their own
    (:mod:`dpivreg.estimation.clipping`). ``"theorem"``: the Theorem's γ1 = γ2 = c0(√q + √(τ + log(nT)))², c0 = 1
    (``{"c0": c}`` for another c0), which under the paper's assumptions clips no row; ``"rms"``: γ1 = 3·sqrt(q·p_endog),
    γ2 = 3·sqrt(p). A number: both stages; a pair: (γ1, γ2). ``False``: no clipping, only with rho1 = rho2 = inf
    (a non-private run).
exog_share : float, default 0.2
    With group clipping, the share of each stage's per-step budget spent on the exogenous
    group; the instruments' rows and the endogenous coordinates get the rest, because the
    endogenous coefficients (the causal effects) are what IV is for. Raise it when the
    controls' coefficients matter as much.
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
    Confidence parameter τ of the Theorem (its clipping rule, the error bound).
inference : bool, default True
    Compute private standard errors, p-values and confidence intervals (see
    :mod:`dpivreg.inference`). DP-2S-GD makes one more release for them, the residual variance
    (``rho_inf``); ``method="moments"`` reads it from its own release (no extra budget) unless
    ``cov_type="robust"``, whose meat needs ``rho_inf`` on either route. ``False``
    spends nothing and leaves ``bse``, ``conf_int`` … unavailable. Needs whitened instruments, so it
    is unavailable with ``preprocess="bounds"``.
cov_type : {"robust", "unadjusted", "clustered"}, optional
    The sampling part of the private covariance (:mod:`dpivreg.inference.covariance`). ``"robust"`` (the
    default without ``privacy_unit``, as in linearmodels): the heteroskedasticity-robust 2SLS sandwich
    (Stata's ``vce(robust)``, linearmodels' ``cov_type="robust"``) with its meat Σᵢ z̃ᵢz̃ᵢᵀũᵢ²/n released
    privately with the budget ``rho_inf`` (for noisy moments too, whose moment release then gets the
    rest). ``"unadjusted"``: homoskedastic errors, σ̂²(X̂ᵀX̂/n)⁻¹/n with a private residual variance (free
    for noisy moments, which read it from their release). ``"clustered"`` (the default with
    ``privacy_unit``): the cluster-robust sandwich with the meat Σ_c g_c g_cᵀ/n of the clusters' summed
    scores g_c = Σ_{i∈c} z̃ᵢũᵢ, each clipped and released with ``rho_inf`` (linearmodels'
    ``cov_type="clustered"`` with ``debiased=False``; Stata's ``vce(cluster ...)``); the clusters are the
    privacy unit or ``clusters``. linearmodels' synonyms ``"homoskedastic"`` and ``"heteroskedastic"``
    are accepted.
progress : bool or None, default None
    Progress bars (tqdm, on stderr; a widget in a notebook) for the long loops of the fit: the
    iterations ("DP-2S-GD iterations"), the private inference's simulation ("privacy-noise
    simulation"), and on Dask data one bar over all the fit's passes over the data ("passes over the
    Dask data", the iterations among them). ``None`` (default): a loop gets a bar only when its time,
    projected from its steps so far, exceeds 5 s (:data:`dpivreg.progress.PROGRESS_SECONDS`) and stderr
    is a terminal or the code runs in a notebook, so short fits and logs stay quiet. ``True``: always
    (also when stderr is redirected). ``False``: never. The bars read only the clock: the results are
    the same, bit for bit, with and without them.
privacy_unit : str, array_like or None
    Whom the fit protects (:mod:`dpivreg.privacy.units`; the docs' "Who is protected?"). ``None`` (default): a
    row; neighbouring data sets replace one row and the row count is public. A column of the data frame
    (or an array with one id per row of the data): neighbouring data sets replace all rows of one unit (a
    person in a panel, a household); the number of units N is public, the row count is not. Each unit
    keeps at most ``max_rows_per_unit`` rows (a random subset, independent of the data), the gradients,
    the clipping release and a clustered meat sum each unit's rows before clipping, the releases that
    sum rows have ``max_rows_per_unit`` times their row-level sensitivity, and the private inference
    clusters by the unit (``cov_type="clustered"``) unless told otherwise. ``res.privacy`` and the summary
    state the unit and N. Needs the moment release (``preprocess`` "private" or "data").
max_rows_per_unit : int, optional
    m, the most rows a privacy unit contributes (public; default
    :data:`dpivreg.privacy.units.DEFAULT_MAX_ROWS`). Units with more rows keep m of them chosen at random, which
    down-weights large units (docs: what it does to the estimand); a larger m keeps more data but
    multiplies the noise of the releases that sum rows (the moment release, a robust meat) by m.
clusters : str, array_like or None
    The groups of ``cov_type="clustered"`` when they are not the privacy unit: a column (or array) whose
    grouping is public and contains whole privacy units (e.g. states of households); the number of
    clusters is public. Without ``privacy_unit`` any public grouping of the rows.
check_data : bool, default False
    Refuse to fit when a check that reads the data finds a problem: a constant instrument, one that copies
    another column, collinear regressors or instruments (the model's ``DataCheckWarning`` at build), or a
    column whose every value lies outside its bounds. Off by default because whether a fit runs is itself
    an output: a refusal that one row can flip (a 0/1 instrument that is 1 in a single row fits, its neighbour
    with that row replaced would be refused) is not private. With ``True`` the fit is announced and recorded
    as a :class:`~dpivreg.PrivacyLeakWarning`; for exploring the data inside the secure room. Without it the
    fit runs, the NON-PRIVATE benchmark omits such columns (as Stata does), and the summary says which
    directions the releases cannot resolve.
epsilon : float, optional
    The budget as (ε, δ)-DP instead of zCDP, with ``delta``: the total ρ becomes the largest whose fit is
    (ε, δ)-DP by the exact Gaussian privacy profile (every release is a Gaussian mechanism, so their composition
    is one with μ = √(2ρ); :func:`~dpivreg.rho_from_epsilon`), split by the default shares as ``rho=`` is. E.g.
    ``fit(epsilon=1, delta=1e-5)`` spends ρ = 0.0359. Not with ``rho``, ``rho1``, ``rho2``, ``rho0``,
    ``rho_clip`` or ``rho_inf``. The summary's budget block shows δ, the ε it gives (exact Gauss.) and the total ρ.

Returns
-------
DPIVResults
"""
