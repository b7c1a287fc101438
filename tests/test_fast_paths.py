"""The fast paths, checked equal to the slow ones on the CPU (make gpu-check times them on a GPU):

- `is_causal=True`: no mask is built when causality is the only restriction and there are as many
  queries as keys (PyTorch's kernel applies the rule; on CUDA the flash kernel can run); otherwise
  the bottom-right causal mask is built, combined with any mask given. The models pass it.
- the static KV cache: whole buffers plus a length mask, so shapes do not grow per token;
- `generate(..., compile=...)`: one compiled step (`generation._step`, the model's call) whose
  layers call one nested compile region, `DecoderLayer.forward`, over the static cache, the length
  a symbol: one graph per model kind and batch size, none more for calls of other lengths, no
  graph break, nothing assigned to any module;
- `tracing()`: value checks skip themselves while torch.compile traces.
"""
import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from minitransformer.attention import attention_with_weights, scaled_dot_product_attention
from minitransformer.checks import tracing
from minitransformer import generation
from minitransformer.generation import generate, read_bandwidth
from minitransformer.layers import DecoderLayer
from minitransformer.kv_cache import DecoderCache, KVCache
from minitransformer.masks import causal_mask, decoder_mask
from minitransformer.model import GPT, GPTConfig, Transformer, TransformerConfig

RECIPE = dict(position_encoding="rotary", norm="rmsnorm", activation="swiglu", bias=False)


def gpt(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=40, max_len=48, d_model=32, n_heads=4, n_layers=2) | kw
    return GPT(GPTConfig(**cfg)).eval()


# ------------------------------------------------------------------ is_causal

@pytest.mark.parametrize("T,S", [(6, 6), (2, 6), (1, 5), (7, 4)])
@pytest.mark.parametrize("gqa", [False, True])
def test_is_causal_equals_the_bottom_right_mask(T, S, gqa):
    g = torch.Generator().manual_seed(T * 10 + S)
    H_kv = 2 if gqa else 4
    q = torch.randn(2, 4, T, 8, generator=g, requires_grad=True)
    k = torch.randn(2, H_kv, S, 8, generator=g, requires_grad=True)
    v = torch.randn(2, H_kv, S, 8, generator=g, requires_grad=True)
    mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)  # the rule, T > S included
    fast = scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    slow = scaled_dot_product_attention(q, k, v, mask=mask, enable_gqa=gqa)
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-6)
    grads = torch.autograd.grad(fast.square().sum(), (q, k, v))
    refs = torch.autograd.grad(slow.square().sum(), (q, k, v))
    for a, b in zip(grads, refs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    if not gqa:
        explicit, weights = attention_with_weights(q, k, v, is_causal=True)
        torch.testing.assert_close(explicit, slow, atol=1e-6, rtol=1e-6)
        assert not weights.masked_select(~mask).any(), "a later key got weight"


def test_is_causal_combines_with_a_mask():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 2, 5, 4, generator=g) for _ in range(3))
    pad = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1], [0, 0, 0, 1, 1]]).bool()
    pad = pad[:, None, None, :]
    both = pad & causal_mask(5)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, pad, is_causal=True),
                               scaled_dot_product_attention(q, k, v, both))
    torch.testing.assert_close(attention_with_weights(q, k, v, pad, is_causal=True)[0],
                               attention_with_weights(q, k, v, both)[0])


def test_is_causal_is_a_flag():
    q = torch.randn(1, 1, 2, 4)
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="is_causal"):
            scaled_dot_product_attention(q, q, q, is_causal=bad)


def test_a_purely_causal_model_call_builds_no_mask(monkeypatch):
    "GPT's training forward hands the kernel is_causal=True and no mask; a padded one a mask."
    seen = []
    real_sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, **kw):
        seen.append((attn_mask is None, is_causal))
        return real_sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model, ids = gpt(**RECIPE), torch.randint(0, 40, (2, 12))
    with torch.no_grad():
        fast = model(ids)
        assert seen and all(s == (True, True) for s in seen), seen
        seen.clear()
        slow = model(ids, full_attention_mask=causal_mask(12))
        assert seen and all(s == (False, False) for s in seen), seen
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-6)


def test_transformer_decode_with_and_without_the_flag():
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(src_vocab_size=30, tgt_vocab_size=30, max_len=32,
                                      d_model=32, n_heads=4)).eval()
    src, tgt = torch.randint(1, 30, (2, 9)), torch.randint(1, 30, (2, 7))
    with torch.no_grad():
        memory, source_mask = m.encode(src)
        fast = m.decode(tgt, memory, source_mask)  # no target padding: is_causal
        slow = m.decode(tgt, memory, source_mask, attention_mask=torch.ones(2, 7).bool())
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-6)


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


@pytest.mark.parametrize("kw", [{}, RECIPE, dict(RECIPE, n_kv_heads=2)])
def test_static_cache_gives_the_logits_of_the_whole_sequence(kw):
    model, ids = gpt(**kw), torch.randint(0, 40, (3, 20))
    with torch.no_grad():
        whole = model(ids)
        cache = model.make_cache(3, 40, static=True)
        assert cache.static and cache.max_len == 40
        steps = [model(ids[:, :12], cache=cache)]  # a prefill, then one token at a time
        steps += [model(ids[:, t : t + 1], cache=cache) for t in range(12, 20)]
    torch.testing.assert_close(torch.cat(steps, 1), whole, atol=1e-5, rtol=1e-5)


def test_static_cache_with_left_padding_and_a_whole_attention_mask():
    model = gpt(**RECIPE)
    prompts = [[5, 6, 7, 8, 9], [3, 4], [10, 11, 12]]
    eager = generate(model, prompts, 12)
    torch.manual_seed(0)
    # the same rows through the static cache (the path compile=... uses, without compiling)
    ids = torch.zeros(3, 17, dtype=torch.long)
    real = torch.zeros(3, 17, dtype=torch.bool)
    for b, r in enumerate(prompts):
        ids[b, 5 - len(r) : 5], real[b, 5 - len(r) : 5] = torch.tensor(r), True
    pos = (torch.arange(17)[None] - (5 - torch.tensor([len(r) for r in prompts]))[:, None])
    pos = pos.clamp(min=0)
    cache, out = model.make_cache(3, 17, static=True), [[], [], []]
    with torch.no_grad():
        logits = model(ids[:, :5], attention_mask=real, positions=pos[:, :5], cache=cache)
        for t in range(5, 17):
            nxt = logits[:, -1].argmax(-1)
            for b in range(3):
                out[b].append(int(nxt[b]))
            ids[:, t], real[:, t] = nxt, True
            if t < 16:
                logits = model(ids[:, t : t + 1], attention_mask=real,
                               positions=pos[:, t : t + 1], cache=cache)
    assert out == eager


def test_decoder_mask_over_a_static_cache():
    m = decoder_mask(1, 1, past=3, keys=6)
    assert m.tolist() == [[True, True, True, True, False, False]]
    m = decoder_mask(1, 2, past=2, keys=6)
    assert m.int().tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]]
    pad = torch.tensor([[False, True, True, True]])
    m = decoder_mask(1, 1, past=3, attention_mask=pad, keys=6)
    assert m.int().flatten().tolist() == [0, 1, 1, 1, 0, 0]
    with pytest.raises(ValueError, match="keys"):
        decoder_mask(1, 2, past=3, keys=4)


# ------------------------------------------------------------------ torch.compile

def graphs() -> int:
    return counters["stats"]["unique_graphs"]


def test_compiled_generation_writes_the_eager_tokens_with_one_layer_graph():
    model = gpt(**dict(RECIPE, n_kv_heads=2), n_layers=3)
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13]]
    eager = generate(model, prompts, 16)
    torch._dynamo.reset()
    counters.clear()
    assert generate(model, prompts, 16, compile="eager") == eager
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert graphs() == 1, dict(counters["stats"])  # the step, around one layer region
    for n in (5, 30, 1, 0):  # other lengths (other cache sizes): nothing more compiled
        assert generate(model, prompts, n, compile="eager") == generate(model, prompts, n)
    assert graphs() == 1, dict(counters["stats"])
    one = [[4, 5, 6]]  # B = 1: a shape of its own (sizes 0 and 1 are never symbols)
    assert generate(model, one, 9, compile="eager") == generate(model, one, 9)
    assert graphs() == 2, dict(counters["stats"])
    assert all("forward" not in vars(m) for m in model.modules())  # nothing assigned


def test_every_layer_calls_one_compiled_region():
    "The layers' calls reuse one subgraph: the step's graph holds one region, called thrice."
    from torch._dynamo.testing import CompileCounterWithBackend
    model = gpt(**dict(RECIPE, n_kv_heads=2), n_layers=3)
    backend = CompileCounterWithBackend("eager")
    cache = model.make_cache(1, 12, static=True)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), cache=cache)
        step = torch.compile(generation._step, backend=backend, dynamic=True,
                             fullgraph=True)  # (fullgraph: raises at a graph break)
        generation._static_heads(cache)
        mask = torch.ones(1, 1, 1, 12, dtype=torch.bool)
        with torch._dynamo.config.patch(specialize_float=True):  # as generate runs it
            step(model, torch.tensor([[4]]), None, None,
                 dict(positions=torch.tensor([[3]]), cache=cache, full_attention_mask=mask))
    graph, = backend.graphs
    calls = [n for n in graph.graph.nodes
             if n.target is torch.ops.higher_order.invoke_subgraph]
    regions = {n.args[1] for n in calls}
    assert len(calls) == 3 and len(regions) == 1, (len(calls), regions)


def test_a_static_cache_counts_the_positions_it_holds():
    model = gpt()
    cache = model.make_cache(1, 10, static=True)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), cache=cache)
        assert len(cache) == 3
        model(torch.tensor([[4]]), cache=cache)
        assert len(cache) == 4
    k = cache.self_attn[0].k  # 4 positions written, zeros after them
    assert k[:, :, :4].abs().sum() > 0 and not k[:, :, 4:].any()


def test_a_step_that_raises_leaves_the_model_as_it_was(monkeypatch):
    model = gpt()

    def broken(*args, **kwargs):
        raise RuntimeError("a step failed")

    monkeypatch.setattr(generation, "_sample", broken)
    with pytest.raises(RuntimeError, match="a step failed"):
        generate(model, [[1, 2]], 4, compile="eager")
    assert all("forward" not in vars(m) for m in model.modules())


def test_compiled_generation_of_a_one_token_prompt_compiles_one_graph():
    "The prompt step runs eagerly even when it is one token long (no second graph)."
    model = gpt(**dict(RECIPE, n_kv_heads=2))
    torch._dynamo.reset()
    counters.clear()
    assert generate(model, [[4]], 6, compile="eager") == generate(model, [[4]], 6)
    assert graphs() == 1, dict(counters["stats"])


def test_compiled_generation_with_a_lora_head():
    from minitransformer.lora import add_lora
    model = gpt(tie_weights=False)
    add_lora(model, ["head"], r=2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora" in name:
                p.normal_(0, 0.5)
    prompts = [[1, 2, 3]]
    assert generate(model, prompts, 8, compile="eager") == generate(model, prompts, 8)


def test_static_cache_under_autocast():
    "Autocast computes keys in bfloat16; the float32 static buffers take them cast."
    model = gpt()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        cache = model.make_cache(1, 8, static=True)
        model(ids, cache=cache)
        assert len(cache) == 4
        out = generate(model, [[1, 2, 3]], 4, compile="eager")
    assert len(out[0]) == 4


def test_start_call_checks_its_argument():
    cache = gpt().make_cache(1, 4)
    with pytest.raises(ValueError, match="overflow"):
        cache.start_call(5)
    with pytest.raises(ValueError, match="T"):
        cache.start_call(-1)
    assert cache.start_call(4) == 0


def test_compiled_encoder_decoder_generation():
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(src_vocab_size=30, tgt_vocab_size=30, max_len=32,
                                      d_model=32, n_heads=4)).eval()
    src, prompts = [[3, 4, 5, 6], [7, 8]], [[1], [1, 2]]
    eager = generate(m, prompts, 10, source=src)
    torch._dynamo.reset()
    counters.clear()
    assert generate(m, prompts, 10, source=src, compile="eager") == eager
    assert not counters["graph_break"], dict(counters["graph_break"])
    # its layer (with cross-attention) is a graph of its own; other target lengths reuse it
    assert generate(m, prompts, 4, source=src, compile="eager") == generate(
        m, prompts, 4, source=src)
    assert graphs() == 1, dict(counters["stats"])


def test_read_bandwidth_is_a_positive_rate():
    assert read_bandwidth(2**20, 3) > 0
    with pytest.raises(ValueError, match="n_bytes"):
        read_bandwidth(2)
    with pytest.raises(ValueError, match="repeats"):
        read_bandwidth(2**20, 1.5)


def test_compile_arguments_are_checked():
    model = gpt()
    with pytest.raises(ValueError, match="compile"):
        generate(model, [[1, 2]], 3, compile="no-such-backend")
    with pytest.raises(ValueError, match="use_cache"):
        generate(model, [[1, 2]], 3, compile=True, use_cache=False)


def test_the_decode_step_traces_as_one_graph():
    "fullgraph=True raises at the first graph break: the static step has none."
    model, cache = gpt(**RECIPE), None
    cache = model.make_cache(2, 24, static=True)
    ids = torch.randint(0, 40, (2, 6))
    step = torch.compile(model.forward, backend="eager", fullgraph=True, dynamic=True)
    generation._static_heads(cache)
    with torch.no_grad(), torch._dynamo.config.patch(specialize_float=True):
        model(ids[:, :5], cache=cache)
        out = step(ids[:, 5:6], cache=cache, last_only=True)
        ref = model(ids)[:, -1:]
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_tracing_is_true_only_under_torch_compile():
    assert tracing() is False
    seen = []

    def f(x):
        seen.append(tracing())
        return x + 1

    torch.compile(f, backend="eager", fullgraph=True)(torch.zeros(2))
    assert seen == [True]


def test_a_full_static_cache_says_so():
    model = gpt()
    cache = model.make_cache(1, 6, static=True)
    with torch.no_grad():
        model(torch.randint(0, 40, (1, 5)), cache=cache)
        with pytest.raises(ValueError, match="KV cache overflow"):
            model(torch.randint(0, 40, (1, 2)), cache=cache)
    with pytest.raises(TypeError, match="attention_mask"):
        decoder_mask(1, 1, past=3, attention_mask=[[True] * 6], keys=6)
