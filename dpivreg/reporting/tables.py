"""The private parameter table: z statistics, p-values, intervals and the publishable exports.

One definition, shared by :class:`~dpivreg.reporting.results.DPIVResults` and
:class:`~dpivreg.reporting.release.FitRelease`: post-processing of the private estimate and its private standard errors
(normal approximation), no privacy cost. The exports (:meth:`~PrivateTable.to_frame`, ``to_markdown``, ``to_csv``) hold
only the private table by default; NON-PRIVATE columns, and any fit with a privacy leak, raise a
:class:`~dpivreg.PrivacyLeakWarning`.
"""

from __future__ import annotations

import math
import numbers
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from dpivreg._validation import check_flag
from dpivreg.errors import PrivacyLeakWarning
from dpivreg.privacy.accounting import PrivacyBudget

__all__ = ["PrivateTable", "check_level", "format_number", "size_text", "warn_benchmark_export", "IV_TEST_COLUMNS",
           "IV_TEST_NUMBERS", "iv_test_frame", "iv_test_records"]

#: The columns of an IV-tests table (:attr:`DPIVResults.iv_tests <dpivreg.reporting.results.DPIVResults.iv_tests>`),
#: in order, and those that hold numbers; the index is the test's name (``test``).
IV_TEST_COLUMNS = ("statistic", "pval", "dist", "lower", "upper", "critical_value", "cost", "null")
IV_TEST_NUMBERS = ("statistic", "pval", "lower", "upper", "critical_value")
#: The rows of an IV-tests table, by the question each answers (a fit has those that apply to it).
ROBUST_OVERID = {"robust": "Wooldridge overid (robust)", "clustered": "Wooldridge overid (cluster-robust)"}
SARGAN = "Sargan overid"
ROBUST_ENDOGENEITY = {"robust": "Wooldridge exogeneity (robust)",
                      "clustered": "Wooldridge exogeneity (cluster-robust)"}
WU_HAUSMAN = "Wu-Hausman exogeneity"
DURBIN = "Durbin exogeneity"
EFFECTIVE_F = "Effective F (MOP)"
OVERID_ROWS = (*ROBUST_OVERID.values(), SARGAN)  # the first present is a fit's over-identification test
#: The title an IV-tests table is exported under (Markdown, CSV).
IV_TESTS_HEADING = "IV tests (post-processing of the releases)"


def check_level(level) -> float:
    """A confidence level in (0, 1)."""
    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), e.g. 0.95 for 95% intervals; got {level!r}.")
    return float(level)


def warn_benchmark_export(what: str, remedy: str, *, stacklevel: int) -> None:
    """The :class:`~dpivreg.PrivacyLeakWarning` of an export that holds the NON-PRIVATE IV2SLS benchmark: ``what``
    names the export, ``remedy`` the call that leaves the benchmark out; ``stacklevel`` as ``warnings.warn``'s, counted
    from the function that calls this one."""
    warnings.warn(f"{what} holds the NON-PRIVATE IV2SLS benchmark: computed from the raw data without noise; do not "
                  f"publish it ({remedy} leaves it out).", PrivacyLeakWarning, stacklevel=stacklevel + 1)


def _called_by_statsmodels() -> bool:
    """Whether the caller of ``conf_int`` is statsmodels' own code (``statsmodels.iolib.summary2.summary_params``
    calls ``results.conf_int(alpha)``), whose positional argument is always an alpha."""
    try:
        caller = sys._getframe(2).f_globals.get("__name__", "")
    except ValueError:  # conf_int is the outermost Python frame (a C callback): not statsmodels
        return False
    return caller == "statsmodels" or caller.startswith("statsmodels.")


class SummaryAccessor:
    """``res.summary`` as both libraries' users expect it: printed or shown as an attribute (linearmodels:
    ``print(res.summary)``) it is the default summary; called (statsmodels: ``res.summary()``,
    ``res.summary(benchmark=False)``) it returns the statsmodels ``Summary``. Its other attributes (``as_text``,
    ``as_latex``, ``as_html``, ``tables``) are the default summary's."""

    __slots__ = ("_make",)

    def __init__(self, make) -> None:
        self._make = make

    def __call__(self, *args, **kwargs):
        return self._make(*args, **kwargs)

    def __str__(self) -> str:
        return str(self._make())

    def __repr__(self) -> str:
        return self._make().as_text()

    def _repr_html_(self) -> str:
        return self._make().as_html()

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "_make":  # never recurse (e.g. an instance made without __init__)
            raise AttributeError(name)
        return getattr(self._make(), name)  # of a fresh summary: call summary() for one to modify


def size_text(nobs: int, unit) -> str:
    """A fit's size for a repr: "n=31857", or with a privacy unit (:class:`dpivreg.privacy.units.UnitFacts`)
    "N=2000 units, n~11203" (the row count's released estimate)."""
    return f"n={nobs}" if unit is None else f"N={unit.n_units} units, n~{nobs}"


def format_number(value, digits: int = 4) -> str:
    """A number as the summaries print it: 4 significant digits, "inf", "none" for None."""
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return "(" + ", ".join(format_number(v, digits) for v in value) + ")"
    if isinstance(value, (int, np.integer)):
        return str(value)
    if math.isinf(value):
        return "inf"
    return f"{value:.{digits}g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.{digits}e}"


def iv_test_frame(records) -> pd.DataFrame:
    """An IV-tests table from its records (:func:`iv_test_records`; one dict per test, its name under ``"test"``):
    the columns :data:`IV_TEST_COLUMNS`, indexed by ``test``; empty (with those columns) for no record."""
    frame = pd.DataFrame([{key: record[key] for key in ("test", *IV_TEST_COLUMNS)} for record in records],
                         columns=["test", *IV_TEST_COLUMNS]).set_index("test")
    return frame.astype({column: float for column in IV_TEST_NUMBERS})


def iv_test_records(frame: pd.DataFrame) -> tuple[dict, ...]:
    """An IV-tests table as records: one dict per test, ``{"test": name, **columns}``, numbers as Python floats
    (NaN where a test has none) and text as str; the inverse of :func:`iv_test_frame`."""
    return tuple({"test": str(name), **{column: float(row[column]) if column in IV_TEST_NUMBERS else str(row[column])
                                        for column in IV_TEST_COLUMNS}}
                 for name, row in frame.iterrows())


class PrivateTable:
    """Mixin: the normal-approximation statistics and the exports from ``params``, ``bse`` and the budget.

    The class provides ``params``, ``bse``, ``delta``, ``privacy``, ``estimator``, ``nobs``, ``leaks``, ``cov_type``
    and the hooks below.
    """

    params: pd.Series
    bse: pd.Series
    delta: float
    privacy: PrivacyBudget
    estimator: str
    nobs: int
    leaks: tuple[str, ...]
    cov_type: str

    # hooks
    @property
    def _has_inference(self) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def _dependent_label(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def _iv_tests_frame(self) -> pd.DataFrame:  # pragma: no cover - overridden
        """The fit's IV tests as a table (:data:`IV_TEST_COLUMNS`; no row when none applies)."""
        raise NotImplementedError

    def _benchmark_columns(self) -> pd.DataFrame:
        raise ValueError("this object holds no benchmark: benchmark=True needs the fit's results (DPIVResults), "
                         "not a release record.")

    # ------------------------------------------------------------------ statistics
    @property
    def std_errors(self) -> pd.Series:
        """linearmodels' name for :attr:`bse`."""
        return self.bse

    @property
    def tvalues(self) -> pd.Series:
        """z statistics params / bse (normal approximation)."""
        return (self.params / self.bse).rename("zstat")

    @property
    def tstats(self) -> pd.Series:
        """linearmodels' name for :attr:`tvalues`."""
        return self.tvalues

    @property
    def pvalues(self) -> pd.Series:
        """Two-sided p-values of H0: coefficient = 0 under the normal approximation."""
        return pd.Series(2.0 * stats.norm.sf(np.abs(self.tvalues.to_numpy())), index=self.params.index,
                         name="pvalue")

    def conf_int(self, positional: float | None = None, /, *, level: float | None = None,
                 alpha: float | None = None) -> pd.DataFrame:
        """Private confidence intervals, columns ``lower`` and ``upper``: ``params`` ± z_(1−alpha/2)·``bse``.

        Parameters
        ----------
        positional : float, optional
            The coverage level, as linearmodels' ``conf_int(level)``: ``conf_int(0.9)`` is a 90% interval. A
            positional value below 0.5 reads as statsmodels' alpha and is refused (it would silently give the
            complementary interval): pass ``alpha=`` for that, or ``level=`` for a level below one half. Called by
            statsmodels' own functions (``summary_col``, ``summary_params``), which pass their alpha
            positionally, it is read as that alpha.
        level : float, optional
            The coverage level by keyword (default 0.95), any value in (0, 1).
        alpha : float, optional
            statsmodels' spelling, keyword only: ``conf_int(alpha=0.05)`` is a 95% interval.
        """
        if positional is not None:
            if level is not None or alpha is not None:
                raise TypeError("pass the level once: conf_int(0.95), conf_int(level=0.95) or conf_int(alpha=0.05).")
            if _called_by_statsmodels():
                alpha = positional  # statsmodels' own functions (summary_col) pass their alpha positionally
            else:
                level = check_level(positional)
                if level < 0.5:
                    raise ValueError(
                        f"conf_int's first argument is the coverage level, as in linearmodels (conf_int(0.95) is a "
                        f"95% interval); {level!r} reads as statsmodels' alpha, which would give a {1 - level:.0%} "
                        f"interval here instead of the {level:.0%} asked for. Pass conf_int({1 - level:g}) or "
                        f"conf_int(alpha={level!r}) for a {1 - level:.0%} interval, or conf_int(level={level!r}) "
                        f"for a {level:.0%} one.")
        if alpha is not None and level is not None:
            raise TypeError("pass level (linearmodels, e.g. conf_int(0.95)) or alpha= (statsmodels), not both.")
        if alpha is not None:
            if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0.0 < alpha < 1.0:
                raise ValueError(f"alpha must lie in (0, 1), e.g. alpha=0.05 for 95% intervals; got {alpha!r}.")
            level = 1.0 - float(alpha)
        level = 0.95 if level is None else check_level(level)
        half = stats.norm.ppf(0.5 + level / 2.0) * self.bse
        return pd.DataFrame({"lower": self.params - half, "upper": self.params + half})

    # ------------------------------------------------------------------ exports (publishable by default)
    def _warn_unpublishable(self, what: str, benchmark: bool, stacklevel: int) -> None:
        """A PrivacyLeakWarning when an export carries NON-PRIVATE numbers or the fit leaked."""
        if benchmark:
            warn_benchmark_export(what, "benchmark=False", stacklevel=stacklevel + 1)
        if self.leaks:
            warnings.warn(f"{what} is of a fit with privacy leaks: " + " ".join(self.leaks), PrivacyLeakWarning,
                          stacklevel=stacklevel + 1)

    def _table(self, benchmark: bool, level: float, what: str, stacklevel: int) -> pd.DataFrame:
        benchmark = check_flag(benchmark, "benchmark")
        level = check_level(level)
        table = pd.DataFrame({"parameter": self.params})
        if self._has_inference:
            ci = self.conf_int(level=level)
            table = table.assign(std_error=self.bse, zstat=self.tvalues, pvalue=self.pvalues,
                                 lower=ci["lower"], upper=ci["upper"])
        if benchmark:
            table = table.join(self._benchmark_columns())
        self._warn_unpublishable(what, benchmark, stacklevel + 1)
        table.index.name = "regressor"
        return table

    def to_frame(self, *, benchmark: bool = False, level: float = 0.95) -> pd.DataFrame:
        """The parameter table as a DataFrame: by default only the private release, ready to publish.

        Columns ``parameter``, ``std_error``, ``zstat``, ``pvalue``, ``lower``, ``upper`` (the private estimate,
        its private standard error, z statistic, normal p-value and ``level`` interval; only ``parameter`` when
        the fit made no inference), one row per regressor. What qualifies the numbers travels in ``attrs``:
        ``notes`` (the budget spent and the cautions), ``cautions`` and ``iv_tests`` (the IV tests as records, one
        dict per test: its name under ``"test"``, then the columns of ``DPIVResults.iv_tests``).

        Parameters
        ----------
        benchmark : bool, default False
            Also the NON-PRIVATE IV2SLS benchmark (results only, not a release record): columns
            ``IV2SLS (NON-PRIVATE)``, ``std_error (NON-PRIVATE)`` (its robust standard error) and
            ``diff/se (NON-PRIVATE)``. A :class:`~dpivreg.PrivacyLeakWarning` says they must not be published.
        level : float, default 0.95
            Level of the intervals.
        """
        table = self._table(benchmark, level, "the table", stacklevel=2)
        table.attrs["notes"] = self._export_notes(bool(benchmark), level)  # the budget and the cautions travel too
        table.attrs["cautions"] = list(self.cautions)
        table.attrs["iv_tests"] = list(iv_test_records(self._iv_tests_frame))
        return table

    def _export_notes(self, benchmark: bool, level: float) -> list[str]:
        priv, delta = self.privacy, self.delta
        size = f"n = {self.nobs}"
        if priv.unit is not None:  # the row count is private: its released estimate, beside the public unit count
            size = f"N = {priv.unit.n_units} units ({priv.unit.unit}), n ~ {self.nobs} rows (private estimate)"
        notes = [(f"Private estimates ({self.estimator}) of {self._dependent_label}; {size}; total privacy "
                  f"spent rho = {format_number(priv.rho)} (zCDP), epsilon = {format_number(priv.epsilon(delta))} at "
                  f"delta = {delta:g}, protecting {priv.protects}.")]
        if self._has_inference:
            notes.append(f"Private standard errors ({self.cov_type}) and {level:.0%} normal intervals, including the "
                         "privacy noise.")
        if benchmark:
            notes.append("The columns marked NON-PRIVATE (the IV2SLS benchmark) are computed from the raw data "
                         "without noise: do not publish them.")
        return notes + self._qualifying_notes()

    def _qualifying_notes(self) -> list[str]:
        """The notes that qualify the table's numbers: the fit's cautions, and its leaks if any."""
        leaks = ["PRIVACY LEAKS (this table is not private): " + " ".join(self.leaks)] if self.leaks else []
        return [*self.cautions, *leaks]

    def to_markdown(self, *, benchmark: bool = False, level: float = 0.95, floatfmt: str = ".4g") -> str:
        """The parameter table (:meth:`to_frame`) as a Markdown table, then the IV tests (a second table, when any
        applies) and the notes: the budget spent and the cautions.

        Parameters
        ----------
        benchmark, level
            As in :meth:`to_frame`.
        floatfmt : str, default ".4g"
            Number format (passed to ``tabulate`` by :meth:`pandas.DataFrame.to_markdown`).
        """
        table = self._table(benchmark, level, "the Markdown table", stacklevel=2)
        notes = self._export_notes(bool(benchmark), level)
        text = table.to_markdown(floatfmt=floatfmt) + "\n\n"
        tests = self._iv_tests_frame
        if len(tests):  # NaN (a p-value the effective F has not, a critical value the others have not) left blank
            cells = tests.astype(object).where(tests.notna(), None)
            text += f"{IV_TESTS_HEADING}:\n\n" + cells.to_markdown(floatfmt=floatfmt, missingval="") + "\n\n"
        return text + "\n".join(notes) + "\n"

    def to_csv(self, path_or_buf=None, *, benchmark: bool = False, level: float = 0.95) -> str | None:
        """The parameter table (:meth:`to_frame`) as CSV, full precision; written to ``path_or_buf`` when given.

        Parameters
        ----------
        path_or_buf : str, path-like or file-like, optional
            Where to write (as :meth:`pandas.DataFrame.to_csv`); the text is returned when omitted.
        benchmark, level
            As in :meth:`to_frame`.

        The IV tests (a CSV table of their own, full precision), then the cautions (:attr:`cautions`) and any
        leaks, follow the table as ``# `` comment lines, so that they travel with the numbers; read the coefficients
        back with ``pd.read_csv(path, index_col=0, comment="#")``. A fit with none of them writes plain CSV.
        """
        table = self._table(benchmark, level, "the CSV table", stacklevel=2)
        tests = self._iv_tests_frame
        comments = ([f"{IV_TESTS_HEADING}, as CSV:", *tests.to_csv(lineterminator="\n").splitlines()] if len(tests)
                    else []) + self._qualifying_notes()
        if not comments:
            return table.to_csv(path_or_buf)
        # the IV tests and the cautions travel with the numbers: as comment lines after the table (comment="#")
        text = table.to_csv() + "".join(f"# {line}\n" for line in comments)
        if path_or_buf is None:
            return text
        if hasattr(path_or_buf, "write"):
            path_or_buf.write(text)
        else:
            Path(path_or_buf).write_text(text, encoding="utf-8")
        return None
