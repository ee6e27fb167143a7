"""Compile a LaTeX fragment with pdflatex in a minimal article (booktabs, amssymb), for the summary tests.

.ci/run installs TeX and sets DPIVREG_REQUIRE_LATEX=1, so that CI fails rather than skips without it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

PREAMBLE = ("\\documentclass{article}\n\\usepackage{booktabs}\n\\usepackage{amssymb}\n"
            "\\usepackage[margin=1cm,landscape]{geometry}\n\\begin{document}\n\\tiny\n")


def require_pdflatex() -> None:
    """Skip (or, with DPIVREG_REQUIRE_LATEX=1, fail) when pdflatex is not installed."""
    if shutil.which("pdflatex") is None:
        if os.environ.get("DPIVREG_REQUIRE_LATEX") == "1":
            pytest.fail("pdflatex is required (DPIVREG_REQUIRE_LATEX=1) but not installed")
        pytest.skip("pdflatex is not installed")


def compile_latex(body: str, directory: Path, name: str) -> Path:
    """pdflatex on ``body`` in the minimal article; asserts it compiles and returns the PDF's path."""
    require_pdflatex()
    tex = directory / f"{name}.tex"
    tex.write_text(PREAMBLE + body + "\n\\end{document}\n")
    run = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", tex.name], cwd=directory, check=False,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:]
    pdf = directory / f"{name}.pdf"
    assert pdf.exists()
    return pdf
