"""The summary of a fit: the statsmodels ``Summary`` that ``DPIVResults.summary()`` returns and every export shares.

:class:`SummaryWriter` builds its blocks from a :class:`~dpivreg.reporting.results.DPIVResults`: the top block (the
estimator's settings and the privacy spent, the budget lines), the parameter table (the private estimate beside the
NON-PRIVATE IV2SLS benchmark), the first-stage block, the Theorem's error-bound block and the notes (inference,
weak instruments, clipping, what is private, every privacy leak). It only reads the results: each number is a
private release, its post-processing or a public setting, except the benchmark columns and counts it labels
NON-PRIVATE. :class:`DPIVSummary` typesets the tables for ``as_text``, ``as_html`` and ``as_latex``.
"""

from __future__ import annotations

import copy
import html
import re
import unicodedata

import numpy as np
from statsmodels.iolib.summary import Summary
from statsmodels.iolib.table import SimpleTable
from statsmodels.iolib.tableformatting import fmt_2cols, fmt_params

from dpivreg.estimation.moments import NOISE_FLOOR, means_at_bounds, unresolved_directions
from dpivreg.estimation.working_scale import free_columns
from dpivreg.inference import iv_tests
from dpivreg.reporting.tables import (
    DURBIN,
    EFFECTIVE_F,
    ROBUST_ENDOGENEITY,
    ROBUST_OVERID,
    SARGAN,
    WU_HAUSMAN,
    format_number,
    iv_test_frame,
    warn_benchmark_export,
)

__all__ = ["DPIVSummary", "SummaryWriter", "Typeset", "WEAK_F", "html_text", "latex_text", "math_label",
           "power_of_ten"]

#: First-stage F below which the summary warns of weak instruments (Staiger & Stock 1997's rule of thumb, the
#: figure Stock & Yogo's tables are usually summarised by).
WEAK_F = 10.0

_fmt = format_number

#: The budget block's line for :attr:`dpivreg.PrivacyBudget.sampler`.
_SAMPLER_LABELS = {"secure": "secure", "seeded": "seeded", "mixed": "mixed",
                   "none": "none (no noise)"}

#: Characters that LaTeX's text mode does not print as themselves (``<``, ``>`` and ``|`` print other glyphs in the
#: default OT1 encoding).
_LATEX_ESCAPES = str.maketrans({"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                                "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                                "^": r"\textasciicircum{}", "<": r"$<$", ">": r"$>$", "|": r"$|$"})


#: Non-ASCII symbols of the summary as LaTeX (math mode); ``\lesssim`` needs the ``amssymb`` package.
_LATEX_SYMBOLS = str.maketrans({"κ": r"$\kappa$", "Θ": r"$\Theta$", "β": r"$\beta$", "ρ": r"$\rho$",
                                "τ": r"$\tau$", "γ": r"$\gamma$", "η": r"$\eta$", "α": r"$\alpha$",
                                "σ": r"$\sigma$", "ε": r"$\varepsilon$", "δ": r"$\delta$", "μ": r"$\mu$",
                                "²": r"$^{2}$", "⁶": r"$^{6}$", "√": r"$\surd$", "≤": r"$\leq$", "≥": r"$\geq$",
                                "≲": r"$\lesssim$", "×": r"$\times$", "−": "-", "…": r"\ldots{}", "–": "--",
                                "≈": r"$\approx$", "·": r"$\cdot$"})

#: The formulas that the summaries' labels and notes print in plain text, as (LaTeX, HTML).
_FORMULAS = {
    "κ^(T/2)": (r"$\kappa^{T/2}$", "κ<sup>T/2</sup>"),
    "Theta^(T)": (r"$\Theta^{(T)}$", "Θ<sup>(T)</sup>"),
    "k^2 rho": (r"$k^{2}\rho$", "k<sup>2</sup>ρ"),
    "κ_β, κ_Θ": (r"$\kappa_\beta$, $\kappa_\Theta$", "κ<sub>β</sub>, κ<sub>Θ</sub>"),
    "T condition": (r"$T$ condition", "<i>T</i> condition"),
    "n condition": (r"$n$ condition", "<i>n</i> condition"),
    "T ≲ ρ1 n²/(p(√q+√τ)⁶)": (r"$T \lesssim \rho_1 n^{2}/(p(\sqrt{q}+\sqrt{\tau})^{6})$",
                              "<i>T</i> ≲ ρ<sub>1</sub> <i>n</i>²/(<i>p</i>(√<i>q</i>+√τ)⁶)"),
}
_FORMULA = re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, sorted(_FORMULAS, key=len, reverse=True))) + r")(?!\w)")

#: The parameters that the summaries' own labels name in ASCII ("rho1 (zCDP):", "Iterations T"), as (LaTeX, HTML).
_PARAMETERS = {"rho": (r"\rho", "ρ"), "epsilon": (r"\varepsilon", "ε"), "delta": (r"\delta", "δ"),
               "eta": (r"\eta", "η"), "alpha": (r"\alpha", "α"), "gamma": (r"\gamma", "γ"), "T": ("T", "<i>T</i>")}
_PARAMETER = re.compile(r"\b(rho|epsilon|delta|eta|alpha|gamma|T)(\d|_[a-z]+)?\b")

#: The width a table is typeset at: its own, or the line's if it is wider (graphicx's ``\resizebox`` shrinks it).
_FIT_WIDTH = "\\resizebox{\\ifdim\\width>\\linewidth\\linewidth\\else\\width\\fi}{!}{%\n"
_TABULAR = re.compile(r"\\begin\{tabular\}.*?\\end\{tabular\}", re.DOTALL)
_HELD = re.compile("\ue000(\\d+)\ue001")


class Typeset(str):
    """Text of a summary table with its own LaTeX and HTML spellings (mathematics, a header on several lines).

    The string itself is the plain text, which ``as_text`` and ``as_csv`` print; ``as_latex`` prints :attr:`latex`
    and ``as_html`` :attr:`html` (both already escaped)."""

    latex: str
    html: str

    def __new__(cls, text: str, latex: str, html: str) -> Typeset:
        self = super().__new__(cls, text)
        self.latex, self.html = latex, html
        return self

    def __getnewargs__(self) -> tuple[str, str, str]:
        return str(self), self.latex, self.html


def _formulas(text: str, plain, typeset: int) -> str:
    """``text`` with each formula of :data:`_FORMULAS` in its spelling ``typeset`` (0 LaTeX, 1 HTML) and the rest
    through ``plain``."""
    out, last = [], 0
    for found in _FORMULA.finditer(text):
        out += [plain(text[last:found.start()]), _FORMULAS[found.group()][typeset]]
        last = found.end()
    return "".join(out + [plain(text[last:])])


def latex_text(text: str) -> str:
    """Text of a summary in LaTeX: special characters escaped, its formulas and Greek letters as mathematics."""
    if isinstance(text, Typeset):
        return text.latex
    return _formulas(str(text), lambda part: part.translate(_LATEX_ESCAPES).translate(_LATEX_SYMBOLS), 0)


def html_text(text: str) -> str:
    """Text of a summary in HTML: ``<``, ``>`` and ``&`` escaped, its formulas with ``<sup>`` and ``<sub>``."""
    if isinstance(text, Typeset):
        return text.html
    return _formulas(str(text), lambda part: html.escape(part, quote=False), 1)


def math_label(text: str) -> Typeset:
    """One of the summaries' own labels ("rho1 (zCDP):", "Iterations T") with the parameters it names as
    mathematics (ρ₁, T) in LaTeX and HTML; the plain text is ``text``. Never for a user's names."""
    latex, markup, last = [], [], 0
    for found in _PARAMETER.finditer(text):
        command, glyph = _PARAMETERS[found.group(1)]
        index = (found.group(2) or "").lstrip("_")
        latex += [latex_text(text[last:found.start()]),
                  f"${command}" + (f"_{{{index}}}" if index.isdigit() else rf"_{{\mathrm{{{index}}}}}" if index
                                   else "") + "$"]
        markup += [html_text(text[last:found.start()]), glyph + (f"<sub>{index}</sub>" if index else "")]
        last = found.end()
    return Typeset(text, "".join(latex + [latex_text(text[last:])]), "".join(markup + [html_text(text[last:])]))


def power_of_ten(value: float) -> Typeset:
    """A number as ``f"{value:g}"`` prints it, with LaTeX and HTML spellings that write an exponent as a power of
    ten (1e-05 as 10⁻⁵, 2.5e-06 as 2.5 × 10⁻⁶)."""
    text = f"{value:g}"
    mantissa, _, exponent = text.partition("e")
    if not exponent:
        return Typeset(text, text, text)
    power = int(exponent)
    if mantissa == "1":
        return Typeset(text, f"$10^{{{power}}}$", f"10<sup>{power}</sup>".replace("-", "−"))
    return Typeset(text, rf"${mantissa} \times 10^{{{power}}}$", f"{mantissa} × 10<sup>{power}</sup>".replace("-", "−"))


def _with_cells(table: SimpleTable, render, output) -> str:
    """``output(table)`` with each cell's text replaced by ``render(text)`` for the call; the table is left as it
    was."""
    cells = [cell for row in table for cell in row]
    kept = [cell.data for cell in cells]
    try:
        for cell in cells:
            if isinstance(cell.data, str):
                cell.data = render(cell.data)
        return output(table)
    finally:
        for cell, data in zip(cells, kept):
            cell.data = data


def latex_table(table: SimpleTable) -> str:
    r"""A table as a centred ``tabular``, shrunk to the line width when it is wider (``\resizebox``, package
    ``graphicx``), each cell through :func:`latex_text` (statsmodels escapes only some of them)."""
    held: list[str] = []

    def hold(text: str) -> str:  # statsmodels' own escaping would undo the LaTeX: it sees a placeholder
        held.append(latex_text(text))
        return f"\ue000{len(held) - 1}\ue001"

    tabular = _with_cells(table, hold, lambda t: t.as_latex_tabular(center=False))
    tabular = _TABULAR.sub(lambda found: _FIT_WIDTH + found.group() + "}", tabular)
    return "\\begin{center}\n" + _HELD.sub(lambda found: held[int(found.group(1))], tabular) + "\n\\end{center}"


def _ascii(latex: str) -> str:
    """A character without a LaTeX spelling above (a user's column name, say): its Unicode name, in ASCII."""
    return "".join(c if ord(c) < 128 else f"[{unicodedata.name(c, hex(ord(c)))}]" for c in latex)


class DPIVSummary(Summary):
    """A statsmodels ``Summary`` whose ``as_latex`` typesets each table on its own, within the line width.

    statsmodels merges all tables into one LaTeX tabular, which fails for tables of different
    widths (our top block, parameter table and bound block). Labels that are mathematics (:class:`Typeset`, and the
    formulas of the notes) are typeset as such in LaTeX and HTML. A summary that holds the NON-PRIVATE benchmark
    (``non_private``) warns with a :class:`~dpivreg.PrivacyLeakWarning` when exported for a paper (``as_latex``,
    ``as_html``, ``as_csv``); printing it (``as_text``) is the data holder's validation view.
    """

    non_private = False
    #: The call that leaves the benchmark out, for the warning.
    remedy = "summary(benchmark=False)"

    def _warn_export(self, what: str) -> None:
        if self.non_private:
            warn_benchmark_export(f"the summary's {what}", self.remedy, stacklevel=3)

    def as_html(self) -> str:
        """The tables and notes as HTML (a :class:`~dpivreg.PrivacyLeakWarning` if it holds the benchmark)."""
        self._warn_export("HTML")
        tables = "\n".join(_with_cells(table, html_text, SimpleTable.as_html) for table in self.tables)
        if self.extra_txt is None:
            return tables
        return tables + "<br/><br/>" + html_text(self.extra_txt).replace("\n", "<br/>")

    def as_csv(self) -> str:
        """The tables and notes as CSV (a :class:`~dpivreg.PrivacyLeakWarning` if it holds the benchmark)."""
        self._warn_export("CSV")
        return super().as_csv()

    def as_latex(self) -> str:
        r"""The tables as LaTeX ``tabular`` environments, each centred and shrunk to the line width when it is
        wider, then the notes; in ASCII, special characters escaped, the Greek letters, symbols and formulas as
        LaTeX math. Compiles with the packages ``booktabs`` (the tables' rules), ``graphicx`` (``\resizebox``) and
        ``amssymb`` (``\lesssim``). A :class:`~dpivreg.PrivacyLeakWarning` if it holds the NON-PRIVATE benchmark."""
        self._warn_export("LaTeX")
        latex = "\n".join(latex_table(table) for table in self.tables)
        if self.extra_txt is not None:
            latex += "\n\n" + latex_text(self.extra_txt).replace("\n", " \\newline\n ")
        return _ascii(latex)


def _percent(share: float) -> str:
    """A share as a percentage with two significant digits below 1% (0.04%, not 0%)."""
    return f"{share:.0%}" if share >= 0.01 or share == 0 else f"{100 * share:.2g}%"


def _rows_allowed(targets: tuple[float, ...]) -> str:
    """The adaptive rule's K per group as the clipping note prints it ("50", or "25-44")."""
    low, high = f"{min(targets):.0f}", f"{max(targets):.0f}"
    return low if low == high else f"{low}-{high}"


#: Loadings of an unresolved direction's columns large enough to name them.
_LOADING = 0.2
_UNRESOLVED_INSTRUMENTS = (
    "a constant or duplicate column, collinear columns, bounds that exclude the data, or too small a budget for a "
    "column's variation. Coefficients that rely on it are not identified by the releases, whatever their standard "
    "errors say")
_UNRESOLVED_REGRESSORS = (
    "a constant or duplicate endogenous regressor, one collinear with the exogenous columns, or bounds that exclude "
    "the data. The coefficients of the endogenous regressors it names are not identified by the releases: their "
    "estimates, standard errors and first-stage statistics are not meaningful")


def _budget_rows(priv, delta: float) -> list[tuple[str, str]]:
    """The budget block's last lines: the total ρ spent, δ, ε by the three conversions and the noise sampler."""
    return [
        (math_label("Total rho (spent):"), _fmt(priv.rho)),
        (math_label("delta:"), power_of_ten(delta)),
        (math_label("epsilon (exact Gauss.):"), _fmt(priv.epsilon(delta))),
        (math_label("epsilon (CKS 2020):"), _fmt(priv.epsilon(delta, "cks"))),
        (math_label("epsilon (paper formula):"), _fmt(priv.epsilon(delta, "bun-steinke"))),
        ("Noise sampler:", _SAMPLER_LABELS[priv.sampler]),
    ]


def two_column_table(left: list[tuple[str, str]], right: list[tuple[str, str]], *, title: str) -> SimpleTable:
    """The summary's top block: two columns of (label, value) side by side, padded to the same length."""
    rows = max(len(left), len(right))
    left, right = left + [("", "")] * (rows - len(left)), right + [("", "")] * (rows - len(right))
    table = SimpleTable([[v] for _, v in left], txt_fmt=copy.deepcopy(fmt_2cols), title=title,
                        stubs=[k for k, _ in left])
    # the right column's labels indented in the text (a Typeset label keeps its LaTeX and HTML)
    stubs = [Typeset("  " + k, k.latex, k.html) if isinstance(k, Typeset) else "  " + k for k, _ in right]
    table.extend_right(SimpleTable([[v] for _, v in right], stubs=stubs))
    return table


def private_parameter_rows(table, names: list, label: str) -> tuple[dict, list[str]]:
    """The private columns of the parameter table of a fit or a release record (a
    :class:`~dpivreg.reporting.tables.PrivateTable`): estimate, standard error, z, p-value and 95% interval, or the
    estimate alone without inference; and their headers."""
    if not table._has_inference:
        return {c: [_fmt(table.params[c])] for c in names}, [label]
    bse, z, pv, ci = table.bse, table.tvalues, table.pvalues, table.conf_int()
    rows = {c: [_fmt(table.params[c]), _fmt(bse[c]), _fmt(z[c], 3), f"{pv[c]:.4f}", _fmt(ci.loc[c, "lower"]),
                _fmt(ci.loc[c, "upper"])] for c in names}
    return rows, [label, "Std. Err.", "z", "P>|z|", "Lower CI", "Upper CI"]


#: What each IV test cost, as the summary's IV tests block says it (the tests' ``cost`` in full in every export).
_TEST_COSTS = {iv_tests.FREE: "free (moment release, rho0)",
               iv_tests.FREE_WITH_MEAT: "free (moments, SE meat rho_inf)",
               iv_tests.FIRST_STAGE_MEAT: "rho_diag (first-stage meat)",
               iv_tests.ENDOGENEITY_MEAT: "rho_diag (endogeneity meat)"}


def iv_tests_table(tests, *, exact: bool) -> SimpleTable:
    """The summary's IV tests block from an IV-tests table (:attr:`DPIVResults.iv_tests
    <dpivreg.reporting.results.DPIVResults.iv_tests>`): statistic, its privacy-noise interval, p-value, the effective
    F's critical value (a column only when the effective F is there), the law and the cost. ``exact``: from exact
    moments (no noise), labelled NOT private."""

    def number(value: float, text) -> str:
        return "" if np.isnan(value) else text(value)

    critical = bool(tests["critical_value"].notna().any())
    rows = [[_fmt(r["statistic"]), f"[{_fmt(r['lower'])}, {_fmt(r['upper'])}]", number(r["pval"], lambda p: f"{p:.4f}")]
            + ([number(r["critical_value"], _fmt)] if critical else [])
            + [r["dist"], math_label(_TEST_COSTS.get(r["cost"], r["cost"]))] for _, r in tests.iterrows()]
    headers = ["Statistic", "95% (noise)", "P-value"] + (["Crit. value"] if critical else []) + ["Dist.", "Cost"]
    title = ("IV tests (from exact moments: NOT private)" if exact
             else "IV tests (private: post-processing of releases)")
    return SimpleTable(rows, headers=headers, stubs=list(tests.index), txt_fmt=copy.deepcopy(fmt_params), title=title)


def _iv_tests_note(tests, *, exact: bool) -> str:
    """How to read the IV tests block: the p-values, the intervals, the errors each test assumes."""
    if exact:
        read = "p-values against the law under Dist. (exact moments: no privacy noise)"
    else:
        read = ("each p-value is against the statistic's law under the null simulated with the releases' privacy "
                "noise (the law under Dist. ignores the noise, which inflates the statistic); the 95% (noise) "
                "interval is the privacy noise's, not the sampling error's")
    homoskedastic = [name.split()[0] for name in (SARGAN, WU_HAUSMAN, DURBIN) if name in tests.index]
    assumes = []
    if homoskedastic:
        names = (", ".join(homoskedastic[:-1]) + " and " if len(homoskedastic) > 1 else "") + homoskedastic[-1]
        assumes.append(f"{names} assume{'' if len(homoskedastic) > 1 else 's'} homoskedastic errors")
    for kind, robust_to in (("robust", "heteroskedasticity"),
                            ("clustered", "heteroskedasticity and to correlation within clusters")):
        robust = [test for test, rows in (("over-identification", ROBUST_OVERID), ("exogeneity", ROBUST_ENDOGENEITY))
                  if rows[kind] in tests.index]
        if robust:
            tested = " and ".join(robust)
            assumes.append(f"Wooldridge's {tested} score test{'s are' if len(robust) > 1 else ' is'} robust to "
                           f"{robust_to}")
    note = f"IV tests: {read}." + (" " + "; ".join(assumes) + "." if assumes else "")
    for reason in tests.attrs.get("refused", ()):
        note += f" Not shown: {reason}"
    if EFFECTIVE_F in tests.index:
        # its meat is clustered exactly when the robust tests beside it are (the same fit's meats)
        clustered = any("cluster-robust" in name for name in tests.index)
        robust_to = "heteroskedasticity and within-cluster correlation" if clustered else "heteroskedasticity"
        note += (f" Effective F (Montiel Olea-Pflueger, robust to {robust_to}): it rejects weak instruments (a "
                 "worst-case bias above 10% of the benchmark) at the 5% level when it exceeds its critical value, "
                 f"here {_fmt(tests.loc[EFFECTIVE_F, 'critical_value'])} (simplified procedure).")
    return note


def _privacy_notes(leaks: tuple[str, ...], sampler: str) -> list[str]:
    """The summary's last notes, of a fit or of its record: its privacy leaks (or that there were none), and a
    seeded sampler's warning."""
    notes = (["PRIVACY LEAKS during the fit (PrivacyLeakWarning):", *(f"  - {leak}" for leak in leaks)] if leaks
             else ["No privacy leak: every data-dependent input was public or paid for in the budget."])
    if sampler == "seeded":
        notes.append("Seeded noise (numpy's generator): reproducible, and removable by whoever knows the seed. "
                     "Publish a fit run with seed=None (the secure sampler).")
    return notes


def release_summary(record) -> DPIVSummary:
    """The publishable summary of a release record (:class:`~dpivreg.reporting.release.FitRelease`): its settings
    and budget, the private parameter table and its notes. The record holds no benchmark and no data, so this is
    what ``summary(benchmark=False)`` of the fit shows, less what needed the fit itself (first-stage diagnostics,
    the error bound, the resolution notes)."""
    label = "Moments" if record.estimator == "noisy moments" else "DP-2S-GD"
    unit = record.unit
    left = [("Dep. Variable:", record.dependent), ("Estimator:", record.estimator),
            ("Privacy unit:", "row" if not unit or not unit.get("unit") else
             f"{unit['unit']} ({unit['n_units']:,} units, <= {unit['max_rows']} rows)"),
            ("No. Observations:", f"~{record.nobs} (private)" if unit and unit.get("unit") else str(record.nobs)),
            ("Cov. Estimator:", record.cov_type if record.cov_type != "clustered" or not unit else
             f"clustered ({unit['clusters']}, {unit['n_clusters']:,})"),
            ("dpivreg version:", record.version)]
    names = list(record.params.index)
    rows, headers = private_parameter_rows(record, names, label)
    smry = DPIVSummary()
    smry.tables.append(two_column_table(left, _budget_rows(record.privacy, record.delta),
                                        title=f"{label} Estimation Summary (release record)"))
    smry.tables.append(SimpleTable([rows[c] for c in names], headers=headers, stubs=names,
                                   txt_fmt=copy.deepcopy(fmt_params),
                                   title=f"Parameter Estimates (private: {record.estimator})"))
    tests = iv_test_frame(record.iv_tests)
    exact = np.isinf(record.privacy.rho0)  # the moment release was exact: the tests are not private
    if len(tests):
        smry.tables.append(iv_tests_table(tests, exact=exact))
    notes = [f"From a release record made {record.created}: the private estimate, its inference and the privacy "
             "spent; no data and no benchmark."]
    if not record._has_inference:
        notes.append(f"Private std. errors: {record.inference_note}.")
    if len(tests):
        notes.append(_iv_tests_note(tests, exact=exact))
    notes.extend(record.cautions)
    if record.formula:
        notes.append(f"Formula: {record.formula}")
    notes += _privacy_notes(record.leaks, record.privacy.sampler)
    smry.add_extra_txt(notes)
    return smry


def _caution(message: str) -> str:
    """A warning's message as a CAUTION note (capitalised)."""
    return f"CAUTION: {message[0].upper()}{message[1:]}"


class SummaryWriter:
    """Writes the summary of one fit (:meth:`summary`), block by block, from its results (read only)."""

    def __init__(self, results) -> None:
        self.results = results

    def summary(self, benchmark: bool = True) -> DPIVSummary:
        """The summary's tables and notes; ``benchmark=False`` leaves out every NON-PRIVATE number (the
        publishable summary, :meth:`dpivreg.reporting.results.DPIVResults.summary`)."""
        smry = DPIVSummary()
        smry.non_private = bool(benchmark)
        smry.tables.append(self._top_table())
        smry.tables.append(self._parameter_table(benchmark))
        if self.results.scale.moments is not None:
            smry.tables.append(self._first_stage_table())
            if len(self.results.iv_tests):
                smry.tables.append(iv_tests_table(self.results.iv_tests, exact=self.results.scale.moments.sigma == 0))
        if self.results.settings.method != "moments" and not self.results.scale.unit_level:
            smry.tables.append(self._bound_table())
        smry.add_extra_txt(self._notes(benchmark))
        return smry

    def _top_rows(self) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        s, priv = self.results.settings, self.results.privacy
        paper = s.calibration == "paper"

        def budget(requested: float, spent: float) -> str:
            return f"{_fmt(spent)} (asked {_fmt(requested)})" if paper else _fmt(spent)

        units = self.results.scale.units
        left = [
            ("Dep. Variable:", self.results.design.dependent_name),
            ("Estimator:", self.results.estimator),
            ("Privacy unit:", "row" if not self.results.scale.unit_level else
             f"{units.unit} ({units.n_units:,} units, <= {units.max_rows} rows)"),
            ("No. Observations:", f"~{self.results.nobs} (private)" if self.results.scale.unit_level else
             str(self.results.nobs)),
            ("Cov. Estimator:", s.cov_type if s.cov_type != "clustered" or units is None else
             f"clustered ({units.clusters}, {units.n_clusters:,})"),
        ]
        if s.selection is not None:
            left.append(("Chosen by:", f"predicted error ratio {_fmt(s.selection.error_ratio, 3)}"))
        if s.method == "moments":
            left += [("Method:", "2SLS on released second moments"),
                     ("Preprocessing:", self._preprocess_label()), ("Bounds:", self._scaling_label())]
            right = [(math_label("rho (zCDP, moments):"), _fmt(priv.rho0))]
            if priv.rho_of("rho_clip"):
                right.append((math_label("rho_clip (zCDP, clipping):"), _fmt(priv.rho_of("rho_clip"))))
        else:
            left += [
                (math_label("Iterations T:"), f"{s.T} ({s.T_source})"),
                ("Method:", s.method),
                ("Start:", {"moments": "warm (private moments)", "zero": "zero (the Algorithm)"}[s.init]),
                ("Schedule:", s.schedule),
                ("Preprocessing:", self._preprocess_label()),
                (math_label("Step size eta:"), f"{_fmt(s.eta)} ({s.eta_source})"),
                (math_label("Step size alpha:"), f"{_fmt(s.alpha)} ({s.alpha_source})"),
                (math_label("Clip gamma1, gamma2:"), f"{_fmt(s.clip1)}, {_fmt(s.clip2)}"),
                ("Clip rule:", s.clip_source),
                ("Bounds:", self._scaling_label()),
            ]
            right = [
                ("Calibration:", s.calibration),
                (math_label("rho0 (zCDP, preprocessing):"), _fmt(priv.rho0)),
                (math_label("rho_clip (zCDP, clipping):"), _fmt(priv.rho_of("rho_clip"))),
                (math_label("rho1 (zCDP):"), budget(s.rho1, priv.rho1)),
                (math_label("rho2 (zCDP):"), budget(s.rho2, priv.rho2)),
            ]
        right.append((math_label("rho_inf (zCDP, inference):"), _fmt(priv.rho_of("rho_inf"))))
        if self.results._first_stage_meat is not None:
            right.append((math_label("rho_diag (zCDP, diagnostics' meats):"), _fmt(priv.rho_of("rho_diag"))))
        right += _budget_rows(priv, self.results.delta)
        return left, right

    def _preprocess_label(self) -> str:
        return {"private": "private moments", "bounds": "bounds only", "data": "data moments (LEAK)"}[
            self.results.settings.preprocess]

    def _scaling_label(self) -> str:
        sources = set(self.results.scale.source[self.results.scale.source != "constant"])
        if sources == {"bounds"}:
            return "public bounds"
        if sources == {"data"}:
            return "from data (LEAK)"
        if not sources:
            return "none needed"
        return "public + data (LEAK)"

    def _top_table(self) -> SimpleTable:
        title = (("Noisy-Moment 2SLS" if self.results.settings.method == "moments" else "DP-2S-GD")
                 + " Estimation Summary")
        return two_column_table(*self._top_rows(), title=title)

    def _parameter_table(self, benchmark: bool = True) -> SimpleTable:
        names = self.results.design.regressor_names
        private, private_headers = private_parameter_rows(self.results, names, self._column_label)
        if not benchmark:
            return SimpleTable([private[c] for c in names], headers=private_headers, stubs=names,
                               txt_fmt=copy.deepcopy(fmt_params),
                               title=f"Parameter Estimates (private: {self.results.estimator})")
        bench = self.results.benchmark
        ref, se = bench.params[names], bench.std_errors[names]
        diff = self.results.params - ref
        rows = [private[c] + [_fmt(ref[c]), _fmt(se[c]), _fmt(diff[c]), _fmt(diff[c] / se[c], 3)] for c in names]
        headers = private_headers + ["IV2SLS*", "Std. Err.*", "Diff.*", "Diff./SE*"]
        return SimpleTable(
            rows, headers=headers, stubs=names, txt_fmt=copy.deepcopy(fmt_params),
            title=f"Parameter Estimates (private: {self.results.estimator}; * = NON-PRIVATE benchmark)",
        )

    @property
    def _column_label(self) -> str:
        return "Moments" if self.results.settings.method == "moments" else "DP-2S-GD"

    def _first_stage_table(self) -> SimpleTable:
        table = self.results.first_stage_diagnostics
        rows = [[_fmt(r["partial.rsquared"]),
                 f"[{_fmt(r['partial.rsquared.lower'])}, {_fmt(r['partial.rsquared.upper'])}]",
                 _fmt(r["shea.rsquared"]), _fmt(r["f.stat"]), f"[{_fmt(r['f.lower'])}, {_fmt(r['f.upper'])}]",
                 f"{r['f.pval']:.4f}", r["f.dist"]] for _, r in table.iterrows()]
        return SimpleTable(
            rows, headers=["Partial R2", "95% (noise)", "Shea R2", "F", "95% (noise)", "P>F", "Dist."],
            stubs=list(table.index), txt_fmt=copy.deepcopy(fmt_params),
            title=self._first_stage_title(),
        )

    def _first_stage_title(self) -> str:
        if self.results.scale.moments.sigma == 0:
            return "First-stage diagnostics (from exact moments: NOT private)"
        if self.results._first_stage_meat is not None:
            return "First-stage diagnostics (private: moment release; robust Wald from the first-stage meat, rho_diag)"
        return "First-stage diagnostics (private: from the moment release, no extra cost)"

    def _bound_table(self) -> SimpleTable:
        rows = self.results.bound.rows()
        c = self.results.contraction
        rows.append(("κ_β, κ_Θ (second, first stage)", f"{_fmt(c.kappa_beta)}, {_fmt(c.kappa_theta)}"))
        if self.results.settings.init == "moments":
            rows.append(("Start", "warm: optimisation term × statistical"))
        return SimpleTable(
            [[v] for _, v in rows], stubs=[k for k, _ in rows], txt_fmt=copy.deepcopy(fmt_2cols),
            title="Error bound components (Theorem, up to constants)",
        )

    def cautions(self) -> list[str]:
        """The notes that qualify the estimate (computed from releases and public inputs, so publishable, and
        carried by every export): unreliable private standard errors, weak instruments, what the moment release
        cannot resolve."""
        inference = self.results._inference
        found = [self._unreliable_caution()] if inference is not None else []
        found += self._inference_warning_cautions()
        found.append(self._gradient_histogram_caution())
        if self.results.scale.moments is not None and self.results._inference is not None:
            first_stage = self._first_stage_notes()
            weak = [note for note in first_stage if note.startswith("WEAK INSTRUMENTS")]
            # with a weak-instrument note, the Anderson-Rubin set it points to travels with it
            found += weak + ([note for note in first_stage if note.startswith("Anderson-Rubin")] if weak else [])
        found += [note for note in self._resolution_notes() if not note.startswith("No moment release")]
        return [note for note in found if note]

    def _unreliable_caution(self) -> str:
        inf = self.results._inference
        if inf is None or inf.reliable:
            return ""
        return ("CAUTION: private std. errors flagged unreliable (first-stage noise ratio "
                f"{inf.first_stage_noise_ratio:.2g}, whitening error {inf.whitening_error:.2g}); their coverage is "
                "not known and may be far below nominal.")

    def _inference_warning_cautions(self) -> list[str]:
        """The inference's warnings other than the unreliable flag (a meat whose histogram saw nothing above its
        noise: very wide standard errors; a simulated bias above 0.2 SE), as CAUTIONs: they qualify the standard
        errors as much."""
        inference = self.results._inference
        return [_caution(message) for message in (inference.warnings if inference else ())
                if not message.startswith("the private standard errors may be unreliable")]

    def _gradient_histogram_caution(self) -> str:
        """A CAUTION when DP-2S-GD ran with a clipping threshold at its grid's top edge (a gradient histogram that
        showed no bin above its noise: much noise in those gradients), else ""."""
        clip = self.results.settings.adaptive_clip
        note = clip.unseen_note() if clip is not None else ""
        return _caution(note) if note else ""

    def _inference_text(self, benchmark: bool = True) -> str:
        if self.results._inference is None:
            return f"Private std. errors: {self.results._inference_note}." + (
                " The IV2SLS std. errors ignore the privacy noise and are not private." if benchmark else "")
        inf = self.results._inference
        share = np.diag(inf.cov_noise) / np.diag(inf.cov)
        caution = self._unreliable_caution()
        caution = caution + " " if caution else ""
        robust = inf.cov_type == "robust"
        if inf.cov_type == "clustered":
            units = self.results.scale.units
            sampling = (f"cluster-robust (sandwich) 2SLS sampling variance from a private meat of the instrument "
                        f"scores summed by cluster ({units.clusters}, {units.n_clusters:,} clusters; rho_inf)")
            errors = "independent clusters"
        elif robust:
            sampling = "robust (sandwich) 2SLS sampling variance from a private meat of the instrument scores (rho_inf)"
            errors = "independent rows"
        elif self.results.settings.method == "moments":
            sampling = "homoskedastic 2SLS sampling variance with the residual variance read from the moment release"
            errors = "homoskedastic errors"
        else:
            sampling = "homoskedastic 2SLS sampling variance from a private residual variance (rho_inf)"
            errors = "homoskedastic errors"
        if self.results.settings.method == "moments":
            how = sampling + " + privacy-noise variance by parametric bootstrap of the release"
            assumes = errors + " and values within their bounds"
        else:
            how = (sampling + " + privacy-noise variance by parametric bootstrap of the whole fit (moments, warm "
                   "start, iteration)")
            assumes = errors + " and negligible gradient clipping"
        return caution + (
            f"Private std. errors (normal approx., 95% CI): {how} ({inf.replications} paths; noise share of the "
            f"variance {_percent(np.min(share))}-{_percent(np.max(share))}). Intervals are centred at the "
            f"estimate. Assumes {assumes}."
        )

    def _first_stage_notes(self) -> list[str]:
        """The weak-instrument warning and the Anderson–Rubin set (post-processing of the moment release)."""
        exact = self.results.scale.moments.sigma == 0  # rho0 = inf or preprocess="data": no noise, and not private
        source = "from exact moments: NOT private" if exact else "from the moment release, no extra cost"

        def noise(lower: float, upper: float) -> str:
            return "" if exact else f" (95% noise interval [{_fmt(lower, 3)}, {_fmt(upper, 3)}])"

        notes = []
        several = len(self.results.design.endog_names) > 1
        if several:
            cd = self.results.cragg_donald
            notes.append(
                f"Cragg-Donald minimum eigenvalue statistic (joint first-stage strength; compare with Stock-Yogo's "
                f"critical values for {len(self.results.design.endog_names)} endogenous regressors and "
                f"{len(self.results.design.instrument_names)} instruments; homoskedastic; {source}): "
                f"{_fmt(cd['statistic'], 3)}{noise(cd['lower'], cd['upper'])}.")
            rule = "the one-regressor rule of thumb; Stock-Yogo's critical values for several are higher"
            strength = [("the Cragg-Donald statistic", cd["statistic"], cd["lower"], cd["upper"], WEAK_F,
                         f"{WEAK_F:g} ({rule})")]
        elif self.results._first_stage_meat is not None:  # the effective F: heteroskedasticity-robust, with its own
            # critical value (read directly: the whole IV-tests table is not needed for the note)
            f = self.results.effective_f
            robust_to = ("heteroskedasticity and within-cluster correlation" if self.results._first_stage_meat.clustered
                         else "heteroskedasticity")
            strength = [(f"the effective F (Montiel Olea-Pflueger, robust to {robust_to})", f.stat, f.lower,
                         f.upper, f.critical_value,
                         f"MOP's critical value {_fmt(f.critical_value, 3)} for a worst-case bias of 10%")]
        else:  # without the first stage's meat: the homoskedastic F against the rule of thumb
            rule = f"{WEAK_F:g} (Staiger and Stock's rule of thumb)"
            strength = [(f"the first-stage F of {name}", row["f.stat"], row["f.lower"], row["f.upper"], WEAK_F, rule)
                        for name, row in self.results.first_stage_diagnostics.iterrows()]
        for what, value, lower, upper, bar, rule in strength:
            if lower >= bar:
                continue
            certain = upper < bar
            notes.append(
                f"WEAK INSTRUMENTS{'' if certain else ' (possibly)'}: {what} is {_fmt(value, 3)}{noise(lower, upper)}"
                f"{', below' if certain else ', reaching below'} {rule}: the Wald intervals above may "
                "under-cover" + ("." if several else "; the Anderson-Rubin set below is robust to weak instruments "
                                                    "(it assumes homoskedastic errors)."))
        if not several:
            ar = self.results.anderson_rubin(0.95)
            notes.append(
                f"Anderson-Rubin 95% set for {ar.variable} (robust to weak instruments; homoskedastic errors; "
                f"{source}): {ar} ({ar.kind}).")
        if self.results.cov_type == "clustered":
            notes.append(self._clustered_note(several))
        return notes

    def _clustered_note(self, several: bool) -> str:
        """Which first-stage statistics assume independent rows in a clustered fit: the Cragg–Donald statistic with
        several endogenous regressors, else the Anderson–Rubin set and, without the first stage's meat, the F."""
        correlation = "with the within-cluster correlation that the clustered standard errors allow"
        if several:
            return (f"The Cragg-Donald statistic assumes independent, homoskedastic rows: {correlation} it overstates "
                    "the evidence (the first-stage Wald statistics above are clustered).")
        if self.results._first_stage_meat is None:
            return (f"The first-stage F and the Anderson-Rubin set assume independent rows: {correlation} they "
                    "overstate the evidence (rho_diag, spent by default, releases a clustered first-stage Wald "
                    "statistic instead of the F).")
        return (f"The Anderson-Rubin set assumes independent rows: {correlation} it overstates the evidence (the "
                "first-stage Wald statistic and the effective F above are clustered).")

    def _resolution_notes(self) -> list[str]:
        """What the moment release cannot resolve (post-processing of the release and its public σ): directions of
        the constant and the instruments, or of the constant and the regressors that involve an endogenous one, below
        its noise floor, and columns whose released mean is at a bound. The design's own checks
        (:class:`~dpivreg.errors.DataCheckWarning`) read the data; these say the same from the releases, so they may
        be published. Without a moment release nothing released can say it, and the note says that."""
        moments = self.results.scale.moments
        if moments is None:
            return ["No moment release (preprocess='bounds'): nothing released shows whether each column has usable "
                    "variation and lies within its bounds; the default preprocess='private' releases the moments "
                    "that would."]
        if moments.sigma == 0:
            return []
        design = self.results.design
        names = ["the constant", *free_columns(design, design.constant_name)]
        block = moments.instrument_block
        n_exog = block - len(design.instrument_names)  # the constant and the exogenous columns lead
        endog = list(range(block, block + len(design.endog_names)))
        notes = []
        for columns, label, what in (
                (list(range(block)), "the instruments [exog, instruments]", _UNRESOLVED_INSTRUMENTS),
                (list(range(n_exog)) + endog, "the regressors [exog, endog]", _UNRESOLVED_REGRESSORS)):
            for vector in unresolved_directions(moments.matrix, moments.sigma, columns):
                if label.startswith("the regressors") and np.abs(vector[n_exog:]).max() < _LOADING:
                    continue  # a direction of the exogenous columns alone: the instruments' note names it
                heavy = [f"{names[columns[i]]} ({vector[i]:+.2f})" for i in np.argsort(-np.abs(vector))
                         if abs(vector[i]) >= _LOADING]
                notes.append(
                    f"UNRESOLVED: the released second moments of the constant and {label} have a direction, mostly "
                    f"{', '.join(heavy)}, below their noise floor {NOISE_FLOOR:.3g}*sigma: the release cannot tell it "
                    f"from no variation ({what}) (post-processing of the moment release, no extra cost).")
        sides = means_at_bounds(moments.matrix, moments.sigma)
        for j in np.flatnonzero(sides):
            notes.append(
                f"Column {names[j]!r}: its released mean lies at its {'upper' if sides[j] > 0 else 'lower'} bound "
                "(within two noise standard deviations): its values may all lie at or beyond that bound; check the "
                "bounds (post-processing of the moment release).")
        return notes

    def _notes(self, benchmark: bool = True) -> list[str]:
        d, sc = self.results.design, self.results.scale
        label = self._column_label
        notes = [f"Private release: the {label} columns (the estimate and its inference); their cost is the total "
                 "rho above."]
        if benchmark:
            kind = self.results.benchmark.cov_type
            notes += [
                f"* NON-PRIVATE: the IV2SLS estimate, its {kind} std. err., the difference {label} - IV2SLS and that",
                "  difference in IV2SLS std. errs. are computed from the raw data without noise. Use them to "
                "validate;",
                "  never publish them.",
            ]
            omitted = self.results.benchmark.omitted
            if omitted:
                notes.append(f"  IV2SLS* omits {', '.join(map(str, omitted))}: collinear with the columns before "
                             "them, as Stata's ivregress omits them (non-private; the private fit keeps every column).")
            if self.results._units is not None and self.results._units.dropped_rows:  # NON-PRIVATE counts
                notes.append(f"  IV2SLS* is on the rows the fit keeps: {self.results._units.truncated_units} "
                             f"unit(s) had more than {self.results._units.facts.max_rows} rows, "
                             f"{self.results._units.dropped_rows} row(s) left out (non-private counts).")
        notes.append(self._inference_text(benchmark))
        if self.results.scale.moments is not None:
            notes += self._first_stage_notes()
            tests = self.results.iv_tests
            if len(tests) or tests.attrs.get("refused"):
                notes.append(_iv_tests_note(tests, exact=self.results.scale.moments.sigma == 0))
        if self.results.privacy_unit is not None:
            notes.append(self._unit_note())
        units = self.results.scale.units
        if units is not None and units.clusters is not None and units.clusters != units.unit:
            notes.append(f"Clusters: {units.clusters} ({units.n_clusters:,}), declared a public grouping of the "
                         f"{'units' if self.results.privacy_unit is not None else 'rows'}: which cluster each "
                         "belongs to and the number of clusters are public; each cluster's summed scores are clipped.")
        if self.results.settings.method != "moments" and self.results.scale.unit_level:
            notes.append("Error bound: not shown; the Theorem is stated for row-level privacy and independent rows.")
        elif self.results.settings.method != "moments":
            notes.append(
                "Error bound: the Theorem's terms with all constants set to 1 (shapes, not calibrated errors); "
                "no privacy cost. " + ("kappa from the released Theta^(T) (method 'gd')."
                                      if self.results.settings.method == "gd" else
                                      "The Theorem is proved for method 'gd'; kappa here is the preconditioned "
                                      "iteration's contraction."))
        if self.results.settings.selection is not None:
            sel = self.results.settings.selection
            other = "noisy moments" if sel.estimator == "DP-2S-GD" else "DP-2S-GD"
            notes.append(
                f"Estimator chosen by the default (method 'auto') over {other}: predicted privacy-noise error of the "
                f"endogenous coefficients (median and 90th percentile, in the same simulated worlds), DP-2S-GD / noisy "
                f"moments = {sel.error_ratio:.3g} (post-processing of the moment and clipping releases; both routes "
                "spend the same total budget).")
        if self.results.settings.adaptive_clip is not None:
            clip = self.results.settings.adaptive_clip
            counted = "units (their summed gradients)" if self.results.scale.unit_level else "rows"
            notes.append(
                "Clipping thresholds: private (rho_clip), from released histograms of the gradient norms at the "
                f"start; each allows at most {_rows_allowed(clip.targets)} {counted} above it"
                + (" (exogenous rows and coordinates clipped as a group of their own, "
                   f"{self.results.settings.exog_share:.0%} of each stage's budget)." if clip.grouped else "."))
            caution = self._gradient_histogram_caution()
            if caution:
                notes.append(caution)
        notes += self._inference_warning_cautions()  # the unreliable flag is in the inference line above
        notes += [
            f"Endogenous: {', '.join(d.endog_names)}. Instruments: {', '.join(d.instrument_names)}."
            + (f" Exogenous: {', '.join(d.exog_names)}." if d.exog_names else " No exogenous regressors."),
        ]
        by_source = {src: list(sc.source.index[sc.source == src]) for src in ("bounds", "data", "constant")}
        if by_source["bounds"]:
            notes.append(f"Scaled by public bounds: {', '.join(map(str, by_source['bounds']))}.")
        notes += list(sc.bound_notes)
        notes += self._resolution_notes()
        if by_source["data"]:
            notes.append(f"Scaled from the data (PRIVACY LEAK): {', '.join(by_source['data'])}.")
        n_clipped = int(sc.clipped_values.sum())
        if n_clipped and benchmark:  # a NON-PRIVATE count: left out of the publishable summary
            notes.append(f"{n_clipped} value(s) lay outside the bounds and were clipped to them (non-private count).")
        return notes + _privacy_notes(self.results.leaks, self.results.privacy.sampler)

    def _unit_note(self) -> str:
        """What the guarantee protects, with a privacy unit (public facts only)."""
        u = self.results.scale.units
        return (f"Privacy unit: {u.unit}. Neighbouring data sets replace all rows of one unit; the number of units "
                f"(N = {u.n_units:,}) is public, the row count is not (No. Observations is its private estimate). "
                f"Each unit contributes at most {u.max_rows} rows (a random subset of larger units); the gradients "
                "and the clipping release are clipped per unit, the releases that sum rows have "
                f"{u.max_rows} times their row-level sensitivity. epsilon is per unit.")
