"""minitransformer.masks: future tokens never change the past, padding never changes real tokens
(over many seeded odd sizes), the decoder mask over a static cache, and the masks' refusals."""

import pytest
import torch

from minitransformer.layers import Decoder, LayerConfig
from minitransformer.masks import (
    causal_mask,
    combine_masks,
    decoder_mask,
    padding_mask,
    padding_mask_from_real,
)
from minitransformer.positions import RotaryEmbedding

from helpers import SEEDS, raises, sizes


def test_decoder_mask_over_a_static_cache():
    m = decoder_mask(1, 1, past=3, keys=6)
    assert m.tolist() == [[True, True, True, True, False, False]]
    m = decoder_mask(1, 2, past=2, keys=6)
    assert m.int().tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]]
    pad = torch.tensor([[False, True, True, True]])
    m = decoder_mask(1, 1, past=3, attention_mask=pad, keys=6)
    assert m.int().flatten().tolist() == [0, 1, 1, 1, 0, 0]
    with pytest.raises(ValueError, match="keys"):
        decoder_mask(1, 2, past=3, keys=4)


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


def test_mask_refusals_moved_to_folded_helpers():
    with raises(ValueError, "a causal mask needs 1 <= T <= S"):
        causal_mask(5, 3)
    pad = torch.ones(2, 1, 1, 3, dtype=torch.bool)
    with raises(ValueError, "do not broadcast together"):
        combine_masks(pad, torch.ones(2, 2, dtype=torch.bool))
    with raises(TypeError, "mask 1 must be boolean"):
        combine_masks(pad, pad.float())
    assert combine_masks(None, None) is None
    with raises(ValueError, "attention_mask must be (B, S) = (2, 4)"):
        padding_mask_from_real(torch.ones(2, 3, dtype=torch.bool), 2, 4, "attention_mask")
    with raises(ValueError, "not both"):
        decoder_mask(1, 2, 0, torch.ones(1, 2, dtype=torch.bool),
                     torch.ones(2, 2, dtype=torch.bool))
