"""minitransformer.pretrained without the reference libraries: a Llama config's rope theta as
transformers 4 wrote it."""

from minitransformer.pretrained import llama_config


def test_llama_config_reads_transformers_4_rope_theta():
    "Before transformers 5, config.json kept rope_theta at the top level."
    cfg = dict(model_type="llama", vocab_size=10, hidden_size=8, num_attention_heads=2,
               num_hidden_layers=1, intermediate_size=16, rms_norm_eps=1e-6,
               max_position_embeddings=32, rope_theta=5e5, rope_scaling=None)
    c = llama_config(cfg)
    assert (c.rope_base, c.n_kv_heads, c.tie_weights) == (5e5, 2, False), c
