"""Public bounds: from a user's mapping (or a whole codebook) to one (lower, upper) pair per design column.

Statistical agencies publish bounds per *variable* of a data set (a codebook, e.g.
:data:`dpivreg.datasets.LABSUP_BOUNDS`), not per design column. :func:`resolve_bounds` accepts such a
mapping for any formula over the data:

* a key that is a design column bounds it; spacing does not matter (``"I(exper**2)"`` is
  ``"I(exper ** 2)"``);
* a key that is a column of the data but not of the design is unused (listed in one summary note),
  except that its bounds carry to the transformed terms of it whose map is monotone and known:
  ``np.log`` / ``np.log1p`` / ``np.sqrt`` / ``np.exp`` of the column where defined on the bounds,
  and ``I(x ** 2)`` (bounds [min of the square, max of the square] over the interval);
* dummies of categories, boolean columns and missing-value indicators lie in [0, 1] by construction
  (public), so they get (0, 1) unless bounded explicitly;
* any other key is a typo: ``ValueError`` listing the design's and the data's columns.

Everything here reads names, dtypes and the bounds only (public inputs); no data.
"""

from __future__ import annotations

import math
import numbers
import re
import sys
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

__all__ = ["ResolvedBounds", "resolve_bounds", "CARRIED_MAPS"]

Pair = tuple[float, float]


def _square(lo: float, hi: float) -> Pair | None:
    if lo >= 0:
        return lo * lo, hi * hi
    if hi <= 0:
        return hi * hi, lo * lo
    return 0.0, max(lo * lo, hi * hi)


def _increasing(func: Callable[[float], float],
                defined: Callable[[float], bool]) -> Callable[[float, float], Pair | None]:
    def carry(lo: float, hi: float) -> Pair | None:
        return (func(lo), func(hi)) if defined(lo) else None
    return carry


#: Transformed terms whose bounds follow from the raw column's: pattern of the design column name (one
#: group: the raw column) and the map from the raw (lo, hi) to the term's (None where undefined).
CARRIED_MAPS: dict[str, Callable[[float, float], Pair | None]] = {
    r"np\.log\((\w+)\)": _increasing(math.log, lambda lo: lo > 0),
    r"np\.log1p\((\w+)\)": _increasing(math.log1p, lambda lo: lo > -1),
    r"np\.sqrt\((\w+)\)": _increasing(math.sqrt, lambda lo: lo >= 0),
    r"np\.exp\((\w+)\)": _increasing(math.exp, lambda lo: True),
    r"I\((\w+)\*\*2\)": _square,
}


@dataclass(frozen=True)
class ResolvedBounds:
    """The bounds of the design's columns and where each came from (public).

    Attributes
    ----------
    bounds : dict
        (lower, upper) per bounded design column.
    unused : tuple
        Keys that are columns of the data but not of the design (a codebook's other variables).
    carried : dict
        Design column -> the raw column (and map) its bounds were carried from.
    automatic : tuple
        Design columns bounded (0, 1) by construction (dummies, booleans, indicators).
    """

    bounds: dict[Hashable, Pair]
    unused: tuple[Hashable, ...] = ()
    carried: dict[Hashable, str] = field(default_factory=dict)
    automatic: tuple[Hashable, ...] = ()

    def notes(self) -> list[str]:
        """The summary's notes about the bounds' provenance."""
        out = []
        if self.carried:
            out.append("Bounds carried from the raw columns: "
                       + ", ".join(f"{name} from {raw}" for name, raw in self.carried.items()) + ".")
        if self.automatic:
            out.append("Bounded [0, 1] by construction: " + ", ".join(map(str, self.automatic)) + ".")
        if self.unused:
            out.append("Bounds given for columns the design does not use: " + ", ".join(map(str, self.unused)) + ".")
        return out


def _squeeze(name: Hashable) -> str:
    return re.sub(r"\s+", "", str(name))


def _pair(name: Hashable, pair) -> Pair:
    if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
        raise TypeError(f"bounds[{name!r}] must be a (lower, upper) pair of numbers, got {pair!r}.")
    lo, hi = pair
    for value in (lo, hi):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"bounds[{name!r}] must be a (lower, upper) pair of numbers, got {pair!r}.")
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"bounds[{name!r}] must be finite, got {pair!r}.")
    if not lo < hi:
        raise ValueError(f"bounds[{name!r}] must satisfy lower < upper, got {pair!r}.")
    if not math.isfinite(hi - lo):  # the map's centre and half-width need the width in float64
        raise ValueError(f"bounds[{name!r}] = {pair!r} span more than float64 can hold (upper − lower overflows): "
                         "give the column's real public range (a codebook's limits), or rescale the column.")
    if not (hi - lo) / 2 >= sys.float_info.min:  # the map divides by the half-width: a subnormal one is inexact
        raise ValueError(f"bounds[{name!r}] = {pair!r} are too close together: the half-width (upper − lower)/2 must "
                         f"be at least {sys.float_info.min:g}. Rescale the column or widen its bounds.")
    return lo, hi


def resolve_bounds(bounds: Mapping | None, design) -> ResolvedBounds:
    """Match ``bounds`` (design columns, or a codebook over the data's columns) to the design's columns
    (module docstring). ``design`` supplies ``column_names``, ``constant_name``, ``data_columns`` and
    ``unit_columns``."""
    if bounds is None:
        bounds = {}
    if not isinstance(bounds, Mapping):
        raise TypeError('bounds must be a dict mapping column names to (lower, upper) pairs, e.g. '
                        f'{{"weeks": (0, 52)}}; got {type(bounds).__name__}.')
    known = list(design.column_names)
    by_squeezed = {_squeeze(name): name for name in known}
    data_columns = list(design.data_columns)
    matched: dict[Hashable, Pair] = {}
    raw: dict[str, Pair] = {}
    unused = []
    for key, pair in bounds.items():
        checked = _pair(key, pair)
        name = key if key in known else by_squeezed.get(_squeeze(key))
        if key in data_columns:
            raw[str(key)] = checked  # the raw column's bounds, for its transformed terms
        if name is not None:
            matched[name] = checked
        elif key in data_columns:
            unused.append(key)
        else:
            raise ValueError(
                f"bounds were given for {key!r}, which is neither a column of the design nor of the data (a "
                f"typo?). Design columns: {known}" + (f"; data columns: {data_columns}." if data_columns else "."))
    carried: dict[Hashable, str] = {}
    for name in known:
        if name in matched or name == design.constant_name:
            continue
        for pattern, carry in CARRIED_MAPS.items():
            found = re.fullmatch(pattern, _squeeze(name))
            if found and found.group(1) in raw:
                pair = carry(*raw[found.group(1)])
                if pair is not None and pair[0] < pair[1]:
                    matched[name] = pair
                    carried[name] = found.group(1)
                    if found.group(1) in unused:
                        unused.remove(found.group(1))
                break
    automatic = tuple(name for name in design.unit_columns if name not in matched)
    matched.update({name: (0.0, 1.0) for name in automatic})
    return ResolvedBounds(matched, tuple(unused), carried, automatic)
