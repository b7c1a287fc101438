"""Adapters in `peft`'s folder format and merged models as Hugging Face folders
(`save_adapter(..., format="peft")`, `load_adapter` of a folder, `save_folder`),
checked against `peft` and `transformers` themselves on a tiny random Llama (and a
tiny BERT): the same logits both ways, and refusals that leave the model unchanged."""

import copy
import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import minitransformer.lora as lora_module
from minitransformer.lora import (
    LoRALinear,
    add_lora,
    load_adapter,
    lora_layers,
    merge_lora,
    save_adapter,
    save_folder,
)
from minitransformer.model import GPT, GPTConfig, TextEncoder, TextEncoderConfig
from minitransformer.pretrained import bert_rules, fill, load_folder

peft = pytest.importorskip("peft")

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings('ignore::FutureWarning', 'ignore::UserWarning')

transformers.logging.set_verbosity_error()

TOL = 1e-4  # float32 logits

IDS = torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(3))


def tiny_llama(folder: Path, tie: bool = False, hidden: int = 64, seed: int = 0,
               rope_theta: float = 1e5):
    "A random transformers Llama saved with save_pretrained (non-trivial weights)."
    cfg = transformers.LlamaConfig(
        vocab_size=100, hidden_size=hidden, num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2, intermediate_size=96, max_position_embeddings=64,
        rope_theta=rope_theta, tie_word_embeddings=tie)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g) if p.dim() == 1
                    else 0.08 * torch.randn(p.shape, generator=g))
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("llama")
    tiny_llama(folder)
    return folder


def reference(folder: Path):
    return transformers.LlamaForCausalLM.from_pretrained(folder).eval()


def ours(folder: Path) -> GPT:
    return load_folder(folder).model


def gap(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


def logits(model, ids=IDS):
    with torch.no_grad():
        out = model(ids)
    return out.logits if hasattr(out, "logits") else out


def random_B(model, seed: int = 1, scale: float = 0.3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in lora_layers(model).values():
            m.B.copy_(scale * torch.randn(m.B.shape, generator=g))


def state(model) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


def same_state(model, before: dict) -> bool:
    now = model.state_dict()
    return now.keys() == before.keys() and all(torch.equal(now[k], v)
                                               for k, v in before.items())


# --- 1. our adapter -> peft ---------------------------------------------------------
@pytest.mark.parametrize("mixed", [False, True], ids=["one-rank", "rank-pattern"])
def test_our_adapter_loads_in_peft_with_the_same_logits(llama_dir, tmp_path, mixed):
    model = ours(llama_dir)
    add_lora(model, ("q_proj", "k_proj", "v_proj", "out", "w2"), r=4, alpha=8)
    if mixed:  # one layer of another rank and alpha: rank_pattern / alpha_pattern
        owner = model.decoder.layers[1].self_attn
        owner.out = LoRALinear(owner.out.base, r=2, alpha=3)
    random_B(model)
    path = save_adapter(model, tmp_path / "ad", format="peft",
                        base_model_name_or_path=str(llama_dir))
    assert path == tmp_path / "ad"
    assert {p.name for p in path.iterdir()} == {"adapter_config.json",
                                                "adapter_model.safetensors"}
    cfg = json.loads((path / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM"
    assert (cfg["r"], cfg["lora_alpha"], cfg["bias"]) == (4, 8.0, "none")
    assert cfg["target_modules"] == ["down_proj", "k_proj", "o_proj", "q_proj",
                                     "v_proj"]
    assert cfg["base_model_name_or_path"] == str(llama_dir)
    want = {"model.layers.1.self_attn.o_proj": 2} if mixed else {}
    assert cfg["rank_pattern"] == want
    tensors = load_file(path / "adapter_model.safetensors")
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in tensors
    assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in tensors
    assert len(tensors) == 2 * 5 * 2
    theirs = peft.PeftModel.from_pretrained(reference(llama_dir), path).eval()
    plain = reference(llama_dir)
    g = gap(logits(theirs), logits(model))
    print(f"\n[ours -> peft, mixed={mixed}] logits max gap {g:.2e}")
    assert g <= TOL
    assert gap(logits(plain), logits(model)) > 1e-2, "the adapter changes nothing"


def test_only_some_layers_of_a_name_are_listed_one_by_one(llama_dir, tmp_path):
    model = ours(llama_dir)
    add_lora(model, ("q_proj",), r=2, alpha=4)
    owner = model.decoder.layers[1].self_attn.qkv  # leave layer 1's q_proj unadapted
    owner.q_proj = owner.q_proj.base
    random_B(model)
    cfg = json.loads((save_adapter(model, tmp_path / "ad", format="peft")
                      / "adapter_config.json").read_text())
    assert cfg["target_modules"] == ["model.layers.0.self_attn.q_proj"]
    theirs = peft.PeftModel.from_pretrained(reference(llama_dir), tmp_path / "ad")
    assert gap(logits(theirs.eval()), logits(model)) <= TOL


# --- 2. peft's adapter -> ours ------------------------------------------------------
def peft_adapter(llama_dir: Path, folder: Path, **config) -> torch.Tensor:
    "A peft LoRA adapter with random non-zero B, saved by peft; returns its logits."
    base = reference(llama_dir)
    config = dict(r=4, lora_alpha=12, target_modules=["q_proj", "o_proj", "up_proj"],
                  task_type="CAUSAL_LM", lora_dropout=0.0) | config
    pm = peft.get_peft_model(base, peft.LoraConfig(**config))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    pm.save_pretrained(folder)
    return logits(pm.eval())


@pytest.mark.parametrize("patterns", [False, True])
def test_peft_adapter_loads_in_ours_with_the_same_logits(llama_dir, tmp_path, patterns):
    extra = dict(rank_pattern={"model.layers.1.self_attn.o_proj": 2},
                 alpha_pattern={"up_proj": 5}) if patterns else {}
    want = peft_adapter(llama_dir, tmp_path / "ad", **extra)
    model = ours(llama_dir)
    assert load_adapter(model, tmp_path / "ad") is model
    layers = lora_layers(model)
    assert len(layers) == 6
    if patterns:
        assert (layers["decoder.layers.1.self_attn.out"].r, layers[
            "decoder.layers.0.ff.w3"].alpha) == (2, 5.0)
    g = gap(want, logits(model))
    print(f"\n[peft -> ours, patterns={patterns}] logits max gap {g:.2e}")
    assert g <= TOL
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{n}.{ab}" for n in layers for ab in "AB"}
    # onto a model that already has those LoRA layers: the same
    again = ours(llama_dir)
    add_lora(again, ("q_proj", "out", "w3"), r=4, alpha=12)
    if not patterns:
        load_adapter(again, tmp_path / "ad")
        assert gap(want, logits(again)) <= TOL


def test_round_trip_through_our_loader_is_exact(llama_dir, tmp_path):
    model = ours(llama_dir)
    add_lora(model, ("q_proj", "v_proj"), r=3, alpha=6)
    random_B(model)
    save_adapter(model, tmp_path / "ad", format="peft")
    fresh = load_adapter(ours(llama_dir), tmp_path / "ad")
    assert torch.equal(logits(fresh), logits(model))


# --- 3. BERT: our TextEncoder <-> peft on a BertModel ------------------------------
def bert_pair():
    cfg = transformers.BertConfig(
        vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=16, type_vocab_size=2,
        layer_norm_eps=1e-12, hidden_act="gelu", pad_token_id=0)
    torch.manual_seed(0)
    ref = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    enc = TextEncoder(TextEncoderConfig(vocab_size=60, d_model=32, n_heads=4, d_ff=64,
                                        n_layers=2, max_len=16, type_vocab_size=2,
                                        norm_eps=1e-12)).eval()
    sd = ref.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fill(enc, bert_rules(2), sd.__getitem__,
             {k: tuple(v.shape) for k, v in sd.items()})
    return ref, enc


def test_text_encoder_adapter_both_ways_with_peft_bert(tmp_path):
    ref, enc = bert_pair()
    ids = torch.randint(1, 60, (2, 8), generator=torch.Generator().manual_seed(0))
    add_lora(enc, ("q_proj", "v_proj", "w2"), r=4, alpha=8)
    random_B(enc)
    path = save_adapter(enc, tmp_path / "ad", format="peft")
    cfg = json.loads((path / "adapter_config.json").read_text())
    # "dense" also names BERT's other projections: each adapted layer is listed
    assert cfg["target_modules"] == sorted(
        f"encoder.layer.{i}.{part}" for i in range(2)
        for part in ("attention.self.query", "attention.self.value", "output.dense"))
    pm = peft.PeftModel.from_pretrained(ref, path).eval()
    with torch.no_grad():
        g = gap(pm(input_ids=ids).last_hidden_state, enc(ids))
    assert g <= TOL, g
    # and back: peft's own save of that model, onto a fresh encoder
    pm.save_pretrained(tmp_path / "again")
    fresh = load_adapter(bert_pair()[1], tmp_path / "again")
    with torch.no_grad():
        assert gap(fresh(ids), enc(ids)) <= 1e-6


# --- 4. merged model -> a Hugging Face folder ---------------------------------------
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_merged_folder_loads_in_transformers_with_the_same_logits(tmp_path, tie):
    tiny_llama(tmp_path / "base", tie=tie, rope_theta=5e4)
    model = ours(tmp_path / "base")
    targets = ("q_proj", "k_proj", "v_proj", "out", "w1", "w2", "w3")
    add_lora(model, targets + (() if tie else ("head",)), r=4, alpha=8)
    random_B(model, scale=0.2)
    before = state(model)
    out = save_folder(model, tmp_path / "hf")
    assert out == tmp_path / "hf"
    assert same_state(model, before) and not any(m.merged for m in
                                                 lora_layers(model).values())
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["tie_word_embeddings"], cfg["rope_theta"]) == (tie, 5e4)
    keys = set(load_file(out / "model.safetensors"))
    assert ("lm_head.weight" in keys) != tie
    assert "model.layers.0.self_attn.q_proj.weight" in keys
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    g = gap(logits(theirs), logits(model))
    print(f"\n[merged -> transformers, tie={tie}] logits max gap {g:.2e}")
    assert g <= TOL
    assert gap(logits(reference(tmp_path / "base")), logits(model)) > 1e-2
    # a merged model writes the same folder's numbers
    merge_lora(model)
    save_folder(model, tmp_path / "hf2")
    a, b = load_file(out / "model.safetensors"), load_file(tmp_path / "hf2" /
                                                            "model.safetensors")
    assert a.keys() == b.keys() and max(gap(a[k], b[k]) for k in a) <= 1e-6


@pytest.mark.parametrize("setting,value", [
    ("position_encoding", "learned"), ("activation", "gelu"), ("norm", "layernorm"),
    ("bias", True), ("norm_first", False), ("rope_interleaved", True)])
def test_models_llama_cannot_express_are_refused(tmp_path, setting, value):
    cfg = dict(vocab_size=50, d_model=16, n_heads=2, n_layers=1, d_ff=24,
               activation="swiglu", norm="rmsnorm", bias=False, norm_first=True,
               position_encoding="rotary", max_len=16) | {setting: value}
    model = GPT(GPTConfig(**cfg))
    with pytest.raises(ValueError, match=f"{setting}={value!r}"):
        save_folder(model, tmp_path / "x")
    assert not (tmp_path / "x").exists()
    add_lora(model, ("q_proj",), r=2)
    with pytest.raises(ValueError, match=f"{setting}={value!r}"):
        save_adapter(model, tmp_path / "y", format="peft")
    assert not (tmp_path / "y").exists()


def test_save_folder_refuses_what_is_not_a_gpt(tmp_path):
    with pytest.raises(TypeError, match="must be a GPT"):
        save_folder(bert_pair()[1], tmp_path / "x")
    with pytest.raises(TypeError, match="nn.Module"):
        save_folder("model", tmp_path / "x")


# --- 5. refusals: the model is left unchanged --------------------------------------
def test_peft_folder_for_another_base_is_refused_and_model_unchanged(llama_dir,
                                                                     tmp_path):
    tiny_llama(tmp_path / "wide", hidden=32)  # other widths
    peft_adapter(tmp_path / "wide", tmp_path / "wide_ad")
    _, enc = bert_pair()  # other names: a BERT adapter
    add_lora(enc, ("q_proj",), r=2)
    save_adapter(enc, tmp_path / "bert_ad", format="peft")
    peft_adapter(llama_dir, tmp_path / "r8", r=8)  # same names, the rank differs
    for prepared in (False, True):
        model = ours(llama_dir)
        if prepared:
            add_lora(model, ("q_proj", "o_proj", "out", "w3"), r=4, alpha=12)
        before, layers = state(model), set(lora_layers(model))
        for folder, message in ((tmp_path / "wide_ad", "needs"),
                                (tmp_path / "bert_ad", "not lora_A or lora_B"),
                                (tmp_path / "r8", "r=8" if prepared else None)):
            if message is None:
                continue  # without LoRA layers yet, another rank is simply read
            with pytest.raises(ValueError, match=message) as e:
                load_adapter(model, folder)
            assert str(folder) in str(e.value)
            assert same_state(model, before) and set(lora_layers(model)) == layers


@pytest.fixture
def good_adapter(llama_dir, tmp_path) -> Path:
    model = ours(llama_dir)
    add_lora(model, ("q_proj", "v_proj"), r=4, alpha=8)
    random_B(model)
    return save_adapter(model, tmp_path / "good", format="peft")


def corrupt_config(folder: Path, change) -> None:
    path = folder / "adapter_config.json"
    if callable(change):
        path.write_bytes(change(json.loads(path.read_text())))
    else:
        path.write_bytes(change)


def set_field(**kw):
    return lambda cfg: json.dumps(cfg | kw).encode()


HOSTILE = {
    "not JSON": (b"{not json", "not valid JSON"),
    "a list": (b"[1, 2]", "JSON object"),
    "not LoRA": (set_field(peft_type="IA3"), "not 'LORA'"),
    "DoRA": (set_field(use_dora=True), "use_dora"),
    "rsLoRA": (set_field(use_rslora=True), "use_rslora"),
    "trained biases": (set_field(bias="all"), "bias"),
    "modules_to_save": (set_field(modules_to_save=["lm_head"]), "modules_to_save"),
    "r zero": (set_field(r=0), "r"),
    "r a string": (set_field(r="4"), "r"),
    "alpha NaN": (set_field(lora_alpha=float("nan")), "lora_alpha"),
    "dropout one": (set_field(lora_dropout=1.0), "lora_dropout"),
    "no r": (lambda c: json.dumps({k: v for k, v in c.items() if k != "r"}).encode(),
             "lacks 'r'"),
    "regex pattern": (set_field(rank_pattern={"(a+)+$": 2}), "not a module name"),
    "pattern a list": (set_field(alpha_pattern=[1]), "alpha_pattern"),
    "pattern value": (set_field(rank_pattern={"q_proj": -1}), "rank_pattern"),
    "rank too large": (set_field(r=100000), "exceeds"),
    "huge": (b'{"r": 4, "pad": "' + b"x" * (1 << 20) + b'"}', "over 1 MiB"),
}


@pytest.mark.parametrize("what", sorted(HOSTILE))
def test_hostile_config_is_refused_from_its_header(llama_dir, good_adapter, what,
                                                   monkeypatch):
    change, message = HOSTILE[what]
    corrupt_config(good_adapter, change)
    reads = []
    real = lora_module.safe_open

    class Counting:  # counts tensors read (not headers)
        def __init__(self, *a, **k):
            self.f = real(*a, **k)

        def __enter__(self):
            self.h = self.f.__enter__()
            return self

        def __exit__(self, *a):
            return self.f.__exit__(*a)

        def __getattr__(self, name):
            if name == "get_tensor":
                reads.append(1)
            return getattr(self.h, name)

    monkeypatch.setattr(lora_module, "safe_open", Counting)
    model = ours(llama_dir)
    before = state(model)
    with pytest.raises((ValueError, TypeError), match=message) as e:
        load_adapter(model, good_adapter)
    assert "adapter_config.json" in str(e.value) or str(good_adapter) in str(e.value)
    assert not reads, "a tensor was read before the config was refused"
    assert same_state(model, before) and not lora_layers(model)


def test_corrupt_or_incomplete_tensor_files_are_refused(llama_dir, good_adapter,
                                                        tmp_path):
    tensors = load_file(good_adapter / "adapter_model.safetensors")
    cases = {}
    a_key = next(k for k in tensors if k.endswith("lora_A.weight"))
    cases["missing B"] = ({k: v for k, v in tensors.items()
                           if k != a_key.replace("lora_A", "lora_B")}, "lacks")
    cases["integer"] = (tensors | {a_key: tensors[a_key].to(torch.int32)},
                        "not floating-point")
    cases["extra key"] = (tensors | {"base_model.model.lm_head.weight":
                                     torch.zeros(100, 64)}, "not lora_A or lora_B")
    cases["empty"] = ({}, "no tensors")
    for name, (content, message) in cases.items():
        folder = tmp_path / name.replace(" ", "_")
        shutil.copytree(good_adapter, folder)
        save_file(content, folder / "adapter_model.safetensors")
        model = ours(llama_dir)
        before = state(model)
        with pytest.raises(ValueError, match=message):
            load_adapter(model, folder)
        assert same_state(model, before) and not lora_layers(model), name
    folder = tmp_path / "truncated"
    shutil.copytree(good_adapter, folder)
    data = (folder / "adapter_model.safetensors").read_bytes()
    (folder / "adapter_model.safetensors").write_bytes(data[:40])
    with pytest.raises(ValueError, match="adapter_model.safetensors is not a readable checkpoint"):
        load_adapter(ours(llama_dir), folder)
    (folder / "adapter_model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="adapter_model.safetensors"):
        load_adapter(ours(llama_dir), folder)


def test_save_refusals(llama_dir, tmp_path):
    model = ours(llama_dir)
    add_lora(model, ("q_proj",), r=2, trainable=("head",))
    with pytest.raises(ValueError, match="trainable too"):
        save_adapter(model, tmp_path / "a", format="peft")
    with pytest.raises(ValueError, match="format"):
        save_adapter(model, tmp_path / "a", format="PEFT")
    with pytest.raises(ValueError, match="peft format only"):
        save_adapter(model, tmp_path / "a.safetensors", base_model_name_or_path="x")
    model.head.weight.requires_grad_(False)
    with pytest.raises(TypeError, match="base_model_name_or_path"):
        save_adapter(model, tmp_path / "a", format="peft", base_model_name_or_path=3)
    wrapper = torch.nn.Sequential(copy.deepcopy(model))
    with pytest.raises(TypeError, match="Sequential"):
        save_adapter(wrapper, tmp_path / "a", format="peft")
    assert not (tmp_path / "a").exists()
    tied = GPT(GPTConfig(vocab_size=50, d_model=16, n_heads=2, n_layers=1, d_ff=24,
                         activation="swiglu", norm="rmsnorm", bias=False,
                         position_encoding="rotary", max_len=16, tie_weights=True))
    with pytest.raises(ValueError, match="tied"):
        add_lora(tied, ("head",))  # LoRA on a tied head: refused where it is added
