"""What the layers (chapter 9) and the KV cache (chapter 10) refuse, and their messages:
the edge cases the chapters leave out of the reader's path; and what the two pages show
(the collapse experiment run once, numbers quoted as printed, curves within their context)."""
import ast
import re

import pytest
import torch

from minitransformer.kv_cache import DecoderCache, KVCache, check_encoder_output
from minitransformer.layers import (Decoder, DecoderLayer, EncoderLayer, LayerConfig,
                                    make_norm)
from minitransformer.masks import causal_mask, padding_mask
from conftest import ROOT
from conftest import notebook_cells as _cells, cell_source as _src, cell_printed as _printed


def raises(exc, text):
    return pytest.raises(exc, match=re.escape(text))


def test_make_norm_and_layer_config_refuse_what_they_cannot_build():
    with raises(ValueError,
                "kind must be one of ('layernorm', 'rmsnorm'), got 'batchnorm'"):
        make_norm("batchnorm", 12, 1e-5)
    with raises(ValueError, "d_model (30) must be divisible by n_heads (4)"):
        LayerConfig(d_model=30, n_heads=4)
    with raises(ValueError, "norm must be one of"):
        LayerConfig(norm="batchnorm")
    with raises(ValueError, "activation must be one of"):
        LayerConfig(activation="tanh")
    with raises(ValueError, "d_ff must be a positive int, got 0"):
        LayerConfig(d_ff=0)
    with raises(ValueError, "norm_eps must be a finite number > 0"):
        LayerConfig(norm_eps=0.0)
    with raises(TypeError, "cfg must be a LayerConfig, got dict"):
        EncoderLayer({"d_model": 16})


def test_layers_refuse_missing_or_unwanted_memory_and_wrong_widths():
    cfg = LayerConfig(d_model=16, n_heads=4, d_ff=40)
    enc, dec = EncoderLayer(cfg), DecoderLayer(cfg)
    gpt_block = DecoderLayer(cfg, cross_attention=False)
    tgt, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    with raises(ValueError, "needs the encoder output `memory` or a cross_cache"):
        dec(tgt)
    with raises(ValueError, "built with cross_attention=False"):
        gpt_block(tgt, memory)
    with raises(ValueError, "x has width 12 (shape (2, 7, 12))"):
        enc(torch.randn(2, 7, 12))
    with raises(ValueError, "x must hold at least one token"):
        enc(torch.randn(2, 0, 16))
    with raises(ValueError, "must have the batch size of x"):
        dec(tgt, torch.randn(3, 7, 16))
    with raises(ValueError, "memory_mask of shape"):
        dec(tgt, memory, memory_mask=padding_mask(torch.tensor([5, 4]), 5))


def test_stacks_refuse_positions_without_rotary_and_foreign_caches():
    cfg = LayerConfig(d_model=16, n_heads=4, d_ff=40, norm_first=True)
    stack = Decoder(cfg, 2, cross_attention=False)
    x = torch.randn(2, 3, 16)
    with raises(ValueError, "positions were given, but this stack has no rotary"):
        stack(x, positions=torch.arange(3))
    with raises(TypeError, "cache must be a DecoderCache (model.make_cache), got dict"):
        stack(x, cache={})


def test_a_failing_decoder_call_leaves_the_cache_length_as_it_was():
    cfg = LayerConfig(d_model=16, n_heads=4, d_ff=40, norm_first=True)
    stack = Decoder(cfg, 2, cross_attention=False).eval()
    cache = DecoderCache.for_decoder(stack, 1, 4)
    with torch.no_grad():
        stack(torch.randn(1, 3, 16), mask=causal_mask(3), cache=cache)
        assert len(cache) == 3
        with raises(ValueError,
                    "KV cache overflow: 3 positions cached + 2 new > max_len 4"):
            stack(torch.randn(1, 2, 16), mask=causal_mask(2, 5), cache=cache)
    assert len(cache) == 3


def test_kv_cache_refuses_overflow_wrong_shapes_and_shared_length():
    cache = KVCache(batch_size=2, n_kv_heads=3, max_len=6, head_dim=5)
    k, v = torch.randn(2, 3, 5, 5), torch.randn(2, 3, 5, 5)
    cache.update(k, v)
    with raises(ValueError,
                "KV cache overflow: 5 positions cached + 2 new > max_len 6"):
        cache.update(k[:, :, :2], v[:, :, :2])
    with raises(ValueError, "does not fit a cache"):
        cache.update(torch.randn(2, 4, 1, 5), torch.randn(2, 4, 1, 5))
    with raises(ValueError, "length must be in [0, 5], got 6"):
        cache.truncate(6)
    cache.reset()
    assert len(cache) == 0
    stack = DecoderCache.allocate(n_layers=1, batch_size=2, n_kv_heads=3, max_len=6,
                                  head_dim=5)
    part = stack.self_attn[0]
    keys, _ = part.update(k[:, :, :1], v[:, :, :1])  # at the stack's position ...
    assert keys.shape[2] == 1 and len(stack) == 0  # ... which only the Decoder moves
    with raises(ValueError, "shares the length of a DecoderCache: reset that instead"):
        part.reset()


def test_decoder_cache_refuses_what_it_cannot_serve():
    cross_stack = Decoder(LayerConfig(d_model=48, n_heads=4), 2).eval()
    memory = torch.randn(2, 9, 48)
    memory_mask = (torch.arange(9) < torch.tensor([[9], [5]]))[:, None, None, :]
    cache = DecoderCache.for_decoder(cross_stack, 2, 8, source_len=9)
    x1 = torch.randn(2, 1, 48)
    with raises(ValueError, "is empty"):
        cross_stack(x1, memory_mask=memory_mask, cache=cache)
    cache.fill_cross_attention(cross_stack, memory)
    with raises(ValueError, "pass memory=None"):
        cross_stack(x1, memory, memory_mask=memory_mask, cache=cache)
    with raises(ValueError, "already filled"):
        cache.fill_cross_attention(cross_stack, memory)
    with raises(ValueError, "needs source_len"):
        DecoderCache.for_decoder(cross_stack, 2, 8)
    with raises(TypeError, "decoder must be a Decoder, got str"):
        DecoderCache.for_decoder("stack", 2, 8)
    with raises(ValueError, "memory must be the encoder output (B, S, C) = (B, S, 48)"):
        check_encoder_output(memory[:, :, :40], 48)
    one = KVCache(1, 4, 8, 12)
    with raises(ValueError, "each KVCache can serve one layer of one DecoderCache"):
        DecoderCache([one, one])
    with raises(TypeError, "self_attn must be a non-empty list of KVCache"):
        DecoderCache([])


def test_chapter_9_runs_the_collapse_experiment_once_with_its_gradients():
    "One run compares the stacks with and without residuals, and one figure draws it."
    code = [c for c in _cells("09_layers") if c["cell_type"] == "code"]
    runs = [c for c in code if "NoResidualEncoderLayer(EncoderLayer)" in _src(c)
            or "attn(X) if residual else attn(X)" in _src(c)]
    figures = [c for c in code if "similarity" in _src(c)
               and any("image/png" in o.get("data", {}) for o in c.get("outputs", []))]
    assert len(runs) == 1 and len(figures) == 1, (len(runs), len(figures))
    assert "gradient norm at each layer's input" in _src(figures[0])
    printed = _printed(runs[0])
    for row in ("similarity", "spread", "no residual", "gradient norm at layer 1's input"):
        assert row in printed, printed


def test_chapter_9_quotes_the_collapse_numbers_it_prints():
    "Every decimal the discussion of the run quotes is one the run prints."
    cells = _cells("09_layers")
    run = next(c for c in cells if "NoResidualEncoderLayer(EncoderLayer)" in _src(c))
    printed = _printed(run)
    md = next(_src(c) for c in cells if c["cell_type"] == "markdown"
              and _src(c).startswith("What the table and the three panels show"))
    quoted = re.findall(r"(?<![\d.])\d+\.\d+", re.sub(r"\$[^$]*\$", "", md))
    assert len(quoted) >= 6, quoted
    missing = [q for q in quoted if not re.search(rf"(?<![\d.]){re.escape(q)}\b", printed)]
    assert not missing, f"quoted but not printed: {missing}\n{printed}"
    grads = re.search(r"post-norm (\d+), pre-norm (\d+), no residual (\d+)", printed)
    assert grads and f"({grads[3]}, against {grads[1]} and {grads[2]})" in md, md


class _Axes:
    "Records what is plotted; ignores everything else."
    def __init__(self):
        self.lines = {}

    def plot(self, x, y, label=None, **kwargs):
        self.lines[label] = [int(t) for t in x]

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _Pyplot:
    def __init__(self):
        self.ax = _Axes()

    def subplots(self, *args, **kwargs):
        return None, self.ax

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def test_kv_cache_plot_stops_gpt2_at_its_context():
    "GPT-2 has 1,024 positions: its cache curves end there; the others run to 4,096."
    cells = [c for c in _cells("10_kv_cache") if c["cell_type"] == "code"]
    defs = ast.parse(next(_src(c) for c in cells if "def kv_bytes(" in _src(c)))
    kv_bytes = ast.Module([n for n in defs.body if isinstance(n, ast.FunctionDef)
                           and n.name == "kv_bytes"], type_ignores=[])
    plot = next(_src(c) for c in cells if "#| alt: KV-cache GiB" in _src(c))
    space = {"torch": torch, "plt": _Pyplot(), "test_eq": lambda a, b: None}
    exec(compile(kv_bytes, "kv_bytes", "exec"), space)
    exec(plot, space)
    lines = space["plt"].ax.lines
    gpt2 = {name: x for name, x in lines.items() if name.startswith("GPT-2")}
    assert len(gpt2) == 2 and all(max(x) == 1024 for x in gpt2.values()), gpt2
    assert all(max(x) == 4096 for name, x in lines.items() if name not in gpt2), lines
    assert "1,024" in plot.splitlines()[0], "the alt text names GPT-2's limit"
