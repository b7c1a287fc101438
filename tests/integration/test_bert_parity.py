"""TextEncoder: BERT's layout, checked against `transformers`' BertModel on random weights
(the real all-MiniLM-L6-v2 weights are checked in test_pretrained.py, via load_folder)."""

import pytest
import torch

from minitransformer.checkpoints import load_checkpoint, save_checkpoint
from minitransformer.model import TextEncoder, TextEncoderConfig
from minitransformer.pretrained import bert_rules

transformers = pytest.importorskip("transformers")


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
    names = {k: v[0] for k, v in bert_rules(cfg["num_hidden_layers"]).items()}
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
