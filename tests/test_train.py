"The weight average of `train(..., ema=...)`: it must not change training, and it works for bfloat16 weights."
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minitransformer.training import train


def _fit(model, steps, ema, xs, ys, lr=0.05):
    "Train `model`; return the live weights at the final evaluation and everything each step started from."
    starts, evaluated = [], []

    def loss_fn(m, b):
        starts.append([p.detach().clone() for p in m.parameters()])
        return F.mse_loss(m(b[0]), b[1])

    def eval_fn(m):
        evaluated.append([p.detach().clone() for p in m.parameters()])
        return {"mse": F.mse_loss(m(xs), ys).item()}

    train(model, lambda step: (xs, ys), loss_fn, steps=steps, lr=lr, warmup=0, ema=ema, eval_fn=eval_fn,
          log_every=0)
    return evaluated[0], starts  # the first evaluation of the last (only) round scores the live weights


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(dtype)


def test_averaging_does_not_change_the_training_trajectory():
    xs, ys = torch.randn(32, 8), torch.randn(32, 1)
    plain, with_ema = _model(), _model()
    live_plain, _ = _fit(plain, 25, None, xs, ys)
    live_ema, _ = _fit(with_ema, 25, 0.95, xs, ys)
    for a, b, p in zip(live_plain, live_ema, plain.parameters()):
        assert torch.equal(a, b) and torch.equal(a, p)
    # ... and the model trained with ema ends holding something else: the average
    assert not all(torch.equal(a, p) for a, p in zip(live_ema, with_ema.parameters()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_average_follows_the_rule_in_float32(dtype):
    xs, ys = torch.randn(32, 8, dtype=dtype), torch.randn(32, 1, dtype=dtype)
    model = _model(dtype)
    live, starts = _fit(model, 40, 0.99, xs, ys, lr=0.01)
    weights = starts + [live]  # the initial weights, then the weights after each of the 40 steps
    expected = [w.float() for w in weights[0]]
    for t, after in enumerate(weights[1:], start=1):
        d = min(0.99, (1 + t) / (10 + t))
        expected = [e + (1 - d) * (w.float() - e) for e, w in zip(expected, after)]
    for e, p in zip(expected, model.parameters()):
        assert p.dtype == dtype
        torch.testing.assert_close(p, e.to(dtype), atol=1e-6, rtol=1e-5 if dtype == torch.float32 else 8e-3)


def test_rejects_a_decay_outside_0_1():
    xs, ys = torch.randn(4, 8), torch.randn(4, 1)
    for bad in (0.0, 1.0, 1.5, -0.1):
        message = re.escape(f"ema must be a number in (0, 1), got {bad}")
        with pytest.raises(ValueError, match=message):
            train(_model(), lambda step: (xs, ys), lambda m, b: F.mse_loss(m(b[0]), b[1]), steps=1, ema=bad)


@pytest.mark.parametrize("kw,msg", [(dict(steps=-3), "steps must be an int >= 0"),
                                    (dict(steps=1.5), "steps must be an int >= 0"),
                                    (dict(max_seconds=-1.0), "max_seconds must be a finite number >= 0"),
                                    (dict(max_seconds=float("nan")), "max_seconds must be a finite number >= 0")])
def test_train_refuses_budgets_that_never_end(kw, msg):
    "These used to loop forever (the stop test read `steps` by truthiness)."
    lin = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match=msg):
        train(lin, lambda s: None, lambda m, b: m.weight.sum(), **kw)


@pytest.mark.parametrize("kw", [dict(steps=0), dict(max_seconds=0)])
def test_an_empty_budget_returns_an_empty_log_at_once(kw):
    lin = torch.nn.Linear(2, 1)
    before = lin.weight.detach().clone()
    log = train(lin, lambda s: 1 / 0, lambda m, b: m.weight.sum(), **kw)  # no batch is drawn
    assert log.steps == 0 and log.losses == [] and torch.equal(lin.weight, before)
