"""Fuzz cases of `minitransformer.multihead`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch import nn

from ._common import (
    BAD,
    DROPOUT_BAD,
    EDGE,
    MODULE_X_MUTS,
    MUTATIONS,
    OPT_POS_INT_BAD,
    POS_INT_BAD,
    Probe,
    VALID,
    _mask_for,
    _mod,
    _rotary,
    case,
    expect_tensor,
    floats,
    fmt,
    ok,
)


# ================================================================== multihead
@case("multihead.split_heads")
def _(data):
    mh = _mod("multihead")
    p = Probe(data, ["x", "n_heads"])
    lead = p.draw(st.lists(st.integers(1, 3), max_size=2).map(tuple), label="lead")
    H, D, T = (p.draw(st.integers(1, 4), label=n) for n in ("H", "D", "T"))
    n_heads = p.value("n_heads", st.just(H), (0, -H, 1.5, True, None, "2", H * D + 1),
                      judge=lambda v: EDGE if v is True and H == 1 else BAD,
                      names=["n_heads"])
    x = p.tensor("x", floats(p, (*lead, T, H * D)), {
        "noncontig": VALID, "double": VALID, "long": VALID, "b0": EDGE, "t0": EDGE,
        "transposed": (VALID, lambda x: x.transpose(-1, -2).contiguous().transpose(-1, -2)),
        "flat": BAD, "list": BAD, "scalar": BAD})
    out = p.run(lambda: p.call("split_heads", mh.split_heads, x, n_heads))
    if ok(out):
        *ld, t, c = x.shape
        expect_tensor(out, (*ld, n_heads, t, c // n_heads), x.dtype, p.finite)
        assert torch.equal(mh.merge_heads(out), x), "merge_heads(split_heads(x)) != x"


@case("multihead.merge_heads")
def _(data):
    mh = _mod("multihead")
    p = Probe(data, ["x"])
    lead = p.draw(st.lists(st.integers(1, 3), max_size=2).map(tuple), label="lead")
    H, T, D = (p.draw(st.integers(1, 4), label=n) for n in ("H", "T", "D"))
    x = p.tensor("x", floats(p, (*lead, H, T, D)), {
        "noncontig": VALID, "b0": EDGE, "t0": EDGE, "list": BAD,
        "two_dims": (BAD, lambda x: x.reshape(-1, x.shape[-1])), "flat": BAD})
    out = p.run(lambda: p.call("merge_heads", mh.merge_heads, x))
    if ok(out):
        *ld, h, t, d = x.shape
        expect_tensor(out, (*ld, t, h * d), x.dtype, p.finite)


@case("multihead.repeat_kv")
def _(data):
    mh = _mod("multihead")
    p = Probe(data, ["x", "groups"])
    lead = p.draw(st.lists(st.integers(1, 3), max_size=1).map(tuple), label="lead")
    H, S, D = (p.draw(st.integers(1, 3), label=n) for n in ("H", "S", "D"))
    x = p.tensor("x", floats(p, (*lead, H, S, D)), {
        "noncontig": VALID, "b0": EDGE, "list": BAD, "flat": BAD})
    groups = p.value("groups", st.integers(1, 3), (0, -1, 1.5, True, None))
    out = p.run(lambda: p.call("repeat_kv", mh.repeat_kv, x, groups))
    if ok(out):
        *ld, h, s, d = x.shape
        expect_tensor(out, (*ld, h * groups, s, d), x.dtype, p.finite)
        if out.numel():  # query head r reads K/V head r // groups
            assert torch.equal(out[..., ::groups, :, :], x)


@case("multihead.default_positions")
def _(data):
    mh = _mod("multihead")
    p = Probe(data, ["past", "T"])
    past = p.value("past", st.integers(0, 10), (-1, 1.5, True, None, "0"))
    T = p.value("T", st.integers(1, 10), (0, -1, 2.5, True, None),
                judge=lambda v: EDGE if v == 0 and v is not False else BAD)
    out = p.run(lambda: p.call("default_positions", mh.default_positions, past, T))
    if ok(out):
        expect_tensor(out, (T,), torch.long)
        assert out.tolist() == list(range(past, past + T))


def _head_dims(p):
    H = p.draw(st.integers(1, 3), label="n_heads")
    D = p.draw(st.sampled_from([2, 4]), label="head_dim")
    return H, D


@case("multihead.check_heads")
def _(data):
    mh = _mod("multihead")
    p = Probe(data, ["d_model", "n_heads", "n_kv_heads"])
    C = p.value("d_model", st.sampled_from([4, 6, 12]), POS_INT_BAD)
    H = p.value("n_heads", st.sampled_from([1, 2, 3, 4]), POS_INT_BAD)
    H_kv = p.value("n_kv_heads", st.one_of(st.none(), st.sampled_from([1, 2, 3, 4])),
                   OPT_POS_INT_BAD)
    if (p.status == VALID or p.hit("n_kv_heads")) and C % H:  # checked before n_kv_heads
        p.mark(BAD, ["d_model", "n_heads"], f"n_heads={H} does not divide d_model={C}")
    if p.status == VALID and H_kv is not None and H % H_kv:
        p.mark(BAD, ["n_kv_heads", "n_heads"], f"n_kv_heads={H_kv} does not divide {H}")
    out = p.run(lambda: p.call("check_heads", mh.check_heads, C, H, H_kv))
    if ok(out):
        assert type(out) is int and out == (H if H_kv is None else H_kv)


@case("multihead.HeadProjection", examples=40)
def _(data):
    mh, kvc = _mod("multihead"), _mod("kv_cache")
    p = Probe(data, ["d_model", "n_heads", "rotary"])  # trusts what project is given
    H, D = _head_dims(p)
    C = p.value("d_model", st.just(H * D), (0, -H * D, H * D + 1, float(H * D), True, "8"),
                names=["d_model", "n_heads"])
    n_heads = p.value("n_heads", st.just(H), (0, -1, 1.5, True, None, H * D + 1),
                      judge=lambda v: BAD,
                      names=["n_heads", "d_model"])
    rotary = _rotary(p, D)
    if p.hit("rotary"):
        rotary = p.draw(st.sampled_from([_mod("positions").RotaryEmbedding(D + 2), "rope"]))
        p.mark(BAD, ["rotary", "head_dim"], f"rotary={rotary!r}")
    B, T, S = (p.draw(st.integers(1, 3), label=n) for n in "BTS")
    x = p.tensor("x", floats(p, (B, T, H * D)), MODULE_X_MUTS)
    context = None
    if rotary is None and p.draw(st.booleans(), label="cross"):
        context = floats(p, (B, S, H * D), label="context")
    context = p.tensor("context", context if context is not None else floats(p, (B, S, H * D)),
                       {**MODULE_X_MUTS, "unchanged": (VALID, lambda c: c)}, names=["context"]) \
        if p.hit("context") else context
    if p.hit("context") and rotary is not None:
        p.mark(BAD, ["context", "rotary"], "context together with rotary")
    positions = None
    if rotary is not None and p.draw(st.booleans(), label="explicit positions"):
        positions = torch.arange(T)
    if p.hit("positions"):
        kind = p.draw(st.sampled_from(["float", "too_far", "wrong_len", "list", "neg"]))
        positions = {"float": torch.arange(T).float(), "too_far": torch.arange(T) + 100,
                     "wrong_len": torch.arange(T + 1), "list": list(range(T)),
                     "neg": torch.arange(T) - 1}[kind]
        if rotary is None or kind not in ("too_far", "neg"):  # (any integer is an
            p.mark(BAD, ["positions", "rotary"], f"positions={fmt(positions)}")  # angle)
    cache = None
    if context is None and p.draw(st.booleans(), label="cache"):
        cache = kvc.KVCache(B, H, T + 1, D)
    if p.hit("cache"):
        cache = p.draw(st.sampled_from(["short", "batch", "object"]), label="cache kind")
        cache = {"short": kvc.KVCache(B, H, max(T - 1, 1), D) if T > 1 else kvc.KVCache(B, H, 1, D),
                 "batch": kvc.KVCache(B + 1, H, T, D), "object": {}}[cache]
        if isinstance(cache, kvc.KVCache) and T == 1 and cache.k.shape[0] == B:
            cache.update(torch.zeros(B, H, 1, D), torch.zeros(B, H, 1, D))  # full
        p.mark(BAD, ["cache", "k", "max_len"] + (["context"] if context is not None else []),
               f"cache={cache!r}")

    def go():
        m = p.call("HeadProjection", mh.HeadProjection, C, n_heads, rotary=rotary)
        q, k, v = p.call("project", m.project, x, context, positions, cache)
        kv = p.call("context_keys_values", m.context_keys_values,
                    x if context is None else context)
        return q, k, v, kv
    out = p.run(go)
    if ok(out):
        q, k, v, (k2, v2) = out
        src = x if context is None else context
        S_ = src.shape[-2]
        expect_tensor(q, (*x.shape[:-2], H, x.shape[-2], D), torch.float32, p.finite, "q")
        expect_tensor(k, (*src.shape[:-2], H, S_, D), torch.float32, p.finite, "k")
        expect_tensor(v, (*src.shape[:-2], H, S_, D), torch.float32, p.finite, "v")
        expect_tensor(k2, (*src.shape[:-2], H, S_, D), torch.float32, p.finite, "k (context)")


@case("multihead.MultiHeadAttention", examples=60)
def _(data):
    mh, kvc = _mod("multihead"), _mod("kv_cache")
    p = Probe(data, ["d_model", "n_heads", "dropout", "ref", "dtype"])  # trusts its inputs
    H, D = _head_dims(p)
    C = H * D
    n_heads = p.value("n_heads", st.just(H), (0, -1, 1.5, True, None, C + 1),
                      judge=lambda v: BAD,
                      names=["n_heads", "d_model"])
    d_model = p.value("d_model", st.just(C), (0, -C, 2.0 * C, True, None),
                      names=["d_model", "n_heads"])
    dropout = p.value("dropout", st.sampled_from([0.0, 0.0, 0.3]), DROPOUT_BAD)
    dtype = p.value("dtype", st.just(None), (torch.int64, "float32", torch.bool))
    training = p.draw(st.booleans(), label="training")
    rotary = _rotary(p, D)
    B, T, S = (p.draw(st.integers(1, 3), label=n) for n in "BTS")
    x = p.tensor("x", floats(p, (B, T, C)), {
        **MODULE_X_MUTS, "unbatched": (EDGE, MUTATIONS["first"]), "nan": EDGE})
    context = None
    if rotary is None and p.draw(st.booleans(), label="cross"):
        context = floats(p, (B, S, C), label="context")
    if p.hit("context"):
        context = p.tensor("context", floats(p, (B, S, C), label="context"), {
            "list": BAD, "wider": MODULE_X_MUTS["wider"], "double": BAD, "long": BAD,
            "batch": (BAD, lambda c: torch.cat([c, c, c], 0)[: 2 * B + 1]),
            "empty_cache": (BAD, lambda c: kvc.KVCache(B, H, 4, D))},
            names=["context", "x"] + (["rotary"] if rotary is not None else []))
    keys = (context if isinstance(context, torch.Tensor) else x)
    k_like = keys if isinstance(keys, torch.Tensor) and keys.dim() >= 2 else torch.zeros(1, 1)
    q_like = x if isinstance(x, torch.Tensor) and x.dim() >= 2 else torch.zeros(1, 1)
    mask = _mask_for(p, q_like, k_like, heads=True)
    positions = None
    if rotary is not None and p.draw(st.booleans(), label="explicit positions"):
        positions = torch.arange(T).expand(B, T) if p.draw(st.booleans()) else torch.arange(T)
    if p.hit("positions"):
        kind = p.draw(st.sampled_from(["float", "too_far", "wrong_len", "batch", "list"]))
        positions = {"float": torch.arange(T).float(), "too_far": torch.arange(T) + 100,
                     "wrong_len": torch.arange(T + 1), "batch": torch.arange(T).expand(B + 1, T),
                     "list": list(range(T))}[kind]
        p.mark(BAD, ["positions", "rotary"], f"positions={fmt(positions)}")
    cache = None
    if context is None and not p.hit("mask") and p.draw(st.booleans(), label="cache"):
        cache = kvc.KVCache(B, H, T + 2, D)  # (not with a corrupted mask: keep it)
        if mask is not None:
            mask = None  # S grows with the cache; no mask
    if p.hit("cache"):
        kind = p.draw(st.sampled_from(["full", "batch", "heads", "dict", "dtype"]))
        cache = {"full": kvc.KVCache(B, H, 1, D), "batch": kvc.KVCache(B + 1, H, 8, D),
                 "heads": kvc.KVCache(B, H + 1, 8, D), "dict": {},
                 "dtype": kvc.KVCache(B, H, 8, D, dtype=torch.float64)}[kind]
        if kind == "full":
            cache.update(torch.zeros(B, H, 1, D), torch.zeros(B, H, 1, D))
        mask = None
        p.mark(BAD, ["cache", "k", "max_len"] + (["context"] if context is not None else []),
               f"cache: {kind}")
    ref = None
    if p.draw(st.booleans(), label="from_torch"):
        ref = nn.MultiheadAttention(C, H, bias=p.draw(st.booleans()), batch_first=True)
    if p.hit("ref"):
        kind = p.draw(st.sampled_from(["linear", "kdim", "bias_kv", "zero_attn"]))
        ref = {"linear": lambda: nn.Linear(C, C),
               "kdim": lambda: nn.MultiheadAttention(C, H, kdim=C + 1, vdim=C + 1),
               "bias_kv": lambda: nn.MultiheadAttention(C, H, add_bias_kv=True),
               "zero_attn": lambda: nn.MultiheadAttention(C, H, add_zero_attn=True)}[kind]()
        p.mark(BAD, ["ref", "add_bias_kv", "add_zero_attn"], f"ref: {kind}")

    def go():
        m = p.call("MultiHeadAttention", mh.MultiHeadAttention, d_model, n_heads,
                   dropout=dropout, rotary=rotary, dtype=dtype)
        m.train(training)
        y = p.call("forward", m, x, context, mask=mask, positions=positions, cache=cache)
        if cache is not None:
            cache.truncate(0) if hasattr(cache, "truncate") else None
        y2, w = p.call("forward_with_weights", m.forward_with_weights, x, context, mask,
                       positions, cache)
        theirs = p.call("from_torch", mh.MultiHeadAttention.from_torch, ref) \
            if ref is not None else None
        return m, y, y2, w, theirs, repr(m)
    out = p.run(go)
    if ok(out):
        m, y, y2, w, theirs, _ = out
        src_len = (context.shape[-2] if isinstance(context, torch.Tensor) else
                   (len(context) if context is not None else x.shape[-2]))
        expect_tensor(y, x.shape, torch.float32, p.finite)
        expect_tensor(y2, x.shape, torch.float32, p.finite, "forward_with_weights output")
        expect_tensor(w, (*x.shape[:-2], H, x.shape[-2], src_len), torch.float32, p.finite,
                      "weights")
        xmax = float(x.abs().max()) if x.numel() else 0.0  # (an empty x has no max)
        if p.finite and not (training and dropout) and cache is None:
            assert torch.allclose(y, y2, atol=1e-3 * max(1.0, xmax)), \
                "forward and forward_with_weights disagree"
        if theirs is not None:
            theirs.eval()
            a = theirs(x) if x.dim() == 3 else None
            b = ref.eval()(x, x, x, need_weights=False)[0] if x.dim() == 3 else None
            if a is not None and p.finite:
                assert torch.allclose(a, b, atol=1e-4 * max(1.0, xmax))
