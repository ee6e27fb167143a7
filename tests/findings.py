"""Assertions on the findings of checks that read the data (:class:`dpivreg.DataCheckWarning`).

A constant or duplicate instrument, collinear columns or a column outside its bounds does not stop a fit (a refusal
one row can flip is not private): building the design warns the data holder and records the finding in
``design.data_findings``; ``fit(check_data=True)`` refuses on it."""

from __future__ import annotations

import re
import warnings

import pytest

from dpivreg import DataCheckWarning


def expect_finding(build, match: str, *args, **kwargs):
    """``build(*args, **kwargs)`` warns a :class:`DataCheckWarning` matching ``match`` and the design (the result, or
    its ``.design``) records a finding matching it; returns the result."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dropped rows and the like: not what is tested
        warnings.simplefilter("always", DataCheckWarning)
        with pytest.warns(DataCheckWarning, match=match):
            result = build(*args, **kwargs)
    design = getattr(result, "design", result)
    assert any(re.search(match, finding, flags=re.S) for finding in design.data_findings), design.data_findings
    return result


def finding_text(build, match: str, *args, **kwargs) -> str:
    """The first recorded finding of ``build(*args, **kwargs)`` matching ``match`` (see :func:`expect_finding`)."""
    design = expect_finding(build, match, *args, **kwargs)
    design = getattr(design, "design", design)
    return next(f for f in design.data_findings if re.search(match, f, flags=re.S))
