"""Fuzz cases of `minitransformer.dates`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""


from __future__ import annotations

import datetime as dt
import random
import re
import string

import torch
from hypothesis import strategies as st

from ._common import BAD, EDGE, INT_BAD, Probe, _mod, case, expect_tensor, ok


# ================================================================== dates
def _names_constant(name, n, first):
    value = getattr(_mod("dates"), name)
    assert len(value) == n and value[0] == first and len(set(value)) == n
    assert isinstance(value, tuple), \
        f"{name} is a mutable {type(value).__name__}; a public constant should be a tuple"


@case("dates.MONTHS", examples=1)
def _(data):
    _names_constant("MONTHS", 12, "January")


@case("dates.WEEKDAYS", examples=1)
def _(data):
    _names_constant("WEEKDAYS", 7, "Monday")


@case("dates.CASES", examples=1)
def _(data):
    d = _mod("dates")
    assert isinstance(d.CASES, tuple) and "as written" in d.CASES
    for c in d.CASES:
        d.write_date(dt.date(2000, 1, 2), "dotted", c)


@case("dates.FIRST_DAY", "dates.LAST_DAY", examples=1)
def _(data):
    d = _mod("dates")
    assert isinstance(d.FIRST_DAY, dt.date) and isinstance(d.LAST_DAY, dt.date)
    assert d.FIRST_DAY < d.LAST_DAY


@case("dates.DATE_FORMATS")
def _(data):
    d = _mod("dates")
    assert isinstance(d.DATE_FORMATS, dict) and d.DATE_FORMATS
    day = data.draw(st.dates(d.FIRST_DAY, d.LAST_DAY), label="day")
    for name, f in d.DATE_FORMATS.items():
        text = f(day)
        assert isinstance(text, str) and text, name
        assert set(text) <= set(d.DateTask.source_chars), f"{name}: {text!r} has characters outside DateTask.source_chars"


@case("dates.number_words")
def _(data):
    d = _mod("dates")
    p = Probe(data, ["n"])
    n = p.value("n", st.integers(0, 99), (-1, 100) + INT_BAD)
    out = p.run(lambda: p.call("number_words", d.number_words, n))
    if ok(out):
        assert isinstance(out, str) and re.fullmatch(r"[a-z]+(-[a-z]+)?", out)


@case("dates.ordinal_words")
def _(data):
    d = _mod("dates")
    p = Probe(data, ["n"])
    n = p.value("n", st.integers(1, 99), (0, -1, 100) + INT_BAD)
    out = p.run(lambda: p.call("ordinal_words", d.ordinal_words, n))
    if ok(out):
        assert isinstance(out, str) and re.fullmatch(r"([a-z]+-)?[a-z]+(st|nd|rd|th)", out), out


def _suffix(n):
    n = abs(n)
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


@case("dates.ordinal_suffix")
def _(data):
    d = _mod("dates")
    p = Probe(data, ["n"])
    n = p.value("n", st.integers(0, 10**6), (-1, -11, -22) + INT_BAD,
                judge=lambda v: EDGE if isinstance(v, int) and not isinstance(v, bool) else BAD)
    out = p.run(lambda: p.call("ordinal_suffix", d.ordinal_suffix, n))
    if ok(out):
        assert out == f"{n}{_suffix(n)}", f"ordinal_suffix({n}) = {out!r}"


@case("dates.year_words")
def _(data):
    d = _mod("dates")
    p = Probe(data, ["y"])
    y = p.value("y", st.integers(1000, 2999), (999, 3000, -1, 1999.5) + INT_BAD)
    out = p.run(lambda: p.call("year_words", d.year_words, y))
    if ok(out):
        assert isinstance(out, str) and re.fullmatch(r"[a-z -]+", out)


@case("dates.write_date")
def _(data):
    d = _mod("dates")
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


@case("dates.DateTask", examples=25)
def _(data):
    d, model = _mod("dates"), _mod("model")
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
