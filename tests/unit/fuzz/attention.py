"""Fuzz cases of `minitransformer.attention`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from ._common import DROPOUT_BAD, Probe, _mask_for, _mod, _qkv, case, expect_tensor, inf, nan, ok


@case("attention.check_mask", examples=40)
def _(data):
    att = _mod("attention")
    p = Probe(data, ["mask", "shape"])
    shape = p.draw(st.lists(st.integers(1, 3), min_size=2, max_size=4).map(tuple), label="shape")
    q = torch.zeros(*shape[:-1], 1)
    k = torch.zeros(*shape[:-2], shape[-1], 1)
    mask = _mask_for(p, q, k)
    shape = p.value("shape", st.just(shape), (5, None, "TS"), names=["shape"])
    out = p.run(lambda: p.call("check_mask", att.check_mask, mask, shape))
    if ok(out):
        assert out is None


def _attention_case(data, fn_name):
    att = _mod("attention")
    p = Probe(data, ["q", "k", "v", "batch", "mask", "dropout_p", "scale"])
    q, k, v = _qkv(p)
    mask = _mask_for(p, q, k)
    dropout_p = p.value("dropout_p", st.sampled_from([0.0, 0.0, 0.5]), DROPOUT_BAD)
    scale = p.value("scale", st.sampled_from([None, 1.0, 0.0, -2.0, 1e-3]),
                    (nan, inf, "1", True), names=["scale"])
    out = p.run(lambda: p.call(fn_name, getattr(att, fn_name), q, k, v, mask,
                               dropout_p=dropout_p, scale=scale))
    if ok(out):
        o, w = out if fn_name == "attention_with_weights" else (out, None)
        lead = tuple(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]))
        T, S = q.shape[-2], k.shape[-2]
        if mask is not None:
            lead = tuple(torch.broadcast_shapes(lead + (T, S), mask.shape))[:-2]
        expect_tensor(o, (*lead, T, v.shape[-1]), q.dtype, p.finite)
        if w is not None:
            expect_tensor(w, (*lead, T, S), q.dtype, p.finite, "weights")
            if p.finite and not dropout_p:
                sums = w.double().sum(-1)
                allowed = torch.ones(*lead, T, S, dtype=torch.bool)
                if mask is not None:
                    allowed = allowed & mask
                tol = 3e-2 if q.dtype == torch.bfloat16 else 1e-4
                assert torch.allclose(sums, allowed.any(-1).double(), atol=tol), \
                    "weights must sum to 1 per query (0 for a query with no allowed key)"
        if mask is not None and p.finite:
            blocked = ~torch.broadcast_to(mask, (*lead, T, S)).any(-1)
            assert not o[blocked].any(), "a query with no allowed key must output zeros"


@case("attention.attention_with_weights", examples=50)
def _(data):
    _attention_case(data, "attention_with_weights")


@case("attention.scaled_dot_product_attention", examples=50)
def _(data):
    _attention_case(data, "scaled_dot_product_attention")
