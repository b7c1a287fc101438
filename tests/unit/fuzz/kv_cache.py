"""Fuzz cases of `minitransformer.kv_cache`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from ._common import (
    BAD,
    EDGE,
    MODULE_X_MUTS,
    POS_INT_BAD,
    Probe,
    VALID,
    _layer_cfg,
    _mod,
    case,
    expect_tensor,
    floats,
    fmt,
    ok,
    pos_int,
)


# ================================================================== kv_cache
@case("kv_cache.KVCache", examples=40)
def _(data):
    kvc = _mod("kv_cache")
    p = Probe(data, ["batch_size", "n_kv_heads", "max_len", "head_dim", "dtype",
                     "length"])  # trusts k, v
    B = p.value("batch_size", st.integers(1, 3), POS_INT_BAD)
    H = p.value("n_kv_heads", st.integers(1, 3), POS_INT_BAD)
    L = p.value("max_len", st.integers(1, 6), POS_INT_BAD)
    D = p.value("head_dim", st.integers(1, 4), POS_INT_BAD)
    # the signature says `dtype: torch.dtype = torch.float32`; None (torch's "default
    # dtype") is not documented: an edge case, accepted or refused with a clear error
    dtype = p.value("dtype", st.sampled_from([torch.float32, torch.float64]),
                    ("float32", None, torch.int64, torch.bool),
                    judge=lambda x: EDGE if x is None else BAD)
    b, h, ll, d = (v if pos_int(v) == VALID else 2 for v in (B, H, L, D))
    T = p.draw(st.integers(1, ll), label="T")
    dt_ = dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32
    k = floats(p, (b, h, T, d), dt_, "k")
    v = floats(p, (b, h, T, d), dt_, "v")
    muts = {"list": BAD, "flat": BAD, "longer": (BAD, lambda t: torch.cat([t] * (ll + 1), 2)),
            "heads": (BAD, lambda t: torch.cat([t, t], 1)), "dtype": (BAD, lambda t: t.half()),
            "noncontig": VALID, "three_dims": (BAD, lambda t: t[0])}
    k = p.tensor("k", k, muts, names=["k", "max_len", "cache"])
    v = p.tensor("v", v, {**muts, "shorter": (BAD, lambda t: t[:, :, :0])},
                 names=["v", "k", "max_len", "cache"])
    length = p.value("length", st.integers(0, T), (-1, T + 1, 0.5, True, "0", None),
                     judge=lambda x: VALID if x is True and T >= 1 else BAD)
    if p.hit("length") and length is True:
        p.mark(BAD, ["length"], "length=True")

    def go():
        c = p.call("KVCache", kvc.KVCache, B, H, L, D, dtype=dtype)
        kk, vv = p.call("update", c.update, k, v)
        n0 = len(c)
        p.call("truncate", c.truncate, length)
        n1 = len(c)
        kv = c.keys_values()
        nbytes, r = c.nbytes, repr(c)
        c.reset()
        return kk, vv, n0, n1, kv, nbytes, len(c), r
    out = p.run(go)
    if ok(out):
        kk, vv, n0, n1, (k2, v2), nbytes, n2, _ = out
        t = k.shape[2]
        expect_tensor(kk, (b, h, t, d), dt_)
        assert torch.equal(kk, k) and torch.equal(vv, v)
        assert (n0, n1, n2) == (t, length, 0)
        assert k2.shape[2] == length
        assert nbytes == 2 * b * h * ll * d * torch.empty(0, dtype=dt_).element_size()


@case("kv_cache.check_encoder_output")
def _(data):
    kvc = _mod("kv_cache")
    p = Probe(data, ["memory", "d_model", "batch_size"])
    B, S = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, 3), label="S")
    C = p.value("d_model", st.integers(1, 6), POS_INT_BAD, names=["d_model", "memory"])
    b = p.value("batch_size", st.one_of(st.none(), st.just(B)),
                (0, -1, 1.5, True, "2", B + 1), names=["batch_size", "memory"])
    memory = floats(p, (B, S, C if pos_int(C) == VALID else 4), label="memory")
    memory = p.tensor("memory", memory, {
        "list": BAD, "long": BAD, "noncontig": VALID, "double": VALID, "b0": BAD,
        "t0": BAD, "first": BAD, "unsqueeze": BAD,
        "wider": (BAD, lambda m: torch.cat([m, m[..., :1]], -1))})
    out = p.run(lambda: p.call("check_encoder_output", kvc.check_encoder_output, memory,
                               C, b))
    if ok(out):
        assert out is memory


@case("kv_cache.DecoderCache", examples=40)
def _(data):
    kvc, layers = _mod("kv_cache"), _mod("layers")
    p = Probe(data, ["n_layers", "batch_size", "max_len", "source_len", "self_attn",
                     "decoder", "memory"])
    cfg = _layer_cfg(p)
    nl = p.value("n_layers", st.integers(1, 2), POS_INT_BAD)
    B = p.value("batch_size", st.integers(1, 3), POS_INT_BAD)
    L = p.value("max_len", st.integers(1, 4), POS_INT_BAD)
    cross = p.draw(st.booleans(), label="cross_attention")
    S = p.draw(st.integers(1, 3), label="S")
    src = p.value("source_len", st.just(S if cross else None),
                  (0, -1, 1.5, True) if cross else (3,),
                  names=["source_len", "max_len", "cross_attention"])
    b = B if pos_int(B) == VALID else 2
    n = nl if pos_int(nl) == VALID else 1
    decoder = layers.Decoder(cfg, n, cross_attention=cross)
    dec = decoder
    if p.hit("decoder"):
        dec = p.draw(st.sampled_from(["encoder", "layer", "none"]), label="decoder (corrupted)")
        dec = {"encoder": layers.Encoder(cfg, 1), "layer": decoder.layers[0], "none": None}[dec]
        p.mark(BAD, ["decoder"], f"decoder={fmt(dec)}")
    memory = floats(p, (b, S, cfg.d_model), label="memory")
    if cross:
        memory = p.tensor("memory", memory, {
            "list": BAD, "wider": MODULE_X_MUTS["wider"], "double": BAD,
            "batch": (BAD, lambda m: torch.cat([m, m], 0)),
            "longer": (BAD, lambda m: torch.cat([m, m], 1)),
            "shorter": (VALID, lambda m: m[:, :1])},
            names=["memory", "source_len"])
    self_attn = None
    if p.hit("self_attn"):
        kind = p.draw(st.sampled_from(["empty", "disagree", "one KVCache", "tensors"]))
        a, c = kvc.KVCache(1, 1, 4, 2), kvc.KVCache(1, 1, 4, 2)
        a.update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
        self_attn = {"empty": [], "disagree": [a, c], "one KVCache": a,
                     "tensors": [torch.zeros(1)]}[kind]
        p.mark(BAD, ["self_attn", "cache", "caches"], f"self_attn: {kind}")

    def go():
        if self_attn is not None:
            c = p.call("DecoderCache", kvc.DecoderCache, self_attn)
            return c, len(c), c.nbytes, None, None
        a = p.call("DecoderCache.allocate", kvc.DecoderCache.allocate, nl, B, cfg.n_heads, L,
                   cfg.head_dim, src)
        f = p.call("DecoderCache.for_decoder", kvc.DecoderCache.for_decoder, dec, B, L,
                   src)
        if cross:
            p.call("fill_cross_attention", f.fill_cross_attention, dec, memory)
        n0 = len(f)
        f.reset()
        return a, len(a), a.nbytes, f, n0
    out = p.run(go)
    if ok(out) and self_attn is None:
        a, la, nbytes, f, n0 = out
        assert la == 0 and n0 == 0 and len(f) == 0
        assert len(a.self_attn) == n and (a.cross_attn is None) == (not cross)
        per = 2 * b * cfg.n_heads * cfg.head_dim * 4
        assert nbytes == n * per * (L + (S if cross else 0))
