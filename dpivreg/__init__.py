"""dpivreg: instrumental-variable regression under differential privacy.

The estimator is the noisy two-stage gradient descent (DP-2S-GD) of Liang, Balasubramanian
& Lai; see :func:`dp_2s_gd` for the engine and :class:`PrivacyBudget` for the accounting.
"""

from .comparison import compare
from .engine import (
    ConvergenceWarning,
    DivergenceError,
    DP2SGDPath,
    LongRunWarning,
    TConditionWarning,
    dp_2s_gd,
)
from .model import DPIV2SLS
from .planning import SEPlan, plan_se
from .privacy import (
    PrivacyBudget,
    PrivacyLeakWarning,
    Release,
    delta_from_rho,
    epsilon_from_rho,
)
from .release import FitRelease, load_release
from .results import DPIVResults, InferenceUnavailableError
from .theory import plan, smallest_n, smallest_rho

__version__ = "0.1.0"

__all__ = [
    "DPIV2SLS",
    "ConvergenceWarning",
    "DP2SGDPath",
    "DPIVResults",
    "DivergenceError",
    "FitRelease",
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
    "load_release",
    "plan",
    "plan_se",
    "smallest_n",
    "smallest_rho",
]
