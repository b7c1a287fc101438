"""Every Python block of the README runs, in order, in one namespace (later blocks may use what
earlier ones made), from the folder of the real SmolLM2 GGUF file (which the README names bare).
`compile=True` runs with torch.compile's "eager" backend here: the same compiled step, traced as
one graph, without inductor's minutes of code generation."""

import contextlib
import io
import os
import re

import pytest

from helpers import ROOT, smollm2_gguf


def _blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(),
                      re.S | re.M)


def test_every_readme_python_block_runs():
    folder = smollm2_gguf().parent
    pytest.importorskip("gguf")
    blocks = _blocks()
    assert len(blocks) >= 3
    here, namespace, out = os.getcwd(), {}, io.StringIO()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(out):
            for i, block in enumerate(blocks):
                code = block.replace("compile=True", 'compile="eager"')
                assert "max_new_tokens=" not in code or all(
                    int(n) <= 30 for n in re.findall(r"max_new_tokens=(\d+)", code))
                exec(compile(code, f"README.md block {i + 1}", "exec"), namespace)
    finally:
        os.chdir(here)
    printed = out.getvalue()
    assert printed.count("Paris") >= 2, printed  # the streamed chat and the blocks' one
    assert "<|im_" not in printed and "\nuser" not in printed, printed


def test_the_readmes_dtype_table_is_the_benchs():
    """Each row of the table under "One dtype policy" is a row of bench/bench_dtypes.py's
    committed results, number for number, in the bench's order."""
    import json
    bench = json.loads((ROOT / "nbs" / "adapters" / "dtypes-bench.json").read_text())
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| SmolLM2-135M from"):].split("\n\n")[0].splitlines()[2:]
    got = [[c.strip() for c in row.strip("|").split("|")] for row in table]
    want = [[r["source"], r["asked"], r["dtype"], str(r["memory_mb"]),
             f"{r['first_token_ms']:.0f}", f"{r['tokens_per_s']:.1f}"] for r in bench["rows"]]
    assert got == want, (got, want)
    assert f"{bench['threads']} threads" in text and bench["date"] in text
