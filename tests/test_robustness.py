"""The boundaries of issue 14, one test per failure: training never hangs or runs uphill,
checkpoints never lose data, configs and entry points refuse bad values clearly."""
import dataclasses
import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from minitransformer.data import char_windows
from minitransformer.generation import generate, sample_next
from minitransformer.model import GPT, GPTConfig, Transformer, TransformerConfig
import minitransformer.checkpoints as checkpoints
from minitransformer.checkpoints import FORMAT, load_checkpoint, save_checkpoint
from minitransformer.training import sequence_loss, train

pytestmark = pytest.mark.timeout(60)

CFG = GPTConfig(vocab_size=16, max_len=24, d_model=32, n_heads=2, n_layers=1)
CYCLE = torch.arange(4, 16).repeat(3)


def batch(step):
    g = torch.Generator().manual_seed(step)
    idx = torch.randint(0, 12, (8,), generator=g)[:, None] + torch.arange(21)
    return CYCLE[idx[:, :-1]], CYCLE[idx[:, 1:]]


def lm_loss(m, b):
    return sequence_loss(m(b[0]), b[1])


def weights(model):
    return [t.detach().clone() for t in model.state_dict().values()]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# --- train ---------------------------------------------------------------------------

@pytest.mark.timeout(10)
@pytest.mark.parametrize("budget", [dict(steps=0), dict(max_seconds=0),
                                    dict(max_seconds=0.0, steps=5)])
def test_an_empty_budget_returns_at_once(budget):
    log = train(GPT(CFG), batch, lm_loss, **budget)
    assert log.steps == 0 and log.losses == []


@pytest.mark.timeout(10)
@pytest.mark.parametrize("budget, name", [
    (dict(steps=-1), "steps"), (dict(max_seconds=-1.0), "max_seconds"),
    (dict(max_seconds=float("nan")), "max_seconds"), (dict(steps=2.5), "steps"),
    (dict(steps=True), "steps"), (dict(max_seconds=float("inf")), "max_seconds")])
def test_a_bad_budget_raises(budget, name):
    with pytest.raises(ValueError, match=name):
        train(GPT(CFG), batch, lm_loss, **budget)


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


def test_a_nan_loss_stops_the_run_without_touching_weights_or_average():
    torch.manual_seed(0)
    model, seen = GPT(CFG), []
    with pytest.raises(FloatingPointError, match="step 4: the loss is nan"):
        train(model, batch, nan_after(3), steps=10, ema=0.9, log_every=0,
              eval_fn=lambda m: seen.append(weights(m)) or {}, eval_every=1)
    assert same(weights(model), seen[-2])  # live weights after step 3 (then the average)
    assert all(torch.isfinite(t).all() for t in weights(model))


def test_a_nan_gradient_is_caught_too():
    model = GPT(CFG)

    def loss_fn(m, b):  # a finite loss whose gradient is NaN: sqrt'(0) * 0 ... = nan
        return lm_loss(m, b) + (m.head.weight.sum() * 0).sqrt()
    before = weights(model)
    with pytest.raises(FloatingPointError, match="gradient norm nan"):
        train(model, batch, loss_fn, steps=3, log_every=0)
    assert same(before, weights(model))


def test_skipping_non_finite_steps_counts_them_and_keeps_everything_finite():
    model = GPT(CFG)
    log = train(model, batch, nan_after(3), steps=8, ema=0.9, log_every=0,
                on_nonfinite="skip")
    assert (log.steps, log.skipped) == (8, 5)
    assert all(torch.isfinite(t).all() for t in weights(model))
    every = nan_after(0)  # every step bad: the run still ends
    log = train(GPT(CFG), batch, every, steps=4, log_every=0, on_nonfinite="skip")
    assert log.skipped == 4


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


def test_loss_fn_must_return_a_scalar_with_grad():
    with pytest.raises(TypeError, match="loss_fn must return a scalar tensor"):
        train(GPT(CFG), batch, lambda m, b: m(b[0]).sum(-1), steps=1)
    with pytest.raises(TypeError, match="loss_fn must return a scalar tensor"):
        train(GPT(CFG), batch, lambda m, b: torch.tensor(1.0), steps=1)


# --- resumable training --------------------------------------------------------------

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


# --- checkpoints ---------------------------------------------------------------------

def test_a_failed_save_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    save_checkpoint(GPT(CFG), path)
    good = path.read_bytes()
    real = checkpoints.save_file

    def half_then_fail(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:
            f.truncate(100)  # half-written
        raise KeyboardInterrupt  # Ctrl-C before the write completes
    monkeypatch.setattr(checkpoints, "save_file", half_then_fail)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(GPT(CFG), path)
    assert path.read_bytes() == good
    assert os.listdir(tmp_path) == ["m.safetensors"]  # no temporary file left behind


def test_an_unsaveable_model_leaves_no_file(tmp_path):
    with pytest.raises(TypeError, match="model must be one of"):
        save_checkpoint(nn.Linear(2, 2), tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_a_config_with_numpy_scalars_round_trips(tmp_path):
    cfg = GPTConfig(vocab_size=np.int64(16), max_len=24, d_model=32, n_heads=2,
                    n_layers=1, dropout=np.float64(0.1), norm_eps=np.float32(1e-5))
    assert type(cfg.vocab_size) is int and type(cfg.dropout) is float
    assert type(cfg.norm_eps) is float
    model = GPT(cfg)
    save_checkpoint(model, tmp_path / "m")
    assert load_checkpoint(tmp_path / "m").config == cfg


def test_a_failed_load_leaves_the_model_untouched(tmp_path):
    save_checkpoint(GPT(CFG), tmp_path / "m")
    for other in (GPT(dataclasses.replace(CFG, d_model=16)), Transformer(
            TransformerConfig(src_vocab_size=5, tgt_vocab_size=5, d_model=16))):
        before = weights(other)
        with pytest.raises(ValueError):
            load_checkpoint(tmp_path / "m", other)
        assert same(before, weights(other))
    changed = GPT(CFG)  # same config, but a layer replaced after it was built
    changed.head = nn.Linear(32, 17, bias=False)
    before = weights(changed)
    with pytest.raises(ValueError, match="tensors differ"):
        load_checkpoint(tmp_path / "m", changed)
    assert same(before, weights(changed))


@pytest.mark.parametrize("cut", [0, 1, 7, 100, -1])
def test_damaged_files_raise_value_errors_naming_the_path(tmp_path, cut):
    save_checkpoint(GPT(CFG), tmp_path / "m")
    data = (tmp_path / "m").read_bytes()
    bad = tmp_path / "bad"
    bad.write_bytes(data[:cut] if cut >= 0 else data[:len(data) // 2])
    with pytest.raises(ValueError, match=str(bad)):
        load_checkpoint(bad)


def test_foreign_files_raise_value_errors_naming_the_path(tmp_path):
    cases = {"text": b"hello" * 50, "zip": None, "other": None}
    (tmp_path / "text").write_bytes(cases["text"])
    torch.save({"weights": torch.zeros(3)}, tmp_path / "zip")
    save_file({"w": torch.zeros(3)}, tmp_path / "other", metadata={"format": "x"})
    for name in cases:
        with pytest.raises(ValueError, match=str(tmp_path / name)):
            load_checkpoint(tmp_path / name)
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing")


@pytest.mark.timeout(10)
def test_a_huge_claimed_vocabulary_is_refused_before_allocating(tmp_path):
    model = GPT(CFG)
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight"}
    config = dataclasses.asdict(CFG) | {"vocab_size": 10**12}  # 128 TB of float32
    save_file(sd, tmp_path / "m", metadata={
        "format": FORMAT, "model": "GPT", "config": json.dumps(config),
        "aliases": json.dumps({"head.weight": "embed.tok.weight"})})
    with pytest.raises(ValueError, match="the config implies"):
        load_checkpoint(tmp_path / "m")


def test_a_tensor_of_the_wrong_kind_is_refused(tmp_path):
    model = GPT(CFG)
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight"}
    sd["embed.tok.weight"] = sd["embed.tok.weight"].long()
    save_file(sd, tmp_path / "m", metadata={
        "format": FORMAT, "model": "GPT", "config": json.dumps(dataclasses.asdict(CFG)),
        "aliases": json.dumps({"head.weight": "embed.tok.weight"})})
    with pytest.raises(ValueError, match="embed.tok.weight has dtype I64"):
        load_checkpoint(tmp_path / "m")


def test_checkpoints_keep_bfloat16_and_tied_weights(tmp_path):
    model = GPT(CFG).to(torch.bfloat16)
    save_checkpoint(model, tmp_path / "m")
    again = load_checkpoint(tmp_path / "m", GPT(CFG).to(torch.bfloat16))
    assert same(weights(again), weights(model))
    assert again.head.weight is again.embed.tok.weight


# --- configs and entry points ---------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("n_layers", -1), ("n_layers", 0), ("d_ff", 0), ("rope_base", 0.0),
    ("rope_base", float("nan")), ("norm_eps", float("inf")), ("dropout", 1.0),
    ("max_len", 2.0), ("pad_id", 16), ("pad_id", -1), ("bias", "yes"),
    ("activation", "tanh"), ("position_encoding", "alibi"), ("tie_weights", None)])
def test_config_fields_are_all_checked(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(CFG, **{field: value})


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


def test_sampling_refuses_a_nan_temperature():
    with pytest.raises(ValueError, match="temperature"):
        sample_next(torch.randn(2, 5), temperature=float("nan"))


def test_char_windows_draws_every_window_and_the_single_one():
    data = torch.arange(12)
    x, y = char_windows(data, 8, 4000, torch.Generator().manual_seed(0))
    assert x[:, 0].unique().tolist() == [0, 1, 2, 3]  # start 3 ends at data[11]
    x, y = char_windows(torch.arange(9), 8, 3)  # exactly one window fits
    assert x.tolist() == [list(range(8))] * 3 and y[:, -1].tolist() == [8] * 3


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


def test_checkpoints_get_the_usual_file_mode(tmp_path):
    umask = os.umask(0o022)
    try:
        save_checkpoint(GPT(CFG), tmp_path / "m")
    finally:
        os.umask(umask)
    assert (tmp_path / "m").stat().st_mode & 0o777 == 0o644


def test_a_zip_signature_inside_the_tensors_does_not_confuse_the_loader(tmp_path):
    model = GPT(CFG)
    marker = torch.tensor(list(b"PK\x05\x06") + [0] * 18, dtype=torch.uint8)
    save_checkpoint(model, tmp_path / "m", {"train/rng/cpu": marker})
    assert same(weights(load_checkpoint(tmp_path / "m")), weights(model))


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


def test_a_crafted_alias_is_refused_before_the_model_changes(tmp_path):
    model = GPT(CFG)
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight"}
    save_file(sd, tmp_path / "m", metadata={
        "format": FORMAT, "model": "GPT", "config": json.dumps(dataclasses.asdict(CFG)),
        "aliases": json.dumps({"head.weight": "decoder.norm.weight"})})
    target = GPT(CFG)
    before = weights(target)
    with pytest.raises(ValueError, match="aliases .*'head.weight'.* do not name"):
        load_checkpoint(tmp_path / "m", target)
    assert same(before, weights(target))


def test_without_clipping_the_norm_is_still_watched():
    model = GPT(CFG)
    log = train(model, batch, lm_loss, steps=3, clip=None, log_every=0)
    assert log.steps == 3
    with pytest.raises(FloatingPointError):
        train(GPT(CFG), batch, nan_after(1), steps=3, clip=None, log_every=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("encoding", ["sinusoidal", "rotary", "learned"])
def test_models_run_in_half_precision_with_computed_positions(dtype, encoding):
    "Positions are computed (no table to cast): they follow the model's dtype."
    from minitransformer.model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=30, max_len=16, d_model=32, n_heads=2, n_layers=1,
                          position_encoding=encoding)).eval()
    ids = torch.randint(0, 30, (2, 7))
    with torch.no_grad():
        full, half = model(ids), model.to(dtype)(ids)
    assert half.dtype == dtype
    assert (half.float() - full).abs().max() < 0.1


def test_model_entry_points_check_ids_then_prefix_then_length():
    "Issue 27 review: ids before the prefix, a wrong dtype a TypeError, P + T in words."
    from minitransformer.model import (EncoderClassifier, EncoderClassifierConfig,
                                       TextEncoder, TextEncoderConfig)
    enc = TextEncoder(TextEncoderConfig(vocab_size=10, max_len=8, d_model=16, n_heads=2,
                                        n_layers=1))
    prefix = torch.zeros(1, 2, 16)
    with pytest.raises(TypeError, match="ids must be a torch.Tensor, got NoneType"):
        enc(None, prefix=prefix)
    with pytest.raises(ValueError, match=r"2 prefix vectors \+ 7 tokens exceed the "
                                         "model's max_len 8"):
        enc(torch.ones(1, 7, dtype=torch.long), prefix=prefix)
    with pytest.raises(ValueError, match="prefix must be"):
        enc(torch.ones(1, 3, dtype=torch.long), prefix=torch.zeros(1, 2, 8))
    clf = EncoderClassifier(EncoderClassifierConfig(vocab_size=10, n_classes=2, d_model=16,
                                                    n_heads=2, n_layers=1, max_len=8))
    tr = Transformer(TransformerConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=16,
                                       n_heads=2, max_len=8))
    calls = [GPT(CFG), enc, clf, tr.encode]
    for dtype in (torch.bool, torch.complex64, torch.float32):
        for call in calls:
            with pytest.raises(TypeError, match=rf"(ids|src) .*dtype {dtype}"):
                call(torch.ones(2, 3, dtype=dtype))


def test_make_cache_without_memory_is_a_type_error_naming_memory():
    tr = Transformer(TransformerConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=16,
                                       n_heads=2, max_len=8))
    with pytest.raises(TypeError, match="memory must be a torch.Tensor, got NoneType"):
        tr.make_cache(None)
    with pytest.raises(ValueError, match=r"memory must be the encoder output \(B, S, C\)"):
        tr.make_cache(torch.zeros(2, 3, 8))


def test_train_refuses_a_checkpoint_of_a_lora_model_up_front(tmp_path):
    from minitransformer.lora import add_lora
    model = GPT(CFG)
    add_lora(model, ["q_proj", "v_proj"], r=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="save_adapter"):
        train(model, batch, lambda m, b: sequence_loss(m(b[0]), b[1]), steps=2,
              checkpoint=tmp_path / "run.safetensors", log_every=0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_load_checkpoint_keeps_the_stored_dtype(tmp_path):
    model = GPT(CFG).to(torch.bfloat16)
    save_checkpoint(model, tmp_path / "bf16.safetensors")
    assert next(load_checkpoint(tmp_path / "bf16.safetensors").parameters()).dtype == \
        torch.bfloat16
    as32 = load_checkpoint(tmp_path / "bf16.safetensors", dtype=torch.float32)
    assert next(as32.parameters()).dtype == torch.float32
    with pytest.raises(TypeError, match="dtype"):
        load_checkpoint(tmp_path / "bf16.safetensors", dtype=torch.int64)


def test_vocabulary_construction_is_linear():
    import time
    from minitransformer.embeddings import Vocabulary
    tokens = [f"t{i}" for i in range(20_000)] * 2
    start = time.perf_counter()
    vocab = Vocabulary(tokens)
    assert len(vocab) == 20_004 and vocab.itos[4:6] == ["t0", "t1"]
    assert time.perf_counter() - start < 0.5  # was 2.4 s (a list searched per token)


def test_read_bandwidth_refuses_more_than_memory_before_allocating():
    from minitransformer.generation import read_bandwidth
    with pytest.raises(ValueError, match="n_bytes"):
        read_bandwidth(n_bytes=10**13)
