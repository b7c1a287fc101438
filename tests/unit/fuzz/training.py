"""Fuzz cases of `minitransformer.training`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import contextlib
import io
import math

import torch
from hypothesis import strategies as st
from torch import nn

from ._common import (
    BAD,
    EDGE,
    Probe,
    VALID,
    _mod,
    case,
    expect_tensor,
    floats,
    ids_of,
    inf,
    nan,
    ok,
)


# ================================================================== training
@case("training.SCHEDULES", examples=1)
def _(data):
    tr = _mod("training")
    assert isinstance(tr.SCHEDULES, tuple) and tr.SCHEDULES
    for s in tr.SCHEDULES:
        assert math.isfinite(tr.learning_rate(0.5, 200, 1e-3, 100, s))


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
