"""Fuzz cases of `minitransformer.feedforward`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from ._common import (
    BAD,
    DROPOUT_BAD,
    EDGE,
    MODULE_X_MUTS,
    POS_INT_BAD,
    Probe,
    VALID,
    _mod,
    case,
    expect_tensor,
    floats,
    ok,
    pos_int,
)


# ================================================================== feedforward
@case("feedforward.ACTIVATIONS", examples=1)
def _(data):
    ff = _mod("feedforward")
    assert isinstance(ff.ACTIVATIONS, tuple) and ff.ACTIVATIONS
    z = torch.linspace(-3, 3, 7)
    for name in ff.ACTIVATIONS:
        assert isinstance(name, str)
        expect_tensor(ff.activation(name, z), z.shape, z.dtype)
        ff.FeedForward(4, 8, name)


@case("feedforward.activation")
def _(data):
    ff = _mod("feedforward")
    p = Probe(data, ["name", "z"])
    name = p.value("name", st.sampled_from(list(ff.ACTIVATIONS) + ["silu"]),
                   ("tanh", "RELU", None, 1, ""), names=["name", "activation"])
    shape = p.draw(st.lists(st.integers(1, 4), max_size=3).map(tuple), label="shape")
    dtype = p.draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
    z = p.tensor("z", floats(p, shape, dtype, "z"), {
        "long": BAD, "list": BAD, "bool": BAD, "noncontig": VALID, "b0": EDGE,
        "nan": EDGE, "inf": EDGE})
    out = p.run(lambda: p.call("activation", ff.activation, name, z))
    if ok(out):
        expect_tensor(out, z.shape, z.dtype, p.finite)


@case("feedforward.FeedForward", examples=40)
def _(data):
    ff = _mod("feedforward")
    p = Probe(data, ["d_model", "d_ff", "activation", "dropout", "dtype"])  # trusts x
    C = p.value("d_model", st.integers(1, 8), POS_INT_BAD)
    d_ff = p.value("d_ff", st.integers(1, 8), POS_INT_BAD)
    act = p.value("activation", st.sampled_from(ff.ACTIVATIONS), ("silu", "tanh", None, 3))
    dropout = p.value("dropout", st.sampled_from([0.0, 0.5]), DROPOUT_BAD)
    dtype = p.value("dtype", st.just(None), (torch.int64, "float32", torch.bool))
    bias, training = p.draw(st.booleans(), label="bias"), p.draw(st.booleans(), label="training")
    cc = C if pos_int(C) == VALID else 4
    shape = p.draw(st.lists(st.integers(1, 3), max_size=2).map(tuple), label="lead")
    x = p.tensor("x", floats(p, (*shape, cc)), {
        **MODULE_X_MUTS, "scalar": BAD, "b0": EDGE, "nan": EDGE,
        # (*lead, C) flattened is (n * C,): still a valid (..., C) input when n == 1
        "flat": BAD if math.prod(shape) != 1 else VALID})

    def go():
        m = p.call("FeedForward", ff.FeedForward, C, d_ff, act, bias, dropout, dtype=dtype)
        m.train(training)
        return p.call("forward", m, x), repr(m)
    out = p.run(go)
    if ok(out):
        expect_tensor(out[0], x.shape, torch.float32, p.finite)
