"""What each idea buys: the tables of chapters 1, 4, 5, 6, 7, 9 and 11 are cell for cell those
that bench/ideas.py writes from nbs/ideas.json, the JSON's verdicts follow from its own runs (each
rung at the learning rate its validation slice chose), each chapter says its rungs' verdicts in
the bench's one sentence per verdict (a "within noise" rung: what it can represent, and that the
budget did not find a gain — no mechanism), and the baseline every row is measured against is
the bigram counted from the training text."""
import importlib.util
import json
import re

import pytest

from helpers import ROOT, cell_source, notebook_cells

RESULT = json.loads((ROOT / "nbs" / "ideas.json").read_text())
SHOWN = {"01_mixing": [0, 1], "04_attention": [1, 2], "05_multihead": [2, 3],
         "06_feedforward": [3, 4], "07_positions": [1, 2], "09_layers": [4, 5, 6, 7],
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


def _own(stem: str) -> list[dict]:
    "The rungs whose idea chapter `stem` teaches (chapter 11: every rung above the bigram)."
    return [r for r in RESULT["rows"] if r["rung"] in SHOWN[stem] and r["rung"]
            and (stem == "11_model" or int(stem[:2]) in r["chapters"])]


def test_the_verdicts_follow_from_the_runs():
    ideas = _ideas()
    assert RESULT["rows"] == ideas.verdicts(RESULT)
    rungs, seeds = len(ideas.RUNGS), RESULT["seeds"]
    grid = rungs * len(ideas.GRID)  # seed 0 at every rate, the others at the chosen one
    assert len(RESULT["runs"]) == grid + rungs * (len(seeds) - 1) + 2
    long = [r for r in RESULT["runs"] if r["steps"] != RESULT["steps"]]
    assert sorted(r["rung"] for r in long) == [0, rungs - 1]
    assert all(r["steps"] == ideas.LONG * RESULT["steps"] for r in long)


def test_the_baseline_is_the_counted_bigram():
    ideas = _ideas()
    assert RESULT["references"] == ideas.count_references(ideas.load_data())
    bigram = RESULT["references"]["count bigram"]
    for row in RESULT["rows"]:
        assert row["vs_bigram"] == round(row["mean"] - bigram, 4)


@pytest.mark.parametrize("stem", SHOWN)
def test_each_table_is_the_benchs_rows(stem):
    text = _section(stem)
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert lines and lines[0].startswith(HEADER), f"{stem}: no table"
    assert "\n".join(lines) == _ideas().table_rows(RESULT, SHOWN[stem]), stem


@pytest.mark.parametrize("stem", SHOWN)
def test_the_prose_claims_only_the_gains_the_rule_grants(stem):
    prose = " ".join(ln for ln in _section(stem).splitlines() if ln[:1] not in "|#")
    prose = re.sub(r"\]\([^)]*\)", "]", prose)  # not the words of a link's target
    own = _own(stem)
    assert own, stem
    said = re.findall(r"\b(buys|costs|within noise)\b", prose)
    assert said == [r["verdict"] for r in own], (stem, said)


@pytest.mark.parametrize("stem", SHOWN)
def test_each_verdict_is_said_in_its_template(stem):
    prose = " ".join(ln for ln in _section(stem).splitlines() if ln[:1] not in "|#")
    for row in _own(stem):
        assert _ideas().verdict_sentence(row) in prose, (stem, row["rung"])
