"""Every page of the docs that discusses the paper links it, to arXiv, through the one target docs/conf.py defines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
ARXIV = "https://arxiv.org/abs/2509.22794"
LINK = re.compile(r"`the paper`_|<the paper_>`_", re.IGNORECASE)


def _local_copy(text: str) -> list[str]:
    """Lines that point at a file of the paper (a PDF, or a file: link) instead of arXiv."""
    return [line.strip() for line in text.split("\n")
            if re.search(r"\.pdf\b|file:", line, re.IGNORECASE)
            and re.search(r"paper|2509\.22794|Balasubramanian", line, re.IGNORECASE)]


def test_the_paper_target_is_defined_once_in_conf_py():
    conf = (DOCS / "conf.py").read_text(encoding="utf-8")
    assert f".. _the paper: {ARXIV}" in conf
    for page in DOCS.glob("*.rst"):
        assert ".. _the paper:" not in page.read_text(encoding="utf-8"), f"{page.name} defines the target again"


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.rst")), ids=lambda p: p.name)
def test_a_page_that_mentions_the_paper_links_it(page):
    text = page.read_text(encoding="utf-8")
    if re.search(r"\bpaper\b|Balasubramanian", text, re.IGNORECASE):
        assert LINK.search(text), f"docs/{page.name} cites the paper without linking it (`the paper`_)"
    assert not _local_copy(text), f"docs/{page.name} points at a local copy of the paper: {_local_copy(text)}"


def test_the_readme_links_the_paper():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"]({ARXIV})" in readme
    assert not _local_copy(readme), _local_copy(readme)


def test_the_local_copy_check_sees_one():
    assert _local_copy("the paper (docs/2509.22794v1.pdf) says")
    assert _local_copy("`the paper <file:///home/me/paper.pdf>`_")
    assert not _local_copy('fig.savefig("dpivreg-output/coefficients.pdf")')
