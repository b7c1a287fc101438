"""The fuzzing machinery shared by every module's cases: the registry (`case`), the
property a call must satisfy (`Probe`), and the drawing helpers that several modules' cases use."""

from __future__ import annotations

import importlib
import math
import os
import re
from collections import Counter

import torch
from hypothesis import note, strategies as st
from torch import nn

nan, inf = math.nan, math.inf


def _mod(name):
    "A module of the package, imported when a case runs (it may be edited meanwhile)."
    return importlib.import_module(f"minitransformer.{name}")


# ------------------------------------------------------------------ registry
REGISTRY: dict = {}  # "module.name" -> (case(data), max_examples)

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


# ================================================================== qkv, attention
MODULE_X_MUTS = {  # a float32 module's (..., T, C) input
    "long": BAD, "list": BAD, "flat": BAD, "double": BAD, "half": BAD,
    "noncontig": VALID, "b0": EDGE, "t0": EDGE,
    "wider": (BAD, lambda x: torch.cat([x, x[..., :1]], -1)),
}

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


def _rotary(p, D, max_len=16):
    pos = _mod("positions")
    if not p.draw(st.booleans(), label="rotary"):
        return None
    return pos.RotaryEmbedding(D, max_len=max_len)


# config fields: a valid strategy, corrupt values, and a judge(value, kwargs) -> status
BOOLS_BAD = ("no", None, 2, 0.0)


def _bool_field():
    return (st.booleans(), BOOLS_BAD, lambda v, kw: VALID if isinstance(v, bool) else BAD)


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


INT_BAD = (1.5, True, "5", None, nan)
