"""Statements chapters 13-17 once got wrong, held to what is true (issue 28's list, items 11, 12, 13,
15): each pattern is the wrong claim; the page and the package must not make it again."""
import json

import pytest

from conftest import ROOT

WRONG = {
    r"transformers >= 4.43": "chat_template.jinja came later than 4.43 (late 2024)",
    r"our GPT (and Llama)": "Meta's Llama code rotates adjacent pairs; Hugging Face's port uses halves",
    r"(Llama, GPT-NeoX)": "Meta's Llama code rotates adjacent pairs; Hugging Face's port uses halves",
    r"stalls the next step's all-reduce": "with find_unused_parameters=False DDP raises at the next forward",
    r"one gradient: as many numbers as the model has parameters":
        "a ring all-reduce sends about 2(N-1)/N times the gradient per rank",
}
FILES = sorted((ROOT / "nbs").glob("1[3-7]_*.ipynb")) + sorted((ROOT / "nbs").glob("11_*.ipynb")) + [
    ROOT / "minitransformer" / m for m in ("training.py", "distributed.py", "pretrained.py", "gguf.py",
                                           "lora.py", "model.py")]


def _text(path) -> str:
    if path.suffix != ".ipynb":
        return path.read_text(encoding="utf-8")
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"])


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_claim_known_to_be_wrong(path):
    text = _text(path)
    found = [f"{claim!r}: {why}" for claim, why in WRONG.items() if claim in text]
    assert not found, f"{path.name} says {found}"


def test_ddp_text_names_the_flag():
    text = _text(ROOT / "nbs" / "14_distributed.ipynb")
    assert "find_unused_parameters" in text and "Expected to have finished reduction" in text
