"""The package on CUDA, in float32 and bfloat16: the same results as on the CPU (float32) or within
bfloat16's precision. Skipped without CUDA; scripts/gpu_check.py (make gpu-check) runs it on a GPU."""

import warnings

import pytest
import torch

import minitransformer as mt
from helpers import smollm2_gguf
from minitransformer.attention import attention_with_weights, scaled_dot_product_attention
from minitransformer.generation import GenerationCache, generate
from minitransformer.layers import DecoderLayer, EncoderLayer, LayerConfig
from minitransformer.lora import add_lora
from minitransformer.masks import causal_mask, combine_masks, padding_mask
from minitransformer.model import GPT, GPTConfig, Transformer, TransformerConfig
from minitransformer.multihead import MultiHeadAttention
from minitransformer.positions import RotaryEmbedding
from minitransformer.quantised import load_gguf_blocks, quantise
from minitransformer.training import sequence_loss, train

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


@pytest.fixture(autouse=True)
def no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def close(a, b, dtype):
    return torch.allclose(a.float().cpu(), b.float().cpu(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_paths_match_cpu(dtype):
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 37, 24), torch.randn(3, 4, 41, 24), torch.randn(3, 4, 41, 40)
    mask = torch.rand(3, 1, 37, 41) < 0.8
    mask[0, 0, 5] = False
    ref, _ = attention_with_weights(q, k, v, mask)
    qc, kc, vc, mc = (t.cuda() for t in (q.to(dtype), k.to(dtype), v.to(dtype), mask))
    for out in (scaled_dot_product_attention(qc, kc, vc, mc), attention_with_weights(qc, kc, vc, mc)[0]):
        assert out.device.type == "cuda" and out.dtype == dtype
        assert not out.isnan().any()
        assert close(out, ref, dtype)
        assert (out[0, :, 5] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_multihead_and_layers_match_cpu(dtype):
    torch.manual_seed(0)
    cfg = LayerConfig(d_model=48, n_heads=4, d_ff=96, activation="swiglu", norm="rmsnorm",
                      norm_first=True)
    mods = [MultiHeadAttention(48, 4, rotary=RotaryEmbedding(12, 64)), EncoderLayer(cfg),
            DecoderLayer(cfg, cross_attention=False)]
    x = torch.randn(2, 19, 48)
    mask = combine_masks(padding_mask(torch.tensor([19, 11]), 19), causal_mask(19))
    for m in mods:
        m.eval()
        with torch.no_grad():
            ref = m(x, mask=mask)  # self-attention mask: `mask` for all three
            mc = m.to("cuda", dtype)
            xc, maskc = x.cuda().to(dtype), mask.cuda()
            out = mc(xc, mask=maskc)
        assert out.dtype == dtype and close(out, ref, dtype), type(m).__name__


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_generation_on_gpu(dtype):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=50, max_len=64, d_model=32, n_heads=4, n_layers=2,
                    position_encoding="rotary")
    gpt = GPT(cfg).cuda().to(dtype).eval()
    prompts = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    cached = generate(gpt, prompts, 20)
    assert all(len(c) == 20 for c in cached)
    assert gpt.make_cache(1).self_attn[0].k.device.type == "cuda"
    if dtype == torch.float32:  # exactness is a float32 claim
        assert cached == generate(gpt, prompts, 20, use_cache=False)
        assert cached == [generate(gpt, [p], 20)[0] for p in prompts]
    t_cfg = TransformerConfig(src_vocab_size=30, tgt_vocab_size=20, d_model=32, n_heads=4)
    t = Transformer(t_cfg).cuda().to(dtype).eval()
    out = generate(t, [[2], [2]], 10, source=[[5, 6, 7], [8, 9]])
    assert all(len(o) == 10 for o in out)


def test_training_step_with_bf16_autocast_on_gpu():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=20, max_len=16, d_model=32, n_heads=2, n_layers=1)).cuda()
    data = torch.arange(4, 20).repeat(4).cuda()
    batch = lambda step: (data[None, :15].expand(8, -1), data[None, 1:16].expand(8, -1))
    log = train(gpt, batch, lambda m, b: sequence_loss(m(b[0]), b[1]), steps=150, lr=3e-3, warmup=10,
                log_every=0, autocast_bf16=True)
    assert log.losses[-1] < 0.2 < log.losses[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_is_causal_and_fused_rms_norm_match_cpu(dtype):
    "The two CUDA-only fast paths: is_causal without a mask (flash), torch's fused rms_norm."
    from minitransformer.layers import RMSNorm
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 33, 16) for _ in range(3))
    ref = scaled_dot_product_attention(q, k, v, mask=causal_mask(33))
    fast = scaled_dot_product_attention(*(t.cuda().to(dtype) for t in (q, k, v)), is_causal=True)
    assert close(fast, ref, dtype)
    norm, x = RMSNorm(16, eps=1e-5), torch.randn(3, 5, 16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    ref = norm(x)
    out = norm.cuda().to(dtype)(x.cuda().to(dtype))
    assert out.dtype == dtype and close(out, ref, dtype)


def _count_graphs(monkeypatch) -> dict[str, int]:
    "Counts, from now on, of CUDA graphs recorded (capture_begin) and replayed."
    seen = {"recorded": 0, "replayed": 0}
    begin, replay = torch.cuda.CUDAGraph.capture_begin, torch.cuda.CUDAGraph.replay

    def counted(name, fn):
        def call(self, *args, **kw):
            seen[name] += 1
            return fn(self, *args, **kw)
        return call
    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", counted("recorded", begin))
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counted("replayed", replay))
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_generation_records_one_cuda_graph_and_replays_it(dtype, monkeypatch):
    """generate(..., compile=True) on CUDA, three calls of one shape on one GenerationCache:
    inductor skips no CUDA graph, the first call records the step's graph once (a recording
    replays it once too), the later calls record nothing and replay it once a token after the
    prompt's, all three write the same tokens, each the eager model's likeliest up to its
    dtype's rounding (a near tie may flip between compiled and eager kernels, in float32 too)."""
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=50, max_len=128, d_model=32, n_heads=4, n_layers=2,
                    position_encoding="rotary")
    gpt = GPT(cfg).cuda().to(dtype).eval()
    prompts = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    counters.clear()
    seen, held, calls = _count_graphs(monkeypatch), GenerationCache(), []
    for _ in range(3):
        before = dict(seen)
        calls.append((generate(gpt, prompts, 20, compile=True, cache=held),
                      {k: seen[k] - before[k] for k in seen}))
    (first, one), (again, two), (third, three) = calls
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert one == {"recorded": 1, "replayed": 18}, one  # a warm-up, a recording (replayed)
    assert two == three == {"recorded": 0, "replayed": 19}  # the prompt's step is eager
    assert again == first == third  # the same graph on the same machine: the same tokens
    _assert_greedy_up_to_rounding(gpt, prompts, again)
    if dtype == torch.bfloat16:  # (once) an encoder–decoder's step, replayed too
        t_cfg = TransformerConfig(src_vocab_size=30, tgt_vocab_size=20, d_model=32, n_heads=4)
        t = Transformer(t_cfg).cuda().eval()
        sources = [[5, 6, 7], [8, 9]]
        out = generate(t, [[2], [2]], 10, source=sources, compile=True)
        _assert_greedy_up_to_rounding(t, [[2], [2]], out, sources)
        assert counters["inductor"]["cudagraph_skips"] == 0


def _assert_greedy_up_to_rounding(model, prompts, generated, sources=None) -> None:
    """Each generated token's logit, recomputed eagerly without a cache, is within a few steps of
    its dtype's rounding of that row's largest: a near tie may go either way, nothing else may.
    `sources`: an encoder–decoder's, one per prompt."""
    for b, (prompt, new) in enumerate(zip(prompts, generated)):
        ids = torch.tensor([prompt + new], device="cuda")
        with torch.no_grad():
            args = (ids[:, :-1],) if sources is None else (
                torch.tensor([sources[b]], device="cuda"), ids[:, :-1])
            logits = model(*args)[0, len(prompt) - 1:].float()  # predicting `new`
        chosen = logits.gather(-1, ids[0, len(prompt):, None])[:, 0]
        bound = 8 * torch.finfo(next(model.parameters()).dtype).eps * logits.abs().max()
        gap = logits.amax(-1) - chosen
        assert (gap <= bound).all(), (gap.max(), bound)


@pytest.mark.parametrize("backend", ["MATH", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_query_that_sees_no_key_gets_zeros_under_each_sdpa_backend(backend, dtype):
    """`attend` zeroes such a row whatever torch's kernel gave it (scripts/gpu_check.py
    prints what each kernel gives on its own)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from minitransformer.attention import attend
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 9, 64, device="cuda", dtype=dtype) for _ in range(3))
    mask = torch.rand(2, 1, 9, 9, device="cuda") < 0.7
    mask[1, 0, 3] = False
    try:
        with sdpa_kernel([getattr(SDPBackend, backend)]):
            out = attend(q, k, v, mask)
    except RuntimeError as e:  # this backend takes no such input here
        pytest.skip(f"{backend}: {str(e)[:80]}")
    ref, _ = attention_with_weights(q.float(), k.float(), v.float(), mask)
    assert (out[1, :, 3] == 0).all() and not out.isnan().any()
    assert close(out, ref, dtype)


def test_rotary_tables_follow_the_model_to_cuda_and_a_cpu_generator_is_refused(tmp_path):
    """The tables stay on the GPU, in float32, through a cast after `.cuda()` and after
    loading a checkpoint onto the GPU; sampling's draws need a generator of the model's
    device, and one on the CPU is refused before any step."""
    from minitransformer.checkpoints import load_checkpoint, save_checkpoint
    cfg = GPTConfig(vocab_size=50, max_len=64, d_model=32, n_heads=4, n_layers=2,
                    position_encoding="rotary")
    gpt = GPT(cfg).cuda().to(torch.bfloat16).eval()
    rotary = gpt.decoder.rotary
    assert rotary.cos.device.type == "cuda" and rotary.cos.dtype == torch.float32
    path = save_checkpoint(GPT(cfg), tmp_path / "gpt.safetensors")
    loaded = load_checkpoint(path, map_location="cuda")
    assert loaded.decoder.rotary.sin.device.type == "cuda"
    assert len(generate(loaded.eval(), [[1, 2]], 4)[0]) == 4
    with pytest.raises(ValueError, match="generator is on cpu"):
        generate(gpt, [[1, 2]], 3, temperature=0.8, generator=torch.Generator())


def _syncs(fn) -> int:
    "How many synchronising CUDA calls `fn()` makes (torch's sync debug mode, as warnings)."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def test_the_token_loop_synchronises_nothing_but_the_tokens_it_must_read():
    """Without stop ids or a callback, a compiled generate reads the device once, at the end:
    30 more tokens add no synchronising call; with a callback, each new token is read once."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=50, max_len=128, d_model=32, n_heads=4, n_layers=2,
                        position_encoding="rotary")).cuda().eval()
    held, prompts = GenerationCache(), [[5, 6, 7], [8, 9]]
    for n in (10, 40):  # compiled, warmed up and recorded for the cache size of both
        generate(gpt, prompts, n, compile=True, cache=held)
    run = lambda n, **kw: _syncs(lambda: generate(gpt, prompts, n, compile=True, cache=held, **kw))
    assert run(40) == run(10)
    assert run(40, callback=lambda new: None) - run(10, callback=lambda new: None) == 30


@pytest.mark.parametrize("kind", ["int8", "q8_0", "q4_0"])
def test_quantised_weights_decode_on_cuda_eager_and_compiled(kind):
    """A model quantised on the CPU moves to the GPU with its blocks: the same logits as on
    the CPU (float32 sums in another order), and eager and compiled generation each write the
    model's likeliest tokens up to rounding."""
    torch.manual_seed(0)
    gpt = quantise(GPT(GPTConfig(vocab_size=64, max_len=64, d_model=64, n_heads=4,
                                 n_layers=2, position_encoding="rotary")).eval(), kind)
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        ref = gpt(ids)
        gpu = gpt.cuda()
        assert torch.allclose(gpu(ids.cuda()).cpu(), ref, atol=1e-4, rtol=1e-4)
    prompts = [[5, 6, 7], [8]]
    for compile in (False, True):
        _assert_greedy_up_to_rounding(gpu, prompts, generate(gpu, prompts, 12, compile=compile))


def test_the_files_blocks_decode_on_cuda():
    "SmolLM2 kept in its file's Q4_1 blocks, on the GPU: eager and compiled greedy decoding."
    pytest.importorskip("gguf")
    lm = load_gguf_blocks(smollm2_gguf(), max_len=128, device="cuda")
    prompts = [lm.tokenizer.encode("The capital of France is")]
    for compile in (False, True):
        _assert_greedy_up_to_rounding(lm.model, prompts,
                                      generate(lm.model, prompts, 8, compile=compile))


@pytest.mark.parametrize("kind", [None, "q4_0"])
def test_lora_and_qlora_train_on_cuda(kind):
    """LoRA on a float model, and QLoRA (LoRA over 4-bit blocks): a few AdamW steps on the GPU
    lower the loss, and only the adapters change."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=64, max_len=64, d_model=64, n_heads=4, n_layers=2,
                        position_encoding="rotary"))
    if kind:
        quantise(gpt, kind)
    add_lora(gpt, targets=("q_proj", "v_proj"), r=4)
    gpt = gpt.cuda().train()
    frozen = {n: p.detach().clone() for n, p in gpt.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in gpt.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW([p for p in gpt.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1)).cuda()
    losses = []
    for _ in range(8):
        loss = sequence_loss(gpt(ids[:, :-1]), ids[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses
    same = lambda a, b: (all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("words", "scales"))
                         if hasattr(a, "words") else torch.equal(a, b))  # blocks: their codes
    assert all(same(p, frozen[n]) and p.grad is None
               for n, p in gpt.named_parameters() if n in frozen)
    assert all(not torch.equal(p, adapters[n]) for n, p in gpt.named_parameters()
               if n in adapters and n.endswith(".B"))  # the updates moved off zero


def test_the_front_door_on_cuda():
    """mt.load(..., device="cuda"): the GGUF model's logits within float32 rounding of the
    CPU's, a chat reply, and compiled sampled generation that repeats with its seed."""
    pytest.importorskip("gguf")
    cpu = mt.load(smollm2_gguf(), max_len=256)
    lm = mt.load(smollm2_gguf(), max_len=256, device="cuda")
    ids = torch.tensor([lm.tokenizer.encode("The capital of France is")])
    with torch.no_grad():
        assert torch.allclose(lm.model(ids.cuda()).cpu(), cpu.model(ids), atol=2e-3, rtol=1e-3)
    reply = lm.chat("What is the capital of France?", max_new_tokens=16)
    assert isinstance(reply, str) and reply.strip()
    rows = [ids[0].tolist()]
    draws = [generate(lm.model, rows, 16, compile=True, temperature=0.8, top_p=0.9,
                      generator=torch.Generator("cuda").manual_seed(0)) for _ in range(2)]
    assert draws[0] == draws[1] and len(draws[0][0]) == 16
