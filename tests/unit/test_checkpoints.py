"""minitransformer.checkpoints: a checkpoint never loses data (a failed save keeps the previous
file, a failed load leaves the model untouched), damaged and foreign files are refused by path,
and dtypes, tied weights and file modes survive the round trip."""

import dataclasses
import json
import os

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import minitransformer.checkpoints as checkpoints
from minitransformer.checkpoints import FORMAT, load_checkpoint, save_checkpoint
from minitransformer.model import GPT, GPTConfig, Transformer, TransformerConfig

from helpers import CFG, same, weights

pytestmark = pytest.mark.timeout(60)


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


def test_load_checkpoint_keeps_the_stored_dtype(tmp_path):
    model = GPT(CFG).to(torch.bfloat16)
    save_checkpoint(model, tmp_path / "bf16.safetensors")
    assert next(load_checkpoint(tmp_path / "bf16.safetensors").parameters()).dtype == \
        torch.bfloat16
    as32 = load_checkpoint(tmp_path / "bf16.safetensors", dtype=torch.float32)
    assert next(as32.parameters()).dtype == torch.float32
    with pytest.raises(TypeError, match="dtype"):
        load_checkpoint(tmp_path / "bf16.safetensors", dtype=torch.int64)
