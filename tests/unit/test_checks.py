"""minitransformer.checks: `tracing` is true only under a tracer."""

import torch

from minitransformer.checks import tracing


def test_tracing_is_true_only_under_torch_compile():
    assert tracing() is False
    seen = []

    def f(x):
        seen.append(tracing())
        return x + 1

    torch.compile(f, backend="eager", fullgraph=True)(torch.zeros(2))
    assert seen == [True]
