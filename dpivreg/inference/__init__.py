"""Private inference: sampling covariances and their private meats (:mod:`~dpivreg.inference.covariance`), the
privacy-noise part and the assembled standard errors (:mod:`~dpivreg.inference.private`), first-stage diagnostics
(:mod:`~dpivreg.inference.diagnostics`) and the Anderson–Rubin set (:mod:`~dpivreg.inference.anderson_rubin`).

The names of :mod:`~dpivreg.inference.private` are importable from here as well. Imports the estimation stage and
below, never reporting or the model. The privacy-noise simulation (``simulate_fit``, ``simulation_kernel``, …) is
in :mod:`dpivreg.estimation.simulation` (the estimator's T and estimator choices use it too); its names resolve here
as deprecated aliases, with a ``DeprecationWarning``.
"""

import warnings

from dpivreg.estimation import simulation as _simulation
from dpivreg.inference.private import (
    MAX_BIAS_SE,
    MC_TOLERANCE,
    MIN_REPLICATIONS,
    PrivateInference,
    moment_inference,
    noise_covariance,
    private_inference,
    residual_variance_release,
    sampling_release,
)

__all__ = ["MAX_BIAS_SE", "MC_TOLERANCE", "MIN_REPLICATIONS", "PrivateInference", "moment_inference",
           "noise_covariance", "private_inference", "residual_variance_release", "sampling_release",
           # deprecated here (module __getattr__ below): the names of the simulation
           *_simulation.__all__]


def __getattr__(name: str):
    """The names of the noise simulation, which lives in :mod:`dpivreg.estimation.simulation` (deprecated here)."""
    if name in _simulation.__all__:
        warnings.warn(f"dpivreg.inference.{name} is a deprecated alias of dpivreg.estimation.simulation.{name}: "
                      "import it from there.", DeprecationWarning, stacklevel=2)
        return getattr(_simulation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
