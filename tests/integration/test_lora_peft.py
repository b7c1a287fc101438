"""minitransformer.lora against `peft`'s LoRA: layer by layer on a Sequential and on a whole
BERT."""

import warnings

import pytest
import torch
from torch import nn

from minitransformer.lora import add_lora, lora_layers
from minitransformer.model import TextEncoder, TextEncoderConfig
from minitransformer.pretrained import bert_rules, fill

from helpers import IDS, REAL, gap


# --- 4. parity with peft --------------------------------------------------------------
def references():
    "peft and transformers (test references only): skip where they are missing."
    return pytest.importorskip("peft"), pytest.importorskip("transformers")


def test_lora_layers_match_peft_on_a_sequential():
    peft, _ = references()
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(12, 20), nn.GELU(), nn.Linear(20, 9))
    ours = nn.Sequential(nn.Linear(12, 20), nn.GELU(), nn.Linear(20, 9))
    ours.load_state_dict(ref.state_dict())
    pm = peft.get_peft_model(ref, peft.LoraConfig(r=4, lora_alpha=12,
                                                  target_modules=["0", "2"],
                                                  lora_dropout=0.0))
    add_lora(ours, targets=("0", "2"), r=4, alpha=12.0)
    g = torch.Generator().manual_seed(3)
    theirs = dict(pm.named_parameters())
    with torch.no_grad():
        for name, m in lora_layers(ours).items():
            A, B = torch.randn(m.A.shape, generator=g), torch.randn(m.B.shape, generator=g)
            m.A.copy_(A), m.B.copy_(B)
            theirs[f"base_model.model.{name}.lora_A.default.weight"].copy_(A)
            theirs[f"base_model.model.{name}.lora_B.default.weight"].copy_(B)
    x = torch.randn(3, 5, 12, generator=g)
    w = torch.randn(3, 5, 9, generator=g)
    a, b = ours(x), pm(x)
    assert gap(a, b) <= 1e-5, gap(a, b)
    (a * w).sum().backward()
    (b * w).sum().backward()
    grads = []
    for name, m in lora_layers(ours).items():
        for ab, pa in (("A", "lora_A"), ("B", "lora_B")):
            want = theirs[f"base_model.model.{name}.{pa}.default.weight"].grad
            grads.append(gap(getattr(m, ab).grad, want))
            assert grads[-1] <= 1e-5, (name, ab)
    print(f"\n[lora vs peft, Sequential] outputs max gap {gap(a, b):.2e}; A/B gradients "
          f"max gap {max(grads):.2e}")
    trainable = sorted(n for n, p in pm.named_parameters() if p.requires_grad)
    assert len(trainable) == 4 == sum(p.requires_grad for p in ours.parameters())


def bert_pair(seed: int = 0):
    "A random `transformers` BertModel and our TextEncoder filled from its state dict."
    _, transformers = references()
    cfg = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=64, max_position_embeddings=16, type_vocab_size=2,
               layer_norm_eps=1e-12, hidden_act="gelu", hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0, pad_token_id=0)
    torch.manual_seed(seed)
    ref = transformers.BertModel(transformers.BertConfig(**cfg),
                                 add_pooling_layer=False).eval()
    ours = TextEncoder(TextEncoderConfig(
        vocab_size=60, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=16,
        type_vocab_size=2, norm_eps=1e-12)).eval()
    state = ref.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every unused tensor is a known one
        fill(ours, bert_rules(2), state.__getitem__,
             {k: tuple(v.shape) for k, v in state.items()})
    return ref, ours


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_text_encoder_lora_matches_peft_lora_on_bert():
    peft, _ = references()
    ref, ours = bert_pair()
    pm = peft.get_peft_model(ref, peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["query", "value"], lora_dropout=0.0))
    names = add_lora(ours, targets=("q_proj", "v_proj"), r=4, alpha=8.0)
    assert len(names) == 4
    theirs = dict(pm.named_parameters())
    to_peft = {"self_attn.qkv.q_proj": "attention.self.query",
               "self_attn.qkv.v_proj": "attention.self.value"}
    pairs = {}
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, m in lora_layers(ours).items():
            i, part = name.split(".")[2], name.split(".", 3)[3]
            stem = f"base_model.model.encoder.layer.{i}.{to_peft[part]}"
            pa, pb = (theirs[f"{stem}.lora_{k}.default.weight"] for k in "AB")
            assert pa.shape == m.A.shape and pb.shape == m.B.shape
            A, B = 0.2 * torch.randn(m.A.shape, generator=g), 0.2 * torch.randn(
                m.B.shape, generator=g)
            m.A.copy_(A), m.B.copy_(B), pa.copy_(A), pb.copy_(B)
            pairs[name] = (m, pa, pb)
    assert sorted(n for n, p in pm.named_parameters() if p.requires_grad) == sorted(
        n for m, pa, pb in pairs.values() for n, p in theirs.items()
        if p is pa or p is pb)
    types = torch.tensor([[0] * 8, [0] * 4 + [1] * 4])
    mine = ours(IDS, attention_mask=REAL, token_type_ids=types)
    other = pm(input_ids=IDS, attention_mask=REAL.long(),
               token_type_ids=types).last_hidden_state
    out_gap = gap(mine[REAL], other[REAL])
    with torch.no_grad():  # the adapters do change the outputs
        plain = bert_pair()[1](IDS, attention_mask=REAL, token_type_ids=types)
    assert gap(plain[REAL], mine[REAL]) > 1e-2
    w = torch.randn(mine.shape, generator=g)
    (mine[REAL] * w[REAL]).sum().backward()
    (other[REAL] * w[REAL]).sum().backward()
    grad_gap = max(max(gap(m.A.grad, pa.grad), gap(m.B.grad, pb.grad))
                   for m, pa, pb in pairs.values())
    scale = max(max(m.A.grad.abs().max().item(), m.B.grad.abs().max().item())
                for m, _, _ in pairs.values())
    print(f"\n[lora vs peft] hidden states max gap {out_gap:.2e}; A/B gradients "
          f"max gap {grad_gap:.2e} (largest gradient {scale:.2e})")
    assert out_gap <= 1e-5, out_gap
    assert grad_gap <= 1e-5, grad_gap
    frozen = [p for n, p in ours.named_parameters() if not p.requires_grad]
    assert frozen and all(p.grad is None for p in frozen)
