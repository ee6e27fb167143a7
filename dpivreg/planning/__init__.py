"""Planning before touching the data, from public inputs only (nothing here reads private data):

* :mod:`~dpivreg.planning.theorem_plan` — the Theorem's bound over T, its recommended T, and the smallest n or budget
  that brings the bound to a target (shapes, constants set to 1; the bound's terms are in
  :mod:`dpivreg.estimation.theory`);
* :mod:`~dpivreg.planning.se_plan` — the private standard error to expect at a budget and the budget a target SE or
  interval width needs, by running the package's own fit on data drawn from
* :mod:`~dpivreg.planning.population` — a synthetic population built from a-priori guesses of the variables.

The planners sit above :class:`dpivreg.DPIV2SLS` (the SE planner runs fits); nothing below imports them. Their public
names are importable from here as well.
"""

from dpivreg.planning.population import SyntheticPopulation, iv_formula, synthetic_population
from dpivreg.planning.se_plan import SEPlan, plan_se
from dpivreg.planning.theorem_plan import Plan, plan, recommended_T, smallest_n, smallest_rho

__all__ = [
    "Plan",
    "SEPlan",
    "SyntheticPopulation",
    "iv_formula",
    "plan",
    "plan_se",
    "recommended_T",
    "smallest_n",
    "smallest_rho",
    "synthetic_population",
]
