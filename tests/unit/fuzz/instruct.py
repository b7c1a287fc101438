"""Fuzz cases of `minitransformer.instruct`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from ._common import INT_BAD, Probe, _mod, case, expect_tensor, inf, nan, ok


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
