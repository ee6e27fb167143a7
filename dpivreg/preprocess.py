"""The working scale: public bounds, clipping data to them, column scales and the exact back-transform.

DP-2S-GD's clipping thresholds and step sizes are stated for data of unit scale (the paper
assumes E[zzᵀ] = I). dpivreg therefore runs the engine on *rescaled* columns and maps the
estimate back, so that the estimand is unchanged:

* every column c is divided by a scale s_c (never shifted: a shift would change the
  estimand of a model without an intercept);
* s_c = max(|lo_c|, |hi_c|) from the public ``bounds`` (so the working column lies in
  [−1, 1]); data outside the bounds is clipped to them first, as diffprivlib does;
* a column without bounds is scaled by its largest absolute value in the data, which
  reads the private data: the fit raises a :class:`~dpivreg.PrivacyLeakWarning` naming it;
* constant columns (the intercept) are public design choices and are not rescaled.

If x_j ↦ x_j/s_j and y ↦ y/s_y, the working-scale coefficients map back exactly as
β_j = β̃_j·s_y/s_j, and the first stage as Θ_jk = Θ̃_jk·s_{x_k}/s_{z_j}.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

from .design import IVDesign

__all__ = ["WorkingScale", "validate_bounds", "working_scale"]

Bounds = Mapping[str, tuple[float, float]]


@dataclass(frozen=True)
class WorkingScale:
    """Scales of every design column and the working-scale arrays fed to the engine.

    Attributes
    ----------
    scales : pandas.Series
        s_c for every design column (dependent, exogenous, endogenous, instruments).
    source : pandas.Series
        Where each scale came from: ``"bounds"`` (public), ``"data"`` (a leak) or
        ``"constant"`` (a constant column, not rescaled).
    clipped_values : pandas.Series
        NON-PRIVATE diagnostic: number of values clipped to the bounds, per column.
    Z, X, Y : ndarray
        Working-scale instruments [exog, instruments], regressors [exog, endog], outcome.
    n_exog : int
        Number of exogenous columns leading Z and X.
    """

    scales: pd.Series
    source: pd.Series
    clipped_values: pd.Series
    Z: np.ndarray
    X: np.ndarray
    Y: np.ndarray
    n_exog: int

    @property
    def leaked_columns(self) -> list[str]:
        """Columns whose scale was read from the data."""
        return list(self.source.index[self.source == "data"])

    def beta_to_original(self, beta: np.ndarray, design: IVDesign) -> np.ndarray:
        """Map working-scale β̃ (…, p) to original units: β_j = β̃_j·s_y/s_{x_j}."""
        s_y = self.scales[design.dependent_name]
        s_x = self.scales[design.regressor_names].to_numpy()
        return np.asarray(beta) * s_y / s_x

    def theta_to_original(self, theta: np.ndarray, design: IVDesign) -> np.ndarray:
        """Map a working-scale endogenous first stage Θ̃ (…, q, p_endog) to original units."""
        s_z = self.scales[design.z_names].to_numpy()
        s_endog = self.scales[design.endog_names].to_numpy()
        return np.asarray(theta) * s_endog[None, :] / s_z[:, None]


def validate_bounds(bounds: Bounds | None, design: IVDesign) -> dict[str, tuple[float, float]]:
    """Check ``bounds`` against the design's columns and return them as float pairs.

    Raises
    ------
    TypeError
        ``bounds`` is not a mapping, or a value is not a pair of numbers.
    ValueError
        An unknown column, a non-finite bound, or lo >= hi.
    """
    if bounds is None:
        return {}
    if not isinstance(bounds, Mapping):
        raise TypeError(
            'bounds must be a dict mapping design column names to (lower, upper) pairs, e.g. '
            f'{{"weeks": (0, 52)}}; got {type(bounds).__name__}.'
        )
    known = _all_columns(design)
    checked: dict[str, tuple[float, float]] = {}
    for name, pair in bounds.items():
        if name not in known:
            raise ValueError(
                f"bounds were given for {name!r}, which is not a column of the design. "
                f"Design columns: {known}."
            )
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise TypeError(f"bounds[{name!r}] must be a (lower, upper) pair of numbers, got {pair!r}.")
        lo, hi = pair
        for value in (lo, hi):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"bounds[{name!r}] must be a (lower, upper) pair of numbers, got {pair!r}.")
        lo, hi = float(lo), float(hi)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"bounds[{name!r}] must be finite, got {pair!r}.")
        if not lo < hi:
            raise ValueError(f"bounds[{name!r}] must satisfy lower < upper, got {pair!r}.")
        checked[name] = (lo, hi)
    return checked


def _all_columns(design: IVDesign) -> list[str]:
    return [design.dependent_name, *design.exog_names, *design.endog_names, *design.instrument_names]


def _is_constant(column: pd.Series) -> bool:
    values = column.to_numpy()
    return bool(values.size) and bool(np.all(values == values[0])) and values[0] != 0


def working_scale(design: IVDesign, bounds: Bounds | None) -> WorkingScale:
    """Clip every column to its bounds, compute its scale and build the engine's arrays.

    Parameters
    ----------
    design : IVDesign
        The model's design.
    bounds : dict, optional
        Public (lower, upper) bounds by design column name.

    Returns
    -------
    WorkingScale
    """
    bounds = validate_bounds(bounds, design)
    frame = pd.concat([design.dependent, design.exog, design.endog, design.instruments], axis=1)
    scales, source, clipped = {}, {}, {}
    columns = {}
    for name in _all_columns(design):
        values = frame[name].to_numpy(dtype=np.float64)
        if name in bounds:
            lo, hi = bounds[name]
            clipped[name] = int(np.count_nonzero((values < lo) | (values > hi)))
            values = np.clip(values, lo, hi)
            scales[name], source[name] = max(abs(lo), abs(hi)), "bounds"
        elif _is_constant(frame[name]) and name in design.exog_names:
            clipped[name] = 0
            scales[name], source[name] = 1.0, "constant"
        else:
            clipped[name] = 0
            largest = float(np.max(np.abs(values))) if values.size else 0.0
            scales[name], source[name] = (largest if largest > 0 else 1.0), "data"
        columns[name] = values / scales[name]

    def stack(names: list[str]) -> np.ndarray:
        if not names:
            return np.empty((design.nobs, 0))
        return np.column_stack([columns[c] for c in names])

    return WorkingScale(
        scales=pd.Series(scales, name="scale", dtype=float),
        source=pd.Series(source, name="source", dtype=object),
        clipped_values=pd.Series(clipped, name="clipped values (non-private)", dtype=np.int64),
        Z=stack(design.z_names),
        X=stack(design.regressor_names),
        Y=columns[design.dependent_name],
        n_exog=len(design.exog_names),
    )
