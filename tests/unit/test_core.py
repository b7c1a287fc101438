"""default_device's choice on machines this one is not: CUDA, then MPS, then the CPU; and
seed_everything's reduction of seeds that torch and NumPy would refuse."""

import pytest
import torch

from minitransformer.core import default_device, seed_everything


def test_prefers_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_device() == torch.device("cuda")


def test_then_mps(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert default_device() == torch.device("mps")


def test_then_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert default_device() == torch.device("cpu")


def test_seeds_torch_refuses_are_reduced_as_the_docstring_says():
    with pytest.raises((RuntimeError, ValueError)):
        torch.manual_seed(2**64)  # what the docstring says torch does with it
    seed_everything(2**64 + 5)
    a = torch.randn(3)
    torch.manual_seed(5)
    assert torch.equal(a, torch.randn(3)), "2**64 + 5 seeds torch as 5 does"
