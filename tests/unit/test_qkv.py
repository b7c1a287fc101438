"""minitransformer.qkv: the projection and `check_qkv` refuse what does not fit."""

import pytest
import torch

from minitransformer.qkv import QKVProjection, check_qkv


# Chapter 3: QKVProjection and check_qkv name what does not fit.
def test_projection_and_check_qkv_refuse_what_does_not_fit():
    proj = QKVProjection(d_model=12, d_q=7, d_v=5)
    Q, K, V = proj(torch.randn(3, 12), context=torch.randn(4, 12))
    cases = [
        (lambda: check_qkv(Q, K, V[:3]), ValueError,
         r"keys \(4, 7\) and values \(3, 5\) must have the same length S"),
        (lambda: check_qkv(Q, K[:, :6], V), ValueError,
         r"queries \(3, 7\) and keys \(4, 6\) must have the same width D"),
        (lambda: proj(torch.randn(3, 10)), ValueError,
         r"x has width 10 \(shape \(3, 10\)\) but this projection expects d_model=12"),
        (lambda: proj(torch.randn(2, 3, 12), context=torch.randn(3, 4, 12)), ValueError,
         r"x \(2, 3, 12\) and context \(3, 4, 12\) have batch dimensions that do not"),
        (lambda: QKVProjection(12, 7, dtype=torch.int64), TypeError,
         "dtype must be a floating-point torch.dtype"),
        (lambda: QKVProjection(12, 0), ValueError, "d_q must be a positive int"),
        (lambda: proj(torch.zeros(3, 12, dtype=torch.float64)), TypeError,
         "x has dtype torch.float64, but the projection's weights are torch.float32"),
        (lambda: proj(torch.zeros(3, 12), context=[[0.5] * 12]), TypeError,
         "context must be a torch.Tensor"),
    ]
    for call, error, message in cases:
        with pytest.raises((TypeError, ValueError), match=message) as info:
            call()
        assert info.type is error, (message, info.type)
