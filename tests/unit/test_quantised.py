"""minitransformer.quantised: the product-and-sum path equals dequantise-then-matmul, dtypes,
refusals with their values, `quantise`'s decisions (tied head, LoRA, every layer checked before
any is replaced), weight bytes, a compiled step with no weight-sized float buffer, and the PyTorch
tools a module must survive (block formats against gguf: tests/integration/test_quantised_gguf.py)."""

import copy
import pickle
import re

import pytest
import torch

from minitransformer.generation import generate
from minitransformer.lora import add_lora, merge_lora
from minitransformer.model import GPT, GPTConfig
from minitransformer.quantised import (
    KINDS,
    QuantisedEmbedding,
    QuantisedLinear,
    quantise,
    weight_bytes,
)


def _gpt(seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    cfg = dict(vocab_size=96, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, n_layers=2, max_len=48,
               activation="swiglu", norm="rmsnorm", bias=False, position_encoding="rotary")
    return GPT(GPTConfig(**(cfg | kw))).eval()


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("shape", [(64,), (1, 64), (3, 5, 64), (2, 1, 64)])
def test_product_and_sum_equals_dequantise_then_matmul(kind, shape):
    g = torch.Generator().manual_seed(4)
    w, b = torch.randn(48, 64, generator=g), torch.randn(48, generator=g)
    layer = QuantisedLinear.from_float(w, kind, bias=b)
    x = torch.randn(*shape, generator=g)
    want = x @ layer.dequantise().T + b
    got = layer(x)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-4), (kind, shape, (got - want).abs().max())


def test_bfloat16_input_computes_in_bfloat16():
    layer = QuantisedLinear.from_float(torch.randn(32, 64), "q4_1")
    x = torch.randn(2, 64)
    y = layer(x.bfloat16())
    assert y.dtype == torch.bfloat16
    assert torch.allclose(y.float(), layer(x), rtol=0.05, atol=0.5)  # bfloat16: 8-bit mantissas


def test_bad_inputs_and_blocks_are_refused_with_their_values():
    layer = QuantisedLinear.from_float(torch.randn(8, 64), "q8_0")
    with pytest.raises(ValueError, match="end in 64 features.*\\(2, 63\\)"):
        layer(torch.randn(2, 63))
    with pytest.raises(TypeError, match="float tensor"):
        layer(torch.ones(2, 64, dtype=torch.long))
    with pytest.raises(ValueError, match="multiple of 32.*40"):
        QuantisedLinear.from_float(torch.randn(8, 40), "q4_0")
    with pytest.raises(ValueError, match="kind"):
        QuantisedLinear.from_float(torch.randn(8, 64), "q3_k")
    with pytest.raises(TypeError, match="int32"):
        QuantisedLinear("q8_0", torch.zeros(2, 8, 4, dtype=torch.uint8), torch.ones(2, 4))
    with pytest.raises(ValueError, match="needs mins"):
        QuantisedLinear("q4_1", torch.zeros(2, 4, 4, dtype=torch.int32), torch.ones(2, 4))


def test_quantise_shares_one_table_for_a_tied_head_and_matches_its_dequantisation():
    model = _gpt()
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(5))
    quantise(model, "q8_0")
    assert isinstance(model.embed.tok, QuantisedEmbedding) and model.head is model.embed.tok.table
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    float_model = _gpt()
    with torch.no_grad():  # the same model with the dequantised weights
        for name, m in model.named_modules():
            if isinstance(m, QuantisedLinear) and m is not model.head:
                float_model.get_submodule(name).weight.copy_(m.dequantise())
        float_model.embed.tok.weight.copy_(model.head.dequantise())
        assert torch.allclose(model(ids), float_model(ids), atol=1e-4)
        assert torch.allclose(model(ids[:, :1]), float_model(ids[:, :1]), atol=1e-4)
    with pytest.raises(ValueError, match="95|96"):
        model.embed.tok(torch.tensor([[96]]))


def test_quantise_refuses_an_unmerged_lora_model_and_changes_nothing():
    model = _gpt()
    add_lora(model, targets=("q_proj", "v_proj"), r=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kinds = [type(m) for m in model.modules()]
    with pytest.raises(ValueError, match="merge_lora"):
        quantise(model, "int8")
    assert [type(m) for m in model.modules()] == kinds
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    merge_lora(model)
    quantise(model, "int8")
    assert isinstance(model.decoder.layers[0].self_attn.qkv.q_proj, QuantisedLinear)


def test_quantise_checks_every_layer_before_replacing_any():
    model = torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.Linear(8, 4))
    with pytest.raises(ValueError, match="multiple of 32.*8"):
        quantise(model, "q4_1")
    assert all(isinstance(m, torch.nn.Linear) for m in model)


def test_weight_bytes_counts_each_storage_once():
    model = _gpt()
    floats = weight_bytes(model)
    assert floats == sum({p.data_ptr(): p.nbytes for p in model.parameters()}.values())
    quantise(model, "q4_1")
    assert weight_bytes(model) < floats / 4


def _float_buffers(source: str) -> list[int]:
    "Sizes of the float32 buffers a generated inductor module allocates."
    shapes = re.findall(r"empty_strided_cpu\(\(([^)]*)\),[^)]*\), torch\.float32\)", source)
    sizes = []
    for s in shapes:
        dims = [d.strip() for d in s.split(",") if d.strip()]
        if all(d.isdigit() for d in dims):  # (symbolic sizes are the cache's lengths)
            sizes.append(int(torch.tensor([int(d) for d in dims]).prod()))
    return sizes


@pytest.mark.slow
def test_a_compiled_decoding_step_writes_no_weight_sized_float_buffer():
    from torch._inductor.utils import run_and_get_code
    model = quantise(_gpt(d_model=128, d_ff=256, vocab_size=64), "q4_1")  # weights >= 8,192
    prompt = [[1, 2, 3, 4]]
    eager = generate(model, prompt, 3)
    torch._dynamo.reset()
    compiled, sources = run_and_get_code(lambda: generate(model, prompt, 3, compile=True))
    assert compiled == eager
    smallest = min(m.in_features * m.out_features for m in model.modules()
                   if isinstance(m, QuantisedLinear))
    sizes = [n for src in sources for n in _float_buffers(src)]
    assert sizes, "no buffers found: has the generated code's form changed?"
    assert max(sizes) < smallest, (max(sizes), smallest)  # a float copy: >= a weight


def test_deepcopy_pickle_hooks_and_torch_func():
    model = quantise(_gpt(), "q4_0")
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        want = model(ids)
        assert torch.equal(copy.deepcopy(model)(ids), want)
        assert torch.equal(pickle.loads(pickle.dumps(model))(ids), want)
    layer = model.decoder.layers[0].ff.w2
    calls = []
    handle = layer.register_forward_hook(lambda m, a, out: calls.append(out.shape))
    with torch.no_grad():
        model(ids)
    handle.remove()
    assert calls == [torch.Size([1, 5, 64])]
    x = torch.randn(3, layer.in_features)
    grads = torch.func.vmap(torch.func.grad(lambda v: layer(v).sum()))(x)
    assert torch.allclose(grads, layer.dequantise().sum(0).expand(3, -1), atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_half_precision_layers_sum_in_float32(dtype, kind):
    "Inputs in the thousands (a real activation outlier) times 8-bit codes overflow float16 sums."
    g = torch.Generator().manual_seed(6)
    layer = QuantisedLinear.from_float(torch.randn(16, 64, generator=g) * 0.05, kind).to(dtype)
    assert layer.dtype == dtype
    x = torch.randn(2, 64, generator=g)
    x[0, 5] = 3000.0
    want = x.to(dtype).float() @ layer.dequantise().float().T
    got = layer(x.to(dtype))
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert torch.allclose(got.float(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item()), \
        (got.float() - want).abs().max()


def test_edge_inputs_empty_rows_and_non_tensors():
    layer = QuantisedLinear.from_float(torch.randn(8, 64), "q4_0", bias=torch.randn(8))
    assert layer(torch.randn(2, 0, 64)).shape == (2, 0, 8)
    with pytest.raises(TypeError, match="float tensor.*list"):
        layer([[1.0] * 64])
    with pytest.raises(ValueError, match="end in 64 features"):
        layer(torch.tensor(1.0))


def test_the_embedding_refuses_negative_and_outside_ids_by_value():
    emb = QuantisedEmbedding(QuantisedLinear.from_float(torch.randn(10, 32), "q8_0"))
    assert emb(torch.tensor([[0, 9]])).shape == (1, 2, 32)
    for bad in (-1, 10):
        with pytest.raises(ValueError, match=str(bad)):
            emb(torch.tensor([[1, bad]]))


def test_quantise_biases_skip_and_a_merged_lora_layer():
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
    bias, x = model[0].bias.detach().clone(), torch.randn(3, 64)
    quantise(model, "q8_0", skip=("2",))
    assert isinstance(model[0], QuantisedLinear) and type(model[2]) is torch.nn.Linear
    assert not model[0].bias.requires_grad and torch.equal(model[0].bias, bias)
    assert not model[0](x).requires_grad
    assert torch.allclose(model[0](x), x @ model[0].dequantise().T + bias, atol=1e-5)
    with pytest.raises(ValueError, match=r"skip names \['heads'\]"):
        quantise(_gpt(), "int8", skip=("heads",))
    with pytest.raises(TypeError, match="collection of layer names"):
        quantise(_gpt(), "int8", skip="head")
    with pytest.raises(ValueError, match="for one layer"):
        quantise(torch.nn.Linear(64, 8), "int8")
    lora = _gpt()
    add_lora(lora, targets=("q_proj",), r=2)
    with torch.no_grad():
        for m in lora.modules():
            if hasattr(m, "B") and isinstance(m.B, torch.nn.Parameter):
                m.B.normal_()
    merge_lora(lora)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        merged = lora(ids)
        quantise(lora, "q8_0")
        assert (lora(ids) - merged).abs().max() < 0.05  # the merged weights, rounded
