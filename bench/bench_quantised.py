"""SmolLM2-135M-Instruct decoding from fewer bytes per weight: float32 (the Q4_1 file dequantised), int8 per
row, q8_0 (int8 per block of 32), the file's own Q4_1 blocks (`load_gguf_blocks`), and
llama.cpp on the same file, side by side in one process, interleaved.

    python bench/bench_quantised.py [--rounds 3] [--new-tokens 128]
    BENCH_THREADS=2 python bench/bench_quantised.py

Each row: tokens/s over the 64-token prompt plus 128 greedy new tokens at batch 1 (the median of the rounds;
the sides take turns going first), the bytes a decode step reads (every weight once, the tied table once,
plus the static KV cache), the achieved GB/s (bytes per token x decode tokens/s, as gpt-fast prints it), the
perplexity of 1,024 tokens of Macbeth (held out: the prompts come from other plays), and the resident memory
after loading that model alone in a fresh process, before any compile. Then the fixed per-token cost: the
compiled step of the file-blocks model profiled, its inductor kernels against everything else.
llama.cpp (llama-cpp-python, optional: skipped when absent) decodes the same file with the same threads.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from bench_smollm2 import PROMPT, llama_cpp_rate, prompts, weights_path
from common import timed
from minitransformer.data import shakespeare_plays
from minitransformer.generation import generate, read_bandwidth
from minitransformer.gguf import load_gguf
from minitransformer.quantised import load_gguf_blocks, quantise, weight_bytes

KINDS = ("float32", "int8", "q8_0", "file blocks")
PPL_TOKENS = 1024


def load(kind: str, max_len: int):
    "SmolLM2 as `kind`: the file dequantised (then rounded again for int8 / q8_0), or kept in its blocks."
    lm = (load_gguf_blocks if kind == "file blocks" else load_gguf)(weights_path(), max_len=max_len)
    if kind in ("int8", "q8_0"):
        quantise(lm.model, kind)
    return lm


def resident_child(kind: str) -> None:
    "In a fresh process: load `kind`, print the resident set size in MB (before any compile)."
    lm = load(kind, PROMPT + 8)  # (kept: the resident set includes its weights)
    rss = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS"))
    print(json.dumps({"rss_mb": rss / 1024, "weights_mb": weight_bytes(lm.model) / 1e6}))


def perplexity(model, tokenizer, n: int = PPL_TOKENS) -> float:
    text = shakespeare_plays()["macbeth"]
    ids = torch.tensor([tokenizer.encode(text[20_000:], special_tokens=False)[:n + 1]])
    with torch.no_grad():
        logits = model(ids[:, :-1])
    return torch.nn.functional.cross_entropy(logits[0], ids[0, 1:]).exp().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--resident-child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    threads = int(os.environ.get("BENCH_THREADS", len(os.sched_getaffinity(0))))
    torch.set_num_threads(threads)
    if a.resident_child:
        return resident_child(a.resident_child)
    N = a.new_tokens
    resident = {}
    for kind in KINDS:
        r = subprocess.run([sys.executable, __file__, "--resident-child", kind], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"the resident-memory process failed:\n{r.stderr}")
        resident[kind] = json.loads(r.stdout.strip().splitlines()[-1])["rss_mb"]

    models = {kind: load(kind, PPL_TOKENS + 1) for kind in KINDS}  # (generate: prompt + N)
    tok = models["float32"].tokenizer
    rows = prompts(tok, 1)
    first = {}
    for kind, lm in models.items():  # compile each (cold or warm inductor cache: as it comes)
        t0 = time.perf_counter()
        generate(lm.model, rows, 2, compile=True)
        first[kind] = time.perf_counter() - t0
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    sides = [(f"{k}, compiled", lambda B, n, m=lm.model: generate(m, rows[:B], n, compile=True))
             for k, lm in models.items()]
    sides.insert(0, ("float32, eager", lambda B, n, m=models["float32"].model: generate(m, rows[:B], n)))
    for _, fn in sides:
        fn(1, N // 2)  # warm-up; another length: no new graph
    recompiled = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
    cpu = torch.device("cpu")
    t = {name: [] for name, _ in sides}
    pre = {name: [] for name, _ in sides}
    out = {}
    for r in range(a.rounds):
        order = sides[r % len(sides):] + sides[:r % len(sides)]
        for name, fn in order:
            kept = {}
            t[name].append(timed(lambda: kept.setdefault("out", fn(1, N)), cpu))
            pre[name].append(timed(lambda: fn(1, 1), cpu))
            out[name] = kept["out"]
        print(f"  round {r + 1}/{a.rounds} done", flush=True)
    llama = llama_cpp_rate(weights_path(), rows, N, threads, a.rounds)
    bandwidth = read_bandwidth()

    c = models["float32"].model.config
    cache = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4 * (PROMPT + N)  # static KV cache, float32
    file_bytes = weights_path().stat().st_size
    print(f"threads={threads} torch={torch.__version__}; read bandwidth {bandwidth / 1e9:.1f} GB/s; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"prompt {PROMPT} tokens, {N} new, greedy, batch 1; {a.rounds} interleaved rounds, medians; "
          f"graphs compiled by another length: {recompiled}")
    print(f"\n{'side':<24}{'tok/s':>7}{'step ms':>9}{'MB/token':>10}{'GB/s':>7}{'perplexity':>11}"
          f"{'resident MB':>12}{'first call s':>13}")
    ppl = {kind: perplexity(lm.model, tok) for kind, lm in models.items()}
    for name, _ in sides:
        kind = name.split(",")[0]
        model = models[kind].model
        total, p = statistics.median(t[name]), statistics.median(pre[name])
        step = (total - p) / (N - 1)
        b = weight_bytes(model) + cache
        first_s = f"{first[kind]:.1f}" if "compiled" in name else "-"
        print(f"{name:<24}{N / total:>7.1f}{1e3 * step:>9.2f}{b / 1e6:>10.1f}{b / step / 1e9:>7.1f}{ppl[kind]:>11.2f}"
              f"{resident[kind]:>12.0f}{first_s:>13}")
    if llama is not None:
        print(f"{'llama.cpp (same file)':<24}{llama[0]:>7.1f}{'':>9}{file_bytes / 1e6:>10.1f}"
              f"{file_bytes * llama[0] / 1e9:>7.1f}   (its GB/s over the whole run, prompt included)")
        blocks = statistics.median(t["file blocks, compiled"])
        print(f"file blocks compiled / llama.cpp tokens per second: {N / blocks / llama[0]:.2f}x")
    else:
        print("llama.cpp: not measured (CMAKE_ARGS=-DGGML_NATIVE=ON pip install llama-cpp-python==0.3.36)")
    base = out["float32, compiled"][0]
    for name, _ in sides:
        same = out[name][0] == base
        print(f"{name}: greedy tokens {'identical to' if same else 'differ from'} float32 compiled")
    profile(models["file blocks"].model, rows, N)


def profile(model, rows, N: int) -> None:
    "The file-blocks compiled step: time in inductor's kernels against the rest (the fixed per-token cost)."
    import torch._inductor.config as inductor_config
    from torch.profiler import ProfilerActivity, profile as torch_profile
    inductor_config.cpp.enable_kernel_profile = True
    torch._dynamo.reset()
    generate(model, rows, 4, compile=True)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        generate(model, rows, 33, compile=True)
    events = prof.key_averages()
    steps = next(e.count for e in events if e.key.startswith("Torch-Compiled Region"))
    region = sum(e.cpu_time_total for e in events if e.key.startswith("Torch-Compiled Region")) / steps
    kernels = sum(e.self_cpu_time_total for e in events if "cpp_fused" in e.key) / steps
    lookup = sum(e.self_cpu_time_total for e in events if "Cache Lookup" in e.key) / steps
    print(f"\nper compiled step (file blocks, {steps} steps): {region / 1e3:.2f} ms in the compiled region, of "
          f"which inductor's kernels {kernels / 1e3:.2f} ms; outside the kernels (the wrapper's buffers and "
          f"calls, guards) {(region - kernels) / 1e3:.2f} ms; dynamo's guard check {lookup / 1e3:.2f} ms")


if __name__ == "__main__":
    main()
