"""minitransformer.instruct without a pretrained model: the data split, `follows_format` and the
reply-only loss."""

import pytest
import torch
import torch.nn.functional as F

from minitransformer.instruct import (
    IGNORE_ID,
    answer_because_data,
    collate,
    follows_format,
    reply_loss,
)

from helpers import tiny


def test_the_split_shares_no_slot_value_and_repeats_for_a_seed():
    train, test = answer_because_data()
    assert (len(train), len(test)) == (297, 33)
    # the reply's second line names the country, animal or sum: none is in both lists
    assert not {r for _, r, _ in train} & {r for _, r, _ in test}
    assert len({r for _, r, _ in test}) == len(test)  # each held-out value asked once
    assert all(follows_format(r) and r.startswith(f"Answer: {a}\n") for _, r, a in train + test)
    assert answer_because_data() == (train, test)
    assert answer_because_data(seed=1) != (train, test)


@pytest.mark.parametrize("reply, want", [
    ("Answer: Paris\nBecause: Paris is the capital of France.", True),
    ("  Answer: 4\nBecause: a dog has 4 legs.\n", True),
    ("Answer: Paris", False),
    ("Answer: Paris\nBecause: it is.\nAnything else?", False),
    ("The capital of France is Paris.", False),
    ("answer: Paris\nbecause: it is.", False),
    ("Answer: \nBecause: x", False),
])
def test_follows_format(reply, want):
    assert follows_format(reply) is want


def test_reply_loss_is_the_cross_entropy_of_the_counted_targets():
    model = tiny(50)
    batch = collate([([5, 6, 7, 8, 9], [IGNORE_ID, IGNORE_ID, 8, 9, IGNORE_ID]),
                     ([11, 12, 13], [IGNORE_ID, 13, IGNORE_ID])], pad_id=0)
    ids, targets = batch
    assert ids.tolist() == [[5, 6, 7, 8, 9], [11, 12, 13, 0, 0]]
    logits = model(ids)
    want = F.cross_entropy(torch.stack([logits[0, 2], logits[0, 3], logits[1, 1]]),
                           torch.tensor([8, 9, 13]))
    torch.testing.assert_close(reply_loss(model, batch), want)
    # the padding changes nothing: the second row alone gives its own loss
    alone = collate([([11, 12, 13], [IGNORE_ID, 13, IGNORE_ID])], pad_id=0)
    torch.testing.assert_close(reply_loss(model, alone),
                               F.cross_entropy(model(alone[0])[0, 1:2], torch.tensor([13])))
