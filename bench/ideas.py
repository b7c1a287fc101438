"""What each idea buys: one character-level model of Shakespeare's plays, grown one idea at a time,
each rung trained at its own best learning rate and scored on the same held-out windows.

    python bench/ideas.py [--steps 3000] [--seeds 0 1 2] [--threads 2]
        [--out nbs/ideas.json] [--svg nbs/figures/11-ideas.svg]
    python bench/ideas.py --tables [--out nbs/ideas.json]   (the book's markdown rows, from the JSON)
    python bench/ideas.py --replot [--out nbs/ideas.json] [--svg ...]   (the plot, from the JSON)
    python bench/ideas.py --rows [--out ...] [--svg ...]   (the verdicts again from the runs)

The run is resumable: every finished run is written to --out at once, and a run already there is
not repeated, so the ladder can be run in pieces (stop it, start it again with the same flags).

The rungs, each the one before plus one idea, all built from the package's own modules
(h: each character's vector; "h + f(h)": f's output added to the vector, not replacing it):
  0 bigram: each character's vector (chapter 2) straight to the output head
  1 + causal mixing, added: h + the plain average of the characters so far (chapter 1's `mix`)
  2 + one learned head and positions: a learned vector per position is added to each
      character's (chapter 7), and h + one head of scaled dot-product attention (chapters 3, 4, 8)
  3 + several heads: h + chapter 5's `MultiHeadAttention` (4 heads, with W_O)
  4 + the feed-forward network: then h + chapter 6's `FeedForward`
  5 + 4 such blocks, with their paths around each step and no norms (chapter 9)
  6 + a pre-norm before each step of each block (chapter 9's `EncoderLayer`, norm_first)
  7 + a final norm before the output head (chapter 9): a 4-layer GPT
Rungs 2, 4 and 5 can represent the rung below exactly (Q = K = 0 and W_V = I give the plain
average, a zero position table adds nothing; a feed-forward network or a block with zero output
weights is no change); the others cannot.

Protocol: width 64, context 32, batch 32, AdamW by chapter 13's `train` (warm-up 100, cosine to
0.1, clipping at 1) for --steps steps. The learning rate of each rung is chosen from GRID on seed
0 by the loss on a validation slice (the last 5 % of the training text, never trained on); seeds
1 and 2 then train at that rate. Per seed, every rung starts from the same random state and sees
the same batches; every rung and seed is scored on the same 200 held-out windows (the last plays,
by name). Rung 0 and the last rung are also trained LONG times longer at their rate (seed 0), to
see whether the budget stopped them. The gain of a rung is the mean over seeds of the paired
difference (same seed, same batches) to the rung below; it "buys" when all paired differences
are positive and the mean exceeds twice the larger seed standard deviation of the two rungs, it
"costs" in the mirror case, and is "within noise" otherwise. References on the same windows:
uniform guessing, and unigram, bigram and trigram models counted from the training text.
"""
import argparse
import json
import math
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
RUNGS = ["bigram", "+ causal mixing, added (no weights)", "+ one learned head and positions",
         "+ several heads", "+ feed-forward network", "+ 4 blocks (paths around each step)",
         "+ pre-norms", "+ a final norm"]
CHAPTERS = [(2,), (1,), (4, 7), (5,), (6,), (9,), (9,), (9,)]  # the chapters of each idea
IDEAS = ["", "Adding the plain average of the characters so far to each character's vector",
         "One learned head of attention, with a learned vector per position",
         "Splitting attention into 4 heads, with an output projection",
         "A feed-forward network after attention", "Stacking 4 such blocks",
         "A norm before each step of each block", "A final norm before the output head"]
CONTAINS_BELOW = [False, False, True, False, True, True, False, False]  # exactly, see above
WIDTH, CONTEXT, BATCH, HEADS, BLOCKS = 64, 32, 32, 4, 4
GRID = [1e-3, 3e-3, 1e-2]  # learning rates tried per rung (seed 0)
LONG = 2  # the longer budget of rung 0 and the last rung, in multiples of --steps
VAL_WINDOWS = 200
NANOGPT = 1.4697  # nanoGPT's README: best validation loss of its character model
WITHIN_NOISE = {  # the one sentence a "within noise" rung gets (tests/book/test_ideas.py)
    True: "this rung can represent the one below it; at this budget it did not find a gain",
    False: "at this budget it did not find a gain"}


class Ladder(nn.Module):
    "Rung `rung` of the ladder: ids `(B, T)` → next-character logits `(B, T, V)`."

    def __init__(self, rung: int, vocab_size: int):
        super().__init__()
        self.rung = rung
        self.embed = TokenEmbedding(vocab_size, WIDTH)
        if rung >= 2:
            self.positions = LearnedPositions(WIDTH, CONTEXT)
        if rung == 2:
            self.qkv = QKVProjection(WIDTH, WIDTH)
        if rung in (3, 4):
            self.attn = MultiHeadAttention(WIDTH, HEADS)
        if rung == 4:
            self.ff = FeedForward(WIDTH, 4 * WIDTH)
        if rung == 5:
            self.blocks = nn.ModuleList(nn.ModuleList(
                [MultiHeadAttention(WIDTH, HEADS), FeedForward(WIDTH, 4 * WIDTH)])
                for _ in range(BLOCKS))
        if rung >= 6:
            cfg = LayerConfig(d_model=WIDTH, n_heads=HEADS, norm_first=True)
            self.blocks = nn.ModuleList(EncoderLayer(cfg) for _ in range(BLOCKS))
        if rung == 7:
            self.norm = cfg.make_norm()
        self.head = nn.Linear(WIDTH, vocab_size)
        self.register_buffer("causal", causal_mask(CONTEXT), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        T = ids.shape[1]
        h = self.embed(ids)  # (B, T, C)
        if self.rung >= 2:
            h = h + self.positions(torch.arange(T))
        mask = self.causal[:T, :T]
        if self.rung == 1:  # the plain average of the characters so far, added
            h = h + mix(mask / mask.sum(-1, keepdim=True), h, check=False)
        elif self.rung == 2:
            h = h + scaled_dot_product_attention(*self.qkv(h), mask)
        elif self.rung in (3, 4):
            h = h + self.attn(h, mask=mask)
            if self.rung == 4:
                h = h + self.ff(h)
        elif self.rung == 5:
            for attn, ff in self.blocks:
                h = h + attn(h, mask=mask)
                h = h + ff(h)
        elif self.rung >= 6:
            for layer in self.blocks:
                h = layer(h, mask=mask)
            if self.rung == 7:
                h = self.norm(h)
        return self.head(h)


def lm_loss(model, batch):
    x, y = batch
    return sequence_loss(model(x), y)


def _score(model, windows) -> float:
    with torch.no_grad():
        return round(torch.stack([sequence_loss(model(x), y) for x, y in windows])
                     .mean().item(), 4)


def run(rung: int, seed: int, lr: float, steps: int, data: dict) -> dict:
    "Train rung `rung` from seed `seed` at `lr`; its validation and held-out losses."
    torch.manual_seed(seed)
    model = Ladder(rung, data["vocab"])
    windows = torch.Generator().manual_seed(seed)  # the same batches for every rung
    start = time.perf_counter()
    log = train(model, lambda step: char_windows(data["train"], CONTEXT, BATCH, windows),
                lm_loss, steps=steps, lr=lr, warmup=100, log_every=0)
    model.eval()
    return {"rung": rung, "seed": seed, "lr": lr, "steps": steps,
            "val_loss": _score(model, data["held_out"]),
            "slice_loss": _score(model, data["slice"]),
            "final_train_loss": round(log.losses[-1], 4),
            "parameters": count_parameters(model),
            "seconds": round(time.perf_counter() - start, 1)}


def chosen_lr(runs: list[dict], rung: int, steps: int) -> float:
    "The grid's learning rate with the lowest validation-slice loss, seed 0."
    grid = [r for r in runs if r["rung"] == rung and r["seed"] == 0 and r["steps"] == steps]
    return min(grid, key=lambda r: r["slice_loss"])["lr"]


def verdicts(result: dict) -> list[dict]:
    "Per rung at its chosen rate: held-out mean and seed sd, the paired gain, vs the bigram."
    runs, seeds, steps = result["runs"], result["seeds"], result["steps"]
    bigram = result["references"]["count bigram"]
    rows = []
    for rung in range(len(RUNGS)):
        lr = chosen_lr(runs, rung, steps)
        loss = {r["seed"]: r["val_loss"] for r in runs
                if r["rung"] == rung and r["lr"] == lr and r["steps"] == steps}
        values = [loss[s] for s in seeds]
        row = {"rung": rung, "name": RUNGS[rung], "chapters": list(CHAPTERS[rung]),
               "lr": lr,
               "values": values, "mean": round(statistics.mean(values), 4),
               "std": round(statistics.stdev(values), 4),
               "vs_bigram": round(statistics.mean(values) - bigram, 4),
               "contains_below": CONTAINS_BELOW[rung],
               "parameters": next(r["parameters"] for r in runs if r["rung"] == rung)}
        long = [r["val_loss"] for r in runs if r["rung"] == rung
                and r["steps"] == result["long_steps"]]
        if long:
            row["long"] = {"steps": LONG * steps, "val_loss": long[0],
                           "same_seed_at_steps": values[seeds.index(0)]}
        if rung:
            below = rows[-1]["values"]
            diffs = [b - v for b, v in zip(below, values)]  # > 0: lower loss
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
    head = ("| rung | held-out loss (mean ± sd, 3 seeds) | vs the bigram "
            "| gain over the rung below | learning rate | parameters |\n"
            "|---|---|---|---|---|---|")
    lines = [head]
    for row in result["rows"]:
        if rungs is not None and row["rung"] not in rungs:
            continue
        gain = "—" if row["rung"] == 0 else f"{row['gain']:+.3f} ({row['verdict']})"
        lines.append(f"| {row['rung']}. {row['name']} | {row['mean']:.3f} ± {row['std']:.3f} "
                     f"| {row['vs_bigram']:+.3f} | {gain} | {row['lr']:g} "
                     f"| {row['parameters']:,} |")
    return "\n".join(lines)


def verdict_sentence(row: dict) -> str:
    "What the book says of a rung's gain: the verdict, in one template per verdict."
    idea, gain = IDEAS[row["rung"]], row["gain"]
    if row["verdict"] == "buys":
        said = (f"{idea} buys {gain:.2f} nats per character over the rung below: every seed "
                "gains, by more than twice the spread between seeds")
    elif row["verdict"] == "costs":
        said = (f"{idea} costs {-gain:.2f} nats per character: every seed loses, by more "
                "than twice the spread between seeds")
    else:
        said = (f"{idea} changes the held-out loss by {gain:+.2f} nats per character, within "
                f"noise: {WITHIN_NOISE[row['contains_below']]}")
    vs = row["vs_bigram"]
    return (f"{said}. The rung ends {abs(vs):.2f} nats per character "
            f"{'below' if vs < 0 else 'above'} the counted bigram.")


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams["svg.hashsalt"] = "ideas"  # the same SVG from the same numbers
    fig, ax = plt.subplots(figsize=(7, 3.6))
    rows, refs = result["rows"], result["references"]
    for i, seed in enumerate(result["seeds"]):
        ax.plot(range(len(rows)), [r["values"][i] for r in rows], "o", color="0.6",
                markersize=4, label="one seed" if i == 0 else None)
    ax.plot(range(len(rows)), [r["mean"] for r in rows], "-", color="C0", label="mean")
    for name, style in (("count bigram", "--"), ("count trigram", "-.")):
        ax.axhline(refs[name], color="0.5", linestyle=style, linewidth=1,
                   label=f"{name} from the training text")
    ax.axhline(result["nanogpt_char_val_loss"], color="0.5", linestyle=":", linewidth=1,
               label="nanoGPT's character model (other text; for scale)")
    ax.set_xticks(range(len(rows)), [f"{r['rung']}" for r in rows])
    ax.set_xlabel("rung: " + "; ".join(f"{r['rung']} {r['name'].removeprefix('+ ')}"
                                       for r in rows[:4]) + ";\n"
                  + "; ".join(f"{r['rung']} {r['name'].removeprefix('+ ')}" for r in rows[4:]),
                  fontsize=8)
    ax.set_ylabel("held-out loss (nats/char)")
    ax.set_ylim(1.3, 2.8)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})


def count_references(data: dict) -> dict:
    "Uniform, unigram, bigram and trigram models counted from the training text."
    V, ids = data["vocab"], data["train"]
    x = torch.cat([w[0] for w in data["held_out"]]).flatten()
    y = torch.cat([w[1] for w in data["held_out"]]).flatten()
    prev = torch.cat([torch.cat([w[0][:, :1], w[0][:, :-1]], 1) for w in data["held_out"]])
    first = torch.zeros_like(data["held_out"][0][0], dtype=torch.bool)
    first[:, 0] = True
    has_prev = (~first).repeat(len(data["held_out"]), 1).flatten()
    prev = prev.flatten()
    uni = torch.bincount(ids, minlength=V).double() + 0.01
    bi = torch.zeros(V, V, dtype=torch.double).index_put_(
        (ids[:-1], ids[1:]), torch.ones(len(ids) - 1, dtype=torch.double), accumulate=True)
    tri = torch.zeros(V, V, V, dtype=torch.double).index_put_(
        (ids[:-2], ids[1:-1], ids[2:]), torch.ones(len(ids) - 2, dtype=torch.double),
        accumulate=True)
    p_uni = uni / uni.sum()
    p_bi = (bi + 0.01) / (bi + 0.01).sum(-1, keepdim=True)
    p_tri = (tri + 0.01) / (tri + 0.01).sum(-1, keepdim=True)
    p_tri = torch.where(has_prev, 0.85 * p_tri[prev, x, y] + 0.15 * p_bi[x, y], p_bi[x, y])
    return {"uniform": round(math.log(V), 4),
            "count unigram": round(-p_uni[y].log().mean().item(), 4),
            "count bigram": round(-p_bi[x, y].log().mean().item(), 4),
            "count trigram": round(-p_tri.log().mean().item(), 4)}


def load_data() -> dict:
    "The plays as character ids, the validation slice and the fixed held-out windows."
    train_text, val_text = shakespeare_split()
    tok = Tokenizer.from_texts([train_text], level="char")
    ids = torch.tensor(tok.encode(train_text))
    cut = int(len(ids) * 0.95)
    val_ids = torch.tensor(tok.encode(val_text))
    held_out, sliced = torch.Generator().manual_seed(1234), torch.Generator().manual_seed(4321)
    return {"vocab": len(tok), "train": ids[:cut],
            "slice": [char_windows(ids[cut:], CONTEXT, 20, sliced)
                      for _ in range(VAL_WINDOWS // 20)],
            "held_out": [char_windows(val_ids, CONTEXT, 20, held_out)
                         for _ in range(VAL_WINDOWS // 20)]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "nbs" / "ideas.json")
    p.add_argument("--svg", type=Path, default=ROOT / "nbs" / "figures" / "11-ideas.svg")
    p.add_argument("--tables", action="store_true", help="print the book's rows from --out")
    p.add_argument("--replot", action="store_true", help="draw --svg again from --out")
    p.add_argument("--rows", action="store_true",
                   help="the rows (verdicts) again from --out's runs, and the plot")
    a = p.parse_args()
    if a.tables or a.replot or a.rows:
        result = json.loads(a.out.read_text())
        if a.rows:
            result["rows"] = verdicts(result)
            a.out.write_text(json.dumps(result, indent=1) + "\n")
            plot(result, a.svg)
        elif a.tables:
            print(table_rows(result))
        else:
            plot(result, a.svg)
        return 0
    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)  # for speed: no loss here depends on values below 1e-38
    data = load_data()
    result = json.loads(a.out.read_text()) if a.out.exists() else {}
    if (result.get("steps"), result.get("seeds")) != (a.steps, a.seeds) or "rows" in result:
        result = {"steps": a.steps, "seeds": a.seeds, "runs": []}  # a new ladder
    result.update({
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": sys.version.split()[0]},
        "torch": torch.__version__, "threads": a.threads, "width": WIDTH,
        "context": CONTEXT, "batch": BATCH, "heads": HEADS, "blocks": BLOCKS, "grid": GRID,
        "long_steps": LONG * a.steps, "held_out_windows": VAL_WINDOWS, "vocab": data["vocab"],
        "nanogpt_char_val_loss": NANOGPT, "references": count_references(data)})
    done = {(r["rung"], r["seed"], r["lr"], r["steps"]) for r in result["runs"]}

    def once(rung, seed, lr, steps):
        if (rung, seed, lr, steps) not in done:
            result["runs"].append(run(rung, seed, lr, steps, data))
            a.out.write_text(json.dumps(result, indent=1) + "\n")
            print(json.dumps(result["runs"][-1]), flush=True)

    last = len(RUNGS) - 1
    for rung in range(len(RUNGS)):
        for lr in GRID:
            once(rung, a.seeds[0], lr, a.steps)
        lr = chosen_lr(result["runs"], rung, a.steps)
        for seed in a.seeds[1:]:
            once(rung, seed, lr, a.steps)
        if rung in (0, last):
            once(rung, a.seeds[0], lr, LONG * a.steps)
    result["minutes"] = round(sum(r["seconds"] for r in result["runs"]) / 60, 1)
    result["rows"] = verdicts(result)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, a.svg)
    print(table_rows(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
