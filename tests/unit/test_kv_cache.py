"""minitransformer.kv_cache: a cache gives the logits of recomputation (growing and static,
grouped heads, cross-attention), follows its memory formula, and refuses overflow, foreign
shapes and what it cannot serve, leaving its length as it was."""

import pytest
import torch

from minitransformer.generation import generate
from minitransformer.kv_cache import DecoderCache, KVCache, check_encoder_output
from minitransformer.layers import Decoder, LayerConfig
from minitransformer.masks import causal_mask, decoder_mask
from minitransformer.model import GPT, GPTConfig, Transformer, TransformerConfig

from helpers import DEVICE, GPT_KINDS, RECIPE, device_gpt, device_seq2seq, raises, small_gpt


# ------------------------------------------------------------------ the static cache
def test_a_static_cache_returns_whole_buffers():
    c = KVCache(2, 3, 6, 4, static=True)
    k = torch.randn(2, 3, 4, 4)
    keys, values = c.update(k, k)
    assert keys.shape == (2, 3, 6, 4) and keys.data_ptr() == c.k.data_ptr()
    assert len(c) == 4 and "static" in repr(c)
    torch.testing.assert_close(keys[:, :, :4], k)
    with pytest.raises(ValueError, match="static"):
        KVCache(2, 3, 6, 4, static="yes")
    dynamic = KVCache(2, 3, 6, 4)
    with pytest.raises(ValueError, match="all static or none"):
        DecoderCache([c, dynamic])
    with pytest.raises(ValueError, match="cross_attn"):
        DecoderCache([KVCache(2, 3, 6, 4)], [KVCache(2, 3, 6, 4, static=True)])


def test_the_buffers_are_the_modules_own():
    "k and v are buffers: .to moves and casts them, state_dict and deepcopy carry them."
    import copy
    c = KVCache(1, 2, 5, 4)
    c.update(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4))
    assert set(c.state_dict()) == {"k", "v"}
    c64 = c.to(torch.float64)
    assert c64.k.dtype == c64.v.dtype == torch.float64 and len(c64) == 3
    twin = copy.deepcopy(c)
    assert twin.k.data_ptr() != c.k.data_ptr() and torch.equal(twin.k, c.k)


def test_writes_at_slots_leave_the_length_to_the_caller():
    c = KVCache(1, 2, 6, 4, static=True)
    new = torch.randn(1, 2, 2, 4, dtype=torch.float64)  # cast to the buffers' float32
    keys, values = c.update(new, new, torch.tensor([4, 1]))
    assert keys.shape == (1, 2, 6, 4) and len(c) == 0
    assert torch.equal(keys[:, :, 4], new[:, :, 0].float())
    assert torch.equal(values[:, :, 1], new[:, :, 1].float())
    assert not keys[:, :, [0, 2, 3, 5]].any()


@pytest.mark.parametrize("kw", [{}, RECIPE, dict(RECIPE, n_kv_heads=2)])
def test_static_cache_gives_the_logits_of_the_whole_sequence(kw):
    model, ids = small_gpt(**kw), torch.randint(0, 40, (3, 20))
    with torch.no_grad():
        whole = model(ids)
        cache = model.make_cache(3, 40, static=True)
        assert cache.static and cache.max_len == 40
        steps = [model(ids[:, :12], cache=cache)]  # a prefill, then one token at a time
        steps += [model(ids[:, t : t + 1], cache=cache) for t in range(12, 20)]
    torch.testing.assert_close(torch.cat(steps, 1), whole, atol=1e-5, rtol=1e-5)


def test_a_static_cache_counts_the_positions_it_holds():
    model = small_gpt()
    cache = model.make_cache(1, 10, static=True)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), cache=cache)
        assert len(cache) == 3
        model(torch.tensor([[4]]), cache=cache)
        assert len(cache) == 4
    k = cache.self_attn[0].k  # 4 positions written, zeros after them
    assert k[:, :, :4].abs().sum() > 0 and not k[:, :, 4:].any()


def test_a_full_static_cache_says_so():
    model = small_gpt()
    cache = model.make_cache(1, 6, static=True)
    with torch.no_grad():
        model(torch.randint(0, 40, (1, 5)), cache=cache)
        with pytest.raises(ValueError, match="KV cache overflow"):
            model(torch.randint(0, 40, (1, 2)), cache=cache)
    with pytest.raises(TypeError, match="attention_mask"):
        decoder_mask(1, 1, past=3, attention_mask=[[True] * 6], keys=6)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", range(len(GPT_KINDS)))
def test_gpt_cached_logits_equal_recomputation(kind):
    model = device_gpt(kind, **GPT_KINDS[kind])
    ids = torch.randint(4, 37, (2, 7), device=DEVICE)
    cache = model.make_cache(2)
    with torch.no_grad():
        step = model(ids, cache=cache)[:, -1]
        for t in range(25):
            full = model(ids)[:, -1]
            assert (step - full).abs().max() <= 1e-5, f"step {t}"
            nxt = full.argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
            step = model(nxt, cache=cache)[:, -1]  # the causal mask is built for the new token
    assert len(cache) == ids.shape[1]  # every token, including the last one fed


@pytest.mark.gpu
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_decoder_cached_logits_equal_recomputation(norm_first):
    model = device_seq2seq(5, norm_first)
    src = torch.randint(4, 29, (3, 9), device=DEVICE)
    src[1, 6:] = 0  # padding
    with torch.no_grad():
        memory, mmask = model.encode(src)  # mmask: (B, S) real source tokens
        assert mmask.tolist() == (src != 0).tolist()
        cache = model.make_cache(memory)  # cross-attention keys/values filled from memory
        tgt = torch.full((3, 1), 2, device=DEVICE)
        step = model.decode(tgt, None, mmask, cache=cache)[:, -1]
        for t in range(20):
            full = model.decode(tgt, memory, mmask)[:, -1]
            assert (step - full).abs().max() <= 1e-5, f"step {t}"
            nxt = full.argmax(-1, keepdim=True)
            tgt = torch.cat([tgt, nxt], 1)
            step = model.decode(nxt, None, mmask, cache=cache)[:, -1]
    assert len(cache) == tgt.shape[1]  # every target token, including the last one fed


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,bytes_per", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_cache_memory_formula(dtype, bytes_per):
    c = DecoderCache.allocate(n_layers=3, batch_size=5, n_kv_heads=7, max_len=11, head_dim=9, source_len=13,
                              device=DEVICE, dtype=dtype)
    assert c.nbytes == 2 * 3 * 5 * 7 * (11 + 13) * 9 * bytes_per
    model = device_gpt(0).to(dtype)
    cache = model.make_cache(2, 40)
    assert cache.nbytes == 2 * 3 * 2 * 3 * 40 * 10 * bytes_per
    assert cache.self_attn[0].k.device.type == DEVICE.type and cache.self_attn[0].k.dtype == dtype


@pytest.mark.gpu
def test_overflow_is_refused_where_a_call_begins_and_a_cache_resets():
    "A cache alone trusts its caller: a write past its end fails in torch, its length kept."
    c = KVCache(1, 2, 4, 3, device=DEVICE)
    c.update(torch.zeros(1, 2, 4, 3, device=DEVICE), torch.zeros(1, 2, 4, 3, device=DEVICE))
    with pytest.raises(RuntimeError):
        c.update(torch.zeros(1, 2, 1, 3, device=DEVICE), torch.zeros(1, 2, 1, 3, device=DEVICE))
    assert len(c) == 4
    c.reset()
    assert len(c) == 0
    model = device_gpt(0)
    with pytest.raises(ValueError, match="exceed the model's max_len 80"):
        generate(model, [[5] * 70], 20)


@pytest.mark.gpu
def test_cross_attention_cache_is_explicit():
    model = device_seq2seq(8, True)
    memory, source_mask = model.encode(torch.randint(4, 29, (2, 5), device=DEVICE))
    cache = model.make_cache(memory)
    tgt = torch.full((2, 1), 2, device=DEVICE)
    with pytest.raises(ValueError, match="pass memory=None"):
        model.decode(tgt, memory, source_mask, cache=cache)
    cache.reset()  # empty again: reading it without memory must fail before any cache changes
    with pytest.raises(ValueError, match="cross-attention part is empty"):
        model.decode(tgt, None, source_mask, cache=cache)
    assert len(cache) == 0


@pytest.mark.gpu
def test_a_failed_call_leaves_the_cache_as_it_was():
    "An error in a later layer (here a mask of the wrong shape) rolls every layer's cache back."
    model = device_gpt(40)
    cache = model.make_cache(2, 40)
    ids = torch.randint(4, 37, (2, 5), device=DEVICE)
    with torch.no_grad():
        model(ids, cache=cache)
        bad = torch.ones(2, 1, 1, 3, dtype=torch.bool, device=DEVICE)  # S should be 6
        with pytest.raises(ValueError, match="full_attention_mask must broadcast"):
            model(ids[:, :1], cache=cache, full_attention_mask=bad)
        attn = model.decoder.layers[-1].self_attn
        original = attn.forward
        attn.forward = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))  # last layer
        with pytest.raises(RuntimeError, match="boom"):
            model(ids[:, :1], cache=cache)
        attn.forward = original
        assert len(cache) == 5 and {len(c) for c in cache.self_attn} == {5}
        step = model(ids[:, :1], cache=cache)[:, -1]  # still usable, and still exact
        full = model(torch.cat([ids, ids[:, :1]], 1))[:, -1]
    assert (step - full).abs().max() <= 1e-5


@pytest.mark.gpu
def test_cache_must_fit_the_stack():
    model = device_gpt(41)
    small = DecoderCache.allocate(2, 1, 3, 20, 10, device=DEVICE)  # the model has 3 layers
    with pytest.raises(ValueError, match="2 layers' caches for a stack of 3 layers"):
        model(torch.randint(4, 37, (1, 4), device=DEVICE), cache=small)
    other = DecoderCache.allocate(3, 1, 3, 20, 10, device=DEVICE, dtype=torch.float64)
    with pytest.raises(ValueError, match="cache was allocated for"):
        model(torch.randint(4, 37, (1, 4), device=DEVICE), cache=other)
    assert len(other) == 0


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


def test_a_cache_for_other_kv_heads_is_refused():
    a = GPT(GPTConfig(vocab_size=10, max_len=8, d_model=16, n_heads=4, n_kv_heads=2,
                      n_layers=1))
    b = GPT(GPTConfig(vocab_size=10, max_len=8, d_model=16, n_heads=4, n_layers=1))
    with pytest.raises(ValueError, match="cache was allocated for"):
        a(torch.zeros(1, 2, dtype=torch.long), cache=b.make_cache(1))


def test_a_failing_decoder_call_leaves_the_cache_length_as_it_was():
    "The stack trusts its cache (the model checks the room): a write past the end raises."
    cfg = LayerConfig(d_model=16, n_heads=4, d_ff=40, norm_first=True)
    stack = Decoder(cfg, 2, cross_attention=False).eval()
    cache = DecoderCache.for_decoder(stack, 1, 4)
    with torch.no_grad():
        stack(torch.randn(1, 3, 16), mask=causal_mask(3), cache=cache)
        assert len(cache) == 3
        with pytest.raises(RuntimeError, match="exceeds dimension size"):  # torch's
            stack(torch.randn(1, 2, 16), mask=causal_mask(2, 5), cache=cache)
    assert len(cache) == 3
    model = small_gpt(max_len=4)
    cache = model.make_cache(1)
    model(torch.tensor([[1, 2, 3]]), cache=cache)
    with raises(ValueError, "KV cache overflow: 3 positions cached + 2 new > max_len 4"):
        model(torch.tensor([[1, 2]]), cache=cache)  # where the model's call begins
    assert len(cache) == 3


def test_kv_cache_refuses_a_bad_truncation_and_a_shared_length():
    cache = KVCache(batch_size=2, n_kv_heads=3, max_len=6, head_dim=5)
    k, v = torch.randn(2, 3, 5, 5), torch.randn(2, 3, 5, 5)
    cache.update(k, v)
    with raises(ValueError, "length must be in [0, 5], got 6"):
        cache.truncate(6)
    cache.reset()
    assert len(cache) == 0
    stack = DecoderCache.allocate(n_layers=1, batch_size=2, n_kv_heads=3, max_len=6,
                                  head_dim=5)
    part = stack.self_attn[0]
    keys, _ = part.update(k[:, :, :1], v[:, :, :1])  # at the stack's position ...
    assert keys.shape[2] == 1 and len(stack) == 0  # ... which only the Decoder moves
    with raises(ValueError, "shares the length of a DecoderCache: reset that instead"):
        part.reset()


def test_decoder_cache_refuses_what_it_cannot_serve():
    cross_stack = Decoder(LayerConfig(d_model=48, n_heads=4), 2).eval()
    memory = torch.randn(2, 9, 48)
    cache = DecoderCache.for_decoder(cross_stack, 2, 8, source_len=9)
    x1 = torch.randn(2, 1, 48)
    with raises(ValueError, "is empty"):
        cache.check_fits(cross_stack, 2, 1)
    cache.fill_cross_attention(cross_stack, memory)
    with raises(ValueError, "pass memory=None"):
        cache.check_fits(cross_stack, 2, 1, memory)
    assert cache.check_fits(cross_stack, 2, 1) == 1  # keys read: the one new token
    with raises(ValueError, "already filled"):
        cache.fill_cross_attention(cross_stack, memory)
    with raises(ValueError, "needs source_len"):
        DecoderCache.for_decoder(cross_stack, 2, 8)
    with raises(TypeError, "decoder must be a Decoder, got str"):
        DecoderCache.for_decoder("stack", 2, 8)
    with raises(ValueError, "memory must be the encoder output (B, S, C) = (B, S, 48)"):
        check_encoder_output(memory[:, :, :40], 48)
    one = KVCache(1, 4, 8, 12)
    with raises(ValueError, "each KVCache can serve one layer of one DecoderCache"):
        DecoderCache([one, one])
    with raises(TypeError, "self_attn must be a non-empty list of KVCache"):
        DecoderCache([])
