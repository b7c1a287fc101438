"""Grouped-query and multi-query attention: `n_kv_heads` through attention, configs, caches."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from minitransformer import attention
from minitransformer.generation import generate
from minitransformer.masks import causal_mask
from minitransformer.model import GPT, GPTConfig, Transformer, TransformerConfig
from minitransformer.multihead import MultiHeadAttention, merge_heads, repeat_kv
from minitransformer.checkpoints import load_checkpoint, save_checkpoint

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


@pytest.mark.parametrize("encoding", ["rotary", "learned"])
def test_a_grouped_gpt_decodes_the_same_with_and_without_its_smaller_cache(encoding):
    torch.manual_seed(1)
    cfg = GPTConfig(vocab_size=30, max_len=40, d_model=48, n_heads=6, n_kv_heads=2,
                    n_layers=2, position_encoding=encoding, activation="swiglu",
                    norm="rmsnorm", bias=False)
    model = GPT(cfg).eval()
    cache = model.make_cache(2)
    assert cache.self_attn[0].k.shape == (2, 2, 40, 8)  # only the 2 K/V heads
    assert cache.nbytes == 2 * 2 * 2 * 2 * 40 * 8 * 4
    prompts = [[3, 4, 5, 6], [7, 8]]
    cached = generate(model, prompts, 12)
    assert cached == generate(model, prompts, 12, use_cache=False)
    alone = [generate(model, [p], 12)[0] for p in prompts]
    assert cached == alone


def test_a_grouped_encoder_decoder_caches_grouped_cross_attention():
    torch.manual_seed(2)
    cfg = TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, max_len=32,
                            d_model=32, n_heads=4, n_kv_heads=1)
    model = Transformer(cfg).eval()
    src = [[3, 4, 5, 6, 7], [8, 9, 10]]
    cached = generate(model, [[1], [1]], 8, source=src)
    assert cached == generate(model, [[1], [1]], 8, source=src, use_cache=False)
    memory, _ = model.encode(torch.tensor([[3, 4, 5]]))
    assert model.make_cache(memory).cross_attn[0].k.shape[1] == 1


@pytest.mark.parametrize("bad", [4, 5, 0, -1, 2.0, True])
def test_n_kv_heads_must_divide_n_heads(bad):
    with pytest.raises(ValueError, match="n_kv_heads"):
        GPTConfig(vocab_size=10, d_model=48, n_heads=6, n_kv_heads=bad)
    with pytest.raises(ValueError, match="n_kv_heads"):
        MultiHeadAttention(48, 6, n_kv_heads=bad)


def test_the_config_resolves_and_round_trips(tmp_path):
    cfg = GPTConfig(vocab_size=10, max_len=8, d_model=16, n_heads=4, n_layers=1)
    assert cfg.n_kv_heads == 4  # None means one K/V head per query head
    grouped = dataclasses.replace(cfg, n_kv_heads=2)
    model = GPT(grouped)
    save_checkpoint(model, tmp_path / "m")
    assert load_checkpoint(tmp_path / "m").config.n_kv_heads == 2
    with pytest.raises(ValueError, match="n_kv_heads: checkpoint 2 vs model 4"):
        load_checkpoint(tmp_path / "m", GPT(cfg))


def test_a_cache_for_other_kv_heads_is_refused():
    a = GPT(GPTConfig(vocab_size=10, max_len=8, d_model=16, n_heads=4, n_kv_heads=2,
                      n_layers=1))
    b = GPT(GPTConfig(vocab_size=10, max_len=8, d_model=16, n_heads=4, n_layers=1))
    with pytest.raises(ValueError, match="cache was allocated for"):
        a(torch.zeros(1, 2, dtype=torch.long), cache=b.make_cache(1))


def test_gpt_config_picks_the_rotary_layout():
    """Interleaved pairs (llama.cpp's GGUF layout) or halves: the same model up to a
    permutation of each head's query and key rows."""
    torch.manual_seed(3)
    halves = GPTConfig(vocab_size=20, max_len=16, d_model=24, n_heads=3, n_kv_heads=1,
                       n_layers=1, position_encoding="rotary", bias=False)
    a = GPT(halves).eval()
    b = GPT(dataclasses.replace(halves, rope_interleaved=True)).eval()
    assert b.decoder.rotary.interleaved and not a.decoder.rotary.interleaved
    b.load_state_dict(a.state_dict())
    D = 8  # head width: halves index i and i + D/2 <-> interleaved 2i and 2i + 1
    perm = torch.arange(D).view(2, D // 2).t().reshape(-1)  # 0, 4, 1, 5, 2, 6, 3, 7
    with torch.no_grad():
        for proj, heads in ((b.decoder.layers[0].self_attn.qkv.q_proj, 3),
                            (b.decoder.layers[0].self_attn.qkv.k_proj, 1)):
            w = proj.weight.view(heads, D, -1)
            proj.weight.copy_(w[:, perm].reshape(heads * D, -1))
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(a(ids), b(ids), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="rope_interleaved"):
        dataclasses.replace(halves, rope_interleaved=1)


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


def test_grouped_heads_must_divide_the_query_heads():
    q, k = torch.randn(1, 6, 3, 4), torch.randn(1, 4, 3, 4)
    with pytest.raises(ValueError, match="dividing the queries' 6"):
        attention.scaled_dot_product_attention(q, k, k, enable_gqa=True)
    with pytest.raises(ValueError, match="do not broadcast"):  # without it: as batch dims
        attention.scaled_dot_product_attention(q, k, k)
