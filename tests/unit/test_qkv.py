"""minitransformer.qkv: the projection and `check_qkv` refuse what does not fit."""

import pytest
import torch

from minitransformer.qkv import QKVProjection, check_qkv


# Chapter 3: QKVProjection and check_qkv name what does not fit.
def test_projection_and_check_qkv_refuse_what_does_not_fit():
    "The module checks its sizes when built (its inputs: the models'); check_qkv its own."
    proj = QKVProjection(d_model=12, d_q=7, d_v=5)
    Q, K, V = proj(torch.randn(3, 12), context=torch.randn(4, 12))
    cases = [
        (lambda: check_qkv(Q, K, V[:3]), ValueError,
         r"keys \(4, 7\) and values \(3, 5\) must have the same length S"),
        (lambda: check_qkv(Q, K[:, :6], V), ValueError,
         r"queries \(3, 7\) and keys \(4, 6\) must have the same width D"),
        (lambda: QKVProjection(12, 7, dtype=torch.int64), TypeError,
         "dtype must be a floating-point torch.dtype"),
        (lambda: QKVProjection(12, 0), ValueError, "d_q must be a positive int"),
    ]
    for call, error, message in cases:
        with pytest.raises((TypeError, ValueError), match=message) as info:
            call()
        assert info.type is error, (message, info.type)
