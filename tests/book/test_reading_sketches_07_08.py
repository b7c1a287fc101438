"""Chapters 7 and 8 (positions, masks): each shows the idea as a plain sketch (a function named
`..._sketch`, not exported) before the exported version with its options, checks the two agree
with a printed result, and folds the exported cell whose options belong to later chapters."""

import re

import pytest
import torch

from minitransformer.masks import causal_mask, decoder_mask
from minitransformer.positions import RotaryEmbedding, sinusoidal_positions

from helpers import (
    cell_printed as _printed,
    cell_source as _src,
    defining_cell as _defining,
    notebook_cells as _cells,
)

from helpers import ROOT

EXPORT = re.compile(r"^\s*#\|\s*export", re.M)


def _sketch_comes_first(stem: str, sketch: str, exported: str, folded: bool) -> None:
    cells = _cells(stem)
    s, e = _defining(cells, sketch, exported=False), _defining(cells, exported, exported=True)
    assert s < e, f"{stem}: {sketch} (cell {s}) must come before {exported} (cell {e})"
    before = cells[s - 1]
    assert before["cell_type"] == "markdown" and "The idea, with nothing else" in _src(before)
    body = [ln for ln in _src(cells[s]).split("\n") if ln.strip()]
    assert len(body) <= 25, f"{sketch} is {len(body)} lines: a sketch is short"
    tags = cells[e].get("metadata", {}).get("tags", [])
    assert ("hide-cell" in tags) == folded, f"{exported}: tags {tags}"
    if folded:  # the prose before the folded cell says what it adds
        assert "folded cell below" in _src(cells[e - 1]) and exported in _src(cells[e - 1])
    checks = [c for c in cells[e + 1:] if c["cell_type"] == "code"
              and re.search(rf"\b{sketch}\(", _src(c)) and re.search(rf"\b{exported}\(", _src(c))]
    assert checks, f"{stem}: no cell after {exported} compares it with {sketch}"
    line = next(ln for ln in _printed(checks[0]).split("\n") if sketch in ln)
    assert exported in line and line.endswith("True"), line


def _run_sketch(stem: str, name: str) -> dict:
    "The namespace of the cell that defines the sketch `name`, run on its own."
    cells = _cells(stem)
    namespace = {"torch": torch}
    if name == "decoder_mask_sketch":  # it builds on the causal sketch
        exec(_src(cells[_defining(cells, "causal_mask_sketch", False)]), namespace)
    src = _src(cells[_defining(cells, name, False)])
    exec(src.split("\nprint(")[0], namespace)  # the definition, not the cell's demo
    return namespace


def test_positions_chapter_sketches_its_tables_and_rotary_before_the_exported_ones():
    _sketch_comes_first("07_positions", "sinusoidal_sketch", "sinusoidal_positions", True)
    _sketch_comes_first("07_positions", "rope_sketch", "RotaryEmbedding", True)
    sinusoidal = _run_sketch("07_positions", "sinusoidal_sketch")["sinusoidal_sketch"]
    for T, C in [(1, 2), (9, 6), (100, 64)]:
        torch.testing.assert_close(sinusoidal(T, C), sinusoidal_positions(T, C),
                                   rtol=0, atol=1e-5)
    rope = _run_sketch("07_positions", "rope_sketch")["rope_sketch"]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 10, generator=g)  # (B, H, T, D)
    positions = torch.arange(7) + 5  # not starting at 0
    ours = RotaryEmbedding(10, max_len=64, interleaved=True)
    torch.testing.assert_close(rope(x, positions), ours(x, positions), rtol=0, atol=1e-5)


def test_masks_chapter_sketches_causal_and_decoder_masks_before_the_exported_ones():
    _sketch_comes_first("08_masks", "causal_mask_sketch", "causal_mask", False)
    _sketch_comes_first("08_masks", "decoder_mask_sketch", "decoder_mask", True)
    sketches = _run_sketch("08_masks", "decoder_mask_sketch")
    for T in range(1, 8):
        assert torch.equal(sketches["causal_mask_sketch"](T), causal_mask(T))
    real = torch.tensor([[True, True, False, False], [True] * 4, [True, False, False, False]])
    assert torch.equal(sketches["decoder_mask_sketch"](real),
                       decoder_mask(3, 4, past=0, attention_mask=real))


@pytest.mark.parametrize("stem", ["07_positions", "08_masks"])
def test_the_sketch_comes_before_the_first_exported_definition(stem):
    import sys
    sys.path.insert(0, str(ROOT / "scripts"))
    import reading_path
    m = reading_path.measure(ROOT / "nbs" / f"{stem}.ipynb")
    assert m["sketch"] is not None and m["sketch_first"], m
