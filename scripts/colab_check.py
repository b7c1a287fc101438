"""Run every chapter as Colab would, and compare its outputs with the committed ones (nbval): in a fresh
virtual environment that has only what a Colab runtime has that matters here — torch, numpy,
matplotlib, ipywidgets and a Jupyter kernel — and neither this package nor nbdev. Each chapter's first
cell takes its Colab branch (a stub `google.colab` module is in place) and installs the package, from a
wheel of this checkout instead of GitHub (MINITRANSFORMER_SOURCE; `make dist` checks the sdist that
GitHub's install builds from); then nbval runs the whole chapter top to bottom in a fresh kernel, from a
folder outside the repository, and compares every cell's output with the committed one (the first
cell's excepted: pip's messages are Colab's alone). This is the notebooks' one nbval run in `make test`:
a chapter that passes here runs from its own first cell *and* prints what the book shows.

With `--jobs N` (default: the CPUs this process may use, at most 4) N runtimes run chapters side by side,
each a venv of its own (the chapters' first cells install into it, so two never share one; all
but the first are hard-linked copies of it, made before any chapter runs) and each
kernel on one thread (OMP_NUM_THREADS=1, one of the conditions `make portability-check` holds the
chapters' outputs to). The longest chapters start first.

    python scripts/colab_check.py [--jobs N] [nbs/NAME.ipynb ...]   (default: every notebook in nbs/)

`--prepare` only makes the runtimes and the wheel (in _build/colab-venv/prepared/) and exits; the next run
with `--prepared` uses them, once. `make test` prepares them while its other first checks run.
"""
import argparse
import json
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

ROOT = Path(__file__).resolve().parent.parent
VENVS = ROOT / "_build" / "colab-venv"
READY = VENVS / "prepared.json"  # what --prepare made: the wheel and the runtimes' names
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"
COLAB_PACKAGES = ["torch==2.13.0", "numpy", "matplotlib", "ipywidgets>=8", "ipykernel"]
STUB = ('import sys, types\n'
        'sys.modules["google"] = types.ModuleType("google")\n'
        'sys.modules["google.colab"] = types.ModuleType("google.colab")  # what Colab has, to the first cell')
LONGEST = ("13_training", "19_instruct", "17_lora", "18_quantised", "16_gguf", "14_distributed",
           "12_generation", "15_pretrained")


def make_runtime(where: Path, name: str, like: str | None = None) -> None:
    """A fresh venv `where`/venvs/`name` with Colab's relevant packages, the kernel `name` (`where`/jupyter);
    `like`: a copy of that runtime's venv, its files hard links (pip replaces a file, never writes into one)."""
    jupyter_dir, venv = where / "jupyter", where / "venvs" / name
    if venv.exists():
        shutil.rmtree(venv)
    py = str(venv / "bin" / "python")
    if like is None:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *COLAB_PACKAGES],
                       check=True)
    else:  # (its pyvenv.cfg and bin/python, a link to the base interpreter, hold no path of the first)
        subprocess.run(["cp", "-al", str(where / "venvs" / like), str(venv)], check=True)
    probe = "import importlib.util as u; print([m for m in ('minitransformer', 'nbdev') if u.find_spec(m)])"
    gone = subprocess.run([py, "-c", probe], check=True, capture_output=True, text=True,
                          cwd=jupyter_dir.parent).stdout.strip()  # outside the checkout, whose folder would import
    assert gone == "[]", f"the simulated runtime must not have {gone} before the chapter installs it"
    subprocess.run([py, "-m", "ipykernel", "install", "--prefix", str(jupyter_dir), "--name", name],
                   check=True, capture_output=True)


def build_wheel(outdir: Path) -> Path:
    "A wheel of this checkout, built once for every runtime's install."
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                    "-w", str(outdir), str(ROOT)], check=True)
    (wheel,) = outdir.glob("minitransformer-*.whl")
    return wheel


def as_colab_runs_it(path: Path, copy: Path) -> None:
    "The chapter with the stub first; the setup cell's output (pip's, in Colab) not compared."
    nb = nbformat.read(path, as_version=4)
    setup = next(c for c in nb.cells if c.cell_type == "code")
    tags = setup.metadata.setdefault("tags", [])
    if "nbval-ignore-output" not in tags:
        tags.append("nbval-ignore-output")
    nb.cells.insert(0, nbformat.v4.new_code_cell(STUB))
    copy.parent.mkdir(parents=True)
    nbformat.write(nb, copy)


_kernel = None  # the runtime of this worker process


def _take_runtime(runtimes) -> None:
    global _kernel
    _kernel = runtimes.get()


def run_chapter(path: Path, workdir: Path) -> tuple[str, float, str | None]:
    "(name, seconds, None) when the chapter ran and matched; (name, seconds, nbval's report) when not."
    copy = workdir / path.name
    as_colab_runs_it(path, copy)
    start = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "--nbval",
         "--nbval-kernel-name", _kernel, "--nbval-sanitize-with", str(SANITIZE),
         "--nbval-cell-timeout", "900", "--rootdir", str(workdir), str(copy)],
        cwd=workdir, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    return path.name, seconds, None if run.returncode == 0 else (run.stdout + run.stderr)[-4000:]


def prepare(jobs: int, where: Path) -> tuple[Path, Path, list[str]]:
    "`jobs` fresh runtimes (venvs and kernels under `where`) and a wheel (`where`/wheel), side by side."
    names = [f"colab-sim-{i}" for i in range(jobs)]
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(1) as pool:  # the wheel beside the runtimes: one installed, the others copies
        wheel = pool.submit(build_wheel, where / "wheel")
        for name in names:
            make_runtime(where, name, None if name == names[0] else names[0])
        wheel = wheel.result()
    print(f"{jobs} fresh Colab-like runtime(s) and {wheel.name} ready in {time.perf_counter() - t0:.0f} s",
          flush=True)
    return where / "jupyter", wheel, names


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=min(4, len(os.sched_getaffinity(0))))
    given = parser.add_mutually_exclusive_group()
    given.add_argument("--prepare", action="store_true", help="make the runtimes and the wheel, then exit")
    given.add_argument("--prepared", action="store_true", help="use what --prepare made (once)")
    parser.add_argument("notebooks", nargs="*")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.prepare:
        if args.notebooks:
            parser.error("--prepare makes the runtimes only: name the notebooks with --prepared")
        READY.unlink(missing_ok=True)
        jupyter_dir, wheel, names = prepare(args.jobs, VENVS / "prepared")
        READY.write_text(json.dumps({"jupyter": str(jupyter_dir), "wheel": str(wheel), "names": names}))
        return 0
    paths = [Path(a).resolve() for a in args.notebooks] or sorted((ROOT / "nbs").glob("*.ipynb"))
    paths.sort(key=lambda p: LONGEST.index(p.stem) if p.stem in LONGEST else len(LONGEST))
    jobs = min(args.jobs, len(paths))
    if args.prepared and not READY.exists():
        parser.error(f"--prepared: nothing prepared ({READY} is missing); run with --prepare first")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.prepared:  # (made by --prepare in this checkout moments ago: make test)
            made = json.loads(READY.read_text())
            READY.unlink()
            jupyter_dir, wheel, names = Path(made["jupyter"]), Path(made["wheel"]), made["names"]
            jobs = min(jobs, len(names))  # one runtime a job
            names = names[:jobs]
        else:
            jupyter_dir, wheel, names = prepare(jobs, VENVS / "run")
        t0 = time.perf_counter()
        os.environ["JUPYTER_PATH"] = str(jupyter_dir / "share" / "jupyter")
        os.environ["MINITRANSFORMER_SOURCE"] = wheel.as_uri()
        os.environ["MINITRANSFORMER_FILES"] = (ROOT / "nbs" / "adapters").as_uri()  # not GitHub's
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
                    print(f"  {name}: ran and matched in {seconds:.0f} s", flush=True)
                else:
                    failed.append(name)
                    print(f"  {name}: FAILED after {seconds:.0f} s\n{error}", flush=True)
        print(f"{len(paths) - len(failed)} passed, {len(failed)} failed in {time.perf_counter() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
