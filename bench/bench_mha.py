"""Our MultiHeadAttention against torch.nn.MultiheadAttention, side by side in one process.

    python bench/bench_mha.py [--device cpu|cuda] [--dtype float32|bfloat16] [--repeats 15]

Both modules get the same weights and the same input (B=8, T=256, d_model=512, 8 heads by default).
Each repeat times one call of each, alternating which goes first, after warm-up; the report gives
each one's median time and the median of the per-repeat ratios ours/torch (target: <= 1.1).
"""
import argparse
import statistics

import torch
from torch import nn

from common import timed
from minitransformer.multihead import MultiHeadAttention


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    torch.manual_seed(0)
    # eval(): lets torch take its fused inference fast path in the no_grad case (dropout is 0 anyway)
    ref = nn.MultiheadAttention(a.d_model, a.heads, batch_first=True).to(device, dtype).eval()
    ours = MultiHeadAttention.from_torch(ref)
    x = torch.randn(a.batch, a.seq, a.d_model, device=device, dtype=dtype)
    with torch.no_grad():
        diff = (ours(x) - ref(x, x, x, need_weights=False)[0]).abs().max().item()
    print(f"device={device} dtype={a.dtype} B={a.batch} T={a.seq} d_model={a.d_model} heads={a.heads} "
          f"threads={torch.get_num_threads()} torch={torch.__version__}; max |ours - torch| = {diff:.1e}")

    def fwd_ours():
        with torch.no_grad():
            ours(x)

    def fwd_ref():
        with torch.no_grad():
            ref(x, x, x, need_weights=False)

    xg = x.clone().requires_grad_()

    def fb_ours():
        ours(xg).sum().backward()

    def fb_ref():
        ref(xg, xg, xg, need_weights=False)[0].sum().backward()

    print(f"{'case':<22}{'ours (ms)':>11}{'torch (ms)':>12}{'ratio':>8}")
    for name, f_ours, f_ref in [("forward, no_grad", fwd_ours, fwd_ref), ("forward + backward", fb_ours, fb_ref)]:
        for _ in range(a.warmup):
            f_ours(); f_ref()
        t_ours, t_ref, ratios = [], [], []
        for i in range(a.repeats):
            if i % 2:
                r, o = timed(f_ref, device), timed(f_ours, device)
            else:
                o, r = timed(f_ours, device), timed(f_ref, device)
            t_ours.append(o); t_ref.append(r); ratios.append(o / r)
        print(f"{name:<22}{1e3 * statistics.median(t_ours):>11.2f}{1e3 * statistics.median(t_ref):>12.2f}"
              f"{statistics.median(ratios):>8.3f}")


if __name__ == "__main__":
    main()
