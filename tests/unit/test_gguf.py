"""minitransformer.gguf without the reference libraries: the rules that unpermute Llama's
queries and keys per head, and paths that are not models."""

import importlib.util
from pathlib import Path

import pytest
import torch

from minitransformer.gguf import gguf_llama_rules, load_pretrained


def test_paths_that_are_not_models_raise(monkeypatch, tmp_path):
    hub = pytest.importorskip("huggingface_hub")
    def no_download(**kwargs):
        raise AssertionError(f"the Hub was asked for {kwargs}")
    monkeypatch.setattr(hub, "snapshot_download", no_download)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"\0")
    names = [tmp_path / "missing", "missing", "a/b/c", "weights.bin"]
    if importlib.util.find_spec("gguf") is not None:  # a .gguf path goes to read_gguf
        names.append(Path("owner") / "missing.gguf")
    for name in names:
        with pytest.raises(FileNotFoundError):
            load_pretrained(name)
    with pytest.raises(TypeError, match="name"):
        load_pretrained(3)


def test_gguf_rules_unpermute_queries_and_keys_per_head():
    "llama.cpp's permutation, undone with each projection's own head count."
    rules = gguf_llama_rules(1, n_heads=6, n_kv_heads=2, tied=True)
    def permute(w, n):
        return w.reshape(n, 2, w.shape[0] // n // 2, -1).swapaxes(1, 2).reshape(w.shape)
    for ours, n, rows in (("q_proj", 6, 48), ("k_proj", 2, 16)):
        src, undo = rules[f"decoder.layers.0.self_attn.qkv.{ours}.weight"]
        w = torch.randn(rows, 48)
        assert torch.equal(undo(permute(w, n)), w), f"{ours} ({src}) not restored"
    assert rules["head.weight"][0] == "token_embd.weight"
