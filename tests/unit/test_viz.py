"""minitransformer.viz: `attention_weights` returns every self-attention layer's weights (causal,
rows that sum to one, the hooks gone afterwards) and refuses what it cannot run;
`attention_heatmap` draws a (T, S) matrix with its labels and refuses other shapes."""
import pytest
import torch

from minitransformer.model import GPT, GPTConfig
from minitransformer.viz import attention_heatmap, attention_weights


def tiny_gpt(n_layers=2) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=20, max_len=16, d_model=16, n_heads=2,
                         n_layers=n_layers)).eval()


def test_attention_weights_are_one_causal_distribution_per_layer_head_and_query():
    ids = torch.randint(0, 20, (3, 7), generator=torch.Generator().manual_seed(1))
    model = tiny_gpt()
    w = attention_weights(model, ids)
    assert w.shape == (2, 3, 2, 7, 7)  # (layers, batch, heads, queries, keys)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 2, 7))
    future = torch.ones(7, 7, dtype=torch.bool).triu(1)
    assert w[..., future].abs().max() == 0, "a query attended to a later key"
    assert (w[..., ~future] > 0).all()
    assert not any(m._forward_hooks for m in model.modules()), "hooks left on the model"


def test_attention_weights_of_a_one_layer_model_reproduce_its_attention():
    "Layer 0's weights, applied to its values, give what its self-attention returns."
    model, ids = tiny_gpt(1), torch.tensor([[3, 1, 4, 1, 5]])
    w = attention_weights(model, ids)[0]  # (B, H, T, S)
    seen = {}
    attn = next(m for n, m in model.named_modules() if n.endswith("self_attn"))
    hook = attn.register_forward_hook(lambda m, a, kw, out: seen.update(a=a, kw=kw, out=out),
                                      with_kwargs=True)
    with torch.no_grad():
        model(ids)
    hook.remove()
    out, again = attn.forward_with_weights(*seen["a"], **seen["kw"])
    torch.testing.assert_close(again, w)
    torch.testing.assert_close(out, seen["out"])


def test_attention_weights_refuses_a_cache_and_a_model_without_self_attention():
    model = tiny_gpt()
    with pytest.raises(ValueError, match="cache"):
        attention_weights(model, torch.tensor([[1, 2]]), cache=model.make_cache(1, 8))
    with pytest.raises(ValueError, match="self_attn"):
        attention_weights(torch.nn.Linear(2, 2), torch.ones(1, 2))
    with pytest.raises(TypeError, match="model"):
        attention_weights("not a model", torch.ones(1, 2))


def test_attention_heatmap_draws_the_matrix_with_its_labels():
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    w = torch.tensor([[1.0, 0.0, 0.0], [0.25, 0.75, 0.0]])
    ax = attention_heatmap(w, ["a", "b"], ["x", "y", "z"], title="t")
    try:
        (image,) = ax.get_images()
        assert image.get_array().shape == (2, 3)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["x", "y", "z"]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]
        assert sorted(t.get_text() for t in ax.texts) == sorted(
            ["1.00", "0.00", "0.00", "0.25", "0.75", "0.00"])  # annotated: 6 cells <= 100
        assert ax.get_title() == "t"
    finally:
        plt.close(ax.figure)


def test_attention_heatmap_refuses_other_shapes_and_labels():
    with pytest.raises(ValueError, match="weights must be 2-D"):
        attention_heatmap(torch.ones(1, 2, 3))
    with pytest.raises(ValueError, match="query_labels has 1 labels"):
        attention_heatmap(torch.ones(2, 3), ["a"])
    with pytest.raises(ValueError, match="key_labels has 2 labels"):
        attention_heatmap(torch.ones(2, 3), None, ["a", "b"])
