"""Fuzz cases of `minitransformer.data`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from ._common import BAD, EDGE, Probe, VALID, _mod, case, expect_tensor, ids_of, ok


# ================================================================== data
@case("data.char_windows", examples=40)
def _(data):
    d = _mod("data")
    p = Probe(data, ["data", "context", "batch_size", "generator"])
    N = p.draw(st.integers(2, 30), label="N")
    context = p.value("context", st.integers(1, N - 1), (0, -1, 2.5, True, None, N),
                      judge=lambda v: EDGE if v == 0 and v is not False else BAD,
                      names=["context", "data"])
    B = p.value("batch_size", st.integers(1, 4), (0, -1, 1.5, True, None),
                judge=lambda v: EDGE if v == 0 and v is not False else BAD)
    tokens = p.tensor("data", ids_of(p, (N,), 20, "data"), {
        "float": BAD, "list": BAD, "two_dims": (BAD, lambda t: t[None]), "bool": BAD,
        "noncontig": VALID, "int32": (VALID, lambda t: t.int())}, names=["data"])
    g = torch.Generator().manual_seed(0)
    if p.hit("generator"):
        g = p.draw(st.sampled_from([0, "seed"]), label="generator (corrupted)")
        p.mark(BAD, ["generator"], f"generator={g!r}")
    out = p.run(lambda: p.call("char_windows", d.char_windows, tokens, context, B, g))
    if ok(out):
        x, y = out
        expect_tensor(x, (B, context), tokens.dtype, what="inputs")
        expect_tensor(y, (B, context), tokens.dtype, what="targets")
        assert torch.equal(x[:, 1:], y[:, :-1])
        text = tokens.tolist()
        for row_x, row_y in zip(x.tolist(), y.tolist()):
            window = row_x + row_y[-1:]
            assert any(text[i:i + len(window)] == window for i in range(len(text))), \
                "a window is not a slice of data"
