"""Run every chapter as Colab would, in a fresh virtual environment that has only what a Colab runtime has
that matters here — torch, numpy, matplotlib, ipywidgets and a Jupyter kernel — and neither this package
nor nbdev. Each chapter's first cell takes its Colab branch (a stub `google.colab` module is in place) and
installs the package, from this checkout instead of GitHub (MINITRANSFORMER_SOURCE); then the whole
chapter runs top to bottom in a fresh kernel, from a folder outside the repository.

With `--jobs N` (default: the CPUs this process may use, at most 4) N runtimes run chapters side by side,
each a venv of its own (the chapters' first cells install into it, so two never share one) and each
kernel on one thread (OMP_NUM_THREADS=1, one of the conditions `make portability-check` holds the
chapters' outputs to). The longest chapters start first.

    python scripts/colab_check.py [--jobs N] [nbs/NAME.ipynb ...]   (default: every notebook in nbs/)
"""
import argparse
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
VENVS = ROOT / "_build" / "colab-venv"
COLAB_PACKAGES = ["torch==2.13.0", "numpy", "matplotlib", "ipywidgets>=8", "ipykernel"]
STUB = ('import sys, types\n'
        'sys.modules["google"] = types.ModuleType("google")\n'
        'sys.modules["google.colab"] = types.ModuleType("google.colab")  # what Colab has, to the first cell')
LONGEST = ("13_training", "17_lora", "18_quantised", "16_gguf", "15_pretrained", "14_distributed")


def make_runtime(jupyter_dir: Path, name: str) -> None:
    "A fresh venv with Colab's relevant packages, registered as the kernel `name`."
    venv = VENVS / name
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *COLAB_PACKAGES], check=True)
    probe = "import importlib.util as u; print([m for m in ('minitransformer', 'nbdev') if u.find_spec(m)])"
    gone = subprocess.run([py, "-c", probe], check=True, capture_output=True, text=True,
                          cwd=jupyter_dir.parent).stdout.strip()  # outside the checkout, whose folder would import
    assert gone == "[]", f"the simulated runtime must not have {gone} before the chapter installs it"
    subprocess.run([py, "-m", "ipykernel", "install", "--prefix", str(jupyter_dir), "--name", name],
                   check=True, capture_output=True)


_kernel = None  # the runtime of this worker process


def _take_runtime(runtimes) -> None:
    global _kernel
    _kernel = runtimes.get()


def run_chapter(path: Path, workdir: Path) -> tuple[str, float, str | None]:
    "(name, seconds, None) when the chapter ran to the end; (name, seconds, error) when a cell failed."
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(STUB))
    for cell in nb.cells:  # a fresh run: no saved outputs, no saved widget state
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    workdir.mkdir(parents=True)
    start = time.perf_counter()
    try:
        NotebookClient(nb, timeout=900, kernel_name=_kernel,
                       resources={"metadata": {"path": str(workdir)}}).execute()
    except CellExecutionError as e:
        return path.name, time.perf_counter() - start, str(e)[-2000:]
    return path.name, time.perf_counter() - start, None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=min(4, len(os.sched_getaffinity(0))))
    parser.add_argument("notebooks", nargs="*")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    paths = [Path(a).resolve() for a in args.notebooks] or sorted((ROOT / "nbs").glob("*.ipynb"))
    paths.sort(key=lambda p: LONGEST.index(p.stem) if p.stem in LONGEST else len(LONGEST))
    jobs = min(args.jobs, len(paths))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        jupyter_dir = tmp / "jupyter"
        names = [f"colab-sim-{i}" for i in range(jobs)]
        t0 = time.perf_counter()
        with ProcessPoolExecutor(jobs) as pool:  # the venvs side by side
            list(pool.map(make_runtime, [jupyter_dir] * jobs, names))
        print(f"{jobs} fresh Colab-like runtime(s) ready in {time.perf_counter() - t0:.0f} s", flush=True)
        os.environ["JUPYTER_PATH"] = str(jupyter_dir / "share" / "jupyter")
        os.environ["MINITRANSFORMER_SOURCE"] = ROOT.as_uri()
        if jobs > 1:
            os.environ["OMP_NUM_THREADS"] = "1"  # one core a kernel
        runtimes = multiprocessing.Manager().Queue()
        for name in names:
            runtimes.put(name)
        failed = []
        with ProcessPoolExecutor(jobs, initializer=_take_runtime, initargs=(runtimes,)) as pool:
            runs = [pool.submit(run_chapter, p, tmp / "work" / p.stem) for p in paths]
            for run in as_completed(runs):  # as each chapter ends
                name, seconds, error = run.result()
                if error is None:
                    print(f"  {name}: ok in {seconds:.0f} s", flush=True)
                else:
                    failed.append(name)
                    print(f"  {name}: FAILED after {seconds:.0f} s\n{error}", flush=True)
        print(f"{len(paths) - len(failed)} passed, {len(failed)} failed in {time.perf_counter() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
