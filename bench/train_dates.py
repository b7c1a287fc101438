"""Train the encoder–decoder Transformer on the dates task and report held-out accuracy against training time.

    python bench/train_dates.py [--seconds 180] [--eval-every 250] [--d-model 128] ...

Training time excludes the evaluations (greedy decoding of the 2,000 held-out dates, with the KV cache).

Several processes (data parallel): the same command under torchrun, e.g.
    torchrun --standalone --nproc_per_node=2 bench/train_dates.py --seconds 60
Each rank draws its own pairs (seeded with --seed and its rank): the global batch is --batch x the number
of processes. loss_fn returns the loss with its number of target tokens, so that ranks counting different
numbers of targets would be weighted right (the dates' ISO targets all have one length, so here the weights
are equal). Rank 0 prints and evaluates.
"""
import argparse
import random

import torch

from minitransformer.core import seed_everything
from minitransformer.dates import DateTask
from minitransformer.model import Transformer, TransformerConfig, count_parameters
from minitransformer.distributed import DDPProcesses, distributed
from minitransformer.training import sequence_loss, train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2, help="encoder layers = decoder layers")
    ap.add_argument("--d-ff", type=int, default=None)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--label-smoothing", type=float, default=0.0)
    ap.add_argument("--activation", default="relu")
    ap.add_argument("--post-norm", action="store_true")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    with distributed() as me:  # one process, or one of torchrun's
        run(a, me)


def run(a: argparse.Namespace, me) -> None:
    if a.threads:
        torch.set_num_threads(a.threads)
    seed_everything(a.seed)
    task = DateTask(seed=0)
    cfg = TransformerConfig(src_vocab_size=len(task.source_tok), tgt_vocab_size=len(task.target_tok),
                            max_len=64, d_model=a.d_model, n_heads=a.heads, n_encoder_layers=a.layers,
                            n_decoder_layers=a.layers, d_ff=a.d_ff, activation=a.activation,
                            norm_first=not a.post_norm)
    model = Transformer(cfg).to(me.device)
    if me.rank == 0:
        print(f"{count_parameters(model):,} parameters; {cfg}; batch {a.batch} x {me.world_size} process(es); "
              f"threads={torch.get_num_threads()}; {me.device}")
    rng = random.Random(a.seed + 1_000_003 * me.rank)  # each rank its own pairs

    def next_batch(step):
        return tuple(t.to(me.device) for t in task.encode(task.train_pairs(a.batch, rng)))

    def loss_fn(m, batch):
        src, tgt = batch
        targets = tgt[:, 1:]
        loss = sequence_loss(m(src, tgt[:, :-1]), targets, ignore_id=cfg.pad_id, label_smoothing=a.label_smoothing)
        return loss, int((targets != cfg.pad_id).sum())  # the mean and what it is over

    log = train(model, next_batch, loss_fn, steps=a.steps, max_seconds=a.seconds, lr=a.lr, warmup=a.warmup,
                eval_fn=lambda m: {"accuracy": task.accuracy(m)}, eval_every=a.eval_every, log_every=a.eval_every,
                processes=DDPProcesses())
    if me.rank != 0:
        return  # rank 0 evaluated and reports
    print(f"{'step':>6} {'train s':>8} {'accuracy':>9}")
    for step, sec, m in log.evals:
        print(f"{step:>6} {sec:>8.1f} {m['accuracy']:>9.4f}")
    first99 = next((sec for _, sec, m in log.evals if m["accuracy"] >= 0.99), None)
    first100 = next((sec for _, sec, m in log.evals if m["accuracy"] >= 1.0), None)
    print(f"first >= 99%: {first99 and round(first99, 1)} s; first 100%: {first100 and round(first100, 1)} s; "
          f"final {log.evals[-1][2]['accuracy']:.4f} after {log.seconds:.1f} s, {log.steps} steps")


if __name__ == "__main__":
    main()
