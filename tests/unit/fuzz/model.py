"""Fuzz cases of `minitransformer.model`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st
from torch import nn

from ._common import (
    BAD,
    EDGE,
    POS_INT_BAD,
    Probe,
    VALID,
    _bool_field,
    _choice_field,
    _config_case,
    _layer_fields,
    _mod,
    bools,
    case,
    expect_tensor,
    floats,
    fmt,
    ids_of,
    inf,
    nan,
    number_in,
    ok,
    pos_int,
)


def _pos_field(hi):
    return (st.integers(1, hi), POS_INT_BAD, lambda v, kw: pos_int(v))


def _text_fields(vocab_names=()):
    model = _mod("model")

    def pad_ok(v, kw):
        if pos_int(v, lo=0) == BAD:
            return BAD
        return VALID if all(v < kw[n] for n in vocab_names) else BAD
    return {
        "max_len": _pos_field(8),
        "position_encoding": _choice_field(model.POSITION_ENCODINGS, ("alibi", None, "Rotary")),
        "rope_base": (st.sampled_from([10000.0, 100.0]), (0.0, -1.0, nan, inf, "1e4", None, True),
                      lambda v, kw: number_in(v, 0, inf, lo_open=True)),
        "pad_id": (st.integers(0, 3), (-1, 1.5, True, None, "0", 10**6), pad_ok),
    }


# ================================================================== model
@case("model.POSITION_ENCODINGS", examples=1)
def _(data):
    model = _mod("model")
    assert isinstance(model.POSITION_ENCODINGS, tuple) and model.POSITION_ENCODINGS
    for enc in model.POSITION_ENCODINGS:
        model.TextConfig(d_model=4, n_heads=1, position_encoding=enc)


@case("model.TextConfig", examples=40)
def _(data):
    _config_case(data, "TextConfig", {**_layer_fields(), **_text_fields()})


def _gpt_fields():
    return {**_layer_fields(), **_text_fields(["vocab_size"]),
            "vocab_size": _pos_field(20), "n_layers": _pos_field(2),
            "tie_weights": _bool_field()}


def _transformer_fields():
    model = _mod("model")
    f = {**_layer_fields(), **_text_fields(["src_vocab_size", "tgt_vocab_size"]),
         "src_vocab_size": (st.integers(4, 20), POS_INT_BAD, lambda v, kw: pos_int(v)),
         "tgt_vocab_size": (st.integers(4, 20), POS_INT_BAD, lambda v, kw: pos_int(v)),
         "n_encoder_layers": _pos_field(2), "n_decoder_layers": _pos_field(2),
         "tie_weights": _bool_field()}
    f["position_encoding"] = _choice_field(("learned", "sinusoidal"), ("rotary", "alibi", None))
    del model
    return f


def _classifier_fields():
    f = {**_layer_fields(), **_text_fields(["vocab_size"]),
         "vocab_size": (st.integers(4, 20), POS_INT_BAD, lambda v, kw: pos_int(v)),
         "n_classes": _pos_field(4), "n_layers": _pos_field(2),
         "pooling": _choice_field(("cls", "mean"), ("max", None, "CLS"))}
    f["position_encoding"] = _choice_field(("learned", "sinusoidal"), ("rotary", "alibi", None))
    return f


def _vit_fields():
    f = {**_layer_fields(), "n_classes": _pos_field(4), "n_layers": _pos_field(2),
         "channels": _pos_field(2),
         "image_size": (st.sampled_from([4, 6, 8]), POS_INT_BAD + (5,),
                        lambda v, kw: VALID if pos_int(v) == VALID and v % kw["patch_size"] == 0 else BAD),
         "patch_size": (st.sampled_from([1, 2]), POS_INT_BAD + (3,),
                        lambda v, kw: VALID if pos_int(v) == VALID and kw["image_size"] % v == 0 else BAD)}
    return f


@case("model.GPTConfig", examples=40)
def _(data):
    _config_case(data, "GPTConfig", _gpt_fields())


@case("model.TransformerConfig", examples=40)
def _(data):
    _config_case(data, "TransformerConfig", _transformer_fields())


@case("model.EncoderClassifierConfig", examples=40)
def _(data):
    _config_case(data, "EncoderClassifierConfig", _classifier_fields())


def _text_encoder_fields():
    f = {**_layer_fields(), **_text_fields(["vocab_size"]),
         "vocab_size": (st.integers(4, 20), POS_INT_BAD, lambda v, kw: pos_int(v)),
         "n_layers": _pos_field(2),
         "type_vocab_size": (st.integers(0, 2), (-1, 1.5, True, None, "2"),
                             lambda v, kw: pos_int(v, lo=0)),
         "embed_norm": _bool_field()}
    f["position_encoding"] = _choice_field(("learned", "sinusoidal"), ("rotary", "alibi", None))
    return f


@case("model.TextEncoderConfig", examples=40)
def _(data):
    _config_case(data, "TextEncoderConfig", _text_encoder_fields())


@case("model.ViTConfig", examples=40)
def _(data):
    def check(c):
        assert c.n_patches == (c.image_size // c.patch_size) ** 2
    _config_case(data, "ViTConfig", _vit_fields(), check)


def _valid_config(p, fields, cls_name, **fixed):
    "A valid tiny config of `cls_name` (no corruption)."
    model = _mod("model")
    kw = {}
    H = p.draw(st.sampled_from([1, 2]), label="n_heads")
    kw.update(n_heads=H, d_model=H * p.draw(st.sampled_from([2, 4]), label="head_dim"))
    for name, (valid, _, _) in fields.items():
        if name not in ("n_heads", "d_model", "pad_id"):
            kw[name] = p.draw(valid, label=name)
    kw.update(fixed)
    return getattr(model, cls_name)(**kw)


def _ids_arg(p, name, ids, V, max_len, names=None):
    return p.tensor(name, ids, {
        "float": BAD, "bool": BAD, "list": BAD, "neg": BAD, "flat": BAD, "unsqueeze": BAD,
        "too_big": (BAD, lambda t: t + V), "noncontig": VALID, "b0": EDGE, "last0": EDGE,
        "too_long": (BAD, lambda t: torch.cat([t] * (max_len + 1), -1))},
        names=names or [name, "token ids", "max_len"])


@case("model.GPT", examples=50)
def _(data):
    model = _mod("model")
    p = Probe(data, ["config", "ids", "attention_mask", "positions", "cache",
                     "full_attention_mask", "batch_size", "max_len"])
    c = _valid_config(p, _gpt_fields(), "GPTConfig",
                      max_len=p.draw(st.integers(2, 8), label="max_len"))
    V, L = c.vocab_size, c.max_len
    B, T = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, L), label="T")
    ids = _ids_arg(p, "ids", ids_of(p, (B, T), V), V, L)
    config = c
    if p.hit("config"):
        config = p.draw(st.sampled_from(["dict", "layer config", "None"]), label="config (corrupted)")
        config = {"dict": dataclasses.asdict(c), "layer config": c.layer(), "None": None}[config]
        p.mark(BAD, ["config", "GPTConfig"], f"config={fmt(config)}")
    am = bools(p, (B, T), "attention_mask") if p.draw(st.booleans(), label="attention_mask") else None
    if p.hit("attention_mask"):
        am = p.tensor("attention_mask", am if am is not None else bools(p, (B, T)), {
            "float": BAD, "list": BAD, "shorter": (BAD, lambda m: m[:, 1:]),
            "four_dims": (BAD, lambda m: m[:, None, None, :]), "all_false": (VALID, lambda m: m & False)})
    positions = None
    if p.draw(st.booleans(), label="explicit positions"):
        positions = torch.arange(T) if p.draw(st.booleans()) else torch.arange(T).expand(B, T)
    if p.hit("positions"):
        kind = p.draw(st.sampled_from(["float", "too_far", "longer", "batch", "list"]))
        positions = {"float": torch.arange(T).float(), "too_far": torch.arange(T) + L,
                     "longer": torch.arange(T + 1), "batch": torch.arange(T).expand(B + 1, T),
                     "list": list(range(T))}[kind]
        p.mark(BAD, ["positions", "max_len"], f"positions: {kind} {fmt(positions)}")
    fm = None
    if p.hit("full_attention_mask"):
        kind = p.draw(st.sampled_from(["valid", "with attention_mask", "float", "wrong_keys"]))
        fm = {"valid": torch.ones(T, T, dtype=torch.bool).tril(),
              "with attention_mask": torch.ones(T, T, dtype=torch.bool).tril(),
              "float": torch.ones(T, T).tril(), "wrong_keys": torch.ones(T, T + 1, dtype=torch.bool)}[kind]
        if kind == "with attention_mask":
            am = torch.ones(B, T, dtype=torch.bool)
        elif kind == "valid":
            am = None  # (the two masks together are refused: not this kind's point)
        p.mark(VALID if kind == "valid" else BAD, ["full_attention_mask", "attention_mask"], f"full_attention_mask: {kind}")
    use_cache = p.draw(st.booleans(), label="cache")
    cache_B = p.value("batch_size", st.just(B), (0, -1, 1.5, B + 1),
                      names=["batch_size", "cache", "k"])
    cache_L = p.value("max_len", st.sampled_from([None, L]), (0, -1, 1.5, max(T - 1, 0)),
                      judge=lambda v: EDGE if v == max(T - 1, 0) and v else BAD,
                      names=["max_len", "cache"])
    if p.hit("max_len") and cache_L == max(T - 1, 0) and cache_L:
        p.mark(BAD, ["max_len", "cache"], "cache shorter than the ids")
    if p.target in ("batch_size", "max_len"):
        use_cache = True
    cache_obj = None
    if p.hit("cache"):
        cache_obj = p.draw(st.sampled_from(["kvcache", "dict"]))
        p.mark(BAD, ["cache"], f"cache: {cache_obj}")
        use_cache = True

    def go():
        m = p.call("GPT", model.GPT, config)
        m.eval()
        cache = None
        if use_cache:
            cache = p.call("make_cache", m.make_cache, cache_B, cache_L)
            if cache_obj == "kvcache":
                cache = cache.self_attn[0]
            elif cache_obj == "dict":
                cache = {}
        y = p.call("forward", m, ids, attention_mask=am, positions=positions, cache=cache,
                   full_attention_mask=fm)
        y2 = None
        if cache is not None and len(cache) < (cache_L or L) and ids.shape[1] < L and am is None and positions is None:
            y2 = p.call("forward (next token)", m, ids[:, -1:], cache=cache)
        return y, y2
    out = p.run(go)
    if ok(out):
        y, y2 = out
        expect_tensor(y, (*ids.shape, V), torch.float32, p.finite, "logits")
        if y2 is not None:
            expect_tensor(y2, (ids.shape[0], 1, V), torch.float32, p.finite, "next-token logits")


@case("model.Transformer", examples=50)
def _(data):
    model = _mod("model")
    p = Probe(data, ["config", "src", "tgt", "batch", "attention_mask", "source_mask",
                     "memory", "positions"])
    c = _valid_config(p, _transformer_fields(), "TransformerConfig",
                      max_len=p.draw(st.integers(2, 8), label="max_len"))
    L, Vs, Vt = c.max_len, c.src_vocab_size, c.tgt_vocab_size
    B, S, T = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, L), label="S"), \
        p.draw(st.integers(1, L - 1), label="T")
    src = _ids_arg(p, "src", ids_of(p, (B, S), Vs, "src"), Vs, L,
                   names=["src", "max_len"])
    tgt = _ids_arg(p, "tgt", ids_of(p, (B, T), Vt, "tgt"), Vt, L, names=["tgt", "max_len"])
    if p.hit("src") and p.status == EDGE or p.hit("tgt") and p.status == EDGE:
        p.names += ["src", "tgt"]  # an empty batch on one side only: a batch mismatch
    if p.hit("batch"):
        tgt = torch.cat([tgt, tgt], 0)
        p.mark(BAD, ["src", "tgt"], f"src {fmt(src)} and tgt {fmt(tgt)} batch sizes differ")
    config = c
    if p.hit("config"):
        kind = p.draw(st.sampled_from(["dict", "gpt config", "None"]), label="config (corrupted)")
        # built inside the judged call (go), like any config that a corruption may need
        config = {"dict": lambda: dataclasses.asdict(c), "None": lambda: None,
                  "gpt config": lambda: model.GPTConfig(d_model=c.d_model, n_heads=c.n_heads,
                                                        vocab_size=Vt)}[kind]
        p.mark(BAD, ["config", "TransformerConfig"], f"config: {kind}")
    am = None
    if p.hit("attention_mask"):
        am = p.tensor("attention_mask", torch.ones(B, S, dtype=torch.bool), {
            "float": BAD, "list": BAD, "shorter": (BAD, lambda m: m[:, 1:]),
            "all_false": (VALID, lambda m: m & False)},
            names=["source_mask"])  # encode's real-token mask of the source
    sm_kind = "default"
    if p.hit("source_mask"):
        sm_kind = p.draw(st.sampled_from(["float", "shorter", "batch"]))
        p.mark(BAD, ["source_mask"], f"source_mask: {sm_kind}")
    mem_kind = None
    if p.hit("memory"):
        mem_kind = p.draw(st.sampled_from(["list", "wider", "double", "2d"]))
        p.mark(BAD, ["memory"], f"memory: {mem_kind}")
    positions = None
    if p.hit("positions"):
        kind = p.draw(st.sampled_from(["float", "too_far", "longer"]))
        positions = {"float": torch.arange(T).float(), "too_far": torch.arange(T) + L,
                     "longer": torch.arange(T + 1)}[kind]
        p.mark(BAD, ["positions", "max_len"], f"positions: {kind}")
    use_cache = p.draw(st.booleans(), label="cache")

    def go():
        m = p.call("Transformer", model.Transformer, config() if callable(config) else config)
        m.eval()
        y = p.call("forward", m, src, tgt)
        memory, sm = p.call("encode", m.encode, src, am)
        if sm_kind != "default":
            sm = {"float": sm.float(), "shorter": sm[:, 1:], "batch": torch.cat([sm, sm])}[sm_kind]
        if mem_kind:
            memory = {"list": memory.tolist(), "double": memory.double(), "2d": memory[0],
                      "wider": torch.cat([memory, memory[..., :1]], -1)}[mem_kind]
        z = p.call("decode", m.decode, tgt, memory, sm, positions=positions)
        w = None
        if use_cache:
            cache = p.call("make_cache", m.make_cache, memory)
            w = p.call("decode (cached)", m.decode, tgt, None, sm, cache=cache)
        return y, memory, sm, z, w
    out = p.run(go)
    if ok(out):
        y, memory, sm, z, w = out
        expect_tensor(y, (*tgt.shape, Vt), torch.float32, p.finite, "logits")
        expect_tensor(memory, (*src.shape, c.d_model), torch.float32, p.finite, "memory")
        expect_tensor(sm, src.shape, torch.bool, what="source mask")
        expect_tensor(z, (*tgt.shape, Vt), torch.float32, p.finite, "decode logits")
        if w is not None:
            expect_tensor(w, (*tgt.shape, Vt), torch.float32, p.finite, "cached decode logits")


@case("model.EncoderClassifier", examples=40)
def _(data):
    model = _mod("model")
    p = Probe(data, ["config", "ids", "attention_mask"])
    c = _valid_config(p, _classifier_fields(), "EncoderClassifierConfig",
                      max_len=p.draw(st.integers(1, 8), label="max_len"))
    V, L = c.vocab_size, c.max_len
    B, T = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, L), label="T")
    ids = _ids_arg(p, "ids", ids_of(p, (B, T), V), V, L)
    config = c
    if p.hit("config"):
        kind = p.draw(st.sampled_from(["dict", "None", "pad_id outside the vocabulary"]))
        # built inside the judged call (go): the config itself may refuse the corruption
        config = {"dict": lambda: dataclasses.asdict(c), "None": lambda: None,
                  "pad_id outside the vocabulary": lambda: dataclasses.replace(c, pad_id=V)}[kind]
        p.mark(BAD, ["config", "EncoderClassifierConfig", "pad_id"], f"config: {kind}")
    am = None
    if p.draw(st.booleans(), label="attention_mask"):
        am = bools(p, (B, T), "attention_mask")
    if p.hit("attention_mask"):
        am = p.tensor("attention_mask", am if am is not None else bools(p, (B, T)), {
            "float": BAD, "list": BAD, "shorter": (BAD, lambda m: m[:, 1:]),
            "four_dims": (BAD, lambda m: m[:, None, None, :]), "all_false": (VALID, lambda m: m & False)})

    def go():
        m = p.call("EncoderClassifier", model.EncoderClassifier,
                   config() if callable(config) else config)
        m.eval()
        return p.call("forward", m, ids, am)
    out = p.run(go)
    if ok(out):
        expect_tensor(out, (ids.shape[0], c.n_classes), torch.float32, p.finite, "logits")


@case("model.TextEncoder", examples=40)
def _(data):
    model = _mod("model")
    p = Probe(data, ["config", "ids", "attention_mask", "token_type_ids"])
    c = _valid_config(p, _text_encoder_fields(), "TextEncoderConfig",
                      max_len=p.draw(st.integers(1, 8), label="max_len"))
    V, L = c.vocab_size, c.max_len
    B, T = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, L), label="T")
    ids = _ids_arg(p, "ids", ids_of(p, (B, T), V), V, L)
    config = c
    if p.hit("config"):
        kind = p.draw(st.sampled_from(["dict", "None"]))
        config = {"dict": lambda: dataclasses.asdict(c), "None": lambda: None}[kind]
        p.mark(BAD, ["config", "TextEncoderConfig"], f"config: {kind}")
    am = bools(p, (B, T), "attention_mask") if p.draw(st.booleans(), label="am") else None
    if p.hit("attention_mask"):
        am = p.tensor("attention_mask", am if am is not None else bools(p, (B, T)), {
            "float": BAD, "list": BAD, "shorter": (BAD, lambda m: m[:, 1:]),
            "four_dims": (BAD, lambda m: m[:, None, None, :])})
    types = None
    if c.type_vocab_size and p.draw(st.booleans(), label="types"):
        types = ids_of(p, (B, T), c.type_vocab_size)
    if p.hit("token_type_ids"):
        n = max(c.type_vocab_size, 1)
        base = types if types is not None else ids_of(p, (B, T), n)
        if c.type_vocab_size:
            types = p.tensor("token_type_ids", base, {
                "float": BAD, "too_big": (BAD, lambda t: t + n),
                "shorter": (BAD, lambda t: t[:, 1:])})
        else:  # a model without token types takes none
            types = base
            p.mark(BAD, ["token_type_ids", "type_vocab_size"], "types without a table")

    def go():
        m = p.call("TextEncoder", model.TextEncoder,
                   config() if callable(config) else config)
        m.eval()
        return p.call("forward", m, ids, am, types)
    out = p.run(go)
    if ok(out):
        expect_tensor(out, (ids.shape[0], ids.shape[1], c.d_model), torch.float32,
                      p.finite, "hidden states")


@case("model.VisionTransformer", examples=40)
def _(data):
    model = _mod("model")
    p = Probe(data, ["config", "images"])
    c = _valid_config(p, _vit_fields(), "ViTConfig")
    B = p.draw(st.integers(1, 3), label="B")
    images = floats(p, (B, c.channels, c.image_size, c.image_size), label="images")
    images = p.tensor("images", images, {
        "long": BAD, "list": BAD, "double": BAD, "half": BAD, "first": BAD, "b0": EDGE,
        "noncontig": VALID, "nan": EDGE, "channels_last": (VALID, lambda t: t.contiguous(memory_format=torch.channels_last)),
        "bigger": (BAD, lambda t: torch.cat([t, t], -1))})
    config = c
    if p.hit("config"):
        config = p.draw(st.sampled_from(["dict", "None", "layer config"]), label="config (corrupted)")
        config = {"dict": dataclasses.asdict(c), "None": None, "layer config": c.layer()}[config]
        p.mark(BAD, ["config", "ViTConfig"], f"config={fmt(config)}")

    def go():
        m = p.call("VisionTransformer", model.VisionTransformer, config)
        m.eval()
        return p.call("forward", m, images)
    out = p.run(go)
    if ok(out):
        expect_tensor(out, (images.shape[0], c.n_classes), torch.float32, p.finite, "logits")


@case("model.count_parameters")
def _(data):
    model = _mod("model")
    p = Probe(data, ["model"])
    kind = p.draw(st.sampled_from(["linear", "gpt", "frozen", "empty"]), label="model kind")
    if kind == "gpt":
        m = model.GPT(model.GPTConfig(d_model=4, n_heads=1, vocab_size=7, n_layers=1, max_len=4,
                                      tie_weights=p.draw(st.booleans(), label="tie_weights")))
    else:
        m = {"linear": nn.Linear(3, 2), "frozen": nn.Linear(3, 2).requires_grad_(False),
             "empty": nn.Sequential()}[kind]
    if p.hit("model"):
        m = p.draw(st.sampled_from([None, torch.zeros(3), [nn.Parameter(torch.zeros(2))], "GPT"]),
                   label="model (corrupted)")
        p.mark(BAD, ["model"], f"model={fmt(m)}")
    out = p.run(lambda: p.call("count_parameters", model.count_parameters, m))
    if ok(out):
        unique = {id(q): q for q in m.parameters() if q.requires_grad}
        assert out == sum(q.numel() for q in unique.values())


@case("model.mean_pool")
def _(data):
    pre = _mod("model")
    p = Probe(data, ["hidden", "mask"])
    B, T, C = (p.draw(st.integers(1, 3), label=n) for n in "BTC")
    hidden = p.tensor("hidden", floats(p, (B, T, C), label="hidden"), {
        "list": BAD, "long": BAD, "flat": BAD, "noncontig": VALID})
    mask = p.tensor("mask", bools(p, (B, T)), {"float": BAD, "list": BAD,
                                                "shorter": (BAD, lambda m: m[:, 1:])})
    out = p.run(lambda: p.call("mean_pool", pre.mean_pool, hidden, mask))
    if ok(out):
        expect_tensor(out, (B, C), hidden.dtype, p.finite)
        m = mask.to(hidden.dtype)[..., None]
        want = (hidden * m).sum(1) / m.sum(1).clamp(min=1)
        torch.testing.assert_close(out, torch.nn.functional.normalize(want, dim=-1))
