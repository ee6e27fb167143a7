"""Planning in the coefficients' units: the private standard error to expect, and the budget a target needs.

:func:`plan_se` answers, before any data access, the two questions an applied user asks of a private
fit: *what standard error will each coefficient have at this budget?* and *what is the smallest budget
for a target standard error (or confidence-interval width)?* It plans by simulation, the standard way
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
4. For a target, V(ρ) = V_sampling + V_noise(ρ) is solved for the smallest total ρ by a safeguarded
   secant search in log ρ (below), each step a fit at the candidate ρ on the *same* synthetic data sets
   and fit seeds (common random numbers), so the answer's planned SE is itself a fit's: the last step
   verifies it.

No private data are touched, so a plan costs no privacy budget. Its cost is computation: ``draws`` fits
per budget evaluated (one at a given ρ; typically 4 to 8 budgets for a target), a few seconds per fit at
n = 10⁶. The accuracy of the planned SE against the realised private SE (the standard deviation of the
private estimate over repeated data draws and noise) is measured by ``benchmarks/plan_accuracy.py`` and
tabulated in the docs' planning page.

The Theorem's terms with constants set to 1 (:func:`dpivreg.theory.plan`) remain available as the
secondary, shape-only view.
"""

from __future__ import annotations

import math
import numbers
import re
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import optimize, stats

from .validation import as_real, check_count, check_rho

__all__ = ["SEPlan", "SyntheticPopulation", "iv_formula", "plan_se", "synthetic_population"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Search range of the total budget for a target.
RHO_SEARCH = (1e-4, 1e6)


def iv_formula(endog: int = 1, instruments: int = 1, exog: int = 0, *, intercept: bool = True) -> str:
    """A formula with generic names from counts: ``y ~ 1 + w1 + … + [x1 + … ~ z1 + …]``.

    Parameters
    ----------
    endog, instruments : int
        Numbers of endogenous regressors (``x1`` …) and of excluded instruments (``z1`` …), instruments >= endog.
    exog : int, default 0
        Number of exogenous regressors besides the intercept (``w1`` …).
    intercept : bool, default True
        Include ``1`` (linearmodels' formulas have no implicit intercept).

    Returns
    -------
    str
    """
    endog = check_count(endog, "endog")
    instruments = check_count(instruments, "instruments")
    exog = check_count(exog, "exog", minimum=0, what="a non-negative integer")
    if not isinstance(intercept, (bool, np.bool_)):
        raise TypeError(f"intercept must be True or False, got {intercept!r}.")
    if instruments < endog:
        raise ValueError(f"instruments must be >= endog for identification, got {instruments} < {endog}.")
    rhs = (["1"] if intercept else []) + [f"w{j + 1}" for j in range(exog)]
    block = f"[{' + '.join(f'x{j + 1}' for j in range(endog))} ~ {' + '.join(f'z{j + 1}' for j in range(instruments))}]"
    return f"y ~ {' + '.join([*rhs, block])}"


# --------------------------------------------------------------------------------------------------
# The synthetic population
# --------------------------------------------------------------------------------------------------

def _censored_moments(mu: float, sigma: float, lo: float, hi: float) -> tuple[float, float]:
    """Mean and SD of N(mu, sigma²) clipped to [lo, hi]."""
    a, b = (lo - mu) / sigma, (hi - mu) / sigma
    Pa, Pb = stats.norm.cdf(a), stats.norm.sf(b)
    pa, pb = stats.norm.pdf(a), stats.norm.pdf(b)
    mid = 1.0 - Pa - Pb
    # E[Z; a < Z < b] = pa - pb, E[Z²; a < Z < b] = mid + a·pa - b·pb (standard normal Z)
    m1 = pa - pb
    m2 = mid + (a * pa if np.isfinite(a) else 0.0) - (b * pb if np.isfinite(b) else 0.0)
    mean_z = m1 + a * Pa + b * Pb
    second_z = m2 + a * a * Pa + b * b * Pb
    var_z = max(second_z - mean_z**2, 0.0)
    return mu + sigma * mean_z, sigma * math.sqrt(var_z)


def _latent_normal(name: str, mean: float, sd: float, lo: float, hi: float) -> tuple[float, float]:
    """(mu, sigma) of the normal whose values clipped to [lo, hi] have the given mean and SD."""
    if not lo < mean < hi:
        raise ValueError(f"means[{name!r}] = {mean:g} must lie strictly inside its bounds ({lo:g}, {hi:g}).")
    largest = math.sqrt((mean - lo) * (hi - mean))  # a two-point distribution on the bounds
    if not sd < largest:
        raise ValueError(
            f"sds[{name!r}] = {sd:g} is not below {largest:.4g}, the largest SD a variable with mean {mean:g} "
            f"can have inside its bounds ({lo:g}, {hi:g}); pass a smaller SD (or a mean nearer the middle)."
        )
    got = _censored_moments(mean, sd, lo, hi)
    if abs(got[0] - mean) <= 1e-6 * sd and abs(got[1] - sd) <= 1e-6 * sd:
        return mean, sd

    def gap(v: np.ndarray) -> np.ndarray:
        m, s = _censored_moments(v[0], math.exp(v[1]), lo, hi)
        return np.array([(m - mean) / sd, (s - sd) / sd])

    sol = optimize.least_squares(gap, x0=np.array([mean, math.log(sd)]), xtol=1e-12, ftol=1e-12)
    if not np.all(np.abs(sol.fun) < 1e-4):
        raise ValueError(
            f"no normal clipped to the bounds ({lo:g}, {hi:g}) has mean {mean:g} and SD {sd:g} ({name!r}); "
            "pass a smaller SD."
        )
    return float(sol.x[0]), float(math.exp(sol.x[1]))


@dataclass(frozen=True)
class SyntheticPopulation:
    """The synthetic population a plan draws from: public inputs and guesses only.

    Rows are independent. Instruments ``z`` are independent of each other and of everything else; exogenous
    regressors ``w`` are independent of the instruments and correlated with each other and with the
    endogenous regressors as ``corr`` says (0 otherwise). A binary variable is 0/1 with the guessed share
    of ones; a continuous one is a normal clipped to its bounds whose clipped mean and SD equal the
    guesses. Each endogenous regressor is

        x_j = clip(μ_j + σ_j·(a_jᵀw̃ + √((1 − s_j)·R²_j)·ζ_j + √((1 − s_j)(1 − R²_j))·v_j)),

    w̃ the standardised exogenous regressors, a_j the loadings giving x_j its guessed correlations with
    them (s_j = a_jᵀ corr(w̃) a_j), ζ_j the standardised combination of the instruments given by
    ``first_stage_weights`` (by default the sum of the instruments assigned to it, instrument k going to
    endogenous regressor k mod p_endog; with several endogenous regressors whose first stages share their
    instruments, give the weights: the fitted values' correlation is what makes them jointly weaker) and v_j
    standard normal, so that R²_j is the instruments'
    partial R² (before clipping). The outcome is y = clip(c + Σ βₖ·xₖ + σ_u·u) over all regressors, with
    corr(u, v_j) = ``endogeneity`` for every j; c gives y the guessed mean and, unless ``error_sd`` is
    given, σ_u gives it the guessed SD.

    Draws have exact moments: the latent normals are orthogonalised against the binary columns and whitened
    in the sample, and binary columns have exactly round(share·n) ones, so a draw's first stage, error
    correlations and 2SLS solution equal the population's up to the clipping (a planned SE describes a
    typical data set, not one draw's luck).

    Attributes
    ----------
    formula : str
    dependent : str
    exog, endog, instruments : tuple of str
        Variable names by role (the intercept excluded).
    intercept : bool
    bounds : dict
        Public bounds of every variable, ``{name: (lo, hi)}``.
    means, sds : dict
        The guessed mean and SD of every variable (of the clipped values).
    binary : frozenset of str
        Variables drawn as 0/1.
    first_stage_r2 : dict
        Partial R² of the instruments for each endogenous regressor.
    first_stage_weights : dict
        ``{endog: {instrument: weight}}``: the combination ζ_j of the standardised instruments in each first
        stage (unit length).
    error_sd : float or None
        The structural error SD σ_u, or None to match the outcome's guessed SD.
    endogeneity : float
        corr(u, v_j).
    coef : dict
        The guessed coefficient of every regressor (0 unless given).
    corr : dict
        ``{(a, b): r}``: guessed correlations between regressors (exogenous–exogenous, both continuous, or
        exogenous–endogenous).
    latent : dict
        ``{name: (mu, sigma)}`` of the normal before clipping, for the continuous variables.
    """

    formula: str
    dependent: str
    exog: tuple[str, ...]
    endog: tuple[str, ...]
    instruments: tuple[str, ...]
    intercept: bool
    bounds: dict
    means: dict
    sds: dict
    binary: frozenset
    first_stage_r2: dict
    error_sd: float | None
    endogeneity: float
    coef: dict
    corr: dict = field(default_factory=dict)
    first_stage_weights: dict = field(default_factory=dict)
    latent: dict = field(default_factory=dict, repr=False)

    @property
    def variables(self) -> tuple[str, ...]:
        """Every variable of the formula: outcome, exogenous, endogenous, instruments."""
        return (self.dependent, *self.exog, *self.endog, *self.instruments)

    def _r(self, a: str, b: str) -> float:
        return self.corr.get((a, b), self.corr.get((b, a), 0.0))

    def exog_correlation(self) -> np.ndarray:
        """Correlation matrix of the standardised exogenous regressors."""
        k = len(self.exog)
        R = np.eye(k)
        for i in range(k):
            for j in range(i + 1, k):
                R[i, j] = R[j, i] = self._r(self.exog[i], self.exog[j])
        return R

    def loadings(self) -> dict[str, np.ndarray]:
        """a_j of each endogenous regressor on the standardised exogenous regressors."""
        R = self.exog_correlation()
        out = {}
        for e in self.endog:
            r = np.array([self._r(w, e) for w in self.exog])
            out[e] = np.linalg.solve(R, r) if len(r) else r
        return out

    def draw(self, n: int, *, seed=None) -> pd.DataFrame:
        """One synthetic data set of ``n`` rows (columns named as in the formula), with exact moments.

        Parameters
        ----------
        n : int
            Rows, > the number of variables + 1.
        seed : None, int >= 0, SeedSequence or Generator

        Returns
        -------
        pandas.DataFrame
        """
        from .engine import make_rng

        n = check_count(n, "n", minimum=len(self.variables) + 2, integral_floats=True)
        rng = make_rng(seed)
        k = len(self.endog)
        binary = [v for v in (*self.exog, *self.instruments) if v in self.binary]
        cont_exog = [w for w in self.exog if w not in self.binary]
        cont_z = [z for z in self.instruments if z not in self.binary]
        std: dict[str, np.ndarray] = {}  # standardised values before clipping
        for v in binary:
            ones = round(self.means[v] * n)
            col = np.zeros(n)
            col[rng.permutation(n)[:ones]] = 1.0
            share = ones / n
            if not 0 < share < 1:
                raise ValueError(f"n = {n} is too small for the share {self.means[v]:g} of ones of {v!r}.")
            std[v] = (col - share) / math.sqrt(share * (1 - share))
        # latent normals: continuous exogenous, continuous instruments, first-stage errors, error's own part
        m = len(cont_exog) + len(cont_z) + k + 1
        G = rng.standard_normal((n, m))
        G -= G.mean(axis=0)
        if binary:
            B = np.column_stack([std[v] for v in binary])
            G -= B @ np.linalg.lstsq(B, G, rcond=None)[0]
        L = np.linalg.cholesky(G.T @ G / n)
        G = np.linalg.solve(L, G.T).T  # sample covariance exactly I
        pos = 0
        if cont_exog:
            idx = [self.exog.index(w) for w in cont_exog]
            R = self.exog_correlation()[np.ix_(idx, idx)]
            Wc = G[:, : len(cont_exog)] @ np.linalg.cholesky(R).T
            for j, w in enumerate(cont_exog):
                std[w] = Wc[:, j]
            pos = len(cont_exog)
        for z in cont_z:
            std[z] = G[:, pos]
            pos += 1
        V, e = G[:, pos: pos + k], G[:, pos + k]
        cols: dict[str, np.ndarray] = {}
        for v in (*self.exog, *self.instruments):
            if v in self.binary:
                cols[v] = std[v] * math.sqrt(self.means[v] * (1 - self.means[v])) + self.means[v]
                cols[v] = np.round(cols[v])
            else:
                mu, sigma = self.latent[v]
                cols[v] = np.clip(mu + sigma * std[v], *self.bounds[v])
        r = self.endogeneity
        u = V.sum(axis=1) * r + math.sqrt(max(1.0 - k * r * r, 0.0)) * e
        loadings = self.loadings()
        for name in self.endog:
            weights = self.first_stage_weights[name]
            zeta = sum((w * std[z] for z, w in weights.items()), np.zeros(n))
            zeta /= math.sqrt(float(np.mean(zeta**2)))  # unit variance in the sample (binary columns: near 1)
            j = self.endog.index(name)
            a = loadings[name]
            explained = float(a @ self.exog_correlation() @ a) if len(a) else 0.0
            x = sum((a[i] * std[w] for i, w in enumerate(self.exog)), np.zeros(n))
            r2 = self.first_stage_r2[name]
            x = x + math.sqrt((1 - explained) * r2) * zeta + math.sqrt((1 - explained) * (1 - r2)) * V[:, j]
            mu, sigma = self.latent[name]
            cols[name] = np.clip(mu + sigma * x, *self.bounds[name])
        regressors = (*self.exog, *self.endog)
        index = sum((self.coef[name] * cols[name] for name in regressors), np.zeros(n))
        mu_y, sigma_y = self.latent[self.dependent]
        if self.error_sd is None:
            # the latent outcome's SD is sigma_y; the error takes what the regressors leave of it
            left = sigma_y**2 - float(np.var(index))
            if left <= 0:
                raise ValueError(
                    f"the guessed coefficients explain more than the outcome's guessed variance ({sigma_y:.4g}² "
                    f"before clipping); lower coef or raise sds[{self.dependent!r}], or give error_sd."
                )
            sigma_u = math.sqrt(left)
        else:
            sigma_u = self.error_sd
        y = mu_y - float(np.mean(index)) + index + sigma_u * u
        cols[self.dependent] = np.clip(y, *self.bounds[self.dependent])
        return pd.DataFrame({name: cols[name] for name in self.variables})


def _split_names(text: str, label: str) -> list[str]:
    terms = [t.strip() for t in text.split("+") if t.strip()]
    for t in terms:
        if t not in ("0", "1") and not _NAME.match(t):
            raise ValueError(
                f"formula: the {label} term {t!r} is not a plain column name; plan_se draws the formula's raw "
                "variables, so write transformed variables (logs, powers, categories) as their own columns with "
                "their own guesses, e.g. 'logwage' for np.log(wage)."
            )
    return terms


def _parse_formula(formula: str) -> tuple[str, list[str], bool, list[str], list[str]]:
    from .design import _split_formula

    if not isinstance(formula, str):
        raise TypeError(f"formula must be a string such as 'y ~ 1 + w + [x ~ z]', got {type(formula).__name__}.")
    parts = _split_formula(formula)
    dep = _split_names(parts.dependent, "dependent")
    if len(dep) != 1 or dep[0] in ("0", "1"):
        raise ValueError(f"formula: the dependent variable must be one column name, got {parts.dependent!r}.")
    exog_terms = _split_names(parts.exog, "exogenous")
    intercept = "1" in exog_terms and "0" not in exog_terms
    exog = [t for t in exog_terms if t not in ("0", "1")]
    endog = _split_names(parts.endog, "endogenous")
    instruments = _split_names(parts.instruments, "instrument")
    if any(t in ("0", "1") for t in (*endog, *instruments)):
        raise ValueError("formula: the [endog ~ instruments] block must name columns, not 0 or 1.")
    names = [dep[0], *exog, *endog, *instruments]
    dup = sorted({v for v in names if names.count(v) > 1})
    if dup:
        raise ValueError(f"formula: {dup} appear(s) in more than one role; each variable has one role in a plan.")
    if len(instruments) < len(endog):
        raise ValueError(f"formula: {len(instruments)} instrument(s) for {len(endog)} endogenous regressor(s); "
                         "the model is not identified.")
    return dep[0], exog, intercept, endog, instruments


def _mapping(value, name: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping {{column: value}}, got {type(value).__name__}.")
    return dict(value)


def _check_keys(values: dict, allowed, name: str) -> None:
    unknown = sorted(set(values) - set(allowed), key=str)
    if unknown:
        raise ValueError(f"{name} names {unknown}, which are not variables of the formula ({sorted(allowed)}).")


def _per_endog(value, endog: list[str], name: str) -> dict | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        values = dict(value)
        _check_keys(values, endog, name)
        missing = [e for e in endog if e not in values]
        if missing:
            raise ValueError(f"{name} gives no value for the endogenous regressor(s) {missing}.")
    else:
        values = {e: value for e in endog}
    return {e: as_real(v, name, "a number or a mapping {endogenous regressor: number}") for e, v in values.items()}


def synthetic_population(
    formula: str,
    *,
    bounds: Mapping[str, tuple[float, float]],
    n: int | None = None,
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
) -> SyntheticPopulation:
    """Build the synthetic population of a plan from public inputs (see :func:`plan_se` for the arguments).

    ``n`` is needed only to turn a first-stage F into a partial R².

    Returns
    -------
    SyntheticPopulation
    """
    dep, exog, intercept, endog, instruments = _parse_formula(formula)
    variables = [dep, *exog, *endog, *instruments]
    if not isinstance(bounds, Mapping):
        raise TypeError(f"bounds must be a mapping {{column: (lower, upper)}} (public bounds), got {type(bounds).__name__}.")
    missing = [v for v in variables if v not in bounds]
    if missing:
        raise ValueError(f"bounds gives no public bounds for {missing}; every variable of the formula needs them "
                         "(a codebook mapping with extra entries is fine).")
    bnd: dict[str, tuple[float, float]] = {}
    for v in variables:
        try:
            lo, hi = bounds[v]
        except (TypeError, ValueError):
            raise TypeError(f"bounds[{v!r}] must be a pair (lower, upper), got {bounds[v]!r}.") from None
        lo, hi = as_real(lo, f"bounds[{v!r}][0]", "a number"), as_real(hi, f"bounds[{v!r}][1]", "a number")
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"bounds[{v!r}] must be finite with lower < upper, got ({lo!r}, {hi!r}).")
        bnd[v] = (lo, hi)
    means_in, sds_in, binary_in, coef_in = (_mapping(means, "means"), _mapping(sds, "sds"),
                                            _mapping(binary, "binary"), _mapping(coef, "coef"))
    for values, name in ((means_in, "means"), (sds_in, "sds"), (binary_in, "binary")):
        _check_keys(values, variables, name)
    _check_keys(coef_in, [*exog, *endog], "coef (regressors only; the intercept follows from means)")
    is_binary = {v: bnd[v] == (0.0, 1.0) for v in variables}
    for v, flag in binary_in.items():
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"binary[{v!r}] must be True or False, got {flag!r}.")
        if flag and bnd[v] != (0.0, 1.0):
            raise ValueError(f"binary[{v!r}] = True needs bounds (0, 1), got {bnd[v]}.")
        is_binary[v] = bool(flag)
    for v in (dep, *endog):
        if is_binary[v]:
            if v in binary_in:
                raise ValueError(f"binary[{v!r}]: only exogenous regressors and instruments can be drawn as 0/1 "
                                 "in a plan; a binary outcome or endogenous regressor is planned as a continuous "
                                 "one (leave it out of binary).")
            is_binary[v] = False
    mean_of, sd_of, latent = {}, {}, {}
    for v in variables:
        lo, hi = bnd[v]
        m = as_real(means_in.get(v, 0.5 if is_binary[v] else (lo + hi) / 2), f"means[{v!r}]", "a number")
        if not lo < m < hi:
            raise ValueError(f"means[{v!r}] = {m:g} must lie strictly inside its bounds ({lo:g}, {hi:g}).")
        if is_binary[v]:
            if v in sds_in:
                raise ValueError(f"sds[{v!r}]: a binary variable's SD follows from its mean (sqrt(m(1 - m))); "
                                 "give its mean (the share of ones) only.")
            s = math.sqrt(m * (1 - m))
        else:
            s = as_real(sds_in.get(v, (hi - lo) / 6.0), f"sds[{v!r}]", "a positive number")
            if not (math.isfinite(s) and s > 0):
                raise ValueError(f"sds[{v!r}] must be a finite number > 0, got {s!r}.")
            latent[v] = _latent_normal(v, m, s, lo, hi)
        mean_of[v], sd_of[v] = m, s
    r2 = _per_endog(first_stage_r2, endog, "first_stage_r2")
    f = _per_endog(first_stage_f, endog, "first_stage_f")
    if (r2 is None) == (f is None):
        raise ValueError("give exactly one of first_stage_r2 (the instruments' partial R² for the endogenous "
                         "regressor(s)) and first_stage_f (their first-stage F at this n): the instruments' "
                         "strength is the guess a plan depends on most.")
    if f is not None:
        if n is None:
            raise ValueError("first_stage_f needs n (the F grows with the sample size).")
        k = len(instruments)
        dof = n - k - len(exog) - int(intercept)
        if dof < 1:
            raise ValueError(f"n = {n} leaves no residual degrees of freedom for the first stage.")
        for e, value in f.items():
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"first_stage_f for {e!r} must be a finite number > 0, got {value!r}.")
        r2 = {e: k * value / (k * value + dof) for e, value in f.items()}
    for e, value in r2.items():
        if not (math.isfinite(value) and 0 < value < 1):
            raise ValueError(f"first_stage_r2 for {e!r} must lie strictly between 0 and 1, got {value!r}.")
    endogeneity = as_real(endogeneity, "endogeneity", "a number in (-1, 1)")
    if not abs(endogeneity) < 1 / math.sqrt(len(endog)):
        raise ValueError(f"endogeneity must lie strictly between ±{1 / math.sqrt(len(endog)):.4g} (the error's "
                         f"correlation with each of {len(endog)} first-stage errors), got {endogeneity!r}.")
    if error_sd is not None:
        if dep in sds_in:
            raise ValueError(f"give error_sd or sds[{dep!r}], not both: with error_sd the outcome's SD follows "
                             "from the coefficients and the error.")
        error_sd = as_real(error_sd, "error_sd", "a positive number")
        if not (math.isfinite(error_sd) and error_sd > 0):
            raise ValueError(f"error_sd must be a finite number > 0, got {error_sd!r}.")
    coef_of = {v: as_real(coef_in.get(v, 0.0), f"coef[{v!r}]", "a number") for v in (*exog, *endog)}
    corr_of = _check_corr(corr, exog, endog, is_binary)
    weights_of = _first_stage_weights(first_stage_weights, endog, instruments)
    return SyntheticPopulation(
        formula=formula, dependent=dep, exog=tuple(exog), endog=tuple(endog), instruments=tuple(instruments),
        intercept=intercept, bounds=bnd, means=mean_of, sds=sd_of,
        binary=frozenset(v for v in variables if is_binary[v]), first_stage_r2=r2, error_sd=error_sd,
        endogeneity=endogeneity, coef=coef_of, corr=corr_of, latent=latent, first_stage_weights=weights_of,
    )


def _first_stage_weights(weights, endog: list[str], instruments: list[str]) -> dict[str, dict[str, float]]:
    """Unit-length instrument weights per endogenous regressor: the guess, or instrument k to regressor k mod p."""
    given = _mapping(weights, "first_stage_weights")
    _check_keys(given, endog, "first_stage_weights (endogenous regressors)")
    out = {}
    for j, e in enumerate(endog):
        if e in given:
            w = _mapping(given[e], f"first_stage_weights[{e!r}]")
            _check_keys(w, instruments, f"first_stage_weights[{e!r}] (instruments)")
            w = {z: as_real(v, f"first_stage_weights[{e!r}][{z!r}]", "a number") for z, v in w.items()}
            if not all(math.isfinite(v) for v in w.values()):
                raise ValueError(f"first_stage_weights[{e!r}] must hold finite numbers, got {w}.")
        else:
            w = {z: 1.0 for i, z in enumerate(instruments) if i % len(endog) == j}
        length = math.sqrt(sum(v * v for v in w.values()))
        if length == 0:
            raise ValueError(f"first_stage_weights[{e!r}] gives every instrument weight 0: the first stage needs "
                             "at least one.")
        out[e] = {z: v / length for z, v in w.items() if v != 0}
    vectors = np.array([[out[e].get(z, 0.0) for z in instruments] for e in endog])
    if np.linalg.matrix_rank(vectors, tol=1e-9) < len(endog):
        raise ValueError("first_stage_weights: the endogenous regressors' instrument weights are linearly "
                         "dependent, so the model would not be identified; give each its own direction.")
    return out


def _check_corr(corr, exog: list[str], endog: list[str], is_binary: dict) -> dict:
    values = _mapping(corr, "corr")
    out: dict[tuple[str, str], float] = {}
    for key, r in values.items():
        if not (isinstance(key, tuple) and len(key) == 2 and all(isinstance(k, str) for k in key)):
            raise TypeError(f"corr keys must be pairs of column names such as ('educ', 'kids'), got {key!r}.")
        a, b = key
        if a in endog and b in exog:
            a, b = b, a
        if not (a in exog and (b in exog or b in endog)) or a == b:
            raise ValueError(f"corr[{key!r}]: correlations are guessed between two exogenous regressors or an "
                             f"exogenous and an endogenous one (exogenous: {exog}, endogenous: {endog}); "
                             "instruments are independent of the regressors' exogenous part in a plan.")
        if b in exog and (is_binary[a] or is_binary[b]):
            raise ValueError(f"corr[{key!r}]: correlations between exogenous regressors need both continuous.")
        if (a, b) in out or (b, a) in out:
            raise ValueError(f"corr gives the pair {key!r} twice.")
        r = as_real(r, f"corr[{key!r}]", "a number in (-1, 1)")
        if not -1 < r < 1:
            raise ValueError(f"corr[{key!r}] must lie strictly between -1 and 1, got {r!r}.")
        out[(a, b)] = r
    k = len(exog)
    R = np.eye(k)
    for (a, b), r in out.items():
        if b in exog:
            i, j = exog.index(a), exog.index(b)
            R[i, j] = R[j, i] = r
    if k and np.linalg.eigvalsh(R).min() <= 1e-9:
        raise ValueError("corr: the exogenous regressors' correlations do not form a positive definite matrix.")
    for e in endog:
        r = np.array([out.get((w, e), 0.0) for w in exog])
        if k and float(r @ np.linalg.solve(R, r)) >= 1 - 1e-6:
            raise ValueError(f"corr: the exogenous regressors would explain all of {e!r} (its correlations with "
                             "them are too large jointly); the instruments need some of its variance.")
    return out


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
        The total zCDP budget planned for (``fit(rho=...)``); the smallest one meeting the target when
        a target was given (``inf`` when none does: the sampling SE alone is above it).
    n : int
    formula : str
    alpha : float
        Level of the intervals whose width :attr:`width` reports.
    target : pandas.Series or None
        The target SE of each targeted coefficient (a target width is converted to an SE).
    attainable : bool
        Whether the target can be met at any budget (True without a target).
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
        """One row per coefficient: se, se_sampling, se_noise, noise_share, width (and target)."""
        frame = pd.DataFrame({"se": self.se, "se_sampling": self.se_sampling, "se_noise": self.se_noise,
                              "noise_share": self.noise_share, "width": self.width})
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
                lines.append(f"  target SE : {tgt} -> smallest total rho {_fmt(self.rho)}")
            else:
                lines.append(f"  target SE : {tgt} -> NOT attainable at n = {self.n:,}: the sampling SE alone "
                             "is above it (a larger n is needed)")
        table = self.to_frame().to_string(float_format=_fmt)
        lines += ["", table, ""]
        if self.search is not None:
            lines += ["  budgets evaluated:", self.search.to_string(index=False, float_format=_fmt), ""]
        lines.append(f"  cost: {self.fits} fit(s) on {self.draws} synthetic data set(s), {self.seconds:.1f} s; "
                     f"seed {self.seed!r}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        se = ", ".join(f"{k}={_fmt(v)}" for k, v in self.se.items())
        extra = "" if self.target is None else f", attainable={self.attainable}"
        return f"SEPlan(n={self.n}, rho={_fmt(self.rho)}, se=[{se}]{extra})"


def _check_alpha(alpha) -> float:
    alpha = as_real(alpha, "alpha", "a number in (0, 1)")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie strictly between 0 and 1 (e.g. 0.05 for 95% intervals), got {alpha!r}.")
    return alpha


class _Evaluator:
    """Planned variances at a budget on fixed synthetic data sets and fit seeds (common random numbers)."""

    def __init__(self, population: SyntheticPopulation, n: int, draws: int, seed, fit_options: dict) -> None:
        ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
        children = ss.spawn(2 * draws)
        self.population, self.n, self.fit_options = population, n, fit_options
        self.data = [population.draw(n, seed=np.random.default_rng(c)) for c in children[:draws]]
        self.fit_seeds = [int(np.random.default_rng(c).integers(2**63 - 1)) for c in children[draws:]]
        self.sampling: np.ndarray | None = None
        self.names: list[str] | None = None
        self.fits = 0
        self.notes: dict[float, list[str]] = {}

    def variances(self, rho: float) -> tuple[np.ndarray, np.ndarray]:
        """(sampling variance, noise variance) per coefficient, averaged over the draws."""
        from .model import DPIV2SLS

        noise, sampling, names = [], [], None
        for data, fit_seed in zip(self.data, self.fit_seeds):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                res = DPIV2SLS.from_formula(self.population.formula, data).fit(
                    rho=rho, bounds=self.population.bounds, seed=fit_seed, **self.fit_options)
                inference = res.inference
                cov_noise = np.diag(inference.cov_noise)
                if self.sampling is None:
                    sampling.append(np.diag(np.asarray(res.benchmark.cov, dtype=float)))
            self.fits += 1
            names = list(res.params.index)
            notes = self.notes.setdefault(rho, [])
            for w in caught:
                text = f"{w.category.__name__}: {str(w.message).split('. ')[0]}."
                if text not in notes:
                    notes.append(text)
            noise.append(cov_noise)
        if self.sampling is None:
            self.sampling = np.mean(sampling, axis=0)
            self.names = names
        return self.sampling, np.mean(noise, axis=0)


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
    smallest total budget that meets the target (as statsmodels' ``solve_power`` solves for the one
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
    means, sds : mapping, optional
        Guessed mean and SD of each variable, as a public summary table would give them. Defaults: the
        midpoint of the bounds and a sixth of their range (the variable fills its bounds at ±3 SD); a binary
        variable's mean is its share of ones (default 0.5) and its SD follows from it. Continuous variables
        are drawn as normals clipped to their bounds with exactly these clipped mean and SD.
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
    (``res.inference.cov_noise``). For a target the smallest ρ is found by a safeguarded secant search
    on log V_noise against log ρ (the Gaussian mechanisms make V_noise roughly proportional to 1/ρ): a
    first fit at ρ = 1, then steps to the ρ where the local power law meets the target, kept inside the
    bracket of budgets known to miss and to meet it (geometric bisection when a step falls outside), until
    the noise variance at the smallest budget meeting the targets uses at least (1 − ``rtol``)² of the room
    the target leaves it. Every step is a fit on the same synthetic data
    with the same seeds, so the returned budget's planned SE is a fit's, not an interpolation.

    Examples
    --------
    >>> from dpivreg import plan_se
    >>> from dpivreg.datasets import LABSUP_BOUNDS
    >>> p = plan_se("weeks ~ 1 + [kids ~ samesex]", n=31857, rho=2.6, bounds=LABSUP_BOUNDS,
    ...             means={"weeks": 22.7, "kids": 2.75, "samesex": 0.5},
    ...             sds={"weeks": 22.6, "kids": 0.98}, first_stage_r2=0.0013, seed=1)  # doctest: +SKIP
    >>> p.se["kids"]  # doctest: +SKIP
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
    ev = _Evaluator(population, n, draws, seed, options)

    search = None
    attainable = True
    if rho is not None:
        v_samp, v_noise = ev.variances(rho)
        names = ev.names
    else:
        v_samp, v_noise = ev.variances(1.0)
        names = ev.names
        idx = [names.index(k) for k in target.index]
        t2 = target.to_numpy() ** 2
        evaluated: dict[float, np.ndarray] = {1.0: v_noise}
        if np.any(v_samp[idx] >= t2):
            attainable, rho = False, math.inf
            v_noise = np.zeros_like(v_noise)
        else:
            rho, v_noise = _solve_rho(ev, v_samp, idx, t2, evaluated, rtol)
            if not math.isfinite(rho):
                attainable = False
        rows = []
        for r in sorted(evaluated):
            se = np.sqrt(v_samp[idx] + evaluated[r][idx])
            rows.append({"rho": r, **{k: s for k, s in zip(target.index, se)},
                         "meets": bool(np.all(se <= target.to_numpy()))})
        search = pd.DataFrame(rows)
    notes = [f"at rho = {_fmt(rho)} the planning fits raised {text}" for text in ev.notes.get(rho, [])]
    if not attainable:
        notes.append("the target SE is below the sampling SE (or not reached within rho <= "
                     f"{RHO_SEARCH[1]:g}): no budget attains it at this n.")
    elif has_target and rho <= RHO_SEARCH[0] * (1.0 + 1e-9):
        notes.append(f"the target is met already at the search's smallest budget, rho = {RHO_SEARCH[0]:g}: the "
                     "smallest rho that meets it may be smaller still.")
    index = pd.Index(names)
    return SEPlan(
        se=pd.Series(np.sqrt(v_samp + v_noise), index=index, name="se"),
        se_sampling=pd.Series(np.sqrt(v_samp), index=index, name="se_sampling"),
        se_noise=pd.Series(np.sqrt(v_noise), index=index, name="se_noise"),
        rho=float(rho), n=n, formula=formula, alpha=alpha, target=target, attainable=attainable, search=search,
        population=population, draws=draws, fits=ev.fits, seconds=time.perf_counter() - started, seed=seed,
        notes=tuple(notes),
    )


def _solve_rho(ev: _Evaluator, v_samp: np.ndarray, idx: list[int], t2: np.ndarray, evaluated: dict,
               rtol: float, max_steps: int = 12) -> tuple[float, np.ndarray]:
    """Smallest total ρ whose planned SE meets every target (safeguarded secant in log ρ).

    ``evaluated`` holds ``{rho: noise variances}`` (the fit at ρ = 1 on entry) and receives every step.
    Returns the smallest evaluated ρ that meets the targets and its noise variances (ρ = inf if none does
    within :data:`RHO_SEARCH`).
    """
    room = t2 - v_samp[idx]  # the noise variance each target allows (> 0)

    def g(v_noise: np.ndarray) -> float:
        """Largest log(noise variance / allowed noise variance) over the targets: <= 0 meets them all."""
        return float(np.max(np.log(np.maximum(v_noise[idx], 1e-300) / room)))

    def close(v_noise: np.ndarray) -> bool:
        """The binding target's noise variance uses all but a share of about 2·rtol of the room it has.

        (A criterion on the SE itself would stop far above the smallest budget when the sampling SE is
        most of the target: the SE is then nearly flat in ρ.)"""
        return g(v_noise) >= 2.0 * math.log(1 - rtol)

    xs = {math.log(r): g(v) for r, v in evaluated.items()}
    x_min, x_max = math.log(RHO_SEARCH[0]), math.log(RHO_SEARCH[1])
    for _ in range(max_steps):
        meet = [x for x, gx in xs.items() if gx <= 0]
        miss = [x for x, gx in xs.items() if gx > 0]
        hi, lo = (min(meet) if meet else None), (max(miss) if miss else None)
        if hi is not None and (close(evaluated[math.exp(hi)]) or (lo is not None and hi - lo < math.log1p(rtol))):
            break
        if hi is not None and lo is not None:  # regula falsi inside the bracket, bisection if it strays
            x_new = lo - xs[lo] * (hi - lo) / (xs[hi] - xs[lo])
            if not lo + 0.1 * (hi - lo) <= x_new <= hi - 0.1 * (hi - lo):
                x_new = 0.5 * (lo + hi)
        else:  # one side only: a power law through the last two points (slope -1 with one point)
            last = sorted(xs)[:2] if lo is None else sorted(xs)[-2:]
            slope = -1.0
            if len(last) == 2 and last[1] != last[0]:
                slope = (xs[last[1]] - xs[last[0]]) / (last[1] - last[0])
            slope = min(slope, -0.25) if math.isfinite(slope) else -1.0
            x0 = lo if hi is None else hi
            x_new = x0 - xs[x0] / slope
            step = math.log(1.25), math.log(100.0)
            if hi is None:
                x_new = min(max(x_new, x0 + step[0]), x0 + step[1])
                if x0 >= x_max:
                    return math.inf, evaluated[math.exp(x0)]
            else:
                x_new = max(min(x_new, x0 - step[0]), x0 - step[1])
                if x0 <= x_min:
                    break
        x_new = min(max(x_new, x_min), x_max)
        if any(abs(x_new - x) < 1e-9 for x in xs):
            break
        r_new = math.exp(x_new)
        _, evaluated[r_new] = ev.variances(r_new)
        xs[x_new] = g(evaluated[r_new])
    meet = [x for x, gx in xs.items() if gx <= 0]
    if not meet:
        return math.inf, evaluated[max(evaluated)]
    r = math.exp(min(meet))
    return r, evaluated[r]
