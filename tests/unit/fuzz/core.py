"""Fuzz cases of `minitransformer.core`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import random

import torch
from hypothesis import strategies as st

from ._common import Probe, _mod, case, nan, ok, pos_int


# ================================================================== core
@case("core.default_device", examples=2)
def _(data):
    core = _mod("core")
    p = Probe(data)
    d = p.run(lambda: p.call("default_device", core.default_device))
    assert isinstance(d, torch.device)
    torch.empty(1, device=d)  # usable


@case("core.seed_everything")
def _(data):
    core = _mod("core")
    p = Probe(data, ["seed"])
    seed = p.value("seed", st.one_of(st.integers(0, 2**31), st.integers(0, 2**80)),
                   (-1, 2.5, True, "3", None, nan, 2**64, 2**70), judge=pos_int_0)

    def go():
        p.call("seed_everything", core.seed_everything, seed)
        a = (random.random(), torch.rand(3))
        core.seed_everything(seed)
        return a, (random.random(), torch.rand(3))
    out = p.run(go)
    if ok(out):
        (r1, t1), (r2, t2) = out
        assert r1 == r2 and torch.equal(t1, t2), "seeding twice did not repeat the draws"


def pos_int_0(v):
    return pos_int(v, lo=0)
