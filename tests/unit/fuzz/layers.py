"""Fuzz cases of `minitransformer.layers`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import dataclasses
import math

import torch
from hypothesis import strategies as st
from torch import nn

from ._common import (
    BAD,
    EDGE,
    MODULE_X_MUTS,
    MUTATIONS,
    POS_INT_BAD,
    Probe,
    VALID,
    _config_case,
    _layer_cfg,
    _layer_fields,
    _mod,
    _rotary,
    _seed,
    case,
    expect_tensor,
    floats,
    fmt,
    inf,
    nan,
    ok,
    pos_int,
)


# ================================================================== layers
@case("layers.NORMS", examples=1)
def _(data):
    layers = _mod("layers")
    assert isinstance(layers.NORMS, tuple) and layers.NORMS
    for kind in layers.NORMS:
        m = layers.make_norm(kind, 4, 1e-5)
        expect_tensor(m(torch.randn(2, 4)), (2, 4), torch.float32)
        layers.LayerConfig(d_model=4, n_heads=1, norm=kind)


def _norm_case(data, kind=None):
    layers = _mod("layers")
    names = ["d_model", "eps", "dtype"] + (["kind"] if kind is None else [])  # x trusted
    p = Probe(data, names)
    k = kind or p.value("kind", st.sampled_from(layers.NORMS),
                        ("batchnorm", None, "LayerNorm", 1), names=["kind", "norm"])
    C = p.value("d_model", st.integers(1, 8), POS_INT_BAD)
    eps = p.value("eps", st.sampled_from([1e-5, 1e-6, 0.1]),
                  (0.0, -1e-5, -1.0, nan, inf, "1e-5", None))
    dtype = p.value("dtype", st.sampled_from([None, torch.float32]),
                    (torch.int64, "float32", torch.bool))
    bias = p.draw(st.booleans(), label="bias")
    cc = C if pos_int(C) == VALID else 4
    shape = p.draw(st.lists(st.integers(1, 3), max_size=2).map(tuple), label="lead")
    x = floats(p, (*shape, cc))
    # make_norm('layernorm') returns torch's own nn.LayerNorm: what its forward does with a
    # bad input is torch's business, so only our RMSNorm's forward gets corrupted inputs
    if k == "rmsnorm":
        x = p.tensor("x", x, {
            **MODULE_X_MUTS,
            "narrower": (BAD, lambda t: t[..., :-1] if t.shape[-1] > 1 else torch.cat([t, t], -1)),
            "scalar": BAD, "b0": EDGE, "nan": EDGE,
            # RMSNorm normalizes in float32 and returns x's dtype: any floating x is fine
            "bfloat16": VALID, "double": VALID, "half": VALID,
            # (*lead, C) flattened is (n * C,): still a valid (..., C) input when n == 1
            "flat": BAD if math.prod(shape) != 1 else VALID},
            names=["x", "d_model"])

    def go():
        if kind is None:
            m = p.call("make_norm", layers.make_norm, k, C, eps, bias, dtype=dtype)
        else:
            m = p.call("RMSNorm", layers.RMSNorm, C, eps, dtype=dtype)
        return p.call("forward", m, x), repr(m)
    out = p.run(go)
    if ok(out):
        y = out[0]
        expect_tensor(y, x.shape, x.dtype, p.finite)
        if p.finite and x.dtype == torch.float32 and x.numel() and float(x.abs().max()) >= 1e-3 \
                and eps <= 1e-5:
            r = y.double().pow(2).mean(-1).sqrt() if k == "rmsnorm" else y.double().std(-1, unbiased=False)
            if cc > 1 and k == "rmsnorm":
                assert torch.allclose(r, torch.ones_like(r), atol=1e-2), "RMS of the output is not 1"


@case("layers.RMSNorm")
def _(data):
    _norm_case(data, "rmsnorm")


@case("layers.make_norm")
def _(data):
    _norm_case(data)


@case("layers.LayerConfig", examples=40)
def _(data):
    _config_case(data, "LayerConfig", _layer_fields())


def _cfg_arg(p, cfg):
    "The config, or (if targeted) something that is not a LayerConfig."
    if not p.hit("cfg"):
        return cfg
    bad = p.draw(st.sampled_from(["dict", "None", "model config"]), label="cfg (corrupted)")
    value = {"dict": dataclasses.asdict(cfg), "None": None,
             "model config": nn.Linear(2, 2)}[bad]
    p.mark(BAD, ["cfg", "config", "LayerConfig"], f"cfg={bad}")
    return value


def _layer_x(p, cfg, B, T, name="x", names=None):
    "(B, T, C) tokens; an edge case may disagree with the masks drawn for B and T."
    return p.tensor(name, floats(p, (B, T, cfg.d_model), label=name), {
        **MODULE_X_MUTS, "unbatched": (BAD, MUTATIONS["first"]), "nan": EDGE},
        names=names or [name, "mask", "memory", "memory_mask", "positions", "cache"])


def _self_mask(p, B, T, S=None):
    "A self-attention mask for (B, H, T, S): None, causal, padding or both; or corrupted."
    masks = _mod("masks")
    S = S or T
    kind = p.draw(st.sampled_from(["none", "causal", "padding", "both"]), label="mask kind")
    lengths = torch.randint(1, S + 1, (B,), generator=_seed(p, "lengths"))
    m = {"none": None, "causal": masks.causal_mask(T, S) if S >= T else None,
         "padding": masks.padding_mask(lengths, S)}.get(kind)
    if kind == "both" and S >= T:
        m = masks.combine_masks(masks.causal_mask(T, S), masks.padding_mask(lengths, S))
    if p.hit("mask"):
        m = p.tensor("mask", m if m is not None else torch.ones(T, S, dtype=torch.bool), {
            "float": BAD, "list": BAD, "additive": (BAD, lambda t: (~t).float() * -1e9),
            "wrong_keys": (BAD, lambda t: torch.cat([t, t], -1)),
            "real_tokens_BS": (BAD if B != T else EDGE, lambda t: torch.ones(B, S + 1, dtype=torch.bool))})
    return m


@case("layers.EncoderLayer", examples=40)
def _(data):
    layers = _mod("layers")
    p = Probe(data, ["cfg", "rotary"])  # trusts x, mask, positions
    cfg = _layer_cfg(p)
    rotary = _rotary(p, cfg.head_dim)
    if p.hit("rotary"):
        rotary = p.draw(st.sampled_from([_mod("positions").RotaryEmbedding(cfg.head_dim + 2), "rope"]))
        p.mark(BAD, ["rotary", "head_dim"], f"rotary={fmt(rotary)}")
    B, T = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, 4), label="T")
    x = _layer_x(p, cfg, B, T)
    mask = _self_mask(p, B, T)
    positions = None
    if rotary is not None and not isinstance(rotary, str) and p.draw(st.booleans()):
        positions = torch.arange(T)
    if p.hit("positions"):
        positions = p.draw(st.sampled_from([torch.arange(T + 1), torch.arange(T) + 100,
                                            torch.arange(T).float()]), label="positions (corrupted)")
        p.mark(BAD, ["positions", "rotary"], f"positions={fmt(positions)}")
    cfg_ = _cfg_arg(p, cfg)

    def go():
        m = p.call("EncoderLayer", layers.EncoderLayer, cfg_, rotary)
        return p.call("forward", m, x, mask, positions)
    out = p.run(go)
    if ok(out):
        expect_tensor(out, x.shape, torch.float32, p.finite)


@case("layers.DecoderLayer", examples=50)
def _(data):
    layers, masks = _mod("layers"), _mod("masks")
    p = Probe(data, ["cfg"])  # trusts x, memory, the masks, positions
    cfg = _layer_cfg(p)
    cross = p.draw(st.booleans(), label="cross_attention")
    rotary = _rotary(p, cfg.head_dim)
    B, T, S = (p.draw(st.integers(1, 3), label=n) for n in "BTS")
    x = _layer_x(p, cfg, B, T)
    memory = floats(p, (B, S, cfg.d_model), label="memory") if cross else None
    if p.hit("memory"):
        if cross:
            memory = p.tensor("memory", memory, {
                "list": BAD, "double": BAD, "long": BAD, "wider": MODULE_X_MUTS["wider"],
                "batch": (BAD, lambda m: torch.cat([m, m, m], 0)[: 2 * B + 1]),
                "none": (BAD, lambda m: None), "b0": (BAD, MUTATIONS["b0"]), "t0": EDGE})
        else:
            memory = floats(p, (B, S, cfg.d_model), label="memory")
            p.mark(BAD, ["memory", "cross_attention"], "memory for a layer without cross-attention")
    mask = _self_mask(p, B, T)
    memory_mask = None
    if cross and p.draw(st.booleans(), label="memory_mask"):
        memory_mask = masks.padding_mask(torch.randint(1, S + 1, (B,), generator=_seed(p, "ml")), S)
    if p.hit("memory_mask") and cross:
        memory_mask = p.tensor("memory_mask", memory_mask if memory_mask is not None else
                               torch.ones(B, 1, 1, S, dtype=torch.bool), {
            "float": BAD, "list": BAD, "wrong_keys": (BAD, lambda t: torch.cat([t, t], -1))})
    positions = None
    if rotary is not None and p.draw(st.booleans()):
        positions = torch.arange(T)
    if p.hit("positions"):
        positions = p.draw(st.sampled_from([torch.arange(T + 1), torch.arange(T) + 100,
                                            torch.arange(T).float()]), label="positions (corrupted)")
        p.mark(BAD, ["positions", "rotary"], f"positions={fmt(positions)}")
    cfg_ = _cfg_arg(p, cfg)

    def go():
        m = p.call("DecoderLayer", layers.DecoderLayer, cfg_, cross, rotary)
        return p.call("forward", m, x, memory, mask, memory_mask, positions)
    out = p.run(go)
    if ok(out):
        expect_tensor(out, x.shape, torch.float32, p.finite)


@case("layers.Encoder", examples=40)
def _(data):
    layers = _mod("layers")
    p = Probe(data, ["cfg", "n_layers"])  # trusts x, mask, positions
    cfg = _layer_cfg(p)
    n_layers = p.value("n_layers", st.integers(1, 2), POS_INT_BAD)
    rotary = _rotary(p, cfg.head_dim)
    B, T = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, 4), label="T")
    x = _layer_x(p, cfg, B, T)
    mask = _self_mask(p, B, T)
    positions = torch.arange(T) if rotary is not None and p.draw(st.booleans()) else None
    if p.hit("positions"):
        positions = p.draw(st.sampled_from([torch.arange(T + 1), torch.arange(T) + 100,
                                            torch.arange(T).float(), list(range(T))]),
                           label="positions (corrupted)")
        p.mark(BAD, ["positions", "rotary", "max_len"], f"positions={fmt(positions)}")
    cfg_ = _cfg_arg(p, cfg)

    def go():
        m = p.call("Encoder", layers.Encoder, cfg_, n_layers, rotary)
        return p.call("forward", m, x, mask, positions)
    out = p.run(go)
    if ok(out):
        expect_tensor(out, x.shape, torch.float32, p.finite)


@case("layers.Decoder", examples=50)
def _(data):
    layers, kvc = _mod("layers"), _mod("kv_cache")
    p = Probe(data, ["cfg", "n_layers"])  # trusts x, memory, mask, positions, cache
    cfg = _layer_cfg(p)
    n_layers = p.value("n_layers", st.integers(1, 2), POS_INT_BAD)
    nl = n_layers if pos_int(n_layers) == VALID else 1
    cross = p.draw(st.booleans(), label="cross_attention")
    rotary = _rotary(p, cfg.head_dim)
    B, T, S = (p.draw(st.integers(1, 3), label=n) for n in "BTS")
    x = _layer_x(p, cfg, B, T)
    memory = floats(p, (B, S, cfg.d_model), label="memory") if cross else None
    if p.hit("memory"):
        memory = (p.tensor("memory", memory, {
            "list": BAD, "double": BAD, "wider": MODULE_X_MUTS["wider"],
            "batch": (BAD, lambda m: torch.cat([m, m, m], 0)[: 2 * B + 1]),
            "none": (BAD, lambda m: None)}) if cross else floats(p, (B, S, cfg.d_model)))
        if not cross:
            p.mark(BAD, ["memory", "cross_attention"], "memory without cross-attention")
    use_cache = p.draw(st.booleans(), label="use a cache")
    mask = None if use_cache else _self_mask(p, B, T)
    positions = torch.arange(T) if rotary is not None and p.draw(st.booleans()) else None
    if p.hit("positions"):
        positions = p.draw(st.sampled_from([torch.arange(T + 1), torch.arange(T) + 100]),
                           label="positions (corrupted)")
        p.mark(BAD, ["positions", "rotary", "max_len"], f"positions={fmt(positions)}")
    cache_kind = "ok"
    if p.hit("cache"):
        # (an "empty cross" cache is only wrong for a decoder with cross-attention)
        cache_kind = p.draw(st.sampled_from(["short", "layers", "batch", "kvcache"]
                                            + (["empty cross"] if cross else [])))
        p.mark(BAD, ["cache", "k", "max_len", "memory"], f"cache: {cache_kind}")
        use_cache = True
    cfg_ = _cfg_arg(p, cfg)

    def go():
        m = p.call("Decoder", layers.Decoder, cfg_, n_layers, cross, rotary)
        m.eval()
        cache, mem = None, memory
        if use_cache:
            n = {"layers": nl + 1}.get(cache_kind, nl)
            L = {"short": max(T - 1, 1) if T > 1 else 1}.get(cache_kind, T + 1)
            if cache_kind == "short" and T == 1:
                L = 1
            b = B + 1 if cache_kind == "batch" else B
            cache = kvc.DecoderCache.allocate(n, b, cfg.n_heads, L, cfg.head_dim,
                                              S if cross else None)
            if cache_kind == "short" and T == 1:
                cache.length = 1  # full: one position (zeros) already stored
            if cross and isinstance(memory, torch.Tensor) and cache_kind not in ("empty cross", "layers") \
                    and memory.dim() == 3:
                cache.fill_cross_attention(m, memory)
                mem = None
            if cache_kind == "kvcache":
                cache = cache.self_attn[0]
        y = p.call("forward", m, x, mem, mask, None, positions, cache)
        return y, cache
    out = p.run(go)
    if ok(out):
        y, cache = out
        expect_tensor(y, x.shape, torch.float32, p.finite)
        if cache is not None:  # (an empty x, T = 0, is an edge case that may be refused)
            assert len(cache) == x.shape[-2], f"cache holds {len(cache)} positions after {x.shape[-2]}"
