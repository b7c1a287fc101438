"""The blocks through PyTorch's int4/int8 kernels (minitransformer.fast_blocks): close to the
exact path while decoding, the exact path itself wherever it must be (gradients, adapters, hooked
layers, other CPUs), never saved, made again where the CPU changes."""
import copy
import os
import pickle
import subprocess
import sys

import pytest
import torch

from minitransformer.checkpoints import load_checkpoint, save_checkpoint
from minitransformer.fast_blocks import (
    FastBlocksLinear, FastFeedForward, FastQKV, fast_blocks, kernels_here)
from minitransformer.lora import add_lora
from minitransformer.model import GPT, GPTConfig
from minitransformer.quantised import quantise

needs_kernels = pytest.mark.skipif(not kernels_here(), reason="no vectorised int4 kernel here")
LINEARS = ("q_proj", "k_proj", "v_proj", "out", "w1", "w2", "w3")


def _exact(seed: int = 0) -> GPT:
    "A small SmolLM2-like GPT: Q4_1 blocks in every layer, a Q8_0 head."
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=96, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2,
                       d_ff=128, activation="swiglu", norm="rmsnorm",
                       position_encoding="rotary", tie_weights=False, max_len=64)
    model = quantise(GPT(config).eval(), "q8_0", skip=LINEARS)
    return quantise(model, "q4_1", skip=("head",))


def _kl(a: torch.Tensor, b: torch.Tensor) -> float:
    p, q = a.log_softmax(-1), b.log_softmax(-1)
    return float((p.exp() * (p - q)).sum(-1).mean())


def _same(a: dict, b: dict) -> bool:
    "Two state dicts hold the same names and bits (a QuantisedWeight: its blocks)."
    parts = lambda t: ([t.words, t.scales, t.mins] if hasattr(t, "words") else [t])
    return a.keys() == b.keys() and all(
        x is y or torch.equal(x, y) for k in a for x, y in zip(parts(a[k]), parts(b[k])))


IDS = torch.tensor([[5, 17, 33, 2, 90, 41, 8, 8, 60, 12, 3, 77]])


@needs_kernels
def test_decoding_takes_the_kernels_close_to_the_exact_path_with_the_same_state_dict():
    exact = _exact()
    fast = fast_blocks(copy.deepcopy(exact))
    kinds = [type(m) for m in fast.modules()]
    assert kinds.count(FastQKV) == 2 and kinds.count(FastFeedForward) == 2
    assert kinds.count(FastBlocksLinear) == 5  # out, w2 per layer; the Q8_0 head
    assert fast.state_dict().keys() == exact.state_dict().keys()
    with torch.no_grad():
        a, b = exact(IDS), fast(IDS)
    assert not torch.equal(a, b)  # bfloat16 activations: the kernels ran
    assert _kl(a, b) < 1e-3  # (bfloat16 rounds to 3 significant digits)
    back = fast_blocks(fast, fast=False)
    assert not any("Fast" in type(m).__name__ for m in back.modules())
    with torch.no_grad():
        assert torch.equal(back(IDS), a)  # switched back: bit for bit


def test_gradients_adapters_and_hooks_take_the_exact_path():
    exact = _exact()
    fast = fast_blocks(copy.deepcopy(exact))
    assert torch.equal(fast(IDS), exact(IDS))  # gradients recorded: exact, bit for bit
    for model in (exact, fast):  # QLoRA: adapters on the blocks, one training step
        torch.manual_seed(1)
        add_lora(model, targets=("q_proj", "v_proj", "out"))
    losses = []
    for model in (exact, fast):
        loss = model(IDS).logsumexp(-1).mean()
        loss.backward()
        losses.append(loss)
    assert torch.equal(*losses)
    layer = lambda m: m.decoder.layers[0].self_attn.qkv
    assert torch.equal(layer(fast).q_proj.A.grad, layer(exact).q_proj.A.grad)
    x = torch.randn(1, 12, 64)
    seen = []
    layer(fast).k_proj.register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():  # an adapter and a hook in the stack: q, k, v each exact
        for got, want in zip(layer(fast)(x), layer(exact)(x)):
            assert torch.equal(got, want)
    assert len(seen) == 1
    out = lambda m: m.decoder.layers[1].self_attn.out  # an adapter on a kernels' layer
    with torch.no_grad():
        assert torch.equal(out(fast)(x), out(exact)(x))


@needs_kernels
def test_the_kernels_copy_is_never_saved_and_is_made_again_after_to_and_pickle(tmp_path):
    exact = _exact()
    fast = fast_blocks(copy.deepcopy(exact))
    path = tmp_path / "fast.safetensors"
    save_checkpoint(fast, path)
    assert _same(load_checkpoint(path).state_dict(), exact.state_dict())
    assert not any("packed" in k or "kernel" in k for k in fast.state_dict())
    head = fast.head
    before = head.packed
    fast.to(torch.float16)
    assert head.kernel_scales.dtype == torch.bfloat16 and head.packed is not before
    again = pickle.loads(pickle.dumps(fast))
    with torch.no_grad():
        assert torch.equal(again(IDS), fast(IDS))


LOAD_CHILD = """
import pickle, sys, torch
from minitransformer.checkpoints import load_checkpoint
sys.path.insert(0, sys.argv[3])
from test_fast_blocks import _same
want = pickle.load(open(sys.argv[2], "rb"))
assert _same(load_checkpoint(sys.argv[1]).state_dict(), want)
"""


@needs_kernels
def test_a_checkpoint_of_a_fast_model_loads_bit_for_bit_under_another_capability(tmp_path):
    exact = _exact()
    save_checkpoint(fast_blocks(copy.deepcopy(exact)), tmp_path / "fast.safetensors")
    (tmp_path / "want.pkl").write_bytes(pickle.dumps(exact.state_dict()))
    env = os.environ | {"ATEN_CPU_CAPABILITY": "default"}
    subprocess.run([sys.executable, "-c", LOAD_CHILD, str(tmp_path / "fast.safetensors"),
                    str(tmp_path / "want.pkl"), os.path.dirname(__file__)], env=env,
                   check=True)


CHILD = """
import os, pickle, sys, torch
from minitransformer.fast_blocks import kernels_here
fast, exact, want = pickle.load(open(sys.argv[1], "rb"))
with torch.no_grad():
    got = fast(torch.tensor([[5, 17, 33, 2]]))
    if not kernels_here():
        assert fast.head.packed is None and torch.equal(got, exact(torch.tensor([[5, 17, 33, 2]])))
    else:
        assert (got - want).abs().max() < 0.05
print(os.environ["ATEN_CPU_CAPABILITY"], kernels_here())
"""


@needs_kernels
@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_another_cpu_makes_its_own_copy_or_takes_the_exact_path(tmp_path, capability):
    exact = _exact()
    fast = fast_blocks(copy.deepcopy(exact))
    with torch.no_grad():
        want = fast(IDS[:, :4])
    path = tmp_path / "models.pkl"
    path.write_bytes(pickle.dumps((fast, exact, want)))
    env = os.environ | {"ATEN_CPU_CAPABILITY": capability}
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], env=env, check=True,
                         capture_output=True, text=True).stdout
    assert out.split() == [capability, str(capability != "default")]


@needs_kernels
def test_a_compiled_step_on_the_kernels_matches_eager():
    from minitransformer.generation import generate
    fast = fast_blocks(_exact())
    with torch.no_grad():
        eager = generate(fast, IDS.tolist(), 6)
        compiled = generate(fast, IDS.tolist(), 6, compile=True)
    assert len(compiled[0]) == len(eager[0]) == 6
    with torch.no_grad():  # the same logits, up to the order of bfloat16 sums
        a = fast(torch.tensor([IDS[0].tolist() + eager[0]]))
    assert a.shape[1] == 18


@needs_kernels
def test_a_replaced_weight_or_a_trained_bias_is_never_multiplied_stale():
    from minitransformer.quantised import QuantisedWeight, quantised_linear
    torch.manual_seed(2)
    layer = quantised_linear(QuantisedWeight.from_float(torch.randn(32, 64), "q4_1"),
                             torch.nn.Parameter(torch.zeros(32)))
    model = fast_blocks(torch.nn.Sequential(layer).eval())
    assert type(layer) is FastBlocksLinear
    x = torch.randn(3, 64)
    with torch.no_grad():
        layer.bias += 10  # a trained bias: read at the call
        assert (layer(x) - torch.nn.functional.linear(x, layer.weight, layer.bias)).abs().max() < 0.5
        layer.weight = torch.nn.Parameter(QuantisedWeight.from_float(torch.randn(32, 64), "q4_1"),
                                          requires_grad=False)  # replaced: the exact path
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
        fast_blocks(model)  # made again: the kernels, close to the exact path
        assert not torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


@needs_kernels
def test_strided_empty_and_bfloat16_inputs_and_a_second_switch():
    exact = _exact()
    fast = fast_blocks(fast_blocks(copy.deepcopy(exact)))  # twice: still stacked
    kinds = [type(m) for m in fast.modules()]
    assert kinds.count(FastQKV) == 2 and kinds.count(FastBlocksLinear) == 5
    with torch.no_grad():
        h = torch.randn(2, 5, 64)
        for x in (h[:, -1:], h.transpose(0, 1), h[:, :0], h.bfloat16()[:, ::2]):
            got, want = fast.head(x), exact.head(x)
            assert got.shape == want.shape and got.dtype == want.dtype
            if want.numel():  # (bfloat16 activations: close, not equal)
                assert (got - want).float().abs().max() < 0.05 * want.float().abs().max()
        fast.train()  # training (without gradients): the exact path
        assert torch.equal(fast.head(h), exact.head(h))
