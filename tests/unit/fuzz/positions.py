"""Fuzz cases of `minitransformer.positions`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from ._common import (
    BAD,
    EDGE,
    MUTATIONS,
    POS_INT_BAD,
    Probe,
    VALID,
    _mod,
    _seed,
    case,
    expect_tensor,
    floats,
    inf,
    nan,
    ok,
    pos_int,
)

# ================================================================== positions
BASE_BAD = (0.0, -10.0, nan, inf, "10000", None, True)


@case("positions.sinusoidal_positions")
def _(data):
    pos = _mod("positions")
    p = Probe(data, ["n_positions", "d_model", "base"])
    N = p.value("n_positions", st.integers(1, 8), POS_INT_BAD)
    C = p.value("d_model", st.integers(1, 8), POS_INT_BAD)
    base = p.value("base", st.sampled_from([10000.0, 2.0, 100, 1e5]), BASE_BAD)
    out = p.run(lambda: p.call("sinusoidal_positions", pos.sinusoidal_positions, N, C, base))
    if ok(out):
        expect_tensor(out, (N, C), torch.float32)
        assert out.abs().max() <= 1 + 1e-6
        assert torch.allclose(out[0, 0::2], torch.zeros(1)) and torch.allclose(out[0, 1::2], torch.ones(1))


def _positions_arg(p, T, max_len, batch=None, name="positions", table=True):
    "`table`: positions index a table of max_len rows; else a formula serves any integer."
    positions = torch.randint(0, max_len, (T,), generator=_seed(p, name))
    if batch and p.draw(st.booleans(), label="per-row positions"):
        positions = positions.expand(batch, T)
    out_of_range = BAD if table else VALID
    return p.tensor(name, positions, {
        "float": BAD, "bool": BAD, "list": BAD, "neg": out_of_range,
        "too_far": (out_of_range, lambda t: t + max_len), "noncontig": VALID,
        "int32": (VALID, lambda t: t.int()), "last0": EDGE}, names=[name, "max_len"])


@case("positions.SinusoidalPositions")
def _(data):
    pos = _mod("positions")
    p = Probe(data, ["d_model", "max_len", "base"])  # trusts positions
    C = p.value("d_model", st.integers(1, 8), POS_INT_BAD)
    L = p.value("max_len", st.integers(1, 12), POS_INT_BAD)
    base = p.value("base", st.sampled_from([10000.0, 2.0]), BASE_BAD)
    T = p.draw(st.integers(1, 5), label="T")
    positions = _positions_arg(p, T, L if pos_int(L) == VALID else 4, batch=2,
                               table=False)

    def go():
        m = p.call("SinusoidalPositions", pos.SinusoidalPositions, C, L, base)
        return p.call("forward", m, positions)
    out = p.run(go)
    if ok(out):
        expect_tensor(out, (*positions.shape, C), torch.float32, p.finite)


@case("positions.LearnedPositions")
def _(data):
    pos = _mod("positions")
    p = Probe(data, ["d_model", "max_len", "init_std", "dtype"])  # trusts positions
    C = p.value("d_model", st.integers(1, 8), POS_INT_BAD)
    L = p.value("max_len", st.integers(1, 12), POS_INT_BAD)
    init_std = p.value("init_std", st.sampled_from([0.02, 1.0, 0.0]),
                       (-1.0, nan, inf, "0.02", None),
                       judge=lambda v: EDGE if v == -1.0 else BAD)
    dtype = p.value("dtype", st.just(None), (torch.int64, "float32", torch.bool))
    T = p.draw(st.integers(1, 5), label="T")
    positions = _positions_arg(p, T, L if pos_int(L) == VALID else 4, batch=2)

    def go():
        m = p.call("LearnedPositions", pos.LearnedPositions, C, L, init_std, dtype=dtype)
        return p.call("forward", m, positions)
    out = p.run(go)
    if ok(out):
        expect_tensor(out, (*positions.shape, C), torch.float32, p.finite)


@case("positions.check_positions")
def _(data):
    pos = _mod("positions")
    p = Probe(data, ["max_len", "positions"])
    L = p.value("max_len", st.integers(1, 12), POS_INT_BAD)
    T = p.draw(st.integers(0, 5), label="T")
    positions = _positions_arg(p, T, L if pos_int(L) == VALID else 4, batch=2)
    out = p.run(lambda: p.call("check_positions", pos.check_positions, positions, L))
    if ok(out):
        assert out is positions


@case("positions.RotaryEmbedding", examples=50)
def _(data):
    pos = _mod("positions")
    p = Probe(data, ["head_dim", "max_len", "base"])  # trusts x, positions, angles
    D = p.value("head_dim", st.sampled_from([2, 4, 6, 8]), (0, 3, -2, 4.0, True, "4", None))
    L = p.value("max_len", st.integers(1, 12), POS_INT_BAD)
    base = p.value("base", st.sampled_from([10000.0, 2.0]), BASE_BAD)
    interleaved = p.draw(st.booleans(), label="interleaved")
    dd = D if pos_int(D) == VALID and D % 2 == 0 else 4
    ll = L if pos_int(L) == VALID else 4
    B, H, T = (p.draw(st.integers(1, 3), label=n) for n in "BHT")
    four = p.draw(st.booleans(), label="(B, H, T, D) rather than (T, D)")
    positions = torch.randint(0, ll, (T,), generator=_seed(p, "positions"))
    if four and p.draw(st.booleans(), label="per-row positions"):
        positions = positions.expand(B, T)
    positions = p.tensor("positions", positions, {
        "float": BAD, "list": BAD, "neg": BAD, "too_far": (BAD, lambda t: t + ll),
        "longer": (BAD, lambda t: torch.cat([t, t], -1)),
        "batch": (BAD, lambda t: t.expand(B + 1, T) if t.dim() == 1 else torch.cat([t, t[:1]])),
        "noncontig": VALID}, names=["positions", "max_len", "x"])
    x = floats(p, (B, H, T, dd) if four else (T, dd))
    x = p.tensor("x", x, {"long": BAD, "list": BAD, "flat": BAD, "double": VALID,
                          "bfloat16": VALID, "noncontig": VALID,
                          "wider": (BAD, lambda t: torch.cat([t, t[..., :2]], -1)),
                          "b0": EDGE if four else (BAD, MUTATIONS["b0"])},
                 names=["x", "head_dim", "positions"])
    bad_angles = None
    if p.hit("angles"):
        bad_angles = p.draw(st.sampled_from(["positions", "cos only", "mismatched shapes",
                                             "too wide"]))
        p.mark(BAD, ["angles"], f"angles given as {bad_angles}")

    def go():
        m = p.call("RotaryEmbedding", pos.RotaryEmbedding, D, L, base, interleaved)
        y = p.call("forward", m, x, positions)
        ang = p.call("angles", m.angles, positions)
        if bad_angles is not None:
            ang = {"positions": positions, "cos only": ang[0],  # (width D/2 vs D: never equal)
                   "mismatched shapes": (ang[0], torch.cat([ang[1], ang[1]], -1)),
                   "too wide": (torch.cat([ang[0], ang[0]], -1),
                                torch.cat([ang[1], ang[1]], -1))}[bad_angles]
        z = p.call("rotate", m.rotate, x, ang)
        return y, z, repr(m)
    out = p.run(go)
    if ok(out):
        y, z, _ = out
        expect_tensor(y, x.shape, x.dtype, p.finite)
        assert torch.equal(y, z)
        if p.finite and x.dtype == torch.float32:  # a rotation keeps each vector's length
            assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-4, atol=1e-3)
