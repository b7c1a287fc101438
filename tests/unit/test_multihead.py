"""minitransformer.multihead: grouped-query attention equals the explicit repeat and torch's
attention, key/value weights shrink with the group, `from_torch` refuses what it cannot copy, and
the refusals of the folded helpers."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minitransformer import attention
from minitransformer.masks import causal_mask, combine_masks, padding_mask_from_ids, to_torch_mask
from minitransformer.multihead import HeadProjection, MultiHeadAttention, merge_heads, repeat_kv
from minitransformer.positions import RotaryEmbedding

from helpers import SEEDS, raises, sizes


@pytest.mark.gpu
def test_from_torch_refuses_what_it_cannot_copy():
    from torch import nn
    from minitransformer.multihead import MultiHeadAttention
    with pytest.raises(ValueError, match="add_bias_kv or add_zero_attn"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(TypeError, match="ref must be an nn.MultiheadAttention"):
        MultiHeadAttention.from_torch(nn.Linear(8, 8))


HAS_ENABLE_GQA = attention._SDPA_GQA  # torch >= 2.5: F.sdpa takes enable_gqa


@pytest.mark.parametrize("n_heads, n_kv_heads", [(6, 6), (6, 3), (6, 2), (6, 1)])
def test_attention_matches_an_explicit_repeat_and_torch(n_heads, n_kv_heads):
    torch.manual_seed(0)
    mha = MultiHeadAttention(36, n_heads, n_kv_heads=n_kv_heads).eval()
    x = torch.randn(3, 7, 36)
    with torch.no_grad():
        q, k, v = mha.project(x)
        assert k.shape == v.shape == (3, n_kv_heads, 7, 36 // n_heads)
        g = n_heads // n_kv_heads
        ours = mha(x, mask=causal_mask(7))
        explicit = mha.out(merge_heads(F.scaled_dot_product_attention(
            q, repeat_kv(k, g), repeat_kv(v, g), is_causal=True)))
        torch.testing.assert_close(ours, explicit, atol=1e-6, rtol=0)
        if HAS_ENABLE_GQA:
            fused = mha.out(merge_heads(F.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=True)))
            torch.testing.assert_close(ours, fused, atol=1e-6, rtol=0)
        slow, w = mha.forward_with_weights(x, mask=causal_mask(7))
        torch.testing.assert_close(ours, slow, atol=1e-6, rtol=0)
        assert w.shape == (3, n_heads, 7, 7)


def test_kv_weights_shrink_with_the_group():
    full = MultiHeadAttention(48, 8, bias=False)
    grouped = MultiHeadAttention(48, 8, bias=False, n_kv_heads=2)
    assert grouped.qkv.k_proj.weight.shape == (12, 48)  # 2 heads x 6
    assert full.qkv.k_proj.weight.numel() == 4 * grouped.qkv.k_proj.weight.numel()
    assert "n_kv_heads=2" in repr(grouped)


@pytest.mark.parametrize("fused", [True, False])
def test_attention_with_grouped_heads_equals_the_explicit_repeat(monkeypatch, fused):
    "enable_gqa: torch's kernel (>= 2.5) or the repeat fallback, masked or not."
    monkeypatch.setattr(attention, "_SDPA_GQA", fused and attention._SDPA_GQA)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 5, 8, generator=g)
    k, v = torch.randn(2, 2, 7, 8, generator=g), torch.randn(2, 2, 7, 8, generator=g)
    mask = torch.rand(2, 1, 5, 7, generator=g) < 0.7
    mask[0, 0, 1] = False  # a query that may see nothing outputs zeros
    for m in (None, mask):
        got = attention.scaled_dot_product_attention(q, k, v, m, enable_gqa=True)
        want, _ = attention.attention_with_weights(q, repeat_kv(k, 3), repeat_kv(v, 3), m)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert got[0, :, 1].abs().max() == 0


@pytest.mark.parametrize("seed", SEEDS)
def test_matches_torch_multihead_with_converted_masks(seed):
    g, B, T, H, D = sizes(seed)
    C = H * D
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(C, H, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(ref)
    ids = torch.randint(1, 9, (B, T), generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    ids[torch.arange(T)[None] >= lengths[:, None]] = 0  # right padding with pad id 0
    pad = padding_mask_from_ids(ids, pad_id=0)
    x = torch.randn(B, T, C, generator=g)
    with torch.no_grad():
        y_ref, w_ref = ref(x, x, x, attn_mask=to_torch_mask(causal_mask(T)), key_padding_mask=to_torch_mask(pad[:, 0, 0]),
                           need_weights=True, average_attn_weights=False)
        y, w = ours.forward_with_weights(x, mask=combine_masks(pad, causal_mask(T)))
    assert torch.allclose(y, y_ref, atol=1e-5) and torch.allclose(w, w_ref, atol=1e-5)


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
