"""Privacy units: whom a fit protects, and the grouping of rows that every release then respects.

Row level (``fit(privacy_unit=None)``, the default)
    Neighbouring data sets replace one row; the row count n is public. Right when each person (household,
    firm) contributes one row, as in a cross-section of mothers.

Unit level (``fit(privacy_unit="hh_id")``)
    Neighbouring data sets replace *all* rows of one unit by the rows of any other unit; the number of units N
    is public, the number of rows (overall and per unit) is not. A person in a panel, a household with
    several members, a firm in matched data is then protected as a whole, not only up to the number of rows
    they contribute (row-level privacy of a unit with k rows is, by group privacy, only k²ρ-zCDP for it).

    Contribution bounding, before any statistic (as the trusted systems do: Tumult Analytics'
    ``max_rows_per_id``, PipelineDP's ``max_contributions``): a unit with more than ``max_rows_per_unit`` = m
    rows keeps m of them, chosen uniformly at random by a key that is a fixed function of the fit's seed and
    the row's position (independent of the data, the same in memory and on Dask). Why that is private although
    replacing a unit by one with another number of rows shifts the positions, hence the keys, of the rows after
    it: the keys are independent and uniform (the seed, like the noise's, is secret), so in either data set every
    unit keeps a uniformly random subset of min(kᵤ, m) rows, independently of the others; coupling the two data
    sets' truncations so that every other unit keeps the same rows, the truncated data sets are unit neighbours
    almost surely, and the guarantee of the releases below carries over. (A public seed would publish which rows
    were kept: keep it as secret as the noise.) Then every release is a sum over units of the units'
    contributions:

    * the gradient steps and the clipping release sum each unit's rows first and clip the *unit's* gradient
      (sensitivity 2γ of the sum, as for a row);
    * releases that sum bounded per-row terms (the moment release, a robust meat of per-row scores, the
      residual variance) have m times the row-level sensitivity: replacing a unit replaces at most m rows,
      each changing the sum by at most the row-level bound (pair the rows of the two units; an unpaired row
      changes it by at most the same bound);
    * a clustered meat sums the scores of each cluster (the unit, or a coarser public grouping of units) and
      clips the cluster's sum: replacing a unit changes one cluster's term.

    The sums are normalised by n̂ = N·k̂, with k̂ the mean number of (kept) rows per unit released as the
    constant's own entry of the moment release: post-processing of a release, so the working scale, the step
    sizes and the covariances keep their row-level meaning without publishing n.

    What truncation does to the estimand: with units of more than m rows the fit estimates the 2SLS
    coefficient of the data in which each such unit keeps m random rows, i.e. its rows are down-weighted by
    m/kᵤ. When the coefficient is the same for every unit (no heterogeneity correlated with unit size) this
    changes nothing in expectation; otherwise large units count for less. No unit with at most m rows is
    changed.

Clusters (``cov_type="clustered"``)
    The clustered sandwich groups the scores by the privacy unit, or by ``clusters=``: a *public* grouping of
    the units (each unit in one cluster, which cluster each unit belongs to declared public, as the row count
    is; e.g. states), of which the number G is public. With row-level privacy every row is a unit, so any
    public grouping of rows serves. The meat's sensitivity (one cluster's clipped term changes) rests on that
    declaration: were a unit's cluster private, a neighbour could move it to another cluster and change two
    terms (twice the sensitivity). Clustering by the privacy unit itself needs no declaration.

The grouping itself (which rows belong to which unit or cluster, and their sizes) is data: it stays inside the
privacy boundary and only shapes the sums (:class:`RowGroups`). Rows are reordered once, clusters and units
contiguous (a sort of the codes, reused by every pass), so that a pass sums groups of consecutive rows with no
Python loop over the groups (:func:`group_sums`).
"""

from __future__ import annotations

import numbers
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd

__all__ = [
    "DEFAULT_MAX_ROWS",
    "UnitFacts",
    "RowGroups",
    "DaskGroups",
    "PrivacyUnits",
    "group_sums",
    "row_keys",
    "unit_label",
    "check_max_rows",
    "starts_of",
]

#: Default ``max_rows_per_unit``: the rows a unit may keep (see the docs' "Who is protected?" for the evidence).
DEFAULT_MAX_ROWS = 10

#: Largest ``max_rows_per_unit`` accepted: beyond it the m-fold sensitivity of the row-sum releases makes their
#: noise useless anyway (the limit is public).
MAX_MAX_ROWS = 10_000


@dataclass(frozen=True)
class UnitFacts:
    """The public facts of a fit's privacy unit and clusters (printed in the summary, kept in release records).

    Attributes
    ----------
    unit : str or None
        The privacy unit's name (a column, or "array" for an array); None for row-level privacy.
    n_units : int
        N, the number of units (the rows, at row level): public.
    max_rows : int
        m, the rows a unit may contribute (1 at row level): public.
    clusters : str or None
        The clustered covariance's grouping: None (no clustering), the unit's name, or a coarser public grouping.
    n_clusters : int or None
        G, the number of clusters: public.
    """

    unit: str | None
    n_units: int
    max_rows: int
    clusters: str | None = None
    n_clusters: int | None = None

    @property
    def row_level(self) -> bool:
        """Whether a row is the privacy unit."""
        return self.unit is None

    def describe(self) -> str:
        """'row' or "unit 'hh_id' (1,234 units, at most 10 rows each)"."""
        if self.row_level:
            return "row"
        return f"unit {self.unit!r} ({self.n_units:,} units, at most {self.max_rows} rows each)"

    def as_dict(self) -> dict:
        """JSON-ready public facts."""
        return {"unit": self.unit, "n_units": int(self.n_units), "max_rows": int(self.max_rows),
                "clusters": self.clusters, "n_clusters": None if self.n_clusters is None else int(self.n_clusters)}


@dataclass(frozen=True)
class RowGroups:
    """Contiguous groups of consecutive rows (PRIVATE: which rows form a group, and the groups' sizes, are data).

    Attributes
    ----------
    unit_starts : ndarray of int64 (N + 1,) or None
        Offsets of the units in the (reordered) rows, the last one the row count; None when a row is the unit.
    cluster_starts : ndarray of int64 (G + 1,) or None
        Offsets of the clusters (each at a unit's start); None without clusters.
    n_rows : int
        The rows (after truncation).
    n_units, n_clusters : int or None
        The public counts N and G (over every source row: a unit or cluster whose rows were all dropped for a
        missing value has no run here but is counted).
    """

    unit_starts: np.ndarray | None
    cluster_starts: np.ndarray | None
    n_rows: int
    n_units: int | None = None
    n_clusters: int | None = None

    def starts(self, level: str) -> np.ndarray:
        """The offsets of ``level`` ("unit" or "cluster"): every row its own group at row level."""
        starts = self.unit_starts if level == "unit" else self.cluster_starts
        if starts is None:
            if level == "cluster":
                raise ValueError("these rows have no clusters.")
            return np.arange(self.n_rows + 1, dtype=np.int64)
        return starts

    def count(self, level: str) -> int:
        """The public number of groups of ``level``: N or G."""
        public = self.n_units if level == "unit" else self.n_clusters
        return int(self.starts(level).shape[0] - 1) if public is None else int(public)

    @property
    def unit_level(self) -> bool:
        """Whether the rows form privacy units of several rows (else each row is a unit)."""
        return self.unit_starts is not None

    def blocks(self, rows: int = 1 << 16) -> list[slice]:
        """Slices of about ``rows`` rows each (a pass's blocks), cut only at the coarsest groups' starts."""
        return _cut(self.coarsest, self.n_rows, max(1, -(-self.n_rows // rows)))

    @property
    def coarsest(self) -> np.ndarray | None:
        """Offsets that every grouping respects (clusters contain units): where pieces of the rows may be cut."""
        return self.cluster_starts if self.cluster_starts is not None else self.unit_starts

    def pieces(self, count: int) -> list[slice]:
        """``count`` (or fewer) contiguous ranges of about equal length, cut only at the coarsest groups' starts."""
        return _cut(self.coarsest, self.n_rows, count)

    def local(self, rows: slice, level: str) -> np.ndarray:
        """The offsets of ``level``'s groups that start inside ``rows`` (a piece cut at group starts), relative to
        its start; the first is 0."""
        starts = self.starts(level)
        a, b = np.searchsorted(starts, [rows.start, rows.stop])
        return (starts[a:b] - rows.start).astype(np.int64)


@dataclass(frozen=True)
class DaskGroups:
    """The groups of Dask rows (PRIVATE): per row the unit's and the cluster's 64-bit hashes, Dask arrays with the
    rows' chunks, each unit (cluster) consecutive within one block; and their public counts."""

    unit_codes: Any
    cluster_codes: Any
    n_units: int
    n_clusters: int | None
    unit_level: bool

    def count(self, level: str) -> int:
        """The number of groups of ``level`` (public: N or G)."""
        return int(self.n_units if level == "unit" else self.n_clusters)

    def codes(self, level: str):
        """The per-row hashes of ``level`` (lazy)."""
        return self.unit_codes if level == "unit" else self.cluster_codes


def starts_of(codes: np.ndarray) -> np.ndarray:
    """Offsets of the runs of equal values in a block's codes (first 0; none for an empty block)."""
    if codes.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate([[True], codes[1:] != codes[:-1]])).astype(np.int64)


def _cut(starts: np.ndarray | None, n_rows: int, count: int) -> list[slice]:
    """Up to ``count`` slices covering range(n_rows), each boundary one of ``starts`` (any row without)."""
    count = max(1, min(count, n_rows))
    targets = np.linspace(0, n_rows, count + 1)[1:-1]
    if starts is None:
        cuts = np.round(targets).astype(np.int64)
    else:
        cuts = starts[np.clip(np.searchsorted(starts, targets), 0, len(starts) - 1)]
    edges = np.unique(np.concatenate([[0], cuts, [n_rows]]))
    return [slice(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


@dataclass(frozen=True)
class PrivacyUnits:
    """A fit's privacy unit and clusters: the public facts and the (private) reordering and grouping of the rows.

    Attributes
    ----------
    facts : UnitFacts
        Public: the unit, N, m, the clusters and G.
    order : ndarray of int64 or None
        PRIVATE: positions of the kept design rows, clusters and units contiguous (units truncated to m rows);
        None on Dask, where the grouped rows are ``rows``.
    groups : RowGroups or DaskGroups
        PRIVATE: the groups of the reordered rows.
    truncated_units : int
        NON-PRIVATE diagnostic: units that had more than m rows (some of their rows were left out).
    dropped_rows : int
        NON-PRIVATE diagnostic: rows left out by the truncation.
    rows : object
        On Dask, the grouped design (:class:`dpivreg.data.dask_units.DaskGroupedRows`); None in memory.
    """

    facts: UnitFacts
    order: np.ndarray
    groups: RowGroups
    truncated_units: int = 0
    dropped_rows: int = 0
    rows: Any = None

    @property
    def row_level(self) -> bool:
        """Whether a row is the privacy unit (then the reordering only groups clusters)."""
        return self.facts.row_level

    def rows_of(self, design):
        """The kept rows of ``design`` in the grouping's order, for the fit's passes: a gathering view
        (:class:`dpivreg.data.design.ReorderedDesign`) in memory, the grouped Dask design (``rows``) on Dask."""
        return self.rows if self.rows is not None else design.reordered(self.order, self.groups)


def check_max_rows(value: Any) -> int:
    """``max_rows_per_unit`` checked: an integer in [1, MAX_MAX_ROWS]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"max_rows_per_unit must be a positive integer (the rows a unit may contribute, public), "
                        f"got {value!r}.")
    if not 1 <= int(value) <= MAX_MAX_ROWS:
        raise ValueError(f"max_rows_per_unit must be between 1 and {MAX_MAX_ROWS:,}, got {value}: the releases that "
                         "sum rows have max_rows_per_unit times the row-level sensitivity.")
    return int(value)


def row_keys(seed: int, positions: np.ndarray) -> np.ndarray:
    """A uniform 64-bit key per row from the seed and the row's position (SplitMix64, Steele, Lea & Flood 2014):
    the same for a row wherever it is processed, independent of the data; the truncation keeps each unit's rows
    with the smallest keys."""
    with np.errstate(over="ignore"):
        x = np.asarray(positions, dtype=np.uint64) + np.uint64(seed % (1 << 64))
        x = x * np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


# ---------------------------------------------------------------------------- per-group sums of per-row terms
#: Rows of per-row terms held at once by :func:`group_sums` (times the terms' width, in doubles: about 4 MB).
GROUP_CHUNK_VALUES = 1 << 19


def group_sums(row_terms: Callable[[slice], np.ndarray], starts: np.ndarray, n_rows: int,
               consume: Callable[[np.ndarray], None], *, width: int) -> None:
    """Call ``consume(S)`` with the per-group sums S (g, d) of the per-row terms, every group once, in order.

    ``row_terms(rows)`` returns the terms (len(rows), d) of consecutive rows; ``starts`` are the groups' offsets
    (first 0; without the final n_rows, or with it). The rows are read in chunks of at most about
    :data:`GROUP_CHUNK_VALUES` / ``width`` rows cut only where a group starts, so that each group's sum is computed
    from its own rows alone, in an order fixed by its own size: with privacy units the rows before a unit are private
    (a neighbour's unit may have more or fewer of them), and a group spliced across a chunk edge would be summed in an
    order that depends on them — its computed sum, and so the release, would change with rows that are not its own
    (Casacuberta et al. 2022; :mod:`dpivreg.privacy.rounding`). A group longer than a chunk is summed in chunks
    counted from its own first row. The memory held is a chunk's terms whatever the groups' sizes; the Python loop
    runs over the chunks, not the groups.
    """
    starts = np.asarray(starts, dtype=np.int64)
    starts = starts[starts < n_rows]
    ends = np.append(starts[1:], n_rows)
    chunk = max(1, GROUP_CHUNK_VALUES // max(1, width))
    i = 0
    while i < starts.size:
        first = int(starts[i])
        if ends[i] - first > chunk:  # one long group, in chunks from its own first row
            total = None
            for a in range(first, int(ends[i]), chunk):
                part = np.add.reduce(row_terms(slice(a, min(a + chunk, int(ends[i])))), axis=0)
                total = part if total is None else total + part
            consume(total[None, :])
            i += 1
            continue
        j = int(np.searchsorted(ends, first + chunk, side="right"))  # the whole groups that fit in one chunk
        terms = row_terms(slice(first, int(ends[j - 1])))
        consume(np.add.reduceat(terms, starts[i:j] - first, axis=0))
        i = j


def unit_label(value: Any) -> str:
    """A name for the privacy unit or the clusters (public: what the caller passed): the column's name, or the
    Series' name, or "array"."""
    if isinstance(value, Hashable) and not isinstance(value, (np.ndarray, pd.Series, pd.Index)):
        return str(value)
    name = getattr(value, "name", None)
    return "array" if name is None else str(name)
