"""Cached generation is exact (logits and tokens), batched prompts match single ones, the cache's memory
follows its formula — over several model kinds and odd sizes. The device is CPU unless MT_DEVICE is set
(scripts/gpu_check.py runs this file with MT_DEVICE=cuda)."""
import os

import pytest
import torch

from minitransformer.generation import generate
from minitransformer.kv_cache import DecoderCache, KVCache
from minitransformer.model import GPT, GPTConfig, Transformer, TransformerConfig

DEVICE = torch.device(os.environ.get("MT_DEVICE", "cpu"))
if DEVICE.type == "cuda" and not torch.cuda.is_available():
    pytest.skip("MT_DEVICE=cuda but no CUDA device", allow_module_level=True)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

GPT_KINDS = [dict(position_encoding="learned"), dict(position_encoding="sinusoidal"),
             dict(position_encoding="rotary", activation="swiglu", norm="rmsnorm", bias=False)]


def gpt(seed, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=37, max_len=80, d_model=30, n_heads=3, n_layers=3, **kw)).to(DEVICE).eval()


def seq2seq(seed, norm_first):
    torch.manual_seed(seed)
    cfg = TransformerConfig(src_vocab_size=29, tgt_vocab_size=23, max_len=80, d_model=30,
                            n_heads=5, norm_first=norm_first)
    return Transformer(cfg).to(DEVICE).eval()


@pytest.mark.parametrize("kind", range(len(GPT_KINDS)))
def test_gpt_cached_logits_equal_recomputation(kind):
    model = gpt(kind, **GPT_KINDS[kind])
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


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_decoder_cached_logits_equal_recomputation(norm_first):
    model = seq2seq(5, norm_first)
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


@pytest.mark.parametrize("kind", range(len(GPT_KINDS)))
def test_gpt_greedy_tokens_same_with_without_cache_batched_or_alone(kind):
    model = gpt(10 + kind, **GPT_KINDS[kind])
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15], [16, 17, 18, 19, 20, 21, 22, 23, 24, 25]]
    cached = generate(model, prompts, 30)
    assert cached == generate(model, prompts, 30, use_cache=False)
    assert cached == [generate(model, [p], 30)[0] for p in prompts]


def test_encoder_decoder_tokens_same_with_without_cache_batched_or_alone():
    model = seq2seq(3, True)
    sources = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
    prompts = [[2], [2, 7], [2]]
    cached = generate(model, prompts, 25, source=sources)
    assert cached == generate(model, prompts, 25, source=sources, use_cache=False)
    assert cached == [generate(model, [p], 25, source=[s])[0] for p, s in zip(prompts, sources)]


def test_sampling_is_reproducible_and_stops():
    model = gpt(1)
    a = generate(model, [[5, 6], [7]], 20, temperature=1.0, top_k=10, generator=torch.Generator(DEVICE).manual_seed(3))
    b = generate(model, [[5, 6], [7]], 20, temperature=1.0, top_k=10, generator=torch.Generator(DEVICE).manual_seed(3))
    assert a == b
    greedy = generate(model, [[5, 6]], 20)[0]
    stopped = generate(model, [[5, 6]], 20, stop_token=greedy[3])[0]
    assert stopped == greedy[: greedy.index(greedy[3])]


@pytest.mark.parametrize("dtype,bytes_per", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_cache_memory_formula(dtype, bytes_per):
    c = DecoderCache.allocate(n_layers=3, batch_size=5, n_kv_heads=7, max_len=11, head_dim=9, source_len=13,
                              device=DEVICE, dtype=dtype)
    assert c.nbytes == 2 * 3 * 5 * 7 * (11 + 13) * 9 * bytes_per
    model = gpt(0).to(dtype)
    cache = model.make_cache(2, 40)
    assert cache.nbytes == 2 * 3 * 2 * 3 * 40 * 10 * bytes_per
    assert cache.self_attn[0].k.device.type == DEVICE.type and cache.self_attn[0].k.dtype == dtype


def test_cache_refuses_overflow_and_resets():
    c = KVCache(1, 2, 4, 3, device=DEVICE)
    c.update(torch.zeros(1, 2, 4, 3, device=DEVICE), torch.zeros(1, 2, 4, 3, device=DEVICE))
    with pytest.raises(ValueError, match="overflow: 4 positions cached \\+ 1 new > max_len 4"):
        c.update(torch.zeros(1, 2, 1, 3, device=DEVICE), torch.zeros(1, 2, 1, 3, device=DEVICE))
    c.reset()
    assert len(c) == 0
    model = gpt(0)
    with pytest.raises(ValueError, match="exceed the model's max_len 80"):
        generate(model, [[5] * 70], 20)


def _left_pad(prompts, pad=0):
    "Left-padded ids (B, P), the real-token mask and positions counted from each row's first token."
    P = max(map(len, prompts))
    ids = torch.tensor([[pad] * (P - len(p)) + p for p in prompts], device=DEVICE)
    real = torch.tensor([[False] * (P - len(p)) + [True] * len(p) for p in prompts], device=DEVICE)
    positions = (real.long().cumsum(1) - 1).clamp(min=0)
    return ids, real, positions


@pytest.mark.parametrize("kind", range(len(GPT_KINDS)))
def test_gpt_padding_changes_no_logit(kind):
    "Logits of a left-padded row equal the row's logits alone (greedy tokens can hide a leak)."
    model = gpt(20 + kind, **GPT_KINDS[kind])
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15]]
    ids, real, positions = _left_pad(prompts)
    with torch.no_grad():
        batched = model(ids, attention_mask=real, positions=positions)
        for b, p in enumerate(prompts):
            alone = model(torch.tensor([p], device=DEVICE))
            gap = (batched[b, -len(p):] - alone[0]).abs().max()
            assert gap <= 1e-5, f"row {b}: padding changed its logits by {gap}"


def test_encoder_decoder_padding_changes_no_logit():
    model = seq2seq(7, False)
    sources, prompts = [[5, 6, 7, 8, 9, 10], [11, 12]], [[2, 7, 8], [2]]
    src = torch.tensor([s + [0] * (6 - len(s)) for s in sources], device=DEVICE)  # right-padded
    tgt, real, positions = _left_pad(prompts)
    with torch.no_grad():
        memory, source_mask = model.encode(src)
        batched = model.decode(tgt, memory, source_mask, attention_mask=real, positions=positions)
        for b, (s, p) in enumerate(zip(sources, prompts)):
            alone = model(torch.tensor([s], device=DEVICE), torch.tensor([p], device=DEVICE))
            gap = (batched[b, -len(p):] - alone[0]).abs().max()
            assert gap <= 1e-5, f"row {b}: padding changed its logits by {gap}"


def test_cross_attention_cache_is_explicit():
    model = seq2seq(8, True)
    memory, source_mask = model.encode(torch.randint(4, 29, (2, 5), device=DEVICE))
    cache = model.make_cache(memory)
    tgt = torch.full((2, 1), 2, device=DEVICE)
    with pytest.raises(ValueError, match="pass memory=None"):
        model.decode(tgt, memory, source_mask, cache=cache)
    cache.reset()  # empty again: reading it without memory must fail before any cache changes
    with pytest.raises(ValueError, match="cross-attention part is empty"):
        model.decode(tgt, None, source_mask, cache=cache)
    assert len(cache) == 0


def test_a_failed_call_leaves_the_cache_as_it_was():
    "An error in a later layer (here a mask of the wrong shape) rolls every layer's cache back."
    model = gpt(40)
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


def test_cache_must_fit_the_stack():
    model = gpt(41)
    small = DecoderCache.allocate(2, 1, 3, 20, 10, device=DEVICE)  # the model has 3 layers
    with pytest.raises(ValueError, match="2 layers' caches for a stack of 3 layers"):
        model(torch.randint(4, 37, (1, 4), device=DEVICE), cache=small)
    other = DecoderCache.allocate(3, 1, 3, 20, 10, device=DEVICE, dtype=torch.float64)
    with pytest.raises(ValueError, match="cache was allocated for"):
        model(torch.randint(4, 37, (1, 4), device=DEVICE), cache=other)
    assert len(other) == 0


def test_from_torch_refuses_what_it_cannot_copy():
    from torch import nn
    from minitransformer.multihead import MultiHeadAttention
    with pytest.raises(ValueError, match="add_bias_kv or add_zero_attn"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(TypeError, match="ref must be an nn.MultiheadAttention"):
        MultiHeadAttention.from_torch(nn.Linear(8, 8))
