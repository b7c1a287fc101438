"""minitransformer.attention: scaled dot-product attention's two paths agree on random shapes,
masks and non-finite inputs, the bottom-right `is_causal` rule, grouped heads, and the caller's
mistakes it names."""

import pytest
import torch
import torch.nn.functional as F

from minitransformer import attention
from minitransformer.attention import attention_with_weights, scaled_dot_product_attention
from minitransformer.masks import causal_mask

from helpers import SEEDS, sizes


# ------------------------------------------------------------------ is_causal
@pytest.mark.parametrize("T,S", [(6, 6), (2, 6), (1, 5), (7, 4)])
@pytest.mark.parametrize("gqa", [False, True])
def test_is_causal_equals_the_bottom_right_mask(T, S, gqa):
    g = torch.Generator().manual_seed(T * 10 + S)
    H_kv = 2 if gqa else 4
    q = torch.randn(2, 4, T, 8, generator=g, requires_grad=True)
    k = torch.randn(2, H_kv, S, 8, generator=g, requires_grad=True)
    v = torch.randn(2, H_kv, S, 8, generator=g, requires_grad=True)
    mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)  # the rule, T > S included
    fast = scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    slow = scaled_dot_product_attention(q, k, v, mask=mask, enable_gqa=gqa)
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-6)
    grads = torch.autograd.grad(fast.square().sum(), (q, k, v))
    refs = torch.autograd.grad(slow.square().sum(), (q, k, v))
    for a, b in zip(grads, refs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    if not gqa:
        explicit, weights = attention_with_weights(q, k, v, is_causal=True)
        torch.testing.assert_close(explicit, slow, atol=1e-6, rtol=1e-6)
        assert not weights.masked_select(~mask).any(), "a later key got weight"


def test_is_causal_combines_with_a_mask():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 2, 5, 4, generator=g) for _ in range(3))
    pad = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1], [0, 0, 0, 1, 1]]).bool()
    pad = pad[:, None, None, :]
    both = pad & causal_mask(5)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, pad, is_causal=True),
                               scaled_dot_product_attention(q, k, v, both))
    torch.testing.assert_close(attention_with_weights(q, k, v, pad, is_causal=True)[0],
                               attention_with_weights(q, k, v, both)[0])


def test_is_causal_is_a_flag():
    q = torch.randn(1, 1, 2, 4)
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="is_causal"):
            scaled_dot_product_attention(q, q, q, is_causal=bad)


def test_grouped_heads_must_divide_the_query_heads():
    q, k = torch.randn(1, 6, 3, 4), torch.randn(1, 4, 3, 4)
    with pytest.raises(ValueError, match="dividing the queries' 6"):
        attention.scaled_dot_product_attention(q, k, k, enable_gqa=True)
    with pytest.raises(ValueError, match="do not broadcast"):  # without it: as batch dims
        attention.scaled_dot_product_attention(q, k, k)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.reduced_precision
def test_fully_blocked_rows_are_zero_not_nan(seed, dtype):
    g, B, T, H, D = sizes(seed)
    S = T + 1
    q = torch.randn(B, H, T, D, generator=g).to(dtype)
    k, v = torch.randn(B, H, S, D, generator=g).to(dtype), torch.randn(B, H, S, D, generator=g).to(dtype)
    mask = torch.rand(B, 1, T, S, generator=g) < 0.5
    mask[:, :, 0] = False  # every sequence's first query sees nothing
    for out in (attention_with_weights(q, k, v, mask)[0], scaled_dot_product_attention(q, k, v, mask)):
        assert not out.isnan().any()
        assert (out[:, :, 0] == 0).all()
        allowed = mask.any(-1, keepdim=True).expand(B, H, T, 1)
        ref = torch.softmax((q.float() @ k.float().transpose(-2, -1)) / D ** 0.5
                            + torch.zeros(B, 1, T, S).masked_fill(~mask, float("-inf")), -1) @ v.float()
        ref = torch.where(allowed, ref, torch.zeros_like(ref))
        # bfloat16: the scores, the weights and the output each rounded (2^-9 of values up to
        # about 2), a few steps of any kernel's order on top
        assert torch.allclose(out.float(), ref, atol=1e-5 if dtype == torch.float32 else 5e-2)


def test_both_attention_paths_agree_on_random_shapes_and_masks():
    g = torch.Generator().manual_seed(1)
    for trial in range(40):
        B, H = torch.randint(1, 4, (2,), generator=g).tolist()
        T, S, D, Dv = torch.randint(1, 12, (4,), generator=g).tolist()
        q = torch.randn(B, H, T, D, generator=g)
        k, v = torch.randn(B, H, S, D, generator=g), torch.randn(B, H, S, Dv, generator=g)
        mask_shape = [(B, H, T, S), (B, 1, 1, S), (T, S), (B, 1, T, S)][trial % 4]
        mask = None if trial % 5 == 0 else torch.rand(mask_shape, generator=g) < 0.7
        scale = None if trial % 3 else 0.3
        slow, _ = attention_with_weights(q, k, v, mask, scale=scale)
        fast = scaled_dot_product_attention(q, k, v, mask, scale=scale)
        assert not fast.isnan().any() and not slow.isnan().any(), f"trial {trial}: NaN"
        torch.testing.assert_close(fast, slow, atol=1e-6, rtol=0,
                                   msg=lambda m: f"trial {trial}: {m}")


def test_non_finite_inputs_follow_one_rule_on_both_paths():
    "NaN in the same places on both paths, the same values elsewhere, zeros where blind."
    g = torch.Generator().manual_seed(2)
    for trial in range(400):
        T, S = torch.randint(1, 5, (2,), generator=g).tolist()
        qkv = [torch.randn(2, n, d, generator=g) for n, d in ((T, 3), (S, 3), (S, 2))]
        for t in qkv:  # about one entry in ten becomes NaN, +inf or -inf
            where = torch.rand(t.shape, generator=g) < 0.1
            pick = torch.randint(0, 3, t.shape, generator=g)
            odd = torch.tensor([float("nan"), float("inf"), -float("inf")])[pick]
            t[where] = odd[where]
        m = torch.rand(2, T, S, generator=g) < 0.7 if trial % 2 else None
        slow = attention_with_weights(*qkv, m)[0]
        fast = scaled_dot_product_attention(*qkv, m)
        assert torch.equal(slow.isnan(), fast.isnan()), f"trial {trial}: NaN differs"
        torch.testing.assert_close(slow.nan_to_num(0.0), fast.nan_to_num(0.0),
                                   atol=1e-5, rtol=0)
        if m is not None:
            blind = ~m.any(-1)  # queries that may see no key: zeros
            assert (fast[blind] == 0).all(), f"trial {trial}: a blind query is not 0"


def test_a_masked_infinite_score_becomes_nan():
    "Masking adds -inf: a masked +inf score gives +inf - inf = NaN, as the text says."
    q, v = torch.ones(1, 1), torch.ones(2, 1)
    k = torch.tensor([[float("inf")], [1.0]])
    mask = torch.tensor([[False, True]])
    out, _ = attention_with_weights(q, k, v, mask)
    assert out.isnan().all()


@pytest.fixture
def qkv():
    return torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)


def test_attention_names_a_callers_mistakes(qkv):
    q, k, v = qkv
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    with pytest.raises(TypeError, match=r"mask must be boolean \(True = may attend\)"):
        scaled_dot_product_attention(q, k, v, mask.float())
    bad_mask = torch.ones(3, 4, dtype=torch.bool)  # (T, S) would be (3, 5)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 4\) does not broadcast to "
                                         r"the attention weights' shape \(2, 3, 5\)"):
        scaled_dot_product_attention(q, k, v, bad_mask)
    with pytest.raises(ValueError, match=r"keys \(2, 4, 4\) and values \(2, 5, 6\)"):
        attention_with_weights(q, k[:, :4], v)
    with pytest.raises(ValueError, match=r"dropout_p must be a number in \[0, 1\)"):
        attention_with_weights(q, k, v, dropout_p=1.0)


def test_our_is_causal_is_bottom_right_and_torchs_is_top_left():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 2, 5), torch.randn(2, 3, 6, 5), torch.randn(2, 3, 6, 5)
    bottom_right, top_left = causal_mask(2, 6), torch.ones(2, 6).tril().bool()
    assert torch.equal(bottom_right, torch.ones(2, 6).tril(4).bool())
    ours = scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(ours, scaled_dot_product_attention(q, k, v, bottom_right))
    explicit, _ = attention_with_weights(q, k, v, is_causal=True)
    torch.testing.assert_close(explicit, ours, atol=1e-6, rtol=1e-5)
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(theirs, scaled_dot_product_attention(q, k, v, top_left))
    assert not torch.allclose(ours, theirs), "with T < S the two alignments differ"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_what_the_cpu_kernels_return_for_a_query_that_may_see_nothing(dtype):
    """PyTorch's CPU kernels (math and flash) give a fully masked query zeros when the
    inputs are finite, but NaN when a blocked key or value is NaN; so `attend` keeps
    its zeroing, which makes the row zeros whatever the inputs, on every backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from minitransformer.attention import attend
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=g, dtype=dtype) for _ in range(3))
    mask = torch.rand(2, 1, 5, 5, generator=g) > 0.4
    mask[..., 0, :] = False  # query 0 of every sequence may see nothing
    v_nan = v.clone()
    v_nan[..., 1, :] = float("nan")  # a blocked value
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
        with sdpa_kernel([backend]):
            finite = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask)
            poisoned = torch.nn.functional.scaled_dot_product_attention(
                q, k, v_nan, attn_mask=mask)
            ours = attend(q, k, v_nan, mask)
        assert torch.equal(finite[..., 0, :], torch.zeros_like(finite[..., 0, :]))
        assert poisoned[..., 0, :].isnan().all(), backend  # (if this changes: measure)
        assert torch.equal(ours[..., 0, :], torch.zeros_like(ours[..., 0, :]))
