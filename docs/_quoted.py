"""What the documentation quotes of dpivreg's output — warnings, errors, summary lines, cautions — produced by the
code itself while the docs are built, so that a quoted message cannot go stale.

A page asks for a quote with a line of its own::

    .. dpivreg-output:: dropped-rows-warning

(at any indentation), which :func:`expand` replaces by a ``code-block:: text`` holding what :data:`OUTPUTS` [name]
returns: the package run on a small scenario, its warning or error caught and printed as Python prints it
(``Category: message``, wrapped at 100 columns) or the lines of its output the page discusses. docs/conf.py calls
:func:`expand` from the same ``source-read`` hook that inlines the generated tables; a scenario that no longer
produces what it quotes (no warning raised, a summary line gone) stops the build with an error naming it.
tests/test_docs_quoted.py checks the quotes against the code and that no page quotes a message by hand.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import textwrap
import warnings
from typing import Callable

#: A page's request for a quote: ``.. dpivreg-output:: <name>`` on a line of its own.
MARKER = re.compile(r"^(?P<indent>[ \t]*)\.\. dpivreg-output::[ \t]*(?P<name>\S+)[ \t]*$")

WIDTH = 100
DEMO_SEED = 20261129  # the demo's default seed (python -m dpivreg demo --help)

#: name -> a function returning the text to quote.
OUTPUTS: dict[str, Callable[[], str]] = {}


def _output(name: str):
    def register(function: Callable[[], str]) -> Callable[[], str]:
        OUTPUTS[name] = function
        return function

    return register


class QuoteError(RuntimeError):
    """A scenario no longer produces what the docs quote from it."""


def wrap(text: str, width: int = WIDTH) -> str:
    """``text`` wrapped at ``width`` columns without breaking words (what a reader's terminal would do, but
    at a width that fits the page)."""
    return "\n".join(textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False) if line else ""
                     for line in text.split("\n"))


def first_warning(category: type[Warning], action: Callable[[], object]) -> str:
    """``Category: message`` of the first warning of ``category`` that ``action()`` raises."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        action()
    for record in caught:
        if issubclass(record.category, category):
            return f"{record.category.__name__}: {record.message}"
    raise QuoteError(f"the scenario raised no {category.__name__} (raised: "
                     f"{sorted({r.category.__name__ for r in caught}) or 'nothing'})")


def exception_text(category: type[BaseException], action: Callable[[], object]) -> str:
    """``Category: message`` of the ``category`` exception that ``action()`` raises."""
    try:
        action()
    except category as error:
        return f"{type(error).__name__}: {error}"
    raise QuoteError(f"the scenario raised no {category.__name__}")


def lines_between(text: str, first: str, last: str | None = None, *, continued: str | None = None) -> str:
    """The lines of ``text`` from the first that starts with ``first``: through the first after it that starts with
    ``last``; or, without ``last``, that line and the lines right after it that start with ``continued``. Each
    right-stripped."""
    lines = [line.rstrip() for line in text.split("\n")]
    starts = [i for i, line in enumerate(lines) if line.startswith(first)]
    if not starts:
        raise QuoteError(f"no line starts with {first!r}")
    start = starts[0]
    if last is None:
        end = start + 1
        while continued is not None and end < len(lines) and lines[end].startswith(continued):
            end += 1
        return "\n".join(lines[start:end])
    ends = [i for i in range(start, len(lines)) if lines[i].startswith(last)]
    if not ends:
        raise QuoteError(f"no line starting with {last!r} follows {first!r}")
    return "\n".join(lines[start:ends[0] + 1])


def demo_output(*arguments: str) -> str:
    """What ``python -m dpivreg demo [arguments]`` prints."""
    from dpivreg.__main__ import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main(["demo", *arguments])
    return printed.getvalue().rstrip("\n")


@functools.lru_cache(maxsize=None)
def _labsup():
    from dpivreg.datasets import load_labsup

    return load_labsup()


def _labsup_bounds(*columns: str) -> dict:
    from dpivreg.datasets import LABSUP_BOUNDS

    return {column: LABSUP_BOUNDS[column] for column in columns}


@functools.lru_cache(maxsize=None)
def _fit_without_the_bound_of_kids():
    """The demo's fit with the bound of kids left out (user guide, "What happens when a bound is missing")."""
    from dpivreg import DPIV2SLS

    model = DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", _labsup())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = model.fit(rho1=1, rho2=1, bounds=_labsup_bounds("weeks", "samesex"), seed=DEMO_SEED)
    return res, caught


@_output("demo")
def _demo() -> str:
    return demo_output()


@_output("demo-moments")
def _demo_moments() -> str:
    return demo_output("--method", "moments")


@_output("dropped-rows-warning")
def _dropped_rows() -> str:
    """The user guide's example: five values of educ set to NaN, the rows dropped by the formula's design."""
    import numpy as np

    from dpivreg import DPIV2SLS
    from dpivreg.errors import DroppedRowsWarning

    df = _labsup().copy()
    df.loc[df.index[:5], "educ"] = np.nan
    return wrap(first_warning(DroppedRowsWarning,
                              lambda: DPIV2SLS.from_formula("weeks ~ 1 + educ + [kids ~ samesex]", df)))


@_output("missing-bound-warning")
def _missing_bound_warning() -> str:
    from dpivreg import PrivacyLeakWarning

    _, caught = _fit_without_the_bound_of_kids()
    leaks = [f"{r.category.__name__}: {r.message}" for r in caught if issubclass(r.category, PrivacyLeakWarning)]
    if not leaks:
        raise QuoteError("the fit without the bound of kids raised no PrivacyLeakWarning")
    return wrap(leaks[0])


@_output("missing-bound-summary")
def _missing_bound_summary() -> str:
    """The summary's lines that name the leak: the top block's ``Bounds:`` line and the notes' leak lines."""
    res, _ = _fit_without_the_bound_of_kids()
    text = res.summary().as_text()
    scaled = lines_between(text, "Scaled from the data (PRIVACY LEAK)")
    leaks = lines_between(text, "PRIVACY LEAKS during the fit", continued="  - ")
    return "\n".join([lines_between(text, "Bounds:"), "", scaled, leaks])


@_output("divergence-error")
def _divergence() -> str:
    """The user guide's ``eta=5`` on the demo."""
    from dpivreg import DPIV2SLS, DivergenceError

    model = DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", _labsup())
    bounds = _labsup_bounds("weeks", "kids", "samesex")
    return wrap(exception_text(DivergenceError, lambda: model.fit(rho1=1, rho2=1, bounds=bounds, eta=5,
                                                                  seed=DEMO_SEED)))


@_output("privacy-unit-summary")
def _privacy_unit_summary() -> str:
    """The user guide's panel fit with ``privacy_unit="unit"``: its summary's top block down to the total rho."""
    from dpivreg import DPIV2SLS
    from dpivreg.datasets import simulate_panel

    panel = simulate_panel(20_000, seed=1)
    res = DPIV2SLS.from_formula(panel.formula, panel.data).fit(rho=2, bounds=panel.bounds, seed=7,
                                                               privacy_unit="unit")
    return lines_between(res.summary().as_text(), "Dep. Variable:", "Iterations T:")


@_output("weak-instrument-cautions")
def _weak_instrument_cautions() -> str:
    """The reporting page's example: the demo's formula on 2,000 rows of the labour-supply data, whose cautions
    (``res.cautions``) every export carries."""
    from dpivreg import DPIV2SLS

    sample = _labsup().sample(2000, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unreliable-inference UserWarning repeats the first caution
        res = DPIV2SLS.from_formula("weeks ~ 1 + [kids ~ samesex]", sample).fit(
            rho1=1, rho2=1, bounds=_labsup_bounds("weeks", "kids", "samesex"), seed=1)
    if not res.cautions:
        raise QuoteError("the 2,000-row fit carries no cautions")
    return "\n\n".join(wrap(caution) for caution in res.cautions)


@functools.lru_cache(maxsize=None)
def render(name: str) -> str:
    """The quote ``name``: its scenario run once per process."""
    if name not in OUTPUTS:
        raise QuoteError(f"no quoted output named {name!r} (docs/_quoted.py has {sorted(OUTPUTS)})")
    try:
        return OUTPUTS[name]()
    except QuoteError as error:
        raise QuoteError(f"dpivreg-output {name!r}: {error}") from None


def expand(text: str) -> tuple[str, list[str]]:
    """``text`` with every ``.. dpivreg-output:: name`` line replaced by a text block of the quote, and the names
    quoted, in order."""
    out, names = [], []
    for line in text.split("\n"):
        match = MARKER.match(line)
        if not match:
            out.append(line)
            continue
        indent, name = match.group("indent"), match.group("name")
        names.append(name)
        out += [f"{indent}.. code-block:: text", ""]
        out += [f"{indent}   {quoted}" if quoted.strip() else "" for quoted in render(name).split("\n")]
    return "\n".join(out), names
