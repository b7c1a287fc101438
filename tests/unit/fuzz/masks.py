"""Fuzz cases of `minitransformer.masks`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from ._common import (
    BAD,
    EDGE,
    Probe,
    VALID,
    _mod,
    _seed,
    bools,
    case,
    expect_tensor,
    ids_of,
    ok,
    pos_int,
)


# ================================================================== masks
@case("masks.causal_mask")
def _(data):
    masks = _mod("masks")
    p = Probe(data, ["T", "S"])
    T = p.value("T", st.integers(1, 6), (0, -1, 1.5, True, "3", None))
    S = p.value("S", st.one_of(st.none(), st.integers(T if isinstance(T, int) else 1, 8)),
                (0, -1, 2.5, True, "8"), names=["S", "T"])
    out = p.run(lambda: p.call("causal_mask", masks.causal_mask, T, S))
    if ok(out):
        s = T if S is None else S
        expect_tensor(out, (T, s), torch.bool)
        i, j = torch.arange(T)[:, None], torch.arange(s)[None, :]
        assert torch.equal(out, j <= s - T + i)


@case("masks.padding_mask")
def _(data):
    masks = _mod("masks")
    p = Probe(data, ["lengths", "S"])
    B = p.draw(st.integers(1, 4), label="B")
    lengths = torch.randint(0, 6, (B,), generator=_seed(p, "lengths"))
    lengths = p.tensor("lengths", lengths, {
        "float": BAD, "bool": BAD, "list": BAD, "neg": BAD, "scalar": BAD,
        "two_dims": (BAD, lambda t: t[None]), "b0": EDGE, "noncontig": VALID,
        "int32": (VALID, lambda t: t.int())})
    mx = int(lengths.max()) if isinstance(lengths, torch.Tensor) and lengths.numel() and not lengths.is_floating_point() else 0
    S = p.value("S", st.one_of(st.none(), st.integers(mx, 8)),
                (mx - 1 if mx else -1, -1, 2.5, True, "8"), names=["S", "lengths"])  # a bool is no int
    out = p.run(lambda: p.call("padding_mask", masks.padding_mask, lengths, S))
    if ok(out):
        s = mx if S is None else S
        expect_tensor(out, (lengths.shape[0], 1, 1, s), torch.bool)
        assert torch.equal(out[:, 0, 0], torch.arange(s)[None] < lengths[:, None])


@case("masks.padding_mask_from_ids")
def _(data):
    masks = _mod("masks")
    p = Probe(data, ["ids", "pad_id"])
    B, S = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, 5), label="S")
    ids = p.tensor("ids", ids_of(p, (B, S), 6), {
        "float": BAD, "bool": BAD, "list": BAD, "flat": BAD, "unsqueeze": BAD,
        "b0": EDGE, "last0": EDGE, "noncontig": VALID})
    pad_id = p.value("pad_id", st.integers(0, 5), (-1, 0.5, True, None, "0"),
                     judge=lambda v: EDGE if v == -1 and v is not True else BAD)
    out = p.run(lambda: p.call("padding_mask_from_ids", masks.padding_mask_from_ids, ids, pad_id))
    if ok(out):
        expect_tensor(out, (ids.shape[0], 1, 1, ids.shape[1]), torch.bool)
        assert torch.equal(out[:, 0, 0], ids != pad_id)


@case("masks.combine_masks")
def _(data):
    masks = _mod("masks")
    p = Probe(data, ["masks"])
    n = p.draw(st.integers(0, 3), label="number of masks")
    T, S = p.draw(st.integers(1, 4), label="T"), p.draw(st.integers(1, 4), label="S")
    shapes = [p.draw(st.sampled_from([(T, S), (1, S), (2, 1, T, S), (S,)]), label="shape")
              for _ in range(n)]
    ms = [None if p.draw(st.booleans(), label="None") else bools(p, s) for s in shapes]
    if p.hit("masks"):
        kind = p.draw(st.sampled_from(["float", "list", "shape", "additive"]))
        bad = {"float": torch.ones(T, S), "list": [[True] * S] * T,
               "shape": torch.ones(T, S + 1, dtype=torch.bool),
               "additive": torch.zeros(T, S)}[kind]
        ms.append(bad)
        # with S = 1 a (T, S + 1) mask broadcasts against every drawn shape; next to a
        # (T, S + 2) one it never does (two key sizes, both >= 2)
        ms.append(torch.ones(T, S + 2 if kind == "shape" and S == 1 else S, dtype=torch.bool))
        p.mark(BAD, ["masks", "mask"], f"masks include {kind}")
    out = p.run(lambda: p.call("combine_masks", masks.combine_masks, *ms))
    if ok(out):
        present = [m for m in ms if m is not None]
        if not present:
            assert out is None
        else:
            want = present[0]
            for m in present[1:]:
                want = want & m
            expect_tensor(out, want.shape, torch.bool)
            assert torch.equal(out, want)


@case("masks.padding_mask_from_real")
def _(data):
    masks = _mod("masks")
    p = Probe(data, ["real", "B", "S"])
    b, s = p.draw(st.integers(0, 3), label="b"), p.draw(st.integers(0, 4), label="s")
    real = p.tensor("real", bools(p, (b, s), "real"), {
        "float": BAD, "long": BAD, "list": BAD, "noncontig": VALID,
        "flat": (BAD, lambda m: m.reshape(-1)), "four_dims": (BAD, lambda m: m[:, None, None]),
        "shorter": (BAD, lambda m: m[:, :-1] if m.shape[1] else m[:, None])},
        names=["the_real", "B", "S"])
    B = p.value("B", st.one_of(st.none(), st.just(b)), (-1, 1.5, True, b + 1),
                names=["B", "the_real"])
    S = p.value("S", st.one_of(st.none(), st.just(s)), (-1, 1.5, True, s + 1),
                names=["S", "the_real"])
    out = p.run(lambda: p.call("padding_mask_from_real", masks.padding_mask_from_real,
                               real, B, S, "the_real"))
    if ok(out):
        expect_tensor(out, (real.shape[0], 1, 1, real.shape[1]), torch.bool)
        assert torch.equal(out[:, 0, 0], real)


@case("masks.additive_mask")
def _(data):
    masks = _mod("masks")
    p = Probe(data, ["mask", "dtype"])
    shape = p.draw(st.lists(st.integers(1, 3), min_size=1, max_size=4).map(tuple),
                   label="shape")
    mask = p.tensor("mask", bools(p, shape), {"float": BAD, "long": BAD, "list": BAD,
                                              "b0": VALID, "noncontig": VALID})
    dtype = p.value("dtype", st.sampled_from([torch.float32, torch.float64, torch.float16,
                                              torch.bfloat16]),
                    (torch.int64, torch.bool, "float32", None, float))
    out = p.run(lambda: p.call("additive_mask", masks.additive_mask, mask, dtype))
    if ok(out):
        expect_tensor(out, mask.shape, dtype)
        assert (out[mask] == 0).all() and (out[~mask] < -1e3).all()


@case("masks.to_torch_mask")
def _(data):
    masks = _mod("masks")
    p = Probe(data, ["mask"])
    shape = p.draw(st.lists(st.integers(1, 3), min_size=1, max_size=4).map(tuple),
                   label="shape")
    mask = p.tensor("mask", bools(p, shape), {"float": BAD, "long": BAD, "list": BAD,
                                              "b0": VALID, "noncontig": VALID})
    out = p.run(lambda: p.call("to_torch_mask", masks.to_torch_mask, mask))
    if ok(out):
        expect_tensor(out, mask.shape, torch.bool)
        assert torch.equal(out, ~mask)


@case("masks.decoder_mask", examples=40)
def _(data):
    masks = _mod("masks")
    p = Probe(data, ["B", "T", "past", "attention_mask", "full_attention_mask", "keys"])
    B = p.value("B", st.integers(1, 3), (0, -1, 1.5, True, None))
    T = p.value("T", st.integers(1, 4), (0, -1, 1.5, True, None))
    past = p.value("past", st.integers(0, 3), (-1, 1.5, True, None))
    b = B if pos_int(B) == VALID else 2
    t = T if pos_int(T) == VALID else 2
    pp = past if pos_int(past, lo=0) == VALID else 1
    # keys: a static cache's length (None: past + T); below past + T is refused
    keys = p.value("keys", st.one_of(st.none(), st.integers(pp + t, pp + t + 3)),
                   (pp + t - 1, -1, 1.5, True, "8"), names=["keys"])
    kk = keys if isinstance(keys, int) and not isinstance(keys, bool) and keys >= pp + t \
        else pp + t
    kind = p.draw(st.sampled_from(["none", "attention_mask", "full_attention_mask",
                                   "whole_attention_mask"]))
    if kind == "whole_attention_mask" and kk == pp + t:
        kind = "attention_mask"
    am = bools(p, (b, pp + t), "attention_mask") if kind == "attention_mask" else None
    if kind == "whole_attention_mask":  # (B, keys): allowed when keys > past + T
        am = bools(p, (b, kk), "attention_mask")
    fm = masks.causal_mask(t, pp + t) if kind == "full_attention_mask" else None
    if p.hit("attention_mask"):
        am = p.tensor("attention_mask", am if am is not None else bools(p, (b, pp + t)), {
            "float": BAD, "list": BAD, "shorter": (BAD, lambda m: m[:, 1:]),
            "four_dims": (BAD, lambda m: m[:, None, None, :])})
        if fm is not None:
            p.mark(BAD, ["attention_mask", "full_attention_mask"], "both masks")
    if p.hit("full_attention_mask"):
        fm = p.tensor("full_attention_mask", fm if fm is not None else masks.causal_mask(t, pp + t), {
            "float": BAD, "list": BAD, "wrong_keys": (BAD, lambda m: torch.cat([m, m], -1)),
            "batch": (BAD, lambda m: m.expand(b + 1, 1, *m.shape)),
            "five_dims": (BAD, lambda m: m.expand(1, 1, 1, *m.shape))})
        if am is not None:
            p.mark(BAD, ["attention_mask", "full_attention_mask"], "both masks")
    if p.target in ("B", "T", "past") and am is None and fm is None and p.target == "B":
        pass  # B only matters to the masks; an invalid B must still be refused
    out = p.run(lambda: p.call("decoder_mask", masks.decoder_mask, B, T, past, am, fm,
                               keys=keys))
    if ok(out) and out is None:  # nothing to mask: one new token, no padding
        assert T == 1 and am is None and fm is None and kk == past + T, \
            "None for a mask that masks"
    elif ok(out):
        expect_tensor(out, None, torch.bool)
        S = past + T
        want = torch.broadcast_shapes(out.shape, (B, 1, T, kk))
        assert tuple(want) == (B, 1, T, kk), f"mask {tuple(out.shape)} does not broadcast"
        full = torch.broadcast_to(out, (B, 1, T, kk))
        assert not full[..., S:].any(), "a key after the new tokens is not masked"
        if fm is None:
            causal = masks.causal_mask(T, S)
            real = None if am is None else am[:, :S]
            ref = causal if real is None else causal & real[:, None, None, :]
            assert torch.equal(full[..., :S], torch.broadcast_to(ref, (B, 1, T, S)))
