"""minitransformer.layers: norms and layer configs refuse what they cannot build, layers and
stacks refuse wrong inputs, and RMSNorm is exact (gradcheck in float64, bfloat16 computed in
float32, torch.func)."""

import torch

from minitransformer.layers import (
    Decoder,
    DecoderLayer,
    EncoderLayer,
    LayerConfig,
    RMSNorm,
    make_norm,
)
from minitransformer.masks import padding_mask

from helpers import raises


def test_make_norm_and_layer_config_refuse_what_they_cannot_build():
    with raises(ValueError,
                "kind must be one of ('layernorm', 'rmsnorm'), got 'batchnorm'"):
        make_norm("batchnorm", 12, 1e-5)
    with raises(ValueError, "d_model (30) must be divisible by n_heads (4)"):
        LayerConfig(d_model=30, n_heads=4)
    with raises(ValueError, "norm must be one of"):
        LayerConfig(norm="batchnorm")
    with raises(ValueError, "activation must be one of"):
        LayerConfig(activation="tanh")
    with raises(ValueError, "d_ff must be a positive int, got 0"):
        LayerConfig(d_ff=0)
    with raises(ValueError, "norm_eps must be a finite number > 0"):
        LayerConfig(norm_eps=0.0)
    with raises(TypeError, "cfg must be a LayerConfig, got dict"):
        EncoderLayer({"d_model": 16})


def test_layers_refuse_missing_or_unwanted_memory_and_wrong_widths():
    cfg = LayerConfig(d_model=16, n_heads=4, d_ff=40)
    enc, dec = EncoderLayer(cfg), DecoderLayer(cfg)
    gpt_block = DecoderLayer(cfg, cross_attention=False)
    tgt, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    with raises(ValueError, "needs the encoder output `memory` or a cross_cache"):
        dec(tgt)
    with raises(ValueError, "built with cross_attention=False"):
        gpt_block(tgt, memory)
    with raises(ValueError, "x has width 12 (shape (2, 7, 12))"):
        enc(torch.randn(2, 7, 12))
    with raises(ValueError, "x must hold at least one token"):
        enc(torch.randn(2, 0, 16))
    with raises(ValueError, "must have the batch size of x"):
        dec(tgt, torch.randn(3, 7, 16))
    with raises(ValueError, "memory_mask of shape"):
        dec(tgt, memory, memory_mask=padding_mask(torch.tensor([5, 4]), 5))


def test_stacks_refuse_positions_without_rotary_and_foreign_caches():
    cfg = LayerConfig(d_model=16, n_heads=4, d_ff=40, norm_first=True)
    stack = Decoder(cfg, 2, cross_attention=False)
    x = torch.randn(2, 3, 16)
    with raises(ValueError, "positions were given, but this stack has no rotary"):
        stack(x, positions=torch.arange(3))
    with raises(TypeError, "cache must be a DecoderCache (model.make_cache), got dict"):
        stack(x, cache={})


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
