"""Chapters 11 and 12: statements in the package and the figures that must stay true."""
import inspect
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from minitransformer import model as model_module
from minitransformer.model import GPTConfig

FIGURES = Path(__file__).resolve().parent.parent / "nbs" / "figures"


def _svg_text(name: str) -> str:
    root = ET.parse(FIGURES / name).getroot()
    words = " ".join(t.text or "" for t in root.iter() if t.tag.endswith("text"))
    return re.sub(r"\s+", " ", words + " " + (root.get("aria-label") or ""))


def test_gptconfig_docstring_names_the_gelu_it_uses():
    "GPT-2 computes GELU with the tanh approximation; GPTConfig's default is exact GELU."
    doc = GPTConfig.__doc__
    assert GPTConfig(vocab_size=10).activation == "gelu"
    assert "GPT-2's defaults" not in doc, doc
    assert "exact GELU" in doc and "gelu_tanh" in doc, doc


def test_rotary_layouts_are_attributed_correctly():
    "Meta's Llama rotates adjacent pairs; GPT-NeoX and Hugging Face's Llama use halves."
    source = inspect.getsource(model_module.TextConfig)
    assert "Llama, GPT-NeoX" not in source
    assert "Meta's" in source and "Hugging Face's Llama" in source, source


def test_left_padding_figure_says_the_cache_grows_per_step():
    words = _svg_text("12-left-padding.svg")
    assert "per row" not in words.split("cache grows")[-1][:40], words
    assert "per step" in words and "in every row" in words, words


def test_architecture_figure_draws_residual_paths_and_pre_norm():
    "Every sublayer has a norm in front and a residual addition (a circled plus)."
    root = ET.parse(FIGURES / "11-architecture.svg").getroot()
    circles = [e for e in root.iter() if e.tag.endswith("circle")]
    words = _svg_text("11-architecture.svg")
    sublayers = sum(words.count(s) for s in ("self-attention", "feed-forward",
                                            "cross-attention"))
    # GPT 2 + encoder 2 + decoder 3 sublayers, and the post-norm inset's one
    assert len(circles) == 2 + 2 + 3 + 1, len(circles)
    assert sublayers >= 7 and words.count("norm") >= 7 + 3, words
    assert "add & norm" not in words and "post-norm" in words, words
