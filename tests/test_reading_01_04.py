"""Checks moved out of the reader's path in chapters 1-4: the two attention paths agree on
random shapes and masks, follow one rule for non-finite inputs, and name a caller's
mistakes; and statements the pages of chapters 1-3 make that a slip in prose would
contradict."""
import math
import re
from pathlib import Path

import pytest
import torch

from minitransformer.attention import attention_with_weights, scaled_dot_product_attention


def test_both_attention_paths_agree_on_random_shapes_and_masks():
    g = torch.Generator().manual_seed(1)
    for trial in range(40):
        B, H = torch.randint(1, 4, (2,), generator=g).tolist()
        T, S, D, Dv = torch.randint(1, 12, (4,), generator=g).tolist()
        q = torch.randn(B, H, T, D, generator=g)
        k, v = torch.randn(B, H, S, D, generator=g), torch.randn(B, H, S, Dv, generator=g)
        mask_shape = [(B, H, T, S), (B, 1, 1, S), (T, S), (B, 1, T, S)][trial % 4]
        mask = None if trial % 5 == 0 else torch.rand(mask_shape, generator=g) < 0.7
        scale = None if trial % 3 else 0.3
        slow, _ = attention_with_weights(q, k, v, mask, scale=scale)
        fast = scaled_dot_product_attention(q, k, v, mask, scale=scale)
        assert not fast.isnan().any() and not slow.isnan().any(), f"trial {trial}: NaN"
        torch.testing.assert_close(fast, slow, atol=1e-6, rtol=0,
                                   msg=lambda m: f"trial {trial}: {m}")


def test_non_finite_inputs_follow_one_rule_on_both_paths():
    "NaN in the same places on both paths, the same values elsewhere, zeros where blind."
    g = torch.Generator().manual_seed(2)
    for trial in range(400):
        T, S = torch.randint(1, 5, (2,), generator=g).tolist()
        qkv = [torch.randn(2, n, d, generator=g) for n, d in ((T, 3), (S, 3), (S, 2))]
        for t in qkv:  # about one entry in ten becomes NaN, +inf or -inf
            where = torch.rand(t.shape, generator=g) < 0.1
            pick = torch.randint(0, 3, t.shape, generator=g)
            odd = torch.tensor([float("nan"), float("inf"), -float("inf")])[pick]
            t[where] = odd[where]
        m = torch.rand(2, T, S, generator=g) < 0.7 if trial % 2 else None
        slow = attention_with_weights(*qkv, m)[0]
        fast = scaled_dot_product_attention(*qkv, m)
        assert torch.equal(slow.isnan(), fast.isnan()), f"trial {trial}: NaN differs"
        torch.testing.assert_close(slow.nan_to_num(0.0), fast.nan_to_num(0.0),
                                   atol=1e-5, rtol=0)
        if m is not None:
            blind = ~m.any(-1)  # queries that may see no key: zeros
            assert (fast[blind] == 0).all(), f"trial {trial}: a blind query is not 0"


def test_a_masked_infinite_score_becomes_nan():
    "Masking adds -inf: a masked +inf score gives +inf - inf = NaN, as the text says."
    q, v = torch.ones(1, 1), torch.ones(2, 1)
    k = torch.tensor([[float("inf")], [1.0]])
    mask = torch.tensor([[False, True]])
    out, _ = attention_with_weights(q, k, v, mask)
    assert out.isnan().all()


@pytest.fixture
def qkv():
    return torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)


def test_attention_names_a_callers_mistakes(qkv):
    q, k, v = qkv
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    with pytest.raises(TypeError, match=r"mask must be boolean \(True = may attend\)"):
        scaled_dot_product_attention(q, k, v, mask.float())
    bad_mask = torch.ones(3, 4, dtype=torch.bool)  # (T, S) would be (3, 5)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 4\) does not broadcast to "
                                         r"the attention weights' shape \(2, 3, 5\)"):
        scaled_dot_product_attention(q, k, v, bad_mask)
    with pytest.raises(ValueError, match=r"keys \(2, 4, 4\) and values \(2, 5, 6\)"):
        attention_with_weights(q, k[:, :4], v)
    with pytest.raises(ValueError, match=r"dropout_p must be a number in \[0, 1\)"):
        attention_with_weights(q, k, v, dropout_p=1.0)


# Chapter 1: softmax, check_attention_weights and mix refuse what they cannot mix.
from minitransformer.embeddings import (  # noqa: E402
    SPECIAL_TOKENS, TokenEmbedding, Tokenizer, check_id_list, check_token_ids, pad_ids)
from minitransformer.mixing import check_attention_weights, mix, softmax  # noqa: E402
from minitransformer.qkv import QKVProjection, check_qkv  # noqa: E402
from conftest import notebook_cells as _cells  # noqa: E402


def test_softmax_matches_torch_on_every_dim_and_in_bfloat16():
    scores = torch.randn(4, 5, 7, generator=torch.Generator().manual_seed(0)) * 10
    for dim in (0, 1, -1):
        torch.testing.assert_close(softmax(scores, dim), torch.softmax(scores, dim),
                                   atol=1e-6, rtol=0)
    torch.testing.assert_close(softmax(scores.bfloat16()).float(),
                               torch.softmax(scores, -1), atol=1e-2, rtol=0)
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


def test_token_embedding_refuses_bad_ids_and_arguments():
    emb = TokenEmbedding(22, 4)
    cases = [
        (lambda: emb(torch.tensor([4, 22, 3])), ValueError, r"token ids\[1\] = 22"),
        (lambda: emb(torch.tensor([[0, -1]])), ValueError, r"must lie in \[0, 22\)"),
        (lambda: emb(torch.tensor([0.0, 1.0])), TypeError, "integer tensor"),
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


# Chapter 3: QKVProjection and check_qkv name what does not fit.
def test_projection_and_check_qkv_refuse_what_does_not_fit():
    proj = QKVProjection(d_model=12, d_q=7, d_v=5)
    Q, K, V = proj(torch.randn(3, 12), context=torch.randn(4, 12))
    cases = [
        (lambda: check_qkv(Q, K, V[:3]), ValueError,
         r"keys \(4, 7\) and values \(3, 5\) must have the same length S"),
        (lambda: check_qkv(Q, K[:, :6], V), ValueError,
         r"queries \(3, 7\) and keys \(4, 6\) must have the same width D"),
        (lambda: proj(torch.randn(3, 10)), ValueError,
         r"x has width 10 \(shape \(3, 10\)\) but this projection expects d_model=12"),
        (lambda: proj(torch.randn(2, 3, 12), context=torch.randn(3, 4, 12)), ValueError,
         r"x \(2, 3, 12\) and context \(3, 4, 12\) have batch dimensions that do not"),
        (lambda: QKVProjection(12, 7, dtype=torch.int64), TypeError,
         "dtype must be a floating-point torch.dtype"),
        (lambda: QKVProjection(12, 0), ValueError, "d_q must be a positive int"),
        (lambda: proj(torch.zeros(3, 12, dtype=torch.float64)), TypeError,
         "x has dtype torch.float64, but the projection's weights are torch.float32"),
        (lambda: proj(torch.zeros(3, 12), context=[[0.5] * 12]), TypeError,
         "context must be a torch.Tensor"),
    ]
    for call, error, message in cases:
        with pytest.raises((TypeError, ValueError), match=message) as info:
            call()
        assert info.type is error, (message, info.type)


# Statements the pages of chapters 1-3 make.
ROOT = Path(__file__).resolve().parent.parent


def _markdown(stem: str) -> str:
    return "\n".join("".join(c["source"]) for c in _cells(stem)
                     if c["cell_type"] == "markdown")


def _sentences(stem: str) -> list[str]:
    return re.split(r"(?<=\.)\s", _markdown(stem))


@pytest.mark.parametrize("stem", ["01_mixing", "02_embeddings", "03_qkv"])
def test_every_exercise_has_exactly_one_solution_dropdown(stem):
    exercises, current = {}, None
    for cell in _cells(stem):
        text = "".join(cell["source"])
        if cell["cell_type"] != "markdown":
            continue
        if text.startswith("## ") and current is not None:
            break  # the section after the exercises
        found = re.match(r"\*\*Exercise (\d+)\.\*\*", text)
        if found:
            current = int(found[1])
            exercises[current] = []
        if current is not None:
            exercises[current] += re.findall(r"^:::\{dropdown\}\s*(.*)$", text, re.M)
            exercises[current] += ["admonition"] * len(re.findall(
                r"\{admonition\}[^\n]*\n:class:[^\n]*dropdown", text))
    assert sorted(exercises) == list(range(1, len(exercises) + 1)) and exercises, stem
    for n, dropdowns in exercises.items():
        assert dropdowns == ["Solution"], f"{stem}, exercise {n}: {dropdowns}"


def test_the_recurrent_demo_prints_which_state_each_step_reads():
    cell = next(c for c in _cells("01_mixing")
                if "".join(c["source"]).count("h.append(torch.tanh(") == 1)
    printed = "".join(t for o in cell["outputs"] for t in o.get("text", []))
    steps = [f"step {t}: h{t} = f(h{t - 1}, x{t})" for t in range(1, 7)]
    assert printed.splitlines()[-6:] == steps, printed


def test_the_lookup_skips_all_but_c_of_the_products_multiplications():
    md = _markdown("02_embeddings")
    assert r"skips the $(|\mathcal V| - 1) \cdot C$ multiplications by zero" in md
    assert r"skipping $|\mathcal V| - 1$ multiplications" not in md
    vocab, width = 50_257, 768  # GPT-2
    assert f"{vocab * width / 1e6:.1f} million multiplications per token" in md
    assert f"all but {width} of them by zero" in md


def test_what_scale_true_multiplies_by_at_4_and_at_512():
    for d_model in (4, 512):
        emb = TokenEmbedding(5, d_model, scale=True)
        ids = torch.arange(5)
        torch.testing.assert_close(emb(ids), emb.weight * math.sqrt(d_model))
    paragraph = next(s for s in _markdown("02_embeddings").split("\n\n")
                     if "scale=True" in s and "512" in s)
    std = 0.02  # TokenEmbedding's init_std
    assert TokenEmbedding(5, 4).init_std == std
    claims = [r"$\sqrt{d_\text{model}} = \sqrt 4 = 2$", f"only to {2 * std:.2f}",
              rf"$\sqrt{{512}} \approx {math.sqrt(512):.1f}$",
              f"become about {std * math.sqrt(512):.2f}",
              rf"$1/\sqrt 2 \approx {1 / math.sqrt(2):.2f}$",
              f"some {round(1 / math.sqrt(2) / std)} times smaller"]
    for claim in claims:
        assert claim in paragraph, claim


def test_gpt2_c_attn_is_stored_in_out_the_transpose_of_nn_linear():
    about = [s for s in _sentences("03_qkv") if "c_attn" in s]
    assert any("`(768, 2304)`" in s and "(in, out)" in s for s in about), about
    for sentence in about:
        assert "2304, 768" not in sentence and "stores one such matrix" not in sentence


def test_gpt2_conv1d_stores_in_out():
    pytorch_utils = pytest.importorskip("transformers.pytorch_utils")
    c_attn = pytorch_utils.Conv1D(3 * 768, 768)  # (nf = out, nx = in), as in GPT-2
    assert tuple(c_attn.weight.shape) == (768, 2304)
    x = torch.randn(2, 768)
    torch.testing.assert_close(c_attn(x), x @ c_attn.weight + c_attn.bias)


def test_chapter_3_motivates_three_matrices_before_its_module():
    texts = ["".join(c["source"]) for c in _cells("03_qkv")]
    first = {key: next(i for i, t in enumerate(texts) if key in t)
             for key in ("## Why three matrices", "## The module",
                         "class QKVProjection(nn.Module)")}
    assert (first["## Why three matrices"] < first["## The module"]
            < first["class QKVProjection(nn.Module)"]), first


def _sketch_and_export(stem: str, exported: str) -> tuple[int, int, str]:
    "Index of the first sketch cell, of the cell exporting `exported`, and the sketch."
    texts = ["".join(c["source"]) if c["cell_type"] == "code" else "" for c in _cells(stem)]
    sketches = [i for i, t in enumerate(texts) if not re.search(r"^#\|\s*export", t, re.M)
                and re.search(r"^(class \w*Sketch\b|def \w*_sketch\b)", t, re.M)]
    export = next(i for i, t in enumerate(texts)
                  if re.search(r"^#\|\s*export", t, re.M) and exported in t)
    assert sketches, f"{stem}: no sketch"
    return sketches[0], export, texts[sketches[0]]


def test_chapter_3_sketches_the_projection_before_its_module():
    sketch, export, text = _sketch_and_export("03_qkv", "class QKVProjection(")
    assert sketch < export, (sketch, export)
    assert "class QKVSketch(nn.Module)" in text and 10 <= len(text.splitlines()) <= 25
    cells = _cells("03_qkv")
    assert "hide-cell" in cells[export]["metadata"].get("tags", [])
    check = next("".join(c["source"]) for c in cells[export:]
                 if "QKVSketch(" in "".join(c["source"]))
    assert "load_state_dict" in check and "QKVProjection" in check


def test_chapter_4_makes_one_full_pass_and_sketches_it_before_the_scale_experiment():
    sketch, export, text = _sketch_and_export("04_attention", "def attention_with_weights(")
    assert sketch < export, (sketch, export)
    assert "def attention_sketch(q, k, v, mask=None)" in text
    assert 10 <= len(text.splitlines()) <= 15
    texts = ["".join(c["source"]) for c in _cells("04_attention")]
    first = {key: next(i for i, t in enumerate(texts) if key in t)
             for key in ("## One pass by hand", "def attention_sketch(",
                         "## Why divide by", "widths = [4, 16, 64, 256, 1024]")}
    assert (first["## One pass by hand"] < first["def attention_sketch("]
            < first["## Why divide by"] < first["widths = [4, 16, 64, 256, 1024]"]), first
    for name in ("def attention_with_weights(", "def scaled_dot_product_attention("):
        cell = next(c for c, t in zip(_cells("04_attention"), texts) if name in t)
        assert "hide-cell" in cell["metadata"].get("tags", []), name
    checks = [t for t in texts[export:] if "attention_sketch(" in t]
    assert any("attention_with_weights" in t for t in checks)
