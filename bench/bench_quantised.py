"""SmolLM2-135M-Instruct decoding from fewer bytes per weight: float32 (the Q4_1 file dequantised), int8 per
row, q8_0 (int8 per block of 32), the file's own Q4_1 blocks (`load_gguf_blocks`), and llama.cpp on the same
file, side by side in one process, alternated round by round.

    python bench/bench_quantised.py [--rounds 5] [--new-tokens 128] [--out nbs/adapters/decode-bench.json]
    BENCH_THREADS=2 python bench/bench_quantised.py

Every side of ours is the public call a user makes, `generate(model, rows, N, compile=True)` with its
defaults (and `generate(model, rows, N)` for the eager float32 row); nothing global is set besides torch's
thread count, printed with the other settings. Each round runs every side once, llama.cpp among them, in an
order that rotates from round to round; each side is timed for the 64-token prompt plus N greedy new tokens
and for the prompt plus one, so that its prefill (s) and its decode step (ms: the difference over N - 1
tokens) are reported apart, for llama.cpp as for us. The ratios to llama.cpp are taken round by round, then
their median. Also per row: the bytes a decode step reads (every weight once, the tied table once, plus the
static KV cache), the achieved GB/s, the perplexity of 1,024 tokens of Macbeth (held out: the prompts come
from other plays), the resident memory after loading that model alone in a fresh process, and the first
compiled call (whether inductor's cache was empty when the bench began is recorded). Then the fixed per-token
cost: the compiled step of the file-blocks model profiled, decoding N tokens as the rounds do (the same cache
size, the same graph), its inductor kernels and attention against everything else, and dynamo's guard check
before the compiled region; since the profiler inflates that check, what skipping it saves a step is also timed
without the profiler (`torch.compiler.set_stance(skip_guard_eval_unsafe=True)`, alternated with the default
round by round). `--out` writes the results as JSON (the book reads them).
llama.cpp (llama-cpp-python, optional: skipped when absent) decodes the same file with the same threads.
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch._inductor.runtime.cache_dir_utils import cache_dir

from bench_smollm2 import PROMPT, prompts, weights_path
from common import graphs, timed
from minitransformer.data import shakespeare_plays
from minitransformer.generation import _slots, generate, read_bandwidth
from minitransformer.gguf import load_gguf
from minitransformer.fast_blocks import fast_blocks
from minitransformer.quantised import load_gguf_blocks, quantise, weight_bytes

KINDS = ("float32", "int8", "q8_0", "file blocks", "fast blocks")
PPL_TOKENS = 1024


def load(kind: str, max_len: int):
    """SmolLM2 as `kind`: the file dequantised (then rounded again for int8 / q8_0), or kept in its blocks
    (multiplied exactly, or through PyTorch's int4/int8 kernels: "fast blocks")."""
    lm = (load_gguf_blocks if "blocks" in kind else load_gguf)(weights_path(), max_len=max_len)
    if kind in ("int8", "q8_0"):
        quantise(lm.model, kind)
    if kind == "fast blocks":
        fast_blocks(lm.model)
    return lm


def first_call_child(kind: str) -> None:
    "In a fresh process (inductor's cache as the parent left it): seconds of the first compiled call."
    lm = load(kind, PPL_TOKENS + 1)
    rows = prompts(lm.tokenizer, 1)
    t0 = time.perf_counter()
    generate(lm.model, rows, 2, compile=True)
    print(json.dumps({"first_call_s": time.perf_counter() - t0}))


def resident_child(kind: str) -> None:
    "In a fresh process: load `kind`, print the resident set size in MB (before any compile)."
    lm = load(kind, PROMPT + 8)  # (kept: the resident set includes its weights)
    rss = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS"))
    print(json.dumps({"rss_mb": rss / 1024, "weights_mb": weight_bytes(lm.model) / 1e6}))


def llama_cpp_side(path, rows, n_max: int, threads: int):
    "llama.cpp on the same file as a side `fn(B, n)`: the first prompt, n greedy tokens (None if absent)."
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    t0 = time.perf_counter()
    llm = Llama(model_path=str(path), n_ctx=PROMPT + n_max + 8, n_threads=threads, n_threads_batch=threads,
                n_batch=PROMPT, verbose=False)
    loaded = time.perf_counter() - t0

    def run(B: int, n: int) -> list[list[int]]:
        llm.reset()
        out = []
        for token in llm.generate(rows[0], top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(token)
            if len(out) == n:
                return [out]

    run(1, 4)  # warm-up
    run.load_s = loaded
    return run


def fidelity(exact, fast, tokenizer, windows: int = 8, width: int = 512) -> dict:
    """The fast path against the exact one, as llama.cpp's `--kl-divergence` measures a quantisation: per
    passage (held-out plays), over `windows` windows of `width` tokens, the mean KL divergence of the fast
    path's next-token distribution from the exact path's, how often their top choices agree, and both
    perplexities."""
    out = {}
    for play in ("macbeth", "hamlet"):
        ids = tokenizer.encode(shakespeare_plays()[play][20_000:], special_tokens=False)
        kl = agree = nll_exact = nll_fast = n = 0.0
        for i in range(windows):
            chunk = torch.tensor(ids[i * width:(i + 1) * width + 1])
            with torch.no_grad():
                p, q = (m(chunk[None, :-1])[0].log_softmax(-1) for m in (exact, fast))
            kl += float((p.exp() * (p - q)).sum())
            agree += float((p.argmax(-1) == q.argmax(-1)).sum())
            nll_exact -= float(p.gather(-1, chunk[1:, None]).sum())
            nll_fast -= float(q.gather(-1, chunk[1:, None]).sum())
            n += width
        out[play] = dict(tokens=int(n), kl_mean=kl / n, top1_agreement=agree / n,
                         perplexity_exact=math.exp(nll_exact / n), perplexity_fast=math.exp(nll_fast / n))
    return out


def first_difference(exact, rows, a: list[int], b: list[int]) -> dict | None:
    "Where two greedy continuations of `rows[0]` part, and the exact path's margin there (its top-2 gap)."
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if k is None:
        return None
    with torch.no_grad():
        top = exact(torch.tensor([rows[0] + a[:k]]))[0, -1].topk(2).values
    return dict(at=k, exact_logit_margin=float(top[0] - top[1]))


def perplexity(model, tokenizer, n: int = PPL_TOKENS) -> float:
    text = shakespeare_plays()["macbeth"]
    ids = torch.tensor([tokenizer.encode(text[20_000:], special_tokens=False)[:n + 1]])
    with torch.no_grad():
        logits = model(ids[:, :-1])
    return torch.nn.functional.cross_entropy(logits[0], ids[0, 1:]).exp().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", help="write the results to this JSON file")
    ap.add_argument("--resident-child", help=argparse.SUPPRESS)
    ap.add_argument("--first-call-child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    threads = int(os.environ.get("BENCH_THREADS", len(os.sched_getaffinity(0))))
    torch.set_num_threads(threads)
    if a.resident_child:
        return resident_child(a.resident_child)
    if a.first_call_child:
        return first_call_child(a.first_call_child)
    N = a.new_tokens
    folder = Path(cache_dir())  # inductor's cache (TORCHINDUCTOR_CACHE_DIR, or its default)
    cache_empty = not folder.exists() or not any(folder.iterdir())  # before anything compiles
    resident = {}
    for kind in KINDS:
        r = subprocess.run([sys.executable, __file__, "--resident-child", kind], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"the resident-memory process failed:\n{r.stderr}")
        resident[kind] = json.loads(r.stdout.strip().splitlines()[-1])["rss_mb"]

    models, load_s = {}, {}
    for kind in KINDS:  # (generate: prompt + N)
        t0 = time.perf_counter()
        models[kind] = load(kind, PPL_TOKENS + 1)
        load_s[kind] = time.perf_counter() - t0
    tok = models["float32"].tokenizer
    rows = prompts(tok, 1)
    first = {}
    for kind, lm in models.items():  # compile each (cold or warm inductor cache: as it comes)
        t0 = time.perf_counter()
        generate(lm.model, rows, 2, compile=True)
        first[kind] = time.perf_counter() - t0
    before_warmup = graphs()
    sides = [(f"{k}, compiled", lambda B, n, m=lm.model: generate(m, rows[:B], n, compile=True))
             for k, lm in models.items()]
    sides.insert(0, ("float32, eager", lambda B, n, m=models["float32"].model: generate(m, rows[:B], n)))
    sides.insert(1, ("fast blocks, eager", lambda B, n, m=models["fast blocks"].model: generate(m, rows[:B], n)))
    for _, fn in sides:  # warm-up: another length than the rounds', the same cache size
        fn(1, N - 8)  # (the first call's 2 tokens had the smaller cache of 128 slots)
    warmup_graphs = graphs() - before_warmup  # one per compiled side: the larger cache
    before_rounds = graphs()
    llama = llama_cpp_side(weights_path(), rows, N, threads)
    if llama is not None:
        sides.append(("llama.cpp", llama))
    cpu = torch.device("cpu")
    t = {name: [] for name, _ in sides}
    pre = {name: [] for name, _ in sides}
    out = {}
    load_before = os.getloadavg()
    for r in range(a.rounds):
        order = sides[r % len(sides):] + sides[:r % len(sides)]
        for name, fn in order:
            kept = {}
            t[name].append(timed(lambda: kept.setdefault("out", fn(1, N)), cpu))
            pre[name].append(timed(lambda: fn(1, 1), cpu))
            out[name] = kept["out"]
        print(f"  round {r + 1}/{a.rounds} done", flush=True)
    load_after = os.getloadavg()
    recompiled = graphs() - before_rounds  # by the rounds' other length: none expected
    bandwidth = read_bandwidth()

    c = models["float32"].model.config
    slots = _slots(PROMPT + N, c.max_len)  # the compiled step's static cache, float32
    cache = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4 * slots
    file_bytes = weights_path().stat().st_size
    settings = dict(threads=threads, torch=torch.__version__, cpu=platform.processor() or platform.machine(),
                    cpu_capability=torch.backends.cpu.get_cpu_capability(),  # AVX2, AVX512, ...
                    inductor_cpp_wrapper=torch._inductor.config.cpp_wrapper,
                    inductor_cache_empty_at_start=cache_empty, cache_slots=slots,
                    read_bandwidth_gb_s=round(bandwidth / 1e9, 2),
                    load_average_before=round(load_before[0], 2), load_average_after=round(load_after[0], 2))
    print("settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    print(f"prompt {PROMPT} tokens, {N} new, greedy, batch 1; {a.rounds} alternated rounds, medians; "
          f"graphs compiled by the warm-up (the rounds' cache size): {warmup_graphs}, "
          f"by the rounds (another length, the same cache size): {recompiled}")
    print(f"\n{'side':<24}{'tok/s':>7}{'prefill s':>10}{'step ms':>9}{'MB/token':>10}{'GB/s':>7}"
          f"{'perplexity':>11}{'resident MB':>12}{'first call s':>13}")
    ppl = {kind: perplexity(lm.model, tok) for kind, lm in models.items()}
    rows_out = {}
    for name, _ in sides:
        total, p, step_ms = medians(t[name], pre[name], N)
        kind = name.split(",")[0]
        if name == "llama.cpp":
            b, extra = file_bytes, dict(load_s=llama.load_s)
        else:
            b = weight_bytes(models[kind].model) + cache
            extra = dict(perplexity=ppl[kind], resident_mb=resident[kind], load_s=load_s[kind],
                         first_call_s=first[kind] if "compiled" in name else None)
        rows_out[name] = dict(tokens_per_s=N / total, prefill_s=p, step_ms=step_ms, mb_per_token=b / 1e6,
                              gb_per_s=b / step_ms / 1e6, rounds_total_s=t[name], rounds_prefill_s=pre[name],
                              **extra)
        r_ = rows_out[name]
        print(f"{name:<24}{r_['tokens_per_s']:>7.1f}{p:>10.3f}{r_['step_ms']:>9.2f}{b / 1e6:>10.1f}"
              f"{r_['gb_per_s']:>7.1f}" + (f"{ppl[kind]:>11.2f}{resident[kind]:>12.0f}"
              f"{(f'{first[kind]:.1f}' if 'compiled' in name else '-'):>13}" if name != "llama.cpp" else ""))
    ratios = {}
    if llama is not None:
        for name in rows_out:
            if name == "llama.cpp":
                continue
            per_round = [tl / tw for tw, tl in zip(t[name], t["llama.cpp"])]  # their time / ours
            step_round = [((tl - pl) / (tw - pw)) for tw, pw, tl, pl in
                          zip(t[name], pre[name], t["llama.cpp"], pre["llama.cpp"])]
            ratios[name] = dict(tokens_per_s=statistics.median(per_round), step=statistics.median(step_round))
            print(f"{name} / llama.cpp, median of the rounds: tokens/s {ratios[name]['tokens_per_s']:.2f}x, "
                  f"decode step {ratios[name]['step']:.2f}x")
    else:
        print("llama.cpp: not measured (CMAKE_ARGS=-DGGML_NATIVE=ON pip install llama-cpp-python==0.3.36)")
    profiles = {}
    for kind in ("file blocks", "fast blocks"):
        saved = guard_cost(models[kind].model, rows, N, a.rounds)
        print(f"skipping the guard check (set_stance(skip_guard_eval_unsafe=True)), {kind}, no profiler: "
              f"{saved:.2f} ms a step saved (median of {a.rounds} alternated rounds)")
        profiles[kind] = profile(models[kind].model, rows, N, rows_out[f"{kind}, compiled"]["step_ms"])
        profiles[kind]["guards_skipped_saved_ms"] = saved
    one_thread = thread_rounds(models["fast blocks"].model, rows, N, a.rounds, 1)
    torch.set_num_threads(threads)
    r = subprocess.run([sys.executable, __file__, "--first-call-child", "fast blocks"], capture_output=True,
                       text=True)  # inductor's cache now warm: what a second process pays
    second_process = json.loads(r.stdout.strip().splitlines()[-1])["first_call_s"] if not r.returncode else None
    print(f"fast blocks, first compiled call in a second process (warm inductor cache): {second_process}")
    fid = fidelity(models["file blocks"].model, models["fast blocks"].model, tok)
    diff = first_difference(models["file blocks"].model, rows, out["file blocks, compiled"][0],
                            out["fast blocks, compiled"][0])
    for play, f in fid.items():
        print(f"fast vs exact blocks, {play}: KL {f['kl_mean']:.5f}, top-1 agreement {f['top1_agreement']:.4f}, "
              f"perplexity {f['perplexity_exact']:.3f} -> {f['perplexity_fast']:.3f} ({f['tokens']} tokens)")
    print(f"greedy tokens on the bench prompt, fast vs exact blocks: "
          f"{'identical' if diff is None else f'first differ at token {diff}'}")
    if a.out:
        result = dict(bench="bench/bench_quantised.py", date=time.strftime("%Y-%m-%d"), prompt=PROMPT,
                      new_tokens=N, rounds=a.rounds, settings=settings, warmup_graphs=warmup_graphs,
                      recompiled=recompiled,
                      sides=rows_out, ratio_to_llama_cpp=ratios, blocks_step_profile=profiles["file blocks"],
                      fast_step_profile=profiles["fast blocks"], one_thread=one_thread,
                      fast_first_call_second_process_s=second_process, fast_fidelity=fid,
                      fast_greedy_first_difference=diff,
                      tokens_equal_float32_compiled={n: out[n][0] == out["float32, compiled"][0]
                                                     for n in out if n != "llama.cpp"})
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {a.out}")
    base = out["float32, compiled"][0]
    for name, _ in sides[:-1] if llama is not None else sides:
        same = out[name][0] == base
        print(f"{name}: greedy tokens {'identical to' if same else 'differ from'} float32 compiled")


def medians(totals: list[float], prefills: list[float], N: int) -> tuple[float, float, float]:
    """Seconds of the whole N-token call, of the prefill (a one-token call), and ms of a decode step
    (their difference over the N - 1 steps): medians over the rounds."""
    steps = [(t - p) / (N - 1) for t, p in zip(totals, prefills)]
    return statistics.median(totals), statistics.median(prefills), 1e3 * statistics.median(steps)


def guard_cost(model, rows, N: int, rounds: int) -> float:
    "ms a compiled decode step saves when dynamo skips its guard check: full runs, alternated, no profiler."
    cpu = torch.device("cpu")
    run = lambda: generate(model, rows, N, compile=True)
    skipping = lambda: torch.compiler.set_stance(skip_guard_eval_unsafe=True)
    run()
    with skipping():
        run()
    saved = []
    for _ in range(rounds):  # the prefill runs eagerly in both: the difference is the N - 1 steps'
        checked = timed(run, cpu)
        with skipping():
            skipped = timed(run, cpu)
        saved.append(1e3 * (checked - skipped) / (N - 1))
    return statistics.median(saved)


def thread_rounds(model, rows, N: int, rounds: int, threads: int) -> dict:
    "Prefill and step of the fast blocks and of llama.cpp at `threads` threads, alternated: medians."
    torch.set_num_threads(threads)
    llama = llama_cpp_side(weights_path(), rows, N, threads)
    sides = {"fast blocks, compiled": lambda n: generate(model, rows, n, compile=True)}
    if llama is not None:
        sides["llama.cpp"] = lambda n: llama(1, n)
    cpu, got = torch.device("cpu"), {name: ([], []) for name in sides}
    sides["fast blocks, compiled"](N - 8)  # warm-up at this thread count
    for _ in range(rounds):
        for name, fn in sides.items():
            total, pre = timed(lambda: fn(N), cpu), timed(lambda: fn(1), cpu)
            got[name][0].append(total)
            got[name][1].append(pre)
    out = {}
    for name, (total, pre) in got.items():
        whole, prefill, step_ms = medians(total, pre, N)
        out[name] = dict(threads=threads, tokens_per_s=N / whole, prefill_s=prefill, step_ms=step_ms)
        print(f"{threads} thread(s), {name}: {out[name]['tokens_per_s']:.1f} tokens/s, prefill "
              f"{out[name]['prefill_s']:.3f} s, step {out[name]['step_ms']:.2f} ms")
    return out


def _profiled(model, rows, n: int) -> dict:
    "µs of one profiled `generate(model, rows, n, compile=True)`: the whole call and its parts, summed."
    from torch.profiler import ProfilerActivity, profile as torch_profile
    t0 = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        generate(model, rows, n, compile=True)
    call = (time.perf_counter() - t0) * 1e6
    events = prof.key_averages()
    mine = lambda test, inclusive=False: sum(e.cpu_time_total if inclusive else e.self_cpu_time_total
                                             for e in events if test(e.key))
    return dict(call=call, region=mine(lambda k: k.startswith("Torch-Compiled Region"), inclusive=True),
                kernels=mine(lambda k: "cpp_fused" in k),
                weight_kernels=mine(lambda k: k in ("aten::_weight_int4pack_mm_for_cpu",
                                                    "aten::_weight_int8pack_mm")),
                attention=mine(lambda k: k.startswith("aten::") and "scaled_dot_product" in k),
                guards=mine(lambda k: "Cache Lookup" in k))


def profile(model, rows, N: int, unprofiled_step_ms: float) -> dict:
    """A compiled blocks model's decode step as the rounds run it (their cache size, their graph), under the
    profiler: a call of N tokens minus a call of one (the prompt's prefill, the same in both), over the N - 1
    steps. Its parts add up to the profiled step: the compiled region (inductor's kernels, aten's int4/int8
    weight kernels, attention, and the rest of the region: the wrapper's buffers and calls), dynamo's guard
    check before it, and what remains outside both (`generate`'s loop, its Python); beside it the unprofiled
    step of the rounds, `unprofiled_step_ms`."""
    import torch._inductor.config as inductor_config
    inductor_config.cpp.enable_kernel_profile = True  # inductor's kernels by name (recompiled: reset)
    torch._dynamo.reset()
    try:
        generate(model, rows, N - 8, compile=True)  # compiles the rounds' graph (the same cache size)
        generate(model, rows, 1, compile=True)
        whole, prefill = _profiled(model, rows, N), _profiled(model, rows, 1)
    finally:  # what runs after it, runs on graphs without the profiling counters
        inductor_config.cpp.enable_kernel_profile = False
        torch._dynamo.reset()
    per = {k: (whole[k] - prefill[k]) / (N - 1) / 1e3 for k in whole}  # ms a step
    inside = per["kernels"] + per["weight_kernels"] + per["attention"]
    out = dict(steps=N - 1, cache_slots=_slots(PROMPT + N, model.config.max_len), step_ms=per["call"],
               unprofiled_step_ms=unprofiled_step_ms, region_ms=per["region"], kernels_ms=per["kernels"],
               weight_kernels_ms=per["weight_kernels"], attention_ms=per["attention"],
               around_kernels_ms=per["region"] - inside, guards_ms=per["guards"],
               outside_ms=per["call"] - per["region"] - per["guards"])
    print(f"\nper decode step ({N - 1} steps, profiled): {out['step_ms']:.2f} ms (unprofiled "
          f"{unprofiled_step_ms:.2f}): the compiled region {out['region_ms']:.2f} (inductor's kernels "
          f"{out['kernels_ms']:.2f}, aten's int4/int8 weight kernels {out['weight_kernels_ms']:.2f}, attention "
          f"{out['attention_ms']:.2f}, the rest {out['around_kernels_ms']:.2f}), the guard check "
          f"{out['guards_ms']:.2f}, outside both {out['outside_ms']:.2f}")
    return out

if __name__ == "__main__":
    main()
