"""Talking to a loaded model: `Pretrained.chat` and `complete` stop at the end of the turn by
themselves (a set of end ids), stream their text in pieces that join to the returned text, and
refuse what cannot write; on the real SmolLM2 GGUF file."""

import json

import pytest
import torch

from minitransformer.pretrained import Pretrained, PretrainedTokenizer

from helpers import smollm2_gguf, tiny

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smol():
    pytest.importorskip("gguf")
    import minitransformer as mt
    return mt.load(smollm2_gguf(), max_len=512)


def test_chat_stops_at_the_end_of_the_turn_and_streams_the_same_text(smol):
    pieces = []
    reply = smol.chat(QUESTION, max_new_tokens=48, stream=pieces.append)
    assert "Paris" in reply
    n = len(smol.tokenizer.encode(reply, special_tokens=False))
    assert n < 48, n  # it stopped by itself
    assert not any(s in reply for s in ("<|im_", "\nuser", "\nsystem")), reply
    assert "".join(pieces) == reply and len(pieces) >= 3, pieces
    assert smol.chat(QUESTION, max_new_tokens=48) == reply  # streamed or not
    assert smol.tokenizer.end_ids == {smol.tokenizer.backend.token_to_id("<|im_end|>")}


def test_sampled_replies_repeat_with_their_seed_and_complete_continues_text(smol):
    kw = dict(max_new_tokens=20, temperature=0.8, top_k=40, seed=7)
    assert smol.chat(QUESTION, **kw) == smol.chat(QUESTION, **kw)
    assert "Paris" in smol.complete("The capital of France is", max_new_tokens=8)


def test_a_bfloat16_model_stops_at_the_end_of_the_turn_too():
    pytest.importorskip("gguf")
    import minitransformer as mt
    half = mt.load(smollm2_gguf(), dtype=torch.bfloat16, max_len=256)
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16}
    stored = mt.load(smollm2_gguf(), dtype="auto", max_len=256)  # Q4_1/Q8_0: f16 scales
    assert {p.dtype for p in stored.model.parameters()} == {torch.float16}
    reply = half.chat(QUESTION, max_new_tokens=48)
    assert "Paris" in reply and len(half.tokenizer.encode(reply, special_tokens=False)) < 48


def test_pieces_never_split_a_character(smol):
    "An emoji is several byte tokens: no piece ends inside it, the pieces join to the text."
    from minitransformer.pretrained import _TextPieces
    tok = smol.tokenizer
    ids = tok.encode("café 👍 naïve 日本", special_tokens=False)
    pieces = []
    stream = _TextPieces(tok.decode, pieces.append)
    for i in ids:
        stream.add([i])
    stream.add([], last=True)
    assert stream.text == "".join(pieces) == tok.decode(ids)
    assert not any("\ufffd" in p for p in pieces), pieces


def test_end_ids_come_from_generation_config(tmp_path, smol):
    smol.tokenizer.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 1]}))
    assert PretrainedTokenizer.from_folder(tmp_path).end_ids == {1, 2}
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 10**9}))
    with pytest.raises(ValueError, match="eos_token_id must be token ids"):
        PretrainedTokenizer.from_folder(tmp_path)


def test_what_cannot_write_text_is_refused(smol):
    untokenized = Pretrained(tiny(50), None, {}, "x.bin")  # a GPT without its tokenizer
    encoder = Pretrained(torch.nn.Identity(), smol.tokenizer, {}, "y.bin")
    for loaded, name in ((untokenized, "x.bin"), (encoder, "y.bin")):
        for call in (lambda: loaded.chat(QUESTION), lambda: loaded.complete("Hi")):
            with pytest.raises(ValueError, match=f"{name} is not a language model"):
                call()
    with pytest.raises(TypeError, match="stream must be callable"):
        smol.chat(QUESTION, stream="print")
