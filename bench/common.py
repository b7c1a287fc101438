"""Timing helpers shared by the benchmark scripts (wall clock, with CUDA synchronised around each call)."""
import time

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: torch.device) -> float:
    "Seconds one call of `fn` takes, after everything queued before it has finished."
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0
