"""Committed outputs hold on any machine: none prints float noise.

nbval compares each cell's text output with the committed one. A value like 3.9e-07 (the gap between
two float32 computations that sum in another order) comes out as 7.2e-07 or 0.0e+00 on another CPU,
and nbval fails there. A chapter prints such a claim as a bound (``below 1e-5``) and asserts the
value; a cell whose output legitimately varies is tagged ``nbval-ignore-output``.

What counts as noise: a number whose magnitude is below 1e-4 and not zero, in plain or scientific
notation; a zero written in a float format's scientific notation (``0.0e+00``, the way an
f-string prints a gap that happened to vanish); a negative zero (``-0.0000``: the sign of a value
that rounds to zero). Not noise: a number right after ``<``, ``≤``, ``~``, ``=`` or the words "to",
"within", "below" (a bound or a constant such as ``eps=1e-12``), and any number on a line that
says it is exact (the word "exact" or "exactly": such a claim holds on every machine).
"""
import json
import re

import pytest

from conftest import chapter_notebooks

_NUMBER = re.compile(r"(?<![\w.])(?P<sign>-?)(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?!\w|\.\d)")
_BOUND = re.compile(r"(?:[<≤~=]|\bto|\bwithin|\bbelow)\s*$")
_EXACT = re.compile(r"\bexact(?:ly)?\b", re.IGNORECASE)
_SCI_ZERO = re.compile(r"0(?:\.0{1,3})?[eE][-+]?0+")


def noise_in(line: str) -> list[str]:
    "The numbers of one output line that would print differently on another CPU."
    if _EXACT.search(line):
        return []
    found = []
    for m in _NUMBER.finditer(line):
        if _BOUND.search(line[: m.start()]):
            continue
        text, value = m.group("num"), float(m.group("num"))
        if 0 < value < 1e-4 or (value == 0 and (_SCI_ZERO.fullmatch(text) or m.group("sign"))):
            found.append(m.group(0))
    return found


def output_text(cell: dict) -> str:
    "What nbval compares for a code cell: its streams and plain-text results."
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append("".join(out.get("text", "")))
        else:
            parts.append("".join(out.get("data", {}).get("text/plain", "")))
    return "".join(parts)


@pytest.mark.parametrize("line, noise", [
    ("largest difference: 3.9e-07", ["3.9e-07"]),
    ("moves the vectors by at most 0.0e+00", ["0.0e+00"]),
    ("gap 0.000012 after 20 steps", ["0.000012"]),
    ("tensor([ 0.1824, -0.0000,  0.8176])", ["-0.0000"]),
    ("largest gap: below 1e-5 (sums in another order differ by ~1e-6)", []),
    ("agree to 1e-5: True", []),
    ("norm_eps=1e-12, dropout=0.0", []),
    ("resumed bit-exact: 0.0e+00", []),
    ("tensor([[0.1824, 0.0000, 0.8176],", []),
    ("losses 4.408 3.896, lr 3e-3, torch 2.13.0, 1e-4", []),
])
def test_detector(line, noise):
    "The detector flags float noise and lets bounds, constants, rounded values and exact claims pass."
    assert noise_in(line) == noise


@pytest.mark.parametrize("path", chapter_notebooks(), ids=lambda p: p.name)
def test_outputs_print_no_float_noise(path):
    cells = [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    bad = []
    for i, cell in enumerate(cells):  # nbval's numbering: code cells only
        if {"nbval-ignore-output", "nbval-skip"} & set(cell.get("metadata", {}).get("tags", [])):
            continue
        bad += [f"cell {i}: {line.strip()!r} prints {noise}" for line in output_text(cell).splitlines()
                if (noise := noise_in(line))]
    assert not bad, ("outputs that another CPU prints differently (print a bound and assert the value, "
                     "or tag the cell nbval-ignore-output where the value itself varies):\n" + "\n".join(bad))
