"""minitransformer.exercises_2: the checkers of chapters 12-19 (built with the machinery of
minitransformer.exercises, tested in test_exercises.py). Each checker accepts the right answers
(the package's own functions, the appendix's and the chapters' solutions) and refuses every
wrong answer in WRONG with the sentence that names it; the global random state is left alone."""

import pytest
import torch

from minitransformer import exercises_2 as E
from minitransformer.distributed import shard_batch
from minitransformer.exercises import ExerciseError
from minitransformer.generation import top_p_filter
from minitransformer.instruct import IGNORE_ID
from minitransformer.lora import LoRALinear
from minitransformer.model import mean_pool
from minitransformer.quantised import QuantisedWeight, pack
from minitransformer.training import sequence_loss

F = torch.nn.functional
INF = float("inf")


# ---- right answers, written as a reader would (helpers for the wrong ones too) ----
def _top_p(logits, p, within=False, in_order=False, on_scores=False, fill=-INF):
    x = logits if on_scores else logits.softmax(-1)
    if in_order:
        x, order = x, torch.arange(x.shape[-1]).expand_as(x)
    else:
        x, order = x.sort(-1, descending=True)
    keep = x.cumsum(-1) <= p if within else x.cumsum(-1) - x < p
    keep = torch.zeros_like(keep).scatter(-1, order, keep)
    return logits.masked_fill(~keep, fill)


def _top_p_sorted(logits, p, descending=True, keep=lambda c, x, p: c - x < p):
    x, order = logits.softmax(-1).sort(-1, descending=descending)
    kept = torch.zeros_like(x, dtype=torch.bool).scatter(-1, order, keep(x.cumsum(-1), x, p))
    return logits.masked_fill(~kept, -INF)


def _loss(logits, ids, **ce):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), **ce)


def _pool(h, m, normalize=True):
    w = m.unsqueeze(-1).float()
    mean = (h * w).sum(1) / w.sum(1).clamp(min=1)
    return F.normalize(mean, dim=-1) if normalize else mean


def _q8_0(raw, signed=True, scaled=True, scale_dtype=torch.float16, scale_at=(0, 1)):
    blocks = raw.view(-1, 34)
    d = blocks[:, list(scale_at)].contiguous().view(scale_dtype).float() if scaled else 1.0
    q = blocks[:, 2:].contiguous()
    return d * (q.view(torch.int8) if signed else q).float()  # (blocks, 32)


def _lora(x, W, b, A, B, alpha, scale=None):
    r = A.shape[0]
    return x @ W.T + b + (alpha / r if scale is None else scale(alpha, r)) * (x @ A.T @ B.T)


def _package_lora(x, W, b, A, B, alpha):  # chapter 17's layer, holding the case's tensors
    base = torch.nn.Linear(W.shape[1], W.shape[0])
    layer = LoRALinear(base, r=A.shape[0], alpha=alpha)
    with torch.no_grad():
        for mine, theirs in ((base.weight, W), (base.bias, b), (layer.A, A), (layer.B, B)):
            mine.copy_(theirs)
        return layer(x)


def _package_q4_0(x, c, d):  # chapter 18's weight of blocks, from the case's codes and scales
    codes = c.to(torch.uint8)  # (O, nb, 32), weight order: low nibbles 0..15, high 16..31
    w = QuantisedWeight("q4_0", pack(codes[..., :16] | codes[..., 16:] << 4), d.T.clone())
    return F.linear(x, w)


def _q4_0(x, c, d, off=8, order=None):  # chapter 18's Ex 2; `off`, `order`: its slips
    xb = x.view(-1, 32)  # (nb, 32)
    c = c if order is None else c.unflatten(-1, order).mT.flatten(-2)
    return (d * ((xb * c).sum(-1) - off * xb.sum(-1))).sum(-1)


def _targets(prompt, full, start=None, own=False, last=True, fill=IGNORE_ID):
    "chapter 19's reply_targets_sketch; counted from position `start` (P - 1) on"
    start = len(prompt) - 1 if start is None else start
    nxt = [full[i] if own else full[i + 1] for i in range(len(full) - 1)]
    out = [fill] * start + nxt[start:]
    return out + [fill] if last else out


RIGHT = {  # checker: right answers (the package's own, then a reader's)
    E.check_top_p: [top_p_filter, _top_p],
    E.check_next_token_loss: [lambda lg, ids: sequence_loss(lg[:, :-1], ids[:, 1:]), _loss],
    E.check_shard: [shard_batch, lambda b, r, w: b.chunk(w)[r]],
    E.check_mean_pool: [mean_pool, _pool],
    E.check_q8_0: [lambda raw: _q8_0(raw).flatten()],
    E.check_lora: [_package_lora, _lora, lambda x, W, b, A, B, al: x @ W.T + b + al / A.shape[0] * x @ (B @ A).T],
    E.check_q4_0_linear: [
        _package_q4_0, _q4_0, lambda x, c, d: (x.view(-1, 32) * d[..., None] * (c - 8)).sum((-2, -1)),
        lambda x, c, d: F.linear(x, (d[..., None] * (c - 8)).flatten(1))],  # (the floats:
    E.check_reply_targets: [  # a checker cannot see them)
        _targets, lambda p, f: tuple(_targets(p, f)), lambda p, f: torch.tensor(_targets(p, f)),
        lambda p, f: ([IGNORE_ID] * (len(p) - 1) + f[len(p):] + [IGNORE_ID])],
}
RIGHT[E.check_top_p].append(  # Hugging Face's way: drop the least likely tokens up to 1 - p
    lambda lg, p: (lambda pr, order: lg.masked_fill(torch.zeros_like(lg, dtype=torch.bool)
                   .scatter(-1, order, pr.cumsum(-1) <= 1 - p), -INF))(*lg.softmax(-1).sort(-1)))


def _w(checker, name, fn, phrase):
    return pytest.param(checker, fn, phrase, id=f"{checker.__name__[6:]}-{name}")


TP, NL, SD, MP = E.check_top_p, E.check_next_token_loss, E.check_shard, E.check_mean_pool
Q8, LO, Q4, RT = E.check_q8_0, E.check_lora, E.check_q4_0_linear, E.check_reply_targets

WRONG = [  # checker, a name, a wrong answer, words its sentence must contain
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
    # slips that once got only a generic message, a wrong name or a raw error
    _w(TP, "ascending", lambda lg, p: _top_p_sorted(lg, p, descending=False),
       "sorted the probabilities in ascending order"),
    _w(TP, "ascending-within", lambda lg, p: _top_p_sorted(lg, p, descending=False,
                                                           keep=lambda c, x, p: c <= p),
       "ascending order"),
    _w(TP, "inverted", lambda lg, p: _top_p_sorted(lg, p, keep=lambda c, x, p: c - x >= p),
       "your comparison is inverted"),
    _w(TP, "inverted-within", lambda lg, p: _top_p_sorted(lg, p, keep=lambda c, x, p: c > p),
       "your comparison is inverted"),
    _w(TP, "mask-inverted", lambda lg, p: lg.masked_fill(_top_p(lg, p) > -INF, -INF),
       "your comparison is inverted"),
    _w(LO, "r-from-B-rows", lambda x, W, b, A, B, al: _lora(
        x, W, b, A, B, al, lambda a, r: a / B.shape[0]), r"took r from the layer's width, "
       r"B.shape\[0\] or A.shape\[1\] \(8\); r is the rank, A.shape\[0\]"),
    _w(LO, "B-times-A", lambda x, W, b, A, B, al: x @ W.T + b + al / A.shape[0] * x @ (B @ A),
       r"multiplied x by B A, which is \(out, in\)"),
    _w(NL, "roll", lambda lg, ids: F.cross_entropy(lg.flatten(0, 1), ids.roll(-1, 1).flatten()),
       r"from ids.roll\(-1\), which wraps"),
    _w(NL, "roll-flat", lambda lg, ids: F.cross_entropy(lg.flatten(0, 1), ids.roll(-1).flatten()),
       r"from ids.roll\(-1\)"),
    _w(SD, "one-row-too-many", lambda b, r, w: b[r * (len(b) // w): (r + 1) * (len(b) // w) + 1],
       "one row too many"),
    _w(SD, "one-row-too-few", lambda b, r, w: b[r * (len(b) // w): (r + 1) * (len(b) // w) - 1],
       "one row too few"),
    _w(Q8, "scale-bytes-swapped", lambda raw: _q8_0(raw, scale_at=[1, 0]).flatten(),
       "swapped the scale's two bytes: GGUF is little-endian"),
    _w(Q8, "scale-at-the-end", lambda raw: _q8_0(raw, scale_at=[32, 33]).flatten(),
       "read the scale from the block's last two bytes; it comes first"),
    _w(Q8, "scale-last-layout", lambda raw: (lambda b: (b[:, 32:].contiguous().view(
        torch.float16).float() * b[:, :32].contiguous().view(torch.int8)).flatten())(
        raw.view(-1, 34)), "last two bytes"),
    _w(MP, "sum-over-T", lambda h, m: (h * m[..., None]).sum(1) / h.shape[1],
       "divided the real tokens' sum by T, padding included, and did not scale"),
    _w(MP, "mean-not-unit", lambda h, m: h.mean(1), "averaged the padding too, and did not"),
    # chapter 18's Ex 2 (my_q4_0_linear) and chapter 19's reply_targets_sketch
    _w(Q4, "c-8-forgotten", lambda x, c, d: _q4_0(x, c, d, off=0), "you forgot c - 8"),
    _w(Q4, "c-plus-8", lambda x, c, d: _q4_0(x, c, d, off=-8), "you added 8"),
    _w(Q4, "offset-once-a-block", lambda x, c, d: (d * ((x.view(-1, 32) * c).sum(-1) - 8)).sum(-1),
       "subtracted 8 once per block, not per weight"),
    _w(Q4, "offset-per-product", lambda x, c, d: (d * (x.view(-1, 32) * c - 8).sum(-1)).sum(-1),
       "applied the offset per weight without its input"),
    _w(Q4, "offset-whole-row", lambda x, c, d: (
        d * ((x.view(-1, 32) * c).sum(-1) - 8 * x.sum())).sum(-1), "applied per block"),
    _w(Q4, "offset-unscaled", lambda x, c, d: (
        (d * (x.view(-1, 32) * c).sum(-1)).sum(-1) - 8 * x.sum()), "your offset is -8, not -8·d"),
    _w(Q4, "nibble-order", lambda x, c, d: _q4_0(x, c, d, order=(2, 16)), "nibble order"),
    _w(Q4, "nibble-order-back", lambda x, c, d: _q4_0(x, c, d, order=(16, 2)), "nibble order"),
    _w(Q4, "per-block", lambda x, c, d: d * ((x.view(-1, 32) * c).sum(-1) - 8 * x.view(-1, 32)
                                             .sum(-1)), r"one sum per block, \(O, nb\)"),
    _w(RT, "prompt-last-masked", lambda p, f: _targets(p, f, start=len(p)),
       "you left out the prompt's last position: it predicts the reply's first id"),
    _w(RT, "one-too-early", lambda p, f: _targets(p, f, start=max(len(p) - 2, 0)),
       "counted one position too early"),
    _w(RT, "no-shift", lambda p, f: _targets(p, f, own=True), "each position's own id"),
    _w(RT, "no-shift-no-last", lambda p, f: _targets(p, f, own=True)[:-1] + [f[-1]],
       "each position's own id"),
    _w(RT, "prompt-counted", lambda p, f: _targets(p, f, start=0), "prompt's targets too"),
    _w(RT, "no-last", lambda p, f: _targets(p, f, last=False), "left out the last position"),
    _w(RT, "reply-only", lambda p, f: f[len(p):], "returned the reply's ids"),
    _w(RT, "fill-0", lambda p, f: _targets(p, f, fill=0),
       r"marked the targets that do not count with 0; use IGNORE_ID \(-100\)"),
    _w(RT, "fill-None", lambda p, f: _targets(p, f, fill=None),
       "returned a list holding None on a prompt of 5 ids .*; the package returns a list of ints"),
]


# tests/unit/test_exercises.py runs RIGHT and WRONG with chapters 1–11's: every right answer
# passes, every wrong one is refused with its named mistake


def test_every_checker_is_covered():
    checkers = set(E.__all__)
    assert all(n.startswith("check_") for n in checkers), checkers
    assert checkers == {c.__name__ for c in RIGHT}
    assert {p.values[0].__name__ for p in WRONG} == checkers
    assert len(WRONG) >= 50


def test_no_message_prints_an_infinity_as_a_number():
    for checker, wrong, _ in (p.values for p in WRONG if "float64" not in p.id):  # (its
        with pytest.raises(ExerciseError) as e:  # -1.8e308 is a number, said as one)
            checker(wrong)
        assert "e+308" not in str(e.value), str(e.value)
    def dropped_first(logits, p):
        return _top_p(logits, p).index_fill(-1, torch.tensor([0]), -INF)
    with pytest.raises(ExerciseError, match=r"largest difference inf at \[0, 0\] \(yours "
                       r"-inf, the package's 3\)"):
        E.check_top_p(dropped_first)


def test_checkers_leave_the_random_state_alone():
    torch.manual_seed(0)
    expected = torch.randn(3)
    torch.manual_seed(0)
    E.check_lora(_lora)  # builds layers, whose initialisation draws random numbers
    E.check_shard(lambda b, r, w: (torch.rand(1), shard_batch(b, r, w))[1])  # a reader's draw
    assert torch.equal(torch.randn(3), expected)


def test_a_right_function_that_changes_its_inputs_still_passes(capsys):
    def lora(x, W, b, A, B, alpha):
        out = _lora(x, W, b, A, B, alpha)
        for t in (x, W, b, A, B):
            t.zero_()
        return out

    def top_p(logits, p):
        out = _top_p(logits, p)
        logits.fill_(0.0)
        return out

    E.check_lora(lora)
    E.check_top_p(top_p)
    assert capsys.readouterr().out.count("agree with the package") == 2


def test_a_named_mistake_also_says_where_and_by_how_much():
    with pytest.raises(ExerciseError, match=r"\(on logits \(2, 5, 7\): largest difference "
                       r"[0-9.e+-]+ \(yours [0-9.e+-]+, the package's [0-9.e+-]+\)\)$"):
        E.check_next_token_loss(lambda lg, ids: _loss(lg, ids, reduction="sum"))
