"""dpivreg: instrumental-variable regression under differential privacy.

The estimator is the noisy two-stage gradient descent (DP-2S-GD) of Liang, Balasubramanian
& Lai; see :func:`dp_2s_gd` for the engine and :class:`PrivacyBudget` for the accounting. The package is laid out
by pipeline stage (the documentation's "Architecture" page): :mod:`dpivreg.data`, :mod:`dpivreg.estimation`,
:mod:`dpivreg.inference`, :mod:`dpivreg.reporting` and :mod:`dpivreg.planning` above :mod:`dpivreg.privacy` and
:mod:`dpivreg.compute`, with :class:`DPIV2SLS` (:mod:`dpivreg.model`) wiring them.
"""

from dpivreg import _aliases
from dpivreg._version import __version__
from dpivreg.errors import (
    DATA_CHECK_NOTE,
    ConvergenceWarning,
    DataCheckWarning,
    DivergenceError,
    DroppedRowsWarning,
    EncodedMissingWarning,
    InferenceOverflowError,
    InferenceUnavailableError,
    LongRunWarning,
    PlanningWarning,
    PrivacyLeakWarning,
    TConditionWarning,
)
from dpivreg.estimation.engine import DP2SGDPath, dp_2s_gd
from dpivreg.model import DPIV2SLS
from dpivreg.planning.se_plan import SEPlan, plan_se
from dpivreg.planning.theorem_plan import plan, smallest_n, smallest_rho
from dpivreg.privacy.accounting import PrivacyBudget, Release, delta_from_rho, epsilon_from_rho, rho_from_epsilon
from dpivreg.reporting.comparison import compare
from dpivreg.reporting.release import FitRelease, load_release
from dpivreg.reporting.results import DPIVResults

_aliases.install()

__all__ = [
    "DPIV2SLS",
    "ConvergenceWarning",
    "DATA_CHECK_NOTE",
    "DP2SGDPath",
    "DPIVResults",
    "DivergenceError",
    "DataCheckWarning",
    "PlanningWarning",
    "DroppedRowsWarning",
    "EncodedMissingWarning",
    "FitRelease",
    "InferenceOverflowError",
    "InferenceUnavailableError",
    "LongRunWarning",
    "TConditionWarning",
    "PrivacyBudget",
    "PrivacyLeakWarning",
    "Release",
    "SEPlan",
    "__version__",
    "compare",
    "delta_from_rho",
    "dp_2s_gd",
    "epsilon_from_rho",
    "rho_from_epsilon",
    "load_release",
    "plan",
    "plan_se",
    "smallest_n",
    "smallest_rho",
]


def __getattr__(name: str):
    """The deprecated flat module paths as attributes (``dpivreg.theory`` after ``import dpivreg``): see
    :mod:`dpivreg._aliases`."""
    return _aliases.moved_attribute(name)
