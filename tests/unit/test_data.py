"""minitransformer.data: `char_windows` draws every window."""

import pytest
import torch

from minitransformer.data import char_windows

pytestmark = pytest.mark.timeout(60)


def test_char_windows_draws_every_window_and_the_single_one():
    data = torch.arange(12)
    x, y = char_windows(data, 8, 4000, torch.Generator().manual_seed(0))
    assert x[:, 0].unique().tolist() == [0, 1, 2, 3]  # start 3 ends at data[11]
    x, y = char_windows(torch.arange(9), 8, 3)  # exactly one window fits
    assert x.tolist() == [list(range(8))] * 3 and y[:, -1].tolist() == [8] * 3
