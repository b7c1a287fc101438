"""Fuzz cases of `minitransformer.distributed`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from ._common import BAD, Probe, VALID, _mod, case, fmt, ok


@case("distributed.shard_batch")
def _(data):
    tr = _mod("distributed")
    p = Probe(data, ["batch", "rank", "world_size"])
    size, b = p.draw(st.integers(1, 4), label="N"), p.draw(st.integers(1, 3), label="b")
    n = p.draw(st.integers(1, 3), label="tensors")
    parts = [torch.arange(size * b * (i + 1)).reshape(size * b, i + 1) for i in range(n)]
    single = n == 1 and p.draw(st.booleans(), label="one tensor")
    batch = parts[0] if single else p.draw(st.sampled_from([tuple, list]),
                                           label="container")(parts)
    if p.hit("batch"):
        kind = p.draw(st.sampled_from(["ragged", "indivisible", "scalar", "ints",
                                       "empty", "dict"]), label="batch corruption")
        status = BAD
        if kind == "ragged":
            batch = (parts[0], torch.zeros(size * b + 1, 2))
        elif kind == "indivisible":
            batch, single = torch.zeros(size * b + 1, 2), True
            status = VALID if size == 1 else BAD  # one rank takes any batch
            parts = [batch]
            b = size * b + 1 if size == 1 else b
        else:
            batch = {"scalar": torch.tensor(3.0), "ints": [1, 2], "empty": (),
                     "dict": {"x": parts[0]}}[kind]
        p.mark(status, ["batch"], f"batch: {kind} -> {fmt(batch)}")
    world = p.value("world_size", st.just(size), (0, -1, 2.5, True, "2"))
    rank = p.value("rank", st.integers(0, size - 1), (size, -1, 0.5, True, "0"),
                   names=["rank", "world_size"])
    out = p.run(lambda: p.call("shard_batch", tr.shard_batch, batch, rank, world))
    if ok(out):
        got = (out,) if single else out
        assert isinstance(got, tuple) and len(got) == len(parts)
        for g, t in zip(got, parts):
            assert torch.equal(g, t[rank * b : (rank + 1) * b])
