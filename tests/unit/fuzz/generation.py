"""Fuzz cases of `minitransformer.generation`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch import nn

from ._common import (
    BAD,
    EDGE,
    OPT_POS_INT_BAD,
    POS_INT_BAD,
    Probe,
    VALID,
    _mod,
    bools,
    case,
    expect_tensor,
    floats,
    fmt,
    inf,
    nan,
    ok,
)


# ================================================================== generation
def next_token_scores(p):
    "Scores `(B, V)` for the next token, in float32, float16 or bfloat16, some of them -inf."
    B, V = p.draw(st.integers(1, 3), label="B"), p.draw(st.integers(1, 20), label="V")
    dtype = p.draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]), label="dtype")
    logits = floats(p, (B, V), dtype, "logits")
    if p.draw(st.booleans(), label="some -inf"):
        logits[:, 1:] = logits[:, 1:].masked_fill(bools(p, (B, V - 1), "-inf"), -inf)
    return logits


@case("generation.sample_next", examples=50)
def _(data):
    gen = _mod("generation")
    p = Probe(data, ["logits", "temperature", "top_k", "top_p", "generator"])
    logits = next_token_scores(p)
    logits = p.tensor("logits", logits, {
        "long": BAD, "list": BAD, "flat": BAD, "unsqueeze": BAD, "nan": BAD,
        "all_neginf": (BAD, lambda t: torch.full_like(t, -inf)), "noncontig": VALID,
        "b0": EDGE, "no_vocab": (EDGE, lambda t: t[:, :0]), "inf": EDGE})
    temperature = p.value("temperature", st.one_of(st.sampled_from([0.0, 1.0, 0.7, 2.0]),
                                                   st.floats(0, 10)),
                          (-1.0, nan, inf, "1", None, -0.0),
                          judge=lambda v: VALID if v == 0 and isinstance(v, float) else (EDGE if v == inf else BAD))
    top_k = p.value("top_k", st.one_of(st.none(), st.integers(1, 25)), OPT_POS_INT_BAD)
    top_p = p.value("top_p", st.one_of(st.none(), st.sampled_from([1.0, 0.9, 0.5, 1e-6])),
                    (0.0, -0.5, 1.5, nan, "0.9", True))
    gen_ = torch.Generator().manual_seed(0)
    if p.hit("generator"):
        gen_ = p.draw(st.sampled_from([0, "seed", torch.zeros(1)]), label="generator (corrupted)")
        p.mark(BAD, ["generator"], f"generator={gen_!r}")
    out = p.run(lambda: p.call("sample_next", gen.sample_next, logits, temperature, top_k,
                               top_p, gen_))
    if ok(out):
        expect_tensor(out, (logits.shape[0],), torch.long)
        assert ((out >= 0) & (out < logits.shape[1])).all()
        if p.finite and logits.numel():
            picked = logits.float().gather(1, out[:, None])
            assert (picked > -inf).all(), "sampled a token whose logit is -inf"
            if temperature == 0 or top_k == 1:
                assert torch.equal(picked[:, 0], logits.float().max(-1).values)


@case("generation.top_p_filter", examples=50)
def _(data):
    gen = _mod("generation")
    p = Probe(data, ["logits", "top_p"])
    logits = next_token_scores(p)
    logits = p.tensor("logits", logits, {
        "long": BAD, "list": BAD, "flat": BAD, "unsqueeze": BAD, "noncontig": VALID,
        "b0": EDGE, "no_vocab": (BAD, lambda t: t[:, :0])})
    top_p = p.value("top_p", st.sampled_from([1.0, 0.9, 0.5, 1e-6]),
                    (0.0, -0.5, 1.5, nan, "0.9", True, None))
    out = p.run(lambda: p.call("top_p_filter", gen.top_p_filter, logits, top_p))
    if ok(out):
        expect_tensor(out, tuple(logits.shape), logits.dtype)
        kept = out > -inf
        # a kept score is unchanged; every row with a finite score keeps its largest
        assert torch.equal(out[kept], logits[kept])
        if p.finite and logits.numel():
            rows = torch.isfinite(logits).any(-1)
            assert torch.equal(out.float().amax(-1)[rows], logits.float().amax(-1)[rows])


@case("generation.read_bandwidth", examples=20)
def _(data):
    gen = _mod("generation")
    p = Probe(data, ["n_bytes", "repeats"])
    n_bytes = p.value("n_bytes", st.integers(4, 4096), (3, 0, -4, 2.5, True, "64", None, nan))
    repeats = p.value("repeats", st.integers(1, 3), POS_INT_BAD)
    out = p.run(lambda: p.call("read_bandwidth", gen.read_bandwidth, n_bytes, repeats))
    if ok(out):
        assert isinstance(out, float) and out > 0, out


def _tiny_model(p, encdec, max_len=8):
    model = _mod("model")
    if encdec:
        c = model.TransformerConfig(d_model=4, n_heads=1, d_ff=4, src_vocab_size=9,
                                    tgt_vocab_size=7, n_encoder_layers=1, n_decoder_layers=1,
                                    max_len=max_len)
        return model.Transformer(c).eval()
    pe = p.draw(st.sampled_from(["learned", "rotary", "sinusoidal"]), label="position_encoding")
    return model.GPT(model.GPTConfig(d_model=4, n_heads=1, d_ff=4, vocab_size=7, n_layers=1,
                                     max_len=max_len, position_encoding=pe)).eval()


@case("generation.generate", examples=50)
def _(data):
    gen = _mod("generation")
    p = Probe(data, ["model", "prompts", "max_new_tokens", "source", "temperature", "top_k",
                     "top_p"])
    encdec = p.draw(st.booleans(), label="encoder-decoder")
    m = _tiny_model(p, encdec)
    Vt, L = 7, 8
    B = p.draw(st.integers(1, 3), label="B")
    rows = [p.draw(st.lists(st.integers(0, Vt - 1), min_size=1, max_size=3), label="prompt")
            for _ in range(B)]
    as_tensor = p.draw(st.booleans(), label="prompts as a tensor")
    prompts = torch.tensor([r[:1] for r in rows]) if as_tensor else rows
    if p.hit("prompts"):
        kind = p.draw(st.sampled_from(["empty", "empty row", "too_big", "negative", "float",
                                       "string", "1-D tensor", "(B, 0) tensor", "float tensor"]))
        prompts = {"empty": [], "empty row": [[1], []], "too_big": [[Vt + 3]], "negative": [[-1]],
                   "float": [[1.5]], "string": "hello", "1-D tensor": torch.tensor([1, 2]),
                   "(B, 0) tensor": torch.zeros(2, 0, dtype=torch.long),
                   "float tensor": torch.tensor([[1.5]])}[kind]
        p.mark(BAD, ["prompts", "prompt"], f"prompts: {kind} {fmt(prompts)}")
    n_rows = len(prompts) if isinstance(prompts, (list, torch.Tensor)) and not p.hit("prompts") else B
    P = max(len(r) for r in (prompts.tolist() if isinstance(prompts, torch.Tensor) else prompts)) \
        if not p.hit("prompts") else 1
    # the last new token is never fed back: P + max_new_tokens - 1 <= max_len
    mnt = p.value("max_new_tokens", st.integers(0, L - P + 1), (-1, 1.5, True, None, L - P + 2),
                  judge=lambda v: VALID if v is True and P < L else BAD,
                  names=["max_new_tokens", "max_len"])
    if p.hit("max_new_tokens") and mnt is True:
        p.mark(BAD, ["max_new_tokens"], "max_new_tokens=True")
    source = None
    if encdec:
        source = [p.draw(st.lists(st.integers(0, 8), min_size=1, max_size=3), label="source")
                  for _ in range(n_rows)]
    if p.hit("source"):
        if encdec:
            kind = p.draw(st.sampled_from(["missing", "count", "empty row", "too_big", "too_long"]))
            source = {"missing": None, "count": source + [[1]], "empty row": [[]] * n_rows,
                      "too_big": [[50]] * n_rows, "too_long": [[1] * (L + 1)] * n_rows}[kind]
        else:
            kind, source = "for a GPT", [[1]] * n_rows
        p.mark(BAD, ["source", "sources", "prompts", "max_len"], f"source: {kind}")
    temperature = p.value("temperature", st.sampled_from([0.0, 1.0, 0.5]), (-1.0, nan, "1", None))
    top_k = p.value("top_k", st.one_of(st.none(), st.integers(1, 9)), (0, -1, 1.5))
    top_p = p.value("top_p", st.one_of(st.none(), st.sampled_from([0.9, 1.0])), (0.0, 1.5, nan))
    stop = p.draw(st.one_of(st.none(), st.integers(0, Vt - 1)), label="stop_token")
    use_cache = p.draw(st.booleans(), label="use_cache")
    model_ = m
    if p.hit("model"):
        model_ = p.draw(st.sampled_from(["module", "None", "string"]), label="model (corrupted)")
        model_ = {"module": nn.Linear(2, 2), "None": None, "string": "gpt"}[model_]
        p.mark(BAD, ["model"], f"model={fmt(model_)}")
    gen_ = torch.Generator().manual_seed(0)
    out = p.run(lambda: p.call("generate", gen.generate, model_, prompts, mnt, source=source,
                               temperature=temperature, top_k=top_k, top_p=top_p,
                               stop_token=stop, generator=gen_, use_cache=use_cache))
    if ok(out):
        assert isinstance(out, list) and len(out) == n_rows
        for row in out:
            assert isinstance(row, list) and len(row) <= mnt
            assert all(type(t) is int and 0 <= t < Vt and t != stop for t in row)
            if stop is None:
                assert len(row) == mnt
