"""Generated source for the small-shape pass: the unrolled kernels and their on-disk cache.

For small shapes on large blocks, :func:`dpivreg.compute.kernels.block_sums` runs a numba loop written out for
the shape (:func:`unrolled_source`: every row's work over scalars held in registers), about three times faster
than the general tiled loop at p = q = 5. This module writes that source, stores it in a cache directory named by
its hash so that numba's disk cache stays valid across processes (:func:`kernel_cache_directory`), and compiles
it (:func:`unrolled_kernel`). It emits code; the kernels that use it and the arithmetic they must match live in
:mod:`dpivreg.compute.kernels`.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
from functools import lru_cache
from pathlib import Path


def unrolled_source(q: int, p_endog: int, width: int, k_lead: int, grouped: bool, z_row: int | None = None,
                    x_row: int | None = None) -> str:
    """Python source of two kernels with :func:`_fused_rows`'s arguments after ``Y, M, clips`` (``S1, s2, counts``)
    for this shape: ``columns(Z_columns, X_columns, Y, M, clips, ...)``, the columns passed as tuples of 1-D arrays
    of unit stride (column-major blocks), and ``rows(Z_flat, X_flat, Y, M, clips, ...)`` for blocks whose rows are
    each contiguous, passed as 1-D arrays in which row i starts at i·z_row and i·x_row (default q and p_endog;
    written into the source, a constant stride lets the compiler load whole rows into vectors: measured 1.5-1.7
    times faster than copying tiles of rows into column buffers at p = q = 5). Same arithmetic as the tiled loop
    (norms ‖z‖·‖r‖ and ‖x̃‖·abs(e) per group, factors min(1, γ/norm) for finite γ, the instruments scaled by their
    group's factor and the residual by the second stage's), so the sums agree to rounding; ``k_lead`` and
    ``grouped`` as ``split`` there."""
    z_row = q if z_row is None else z_row
    x_row = p_endog if x_row is None else x_row
    last = width - 1
    lead_z, rest_z = range(k_lead), range(k_lead, q)
    lead_x, rest_x = range(p_endog, p_endog + k_lead), range(p_endog + k_lead, last)
    groups = (0, 1, 2, 3) if grouped else (0, 2)
    rest1, rest2 = (1, 3) if grouped else (0, 2)

    def total(terms) -> str:
        return " + ".join(terms) or "0.0"

    def setup() -> list[str]:
        return ["    " + "; ".join(f"m{k}_{j} = M[{k}, {j}]" for k in range(q) for j in range(width)),
                *(f"    c{g} = clips[{g}]; finite{g} = c{g} < np.inf; l{g} = clips[{4 + g}]"
                  for g in groups),
                "    " + "; ".join([f"a{k}_{j} = 0.0" for k in range(q) for j in range(p_endog)]
                                   + [f"b{j} = 0.0" for j in range(p_endog, last)]),
                "    clipped1 = 0; clipped2 = 0; overflow = 0"]

    def row(pad: str, z: str, x: str, y: str) -> list[str]:
        """One row's work; ``z``, ``x``, ``y``: how to read instrument k, regressor j and the outcome."""
        body = ["; ".join(f"z{k} = {z.format(k=k)}" for k in range(q)),
                *(f"u{j} = " + total(f"m{k}_{j} * z{k}" for k in range(q)) for j in range(width)),
                "; ".join(f"r{j} = u{j} - {x.format(j=j)}" for j in range(p_endog)),
                "rr = " + total(f"r{j} * r{j}" for j in range(p_endog)),
                f"e = u{last} - {y}"]
        body.append("norm_r = np.sqrt(rr); abs_e = abs(e)")
        if grouped:
            body += [f"n{g} = np.sqrt({total(terms)})"
                     for g, terms in ((0, [f"z{k} * z{k}" for k in lead_z]), (1, [f"z{k} * z{k}" for k in rest_z]),
                                      (2, [f"u{j} * u{j}" for j in lead_x]), (3, [f"u{j} * u{j}" for j in rest_x]))]
        else:
            body.append(f"n0 = np.sqrt({total(f'z{k} * z{k}' for k in range(q))})")
            body.append(f"n2 = np.sqrt({total(f'u{j} * u{j}' for j in range(p_endog, last))})")
        for g in groups:  # inexact factors (a norm at its limit, or not finite) flagged: group_clips
            other = "norm_r" if g < 2 else "abs_e"
            body.append(f"g{g} = n{g} * {other}")
            body.append(f"overflow += finite{g} & (not n{g} + {other} < l{g})")
            body.append(f"f{g} = min(1.0, c{g} / g{g}) if finite{g} else 1.0")
        body += [f"clipped1 += (f0 < 1.0) | (f{rest1} < 1.0)",
                 f"clipped2 += (f2 < 1.0) | (f{rest2} < 1.0)",
                 "; ".join(f"y{k} = z{k} * f{0 if k < k_lead else rest1}" for k in range(q)),
                 f"e_lead = e * f2; e_rest = e * f{rest2}",
                 *("; ".join(f"a{k}_{j} += y{k} * r{j}" for j in range(p_endog)) for k in range(q)),
                 *(f"b{j} += u{j} * {'e_lead' if j < p_endog + k_lead else 'e_rest'}" for j in range(p_endog, last))]
        return [pad + line for line in body]

    def finish() -> list[str]:
        return ["    " + "; ".join(f"S1[{k}, {j}] += a{k}_{j}" for j in range(p_endog)) for k in range(q)] + [
            *(f"    s2[{j - p_endog}] += b{j}" for j in range(p_endog, last)),
            "    counts[0] += clipped1; counts[1] += clipped2; counts[2] += overflow"]

    shape = f"q = {q}, p_endog = {p_endog}, width = {width}, k_lead = {k_lead}, grouped = {grouped}"
    lines = ["import numpy as np", "", "", f"def columns(Z, X, Y, M, clips, S1, s2, counts):  # {shape}",
             "    n = Y.shape[0]", *setup(), "    for i in range(n):", *row(" " * 8, "Z[{k}][i]", "X[{j}][i]", "Y[i]"),
             *finish(), "", "",
             f"def rows(Z, X, Y, M, clips, S1, s2, counts):  # {shape}, rows every {z_row} and {x_row} values",
             "    n = Y.shape[0]", *setup(), "    for i in range(n):",
             *row(" " * 8, f"Z[i * {z_row} + {{k}}]", f"X[i * {x_row} + {{j}}]", "Y[i]"), *finish()]
    return "\n".join(lines) + "\n"


def _written_source(directory: Path, name: str, source: str) -> Path:
    """``directory/name.py`` holding ``source``: written (atomically: another process never imports half a file)
    unless it already holds exactly that, so its time stamp, and numba's cache keyed by it, stay valid."""
    path = directory / f"{name}.py"
    if not path.is_file() or path.read_text(encoding="utf-8") != source:
        partial = directory / f"{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        partial.write_text(source, encoding="utf-8")
        try:
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    return path


@lru_cache(maxsize=1)
def _process_directory() -> Path:
    """A temporary directory for this process's generated kernels when the cache cannot hold them, removed at exit."""
    directory = Path(tempfile.mkdtemp(prefix="dpivreg-kernels-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


def kernel_cache_directory() -> Path | None:
    """Where the generated kernels' sources go (numba caches their compiled code beside them, in ``__pycache__``):
    ``$DPIVREG_CACHE_DIR``, else ``dpivreg`` in ``$XDG_CACHE_HOME`` (``~/.cache``); None if it cannot be created
    (each process then compiles the kernels it uses, from sources in a temporary directory)."""
    base = os.environ.get("DPIVREG_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "dpivreg")
    directory = Path(base) / "kernels"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return directory if os.access(directory, os.W_OK) else None


@lru_cache(maxsize=None)
def unrolled_kernel(q: int, p_endog: int, width: int, k_lead: int, grouped: bool, z_row: int | None = None,
                    x_row: int | None = None):
    """The kernels ``columns`` and ``rows`` of :func:`unrolled_source` for this shape, compiled by numba with the
    tiled loop's settings (on first call). Their source is written to a file named by its hash, rewritten only if
    missing or different (so numba's disk cache, keyed by the file's time stamp, stays valid), and imported; if the
    cache directory cannot take it (not writable, a directory or an undecodable file in its place), from this
    process's temporary directory instead."""
    import numba

    source = unrolled_source(q, p_endog, width, k_lead, grouped, z_row, x_row)
    name = f"fused_q{q}_p{p_endog}_w{width}_k{k_lead}{'g' if grouped else ''}_" + hashlib.sha256(
        source.encode()).hexdigest()[:12]
    directory = kernel_cache_directory()
    try:
        path = _written_source(directory or _process_directory(), name, source)
    except (OSError, UnicodeError):  # a bad cache file must not stop a fit
        path = _written_source(_process_directory(), name, source)
    spec = importlib.util.spec_from_file_location(f"dpivreg_generated_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # numba's cached code refers to its function's module by name
    spec.loader.exec_module(module)
    compile_ = numba.njit(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "contract", "nsz"})
    return compile_(module.columns), compile_(module.rows)
