"""minitransformer.mixing: softmax matches torch on every dim and in bfloat16, and softmax,
`check_attention_weights` and `mix` refuse what does not fit."""

import pytest
import torch

from minitransformer.mixing import check_attention_weights, mix, softmax


@pytest.mark.reduced_precision
def test_softmax_matches_torch_on_every_dim_and_in_bfloat16():
    scores = torch.randn(4, 5, 7, generator=torch.Generator().manual_seed(0)) * 10
    for dim in (0, 1, -1):
        torch.testing.assert_close(softmax(scores, dim), torch.softmax(scores, dim),
                                   atol=1e-6, rtol=0)
    rounded = scores.bfloat16()  # against float32 on the same rounded scores: the weights'
    torch.testing.assert_close(softmax(rounded).float(),  # own rounding (2^-9 of values
                               torch.softmax(rounded.float(), -1),  # <= 1) and one more
                               atol=2**-8, rtol=0)  # step of any bfloat16 kernel
    assert softmax(torch.tensor(0.3)) == 1.0  # 0-d, as in torch
    assert softmax(torch.zeros(3, 0)).shape == (3, 0)
    assert softmax(torch.zeros(0), dim=0).shape == (0,)


def test_softmax_refuses_bad_arguments():
    with pytest.raises(TypeError, match="floating-point tensor, got dtype torch.int64"):
        softmax(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"dim 2 is out of range for scores of shape \(2, 3\)"):
        softmax(torch.zeros(2, 3), dim=2)
    with pytest.raises(TypeError, match="dim must be an int"):
        softmax(torch.zeros(2), dim=None)


def test_check_attention_weights_names_the_broken_rule():
    good = softmax(torch.randn(2, 3, 4))
    assert check_attention_weights(good) is good
    with pytest.raises(ValueError, match=r"row \[1\] sums to 0.9"):
        check_attention_weights(torch.tensor([[0.5, 0.5], [0.7, 0.2]]))
    with pytest.raises(ValueError, match=r"weights\[1\] = -0.2"):
        check_attention_weights(torch.tensor([1.2, -0.2]))
    with pytest.raises(ValueError, match="NaN"):
        check_attention_weights(torch.tensor([0.5, float("nan")]))
    for atol in (-1.0, float("nan")):
        with pytest.raises((TypeError, ValueError), match="atol"):
            check_attention_weights(good, atol=atol)


def test_mix_refuses_weights_and_values_that_do_not_fit():
    A, V = softmax(torch.randn(5, 6)), torch.randn(6, 3)
    with pytest.raises(TypeError, match="weights and values must share a dtype"):
        mix(A.double(), V)
    with pytest.raises(ValueError, match=r"weights \(3, 5, 6\) and values \(4, 6, 2\) "
                                         "do not broadcast"):
        mix(softmax(torch.randn(3, 5, 6)), torch.randn(4, 6, 2))
    assert mix(softmax(torch.randn(3, 5, 6)), torch.randn(1, 6, 2)).shape == (3, 5, 2)
