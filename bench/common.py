"""Helpers shared by the benchmark scripts: timing (wall clock, with CUDA synchronised around each call) and
the count of graphs torch.compile has compiled."""
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


def graphs() -> int:
    "How many graphs torch.compile has compiled in this process."
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]
