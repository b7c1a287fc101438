"""minitransformer.checks: `tracing` is true only under a tracer; `check_float_dtype` takes
"auto" only where it is allowed."""

import pytest
import torch

from minitransformer.checks import check_float_dtype, tracing


def test_tracing_is_true_only_under_torch_compile():
    assert tracing() is False
    seen = []

    def f(x):
        seen.append(tracing())
        return x + 1

    torch.compile(f, backend="eager", fullgraph=True)(torch.zeros(2))
    assert seen == [True]


def test_check_float_dtype_takes_auto_only_where_allowed():
    check_float_dtype("auto", allow_auto=True)
    check_float_dtype(torch.bfloat16, allow_auto=True)
    for bad in ("auto", "float16"):
        with pytest.raises(TypeError, match="dtype must be a floating-point"):
            check_float_dtype(bad, allow_auto=bad == "float16")
    with pytest.raises(TypeError, match=r"\(or 'auto': as stored\), got torch.int8"):
        check_float_dtype(torch.int8, allow_auto=True)
