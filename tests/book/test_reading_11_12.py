"""Chapters 11 and 12: the figures, chapter 11's sketches (each shown before its folded class and
computing what it computes), and the decoding section's statements that must stay true."""

import json
import re
import xml.etree.ElementTree as ET

import pytest
import torch
from torch import nn

from minitransformer.layers import Decoder, Encoder, LayerConfig
from minitransformer.masks import causal_mask
from minitransformer.model import (
    Transformer, TransformerConfig, ViTConfig, VisionTransformer)
from minitransformer.positions import SinusoidalPositions

from helpers import (
    ROOT, cell_printed as _printed, cell_source as _text, defining_cell,
    notebook_cells as _cells)

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
    """The bench's rows against the bench's bandwidth, both read from the file the bench wrote
    (llama.cpp: its Q4_1 file's bytes over that bandwidth), never this machine's."""
    bench = json.loads((ROOT / "nbs" / "adapters" / "smollm2-bench.json").read_text())
    bandwidth, per_token = bench["read_bandwidth_gb_s"] * 1e9, bench["bytes_per_token"]
    cells = _cells("12_generation")
    table = next(c for c in cells if "BENCH_BANDWIDTH" in _text(c) and c["cell_type"] == "code")
    assert "two(bandwidth / b)" not in _text(table)  # this machine's bandwidth for every row
    rows = {line[:29].strip(): line[29:].split() for line in _printed(table).splitlines()}
    for name, b, rate in [
            ("SmolLM2, llama.cpp, Q4_1", per_token["gguf_file"], bench["llama_cpp"]["tokens_per_s"]),
            ("SmolLM2, ours, compiled", per_token["weights"] + per_token["static_cache"],
             bench["batch1_tokens_per_s"]["ours, compiled"])]:
        mb, _, _, memory, share, _ = rows[name]
        assert mb == f"{b / 1e6:.0f}", rows
        assert abs(float(memory) / (bandwidth / b) - 1) < 0.05, rows  # (two digits printed)
        assert share == f"{rate * b / bandwidth:.0%}", rows


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


# ------------------------------------------------------------- chapter 11's sketches

SKETCHES = [("GPTSketch", "GPT"), ("Seq2SeqSketch", "Transformer"),
            ("ViTSketch", "VisionTransformer")]


@pytest.mark.parametrize("sketch, exported", SKETCHES)
def test_each_model_is_shown_as_a_sketch_and_the_exported_class_is_folded(sketch, exported):
    """The sketch (not exported, 10 to 25 lines, no options) comes before the exported class,
    which is folded; a later cell builds the class, compares the two and prints
    `<sketch> and <class> ... True`."""
    cells = _cells("11_model")
    s, e = defining_cell(cells, sketch, False), defining_cell(cells, exported, True)
    assert s < e, f"{sketch} (cell {s}) must come before {exported} (cell {e})"
    assert "idea" in _text(cells[s - 1]).lower(), "the prose before the sketch names the idea"
    body = [ln for ln in _text(cells[s]).split("\n") if ln.strip()]
    assert 10 <= len(body) <= 25, f"{sketch} is {len(body)} lines: a sketch is 10 to 25"
    assert not re.search(r"\b(raise|cache|dtype|device|dropout)\b", _text(cells[s])), sketch
    assert {"hide-input", "hide-cell"} & set(cells[e]["metadata"].get("tags", [])), exported
    assert "folded cell below" in _text(cells[e - 1]) and exported in _text(cells[e - 1])
    lines = [ln for c in cells[e + 1:] if c["cell_type"] == "code"
             and re.search(rf"\b{exported}\(", _text(c))
             for ln in _printed(c).split("\n") if ln.startswith(f"{sketch} and {exported} ")]
    assert len(lines) == 1, f"one cell after {exported} compares it with {sketch}: {lines}"
    assert lines[0].endswith("True"), lines


def test_every_exported_class_of_the_chapter_is_folded():
    "What the page shows of the package is the sketches, the imports and `count_parameters`."
    for i, c in enumerate(_cells("11_model")):
        src = _text(c)
        if c["cell_type"] == "code" and re.search(r"^\s*#\|\s*export", src, re.M) \
                and re.search(r"^class [A-Z]", src, re.M):
            assert {"hide-input", "hide-cell"} & set(c["metadata"].get("tags", [])), i


def _sketch_class(name: str) -> type:
    "The sketch as the page shows it, defined on its own."
    cells = _cells("11_model")
    namespace = {"nn": nn, "torch": torch, "LayerConfig": LayerConfig, "Encoder": Encoder,
                 "Decoder": Decoder, "SinusoidalPositions": SinusoidalPositions,
                 "causal_mask": causal_mask}
    exec(_text(cells[defining_cell(cells, name, False)]), namespace)
    return namespace[name]


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_seq2seq_sketch_computes_what_transformer_computes(norm_first):
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=30, tgt_vocab_size=20, d_model=24, n_heads=3,
                            n_encoder_layers=2, n_decoder_layers=2, norm_first=norm_first)
    full = Transformer(cfg).eval()
    sketch = _sketch_class("Seq2SeqSketch")(V_src=30, V_tgt=20, C=24, n_layers=2, n_heads=3)
    if norm_first:  # the sketch is post-norm, as in 2017: give it the layers' choice
        sketch.encoder, sketch.decoder = Encoder(cfg.layer(), 2), Decoder(cfg.layer(), 2)
    sketch.load_state_dict({k.replace("embed.tok.", "embed."): v
                            for k, v in full.state_dict().items()})
    src = torch.tensor([[3, 4, 5, 6, 0, 0, 0], [7, 8, 9, 10, 11, 12, 13]])
    tgt = torch.tensor([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]])
    with torch.no_grad():
        torch.testing.assert_close(sketch.eval()(src, tgt), full(src, tgt), rtol=0, atol=1e-6)


@pytest.mark.parametrize("size, patch, channels", [(28, 7, 1), (12, 4, 3)])
def test_the_vit_sketch_computes_what_vision_transformer_computes(size, patch, channels):
    torch.manual_seed(0)
    cfg = ViTConfig(image_size=size, patch_size=patch, channels=channels, n_classes=5,
                    d_model=32, n_heads=4, n_layers=2)
    full = VisionTransformer(cfg).eval()
    nn.init.normal_(full.cls)  # not zero: the check then sees where [CLS] goes
    sketch = _sketch_class("ViTSketch")(image_size=size, P=patch, channels=channels, C=32,
                                        n_layers=2, n_heads=4, n_classes=5).eval()
    weights = full.state_dict()
    weights["pos"] = weights.pop("pos.weight")
    weights["patchify.weight"] = weights["patchify.weight"].flatten(1)
    sketch.load_state_dict(weights)
    images = torch.randn(3, channels, size, size)
    with torch.no_grad():
        torch.testing.assert_close(sketch(images), full(images), rtol=0, atol=1e-5)


def test_next_token_pairs_are_shown_where_the_logits_first_appear():
    "The targets printed in chapter 11 are the inputs shifted by one."
    cells = _cells("11_model")
    at = next(i for i, c in enumerate(cells) if "targets" in _printed(c))
    assert at < defining_cell(cells, "GPT", True), "before the exported GPT"
    rows = dict(ln.split(None, 1) for ln in _printed(cells[at]).splitlines()[:2])
    inputs, targets = (json.loads(rows[k]) for k in ("inputs", "targets"))
    assert inputs[1:] == targets[:-1] and len(inputs) == len(targets) >= 5, rows
