"""Chapter 5 (multi-head attention): the reader meets the idea as a short sketch before the
package's classes, whose options belong to later chapters; the sketch computes what the
exported module computes, and the exported classes are folded."""

import re

import torch
from torch import nn

from minitransformer.attention import scaled_dot_product_attention
from minitransformer.multihead import MultiHeadAttention

from helpers import cell_source as _src, notebook_cells as _cells

EXPORT = re.compile(r"^\s*#\|\s*export", re.M)


def _sketch_cell(cells: list[dict]) -> int:
    found = [i for i, c in enumerate(cells) if c["cell_type"] == "code"
             and not EXPORT.search(_src(c)) and re.search(r"^class \w*Sketch\b", _src(c), re.M)]
    assert len(found) == 1, f"one non-exported cell defines the sketch, found {found}"
    return found[0]


def test_multihead_sketch_comes_before_the_exported_code():
    cells = _cells("05_multihead")
    at = _sketch_cell(cells)
    src = _src(cells[at])
    assert "class MultiHeadSketch(nn.Module):" in src
    assert 10 <= len(src.strip().split("\n")) <= 25, "a sketch is 10 to 25 lines"
    assert not re.search(r"\b(raise|rotary|cache|n_kv_heads|device|dtype)\b", src)
    exported = [i for i, c in enumerate(cells) if c["cell_type"] == "code"
                and EXPORT.search(_src(c)) and re.search(r"^(?:class|def) [A-Za-z]", _src(c), re.M)]
    assert exported and at < exported[0], "the sketch comes before the first exported definition"
    before = _src(cells[at - 1])
    assert cells[at - 1]["cell_type"] == "markdown" and "the idea, with nothing else" in before.lower()


def test_the_optioned_classes_are_folded_and_what_they_add_is_said():
    cells = _cells("05_multihead")
    for name in ("class HeadProjection(", "class MultiHeadAttention("):
        cell = next(c for c in cells if name in _src(c))
        assert "hide-cell" in cell["metadata"].get("tags", []), f"{name} should be folded"
    module = next(_src(c) for c in cells if c["cell_type"] == "markdown"
                  and _src(c).startswith("## The module"))
    for option in ("`rotary`", "`cache`", "`n_kv_heads`", "chapters 7 and 10", "the sketch"):
        assert option in module, option


def test_the_page_checks_the_sketch_against_the_module_and_prints_it():
    cells = _cells("05_multihead")
    at = _sketch_cell(cells)
    checks = [c for c in cells[at + 1:] if c["cell_type"] == "code"
              and "MultiHeadSketch(" in _src(c) and "MultiHeadAttention(" in _src(c)]
    assert len(checks) == 1
    printed = "".join("".join(o.get("text", "")) for o in checks[0].get("outputs", []))
    assert "sketch and MultiHeadAttention agree (within 1e-6): True" in printed, printed


def test_the_sketch_computes_what_multihead_attention_computes():
    "The sketch as the page shows it, run against the package on the chapter's case."
    cells = _cells("05_multihead")
    ns = {"nn": nn, "torch": torch, "scaled_dot_product_attention": scaled_dot_product_attention}
    exec(_src(cells[_sketch_cell(cells)]), ns)
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=16, n_heads=4, bias=False).eval()
    sketch = ns["MultiHeadSketch"](C=16, H=4)
    ours = (mha.qkv.q_proj, mha.qkv.k_proj, mha.qkv.v_proj, mha.out)
    with torch.no_grad():
        for mine, theirs in zip((sketch.q, sketch.k, sketch.v, sketch.out), ours):
            mine.weight.copy_(theirs.weight)
        x = torch.randn(3, 7, 16)
        torch.testing.assert_close(sketch(x), mha(x), atol=1e-6, rtol=1e-5)
