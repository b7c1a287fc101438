"""Fuzz cases of `minitransformer.qkv`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from ._common import (
    BAD,
    MODULE_X_MUTS,
    MUTATIONS,
    OPT_POS_INT_BAD,
    POS_INT_BAD,
    Probe,
    VALID,
    _mod,
    _qkv,
    case,
    expect_tensor,
    floats,
    ok,
    pos_int,
)


@case("qkv.QKVProjection", examples=40)
def _(data):
    qkv = _mod("qkv")
    p = Probe(data, ["d_model", "d_q", "d_k", "d_v", "dtype"])  # trusts x, context
    C = p.value("d_model", st.integers(1, 8), POS_INT_BAD)
    dq = p.value("d_q", st.integers(1, 8), POS_INT_BAD)
    # None is the documented default of d_k and d_v (= d_q), not a bad value
    dk = p.value("d_k", st.one_of(st.none(), st.integers(1, 8)), OPT_POS_INT_BAD)
    dv = p.value("d_v", st.one_of(st.none(), st.integers(1, 8)), OPT_POS_INT_BAD)
    dtype = p.value("dtype", st.sampled_from([None, torch.float32]),
                    (torch.int64, "float32", torch.bool))
    bias = p.draw(st.booleans(), label="bias")
    cc = C if pos_int(C) == VALID else 4
    B, T, S = (p.draw(st.integers(1, 3), label=n) for n in "BTS")
    x = p.tensor("x", floats(p, (B, T, cc)), MODULE_X_MUTS)
    use_context = p.draw(st.booleans(), label="cross-attention")
    context = floats(p, (B, S, cc), label="context") if use_context else None
    if p.hit("context"):
        context = p.tensor("context", floats(p, (B, S, cc), label="context"), {
            **MODULE_X_MUTS, "b0": (BAD, MUTATIONS["b0"]),
            "batch": (BAD, lambda c: torch.cat([c, c, c], 0)[: 2 * B + 1])},
            names=["context", "x"])

    def go():
        m = p.call("QKVProjection", qkv.QKVProjection, C, dq, dk, dv, bias, dtype=dtype)
        qkv_ = p.call("forward", m, x, context)
        q = p.call("queries", m.queries, x)
        kv = p.call("keys_values", m.keys_values, x if context is None else context)
        return qkv_, q, kv
    out = p.run(go)
    if ok(out):
        (q, k, v), q2, (k2, v2) = out
        dk_, dv_ = dk or dq, dv or dk or dq
        src = x if context is None else context
        expect_tensor(q, (*x.shape[:-1], dq), torch.float32, p.finite, "Q")
        expect_tensor(k, (*src.shape[:-1], dk_), torch.float32, p.finite, "K")
        expect_tensor(v, (*src.shape[:-1], dv_), torch.float32, p.finite, "V")
        assert torch.equal(q, q2) and torch.equal(k, k2) and torch.equal(v, v2)


@case("qkv.check_qkv", examples=40)
def _(data):
    qkv = _mod("qkv")
    p = Probe(data, ["q", "k", "v", "batch"])
    q, k, v = _qkv(p)
    out = p.run(lambda: p.call("check_qkv", qkv.check_qkv, q, k, v))
    if ok(out):
        assert out is None
