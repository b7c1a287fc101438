"""`train` under torchrun: two CPU processes (gloo) must train as one.

Every rank draws the same step-seeded global batch and keeps its rows (`shard_batch`),
so 2 ranks x batch b must end with the weights, average and logged losses of 1 process
x batch 2b fed the same windows; with padding, only `loss_fn`'s `(loss, count)` makes
the ranks' unequal target counts weigh as in one process (the plain mean is shown to
differ, so the check can fail). Rank 0 alone prints, evaluates and saves (a checkpoint
without DDP's `module.` prefix); a NaN on one rank is skipped by all; a time budget
ends every rank at the same step; a crash on one rank ends the run with its error
instead of a hang.

Each torchrun launch costs seconds, so one launch runs every scenario that should
succeed (each test reads its results) and a second one the crash. The 1-process
references run in this process, from the very module the ranks run (written to a
temporary folder). What needs no torchrun is in tests/unit/test_distributed.py and
tests/unit/test_training.py.
"""

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from minitransformer.checkpoints import load_checkpoint
from minitransformer.data import shakespeare_split
from minitransformer.distributed import shard_batch
from minitransformer.embeddings import Tokenizer

from helpers import identical

pytestmark = pytest.mark.timeout(300)

LAUNCH_TIMEOUT = 120  # seconds: a hung run fails its test instead of blocking CI

# How close 2 ranks and 1 process end. The all-reduce sums the two halves' gradients in
# another order than one backward pass does, so they differ by float rounding (~1e-7),
# and AdamW amplifies it: it divides each gradient by its own running size, so a weight
# whose gradient is nearly zero takes a step of up to the learning rate whose size
# rounding decides. This bias-free model ends 8 steps ~1e-7 apart here; a GPT-2-style
# one, whose key biases have an exactly zero gradient, ~1e-4 apart after 12 steps. The
# weights themselves move ~1e-2, and a misweighted all-reduce moves them ~2e-2.
WEIGHT_TOL = 1e-4

LOSS_TOL = 1e-5  # a loss averages thousands of predictions: it moves far less

TOL = 1e-6  # one process against itself: the same sums in the same order

# The scenarios, as a module: run by each rank under torchrun (`python -m
# torch.distributed.run ... scenarios.py CORPUS OUT`) and imported by the tests for the
# 1-process references.
SCENARIOS = '''
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from minitransformer.data import char_windows
from minitransformer.model import GPT, GPTConfig
from minitransformer.distributed import DDPProcesses, distributed, shard_batch
from minitransformer.training import sequence_loss, train

WORLD, B, T, STEPS = 2, 4, 32, 8  # ranks, rows per rank, context, steps
PAD = 0  # the tokenizer's pad_id: a target that does not count


def small_gpt(vocab: int, seed: int = 0) -> GPT:
    "The book's recipe (rotary, SwiGLU, RMSNorm, no biases), tiny."
    # dropout=0: with dropout each rank would draw its own masks from its own
    # generator, unlike the one process's single draw, so the runs could not match
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab, max_len=T, d_model=32, n_heads=2,
                         n_layers=2, position_encoding="rotary", activation="swiglu",
                         norm="rmsnorm", bias=False, dropout=0.0))


def windows(data: torch.Tensor, step: int) -> tuple:
    "The global batch of a step: WORLD * B windows, the same on every rank."
    g = torch.Generator().manual_seed(step)
    return char_windows(data, T, WORLD * B, generator=g)


def padded(data: torch.Tensor, step: int) -> tuple:
    "Windows whose targets end in PAD: rank 0's rows keep many more than rank 1's."
    x, y = windows(data, step)
    g = torch.Generator().manual_seed(10_000 + step)
    keep = torch.cat([torch.randint(T // 2, T + 1, (B,), generator=g),
                      torch.randint(1, T // 4, ((WORLD - 1) * B,), generator=g)])
    return x, y.masked_fill(torch.arange(T) >= keep[:, None], PAD)


def lm_loss(net, batch):
    return sequence_loss(net(batch[0]), batch[1])


def counted_loss(net, batch):
    x, y = batch
    return sequence_loss(net(x), y, ignore_id=PAD), int((y != PAD).sum())


def mean_loss(net, batch):  # wrong under DDP when the ranks count different targets
    x, y = batch
    return sequence_loss(net(x), y, ignore_id=PAD)


def fit(data: torch.Tensor, loss_fn=lm_loss, pad: bool = False,
        seed_by_rank: bool = False, **kw) -> dict:
    """Train a fresh model on this rank's rows of each step's global batch.
    `seed_by_rank`: each rank starts from other weights (DDP must copy rank 0's)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    model = small_gpt(int(data.max()) + 1, seed=rank if seed_by_rank else 0)
    make = padded if pad else windows
    log = train(model, lambda step: shard_batch(make(data, step)), loss_fn,
                **{"steps": STEPS, "lr": 3e-3, "warmup": 2, "log_every": 0} | kw,
                processes=DDPProcesses())
    return {"weights": {k: v.clone() for k, v in model.state_dict().items()},
            "losses": log.losses, "lrs": log.lrs, "steps": log.steps,
            "skipped": log.skipped, "evals": log.evals}


# the scenarios with a 1-process reference: name -> fit's arguments
REFERENCED = {"plain": {}, "ema": {"ema": 0.9, "seed_by_rank": True},
              "counted": {"loss_fn": counted_loss, "pad": True},
              "mean": {"loss_fn": mean_loss, "pad": True}}
NAN_STEP = 4  # the step whose loss is NaN on rank 1 only
LOG_EVERY = 2


def nan_on_rank_1(net, batch):
    nan_on_rank_1.calls += 1
    nan_on_rank_1.net = type(net).__name__  # what train passed: DDP's wrapper
    loss = lm_loss(net, batch)
    if dist.get_rank() == 1 and nan_on_rank_1.calls == NAN_STEP + 1:
        return loss * float("nan")
    return loss


nan_on_rank_1.calls = 0


def main(corpus: str, out: str) -> None:
    data, out = torch.load(corpus), Path(out)
    with distributed("gloo") as r:  # the models stay on the CPU, also on a GPU machine
        assert r.world_size == WORLD, r
        res = {name: fit(data, **kw) for name, kw in REFERENCED.items()}
        res["timed"] = fit(data, steps=None, max_seconds=1.0)
        x, y = windows(data, -1)
        res["eval"] = fit(
            data, nan_on_rank_1, eval_every=3, log_every=LOG_EVERY,
            checkpoint=out / "run.safetensors", on_nonfinite="skip",
            eval_fn=lambda m: {"loss": lm_loss(m, (x, y)).item(),
                               "unwrapped": float(type(m) is GPT)})
        res["rank"], res["world_size"] = r.rank, r.world_size
        res["loss_fn_got"] = nan_on_rank_1.net
        torch.save(res, out / f"rank{r.rank}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])
'''

CRASH = '''
import torch
from torch import nn
from minitransformer.distributed import DDPProcesses, distributed
from minitransformer.training import train

with distributed("gloo") as r:
    torch.manual_seed(0)
    model, x = nn.Linear(4, 1), torch.randn(8, 4)

    def loss_fn(net, batch):
        loss_fn.calls += 1
        if r.rank == 1 and loss_fn.calls == 3:
            raise ValueError("boom on rank 1")
        return net(batch).square().mean()

    loss_fn.calls = 0
    train(model, lambda step: x, loss_fn, steps=10_000, warmup=0, log_every=0,
          processes=DDPProcesses())
    print(f"rank {r.rank} trained to the end", flush=True)
'''


def _torchrun(script, *args) -> tuple[int, str, float]:
    "Run `script` on 2 CPU ranks: (exit code, stdout + stderr, seconds)."
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node=2", str(script), *map(str, args)]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    t0 = time.perf_counter()
    # its own session: on a timeout, torchrun and its workers are killed together
    proc = subprocess.Popen(cmd, cwd=script.parent, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun hung for {LAUNCH_TIMEOUT} s:\n{out[-6000:]}")
    return proc.returncode, out, time.perf_counter() - t0


def _import(path):
    spec = importlib.util.spec_from_file_location(f"_dist_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    "The scenarios run on 2 ranks: the module, each rank's results, the output."
    folder = tmp_path_factory.mktemp("distributed")
    text = shakespeare_split()[0][:40_000]
    tok = Tokenizer.from_texts([text], level="char")
    torch.save(torch.tensor(tok.encode(text)), folder / "corpus.pt")
    script = folder / "scenarios.py"
    script.write_text(SCENARIOS)
    rc, out, seconds = _torchrun(script, folder / "corpus.pt", folder)
    assert rc == 0, f"torchrun exited with {rc}:\n{out[-6000:]}"
    ranks = [torch.load(folder / f"rank{r}.pt") for r in range(2)]
    return {"module": _import(script), "ranks": ranks, "out": out, "folder": folder,
            "data": torch.load(folder / "corpus.pt")}


@pytest.fixture(scope="module")
def reference(launch):
    "The referenced scenarios in 1 process, batch WORLD * B."
    m = launch["module"]
    return {name: m.fit(launch["data"], **kw) for name, kw in m.REFERENCED.items()}


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_two_ranks_train_as_one_process_on_the_character_task(launch, reference):
    r0, r1 = launch["ranks"]
    for name in ("plain", "ema"):  # with ema the model ends holding the average
        ref = reference[name]
        assert r0[name]["steps"] == ref["steps"] == launch["module"].STEPS
        assert max_diff(r0[name]["weights"], ref["weights"]) <= WEIGHT_TOL, name
        diff = max(abs(a - b) for a, b in zip(r0[name]["losses"], ref["losses"]))
        assert diff <= LOSS_TOL, (name, r0[name]["losses"], ref["losses"])
    # a real comparison: the weights moved, and the average is not the live weights
    start = launch["module"].small_gpt(int(launch["data"].max()) + 1).state_dict()
    assert max_diff(r0["plain"]["weights"], start) > 10 * WEIGHT_TOL
    assert max_diff(r0["plain"]["weights"], r0["ema"]["weights"]) > 100 * TOL


def test_ranks_end_bit_identical(launch):
    "Also in `ema`, where rank 1 built its model from another seed."
    r0, r1 = launch["ranks"]
    assert (r0["rank"], r1["rank"], r0["world_size"]) == (0, 1, 2)
    assert r0["loss_fn_got"] == r1["loss_fn_got"] == "DistributedDataParallel"
    for name in ("plain", "ema", "counted", "mean", "timed", "eval"):
        assert identical(r0[name]["weights"], r1[name]["weights"]), name
        for key in ("losses", "lrs"):  # (the same NaN where a step was skipped)
            a, b = (torch.tensor(r[name][key], dtype=torch.float64) for r in (r0, r1))
            assert torch.equal(a.isnan(), b.isnan()), (name, key)
            assert torch.equal(a.nan_to_num(), b.nan_to_num()), (name, key)


def test_padding_needs_the_count_to_match_one_process(launch, reference):
    r0, _ = launch["ranks"]
    m = launch["module"]
    for step in range(m.STEPS):  # the ranks count very different numbers of targets
        c0, c1 = ((y != m.PAD).sum() for y in (shard_batch(m.padded(
            launch["data"], step)[1], r, m.WORLD) for r in (0, 1)))
        assert c0 > 2 * c1 > 0
    counted = max_diff(r0["counted"]["weights"], reference["counted"]["weights"])
    assert counted <= WEIGHT_TOL
    diff = max(abs(a - b) for a, b in zip(r0["counted"]["losses"],
                                           reference["counted"]["losses"]))
    assert diff <= LOSS_TOL, (r0["counted"]["losses"], reference["counted"]["losses"])
    # the plain mean weighs rank 1's few targets as much as rank 0's many: it must
    # differ from one process (same loss_fn there) by far more than the tolerance
    mean = max_diff(r0["mean"]["weights"], reference["mean"]["weights"])
    assert mean > 10 * WEIGHT_TOL, mean
    # ... while one process gives the same result either way (it ignores the count)
    assert max_diff(reference["mean"]["weights"], reference["counted"]["weights"]) \
        <= TOL


def test_a_time_limited_run_ends_every_rank_at_the_same_step(launch):
    r0, r1 = launch["ranks"]  # and torchrun exited with 0 (the fixture checks)
    assert r0["timed"]["steps"] == r1["timed"]["steps"] > 0
    assert len(r0["timed"]["losses"]) == r0["timed"]["steps"]


def test_rank_0_alone_prints_evaluates_and_saves(launch):
    r0, r1 = launch["ranks"]
    m = launch["module"]
    assert r1["eval"]["evals"] == []
    steps = [s for s, _, _ in r0["eval"]["evals"]]
    assert steps == [3, 6, 8]  # every 3 steps and at the end
    assert all(metrics["unwrapped"] == 1.0 for _, _, metrics in r0["eval"]["evals"])
    printed = [line for line in launch["out"].splitlines() if line.startswith("step ")]
    assert len(printed) == m.STEPS // m.LOG_EVERY, launch["out"][-4000:]
    loaded = load_checkpoint(launch["folder"] / "run.safetensors")
    assert not any(k.startswith("module.") for k in loaded.state_dict())
    assert identical(loaded.state_dict(), r0["eval"]["weights"])


def test_a_nan_on_one_rank_is_skipped_by_every_rank(launch):
    r0, r1 = launch["ranks"]
    nan_step = launch["module"].NAN_STEP
    for r in (r0, r1):
        assert r["eval"]["skipped"] == 1
        assert r["eval"]["steps"] == launch["module"].STEPS
        losses = torch.tensor(r["eval"]["losses"])
        assert losses[nan_step].isnan() and losses.isnan().sum() == 1
    assert identical(r0["eval"]["weights"], r1["eval"]["weights"])


def test_a_crash_on_one_rank_ends_the_run_with_its_error(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    rc, out, seconds = _torchrun(script)
    assert rc != 0, out[-6000:]
    assert "ValueError: boom on rank 1" in out, out[-6000:]
    assert "trained to the end" not in out, out[-6000:]  # rank 0 was stopped too
    assert seconds < LAUNCH_TIMEOUT / 2, (seconds, out[-6000:])


ALONE = '''
import sys

import torch
from torch import nn
from minitransformer.distributed import distributed
from minitransformer.training import SingleProcess, train

with distributed("gloo") as r:
    for processes in (None, SingleProcess()):
        try:
            train(nn.Linear(2, 1), lambda step: torch.ones(4, 2),
                  lambda m, b: m(b).square().mean(), steps=1, log_every=0,
                  processes=processes)
            sys.stdout.write(f"rank {r.rank} trained alone\\n")
        except ValueError as e:  # one write per line: the ranks' lines cannot mix
            sys.stdout.write(f"rank {r.rank} refused: {e}\\n")
        sys.stdout.flush()
'''


def test_train_under_torchrun_needs_ddp_processes(tmp_path):
    "Without `DDPProcesses`, each rank would train a model of its own: refused."
    script = tmp_path / "alone.py"
    script.write_text(ALONE)
    rc, out, _ = _torchrun(script)
    assert rc == 0, out[-6000:]
    assert "trained alone" not in out, out[-6000:]
    assert out.count("refused: ") == 4, out[-6000:]  # 2 ranks x (None, SingleProcess)
    assert out.count("pass processes=DDPProcesses()") == 4, out[-6000:]
