"""Compile a LaTeX fragment with pdflatex, for the summary tests: in a minimal article (booktabs, graphicx, amssymb;
landscape, tiny type) or in the standard article (the same packages, its own text width and type), and read the
overfull boxes from the log.

.ci/run installs TeX and sets DPIVREG_REQUIRE_LATEX=1, so that CI fails rather than skips without it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

#: The packages the summaries' LaTeX needs (DPIVSummary.as_latex): booktabs (rules), graphicx (\resizebox), amssymb.
PACKAGES = "\\usepackage{booktabs}\n\\usepackage{graphicx}\n\\usepackage{amssymb}\n"
PREAMBLE = ("\\documentclass{article}\n" + PACKAGES +
            "\\usepackage[margin=1cm,landscape]{geometry}\n\\begin{document}\n\\tiny\n")
#: The standard article class as it comes (portrait, 10pt type, a text width of 345pt).
ARTICLE = "\\documentclass{article}\n" + PACKAGES + "\\begin{document}\n"


def require_pdflatex() -> None:
    """Skip (or, with DPIVREG_REQUIRE_LATEX=1, fail) when pdflatex is not installed."""
    if shutil.which("pdflatex") is None:
        if os.environ.get("DPIVREG_REQUIRE_LATEX") == "1":
            pytest.fail("pdflatex is required (DPIVREG_REQUIRE_LATEX=1) but not installed")
        pytest.skip("pdflatex is not installed")


def compile_latex(body: str, directory: Path, name: str, *, preamble: str = PREAMBLE) -> Path:
    """pdflatex on ``body`` after ``preamble``; asserts it compiles and returns the PDF's path (its log beside it)."""
    require_pdflatex()
    tex = directory / f"{name}.tex"
    tex.write_text(preamble + body + "\n\\end{document}\n")
    run = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", tex.name], cwd=directory,
                         check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:]
    pdf = directory / f"{name}.pdf"
    assert pdf.exists()
    return pdf


def overfull_hboxes(pdf: Path) -> list[str]:
    r"""The "Overfull \hbox (...pt too wide)" lines of the log of a document compiled by :func:`compile_latex`:
    material wider than the line (TeX reports what exceeds it by more than \hfuzz, 0.1pt)."""
    log = pdf.with_suffix(".log").read_text(encoding="latin-1")
    return re.findall(r"^Overfull \\hbox \([^)]*\).*$", log, flags=re.MULTILINE)
