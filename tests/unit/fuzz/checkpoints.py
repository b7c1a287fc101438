"""Fuzz cases of `minitransformer.checkpoints`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import json

from hypothesis import strategies as st

from ._common import Probe, _mod, case, ok


@case("checkpoints.FORMAT", examples=1)
def _(data):
    ck = _mod("checkpoints")
    assert isinstance(ck.FORMAT, str) and ck.FORMAT.startswith("minitransformer-checkpoint")


@case("checkpoints.parse_json_object", examples=40)
def _(data):
    ck = _mod("checkpoints")
    p = Probe(data, ["text"])
    value = {"a": 1, "b": [1.5, "x"], "c": {"d": None}}
    text = p.value("text", st.sampled_from([json.dumps(value), json.dumps(value).encode()]),
                   bad=("[1, 2]", "3", "not json", "", b"\xff\xfe{}", "[" * 5000, "null"))
    out = p.run(lambda: p.call("parse_json_object", ck.parse_json_object, text, "text"))
    if ok(out):
        assert out == value, out
