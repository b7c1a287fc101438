"""Fuzz cases of `minitransformer.lora`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch import nn

from ._common import (
    BAD,
    DROPOUT_BAD,
    POS_INT_BAD,
    Probe,
    VALID,
    _mod,
    case,
    expect_tensor,
    floats,
    fmt,
    inf,
    nan,
    number_in,
    ok,
    pos_int,
)

# ================================================================== lora
ALPHA_BAD = (0.0, -1.0, nan, inf, "16", None, True)

LORA_X_MUTS = {"noncontig": VALID, "b0": VALID, "unsqueeze": VALID}


@case("lora.LoRALinear", examples=40)
def _(data):
    lora = _mod("lora")
    p = Probe(data, ["base", "r", "alpha", "dropout", "x"])
    n_in, n_out = (p.draw(st.integers(1, 6), label=n) for n in ("in", "out"))
    dtype = p.draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
                   label="dtype")
    bias = p.draw(st.booleans(), label="bias")
    base = nn.Linear(n_in, n_out, bias=bias, dtype=dtype)
    if p.hit("base"):
        kind = p.draw(st.sampled_from(["conv", "identity", "none", "tensor", "lora",
                                       "bilinear"]), label="base corruption")
        base = {"conv": lambda: nn.Conv1d(n_in, n_out, 1),
                "identity": lambda: nn.Identity(), "none": lambda: None,
                "tensor": lambda: base.weight.detach(),
                "lora": lambda: lora.LoRALinear(base, 1),  # no adapter on an adapter
                "bilinear": lambda: nn.Bilinear(n_in, n_in, n_out)}[kind]()
        p.mark(BAD, ["base"], f"base: {kind} -> {fmt(base)}")
    side = min(n_in, n_out)
    r = p.value("r", st.integers(1, side), POS_INT_BAD + (side + 1, 2**40),
                judge=lambda v: pos_int(v, hi=side))
    alpha = p.value("alpha", st.sampled_from([16.0, 1.0, 0.5, 3, 1e-3]), ALPHA_BAD,
                    judge=lambda v: number_in(v, lo=0, lo_open=True))
    dropout = p.value("dropout", st.sampled_from([0.0, 0.5]), DROPOUT_BAD)
    training = p.draw(st.booleans(), label="training")
    lead = p.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple),
                  label="lead")
    x = p.tensor("x", floats(p, (*lead, n_in), dtype), LORA_X_MUTS)

    def go():
        m = p.call("LoRALinear", lora.LoRALinear, base, r, alpha, dropout)
        m.train(training)
        return m, p.call("forward", m, x), repr(m)
    out = p.run(go)
    if ok(out):
        m, y, _ = out
        expect_tensor(y, (*x.shape[:-1], n_out), dtype, p.finite)
        assert m.A.shape == (r, n_in) and m.B.shape == (n_out, r), (m.A.shape, m.B.shape)
        assert m.A.dtype == m.B.dtype == dtype and not m.B.any()
        assert m.A.requires_grad and m.B.requires_grad
        assert not any(q.requires_grad for q in base.parameters()), "base not frozen"
        assert m.weight is base.weight and (m.in_features, m.out_features) == (n_in, n_out)
        assert m.scaling == alpha / r
        with torch.no_grad():  # B is zero: the layer is its base, dropout or not
            assert torch.equal(y, base(x)), "at initialisation LoRALinear != base"
