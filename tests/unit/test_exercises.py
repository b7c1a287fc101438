"""minitransformer.exercises: the checkers of chapters 1-11 and the machinery every checker is
built from. Each checker accepts the right answers (the package's own functions, the appendix's
and the chapters' solutions) and refuses every wrong answer in WRONG with the sentence that names
it; a reader's exception is reported with its case, and the global random state is left alone.
The checkers of chapters 12-19 (minitransformer.exercises_2) are tested in test_exercises_2.py."""

import math
import re

import pytest
import torch

from minitransformer import exercises as E
from minitransformer.attention import scaled_dot_product_attention
from minitransformer.masks import causal_mask
from minitransformer.mixing import softmax
from minitransformer.model import GPT, GPTConfig, count_parameters
from minitransformer.multihead import split_heads
from minitransformer.positions import RotaryEmbedding
from test_exercises_2 import RIGHT as RIGHT_2, WRONG as WRONG_2

F = torch.nn.functional
INF = float("inf")


# ---- right answers, written as a reader would (helpers for the wrong ones too) ----
def _softmax(s, top=None, empty=0.0):
    top = s.amax(-1, keepdim=True) if top is None else top
    e = (s - torch.where(torch.isfinite(top), top, 0.0)).exp()
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / total.clamp_min(1e-30), empty)


def _attention(q, k, v, mask=None, scale=None, dim=-1, fill=-INF, after=False):
    s = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None and not after:
        s = s.masked_fill(~mask, fill)
    w = s.softmax(dim)
    return (w if mask is None or not after else w.masked_fill(~mask, fill)) @ v


def _rope(x, pos, shift=0, pairs=False, two=2, sign=1):
    D = x.shape[-1]
    a = (pos + shift).float()[:, None] * 10000 ** (-two * torch.arange(D // 2) / D)
    c, s = a.cos(), sign * a.sin()
    if pairs:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).flatten(-2)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], -1)


def _mask(T, S, diag=None, polarity=True, dtype=torch.bool):
    m = torch.ones(T, S, dtype=torch.bool).tril(S - T if diag is None else diag)
    return (m if polarity else ~m).to(dtype)


def _ln(x, eps, unbiased=False):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / (x.var(-1, keepdim=True, unbiased=unbiased) + eps).sqrt()


def _step(kc, vc, q, k, v, package=None, **att):
    K, V = torch.cat([kc, k], -2), torch.cat([vc, v], -2)
    return (package(q, K, V) if package else _attention(q, K, V, **att)), K, V


def _count(V, T, C, L):
    return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def _model_count(V, T, C, L):  # the package's model, built on the meta device
    with torch.device("meta"):
        return count_parameters(GPT(GPTConfig(vocab_size=V, max_len=T, d_model=C, n_heads=1,
                                              n_layers=L, d_ff=4 * C, activation="gelu_tanh")))


def _rope_base(x, pos, base):
    D = x.shape[-1]
    a = pos.float()[:, None] * base ** (-2 * torch.arange(D // 2) / D)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()], -1)


# The checkers compute their answers themselves (an appendix imports no later chapter); the
# package's own functions are their first right answers, so the two are checked equal here.
RIGHT = {  # checker: right answers (the package's own, then a reader's)
    E.check_softmax: [softmax, _softmax],
    E.check_embedding: [lambda ids, t: t[ids], lambda ids, t: F.embedding(ids, t),
                        lambda ids, t: F.one_hot(ids, t.shape[0]).float() @ t],
    E.check_projections: [lambda x, s, a, b, c: (x @ a, s @ b, s @ c)],
    E.check_attention: [scaled_dot_product_attention, _attention,
                        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m)],
    E.check_split_heads: [split_heads,
                          lambda x, h: x.unflatten(-1, (h, -1)).transpose(-3, -2)],
    E.check_feedforward: [lambda x, w1, b1, w2, b2: F.gelu(x @ w1 + b1) @ w2 + b2],
    E.check_rope: [lambda x, pos: RotaryEmbedding(x.shape[-1])(x, pos), _rope],
    E.check_causal_mask: [causal_mask, _mask],
    E.check_layer_norm: [lambda x, eps: F.layer_norm(x, x.shape[-1:], eps=eps), _ln],
    E.check_cache_step: [lambda kc, vc, q, k, v: _step(
        kc, vc, q, k, v, package=scaled_dot_product_attention), _step],
    E.check_parameter_count: [_model_count, _count],
}


def _w(checker, name, fn, phrase):
    return pytest.param(checker, fn, phrase, id=f"{checker.__name__[6:]}-{name}")


S, EM, PR, AT = E.check_softmax, E.check_embedding, E.check_projections, E.check_attention
SH, FF, RO, CM = E.check_split_heads, E.check_feedforward, E.check_rope, E.check_causal_mask
LN, KV, PC = E.check_layer_norm, E.check_cache_step, E.check_parameter_count
gelu = F.gelu

WRONG = [  # checker, a name, a wrong answer, words its sentence must contain
    _w(S, "no-max", lambda s: s.exp() / s.exp().sum(-1, keepdim=True), "exp.1000. overflows"),
    _w(S, "one-max-for-the-tensor", lambda s: _softmax(s, top=s.max()),
       r"one maximum for the whole tensor: row 1 of the scores \[\[1000, 999\], \[0, 1\]\] "
       r"came out \[0.0, 0.0\], not \[0.27, 0.73\]"),
    _w(S, "one-max-nan", lambda s: (s - s.max()).exp() / (s - s.max()).exp().sum(-1, keepdim=True),
       r"one maximum for the whole tensor: .* came out \[nan, nan\]"),
    _w(S, "max-clamped-at-0", lambda s: (lambda e: e / e.sum(-1, keepdim=True))(
        (s - s.amax(-1, keepdim=True).clamp_min(0)).exp()), r"exp\(-1000\) underflows"),
    _w(S, "not-normalised", lambda s: (s - s.amax(-1, keepdim=True)).exp(), "not normalised"),
    _w(S, "empty-row-nan", lambda s: s.softmax(-1), "must be 0, not NaN"),
    _w(S, "empty-row-uniform", lambda s: s.clamp_min(-1e30).softmax(-1), r"uniform \(1/3 each\)"),
    _w(S, "axis-0", lambda s: s.softmax(0), "along axis 0"),
    _w(S, "axis-1", lambda s: s.softmax(-2) if s.dim() > 2 else _softmax(s), "along axis 1"),
    _w(S, "whole-tensor", lambda s: s.exp() / s.exp().sum(), "over the whole tensor"),
    _w(S, "log-softmax", lambda s: s.log_softmax(-1), "log-probabilities"),
    _w(EM, "one-off", lambda ids, t: t[(ids + 1) % t.shape[0]], "one token off"),
    _w(EM, "flattened", lambda ids, t: t[ids.flatten()], "flattened the batch"),
    _w(EM, "transposed", lambda ids, t: t[ids.T], r"\(T, B, C\)"),
    _w(EM, "one-hot", lambda ids, t: F.one_hot(ids, t.shape[0]), "one-hot vectors"),
    _w(EM, "bad-shape", lambda ids, t: t[ids][..., :1], "returned shape"),
    _w(PR, "kv-from-x", lambda x, s, a, b, c: (x @ a, x @ b, x @ c),
       "k comes from the wrong input"),
    _w(PR, "q-from-source", lambda x, s, a, b, c: (s @ a, s @ b, s @ c),
       "q comes from the wrong input"),
    _w(PR, "wk-wv-swapped", lambda x, s, a, b, c: (x @ a, s @ c, s @ b),
       "W_K and W_V are swapped"),
    _w(PR, "transposed", lambda x, s, a, b, c: (x @ a.T, s @ b.T, s @ c.T), "transposed"),
    _w(PR, "two-results", lambda x, s, a, b, c: (x @ a, s @ b), r"must return \(q, k, v\)"),
    _w(AT, "no-scale", lambda q, k, v, m: _attention(q, k, v, m, scale=1.0), "not scaled"),
    _w(AT, "by-D", lambda q, k, v, m: _attention(q, k, v, m, scale=q.shape[-1]),
       "divided the scores by D"),
    _w(AT, "by-sqrt-Dv", lambda q, k, v, m: _attention(q, k, v, m, scale=v.shape[-1] ** 0.5),
       "width of the values"),
    _w(AT, "mask-ignored", lambda q, k, v, m: _attention(q, k, v, None), "ignores the mask"),
    _w(AT, "mask-reversed", lambda q, k, v, m: _attention(q, k, v, None if m is None else ~m),
       "polarity"),
    _w(AT, "fill-0", lambda q, k, v, m: _attention(q, k, v, m, fill=0.0), "filled the masked "
       "scores with 0"),
    _w(AT, "mask-added", lambda q, k, v, m: (
        (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + (0 if m is None else m))
        .softmax(-1) @ v), "added the boolean mask"),
    _w(AT, "masked-after-0", lambda q, k, v, m: _attention(q, k, v, m, fill=0.0, after=True),
       "masked after the softmax"),
    _w(AT, "masked-after-inf", lambda q, k, v, m: _attention(q, k, v, m, after=True),
       "masked after the softmax"),
    _w(AT, "weights-times-mask", lambda q, k, v, m: (
        (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1)
        * (1 if m is None else m)) @ v, "masked after the softmax"),
    _w(AT, "weights-returned", lambda q, k, v, m: _attention(q, k, torch.eye(k.shape[-2]), m),
       "returned the attention weights"),
    _w(AT, "over-queries", lambda q, k, v, m: _attention(q, k, v, m, dim=-2), "over the queries"),
    _w(SH, "one-reshape", lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1),
       "mixes tokens into heads"),
    _w(SH, "every-H-th", lambda x, h: x.unflatten(-1, (-1, h)).permute(0, 3, 1, 2), "every H-th"),
    _w(SH, "no-transpose", lambda x, h: x.unflatten(-1, (h, -1)), r"kept \(B, T, H, D\)"),
    _w(SH, "B-and-H-merged", lambda x, h: split_heads(x, h).flatten(0, 1), "merged B and H"),
    _w(FF, "tanh", lambda x, w1, b1, w2, b2: gelu(x @ w1 + b1, approximate="tanh") @ w2 + b2,
       "tanh"),
    _w(FF, "relu", lambda x, w1, b1, w2, b2: F.relu(x @ w1 + b1) @ w2 + b2, "ReLU"),
    _w(FF, "silu", lambda x, w1, b1, w2, b2: F.silu(x @ w1 + b1) @ w2 + b2, "SiLU"),
    _w(FF, "no-activation", lambda x, w1, b1, w2, b2: (x @ w1 + b1) @ w2 + b2, "no activation"),
    _w(FF, "gelu-on-output", lambda x, w1, b1, w2, b2: gelu(gelu(x @ w1 + b1) @ w2 + b2),
       "output too"),
    _w(FF, "b1-after", lambda x, w1, b1, w2, b2: (gelu(x @ w1) + b1) @ w2 + b2, "b1 after GELU"),
    _w(FF, "no-b1", lambda x, w1, b1, w2, b2: gelu(x @ w1) @ w2 + b2, "bias b1"),
    _w(FF, "no-b2", lambda x, w1, b1, w2, b2: gelu(x @ w1 + b1) @ w2, "bias b2"),
    _w(FF, "no-biases", lambda x, w1, b1, w2, b2: gelu(x @ w1) @ w2, "both biases"),
    _w(RO, "positions-ignored", lambda x, p: _rope(x, torch.arange(len(p))),
       r"ignores `positions` \(here from 3\)"),
    _w(RO, "not-rotated", lambda x, p: x, "not rotated"),
    _w(RO, "neighbours", lambda x, p: _rope(x, p, pairs=True), "neighbouring"),
    _w(RO, "ahead", lambda x, p: _rope(x, p, shift=1), "one position ahead"),
    _w(RO, "behind", lambda x, p: _rope(x, p, shift=-1), "one position behind"),
    _w(RO, "wrong-way", lambda x, p: _rope(x, p, sign=-1), "wrong way"),
    _w(RO, "exponent-i", lambda x, p: _rope(x, p, two=1), "wrong exponent"),
    _w(RO, "exponent-4i", lambda x, p: _rope(x, p, two=4), "wrong exponent"),
    _w(CM, "reversed", lambda T, S: _mask(T, S, polarity=False), "polarity"),
    _w(CM, "top-left", lambda T, S: _mask(T, S, diag=0), "top-left"),
    _w(CM, "no-diagonal", lambda T, S: _mask(T, S, diag=S - T - 1), "own position"),
    _w(CM, "future", lambda T, S: torch.ones(T, S, dtype=torch.bool).triu(S - T), "the future"),
    _w(CM, "one-ahead", lambda T, S: _mask(T, S, diag=S - T + 1), "one position ahead"),
    _w(CM, "T-by-T", lambda T, S: _mask(T, T), r"is \(T, T\)"),
    _w(CM, "S-by-S", lambda T, S: _mask(S, S), r"the \(S, S\) mask"),
    _w(CM, "float-0-1", lambda T, S: _mask(T, S, dtype=torch.float32), "torch.float32 numbers"),
    _w(CM, "additive", lambda T, S: torch.zeros(T, S).masked_fill(~_mask(T, S), -INF),
       "additive mask of 0 and -inf"),
    _w(LN, "unbiased", lambda x, eps: _ln(x, eps, unbiased=True), "unbiased variance"),
    _w(LN, "no-eps", lambda x, eps: _ln(x, 0.0), "left out eps"),
    _w(LN, "eps-on-std", lambda x, eps: (x - x.mean(-1, keepdim=True))
       / (x.std(-1, keepdim=True, unbiased=False) + eps), "inside the square root"),
    _w(LN, "no-sqrt", lambda x, eps: (x - x.mean(-1, keepdim=True))
       / (x.var(-1, keepdim=True, unbiased=False) + eps), "divided by the variance"),
    _w(LN, "no-centring", lambda x, eps: x / (x.var(-1, keepdim=True, unbiased=False)
                                              + eps).sqrt(), "did not subtract the mean"),
    _w(LN, "rmsnorm", lambda x, eps: x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt(),
       "RMSNorm"),
    _w(LN, "whole-tensor", lambda x, eps: (x - x.mean()) / (x.var(unbiased=False) + eps).sqrt(),
       "whole tensor"),
    _w(LN, "first-axis", lambda x, eps: (x - x.mean(0)) / (x.var(0, unbiased=False) + eps).sqrt(),
       "first axis"),
    _w(KV, "past-only", lambda kc, vc, q, k, v: (
        _attention(q, kc, vc) if kc.shape[-2] else v, *_step(kc, vc, q, k, v)[1:]),
       "attends before appending the new key and value, so it sees only the past"),
    _w(KV, "new-only", lambda kc, vc, q, k, v: (v, *_step(kc, vc, q, k, v)[1:]),
       "output is the new value v"),
    _w(KV, "no-scale", lambda kc, vc, q, k, v: _step(kc, vc, q, k, v, scale=1.0), "not scaled"),
    _w(KV, "by-D", lambda kc, vc, q, k, v: _step(kc, vc, q, k, v, scale=q.shape[-1]), "by D"),
    _w(KV, "softmax-axis", lambda kc, vc, q, k, v: _step(kc, vc, q, k, v, dim=-2), "axis -2"),
    _w(KV, "newest-first", lambda kc, vc, q, k, v: (
        _step(kc, vc, q, k, v)[0], torch.cat([k, kc], -2), torch.cat([v, vc], -2)),
       "before the past"),
    _w(KV, "old-caches", lambda kc, vc, q, k, v: (_step(kc, vc, q, k, v)[0], kc, vc),
       "returned the old k_cache"),
    _w(KV, "caches-swapped", lambda kc, vc, q, k, v: (lambda o, K, V: (o, V, K))(
        *_step(kc, vc, q, k, v)), "other cache as your k_cache"),
    _w(KV, "two-results", lambda kc, vc, q, k, v: _step(kc, vc, q, k, v)[:2],
       r"must return \(out, k_cache, v_cache\)"),
    _w(PC, "head-counted", lambda V, T, C, L: _count(V, T, C, L) + V * C, "tied"),
    _w(PC, "no-embedding", lambda V, T, C, L: _count(V, T, C, L) - V * C, "token embedding"),
    _w(PC, "no-positions", lambda V, T, C, L: _count(V, T, C, L) - T * C, "learned positions"),
    _w(PC, "no-final-norm", lambda V, T, C, L: _count(V, T, C, L) - 2 * C, "final norm"),
    _w(PC, "no-layer-norms", lambda V, T, C, L: _count(V, T, C, L) - 4 * C * L,
       r"4·C per layer: the layer norms \(2·C each\), attention's four biases"),
    _w(PC, "no-biases", lambda V, T, C, L: _count(V, T, C, L) - 9 * C * L, r"the biases \(9"),
    _w(PC, "no-biases-norms", lambda V, T, C, L: _count(V, T, C, L) - 13 * C * L - 2 * C,
       "biases and norms"),
    _w(PC, "no-out-proj", lambda V, T, C, L: _count(V, T, C, L) - L * (C * C + C),
       "output projection"),
    _w(PC, "ffn-width-C", lambda V, T, C, L: _count(V, T, C, L) - L * (6 * C * C + 3 * C),
       "4·d_model"),
    _w(PC, "one-layer", lambda V, T, C, L: _count(V, T, C, 1), "counted one layer"),
    _w(PC, "float", lambda V, T, C, L: float(_count(V, T, C, L)), "not an int"),
    _w(PC, "other", lambda V, T, C, L: _count(V, T, C, L) + 1, "the model has 72,224"),
    # slips that once got only a generic message, a wrong name or a raw error
    _w(RO, "base-1000", lambda x, p: _rope_base(x, p, 1000.0),
       "your rotation uses base 1,000; the convention is 10,000"),
    _w(RO, "base-500000", lambda x, p: _rope_base(x, p, 5e5), "uses base 500,000"),
    _w(EM, "ids-minus-1", lambda ids, t: t[ids - 1], r"not row i - 1 \(ids count from 0\)"),
    _w(SH, "heads-reversed", lambda x, h: split_heads(x, h).flip(1),
       "your heads are in reverse order"),
    _w(AT, "by-sqrt-S", lambda q, k, v, m: _attention(q, k, v, m, scale=k.shape[-2] ** .5),
       r"divided the scores by √S, the number of keys .*; divide by √D"),
    _w(AT, "by-sqrt-T", lambda q, k, v, m: _attention(q, k, v, m, scale=q.shape[-2] ** .5),
       r"by √S, the number of keys \(and of queries\)"),  # (the first case: T = S)
    _w(KV, "attends-before-appending", lambda kc, vc, q, k, v: (  # (an empty cache)
        _attention(q, kc, vc), *_step(kc, vc, q, k, v)[1:]),
       r"attends before appending .* \(on 0 cached positions"),
    _w(KV, "sdpa-before-appending", lambda kc, vc, q, k, v: (
        F.scaled_dot_product_attention(q, kc, vc), *_step(kc, vc, q, k, v)[1:]),
       "attends before appending"),
    _w(PC, "no-attention-biases", lambda V, T, C, L: _count(V, T, C, L) - 4 * C * L,
       r"the layer norms \(2·C each\), attention's four biases \(C each\) or the first "
       r"feed-forward bias \(4·C\)"),
    _w(PC, "no-ffn-biases", lambda V, T, C, L: _count(V, T, C, L) - 5 * C * L,
       r"left out the feed-forward's biases \(5·C per layer"),
]


EVERY_RIGHT = RIGHT | RIGHT_2  # with chapters 12–19's (tests/unit/test_exercises_2.py)
EVERY_WRONG = WRONG + WRONG_2


@pytest.mark.parametrize("checker", EVERY_RIGHT, ids=lambda c: c.__name__)
def test_right_answers_pass(checker, capsys):
    for right in EVERY_RIGHT[checker]:
        checker(right)
    out = capsys.readouterr().out
    assert out.count("cases agree with the package") == len(EVERY_RIGHT[checker]), out


@pytest.mark.parametrize("checker, wrong, phrase", EVERY_WRONG)
def test_a_wrong_answer_is_refused_with_its_name(checker, wrong, phrase):
    with pytest.raises(E.ExerciseError, match=phrase):
        checker(wrong)


def test_softmax_without_the_empty_row_case(capsys):
    E.check_softmax(lambda s: s.softmax(-1), empty_rows=False)  # NaN for an empty row
    assert capsys.readouterr().out == "softmax: all 8 cases agree with the package\n"


def test_every_checker_is_covered():
    checkers = {n for n in E.__all__ if n.startswith("check_")}
    assert checkers == {c.__name__ for c in RIGHT}
    assert {p.values[0].__name__ for p in WRONG} == checkers
    assert len(WRONG) >= 50


def test_no_message_prints_an_infinity_as_a_number():
    for checker, wrong, _ in (p.values for p in WRONG):
        with pytest.raises(E.ExerciseError) as e:
            checker(wrong)
        assert "e+308" not in str(e.value), str(e.value)


def test_a_readers_exception_names_the_case():
    def broken(scores):
        raise IndexError("index 3 is out of bounds")
    with pytest.raises(E.ExerciseError,
                       match=r"raised IndexError \(index 3.*\) on scores of shape"):
        E.check_softmax(broken)


def test_a_non_function_is_a_type_error():
    with pytest.raises(TypeError, match="takes your function, got int"):
        E.check_softmax(3)
    with pytest.raises(E.ExerciseError, match="returned a list, not a tensor"):
        E.check_causal_mask(lambda T, S: [[True]])


def test_checkers_leave_the_random_state_alone():
    torch.manual_seed(0)
    expected = torch.randn(3)
    torch.manual_seed(0)
    E.check_softmax(lambda s: (torch.rand(1), softmax(s))[1])  # a reader's own draw
    E.check_causal_mask(lambda T, S: (torch.randn(1), causal_mask(T, S))[1])
    assert torch.equal(torch.randn(3), expected)


def test_a_right_function_that_changes_its_inputs_still_passes(capsys):
    def attention(q, k, v, mask=None):
        out = _attention(q, k, v, mask)
        q.mul_(0), k.mul_(0), v.mul_(0)
        if mask is not None:
            mask.logical_not_()
        return out

    def step(kc, vc, q, k, v):
        out = _step(kc, vc, q, k, v)
        for t in (kc, vc, q, k, v):
            t.zero_()
        return out

    E.check_attention(attention)
    E.check_cache_step(step)
    E.check_projections(lambda x, s, a, b, c: (x @ a, s @ b, (s @ c, s.zero_())[0]))
    assert capsys.readouterr().out.count("agree with the package") == 3


def test_a_plain_mismatch_says_where_and_by_how_much():
    def off(q, k, v, mask=None):
        out = _attention(q, k, v, mask)
        if out.dim() == 3:
            out[1, 2, 0] += 0.41
        return out
    with pytest.raises(E.ExerciseError, match=(
            r"^your scaled dot-product attention returned different values on q \(2, 4, 8\), "
            r"k \(2, 6, 8\), v \(2, 6, 3\), a \(4, 6\) mask: largest difference 0.41 at "
            r"\[1, 2, 0\] \(yours .*, the package's ")):
        E.check_attention(off)

    def one_wrong(T, S):
        m = _mask(T, S)
        m[0, 0] = False
        return m
    with pytest.raises(E.ExerciseError, match=r"on T = 3, S = 3: first difference at \[0, 0\]: "
                       r"yours False, the package's True"):
        E.check_causal_mask(one_wrong)


def test_the_two_values_of_a_small_difference_are_told_apart():
    "Yours and the package's are printed with digits enough to differ, in plain notation."
    with pytest.raises(E.ExerciseError) as e:
        E.check_layer_norm(lambda x, eps: torch.nn.functional.layer_norm(
            x, x.shape[-1:], eps=eps) * 1.001)
    m = re.search(r"yours (\S+), the package's (\S+)\)", str(e.value))
    assert m and m.group(1) != m.group(2) and "e+" not in m.group(0), str(e.value)
