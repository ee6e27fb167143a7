"""With every budget infinite the fit is 2SLS: its estimate and covariance must reproduce Stata's ``ivregress``.

Reference: Stata 13 output of ``ivregress 2sls y [x3 x4 x5] (x1 [x2] = z1 [z2]), vce(unadjusted | robust)
[noconstant]`` on linearmodels' simulated test data (600 rows, ``y_unadjusted`` or ``y_robust`` by the vce),
``stata-iv-simulated-results.txt`` and ``simulated-data.dta`` of linearmodels' own test suite. They are read
where the installed linearmodels ships them (``linearmodels/tests/iv/results/``; linearmodels is a dependency,
so CI has them) and are not copied into this repository. ``DPIVREG_STATA_REFERENCE`` names another folder with
the same files. Without ``small`` Stata's covariance uses n, no degrees-of-freedom correction, as dpivreg's does
(``cov_type="unadjusted"`` and ``"robust"``). The tests fail, rather than skip, when the files are missing.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from pathlib import Path

import linearmodels
import numpy as np
import pytest

from dpivreg import DPIV2SLS, PrivacyLeakWarning

REFERENCE = Path(os.environ.get("DPIVREG_STATA_REFERENCE",
                                Path(linearmodels.__file__).resolve().parent / "tests" / "iv" / "results"))
RESULTS = REFERENCE / "stata-iv-simulated-results.txt"
HEADER = re.compile(r"^#{10} !(?P<config>.*)! #{10}$", re.MULTILINE)
CONFIG = re.compile(r"2sls-num_endog_(?P<endog>\d)-num_exog_(?P<exog>\d)-num_instr_(?P<instr>\d)-weighted_False-"
                    r"vce\((?P<vce>unadjusted|robust)\)-(?P<option>|noconstant)$")



def stata_blocks() -> dict[str, tuple[dict[str, float], list[str], np.ndarray]]:
    """{configuration: (coefficients by name, covariance names, covariance)} of the unweighted 2SLS
    ``vce(unadjusted)`` and ``vce(robust)`` blocks without ``small``."""
    text = RESULTS.read_text()
    heads = list(HEADER.finditer(text))
    blocks = {}
    for head, following in zip(heads, heads[1:] + [None]):
        config = head.group("config")
        if not CONFIG.match(config):
            continue
        body = text[head.end(): following.start() if following else len(text)]
        estimates, variance = body.split("********* Variance *************")
        coefficients = {}
        for line in estimates.splitlines():
            parts = line.split("\t")
            if len(parts) == 2 and re.fullmatch(r"x\d|_cons", parts[0]):
                coefficients[parts[0]] = float(parts[1])
        rows = [line.split("\t") for line in variance.strip().splitlines()[1:]]
        names = [name for name in rows[0] if name]
        V = np.array([[float(v) for v in row[1:1 + len(names)]] for row in rows[1:1 + len(names)]])
        blocks[config] = (coefficients, names, V)
    return blocks


BLOCKS = stata_blocks()


def formula(config: str) -> str:
    parts = CONFIG.match(config)
    exog = ["x3", "x4", "x5"][: int(parts["exog"])]
    endog = ["x1", "x2"][: int(parts["endog"])]
    instruments = ["z1", "z2"][: int(parts["instr"])]
    right = ("0 + " if parts["option"] == "noconstant" else "1 + ") + "".join(f"{x} + " for x in exog)
    return f"y_{parts['vce']} ~ {right}[{' + '.join(endog)} ~ {' + '.join(instruments)}]"


def test_the_reference_holds_every_configuration():
    """Twelve blocks per vce: 1 or 2 endogenous, 0 or 3 exogenous, 1 or 2 instruments (as identified),
    ± constant."""
    assert len(BLOCKS) == 24
    assert all(len(V) == len(names) == len(coefficients) for coefficients, names, V in BLOCKS.values())


@pytest.mark.parametrize("config", sorted(BLOCKS))
def test_infinite_budget_reproduces_stata_ivregress(config):
    """params and V to 1e-6 (relative; V also absolute at 1e-6 of its largest entry)."""
    import pandas as pd

    data = pd.read_stata(REFERENCE / "simulated-data.dta")
    coefficients, names, V = BLOCKS[config]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)  # rho = inf: not private, and it says so
        res = DPIV2SLS.from_formula(formula(config), data).fit(rho=math.inf, seed=0,
                                                               cov_type=CONFIG.match(config)["vce"])
    ours = [("_cons" if name == "Intercept" else name) for name in res.params.index]
    assert sorted(ours) == sorted(names)
    expected = np.array([coefficients[name] for name in ours])
    order = [names.index(name) for name in ours]
    np.testing.assert_allclose(res.params.to_numpy(), expected, rtol=1e-6, atol=0)
    np.testing.assert_allclose(res.cov_params().to_numpy(), V[np.ix_(order, order)], rtol=1e-6,
                               atol=1e-6 * np.max(np.abs(V)))
