"""Every number in the book's results prose comes from its data.

The places: the prose cells of chapters 12, 18 and 19 that report measurements, every row of
`nbs/results.md`, and the README's results. Each number found there (outside code, links and
math) must equal, at the precision it is printed with, a value of a data file the place names —
a field of a committed JSON file, or a figure this file derives from such fields (a ratio, a mean
over seeds), or, in a chapter, a number one of the chapter's cells printed — or be on the
allow-list below, each entry with its reason. A re-run bench that changes a figure thus fails
here until the prose says the new figure (`test_a_changed_figure_fails` shows it)."""
import json
import math
import re
import statistics
from pathlib import Path

import pytest

from helpers import ROOT, cell_printed, cell_source, notebook_cells

ADAPTERS = ROOT / "nbs" / "adapters"

# a number: not part of a name (GPT-2, Q4_1, 135M, float32), commas as thousands separators
_NUMBER = re.compile(r"(?<![\w.\/_])(?<!\w-)(?P<sign>[-−+]?)"
                     r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?![\w]|\.\d|,\d{3})")
_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
_VERSION = re.compile(r"\b\d+\.\d+\.\d+\b")  # torch 2.13.0, llama-cpp-python 0.3.36
_SKIP = re.compile(r"`[^`]*`|\]\([^)]*\)|\$[^$]*\$|<[^>]*>")  # code, link targets, math, html
_CHAPTER = re.compile(r"(?:[Cc]hapters?|ch\.|§|[Ee]xercises?|Ex|[Cc]ells?|[Ii]tems?|rungs?)"
                      r"\s+(?:\d+(?:,\s*|\s+and\s+|\s*[–-]\s*))*$")


def _leaves(x) -> list[float]:
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return []
    if isinstance(x, (int, float)):
        return [float(x)]
    values = x.values() if isinstance(x, dict) else x
    return [v for item in values for v in _leaves(item)]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _decode_bench(d: dict) -> list[float]:
    "The figures chapter 18 and results.md derive from `decode-bench.json`."
    sides, prof = d["sides"], d["blocks_step_profile"]
    out = [prof["kernels_ms"] / prof["region_ms"],  # the loops' share of the region
           prof["kernels_ms"] / sides["llama.cpp"]["step_ms"],  # the loops against llama.cpp
           sides["file blocks, compiled"]["mb_per_token"] / d["settings"]["read_bandwidth_gb_s"],
           ]
    blocks, llama = sides["file blocks, compiled"], sides["llama.cpp"]
    ratios = [b / l for b, l in zip(llama["rounds_total_s"], blocks["rounds_total_s"])]
    out += [statistics.median(ratios), blocks["tokens_per_s"] / sides[
        "float32, compiled"]["tokens_per_s"]]
    if "fast blocks, compiled" in sides:  # the int4/int8 kernels' path (since 2026-12-06)
        fast, fast_eager = sides["fast blocks, compiled"], sides["fast blocks, eager"]
        fast_prof = d["fast_step_profile"]
        out += [fast["tokens_per_s"] / sides["float32, compiled"]["tokens_per_s"],
                fast["tokens_per_s"] / blocks["tokens_per_s"],
                fast_eager["tokens_per_s"] / sides["float32, eager"]["tokens_per_s"],
                fast_prof["weight_kernels_ms"] / llama["step_ms"],
                fast_prof["step_ms"] - fast_prof["unprofiled_step_ms"],
                prof["step_ms"] - prof["unprofiled_step_ms"],
                d["one_thread"]["llama.cpp"]["step_ms"]
                / d["one_thread"]["fast blocks, compiled"]["step_ms"]]
        out += [100 * (f["perplexity_fast"] / f["perplexity_exact"] - 1)
                for f in d["fast_fidelity"].values()]
        out += [100 * f["top1_agreement"] for f in d["fast_fidelity"].values()]
    return out


def _smollm2(d: dict) -> list[float]:
    "The bytes a token reads, and the rows compared, from `smollm2-bench.json`."
    b = d["bytes_per_token"]
    rows = sum(v["rows"] for k, v in d["same_tokens"].items() if k.startswith("batch"))
    return [b["weights"] + b["static_cache"], b["weights"] + b["eager_cache"], rows]


def _instruct(rows: list[dict]) -> list[float]:
    """Means and standard errors over the seeds, per model, of `answer-because-runs.jsonl`, the
    shares in percent, the trainable share and the saved adapter's size."""
    out = []
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["model"], r["mask_prompt"], r["r"]), []).append(r)
    for runs in groups.values():
        for key in ("format", "right", "perplexity", "train_seconds", "final_loss",
                    "reply_loss"):
            values = [r[key] * (100 if key in ("format", "right") else 1)
                      for r in runs if key in r]
            out += values
            if len(values) > 1:
                out += [statistics.mean(values),
                        statistics.stdev(values) / math.sqrt(len(values))]
    lora = next(r for r in rows if "weight_bytes" in r and r["model"] == "lora")
    out.append(100 * lora["trainable"] / (lora["weight_bytes"] / 4))
    out.append((ADAPTERS / "answer-because.safetensors").stat().st_size)
    return out


def _qlora_step(rows: list[dict]) -> list[float]:
    "What one 4-bit step costs against a float32 one (`qlora-step.jsonl`)."
    f32, blocks = (next(r for r in rows if r["weights"] == w) for w in ("float32", "blocks"))
    held = [r["weight_bytes"] + r["optimizer_bytes"] for r in (f32, blocks)]
    return held + [held[1] / held[0], blocks["peak_bytes"] / f32["peak_bytes"],
                   blocks["seconds_per_step"] / f32["seconds_per_step"]]


def _ideas(d: dict) -> list[float]:
    "The rungs' count, and each distance below the bigram."
    return [len(d["rows"])] + [-r["vs_bigram"] for r in d["rows"]]


SOURCES = {  # name: (file, what it derives besides its fields)
    "ideas": ("nbs/ideas.json", _ideas),
    "decode-bench": ("nbs/adapters/decode-bench.json", _decode_bench),
    "decode-bench-2026-12-05": ("nbs/adapters/decode-bench-2026-12-05.json", _decode_bench),
    "smollm2-bench": ("nbs/adapters/smollm2-bench.json", _smollm2),
    "dtypes-bench": ("nbs/adapters/dtypes-bench.json", lambda d: []),
    "instruct-runs": ("nbs/adapters/answer-because-runs.jsonl", _instruct),
    "qlora-step": ("nbs/adapters/qlora-step.jsonl", _qlora_step),
}


def read_source(name: str):
    path = ROOT / SOURCES[name][0]
    return _jsonl(path) if path.suffix == ".jsonl" else json.loads(path.read_text())


def source_values(name: str, data=None) -> list[float]:
    "The fields of source `name` (its committed data, or `data`) and what it derives."
    data = read_source(name) if data is None else data
    return _leaves(data) + SOURCES[name][1](data)


# results.md rows whose bench writes no results file: every number in them is allowed, for
# this reason (the command in the row reproduces them). Keyed by the row's first words.
UNFILED_ROWS = {
    "our `MultiHeadAttention` vs": "bench/bench_mha.py prints its timings; no results file",
    "same, forward + backward": "bench/bench_mha.py prints its timings; no results file",
    "generation with vs without KV cache": "bench/bench_generate.py prints; no results file",
    "decode time per token": "bench/bench_generate.py prints; no results file",
    "ours vs `transformers` GPT-2": "bench/bench_generate.py prints; no results file",
    "dates → ISO": "bench/train_dates.py prints its accuracy; no results file",
    "same, 180-s schedule": "bench/train_dates.py prints its accuracy; no results file",
    "Shakespeare, char GPT": "bench/train_shakespeare.py prints its losses; no results file",
    "same, 10 min": "bench/train_shakespeare.py prints its losses; no results file",
    "the recipe's train step": "bench/bench_train_step.py prints its timings; no results file",
    "SmolLM2-135M-Instruct (real weights, GGUF) logits": "a parity test's printed gaps",
    "all-MiniLM-L6-v2": "a parity test's printed gaps",
    "SmolLM2-135M greedy decoding, ours vs": "five runs of bench/bench_smollm2.py before its "
                                             "--out; the latest run is the row below",
    "peak memory of loading": "bench/bench_load.py prints; no results file",
    "LoRA on MiniLM": "chapter 17 prints these; the chapter's own cells check them",
}
# results.md rows read from a results file: the row's first words → the sources it may use
FILED_ROWS = {
    "SmolLM2-135M decoding from fewer bytes": ["decode-bench", "decode-bench-2026-12-05"],
    "SmolLM2-135M compiled decoding": ["smollm2-bench"],
    "SmolLM2-135M-Instruct taught": ["instruct-runs"],
    "QLoRA": ["qlora-step", "instruct-runs"],
    "What each idea buys": ["ideas"],
}
# the prose cells of the chapters that report measurements: stem → (cell ids, sources); each
# number there may also be one the chapter's own cells printed
CHAPTER_CELLS = {
    "12_generation": (["1a19f505", "8c756c95", "f74b4bba", "e9250870"], ["smollm2-bench"]),
    "18_quantised": (["b3e7daa1", "b6e8fd34", "5104656f", "6090e28f", "f18fa5e1",
                      "f18fa5e3"],
                     ["decode-bench", "decode-bench-2026-12-05"]),
    "19_instruct": (["6d5ef083", "9d0d6d65", "a9819b03", "ae655b27", "339729db", "d9faffea",
                     "6b8f6901", "3f76c91a", "4c25c25a"], ["instruct-runs", "qlora-step"]),
}
# single numbers allowed in a place, each with its reason: (place, number) → reason
ALLOWED = {
    ("19_instruct", "0.05"): "the conventional significance level, not a measurement",
    ("19_instruct", "2024"): "the year of a cited paper (Shi et al.)",
    ("19_instruct", "10"): "a threshold the sums table names ('off by over 10')",
    ("18_quantised", "67.1"): "exercise 3's arithmetic on the 1.7B model's shapes (its cell "
                              "checks 67,108,864)",
    ("18_quantised", "30"): "SmolLM2-135M's 30 layers: a shape, not a measurement",
    ("results.md", "1,024"): "the perplexity's text, tokens of Macbeth: set in bench_quantised.py",
    ("results.md", "256"): "the rounds' cache slots, set in bench_quantised.py",
}


def numbers(text: str) -> list[tuple[str, str]]:
    "Each number of `text` outside code, link targets, math and tags, with the unit after it."
    text = _DATE.sub(" ", _VERSION.sub(" ", _SKIP.sub(" ", text)))
    found = []
    for m in _NUMBER.finditer(text):
        if _CHAPTER.search(text[:m.start()]):
            continue  # a chapter, exercise, cell, item or rung number
        unit = re.match(r"(?:\s*(?:vs|to|→|and|/)\s*[\d.,]+)?\s*(%|×|ms\b|s\b|MB\b|GB/s|GB\b|tokens/s|steps)", text[m.end():])
        found.append((m["sign"] + m["num"], unit[1] if unit else ""))
    return found


def binds(number: str, unit: str, values: list[float]) -> bool:
    "Whether `number`, as printed, is one of `values` rounded to its precision."
    plain = number.replace(",", "").replace("−", "-").lstrip("+")
    x, places = float(plain), len(plain.split(".")[1]) if "." in plain else 0
    scales = {"%": (1, 100), "MB": (1, 1e-6, 2 ** -20), "ms": (1, 1e3), "GB": (1, 1e-9)}
    for v in values:
        for scale in scales.get(unit, (1,)):
            for sign in (1, -1) if places else (1,):
                if round(sign * v * scale, places) == x:
                    return True
    return False


def results_rows() -> dict[str, str]:
    "The rows of results.md's table, keyed by their first cell."
    text = (ROOT / "nbs" / "results.md").read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| what")]
    return {row.split(" | ")[0].lstrip("| "): row for row in rows}


def row_text(row: str) -> str:
    "What a results row measured, and its result: not its command (code), nor its target."
    cells = row.split(" | ")
    return cells[0] + " | " + cells[2]


def unbound(place: str, text: str, sources: list[str], extra: list[float] = ()) -> list[str]:
    "The numbers of `text` that neither its sources, nor `extra`, nor the allow-list give."
    values = [v for s in sources for v in source_values(s)] + list(extra)
    return [f"{n}{u and ' ' + u}" for n, u in numbers(text)
            if (place, n) not in ALLOWED and not binds(n, u, values)]


def test_every_results_row_is_filed_or_allowed():
    for first in results_rows():
        filed = [k for k in FILED_ROWS if first.startswith(k)]
        unfiled = [k for k in UNFILED_ROWS if first.startswith(k)]
        assert len(filed) + len(unfiled) == 1, f"results.md row {first[:60]!r}: which data?"


@pytest.mark.parametrize("key", FILED_ROWS)
def test_results_rows_say_their_files_numbers(key):
    rows = [row for first, row in results_rows().items() if first.startswith(key)]
    assert len(rows) == 1, key
    assert unbound("results.md", row_text(rows[0]), FILED_ROWS[key]) == [], key


def test_results_header_numbers():
    text = (ROOT / "nbs" / "results.md").read_text().split("\n| ")[0]
    assert unbound("results.md", text, ["decode-bench"]) == []


def test_a_changed_figure_fails():
    "Change one figure of a data file, and the results row that says it no longer binds."
    key = "SmolLM2-135M decoding from fewer bytes"
    row = next(r for first, r in results_rows().items() if first.startswith(key))
    said = numbers(row_text(row))
    data = read_source("decode-bench")
    rate = f'{data["sides"]["file blocks, compiled"]["tokens_per_s"]:.1f}'  # as the row says it
    assert (rate, "tokens/s") in said and binds(rate, "tokens/s", source_values("decode-bench", data))
    data["sides"]["file blocks, compiled"]["tokens_per_s"] *= 1.05  # a re-run, 5 % faster
    assert not binds(rate, "tokens/s", source_values("decode-bench", data))


def _printed(stem: str) -> list[float]:
    "Every number a code cell of chapter `stem` printed."
    text = "\n".join(cell_printed(c) for c in notebook_cells(stem) if c["cell_type"] == "code")
    return [float(n.replace(",", "").replace("−", "-")) for n, _ in numbers(text)]


@pytest.mark.parametrize("stem", CHAPTER_CELLS)
def test_chapter_prose_says_its_data(stem):
    ids, sources = CHAPTER_CELLS[stem]
    cells = {c.get("id"): cell_source(c) for c in notebook_cells(stem)}
    assert set(ids) <= cells.keys(), f"{stem}: cells {set(ids) - cells.keys()} are gone"
    printed = _printed(stem)
    for cid in ids:
        assert unbound(stem, cells[cid], sources, printed) == [], (stem, cid)
