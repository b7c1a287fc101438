"""Hostile files, each a few kilobytes written for the purpose, are refused from their
header: before any model is built or anything allocated, with a TypeError/ValueError that
names the file and the field; a refused load leaves the model it was given as it was.

Files that claim a huge size are loaded in a subprocess whose address space is limited to
2 GiB more than it holds after its imports, and with a time limit: a loader that believed the
claim would fail there with a MemoryError or a time-out instead of the expected ValueError."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from minitransformer.checkpoints import load_checkpoint, save_checkpoint
from minitransformer.gguf import load_gguf
from minitransformer.lora import add_lora, load_adapter, lora_layers, save_adapter
from minitransformer.model import GPT, GPTConfig
from minitransformer.pretrained import PretrainedTokenizer, llama_config, llama_rules, load_folder
from minitransformer.quantised import QuantisedWeight, load_gguf_blocks

from helpers import GGUF_META, gguf_file

gguf = pytest.importorskip("gguf")

LIMITED = r'''
import json, resource, sys
from pathlib import Path
import torch
from minitransformer.pretrained import load_folder
from minitransformer.gguf import load_gguf
from minitransformer.quantised import load_gguf_blocks
from minitransformer.checkpoints import load_checkpoint
vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30),) * 2)  # 2 GiB more than now
path = Path(sys.argv[1])
try:
    result = CALL
    print(json.dumps({"ok": repr(result)[:200]}))
except Exception as e:
    print(json.dumps({"type": type(e).__name__, "message": str(e)}))
'''


def limited(call: str, path: Path, timeout: float = 60) -> dict:
    "Run `call` (an expression of `path`) in a subprocess limited in memory and time."
    done = subprocess.run([sys.executable, "-c", LIMITED.replace("CALL", call), str(path)],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def refused(result: dict, kind: str, *names: str) -> None:
    assert result.get("type") == kind, result
    for name in names:
        assert name in result["message"], (name, result["message"])


def same_state(model: torch.nn.Module, before: dict) -> bool:
    after = model.state_dict()
    return after.keys() == before.keys() and all(torch.equal(after[k], v)
                                                 for k, v in before.items())


def snapshot(model: torch.nn.Module) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


# --- Hugging Face folders ---------------------------------------------------------------
LLAMA = dict(model_type="llama", vocab_size=64, hidden_size=32, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=2, intermediate_size=48,
             max_position_embeddings=64, rms_norm_eps=1e-5, hidden_act="silu",
             tie_word_embeddings=False)


def llama_folder(folder: Path, **changes) -> Path:
    "A tiny Llama folder (our GPT's random weights under Llama's names); config changed."
    folder.mkdir(parents=True, exist_ok=True)
    state = GPT(llama_config(LLAMA)).state_dict()
    tensors = {f"model.{src}" if not src.startswith("lm_head") else src:
               state[name].contiguous()
               for name, (src, _) in llama_rules(LLAMA["num_hidden_layers"], False).items()}
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(LLAMA | changes))
    return folder


def test_the_tiny_folder_loads(tmp_path):
    "The base of every hostile folder below is a good one."
    loaded = load_folder(llama_folder(tmp_path / "ok"))
    assert loaded.model.config.n_layers == 2 and not loaded.unused


@pytest.mark.timeout(120)
def test_a_huge_width_is_refused_from_the_header(tmp_path):
    folder = llama_folder(tmp_path / "wide", hidden_size=10**9, intermediate_size=10**9)
    refused(limited("load_folder(path)", folder), "ValueError", str(folder), "shape")


@pytest.mark.parametrize("text, what", [("{not json", "is not valid JSON"),
                                        ("[1, 2, 3]", "must be a JSON object"),
                                        ("[" * 100_000 + "]" * 100_000,
                                         "is not valid JSON")])
def test_config_json_that_is_not_an_object(tmp_path, text, what):
    folder = llama_folder(tmp_path / "bad")
    (folder / "config.json").write_text(text)
    with pytest.raises(ValueError, match=what) as e:
        load_folder(folder)
    assert str(folder / "config.json") in str(e.value)


def test_config_fields_of_the_wrong_kind_name_the_file_and_field(tmp_path):
    folder = llama_folder(tmp_path / "kind", num_attention_heads=0)
    with pytest.raises(ValueError, match="num_attention_heads") as e:
        load_folder(folder)
    assert "config.json" in str(e.value)
    folder = llama_folder(tmp_path / "kind2", vocab_size="many")
    with pytest.raises((TypeError, ValueError), match="vocab_size") as e:
        load_folder(folder)
    assert "config.json" in str(e.value)


def test_a_garbage_tokenizer_is_refused_before_any_weight(tmp_path):
    # the config also claims a huge width: the tokenizer's error comes first
    folder = llama_folder(tmp_path / "tok", hidden_size=10**9)
    (folder / "tokenizer.json").write_text('{"model": {"type": "nonsense"}}')
    with pytest.raises(ValueError, match="is not a readable tokenizer") as e:
        load_folder(folder)
    assert str(folder / "tokenizer.json") in str(e.value)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer_config.json").write_text("[]")
    (folder / "tokenizer.json").write_text(_tiny_tokenizer_json())
    with pytest.raises(ValueError, match="tokenizer_config.json"):
        load_folder(folder)


def _tiny_tokenizer_json() -> str:
    from tokenizers import Tokenizer as Backend, models
    return Backend(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).to_str()


def test_a_truncated_safetensors_file_names_itself(tmp_path):
    folder = llama_folder(tmp_path / "cut")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:100])
    with pytest.raises(ValueError, match="model.safetensors is not a readable"):
        load_folder(folder)


def test_pytorch_bin_weights_are_not_unpickled(tmp_path):
    folder = llama_folder(tmp_path / "bin")
    (folder / "model.safetensors").unlink()
    _pickle_bomb(folder / "pytorch_model.bin", tmp_path / "ran")
    with pytest.raises(FileNotFoundError, match="holds no"):
        load_folder(folder)
    assert not (tmp_path / "ran").exists()


# --- GGUF --------------------------------------------------------------------------------
def test_the_tiny_gguf_loads(tmp_path):
    loaded = load_gguf(gguf_file(tmp_path / "ok.gguf"))
    assert loaded.model.config.n_layers == 2 and loaded.tokenizer.bos == "<s>"
    assert loaded.model.head.weight is loaded.model.embed.tok.weight  # tied: one


def test_the_tiny_gguf_in_blocks_loads_both_ways_alike(tmp_path):
    path = gguf_file(tmp_path / "q8.gguf", blocks=True)
    kept, floats = load_gguf_blocks(path).model, load_gguf(path).model
    assert isinstance(kept.decoder.layers[1].ff.w1.weight, QuantisedWeight)
    assert not isinstance(kept.decoder.layers[1].ff.w2.weight, QuantisedWeight)  # 48 a row
    assert kept.head.weight is kept.embed.tok.weight  # tied: one table of blocks
    ids = torch.tensor([[0, 5, 9, 62, 63]])
    with torch.no_grad():
        assert torch.allclose(kept(ids), floats(ids), atol=1e-5)


def test_a_gguf_without_blocks_is_refused_before_building(tmp_path, monkeypatch):
    import minitransformer.quantised as quantised
    path = gguf_file(tmp_path / "f32.gguf")  # float32: no blocks to keep

    def build(*args):
        raise AssertionError("a model was built for a file that is refused")
    monkeypatch.setattr(quantised, "_gguf_blocks_model", build)
    with pytest.raises(ValueError, match=r"F32.*none quantised.*load_gguf reads it"):
        load_gguf_blocks(path)


@pytest.mark.timeout(120)
def test_a_gguf_claiming_a_huge_width_is_refused_from_its_tensor_list(tmp_path):
    path = gguf_file(tmp_path / "wide.gguf", llama__embedding_length=2**20 * 4,
                     llama__feed_forward_length=2**30)
    refused(limited("load_gguf(path)", path), "ValueError", str(path), "shape")
    refused(limited("load_gguf_blocks(path)", path), "ValueError", str(path), "shape")


@pytest.mark.parametrize("changes, field", [
    ({"llama__attention__head_count": 0}, "llama.attention.head_count"),
    ({"tokenizer__ggml__bos_token_id": 10**6}, "bos_token_id"),
    ({"tokenizer__ggml__merges": ["zz yy"]}, "merges"),
    ({"llama__attention__layer_norm_rms_epsilon": -1.0}, "layer_norm_rms_epsilon")])
@pytest.mark.parametrize("blocks", [False, True])
def test_gguf_metadata_out_of_range_names_the_field(tmp_path, changes, field, blocks):
    path = gguf_file(tmp_path / "bad.gguf", blocks, **changes)
    with pytest.raises(ValueError, match=field) as e:
        (load_gguf_blocks if blocks else load_gguf)(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("blocks", [False, True])
def test_a_truncated_gguf_is_a_value_error_at_every_cut(tmp_path, blocks):
    data = gguf_file(tmp_path / "whole.gguf", blocks).read_bytes()
    for cut in (0, 4, 30, 200, 1000, len(data) // 3, len(data) // 2, len(data) - 8):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=str(path)):
            (load_gguf_blocks if blocks else load_gguf)(path)


def test_chat_templates_name_messages():
    from tokenizers import Tokenizer as Backend, models
    tok = PretrainedTokenizer(
        Backend(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")),
        chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    for bad in (None, 42, "hello"):
        with pytest.raises(TypeError, match="messages"):
            tok.apply_chat_template(bad)
    assert tok.apply_chat_template([{"role": "user", "content": "a"}]) == "a"
    escape = PretrainedTokenizer(tok.backend, chat_template="{{ ''.__class__.__mro__[1]"
                                                            ".__subclasses__() }}")
    with pytest.raises(Exception, match="unsafe|not safely|attribute"):
        escape.apply_chat_template([{"role": "user", "content": "a"}])


# --- checkpoints -------------------------------------------------------------------------
CFG = GPTConfig(vocab_size=50, max_len=32, d_model=32, n_heads=2, n_layers=2,
                position_encoding="rotary", activation="swiglu", norm="rmsnorm",
                bias=False)


def checkpoint(path: Path, **metadata) -> Path:
    "A checkpoint of a random GPT(CFG), its metadata changed."
    save_checkpoint(GPT(CFG), path)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    save_file(load_file(path), path, metadata=meta | metadata)
    return path


def with_config(path: Path, **changes) -> Path:
    from dataclasses import asdict
    return checkpoint(path, config=json.dumps(asdict(CFG) | changes))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["folder", "gguf", "gguf blocks", "checkpoint"])
def test_ten_million_layers_are_refused_at_once(tmp_path, kind):
    "Each loader refuses the claim from the header, before building anything."
    path, call = {
        "folder": lambda: (llama_folder(tmp_path / "deep", num_hidden_layers=10**7),
                           "load_folder(path)"),
        "gguf": lambda: (gguf_file(tmp_path / "deep.gguf", llama__block_count=10**7),
                         "load_gguf(path)"),
        "gguf blocks": lambda: (gguf_file(tmp_path / "deep.gguf", True,
                                          llama__block_count=10**7),
                                "load_gguf_blocks(path)"),
        "checkpoint": lambda: (with_config(tmp_path / "deep.safetensors", n_layers=10**7),
                               "load_checkpoint(path)")}[kind]()
    refused(limited(call, path, timeout=30), "ValueError", str(path), "10000000",
            "tensors")


@pytest.mark.timeout(120)
def test_a_rotary_gpt_claiming_a_billion_positions_costs_nothing(tmp_path):
    "No stored tensor depends on max_len: the model loads, and only its limit is larger."
    path = with_config(tmp_path / "long.safetensors", max_len=10**9)
    result = limited("load_checkpoint(path)(torch.tensor([[1, 2, 3]])).shape", path)
    assert result == {"ok": "torch.Size([1, 3, 50])"}, result


@pytest.mark.parametrize("field", ["config", "aliases"])
def test_deeply_nested_metadata_is_a_value_error(tmp_path, field):
    path = checkpoint(tmp_path / "nested.safetensors",
                      **{field: "[" * 100_000 + "]" * 100_000})
    with pytest.raises(ValueError, match="is not valid JSON") as e:
        load_checkpoint(path)
    assert str(path) in str(e.value) and field in str(e.value)


def _pickle_bomb(path: Path, marker: Path) -> None:
    "A torch.save file that would create `marker` when unpickled."
    class Bomb:
        def __reduce__(self):
            return (open, (str(marker), "w"))
    torch.save({"state_dict": Bomb()}, path)


def test_torch_save_files_are_refused_unopened_and_the_model_unchanged(tmp_path):
    model = GPT(CFG)
    before = snapshot(model)
    path = tmp_path / "old.pt"
    _pickle_bomb(path, tmp_path / "ran")
    for target in (None, model):
        with pytest.raises(ValueError, match="checkpoints are safetensors") as e:
            load_checkpoint(path, target)
        assert str(path) in str(e.value)
    assert not (tmp_path / "ran").exists() and same_state(model, before)
    torch.save(GPT(CFG).state_dict(), path)  # a plain state dict: refused alike
    with pytest.raises(ValueError, match="checkpoints are safetensors"):
        load_checkpoint(path, model)
    assert same_state(model, before)


def test_a_checkpoint_missing_a_tensor_changes_nothing(tmp_path):
    path = checkpoint(tmp_path / "part.safetensors")
    tensors = load_file(path)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    del tensors["decoder.norm.weight"]
    save_file(tensors, path, metadata=meta)
    model = GPT(CFG)
    before = snapshot(model)
    with pytest.raises(ValueError, match="decoder.norm.weight") as e:
        load_checkpoint(path, model)
    assert str(path) in str(e.value) and same_state(model, before)


def test_a_new_model_holds_the_file_s_tensors_once(tmp_path):
    "Built on the meta device and handed the tensors: tied weights are one parameter."
    source = GPT(CFG).eval()
    path = save_checkpoint(source, tmp_path / "ok.safetensors")
    loaded = load_checkpoint(path).eval()
    assert loaded.head.weight is loaded.embed.tok.weight
    assert len(list(loaded.parameters())) == len(list(source.parameters()))
    assert not any(t.is_meta for t in loaded.state_dict().values())
    ids = torch.randint(0, 50, (2, 7))
    assert torch.equal(loaded(ids), source(ids))


# --- adapters ----------------------------------------------------------------------------
def adapted(seed: int = 0) -> tuple[GPT, GPT]:
    "(a base GPT, the same GPT with LoRA on q_proj and v_proj)."
    torch.manual_seed(seed)
    base = GPT(CFG)
    lora = GPT(CFG)
    lora.load_state_dict(base.state_dict())
    add_lora(lora)
    for name, p in lora.named_parameters():
        if name.endswith(".B"):
            torch.nn.init.normal_(p)  # a trained adapter's B is not zero
    return base, lora


def adapter(path: Path, change_layers=None, drop: str | None = None) -> Path:
    _, lora = adapted()
    save_adapter(lora, path)
    tensors = load_file(path)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    layers = json.loads(meta["layers"])
    if change_layers is not None:
        change_layers(layers)
    if drop is not None:
        del tensors[drop]
    save_file(tensors, path, metadata=meta | {"layers": json.dumps(layers)})
    return path


def test_the_adapter_loads(tmp_path):
    base, lora = adapted()
    load_adapter(base, adapter(tmp_path / "ok.safetensors"))
    ids = torch.randint(0, 50, (2, 7))
    assert torch.equal(base(ids), lora(ids))


def _last(layers: dict) -> dict:
    return layers[list(layers)[-1]]  # the last layer: the old loader had wrapped others


@pytest.mark.parametrize("change, field", [
    (lambda ls: _last(ls).update(alpha=-1), "alpha"),
    (lambda ls: _last(ls).pop("r"), "r, alpha and fingerprint"),
    (lambda ls: _last(ls).update(r=10**6), "r=1000000"),
    (lambda ls: _last(ls).update(dropout=1.5), "dropout"),
    (lambda ls: _last(ls).update(fingerprint=7), "fingerprint")])
def test_an_invalid_layer_leaves_the_model_as_it_was(tmp_path, change, field):
    path = adapter(tmp_path / "bad.safetensors", change)
    base, _ = adapted()
    before = snapshot(base)
    with pytest.raises(ValueError, match=field) as e:
        load_adapter(base, path)
    assert str(path) in str(e.value)
    assert same_state(base, before) and not lora_layers(base)
    assert all(p.requires_grad for p in base.parameters())  # not frozen either


def test_an_adapter_lacking_a_tensor_it_lists_is_refused(tmp_path):
    path = adapter(tmp_path / "lacking.safetensors",
                   drop="decoder.layers.1.self_attn.qkv.v_proj.B")
    base, _ = adapted()
    before = snapshot(base)
    with pytest.raises(ValueError, match="lacks.*v_proj.B") as e:
        load_adapter(base, path)
    assert str(path) in str(e.value) and same_state(base, before) and not lora_layers(base)


def test_an_adapter_layer_list_that_is_not_json(tmp_path):
    path = adapter(tmp_path / "json.safetensors")
    tensors = load_file(path)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    save_file(tensors, path, metadata=meta | {"layers": "[" * 100_000})
    base, _ = adapted()
    with pytest.raises(ValueError, match="layer list is not valid JSON"):
        load_adapter(base, path)


def test_an_adapter_naming_a_weight_it_wraps_is_refused(tmp_path):
    "A base weight of a layer the adapter wraps would move under LoRA: refused first."
    layer = "decoder.layers.0.self_attn.qkv.q_proj"
    path = adapter(tmp_path / "base.safetensors")
    tensors = load_file(path)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    base, _ = adapted()
    tensors[f"{layer}.weight"] = base.get_parameter(f"{layer}.weight").detach().clone()
    save_file(tensors, path, metadata=meta)
    before = snapshot(base)
    with pytest.raises(ValueError, match=f"{layer}.weight, which is not LoRA"):
        load_adapter(base, path)
    assert same_state(base, before) and not lora_layers(base)


# --- more checkpoint and folder cases ----------------------------------------------------
def test_aliases_must_be_the_config_s_tied_weights(tmp_path):
    path = checkpoint(tmp_path / "alias.safetensors",
                      aliases=json.dumps({"decoder.norm.weight":
                                          "decoder.layers.0.attn_norm.weight"}))
    model = GPT(CFG)
    before = snapshot(model)
    for target in (None, model):
        with pytest.raises(ValueError, match="do not name its config's tied weights"):
            load_checkpoint(path, target)
    assert same_state(model, before)


def test_a_tied_weight_stored_twice_is_refused(tmp_path):
    path = checkpoint(tmp_path / "twice.safetensors", aliases="{}")
    tensors = load_file(path)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    tensors["head.weight"] = torch.randn_like(tensors["embed.tok.weight"])
    save_file(tensors, path, metadata=meta)
    for target in (None, GPT(CFG)):
        with pytest.raises(ValueError, match="tied weights"):
            load_checkpoint(path, target)


@pytest.mark.timeout(60)
def test_junk_tensors_do_not_buy_layers(tmp_path):
    "A thousand empty tensors back no layer: every expected name is checked first."
    import time
    path = with_config(tmp_path / "junk.safetensors", n_layers=1000)
    tensors = load_file(path) | {f"junk.{i}": torch.zeros(0) for i in range(9000)}
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    save_file(tensors, path, metadata=meta)
    start = time.perf_counter()
    with pytest.raises(ValueError, match="missing"):
        load_checkpoint(path)
    assert time.perf_counter() - start < 10


def test_files_that_are_not_utf8_name_themselves(tmp_path):
    folder = llama_folder(tmp_path / "binary")
    (folder / "config.json").write_bytes(b"\xff\xfe{\x00")
    with pytest.raises(ValueError, match="config.json"):
        load_folder(folder)
    folder = llama_folder(tmp_path / "template")
    (folder / "tokenizer.json").write_text(_tiny_tokenizer_json())
    (folder / "chat_template.jinja").write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="chat_template.jinja"):
        load_folder(folder)


@pytest.mark.parametrize("dtype", [torch.int64, "bfloat16"])
def test_a_wrong_dtype_is_refused_before_reading(tmp_path, dtype):
    folder = llama_folder(tmp_path / "dtype")
    with pytest.raises((TypeError, ValueError), match="dtype"):
        load_folder(folder, dtype=dtype)
    with pytest.raises((TypeError, ValueError), match="dtype"):
        load_gguf(gguf_file(tmp_path / "d.gguf"), dtype=dtype)


def test_a_config_too_large_to_exist_names_its_file(tmp_path):
    "hidden_size=10**9 with one head: tensors too large to exist, refused naming config.json."
    folder = llama_folder(tmp_path / "huge", hidden_size=10**9, num_attention_heads=1,
                          num_key_value_heads=1)
    with pytest.raises(ValueError, match="config.json") as e:
        load_folder(folder)
    assert "too large" in str(e.value) or "shape" in str(e.value), e.value


def test_a_lora_model_is_not_saved_as_a_checkpoint(tmp_path):
    "save_checkpoint would write a file load_checkpoint rejects: refused, pointing on."
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_len=8))
    add_lora(model, ["q_proj", "v_proj"], r=2)
    with pytest.raises(ValueError, match="save_adapter"):
        save_checkpoint(model, tmp_path / "lora.safetensors")
    assert not (tmp_path / "lora.safetensors").exists()
