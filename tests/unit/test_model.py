"""minitransformer.model: the models' entry points check what they are handed once, where a call
enters (hooks, subclasses and inner modules included); padding changes no logit; configs are
checked, resolve and round-trip; the decode step traces as one graph."""

import dataclasses
import inspect

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minitransformer import generation, model as model_module
from minitransformer.checkpoints import load_checkpoint, save_checkpoint
from minitransformer.generation import generate, sample_next
from minitransformer.kv_cache import DecoderCache
from minitransformer.layers import RMSNorm
from minitransformer.masks import causal_mask
from minitransformer.model import GPT, GPTConfig, Transformer, TransformerConfig, mean_pool
from minitransformer.multihead import MultiHeadAttention

from helpers import (
    CFG,
    DEVICE,
    GPT_KINDS,
    RECIPE,
    counted,
    device_gpt,
    device_seq2seq,
    small_gpt,
    smollm2_shaped_gpt,
)


def test_a_purely_causal_model_call_builds_no_mask(monkeypatch):
    "GPT's training forward hands the kernel is_causal=True and no mask; a padded one a mask."
    seen = []
    real_sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, **kw):
        seen.append((attn_mask is None, is_causal))
        return real_sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model, ids = small_gpt(**RECIPE), torch.randint(0, 40, (2, 12))
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


def test_the_decode_step_traces_as_one_graph():
    "fullgraph=True raises at the first graph break: the static step has none."
    model, cache = small_gpt(**RECIPE), None
    cache = model.make_cache(2, 24, static=True)
    ids = torch.randint(0, 40, (2, 6))
    step = torch.compile(model.forward, backend="eager", fullgraph=True, dynamic=False)
    with torch.no_grad():
        model(ids[:, :5], cache=cache)
        out = step(ids[:, 5:6], cache=cache, last_only=True,
                   cache_position=torch.tensor([5]))
        ref = model(ids)[:, -1:]
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert len(cache) == 5  # with cache_position, the length is the caller's


def test_cache_position_is_checked_where_the_call_begins():
    model = small_gpt()
    ids = torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match="static"):
        model(ids, cache=model.make_cache(1, 8), cache_position=torch.tensor([0, 1]))
    static = model.make_cache(1, 8, static=True)
    with pytest.raises(ValueError, match=r"cache_position must be \(2,\) int64"):
        model(ids, cache=static, cache_position=torch.tensor([0]))
    with pytest.raises(ValueError, match=r"cache_position must lie in \[0, 8\)"):
        model(ids, cache=static, cache_position=torch.tensor([7, 8]))
    with pytest.raises(ValueError, match="pass the cache"):
        model(ids, cache_position=torch.tensor([0, 1]))
    assert not static.self_attn[0].k.any()  # nothing written by a refused call


def _left_pad(prompts, pad=0):
    "Left-padded ids (B, P), the real-token mask and positions counted from each row's first token."
    P = max(map(len, prompts))
    ids = torch.tensor([[pad] * (P - len(p)) + p for p in prompts], device=DEVICE)
    real = torch.tensor([[False] * (P - len(p)) + [True] * len(p) for p in prompts], device=DEVICE)
    positions = (real.long().cumsum(1) - 1).clamp(min=0)
    return ids, real, positions


@pytest.mark.gpu
@pytest.mark.parametrize("kind", range(len(GPT_KINDS)))
def test_gpt_padding_changes_no_logit(kind):
    "Logits of a left-padded row equal the row's logits alone (greedy tokens can hide a leak)."
    model = device_gpt(20 + kind, **GPT_KINDS[kind])
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15]]
    ids, real, positions = _left_pad(prompts)
    with torch.no_grad():
        batched = model(ids, attention_mask=real, positions=positions)
        for b, p in enumerate(prompts):
            alone = model(torch.tensor([p], device=DEVICE))
            gap = (batched[b, -len(p):] - alone[0]).abs().max()
            assert gap <= 1e-5, f"row {b}: padding changed its logits by {gap}"


@pytest.mark.gpu
def test_encoder_decoder_padding_changes_no_logit():
    model = device_seq2seq(7, False)
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


def test_mean_pool_averages_real_tokens_only():
    hidden = torch.randn(3, 4, 5)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    hidden[0, 2:] = 1e6  # padding vectors must not leak in
    plain = mean_pool(hidden, mask, normalize=False)
    assert torch.allclose(plain[0], hidden[0, :2].mean(0)), plain[0]
    assert torch.allclose(plain[1], hidden[1].mean(0)), plain[1]
    assert torch.equal(plain[2], torch.zeros(5)), f"an all-padding row: {plain[2]}"
    unit = mean_pool(hidden, mask)
    assert torch.allclose(unit[:2].norm(dim=-1), torch.ones(2))
    assert torch.allclose(unit[0], plain[0] / plain[0].norm())


def test_gptconfig_docstring_names_the_gelu_it_uses():
    "GPT-2 computes GELU with the tanh approximation; GPTConfig's default is exact GELU."
    doc = GPTConfig.__doc__
    assert GPTConfig(vocab_size=10).activation == "gelu"
    assert "GPT-2's defaults" not in doc, doc
    assert "exact GELU" in doc and "gelu_tanh" in doc, doc


def test_rotary_layouts_are_attributed_correctly():
    "Meta's Llama rotates adjacent pairs; GPT-NeoX and Hugging Face's Llama use halves."
    source = inspect.getsource(model_module.TextConfig)
    assert "Llama, GPT-NeoX" not in source
    assert "Meta's" in source and "Hugging Face's Llama" in source, source


# --- configs and entry points ---------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("field, value", [
    ("n_layers", -1), ("n_layers", 0), ("d_ff", 0), ("rope_base", 0.0),
    ("rope_base", float("nan")), ("norm_eps", float("inf")), ("dropout", 1.0),
    ("max_len", 2.0), ("pad_id", 16), ("pad_id", -1), ("bias", "yes"),
    ("activation", "tanh"), ("position_encoding", "alibi"), ("tie_weights", None)])
def test_config_fields_are_all_checked(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(CFG, **{field: value})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("encoding", ["sinusoidal", "rotary", "learned"])
@pytest.mark.reduced_precision
def test_models_run_in_half_precision_with_computed_positions(dtype, encoding):
    "Positions are computed (no table to cast): they follow the model's dtype."
    from minitransformer.model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=30, max_len=16, d_model=32, n_heads=2, n_layers=1,
                          position_encoding=encoding)).eval()
    ids = torch.randint(0, 30, (2, 7))
    with torch.no_grad():
        full, half = model(ids), model.to(dtype)(ids)
    assert half.dtype == dtype
    # a few roundings of the dtype's step at the logits' scale (measured: bfloat16 0.018 and
    # float16 0.002 at logits up to 7; 0.003 and 0.0004 at logits of 0.3)
    bound = 4 * torch.finfo(dtype).eps * (1 + full.abs().max())
    assert (half.float() - full).abs().max() <= bound, ((half.float() - full).abs().max(), bound)


@pytest.mark.timeout(60)
def test_model_entry_points_check_ids_then_prefix_then_length():
    "Ids are checked before the prefix, a wrong dtype is a TypeError, P + T is said in words."
    from minitransformer.model import (EncoderClassifier, EncoderClassifierConfig,
                                       TextEncoder, TextEncoderConfig)
    enc = TextEncoder(TextEncoderConfig(vocab_size=10, max_len=8, d_model=16, n_heads=2,
                                        n_layers=1))
    prefix = torch.zeros(1, 2, 16)
    with pytest.raises(TypeError, match="ids must be a torch.Tensor, got NoneType"):
        enc(None, prefix=prefix)
    with pytest.raises(ValueError, match=r"2 prefix vectors \+ 7 tokens exceed the "
                                         "model's max_len 8"):
        enc(torch.ones(1, 7, dtype=torch.long), prefix=prefix)
    with pytest.raises(ValueError, match="prefix must be"):
        enc(torch.ones(1, 3, dtype=torch.long), prefix=torch.zeros(1, 2, 8))
    clf = EncoderClassifier(EncoderClassifierConfig(vocab_size=10, n_classes=2, d_model=16,
                                                    n_heads=2, n_layers=1, max_len=8))
    tr = Transformer(TransformerConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=16,
                                       n_heads=2, max_len=8))
    calls = [GPT(CFG), enc, clf, tr.encode]
    for dtype in (torch.bool, torch.complex64, torch.float32):
        for call in calls:
            with pytest.raises(TypeError, match=rf"(ids|src) .*dtype {dtype}"):
                call(torch.ones(2, 3, dtype=dtype))


@pytest.mark.timeout(60)
def test_make_cache_without_memory_is_a_type_error_naming_memory():
    tr = Transformer(TransformerConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=16,
                                       n_heads=2, max_len=8))
    with pytest.raises(TypeError, match="memory must be a torch.Tensor, got NoneType"):
        tr.make_cache(None)
    with pytest.raises(ValueError, match=r"memory must be the encoder output \(B, S, C\)"):
        tr.make_cache(torch.zeros(2, 3, 8))


def test_no_dropout_module_runs_at_p_zero_or_in_eval():
    calls = []
    for dropout, train in ((0.0, True), (0.1, False)):
        model = smollm2_shaped_gpt(2, dropout=dropout, position_encoding="learned").train(train)
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.register_forward_pre_hook(lambda *a: calls.append(1))
        model(torch.randint(0, 256, (1, 5)))
    assert calls == []
    drop = smollm2_shaped_gpt(1, dropout=0.1).train()
    hits = []
    for m in drop.modules():
        if isinstance(m, nn.Dropout):
            m.register_forward_pre_hook(lambda *a: hits.append(1))
    drop(torch.randint(0, 256, (1, 5)))
    assert hits


def test_a_subclass_that_overrides_forward_runs_once():
    calls = []

    class Doubled(GPT):
        def forward(self, ids, **kw):
            calls.append(1)
            return super().forward(ids, **kw) * 2

    torch.manual_seed(0)
    model = Doubled(GPTConfig(vocab_size=50, n_layers=1, d_model=16, n_heads=2)).eval()
    plain = GPT(model.config).eval()
    plain.load_state_dict(model.state_dict())
    ids = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), 2 * plain(ids))
    assert calls == [1]


def test_what_a_model_is_handed_is_refused_where_it_is_used():
    from minitransformer.model import Transformer, TransformerConfig
    model = smollm2_shaped_gpt(1, vocab=50, d_model=16, n_heads=2, n_kv_heads=None, d_ff=32)
    ids = torch.randint(0, 50, (2, 3))
    with pytest.raises(ValueError, match="does not broadcast"):  # 3 heads for 2
        model(ids, full_attention_mask=torch.ones(2, 3, 3, 3, dtype=torch.bool))
    torch.manual_seed(0)
    tr = Transformer(TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16,
                                       n_heads=2, n_encoder_layers=1, n_decoder_layers=1))
    memory, source_mask = tr.encode(torch.randint(1, 20, (2, 4)))
    with pytest.raises(ValueError, match="has no cross-attention"):
        model(ids, cache=tr.make_cache(memory))
    with pytest.raises(ValueError, match="needs the encoder output"):
        tr.decode(ids.clamp(max=19), None, cache=model.make_cache(2))
    with pytest.raises(ValueError, match="KV cache overflow"):
        model(ids, cache=model.make_cache(2, max_len=2))
    with pytest.raises(ValueError, match=r"cache was allocated for .* \(2, 3, 8,"):
        model(ids, cache=DecoderCache.allocate(1, 2, 3, 8, 8))  # 3 K/V heads for 2


def test_a_model_call_reads_the_device_once_whatever_its_depth():
    ids = torch.randint(0, 256, (2, 9))
    positions = torch.arange(3, 12)
    for n_layers in (1, 6):
        model = smollm2_shaped_gpt(n_layers)
        with torch.no_grad():
            assert counted(lambda: model(ids))[1] == 1  # the token ids' range
            assert counted(lambda: model(ids, positions=positions))[1] == 1  # with theirs


def test_a_hook_inside_a_call_gets_the_same_checks():
    "Entry points called from a hook inside a model's call check as they do outside."
    model = smollm2_shaped_gpt(1)
    seen = []

    def hook(module, args, out):
        for check in (lambda: sample_next(torch.tensor([[0.0, float("nan")]])),
                      lambda: causal_mask(3, 2)):
            try:
                check()
            except ValueError as e:
                seen.append(str(e))

    model.decoder.norm.register_forward_hook(hook)
    generate(model, [[1, 2, 3]], 2)
    assert len(seen) == 4, seen  # two refusals, in each of the two calls
    assert "finite largest score" in seen[0]


def test_a_module_put_inside_a_model_is_trusted():
    """A building block checks its configuration, not its input: a norm of the wrong width
    put inside a stack fails in torch's own arithmetic (the model checks its ids)."""
    model = smollm2_shaped_gpt(1)
    model.decoder.layers[0].ff_norm = RMSNorm(8)  # the wrong width, inside the stack
    with pytest.raises(RuntimeError, match="must match the size"):
        model(torch.randint(0, 256, (1, 3)))


