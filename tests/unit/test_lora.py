"""minitransformer.lora: low-rank adapters on a frozen model (merging, gradients, dtypes, adapter
files and argument errors); failures that once happened are pinned by the `test_bug_*` tests at
the end (parity with `peft`: tests/integration/test_lora_peft.py)."""

import math

import pytest
import torch
from torch import nn

from minitransformer.checkpoints import save_checkpoint
from minitransformer.lora import (
    ADAPTER_FORMAT,
    LoRALinear,
    add_lora,
    load_adapter,
    lora_layers,
    merge_lora,
    save_adapter,
    unmerge_lora,
)
from minitransformer.model import GPT, GPTConfig, TextEncoder, TextEncoderConfig

from helpers import IDS, REAL, gap


def gpt(seed: int = 0, **over) -> GPT:
    "A small GPT with grouped-query attention, rotary positions and SwiGLU."
    torch.manual_seed(seed)
    cfg = dict(vocab_size=40, d_model=16, n_heads=4, n_kv_heads=2, n_layers=2,
               d_ff=24, activation="swiglu", norm="rmsnorm", position_encoding="rotary",
               max_len=32, tie_weights=False, bias=False) | over
    return GPT(GPTConfig(**cfg)).eval()


def encoder(seed: int = 0) -> TextEncoder:
    torch.manual_seed(seed)
    return TextEncoder(TextEncoderConfig(vocab_size=40, d_model=16, n_heads=4, d_ff=32,
                                         n_layers=2, max_len=16)).eval()


def nonzero_B(model: nn.Module, seed: int = 1) -> None:
    "Give every LoRA layer's B random values (at initialisation B is zero)."
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in lora_layers(model).values():
            m.B.copy_(0.3 * torch.randn(m.B.shape, generator=g))


def base_weights(model: nn.Module) -> dict:
    "Every tensor of the state dict except the adapters' A and B, cloned."
    return {k.replace(".base.", "."): v.clone() for k, v in model.state_dict().items()
            if not k.endswith((".A", ".B"))}


# --- 1. at initialisation the adapted model is the base model ------------------------
def test_lora_layer_at_init_is_its_base_and_forwards_its_attributes():
    torch.manual_seed(0)
    base = nn.Linear(12, 7)
    m = LoRALinear(base, r=3, alpha=6.0)
    assert m.A.shape == (3, 12) and m.B.shape == (7, 3) and not m.B.any()
    assert m.A.abs().max() > 0 and m.scaling == 2.0
    assert m.weight is base.weight and m.bias is base.bias
    assert (m.in_features, m.out_features) == (12, 7)
    assert not base.weight.requires_grad and m.A.requires_grad and m.B.requires_grad
    bound = 1 / math.sqrt(12)  # kaiming_uniform(a=sqrt(5)), as nn.Linear and peft
    assert m.A.abs().max() <= bound
    x = torch.randn(2, 5, 12)
    assert torch.equal(m(x), base(x))
    assert "r=3, alpha=6, merged=False" in repr(m)


@pytest.mark.parametrize("kind", ["encoder", "gpt"])
def test_adapted_model_equals_base_model_at_init(kind):
    make = encoder if kind == "encoder" else gpt
    base, adapted = make(), make()
    targets = ("q_proj", "k_proj", "v_proj", "out", "w1", "w2", "w3")
    names = add_lora(adapted, targets=targets, r=4, alpha=8.0)
    per_layer = 6 if kind == "encoder" else 7  # q, k, v, out, w1, w2 (+ w3: swiglu)
    assert len(names) == 2 * per_layer == len(lora_layers(adapted))
    with torch.no_grad():
        args = (IDS, REAL) if kind == "encoder" else (IDS,)
        assert torch.equal(adapted(*args), base(*args))


# --- 2. merge / unmerge ---------------------------------------------------------------
@pytest.mark.parametrize("kind", ["encoder", "gpt"])
def test_merged_equals_unmerged_and_unmerge_restores_the_base(kind):
    model = encoder() if kind == "encoder" else gpt()
    add_lora(model, targets=("q_proj", "v_proj", "w2"), r=4, alpha=8.0)
    before = base_weights(model)
    nonzero_B(model)
    args = (IDS, REAL) if kind == "encoder" else (IDS,)
    with torch.no_grad():
        unmerged = model(*args)
        merge_lora(model)
        assert all(m.merged for m in lora_layers(model).values())
        merged = model(*args)
        changed = base_weights(model)
        unmerge_lora(model)
        again = model(*args)
    assert gap(merged, unmerged) <= 1e-5, gap(merged, unmerged)
    assert gap(again, unmerged) <= 1e-5
    moved = [k for k in before if not torch.equal(before[k], changed[k])]
    assert len(moved) == 3 * 2, moved  # exactly the adapted weights changed
    after = base_weights(model)
    assert max(gap(before[k], after[k]) for k in before) <= 1e-6


def test_merge_twice_or_unmerge_unmerged_raises():
    m = LoRALinear(nn.Linear(6, 5), r=2)
    with pytest.raises(RuntimeError, match="not merged"):
        m.unmerge()
    m.merge()
    with pytest.raises(RuntimeError, match="already merged"):
        m.merge()
    model = gpt()
    add_lora(model)
    with pytest.raises(RuntimeError, match="not merged"):
        unmerge_lora(model)
    merge_lora(model)
    with pytest.raises(RuntimeError, match="already merged"):
        merge_lora(model)


def test_merged_layer_delta_is_scaled_BA():
    torch.manual_seed(0)
    base = nn.Linear(10, 6)
    w = base.weight.detach().clone()
    m = LoRALinear(base, r=2, alpha=5.0)
    with torch.no_grad():
        m.B.normal_()
    torch.testing.assert_close(m.delta(), 2.5 * m.B @ m.A)
    m.merge()
    torch.testing.assert_close(base.weight, w + 2.5 * m.B @ m.A)


# --- 3. only the adapter is trained ---------------------------------------------------
@pytest.mark.parametrize("kind", ["encoder", "gpt"])
def test_only_the_adapter_and_the_trainable_extras_get_gradients(kind):
    model = encoder() if kind == "encoder" else gpt()
    extras = () if kind == "encoder" else ("head",)
    r = 3
    names = add_lora(model, targets=("q_proj", "k_proj", "v_proj", "w1"), r=r,
                     alpha=6.0, trainable=extras)
    nonzero_B(model)  # else A's gradient is 0 (but still a tensor)
    args = (IDS, REAL) if kind == "encoder" else (IDS,)
    model(*args).square().mean().backward()
    layers = lora_layers(model)
    want = 0
    for name, m in layers.items():
        assert m.A.grad is not None and m.B.grad is not None, name
        assert m.A.grad.abs().max() > 0 and m.B.grad.abs().max() > 0, name
        assert m.A.numel() + m.B.numel() == r * (m.in_features + m.out_features)
        want += r * (m.in_features + m.out_features)
    adapter = {f"{n}.{p}" for n in names for p in "AB"}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    extra = {n for n in trainable if any(n.startswith(e + ".") for e in extras)}
    assert trainable == adapter | extra
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(p.grad is None for n, p in model.named_parameters()
                          if n in frozen), "a frozen parameter received a gradient"
    if kind == "gpt":
        assert extra == {"head.weight"} and model.head.weight.grad is not None
        want += model.head.weight.numel()
    count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert count == want
    # the formula, by hand: per block q (16→16), k (16→8, GQA), v (16→8 or 16), w1
    C, kv = 16, (16 if kind == "encoder" else 8)
    d_ff = 32 if kind == "encoder" else 24
    by_hand = 2 * r * ((C + C) + 2 * (C + kv) + (C + d_ff))
    assert count == by_hand + (40 * 16 if kind == "gpt" else 0)


# --- 5. adapter files -----------------------------------------------------------------
def trained_gpt(seed: int = 0, extras=("head",), **kw):
    "A GPT with adapters whose B (and head) were changed, as training would."
    model = gpt(seed)
    add_lora(model, targets=("q_proj", "v_proj", "w2"), r=4, alpha=8.0,
             trainable=extras, **kw)
    nonzero_B(model)
    if extras:
        with torch.no_grad():
            model.head.weight.mul_(-1.5)
    return model


def test_adapter_file_is_small_and_loads_onto_the_same_base(tmp_path):
    model = trained_gpt()
    path = save_adapter(model, tmp_path / "adapter.safetensors")
    assert path == tmp_path / "adapter.safetensors" and path.is_file()
    assert not list(tmp_path.glob(".*.tmp")), "the atomic writer left a temporary file"
    full = save_checkpoint(gpt(), tmp_path / "full.safetensors")
    small, big = path.stat().st_size, full.stat().st_size
    print(f"\n[adapter] {small} bytes (with a 40x16 head), full checkpoint {big} bytes")
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        keys, meta = set(f.keys()), f.metadata()
    assert keys == {f"{n}.{p}" for n in lora_layers(model) for p in "AB"} | {"head.weight"}
    assert meta["format"] == ADAPTER_FORMAT and meta["model"] == "GPT"
    assert small < big / 2
    with torch.no_grad():
        want = model(IDS)
        for prepare in (False, True):  # onto a bare copy, or one with adapters already
            fresh = gpt()
            if prepare:
                add_lora(fresh, targets=("q_proj", "v_proj", "w2"), r=4, alpha=8.0,
                         trainable=("head",))
            assert load_adapter(fresh, path) is fresh
            assert set(lora_layers(fresh)) == set(lora_layers(model))
            assert torch.equal(fresh(IDS), want), prepare
            assert torch.equal(fresh.head.weight, model.head.weight)  # the extra


def test_adapter_alone_is_far_smaller_than_a_checkpoint(tmp_path):
    model = encoder()
    add_lora(model, r=2, alpha=4.0)
    small = save_adapter(model, tmp_path / "a.safetensors").stat().st_size
    big = save_checkpoint(encoder(), tmp_path / "full.safetensors").stat().st_size
    print(f"\n[adapter] encoder q/v r=2: {small} bytes, full checkpoint {big} bytes "
          f"({big / small:.0f}x)")
    assert small * 10 < big


def test_loading_onto_another_base_names_the_layer_and_changes_nothing(tmp_path):
    path = save_adapter(trained_gpt(seed=0), tmp_path / "a.safetensors")
    other = gpt(seed=1)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    flags = [p.requires_grad for p in other.parameters()]
    with pytest.raises(ValueError, match=r"another base model.*decoder\.layers\.0\."
                                         r"self_attn\.qkv\.q_proj"):
        load_adapter(other, path)
    assert not lora_layers(other)
    after = other.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert flags == [p.requires_grad for p in other.parameters()]
    # one changed base weight (not the first layer) is enough, and is named
    same = gpt(seed=0)
    with torch.no_grad():
        same.decoder.layers[1].ff.w2.weight[0, 0] += 1e-3
    with pytest.raises(ValueError, match=r"decoder\.layers\.1\.ff\.w2"):
        load_adapter(same, path)
    assert not lora_layers(same)


def test_loading_bad_files_raises_clear_errors(tmp_path):
    model = gpt()
    with pytest.raises(FileNotFoundError, match="no adapter file"):
        load_adapter(model, tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file at all")
    with pytest.raises(ValueError, match="not a readable adapter file"):
        load_adapter(model, junk)
    ckpt = save_checkpoint(gpt(), tmp_path / "full.safetensors")
    with pytest.raises(ValueError, match="not a minitransformer LoRA adapter"):
        load_adapter(model, ckpt)
    enc = encoder()
    add_lora(enc)
    path = save_adapter(enc, tmp_path / "enc.safetensors")
    with pytest.raises(ValueError, match="adapts a TextEncoder, not a GPT"):
        load_adapter(model, path)
    assert not lora_layers(model)


def test_a_layer_the_model_lacks_is_refused(tmp_path):
    "A file naming a layer that is missing (or not a Linear) changes nothing."
    path = save_adapter(trained_gpt(extras=()), tmp_path / "a.safetensors")
    shallow = gpt(n_layers=1)
    with pytest.raises(ValueError, match=r"decoder\.layers\.1\..*not an nn\.Linear"):
        load_adapter(shallow, path)
    assert not lora_layers(shallow)
    path = save_adapter(trained_gpt(), tmp_path / "b.safetensors")
    small_head = gpt()
    small_head.head = nn.Linear(16, 30, bias=False)  # the extra "head": another shape
    with pytest.raises(ValueError, match="head.weight"):
        load_adapter(small_head, path)
    assert not lora_layers(small_head)


def test_save_refuses_merged_models_and_models_without_adapters(tmp_path):
    with pytest.raises(ValueError, match="no LoRA layers"):
        save_adapter(gpt(), tmp_path / "a.safetensors")
    model = trained_gpt()
    merge_lora(model)
    with pytest.raises(ValueError, match="unmerge"):
        save_adapter(model, tmp_path / "a.safetensors")
    assert not (tmp_path / "a.safetensors").exists()
    unmerge_lora(model)
    assert save_adapter(model, tmp_path / "a.safetensors").is_file()
    merge_lora(model)  # and a merged model cannot take an adapter either
    with pytest.raises(ValueError):
        load_adapter(model, tmp_path / "a.safetensors")


# --- 6. argument errors ---------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, message", [
    (dict(r=0), ValueError, "r must be"),
    (dict(r=-1), ValueError, "r must be"),
    (dict(r=2.0), ValueError, "r must be"),
    (dict(r=True), ValueError, "r must be"),
    (dict(r=6), ValueError, r"r=6 exceeds"),  # min(in=8, out=5) = 5
    (dict(alpha=0.0), ValueError, "alpha must be"),
    (dict(alpha=-1.0), ValueError, "alpha must be"),
    (dict(alpha=math.nan), ValueError, "alpha must be"),
    (dict(alpha="16"), ValueError, "alpha must be"),
    (dict(dropout=1.0), ValueError, "dropout must be"),
    (dict(dropout=-0.1), ValueError, "dropout must be"),
])
def test_lora_layer_argument_errors_name_the_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        LoRALinear(nn.Linear(8, 5), **({"r": 2} | kwargs))


@pytest.mark.parametrize("base", [nn.Conv1d(3, 3, 1), nn.Identity(), None,
                                  torch.zeros(3, 3)])
def test_lora_layer_base_must_be_a_linear(base):
    with pytest.raises(TypeError, match="base must be an nn.Linear"):
        LoRALinear(base, r=1)
    with pytest.raises(TypeError, match="base must be an nn.Linear"):
        LoRALinear(LoRALinear(nn.Linear(4, 4), r=1), r=1)  # no adapter on an adapter


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(targets=()), ValueError, "targets must be"),
    (dict(targets=[]), ValueError, "targets must be"),
    (dict(targets="q_proj"), ValueError, "targets must be"),
    (dict(targets=("nope",)), ValueError, r"targets \['nope'\] name no nn\.Linear of GPT"),
    (dict(targets=("qkv",)), ValueError, r"name no nn\.Linear"),  # not a Linear
    (dict(r=0), ValueError, "r must be"),
    (dict(r=99), ValueError, "r=99 exceeds"),
    (dict(alpha=0), ValueError, "alpha must be"),
    (dict(dropout=1.0), ValueError, "dropout must be"),
])
def test_add_lora_argument_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        add_lora(gpt(), **kwargs)


def test_add_lora_refuses_a_non_module_and_a_second_call():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        add_lora({"q_proj": nn.Linear(2, 2)})
    model = gpt()
    add_lora(model)
    with pytest.raises(ValueError, match="already holds LoRA layers"):
        add_lora(model, targets=("k_proj",))
    assert len(lora_layers(model)) == 4  # q and v of 2 blocks, nothing more


def test_add_lora_returns_names_and_dropout_acts_only_in_training():
    model = encoder()
    names = add_lora(model, targets=["v_proj"], r=2, dropout=0.5)
    assert names == [f"encoder.layers.{i}.self_attn.qkv.v_proj" for i in range(2)]
    nonzero_B(model)
    model.eval()  # (the new layers are made in training mode: see the bug tests)
    with torch.no_grad():
        a, b = model(IDS, REAL), model(IDS, REAL)
        assert torch.equal(a, b)  # eval: no dropout
        model.train()
        torch.manual_seed(0)
        c = model(IDS, REAL)
        assert gap(a, c) > 1e-4  # training: dropout on the adapter's input


# --- 7. dtype -------------------------------------------------------------------------
@pytest.mark.reduced_precision
def test_bfloat16_base_keeps_bfloat16():
    torch.manual_seed(0)
    base = nn.Linear(16, 8).to(torch.bfloat16)
    m = LoRALinear(base, r=4, alpha=8.0)
    assert m.A.dtype == m.B.dtype == torch.bfloat16
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    y = m(x)
    assert y.dtype == torch.bfloat16 and torch.equal(y, base(x))
    with torch.no_grad():
        m.B.normal_()
    y = m(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert m.A.grad.dtype == m.B.grad.dtype == torch.bfloat16
    m.merge()
    assert base.weight.dtype == torch.bfloat16 and m(x).dtype == torch.bfloat16
    want = (x.float() @ (base.weight.float()).T + base.bias.float())
    # merged in bfloat16: the weight plus update rounded once, then a 16-long product of
    # rounded terms; a tenth of the largest output is ~25 times that rounding
    assert gap(m(x), want) < 0.1 * want.abs().max().item()


@pytest.mark.reduced_precision
def test_bfloat16_gpt_with_adapters():
    model = gpt().to(torch.bfloat16)
    add_lora(model, r=2)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        assert model(IDS).dtype == torch.bfloat16


# --- boundaries that once failed ---------------------------------------------------
def test_bug_load_adapter_ignores_the_files_alpha(tmp_path):
    path = save_adapter(trained_gpt(extras=()), tmp_path / "a.safetensors")
    want = load_adapter(gpt(), path)(IDS)  # added by load_adapter: alpha from the file
    model = gpt()
    add_lora(model, targets=("q_proj", "v_proj", "w2"), r=4, alpha=16.0)  # not 8
    try:
        load_adapter(model, path)
    except ValueError as e:
        assert "alpha" in str(e)
        return
    with torch.no_grad():
        assert gap(model(IDS), want) <= 1e-6


def test_bug_load_adapter_with_another_r_raises_runtime_error(tmp_path):
    path = save_adapter(trained_gpt(extras=()), tmp_path / "a.safetensors")
    model = gpt()
    add_lora(model, targets=("q_proj", "v_proj", "w2"), r=2, alpha=8.0)
    with pytest.raises(ValueError, match="q_proj"):
        load_adapter(model, path)


def test_bug_load_adapter_leaves_the_base_trainable(tmp_path):
    model = trained_gpt()
    path = save_adapter(model, tmp_path / "a.safetensors")
    fresh = load_adapter(gpt(), path)
    want = {n for n, p in model.named_parameters() if p.requires_grad}
    got = {n for n, p in fresh.named_parameters() if p.requires_grad}
    again = save_adapter(fresh, tmp_path / "b.safetensors")
    assert again.stat().st_size == path.stat().st_size
    assert got == want


def test_bug_add_lora_changes_the_model_when_it_raises():
    model = gpt()
    with pytest.raises(ValueError, match="r must be"):
        add_lora(model, r=0)
    assert all(p.requires_grad for p in model.parameters())
    model = gpt(vocab_size=8)  # head: 16 -> 8; q_proj: 16 -> 16
    with pytest.raises(ValueError, match="r=12 exceeds"):
        add_lora(model, targets=("q_proj", "head"), r=12)
    assert not lora_layers(model)


def test_bug_add_lora_trainable_string_is_silently_ignored():
    model = gpt()
    try:
        add_lora(model, trainable="head")
    except (TypeError, ValueError) as e:
        assert "trainable" in str(e)
        return
    assert model.head.weight.requires_grad


def test_bug_merging_a_tied_head_changes_the_embeddings():
    "A tied head is refused (merging it would change the token embeddings too)."
    model = gpt(tie_weights=True)
    with pytest.raises(ValueError, match="shared with another parameter"):
        add_lora(model, targets=("head",), r=4, alpha=8.0)
    assert not lora_layers(model) and all(p.requires_grad for p in model.parameters())


def test_bug_add_lora_on_an_eval_model_leaves_dropout_on():
    model = encoder()  # .eval()
    add_lora(model, targets=["v_proj"], r=2, dropout=0.5)
    nonzero_B(model)
    assert not any(m.training for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(IDS, REAL), model(IDS, REAL))


def test_bug_merge_unmerge_breaks_the_fingerprint(tmp_path):
    model = trained_gpt()
    path = save_adapter(model, tmp_path / "a.safetensors")
    merge_lora(model)
    unmerge_lora(model)
    load_adapter(model, path)
