"""Fuzz cases of `minitransformer.mixing`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from ._common import (
    BAD,
    EDGE,
    MUTATIONS,
    Probe,
    VALID,
    _mod,
    bools,
    case,
    expect_tensor,
    floats,
    inf,
    nan,
    ok,
)


# ================================================================== mixing
@case("mixing.softmax")
def _(data):
    mixing = _mod("mixing")
    p = Probe(data, ["scores", "dim"])
    shape = p.draw(st.lists(st.integers(1, 4), max_size=4).map(tuple), label="shape")
    dtype = p.draw(st.sampled_from([torch.float32, torch.float64, torch.float16,
                                    torch.bfloat16]), label="dtype")
    scores = floats(p, shape, dtype, "scores")
    if p.draw(st.booleans(), label="some -inf"):
        scores = scores.masked_fill(bools(p, shape, "-inf"), -inf)
    n = max(len(shape), 1)
    dim = p.value("dim", st.integers(-n, n - 1), (n, -n - 1, 1.5, None, "0", True),
                  judge=lambda v: EDGE if v is True else BAD)
    scores = p.tensor("scores", scores, {
        "long": BAD, "list": BAD, "noncontig": VALID, "inf": EDGE, "nan": EDGE,
        "empty": (EDGE, lambda x: x.reshape(-1)[:0]),
        "zero_rows": (EDGE, lambda x: torch.zeros(0, 3, dtype=x.dtype)),
        "zero_cols": (EDGE, lambda x: torch.zeros(3, 0, dtype=x.dtype))})
    out = p.run(lambda: p.call("softmax", mixing.softmax, scores, dim=dim))
    if ok(out):
        expect_tensor(out, scores.shape, scores.dtype, p.finite)
        if p.finite and out.numel():
            w = out.double()
            assert (w >= 0).all()
            d = dim if isinstance(dim, int) else -1
            sums = w.sum(d) if out.dim() else w
            dead = (scores == -inf).all(d) if scores.dim() else scores == -inf
            tol = 2e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-4
            assert torch.allclose(sums, (~dead).double(), atol=tol), \
                "each slice must sum to 1 (0 when all scores are -inf)"


@case("mixing.check_attention_weights")
def _(data):
    mixing = _mod("mixing")
    p = Probe(data, ["weights", "atol"])
    shape = p.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple))
    w = floats(p, shape, label="scores").softmax(-1)
    atol = p.value("atol", st.sampled_from([1e-4, 1e-3, 0.5]), (-1.0, nan, "1e-4", None))
    w = p.tensor("weights", w, {
        "neg": BAD, "nan": BAD, "long": BAD, "list": BAD, "scalar": BAD,
        "double": VALID, "noncontig": VALID,
        "unnormalised": (BAD, lambda x: x * 2), "b0": EDGE,
        "empty_rows": (EDGE, lambda x: x[..., :0])})
    out = p.run(lambda: p.call("check_attention_weights", mixing.check_attention_weights,
                               w, atol=atol))
    if ok(out):
        assert out is w


@case("mixing.mix")
def _(data):
    mixing = _mod("mixing")
    p = Probe(data, ["weights", "values", "batch"])
    lead = p.draw(st.lists(st.integers(1, 3), max_size=2).map(tuple), label="lead")
    T, S, Dv = (p.draw(st.integers(1, 4), label=n) for n in "TSD")
    single = p.draw(st.booleans(), label="single query (S,)")
    w = floats(p, (S,) if single else (*lead, T, S), label="scores").softmax(-1)
    v = floats(p, (S, Dv) if single else (*lead, S, Dv), label="values")
    names = ["weights", "values"]
    w = p.tensor("weights", w, {
        "long": BAD, "list": BAD, "neg": BAD, "nan": BAD, "noncontig": VALID,
        "more_keys": (BAD, lambda x: torch.cat([x, x], -1) / 2),
        "double": (BAD, lambda x: x.double())}, names)
    v = p.tensor("values", v, {
        "long": BAD, "list": BAD, "flat": BAD, "noncontig": VALID,
        "t0": EDGE if single else (BAD, MUTATIONS["t0"]),
        "no_width": (EDGE, lambda x: x[..., :0])}, names)
    if p.hit("batch") and not single:
        w = floats(p, (3, T, S), label="scores (3)").softmax(-1)
        v = floats(p, (5, S, Dv), label="values (5)")
        p.mark(BAD, names, "weights and values batch dims do not broadcast (3 vs 5)")
    out = p.run(lambda: p.call("mix", mixing.mix, w, v))
    if ok(out):
        if w.dim() == 1:
            want = (v.shape[-1],)
        else:
            want = (*torch.broadcast_shapes(w.shape[:-2], v.shape[:-2]), w.shape[-2],
                    v.shape[-1])
        expect_tensor(out, want, v.dtype, p.finite)
