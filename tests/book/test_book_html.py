"""The built book (made by `make book` / `make test` before pytest runs) shows no nbdev or nbval
noise, typesets its math and links every chapter to Colab."""

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from helpers import ROOT, chapter_notebooks

HTML = ROOT / "_build" / "html"

NOTEBOOKS = chapter_notebooks()


class _Page(HTMLParser):
    "Visible text of a page (no scripts or styles), and its links and classes."

    def __init__(self):
        super().__init__()
        self.text, self.links, self.classes, self._skip = [], [], set(), 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "style"):
            self._skip += 1
        if a.get("href"):
            self.links.append(a["href"])
        self.classes.update((a.get("class") or "").split())

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


def _page(nb: Path):
    path = HTML / "nbs" / (nb.stem + ".html")
    if not path.exists():
        pytest.fail(f"{path} is missing: build the book first (`make book`; `make test` does it)")
    raw = path.read_text(encoding="utf-8")
    p = _Page()
    p.feed(raw)
    return raw, p, "".join(p.text)


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_directives_or_markers(nb):
    _, _, text = _page(nb)
    for bad in ("#|", "NBVAL_", "nbval-"):
        assert bad not in text, f"{bad!r} is visible in the built page of {nb.name}"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_math_is_typeset_markup(nb):
    raw, page, text = _page(nb)
    assert "$$" not in text, f"raw $$ math in the built page of {nb.name}"
    source = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "markdown")
    if "$" in source:
        assert "math" in page.classes, f"{nb.name} has math but the page has no math elements"
        assert "mathjax" in raw.lower(), f"{nb.name} has math but the page does not load MathJax"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_colab_button_points_at_the_notebook(nb, settings):
    _, page, _ = _page(nb)
    repo = settings["git_url"].removeprefix("https://github.com/")
    want = f"https://colab.research.google.com/github/{repo}/blob/{settings['branch']}/nbs/{nb.name}"
    assert want in page.links, f"no Open-in-Colab link {want} on {nb.stem}.html"


def _show_doc_calls(nb: Path) -> list[str]:
    cells = [c for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]
    return ["".join(c["source"]) for c in cells if "".join(c["source"]).startswith("show_doc(")]


def _has_widget_state(nb: Path) -> bool:
    return bool(json.loads(nb.read_text())["metadata"].get("widgets"))


DOCUMENTED = [nb for nb in NOTEBOOKS if _show_doc_calls(nb)]

WITH_WIDGETS = [nb for nb in NOTEBOOKS if _has_widget_state(nb)]


def test_the_checks_below_have_pages_to_check():
    "The book uses show_doc and saved widgets somewhere, so the two tests below check something."
    assert DOCUMENTED, "no chapter calls show_doc: test_show_doc_renders would check nothing"
    assert WITH_WIDGETS, "no chapter saved widget state: test_widgets_are_embedded would check nothing"


@pytest.mark.parametrize("nb", DOCUMENTED, ids=lambda p: p.stem)
def test_show_doc_renders(nb):
    "show_doc cells appear as their rendered documentation, with the call itself hidden."
    raw, _, text = _page(nb)
    for c in _show_doc_calls(nb):
        name = c[len("show_doc("):].split(")")[0]
        assert f"show_doc({name})" not in text, f"the show_doc call for {name} is visible in {nb.stem}.html"
        assert f"def {name}(" in text, f"the documentation of {name} is missing from {nb.stem}.html"


@pytest.mark.parametrize("nb", WITH_WIDGETS, ids=lambda p: p.stem)
def test_widgets_are_embedded(nb):
    "A notebook that saved widget state gets it into the page, with the widget manager to draw it."
    raw, _, _ = _page(nb)
    assert "application/vnd.jupyter.widget-state+json" in raw
    assert "application/vnd.jupyter.widget-view+json" in raw
