"""What each idea buys: the tables of chapters 1, 4, 5, 6, 7, 9 and 11 are cell for cell those
that bench/ideas.py writes from nbs/ideas.json, the JSON's verdicts follow from its own runs, and
the prose claims a gain only where the rule grants it."""
import importlib.util
import json
import re

import pytest

from helpers import ROOT, cell_source, notebook_cells

RESULT = json.loads((ROOT / "nbs" / "ideas.json").read_text())
SHOWN = {"01_mixing": [0, 1], "04_attention": [1, 2], "05_multihead": [2, 3],
         "06_feedforward": [3, 4], "07_positions": [4, 5], "09_layers": [5, 6, 7],
         "11_model": list(range(8))}
HEADER = "| rung | held-out loss"


def _ideas():
    spec = importlib.util.spec_from_file_location("ideas", ROOT / "bench" / "ideas.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _section(stem: str) -> str:
    cells = [cell_source(c) for c in notebook_cells(stem) if c["cell_type"] == "markdown"]
    found = [c for c in cells if c.startswith("## What this idea buys")]
    assert len(found) == 1, f"{stem}: one 'What this idea buys' section"
    return found[0]


def test_the_verdicts_follow_from_the_runs():
    rows = _ideas().verdicts(RESULT["runs"], RESULT["seeds"])
    for got, want in zip(RESULT["rows"], rows):
        assert {k: v for k, v in got.items() if k != "steps_per_second"} == {
            k: v for k, v in want.items() if k != "steps_per_second"}
    assert len(RESULT["runs"]) == len(RESULT["seeds"]) * len(rows) == 3 * 8


@pytest.mark.parametrize("stem", SHOWN)
def test_each_table_is_the_benchs_rows(stem):
    text = _section(stem)
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert lines and lines[0].startswith(HEADER), f"{stem}: no table"
    assert "\n".join(lines) == _ideas().table_rows(RESULT, SHOWN[stem]), stem


@pytest.mark.parametrize("stem", SHOWN)
def test_the_prose_claims_only_the_gains_the_rule_grants(stem):
    prose = " ".join(ln for ln in _section(stem).splitlines() if ln[:1] not in "|#")
    rows = {r["rung"]: r for r in RESULT["rows"]}
    own = [r for r in SHOWN[stem] if r and (stem == "11_model"
                                          or rows[r]["chapter"] == int(stem[:2]))]
    assert own, stem
    said = re.findall(r"\b(buys|costs|within noise)\b", prose)
    assert said == [rows[r]["verdict"] for r in own], (stem, said)
