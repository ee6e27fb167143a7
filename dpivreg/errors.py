"""Every warning and error class dpivreg raises, and the note its data checks carry (re-exported from :mod:`dpivreg`).

Warnings say what happened and what to do; errors name the argument or column at fault. Nothing here computes
anything: the module sits at the bottom of the package and imports nothing of it.
"""

from __future__ import annotations

__all__ = ["PrivacyLeakWarning", "DivergenceError", "ConvergenceWarning", "LongRunWarning", "TConditionWarning",
           "DroppedRowsWarning", "EncodedMissingWarning", "DataCheckWarning", "PlanningWarning",
           "InferenceUnavailableError", "InferenceOverflowError", "DATA_CHECK_NOTE"]

#: Appended to the messages of checks that read the data (constant columns, values outside bounds, missing rows):
#: their verdicts are not releases.
DATA_CHECK_NOTE = ("(This check reads the data: its verdict is seen only by the data holder and is not a "
                   "private release; see the docs' 'What may be published'.)")


class PrivacyLeakWarning(UserWarning):
    """A value computed from the private data fed the algorithm outside the privacy accounting.

    Raised (as a warning) whenever bounds, scales, centring, step sizes or clipping
    thresholds are read from the data instead of being public or paid for, and whenever a
    stage runs without noise or clipping so that the fit is not private at all. The
    message names what leaked; results keep the list and the summary prints it.
    """


class DivergenceError(ArithmeticError):
    """An iterate of DP-2S-GD became non-finite: the step size is too large for the data's scale."""


class ConvergenceWarning(UserWarning):
    """The iteration cannot have converged (step sizes too small for T), so the estimate stays near its start."""


class LongRunWarning(UserWarning):
    """A loop of the fit (the iteration, or its simulation for the private inference) will run for minutes."""


class TConditionWarning(UserWarning):
    """T exceeds the T condition of the paper's Theorem 1, T ≲ ρ1·n²/(p(√q+√τ)⁶), on a fit that runs the
    Theorem's Algorithm (``init="zero"`` or ``method="gd"``): the Theorem's error bound does not cover the fit.

    The condition reads only public inputs (n, p, q, ρ1, τ, T), so the warning costs no privacy.
    """


class DataCheckWarning(UserWarning):
    """A check that reads the data found a problem (a constant or duplicate instrument, collinear columns, every
    value of a column outside its bounds) and the fit runs anyway.

    A refusal would make whether a fit runs depend on one row (a 0/1 instrument that is 1 in a single row fits, its
    neighbour with that row replaced would not), so on the private route these checks only warn the data holder; the
    summary then says what the releases themselves can resolve. The warning is NON-PRIVATE: it is seen only by
    the data holder and must not be published. ``fit(check_data=True)`` refuses instead, announced as a
    :class:`PrivacyLeakWarning`.
    """


class PlanningWarning(UserWarning):
    """A plan (:func:`dpivreg.plan_se`) would flatter the private fit: it describes a budget where the fit's intervals
    are unreliable or its releases are often near-singular (the estimate then has heavy tails that no standard error
    describes), or it rests on a default guess that understates some standard errors (the message names it).
    A plan reads no data, so the warning is public."""


class DroppedRowsWarning(UserWarning):
    """Rows with a missing value in any design block were dropped."""


class EncodedMissingWarning(UserWarning):
    """
    A variable used by the formula is missing in rows that the design keeps.

    This happens when the formula turns a missing value into a number, e.g.
    formulaic (and therefore linearmodels) codes a missing category of
    ``C(cat)`` as the reference level.
    """


class InferenceUnavailableError(ValueError):
    """Private standard errors were not computed for this fit (the message says why and what to do)."""


class InferenceOverflowError(OverflowError):
    """The covariance overflowed after the sampling part was released: ``releases`` holds what was drawn,
    which the fit's accountant must record, and ``meats`` the diagnostics' meats released in the same passes (each
    with its own records), which the fit keeps."""

    def __init__(self, message: str, *, releases: tuple = (), meats: tuple = ()) -> None:
        super().__init__(message)
        self.releases = releases
        self.meats = meats
