"""Chapters 5-8 (multi-head attention, feed-forward, positions, masks): the statements their
pages make that a slip in prose or a figure would contradict, and the refusals that moved out
of the reader's path into folded helpers."""
import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from minitransformer.attention import attention_with_weights, scaled_dot_product_attention
from minitransformer.feedforward import FeedForward, activation
from minitransformer.masks import (causal_mask, combine_masks, decoder_mask,
                                   padding_mask_from_real)
from minitransformer.multihead import HeadProjection, MultiHeadAttention
from minitransformer.positions import RotaryEmbedding, check_positions
from conftest import notebook_cells as _cells, cell_printed as _printed

ROOT = Path(__file__).resolve().parent.parent


def raises(exc, text):
    return pytest.raises(exc, match=re.escape(text))


def _markdown(stem: str) -> str:
    cells = json.loads((ROOT / "nbs" / f"{stem}.ipynb").read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def test_our_is_causal_is_bottom_right_and_torchs_is_top_left():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 2, 5), torch.randn(2, 3, 6, 5), torch.randn(2, 3, 6, 5)
    bottom_right, top_left = causal_mask(2, 6), torch.ones(2, 6).tril().bool()
    assert torch.equal(bottom_right, torch.ones(2, 6).tril(4).bool())
    ours = scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(ours, scaled_dot_product_attention(q, k, v, bottom_right))
    explicit, _ = attention_with_weights(q, k, v, is_causal=True)
    torch.testing.assert_close(explicit, ours, atol=1e-6, rtol=1e-5)
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(theirs, scaled_dot_product_attention(q, k, v, top_left))
    assert not torch.allclose(ours, theirs), "with T < S the two alignments differ"


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


def test_activation_and_feed_forward_refuse_unknown_names_and_wrong_inputs():
    with raises(ValueError, "unknown activation 'swish'; choose from"):
        activation("swish", torch.zeros(3))
    with raises(ValueError, "unknown activation 'swish'; choose from"):
        FeedForward(12, 48, "swish")
    with raises(TypeError, "z must be a float"):
        activation("relu", torch.tensor([1]))
    torch.testing.assert_close(activation("silu", torch.ones(2)), F.silu(torch.ones(2)))
    with raises(ValueError, "d_ff must be a positive int"):
        FeedForward(12, 0)


def test_multihead_refusals_moved_to_folded_helpers():
    with raises(ValueError, "d_model (30) must be divisible by n_heads (4)"):
        MultiHeadAttention(30, 4)
    with raises(ValueError, "rotary embedding is for head_dim 8, but d_model 24 / "
                            "n_heads 4 = 6"):
        HeadProjection(24, 4, rotary=RotaryEmbedding(8))
    with raises(TypeError, "ref must be an nn.MultiheadAttention"):
        MultiHeadAttention.from_torch(torch.nn.Linear(4, 4))
    ref = torch.nn.MultiheadAttention(8, 2, add_zero_attn=True)
    with raises(ValueError, "from_torch cannot copy add_bias_kv or add_zero_attn"):
        MultiHeadAttention.from_torch(ref)


def test_rotary_and_positions_refusals_moved_to_folded_helpers():
    with raises(ValueError, "head_dim must be even, got 7"):
        RotaryEmbedding(7)
    with raises(ValueError, "positions must be (T,) or (B, T), got shape (1, 2, 3)"):
        RotaryEmbedding(4).angles(torch.zeros(1, 2, 3, dtype=torch.long))
    with raises(TypeError, "positions must be an integer tensor"):
        check_positions(torch.zeros(3), 8)
    with raises(ValueError, "positions must lie in [0, 8) (max_len=8), got values from 0 "
                            "to 9"):
        check_positions(torch.arange(10), 8)


def test_mask_refusals_moved_to_folded_helpers():
    with raises(ValueError, "a causal mask needs 1 <= T <= S"):
        causal_mask(5, 3)
    pad = torch.ones(2, 1, 1, 3, dtype=torch.bool)
    with raises(ValueError, "do not broadcast together"):
        combine_masks(pad, torch.ones(2, 2, dtype=torch.bool))
    with raises(TypeError, "mask 1 must be boolean"):
        combine_masks(pad, pad.float())
    assert combine_masks(None, None) is None
    with raises(ValueError, "attention_mask must be (B, S) = (2, 4)"):
        padding_mask_from_real(torch.ones(2, 3, dtype=torch.bool), 2, 4, "attention_mask")
    with raises(ValueError, "not both"):
        decoder_mask(1, 2, 0, torch.ones(1, 2, dtype=torch.bool),
                     torch.ones(2, 2, dtype=torch.bool))


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
    md = _markdown("05_multihead")
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
