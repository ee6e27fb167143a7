"""dpivreg: instrumental-variable regression under differential privacy.

The estimator is the noisy two-stage gradient descent (DP-2S-GD) of Liang, Balasubramanian
& Lai; see :func:`dp_2s_gd` for the engine and :class:`PrivacyBudget` for the accounting.
"""

from .engine import ConvergenceWarning, DivergenceError, DP2SGDPath, LongRunWarning, dp_2s_gd
from .model import DPIV2SLS
from .privacy import PrivacyBudget, PrivacyLeakWarning, Release, delta_from_rho, epsilon_from_rho
from .release import FitRelease, load_release
from .results import DPIVResults, InferenceUnavailableError
from .comparison import compare
from .theory import plan, smallest_n, smallest_rho

__version__ = "0.1.0"

__all__ = [
    "DPIV2SLS",
    "DPIVResults",
    "dp_2s_gd",
    "DP2SGDPath",
    "DivergenceError",
    "LongRunWarning",
    "ConvergenceWarning",
    "PrivacyBudget",
    "PrivacyLeakWarning",
    "Release",
    "epsilon_from_rho",
    "delta_from_rho",
    "InferenceUnavailableError",
    "FitRelease",
    "load_release",
    "compare",
    "plan",
    "smallest_n",
    "smallest_rho",
    "__version__",
]
