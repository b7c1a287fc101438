"""Fuzz cases of `minitransformer.embeddings`: for each public name, a `case(data)` that draws its
arguments and checks the call (the property is in `_common.Probe.run`; the runner is
tests/unit/test_fuzz.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from ._common import (
    BAD,
    EDGE,
    POS_INT_BAD,
    Probe,
    VALID,
    _mod,
    case,
    expect_tensor,
    fmt,
    ids_of,
    inf,
    nan,
    ok,
    pos_int,
)

# ================================================================== embeddings
ALPHABET = "ab c.,!A\n"

TEXT = st.text(alphabet=ALPHABET, max_size=12)


@case("embeddings.SPECIAL_TOKENS", examples=1)
def _(data):
    emb = _mod("embeddings")
    t = emb.SPECIAL_TOKENS
    assert isinstance(t, tuple) and len(t) == 4 and len(set(t)) == 4
    assert all(isinstance(s, str) and s for s in t)
    assert (emb.Vocabulary.pad_id, emb.Vocabulary.unk_id, emb.Vocabulary.bos_id,
            emb.Vocabulary.eos_id) == (0, 1, 2, 3)


def _vocab_args(p):
    level = p.value("level", st.sampled_from(["word", "char"]), ("sentence", None, 1, "Word"))
    lowercase = p.draw(st.booleans(), label="lowercase")
    tokens = p.draw(st.one_of(st.lists(TEXT, max_size=6), TEXT), label="tokens")
    if p.hit("tokens"):
        tokens = p.draw(st.sampled_from([None, 5, [1, 2], ["a", None], [b"x"]]),
                        label="tokens (corrupted)")
        p.mark(BAD, ["tokens", "token"], f"tokens={tokens!r}")
    return tokens, level, lowercase


def _check_vocab(v, emb):
    assert v.itos[:4] == list(emb.SPECIAL_TOKENS)
    assert len(v) == len(v.itos) == len(v.stoi)
    assert all(v.stoi[t] == i for i, t in enumerate(v.itos))


@case("embeddings.Vocabulary")
def _(data):
    emb = _mod("embeddings")
    p = Probe(data, ["tokens", "level", "texts", "min_freq", "text"])
    tokens, level, lowercase = _vocab_args(p)
    texts = p.value("texts", st.lists(TEXT, max_size=4), ("one string", None, [1, "a"], 3),
                    names=["texts", "text"])
    min_freq = p.value("min_freq", st.integers(1, 3), (0, -1, 1.5, "2", None, nan, True),
                       judge=lambda v: EDGE if v == 0 and v is not False else BAD)
    text = p.value("text", TEXT, (None, 5, [b"x"], ["a"]))

    def go():
        v = p.call("Vocabulary", emb.Vocabulary, tokens, level, lowercase)
        w = p.call("Vocabulary.from_texts", emb.Vocabulary.from_texts, texts, level,
                   lowercase, min_freq)
        return v, w, p.call("split", w.split, text), repr(v)
    out = p.run(go)
    if ok(out):
        v, w, pieces, _ = out
        _check_vocab(v, emb)
        _check_vocab(w, emb)
        assert all(isinstance(t, str) for t in pieces)
        if level == "char":
            assert "".join(pieces) == (text.lower() if lowercase else text)


def _tokenizer(p, emb, level=None):
    level = level or p.draw(st.sampled_from(["word", "char"]), label="level")
    corpus = p.draw(st.lists(TEXT, min_size=1, max_size=4), label="corpus")
    return emb.Tokenizer.from_texts(corpus, level=level), corpus


@case("embeddings.Tokenizer")
def _(data):
    emb = _mod("embeddings")
    p = Probe(data, ["tokens", "level", "text", "ids", "texts"])
    tokens, level, lowercase = _vocab_args(p)
    text = p.value("text", TEXT, (None, 5, b"ab", ["a"]))
    add_bos, add_eos = p.draw(st.booleans()), p.draw(st.booleans())
    as_tensor = p.draw(st.booleans(), label="ids as a tensor")
    texts = p.value("texts", st.lists(TEXT, min_size=1, max_size=3),
                    ([], "one string", None, ["a", 5], ()),
                    names=["texts", "text"])
    bad_ids = (None, [1.0, 2.0], [True], [-1], [10**6], torch.tensor([1.5]),
               torch.tensor([[4, 5]]), "abc", torch.tensor([-1]))

    def go():
        tok = p.call("Tokenizer", emb.Tokenizer, tokens, level, lowercase)
        ids = p.call("encode", tok.encode, text, add_bos, add_eos)
        given = torch.tensor(ids, dtype=torch.long) if as_tensor else ids
        if p.hit("ids"):
            given = p.draw(st.sampled_from(bad_ids), label="ids (corrupted)")
            p.mark(BAD, ["ids", "token id"], f"ids={given!r}")
        back = p.call("decode", tok.decode, given)
        batch = p.call("encode_batch", tok.encode_batch, texts, add_bos, add_eos)
        return tok, ids, back, batch
    out = p.run(go)
    if ok(out):
        tok, ids, back, (batch, mask) = out
        _check_vocab(tok, emb)
        assert all(type(i) is int and 0 <= i < len(tok) for i in ids)
        assert len(ids) == len(tok.split(text)) + add_bos + add_eos
        assert isinstance(back, str)
        if level == "char" and not lowercase and all(c in tok.stoi for c in text):
            assert back == text, f"decode(encode({text!r})) = {back!r}"
        expect_tensor(batch, (len(texts), mask.shape[1]), torch.long)
        expect_tensor(mask, batch.shape, torch.bool)
        lengths = mask.sum(1).tolist()
        assert lengths == [len(tok.encode(t, add_bos, add_eos)) for t in texts]
        assert mask.shape[1] == max(lengths)


@case("embeddings.pad_ids")
def _(data):
    emb = _mod("embeddings")
    p = Probe(data, ["rows", "pad_id", "left"])
    rows = p.value("rows", st.lists(st.lists(st.integers(0, 50), max_size=4), min_size=1,
                                    max_size=3),
                   ([], None, "abc", [[1, 2.0]], [[True]], [5], torch.zeros(2, 2)))
    pad_id = p.value("pad_id", st.integers(0, 50), (None, 1.5, True, "0", -1))
    left = p.value("left", st.booleans(), (None, 1, "yes"))
    out = p.run(lambda: p.call("pad_ids", emb.pad_ids, rows, pad_id, left))
    if ok(out):
        ids, mask = out
        T = max(map(len, rows))
        expect_tensor(ids, (len(rows), T), torch.long)
        expect_tensor(mask, (len(rows), T), torch.bool)
        for b, r in enumerate(rows):
            assert ids[b][mask[b]].tolist() == r
            assert (ids[b][~mask[b]] == pad_id).all()
            real = mask[b].nonzero().flatten().tolist()
            assert real == (list(range(T - len(r), T)) if left else list(range(len(r))))


@case("embeddings.check_id_list")
def _(data):
    emb = _mod("embeddings")
    p = Probe(data, ["ids", "vocab_size"])
    V = p.value("vocab_size", st.one_of(st.none(), st.integers(1, 20)),
                (0, -1, 2.5, True, "5"))
    ids = p.draw(st.lists(st.integers(0, (V if pos_int(V) == VALID else 5) - 1),
                          max_size=4), label="ids")
    as_tensor = p.draw(st.booleans(), label="ids as a tensor")
    ids = torch.tensor(ids, dtype=torch.long) if as_tensor else ids
    if p.hit("ids"):
        import numpy as np
        kind = p.draw(st.sampled_from(["float", "bool", "string", "None", "nested",
                                       "2-D tensor", "float tensor", "negative",
                                       "too_big", "numpy", "tuple", "0-D tensor"]))
        bad = {"float": [1.5], "bool": [True], "string": "abc", "None": None,
               "nested": [[1]], "2-D tensor": torch.zeros(2, 2, dtype=torch.long),
               "float tensor": torch.zeros(2), "negative": [-1], "too_big": [99],
               "numpy": [np.int64(0)], "tuple": (0, 0), "0-D tensor": torch.tensor(0)}
        ids = bad[kind]
        fine = kind in ("numpy", "tuple", "0-D tensor") or (
            kind == "too_big" and V is None)
        p.mark(VALID if fine else BAD, ["ids", "the_ids"], f"ids: {kind} {fmt(ids)}")
    out = p.run(lambda: p.call("check_id_list", emb.check_id_list, ids, V, "the_ids"))
    if ok(out):
        assert isinstance(out, list) and all(type(i) is int for i in out)
        want = ids.reshape(-1).tolist() if isinstance(ids, torch.Tensor) else list(ids)
        assert out == [int(i) for i in want]


@case("embeddings.check_token_ids")
def _(data):
    emb = _mod("embeddings")
    p = Probe(data, ["ids", "vocab_size"])
    V = p.value("vocab_size", st.integers(1, 20), (0, -1, 2.5, None, True, "5"))
    shape = p.draw(st.lists(st.integers(1, 3), max_size=3).map(tuple), label="shape")
    ids = ids_of(p, shape, V if pos_int(V) == VALID else 5)
    ids = p.tensor("ids", ids, {
        "float": BAD, "bool": BAD, "list": BAD, "neg": BAD,
        "too_big": (BAD, lambda x: x + 100), "int32": (VALID, lambda x: x.int()),
        "noncontig": VALID, "b0": VALID, "complex": (BAD, lambda x: x.to(torch.complex64))},
        names=["ids", "token ids"])
    out = p.run(lambda: p.call("check_token_ids", emb.check_token_ids, ids, V, "ids"))
    if ok(out):
        assert out is ids


@case("embeddings.TokenEmbedding")
def _(data):
    emb = _mod("embeddings")
    p = Probe(data, ["vocab_size", "d_model", "padding_idx", "init_std"])  # trusts ids
    V = p.value("vocab_size", st.integers(1, 20), POS_INT_BAD)
    C = p.value("d_model", st.integers(1, 8), POS_INT_BAD)
    vv = V if pos_int(V) == VALID else 5
    padding_idx = p.value("padding_idx", st.one_of(st.none(), st.integers(0, vv - 1)),
                          (-1, vv, 1.5, True, "0"))
    init_std = p.value("init_std", st.sampled_from([0.02, 1.0, 0.0]),
                       (-1.0, nan, inf, "0.02", None), names=["init_std"])
    scale = p.draw(st.booleans(), label="scale")
    shape = p.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple))
    ids = p.tensor("ids", ids_of(p, shape, vv), {
        "float": BAD, "bool": BAD, "list": BAD, "neg": BAD,
        "too_big": (BAD, lambda x: x + vv), "noncontig": VALID, "b0": EDGE,
        "last0": EDGE, "scalar": EDGE}, names=["ids", "token ids"])

    def go():
        m = p.call("TokenEmbedding", emb.TokenEmbedding, V, C, padding_idx, scale, init_std)
        return m, p.call("forward", m, ids), repr(m)
    out = p.run(go)
    if ok(out):
        m, x, _ = out
        expect_tensor(x, (*ids.shape, C), torch.float32, p.finite)
        if padding_idx is not None:
            assert not m.weight[padding_idx].any()
