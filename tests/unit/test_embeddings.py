"""minitransformer.embeddings: the tokenizer, `pad_ids` and `TokenEmbedding` refuse bad arguments,
and building a vocabulary takes linear time."""

import pytest
import torch

from minitransformer.embeddings import (
    SPECIAL_TOKENS,
    TokenEmbedding,
    Tokenizer,
    check_id_list,
    check_token_ids,
    pad_ids,
)

# Chapter 2: the tokenizer, pad_ids and TokenEmbedding name a caller's mistakes.
CORPUS = ["The animal rested because it was tired.",
          "The chef chopped the vegetables before serving them.", "I like tea."]


def test_tokenizer_and_pad_ids_refuse_bad_arguments():
    tok = Tokenizer.from_texts(CORPUS)
    cases = [
        (lambda: tok.decode([3, 99]), ValueError,
         "token id 99 is outside the vocabulary of 22 tokens"),
        (lambda: Tokenizer([], level="bpe"), ValueError, "level must be 'word' or 'char'"),
        (lambda: tok.decode([True]), TypeError, "ids must be ints, got True"),
        (lambda: tok.decode(None), TypeError, "ids must be an iterable of ints"),
        (lambda: Tokenizer(None), TypeError, "tokens must be an iterable of strings"),
        (lambda: Tokenizer([1, 2]), TypeError, r"tokens\[0\] is 1 \(int\)"),
        (lambda: Tokenizer.from_texts(None), TypeError, "texts must be an iterable"),
        (lambda: Tokenizer.from_texts("one text"), TypeError, "not one string"),
        (lambda: Tokenizer.from_texts(CORPUS, min_freq=0), ValueError,
         "min_freq must be a positive int, got 0"),
        (lambda: tok.encode_batch([]), ValueError, "texts must be a non-empty"),
        (lambda: tok.encode_batch("one text"), TypeError, "sequence of strings, not one"),
        (lambda: tok.encode_batch(["a", 5]), TypeError, r"texts\[1\] is 5"),
        (lambda: tok.split(5), TypeError, "text must be a str, got int"),
        (lambda: pad_ids([], 0), ValueError, "rows must hold at least one row"),
        (lambda: pad_ids("abc", 0), TypeError, "rows must be a sequence of lists"),
        (lambda: pad_ids([[1, 2.0]], 0), TypeError, r"rows\[0\] must be ints, got 2.0"),
        (lambda: pad_ids([[1]], -1), ValueError, "pad_id must be an int >= 0, got -1"),
        (lambda: check_id_list([[1]], 5, "prompt"), TypeError, "prompt must be ints"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    assert tok.decode(torch.tensor(5)) == tok.itos[5]  # a 0-D tensor: one id
    assert len(Tokenizer.from_texts([])) == len(SPECIAL_TOKENS)
    assert check_id_list(torch.tensor([1, 2]), 5) == [1, 2]
    assert pad_ids([[], [5]], 0)[1].tolist() == [[False], [True]]  # an empty row


def test_token_embedding_and_the_ids_check_refuse_what_they_cannot_serve():
    "The module checks its arguments; the ids it trusts are the models' to check."
    emb = TokenEmbedding(22, 4)
    cases = [
        (lambda: check_token_ids(torch.tensor([4, 22, 3]), emb.vocab_size), ValueError,
         r"token ids\[1\] = 22"),
        (lambda: check_token_ids(torch.tensor([[0, -1]]), emb.vocab_size), ValueError,
         r"must lie in \[0, 22\)"),
        (lambda: check_token_ids(torch.tensor([0.0, 1.0]), 22), TypeError, "integer tensor"),
        (lambda: check_token_ids(torch.tensor(4), 0, "ids"), ValueError,
         "vocab_size must be a positive int, got 0"),
        (lambda: check_token_ids(torch.tensor(1), 2.5, "ids"), ValueError, "vocab_size"),
        (lambda: TokenEmbedding(5, 2, init_std=-1.0), ValueError, "init_std must be"),
        (lambda: TokenEmbedding(5, 2, init_std=float("inf")), ValueError, "init_std"),
        (lambda: TokenEmbedding(5, 2, padding_idx=1.5), TypeError, "padding_idx must be"),
        (lambda: TokenEmbedding(5, 2, padding_idx=True), TypeError, "padding_idx"),
        (lambda: TokenEmbedding(5, 2, padding_idx=5), ValueError, "outside the vocab"),
    ]
    for call, _, message in cases:  # (a number of the wrong kind: either error)
        with pytest.raises((TypeError, ValueError), match=message):
            call()


@pytest.mark.timeout(60)
def test_vocabulary_construction_is_linear():
    import time
    from minitransformer.embeddings import Vocabulary
    tokens = [f"t{i}" for i in range(20_000)] * 2
    start = time.perf_counter()
    vocab = Vocabulary(tokens)
    assert len(vocab) == 20_004 and vocab.itos[4:6] == ["t0", "t1"]
    assert time.perf_counter() - start < 0.5  # was 2.4 s (a list searched per token)
