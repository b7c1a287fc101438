"""The chapters read like a book: each numbered chapter has its map, a diagram and exercises with folded
solutions; every figure has alt text; code and printed outputs fit the book's column; checks are called
checks; the shown code is the idea (guards folded, few references forward); the prose explains rather than
reports on tests."""

import re
import sys
import xml.etree.ElementTree as ET

import pytest
import yaml

from helpers import ROOT, cell_source as _src, chapter_notebooks, notebook_cells as _cells

sys.path.insert(0, str(ROOT / "scripts"))
import reading_path  # noqa: E402


COLUMN = 88  # characters of code that fit the book's column at a 1280-px window

NOTEBOOKS = chapter_notebooks()


def _numbered() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    part = next(p for p in toc["parts"] if p.get("numbered"))
    return [c["file"].removeprefix("nbs/") for c in part["chapters"]]


NUMBERED = _numbered()

IMAGE = re.compile(r"!\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(([^)\s]+)\)")  # alt may hold [brackets]


def _alt(cell) -> str | None:
    m = re.search(r"^\s*#\|\s*alt:\s*(.+)$", _src(cell), re.M)
    return m.group(1).strip() if m else None


def test_numbered_chapters_are_the_nineteen():
    assert len(NUMBERED) == 19 and NUMBERED[0] == "01_mixing", NUMBERED


@pytest.mark.parametrize("stem", NUMBERED)
def test_chapter_has_its_map_and_a_diagram(stem):
    n = int(stem[:2])
    md = "\n".join(_src(c) for c in _cells(stem) if c["cell_type"] == "markdown")
    images = IMAGE.findall(md)
    assert any(src == f"figures/map-{n:02d}.svg" for _, src in images), f"{stem} lacks its map"
    diagrams = [src for _, src in images if src.startswith("figures/") and "/map-" not in src]
    drawn = [c for c in _cells(stem) if (_alt(c) or "").lower().startswith("diagram")]
    assert diagrams or drawn, f"{stem} has no explanatory diagram besides the map"


@pytest.mark.parametrize("stem", NUMBERED)
def test_map_is_legible_in_the_column(stem):
    "The map is drawn at about the column's width (752 px at 1280), so 13-px labels stay >= 12 px."
    root = ET.parse(ROOT / "nbs" / "figures" / f"map-{int(stem[:2]):02d}.svg").getroot()
    width = float(root.get("viewBox").split()[2])
    sizes = {float(t.get("font-size")) for t in root.iter("{http://www.w3.org/2000/svg}text")}
    assert min(sizes) * min(1.0, 690 / width) >= 12, f"map of {stem}: {min(sizes)}-px labels in {width} px"


@pytest.mark.parametrize("stem", NUMBERED)
def test_chapter_ends_with_exercises_and_folded_solutions(stem):
    cells = _cells(stem)
    heads = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
             and re.search(r"^## Exercises\s*$", _src(c), re.M)]
    assert heads, f"{stem} has no '## Exercises' section"
    exercises = [i for i, c in enumerate(cells) if i > heads[0] and c["cell_type"] == "markdown"
                 and _src(c).lstrip().startswith("**Exercise")]
    assert 3 <= len(exercises) <= 7, f"{stem} has {len(exercises)} exercises (3 to 7 expected)"
    for i in exercises:
        nxt = cells[i + 1]
        folded = ("hide-cell" in nxt["metadata"].get("tags", []) if nxt["cell_type"] == "code"
                  else ":::{dropdown}" in _src(nxt) or "```{dropdown}" in _src(nxt))
        assert folded, f"{stem}: exercise {_src(cells[i])[:40]!r} is not followed by a folded solution"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_figure_has_alt_text(nb):
    for i, c in enumerate(_cells(nb)):
        if c["cell_type"] == "markdown":
            for alt, src in IMAGE.findall(_src(c)):
                assert len(alt.strip()) >= 10, f"{nb.stem} cell {i}: image {src} needs alt text"
        elif any("image/png" in o.get("data", {}) for o in c.get("outputs", [])):
            assert _alt(c) and len(_alt(c)) >= 10, f"{nb.stem} cell {i} draws a figure without `#| alt:`"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_code_fits_the_column(nb):
    long = [(i, line) for i, c in enumerate(_cells(nb)) if c["cell_type"] == "code"
            for line in _src(c).split("\n")
            if len(line) > COLUMN and not line.lstrip().startswith("#|")]  # directives: not shown
    assert not long, f"{nb.stem}: {len(long)} code lines over {COLUMN} characters, e.g. {long[:2]}"


WIDGET = "application/vnd.jupyter.widget-view+json"


def _printed(out) -> str | None:
    "The text a reader sees of one output, when it is shown as plain text."
    if out.get("output_type") == "stream":
        return "".join(out["text"])
    data = out.get("data", {})
    if WIDGET in data or {"text/html", "text/markdown", "image/png", "image/svg+xml"} & set(data):
        return None  # rendered, not printed: a widget, a table, show_doc's entry, a figure
    text = data.get("text/plain")
    return None if text is None else "".join(text)


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_printed_outputs_fit_the_column(nb):
    long = []
    for i, c in enumerate(_cells(nb)):
        if c["cell_type"] != "code" or {"remove-output", "remove-cell"} & set(c["metadata"].get("tags", [])):
            continue
        for out in c.get("outputs", []):
            text = _printed(out)
            long += [(i, line) for line in (text or "").split("\n") if len(line) > COLUMN]
    assert not long, f"{nb.stem}: {len(long)} printed lines over {COLUMN} characters, e.g. {long[:2]}"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_shown_code_tells_the_type_checker_nothing(nb):
    "What a reader sees has no `# type: ignore` and no `cast(`: the code says what it means."
    hidden = {"hide-cell", "hide-input", "remove-cell", "remove-input"}
    found = [i for i, c in enumerate(_cells(nb)) if c["cell_type"] == "code"
             and not hidden & set(c["metadata"].get("tags", []))
             and re.search(r"#\s*type:\s*ignore|\bcast\(", _src(c))]
    assert not found, f"{nb.stem}: shown cells {found} silence the type checker"


@pytest.mark.parametrize("stem", NUMBERED)
def test_shown_code_leaves_the_guards_folded(stem):
    "A chapter's shown exported code is the computation: its guards are folded `_check_...` calls."
    m = reading_path.measure(ROOT / "nbs" / f"{stem}.ipynb")
    assert m["raises"] == 0, (f"{stem} shows {m['raises']} raise statements in its exported code: "
                              "move the guard into a folded `_check_...` helper")


FORWARD_BUDGET = 3  # references to a later chapter per chapter: "chapter 12 adds ..."


@pytest.mark.parametrize("stem", NUMBERED[:12])
def test_chapters_lean_little_on_later_ones(stem):
    refs = reading_path.measure(ROOT / "nbs" / f"{stem}.ipynb")["forward"]
    assert len(refs) <= FORWARD_BUDGET, f"{stem} refers forward {len(refs)} times: {refs}"


REPORTS = [  # prose that reports on tests or on the package's history instead of explaining
    r"random cases", r"the package's tests", r"checked on (?:\d|models)", r"folded below\)",
    r"the checks are folded", r"make gpu-check", r"\bformat 1\b", r"reorganisation",
    r"this comparison was run for", r"not about the same",
]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_explains_rather_than_reports(nb):
    md = "\n".join(_src(c) for c in _cells(nb) if c["cell_type"] == "markdown")
    found = [m.group(0) for r in REPORTS for m in re.finditer(r, md, re.I)]
    assert not found, f"{nb.stem} reports on its checks instead of explaining: {found}"


PAGES = sorted((ROOT / "nbs").glob("*.md")) + [ROOT / "README.md"]  # the book's other pages


@pytest.mark.parametrize("nb", NOTEBOOKS + PAGES, ids=lambda p: p.name)
def test_checks_are_called_checks(nb):
    md = (nb.read_text(encoding="utf-8") if nb.suffix == ".md" else
          "\n".join(_src(c) for c in _cells(nb) if c["cell_type"] == "markdown"))
    found = re.findall(r"\b(?:proof|proofs|proves?|proven)\b", md, re.I)
    assert not found, f"{nb.stem} says {found}: a test on random inputs is a check, not a proof"
    assert not re.search(r"\bthe seed\b", md, re.I), f"{nb.stem} refers to its source outline"


def test_figures_exist_and_are_svg():
    referenced = set()
    for nb in NOTEBOOKS:
        md = "\n".join(_src(c) for c in _cells(nb) if c["cell_type"] == "markdown")
        referenced |= {src for _, src in IMAGE.findall(md) if src.startswith("figures/")}
    assert referenced, "no chapter shows a figure from nbs/figures/"
    for src in sorted(referenced):
        path = ROOT / "nbs" / src
        assert path.exists(), f"{src} is referenced but missing"
        if path.suffix == ".svg":
            root = ET.parse(path).getroot()
            assert root.tag.endswith("svg") and root.get("viewBox"), f"{src}: an <svg> with a viewBox"


def test_each_numbered_chapter_ends_its_summary_with_a_link_to_the_next():
    "The last line of 'What we have' links to the next chapter by its title (19: the closing page)."
    numbered = [nb for nb in NOTEBOOKS if nb.name[:2].isdigit() and 0 < int(nb.name[:2]) < 90]
    titles = [_src(_cells(nb)[0]).splitlines()[0].lstrip("# ").strip() for nb in numbered]
    targets = [(t, nb.name) for t, nb in zip(titles[1:], numbered[1:])]
    targets.append(("Where to go next", "closing.md"))
    closing = (ROOT / "nbs" / "closing.md").read_text(encoding="utf-8")
    assert closing.startswith("# Where to go next\n")
    for nb, (title, target) in zip(numbered, targets):
        cells = _cells(nb)
        start = max(i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                    and _src(c).lstrip().startswith("## What we have"))
        end = next((i for i in range(start + 1, len(cells))
                    if _src(cells[i]).lstrip().startswith("## ")), len(cells))
        last = _src(cells[end - 1]).rstrip().splitlines()[-1]
        assert last == f"Next: [{title}]({target}).", f"{nb.stem} ends with {last!r}"
