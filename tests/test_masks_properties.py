"""Properties of masks and positions over many seeded random sizes (odd on purpose).

The chapters show each property once; these run them across shapes, dtypes and mask layouts."""
import pytest
import torch
from torch import nn

from minitransformer.attention import attention_with_weights, scaled_dot_product_attention
from minitransformer.layers import Decoder, LayerConfig
from minitransformer.masks import causal_mask, combine_masks, padding_mask, padding_mask_from_ids, to_torch_mask
from minitransformer.multihead import MultiHeadAttention
from minitransformer.positions import RotaryEmbedding

SEEDS = range(8)


def sizes(seed):
    g = torch.Generator().manual_seed(seed)
    H = int(torch.randint(1, 5, (1,), generator=g))
    D = int(torch.randint(1, 4, (1,), generator=g)) * 2 + 1  # odd head width: 3, 5, 7
    B = int(torch.randint(1, 4, (1,), generator=g))
    T = int(torch.randint(2, 12, (1,), generator=g))
    return g, B, T, H, D


def stack(C, H, rotary=False):
    "Two pre-norm decoder-only blocks (the package's own Decoder stack), optionally rotary."
    rope = RotaryEmbedding(C // H, max_len=64) if rotary else None
    cfg = LayerConfig(d_model=C, n_heads=H, d_ff=2 * C + 1, activation="gelu", norm_first=True)
    return Decoder(cfg, 2, cross_attention=False, rotary=rope).eval()


def run(model, x, mask):
    return model(x, mask=mask)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("rotary", [False, True])
def test_future_tokens_never_change_the_past(seed, rotary):
    g, B, T, H, D = sizes(seed)
    D += rotary  # rotary embeddings need an even head width
    torch.manual_seed(seed)
    model = stack(H * D, H, rotary)
    x = torch.randn(B, T, H * D, generator=g)
    t = int(torch.randint(1, T, (1,), generator=g))
    x2 = x.clone()
    x2[:, t:] = torch.randn(B, T - t, H * D, generator=g)
    with torch.no_grad():
        a, b = run(model, x, causal_mask(T)), run(model, x2, causal_mask(T))
    assert torch.allclose(a[:, :t], b[:, :t], atol=1e-5), f"positions < {t} changed (B={B} T={T} H={H} D={D})"
    assert not torch.allclose(a[:, t:], b[:, t:], atol=1e-5), "positions >= t should change (the test can fail)"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("causal", [False, True])
def test_padding_never_changes_real_tokens(seed, causal):
    g, B, T, H, D = sizes(seed)
    torch.manual_seed(seed)
    model = stack(H * D, H)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    x = torch.randn(B, T, H * D, generator=g)
    extra = int(torch.randint(1, 5, (1,), generator=g))
    x_long = torch.cat([x, 50 * torch.randn(B, extra, H * D, generator=g)], 1)
    for b in range(B):  # the tail beyond each length is padding too: scramble it
        x_long[b, lengths[b]:] = 50 * torch.randn(T + extra - int(lengths[b]), H * D, generator=g)

    def mask(S):
        return combine_masks(padding_mask(lengths, S), causal_mask(S) if causal else None)

    with torch.no_grad():
        short, long = run(model, x, mask(T)), run(model, x_long, mask(T + extra))
    for b in range(B):
        n = int(lengths[b])
        assert torch.allclose(short[b, :n], long[b, :n], atol=1e-4), f"sequence {b} (length {n}) changed"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
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
        assert torch.allclose(out.float(), ref, atol=1e-5 if dtype == torch.float32 else 5e-2)


@pytest.mark.parametrize("seed", SEEDS)
def test_matches_torch_multihead_with_converted_masks(seed):
    g, B, T, H, D = sizes(seed)
    C = H * D
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(C, H, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(ref)
    ids = torch.randint(1, 9, (B, T), generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    ids[torch.arange(T)[None] >= lengths[:, None]] = 0  # right padding with pad id 0
    pad = padding_mask_from_ids(ids, pad_id=0)
    x = torch.randn(B, T, C, generator=g)
    with torch.no_grad():
        y_ref, w_ref = ref(x, x, x, attn_mask=to_torch_mask(causal_mask(T)), key_padding_mask=to_torch_mask(pad[:, 0, 0]),
                           need_weights=True, average_attn_weights=False)
        y, w = ours.forward_with_weights(x, mask=combine_masks(pad, causal_mask(T)))
    assert torch.allclose(y, y_ref, atol=1e-5) and torch.allclose(w, w_ref, atol=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_properties(seed, interleaved):
    g, B, T, H, D = sizes(seed)
    D = D + 1  # even
    rope = RotaryEmbedding(D, max_len=300, interleaved=interleaved)
    q, k = torch.randn(B, H, T, D, generator=g), torch.randn(B, H, T, D, generator=g)
    pos = torch.randint(0, 150, (T,), generator=g)
    shift = int(torch.randint(1, 150, (1,), generator=g))
    assert torch.allclose(rope(q, pos).norm(dim=-1), q.norm(dim=-1), atol=1e-5)
    assert torch.equal(rope(q, torch.zeros(T, dtype=torch.long)), q)
    s1 = rope(q, pos) @ rope(k, pos).transpose(-2, -1)
    s2 = rope(q, pos + shift) @ rope(k, pos + shift).transpose(-2, -1)
    assert torch.allclose(s1, s2, atol=1e-4), "scores must depend on relative positions only"
    if interleaved:
        halves = RotaryEmbedding(D, max_len=300)
        perm = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])
        assert torch.allclose(halves(q[..., perm], pos), rope(q, pos)[..., perm], atol=1e-6)
