"""minitransformer.exercises: each checker accepts the right answers (the package's own
functions, the appendix's and the chapters' solutions) and refuses every wrong answer in
WRONG with the sentence that names it; a reader's exception is reported with its case, and
the global random state is left alone."""

import math
import re

import pytest
import torch

from minitransformer import exercises as E
from minitransformer.attention import scaled_dot_product_attention
from minitransformer.distributed import shard_batch
from minitransformer.generation import top_p_filter
from minitransformer.masks import causal_mask
from minitransformer.mixing import softmax
from minitransformer.model import mean_pool
from minitransformer.multihead import split_heads
from minitransformer.training import sequence_loss

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


def _step(kc, vc, q, k, v, **att):
    K, V = torch.cat([kc, k], -2), torch.cat([vc, v], -2)
    return _attention(q, K, V, **att), K, V


def _count(V, T, C, L):
    return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def _top_p(logits, p, within=False, in_order=False, on_scores=False, fill=-INF):
    x = logits if on_scores else logits.softmax(-1)
    if in_order:
        x, order = x, torch.arange(x.shape[-1]).expand_as(x)
    else:
        x, order = x.sort(-1, descending=True)
    keep = x.cumsum(-1) <= p if within else x.cumsum(-1) - x < p
    keep = torch.zeros_like(keep).scatter(-1, order, keep)
    return logits.masked_fill(~keep, fill)


def _loss(logits, ids, **ce):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), **ce)


def _pool(h, m, normalize=True):
    w = m.unsqueeze(-1).float()
    mean = (h * w).sum(1) / w.sum(1).clamp(min=1)
    return F.normalize(mean, dim=-1) if normalize else mean


def _q8_0(raw, signed=True, scaled=True, scale_dtype=torch.float16):
    blocks = raw.view(-1, 34)
    d = blocks[:, :2].contiguous().view(scale_dtype).float() if scaled else 1.0
    q = blocks[:, 2:].contiguous()
    return d * (q.view(torch.int8) if signed else q).float()  # (blocks, 32)


def _lora(x, W, b, A, B, alpha, scale=None):
    r = A.shape[0]
    return x @ W.T + b + (alpha / r if scale is None else scale(alpha, r)) * (x @ A.T @ B.T)


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
    E.check_rope: [_rope],
    E.check_causal_mask: [causal_mask, _mask],
    E.check_layer_norm: [lambda x, eps: F.layer_norm(x, x.shape[-1:], eps=eps), _ln],
    E.check_cache_step: [_step],
    E.check_parameter_count: [_count],
    E.check_top_p: [top_p_filter, _top_p],
    E.check_next_token_loss: [lambda lg, ids: sequence_loss(lg[:, :-1], ids[:, 1:]), _loss],
    E.check_shard: [shard_batch, lambda b, r, w: b.chunk(w)[r]],
    E.check_mean_pool: [mean_pool, _pool],
    E.check_q8_0: [lambda raw: _q8_0(raw).flatten()],
    E.check_lora: [_lora],
}


def _w(checker, name, fn, phrase):
    return pytest.param(checker, fn, phrase, id=f"{checker.__name__[6:]}-{name}")


S, EM, PR, AT = E.check_softmax, E.check_embedding, E.check_projections, E.check_attention
SH, FF, RO, CM = E.check_split_heads, E.check_feedforward, E.check_rope, E.check_causal_mask
LN, KV, PC, TP = E.check_layer_norm, E.check_cache_step, E.check_parameter_count, E.check_top_p
NL, SD, MP, Q8, LO = (E.check_next_token_loss, E.check_shard, E.check_mean_pool, E.check_q8_0,
                      E.check_lora)
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
       "only to the past"),
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
    _w(PC, "no-layer-norms", lambda V, T, C, L: _count(V, T, C, L) - 4 * C * L, "layer norms"),
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
    _w(TP, "bool-mask", lambda lg, p: _top_p(lg, p) > -INF, "boolean mask of the kept"),
    _w(TP, "probabilities", lambda lg, p: _top_p(lg, p).softmax(-1), "returned probabilities"),
    _w(TP, "zero-fill", lambda lg, p: _top_p(lg, p, fill=0.0), "must be -inf"),
    _w(TP, "big-negative", lambda lg, p: _top_p(lg, p, fill=-1e9), "large negative number"),
    _w(TP, "finfo-min", lambda lg, p: _top_p(lg, p, fill=torch.finfo(lg.dtype).min),
       "large negative number"),
    _w(TP, "finfo-min-float64", lambda lg, p: _top_p(lg.double(), p,
       fill=torch.finfo(torch.float64).min), "large negative number"),
    _w(TP, "within-p", lambda lg, p: _top_p(lg, p, within=True), "reaches p"),
    _w(TP, "token-order", lambda lg, p: _top_p(lg, p, in_order=True), "token order"),
    _w(TP, "on-scores", lambda lg, p: _top_p(lg, p, on_scores=True), "added up the scores"),
    _w(TP, "left-sorted", lambda lg, p: lg.masked_fill(~(lambda pr: pr.cumsum(-1) - pr < p)(
        lg.softmax(-1).sort(-1, descending=True).values), -INF), "sorted order"),
    _w(NL, "no-shift", lambda lg, ids: F.cross_entropy(lg.flatten(0, 1), ids.flatten()),
       "on its own token"),
    _w(NL, "wrong-way", lambda lg, ids: sequence_loss(lg[:, 1:], ids[:, :-1]), "wrong way"),
    _w(NL, "logits-only", lambda lg, ids: sequence_loss(lg[:, :-1], ids[:, :-1]),
       "not the first ids"),
    _w(NL, "ids-only", lambda lg, ids: sequence_loss(lg[:, 1:], ids[:, 1:]),
       "not the last logits"),
    _w(NL, "summed", lambda lg, ids: _loss(lg, ids, reduction="sum"), "summed"),
    _w(NL, "per-position", lambda lg, ids: _loss(lg, ids, reduction="none"),
       "one loss per position"),
    _w(NL, "softmax-first", lambda lg, ids: _loss(lg.softmax(-1), ids), "softmax before"),
    _w(NL, "negative", lambda lg, ids: -_loss(lg, ids), "negative"),
    _w(NL, "a-float", lambda lg, ids: _loss(lg, ids).item(), "returned a float, not a tensor"),
    _w(SD, "round-robin", lambda b, r, w: b[r::w], "round-robin"),
    _w(SD, "rank-ahead", lambda b, r, w: b[(r + 1) * (len(b) // w): (r + 2) * (len(b) // w)],
       "one rank off"),
    _w(SD, "ranks-from-1", lambda b, r, w: b[(r - 1) * (len(b) // w): r * (len(b) // w)],
       "one rank behind"),
    _w(SD, "world-rows", lambda b, r, w: b[r * w: (r + 1) * w], "world_size rows"),
    _w(SD, "float-rows", lambda b, r, w: b.chunk(w)[r].float(),
       "returned torch.float32 .* where the package returns torch.int64"),
    _w(SD, "whole-batch", lambda b, r, w: b, "whole batch"),
    _w(SD, "all-chunks", lambda b, r, w: b.chunk(w), "returned a tuple, not a tensor"),
    _w(MP, "padding-too", lambda h, m: F.normalize(h.mean(1), dim=-1), "averaged the padding"),
    _w(MP, "not-unit", lambda h, m: _pool(h, m, normalize=False), "length 1"),
    _w(MP, "first-token", lambda h, m: F.normalize(h[:, 0], dim=-1), "first token"),
    _w(MP, "last-token", lambda h, m: F.normalize(h[:, -1], dim=-1), "last position"),
    _w(MP, "max-pool", lambda h, m: F.normalize(h.masked_fill(~m[..., None], -INF).amax(1),
                                                dim=-1), "largest value"),
    _w(MP, "unit-tokens", lambda h, m: _pool(F.normalize(h, dim=-1), m), "each token to length"),
    _w(MP, "mask-reversed", lambda h, m: _pool(h, ~m), "padding alone"),
    _w(Q8, "unsigned", lambda raw: _q8_0(raw, signed=False).flatten(), "unsigned"),
    _w(Q8, "no-scale", lambda raw: _q8_0(raw, scaled=False).flatten(), "left out the scale"),
    _w(Q8, "bfloat16-scale", lambda raw: _q8_0(raw, scale_dtype=torch.bfloat16).flatten(),
       "bfloat16"),
    _w(Q8, "not-flat", lambda raw: _q8_0(raw), r"\(blocks, 32\)"),
    _w(Q8, "float16", lambda raw: _q8_0(raw).flatten().half(), "float16"),
    _w(LO, "by-alpha", lambda x, W, b, A, B, al: _lora(x, W, b, A, B, al, lambda a, r: a),
       "alpha / r"),
    _w(LO, "r-over-alpha", lambda x, W, b, A, B, al: _lora(x, W, b, A, B, al, lambda a, r: r / a),
       "swapped r and alpha"),
    _w(LO, "rslora", lambda x, W, b, A, B, al: _lora(x, W, b, A, B, al, lambda a, r: a / r ** .5),
       "rsLoRA"),
    _w(LO, "no-base", lambda x, W, b, A, B, al: _lora(x, W, b, A, B, al) - x @ W.T - b,
       "lacks the frozen layer"),
    _w(LO, "no-update", lambda x, W, b, A, B, al: x @ W.T + b, "no update"),
    _w(LO, "no-bias", lambda x, W, b, A, B, al: _lora(x, W, b, A, B, al) - b, "bias b"),
    _w(LO, "all-scaled", lambda x, W, b, A, B, al: (x @ W.T + b + x @ A.T @ B.T) * al / A.shape[0],
       "output too"),
]


@pytest.mark.parametrize("checker", RIGHT, ids=lambda c: c.__name__)
def test_right_answers_pass(checker, capsys):
    for right in RIGHT[checker]:
        checker(right)
    out = capsys.readouterr().out
    assert out.count("cases agree with the package") == len(RIGHT[checker]), out


@pytest.mark.parametrize("checker, wrong, phrase", WRONG)
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
    for checker, wrong, _ in (p.values for p in WRONG if "float64" not in p.id):  # (its
        with pytest.raises(E.ExerciseError) as e:  # -1.8e308 is a number, said as one)
            checker(wrong)
        assert "e+308" not in str(e.value), str(e.value)
    def dropped_first(logits, p):
        return _top_p(logits, p).index_fill(-1, torch.tensor([0]), -INF)
    with pytest.raises(E.ExerciseError, match=r"largest difference inf at \[0, 0\] \(yours "
                       r"-inf, the package's 3\)"):
        E.check_top_p(dropped_first)


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
    E.check_lora(_lora)  # builds layers, whose initialisation draws random numbers
    E.check_softmax(lambda s: (torch.rand(1), softmax(s))[1])  # a reader's own draw
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

    def lora(x, W, b, A, B, alpha):
        out = _lora(x, W, b, A, B, alpha)
        for t in (x, W, b, A, B):
            t.zero_()
        return out

    def top_p(logits, p):
        out = _top_p(logits, p)
        logits.fill_(0.0)
        return out

    E.check_attention(attention)
    E.check_cache_step(step)
    E.check_lora(lora)
    E.check_top_p(top_p)
    E.check_projections(lambda x, s, a, b, c: (x @ a, s @ b, (s @ c, s.zero_())[0]))
    assert capsys.readouterr().out.count("agree with the package") == 5


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


def test_a_named_mistake_also_says_where_and_by_how_much():
    with pytest.raises(E.ExerciseError, match=r"\(on logits \(2, 5, 7\): largest difference "
                       r"[0-9.e+-]+ \(yours [0-9.e+-]+, the package's [0-9.e+-]+\)\)$"):
        E.check_next_token_loss(lambda lg, ids: _loss(lg, ids, reduction="sum"))


def test_the_two_values_of_a_small_difference_are_told_apart():
    "Yours and the package's are printed with digits enough to differ, in plain notation."
    with pytest.raises(E.ExerciseError) as e:
        E.check_layer_norm(lambda x, eps: torch.nn.functional.layer_norm(
            x, x.shape[-1:], eps=eps) * 1.001)
    m = re.search(r"yours (\S+), the package's (\S+)\)", str(e.value))
    assert m and m.group(1) != m.group(2) and "e+" not in m.group(0), str(e.value)
