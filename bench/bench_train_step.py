"""CPU train-step cost: the book's recipe against a GPT-2-style GPT, in one process.

    python bench/bench_train_step.py [--rounds 15] [--steps 4] [--threads N] [--quick]
    python bench/bench_train_step.py --angles-per-call   # + the recipe, angles computed per call
    python bench/bench_train_step.py --profile [--profile-rounds 7] [--profile-steps 2]

Both are our own `GPT` at the shapes of bench/train_shakespeare.py: 4 layers,
d_model 128, 4 heads, context 128, batch 16, the 86-character vocabulary, tied
embeddings, no dropout, float32 on the CPU.
- recipe: rotary positions, SwiGLU (d_ff 344 = 8/3 x 128 rounded up to a multiple of
  8: the recipe's own --d-ff), RMSNorm, no biases;
- gpt2: learned positions, GELU (tanh, as in GPT-2's code) with d_ff 512 = 4 x 128,
  LayerNorm, biases.

A train step: forward on fixed random ids (16, 128), `sequence_loss` against random
targets, backward, AdamW step (the recipe's lr 3e-3, betas (0.9, 0.99), weight decay
0.1 on matrices), zero_grad. After warm-up, each round times --steps steps of one
model then of the other, alternating which goes first; the report gives each one's
median time per step (and the middle half of the rounds) and tokens per second
(16 x 128 tokens a step), and the median of the per-round ratios recipe/gpt2 (goal:
<= 1.1, compiled), eagerly and through `torch.compile(model)` (as `train(compile=True)`
runs the steps), and each model's compiled/eager speed-up. Medians, since on a shared
machine some rounds stall; --threads 1 is steadier.

--angles-per-call adds a third model: the recipe with its rotary angles computed from
the positions in every call (float64 cos and sin, as `RotaryEmbedding` did before it
kept tables), to time the tables against that, side by side.

--profile instead runs torch.profiler over a few steps of each model, interleaved, and
prints per step (medians over the rounds) the top ops by self CPU time for each, the
ops whose time differs most between them, and the time by component (norms, rotary,
feed-forward, attention, ...: forward and backward together, a backward node counted
towards the forward op that made it).
"""
import argparse
import statistics
import time
from collections import defaultdict

import torch

from minitransformer.model import GPT, GPTConfig, count_parameters
from minitransformer.positions import RotaryEmbedding
from minitransformer.training import sequence_loss

VOCAB = 86  # the character vocabulary of bench/train_shakespeare.py (the plays)
SHAPE = dict(vocab_size=VOCAB, max_len=128, d_model=128, n_heads=4, n_layers=4,
             tie_weights=True, dropout=0.0)
BACKWARD_NODE = "autograd::engine::evaluate_function"  # the profiler's backward nodes
CONFIGS = {  # name -> the GPTConfig fields beyond SHAPE
    "recipe": dict(position_encoding="rotary", activation="swiglu", d_ff=344,
                   norm="rmsnorm", bias=False),
    "gpt2": dict(position_encoding="learned", activation="gelu_tanh", d_ff=512,
                 norm="layernorm", bias=True),
}


class PerCallAngles(RotaryEmbedding):
    "Rotary angles computed in every call, as before the tables (for --angles-per-call)."

    def angles(self, positions, dtype=torch.float32):
        i2 = torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=positions.device)
        angles = positions.to(torch.float64)[..., None] * self.base ** (-i2 / self.head_dim)
        angles = torch.stack([angles, angles], -1 if self.interleaved else -2).flatten(-2)
        return angles.cos().float().to(dtype), angles.sin().float().to(dtype)


def adamw(model: GPT) -> torch.optim.AdamW:
    "The recipe's optimiser, as `train` builds it: weight decay on matrices only."
    ps = list(model.parameters())
    return torch.optim.AdamW([{"params": [p for p in ps if p.dim() >= 2],
                               "weight_decay": 0.1},
                              {"params": [p for p in ps if p.dim() < 2],
                               "weight_decay": 0.0}], lr=3e-3, betas=(0.9, 0.99))


def make_step(model: GPT, x: torch.Tensor, y: torch.Tensor, compiled: bool = False):
    "A train step; `compiled`: via `torch.compile(model)`, as `train(compile=True)`."
    opt = adamw(model)
    net = torch.compile(model) if compiled else model

    def step() -> None:
        loss = sequence_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def run_steps(step, n: int) -> float:
    "Seconds per step over `n` steps."
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t0) / n


# --- --profile ------------------------------------------------------------------------
def label_modules(model: GPT) -> list:
    """Mark the forward of each component with a `record_function` range (profile only):
    hooks on modules, and the rotary embedding's `angles`/`rotate` wrapped on the
    instance (the package is not touched)."""
    from torch.autograd.profiler import record_function
    handles, open_ranges = [], []

    def enter(name):
        def pre(mod, args):
            rf = record_function(f"## {name}")
            rf.__enter__()
            open_ranges.append(rf)
        return pre

    def leave(mod, args, out):
        open_ranges.pop().__exit__(None, None, None)

    def label(mod, name):
        handles.append(mod.register_forward_pre_hook(enter(name)))
        handles.append(mod.register_forward_hook(leave))

    label(model.embed, "embedding (+ positions)")
    label(model.head, "head (logits)")
    for block in model.decoder.layers:
        label(block.attn_norm, "norms")
        label(block.ff_norm, "norms")
        label(block.self_attn, "attention (rest)")
        label(block.ff, "feed-forward")
    label(model.decoder.norm, "norms")
    rot = model.decoder.rotary
    if rot is not None:
        for meth in ("angles", "rotate"):
            def wrapped(*args, _f=getattr(rot, meth), **kw):
                with record_function("## rotary"):
                    return _f(*args, **kw)
            setattr(rot, meth, wrapped)
    return handles


def labelled_step(model: GPT, x, y):
    "A train step with its components labelled for the profiler."
    from torch.autograd.profiler import record_function
    label_modules(model)
    opt = adamw(model)

    def step() -> None:
        with record_function("## rest of forward (mask, residuals)"):
            logits = model(x)
        with record_function("## loss"):
            loss = sequence_loss(logits, y)
        loss.backward()
        with record_function("## AdamW step + zero_grad"):
            opt.step()
            opt.zero_grad(set_to_none=True)

    return step


def components(prof, steps: int) -> dict:
    "ms per step by component, forward ops and the backward nodes they made."
    events = [e for e in prof.events() if e.device_type.name == "CPU"]
    ranges = sorted(((e.time_range.start, e.time_range.end, e.name[3:]) for e in events
                     if e.name.startswith("## ")), key=lambda r: r[0])

    def innermost(e) -> str:
        best = None
        for s, t, name in ranges:  # few hundred ranges a step: fine
            if s <= e.time_range.start and e.time_range.end <= t:
                if best is None or s >= best[0]:
                    best = (s, name)
        return best[1] if best else None

    owner, out = {}, defaultdict(float)
    bwd = [e for e in events if e.name.startswith(BACKWARD_NODE)]
    bwd_ids = {id(e) for e in bwd}
    # forward ops: self time to their innermost label. An op records the number the
    # next autograd node will get, so the last op recording n (in time) made node n.
    for e in sorted(events, key=lambda e: e.time_range.start):
        if e.name.startswith("## ") or id(e) in bwd_ids or _inside(e, bwd):
            continue
        name = innermost(e) or "other"
        out[name] += e.self_cpu_time_total
        if e.sequence_nr >= 0:
            owner[e.thread, e.sequence_nr] = name
    for e in bwd:  # whole backward nodes, to the label of their forward op
        name = owner.get((e.fwd_thread, e.sequence_nr), "backward (unattributed)")
        out[name] += e.cpu_time_total
    return {k: v / 1e3 / steps for k, v in out.items()}


def _inside(e, bwd) -> bool:
    p = e.cpu_parent
    while p is not None:
        if p.name.startswith(BACKWARD_NODE):
            return True
        p = p.cpu_parent
    return False


def op_table(prof, steps: int) -> dict:
    "Self CPU ms per step of each op."
    return {k.key: k.self_cpu_time_total / 1e3 / steps for k in prof.key_averages()
            if not k.key.startswith("## ")}


def print_profile(models: dict, x, y, rounds: int, steps: int, top: int) -> None:
    """Profile `steps` steps of each model a round, interleaved; each op's and each
    component's median over the rounds (robust to a round the machine stalled)."""
    from torch.profiler import ProfilerActivity, profile
    fns = {name: labelled_step(m, x, y) for name, m in models.items()}
    for fn in fns.values():
        run_steps(fn, 3)  # warm-up
    per_round = {name: ([], []) for name in fns}  # op tables, component tables
    for i in range(rounds):
        for name in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                run_steps(fns[name], steps)
            per_round[name][0].append(op_table(prof, steps))
            per_round[name][1].append(components(prof, steps))

    def medians(dicts: list) -> dict:
        keys = set().union(*dicts)
        return {k: statistics.median(d.get(k, 0.0) for d in dicts) for k in keys}

    tables = {name: medians(ops) for name, (ops, _) in per_round.items()}
    comps = {name: medians(cs) for name, (_, cs) in per_round.items()}
    print(f"profiled: {rounds} rounds x {steps} steps of each, interleaved; medians "
          "over the rounds")
    for name, table in tables.items():
        print(f"\n{name}: top {top} ops by self CPU time, ms per step "
              f"(all ops: {sum(table.values()):.1f} ms)")
        for op, ms in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            print(f"  {op[:58]:<58}{ms:>8.2f}")
    r, g = tables["recipe"], tables["gpt2"]
    print(f"\nops with the largest difference, ms per step (recipe - gpt2; total "
          f"{sum(r.values()) - sum(g.values()):+.1f})")
    print(f"  {'op':<50}{'recipe':>8}{'gpt2':>8}{'diff':>8}")
    diffs = sorted(set(r) | set(g), key=lambda k: -abs(r.get(k, 0) - g.get(k, 0)))
    for op in diffs[:top]:
        print(f"  {op[:50]:<50}{r.get(op, 0):>8.2f}{g.get(op, 0):>8.2f}"
              f"{r.get(op, 0) - g.get(op, 0):>+8.2f}")
    r, g = comps["recipe"], comps["gpt2"]
    print("\nby component, forward + backward, ms per step (profiled: slower than "
          "unprofiled)")
    print(f"  {'component':<36}{'recipe':>8}{'gpt2':>8}{'diff':>8}")
    for k in sorted(set(r) | set(g), key=lambda k: -(r.get(k, 0) - g.get(k, 0))):
        print(f"  {k:<36}{r.get(k, 0):>8.2f}{g.get(k, 0):>8.2f}"
              f"{r.get(k, 0) - g.get(k, 0):>+8.2f}")
    print(f"  {'total':<36}{sum(r.values()):>8.2f}{sum(g.values()):>8.2f}"
          f"{sum(r.values()) - sum(g.values()):>+8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=4, help="steps of each model a round")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps of each first")
    ap.add_argument("--threads", type=int, default=None, help="default: torch's")
    ap.add_argument("--quick", action="store_true", help="3 rounds of 2 steps")
    ap.add_argument("--no-compile", action="store_true",
                    help="eager steps only (default: eager and torch.compile(model))")
    ap.add_argument("--profile", action="store_true",
                    help="profile a few steps of each instead of timing")
    ap.add_argument("--profile-rounds", type=int, default=7)
    ap.add_argument("--profile-steps", type=int, default=2, help="steps a round")
    ap.add_argument("--top", type=int, default=15, help="ops listed by --profile")
    ap.add_argument("--angles-per-call", action="store_true",
                    help="also the recipe with its rotary angles computed in every call")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.quick:
        a.rounds, a.steps, a.warmup = 3, 2, 2
    torch.manual_seed(0)
    models = {name: GPT(GPTConfig(**SHAPE, **kw)) for name, kw in CONFIGS.items()}
    if a.angles_per_call:  # (one RotaryEmbedding, shared by the layers: its class swapped)
        models["per-call"] = GPT(GPTConfig(**SHAPE, **CONFIGS["recipe"]))
        models["per-call"].decoder.rotary.__class__ = PerCallAngles
    B, T = 16, SHAPE["max_len"]
    x, y = torch.randint(0, VOCAB, (B, T)), torch.randint(0, VOCAB, (B, T))
    print(f"torch={torch.__version__} threads={torch.get_num_threads()} float32 CPU; "
          f"{SHAPE['n_layers']} layers, d_model {SHAPE['d_model']}, "
          f"{SHAPE['n_heads']} heads, vocab {VOCAB}, batch {B} x context {T}")
    for name, m in models.items():
        c = m.config
        print(f"  {name:<7}{count_parameters(m):>9,} parameters: {c.position_encoding} "
              f"positions, {c.activation} d_ff {c.d_ff}, {c.norm}, bias={c.bias}")
    if a.profile:
        print_profile(models, x, y, a.profile_rounds, a.profile_steps, a.top)
        return
    modes = ("eager",) if a.no_compile else ("eager", "compiled")
    steps = {(name, mode): make_step(m, x, y, mode == "compiled")
             for mode in modes for name, m in models.items()}
    for key in steps:  # (the compiled ones compile here)
        run_steps(steps[key], a.warmup)
    times = {key: [] for key in steps}
    rivals = [name for name in models if name != "gpt2"]
    ratios = {(name, mode): [] for name in rivals for mode in modes}
    for i in range(a.rounds):
        order = list(steps) if i % 2 == 0 else list(steps)[::-1]
        for key in order:
            times[key].append(run_steps(steps[key], a.steps))
        for name in rivals:
            for mode in modes:
                ratios[name, mode].append(times[name, mode][-1] / times["gpt2", mode][-1])
    print(f"{a.rounds} rounds x {a.steps} steps of each, interleaved "
          f"(after {a.warmup} warm-up steps)")
    print(f"{'model':<20}{'ms/step':>9}{'middle half':>15}{'tokens/s':>10}")
    for (name, mode), ts in times.items():
        q1, med, q3 = quartiles(ts)
        print(f"{name + ', ' + mode:<20}{1e3 * med:>9.1f}"
              f"{f'{1e3 * q1:.1f}..{1e3 * q3:.1f}':>15}{B * T / med:>10,.0f}")
    for name, mode in ratios:
        q1, med, q3 = quartiles(ratios[name, mode])
        goal = " (goal <= 1.1)" if name == "recipe" and mode == modes[-1] else ""
        print(f"ratio {name}/gpt2, {mode}, median of the per-round ratios: {med:.3f}"
              f"{goal}; middle half of the rounds {q1:.3f}..{q3:.3f}")
    if "compiled" in modes:
        for name in models:
            speedup = [e / c for e, c in zip(times[name, "eager"],
                                             times[name, "compiled"])]
            print(f"{name}: compiled / eager speed-up, median of the rounds: "
                  f"{quartiles(speedup)[1]:.2f}x")


def quartiles(xs: list) -> tuple:
    "First quartile, median, third quartile."
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    return tuple(statistics.quantiles(xs, n=4))


if __name__ == "__main__":
    main()
