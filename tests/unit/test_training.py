"""minitransformer.training: `train` never hangs or runs uphill (budgets, clipping, non-finite
steps, Ctrl-C), resumes on the uninterrupted curve, refuses a bad count or a DDP-wrapped model,
averages weights without changing training, and checks every argument."""

import dataclasses
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from minitransformer.checkpoints import load_checkpoint, save_checkpoint
from minitransformer.distributed import DDPProcesses, distributed
from minitransformer.model import GPT
from minitransformer.training import SingleProcess, sequence_loss, train

from helpers import CFG, identical, same, weights


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
@pytest.mark.reduced_precision
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
        # bfloat16: one rounding of the same float32 number, at most one step (2^-7 = 7.8e-3)
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


def _lin_loss(count):
    def loss_fn(m, b):
        return F.mse_loss(m(b[0]), b[1]), count
    return loss_fn


@pytest.mark.timeout(300)
@pytest.mark.timeout(30)
@pytest.mark.parametrize("count", [2.0, -1, True, "3", torch.tensor(2.0),
                                   torch.tensor([2]), torch.tensor(-1)])
def test_train_refuses_a_bad_count(count):
    xs, ys = torch.randn(4, 3), torch.randn(4, 1)
    negative = not isinstance(count, (bool, str, float)) and (
        count.numel() == 1 and not count.is_floating_point() and count.item() < 0
        if isinstance(count, torch.Tensor) else count < 0)
    with pytest.raises(ValueError if negative else TypeError, match="count"):
        train(nn.Linear(3, 1), lambda s: (xs, ys), _lin_loss(count), steps=1)


@pytest.mark.timeout(300)
def test_one_process_ignores_a_good_count():
    xs, ys = torch.randn(4, 3), torch.randn(4, 1)
    ends = []
    for count in (None, 4, torch.tensor(4), 0):
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        loss_fn = _lin_loss(count) if count is not None else \
            (lambda m, b: F.mse_loss(m(b[0]), b[1]))
        train(model, lambda s: (xs, ys), loss_fn, steps=3, warmup=0, log_every=0)
        ends.append(model.state_dict())
    assert all(identical(ends[0], e) for e in ends[1:])


@pytest.mark.timeout(300)
def test_train_refuses_a_ddp_wrapped_model(tmp_path, monkeypatch):
    """A 1-rank gloo group in this process, just long enough to build a DDP wrapper
    (and to see `distributed()` refuse to join a second group)."""
    if dist.is_initialized():
        pytest.skip("this process already belongs to a process group")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}",
                            rank=0, world_size=1)
    try:
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.setenv(key, "1" if key == "WORLD_SIZE" else "0")
        with pytest.raises(RuntimeError, match="already belongs to a process group"):
            with distributed():
                pass
        wrapped = DistributedDataParallel(nn.Linear(3, 1))
        xs, ys = torch.randn(4, 3), torch.randn(4, 1)
        with pytest.raises(TypeError, match="pass the model itself"):
            train(wrapped, lambda s: (xs, ys),
                  lambda m, b: F.mse_loss(m(b[0]), b[1]), steps=1)
        with pytest.raises(TypeError, match="processes must be a SingleProcess"):
            train(nn.Linear(3, 1), lambda s: (xs, ys),
                  lambda m, b: F.mse_loss(m(b[0]), b[1]), steps=1, processes="ddp")
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(300)
def test_one_process_answers_as_itself():
    "`DDPProcesses` outside a process group answers as `SingleProcess`: the same steps."
    xs, ys = torch.randn(4, 3), torch.randn(4, 1)
    ends = []
    for processes in (None, SingleProcess(), DDPProcesses()):
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        train(model, lambda s: (xs, ys), lambda m, b: F.mse_loss(m(b[0]), b[1]),
              steps=3, warmup=0, log_every=0, processes=processes)
        ends.append(model.state_dict())
    assert all(identical(ends[0], e) for e in ends[1:])


CYCLE = torch.arange(4, 16).repeat(3)


def batch(step):
    g = torch.Generator().manual_seed(step)
    idx = torch.randint(0, 12, (8,), generator=g)[:, None] + torch.arange(21)
    return CYCLE[idx[:, :-1]], CYCLE[idx[:, 1:]]


def lm_loss(m, b):
    return sequence_loss(m(b[0]), b[1])


# --- train ---------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.timeout(10)
@pytest.mark.parametrize("budget", [dict(steps=0), dict(max_seconds=0),
                                    dict(max_seconds=0.0, steps=5)])
def test_an_empty_budget_returns_at_once(budget):
    log = train(GPT(CFG), batch, lm_loss, **budget)
    assert log.steps == 0 and log.losses == []


@pytest.mark.timeout(60)
@pytest.mark.timeout(10)
@pytest.mark.parametrize("budget, name", [
    (dict(steps=-1), "steps"), (dict(max_seconds=-1.0), "max_seconds"),
    (dict(max_seconds=float("nan")), "max_seconds"), (dict(steps=2.5), "steps"),
    (dict(steps=True), "steps"), (dict(max_seconds=float("inf")), "max_seconds")])
def test_a_bad_budget_raises(budget, name):
    with pytest.raises(ValueError, match=name):
        train(GPT(CFG), batch, lm_loss, **budget)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kwargs, name", [
    (dict(clip=-1.0), "clip"), (dict(clip=0.0), "clip"), (dict(lr=-1e-3), "lr"),
    (dict(lr=float("nan")), "lr"), (dict(warmup=-1), "warmup"),
    (dict(schedule="linear"), "schedule"), (dict(min_lr_ratio=2.0), "min_lr_ratio"),
    (dict(weight_decay=-0.1), "weight_decay"), (dict(betas=(0.9, 1.0)), "betas"),
    (dict(ema=1.0), "ema"), (dict(eval_every=0), "eval_every"),
    (dict(log_every=-1), "log_every"), (dict(autocast_bf16=1), "autocast_bf16"),
    (dict(on_nonfinite="ignore"), "on_nonfinite"), (dict(checkpoint_every=5), "checkpoint"),
    (dict(checkpoint=3), "checkpoint"), (dict(eval_fn=3), "eval_fn")])
def test_every_train_argument_is_checked(kwargs, name):
    model = GPT(CFG)
    before = weights(model)
    with pytest.raises((TypeError, ValueError), match=name):
        train(model, batch, lm_loss, steps=3, **kwargs)
    assert same(before, weights(model))


@pytest.mark.timeout(60)
def test_a_negative_clip_no_longer_trains_uphill():
    "clip=-1 used to flip the gradients: the loss rose from 2.39 to 6.09 in 30 steps."
    torch.manual_seed(0)
    model = GPT(CFG)
    with pytest.raises(ValueError, match="clip must be a finite number > 0, got -1.0"):
        train(model, batch, lm_loss, steps=30, clip=-1.0)
    log = train(model, lambda s: batch(0), lm_loss, steps=30, lr=3e-3, warmup=0,
                log_every=0)
    assert log.losses[-1] < log.losses[0]


def nan_after(k):
    calls = []

    def loss_fn(m, b):
        calls.append(1)
        return lm_loss(m, b) * (float("nan") if len(calls) > k else 1.0)
    return loss_fn


@pytest.mark.timeout(60)
def test_a_nan_loss_stops_the_run_without_touching_weights_or_average():
    torch.manual_seed(0)
    model, seen = GPT(CFG), []
    with pytest.raises(FloatingPointError, match="step 4: the loss is nan"):
        train(model, batch, nan_after(3), steps=10, ema=0.9, log_every=0,
              eval_fn=lambda m: seen.append(weights(m)) or {}, eval_every=1)
    assert same(weights(model), seen[-2])  # live weights after step 3 (then the average)
    assert all(torch.isfinite(t).all() for t in weights(model))


@pytest.mark.timeout(60)
def test_a_nan_gradient_is_caught_too():
    model = GPT(CFG)

    def loss_fn(m, b):  # a finite loss whose gradient is NaN: sqrt'(0) * 0 ... = nan
        return lm_loss(m, b) + (m.head.weight.sum() * 0).sqrt()
    before = weights(model)
    with pytest.raises(FloatingPointError, match="gradient norm nan"):
        train(model, batch, loss_fn, steps=3, log_every=0)
    assert same(before, weights(model))


@pytest.mark.timeout(60)
def test_skipping_non_finite_steps_counts_them_and_keeps_everything_finite():
    model = GPT(CFG)
    log = train(model, batch, nan_after(3), steps=8, ema=0.9, log_every=0,
                on_nonfinite="skip")
    assert (log.steps, log.skipped) == (8, 5)
    assert all(torch.isfinite(t).all() for t in weights(model))
    every = nan_after(0)  # every step bad: the run still ends
    log = train(GPT(CFG), batch, every, steps=4, log_every=0, on_nonfinite="skip")
    assert log.skipped == 4


@pytest.mark.timeout(60)
def test_ctrl_c_during_the_averaged_evaluation_leaves_the_live_weights():
    model, calls = GPT(CFG), []

    def eval_fn(m):
        calls.append(weights(m))
        if len(calls) == 2:  # the second call scores the averaged weights
            raise KeyboardInterrupt
        return {"x": 0.0}
    with pytest.raises(KeyboardInterrupt):
        train(model, batch, lm_loss, steps=3, ema=0.9, eval_fn=eval_fn, eval_every=3,
              log_every=0)
    assert same(weights(model), calls[0])  # the live weights, not the average
    assert not same(calls[0], calls[1])
    model(torch.zeros(1, 3, dtype=torch.long))  # and the model still runs


@pytest.mark.timeout(60)
def test_loss_fn_must_return_a_scalar_with_grad():
    with pytest.raises(TypeError, match="loss_fn must return a scalar tensor"):
        train(GPT(CFG), batch, lambda m, b: m(b[0]).sum(-1), steps=1)
    with pytest.raises(TypeError, match="loss_fn must return a scalar tensor"):
        train(GPT(CFG), batch, lambda m, b: torch.tensor(1.0), steps=1)


# --- resumable training --------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("ema", [None, 0.9])
def test_a_resumed_run_follows_the_uninterrupted_curve(tmp_path, ema):
    cfg = dataclasses.replace(CFG, dropout=0.1)
    settings = dict(steps=25, lr=3e-3, warmup=5, ema=ema, log_every=0)
    torch.manual_seed(1)
    whole_model = GPT(cfg)
    whole = train(whole_model, batch, lm_loss, **settings)

    def crash(step):
        if step == 17:
            raise KeyboardInterrupt
        return batch(step)
    torch.manual_seed(1)
    with pytest.raises(KeyboardInterrupt):
        train(GPT(cfg), crash, lm_loss, checkpoint=tmp_path / "run", checkpoint_every=7,
              **settings)
    torch.manual_seed(5)
    model = GPT(cfg)
    resumed = train(model, batch, lm_loss, checkpoint=tmp_path / "run", resume=True,
                    **settings)
    assert resumed.losses == whole.losses and resumed.lrs == whole.lrs
    assert same(weights(model), weights(whole_model))
    # the finished run's file: live weights, and with ema the average on request
    if ema is not None:
        averaged = load_checkpoint(tmp_path / "run", average=True)
        assert same(weights(averaged), weights(whole_model))


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("error")  # refused before any warning about changed args
def test_resume_refuses_a_different_model_or_a_weights_only_file(tmp_path):
    train(GPT(CFG), batch, lm_loss, steps=2, log_every=0, checkpoint=tmp_path / "run")
    bigger = GPT(dataclasses.replace(CFG, n_layers=2))
    with pytest.raises(ValueError, match="n_layers: checkpoint 1 vs model 2"):
        train(bigger, batch, lm_loss, steps=4, checkpoint=tmp_path / "run", resume=True)
    save_checkpoint(GPT(CFG), tmp_path / "plain")
    with pytest.raises(ValueError, match="holds no training state"):
        train(GPT(CFG), batch, lm_loss, steps=4, checkpoint=tmp_path / "plain",
              resume=True)
    with pytest.raises(ValueError, match="resume it with the same ema"):
        train(GPT(CFG), batch, lm_loss, steps=4, ema=0.9, checkpoint=tmp_path / "run",
              resume=True)


@pytest.mark.timeout(60)
def test_sequence_loss_boundaries():
    logits = torch.randn(2, 3, 5)
    with pytest.raises(ValueError, match=r"targets must be token ids in \[0, 5\)"):
        sequence_loss(logits, torch.tensor([[0, 1, 5], [0, 0, 0]]))
    with pytest.raises(ValueError, match="targets must be token ids"):
        sequence_loss(logits, torch.tensor([[0, 1, -1], [0, 0, 0]]))
    with pytest.raises(TypeError, match="targets must hold integer token ids"):
        sequence_loss(logits, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="label_smoothing"):
        sequence_loss(logits, torch.zeros(2, 3, dtype=torch.long), label_smoothing=-0.1)
    ignored = torch.full((2, 3), 7)  # no target counts: 0, with a gradient
    logits.requires_grad_()
    loss = sequence_loss(logits, ignored, ignore_id=7)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logits.grad, torch.zeros_like(logits))
    ok = sequence_loss(logits, torch.tensor([[0, 1, 7], [4, 7, 7]]), ignore_id=7)
    assert torch.isfinite(ok)


@pytest.mark.timeout(60)
def test_a_resume_that_does_not_fit_changes_nothing(tmp_path):
    "Saved with one weight frozen, resumed with it trainable: refused before any change."
    torch.manual_seed(0)
    frozen = GPT(CFG)
    frozen.decoder.norm.weight.requires_grad_(False)
    train(frozen, batch, lm_loss, steps=3, ema=0.9, log_every=0,
          checkpoint=tmp_path / "run")
    model = GPT(CFG)
    before = weights(model)
    with pytest.raises(ValueError, match="other trainable parameters"):
        train(model, batch, lm_loss, steps=6, ema=0.9, checkpoint=tmp_path / "run",
              resume=True)
    assert same(before, weights(model))


@pytest.mark.timeout(60)
def test_checkpoint_problems_are_found_before_training(tmp_path):
    calls = []

    def counting(m, b):
        calls.append(1)
        return lm_loss(m, b)
    with pytest.raises(ValueError, match="its folder does not exist"):
        train(GPT(CFG), batch, counting, steps=3, checkpoint=tmp_path / "no" / "run")
    with pytest.raises(TypeError, match="checkpoints hold one of"):
        train(nn.Linear(2, 2), lambda s: torch.zeros(1, 2),
              lambda m, b: m(b).sum(), steps=3, checkpoint=tmp_path / "run")
    assert calls == []


@pytest.mark.timeout(60)
def test_without_clipping_the_norm_is_still_watched():
    model = GPT(CFG)
    log = train(model, batch, lm_loss, steps=3, clip=None, log_every=0)
    assert log.steps == 3
    with pytest.raises(FloatingPointError):
        train(GPT(CFG), batch, nan_after(1), steps=3, clip=None, log_every=0)


@pytest.mark.timeout(60)
def test_train_refuses_a_checkpoint_of_a_lora_model_up_front(tmp_path):
    from minitransformer.lora import add_lora
    model = GPT(CFG)
    add_lora(model, ["q_proj", "v_proj"], r=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="save_adapter"):
        train(model, batch, lambda m, b: sequence_loss(m(b[0]), b[1]), steps=2,
              checkpoint=tmp_path / "run.safetensors", log_every=0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
