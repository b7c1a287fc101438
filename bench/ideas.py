"""What each idea buys: one character-level model of Shakespeare's plays, grown one idea at a time,
each rung trained with the same protocol and scored on the same held-out windows.

    python bench/ideas.py [--steps 1500] [--seeds 0 1 2] [--threads 2]
        [--out nbs/ideas.json] [--svg nbs/figures/11-ideas.svg]
    python bench/ideas.py --retime [--out nbs/ideas.json]   (steps/s again, on a quiet machine)
    python bench/ideas.py --tables [--out nbs/ideas.json]   (the book's markdown rows, from the JSON)
    python bench/ideas.py --replot [--out nbs/ideas.json] [--svg ...]   (the plot, from the JSON)

The losses do not depend on the machine's load; steps per second do: `--retime` measures them
again (100 steps of each rung, after 10 untimed, seed 0) and records the load average with them.

The rungs, each the one before plus one idea, all built from the package's own modules:
  0 bigram: each character's vector (chapter 2) straight to the output head
  1 + weight-free causal mixing: the average of the characters so far (chapter 1's `mix`)
  2 + learned Q, K, V: one head of scaled dot-product attention (chapters 3, 4, 8's rule)
  3 + several heads (chapter 5's `MultiHeadAttention`, 4 heads)
  4 + the feed-forward network after attention (chapter 6)
  5 + positions: a learned vector per position added to each character's (chapter 7)
  6 + N = 4 such blocks, stacked without residuals or norms
  7 + residuals and pre-norms: 4 of chapter 9's layers and a final norm
Protocol: width 64, context 32, batch 32, a fixed number of AdamW steps (chapter 13's `train`:
warm-up 100, cosine to 0.1, clipping at 1, ONE learning rate, 1e-3, for every rung: no rung is
tuned), per seed the same initial random state and the same batches for every rung, and the same
200 held-out windows (the last plays, by name) for every rung and seed. The gain of a rung is the
mean over seeds of the paired difference (same seed, same batches) to the rung below; it "buys"
when all paired differences are positive and the mean exceeds twice the larger seed standard
deviation of the two rungs, it "costs" in the mirror case, and is "within noise" otherwise.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from minitransformer.attention import scaled_dot_product_attention
from minitransformer.data import char_windows, shakespeare_split
from minitransformer.embeddings import TokenEmbedding, Tokenizer
from minitransformer.feedforward import FeedForward
from minitransformer.layers import EncoderLayer, LayerConfig
from minitransformer.masks import causal_mask
from minitransformer.mixing import mix
from minitransformer.model import count_parameters
from minitransformer.multihead import MultiHeadAttention
from minitransformer.positions import LearnedPositions
from minitransformer.qkv import QKVProjection
from minitransformer.training import sequence_loss, train

ROOT = Path(__file__).resolve().parent.parent
RUNGS = ["bigram", "+ causal mixing (no weights)", "+ learned Q, K, V (one head)",
         "+ several heads", "+ feed-forward network", "+ positions",
         "+ 4 blocks, no residuals", "+ residuals and norms"]
CHAPTERS = [2, 1, 4, 5, 6, 7, 9, 9]  # the chapter that teaches each rung's idea
WIDTH, CONTEXT, BATCH, HEADS, BLOCKS, LR = 64, 32, 32, 4, 4, 1e-3
VAL_WINDOWS = 200
NANOGPT = 1.4697  # nanoGPT's README: best validation loss of its character model


class Ladder(nn.Module):
    "Rung `rung` of the ladder: ids `(B, T)` → next-character logits `(B, T, V)`."

    def __init__(self, rung: int, vocab_size: int):
        super().__init__()
        self.rung = rung
        self.embed = TokenEmbedding(vocab_size, WIDTH)
        if rung >= 5:
            self.positions = LearnedPositions(WIDTH, CONTEXT)
        if rung == 2:
            self.qkv = QKVProjection(WIDTH, WIDTH)
        if rung in (3, 4, 5):
            self.attn = MultiHeadAttention(WIDTH, HEADS)
        if rung in (4, 5):
            self.ff = FeedForward(WIDTH, 4 * WIDTH)
        if rung == 6:
            self.blocks = nn.ModuleList(nn.ModuleList(
                [MultiHeadAttention(WIDTH, HEADS), FeedForward(WIDTH, 4 * WIDTH)])
                for _ in range(BLOCKS))
        if rung == 7:
            cfg = LayerConfig(d_model=WIDTH, n_heads=HEADS, norm_first=True)
            self.blocks = nn.ModuleList(EncoderLayer(cfg) for _ in range(BLOCKS))
            self.norm = cfg.make_norm()
        self.head = nn.Linear(WIDTH, vocab_size)
        self.register_buffer("causal", causal_mask(CONTEXT), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        T = ids.shape[1]
        x = self.embed(ids)  # (B, T, C)
        if self.rung >= 5:
            x = x + self.positions(torch.arange(T))
        mask = self.causal[:T, :T]
        if self.rung == 1:  # each position: the plain average of the characters so far
            x = mix(mask / mask.sum(-1, keepdim=True), x, check=False)
        elif self.rung == 2:
            q, k, v = self.qkv(x)
            x = scaled_dot_product_attention(q, k, v, mask)
        elif self.rung in (3, 4, 5):
            x = self.attn(x, mask=mask)
            if self.rung >= 4:
                x = self.ff(x)
        elif self.rung == 6:
            for attn, ff in self.blocks:
                x = ff(attn(x, mask=mask))
        elif self.rung == 7:
            for layer in self.blocks:
                x = layer(x, mask=mask)
            x = self.norm(x)
        return self.head(x)


def lm_loss(model, batch):
    x, y = batch
    return sequence_loss(model(x), y)


def run(rung: int, seed: int, steps: int, data: dict) -> dict:
    "Train rung `rung` from seed `seed`; its held-out loss, parameters and steps/s."
    torch.manual_seed(seed)
    model = Ladder(rung, data["vocab"])
    windows = torch.Generator().manual_seed(seed)  # the same batches for every rung
    start = time.perf_counter()
    log = train(model, lambda step: char_windows(data["train"], CONTEXT, BATCH, windows),
                lm_loss, steps=steps, lr=LR, warmup=100, log_every=0)
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        val = torch.stack([sequence_loss(model(x), y) for x, y in data["val"]]).mean()
    return {"rung": rung, "seed": seed, "val_loss": round(val.item(), 4),
            "final_train_loss": round(log.losses[-1], 4),
            "parameters": count_parameters(model), "steps_per_second": round(steps / seconds, 1)}


def verdicts(runs: list[dict], seeds: list[int]) -> list[dict]:
    "Per rung: mean and seed std of the held-out loss, and the paired gain over the rung below."
    loss = {(r["rung"], r["seed"]): r["val_loss"] for r in runs}
    rows = []
    for rung in range(len(RUNGS)):
        values = [loss[rung, s] for s in seeds]
        row = {"rung": rung, "name": RUNGS[rung], "chapter": CHAPTERS[rung],
               "mean": round(statistics.mean(values), 4),
               "std": round(statistics.stdev(values), 4),
               "parameters": next(r["parameters"] for r in runs if r["rung"] == rung),
               "steps_per_second": round(statistics.median(
                   r["steps_per_second"] for r in runs if r["rung"] == rung), 1)}
        if rung:
            diffs = [loss[rung - 1, s] - loss[rung, s] for s in seeds]  # > 0: lower loss
            gain, noise = statistics.mean(diffs), 2 * max(row["std"], rows[-1]["std"])
            row["paired_gains"] = [round(d, 4) for d in diffs]
            row["gain"] = round(gain, 4)
            row["verdict"] = ("buys" if all(d > 0 for d in diffs) and gain > noise else
                              "costs" if all(d < 0 for d in diffs) and -gain > noise else
                              "within noise")
        rows.append(row)
    return rows


def table_rows(result: dict, rungs=None) -> str:
    "The book's markdown table of `rungs` (all by default), read from a results file."
    head = ("| rung | held-out loss (mean ± sd, 3 seeds) | gain over the rung below "
            "| parameters |\n|---|---|---|---|")
    lines = [head]
    for row in result["rows"]:
        if rungs is not None and row["rung"] not in rungs:
            continue
        gain = "—" if row["rung"] == 0 else f"{row['gain']:+.3f} ({row['verdict']})"
        lines.append(f"| {row['rung']}. {row['name']} | {row['mean']:.3f} ± {row['std']:.3f} "
                     f"| {gain} | {row['parameters']:,} |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams["svg.hashsalt"] = "ideas"  # the same SVG from the same numbers
    fig, ax = plt.subplots(figsize=(7, 3.6))
    rows = result["rows"]
    for seed in result["seeds"]:
        ys = [next(r["val_loss"] for r in result["runs"] if r["rung"] == row["rung"]
                   and r["seed"] == seed) for row in rows]
        ax.plot(range(len(rows)), ys, "o", color="0.6", markersize=4,
                label="one seed" if seed == result["seeds"][0] else None)
    ax.plot(range(len(rows)), [r["mean"] for r in rows], "-", color="C0", label="mean")
    ax.axhline(rows[0]["mean"], color="0.5", linestyle="--", linewidth=1,
               label="the bigram floor")
    ax.axhline(result["nanogpt_char_val_loss"], color="0.5", linestyle=":", linewidth=1,
               label="nanoGPT's character model (other text; for scale)")
    ax.set_xticks(range(len(rows)), [f"{r['rung']}" for r in rows])
    ax.set_xlabel("rung: " + "; ".join(f"{r['rung']} {r['name'].removeprefix('+ ')}"
                                       for r in rows[:4]) + ";\n"
                  + "; ".join(f"{r['rung']} {r['name'].removeprefix('+ ')}" for r in rows[4:]),
                  fontsize=8)
    ax.set_ylabel("held-out loss (nats/char)")
    ax.set_ylim(1.3, 3.4)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "nbs" / "ideas.json")
    p.add_argument("--svg", type=Path, default=ROOT / "nbs" / "figures" / "11-ideas.svg")
    p.add_argument("--tables", action="store_true", help="print the book's rows from --out")
    p.add_argument("--retime", action="store_true", help="measure steps/s again into --out")
    p.add_argument("--replot", action="store_true", help="draw --svg again from --out")
    a = p.parse_args()
    if a.tables or a.replot:
        result = json.loads(a.out.read_text())
        if a.tables:
            print(table_rows(result))
        else:
            plot(result, a.svg)
        return 0
    torch.set_num_threads(a.threads)
    data = load_data()
    if a.retime:
        result = json.loads(a.out.read_text())
        retime(result, data, a.threads)
        a.out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result["timing"]))
        return 0
    load = os.getloadavg()[0]
    runs, start = [], time.perf_counter()
    for seed in a.seeds:
        for rung in range(len(RUNGS)):
            runs.append(run(rung, seed, a.steps, data))
            print(json.dumps(runs[-1]), flush=True)
    result = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "cpus": os.cpu_count(), "python": sys.version.split()[0]},
              "torch": torch.__version__, "threads": a.threads,
              "load_average_before_after": [round(load, 2), round(os.getloadavg()[0], 2)],
              "minutes": round((time.perf_counter() - start) / 60, 1),
              "steps": a.steps, "seeds": a.seeds, "width": WIDTH, "context": CONTEXT,
              "batch": BATCH, "heads": HEADS, "blocks": BLOCKS, "lr": LR,
              "held_out_windows": VAL_WINDOWS, "vocab": data["vocab"],
              "nanogpt_char_val_loss": NANOGPT, "runs": runs}
    result["rows"] = verdicts(runs, a.seeds)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, a.svg)
    print(table_rows(result))
    return 0


def load_data() -> dict:
    "The plays as character ids, and the fixed held-out windows."
    train_text, val_text = shakespeare_split()
    tok = Tokenizer.from_texts([train_text], level="char")
    val_ids = torch.tensor(tok.encode(val_text))
    held_out = torch.Generator().manual_seed(1234)
    return {"vocab": len(tok), "train": torch.tensor(tok.encode(train_text)),
            "val": [char_windows(val_ids, CONTEXT, 20, held_out)
                    for _ in range(VAL_WINDOWS // 20)]}


def retime(result: dict, data: dict, threads: int, steps: int = 100) -> None:
    "Steps per second of each rung (seed 0), measured again, with the load average."
    load = os.getloadavg()[0]
    per_rung = []
    for rung in range(len(RUNGS)):
        torch.manual_seed(0)
        model = Ladder(rung, data["vocab"])
        g = torch.Generator().manual_seed(0)
        batch = lambda step: char_windows(data["train"], CONTEXT, BATCH, g)
        train(model, batch, lm_loss, steps=10, lr=LR, warmup=1, log_every=0)  # untimed
        start = time.perf_counter()
        train(model, batch, lm_loss, steps=steps, lr=LR, warmup=1, log_every=0)
        per_rung.append(round(steps / (time.perf_counter() - start), 1))
    for row, rate in zip(result["rows"], per_rung):
        row["steps_per_second"] = rate
    result["timing"] = {"steps_per_second": per_rung, "threads": threads,
                        "load_average_before_after": [round(load, 2),
                                                      round(os.getloadavg()[0], 2)]}


if __name__ == "__main__":
    sys.exit(main())
