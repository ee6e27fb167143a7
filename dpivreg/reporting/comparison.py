"""Several fits side by side: :func:`compare` (linearmodels' ``compare``, with the privacy spent in the table).

Each column is one private fit (a :class:`~dpivreg.reporting.results.DPIVResults` or a saved
:class:`~dpivreg.reporting.release.FitRelease`): its estimates with the private standard errors (or z statistics, or
p-values) below them, the dependent variable, estimator, n, covariance, T, the budget spent (ρ, and ε at
the fit's δ) and its IV tests in brief (the over-identification and Wu-Hausman p-values, the effective F). With
``benchmark=True`` (the default, as in ``summary()``) each distinct design also gets a column of the IV2SLS benchmark
headed ``NON-PRIVATE IV2SLS`` (``*`` is kept for the optional significance stars); ``benchmark=False`` gives the
publishable table.

statsmodels' ``summary_col`` also takes the results (``summary_col([res_a, res_b])``): it reads the model's
``exog_names`` and ``endog_names`` in statsmodels' meaning (all regressors; the dependent variable), which
:class:`~dpivreg.DPIV2SLS` gives for it, while ``design.exog_names`` and ``design.endog_names`` keep linearmodels'
(the exogenous and the endogenous regressors). It has no row for the budget and no way to mark a column
NON-PRIVATE: ``compare`` is the table to publish; ``compare(...).params`` and ``.std_errors`` are DataFrames for
any other layout.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
from statsmodels.iolib.table import SimpleTable
from statsmodels.iolib.tableformatting import fmt_params

from dpivreg._validation import check_flag
from dpivreg.errors import InferenceUnavailableError, PrivacyLeakWarning
from dpivreg.reporting.release import FitRelease
from dpivreg.reporting.results import DPIVResults, DPIVSummary
from dpivreg.reporting.summary import Typeset, html_text, latex_text, math_label, power_of_ten
from dpivreg.reporting.tables import (
    EFFECTIVE_F,
    OVERID_ROWS,
    ROBUST_ENDOGENEITY,
    ROBUST_OVERID,
    SARGAN,
    WU_HAUSMAN,
    check_level,
    warn_benchmark_export,
)
from dpivreg.reporting.tables import format_number as _fmt

if TYPE_CHECKING:  # matplotlib is optional: imported by plot() when it draws
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["PRECISIONS", "DPIVComparison", "compare"]

Precision = Literal["std_errors", "tstats", "pvalues"]
PRECISIONS = ("std_errors", "tstats", "pvalues")
_STAR_LEVELS = ((0.01, "***"), (0.05, "**"), (0.10, "*"))
#: The HTML table's rule between the settings and the coefficients.
_HTML_RULE = 'style="border-top: 1px solid"'


def _as_named(results) -> dict[str, DPIVResults | FitRelease]:
    if isinstance(results, Mapping):
        named = {str(k): v for k, v in results.items()}
        if len(named) < len(results):
            raise ValueError("two of the names in results are the same once written as text (e.g. 1 and '1'): "
                             "give each fit its own name.")
    elif isinstance(results, Sequence) and not isinstance(results, (str, bytes)):
        named = {f"Model {i}": v for i, v in enumerate(results)}
    else:
        raise TypeError("results must be a dict {name: fit} or a list of fits (DPIVResults or FitRelease), "
                        f"got {type(results).__name__}.")
    if not named:
        raise ValueError("results is empty: give at least one fit to compare.")
    for name, res in named.items():
        if not isinstance(res, (DPIVResults, FitRelease)):
            raise TypeError(f"results[{name!r}] is a {type(res).__name__}, not a dpivreg fit (DPIVResults or "
                            "FitRelease). For linearmodels' own results use linearmodels.iv.compare.")
    return named


def _benchmark_key(res: DPIVResults) -> tuple:
    """Fits whose benchmarks are the same numbers share one benchmark column (the same design on the same rows,
    in memory or on Dask); a formula and n alone do not identify the data."""
    bench = res.benchmark  # the bytes, so that a NaN coefficient (a declared level never seen) equals itself
    return (res.design.dependent_name, tuple(bench.params.index), bench.params.to_numpy().tobytes(),
            bench.std_errors.to_numpy().tobytes())


def _statistic(res: DPIVResults | FitRelease, attr: str) -> pd.Series:
    """A fit's statistic by name; NaN for the inference's statistics of a fit that made none."""
    try:
        return getattr(res, attr)
    except InferenceUnavailableError:
        return pd.Series(np.nan, index=res.params.index)


class DPIVComparison:
    """Private fits side by side; build with :func:`compare`.

    Attributes are DataFrames indexed by regressor (the union, in order of first appearance) with one column
    per fit; a regressor a fit does not have is NaN. :attr:`summary` is the table, :meth:`plot` the picture.
    """

    def __init__(self, results: dict[str, DPIVResults | FitRelease], *, benchmark: bool, precision: str,
                 stars: bool) -> None:
        self._results = results
        self._benchmark = benchmark
        self._precision = precision
        self._stars = stars

    # ------------------------------------------------------------------ the numbers
    def _frame(self, attr: str) -> pd.DataFrame:
        columns = {name: _statistic(res, attr) for name, res in self._results.items()}
        order = list(dict.fromkeys(name for s in columns.values() for name in s.index))
        return pd.DataFrame({name: s.reindex(order) for name, s in columns.items()}, index=order)

    @property
    def params(self) -> pd.DataFrame:
        """The private estimates."""
        return self._frame("params")

    @property
    def std_errors(self) -> pd.DataFrame:
        """The private standard errors (NaN for a fit without inference)."""
        return self._frame("bse")

    @property
    def tstats(self) -> pd.DataFrame:
        """z statistics."""
        return self._frame("tvalues")

    @property
    def pvalues(self) -> pd.DataFrame:
        """Two-sided normal p-values."""
        return self._frame("pvalues")

    @property
    def nobs(self) -> pd.Series:
        """Row counts (public)."""
        return pd.Series({name: res.nobs for name, res in self._results.items()}, name="nobs")

    @property
    def rho(self) -> pd.Series:
        """Total zCDP spent per fit."""
        return pd.Series({name: res.privacy.rho for name, res in self._results.items()}, name="rho")

    @property
    def epsilon(self) -> pd.Series:
        """ε per fit at its own δ (:attr:`delta`), exact Gaussian conversion."""
        return pd.Series({name: res.epsilon for name, res in self._results.items()}, name="epsilon")

    @property
    def delta(self) -> pd.Series:
        """The δ each fit reports ε at."""
        return pd.Series({name: res.delta for name, res in self._results.items()}, name="delta")

    @property
    def iv_tests(self) -> pd.DataFrame:
        """Each fit's IV tests in brief, one row per fit (from its ``iv_tests``, post-processing of its releases):
        ``overid_test`` (the over-identification test shown: the robust one when the fit released the robust meat,
        else Sargan's; empty when exactly identified), ``overid_pval``, ``wu_hausman_pval`` (endogeneity of all the
        endogenous regressors), ``robust_endogeneity_test`` and ``robust_endogeneity_pval`` (Wooldridge's robust or
        cluster-robust score test of the same, where the fit bought its meat with ``rho_diag``; empty and NaN
        otherwise), ``effective_f`` and ``effective_f_critical`` (Montiel
        Olea-Pflueger's critical value for a worst-case bias of 10%); NaN where a fit has no such test."""
        rows = {}
        for name, res in self._results.items():
            tests = res._iv_tests_frame
            overid = next((test for test in OVERID_ROWS if test in tests.index), None)
            rows[name] = {
                "overid_test": "" if overid is None else overid,
                "overid_pval": np.nan if overid is None else tests.loc[overid, "pval"],
                "wu_hausman_pval": tests.loc[WU_HAUSMAN, "pval"] if WU_HAUSMAN in tests.index else np.nan,
                "robust_endogeneity_test": next((kind.replace("clustered", "cluster-robust")
                                                 for kind, test in ROBUST_ENDOGENEITY.items()
                                                 if test in tests.index), ""),
                "robust_endogeneity_pval": next((tests.loc[test, "pval"] for test in ROBUST_ENDOGENEITY.values()
                                                 if test in tests.index), np.nan),
                "effective_f": tests.loc[EFFECTIVE_F, "statistic"] if EFFECTIVE_F in tests.index else np.nan,
                "effective_f_critical": (tests.loc[EFFECTIVE_F, "critical_value"] if EFFECTIVE_F in tests.index
                                         else np.nan)}
        return pd.DataFrame.from_dict(rows, orient="index")

    def _iv_test_rows(self) -> list[tuple[str, list[str]]]:
        """The settings part's rows of the IV tests, those that some fit has; blank for a fit without the test and
        for the benchmark's columns."""
        tests, blank = self.iv_tests, [""] * len(self._benchmarks)
        short = {SARGAN: "Sargan", **{name: kind.replace("clustered", "cluster-robust")
                                      for kind, name in ROBUST_OVERID.items()}}
        rows = []
        if tests["overid_pval"].notna().any():
            rows.append(("Overid. p-value", [f"{r.overid_pval:.4f} ({short[r.overid_test]})" if r.overid_test else ""
                                             for r in tests.itertuples()] + blank))
        if tests["wu_hausman_pval"].notna().any():
            rows.append(("Wu-Hausman p-value", [f"{p:.4f}" if np.isfinite(p) else ""
                                                for p in tests["wu_hausman_pval"]] + blank))
        if tests["robust_endogeneity_pval"].notna().any():
            rows.append(("Robust endog. p-value", [f"{r.robust_endogeneity_pval:.4f} ({r.robust_endogeneity_test})"
                                                   if r.robust_endogeneity_test else ""
                                                   for r in tests.itertuples()] + blank))
        if tests["effective_f"].notna().any():
            rows.append(("Effective F", [f"{_fmt(r.effective_f)} (c {_fmt(r.effective_f_critical, 3)})"
                                         if np.isfinite(r.effective_f_critical) else ""
                                         for r in tests.itertuples()] + blank))
        return rows

    @property
    def _benchmarks(self) -> dict[str, DPIVResults]:
        """The benchmark columns the comparison shows (none with ``benchmark=False``): column label → fit."""
        return self._benchmark_fits if self._benchmark else {}

    @cached_property
    def _benchmark_fits(self) -> dict[str, DPIVResults]:
        """One fit per distinct design with a benchmark (the results, not the records): column label → that fit."""
        fits = {name: res for name, res in self._results.items() if isinstance(res, DPIVResults)}
        first: dict = {}
        for name, res in fits.items():
            first.setdefault(_benchmark_key(res), name)
        if len(first) == 1:
            return {"NON-PRIVATE IV2SLS": fits[next(iter(first.values()))]}
        return {f"NON-PRIVATE IV2SLS ({name})": fits[name] for name in first.values()}

    @property
    def benchmark_params(self) -> pd.DataFrame:
        """NON-PRIVATE: the IV2SLS estimates of each distinct design (empty with ``benchmark=False``)."""
        return self._benchmark_frame("params")

    @property
    def benchmark_std_errors(self) -> pd.DataFrame:
        """NON-PRIVATE: the IV2SLS standard errors of each distinct design (robust, or clustered as the fit)."""
        return self._benchmark_frame("std_errors")

    def _benchmark_frame(self, attr: str) -> pd.DataFrame:
        order = list(self.params.index)
        return pd.DataFrame({label: getattr(res.benchmark, attr).reindex(order)
                             for label, res in self._benchmarks.items()}, index=order)

    # ------------------------------------------------------------------ the table
    def _cells(self, estimate: float, below: float, pvalue: float) -> tuple[str, str]:
        if np.isnan(estimate):
            return "", ""
        stars = ""
        if self._stars and np.isfinite(pvalue):
            stars = next((mark for level, mark in _STAR_LEVELS if pvalue < level), "")
        under = "" if np.isnan(below) else f"({_fmt(below, 4) if self._precision != 'pvalues' else f'{below:.4f}'})"
        return _fmt(estimate) + stars, under

    def _info_rows(self) -> list[tuple[str, list[str]]]:
        fits = self._results.values()

        def setting(res, key):
            return res.settings[key] if isinstance(res, FitRelease) else getattr(res.settings, key)

        rows = [
            ("Dep. Variable", [res._dependent_label for res in fits]),
            ("Estimator", [res.estimator for res in fits]),
            ("Instruments", [", ".join(res.design.instrument_names if isinstance(res, DPIVResults)
                                       else res.instrument_names) for res in fits]),
            ("Privacy unit", [_unit_label(res.privacy.unit) for res in fits]),
            ("No. Observations", [str(res.nobs) if res.privacy.unit is None else f"~{res.nobs} (private)"
                                  for res in fits]),
            ("Cov. Est.", [res.cov_type if not _statistic(res, "bse").isna().all() else "none" for res in fits]),
            (math_label("Iterations T"), [str(setting(res, "T")) if res.estimator == "DP-2S-GD" else ""
                                          for res in fits]),
            (math_label("rho (zCDP)"), [_fmt(res.privacy.rho) for res in fits]),
            self._epsilon_row(),
            ("Private", ["yes" if res.is_private else "NO" for res in fits]),
            ("Noise sampler", [res.privacy.sampler for res in fits]),
        ]
        for res in self._benchmarks.values():
            d, bench = res.design, res.benchmark
            values = [d.dependent_name, "IV2SLS", ", ".join(d.instrument_names), "", str(bench.nobs), bench.cov_type,
                      "", "NON-PRIVATE", "", "NO", ""]
            rows = [(key, cells + [value]) for (key, cells), value in zip(rows, values, strict=True)]
        return rows

    def _epsilon_row(self) -> tuple[str, list[str]]:
        """ε of each fit; the δ it is at in the label when the fits share one (a narrower table), else in each cell."""
        fits = self._results.values()
        deltas = {res.delta for res in fits}
        if len(deltas) == 1:
            delta = power_of_ten(deltas.pop())
            label = Typeset(f"epsilon (delta {delta})", rf"$\varepsilon$ ($\delta$ = {delta.latex})",
                            f"ε (δ = {delta.html})")
            return label, [_fmt(res.epsilon) for res in fits]
        cells = []
        for res in fits:
            eps, delta = _fmt(res.epsilon), power_of_ten(res.delta)
            cells.append(Typeset(f"{eps} (delta {delta})", rf"{eps} ($\delta$ = {delta.latex})",
                                 f"{eps} (δ = {delta.html})"))
        return math_label("epsilon"), cells

    def _table(self) -> SimpleTable:
        below = {"std_errors": self.std_errors, "tstats": self.tstats, "pvalues": self.pvalues}[self._precision]
        params, pvalues = self.params, self.pvalues
        bench_params, bench_se = self.benchmark_params, self.benchmark_std_errors
        headers = list(self._results) + list(self._benchmarks)
        data, stubs = [], []
        for key, cells in self._info_rows() + self._iv_test_rows():
            data.append(cells)
            stubs.append(key)
        settings = len(data)
        for name in params.index:
            top, bottom = [], []
            for col in self._results:
                a, b = self._cells(params.loc[name, col], below.loc[name, col], pvalues.loc[name, col])
                top.append(a)
                bottom.append(b)
            for label in self._benchmarks:
                a, b = self._cells(bench_params.loc[name, label], bench_se.loc[name, label]
                                   if self._precision == "std_errors" else np.nan, np.nan)
                top.append(a)
                bottom.append(b)
            data += [top, bottom]
            stubs += [name, ""]
        title = "Model Comparison" + (" (NON-PRIVATE benchmark beside the fits)" if self._benchmarks else "")
        table = SimpleTable(data, headers=headers, stubs=stubs, title=title,
                            txt_fmt={**copy.deepcopy(fmt_params), "settings_dec_below": "-"},
                            ltx_fmt={"settings_dec_below": r"\midrule"}, csv_fmt={"settings_dec_below": None})
        # a rule between the settings and the coefficients: below the last settings row (row 0 is the header) in
        # text and LaTeX, above the first coefficient row in HTML (statsmodels draws no rule below an HTML row)
        table[settings].dec_below = "settings_dec_below"
        # the benchmark headers on lines of their own in LaTeX and HTML (statsmodels keeps only a header's text)
        first = len(table[0]) - len(self._benchmarks)
        for cell, label in zip(table[0][first:], self._benchmarks, strict=True):
            cell.data = _stacked_header(label)
        table[settings + 1].add_format("html", data_fmts=[f"<td {_HTML_RULE}>%s</td>"],
                                       stub=f"<th {_HTML_RULE}>%s</th>")
        return table

    def _notes(self) -> list[str]:
        what = {"std_errors": "private standard errors", "tstats": "z statistics",
                "pvalues": "p-values"}[self._precision]
        notes = [f"{what.capitalize()} in parentheses (normal approximation, including the privacy noise)."]
        if self._stars:
            notes.append("Stars: *** p < 0.01, ** p < 0.05, * p < 0.1 (private p-values).")
        notes.append("Each fit's privacy is its own: fits of the same data compose, their rho add up (for the same "
                     "privacy unit; a row-level rho costs a unit of k rows k^2 rho).")
        tests = self.iv_tests
        if tests[["overid_pval", "wu_hausman_pval", "robust_endogeneity_pval", "effective_f"]].notna().any(axis=None):
            notes.append("IV tests (post-processing of each fit's releases): the p-values of the overidentification "
                         "test (Wooldridge's robust score test where the fit released the robust meat, else Sargan's) "
                         "and of the Wu-Hausman test of exogeneity of the endogenous regressors (and of Wooldridge's "
                         "robust score test of it where the fit bought its meat), each against its law "
                         "under the null with the fit's privacy noise; the effective F (Montiel Olea-Pflueger) with c, "
                         "its critical value for a worst-case bias of 10%.")
        if self._benchmarks:
            kinds = " or ".join(sorted({res.benchmark.cov_type for res in self._benchmarks.values()}))
            notes.append(f"NON-PRIVATE: the IV2SLS column(s) are computed from the raw data without noise ({kinds} "
                         "std. errors below); use them to validate, never publish them (benchmark=False).")
        for name, res in self._results.items():
            notes.extend(f"{name}: {note}" for note in res.cautions)
            if res.leaks:
                notes.append(f"PRIVACY LEAKS in {name}: " + " ".join(res.leaks))
        return notes

    @property
    def summary(self) -> DPIVSummary:
        r"""The table as a statsmodels ``Summary`` (``as_text``, ``as_latex``, ``as_html``, ``as_csv``).

        A rule separates the settings from the coefficients. ``as_latex`` needs the packages ``booktabs``,
        ``graphicx`` and ``amssymb``: it shrinks a table wider than the line to the line width (``\resizebox``), sets
        the benchmark's headers on lines of their own, and ρ, ε, δ and T as mathematics."""
        smry = DPIVSummary()
        smry.non_private = bool(self._benchmarks)
        smry.remedy = "compare(..., benchmark=False)"
        smry.tables.append(self._table())
        smry.add_extra_txt(self._notes())
        return smry

    # ------------------------------------------------------------------ the picture
    def plot(self, *, level: float = 0.95, ax: Axes | Sequence[Axes] | None = None,
             coefficients: str | Sequence[str] | None = None, benchmark: bool | None = None) -> Figure:
        """A coefficient plot: each fit's private estimate and its private interval, a panel per coefficient.

        The fits are the rows of each panel, in the table's order (a fit without inference shows its estimate
        alone); each panel has its own scale, so that an intercept and a slope are both legible. With the
        benchmark, each distinct design's IV2SLS estimate and interval follow below a thin line, drawn as hollow
        grey squares with dashed intervals and labelled ``IV2SLS (NON-PRIVATE)`` in the legend, and the call
        warns with a :class:`~dpivreg.PrivacyLeakWarning`, as the table's exports do. Needs matplotlib
        (``pip install dpivreg[plot]``).

        Parameters
        ----------
        level : float, default 0.95
            Coverage of the intervals, in (0, 1): the private intervals are ``conf_int(level=level)`` of each fit
            (normal approximation, including the privacy noise), the benchmark's its normal interval.
        ax : matplotlib.axes.Axes or sequence of Axes, optional
            Where to draw: one Axes per coefficient plotted. By default a new figure with up to three panels a
            row.
        coefficients : str or sequence of str, optional
            The coefficients to plot, in this order (default: all, in the table's order).
        benchmark : bool, optional
            Draw the NON-PRIVATE IV2SLS benchmark; by default as the comparison does (``compare(...,
            benchmark=...)``). ``False`` gives a publishable picture of a comparison made with the benchmark.

        Returns
        -------
        matplotlib.figure.Figure
            The figure drawn on (that of ``ax`` when given).

        Raises
        ------
        ValueError
            For a ``level`` outside (0, 1), a coefficient the comparison does not have, ``benchmark=True`` when
            no fit has a benchmark (release records hold none), or a number of Axes that is not the number of
            coefficients.
        ImportError
            Without matplotlib.

        Examples
        --------
        >>> fits = {f"rho = {r}": model.fit(rho=r, bounds=LABSUP_BOUNDS) for r in (0.5, 2.6, 10)}  # doctest: +SKIP
        >>> compare(fits, benchmark=False).plot(level=0.9).savefig("coefficients.pdf")  # doctest: +SKIP
        """
        level = check_level(level)
        names = self._plot_names(coefficients)
        show = self._benchmark if benchmark is None else check_flag(benchmark, "benchmark")
        benchmarks = self._benchmark_fits if show else {}
        if benchmark and not benchmarks:
            raise ValueError("benchmark=True, but none of the fits has a benchmark: a release record (FitRelease) "
                             "holds none; compare the fits' results (DPIVResults) to draw it.")
        plt = _pyplot()
        if ax is None:
            columns = min(len(names), 3)
            rows = -(-len(names) // columns)
            height = 0.32 * (len(self._results) + len(benchmarks)) + 0.9
            fig, grid = plt.subplots(rows, columns, sharey=True, squeeze=False, layout="constrained",
                                     figsize=(1.8 + 2.8 * columns, height * rows + 0.5))
            axes = list(grid.flat)
            for unused in axes[len(names):]:
                fig.delaxes(unused)
        else:
            axes = [ax] if not isinstance(ax, (Sequence, np.ndarray)) else list(np.ravel(ax))
            if len(axes) != len(names):
                raise ValueError(f"ax: give one Axes per coefficient plotted ({len(names)}), got {len(axes)}.")
            fig = axes[0].figure
        if benchmarks:
            warn_benchmark_export("the plot", "plot(benchmark=False)", stacklevel=2)
        lines = [(name, res.params, _private_interval(res, level), False) for name, res in self._results.items()]
        lines += [(label, res.benchmark.params, res.benchmark.conf_int(level), True)
                  for label, res in benchmarks.items()]
        labels = [label + (" (no interval)" if ci.isna().all(axis=None) else "") for label, _, ci, _ in lines]
        handles = {}
        for panel, name in zip(axes, names):
            handles.update(_draw_panel(panel, name, lines))
            panel.set_yticks(range(len(lines)), labels)
            for tick, (*_, nonprivate) in zip(panel.get_yticklabels(), lines):
                tick.set_color(_BENCHMARK_STYLE["color"] if nonprivate else "black")
            panel.set_ylim(len(lines) - 0.5, -0.5)  # the first fit on top
            if benchmarks:
                panel.axhline(len(self._results) - 0.5, color="0.8", linewidth=0.8)
            panel.set_title(name)
        legend = {False: f"private estimate, {100 * level:g}% interval", True: "IV2SLS (NON-PRIVATE)"}
        kinds = sorted(handles)
        if ax is None:
            fig.legend([handles[k] for k in kinds], [legend[k] for k in kinds], loc="outside lower center",
                       ncols=len(kinds), frameon=False)
        else:
            axes[0].legend([handles[k] for k in kinds], [legend[k] for k in kinds], fontsize="small")
        return fig

    def _plot_names(self, coefficients) -> list[str]:
        """The coefficients to plot (all by default), checked against the comparison's."""
        known = list(self.params.index)
        if coefficients is None:
            return known
        if isinstance(coefficients, str):
            coefficients = [coefficients]
        elif not isinstance(coefficients, Sequence):
            raise TypeError(f"coefficients must be a name or a list of names, got {type(coefficients).__name__}.")
        chosen = list(coefficients)
        if not chosen:
            raise ValueError("coefficients is empty: name at least one, or leave it out to plot them all.")
        unknown = [c for c in chosen if c not in known]
        if unknown:
            raise ValueError(f"unknown coefficient(s) {', '.join(map(repr, unknown))}: the comparison's coefficients "
                             f"are {', '.join(map(repr, known))}.")
        if len(set(chosen)) < len(chosen):
            raise ValueError(f"coefficients names one twice: {chosen!r}.")
        return chosen

    def __str__(self) -> str:
        return self.summary.as_text()

    def __repr__(self) -> str:
        return self.__str__()

    def _repr_html_(self) -> str:
        return self.summary.as_html()


def compare(results, *, benchmark: bool = True, precision: Precision = "std_errors",
            stars: bool = False) -> DPIVComparison:
    """Compare private fits side by side (linearmodels' ``compare`` for DP fits).

    Parameters
    ----------
    results : dict or list
        ``{name: fit}`` (column names) or a list of fits (named ``Model 0``, ``Model 1``, ...); each fit a
        :class:`~dpivreg.reporting.results.DPIVResults` or a loaded :class:`~dpivreg.reporting.release.FitRelease`.
    benchmark : bool, default True
        Add, for each distinct design among the ``DPIVResults``, a column of the NON-PRIVATE IV2SLS
        benchmark, headed ``NON-PRIVATE IV2SLS``. ``False`` gives the publishable table (only private releases).
    precision : {"std_errors", "tstats", "pvalues"}, default "std_errors"
        What is shown in parentheses below each estimate.
    stars : bool, default False
        Mark estimates by their private p-values (``***`` 1%, ``**`` 5%, ``*`` 10%).

    Returns
    -------
    DPIVComparison
        ``summary`` (text, LaTeX, HTML), ``plot()`` (a coefficient plot), and ``params``, ``std_errors``,
        ``tstats``, ``pvalues``, ``nobs``, ``rho``, ``epsilon``, ``iv_tests`` as pandas objects.

    Examples
    --------
    >>> from dpivreg import DPIV2SLS, compare
    >>> from dpivreg.datasets import load_labsup, LABSUP_BOUNDS
    >>> df = load_labsup()
    >>> model = DPIV2SLS.from_formula("weeks ~ 1 + educ + [kids ~ samesex]", df)
    >>> fits = {f"rho = {r}": model.fit(rho=r, bounds=LABSUP_BOUNDS, seed=1) for r in (0.5, 2.6, 10)}
    >>> print(compare(fits).summary)  # doctest: +SKIP
    """
    named = _as_named(results)
    benchmark = check_flag(benchmark, "benchmark")
    stars = check_flag(stars, "stars")
    # linearmodels' spellings too: any case, "t-stats", "std-errors"
    spelled = precision.lower().replace("-", "_").replace("t_stats", "tstats") if isinstance(precision, str) else None
    if spelled not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}.")
    leaky = [name for name, res in named.items() if res.leaks]
    if leaky:
        warnings.warn(f"the comparison holds fits with privacy leaks ({', '.join(leaky)}): their columns are not "
                      "private; the notes list the leaks.", PrivacyLeakWarning, stacklevel=2)
    precision = spelled
    return DPIVComparison(named, benchmark=benchmark, precision=precision, stars=stars)


#: How the plot draws a private estimate and a NON-PRIVATE benchmark.
_PRIVATE_STYLE = {"fmt": "o", "color": "tab:blue", "elinewidth": 2.0, "capsize": 3, "markersize": 6}
_BENCHMARK_STYLE = {"fmt": "s", "color": "0.35", "markerfacecolor": "white", "elinewidth": 1.2, "capsize": 3,
                    "markersize": 6}


def _pyplot():
    """matplotlib.pyplot, or an ImportError that names the extra to install."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("DPIVComparison.plot needs matplotlib, which is not installed; install it with "
                          "`pip install dpivreg[plot]` (or `pip install matplotlib`).") from exc
    return plt


def _private_interval(res: DPIVResults | FitRelease, level: float) -> pd.DataFrame:
    """A fit's private interval at ``level``; NaN for a fit that made no inference."""
    try:
        return res.conf_int(level=level)
    except InferenceUnavailableError:
        return pd.DataFrame({"lower": np.nan, "upper": np.nan}, index=res.params.index)


def _draw_panel(panel: Axes, name: str, lines: list) -> dict:
    """One coefficient's panel: an estimate (and its interval, when there is one) on each row of ``lines``
    ``(label, params, intervals, nonprivate)``; a dotted line at zero when an interval reaches it. Returns a
    drawn container of each kind (private, NON-PRIVATE), for the legend."""
    drawn, ends = {}, []
    for row, (_, params, ci, nonprivate) in enumerate(lines):
        if name not in params.index or np.isnan(params[name]):
            continue  # the fit does not have this coefficient
        estimate, lower, upper = params[name], ci.loc[name, "lower"], ci.loc[name, "upper"]
        xerr = None if np.isnan(lower) else [[estimate - lower], [upper - estimate]]
        container = panel.errorbar([estimate], [row], xerr=xerr, **(_BENCHMARK_STYLE if nonprivate else _PRIVATE_STYLE))
        if nonprivate and xerr is not None:
            container.lines[2][0].set_linestyle("--")
        drawn.setdefault(nonprivate, container)
        ends += [estimate] if xerr is None else [lower, upper]
    if ends and min(ends) <= 0 <= max(ends):
        panel.axvline(0.0, color="0.6", linewidth=0.8, linestyle=":", zorder=0)
    return drawn


def _stacked_header(label: str) -> Typeset:
    """A benchmark column's header ("NON-PRIVATE IV2SLS (name)") on lines of its own in LaTeX and HTML: the column
    is as narrow as its numbers."""
    fit = label.removeprefix("NON-PRIVATE IV2SLS").strip()  # "(name)" when there are several benchmarks
    lines = ["NON-PRIVATE", "IV2SLS"] + ([fit] if fit else [])
    latex = r"\begin{tabular}[b]{@{}c@{}}" + r"\\".join(map(latex_text, lines)) + r"\end{tabular}"
    return Typeset(label, latex, "<br/>".join(map(html_text, lines)))


def _unit_label(unit) -> str:
    """A fit's privacy unit for the table: "row", or the unit and its public number of units."""
    return "row" if unit is None else f"{unit.unit} ({unit.n_units:,})"
