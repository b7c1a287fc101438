"""Fuzz cases of `minitransformer.checks`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch import nn

from ._common import (
    BAD,
    EDGE,
    Probe,
    VALID,
    _mod,
    bools,
    case,
    fmt,
    inf,
    is_finite_number,
    nan,
    number_in,
    ok,
    pos_int,
)


@case("checks.shape_str")
def _(data):
    core = _mod("checks")
    p = Probe(data, ["x"])
    shape = p.draw(st.lists(st.integers(0, 4), max_size=4).map(tuple), label="shape")
    x = p.tensor("x", torch.zeros(shape), {"list": BAD, "noncontig": VALID,
                                           "scalar0": (BAD, lambda t: 3.0),
                                           "size": (BAD, lambda t: t.shape)})
    out = p.run(lambda: p.call("shape_str", core.shape_str, x))
    if ok(out):
        assert out == str(tuple(x.shape))


@case("checks.check_tensor")
def _(data):
    core = _mod("checks")
    p = Probe(data, ["x", "min_dim"])
    shape = p.draw(st.lists(st.integers(0, 3), max_size=3).map(tuple), label="shape")
    dtype = p.draw(st.sampled_from([torch.float32, torch.int64, torch.bool, torch.float16]))
    min_dim = p.value("min_dim", st.integers(0, 4), ("1", None, 1.5, -1),
                      judge=lambda v: EDGE if v == -1 else BAD, names=["min_dim", "probe"])
    floating = p.draw(st.booleans(), label="floating")
    x = p.tensor("x", torch.zeros(shape, dtype=dtype), {"list": BAD, "noncontig": VALID,
                                                        "number": (BAD, lambda t: 1.0)},
                 names=["probe", "x"])
    if p.status == VALID and (x.dim() < min_dim or (floating and not x.is_floating_point())):
        p.mark(BAD, ["probe"], f"x {fmt(x)} fails min_dim={min_dim} floating={floating}")
    out = p.run(lambda: p.call("check_tensor", core.check_tensor, x, "probe",
                               min_dim=min_dim, floating=floating))
    if ok(out):
        assert out is x


def _torch_broadcast(shapes):
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        return None


@case("checks.broadcast_shape")
def _(data):
    core = _mod("checks")
    p = Probe(data, ["shapes"])
    dims = st.lists(st.sampled_from([1, 2, 3, 0]), max_size=3).map(tuple)
    shapes = p.draw(st.lists(dims, max_size=3), label="shapes")
    if p.hit("shapes"):
        kind = p.draw(st.sampled_from(["int", "none", "negative", "list", "size"]))
        bad = {"int": 5, "none": None, "negative": (2, -1), "list": [2, 3],
               "size": torch.Size([2, 3])}[kind]
        shapes = shapes + [bad]
        p.mark(VALID if kind in ("list", "size") else BAD, ["shapes", "shape"],
               f"shapes includes {bad!r}")
    out = p.run(lambda: p.call("broadcast_shape", core.broadcast_shape, *shapes))
    if ok(out):
        assert out == _torch_broadcast([tuple(s) for s in shapes]), \
            f"broadcast_shape{tuple(shapes)} = {out}, torch says {_torch_broadcast(shapes)}"


ANY_VALUE = st.one_of(st.integers(-3, 5), st.integers(-2**70, 2**70), st.booleans(),
                      st.floats(-2, 3), st.sampled_from([nan, inf, -inf, 0.0, 1.0, 0.5]),
                      st.none(), st.sampled_from(["1", "0.5", b"1"]))


@case("checks.check_positive_int")
def _(data):
    core = _mod("checks")
    p = Probe(data)
    value = p.draw(ANY_VALUE, label="value")
    if pos_int(value) == BAD:
        p.mark(BAD, ["n_things"], f"value={value!r}", is_finite_number(value))
    out = p.run(lambda: p.call("check_positive_int", core.check_positive_int, value,
                               "n_things"))
    if ok(out):
        assert type(out) is int and out == value


@case("checks.check_int")
def _(data):
    core = _mod("checks")
    p = Probe(data)
    value = p.draw(ANY_VALUE, label="value")
    minimum = p.draw(st.one_of(st.none(), st.integers(-3, 3)), label="minimum")
    if pos_int(value, lo=-inf if minimum is None else minimum) == BAD:
        p.mark(BAD, ["n_things"], f"value={value!r}", is_finite_number(value))
    out = p.run(lambda: p.call("check_int", core.check_int, value, "n_things",
                               minimum=minimum))
    if ok(out):
        assert type(out) is int and out == value


@case("checks.check_number")
def _(data):
    core = _mod("checks")
    p = Probe(data)
    value = p.draw(ANY_VALUE, label="value")
    low = p.draw(st.one_of(st.none(), st.sampled_from([0, 0.0, -1.0, 1])), label="low")
    high = p.draw(st.one_of(st.none(), st.sampled_from([1, 1.0, 2.5, 10**30])), label="high")
    lo_open, hi_open = p.draw(st.booleans(), label="low_open"), p.draw(st.booleans(), label="high_open")
    status = number_in(value, -inf if low is None else low, inf if high is None else high,
                       lo_open=lo_open and low is not None, hi_open=hi_open and high is not None)
    p.mark(status, ["x_thing"], f"value={value!r}", is_finite_number(value))
    out = p.run(lambda: p.call("check_number", core.check_number, value, "x_thing", low=low,
                               high=high, low_open=lo_open, high_open=hi_open))
    if ok(out):  # "as a plain float": an int above 2**53 may round
        assert type(out) is float and out == float(value)


@case("checks.check_choice")
def _(data):
    core = _mod("checks")
    p = Probe(data)
    choices = p.draw(st.lists(st.sampled_from(["relu", "gelu", "cls", ""]), min_size=1,
                              max_size=3, unique=True).map(tuple), label="choices")
    value = p.draw(st.one_of(st.sampled_from(["relu", "gelu", "cls", "", "RELU", "relu "]),
                             st.none(), st.integers(0, 2), st.just(("relu",))), label="value")
    if not (isinstance(value, str) and value in choices):
        p.mark(BAD, ["kind_thing"], f"value={value!r}")
    out = p.run(lambda: p.call("check_choice", core.check_choice, value, "kind_thing", choices))
    if ok(out):
        assert out == value


@case("checks.check_flag")
def _(data):
    core = _mod("checks")
    p = Probe(data)
    value = p.draw(st.one_of(st.booleans(), ANY_VALUE), label="value")
    if not isinstance(value, bool):
        p.mark(BAD, ["flag_thing"], f"value={value!r}", is_finite_number(value))
    out = p.run(lambda: p.call("check_flag", core.check_flag, value, "flag_thing"))
    if ok(out):
        assert out is value


@case("checks.check_str")
def _(data):
    core = _mod("checks")
    p = Probe(data)
    value = p.draw(st.one_of(st.text(max_size=8), ANY_VALUE), label="value")
    if not isinstance(value, str):
        p.mark(BAD, ["str_thing"], f"value={value!r}", is_finite_number(value))
    out = p.run(lambda: p.call("check_str", core.check_str, value, "str_thing"))
    if ok(out):
        assert out is value


def _probability_case(data, fn_name, allow_one_default=True):
    core = _mod("checks")
    p = Probe(data)
    value = p.draw(ANY_VALUE, label="value")
    kw = {}
    if fn_name == "check_probability":
        kw = dict(allow_zero=p.draw(st.booleans(), label="allow_zero"),
                  allow_one=p.draw(st.booleans(), label="allow_one"))
    zero_ok, one_ok = kw.get("allow_zero", True), kw.get("allow_one", allow_one_default)
    status = number_in(value, 0, 1, lo_open=not zero_ok, hi_open=not one_ok)
    p.mark(status, ["p_thing"], f"value={value!r}", is_finite_number(value))
    out = p.run(lambda: p.call(fn_name, getattr(core, fn_name), value, "p_thing", **kw))
    if ok(out):
        assert type(out) is float and out == value


@case("checks.check_probability")
def _(data):
    _probability_case(data, "check_probability")


@case("checks.check_dropout")
def _(data):
    _probability_case(data, "check_dropout", allow_one_default=False)


@case("checks.check_bool_mask")
def _(data):
    core = _mod("checks")
    p = Probe(data, ["mask"])
    shape = p.draw(st.lists(st.integers(0, 3), max_size=4).map(tuple), label="shape")
    mask = p.tensor("mask", bools(p, shape), {"float": BAD, "long": BAD, "list": BAD,
                                              "uint8": (BAD, lambda m: m.to(torch.uint8)),
                                              "noncontig": VALID}, names=["the_mask", "mask"])
    out = p.run(lambda: p.call("check_bool_mask", core.check_bool_mask, mask, "the_mask"))
    if ok(out):
        assert out is mask


@case("checks.is_integer_tensor")
def _(data):
    core = _mod("checks")
    p = Probe(data, ["t"])
    dtype = p.draw(st.sampled_from([torch.int64, torch.int32, torch.uint8, torch.float32,
                                    torch.float16, torch.bool, torch.complex64]))
    t = p.tensor("t", torch.zeros(2, dtype=dtype), {"list": BAD, "noncontig": VALID},
                 names=["t", "tensor"])
    out = p.run(lambda: p.call("is_integer_tensor", core.is_integer_tensor, t))
    if ok(out):
        assert out is (dtype in (torch.int64, torch.int32, torch.uint8))


@case("checks.check_float_dtype")
def _(data):
    core = _mod("checks")
    p = Probe(data)
    dtype = p.draw(st.sampled_from([None, torch.float32, torch.bfloat16, torch.float64,
                                    torch.int64, torch.bool, "float32", float]), label="dtype")
    if not (dtype is None or isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        p.mark(BAD, ["dtype_thing"], f"dtype={dtype!r}")
    p.run(lambda: p.call("check_float_dtype", core.check_float_dtype, dtype, "dtype_thing"))


@case("checks.check_dtype")
def _(data):
    core = _mod("checks")
    p = Probe(data, ["t"])
    want = p.draw(st.sampled_from([torch.float32, torch.bfloat16]), label="dtype")
    t = p.tensor("t", torch.zeros(2, 3, dtype=want), {"double": BAD, "half": BAD,
                                                       "noncontig": VALID},
                 names=["the_input"])
    out = p.run(lambda: p.call("check_dtype", core.check_dtype, t, "the_input", want,
                               "the weights"))
    if ok(out):
        assert out is t


@case("checks.check_module")
def _(data):
    core = _mod("checks")
    p = Probe(data)
    value = p.draw(st.sampled_from(["linear", "sequential", "class", "None", "string",
                                    "tensor"]), label="value")
    value = {"linear": nn.Linear(2, 2), "sequential": nn.Sequential(), "class": nn.Linear,
             "None": None, "string": "gpt2", "tensor": torch.zeros(2)}[value]
    if not isinstance(value, nn.Module):
        p.mark(BAD, ["the_model"], f"value={fmt(value)}")
    out = p.run(lambda: p.call("check_module", core.check_module, value, "the_model"))
    if ok(out):
        assert out is value
