"""Committed outputs hold on any machine: none prints float noise.

nbval compares each cell's text output with the committed one. A value like 3.9e-07 (the gap between
two float32 computations that sum in another order) comes out as 7.2e-07 or 0.0e+00 on another CPU,
and nbval fails there. A chapter prints such a claim as a bound (``agree to 10⁻⁵``) and asserts
the value; a cell whose output legitimately varies is tagged ``nbval-ignore-output``.

What counts as noise: a number whose magnitude is below 1e-4 and not zero, in plain or scientific
notation; a float printed at full precision (7 or more significant digits, as in 0.9999999403953552);
a zero written in scientific notation outside a tensor's repr (``0.0e+00``, the way an f-string
prints a gap that happened to vanish); a negative zero (``-0.0000``: the sign of a value that rounds
to zero). Not noise: a round number (one significant digit) right after ``<``, ``≤``, ``~``, ``=``
or the words "to", "within", "below" — a bound such as ``agree to 1e-5`` or a constant such as
``eps=1e-12`` — and a zero on a line that says it is exact (the word "exact" or "exactly": such a
claim holds on every machine)."""

import json
import re

import pytest

from helpers import chapter_notebooks

_NUMBER = re.compile(r"(?<![\w.])(?P<sign>-?)(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?!\d|\.\d)")

_BOUND = re.compile(r"(?:[<≤~=]|\bto|\bwithin|\bbelow)\s*$")

_EXACT = re.compile(r"\bexact(?:ly)?\b", re.IGNORECASE)

_SCI_ZERO = re.compile(r"0(?:\.0+)?[eE][-+]?0+")

_ROUND = re.compile(r"[1-9](?:\.0*)?(?:[eE][-+]?\d+)?|0\.0*[1-9]")  # one significant digit

_TENSOR_LINE = re.compile(r"\s*(?:\(?tensor\(|\[)")  # a row of a tensor's repr


def noise_in(line: str) -> list[str]:
    "The numbers of one output line that would print differently on another CPU."
    exact, in_tensor = _EXACT.search(line), _TENSOR_LINE.match(line)
    found = []
    for m in _NUMBER.finditer(line):
        text, value = m.group("num"), float(m.group("num"))
        if _ROUND.fullmatch(text) and _BOUND.search(line[: m.start()]):
            continue  # a bound or a constant
        digits = len(re.sub(r"^[0.]+", "", text.split("e")[0].split("E")[0].replace(".", "")))
        if value == 0:
            noisy = bool(m.group("sign")) or (_SCI_ZERO.fullmatch(text) and not in_tensor)
            noisy = noisy and not exact
        else:
            noisy = value < 1e-4 or ("." in text and digits >= 7)
        if noisy:
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
    ("bit-exact: False, largest gap 3.1e-07", ["3.1e-07"]),
    ("max err=3.9e-07, gap = 2.1e-07", ["3.9e-07", "2.1e-07"]),
    ("loss fell from 2.1 to 3.9e-05", ["3.9e-05"]),
    ("largest gap over 20 steps: 7e-07", ["7e-07"]),
    ("gap 0.0000e+00", ["0.0000e+00"]),
    ("tensor([[ 0.0000e+00, -3.3895e+38],", []),
    ("took 3.2e-05s", ["3.2e-05"]),
    ("sum 0.9999999403953552, tensor(1.0000001192092896)", ["0.9999999403953552",
                                                            "1.0000001192092896"]),
    ("22,565,376 parameters; 134.5 M; cosine 1.0000", []),
    ("below 2.5e-05", ["2.5e-05"]),
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
