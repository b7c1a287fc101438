import json
import re
from configparser import ConfigParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def settings():
    "The [DEFAULT] section of settings.ini."
    cfg = ConfigParser(delimiters=["="])
    cfg.read(ROOT / "settings.ini", encoding="utf-8")
    return cfg["DEFAULT"]


def chapter_notebooks() -> list[Path]:
    "Every notebook in nbs/, in book order."
    return sorted(p for p in (ROOT / "nbs").glob("*.ipynb"))



def notebook_cells(stem_or_path) -> list[dict]:
    "The cells of `nbs/<stem>.ipynb` (or of the notebook at a path), as JSON."
    path = stem_or_path if hasattr(stem_or_path, "read_text") else ROOT / "nbs" / f"{stem_or_path}.ipynb"
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def cell_source(cell: dict) -> str:
    return "".join(cell["source"])


def cell_printed(cell: dict) -> str:
    "What a code cell printed (its stream outputs)."
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []) if o["output_type"] == "stream")


def defining_cell(cells: list[dict], name: str, exported: bool) -> int:
    "The index of the one code cell, exported (`#| export`) or not, that defines `name`."
    hits = [i for i, c in enumerate(cells) if c["cell_type"] == "code"
            and re.search(rf"^(?:def|class) {name}\b", cell_source(c), re.M)
            and bool(re.search(r"^\s*#\|\s*export", cell_source(c), re.M)) == exported]
    assert len(hits) == 1, f"{name}: {len(hits)} cells define it (exported={exported})"
    return hits[0]
