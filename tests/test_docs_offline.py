"""The built documentation works offline: its math is typeset with no network, and wide tables scroll.

The readers are statistical agencies in secure rooms without internet. The test builds the HTML
documentation into a temporary directory (about 30 s; docs/conf.py renders the math at build time
with LaTeX and dvisvgm) and opens pages in headless Chromium from ``file://`` URLs, with every
connection sent to a proxy that does not exist and every host name unresolvable. A small script
added to a copy of each page reports, once the page has loaded (and MathJax, if a page uses it, has
finished), the LaTeX left in the rendered text, the formulas that are not typeset or whose image did
not load, every resource the page asked for from the network, and the scroll state of each table's
wrapper. With the old configuration (``sphinx.ext.mathjax``, MathJax from a CDN) it fails: the math
stays ``\\[\\begin{split}...`` and the page requests the CDN's script.

Needs Chromium, ``latex`` and ``dvisvgm``. Without them the tests skip, except with
``DPIVREG_REQUIRE_BROWSER=1`` (set by .ci/run), where they fail. ``DPIVREG_CHROMIUM`` names the
browser's executable if it is not ``chromium`` on the PATH.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
REQUIRE = os.environ.get("DPIVREG_REQUIRE_BROWSER") == "1"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# Runs in the page: after load (and after MathJax's typesetting, should a page use MathJax), write
# what a reader would see into <output id="dpivreg-offline-probe"> as JSON.
PROBE = r"""
<script>
window.addEventListener("load", async () => {
  const report = {};
  try {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      await MathJax.startup.promise;
    }
    const body = document.querySelector("div.body") || document.body;
    const text = body.innerText;
    report.latex_in_text = [];
    for (const marker of ["\\[", "\\(", "\\begin{", "\\end{"]) {
      let at = text.indexOf(marker);
      if (at >= 0) report.latex_in_text.push(text.slice(Math.max(0, at - 30), at + 50));
    }
    const loaded = (img) => img.complete && img.naturalWidth > 0 && img.naturalHeight > 0;
    report.math = 0;
    report.untypeset = [];
    for (const el of body.querySelectorAll("div.math, span.math, img.math")) {
      if (el.matches("div.math img.math")) continue;       // counted with its div
      report.math += 1;
      const img = el.tagName === "IMG" ? el : el.querySelector("img");
      const mathjax = el.querySelector("mjx-container");
      const ok = (img && loaded(img)) || (mathjax && !mathjax.querySelector("mjx-merror"));
      if (!ok) report.untypeset.push((el.getAttribute("alt") || el.textContent).slice(0, 80));
    }
    report.network = performance.getEntriesByType("resource").map((e) => e.name)
      .filter((name) => !/^(file|data|blob|about):/.test(name));
    for (const el of document.querySelectorAll("script[src], link[href], img[src], iframe[src]")) {
      const url = el.src || el.href;
      if (/^(https?:)?\/\//.test(el.getAttribute("src") || el.getAttribute("href") || "")
          && el.rel !== "canonical" && !report.network.includes(url)) report.network.push(url);
    }
    const column = body.getBoundingClientRect();
    report.tables = [...body.querySelectorAll("table")].map((table) => {
      const wrapper = table.parentElement;
      return {
        wrapped: wrapper.classList.contains("dpivreg-table-scroll"),
        overflow_x: getComputedStyle(wrapper).overflowX,
        scroll_width: wrapper.scrollWidth,
        client_width: wrapper.clientWidth,
        table_width: table.getBoundingClientRect().width,
        right: wrapper.getBoundingClientRect().right,
        column_right: column.right,
      };
    });
  } catch (error) {
    report.error = String(error);
  }
  const out = document.createElement("output");
  out.id = "dpivreg-offline-probe";
  out.textContent = JSON.stringify(report);
  document.body.appendChild(out);
});
</script>
"""
PROBE_OUTPUT = re.compile(r'<output id="dpivreg-offline-probe">(.*?)</output>', re.DOTALL)


def _missing(reason: str):
    if REQUIRE:
        pytest.fail(f"{reason}, but DPIVREG_REQUIRE_BROWSER=1 requires it (.ci/run installs it)")
    pytest.skip(reason)


def _chromium() -> str:
    named = os.environ.get("DPIVREG_CHROMIUM")
    if named:
        found = shutil.which(named)
        if not found:
            _missing(f"DPIVREG_CHROMIUM={named!r} is not an executable")
        return found
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    _missing(f"no Chromium ({', '.join(BROWSERS)}) on the PATH to render the docs with")


@pytest.fixture(scope="module")
def chromium() -> str:
    return _chromium()


@pytest.fixture(scope="module")
def built_docs(tmp_path_factory) -> Path:
    """The HTML documentation built from this checkout into a temporary directory."""
    try:
        import numpydoc  # noqa: F401
        import sphinx  # noqa: F401
    except ImportError as error:
        _missing(f"Sphinx and numpydoc are needed to build the docs ({error})")
    for program in ("latex", "dvisvgm"):
        if shutil.which(program) is None:
            _missing(f"{program!r} is needed to typeset the docs' math (Debian: texlive-latex-extra, dvisvgm)")
    out = tmp_path_factory.mktemp("docs")
    env = {key: value for key, value in os.environ.items() if key != "DPIVREG_DOCS_REQUIRE_GENERATED"}
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-b", "html", "-d", str(out / "doctrees"), str(DOCS),
         str(out / "html")],
        capture_output=True, text=True, env=env, timeout=300, check=False)
    assert build.returncode == 0, f"the docs build failed:\n{build.stdout}\n{build.stderr}"
    return out / "html"


def render_offline(chromium: str, page: Path, tmp_path: Path) -> dict:
    """Open a copy of ``page`` (with the probe added) in headless Chromium with no network; the probe's
    report."""
    text = page.read_text(encoding="utf-8")
    assert "</body>" in text
    probed = page.with_name(page.stem + ".offline-probe.html")
    probed.write_text(text.replace("</body>", PROBE + "</body>", 1), encoding="utf-8")
    command = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-extensions", "--disable-default-apps", f"--user-data-dir={tmp_path / 'profile'}",
        # no network: every request goes to a proxy that is not there, no name resolves
        "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--window-size=1280,1000", "--virtual-time-budget=10000", "--dump-dom", probed.as_uri(),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    match = PROBE_OUTPUT.search(run.stdout)
    assert match, (f"the page's probe did not report (chromium exit {run.returncode}):\n"
                   f"{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    report = json.loads(html.unescape(match.group(1)))
    assert "error" not in report, report["error"]
    return report


def test_method_page_math_is_typeset_offline(chromium, built_docs, tmp_path):
    """Every formula of the method page (split/aligned displays, inline math) is typeset and shown
    with the network off; no LaTeX source is left in the text and nothing is fetched from outside."""
    report = render_offline(chromium, built_docs / "method.html", tmp_path)
    assert not report["network"], f"the page asks the network for {report['network']}"
    assert not report["latex_in_text"], f"raw LaTeX in the rendered page: {report['latex_in_text']}"
    assert not report["untypeset"], f"formulas not typeset offline: {report['untypeset']}"
    source = (DOCS / "method.rst").read_text(encoding="utf-8")
    written = source.count(":math:`") + source.count(".. math::")
    assert report["math"] >= written > 30, (report["math"], written)


@pytest.mark.parametrize("page", ["user_guide", "defaults"])
def test_other_pages_with_math_are_typeset_offline(chromium, built_docs, tmp_path, page):
    report = render_offline(chromium, built_docs / f"{page}.html", tmp_path)
    assert not report["network"], f"the page asks the network for {report['network']}"
    assert not report["latex_in_text"], f"raw LaTeX in the rendered page: {report['latex_in_text']}"
    assert report["math"] > 0 and not report["untypeset"], report


def test_wide_tables_scroll_inside_the_body_column(chromium, built_docs, tmp_path):
    """The reproduction page's tables: each in a wrapper that scrolls sideways (overflow-x: auto) and
    ends inside the body column; the widest of them is wider than the column, so it really scrolls."""
    report = render_offline(chromium, built_docs / "reproduction.html", tmp_path)
    tables = report["tables"]
    assert tables, "no table on the reproduction page"
    for table in tables:
        assert table["wrapped"] and table["overflow_x"] == "auto", table
        assert table["right"] <= table["column_right"] + 1, table
    assert any(t["scroll_width"] > t["client_width"] for t in tables), (
        "no table on the reproduction page is wider than the column any more: pick a page that has one",
        tables)


def test_the_reporting_page_renders_offline_and_shows_its_checklist(chromium, built_docs, tmp_path):
    """The "How to report" page: loads with the network off, holds its four sections, and a headless screenshot of
    it is a rendered page (not blank: many distinct colours, text drawn)."""
    report = render_offline(chromium, built_docs / "reporting.html", tmp_path)
    assert not report["network"], f"the page asks the network for {report['network']}"
    text = (built_docs / "reporting.html").read_text(encoding="utf-8")
    for heading in ("What goes in the table", "How to state the guarantee", "Which interval when the instruments are "
                    "weak", "What never to publish"):
        assert heading in text, heading
    shot = tmp_path / "reporting.png"
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               f"--user-data-dir={tmp_path / 'profile-shot'}", "--proxy-server=127.0.0.1:9",
               "--host-resolver-rules=MAP * ~NOTFOUND", "--window-size=1280,1600", f"--screenshot={shot}",
               (built_docs / "reporting.html").as_uri()]
    subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert shot.is_file(), "chromium wrote no screenshot"
    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == (1280, 1600)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "the screenshot is (nearly) blank"
    dark = sum(count for count, (r, g, b) in colours if r + g + b < 200)
    assert dark > 2_000, "no text drawn on the page"
