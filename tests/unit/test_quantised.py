"""minitransformer.quantised: a `QuantisedWeight` inside an `nn.Linear` computes what its
dequantised weight does (eager and compiled), allows only its listed ops, keeps its codes through
`.to()`, allocates at most twice a float weight per eager call, and serves LoRA as a frozen base
(QLoRA) without saving a float copy; `quantise`'s decisions (tied head, LoRA, every layer checked
before any is changed), weight bytes, a compiled step with no weight-sized float buffer, and the
PyTorch tools a model must survive (block formats against gguf:
tests/integration/test_quantised_gguf.py)."""

import copy
import pickle
import re

import pytest
import torch

from minitransformer.generation import generate
from minitransformer.lora import add_lora, merge_lora
from minitransformer.model import GPT, GPTConfig
from minitransformer.quantised import (
    FORMATS,
    QuantisedWeight,
    quantise,
    quantised_linear,
    weight_bytes,
)


def _layer(w: torch.Tensor, kind: str, bias: torch.Tensor | None = None) -> torch.nn.Linear:
    "An nn.Linear holding `w` rounded to `kind`."
    return quantised_linear(QuantisedWeight.from_float(w, kind), bias)


def _gpt(seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    cfg = dict(vocab_size=96, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, n_layers=2, max_len=48,
               activation="swiglu", norm="rmsnorm", bias=False, position_encoding="rotary")
    return GPT(GPTConfig(**(cfg | kw))).eval()


@pytest.mark.parametrize("kind", list(FORMATS))
@pytest.mark.parametrize("shape", [(64,), (1, 64), (3, 5, 64), (2, 1, 64)])
def test_product_and_sum_equals_dequantise_then_matmul(kind, shape):
    g = torch.Generator().manual_seed(4)
    w, b = torch.randn(48, 64, generator=g), torch.randn(48, generator=g)
    layer = _layer(w, kind, b)
    x = torch.randn(*shape, generator=g)
    want = x @ layer.weight.dequantise().T + b
    got = layer(x)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-4), (kind, shape, (got - want).abs().max())
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, dynamic=False)(x)  # product and sum
    assert torch.allclose(compiled, want, atol=1e-4), (kind, shape, (compiled - want).abs().max())


@pytest.mark.reduced_precision
def test_bfloat16_input_computes_in_bfloat16():
    layer = _layer(torch.randn(32, 64), "q4_1")
    x = torch.randn(2, 64)
    y = layer(x.bfloat16())
    assert y.dtype == torch.bfloat16
    assert torch.allclose(y.float(), layer(x), rtol=0.05, atol=0.5)  # bfloat16: 8 significant bits (7 stored)


def test_bad_inputs_and_blocks_are_refused_with_their_values():
    layer = _layer(torch.randn(8, 64), "q8_0")
    with pytest.raises(ValueError, match="end in 64 features.*\\(2, 63\\)"):
        layer(torch.randn(2, 63))
    with pytest.raises(TypeError, match="float tensor"):
        layer(torch.ones(2, 64, dtype=torch.long))
    with pytest.raises(ValueError, match="multiple of 32.*40"):
        QuantisedWeight.from_float(torch.randn(8, 40), "q4_0")
    with pytest.raises(ValueError, match="kind"):
        QuantisedWeight.from_float(torch.randn(8, 64), "q3_k")
    with pytest.raises(TypeError, match="int32"):
        QuantisedWeight("q8_0", torch.zeros(2, 8, 4, dtype=torch.uint8), torch.ones(2, 4))
    with pytest.raises(ValueError, match="needs mins"):
        QuantisedWeight("q4_1", torch.zeros(2, 4, 4, dtype=torch.int32), torch.ones(2, 4))
    with pytest.raises(TypeError, match="QuantisedWeight"):
        quantised_linear(torch.randn(8, 64))


def test_quantise_shares_one_table_for_a_tied_head_and_matches_its_dequantisation():
    model = _gpt()
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(5))
    quantise(model, "q8_0")
    assert isinstance(model.head.weight, QuantisedWeight)
    assert model.head.weight is model.embed.tok.weight  # one weight, both read
    assert all(isinstance(m.weight, QuantisedWeight) for m in model.modules()
               if isinstance(m, torch.nn.Linear))
    float_model = _gpt()
    with torch.no_grad():  # the same model with the dequantised weights
        float_model.load_state_dict(model.state_dict())  # copying a QuantisedWeight dequantises
        assert torch.allclose(model(ids), float_model(ids), atol=1e-4)
        assert torch.allclose(model(ids[:, :1]), float_model(ids[:, :1]), atol=1e-4)
    with pytest.raises(ValueError, match="95|96"):
        model(torch.tensor([[96]]))


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
    q_proj = model.decoder.layers[0].self_attn.qkv.q_proj
    assert type(q_proj) is torch.nn.Linear and isinstance(q_proj.weight, QuantisedWeight)
    with pytest.raises(ValueError, match="quantised already"):
        quantise(model, "int8")


def test_quantise_checks_every_layer_before_replacing_any():
    model = torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.Linear(8, 4))
    with pytest.raises(ValueError, match="multiple of 32.*8"):
        quantise(model, "q4_1")
    assert not any(isinstance(m.weight, QuantisedWeight) for m in model)


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
        if all(d.isdigit() for d in dims):  # (every size is static: all numbers)
            sizes.append(int(torch.tensor([int(d) for d in dims]).prod()))
    return sizes


@pytest.mark.slow
@pytest.mark.skipif(tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 13),
                    reason="a property of inductor's code, not of the results: before torch 2.13 "
                    "it does not fuse the product and sum into one loop (2.7.1-2.12.1 write one "
                    "float buffer the size of a weight, and compute the same numbers)")
def test_a_compiled_decoding_step_writes_no_weight_sized_float_buffer():
    from torch._inductor.utils import run_and_get_code
    model = quantise(_gpt(d_model=128, d_ff=256, vocab_size=64), "q4_1")  # weights >= 8,192
    prompt = [[1, 2, 3, 4]]
    eager = generate(model, prompt, 3)
    torch._dynamo.reset()
    compiled, sources = run_and_get_code(lambda: generate(model, prompt, 3, compile=True))
    assert compiled == eager
    smallest = min(p.numel() for p in model.parameters() if isinstance(p, QuantisedWeight))
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
    assert torch.allclose(grads, layer.weight.dequantise().sum(0).expand(3, -1), atol=1e-4)
    exported = torch.export.export(layer, (x,)).module()
    assert torch.allclose(exported(x), layer(x), atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
@pytest.mark.reduced_precision
def test_half_precision_layers_sum_in_float32(dtype, kind):
    "Inputs in the thousands (a real activation outlier) times 8-bit codes overflow float16 sums."
    g = torch.Generator().manual_seed(6)
    layer = _layer(torch.randn(16, 64, generator=g) * 0.05, kind).to(dtype)
    assert layer.weight.dtype == dtype and layer.weight.words.dtype == torch.int32
    x = torch.randn(2, 64, generator=g)
    x[0, 5] = 3000.0
    want = x.to(dtype).float() @ layer.weight.dequantise().float().T
    torch._dynamo.reset()
    got = torch.compile(layer, fullgraph=True, dynamic=False)(x.to(dtype))  # product and sum
    assert got.dtype == dtype and torch.isfinite(got).all()
    # what is claimed is no overflow (inf) and sums kept in float32: the output is rounded once
    # to the dtype (2^-9 in bfloat16, 2^-12 in float16), its inputs and weights too; 2e-2 is
    # several such steps, and an overflowing or float16-summed result misses it by far
    assert torch.allclose(got.float(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item()), \
        (got.float() - want).abs().max()


def test_edge_inputs_empty_rows_and_non_tensors():
    layer = _layer(torch.randn(8, 64), "q4_0", torch.randn(8))
    assert layer(torch.randn(2, 0, 64)).shape == (2, 0, 8)
    with pytest.raises(TypeError, match="must be Tensor, not list"):  # as any nn.Linear
        layer([[1.0] * 64])
    with pytest.raises(ValueError, match="end in 64 features"):
        layer(torch.tensor(1.0))


def test_the_quantised_table_fails_like_a_float_one_outside_its_ids():
    from minitransformer.embeddings import TokenEmbedding
    emb = TokenEmbedding(10, 32)
    emb.weight = torch.nn.Parameter(QuantisedWeight.from_float(emb.weight, "q8_0"),
                                    requires_grad=False)
    assert emb(torch.tensor([[0, 9]])).shape == (1, 2, 32)
    assert torch.equal(emb(torch.tensor([3])), emb.weight.dequantise()[3:4])
    for bad in (-1, 10):  # (the module trusts its ids, as over a float table; a model
        with pytest.raises(IndexError, match="out of range"):  # names the id first)
            emb(torch.tensor([[1, bad]]))


def test_quantise_biases_skip_and_a_merged_lora_layer():
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
    bias, x = model[0].bias.detach().clone(), torch.randn(3, 64)
    quantise(model, "q8_0", skip=("2",))
    assert isinstance(model[0].weight, QuantisedWeight)
    assert not isinstance(model[2].weight, QuantisedWeight)
    assert not model[0].weight.requires_grad and torch.equal(model[0].bias, bias)
    assert torch.allclose(model[0](x), x @ model[0].weight.dequantise().T + bias, atol=1e-5)
    with pytest.raises(ValueError, match=r"skip names \['heads'\]"):
        quantise(_gpt(), "int8", skip=("heads",))
    with pytest.raises(TypeError, match="collection of layer names"):
        quantise(_gpt(), "int8", skip="head")
    with pytest.raises(ValueError, match="for one weight"):
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


def test_only_the_listed_ops_reach_the_blocks():
    "An op outside the allow-list raises instead of dequantising silently."
    w = QuantisedWeight.from_float(torch.randn(8, 64), "q4_1")
    for op in (lambda: w + 1, lambda: w.sum(), lambda: w @ torch.randn(64, 2),
               lambda: w.reshape(64, 8), lambda: w.add_(1), lambda: torch.relu(w),
               lambda: w.T, lambda: torch.randn(64, 8) @ w.t()):
        with pytest.raises(NotImplementedError, match="dequantise it"):
            op()
    with pytest.raises(NotImplementedError, match="dequantise it"):
        w.copy_(torch.randn(8, 64))  # floats into the blocks: refused, not rounded
    floats = torch.empty(8, 64, dtype=torch.float64).copy_(w)  # out of the blocks: floats
    assert torch.equal(floats, w.dequantise().double())
    for view in (w.detach(), w.clone(), copy.deepcopy(w), torch.ops.aten.alias(w)):
        assert isinstance(view, QuantisedWeight) and torch.equal(view.words, w.words)
    moved = w.to(torch.float64)  # a copy: its blocks are its own
    assert moved.words.data_ptr() != w.words.data_ptr() and torch.equal(moved.words, w.words)
    with pytest.raises(NotImplementedError, match="share its blocks"):
        w.share_memory_()
    x = torch.randn(64, requires_grad=True)  # one input row, 1-D, as nn.Linear takes it
    bias = torch.zeros(8, requires_grad=True)
    torch.nn.functional.linear(input=x, weight=w, bias=bias).sum().backward()
    assert torch.equal(bias.grad, torch.ones(8)) and x.grad.shape == (64,)
    with pytest.raises(NotImplementedError, match="max_norm"):
        torch.nn.functional.embedding(torch.tensor([1]), w, max_norm=1.0)
    assert "kind='q4_1'" in repr(w) and w.shape == (8, 64) and w.dtype == torch.float32


def test_to_moves_the_blocks_and_converts_only_the_scales():
    model = quantise(_gpt(), "q4_1")
    model.to(torch.float64)
    w = model.decoder.layers[0].ff.w1.weight
    assert isinstance(w, QuantisedWeight) and w.dtype == torch.float64
    assert w.words.dtype == torch.int32 and w.scales.dtype == w.mins.dtype == torch.float64
    assert model.head.weight is model.embed.tok.weight
    assert model(torch.tensor([[1, 2, 3]])).dtype == torch.float64


def _self_bytes(fn) -> int:
    "Bytes the CPU ops of `fn()` allocate (the profiler's self memory, summed)."
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return sum(max(e.self_cpu_memory_usage, 0) for e in prof.key_averages())


def test_an_eager_call_allocates_at_most_twice_the_float_weight():
    "One row through a 1536 x 576 q4_1 layer; a lookup of a few rows: far less than the table."
    layer = _layer(torch.randn(1536, 576, generator=torch.Generator().manual_seed(8)), "q4_1")
    x, floats = torch.randn(1, 576), 1536 * 576 * 4
    with torch.no_grad():
        layer(x)  # (warm)
        allocated = _self_bytes(lambda: layer(x))
    assert allocated <= 2 * floats, allocated / floats
    ids = torch.tensor([[5, 17, 900]])
    looked_up = _self_bytes(lambda: torch.nn.functional.embedding(ids, layer.weight))
    assert looked_up < floats / 100, looked_up


def test_lora_on_a_quantised_model_trains_the_adapter_and_keeps_no_float_weight():
    "QLoRA: the blocks frozen, the adapter in float32, gradients those of LoRA on the floats."
    from minitransformer.lora import LoRALinear
    model = quantise(_gpt(), "q4_1")
    assert add_lora(model, targets=("q_proj", "v_proj", "w1"), r=2)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith((".A", ".B")) for n in trainable), trainable
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    model(ids).logsumexp(-1).mean().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if n in trainable)
    with pytest.raises(ValueError, match=r"quantised blocks.*save_folder"):
        merge_lora(model)  # (the route it names: test_qloras_ending_...)
    # one layer against LoRA on its dequantised weight: the same numbers, summed otherwise
    g = torch.Generator().manual_seed(9)
    base = _layer(torch.randn(96, 64, generator=g), "q4_1")
    floats = torch.nn.Linear(64, 96, bias=False)
    floats.weight = torch.nn.Parameter(base.weight.dequantise())
    ours, theirs = LoRALinear(base, 4, 8.0), LoRALinear(floats, 4, 8.0)
    assert ours.fingerprint == theirs.fingerprint  # the blocks hash as the floats they hold
    with torch.no_grad():
        ours.B.normal_(generator=g)
        theirs.A.copy_(ours.A), theirs.B.copy_(ours.B)
    x = torch.randn(5, 64, generator=g, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    ours(x).square().sum().backward()
    theirs(x2).square().sum().backward()
    for a, b in ((ours.A.grad, theirs.A.grad), (ours.B.grad, theirs.B.grad), (x.grad, x2.grad)):
        assert (a - b).norm() <= 1e-5 * b.norm(), (a - b).norm() / b.norm()
    saved = []  # what autograd keeps for backward: no float tensor the size of the weight

    def pack(t):
        if type(t) is torch.Tensor and t.is_floating_point() and t.numel() >= 96 * 64:
            saved.append(tuple(t.shape))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ours(torch.randn(1, 64, requires_grad=True)).sum()
    assert not saved, saved
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        theirs(torch.randn(1, 64, requires_grad=True)).sum()
    assert saved, "the check cannot see a saved float weight"


def test_a_compiled_qlora_step_and_vmap_of_grad():
    from minitransformer.lora import LoRALinear
    layer = LoRALinear(_layer(torch.randn(32, 64), "q8_0"), 2, 4.0)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    x = torch.randn(3, 64)
    compiled(x).sum().backward()
    assert layer.A.grad is not None and layer.B.grad is not None
    params = {n: p.detach() for n, p in layer.named_parameters() if p.requires_grad}
    per_example = torch.func.vmap(torch.func.grad(
        lambda p, xi: torch.func.functional_call(layer, p, (xi[None],)).sum()),
        in_dims=(None, 0))(params, x)
    assert per_example["B"].shape == (3, 32, 2)


def test_a_quantised_checkpoint_round_trips_bit_for_bit(tmp_path):
    from minitransformer.checkpoints import load_checkpoint, save_checkpoint
    from safetensors import safe_open
    model, ids = quantise(_gpt(), "q4_1"), torch.tensor([[3, 1, 4, 1, 5]])
    path = save_checkpoint(model, tmp_path / "q.safetensors")
    with safe_open(path, framework="pt") as f:
        stored = sum(f.get_tensor(k).nbytes for k in f.keys())
        assert not any(f.get_tensor(k).is_floating_point() and f.get_tensor(k).numel() >= 64 * 64
                       for k in f.keys() if "norm" not in k), "a float copy of a weight"
    assert stored == weight_bytes(model)  # the blocks, each once: the file is them + a header
    again = load_checkpoint(path)
    for (name, a), (_, b) in zip(model.named_parameters(), again.named_parameters()):
        assert type(a) is type(b) and a.requires_grad == b.requires_grad, name
        if isinstance(a, QuantisedWeight):
            assert a.kind == b.kind and all(torch.equal(getattr(a, k), getattr(b, k))
                                            for k in ("words", "scales", "mins")), name
    assert again.head.weight is again.embed.tok.weight
    with torch.no_grad():
        assert torch.equal(again(ids), model(ids))
        floats = load_checkpoint(path, _gpt(1))  # into a float model: dequantised
        assert torch.allclose(floats(ids), model(ids), atol=1e-4)
        blocks = load_checkpoint(path, quantise(_gpt(1), "q4_1"))  # into blocks: the blocks
        assert torch.equal(blocks(ids), model(ids))
        assert blocks.head.weight is blocks.embed.tok.weight
        wide = load_checkpoint(path, quantise(_gpt(1), "q4_1").to(torch.float64))
        assert wide.head.weight.dtype == torch.float64  # a model keeps its own dtype
        assert wide(ids).dtype == torch.float64


def test_a_quantised_checkpoint_that_does_not_fit_is_refused_unchanged(tmp_path):
    import json
    from minitransformer.checkpoints import load_checkpoint, save_checkpoint
    from safetensors.torch import load_file, save_file
    path = save_checkpoint(quantise(_gpt(), "q4_1"), tmp_path / "q.safetensors")
    float_path = save_checkpoint(_gpt(2), tmp_path / "f.safetensors")
    target = quantise(_gpt(1), "q4_1")
    def tensors_of(model):  # every tensor a model holds, the blocks' too
        return [x for t in model.state_dict().values()
                for x in ((t.words, t.scales, t.mins) if isinstance(t, QuantisedWeight) else (t,))]
    before = [t.clone() for t in tensors_of(target)]

    def unchanged():
        return all(torch.equal(a, b) for a, b in zip(before, tensors_of(target)))
    with pytest.raises(ValueError, match="stores embed.tok.weight as floats"):
        load_checkpoint(float_path, target)  # floats into blocks: refused, not rounded
    assert unchanged()
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(n))["__metadata__"]
    tensors = load_file(path)
    words = tensors["embed.tok.weight.words"]
    hostile = {  # what: (tensors, metadata, what the error says)
        "blocks of another count": (tensors | {"embed.tok.weight.words": words[:1].clone()},
                                    meta, "do not make a QuantisedWeight"),
        "an unknown type": (tensors, meta | {"wrapped": meta["wrapped"].replace(
            "QuantisedWeight", "Evil")}, "weights of types"),
        "another kind": (tensors, meta | {"wrapped": meta["wrapped"].replace(
            "q4_1", "q3_k")}, "kind"),
        "a tensor it does not hold": (tensors | {"embed.tok.weight.junk": torch.zeros(9, 9)},
                                      meta, "holds"),
        "a run's tensor": (tensors | {"train/x.words": words.clone()}, meta | {"wrapped": json.dumps(
            json.loads(meta["wrapped"]) | {"train/x": {"type": "QuantisedWeight",
                                                       "ctx": "q4_1"}})}, "model weights"),
    }
    for what, (t, m, message) in hostile.items():
        bad = tmp_path / f"{what}.safetensors"
        save_file(t, bad, metadata=m)
        with pytest.raises(ValueError, match=message):
            load_checkpoint(bad, target)
        assert unchanged(), what
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError):
        load_checkpoint(truncated, target)
    assert unchanged()


def test_save_folder_writes_a_quantised_lora_model_as_floats(tmp_path):
    "A Hugging Face folder has no blocks: the weights are written dequantised, the update merged."
    from minitransformer.lora import save_folder
    from minitransformer.pretrained import load_folder
    model = quantise(_gpt(rope_base=1e4), "q4_1")
    add_lora(model, targets=("q_proj",), r=2)
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "B") and isinstance(m.B, torch.nn.Parameter):
                m.B.normal_(generator=torch.Generator().manual_seed(10))
    loaded = load_folder(save_folder(model, tmp_path / "folder"))
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(loaded.model(ids), model(ids), atol=1e-4)


def test_qloras_ending_every_refusal_names_the_route_and_the_route_works(tmp_path):
    """merge_lora over blocks and quantise over an unmerged QLoRA model refuse (changing nothing)
    and name the route (a layer's own merge is refused by the blocks themselves); save_folder → load_folder → quantise is that route: the merged floats
    read back compute what the QLoRA model did, and quantise rounds them to blocks again."""
    from minitransformer.lora import save_folder
    from minitransformer.pretrained import load_folder
    model = quantise(_gpt(rope_base=1e4), "q4_1")
    add_lora(model, targets=("q_proj", "v_proj"), r=2)
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "B") and isinstance(m.B, torch.nn.Parameter):
                m.B.normal_(generator=torch.Generator().manual_seed(3))
    route = r"save_folder\(model, folder\).*load_folder\(folder\).*quantise"
    layer = model.decoder.layers[0].self_attn.qkv.q_proj
    for refused in (lambda: merge_lora(model), lambda: quantise(model, "q4_1")):
        with pytest.raises(ValueError, match=route):
            refused()
    assert not layer.merged and isinstance(layer.base.weight, QuantisedWeight)
    ids = torch.tensor([[1, 2, 3, 4]])
    merged = load_folder(save_folder(model, tmp_path / "merged")).model
    with torch.no_grad():
        torch.testing.assert_close(merged(ids), model(ids), atol=1e-4, rtol=1e-4)
    again = quantise(merged, "q4_1").decoder.layers[0].self_attn.qkv.q_proj.weight
    assert isinstance(again, QuantisedWeight)


@pytest.mark.reduced_precision
def test_a_model_with_bfloat16_linears_and_float32_norms_generates():
    """Mixed precision: the cache takes the dtype of the key projection that writes it."""
    model = _gpt()
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.to(torch.bfloat16)
    model.embed.to(torch.bfloat16)
    norm = model.decoder.layers[0].ff_norm.weight
    assert norm.dtype == torch.float32
    cache = model.make_cache(1)
    assert cache.self_attn[0].k.dtype == torch.bfloat16
    out = generate(model, [[1, 2, 3]], 4)
    assert len(out[0]) == 4  # (which tokens: bfloat16's choice, not asserted)


@pytest.mark.slow
def test_compiled_generation_of_a_deep_quantised_model():
    "Three layers or more: the step compiles with the blocks, one flat graph."
    model = quantise(_gpt(n_layers=3), "q4_1")
    prompt = [[1, 2, 3, 4]]
    torch._dynamo.reset()
    assert generate(model, prompt, 4, compile=True) == generate(model, prompt, 4)


@pytest.mark.parametrize("kind", list(FORMATS))
def test_the_input_gradient_is_grad_times_the_weight_from_one_float_buffer(kind):
    "Backward: grad·W in the codes' order, reordered: one float buffer of the weight's size."
    layer = _layer(torch.randn(1536, 576, generator=torch.Generator().manual_seed(9)), kind)
    x = torch.randn(2, 3, 576, requires_grad=True)
    g = torch.randn(2, 3, 1536)
    layer(x).backward(g)
    want = g.double() @ layer.weight.dequantise().double()
    assert (x.grad.double() - want).abs().max() < 1e-4 * want.abs().max()
    y = layer(x)
    allocated = _self_bytes(lambda: y.backward(g))
    assert allocated <= 1.5 * 1536 * 576 * 4, allocated / (1536 * 576 * 4)  # + int32 codes
