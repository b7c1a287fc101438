"""Statements the pages of chapters 1-4 make that a slip in prose would contradict, and the
shape of chapters 3 and 4 (the motivation and a sketch before each module)."""

import math
import re

import pytest
import torch

from minitransformer.embeddings import TokenEmbedding

from helpers import notebook_cells as _cells


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
    assert printed.splitlines()[-7:-1] == steps, printed
    assert printed.splitlines()[-1] == "h6 computed without h5 differs from the real h6: True"


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


def test_chapter_2_sketches_the_tokenizer_and_the_table_before_the_package_classes():
    "A plain tokenizer and embedding come first; the package's classes are folded after."
    import sys
    from helpers import ROOT, cell_printed, defining_cell
    sys.path.insert(0, str(ROOT / "scripts"))
    import reading_path
    cells = _cells("02_embeddings")
    s = defining_cell(cells, "TokenizerSketch", exported=False)
    assert s == defining_cell(cells, "EmbeddingSketch", exported=False)
    assert reading_path.measure(ROOT / "nbs" / "02_embeddings.ipynb")["sketch_first"]
    assert "The idea, with nothing else" in "".join(cells[s - 1]["source"])
    body = [ln for ln in "".join(cells[s]["source"]).split("\n") if ln.strip()]
    assert 10 <= len(body) <= 25, f"the sketch is {len(body)} lines"
    for name in ("Vocabulary", "Tokenizer", "TokenEmbedding"):
        e = defining_cell(cells, name, exported=True)
        assert s < e and "hide-cell" in cells[e]["metadata"].get("tags", []), name
    check = next(c for c in cells[s + 1:] if c["cell_type"] == "code"
                 and "TokenizerSketch(" in "".join(c["source"])
                 and "EmbeddingSketch(" in "".join(c["source"]))
    lines = [ln for ln in cell_printed(check).split("\n") if "Sketch" in ln]
    assert len(lines) == 2 and all(ln.endswith("True") for ln in lines), lines


def test_the_tokenizer_sketch_computes_what_the_package_computes():
    "The sketch as the page shows it, run against the package on other texts."
    from collections import Counter

    from torch import nn

    from helpers import defining_cell
    from minitransformer.embeddings import Tokenizer
    cells = _cells("02_embeddings")
    src = "".join(cells[defining_cell(cells, "TokenizerSketch", exported=False)]["source"])
    ns = {"re": re, "Counter": Counter, "nn": nn, "torch": torch}
    exec(src.split("\nprint(")[0], ns)
    texts = ["b a c a b a.", "Zed zed, zed!", "c c b"]
    sketch, tok = ns["TokenizerSketch"](texts), Tokenizer.from_texts(texts)
    assert sketch.itos == tok.itos  # ties broken alphabetically, capitals first
    for text in texts + ["a q b ?", ""]:
        assert sketch.encode(text) == tok.encode(text), text
    emb = TokenEmbedding(len(tok), 6)
    table = ns["EmbeddingSketch"](emb.weight.detach().clone())
    ids = torch.tensor([[4, 0, 9], [1, 1, 2]])
    assert torch.equal(table(ids), emb(ids))
