"""Talking to a loaded model: `Pretrained.chat` and `complete` stop at the end of the turn by
themselves (a set of end ids), stream their text in pieces that join to the returned text, and
refuse what cannot write; on the real SmolLM2 GGUF file."""

import json

import pytest
import torch

from minitransformer.generation import generate
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
    """A seed repeats a sampled reply (the same model, on the same machine); `complete` continues
    a prompt with its likeliest token where that token leads by a margin no kernel can undo
    (measured 2.48 logits for " Paris" over " the"; float32's error there is ~1e-4)."""
    kw = dict(max_new_tokens=20, temperature=0.8, top_k=40, seed=7)
    assert smol.chat(QUESTION, **kw) == smol.chat(QUESTION, **kw)
    tok, prompt = smol.tokenizer, "The capital of France is"
    with torch.no_grad():
        top = smol.model(torch.tensor([tok.encode(prompt)]))[0, -1].topk(2)
    assert top.values[0] - top.values[1] > 1.0, top  # a clear winner, on any machine
    said = smol.complete(prompt, max_new_tokens=8)
    assert said.startswith(tok.decode([int(top.indices[0])])) and said.startswith(" Paris")


# bfloat16 keeps 8 significant bits: over SmolLM2's 30 layers the chat's logits moved by at most
# 0.0247 of their largest magnitude on an AVX2 CPU (bfloat16 emulated) and 0.024 on one with
# native bfloat16 (AMX); twice that is the bound. Which token wins where float32's top two are
# closer than that is the machine's choice (the first reply token: 0.08 apart), so the text a
# bfloat16 model writes greedily is never asserted, only what holds on any machine.
BF16_LOGITS = 0.05


@pytest.fixture(scope="module")
def half():
    pytest.importorskip("gguf")
    import minitransformer as mt
    return mt.load(smollm2_gguf(), dtype=torch.bfloat16, max_len=256)


@pytest.mark.reduced_precision
def test_a_bfloat16_model_agrees_with_float32_and_ends_the_turn_where_it_does(smol, half):
    """Teacher forcing: float32's reply (and its end-of-turn token) fed to both models. The
    bfloat16 logits stay within BF16_LOGITS of float32's; wherever float32's winner leads by
    more than twice this machine's error there, bfloat16 picks it too; and at the reply's end
    the end-of-turn token leads by such a margin, so a bfloat16 chat ends its turn there."""
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16}
    tok = smol.tokenizer
    prompt = tok.encode(tok.apply_chat_template(QUESTION), special_tokens=False)
    reply = generate(smol.model, [prompt], 48, stop_token=tok.end_ids)[0]
    ids = torch.tensor([prompt + reply + sorted(tok.end_ids)])  # the turn, ended
    with torch.no_grad():
        want = smol.model(ids[:, :-1])[0, len(prompt) - 1:]  # predicting each reply token
        got = half.model(ids[:, :-1])[0, len(prompt) - 1:].float()
    err = (got - want).abs().amax(-1)  # each position's largest difference
    assert err.max() <= BF16_LOGITS * want.abs().max(), (err.max(), want.abs().max())
    top = want.topk(2, -1)
    lead = top.values[:, 0] - top.values[:, 1]
    clear = lead > 2 * err
    assert torch.equal(got.argmax(-1)[clear], top.indices[clear, 0]), (lead, err)
    assert clear[-1] and int(top.indices[-1, 0]) in tok.end_ids, (lead[-1], err[-1])
    assert clear.sum() >= len(reply) - 1, (lead, err)  # all but near ties are compared


@pytest.mark.reduced_precision
def test_a_bfloat16_chat_stops_where_its_own_tokens_end(half):
    """The stop mechanism on the bfloat16 model against this machine's own greedy tokens, and
    on the same model with its end-of-turn logit made to win from the fourth new token on."""
    tok = half.tokenizer
    prompt = tok.encode(tok.apply_chat_template(QUESTION), special_tokens=False)
    own = generate(half.model, [prompt], 24, stop_token=tok.end_ids)[0]
    assert half.chat(QUESTION, max_new_tokens=24) == tok.decode(own)
    end, calls = next(iter(tok.end_ids)), []

    def end_wins_later(module, args, out):  # the head's logits, from the 4th step on
        calls.append(1)
        if len(calls) >= 4:
            out[..., end] = out.max() + 1
        return out
    hook = half.model.head.register_forward_hook(end_wins_later)
    try:
        reply = half.chat("What is the capital of France?", max_new_tokens=24)
    finally:
        hook.remove()
    assert half.stats["new_tokens"] == 3 and half.stats["prompt_tokens"] == len(prompt)
    assert reply == tok.decode(generate(half.model, [prompt], 3)[0]), reply


def test_dtype_auto_computes_a_file_of_blocks_in_float32():
    pytest.importorskip("gguf")
    import minitransformer as mt
    stored = mt.load(smollm2_gguf(), dtype="auto", max_len=64)  # Q4_1/Q8_0: f16 scales
    assert {p.dtype for p in stored.model.parameters()} == {torch.float32}


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
