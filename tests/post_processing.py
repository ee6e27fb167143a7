"""Checks that a statistic is post-processing of releases: the fit's design is made to raise on any data read."""

from __future__ import annotations

#: The design's accessors that read rows or their values.
READERS = ("row_block", "blockwise_sum", "map_blocks")
VALUES = ("column_range", "factor", "values")


def forbid_data_reads(monkeypatch, design, what: str) -> None:
    """Make every row or value accessor of ``design``'s class raise ``AssertionError(f"{what} read the data")``."""

    def forbidden(*args, **kwargs):
        raise AssertionError(f"{what} read the data")

    for name in READERS:
        if hasattr(type(design), name):
            monkeypatch.setattr(type(design), name, forbidden)
    for name in VALUES:
        monkeypatch.setattr(type(design), name, property(forbidden), raising=False)
