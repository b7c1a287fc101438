"""GPU check: where CUDA is present, run the package's tests on the GPU (float32 and bfloat16), the
cache-equivalence tests, and a short benchmark of generation and attention throughput, printing a table.
On a machine without CUDA it says so and exits 0.

    python scripts/gpu_check.py          (make gpu-check)
"""
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def bench_attention(dtype, B=8, H=16, T=2048, D=64, repeats=20) -> tuple[float, float, float]:
    """TFLOP/s, forward only, of causal attention three ways: the fused kernel told `is_causal`
    (no mask: the flash kernel can run), the fused kernel with a boolean causal mask, the explicit path."""
    from minitransformer.attention import attention_with_weights, scaled_dot_product_attention
    from minitransformer.masks import causal_mask
    q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=dtype) for _ in range(3))
    mask = causal_mask(T, device="cuda")
    flops = 4 * B * H * T * T * D / 2  # two matmuls, half of them masked
    out = []
    for fn in (lambda: scaled_dot_product_attention(q, k, v, is_causal=True),
               lambda: scaled_dot_product_attention(q, k, v, mask),
               lambda: attention_with_weights(q, k, v, mask)):
        fn(); torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter(); fn(); torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
        out.append(flops / statistics.median(times) / 1e12)
    a = scaled_dot_product_attention(q, k, v, is_causal=True)
    b = scaled_dot_product_attention(q, k, v, mask)
    # two kernels, each rounding its output to bfloat16 (one step: 2^-8 to 2^-7 relative), so
    # the bound is absolute and relative: outputs of early rows (1-3 keys) exceed 2
    rtol, atol = (2**-7, 1e-2) if dtype == torch.bfloat16 else (0.0, 1e-4)
    assert torch.allclose(a.float(), b.float(), rtol=rtol, atol=atol), \
        "is_causal and the causal mask disagree"
    return tuple(out)


def empty_rows() -> list[tuple[str, str, str]]:
    """What torch's own attention kernels give a query whose mask allows no key, per backend and
    dtype: "zeros", "nan", "other" or "n/a" (the backend takes no such input); `attend` zeroes
    such rows itself, which is needed only where some kernel gives anything but zeros."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = (torch.randn(2, 4, 9, 64, device="cuda", dtype=dtype) for _ in range(3))
        mask = torch.rand(2, 1, 9, 9, device="cuda") < 0.7
        mask[1, 0, 3] = False
        for name in ("MATH", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "FLASH_ATTENTION"):
            try:
                with sdpa_kernel([getattr(SDPBackend, name)]):
                    row = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[1, :, 3]
                got = ("nan" if row.isnan().any() else "zeros" if (row == 0).all()
                       else "other")
            except RuntimeError:
                got = "n/a"
            rows.append((str(dtype).removeprefix("torch."), name, got))
    return rows


def _same_up_to_a_near_tie(model, prompts, compiled, eager) -> None:
    """Where compiled and eager greedy tokens part, the two tokens' logits there differ by no
    more than float32's rounding of that step's logits (kernels sum in another order)."""
    for prompt, a, b in zip(prompts, compiled, eager):
        if a != b:
            i = next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)
            with torch.no_grad():
                logits = model(torch.tensor([prompt + a[:i]], device="cuda"))[0, -1].float()
            gap = (logits[a[i]] - logits[b[i]]).abs().item()
            assert gap <= 64 * torch.finfo(torch.float32).eps * logits.abs().max().item(), (
                f"compiled and eager tokens part at {i} by a logit gap of {gap}")


def bench_generate(dtype, new_tokens=256) -> list[float]:
    """Tokens/s of cached greedy generation for the 4-layer d_model-256 benchmark GPT: batch 1 and 32,
    eager and with `generate(..., compile=True)` (one flat graph a step over the static cache,
    replayed as a CUDA graph), and the seconds of the first compiled call (compilation included).
    Printed for the compiled calls: the CUDA graphs recorded by the first call and by the timed
    one (a GenerationCache kept between them), the replays and the synchronising calls of the
    timed one (torch's sync debug mode). Asserted: inductor skipped no CUDA graph, the timed call
    recorded none and replayed one a decode step, and the compiled tokens equal the eager ones
    but for a near tie (float32)."""
    from torch._dynamo.utils import counters
    import warnings
    from minitransformer.generation import GenerationCache, generate
    from minitransformer.model import GPT, GPTConfig
    replays, recordings = [], []
    replay, begin = torch.cuda.CUDAGraph.replay, torch.cuda.CUDAGraph.capture_begin
    torch.cuda.CUDAGraph.replay = lambda self: replays.append(1) or replay(self)
    torch.cuda.CUDAGraph.capture_begin = lambda self, *a, **k: recordings.append(1) or begin(
        self, *a, **k)
    counters.clear()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=5000, max_len=16 + new_tokens, d_model=256, n_heads=4,
                          n_layers=4)).cuda().to(dtype).eval()
    res, first = [], 0.0
    try:
        for compile in (False, True):
            for B in (1, 32):
                prompts = [list(range(10 + b % 7, 26)) for b in range(B)]  # several lengths
                held = GenerationCache()
                recordings.clear()
                t0 = time.perf_counter()
                generate(model, prompts, new_tokens, compile=compile, cache=held)  # compiles
                torch.cuda.synchronize()
                if compile and B == 1:
                    first = time.perf_counter() - t0
                recorded_first = len(recordings)
                torch.cuda.synchronize(); t0 = time.perf_counter()
                replays.clear()
                recordings.clear()
                tokens = generate(model, prompts, new_tokens, compile=compile, cache=held)
                torch.cuda.synchronize()
                res.append(B * new_tokens / (time.perf_counter() - t0))
                if not compile:
                    continue
                with warnings.catch_warnings(record=True) as caught:  # untimed: the syncs
                    warnings.simplefilter("always")
                    torch.cuda.set_sync_debug_mode("warn")
                    try:
                        generate(model, prompts, new_tokens, compile=True, cache=held)
                    finally:
                        torch.cuda.set_sync_debug_mode("default")
                syncs = sum("synchroniz" in str(w.message) for w in caught)
                print(f"{dtype}, B={B}: CUDA graphs recorded {recorded_first} (first call), "
                      f"{len(recordings)} (timed call); {len(replays)} replays for {new_tokens} "
                      f"tokens; {syncs} synchronising calls in a whole call; "
                      f"{counters['inductor']['cudagraph_skips']} skips", flush=True)
                assert len(replays) == new_tokens - 1, "a decode step replayed no CUDA graph"
                assert not recordings, "the timed call recorded a CUDA graph again"
                assert counters["inductor"]["cudagraph_skips"] == 0, "inductor skipped CUDA graphs"
                if dtype == torch.float32:  # the eager tokens, but for a near tie's flip
                    _same_up_to_a_near_tie(model, prompts, tokens, generate(model, prompts,
                                                                            new_tokens))
    finally:
        torch.cuda.CUDAGraph.replay, torch.cuda.CUDAGraph.capture_begin = replay, begin
    return res + [first]


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device here; skipped (nothing to check)")
        return 0
    name = torch.cuda.get_device_name()
    print(f"gpu-check on {name}, torch {torch.__version__}", flush=True)
    env = {**os.environ, "MT_DEVICE": "cuda"}
    files = ["tests/integration/test_gpu.py"] + [f"tests/unit/test_{m}.py" for m in (
        "generation", "kv_cache", "model", "multihead")]  # (every file with `gpu` tests)
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-m", "gpu", *files], cwd=ROOT, env=env)
    print("\nwhat torch's kernel gives a query that may see no key:")
    for dtype, backend, got in empty_rows():
        print(f"  {dtype:<10}{backend:<21}{got}")
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        attn = bench_attention(dtype)
        gen = bench_generate(dtype)
        rows.append((str(dtype).removeprefix("torch."), *attn, *gen))
    print(f"\n{'dtype':<10}{'attention TFLOP/s: is_causal':>29}{'bool mask':>11}{'explicit':>10}"
          f"{'tok/s B=1 eager':>17}{'compiled':>10}{'tok/s B=32 eager':>18}{'compiled':>10}"
          f"{'first compiled call s':>23}")
    for r in rows:
        print(f"{r[0]:<10}{r[1]:>29.1f}{r[2]:>11.1f}{r[3]:>10.1f}{r[4]:>17.0f}{r[6]:>10.0f}{r[5]:>18.0f}{r[7]:>10.0f}"
              f"{r[8]:>23.1f}")
    print("(attention: B=8, H=16, T=2048, D=64, causal, forward; generation: 4 layers, d_model 256, "
          "256 new tokens after prompts of 9-16 tokens; first compiled call: float32's in a fresh "
          "process, bfloat16's after float32's, with inductor's caches warm)")
    return tests.returncode


if __name__ == "__main__":
    sys.exit(main())
