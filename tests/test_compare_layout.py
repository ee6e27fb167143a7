"""The layout of a comparison (issue 42, item 6): its LaTeX within the text width of the standard article, a rule
between the settings and the coefficients, mathematics typeset, and ``compare(...).plot()``.

The fits are those of tests/test_publish.py (n = 1,500): three of one design and one of another, so that a
4-fit comparison with the benchmark has six columns of numbers, two of them NON-PRIVATE.
"""

from __future__ import annotations

import re
import sys
import warnings

import matplotlib
import numpy as np
import pytest
from latex import ARTICLE, compile_latex, overfull_hboxes
from matplotlib.container import ErrorbarContainer
from scipy import stats
from test_publish import BOUNDS, FIT, F, _frame

from dpivreg import DPIV2SLS, PrivacyLeakWarning, compare

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

#: The shrink-to-the-line wrapper of a table (graphicx's \resizebox), to typeset it at its natural width instead.
SHRINK = re.compile(r"\\resizebox\{[^\n]*\}\{!\}\{%\n")


@pytest.fixture(scope="module")
def four():
    frame = _frame()
    model = DPIV2SLS.from_formula(F, frame)
    return {"rho = 2.6": model.fit(**FIT), "rho = 0.5": model.fit(rho=0.5, bounds=BOUNDS, seed=4),
            "no w": DPIV2SLS.from_formula("y ~ 1 + [x ~ z]", frame).fit(rho=2.6, bounds=BOUNDS, seed=5),
            "rho = 10": model.fit(rho=10.0, bounds=BOUNDS, seed=6)}


@pytest.fixture
def figures():
    """Closes the figures a test draws."""
    yield
    plt.close("all")


def _latex(summary) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)  # the benchmark's warning is tested elsewhere
        return summary.as_latex()


# ---------------------------------------------------------------------------------------- the page
@pytest.mark.parametrize("benchmark", [True, False])
def test_a_four_fit_comparison_compiles_within_the_text_width_of_the_article(four, benchmark, tmp_path):
    """pdflatex in the standard article class (a 345pt text width, 10pt type): no overfull box in the log."""
    table = compare(four, benchmark=benchmark)
    tex = _latex(table.summary)
    pdf = compile_latex(tex, tmp_path, f"compare_{benchmark}", preamble=ARTICLE)
    assert overfull_hboxes(pdf) == []
    assert tex.count(r"\begin{tabular}{") == 1 and (r"\\(no w)" in tex) == benchmark  # one table, six columns
    if benchmark:  # the check can fail: with its two benchmark columns, the table at its natural width overflows
        natural = compile_latex(SHRINK.sub("{", tex), tmp_path, "natural", preamble=ARTICLE)
        assert overfull_hboxes(natural)


@pytest.mark.parametrize("benchmark", [True, False])
def test_the_summary_of_one_fit_compiles_within_the_text_width_too(four, benchmark, tmp_path):
    pdf = compile_latex(_latex(four["rho = 2.6"].summary(benchmark=benchmark)), tmp_path, f"one_{benchmark}",
                        preamble=ARTICLE)
    assert overfull_hboxes(pdf) == []


def test_a_narrow_table_keeps_its_size(four, tmp_path):
    r"""\resizebox only shrinks: a one-fit comparison without the benchmark is narrower than the line and is
    typeset at its natural width (the wrapper's width is the table's own then)."""
    tex = _latex(compare({"a": four["rho = 2.6"]}, benchmark=False).summary)
    assert r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}" in tex
    compile_latex(tex, tmp_path, "narrow", preamble=ARTICLE)


# ---------------------------------------------------------------------------------------- settings | coefficients
def test_a_rule_separates_the_settings_from_the_coefficients(four):
    table = compare(four)
    text = table.summary.as_text().splitlines()
    first = next(i for i, line in enumerate(text) if line.startswith("Intercept"))
    assert set(text[first - 1]) == {"-"}
    # the settings end with the IV tests' rows (these exactly identified fits have the endogeneity tests and the
    # effective F)
    labels = ["Wu-Hausman p-value", "Robust endog. p-value", "Effective F"]
    assert all(line.startswith(label) for line, label in zip(text[first - 4:first - 1], labels))
    assert text[first - 5].startswith("Noise sampler")
    latex = _latex(table.summary).splitlines()
    first = next(i for i, line in enumerate(latex) if line.startswith(r"\textbf{Intercept}"))
    assert latex[first - 1] == r"\midrule" and latex[first - 2].startswith(r"\textbf{Effective F}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        html, csv = table.summary.as_html(), table.summary.as_csv()
    rows = html.split("<tr>")
    ruled = [row for row in rows if "border-top" in row]
    assert len(ruled) == 1 and "<th style=\"border-top: 1px solid\">Intercept</th>" in ruled[0]
    assert not [line for line in csv.splitlines() if line and set(line) == {"-"}]  # CSV stays data


# ---------------------------------------------------------------------------------------- mathematics
def test_the_comparison_typesets_its_parameters_as_mathematics(four):
    table = compare(four, benchmark=False)
    tex = _latex(table.summary)
    for math in (r"\textbf{$\rho$ (zCDP)}", r"\textbf{$\varepsilon$ ($\delta$ = $10^{-5}$)}",
                 r"\textbf{Iterations $T$}", r"$k^{2}\rho$"):
        assert math in tex
    assert "textasciicircum" not in tex and tex.isascii()
    html = table.summary.as_html()
    assert "<th>ρ (zCDP)</th>" in html and "<th>ε (δ = 10<sup>−5</sup>)</th>" in html
    assert "k<sup>2</sup>ρ" in html
    text = table.summary.as_text()  # the text stays plain
    assert "rho (zCDP)" in text and "epsilon (delta 1e-05)" in text and "k^2 rho" in text


def test_fits_at_different_deltas_show_theirs_in_each_cell(four):
    frame = _frame()
    other = DPIV2SLS.from_formula(F, frame).fit(**FIT, delta=1e-6)
    table = compare({"a": four["rho = 2.6"], "b": other}, benchmark=False)
    tex, text = _latex(table.summary), table.summary.as_text()
    assert rf"{table.epsilon['b']:.4g} ($\delta$ = $10^{{-6}}$)" in tex and r"\textbf{$\varepsilon$}" in tex
    assert f"{table.epsilon['a']:.4g} (delta 1e-05)" in text


def test_the_summary_typesets_its_formulas(four):
    res = four["rho = 2.6"]
    tex = _latex(res.summary())
    for math in (r"$\kappa^{T/2}$", r"$\rho_{1}$ (zCDP)", r"$\rho_{\mathrm{clip}}$", r"Step size $\eta$",
                 r"Clip $\gamma_{1}$, $\gamma_{2}$", r"$\kappa_\beta$, $\kappa_\Theta$", r"$T \lesssim \rho_1 n^{2}"):
        assert math in tex
    assert "textasciicircum" not in tex
    html = res.summary(benchmark=False).as_html()
    assert "κ<sup>T/2</sup>" in html and "ρ<sub>1</sub> (zCDP):" in html and "P&gt;|z|" in html
    assert "κ^(T/2)" in res.summary().as_text()


def test_names_are_text_not_mathematics(four, tmp_path):
    """A fit's name is the user's text: escaped, never read as a parameter (a fit named "rho" stays "rho")."""
    table = compare({"rho": four["rho = 2.6"], "a_1 & 50%": four["rho = 0.5"]}, benchmark=False)
    tex = _latex(table.summary)
    assert r"\textbf{rho}" in tex and r"\textbf{a\_1 \& 50\%}" in tex
    compile_latex(tex, tmp_path, "names", preamble=ARTICLE)
    assert "<th>a_1 &amp; 50%</th>" in table.summary.as_html()


# ---------------------------------------------------------------------------------------- the plot
def _bars(fig) -> dict[str, list[ErrorbarContainer]]:
    return {ax.get_title(): [c for c in ax.containers if isinstance(c, ErrorbarContainer)] for ax in fig.axes}


def _interval(container: ErrorbarContainer) -> tuple[float, float, float]:
    """(estimate, lower, upper) of one drawn estimate."""
    (segment,) = container.lines[2][0].get_segments()
    return float(container.lines[0].get_xdata()[0]), float(segment[0, 0]), float(segment[1, 0])


def _texts(fig) -> list[str]:
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    ticks = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
    return [t.get_text() for legend in legends for t in legend.get_texts()] + ticks


def test_the_plot_draws_each_estimate_and_its_private_interval(four, figures):
    table = compare(four, benchmark=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)  # no benchmark: nothing to warn of
        fig = table.plot()
    assert isinstance(fig, matplotlib.figure.Figure)
    bars = _bars(fig)
    assert list(bars) == ["Intercept", "w", "x"]
    assert [len(b) for b in bars.values()] == [4, 3, 4]  # "no w" has no w
    for name, drawn in bars.items():
        fits = [res for res in four.values() if name in res.params.index]
        for container, res in zip(drawn, fits):
            ci = res.conf_int(level=0.95)
            np.testing.assert_allclose(_interval(container), (res.params[name], *ci.loc[name]), rtol=1e-12)
    texts = _texts(fig)
    assert "private estimate, 95% interval" in texts and not [t for t in texts if "NON-PRIVATE" in t]


def test_the_benchmark_is_drawn_marked_non_private_and_warns(four, figures):
    table = compare(four)
    with pytest.warns(PrivacyLeakWarning, match="the plot holds the NON-PRIVATE IV2SLS benchmark") as caught:
        fig = table.plot()
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert [len(b) for b in _bars(fig).values()] == [6, 4, 6]  # two benchmark designs; "no w"'s has no w
    texts = _texts(fig)
    assert "IV2SLS (NON-PRIVATE)" in texts and "NON-PRIVATE IV2SLS (no w)" in texts
    estimate, lower, upper = _interval(_bars(fig)["x"][4])
    bench = four["rho = 2.6"].benchmark
    np.testing.assert_allclose((estimate, lower, upper), (bench.params["x"], *bench.conf_int(0.95).loc["x"]))
    assert _bars(fig)["x"][4].lines[2][0].get_linestyle() != _bars(fig)["x"][0].lines[2][0].get_linestyle()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        public = table.plot(benchmark=False)  # the publishable picture of the validation table
    assert not [t for t in _texts(public) if "NON-PRIVATE" in t]


def test_the_level_sets_the_width_of_the_intervals(four, figures):
    table = compare(four, benchmark=False)
    wide, narrow = (_bars(table.plot(level=level, coefficients=["x"]))["x"] for level in (0.95, 0.5))
    ratio = [(w[2] - w[1]) / (n[2] - n[1]) for w, n in zip(map(_interval, wide), map(_interval, narrow))]
    np.testing.assert_allclose(ratio, stats.norm.ppf(0.975) / stats.norm.ppf(0.75), rtol=1e-10)
    assert "private estimate, 50% interval" in _texts(table.plot(level=0.5))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"level": 95}, ValueError, "level must lie in"),
    ({"level": 0.0}, ValueError, "level must lie in"),
    ({"coefficients": "educ"}, ValueError, r"unknown coefficient\(s\) 'educ': the comparison's coefficients are "
                                           "'Intercept', 'w', 'x'"),
    ({"coefficients": []}, ValueError, "coefficients is empty"),
    ({"coefficients": ["x", "x"]}, ValueError, "twice"),
    ({"coefficients": 3}, TypeError, "coefficients must be a name"),
    ({"benchmark": "yes"}, TypeError, "benchmark must be True or False"),
])
def test_the_plot_refuses_bad_options_clearly(four, kwargs, error, match, figures):
    with pytest.raises(error, match=match):
        compare(four, benchmark=False).plot(**kwargs)


def test_the_plot_takes_release_records_and_given_axes(four, figures):
    record = four["rho = 0.5"].release()
    table = compare({"record": record, "fit": four["rho = 2.6"]})
    fig, axes = plt.subplots(1, 2)
    with pytest.warns(PrivacyLeakWarning):
        assert table.plot(ax=axes, coefficients=["x", "w"]) is fig
    assert [ax.get_title() for ax in axes] == ["x", "w"]
    np.testing.assert_allclose(_interval(_bars(fig)["x"][0]), (record.params["x"], *record.conf_int(0.95).loc["x"]))
    with pytest.raises(ValueError, match="one Axes per coefficient plotted"):
        table.plot(ax=axes[0], benchmark=False)
    with pytest.raises(ValueError, match="none of the fits has a benchmark"):
        compare([record], benchmark=False).plot(benchmark=True)


def test_the_plot_without_matplotlib_names_the_extra(four, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r"pip install dpivreg\[plot\]"):
        compare(four, benchmark=False).plot()
