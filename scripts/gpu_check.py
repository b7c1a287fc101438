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


def bench_attention(dtype, B=8, H=16, T=2048, D=64, repeats=20) -> tuple[float, float]:
    "TFLOP/s of our fused attention (causal) and of the explicit path, forward only."
    from minitransformer.attention import attention_with_weights, scaled_dot_product_attention
    from minitransformer.masks import causal_mask
    q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=dtype) for _ in range(3))
    mask = causal_mask(T, device="cuda")
    flops = 4 * B * H * T * T * D / 2  # two matmuls, half of them masked
    out = []
    for fn in (lambda: scaled_dot_product_attention(q, k, v, mask), lambda: attention_with_weights(q, k, v, mask)):
        fn(); torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter(); fn(); torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
        out.append(flops / statistics.median(times) / 1e12)
    return out[0], out[1]


def bench_generate(dtype, new_tokens=256) -> tuple[float, float]:
    "Tokens/s of cached greedy generation, batch 1 and batch 32, for the 4-layer d_model-256 benchmark GPT."
    from minitransformer.generation import generate
    from minitransformer.model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=5000, max_len=16 + new_tokens, d_model=256, n_heads=4, n_layers=4)).cuda().to(dtype).eval()
    res = []
    for B in (1, 32):
        prompts = [list(range(10, 26))] * B
        generate(model, prompts, 8)
        torch.cuda.synchronize(); t0 = time.perf_counter()
        generate(model, prompts, new_tokens)
        torch.cuda.synchronize()
        res.append(B * new_tokens / (time.perf_counter() - t0))
    return res[0], res[1]


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device here; skipped (nothing to check)")
        return 0
    name = torch.cuda.get_device_name()
    print(f"gpu-check on {name}, torch {torch.__version__}", flush=True)
    env = {**os.environ, "MT_DEVICE": "cuda"}
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "tests/test_gpu.py", "tests/test_generation.py"], cwd=ROOT, env=env)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        fused, explicit = bench_attention(dtype)
        g1, g32 = bench_generate(dtype)
        rows.append((str(dtype).removeprefix("torch."), fused, explicit, g1, g32))
    print(f"\n{'dtype':<10}{'attention TFLOP/s':>19}{'explicit path':>15}{'gen tok/s B=1':>15}{'gen tok/s B=32':>16}")
    for r in rows:
        print(f"{r[0]:<10}{r[1]:>19.1f}{r[2]:>15.1f}{r[3]:>15.0f}{r[4]:>16.0f}")
    print("(attention: B=8, H=16, T=2048, D=64, causal, forward; generation: 4 layers, d_model 256, 256 new tokens)")
    return tests.returncode


if __name__ == "__main__":
    sys.exit(main())
