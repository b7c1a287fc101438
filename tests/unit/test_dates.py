"""minitransformer.dates: the translation task of chapter 13 — every format writes every day it
may meet in characters the source tokenizer knows, a seed fixes the held-out dates, and
`translate` is greedy decoding with chapter 12's `generate`, batch by batch."""

import datetime as dt
import random

import pytest
import torch

from minitransformer.dates import CASES, DATE_FORMATS, FIRST_DAY, LAST_DAY, DateTask, write_date
from minitransformer.generation import generate
from minitransformer.model import Transformer, TransformerConfig

pytestmark = pytest.mark.timeout(60)

DAYS = [FIRST_DAY, LAST_DAY, dt.date(1900, 2, 28), dt.date(2000, 2, 29), dt.date(1909, 3, 3),
        dt.date(2011, 11, 11), dt.date(1999, 12, 31)]


def test_every_format_and_case_writes_each_day_in_known_characters():
    task = DateTask(n_test=1)
    for day in DAYS:
        written = {write_date(day, fmt, case) for fmt in DATE_FORMATS for case in CASES}
        assert len(written) > len(DATE_FORMATS), "formats and cases write the day differently"
        for text in written:
            ids = task.source_tok.encode(text)
            assert text and task.source_tok.unk_id not in ids, text
            assert task.source_tok.decode(ids) == text


def test_a_seed_fixes_the_held_out_dates_and_training_never_draws_them():
    a, b, c = DateTask(n_test=300, seed=4), DateTask(n_test=300, seed=4), DateTask(n_test=300)
    assert a.test_pairs == b.test_pairs and a.test_pairs != c.test_pairs
    held_out = {t for _, t in a.test_pairs}
    assert len(held_out) == 300
    train = a.train_pairs(20_000, random.Random(0))
    assert not held_out & {t for _, t in train}
    assert len({t for _, t in train}) > 15_000  # drawn from the whole span of days


def test_translate_is_greedy_generate_in_batches():
    task = DateTask(n_test=7, seed=1)
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(
        d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1,
        src_vocab_size=len(task.source_tok), tgt_vocab_size=len(task.target_tok),
        max_len=64)).eval()
    sources = [s for s, _ in task.test_pairs]

    def greedy(chunk):  # the same computation, batch for batch
        new = generate(model, [[task.target_tok.bos_id]] * len(chunk), max_new_tokens=11,
                       source=[task.source_tok.encode(s) for s in chunk],
                       stop_token=task.target_tok.eos_id)
        return [task.target_tok.decode(ids) for ids in new]
    want = greedy(sources)
    assert task.translate(model, sources) == want
    assert task.translate(model, sources, batch_size=3) == [  # batches of 3, 3, 1
        t for i in range(0, 7, 3) for t in greedy(sources[i:i + 3])]
    assert task.accuracy(model) == sum(
        w == t for w, (_, t) in zip(want, task.test_pairs)) / len(want)
