"""Every page of the docs that discusses the paper links it, to arXiv, through the one target docs/conf.py defines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
ARXIV = "https://arxiv.org/abs/2509.22794"
LINK = re.compile(r"`the paper`_|<the paper_>`_", re.IGNORECASE)


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
    assert not re.search(r"\.pdf\b", text, re.IGNORECASE), f"docs/{page.name} points at a PDF file"


def test_the_readme_links_the_paper():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"]({ARXIV})" in readme
    assert not re.search(r"\.pdf\b", readme, re.IGNORECASE)
