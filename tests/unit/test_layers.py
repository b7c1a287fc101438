"""minitransformer.layers: norms and layer configs refuse what they cannot build, what the
layers and stacks trust is refused where a model's call begins, and RMSNorm is exact (gradcheck in float64, bfloat16 computed in
float32, torch.func)."""

import pytest
import torch

from minitransformer.layers import EncoderLayer, LayerConfig, RMSNorm, make_norm
from minitransformer.model import GPT, GPTConfig, Transformer, TransformerConfig

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


def test_the_models_refuse_what_their_layers_trust():
    """The layers and stacks check their configuration only; what reaches them is checked
    once, where a model's call begins, naming the argument."""
    torch.manual_seed(0)
    tr = Transformer(TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16,
                                       n_heads=4, n_encoder_layers=1, n_decoder_layers=1))
    memory, source_mask = tr.encode(torch.randint(1, 20, (2, 7)))
    tgt = torch.randint(1, 20, (2, 5))
    with raises(ValueError, "decode needs the encoder output `memory`"):
        tr.decode(tgt, None)
    with raises(ValueError, "memory must be the encoder output (B, S, C) = (2, S, 16)"):
        tr.decode(tgt, torch.randn(3, 7, 16))
    with raises(ValueError, "source_mask must be (B, S) = (2, 7)"):
        tr.decode(tgt, memory, source_mask[:, :5])
    gpt = GPT(GPTConfig(vocab_size=20, d_model=16, n_heads=4, n_layers=1))
    with raises(TypeError, "positions must be an integer tensor"):
        gpt(tgt, positions=torch.arange(5.0))
    with raises(TypeError, "cache must be a DecoderCache (model.make_cache), got dict"):
        gpt(tgt, cache={})
    with raises(TypeError, "cache must be a DecoderCache (model.make_cache), got dict"):
        gpt.decoder.check_cache({}, 2, 5)  # what the model asks of its stack


def test_rms_norm_passes_gradcheck_in_float64():
    torch.manual_seed(0)
    norm = RMSNorm(6, dtype=torch.float64)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(norm, (x,))
    assert torch.autograd.gradgradcheck(norm, (x,))  # a second derivative, too
    assert norm(x).dtype == torch.float64


@pytest.mark.reduced_precision
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
