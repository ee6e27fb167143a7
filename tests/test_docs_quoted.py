"""What the docs quote of dpivreg's output is what the code emits now.

The pages do not copy warnings, errors, summary lines or cautions: ``.. dpivreg-output:: <name>`` asks docs/_quoted.py
for them while the docs are built (docs/conf.py's ``source-read`` hook). These tests read each page as the build
does, with its quotes expanded, and check that it holds the message this test itself gets from the code for the
scenario the page describes; that no page (nor the README) quotes a message of the package by hand, where it could
go stale; and that the quick start's line-by-line reading of the demo's summary quotes lines the demo prints.
"""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import dpivreg.errors
from dpivreg import DPIV2SLS, DivergenceError, PrivacyLeakWarning
from dpivreg.__main__ import main as cli_main
from dpivreg.datasets import LABSUP_BOUNDS, load_labsup, simulate_panel
from dpivreg.errors import DroppedRowsWarning

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS))
import _quoted  # noqa: E402

PAGES = sorted(DOCS.glob("*.rst"))
BOUNDS = {k: LABSUP_BOUNDS[k] for k in ("weeks", "kids", "samesex")}


def _words(text: str) -> str:
    """``text`` with every run of whitespace one space: the quotes are wrapped to the page's width."""
    return " ".join(text.split())


def _built(page: str) -> str:
    """The page's source as the docs build reads it: every quote expanded."""
    text, _ = _quoted.expand((DOCS / f"{page}.rst").read_text(encoding="utf-8"))
    return text


def _assert_quoted(page: str, message: str) -> None:
    assert _words(message) in _words(_built(page)), (
        f"docs/{page}.rst does not quote what the code emits now:\n{message}\n"
        "Quote it with `.. dpivreg-output:: <name>` (docs/_quoted.py), not by hand.")


def _markers() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for line in page.read_text(encoding="utf-8").split("\n"):
            match = _quoted.MARKER.match(line)
            if match:
                found.setdefault(match.group("name"), []).append(page.name)
    return found


@pytest.fixture(scope="module")
def labsup():
    return load_labsup()


def test_every_quote_a_page_asks_for_exists_and_every_scenario_is_quoted():
    used = _markers()
    assert used, "no page quotes the package's output through docs/_quoted.py"
    assert set(used) <= set(_quoted.OUTPUTS), f"unknown quotes: {sorted(set(used) - set(_quoted.OUTPUTS))}"
    assert set(_quoted.OUTPUTS) <= set(used), f"scenarios no page quotes: {sorted(set(_quoted.OUTPUTS) - set(used))}"


def test_the_dropped_rows_warning_the_user_guide_quotes(labsup):
    df = labsup.copy()
    df.loc[df.index[:5], "educ"] = np.nan
    with pytest.warns(DroppedRowsWarning) as caught:
        DPIV2SLS.from_formula("weeks ~ 1 + educ + [kids ~ samesex]", df)
    message = next(str(r.message) for r in caught if r.category is DroppedRowsWarning)
    assert "dropped 5 of 31857 rows" in message
    _assert_quoted("user_guide", f"DroppedRowsWarning: {message}")


def test_the_missing_bound_leak_the_user_guide_quotes(labsup):
    model = DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", labsup)
    with pytest.warns(PrivacyLeakWarning) as caught:
        res = model.fit(rho1=1, rho2=1, bounds={k: BOUNDS[k] for k in ("weeks", "samesex")}, seed=20261129)
    message = next(str(r.message) for r in caught if r.category is PrivacyLeakWarning)
    assert "kids" in message and not res.is_private
    _assert_quoted("user_guide", f"PrivacyLeakWarning: {message}")
    summary = res.summary().as_text().split("\n")
    for start in ("Bounds:", "Scaled from the data (PRIVACY LEAK)", "PRIVACY LEAKS during the fit", "  - bounds"):
        line = next(line for line in summary if line.startswith(start))
        _assert_quoted("user_guide", line)


def test_the_divergence_error_the_user_guide_quotes(labsup):
    model = DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", labsup)
    with pytest.raises(DivergenceError) as raised:
        model.fit(rho1=1, rho2=1, bounds=BOUNDS, eta=5, seed=20261129)
    _assert_quoted("user_guide", f"DivergenceError: {raised.value}")


def test_the_privacy_unit_summary_the_user_guide_quotes():
    panel = simulate_panel(20_000, seed=1)
    res = DPIV2SLS.from_formula(panel.formula, panel.data).fit(rho=2, bounds=panel.bounds, seed=7,
                                                               privacy_unit="unit")
    top = res.summary().as_text().split("\n")
    for start in ("Privacy unit:", "No. Observations:", "Cov. Estimator:", "Chosen by:"):
        _assert_quoted("user_guide", next(line for line in top if line.startswith(start)))
    assert res.privacy.rho == pytest.approx(2)


def test_the_weak_instrument_cautions_the_reporting_page_quotes(labsup):
    sample = labsup.sample(2000, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", sample).fit(rho1=1, rho2=1, bounds=BOUNDS,
                                                                                 seed=1)
    assert any(c.startswith("CAUTION") for c in res.cautions)
    assert any(c.startswith("WEAK INSTRUMENTS") for c in res.cautions)
    for caution in res.cautions:
        _assert_quoted("reporting", caution)
    assert res.privacy.rho == pytest.approx(2.7)  # the total the page states


@pytest.mark.parametrize("arguments", [["demo"], ["demo", "--method", "moments"]])
def test_the_demo_outputs_the_quick_start_quotes(capsys, arguments):
    assert cli_main(arguments) == 0
    out = capsys.readouterr().out
    _assert_quoted("quickstart", out)


# Python prints a warning or an exception as "Category: message": a page line of that form quotes one.
_CLASSES = "|".join(name for name in dpivreg.errors.__all__ if name[0].isupper() and name != "DATA_CHECK_NOTE")
_HAND_QUOTE = re.compile(rf"\b(?:{_CLASSES}|UserWarning|ValueError|TypeError):\s+\S")
# The summary's cautions and leak notes, as they start a line of the summary.
_NOTE = re.compile(r"^\s*(?:CAUTION: |WEAK INSTRUMENTS: |PRIVACY LEAKS during the fit|Scaled from the data \(PRIVACY)")


@pytest.mark.parametrize("path", [*PAGES, ROOT / "README.md"], ids=lambda p: p.name)
def test_no_page_quotes_a_message_by_hand(path):
    """A message copied into a page goes stale when the code changes it (the user guide once quoted a
    DroppedRowsWarning the code no longer emitted): quote through docs/_quoted.py instead."""
    hand = [f"{path.name}:{i}: {line.strip()}" for i, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1)
            if _HAND_QUOTE.search(line) or _NOTE.match(line)]
    assert not hand, "messages quoted by hand (use `.. dpivreg-output::`):\n" + "\n".join(hand)


def test_the_hand_quote_check_sees_a_copied_message():
    """The check above is not blind: the lines the user guide held before its quotes were generated."""
    copied = ["   DroppedRowsWarning: design_from_formula dropped 5 of 31857 rows (0.0%) because they have a",
              "   PrivacyLeakWarning: bounds were read from the data (no public bounds given) for: kids.",
              "   Scaled from the data (PRIVACY LEAK): kids."]
    assert all(_HAND_QUOTE.search(line) or _NOTE.match(line) for line in copied)
    assert not _HAND_QUOTE.search("raises a :class:`~dpivreg.PrivacyLeakWarning` naming the columns.")


def test_the_quick_start_reads_lines_the_demo_prints(capsys):
    """The quick start explains the demo's summary line by line, each definition headed by the line it explains
    (``Label: value``; the error-bound block prints no colon): each such line is one the demo prints."""
    outputs = []
    for arguments in (["demo"], ["demo", "--method", "moments"]):
        assert cli_main(arguments) == 0
        outputs.append(_words(capsys.readouterr().out))
    lines = (DOCS / "quickstart.rst").read_text(encoding="utf-8").split("\n")
    quoted, missing = 0, []
    for line, following in zip(lines, lines[1:]):
        if not (line.startswith("``") and following.startswith("   ")):
            continue  # a definition's term is a line of literals followed by its indented definition
        for literal in re.findall(r"``(.+?)``", line):
            if "..." in literal or ": " not in literal:
                continue
            quoted += 1
            forms = {_words(literal), _words(literal.replace(": ", " ", 1))}
            if not any(form in out for form in forms for out in outputs):
                missing.append(literal)
    assert quoted > 30
    assert not missing, f"docs/quickstart.rst reads summary lines the demo does not print: {missing}"
