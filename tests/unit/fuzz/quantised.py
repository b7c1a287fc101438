"""Fuzz cases of `minitransformer.quantised`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from ._common import BAD, Probe, VALID, _mod, case, expect_tensor, floats, fmt, ok

QUANT_X_MUTS = {"long": BAD, "list": BAD, "noncontig": VALID, "b0": VALID, "double": VALID,
                "bfloat16": VALID, "wider": (BAD, lambda x: torch.cat([x, x[..., :1]], -1))}


@case("quantised.QuantisedWeight", "quantised.quantised_linear", examples=30)
def _(data):
    q = _mod("quantised")
    p = Probe(data, ["kind", "weight", "x"])
    kind = p.value("kind", st.sampled_from(sorted(q.FORMATS)), ("q3_k", "Q8_0", 8, None),
                   judge=lambda v: VALID if v in q.FORMATS else BAD)
    n_out, blocks = p.draw(st.integers(1, 5), label="out"), p.draw(st.integers(1, 3),
                                                                   label="blocks")
    weight = floats(p, (n_out, 32 * blocks), label="weight")
    if p.hit("weight"):
        how = p.draw(st.sampled_from(["1-d", "long", "odd width"]), label="weight corruption")
        weight = {"1-d": weight.reshape(-1), "long": weight.long(),
                  "odd width": weight[:, :-4] if kind == "int8" else weight[:, :-1]}[how]
        status = VALID if how == "odd width" and kind == "int8" else BAD  # int8: any 4k
        p.mark(status, ["weight"], f"weight: {how} -> {fmt(weight)}")
    bias = p.draw(st.booleans(), label="bias")
    lead = p.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple),
                  label="lead")
    C = weight.shape[-1] if weight.dim() == 2 else 32 * blocks
    x = p.tensor("x", floats(p, (*lead, C)), QUANT_X_MUTS, names=("x", "input"))

    def go():
        b = torch.randn(n_out) if bias else None
        w = p.call("from_float", q.QuantisedWeight.from_float, weight, kind)
        layer = p.call("quantised_linear", q.quantised_linear, w, b)
        return layer, p.call("forward", layer, x)
    out = p.run(go)
    if ok(out):
        layer, y = out
        expect_tensor(y, (*x.shape[:-1], n_out), x.dtype, p.finite)
        want = x.double() @ layer.weight.dequantise().double().T + (
            0 if layer.bias is None else layer.bias.double())
        if want.numel():
            tol = 1e-3 * (1 + want.abs().max().item()) * (30 if x.dtype == torch.bfloat16 else 1)
            assert (y.double() - want).abs().max().item() <= tol, "product != dequantised matmul"
