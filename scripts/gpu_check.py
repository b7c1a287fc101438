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
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-4
    assert (a.float() - b.float()).abs().max().item() < tol, "is_causal and the causal mask disagree"
    return tuple(out)


def bench_generate(dtype, new_tokens=256) -> list[float]:
    """Tokens/s of cached greedy generation for the 4-layer d_model-256 benchmark GPT: batch 1 and 32,
    eager and with `generate(..., compile=True)` (one flat graph a step over the static cache), and
    the seconds of the first compiled call (compilation included); the compiled tokens must equal the
    eager ones."""
    from minitransformer.generation import generate
    from minitransformer.model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=5000, max_len=16 + new_tokens, d_model=256, n_heads=4,
                          n_layers=4)).cuda().to(dtype).eval()
    res, first = [], 0.0
    for compile in (False, True):
        for B in (1, 32):
            prompts = [list(range(10 + b % 7, 26)) for b in range(B)]  # several lengths: left padding
            t0 = time.perf_counter()
            generate(model, prompts, new_tokens, compile=compile)  # warm-up (and compilation)
            torch.cuda.synchronize()
            if compile and B == 1:
                first = time.perf_counter() - t0
            torch.cuda.synchronize(); t0 = time.perf_counter()
            tokens = generate(model, prompts, new_tokens, compile=compile)
            torch.cuda.synchronize()
            res.append(B * new_tokens / (time.perf_counter() - t0))
            if compile and dtype == torch.float32:
                same = tokens == generate(model, prompts, new_tokens)
                print(f"compiled tokens equal to eager ones (B={B}, float32): {same}", flush=True)
    return res + [first]


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device here; skipped (nothing to check)")
        return 0
    name = torch.cuda.get_device_name()
    print(f"gpu-check on {name}, torch {torch.__version__}", flush=True)
    env = {**os.environ, "MT_DEVICE": "cuda"}
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-m", "gpu", "tests"], cwd=ROOT, env=env)
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
