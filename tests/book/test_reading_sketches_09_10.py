"""Chapters 9 and 10 (layers, KV cache): each shows the idea as a plain sketch (a class named
`...Sketch`, not exported) before the exported class, whose options belong to other chapters;
a later cell checks the two agree and prints it, and the exported class is folded."""

import re
import sys

import pytest
import torch
from torch import nn

from minitransformer.feedforward import FeedForward
from minitransformer.kv_cache import KVCache
from minitransformer.layers import DecoderLayer, LayerConfig
from minitransformer.masks import causal_mask, padding_mask
from minitransformer.multihead import MultiHeadAttention

from helpers import (
    cell_printed as _printed,
    cell_source as _src,
    defining_cell as _defining,
    notebook_cells as _cells,
)

from helpers import ROOT

EXPORT = re.compile(r"^\s*#\|\s*export", re.M)


def _sketch_comes_first(stem: str, sketch: str, exported: str, adds: tuple,
                        options: str) -> list[str]:
    "Check the sketch's place, size and fold; return the lines its check prints."
    cells = _cells(stem)
    s, e = _defining(cells, sketch, exported=False), _defining(cells, exported, exported=True)
    assert s < e, f"{stem}: {sketch} (cell {s}) must come before {exported} (cell {e})"
    before = _src(cells[s - 1])
    assert cells[s - 1]["cell_type"] == "markdown" and "The idea, with nothing else" in before
    src = _src(cells[s])
    body = [ln for ln in src.split("\n") if ln.strip()]
    assert 10 <= len(body) <= 25, f"{sketch} is {len(body)} lines: a sketch is 10 to 25"
    assert not re.search(rf"\b(raise|dtype|device|{options})\b", src), "no options"
    assert "hide-cell" in cells[e].get("metadata", {}).get("tags", []), f"{exported} folded"
    prose = next(_src(c) for c in reversed(cells[s:e]) if c["cell_type"] == "markdown")
    assert "folded cell below" in prose and exported in prose, prose
    for option in adds:  # what the exported class adds, and where it is taught
        assert option in prose, option
    checks = [c for c in cells[e + 1:] if c["cell_type"] == "code"
              and re.search(rf"\b{sketch}\(", _src(c)) and re.search(rf"\b{exported}\b", _src(c))]
    assert checks, f"{stem}: no cell after {exported} compares it with {sketch}"
    lines = [ln for ln in _printed(checks[0]).split("\n") if sketch in ln]
    assert lines and all(exported in ln and ln.endswith("True") for ln in lines), lines
    return lines


def _run_sketch(stem: str, name: str, namespace: dict) -> type:
    "The sketch as the page shows it, defined on its own."
    cells = _cells(stem)
    exec(_src(cells[_defining(cells, name, False)]), namespace)
    return namespace[name]


def test_layers_chapter_sketches_a_decoder_layer_before_the_exported_one():
    lines = _sketch_comes_first("09_layers", "DecoderLayerSketch", "DecoderLayer",
                                ("`self_cache`", "`cross_cache`", "chapter 10", "post-norm"),
                                "cache|rotary|positions|dropout|norm_first")
    assert len(lines) == 2, lines  # with cross-attention and without


@pytest.mark.parametrize("cross", [True, False])
def test_the_decoder_layer_sketch_computes_what_decoder_layer_computes(cross):
    ns = {"nn": nn, "torch": torch, "MultiHeadAttention": MultiHeadAttention,
          "FeedForward": FeedForward}
    sketch_cls = _run_sketch("09_layers", "DecoderLayerSketch", ns)
    torch.manual_seed(0)
    cfg = LayerConfig(d_model=24, n_heads=3, d_ff=40, norm_first=True)
    layer = DecoderLayer(cfg, cross_attention=cross).eval()
    sketch = sketch_cls(24, 3, 40, cross_attention=cross).eval()
    sketch.load_state_dict(layer.state_dict())  # strict: the names are the layer's
    x, memory = torch.randn(2, 6, 24), torch.randn(2, 4, 24)
    pad = padding_mask(torch.tensor([4, 2]))
    args = (x, memory) if cross else (x,)
    kw = dict(mask=causal_mask(6), memory_mask=pad if cross else None)
    with torch.no_grad():
        torch.testing.assert_close(sketch(*args, **kw), layer(*args, **kw),
                                   rtol=0, atol=1e-6)


def test_kv_cache_chapter_sketches_a_growing_cache_before_the_exported_one():
    lines = _sketch_comes_first("10_kv_cache", "KVCacheSketch", "KVCache",
                                ("preallocates", "`static`", "chapter 12"),
                                "static|max_len|truncate|reset")
    assert len(lines) == 2, lines  # keys and values, then outputs


def test_the_kv_cache_sketch_holds_what_kv_cache_holds_and_attends_like_it():
    sketch = _run_sketch("10_kv_cache", "KVCacheSketch", {"torch": torch})()
    cache = KVCache(batch_size=2, n_kv_heads=3, max_len=8, head_dim=4)
    g = torch.Generator().manual_seed(0)
    for T in (3, 1, 1, 2):  # a prompt, then new tokens
        k, v = torch.randn(2, 3, T, 4, generator=g), torch.randn(2, 3, T, 4, generator=g)
        for got, want in zip(sketch.update(k, v), cache.update(k, v)):
            assert torch.equal(got, want)
    q, k, v = (torch.randn(2, 3, 1, 4, generator=g) for _ in range(3))
    out = sketch.attend(q, k, v)
    K, V = cache.update(k, v)
    want = torch.softmax(q @ K.transpose(-2, -1) / 2, -1) @ V  # D = 4: scale 1/2
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    assert sketch.k.shape == (2, 3, 8, 4) == K.shape


@pytest.mark.parametrize("stem", ["09_layers", "10_kv_cache"])
def test_the_pages_stay_within_their_forward_references(stem):
    sys.path.insert(0, str(ROOT / "scripts"))
    import reading_path
    m = reading_path.measure(ROOT / "nbs" / f"{stem}.ipynb")
    assert m["sketch"] is not None and len(m["forward"]) <= 3, m


@pytest.mark.parametrize("start", ["cfg = LayerConfig(d_model=16, n_heads=4, d_ff=64)",
                                   "cfg = LayerConfig(d_model=16, n_heads=4, d_ff=40)\n",
                                   "cfg = LayerConfig(d_model=16, n_heads=4, d_ff=40, "
                                   "norm_first=True)\n"])
def test_the_layers_demo_cells_end_in_a_printed_result(start):
    cells = [c for c in _cells("09_layers") if c["cell_type"] == "code"
             and _src(c).startswith(start)
             and "hide-cell" not in c["metadata"].get("tags", [])]  # not a solution
    assert len(cells) == 1, start
    assert _printed(cells[0]).strip(), f"the cell starting {start!r} prints nothing"


def test_layers_chapter_sketches_an_encoder_stack_before_the_exported_one():
    lines = _sketch_comes_first("09_layers", "EncoderSketch", "Encoder",
                                ("`LayerConfig`", "rotary", "post-norm"),
                                "cache|rotary|positions|dropout|norm_first")
    assert len(lines) == 1, lines
    cells = _cells("09_layers")
    config = cells[_defining(cells, "LayerConfig", exported=True)]
    assert "hide-cell" in config["metadata"].get("tags", []), "LayerConfig is folded"


def test_the_encoder_sketch_computes_what_encoder_computes():
    ns = {"nn": nn, "torch": torch, "MultiHeadAttention": MultiHeadAttention,
          "FeedForward": FeedForward}
    sketch_cls = _run_sketch("09_layers", "EncoderSketch", ns)
    from minitransformer.layers import Encoder
    torch.manual_seed(0)
    cfg = LayerConfig(d_model=24, n_heads=3, d_ff=40, norm_first=True)
    stack = Encoder(cfg, 2).eval()
    sketch = sketch_cls(24, 3, 40, n_layers=2).eval()
    sketch.load_state_dict(stack.state_dict())  # strict: the names are the stack's
    x, pad = torch.randn(2, 6, 24), padding_mask(torch.tensor([6, 3]))
    with torch.no_grad():
        torch.testing.assert_close(sketch(x, mask=pad), stack(x, mask=pad),
                                   rtol=0, atol=1e-6)
