"""Chapters 11 and 12: the figures and the decoding section's statements that must stay true."""

import re
import xml.etree.ElementTree as ET

from helpers import ROOT, cell_printed as _printed, cell_source as _text, notebook_cells as _cells

FIGURES = ROOT / "nbs" / "figures"


def _svg_text(name: str) -> str:
    root = ET.parse(FIGURES / name).getroot()
    words = " ".join(t.text or "" for t in root.iter() if t.tag.endswith("text"))
    return re.sub(r"\s+", " ", words + " " + (root.get("aria-label") or ""))


def test_left_padding_figure_says_the_cache_grows_per_step():
    words = _svg_text("12-left-padding.svg")
    assert "per row" not in words.split("cache grows")[-1][:40], words
    assert "per step" in words and "in every row" in words, words


def test_architecture_figure_draws_residual_paths_and_pre_norm():
    "Every sublayer has a norm in front and a residual addition (a circled plus)."
    root = ET.parse(FIGURES / "11-architecture.svg").getroot()
    circles = [e for e in root.iter() if e.tag.endswith("circle")]
    words = _svg_text("11-architecture.svg")
    sublayers = sum(words.count(s) for s in ("self-attention", "feed-forward",
                                            "cross-attention"))
    # GPT 2 + encoder 2 + decoder 3 sublayers, and the post-norm inset's one
    assert len(circles) == 2 + 2 + 3 + 1, len(circles)
    assert sublayers >= 7 and words.count("norm") >= 7 + 3, words
    assert "add & norm" not in words and "post-norm" in words, words


def test_decoding_table_holds_each_row_against_its_own_machine():
    "The bench's rows against the bench's bandwidth (llama.cpp: 48.9 GB/s / 98 MB ≈ 500)."
    cells = _cells("12_generation")
    table = next(c for c in cells if "BENCH_BANDWIDTH" in _text(c) and c["cell_type"] == "code")
    assert "two(bandwidth / b)" not in _text(table)  # this machine's bandwidth for every row
    rows = {line[:29].strip(): line[29:].split() for line in _printed(table).splitlines()}
    mb, rate, gbs, memory, share, arith = rows["SmolLM2, llama.cpp, Q4_1"]
    assert (mb, memory) == ("98", "500"), rows
    assert abs(float(gbs) - 98e6 * 72.4 / 1e9) < 0.1 and share == "15%", rows
    assert rows["SmolLM2, ours, compiled"][3:5] == ["91", "33%"], rows  # 29.7 of 90.9


def test_decoding_section_comes_before_compiling_and_names_both_ceilings():
    cells = _cells("12_generation")
    heads = [_text(c).split("\n")[0] for c in cells if c["cell_type"] == "markdown"]
    assert heads.index("## Why decoding is memory-bound") < heads.index("## Compiling the step")
    md = "\n".join(_text(c) for c in cells if c["cell_type"] == "markdown")
    assert "arithmetic" in md and "does not apply to a model that fits in cache" in md


def test_long_cache_exercise_stays_within_smollm2s_context():
    "SmolLM2-135M's context is 8,192 tokens: the exercise's long cache is that, not 100,000."
    cells = _cells("12_generation")
    md = "\n".join(_text(c) for c in cells if c["cell_type"] == "markdown")
    assert "100,000" not in md and "100{,}000" not in md
    assert "8,192 tokens, SmolLM2's whole context" in md
    assert 8192 * 46_080 == 377_487_360 and "$= 377$ MB" in md
