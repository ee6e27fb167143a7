"""Argument validation: one definition per kind of argument, one message style.

Every public entry point checks its arguments here before touching the data: ``TypeError`` for the wrong
kind of value, ``ValueError`` for a value outside its range, each naming the argument and what to pass.
The limits below are public constants (they depend on no data):

* :data:`MAX_T` iterations: the released path stores T + 1 first-stage and second-stage iterates and the
  schedule T entries; beyond it a fit would run for days or exhaust memory before its first step.
* :data:`MAX_TAU`: the Theorem's bounds hold with probability 1 − c·e^(−τ); e^(−τ) underflows float64
  near τ = 745, so larger τ states nothing more.
* :data:`MIN_RHO`, :data:`MAX_RHO`: a zCDP budget outside [1e-100, 1e100] has a noise variance beyond
  float64's range next to the sensitivities (the accounting could not be exact); ``inf`` says "no noise"
  explicitly.
* :data:`MIN_CLIP`, :data:`MAX_CLIP`: clipping thresholds act on the working scale, where a row's gradient is
  of order 1; a threshold below 1e-8 clips every gradient to (numerically) nothing, one above 1e100 makes the
  noise (proportional to it) overflow.

No module of the package is imported here, so every module can use it.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["MAX_T", "MAX_TAU", "MAX_RHO", "MIN_RHO", "MIN_CLIP", "MAX_CLIP", "MIN_RAW_CLIP", "as_real", "check_rho",
           "check_delta", "check_spent_rho", "check_epsilon", "check_positive", "check_T", "check_tau", "check_count",
           "check_flag", "check_clip", "check_raw_clip"]

#: Largest number of iterations a fit or a plan accepts.
MAX_T: int = 1_000_000
#: Largest confidence parameter τ (e^(−τ) underflows float64 beyond about 745).
MAX_TAU: float = 700.0
#: Largest finite zCDP budget: beyond it the Gaussian noise's variance underflows float64 next to the
#: sensitivities (and ε at any δ is astronomically large anyway); ``inf`` states "no noise" explicitly.
MAX_RHO: float = 1e100
#: Smallest zCDP budget: below it the noise (1e50 times the sensitivity and more) overflows the accounting's
#: float64 arithmetic, and nothing of the data survives it anyway.
MIN_RHO: float = 1e-100
#: Smallest clipping threshold on the working scale.
MIN_CLIP: float = 1e-8
#: Largest clipping threshold on the working scale (the noise, proportional to it, must stay within float64).
MAX_CLIP: float = 1e100
#: Smallest clipping threshold the engine and the moment mechanisms accept on the caller's own scale
#: (:func:`dpivreg.dp_2s_gd` takes raw arrays): clipping is exact in float64 for thresholds from 2^-900 on
#: (:func:`dpivreg.compute.kernels.group_clips`), and the sensitivity √2·B²/n of a ball-clipped moment release must stay
#: a normal float (at B = 1e-175, B² is 0 and the release had no noise). The largest is :data:`MAX_CLIP`: n rows
#: of norm near 1e308 sum to inf without any row's norm overflowing.
MIN_RAW_CLIP: float = 1e-100


def as_real(value: object, name: str, expected: str) -> float:
    """``value`` as a float; TypeError (naming ``name``) for bools and anything that is not a real number.

    Integers too large for a float become ``±inf`` (they lie beyond every float anyway).
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}.")
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def check_rho(value: float, name: str) -> float:
    """A zCDP budget: a number > 0, ``inf`` allowed (no noise: not private)."""
    value = as_real(value, name, "a positive number (a zCDP budget)")
    if math.isnan(value) or value <= 0:
        raise ValueError(
            f"{name} must be > 0 (a zCDP budget; use numpy.inf for no noise, which is not private), "
            f"got {value!r}."
        )
    if value < MIN_RHO:
        raise ValueError(f"{name} = {value:g} is below the smallest budget {MIN_RHO:g}: its noise would overflow "
                         "float64 arithmetic and leave nothing of the data. Pass a larger budget.")
    if math.isfinite(value) and value > MAX_RHO:
        raise ValueError(f"{name} = {value:g} is beyond the largest finite budget {MAX_RHO:g} (its noise would "
                         "underflow float64, and it protects nothing); use numpy.inf for no noise, which is not "
                         "private.")
    return value


def check_delta(delta: float, name: str = "delta") -> float:
    """δ of (ε, δ)-DP: 0 < δ < 1."""
    delta = as_real(delta, name, "a number in (0, 1)")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"{name} must lie strictly between 0 and 1 (e.g. 1e-5 or 1/n²), got {delta!r}.")
    return delta


def check_spent_rho(rho: float) -> float:
    """A zCDP budget *spent* (argument of the conversions): a real number >= 0, ``inf`` allowed."""
    rho = as_real(rho, "rho", "a real number >= 0 (the zCDP budget spent)")
    if math.isnan(rho) or rho < 0:
        raise ValueError(f"rho must be >= 0 (the zCDP budget spent; inf for a non-private fit), got {rho!r}.")
    return rho


def check_epsilon(epsilon: float) -> float:
    """An ε of (ε, δ)-DP: a real number >= 0, ``inf`` allowed."""
    epsilon = as_real(epsilon, "epsilon", "a real number >= 0")
    if math.isnan(epsilon) or epsilon < 0:
        raise ValueError(f"epsilon must be a number >= 0, got {epsilon!r}.")
    return epsilon


def check_positive(value, name: str, *, allow_none: bool = False) -> float | None:
    """A finite number > 0 (``None`` passes through with ``allow_none``)."""
    if value is None and allow_none:
        return None
    value = as_real(value, name, "a positive number")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}.")
    return value


def check_raw_clip(value, name: str, *, allow_none: bool = False) -> float | None:
    """A clipping threshold on the caller's own scale: a finite number in [:data:`MIN_RAW_CLIP`, :data:`MAX_CLIP`]
    (``None``, no clipping, passes through with ``allow_none``)."""
    value = check_positive(value, name, allow_none=allow_none)
    if value is not None and value < MIN_RAW_CLIP:
        raise ValueError(f"{name} = {value:g} is below {MIN_RAW_CLIP:g}: float64 cannot clip exactly at such a "
                         "threshold (the squares of gradients that small underflow). Rescale the data so that a "
                         "row's gradient is nearer 1.")
    if value is not None and value > MAX_CLIP:
        raise ValueError(f"{name} = {value:g} is above {MAX_CLIP:g}: sums of rows clipped at such a threshold can "
                         "overflow float64 (unflagged, so a neighbour could tell), and the noise is proportional to "
                         "it. Rescale the data so that a row's gradient is nearer 1.")
    return value


def check_T(T, name: str = "T") -> int:
    """A number of iterations: an integer in [1, :data:`MAX_T`]."""
    if isinstance(T, (bool, np.bool_)) or not isinstance(T, numbers.Integral):
        raise TypeError(f"{name} must be an integer number of iterations >= 1, got {T!r}.")
    if T < 1:
        raise ValueError(f"{name} must be >= 1, got {T}.")
    if T > MAX_T:
        raise ValueError(f"{name} = {T} iterations is more than dpivreg runs ({MAX_T:,}): the path alone would "
                         "take days and its storage may exceed memory. The default T (3 to 12 from the warm start) "
                         "is what the accuracy studies measured; pass a smaller T.")
    return int(T)


def check_tau(tau, name: str = "tau") -> float:
    """The Theorem's confidence parameter τ: a number in (0, :data:`MAX_TAU`]."""
    tau = as_real(tau, name, "a number > 0 (the Theorem's confidence parameter)")
    if not (math.isfinite(tau) and 0 < tau <= MAX_TAU):
        raise ValueError(f"{name} must be a number in (0, {MAX_TAU:g}] (the Theorem's confidence parameter: its "
                         f"bounds hold with probability 1 - c·exp(-{name}), which underflows beyond that), got "
                         f"{tau!r}.")
    return tau


def check_count(value, name: str, *, minimum: int = 1, what: str = "a positive integer",
                integral_floats: bool = False) -> int:
    """An integer count >= ``minimum``; with ``integral_floats`` a float such as 2.0 is accepted (1.5 never)."""
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real)
            or (not integral_floats and not isinstance(value, numbers.Integral))):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__} {value!r}.")
    if not isinstance(value, numbers.Integral):
        if not (math.isfinite(value) and float(value).is_integer()):
            raise ValueError(f"{name} must be {what} (a whole number), got {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be {what} >= {minimum}, got {value!r}.")
    return int(value)


def check_flag(value, name: str) -> bool:
    """True or False (NumPy booleans accepted)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}.")
    return bool(value)


def check_clip(value, name: str) -> float:
    """A clipping threshold on the working scale: a finite number >= :data:`MIN_CLIP`."""
    value = as_real(value, name, "a clipping threshold (a number > 0)")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite clipping threshold > 0, got {value!r}.")
    if value < MIN_CLIP:
        raise ValueError(f"{name} = {value:g} is below {MIN_CLIP:g}: thresholds act on the working scale, where a "
                         "row's gradient is of order 1, so every gradient would be clipped to nothing and the "
                         "iteration would not move. Use clip='adaptive' (the default) or a threshold near 1.")
    if value > MAX_CLIP:
        raise ValueError(f"{name} = {value:g} is above {MAX_CLIP:g}: thresholds act on the working scale, where a "
                         "row's gradient is of order 1, and the noise, proportional to the threshold, would overflow. "
                         "Use clip='adaptive' (the default) or a threshold near 1.")
    return value
