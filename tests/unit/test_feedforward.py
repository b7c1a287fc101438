"""minitransformer.feedforward: activations and the feed-forward network refuse unknown names and
wrong inputs."""

import torch
import torch.nn.functional as F

from minitransformer.feedforward import FeedForward, activation

from helpers import raises


def test_activation_and_feed_forward_refuse_unknown_names_and_wrong_inputs():
    with raises(ValueError, "unknown activation 'swish'; choose from"):
        activation("swish", torch.zeros(3))
    with raises(ValueError, "unknown activation 'swish'; choose from"):
        FeedForward(12, 48, "swish")
    with raises(TypeError, "z must be a float"):
        activation("relu", torch.tensor([1]))
    torch.testing.assert_close(activation("silu", torch.ones(2)), F.silu(torch.ones(2)))
    with raises(ValueError, "d_ff must be a positive int"):
        FeedForward(12, 0)
