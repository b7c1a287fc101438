"""Where the checks run (appendix D): configuration in `__init__`, shapes and dtypes where
they are used, tensor values once where a call enters the package (a model's forward on
ids, `generate`, the standalone functions), and no flag: a hook, a subclass or a user's
module inside a call gets the same checks as outside.

Pinned here: the Python calls into the package and the host reads per decoded token on
a 6-layer SmolLM2-shaped GPT; a model call reads the device once whatever its depth;
checks inside hooks; RMSNorm's one formula (gradcheck in float64, float32 arithmetic for
bfloat16, torch.func, a second derivative); rotary's one rotation.
"""
import os
import sys

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import minitransformer
from minitransformer.generation import generate, sample_next
from minitransformer.layers import RMSNorm
from minitransformer.masks import causal_mask
from minitransformer.model import GPT, GPTConfig
from minitransformer.positions import RotaryEmbedding

PACKAGE = os.path.dirname(minitransformer.__file__)
READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
         torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy}
SMOLLM2_SHAPE = dict(d_model=576, n_heads=9, n_kv_heads=3, d_ff=1536, max_len=128,
                     position_encoding="rotary", norm="rmsnorm", norm_eps=1e-5,
                     activation="swiglu", bias=False, rope_base=1e5)


class HostReads(TorchFunctionMode):
    "Counts the calls that copy a tensor's values to Python (a device sync on CUDA)."

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += func in READS
        return func(*args, **(kwargs or {}))


def counted(fn) -> tuple[int, int]:
    "(Python calls whose code lives in the package, host reads) of `fn()`."
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        calls += event == "call" and frame.f_code.co_filename.startswith(PACKAGE)

    with HostReads() as reads:
        sys.setprofile(profile)
        try:
            fn()
        finally:
            sys.setprofile(None)
    return calls, reads.n


def gpt(n_layers=6, vocab=256, **kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab, n_layers=n_layers, **(SMOLLM2_SHAPE | kw))).eval()


@pytest.mark.parametrize("prompts", [[[1, 2, 3, 4, 5]], [[1, 2, 3, 4, 5], [6, 7]]],
                         ids=["batch 1", "batch 2, padded"])
def test_a_decoded_token_costs_few_python_calls_and_one_host_read(prompts):
    model = gpt()
    generate(model, prompts, 2)  # warm-up
    c4, r4 = counted(lambda: generate(model, prompts, 4))
    c12, r12 = counted(lambda: generate(model, prompts, 12))
    calls, reads = (c12 - c4) / 8, (r12 - r4) / 8
    print(f"per decoded token: {calls:.0f} Python calls into the package, {reads:.0f} host "
          "read(s)")  # (pytest -s shows it)
    assert reads <= 1, f"{reads} host reads per decoded token"
    assert calls <= 170, f"{calls} Python calls into the package per decoded token"


def test_no_dropout_module_runs_at_p_zero_or_in_eval():
    calls = []
    for dropout, train in ((0.0, True), (0.1, False)):
        model = gpt(2, dropout=dropout, position_encoding="learned").train(train)
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.register_forward_pre_hook(lambda *a: calls.append(1))
        model(torch.randint(0, 256, (1, 5)))
    assert calls == []
    drop = gpt(1, dropout=0.1).train()
    hits = []
    for m in drop.modules():
        if isinstance(m, nn.Dropout):
            m.register_forward_pre_hook(lambda *a: hits.append(1))
    drop(torch.randint(0, 256, (1, 5)))
    assert hits


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_tables_rotate_exactly_as_the_pairs_formula(interleaved):
    "x·cos + swap(x)·(signed sin) is bit-equal to rotating each pair by its angle."
    rope = RotaryEmbedding(8, interleaved=interleaved)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, generator=g)
    positions = torch.randint(0, 4096, (2, 5), generator=g)
    theta = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    angles = positions.double()[..., None] * theta
    cos, sin = angles.cos().float()[:, None], angles.sin().float()[:, None]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        ref = torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)
    else:
        a, b = x.chunk(2, -1)
        ref = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
    assert torch.equal(rope(x, positions), ref)


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
    model = gpt(1, vocab=50, d_model=16, n_heads=2, n_kv_heads=None, d_ff=32)
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
    with pytest.raises(ValueError, match="does not fit a cache"):
        model.make_cache(2).self_attn[0].update(torch.zeros(2, 3, 1, 8),
                                                 torch.zeros(2, 3, 1, 8))


def test_a_model_call_reads_the_device_once_whatever_its_depth():
    ids = torch.randint(0, 256, (2, 9))
    positions = torch.arange(3, 12)
    for n_layers in (1, 6):
        model = gpt(n_layers)
        with torch.no_grad():
            assert counted(lambda: model(ids))[1] == 1  # the token ids' range
            assert counted(lambda: model(ids, positions=positions))[1] == 1  # with theirs


def test_with_a_stop_token_a_decoded_token_costs_one_more_read():
    model = gpt()
    prompts = [[1, 2, 3, 4, 5]]
    r4 = counted(lambda: generate(model, prompts, 4, stop_token=300))[1]
    r12 = counted(lambda: generate(model, prompts, 12, stop_token=300))[1]
    assert (r12 - r4) / 8 <= 2  # the model's check of the ids; whether rows stopped


def test_a_hook_inside_a_call_gets_the_same_checks():
    model = gpt(1)
    seen = []

    def hook(module, args, out):
        for check in (lambda: sample_next(torch.tensor([[0.0, float("nan")]])),
                      lambda: causal_mask(3, 2), lambda: module(torch.randn(1, 2, 5))):
            try:
                check()
            except ValueError as e:
                seen.append(str(e))

    model.decoder.norm.register_forward_hook(hook)
    generate(model, [[1, 2, 3]], 2)
    assert len(seen) == 6, seen  # three refusals, in each of the two calls
    assert "finite largest score" in seen[0] and "expected 576" in seen[2]


def test_a_module_put_inside_a_model_checks_its_input():
    model = gpt(1)
    model.decoder.layers[0].ff_norm = RMSNorm(8)  # the wrong width, inside the stack
    with pytest.raises(ValueError, match="x has width 576"):
        model(torch.randint(0, 256, (1, 3)))


def test_non_finite_logits_are_refused():
    with pytest.raises(ValueError, match="finite largest score"):
        sample_next(torch.tensor([[0.0, float("nan")]]), temperature=0)
    with pytest.raises(ValueError, match="finite largest score"):
        sample_next(torch.full((1, 3), float("-inf")), temperature=0.7)
    model = gpt(1)
    with torch.no_grad():
        model.head.weight.fill_(float("nan"))
    for stop_token in (None, 7):  # read at the end, or at every step
        with pytest.raises(ValueError, match="finite largest score"):
            generate(model, [[1, 2]], 3, stop_token=stop_token)


def test_rms_norm_passes_gradcheck_in_float64():
    torch.manual_seed(0)
    norm = RMSNorm(6, dtype=torch.float64)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(norm, (x,))
    assert torch.autograd.gradgradcheck(norm, (x,))  # a second derivative, too
    assert norm(x).dtype == torch.float64


def test_rms_norm_computes_bfloat16_in_float32():
    torch.manual_seed(0)
    norm = RMSNorm(16, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 16)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    half = norm.to(torch.bfloat16)(x.bfloat16())
    assert half.dtype == torch.bfloat16
    xb = x.bfloat16().float()
    w = norm.weight.float()
    want = xb * torch.rsqrt(xb.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    assert torch.equal(half, want.bfloat16())  # float32 arithmetic, rounded once
    torch.testing.assert_close(half.float(), ref, atol=0.05, rtol=0.02)


def test_rms_norm_under_torch_func():
    norm = RMSNorm(8)
    x = torch.randn(3, 8)
    plain = lambda x: (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).sum()
    torch.testing.assert_close(torch.func.grad(lambda x: norm(x).sum())(x),
                               torch.func.grad(plain)(x))
    torch.testing.assert_close(torch.func.vmap(norm)(x[:, None]), norm(x)[:, None])
