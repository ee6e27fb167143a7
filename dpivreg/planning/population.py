"""The synthetic population a plan simulates from: built from public inputs only (the formula, n, the public bounds
and a-priori guesses of each variable's mean and SD, the first-stage strength, the structural error SD and the
endogeneity), never from data. :func:`synthetic_population` builds it, :func:`iv_formula` writes the formula of a
generic design; :func:`dpivreg.planning.se_plan.plan_se` draws its data sets from it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import optimize, stats

from dpivreg._validation import as_real, check_count
from dpivreg.data.formula import _split_formula
from dpivreg.privacy.sampler import make_rng

__all__ = ["SyntheticPopulation", "iv_formula", "synthetic_population"]


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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


#: Without a guess, the outcome's SD is this share of the largest SD its bounds allow, √((m − lo)(hi − m)) (a
#: two-point distribution on the bounds): the worst case for every planned SE, which scales with the structural error
#: SD. A normal clipped to the bounds approaches the two-point limit only as its SD grows without bound, so the
#: population takes 99% of it.
WORST_CASE_SHARE = 0.99


def _require_guesses(regressors: list[str], instruments: list[str], is_binary: dict, means: dict, sds: dict) -> None:
    """Refuse a plan without each regressor's and instrument's guessed mean and SD (a binary one's share of ones).

    A coefficient's planned SE scales as 1/SD of its regressor, and the bounds give no lower bound on an SD, so no
    default is safe: a sixth of the range (a variable filling its bounds at ±3 SD) would make the labour-supply plan
    of ``kids`` five times too small (SD 2.0 for its 0.98). An instrument's strength is set by the first-stage R²,
    but how much of its bounds it uses sets how much of it the release's noise drowns: at n = 5,000, ρ = 0.3 and a
    partial R² of 0.05, a continuous instrument with SD 0.1 instead of a sixth of its bounds (−3, 3) gave the
    endogenous coefficient a noise SE 5.1 times larger and intervals flagged unreliable, and a binary one with share
    0.05 instead of 0.5 a noise SE 3.1 times larger. The
    outcome needs no guess: its worst case is bounded (:data:`WORST_CASE_SHARE`).
    """
    missing = [v for v in (*regressors, *instruments) if v not in means or (not is_binary[v] and v not in sds)]
    if missing:
        needs = ", ".join(f"{v!r}: its share of ones in means" if is_binary[v] else f"{v!r}: means and sds"
                          for v in missing)
        raise ValueError(
            f"plan_se needs the guessed mean and SD of every regressor and instrument; missing for {needs}. A "
            "coefficient's planned SE scales as 1/SD of its regressor, an instrument's spread inside its bounds sets "
            "how much of it the privacy noise drowns, and the bounds cannot bound an SD from below, so no default is "
            "safe (a sixth of the range would make the labour-supply plan of 'kids' five times too small). Take them "
            "from a public summary table (a census tabulation, the survey's codebook or a published table); when "
            "unsure, a smaller SD gives a conservative plan. The outcome's SD may be left out: the plan then takes "
            "the largest its bounds allow.")


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
        raise TypeError(f"bounds must be a mapping {{column: (lower, upper)}} (public bounds), "
                        f"got {type(bounds).__name__}.")
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
    if error_sd is not None:
        if dep in sds_in:
            raise ValueError(f"give error_sd or sds[{dep!r}], not both: with error_sd the outcome's SD follows "
                             "from the coefficients and the error.")
        error_sd = as_real(error_sd, "error_sd", "a positive number")
        if not (math.isfinite(error_sd) and error_sd > 0):
            raise ValueError(f"error_sd must be a finite number > 0, got {error_sd!r}.")
    _require_guesses([*exog, *endog], instruments, is_binary, means_in, sds_in)
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
            default = (hi - lo) / 6.0
            if v == dep:
                largest = WORST_CASE_SHARE * math.sqrt((m - lo) * (hi - m))
                # with error_sd the outcome's SD follows from the coefficients and the error when drawn, and its
                # latent normal sets only its centre: take the error's SD for it, not the worst case
                default = largest if error_sd is None else min(error_sd, largest)
            s = as_real(sds_in.get(v, default), f"sds[{v!r}]", "a positive number")
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
