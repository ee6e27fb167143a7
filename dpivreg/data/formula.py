"""Splitting an IV formula into its four blocks: ``dep ~ exog + [endog ~ instruments]`` read as linearmodels reads it
(one bracketed term, the instruments after the inner ``~``), the blocks' formulas, the variables they name, and the
errors that point at the block and term a user wrote. Names only: nothing here reads data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BLOCKS: tuple[str, ...] = ("dependent", "exog", "endog", "instruments")


_BLOCK_LABELS: dict[str, str] = {
    "dependent": "dependent variable",
    "exog": "exogenous regressors (exog)",
    "endog": "endogenous regressors (endog)",
    "instruments": "instruments",
}


_FORMULA_HELP = (
    "An IV formula has the form 'dependent ~ exog + [endog ~ instruments]', "
    "e.g. 'weeks ~ 1 + educ + [kids ~ samesex]'."
)


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


_UNKNOWN_NAME = (
    re.compile(r"`([^`]+)` is not present in the dataset"),
    re.compile(r"name '([^']+)' is not defined"),
)


@dataclass(frozen=True)
class _FormulaParts:
    """The text of the four blocks of an IV formula (``exog`` may be empty)."""

    dependent: str
    exog: str
    endog: str
    instruments: str


def _check_count(text: str, char: str, expected: int, where: str) -> None:
    """Raise if ``text`` does not contain ``char`` exactly ``expected`` times."""
    found = text.count(char)
    if found != expected:
        raise ValueError(
            f"formula must have exactly {expected} '{char}' {where}, found "
            f"{found}. {_FORMULA_HELP}"
        )


def _check_term_block(text: str, label: str) -> None:
    """Raise if a block of the bracket is empty or starts or ends with '+'."""
    if not text:
        raise ValueError(
            f"the {label} block of the formula is empty: name at least one "
            f"variable. {_FORMULA_HELP}"
        )
    if text[0] == "+" or text[-1] == "+":
        raise ValueError(
            f"the {label} block must not start or end with '+', got {text!r}."
        )


def _top_level_brackets(text: str) -> tuple[list[int], list[int]]:
    """Positions of the '[' and ']' outside parentheses and quotes: the IV block's, not those of a list
    argument such as ``C(g, levels=['a', 'b'])``. With unbalanced parentheses every bracket counts (the
    formula engine then reports the parenthesis)."""
    if text.count("(") != text.count(")"):
        return ([i for i, c in enumerate(text) if c == "["], [i for i, c in enumerate(text) if c == "]"])
    opens, closes, depth, quote = [], [], 0, None
    for i, char in enumerate(text):
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "'\"`":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif depth == 0 and char == "[":
            opens.append(i)
        elif depth == 0 and char == "]":
            closes.append(i)
    return opens, closes


def _split_formula(formula: str) -> _FormulaParts:
    """
    Split and check the structure of an IV formula.

    Parameters
    ----------
    formula : str
        Formula of the form ``dep ~ exog + [endog ~ instruments]``; exogenous
        terms may also follow the bracket (``dep ~ 1 + [x ~ z] + w``).

    Returns
    -------
    _FormulaParts
        The text of the blocks, with the exogenous terms before and after the
        bracket joined as linearmodels joins them.

    Raises
    ------
    ValueError
        If the formula has no bracket, several or unbalanced brackets, the
        wrong number of '~', or an empty block.
    """
    text = formula.strip()
    if not text:
        raise ValueError(f"formula is empty. {_FORMULA_HELP}")
    opens, closes = _top_level_brackets(text)
    n_open, n_close = len(opens), len(closes)
    if n_open != n_close:
        raise ValueError(
            f"formula has unbalanced brackets ({n_open} '[' and {n_close} ']'). "
            f"{_FORMULA_HELP}"
        )
    if n_open == 0:
        if "~" not in text:
            raise ValueError(f"formula has no '~'. {_FORMULA_HELP}")
        raise ValueError(
            "formula has no [endog ~ instruments] block, so there is no "
            "endogenous variable to instrument. For a model without endogenous "
            "variables use OLS (e.g. statsmodels.formula.api.ols or "
            f"linearmodels.OLS). {_FORMULA_HELP}"
        )
    if n_open > 1:
        raise ValueError(
            f"formula has {n_open} bracket blocks; only one [endog ~ instruments] "
            "block is allowed. Put all endogenous variables and all instruments "
            "in one block, e.g. '[x1 + x2 ~ z1 + z2 + z3]'."
        )
    lb, rb = opens[0], closes[0]
    if rb < lb:
        raise ValueError(f"formula has unbalanced brackets (']' before '['). {_FORMULA_HELP}")
    before, inside, after = text[:lb], text[lb + 1 : rb], text[rb + 1 :]
    _check_count(before, "~", 1, "before the bracket block")
    _check_count(inside, "~", 1, "inside the bracket block")
    _check_count(after, "~", 0, "after the bracket block")

    dependent, left = (part.strip() for part in before.split("~"))
    endog, instruments = (part.strip() for part in inside.split("~"))
    right = after.strip()
    if not dependent:
        raise ValueError(
            f"the dependent variable (left of the first '~') is empty. {_FORMULA_HELP}"
        )
    _check_term_block(endog, "endogenous (left of '~' inside [...])")
    _check_term_block(instruments, "instruments (right of '~' inside [...])")
    if left.endswith("+"):
        left = left[:-1].strip()
    if left and right and right[0] not in "+-":
        raise ValueError(
            "exogenous terms after the bracket block must be joined with '+', "
            f"e.g. '... [endog ~ instruments] + {right}', got '] {right}'."
        )
    exog = f"{left} {right}".strip()
    return _FormulaParts(dependent, exog, endog, instruments)


def _block_formulas(parts: _FormulaParts) -> dict[str, str | None]:
    """Right-hand-side formula of every block, without an implicit intercept."""
    return {
        "dependent": f"0 + {parts.dependent}",
        "exog": f"0 + {parts.exog}" if parts.exog else None,
        "endog": f"0 + {parts.endog}",
        "instruments": f"0 + {parts.instruments}",
    }


def _unknown_name(exc: BaseException) -> str | None:
    """Name that a formula engine could not find, read from its error chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for pattern in _UNKNOWN_NAME:
            match = pattern.search(str(current))
            if match:
                return match.group(1)
        current = current.__cause__ or current.__context__
    return None


def _block_error(block: str, text: str, engine: str, exc: Exception) -> ValueError:
    """A ValueError that says which block failed and why, for ``raise ... from``."""
    message = _ANSI_ESCAPE.sub("", str(exc)).strip()
    name = _unknown_name(exc)
    label = _BLOCK_LABELS[block]
    if name is not None:
        return ValueError(
            f"unknown column or name {name!r} in the {label} block {text!r}: it "
            "is neither a column of `data` nor a variable of the formula's "
            f"context. Check the spelling or pass it in `context`. ({engine}: "
            f"{message})"
        )
    return ValueError(
        f"could not build the {label} block {text!r} with {engine}: "
        f"{type(exc).__name__}: {message}"
    )


def _formula_names(parts: _FormulaParts) -> set[str]:
    """Names that the formula reads (best effort: a block that fails to parse is skipped)."""
    return set(_formula_factors(parts))


def _formula_factors(parts: _FormulaParts) -> dict[str, list[str]]:
    """
    Names that the formula reads, each with the expressions of the factors that read it.

    Best effort: a block that fails to parse is skipped (the formula engine
    reports it when the blocks are built).
    """
    from formulaic import Formula  # noqa: PLC0415

    factors: dict[str, list[str]] = {}
    for text in _block_formulas(parts).values():
        if text is None:
            continue
        try:
            terms = list(Formula(text))
            for term in terms:
                for factor in term.factors:
                    for name in factor.required_variables:
                        factors.setdefault(str(name), []).append(str(factor.expr))
        except Exception:  # noqa: BLE001 - the engine reports malformed blocks later
            continue
    return factors


def _only_in_categorical(name: str, expressions: list[str]) -> bool:
    """Whether every expression reading ``name`` is ``C(name)`` or ``C(name, ...)``."""
    pattern = re.compile(rf"C\(\s*{re.escape(name)}\s*[,)]")
    return bool(expressions) and all(
        pattern.match(e) is not None and e.endswith(")") for e in expressions
    )
