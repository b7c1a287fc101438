"""What the layers (chapter 9) and the KV cache (chapter 10) pages show: the collapse
experiment run once, numbers quoted as printed, curves within their context."""

import ast
import re

import torch

from helpers import cell_printed as _printed, cell_source as _src, notebook_cells as _cells


def test_chapter_9_runs_the_collapse_experiment_once_with_its_gradients():
    "One run compares the stacks with and without residuals, and one figure draws it."
    code = [c for c in _cells("09_layers") if c["cell_type"] == "code"]
    runs = [c for c in code if "NoResidualEncoderLayer(EncoderLayer)" in _src(c)
            or "attn(X) if residual else attn(X)" in _src(c)]
    figures = [c for c in code if "similarity" in _src(c)
               and any("image/png" in o.get("data", {}) for o in c.get("outputs", []))]
    assert len(runs) == 1 and len(figures) == 1, (len(runs), len(figures))
    assert "gradient norm at each layer's input" in _src(figures[0])
    printed = _printed(runs[0])
    for row in ("similarity", "spread", "no residual", "gradient norm at layer 1's input"):
        assert row in printed, printed


def test_chapter_9_quotes_the_collapse_numbers_it_prints():
    "Every decimal the discussion of the run quotes is one the run prints."
    cells = _cells("09_layers")
    run = next(c for c in cells if "NoResidualEncoderLayer(EncoderLayer)" in _src(c))
    printed = _printed(run)
    md = next(_src(c) for c in cells if c["cell_type"] == "markdown"
              and _src(c).startswith("What the table and the three panels show"))
    quoted = re.findall(r"(?<![\d.])\d+\.\d+", re.sub(r"\$[^$]*\$", "", md))
    assert len(quoted) >= 6, quoted
    missing = [q for q in quoted if not re.search(rf"(?<![\d.]){re.escape(q)}\b", printed)]
    assert not missing, f"quoted but not printed: {missing}\n{printed}"
    grads = re.search(r"post-norm (\d+), pre-norm (\d+), no residual (\d+)", printed)
    assert grads and f"({grads[3]}, against {grads[1]} and {grads[2]})" in md, md


class _Axes:
    "Records what is plotted; ignores everything else."
    def __init__(self):
        self.lines = {}

    def plot(self, x, y, label=None, **kwargs):
        self.lines[label] = [int(t) for t in x]

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _Pyplot:
    def __init__(self):
        self.ax = _Axes()

    def subplots(self, *args, **kwargs):
        return None, self.ax

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def test_kv_cache_plot_stops_gpt2_at_its_context():
    "GPT-2 has 1,024 positions: its cache curves end there; the others run to 4,096."
    cells = [c for c in _cells("10_kv_cache") if c["cell_type"] == "code"]
    defs = ast.parse(next(_src(c) for c in cells if "def kv_bytes(" in _src(c)))
    kv_bytes = ast.Module([n for n in defs.body if isinstance(n, ast.FunctionDef)
                           and n.name == "kv_bytes"], type_ignores=[])
    plot = next(_src(c) for c in cells if "#| alt: KV-cache GiB" in _src(c))
    space = {"torch": torch, "plt": _Pyplot(), "test_eq": lambda a, b: None}
    exec(compile(kv_bytes, "kv_bytes", "exec"), space)
    exec(plot, space)
    lines = space["plt"].ax.lines
    gpt2 = {name: x for name, x in lines.items() if name.startswith("GPT-2")}
    assert len(gpt2) == 2 and all(max(x) == 1024 for x in gpt2.values()), gpt2
    assert all(max(x) == 4096 for name, x in lines.items() if name not in gpt2), lines
    assert "1,024" in plot.splitlines()[0], "the alt text names GPT-2's limit"
