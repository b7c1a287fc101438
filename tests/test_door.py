"""Checks at the door (chapter 0): a public entry point checks its arguments once, then
runs its body with `door.checked` raised, so the package's own inner calls skip their
checks and read nothing back from the device.

Pinned here: the Python calls into the package and the host reads per decoded token on
a 6-layer SmolLM2-shaped GPT; host reads of a model call do not grow with depth; the
flag is lowered after errors and belongs to one thread; the per-call work that replaced
per-token work (rotary tables, dropout at p = 0, the fused RMSNorm) computes the same.
"""
import os
import sys
import threading

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import minitransformer
from minitransformer.checks import door, inside
from minitransformer.generation import generate, sample_next
from minitransformer.layers import RMSNorm
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


def test_a_model_call_reads_the_device_once_whatever_its_depth():
    ids = torch.randint(0, 256, (2, 9))
    positions = torch.arange(3, 12)
    for n_layers in (1, 6):
        model = gpt(n_layers)
        with torch.no_grad():
            assert counted(lambda: model(ids))[1] == 1  # the token ids' range
            assert counted(lambda: model(ids, positions=positions))[1] == 2  # and theirs


def test_the_flag_is_lowered_after_an_error_and_inner_calls_skip_checks():
    model = gpt(1)
    with pytest.raises(ValueError, match="ids must lie in"):
        model(torch.tensor([[300]]))
    assert not door.checked
    # inside the package, a module trusts what it is given: no check, no read
    x = torch.randn(1, 3, 576)
    assert counted(lambda: inside(model.decoder, x))[1] == 0
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        model.decoder(x.long())  # at the door it checks


def test_the_flag_belongs_to_one_thread():
    seen = []
    norm = RMSNorm(4)

    def other():
        try:
            norm(torch.randn(2, 5))  # a wrong width, while the main thread is inside
        except ValueError as e:
            seen.append(str(e))

    def body():
        t = threading.Thread(target=other)
        t.start()
        t.join()

    inside(body)
    assert seen and "expected 4" in seen[0]


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_rms_norm_has_autograds_gradients(dtype):
    g = torch.Generator().manual_seed(0)
    norm = RMSNorm(16, eps=1e-5, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16, generator=g))
    x = torch.randn(3, 7, 16, generator=g).to(dtype).requires_grad_()
    out = norm(x)
    grads = torch.autograd.grad((out.float() ** 2).sum(), (x, norm.weight))
    xf, w = x.detach().float().requires_grad_(), norm.weight.detach().float().requires_grad_()
    ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    refs = torch.autograd.grad((ref.to(dtype).float() ** 2).sum(), (xf, w))
    with torch.no_grad():
        assert torch.equal(out, norm(x))  # the same forward with and without autograd
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0.1, rtol=0.02)
    for got, want in zip(grads, refs):
        torch.testing.assert_close(got.float(), want, **tol)


def test_non_finite_logits_are_refused_with_the_one_read():
    with pytest.raises(ValueError, match="finite largest score"):
        sample_next(torch.tensor([[0.0, float("nan")]]), temperature=0)
    with pytest.raises(ValueError, match="finite largest score"):
        sample_next(torch.full((1, 3), float("-inf")), temperature=0.7)
    model = gpt(1)
    with torch.no_grad():
        model.head.weight.fill_(float("nan"))
    with pytest.raises(ValueError, match="finite largest score"):
        generate(model, [[1, 2]], 3)
    assert not door.checked and not door.no_empty_rows


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


def test_inside_restores_the_flag_it_found():
    def nested():
        inside(lambda: None)
        return door.checked

    assert inside(nested) is True and not door.checked


def test_what_the_stacks_used_to_check_is_still_refused_at_the_door():
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
    cache = model.make_cache(2)
    with pytest.raises(ValueError, match="one layer's part of a DecoderCache"):
        cache.self_attn[0].update(torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 8))


def test_rms_norm_under_torch_func_and_twice_differentiated():
    norm = RMSNorm(8)
    x = torch.randn(3, 8)
    plain = lambda x: (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).sum()
    torch.testing.assert_close(torch.func.grad(lambda x: norm(x).sum())(x),
                               torch.func.grad(plain)(x))
    x.requires_grad_()
    g, = torch.autograd.grad(norm(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):  # refused, not a wrong second derivative
        g.sum().backward()
