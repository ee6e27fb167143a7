"""Results of a DP-2S-GD fit and their summary (statsmodels conventions, linearmodels layout).

What is private and what is not
-------------------------------
Private releases (their cost is in ``privacy``): ``params`` (β⁽ᵀ⁾), ``path`` (β⁽⁰…ᵀ⁾),
``first_stage`` / ``first_stage_path`` (Θ⁽ᵀ⁾ / Θ⁽⁰…ᵀ⁾), all mapped to original units by the
public (or, with a warning, data-derived) column scales.

Also private or post-processing: ``bse``, ``cov_params()``, ``conf_int()``, ``bias``, the working scale's
centres, scales and released moments, the clipping thresholds and their histograms
(``settings.adaptive_clip``) and the estimator choice (``settings.selection``).

NON-PRIVATE (computed from the raw data without noise; for validation only, never to
publish): ``benchmark`` (linearmodels IV2SLS on the same design), ``clipped_rows`` and
``scale.clipped_values`` (diagnostics), and the data the results hold: ``design``, ``model`` and the
working arrays ``scale.Z``, ``scale.X``, ``scale.Y``. The summary labels every such column.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from dpivreg._validation import check_flag
from dpivreg._version import __version__
from dpivreg.data.cross_products import CrossProductIV2SLS, iv2sls_benchmark
from dpivreg.data.design import IVDesign
from dpivreg.errors import InferenceUnavailableError, PrivacyLeakWarning
from dpivreg.estimation import theory, tuning
from dpivreg.estimation.engine import DP2SGDPath
from dpivreg.estimation.working_scale import WorkingScale
from dpivreg.inference import iv_tests
from dpivreg.inference.anderson_rubin import anderson_rubin_set
from dpivreg.inference.diagnostics import cragg_donald, first_stage_diagnostics, released_grams
from dpivreg.inference.iv_tests import EffectiveF, TestStatistic
from dpivreg.inference.private import PrivateInference
from dpivreg.privacy.accounting import PrivacyBudget
from dpivreg.reporting.release import FitRelease, record_time
from dpivreg.reporting.summary import WEAK_F, DPIVSummary, SummaryWriter
from dpivreg.reporting.tables import (
    DURBIN,
    EFFECTIVE_F,
    ROBUST_ENDOGENEITY,
    ROBUST_OVERID,
    SARGAN,
    WU_HAUSMAN,
    PrivateTable,
    SummaryAccessor,
    check_level,
    format_number,
    iv_test_frame,
    iv_test_records,
    size_text,
)

__all__ = ["DPIVResults", "FitSettings", "DPIVSummary", "WEAK_F"]



@dataclass(frozen=True)
class FitSettings:
    """The tuning of one fit, with where each data-dependent setting came from.

    Attributes
    ----------
    T : int
        Iterations.
    eta, alpha : float
        Step sizes on the working scale.
    eta_source, alpha_source : str
        ``"user"`` or ``"data"`` (the paper's rule from the data's eigenvalues: a leak).
    clip1, clip2 : float or None
        Clipping thresholds on the working scale (None: no clipping).
    clip_source : str
        How the thresholds were chosen (e.g. ``"Theorem, c0 = 1"``, ``"user"``, ``"none"``).
    calibration : str
        ``"exact"`` or ``"paper"``.
    tau : float
        Confidence parameter τ of the Theorem's settings.
    rho0, rho1, rho2 : float
        The budgets requested (rho0 = 0 unless ``preprocess="private"``).
    preprocess : str
        ``"private"``, ``"bounds"`` or ``"data"``.
    method : str
        ``"preconditioned"`` or ``"gd"``.
    rho_inf : float
        Budget of the inference release (0 when none was made).
    init : str
        Starting point: ``"moments"`` (warm start from the released moments), ``"zero"`` (the
        Algorithm), ``"none"`` (``method="moments"``).
    schedule : str
        ``"staggered"``, ``"uniform"`` or ``"none"``.
    T_source : str
        Where T came from (``"user"``, ``"simulated"`` (:func:`dpivreg.estimation.selection.choose_iterations`),
        ``"from kappa"`` (:func:`dpivreg.estimation.tuning.iterations`), ``"paper's experiments"``).
    rho_clip : float
        Budget of the clipping release (0 when none was made).
    kappa : float
        The whitening error κ̂ the default steps and T were chosen from (post-processing; 0 when exact).
    exog_share : float
        Share of each stage's budget on the exogenous clipping group (0 without group clipping).
    adaptive_clip : AdaptiveClip or None
        The private clipping release and its outcome (``clip="adaptive"``).
    selection : Selection or None
        The default's choice between DP-2S-GD and noisy moments (``method="auto"``), or None.
    cov_type : str
        The sampling covariance, ``"unadjusted"`` or ``"robust"`` (:mod:`dpivreg.inference.covariance`); ``"none"``
        without inference.
    """

    T: int
    eta: float
    alpha: float
    eta_source: str
    alpha_source: str
    clip1: float | None
    clip2: float | None
    clip_source: str
    calibration: str
    tau: float
    rho0: float
    rho1: float
    rho2: float
    preprocess: str
    method: str
    rho_inf: float = 0.0
    init: str = "zero"
    schedule: str = "uniform"
    T_source: str = "user"
    rho_clip: float = 0.0
    kappa: float = 0.0
    exog_share: float = 0.0
    adaptive_clip: Any = None
    selection: Any = None
    cov_type: str = "unadjusted"


def _plain(clip):
    """A clipping threshold as JSON-ready Python: None, a float or a list of group thresholds."""
    if clip is None:
        return None
    if isinstance(clip, (tuple, list, np.ndarray)):
        return [float(c) for c in clip]
    return float(clip)


_fmt = format_number


def _test_row(test: TestStatistic | EffectiveF) -> dict:
    """A test's row of :attr:`DPIVResults.iv_tests`; the effective F's null is Montiel Olea and Pflueger's (their
    test rejects weak instruments when the statistic exceeds the critical value)."""
    if isinstance(test, EffectiveF):
        null = (f"Weak instruments: the worst-case 2SLS bias exceeds {test.tau:.0%} of the benchmark (rejected at "
                f"{iv_tests.MOP_LEVEL:.0%} when the statistic exceeds the critical value)")
        return {"statistic": test.stat, "pval": np.nan, "dist": "", "lower": test.lower, "upper": test.upper,
                "critical_value": test.critical_value, "cost": test.cost, "null": null}
    return {"statistic": test.stat, "pval": test.pval, "dist": test.dist_name, "lower": test.lower,
            "upper": test.upper, "critical_value": np.nan, "cost": test.cost, "null": test.null}


def _is_text_restriction(restriction) -> bool:
    """Whether restrictions passed positionally are text (a string, a list of strings or a dict), as statsmodels'
    ``t_test("x = 0")`` passes them, rather than the rows of C."""
    if isinstance(restriction, (str, dict)):
        return True
    return isinstance(restriction, (list, tuple)) and len(restriction) > 0 and all(isinstance(r, str)
                                                                                    for r in restriction)


class DPIVResults(PrivateTable):
    """Results of :meth:`DPIV2SLS.fit <dpivreg.DPIV2SLS.fit>`.

    Attributes are pandas objects named by the design's columns, in original units.
    See the module docstring for which of them are private releases.
    """

    def __init__(
        self,
        *,
        model: Any,  # the DPIV2SLS that made the fit (not imported: the model imports this module)
        engine_path: DP2SGDPath,
        scale: WorkingScale,
        settings: FitSettings,
        delta: float,
        leaks: tuple[str, ...],
        privacy: PrivacyBudget,
        inference: PrivateInference | None = None,
        inference_note: str = "",
        first_stage_meat: Any = None,
        endogeneity_meat: Any = None,
        units: Any = None,
    ) -> None:
        self._model = model
        self._engine_path = engine_path
        self._scale = scale
        self._settings = settings
        self._delta = delta
        self._leaks = tuple(leaks)
        self._privacy = privacy
        self._inference = inference
        self._inference_note = inference_note
        self._first_stage_meat = first_stage_meat  # covariance.ReleasedMeat (rho_diag) or None
        self._endogeneity_meat = endogeneity_meat  # covariance.ReleasedMeat (rho_diag) or None
        self._units = units  # units.PrivacyUnits (its reordering is data: for the NON-PRIVATE benchmark only) or None
        self._datetime = _dt.datetime.now()

    # ------------------------------------------------------------------ basic attributes
    @property
    def model(self) -> Any:
        """The model that was fitted."""
        return self._model

    @property
    def design(self) -> IVDesign:
        """The design (named blocks) the model was built on."""
        return self._model.design

    @property
    def nobs(self) -> int:
        """Number of observations: public at row level; with a privacy unit (``fit(privacy_unit=...)``) the row
        count is private and this is its released estimate n̂ = N·k̂, rounded (post-processing of the moment
        release, :mod:`dpivreg.privacy.units`), which the private statistics use."""
        if self._scale.unit_level:
            return int(round(self._scale.n))
        return self.design.nobs

    @property
    def privacy_unit(self):
        """Whom the fit protects: :class:`dpivreg.privacy.units.UnitFacts` (the unit, the public number of units
        ``n_units``, the rows each may contribute ``max_rows``, and the clusters), or None for a row."""
        return self._scale.units if self._scale.unit_level else None

    @property
    def n_units(self) -> int:
        """The public number of privacy units (the rows at row level)."""
        return self._scale.n_units

    @property
    def settings(self) -> FitSettings:
        """Step sizes, clipping thresholds, calibration and where each came from."""
        return self._settings

    @property
    def engine_path(self) -> DP2SGDPath:
        """The engine's raw output on the working scale (released paths, noise scales)."""
        return self._engine_path

    @property
    def scale(self) -> WorkingScale:
        """The working scale: column centres and scales, their sources and the released moments (private or
        public), plus the NON-PRIVATE clipping counts ``clipped_values`` and working arrays ``Z``, ``X``, ``Y``
        (the data themselves)."""
        return self._scale

    @property
    def privacy(self) -> PrivacyBudget:
        """The accountant: every release of the fit (preprocessing and both stages) and the zCDP it spent."""
        return self._privacy

    @property
    def delta(self) -> float:
        """The δ at which ε is reported."""
        return self._delta

    @property
    def epsilon(self) -> float:
        """ε at ``delta`` by the exact Gaussian conversion (see ``privacy.epsilon`` for others)."""
        return self.privacy.epsilon(self._delta)

    @property
    def leaks(self) -> tuple[str, ...]:
        """Messages of every :class:`~dpivreg.PrivacyLeakWarning` raised during the fit."""
        return self._leaks

    @property
    def is_private(self) -> bool:
        """True when the fit spent a finite budget and nothing leaked."""
        return self.privacy.is_private and not self._leaks

    # ------------------------------------------------------------------ private releases
    @property
    def estimator(self) -> str:
        """``"DP-2S-GD"`` or ``"noisy moments"`` (``method="moments"``)."""
        return "noisy moments" if self._settings.method == "moments" else "DP-2S-GD"

    @cached_property
    def params(self) -> pd.Series:
        """The private estimate in original units: β⁽ᵀ⁾ (DP-2S-GD) or 2SLS on the released moments."""
        beta = self._scale.beta_to_original(self._engine_path.beta_final)
        return pd.Series(beta, index=self.design.regressor_names, name="parameter")

    @cached_property
    def path(self) -> pd.DataFrame:
        """β⁽⁰⁾ … β⁽ᵀ⁾ in original units, one row per iteration (private release)."""
        beta = self._scale.beta_to_original(self._engine_path.beta)
        index = pd.RangeIndex(beta.shape[0], name="iteration")
        return pd.DataFrame(beta, index=index, columns=self.design.regressor_names)

    @cached_property
    def first_stage(self) -> pd.DataFrame:
        """Θ⁽ᵀ⁾ in original units: instruments (exogenous first) × endogenous (private release)."""
        theta = self._scale.theta_to_original(self._engine_path.theta_final)
        return pd.DataFrame(theta, index=self.design.z_names, columns=self.design.endog_names)

    @cached_property
    def first_stage_diagnostics(self) -> pd.DataFrame:
        """Private first-stage strength per endogenous regressor, as linearmodels' ``first_stage.diagnostics``
        (``rsquared``, ``partial.rsquared``, ``shea.rsquared``, ``f.stat`` with ``f.pval``, ``f.dist``), from the
        moment release, with 95% intervals for the privacy noise (``f.lower``, ``f.upper``,
        ``partial.rsquared.lower``, ``partial.rsquared.upper``). Post-processing: no privacy cost
        (:mod:`dpivreg.inference.diagnostics`). The F is the homoskedastic one (``f.dist`` F(m, n − q)), or, when the
        fit released the first stage's meat (``rho_diag``, by default with robust or clustered errors), the robust
        Wald statistic (``f.dist`` chi2(m)), as linearmodels reports them for ``cov_type="unadjusted"`` and
        ``"robust"``."""

        d = self.design
        return first_stage_diagnostics(self._released_moments("first-stage diagnostics"), list(d.endog_names),
                                       len(d.z_names), len(d.exog_names), self.nobs,
                                       constant=self._scale.constant_index is not None, meat=self._first_stage_meat)

    @cached_property
    def cragg_donald(self) -> pd.Series:
        """The Cragg–Donald minimum eigenvalue statistic of joint first-stage strength (Stata's ``estat
        firststage``; compare with Stock & Yogo's critical values), from the moment release, with a 95% interval
        for the privacy noise: ``statistic``, ``lower``, ``upper``. Homoskedastic; post-processing, no privacy
        cost (:mod:`dpivreg.inference.diagnostics`). With one endogenous regressor it is the first-stage F with n − q
        degrees of freedom."""

        d = self.design
        return cragg_donald(self._released_moments("the Cragg–Donald statistic"), len(d.z_names),
                            len(d.exog_names), len(d.endog_names), self.nobs)

    def anderson_rubin(self, level: float = 0.95):
        """Anderson–Rubin confidence set for the endogenous coefficient (one endogenous regressor), robust to weak
        instruments: test inversion of H₀: β = b in the reduced form of y − x·b on the instruments, with the
        privacy noise in the statistic's variance (:mod:`dpivreg.inference.anderson_rubin`). Private: post-processing of
        the moment release (on the default DP-2S-GD route the pilot release, ``rho0``), no extra budget;
        homoskedastic errors assumed, and the noise's effect to first order.

        Parameters
        ----------
        level : float, default 0.95
            Confidence level.

        Returns
        -------
        AndersonRubinSet
            ``intervals`` (possibly unbounded or empty), ``kind``, ``bounded``, ``statistic(b)``,
            ``pvalue(b)``, ``b in set``.
        """

        d = self.design
        if len(d.endog_names) != 1:
            raise ValueError(f"the Anderson–Rubin set is for one endogenous regressor; this model has "
                             f"{len(d.endog_names)} ({', '.join(d.endog_names)}). Fit a model with one.")
        level = check_level(level)
        grams = self._grams_for("the Anderson–Rubin set")
        k = len(d.exog_names)
        jacobian = self._scale.beta_jacobian()
        return anderson_rubin_set(*grams, variable=d.endog_names[0], n_exog=k, q=len(d.z_names),
                                  n=self.nobs, to_original=float(jacobian[k, k]), level=level)

    # ------------------------------------------------------------------ IV specification tests
    def _test_layout(self) -> tuple[int, int, int, int]:
        d = self.design
        return len(d.z_names), len(d.exog_names), len(d.endog_names), self.nobs

    @cached_property
    def _overidentification(self) -> tuple[TestStatistic, TestStatistic]:
        return iv_tests.overidentification_tests(self._released_moments("Sargan's test"), *self._test_layout(),
                                                 grams=self._grams_for("Sargan's test"))

    @property
    def sargan(self) -> TestStatistic:
        """Sargan's test of over-identification (homoskedastic errors), as linearmodels' ``sargan``: ``stat``,
        ``pval``, ``dist``, ``null``, with ``lower``/``upper`` the 95% interval for the privacy noise. Post-processing
        of the moment release: no privacy cost (:mod:`dpivreg.inference.iv_tests`). Raises
        :class:`~dpivreg.errors.InferenceUnavailableError` for an exactly identified model."""
        return self._overidentification[0]

    @property
    def basmann(self) -> TestStatistic:
        """Basmann's test of over-identification (homoskedastic errors), as linearmodels' ``basmann``; see
        :attr:`sargan`."""
        return self._overidentification[1]

    @cached_property
    def wooldridge_overid(self) -> TestStatistic:
        """The heteroskedasticity-robust test of over-identification (Wooldridge's score test; linearmodels'
        ``wooldridge_overid``, Stata's score χ² of ``estat overid`` after ``vce(robust)``; the two-step GMM J), from
        the moment release and the robust standard errors' released meat (cluster-robust with
        ``cov_type="clustered"``): no extra privacy cost (:mod:`dpivreg.inference.iv_tests`)."""
        if self.cov_type == "unadjusted":
            raise InferenceUnavailableError(
                "the robust over-identification test uses the released meat of the robust standard errors, which "
                "cov_type='unadjusted' does not release: refit with cov_type='robust' (the default), or use the "
                "homoskedastic res.sargan.")
        inference = self.inference
        meat = iv_tests.structural_meat(inference.meat, inference.releases)
        return iv_tests.robust_overidentification_test(self._released_moments("The robust over-identification test"),
                                                       meat, *self._test_layout(),
                                                       clustered=self.cov_type == "clustered",
                                                       grams=self._grams_for("The robust over-identification test"))

    def durbin(self, variables: str | list[str] | None = None) -> TestStatistic:
        """Durbin's test of exogeneity of ``variables`` (all endogenous regressors by default), as linearmodels'
        ``durbin()``: χ²(number tested), homoskedastic errors, with a 95% interval for the privacy noise.
        Post-processing of the moment release: no privacy cost (:mod:`dpivreg.inference.iv_tests`)."""
        return self._endogeneity(variables)[0]

    def wu_hausman(self, variables: str | list[str] | None = None) -> TestStatistic:
        """The Wu–Hausman test of exogeneity of ``variables`` (all endogenous regressors by default), as
        linearmodels' ``wu_hausman()``: F(number tested, n − k − p − number tested), homoskedastic errors; see
        :meth:`durbin`."""
        return self._endogeneity(variables)[1]

    def _endogeneity(self, variables) -> tuple[TestStatistic, TestStatistic]:
        q, k, _, n = self._test_layout()
        return iv_tests.endogeneity_tests(self._released_moments("The endogeneity tests"),
                                          list(self.design.endog_names), q, k, n, variables,
                                          grams=self._grams_for("The endogeneity tests"))

    @cached_property
    def wooldridge_score(self) -> TestStatistic:
        """Wooldridge's heteroskedasticity-robust score test that the endogenous regressors are exogenous
        (linearmodels' ``wooldridge_score``; Stata's robust score χ² of ``estat endogenous`` after ``vce(robust)``;
        cluster-robust with ``cov_type="clustered"``): χ²(number of endogenous regressors), with a 95% interval for
        the privacy noise. From the moment release and the endogeneity test's released meat, which
        ``rho_diag`` buys beside the first stage's (by default with robust or clustered standard errors;
        :mod:`dpivreg.inference.iv_tests`)."""
        if self._endogeneity_meat is None:
            raise InferenceUnavailableError(
                "the robust endogeneity test needs the endogeneity test's released meat, which this fit did not "
                "make (rho_diag=0, cov_type='unadjusted', inference=False or preprocess='bounds'): refit with robust "
                "or clustered standard errors, where the default rho_diag buys it, or use the homoskedastic "
                "res.wu_hausman() and res.durbin().")
        q, k, p, n = self._test_layout()
        return iv_tests.robust_endogeneity_test(self._released_moments("The robust endogeneity test"),
                                                self._endogeneity_meat, q, k, p, n,
                                                clustered=self._endogeneity_meat.clustered,
                                                grams=self._grams_for("The robust endogeneity test"))

    @cached_property
    def effective_f(self) -> EffectiveF:
        """Montiel Olea and Pflueger's (2013) effective first-stage F (heteroskedasticity-robust instrument
        strength; HC0) of the endogenous regressor, with its simplified critical value for a worst-case bias of 10%
        at 5% (``critical_value``, ``weak``) and a 95% interval for the privacy noise. From the moment release and
        the first stage's released meat (``rho_diag``, by default with robust or clustered errors;
        :mod:`dpivreg.inference.iv_tests`). With one
        instrument it is the robust first-stage Wald statistic."""
        d = self.design
        if len(d.endog_names) != 1:
            raise InferenceUnavailableError(
                f"the effective F is defined for one endogenous regressor; this model has {len(d.endog_names)} "
                f"({', '.join(d.endog_names)}): res.cragg_donald measures their joint strength.")
        if self._first_stage_meat is None:
            raise InferenceUnavailableError(
                "the effective F needs the first stage's released meat, which this fit did not make (rho_diag=0, "
                "cov_type='unadjusted', inference=False or preprocess='bounds'): refit with robust or clustered "
                "standard errors, where the default rho_diag buys it.")
        q, k, _, n = self._test_layout()
        return iv_tests.effective_f(self._released_moments("The effective F"), self._first_stage_meat,
                                    d.endog_names[0], q, k, n, grams=self._grams_for("The effective F"))

    @cached_property
    def iv_tests(self) -> pd.DataFrame:
        """The IV specification tests that apply to this fit, one row each, as the summary's IV tests block and
        every export show them (this is the one place that decides which apply).

        Rows, in this order, each only when it applies (a test that does not is left out, never a stub row):
        over-identification, when the model is over-identified: ``Wooldridge overid (robust)`` (or
        ``(cluster-robust)``; :attr:`wooldridge_overid`) when the fit released the robust standard errors' meat, and
        ``Sargan overid`` (:attr:`sargan`); endogeneity of all the endogenous regressors: ``Wooldridge exogeneity
        (robust)`` (or ``(cluster-robust)``; :attr:`wooldridge_score`) when the fit released the endogeneity test's
        meat (``rho_diag``), ``Wu-Hausman exogeneity`` and ``Durbin exogeneity`` (:meth:`wu_hausman`,
        :meth:`durbin`); instrument strength: ``Effective F (MOP)`` (:attr:`effective_f`) with one endogenous
        regressor and the first stage's meat (``rho_diag``). No row without the moment release
        (``preprocess="bounds"``).

        Columns: ``statistic``; ``pval`` (against the statistic's law under the null simulated with the privacy
        noise; NaN for the effective F, which is read against its critical value); ``dist`` (the large-sample law,
        e.g. ``chi2(1)``; empty for the effective F); ``lower``, ``upper`` (the 95% interval of the privacy noise);
        ``critical_value`` (the effective F's for a worst-case bias of 10%, Montiel Olea-Pflueger's simplified
        procedure; NaN for the others); ``cost`` (what paid for it); ``null``. Index ``test``.

        A test the release cannot support (the homoskedastic tests where the residual variance is below the
        release's noise) is left out and its reason kept in ``attrs["refused"]``, which the summary's note shows.

        Post-processing of the moment release and, for the robust tests, of the released meats: no data read, no
        budget (:mod:`dpivreg.inference.iv_tests`)."""
        tests: dict[str, TestStatistic | EffectiveF] = {}
        refused: list[str] = []

        def add(names: tuple[str, ...], compute) -> None:
            try:
                values = compute()
            except InferenceUnavailableError as exc:  # e.g. a residual variance the release cannot resolve
                refused.append(str(exc))
                return
            tests.update(zip(names, values if isinstance(values, tuple) else (values,)))

        if self._scale.moments is not None:
            q, k, p, _ = self._test_layout()
            if q - k > p:  # over-identified
                if self._inference is not None and self.cov_type in ROBUST_OVERID:
                    add((ROBUST_OVERID[self.cov_type],), lambda: self.wooldridge_overid)
                add((SARGAN,), lambda: self.sargan)
            if self._endogeneity_meat is not None:  # bought with rho_diag (also without the fit's own inference)
                kind = "clustered" if self._endogeneity_meat.clustered else "robust"
                add((ROBUST_ENDOGENEITY[kind],), lambda: self.wooldridge_score)
            add((DURBIN, WU_HAUSMAN), lambda: self._endogeneity(None))
            tests = {name: tests[name] for name in (*ROBUST_OVERID.values(), SARGAN, *ROBUST_ENDOGENEITY.values(),
                                                    WU_HAUSMAN, DURBIN) if name in tests}
            if p == 1 and self._first_stage_meat is not None:
                add((EFFECTIVE_F,), lambda: self.effective_f)
        frame = iv_test_frame([{"test": name, **_test_row(test)} for name, test in tests.items()])
        frame.attrs["refused"] = refused
        return frame

    @property
    def _iv_tests_frame(self) -> pd.DataFrame:
        return self.iv_tests

    @cached_property
    def _released_grams(self) -> tuple[np.ndarray, np.ndarray | None]:
        """The moment release's Gram matrix and its simulated re-releases (fixed seed), made once per fit for the
        Anderson–Rubin set and the IV tests (:func:`dpivreg.inference.diagnostics.released_grams`)."""
        return released_grams(self._scale.moments)

    def _grams_for(self, what: str) -> tuple[np.ndarray, np.ndarray | None]:
        self._released_moments(what)  # a clear error without the moment release
        return self._released_grams

    def _released_moments(self, what: str):
        moments = self._scale.moments
        if moments is None:
            raise InferenceUnavailableError(
                f"{what}: not available without the moment release, which preprocess='bounds' does not make. Refit "
                "with preprocess='private' (the default).")
        return moments

    @cached_property
    def first_stage_path(self) -> np.ndarray:
        """Θ⁽⁰⁾ … Θ⁽ᵀ⁾ in original units, shape (T+1, instruments, endogenous) (private release)."""
        return self._scale.theta_to_original(self._engine_path.theta)

    # ------------------------------------------------------------------ private inference
    @property
    def inference(self) -> PrivateInference:
        """The private covariance and its pieces (sampling, privacy noise); see :mod:`dpivreg.inference`."""
        if self._inference is None:
            raise InferenceUnavailableError(
                f"private standard errors are {self._inference_note}. Refit with inference=True and "
                "preprocess='private' (the default). The IV2SLS standard errors in .benchmark are NOT a "
                "substitute: they are non-private and ignore the privacy noise."
            )
        return self._inference

    def cov_params(self) -> pd.DataFrame:
        """Covariance of the private estimate (sampling + privacy noise), original units (private)."""
        names = self.design.regressor_names
        return pd.DataFrame(self.inference.cov, index=names, columns=names)

    @property
    def cov(self) -> pd.DataFrame:
        """linearmodels' name for :meth:`cov_params`."""
        return self.cov_params()

    @property
    def cov_type(self) -> str:
        """The sampling covariance of the private inference: ``"unadjusted"`` or ``"robust"``."""
        return self._settings.cov_type

    @cached_property
    def bse(self) -> pd.Series:
        """Private standard errors: sqrt of the diagonal of :meth:`cov_params`."""
        return pd.Series(np.sqrt(np.diag(self.inference.cov)), index=self.design.regressor_names, name="std_error")

    @property
    def bias(self) -> pd.Series:
        """Simulated bias of the estimate (post-processing, a diagnostic: nothing is corrected by it; a
        value above 0.2 standard errors raises a warning at fit time; see :mod:`dpivreg.inference`)."""
        return pd.Series(self.inference.bias, index=self.design.regressor_names, name="bias")

    def wald_test(self, restriction=None, value=None, *, formula=None):
        """Wald test of the linear restrictions Cβ = v on the private estimate (post-processing: no cost).

        The statistic (Cβ̂ − v)ᵀ(C V̂ Cᵀ)⁻¹(Cβ̂ − v), V̂ = :meth:`cov_params`, is χ² with as many degrees of
        freedom as restrictions under the null (the private intervals' normal approximation).

        Parameters
        ----------
        restriction : array_like (m, p), str, list of str or dict, optional
            The rows of C, one per restriction, columns in the order of ``params``; or the restrictions as text,
            positionally as statsmodels takes them (``wald_test("kids = 0")``), read as ``formula``.
        value : array_like (m,), optional
            v; default zeros.
        formula : str, list of str or dict, optional
            The restrictions in linearmodels' (formulaic's) syntax instead: ``"x1 = 0, x2 + x3 = 1"``,
            ``["x1 = 0", "x2 = 0"]`` or ``{"x1": 0, "x2 + x3": 1}``; names that are not Python identifiers
            (e.g. ``C(x)[T.1]``) in back-ticks.

        Returns
        -------
        linearmodels.shared.hypotheses.WaldTestStatistic
            ``stat``, ``pval``, ``df``, as linearmodels' ``wald_test`` returns.
        """
        from linearmodels.shared.hypotheses import quadratic_form_test

        C, v = self._restrictions(restriction, value, formula)
        return quadratic_form_test(self.params.to_numpy(), self.inference.cov, restriction=C, value=v)

    def t_test(self, restriction=None, value=None, *, formula=None):
        """z tests of each linear combination Cⱼβ = vⱼ on the private estimate (post-processing).

        Arguments as :meth:`wald_test`. Returns a statsmodels ``ContrastResults`` with the combinations'
        estimates (``effect``), their private standard errors (``sd``), z statistics and two-sided normal
        p-values, and ``conf_int(alpha)``, as statsmodels' ``t_test`` returns for a normal approximation.
        """
        from statsmodels.stats.contrast import ContrastResults

        C, v = self._restrictions(restriction, value, formula)
        effect = C @ self.params.to_numpy()
        sd = np.sqrt(np.diag(C @ self.inference.cov @ C.T))
        return ContrastResults(effect=effect, sd=sd, statistic=(effect - v) / sd, distribution="norm")

    def _restrictions(self, restriction, value, formula) -> tuple[np.ndarray, np.ndarray]:
        """(C, v) from an array or a formula, checked against the parameters."""
        names = self.design.regressor_names
        if formula is None and _is_text_restriction(restriction):
            formula, restriction = restriction, None  # statsmodels' positional strings: t_test("kids = 0")
        if formula is not None:
            if restriction is not None or value is not None:
                raise ValueError("give the restrictions either as formula= or as restriction (and value), not both.")
            from formulaic.utils.constraints import LinearConstraints

            spec = formula
            if isinstance(formula, dict):
                spec = [f"{lhs} = {rhs}" for lhs, rhs in formula.items()]
            try:
                constraints = LinearConstraints.from_spec(spec, [str(n) for n in names])
            except Exception as error:  # formulaic's parse errors name the token, not our parameters
                raise ValueError(f"could not read the restrictions {formula!r} ({error}). The parameters are "
                                 f"{list(names)}; write e.g. 'x1 = 0, x2 + x3 = 1', and put names that are not "
                                 "Python identifiers in back-ticks.") from None
            return self._checked_restrictions(np.asarray(constraints.constraint_matrix, dtype=float),
                                              np.asarray(constraints.constraint_values, dtype=float).ravel())
        if restriction is None:
            raise TypeError("wald_test/t_test need restriction (an array with one row per restriction and a column "
                            f"per parameter, {list(names)}) or formula=, e.g. formula='{names[-1]} = 0'.")
        C = np.atleast_2d(np.asarray(restriction, dtype=float))
        if C.ndim != 2 or C.shape[1] != len(names):
            raise ValueError(f"restriction must have one column per parameter ({len(names)}: {list(names)}), got "
                             f"shape {np.shape(restriction)}.")
        v = np.zeros(C.shape[0]) if value is None else np.asarray(value, dtype=float).ravel()
        if v.shape != (C.shape[0],):
            raise ValueError(f"value must have one entry per restriction ({C.shape[0]}), got shape {np.shape(value)}.")
        return self._checked_restrictions(C, v)

    @staticmethod
    def _checked_restrictions(C: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not (np.all(np.isfinite(C)) and np.all(np.isfinite(v))):
            raise ValueError("restriction and value must be finite numbers.")
        if np.linalg.matrix_rank(C) < C.shape[0]:
            raise ValueError("the restrictions are linearly dependent (restriction has rank "
                             f"{np.linalg.matrix_rank(C)} < {C.shape[0]} rows): drop the redundant ones.")
        return C, v

    # ------------------------------------------------------------------ theory (free)
    @cached_property
    def contraction(self) -> theory.ContractionRates:
        """Contraction rates κ_β, κ_Θ, κ on the working scale (post-processing: no privacy cost).

        Under the paper's isotropy assumption δ = δ(τ) = (√q+√τ)/√n. With ``method="gd"``,
        γ̄, γ̲ = (1±δ)²·σ_max/min(Θ̄)² from the released Θ⁽ᵀ⁾ (Θ̄ the full q×p first stage,
        exogenous columns mapping to themselves) and the paper's remark gives κ. With
        ``method="preconditioned"`` the contraction of the whitened iteration is reported
        (:func:`dpivreg.estimation.theory.preconditioned_contraction_rates`). See :mod:`dpivreg.estimation.theory`.
        """
        d, path = self.design, self._engine_path
        q, k = len(d.z_names), len(d.exog_names)
        self._require_iteration("contraction rates")
        delta = theory.delta_tau(self.nobs, q, self._settings.tau)
        if self._settings.method == "preconditioned" and self._settings.init == "moments":
            # the whitening error κ̂ of the release bounds the spectrum of Z̃ᵀZ̃/n (see dpivreg.estimation.tuning)
            kappa = self._settings.kappa
            theta_rate = min(tuning.contraction(kappa, self._settings.eta) ** 2, 1.0)
            beta_rate = min(tuning.contraction(kappa, self._settings.alpha) ** 2, 1.0)
            return theory.ContractionRates(beta_rate, theta_rate, max(beta_rate, theta_rate))
        if self._settings.method == "preconditioned":
            return theory.preconditioned_contraction_rates(delta, self._settings.eta, self._settings.alpha)
        theta_full = np.concatenate([np.eye(q, k), path.theta_final], axis=1)
        gamma_bar, gamma_under = theory.eigenvalue_bounds(theta_full, delta)
        return theory.contraction_rates(delta, gamma_bar, gamma_under)

    @cached_property
    def bound(self) -> theory.ErrorBound:
        """The Theorem's error-bound components for this fit (up to constants, c = 1; no privacy cost).

        Uses n, p = all regressors, q = all instruments, T, the budgets actually spent, τ and
        the contraction rate κ of :attr:`contraction`. The Theorem starts from zero; from the warm start
        the optimisation term multiplies the warm start's (smaller) error instead of ‖β̂‖.
        """
        self._require_iteration("the Theorem's error bound")
        if self._scale.unit_level:
            raise ValueError("the Theorem's error bound is stated for row-level privacy (neighbours replace one row) "
                             "and independent rows; this fit protects privacy units, so it has no such bound.")
        d, priv = self.design, self.privacy
        n, p, q, tau = self.nobs, len(d.regressor_names), len(d.z_names), self._settings.tau
        start_error = theory.initial_error(self._settings.init, n, p, q, tau)
        return theory.error_bound(n, p, q, self._settings.T, priv.rho1, priv.rho2, tau=tau, kappa=self._bound_kappa(),
                                  start_error=start_error)

    def _require_iteration(self, what: str) -> None:
        if self._settings.method == "moments":
            raise ValueError(f"{what} describe(s) DP-2S-GD; method='moments' runs no iteration.")

    def _bound_kappa(self) -> float:
        # κ = 1 (no contraction guaranteed) is outside theory's (0, 1) domain: report the closest value.
        return float(min(max(self.contraction.kappa, 1e-12), 1.0 - 1e-12))

    # ------------------------------------------------------------------ non-private
    @cached_property
    def benchmark(self) -> CrossProductIV2SLS:
        """NON-PRIVATE benchmark: 2SLS on the same design with linearmodels' default robust (HC0) covariance.

        Computed from the raw data without noise: use it to validate the private estimate, never
        publish it. With privacy units or clusters it is 2SLS on the rows the fit keeps (at most
        ``max_rows_per_unit`` per unit) with linearmodels' clustered covariance (``cov_type="clustered"``,
        by the fit's clusters). It is built from the design's column factor and one residual pass
        (:func:`dpivreg.data.cross_products.iv2sls_benchmark`), in memory and on Dask alike, and equals
        ``linearmodels.iv.IV2SLS(...).fit()`` to rounding: ``params``, ``std_errors``, ``cov``,
        ``tstats``, ``pvalues``, ``conf_int()``, and ``unadjusted_cov`` / ``unadjusted_std_errors``
        for ``cov_type="unadjusted"``. linearmodels' own results object, with its first-stage
        diagnostics and tests, is :attr:`benchmark_linearmodels`.
        """
        return iv2sls_benchmark(self.design, units=self._units)

    @cached_property
    def benchmark_linearmodels(self) -> Any:
        """NON-PRIVATE: linearmodels' ``IV2SLS(...).fit()`` results on the same in-memory design (lazy).

        For users who want linearmodels' methods on the benchmark (``first_stage``, ``wu_hausman()``,
        ``summary``, other ``cov_type`` options via ``res.benchmark_linearmodels.model.fit(...)``).
        It is built only when asked for (linearmodels needs several copies of the data); the summary
        uses the equal and much cheaper :attr:`benchmark`. Not available for a Dask design.
        """
        d = self.design
        if getattr(d, "is_dask", False):
            raise ValueError("benchmark_linearmodels needs the design in memory; for a Dask design use "
                             "res.benchmark (2SLS from cross-products) or compute the design and refit.")
        from linearmodels.iv import IV2SLS  # noqa: PLC0415 - built only on request

        if self._units is None:
            exog = d.exog  # read once: a block with 0/1 columns is widened to float64 at each read
            return IV2SLS(d.dependent, exog if exog.shape[1] else None, d.endog, d.instruments).fit()
        order, groups = self._units.order, self._units.groups  # the kept rows, clustered as the fit
        dependent, exog, endog, instruments = (block.iloc[order] for block in (d.dependent, d.exog, d.endog,
                                                                               d.instruments))
        model = IV2SLS(dependent, exog if exog.shape[1] else None, endog, instruments)
        if self._units.facts.clusters is None:
            return model.fit()
        clusters = np.repeat(np.arange(groups.count("cluster")), np.diff(groups.starts("cluster")))
        return model.fit(cov_type="clustered", clusters=clusters)

    @property
    def clipped_rows(self) -> pd.DataFrame:
        """NON-PRIVATE diagnostic: rows (with a privacy unit: units) whose gradient was clipped, per iteration and
        stage."""
        counts = self._engine_path.clipped_rows
        what = " (units)" if self._scale.unit_level else ""
        return pd.DataFrame(
            counts, index=pd.RangeIndex(1, counts.shape[0] + 1, name="iteration"),
            columns=[f"first stage{what}", f"second stage{what}"],
        )

    @cached_property
    def cautions(self) -> tuple[str, ...]:
        """The notes that qualify the estimate — unreliable private standard errors (CAUTION), weak instruments
        (WEAK INSTRUMENTS), what the moment release cannot resolve (UNRESOLVED, a released mean at a bound) —
        computed from releases and public inputs, so publishable; every export carries them (the summary, the
        Markdown and CSV tables, ``to_frame().attrs``, the release record, ``compare``)."""
        return tuple(SummaryWriter(self).cautions())

    @property
    def summary(self) -> SummaryAccessor:
        """Summary of the fit: ``res.summary(benchmark=True)`` returns a statsmodels ``Summary`` (``as_text``,
        ``as_latex``, ``as_html``, ``as_csv``); ``print(res.summary)`` prints the default one, as linearmodels'
        property does (:class:`~dpivreg.reporting.tables.SummaryAccessor`; its attributes are those of a fresh
        summary: call it for one to modify).

        Top block: the estimator's settings and the privacy spent. Parameter table: the private
        estimate beside the NON-PRIVATE IV2SLS benchmark. Error-bound block: the Theorem's terms
        (free post-processing). Notes: what is private, the design, the scaling source, what the releases
        cannot resolve and every privacy leak raised during the fit.

        Called with ``benchmark=False`` it gives the publishable summary: only private releases, their
        post-processing and public settings (no benchmark columns, no NON-PRIVATE counts such as the number of
        clipped values). A fit with a privacy leak still lists its leaks: do not publish it.
        """
        return SummaryAccessor(self._summary)

    def _summary(self, *, benchmark: bool = True) -> DPIVSummary:
        """The summary itself (:attr:`summary`)."""
        benchmark = check_flag(benchmark, "benchmark")
        if not benchmark and self._leaks:  # the publishable summary of a fit that is not private
            warnings.warn("the summary is of a fit with privacy leaks (listed in its notes): do not publish it. "
                          + " ".join(self._leaks), PrivacyLeakWarning, stacklevel=3)
        return SummaryWriter(self).summary(benchmark)

    # ------------------------------------------------------------------ exports (tables.PrivateTable) and the record
    @property
    def _has_inference(self) -> bool:
        return self._inference is not None

    @property
    def _dependent_label(self) -> str:
        return self.design.dependent_name

    def _benchmark_columns(self) -> pd.DataFrame:
        names = self.design.regressor_names
        ref, se = self.benchmark.params[names], self.benchmark.std_errors[names]
        return pd.DataFrame({"IV2SLS (NON-PRIVATE)": ref, "std_error (NON-PRIVATE)": se,
                             "diff/se (NON-PRIVATE)": (self.params - ref) / se})

    def release(self) -> FitRelease:
        """The fit's private output as a :class:`~dpivreg.reporting.release.FitRelease`: no row of data, no benchmark.

        It holds the estimate, its standard errors, covariance and 95% intervals, the released paths, the
        accountant's releases (budget, ε at any δ), the public settings and scaling, the names, n and any
        leaks; ``.save(path)`` writes it as JSON and :func:`dpivreg.load_release` reads it back.
        """
        if self._leaks:
            warnings.warn("the release record is of a fit with privacy leaks (kept in its `leaks`): "
                          + " ".join(self._leaks), PrivacyLeakWarning, stacklevel=2)
        d, s = self.design, self._settings
        cov = None if self._inference is None else self.cov_params()
        settings = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)
                    if f.name not in ("adaptive_clip", "selection")}
        settings["clip1"], settings["clip2"] = _plain(s.clip1), _plain(s.clip2)
        for step in ("eta", "alpha"):  # the paper's rule from the data's eigenvalues: a leak, not copied
            if settings[f"{step}_source"] == "data":
                settings[step] = "data (not recorded)"
        if s.adaptive_clip is not None:
            settings["clip_rows_allowed"] = [float(k) for k in s.adaptive_clip.targets]
        if s.selection is not None:
            settings["selection"] = {"estimator": s.selection.estimator,
                                     "error_ratio": float(s.selection.error_ratio)}

        return FitRelease(
            dependent=d.dependent_name, formula=self._model.formula, endog_names=tuple(d.endog_names),
            instrument_names=tuple(d.instrument_names), exog_names=tuple(d.exog_names), nobs=int(self.nobs),
            estimator=self.estimator, params=self.params.copy(), cov=cov, cov_type=s.cov_type,
            path=self.path.copy(), first_stage_path=np.array(self.first_stage_path),
            privacy=PrivacyBudget(self.privacy.releases, self.privacy.target, unit=self.privacy.unit),
            delta=self._delta, unit=None if self._scale.units is None else self._scale.units.as_dict(),
            settings=settings, scaling=self._public_scaling(), leaks=self._leaks,
            inference_note=self._inference_note, version=__version__, created=record_time(),
            cautions=self.cautions, iv_tests=iv_test_records(self.iv_tests),
        )

    def _public_scaling(self) -> dict:
        """The working scale's public part per column (bounds and the constant); data-derived scales are left out."""
        sc = self._scale
        centres = sc.bound_centres if sc.bound_centres is not None else pd.Series(0.0, index=sc.bound_scales.index)
        out = {}
        for name in sc.bound_scales.index:
            source = sc.source[name]
            if source == "data":
                out[str(name)] = {"source": "data (not recorded)"}
            else:
                out[str(name)] = {"centre": float(centres[name]), "scale": float(sc.bound_scales[name]),
                                  "source": str(source)}
        return out

    def __str__(self) -> str:
        return self.summary().as_text()

    def __repr__(self) -> str:
        return (
            f"<DPIVResults: {self.design.dependent_name} on {', '.join(self.design.regressor_names)}; "
            f"{size_text(self.nobs, self.privacy.unit)}, T={self._settings.T}, rho={_fmt(self.privacy.rho)}, "
            f"epsilon={_fmt(self.epsilon)} at delta={_fmt(self._delta)}>"
        )

    def _repr_html_(self) -> str:
        return self.summary().as_html()
