"""Statements chapters 13-17 once got wrong, held to what is true: each pattern is the wrong claim;
the page and the package must not make it again.
The figures say what the code does, and the pages quote the tolerances and accuracies they print."""

import json
import re
import xml.etree.ElementTree as ET

import pytest

from helpers import ROOT, cell_printed as _printed, cell_source as _src, notebook_cells as _cells


WRONG = {
    r"transformers >= 4.43": "chat_template.jinja came later than 4.43 (late 2024)",
    r"our GPT (and Llama)": "Meta's Llama code rotates adjacent pairs; Hugging Face's port uses halves",
    r"(Llama, GPT-NeoX)": "Meta's Llama code rotates adjacent pairs; Hugging Face's port uses halves",
    r"stalls the next step's all-reduce": "with find_unused_parameters=False DDP raises at the next forward",
    r"one gradient: as many numbers as the model has parameters":
        "a ring all-reduce sends about 2(N-1)/N times the gradient per rank",
    r"averages over thousands of predictions": "a loss there is a mean over 16 x 64 = 1,024",
    r"The time budget and the learning rate follow rank 0's clock, broadcast at every step":
        "rank 0's clock is broadcast only when the run has a time budget",
    r"without ever being sent": "DDP copies rank 0's weights to every rank once, at the start",
    r"what is left of it is only what attention mixed":
        "each token's own position embedding carries its place too",
    r"fits every training sentence": "say what the probe's printed training accuracy is",
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


FIGURES = ROOT / "nbs" / "figures"


def _svg(name: str):
    "The figure's root element and all its words: texts, title, description, aria-label."
    root = ET.parse(FIGURES / name).getroot()
    words = " ".join(e.text or "" for e in root.iter()
                     if e.tag.rsplit("}", 1)[-1] in ("text", "title", "desc"))
    return root, re.sub(r"\s+", " ", words + " " + (root.get("aria-label") or ""))


def _tag(e) -> str:
    return e.tag.rsplit("}", 1)[-1]


def test_training_step_figure_clips_by_one_norm_over_all_weights():
    "clip_grad_norm_ takes one norm over every gradient together, not one per tensor."
    root, words = _svg("13-training-step.svg")
    assert "one ‖g‖ over all weights together" in words, words
    texts = [e for e in root.iter() if _tag(e) == "text"]
    clip = next(e for e in texts if e.text == "clip")
    box = min((e for e in root.iter() if _tag(e) == "rect"  # the smallest around "clip"
               and float(e.get("x")) < float(clip.get("x")) < float(e.get("x")) + float(e.get("width"))
               and float(e.get("y")) < float(clip.get("y")) < float(e.get("y")) + float(e.get("height"))),
              key=lambda e: float(e.get("width")) * float(e.get("height")))
    x0, width = float(box.get("x")), float(box.get("width"))
    y0, height = float(box.get("y")), float(box.get("height"))
    inside = [e for e in texts if x0 < float(e.get("x")) < x0 + width
              and y0 < float(e.get("y")) < y0 + height]
    assert len(inside) >= 4, [e.text for e in inside]
    for e in inside:  # centred lines; sans-serif averages under 0.6 em a character
        half = 0.6 * float(e.get("font-size")) * len(e.text) / 2
        assert x0 < float(e.get("x")) - half and float(e.get("x")) + half < x0 + width, e.text
        assert float(e.get("y")) < y0 + height - 4, e.text


def test_data_parallel_figure_sends_weights_only_at_the_start():
    "DDP copies rank 0's weights once when it wraps the model; afterwards only gradients travel."
    _, words = _svg("14-data-parallel.svg")
    claims = [m.start() for m in re.finditer(r"no weights", words)]
    assert claims, words
    for at in claims:
        assert "after the start" in words[max(0, at - 100):at], words[max(0, at - 100):at + 40]


def test_distributed_page_quotes_the_tolerances_it_checks():
    "The weights' and losses' tolerances in the prose are those asserted and printed."
    cells = _cells("14_distributed")
    run = next(c for c in cells if c["cell_type"] == "code" and "one = run(" in _src(c))
    code, printed = _src(run), _printed(run)
    weights = re.search(r'gap\(one\["end"\], two\["end"\]\) < 1e-(\d+)', code)[1]
    losses = re.search(r"loss_gap < 1e-(\d+)", code)[1]
    sup = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")
    assert f"losses agree to 10⁻{losses.translate(sup)}" in printed, printed
    assert f"the weights to 10⁻{weights.translate(sup)}" in printed, printed
    md = next(_src(c) for c in cells if _src(c).startswith("What is equal, and how equal?"))
    assert f"allows the weights $10^{{-{weights}}}$" in md, md
    assert f"agree to $10^{{-{losses}}}$" in md and "1,024 predictions" in md, md
    # the explanation is about this model: a bias-free one (biases are the aside)
    assert "bias=False" in code and "This model has no biases" in md


def test_converged_probe_prints_both_accuracies_and_the_pages_quote_them():
    cells = _cells("17_lora")
    probe = next(c for c in cells if c["cell_type"] == "code" and "fit_train" in _src(c))
    printed = _printed(probe)
    found = re.search(r"(\d+\.\d)% of the (\d+) training sentences,\s+(\d+\.\d)% of the "
                      r"(\d+) test sentences with unseen names", printed)
    assert found, printed
    train, n_train, test, _ = found.groups()
    md = "\n".join(_src(c) for c in cells if c["cell_type"] == "markdown")
    assert f"all {n_train} training sentences right ({train}%)" in md
    assert f"still only {test}% of the test sentences" in md
    assert f"still only {round(float(test))}% of the test sentences" in md
    assert "fit_train == 1.0" in _src(probe), "'all' is asserted, not a share above 95%"
