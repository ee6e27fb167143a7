"""The privacy pieces, named by what they are: the accountant (:mod:`~dpivreg.privacy.accounting`: zCDP releases,
the budget, ε at δ), the Gaussian mechanisms with their sensitivities (:mod:`~dpivreg.privacy.mechanisms`) and the
privacy units' pure logic (:mod:`~dpivreg.privacy.units`: who is protected, how rows group into units).

The accountant's names are importable from here as well (``from dpivreg.privacy import PrivacyBudget``), and
:class:`~dpivreg.errors.PrivacyLeakWarning` (defined in :mod:`dpivreg.errors`).
Imports only :mod:`dpivreg.errors` and :mod:`dpivreg._validation` besides itself.
"""

from dpivreg.errors import PrivacyLeakWarning
from dpivreg.privacy.accounting import (
    CALIBRATIONS,
    EPSILON_METHODS,
    PrivacyBudget,
    Release,
    clipped_mean_sensitivity,
    delta_from_rho,
    epsilon_from_rho,
    gaussian_zcdp,
    noise_std,
    rho_from_epsilon,
)

__all__ = ["CALIBRATIONS", "EPSILON_METHODS", "PrivacyBudget", "Release", "clipped_mean_sensitivity", "delta_from_rho",
           "epsilon_from_rho", "rho_from_epsilon", "gaussian_zcdp", "noise_std", "PrivacyLeakWarning"]
