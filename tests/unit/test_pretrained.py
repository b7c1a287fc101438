"""minitransformer.pretrained without the reference libraries: a Llama config's rope theta as
transformers 4 wrote it; a sharded folder's files each opened once."""

import torch

from minitransformer.pretrained import llama_config


def test_llama_config_reads_transformers_4_rope_theta():
    "Before transformers 5, config.json kept rope_theta at the top level."
    cfg = dict(model_type="llama", vocab_size=10, hidden_size=8, num_attention_heads=2,
               num_hidden_layers=1, intermediate_size=16, rms_norm_eps=1e-6,
               max_position_embeddings=32, rope_theta=5e5, rope_scaling=None)
    c = llama_config(cfg)
    assert (c.rope_base, c.n_kv_heads, c.tie_weights) == (5e5, 2, False), c


def test_a_sharded_folder_is_opened_once_a_file(tmp_path, monkeypatch):
    "The headers give the shapes; the tensors come from the same open files, not reopened each."
    import safetensors
    from safetensors.torch import save_file
    from minitransformer.pretrained import _safetensors
    for i in range(2):
        save_file({f"w{i}.{j}": torch.full((2, 3), float(j)) for j in range(3)},
                  str(tmp_path / f"model-0000{i + 1}-of-00002.safetensors"))
    opened = []
    real = safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open",
                        lambda f, *a, **k: opened.append(f) or real(f, *a, **k))
    tensor, shapes = _safetensors(tmp_path)
    assert shapes == {f"w{i}.{j}": (2, 3) for i in range(2) for j in range(3)}
    assert all(torch.equal(tensor(k), torch.full((2, 3), float(k[-1]))) for k in shapes)
    assert len(opened) == 2, opened
