"""Fuzz cases of `minitransformer.pretrained`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from ._common import BAD, POS_INT_BAD, Probe, _mod, case, ok


# ------------------------------------------------------------------ pretrained, gguf (15, 16)
@case("pretrained.bert_rules", "pretrained.gpt2_rules")
def _(data):
    pre = _mod("pretrained")
    p = Probe(data, ["n_layers"])
    n = p.value("n_layers", st.integers(1, 4), POS_INT_BAD)
    for name in ("bert_rules", "gpt2_rules"):
        out = p.run(lambda: p.call(name, getattr(pre, name), n))
        if ok(out):
            assert all(isinstance(v, tuple) and len(v) == 2 for v in out.values())
            assert f"{'encoder' if name == 'bert_rules' else 'decoder'}.layers.{n - 1}." \
                   f"self_attn.qkv.q_proj.weight" in out


@case("pretrained.llama_rules", "gguf.gguf_llama_rules")
def _(data):
    pre, gg = _mod("pretrained"), _mod("gguf")
    p = Probe(data, ["n_layers", "tied", "n_heads", "n_kv_heads"])
    n = p.value("n_layers", st.integers(1, 4), POS_INT_BAD)
    tied = p.value("tied", st.booleans(), ("yes", None, 2))
    heads = p.value("n_heads", st.sampled_from([2, 4]), POS_INT_BAD)
    kv = p.value("n_kv_heads", st.sampled_from([1, 2]), POS_INT_BAD)
    if p.target in ("n_heads", "n_kv_heads"):  # llama_rules takes neither
        out = p.run(lambda: p.call("gguf_llama_rules", gg.gguf_llama_rules, n, heads,
                                   kv, tied))
    else:
        out = p.run(lambda: p.call("llama_rules", pre.llama_rules, n, tied))
        if ok(out):
            head = out["head.weight"][0]
            assert head == ("embed_tokens.weight" if tied else "lm_head.weight"), head
        out = p.run(lambda: p.call("gguf_llama_rules", gg.gguf_llama_rules, n, heads,
                                   kv, tied))
    if ok(out):  # the un-permutation maps a head's pairs back to its two halves
        how = out["decoder.layers.0.self_attn.qkv.q_proj.weight"][1]
        D = 4
        stored = torch.arange(heads * D, dtype=torch.float32)[:, None]
        halves = how(stored).flatten().reshape(heads, D)
        first = halves[0].tolist()
        assert first == [0.0, 2.0, 1.0, 3.0], first


def _hf_config_case(data, fn_name, valid: dict, unsupported: dict, optional=()):
    pre = _mod("pretrained")
    p = Probe(data, ["cfg"])
    cfg = dict(valid)
    if p.hit("cfg"):
        kind = p.draw(st.sampled_from(["drop", "unsupported", "not_a_dict"]),
                      label="cfg corruption")
        if kind == "drop":
            key = p.draw(st.sampled_from(sorted(set(valid) - set(optional))),
                         label="dropped")
            del cfg[key]
            p.mark(BAD, [key], f"cfg lacks {key}")
        elif kind == "unsupported":
            key = p.draw(st.sampled_from(sorted(unsupported)), label="unsupported")
            cfg[key] = unsupported[key]
            p.mark(BAD, [key], f"cfg[{key!r}] = {unsupported[key]!r}")
        else:
            cfg = list(cfg.items())
            p.mark(BAD, ["cfg"], "cfg is a list")
    out = p.run(lambda: p.call(fn_name, getattr(pre, fn_name), cfg))
    if ok(out):
        assert out.vocab_size == valid.get("vocab_size"), out


@case("pretrained.bert_config")
def _(data):
    _hf_config_case(data, "bert_config", dict(
        vocab_size=50, hidden_size=32, num_attention_heads=4, intermediate_size=64,
        num_hidden_layers=2, layer_norm_eps=1e-12, max_position_embeddings=16,
        type_vocab_size=2), {"hidden_act": "relu", "position_embedding_type": "relative"})


@case("pretrained.llama_config")
def _(data):
    _hf_config_case(data, "llama_config", dict(
        vocab_size=50, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, num_hidden_layers=2, rms_norm_eps=1e-5,
        max_position_embeddings=64), {
        "hidden_act": "gelu", "attention_bias": True, "mlp_bias": True,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "head_dim": 4},
        optional=("num_key_value_heads",))


@case("pretrained.gpt2_config")
def _(data):
    _hf_config_case(data, "gpt2_config", dict(
        vocab_size=50, n_embd=32, n_head=4, n_layer=2, layer_norm_epsilon=1e-5,
        n_positions=16), {"activation_function": "relu",
                          "scale_attn_by_inverse_layer_idx": True})
