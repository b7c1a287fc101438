"""minitransformer.positions: rotary embedding's properties and tables (exactly the pairs
formula), and the refusals of the position modules."""

import pytest
import torch

from minitransformer.positions import RotaryEmbedding, check_positions

from helpers import SEEDS, raises, sizes


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


def test_rotary_and_positions_refusals():
    with raises(ValueError, "head_dim must be even, got 7"):
        RotaryEmbedding(7)
    with raises(TypeError, "positions must be an integer tensor"):
        check_positions(torch.zeros(3), 8)
    with raises(ValueError, "positions must lie in [0, 8) (max_len=8), got values from 0 "
                            "to 9"):
        check_positions(torch.arange(10), 8)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_tables_rotate_exactly_as_the_pairs_formula(interleaved):
    "x·cos + swap(x)·(signed sin) is bit-equal to rotating each pair by its angle."
    rope = RotaryEmbedding(8, interleaved=interleaved)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, generator=g)
    positions = torch.randint(0, 4096, (2, 5), generator=g)
    theta = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    angles = positions.double()[..., None] * theta
    cos, sin = angles.cos().float()[:, None], angles.sin().float()[:, None]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        ref = torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)
    else:
        a, b = x.chunk(2, -1)
        ref = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
    assert torch.equal(rope(x, positions), ref)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_passes_gradcheck_in_float64(interleaved):
    "float64 queries are rotated in float64 (not rounded to float32 on the way)."
    rope = RotaryEmbedding(8, max_len=16, interleaved=interleaved)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([0, 3, 4, 9, 15])
    rotate = lambda t: rope(t, positions)
    assert rotate(x).dtype == torch.float64
    assert torch.autograd.gradcheck(rotate, (x,))
    assert torch.autograd.gradgradcheck(rotate, (x,))


def test_rotary_tables_are_made_once_stay_float32_and_are_not_saved():
    """The cos and sin tables are made when the module is built (on the CPU when it is
    built on meta, to be loaded), move with `.to()`, keep float32 through a cast, and
    are not in the state dict; a forward reads rows of them and computes no cosine."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from minitransformer.model import GPT, GPTConfig
    rope = RotaryEmbedding(8, max_len=32)
    assert rope.cos.shape == rope.sin.shape == (32, 8) and rope.state_dict() == {}
    cos = rope.cos.clone()
    assert rope.double().cos.dtype == torch.float32 and torch.equal(rope.cos, cos)
    assert rope.to(torch.bfloat16).sin.dtype == torch.float32
    with torch.device("meta"):
        built = RotaryEmbedding(8, max_len=32)  # (shapes only: nothing allocated)
    assert built.cos.is_meta and built.to(torch.bfloat16).cos.is_meta  # (a cast: no move)
    assert torch.equal(built.to_empty(device="cpu").cos, cos)  # made where it is put
    huge = RotaryEmbedding(8, max_len=2**22)  # 2^25 numbers a table: computed per call
    assert huge.cos is None and huge.state_dict() == {}
    x, positions = torch.randn(2, 3, 5, 8), torch.tensor([0, 7, 3, 31, 12])
    assert torch.equal(huge(x, positions), rope(x, positions))  # the same numbers
    assert rope.to("meta").cos.is_meta  # (follows its model, wherever it goes)

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    model = GPT(GPTConfig(vocab_size=20, max_len=16, d_model=16, n_heads=2, n_layers=2,
                          position_encoding="rotary")).eval()
    seen: set = set()
    with Ops(), torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))
    assert not seen & {"cos", "sin", "pow"}, sorted(seen)
