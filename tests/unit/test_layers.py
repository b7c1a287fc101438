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


def _forward_source(cls) -> "ast.FunctionDef":
    import ast
    import inspect
    import textwrap
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.forward)))
    return tree.body[0]


@pytest.mark.parametrize("cls", ["EncoderLayer", "DecoderLayer"])
def test_a_pre_norm_layer_reads_like_its_residual_equations(cls):
    """In the pre-norm branch each sublayer is one `x = x + <call>` line and no helper
    does the wrapping: what a reader sees is what runs."""
    import ast
    from minitransformer import layers
    forward = _forward_source(getattr(layers, cls))
    branch = next(s for s in forward.body if isinstance(s, ast.If)
                  and "norm_first" in ast.unparse(s.test))
    lines = [s for s in ast.walk(ast.Module(branch.body, [])) if isinstance(s, ast.Assign)]
    wanted = 2 if cls == "EncoderLayer" else 3  # (attention, [cross-attention,] FFN)
    assert len(lines) == wanted, [ast.unparse(s) for s in lines]
    for line in lines:
        assert ast.unparse(line.targets[0]) == "x", ast.unparse(line)
        value = line.value
        assert isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)
        assert ast.unparse(value.left) == "x" and isinstance(value.right, ast.Call)
    called = {ast.unparse(n.func) for n in ast.walk(forward) if isinstance(n, ast.Call)}
    assert not [name for name in called if "residual" in name], called


@pytest.mark.parametrize("step", ["prompt", "cached token"])
def test_gpt_forward_reaches_attention_in_at_most_four_hops(step, monkeypatch):
    """From `GPT.forward` to PyTorch's attention kernel, at most four frames of the
    package in between (nanoGPT: two): the stack is walked at the kernel."""
    import traceback
    from minitransformer import attention
    model = GPT(GPTConfig(vocab_size=20, max_len=16, d_model=16, n_heads=2,
                          n_layers=1)).eval()
    kernel, stacks = attention.F.scaled_dot_product_attention, []

    def spy(*args, **kwargs):
        frames = [f.name for f in traceback.extract_stack()[:-1]
                  if "/minitransformer/" in f.filename.replace("\\", "/")]
        stacks.append(frames[frames.index("forward"):])  # (from the model's forward)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    ids = torch.tensor([[1, 2, 3]])
    if step == "prompt":
        model(ids)
    else:
        cache = model.make_cache(1)
        model(ids, cache=cache)
        stacks.clear()
        model(torch.tensor([[4]]), cache=cache)
    assert stacks, "the kernel was not reached"
    hops = len(stacks[0]) - 1  # (the frames after GPT.forward)
    assert hops <= 4, stacks[0]
