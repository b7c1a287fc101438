"""minitransformer.exercises: each checker accepts a right answer, names each known mistake in
its sentence, reports a reader's exception with the case, and leaves the global random state
alone."""

import math

import pytest
import torch

from minitransformer import exercises as E

F = torch.nn.functional


def _softmax(s):
    top = s.amax(-1, keepdim=True)
    e = (s - torch.where(torch.isfinite(top), top, 0.0)).exp()
    return e / e.sum(-1, keepdim=True).clamp_min(1e-30)


def _attention(q, k, v, mask=None, scale=None, dim=-1):
    s = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return s.softmax(dim) @ v


def _rope(x, pos, shift=0, pairs=False):
    D = x.shape[-1]
    a = (pos + shift).float()[:, None] * 10000 ** (-torch.arange(0, D, 2).float() / D)
    c, s = a.cos(), a.sin()
    if pairs:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).flatten(-2)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], -1)


def _top_p(logits, p, within=False, in_order=False, on_scores=False):
    x = logits if on_scores else logits.softmax(-1)
    x, order = (x, torch.arange(x.shape[-1]).expand_as(x)) if in_order else x.sort(-1, descending=True)
    keep = x.cumsum(-1) <= p if within else x.cumsum(-1) - x < p
    keep = torch.zeros_like(keep).scatter(-1, order, keep)
    return logits.masked_fill(~keep, float("-inf"))


def _ln(x, eps, unbiased=False):
    return (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True, unbiased=unbiased) + eps).sqrt()


def _step(kc, vc, q, k, v, past_only=False):
    K, V = torch.cat([kc, k], -2), torch.cat([vc, v], -2)
    out = _attention(q, kc, vc) if past_only and kc.shape[-2] else _attention(q, K, V)
    return out, K, V


def _lora(x, W, b, A, B, alpha, scale_by_r=True):
    return x @ W.T + b + (alpha / A.shape[0] if scale_by_r else alpha) * (x @ A.T @ B.T)


def _mask(T, S, diag=None, polarity=True, dtype=torch.bool):
    m = torch.ones(T, S, dtype=torch.bool).tril(S - T if diag is None else diag)
    return (m if polarity else ~m).to(dtype)


def _count(V, T, C, L):
    return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def _next_token_loss(logits, ids):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def _pool(h, m, normalize=True):
    w = m.unsqueeze(-1).float()
    mean = (h * w).sum(1) / w.sum(1).clamp(min=1)
    return F.normalize(mean, dim=-1) if normalize else mean


def _q8_0(raw, signed=True, scaled=True):
    blocks = raw.view(-1, 34)
    d = blocks[:, :2].contiguous().view(torch.float16).float() if scaled else 1.0
    q = blocks[:, 2:].contiguous()
    return (d * (q.view(torch.int8) if signed else q).float()).flatten()


CASES = [  # checker, a right answer, [(a wrong answer, words its sentence must contain)]
    (E.check_softmax, _softmax, [
        (lambda s: s.exp() / s.exp().sum(-1, keepdim=True), "overflows"),
        (lambda s: (s - s.amax(-1, keepdim=True)).exp(), "not normalised"),
        (lambda s: s.softmax(-1), "not NaN"),
        (lambda s: s.softmax(0), "along axis 0")]),
    (E.check_embedding, lambda ids, t: t[ids], [
        (lambda ids, t: t[(ids + 1) % t.shape[0]], "one token off"),
        (lambda ids, t: t[ids][..., :1], "returned shape")]),
    (E.check_projections, lambda x, s, a, b, c: (x @ a, s @ b, s @ c), [
        (lambda x, s, a, b, c: (x @ a, x @ b, x @ c), "wrong input"),
        (lambda x, s, a, b, c: (x @ a, s @ b), r"must return \(q, k, v\)")]),
    (E.check_attention, _attention, [
        (lambda q, k, v, m: _attention(q, k, v, m, scale=1.0), "not scaled"),
        (lambda q, k, v, m: _attention(q, k, v, m, scale=q.shape[-1]), "divided the scores by D"),
        (lambda q, k, v, m: _attention(q, k, v, None if m is None else ~m), "polarity"),
        (lambda q, k, v, m: _attention(q, k, v, None), "ignores the mask"),
        (lambda q, k, v, m: _attention(q, k, v, m, dim=-2), "over the queries")]),
    (E.check_split_heads, lambda x, h: x.unflatten(-1, (h, -1)).transpose(-3, -2), [
        (lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1), "directly"),
        (lambda x, h: x.unflatten(-1, (-1, h)).permute(0, 3, 1, 2), "every H-th")]),
    (E.check_feedforward, lambda x, w1, b1, w2, b2: F.gelu(x @ w1 + b1) @ w2 + b2, [
        (lambda x, w1, b1, w2, b2: F.gelu(x @ w1 + b1, approximate="tanh") @ w2 + b2, "tanh"),
        (lambda x, w1, b1, w2, b2: F.relu(x @ w1 + b1) @ w2 + b2, "ReLU"),
        (lambda x, w1, b1, w2, b2: (x @ w1 + b1) @ w2 + b2, "no activation")]),
    (E.check_rope, _rope, [
        (lambda x, p: _rope(x, p, shift=1), "ahead"),
        (lambda x, p: _rope(x, p, shift=-1), "behind"),
        (lambda x, p: _rope(x, p, pairs=True), "neighbouring"),
        (lambda x, p: _rope(x, -p), "wrong way")]),
    (E.check_causal_mask, _mask, [
        (lambda T, S: _mask(T, S, polarity=False), "polarity"),
        (lambda T, S: _mask(T, S, diag=0), "top-left"),
        (lambda T, S: _mask(T, S, diag=S - T - 1), "own position"),
        (lambda T, S: _mask(T, S, dtype=torch.float32), "boolean")]),
    (E.check_layer_norm, _ln, [
        (lambda x, eps: _ln(x, eps, unbiased=True), "unbiased"),
        (lambda x, eps: (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True, unbiased=False) + eps),
         "inside the square root"),
        (lambda x, eps: x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt(), "RMSNorm")]),
    (E.check_cache_step, _step, [
        (lambda kc, vc, q, k, v: _step(kc, vc, q, k, v, past_only=True), "only to the past"),
        (lambda kc, vc, q, k, v: (_attention(q, torch.cat([kc, k], -2), torch.cat([vc, v], -2)),
                                  torch.cat([k, kc], -2), torch.cat([v, vc], -2)), "before the past")]),
    (E.check_parameter_count, _count, [
        (lambda V, T, C, L: _count(V, T, C, L) + V * C, "tied"),
        (lambda V, T, C, L: _count(V, T, C, L) - T * C, "learned positions"),
        (lambda V, T, C, L: _count(V, T, C, L) - 2 * C, "final norm"),
        (lambda V, T, C, L: float(_count(V, T, C, L)), "not an int")]),
    (E.check_top_p, _top_p, [
        (lambda lg, p: _top_p(lg, p, within=True), "reaches p"),
        (lambda lg, p: _top_p(lg, p, in_order=True), "token order"),
        (lambda lg, p: _top_p(lg, p, on_scores=True), "added up the scores"),
        (lambda lg, p: _top_p(lg, p).softmax(-1), "returned probabilities"),
        (lambda lg, p: _top_p(lg, p).nan_to_num(neginf=0.0), "must be -inf")]),
    (E.check_next_token_loss, _next_token_loss, [
        (lambda lg, ids: F.cross_entropy(lg.flatten(0, 1), ids.flatten()), "own token"),
        (lambda lg, ids: F.cross_entropy(lg[:, 1:].flatten(0, 1), ids[:, :-1].flatten()),
         "wrong way"),
        (lambda lg, ids: F.cross_entropy(lg[:, :-1].flatten(0, 1), ids[:, 1:].flatten(),
                                         reduction="sum"), "summed")]),
    (E.check_shard, lambda b, r, w: b[r * (len(b) // w): (r + 1) * (len(b) // w)], [
        (lambda b, r, w: b[r::w], "round-robin"),
        (lambda b, r, w: b[(r + 1) * (len(b) // w): (r + 2) * (len(b) // w)], "one rank off")]),
    (E.check_mean_pool, _pool, [
        (lambda h, m: F.normalize(h.mean(1), dim=-1), "padding too"),
        (lambda h, m: _pool(h, m, normalize=False), "length 1"),
        (lambda h, m: F.normalize(h[:, 0], dim=-1), "first token")]),
    (E.check_q8_0, _q8_0, [
        (lambda raw: _q8_0(raw, signed=False), "unsigned"),
        (lambda raw: _q8_0(raw, scaled=False), "left out the scale")]),
    (E.check_lora, _lora, [
        (lambda x, W, b, A, B, alpha: _lora(x, W, b, A, B, alpha, scale_by_r=False), "alpha / r"),
        (lambda x, W, b, A, B, alpha: x @ W.T + b, "no update")]),
]


@pytest.mark.parametrize("checker, right, wrongs", CASES, ids=[c[0].__name__ for c in CASES])
def test_checker_accepts_right_and_names_mistakes(checker, right, wrongs, capsys):
    checker(right)
    assert "agree with the package" in capsys.readouterr().out
    for wrong, words in wrongs:
        with pytest.raises(E.ExerciseError, match=words):
            checker(wrong)


def test_every_checker_is_covered():
    checkers = {n for n in E.__all__ if n.startswith("check_")}
    assert checkers == {c[0].__name__ for c in CASES}


def test_a_readers_exception_names_the_case():
    def broken(scores):
        raise IndexError("index 3 is out of bounds")
    with pytest.raises(E.ExerciseError, match=r"raised IndexError \(index 3.*\) on scores of shape"):
        E.check_softmax(broken)


def test_a_wrong_value_type_and_a_non_function():
    with pytest.raises(E.ExerciseError, match="returned a list, not a tensor"):
        E.check_causal_mask(lambda T, S: [[True]])
    with pytest.raises(TypeError, match="takes your function, got int"):
        E.check_softmax(3)


def test_checkers_leave_the_random_state_alone():
    torch.manual_seed(0)
    expected = torch.randn(3)
    torch.manual_seed(0)
    E.check_lora(_lora)  # builds layers, whose initialisation draws random numbers
    assert torch.equal(torch.randn(3), expected)


def _named(checker, wrong, words):
    "The checker stops `wrong` with a sentence that contains `words`."
    with pytest.raises(E.ExerciseError, match=words):
        checker(wrong)


def test_softmax_over_another_axis_is_named():
    _named(E.check_softmax, lambda s: s.softmax(0), "along axis 0")
    _named(E.check_softmax, lambda s: s.softmax(-2) if s.dim() > 2 else _softmax(s),
           "along axis 1")
    _named(E.check_softmax, lambda s: s.exp() / s.exp().sum(0) if s.dim() > 1 else _softmax(s),
           "along axis 0")


def test_masking_after_the_softmax_is_named():
    def after(q, k, v, mask=None, fill=0.0):
        w = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1)
        return (w if mask is None else w.masked_fill(~mask, fill)) @ v
    _named(E.check_attention, after, "masked after the softmax")
    _named(E.check_attention, lambda q, k, v, m=None: after(q, k, v, m, float("-inf")),
           "masked after the softmax")
    def times_mask(q, k, v, mask=None):
        w = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1)
        return (w if mask is None else w * mask) @ v
    _named(E.check_attention, times_mask, "masked after the softmax")


def test_a_causal_mask_one_step_off_is_named():
    _named(E.check_causal_mask, lambda T, S: _mask(T, S, diag=S - T + 1), "one position ahead")
    _named(E.check_causal_mask, lambda T, S: _mask(T, S, diag=S - T - 1), "own position")


def test_a_wrong_rope_exponent_is_named():
    def rope(x, pos, two=2):
        D = x.shape[-1]
        theta = 10000.0 ** (-two * torch.arange(D // 2) / D)
        a = pos[:, None] * theta
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return torch.cat([x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()], -1)
    E.check_rope(rope)
    _named(E.check_rope, lambda x, pos: rope(x, pos, two=1), "wrong exponent")
    _named(E.check_rope, lambda x, pos: rope(x, pos, two=4), "wrong exponent")


def test_a_forgotten_bias_is_named():
    _named(E.check_feedforward, lambda x, w1, b1, w2, b2: F.gelu(x @ w1) @ w2 + b2, "bias b1")
    _named(E.check_feedforward, lambda x, w1, b1, w2, b2: F.gelu(x @ w1 + b1) @ w2, "bias b2")
    _named(E.check_feedforward, lambda x, w1, b1, w2, b2: F.gelu(x @ w1) @ w2, "both biases")
    _named(E.check_lora, lambda x, W, b, A, B, alpha: _lora(x, W, b, A, B, alpha) - b,
           "left out the frozen layer's bias")


def test_r_and_alpha_swapped_in_lora_is_named():
    def swapped(x, W, b, A, B, alpha):
        return x @ W.T + b + A.shape[0] / alpha * (x @ A.T @ B.T)
    _named(E.check_lora, swapped, "swapped r and alpha")


def test_top_p_left_in_sorted_order_is_named():
    def unsorted(logits, p, back=False):
        probs, order = logits.softmax(-1).sort(-1, descending=True)
        keep = probs.cumsum(-1) - probs < p
        kept = logits.gather(-1, order) if back else logits
        return kept.masked_fill(~keep, float("-inf"))
    _named(E.check_top_p, unsorted, "sorted order")
    _named(E.check_top_p, lambda lg, p: unsorted(lg, p, back=True), "sorted order")


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

    def feedforward(x, w1, b1, w2, b2):
        out = F.gelu(x @ w1 + b1) @ w2 + b2
        for t in (x, w1, b1, w2, b2):
            t.mul_(-1)
        return out

    def top_p(logits, p):
        out = _top_p(logits, p)
        logits.fill_(0.0)
        return out

    E.check_attention(attention)
    E.check_cache_step(step)
    E.check_lora(lora)
    E.check_feedforward(feedforward)
    E.check_top_p(top_p)
    E.check_projections(lambda x, s, a, b, c: (x @ a, s @ b, (s @ c, s.zero_())[0]))
    assert capsys.readouterr().out.count("agree with the package") == 6


def test_a_plain_mismatch_says_where_and_by_how_much():
    def off(q, k, v, mask=None):
        out = _attention(q, k, v, mask)
        if out.dim() == 3:
            out[1, 2, 0] += 0.41
        return out
    with pytest.raises(E.ExerciseError) as e:
        E.check_attention(off)
    assert str(e.value).startswith(
        "your attention returned different values on q (2, 4, 8), k (2, 6, 8), v (2, 6, 3), "
        "a (4, 6) mask: largest difference 0.41 at [1, 2, 0] (yours ")
    assert "the package's " in str(e.value)

    def one_wrong(T, S):
        m = _mask(T, S)
        m[0, 0] = False
        return m
    with pytest.raises(E.ExerciseError, match=r"on T = 3, S = 3: first difference at \[0, 0\]: "
                       r"yours False, the package's True"):
        E.check_causal_mask(one_wrong)
    with pytest.raises(E.ExerciseError, match=r"on logits \(1, 2, 3\): largest difference 0.5 \(yours"):
        E.check_next_token_loss(lambda lg, ids: _next_token_loss(lg, ids) + 0.5)
