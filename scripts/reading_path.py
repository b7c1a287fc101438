"""What a reader meets on each chapter's page: the code lines shown (not folded, not hidden), the
exported lines among them, the `raise` statements among those (guards belong in folded cells), and
references forward to later chapters ("chapter 12 adds ...") in the prose and the shown comments,
whether a sketch (a plain class or function named `...Sketch`/`..._sketch`, not exported) comes before
the chapter's first exported class or function, and the source lines of all cells, markdown included.

    python scripts/reading_path.py          # a table, one row per notebook
tests/book/test_chapters.py holds the chapters to it."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDED = {"hide-cell", "hide-input", "remove-cell", "remove-input"}
NOT_SHOWN = re.compile(r"\s*#\|\s*(hide|default_exp|include: false|echo: false)\b")
FORWARD = re.compile(r"\b[Cc]hapters?\s+(\d+)((?:\s*(?:,|and|or|–|-)\s*\d+)*)")
RAISE = re.compile(r"\braise (TypeError|ValueError)\b")
SKETCH = re.compile(r"^(?:class \w*Sketch\b|def \w*_sketch\b)", re.M)
DEFINES = re.compile(r"^(?:class|def) [A-Za-z]\w*", re.M)  # a public class or function


def shown_lines(cell: dict) -> list[str]:
    "The code lines of `cell` that the book shows unfolded."
    src = "".join(cell["source"])
    if cell["cell_type"] != "code" or FOLDED & set(cell.get("metadata", {}).get("tags", [])):
        return []
    lines = src.split("\n")
    if any(NOT_SHOWN.match(line) for line in lines) or '"google.colab" in sys.modules' in src:
        return []
    body = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#|")]
    if body and all(re.match(r"^\s*show_doc\(.*\)\s*;?\s*$", ln) for ln in body):
        return []
    return body


def forward_refs(text: str, n: int) -> list[str]:
    "Mentions in `text` of a chapter after chapter `n`."
    found = []
    for m in FORWARD.finditer(text):
        nums = [int(m.group(1))] + [int(x) for x in re.findall(r"\d+", m.group(2) or "")]
        if any(k > n for k in nums):
            found.append(m.group(0))
    return found


def measure(path: Path) -> dict:
    n = int(path.name[:2])
    shown = exported = raises = lines = 0
    refs: list[str] = []
    sketch = first_export = None  # cell indices
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        src = "".join(cell["source"])
        lines += len(src.split("\n"))
        is_export = cell["cell_type"] == "code" and re.search(r"^\s*#\|\s*export", src, re.M)
        if is_export and first_export is None and DEFINES.search(src):
            first_export = i
        if cell["cell_type"] == "code" and not is_export and sketch is None and SKETCH.search(src):
            sketch = i
        if cell["cell_type"] == "markdown":
            refs += forward_refs("".join(cell["source"]), n)
            continue
        body = shown_lines(cell)
        shown += len(body)
        if re.search(r"^\s*#\|\s*export", "".join(cell["source"]), re.M):
            exported += len(body)
            raises += sum(bool(RAISE.search(ln)) for ln in body)
        refs += forward_refs("\n".join(ln.split("#", 1)[1] for ln in body if "#" in ln), n)
    before = sketch is not None and (first_export is None or sketch < first_export)
    return {"shown": shown, "exported": exported, "raises": raises, "forward": refs,
            "lines": lines, "sketch": sketch, "sketch_first": before}


def main() -> None:
    print(f"{'notebook':18} {'shown':>6} {'exported':>9} {'raise':>6} {'forward refs':>13}"
          f" {'sketch':>13} {'source lines':>13}")
    for path in sorted((ROOT / "nbs").glob("[0-9][0-9]_*.ipynb")):
        m = measure(path)
        fw = len(m["forward"]) if int(path.name[:2]) < 90 else "-"
        sketch = ("-" if m["sketch"] is None else
                  f"cell {m['sketch']}" + ("" if m["sketch_first"] else " (late)"))
        print(f"{path.stem:18} {m['shown']:6} {m['exported']:9} {m['raises']:6} {fw:>13}"
              f" {sketch:>13} {m['lines']:13}")


if __name__ == "__main__":
    sys.exit(main())
