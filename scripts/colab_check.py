"""Run every chapter as Colab would, in a fresh virtual environment that has only what a Colab runtime has
that matters here — torch, numpy, matplotlib, ipywidgets and a Jupyter kernel — and neither this package
nor nbdev. Each chapter's first cell takes its Colab branch (a stub `google.colab` module is in place) and
installs the package, from this checkout instead of GitHub (MINITRANSFORMER_SOURCE); then the whole
chapter runs top to bottom in a fresh kernel, from a folder outside the repository.

    python scripts/colab_check.py [nbs/NAME.ipynb ...]      (default: every notebook in nbs/)
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "_build" / "colab-venv"
COLAB_PACKAGES = ["torch==2.13.0", "numpy", "matplotlib", "ipywidgets>=8", "ipykernel"]
STUB = ('import sys, types\n'
        'sys.modules["google"] = types.ModuleType("google")\n'
        'sys.modules["google.colab"] = types.ModuleType("google.colab")  # what Colab has, to the first cell')


def make_runtime(jupyter_dir: Path) -> None:
    "A fresh venv with Colab's relevant packages, registered as the kernel `colab-sim`."
    if VENV.exists():
        shutil.rmtree(VENV)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    py = str(VENV / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *COLAB_PACKAGES], check=True)
    probe = "import importlib.util as u; print([m for m in ('minitransformer', 'nbdev') if u.find_spec(m)])"
    gone = subprocess.run([py, "-c", probe], check=True, capture_output=True, text=True,
                          cwd=jupyter_dir.parent).stdout.strip()  # outside the checkout, whose folder would import
    assert gone == "[]", f"the simulated runtime must not have {gone} before the chapter installs it"
    subprocess.run([py, "-m", "ipykernel", "install", "--prefix", str(jupyter_dir), "--name", "colab-sim"],
                   check=True, capture_output=True)


def run_chapter(path: Path, workdir: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(STUB))
    for cell in nb.cells:  # a fresh run: no saved outputs, no saved widget state
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    start = time.perf_counter()
    NotebookClient(nb, timeout=900, kernel_name="colab-sim", resources={"metadata": {"path": str(workdir)}}).execute()
    return time.perf_counter() - start


def main(args: list[str]) -> int:
    paths = [Path(a).resolve() for a in args] or sorted((ROOT / "nbs").glob("*.ipynb"))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        jupyter_dir = tmp / "jupyter"
        t0 = time.perf_counter()
        make_runtime(jupyter_dir)
        print(f"fresh Colab-like runtime ready in {time.perf_counter() - t0:.0f} s", flush=True)
        os.environ["JUPYTER_PATH"] = str(jupyter_dir / "share" / "jupyter")
        os.environ["MINITRANSFORMER_SOURCE"] = ROOT.as_uri()
        failed = []
        for p in paths:
            work = tmp / "work" / p.stem
            work.mkdir(parents=True)
            try:
                print(f"  {p.name}: ok in {run_chapter(p, work):.0f} s", flush=True)
            except CellExecutionError as e:
                failed.append(p.name)
                print(f"  {p.name}: FAILED\n{str(e)[-2000:]}", flush=True)
    print(f"{len(paths) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
