"""NON-PRIVATE statistics of the design from its columns' triangular factor: the rank checks and the
2SLS benchmark.

Both kinds of design (in memory and Dask) compute, in the pass that builds and checks them, the
triangular factor R of their columns [dependent, exog, endog, instruments] divided by each column's
largest absolute value (TSQR: the R of every block of rows, stacked and factored again), so that the
scaled columns are V = QR with Q orthonormal. R has the singular values of every subset of columns,
so the rank checks read it instead of the rows, and every least-squares problem of 2SLS is solved on
R's small blocks (no normal equations, whose condition number is the square). The 2SLS benchmark then
needs one more pass, for the residuals' Σeᵢ² and the robust covariance's middle matrix.

Nothing here is private: the factor, the checks' verdicts and the benchmark are computed from the
raw data without noise. They validate the private estimate and must never be published.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from dpivreg.errors import DATA_CHECK_NOTE
from dpivreg.privacy.units import group_sums

__all__ = ["ColumnFactor", "CrossProductIV2SLS", "block_factor", "combine_factors", "r_factor",
           "factor_rank", "check_factor_rank", "factor_rank_finding", "independent_columns", "rank_error",
           "iv2sls_from_factor", "iv2sls_benchmark",
           "residual_block"]


# ---------------------------------------------------------------------------
# The factor
# ---------------------------------------------------------------------------
def r_factor(values: np.ndarray) -> np.ndarray:
    """The d × d triangular factor R of values = QR (zero rows appended when there are fewer than d rows)."""
    d = values.shape[1]
    r = np.linalg.qr(values, mode="r") if values.shape[0] else np.zeros((0, d))
    return np.vstack([r, np.zeros((d - r.shape[0], d))]) if r.shape[0] < d else r


def block_factor(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scale, R) of one block of finite rows: each column's largest absolute value and the R of the columns divided
    by it (an all-zero column divided by 1)."""
    scale = np.max(np.abs(values), axis=0, initial=0.0)
    unit = np.where(scale > 0, scale, 1.0)
    return scale, r_factor(values / unit)


def combine_factors(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The (unit, R) of all rows from the blocks' (scale, R): R of V·diag(c) is R·diag(c), so every block's
    R is brought to the global column units, stacked and factored again (TSQR)."""
    scale = np.max([s for s, _ in parts], axis=0)
    unit = np.where(scale > 0, scale, 1.0)
    return unit, r_factor(np.vstack([r * (s / unit) for s, r in parts]))


@dataclass(frozen=True)
class ColumnFactor:
    """The columns' triangular factor: data[:, cols] = Q · R[:, cols] · diag(scale[cols]) (NON-PRIVATE).

    Attributes
    ----------
    scale : ndarray (d,)
        The largest absolute value per column over the rows, 1 for an all-zero column.
    r : ndarray (d, d)
        The triangular factor of the columns divided by ``scale``.
    """

    scale: np.ndarray
    r: np.ndarray

    def r_columns(self, cols: list[int]) -> np.ndarray:
        """R[:, cols] in original units: the data's columns ``cols`` equal Q·R[:, cols] (Q orthonormal)."""
        return self.r[:, cols] * self.scale[cols]

    def cross_products(self, rows: list[int], cols: list[int]) -> np.ndarray:
        """Σ aᵢbᵢᵀ in original units for the columns at positions ``rows`` and ``cols``."""
        return self.r_columns(rows).T @ self.r_columns(cols)


# ---------------------------------------------------------------------------
# Rank (the design's checks)
# ---------------------------------------------------------------------------
def factor_rank(r: np.ndarray, nobs: int) -> int:
    """Rank of the nobs × k columns whose triangular factor is ``r`` (k columns), with the tolerance
    of ``numpy.linalg.matrix_rank`` on the columns themselves: σ_max · max(nobs, k) · eps."""
    if r.shape[1] == 0:
        return 0
    singular = np.linalg.svd(r, compute_uv=False)
    tol = singular.max() * max(nobs, r.shape[1]) * np.finfo(np.float64).eps
    return int(np.count_nonzero(singular > tol))


def check_factor_rank(r: np.ndarray, nobs: int, columns: list[Hashable], label: str) -> None:
    """Raise :func:`rank_error` if the columns with triangular factor ``r`` are collinear
    (:func:`factor_rank_finding`)."""
    finding = factor_rank_finding(r, nobs, columns, label)
    if finding is not None:
        raise ValueError(finding)


def factor_rank_finding(r: np.ndarray, nobs: int, columns: list[Hashable], label: str) -> str | None:
    """The message of :func:`rank_error` if the columns with triangular factor ``r`` are collinear, else None.

    The columns are scaled to a largest absolute value of 1 first, so a column in the 1e13 (GDP in dollars) next to an
    intercept, or one scaled by 1e-300, is not called collinear: the working scale of the private fit
    rescales every column anyway. This deviates on purpose from linearmodels, whose rank check runs on
    the raw columns and rejects such designs. Genuinely collinear columns stay collinear.
    """
    rank = factor_rank(r, nobs)
    if rank == r.shape[1]:
        return None
    lo, hi = 1, r.shape[1]
    while lo < hi:  # the first prefix that is rank deficient (full rank of a prefix is monotone)
        mid = (lo + hi) // 2
        if factor_rank(r[:, :mid], nobs) < mid:
            hi = mid
        else:
            lo = mid + 1
    return str(rank_error(columns, rank, lo - 1, label))


def independent_columns(r: np.ndarray, nobs: int, columns: list[int]) -> list[int]:
    """The columns (positions into ``r``'s columns) kept when each of ``columns`` in turn is omitted if it is a
    linear combination of those kept before it (as Stata's ``ivregress`` omits collinear regressors and
    instruments, "omitted because of collinearity"); the same rank rule as :func:`factor_rank_finding`."""
    kept: list[int] = []
    for c in columns:
        if factor_rank(r[:, kept + [c]], nobs) == len(kept) + 1:
            kept.append(c)
    return kept


def rank_error(columns: list[Hashable], rank: int, bad: int, label: str) -> ValueError:
    """The error for a rank-deficient block; ``bad`` is the first collinear column's position."""
    name = columns[bad]
    return ValueError(
        f"{label} does not have full column rank (rank {rank} < {len(columns)} "
        f"columns): column {name!r} is a linear combination of the columns before "
        f"it in {columns}. Drop a collinear column (e.g. {name!r}). {DATA_CHECK_NOTE}"
    )


# ---------------------------------------------------------------------------
# The 2SLS benchmark
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class CrossProductIV2SLS:
    """NON-PRIVATE 2SLS from cross-products (never publish it).

    Equal (to rounding) to ``linearmodels.iv.IV2SLS(...).fit()`` with its default robust (HC0)
    covariance and ``debiased=False``: ``params``, ``std_errors``, ``cov``, ``tstats``, ``pvalues``,
    ``conf_int()``, ``nobs``, ``cov_type``, ``resid_ss``; and with ``cov_type="unadjusted"`` for
    ``unadjusted_cov`` / ``unadjusted_std_errors``. For linearmodels' full results object (first-stage
    diagnostics, tests, its summary) use ``DPIVResults.benchmark_linearmodels`` (in-memory designs).
    """

    params: pd.Series
    cov: pd.DataFrame
    unadjusted_cov: pd.DataFrame
    nobs: int
    resid_ss: float
    cov_type: str = "robust"
    #: Regressors and instruments left out as collinear with those before them (Stata's "omitted because of
    #: collinearity"), or all-zero declared levels: their coefficients are NaN.
    omitted: tuple = ()

    @property
    def std_errors(self) -> pd.Series:
        """Robust standard errors (sqrt of the diagonal of ``cov``)."""
        return pd.Series(np.sqrt(np.diag(self.cov.to_numpy())), index=self.params.index, name="stderr")

    @property
    def unadjusted_std_errors(self) -> pd.Series:
        """Homoskedastic standard errors (sqrt of the diagonal of ``unadjusted_cov``)."""
        return pd.Series(np.sqrt(np.diag(self.unadjusted_cov.to_numpy())), index=self.params.index,
                         name="stderr")

    @property
    def tstats(self) -> pd.Series:
        """params / std_errors."""
        return (self.params / self.std_errors).rename("tstat")

    @property
    def pvalues(self) -> pd.Series:
        """Two-sided p-values under the normal approximation."""
        return pd.Series(2.0 * stats.norm.sf(np.abs(self.tstats.to_numpy())), index=self.params.index,
                         name="pvalue")

    def conf_int(self, level: float = 0.95) -> pd.DataFrame:
        """Normal confidence intervals, columns ``lower`` and ``upper``."""
        half = stats.norm.ppf(0.5 + level / 2.0) * self.std_errors
        return pd.DataFrame({"lower": self.params - half, "upper": self.params + half})


def residual_block(block: np.ndarray, beta: np.ndarray, x_pos: list[int], z_pos: list[int],
                   Pi: np.ndarray) -> tuple[float, np.ndarray]:
    """Σeᵢ² and Σ x̂ᵢx̂ᵢᵀeᵢ² of one block of design rows, e = y − Xβ, x̂ᵢ = Πᵀzᵢ formed row by row (as
    linearmodels does)."""
    e = block[:, 0] - block[:, x_pos] @ beta
    xe = (block[:, z_pos] @ Pi) * e[:, None]
    return float(e @ e), xe.T @ xe


def _triangular_inverse(A: np.ndarray) -> np.ndarray:
    """(AᵀA)⁻¹ from the R factor of A (QR), without forming AᵀA (which squares the condition number)."""
    r = np.linalg.qr(A, mode="r")
    r_inv = np.linalg.solve(r, np.eye(r.shape[0]))
    return r_inv @ r_inv.T


def iv2sls_from_factor(factor: ColumnFactor, positions: dict[str, list[int]], nobs: int,
                       names: list[Hashable], residual_pass: Callable[..., tuple[float, np.ndarray]]
                       ) -> CrossProductIV2SLS:
    """2SLS and its robust (HC0) and unadjusted covariance from the columns' factor and one residual pass.

    With Z = Q·Rz, X = Q·Rx, y = Q·ry for one orthonormal Q, the first stage Π = argmin‖Rz Π − Rx‖, the
    fitted X̂ = Q·(Rz Π) and β = argmin‖Rz Π β − ry‖ (least squares on the small blocks). The bread is
    (X̂ᵀX̂)⁻¹; ``residual_pass(residual_block, beta, x_pos, z_pos, Pi)`` returns the sums of
    :func:`residual_block` over all rows: Σeᵢ² (unadjusted: s² = Σeᵢ²/n) and the robust meat.
    """
    z, x = positions["z"], positions["x"]
    Rz, Rx, ry = (factor.r_columns(c) for c in (z, x, [0]))
    Pi = np.linalg.lstsq(Rz, Rx, rcond=None)[0]
    fitted = Rz @ Pi
    beta = np.linalg.lstsq(fitted, ry[:, 0], rcond=None)[0]
    resid_ss, meat = residual_pass(residual_block, beta, x, z, Pi)
    bread = _triangular_inverse(fitted)
    robust = bread @ meat @ bread
    unadjusted = bread * (resid_ss / nobs)

    def frame(matrix: np.ndarray) -> pd.DataFrame:
        return pd.DataFrame((matrix + matrix.T) / 2.0, index=names, columns=names)

    return CrossProductIV2SLS(params=pd.Series(beta, index=names, name="parameter"), cov=frame(robust),
                              unadjusted_cov=frame(unadjusted), nobs=int(nobs), resid_ss=float(resid_ss))


def iv2sls_benchmark(design, *, units=None) -> CrossProductIV2SLS:
    """The NON-PRIVATE 2SLS benchmark of a design (in memory or Dask): :func:`iv2sls_from_factor` on the
    design's ``factor`` with its ``blockwise_sum`` as the residual pass.

    Columns allowed to be all zero that are (``design.zero_columns``: a declared level absent from the data,
    the indicator of a complete column) and columns collinear with those before them (a constant or duplicate
    instrument: the design's ``data_findings``, which do not stop a private fit) are left out of the fit, as Stata's
    ``ivregress`` omits them; their coefficients and covariances are NaN (not identified by these rows), and
    ``omitted`` names them. With fewer independent instruments than regressors every value is NaN.

    ``units`` (:class:`dpivreg.privacy.units.PrivacyUnits`, with privacy units or clusters): 2SLS on the rows the fit
    keeps, with linearmodels' clustered covariance (``debiased=False``) by the fit's clusters, when it has any,
    instead of HC0: the meat Σ_c ξ_c ξ_cᵀ of the clusters' summed x̂ᵢeᵢ (one pass over the rows in the fit's
    order)."""
    factor = design.factor if units is None or units.dropped_rows == 0 else units.rows_of(design).factor
    positions = _identified_positions(design, factor)
    names = design.column_names
    omitted = tuple(names[c] for c in design.positions["x"] + design.positions["instruments"]
                    if c not in positions["x"] + positions["z"])
    everyone = design.regressor_names
    if len(positions["z"]) < len(positions["x"]):  # fewer independent instruments than regressors
        return _unidentified(everyone, design.nobs if units is None else units.rows_of(design).nobs, omitted)
    kept = [names[c] for c in positions["x"]]
    if units is None:
        fit = iv2sls_from_factor(factor, positions, design.nobs, kept, design.blockwise_sum)
    else:
        rows = units.rows_of(design)
        if units.facts.clusters is None:
            fit = iv2sls_from_factor(factor, positions, rows.nobs, kept, rows.blockwise_sum)
        else:
            def clustered_pass(_, *args):
                return rows.grouped_sum(clustered_residual_block, "cluster", *args)

            fit = dataclasses.replace(iv2sls_from_factor(factor, positions, rows.nobs, kept, clustered_pass),
                                      cov_type="clustered")
    if not omitted:
        return fit
    return dataclasses.replace(fit, params=fit.params.reindex(everyone),
                               cov=fit.cov.reindex(index=everyone, columns=everyone),
                               unadjusted_cov=fit.unadjusted_cov.reindex(index=everyone, columns=everyone),
                               omitted=omitted)


def _identified_positions(design, factor: ColumnFactor) -> dict[str, list[int]]:
    """The design's positions without the columns the benchmark leaves out: all-zero declared levels
    (``design.zero_columns``), then each regressor of [exog, endog] that is a linear combination of those kept before
    it, then each excluded instrument that is one of the kept exogenous columns and instruments before it
    (:func:`independent_columns`)."""
    zero = set(design.zero_columns)
    pos = design.positions
    x = independent_columns(factor.r, design.nobs, [c for c in pos["x"] if c not in zero])
    exog = [c for c in x if c in pos["exog"]]
    z = independent_columns(factor.r, design.nobs, exog + [c for c in pos["instruments"] if c not in zero])
    return {**pos, "x": x, "z": z}


def _unidentified(names: list[Hashable], nobs: int, omitted: tuple) -> CrossProductIV2SLS:
    """The benchmark of a design with fewer independent instruments than regressors: every value NaN."""
    nan = pd.DataFrame(np.nan, index=names, columns=names)
    return CrossProductIV2SLS(params=pd.Series(np.nan, index=names, name="parameter"), cov=nan, unadjusted_cov=nan,
                              nobs=int(nobs), resid_ss=float("nan"), omitted=omitted)


def clustered_residual_block(block: np.ndarray, starts: np.ndarray, beta: np.ndarray, x_pos: list[int],
                             z_pos: list[int], Pi: np.ndarray) -> tuple[float, np.ndarray]:
    """Σeᵢ² and the clustered meat Σ_c ξ_c ξ_cᵀ (ξ_c = Σ_{i∈c} x̂ᵢeᵢ) of a block of design rows holding whole
    clusters, which start at ``starts``: the clustered counterpart of :func:`residual_block`."""

    p = len(x_pos)
    meat, squares = np.zeros((p, p)), [0.0]

    def terms(rows: slice) -> np.ndarray:
        e = block[rows, 0] - block[rows][:, x_pos] @ beta
        return np.column_stack([(block[rows][:, z_pos] @ Pi) * e[:, None], e * e])

    def consume(S: np.ndarray) -> None:
        meat[:] += S[:, :p].T @ S[:, :p]
        squares[0] += float(S[:, p].sum())

    group_sums(terms, starts, block.shape[0], consume, width=p + 1)
    return squares[0], meat
