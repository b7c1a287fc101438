"""Chapters 5-8 (multi-head attention, feed-forward, positions, masks): the statements their
pages make that a slip in prose or a figure would contradict."""

import json
import re

import torch

from minitransformer.feedforward import FeedForward

from helpers import cell_printed as _printed, notebook_cells as _cells

from helpers import ROOT


def _markdown(stem: str) -> str:
    cells = json.loads((ROOT / "nbs" / f"{stem}.ipynb").read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def test_no_page_calls_our_is_causal_top_left():
    svg = (ROOT / "nbs" / "figures" / "08-causal.svg").read_text(encoding="utf-8")
    assert "top-left (is_causal=True)" not in svg
    for sentence in re.split(r"(?<=[.:])\s", _markdown("08_masks") + "\n" + svg):
        if "top-left" in sentence and "is_causal=True" in sentence:
            assert re.search(r"PyTorch|scaled_dot_product_attention", sentence), sentence


def test_the_feed_forward_is_written_for_row_vectors():
    doc = FeedForward.__doc__
    assert "φ(x W1) W2" in doc and "(SiLU(x W1) ⊙ x W3) W2" in doc, doc
    assert "W2 φ(W1 x)" not in doc
    md = _markdown("06_feedforward")
    assert r"W_2^\top \phi(W_1^\top x + b_1) + b_2" in md
    assert r"W_2\,\phi(W_1 x + b_1)" not in md


def test_gelu_attributions_bert_exact_gpt2_tanh():
    source = (ROOT / "minitransformer" / "feedforward.py").read_text(encoding="utf-8")
    assert "BERT's and GPT-2's code" not in source
    md = _markdown("06_feedforward")
    assert "original code of *both* BERT and GPT-2" not in md
    assert "about 2% more" not in md and "0.78%" in md
    extra = 3 * 4096 * 11008 - 2 * 4096 * 4 * 4096  # exercise 3: SwiGLU vs a plain FFN
    assert extra == 2**20 and round(100 * extra / (2 * 4096 * 4 * 4096), 2) == 0.78


def test_nearest_distinct_sinusoidal_positions_are_printed_as_they_are():
    from minitransformer.positions import sinusoidal_positions
    pe = sinusoidal_positions(64, 32)  # the chapter's table
    dist = torch.cdist(pe.double(), pe.double())
    dist.fill_diagonal_(float("inf"))
    nearest = dist.min().item()
    assert abs(nearest - 1.1716) < 1e-3, nearest  # 2 decimals are stable: 1.17
    shown = [_printed(c) for c in _cells("07_positions") if c["cell_type"] == "code"
             and "sinusoidal_positions(64, 32)" in "".join(c["source"])]
    assert len(shown) == 1, "one cell computes the nearest pair of the 64 x 32 table"
    assert f"the two closest lie {nearest:.2f} apart" in shown[0], shown[0]
    assert "lie 1.0 apart" not in shown[0]


def test_step_counts_in_the_prose_match_the_training_code():
    cells = _cells("05_multihead")
    at = [i for i, c in enumerate(cells) if "def train_lookups" in "".join(c["source"])]
    assert len(at) == 1
    steps = re.search(r"steps: int = (\d+)", "".join(cells[at[0]]["source"])).group(1)
    before = "".join(cells[at[0] - 1]["source"])
    assert f"{steps} steps" in before, before
    md = re.sub(r"## What this idea buys.*?(?=\n## |\Z)", "", _markdown("05_multihead"),
                flags=re.S)  # (bench/ideas.py's protocol, not this chapter's training)
    for number in re.findall(r"(\d+) (?:training )?steps", md):
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        assert re.search(rf"range\({number}\)|steps: int = {number}\b", code), number


def test_multihead_prose_claims_what_the_experiment_and_the_models_show():
    md = _markdown("05_multihead")
    assert "the best it can do" not in md  # a learned outcome, not a proven optimum
    gqa = next(p for p in md.split("\n\n") if "Multi-query attention" in p)
    if "SmolLM2" in gqa:  # 135M (9 heads, 3 K/V) and 360M (15, 5) share; 1.7B (32, 32) not
        assert "SmolLM2)" not in gqa and "1.7B" in gqa, gqa


def test_every_mask_exercise_has_exactly_one_solution():
    cells = _cells("08_masks")
    starts = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
              and "".join(c["source"]).lstrip().startswith("**Exercise")]
    assert len(starts) >= 3
    for a, b in zip(starts, starts[1:] + [len(cells)]):
        block = [c for c in cells[a + 1:b] if c["cell_type"] == "markdown"
                 and not "".join(c["source"]).lstrip().startswith("## ")]
        solutions = sum("".join(c["source"]).count("{dropdown} Solution") for c in block)
        assert solutions == 1, f"{''.join(cells[a]['source'])[:30]!r}: {solutions} solutions"


def test_additive_form_blames_nan_on_a_row_with_no_allowed_key_only():
    md = _markdown("08_masks")
    assert "A blocked entry of $-\\infty$ is a known source of NaN" not in md
    assert "One $-\\infty$ in a row is harmless" in md
    assert "*everywhere*" in md
    row = torch.tensor([0.0, float("-inf"), 0.0])
    assert torch.softmax(row, -1).tolist() == [0.5, 0.0, 0.5]
    assert torch.softmax(torch.full((3,), float("-inf")), -1).isnan().all()
