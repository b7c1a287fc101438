"""The release tooling: scripts/release.py on a temporary copy of the files it edits (the checkout is never
touched), and the release artifacts' ingredients (licence, changelog, manifest, workflows)."""

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from configparser import ConfigParser
from pathlib import Path

import pytest
import yaml

from helpers import ROOT

SCRIPT = ROOT / "scripts" / "release.py"

spec = importlib.util.spec_from_file_location("release", SCRIPT)

release = importlib.util.module_from_spec(spec)

spec.loader.exec_module(release)

TAG = "v9.8.7"


def _settings(root: Path) -> dict:
    cfg = ConfigParser(delimiters=["="])
    cfg.read(root / "settings.ini", encoding="utf-8")
    return dict(cfg["DEFAULT"])


@pytest.fixture
def project(tmp_path):
    "A copy of what release.py reads and writes; the checkout's own files are checked unchanged afterwards."
    names = ["settings.ini", "CHANGELOG.md", "_config.yml", "minitransformer/__init__.py"]
    names += [str(p.relative_to(ROOT)) for p in sorted((ROOT / "nbs").glob("*.ipynb")) + sorted((ROOT / "nbs").glob("*.md"))]
    before = {n: (ROOT / n).read_bytes() for n in names}
    for n in names:
        (tmp_path / n).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / n, tmp_path / n)
    yield tmp_path
    for n in ("settings.ini", "CHANGELOG.md", "_config.yml", "minitransformer/__init__.py"):
        assert (ROOT / n).read_bytes() == before[n], f"the test changed the checkout's {n}"


def _cli(root: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), *args], capture_output=True, text=True)
    assert (p.returncode == 0) == ok, p.stdout + p.stderr
    return p


def test_pin_book_points_colab_cells_and_links_at_the_tag(project):
    repo = _settings(project)["git_url"]
    git = f"git+{repo}"
    notebooks = sorted((project / "nbs").glob("*.ipynb"))
    old = {p: p.read_text(encoding="utf-8") for p in notebooks}
    old_conf = (project / "_config.yml").read_text()

    run = _cli(project, "pin-book", TAG)
    assert f"pointed the book at {TAG}" in run.stdout
    wide = [line for p in notebooks for c in json.loads(p.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "code" for line in "".join(c["source"]).splitlines()
            if TAG in line and len(line) > release.COLUMN]
    assert ("longer than the book's" in run.stderr) == bool(wide), run.stderr  # said, when it happens

    for p in notebooks:
        new = p.read_text(encoding="utf-8")
        # byte-identical apart from the pinned URLs: undoing the pin gives the original file back
        undone = new.replace(f"{git}@{TAG}", git)
        undone = re.sub(rf"({re.escape(repo)})/(blob|tree|raw)/{re.escape(TAG)}/", r"\1/\2/main/", undone)
        assert undone == old[p], f"{p.name}: more than the URL changed"
        nb_old, nb_new = json.loads(old[p]), json.loads(new)
        first = "".join(next(c for c in nb_new["cells"] if c["cell_type"] == "code")["source"])
        assert "google.colab" in first and f"{git}@{TAG}" in first, f"{p.name}'s Colab cell is not pinned"
        for c in nb_new["cells"]:
            assert not re.search(rf"{re.escape(git)}(?!@{TAG})", "".join(c["source"])), f"{p.name} still installs from main"
        for a, b in zip(nb_old["cells"], nb_new["cells"]):
            assert {k: v for k, v in a.items() if k != "source"} == {k: v for k, v in b.items() if k != "source"}
        assert nb_old["metadata"] == nb_new["metadata"]

    # the install spec the pinned cell hands to pip is a valid requirement at the tag
    packaging = pytest.importorskip("packaging.requirements")
    req = packaging.Requirement(f"minitransformer[chapters] @ {git}@{TAG}")
    assert req.url.endswith(f"@{TAG}")

    conf = (project / "_config.yml").read_text()
    assert yaml.safe_load(conf)["repository"]["branch"] == TAG
    changed = [(a, b) for a, b in zip(old_conf.splitlines(), conf.splitlines()) if a != b]
    assert len(changed) == 1 and "branch:" in changed[0][0] and len(conf) == len(old_conf) - len("main") + len(TAG)
    for md in (project / "nbs").glob("*.md"):
        assert not re.search(rf"{re.escape(git)}(?!@{TAG})", md.read_text()), f"{md.name} still installs from main"

    # idempotent, and a later tag re-pins the same places
    snapshot = {p: p.read_bytes() for p in notebooks}
    _cli(project, "pin-book", TAG)
    assert {p: p.read_bytes() for p in notebooks} == snapshot
    _cli(project, "pin-book", "v9.8.8")
    assert all(p.read_text(encoding="utf-8").replace("@v9.8.8", f"@{TAG}").replace("/blob/v9.8.8/", f"/blob/{TAG}/")
               == snapshot[p].decode("utf-8") for p in notebooks)
    assert yaml.safe_load((project / "_config.yml").read_text())["repository"]["branch"] == "v9.8.8"


def test_pin_book_refuses_to_touch_outputs(project):
    repo = _settings(project)["git_url"]
    p = project / "nbs" / "00_core.ipynb"
    nb = json.loads(p.read_text(encoding="utf-8"))
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"name": "stdout", "output_type": "stream", "text": [f"git+{repo}\n"]}]
    p.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    assert "outside cell sources" in _cli(project, "pin-book", TAG, ok=False).stderr
    assert _cli(project, "pin-book", "main", ok=False).stderr.strip().endswith("is not a release tag like v1.2.3")


def test_bump_sets_the_version_and_dates_the_changelog(project):
    old_ini = (project / "settings.ini").read_text()
    old_log = (project / "CHANGELOG.md").read_text()
    unreleased = re.search(r"^## \[Unreleased\]\n(.*?)(?=^## \[|^\[)", old_log, re.S | re.M).group(1).strip()
    assert unreleased, "CHANGELOG.md's [Unreleased] section is empty"
    current = _settings(project)["version"]

    _cli(project, "bump", "9.8.7", "--date", "2031-02-03")

    ini = (project / "settings.ini").read_text()
    diff = [(a, b) for a, b in zip(old_ini.splitlines(), ini.splitlines()) if a != b]
    assert diff == [(f"version = {current}", "version = 9.8.7")], diff
    assert len(ini.splitlines()) == len(old_ini.splitlines())
    assert (project / "minitransformer" / "__init__.py").read_text().splitlines()[0] == '__version__ = "9.8.7"'

    log = (project / "CHANGELOG.md").read_text()
    assert re.search(r"^## \[Unreleased\]\n\n## \[9\.8\.7\] - 2031-02-03\n", log, re.M), log[:2000]
    assert release.notes(project, "9.8.7").strip() == unreleased
    repo = _settings(project)["git_url"]
    assert f"[Unreleased]: {repo}/compare/v9.8.7...HEAD" in log
    first = not re.search(r"^## \[\d", old_log, re.M)
    assert (f"[9.8.7]: {repo}/releases/tag/v9.8.7" if first else f"[9.8.7]: {repo}/compare/v") in log
    assert log.count("## [Unreleased]") == 1

    _cli(project, "check-tag", "v9.8.7")
    assert "settings.ini says version 9.8.7" in _cli(project, "check-tag", "v9.8.8", ok=False).stderr
    assert "lists no changes" in _cli(project, "bump", "9.8.8", ok=False).stderr  # [Unreleased] is empty now
    assert "already released" in _cli(project, "bump", "9.8.7", ok=False).stderr
    assert "older than" in _cli(project, "bump", "9.8.6", ok=False).stderr

    # the next release compares with this one; the older entry and its link stay
    (project / "CHANGELOG.md").write_text(log.replace("## [Unreleased]\n", "## [Unreleased]\n\n### Fixed\n\n- a bug\n", 1))
    _cli(project, "bump", "9.9.0rc1", "--date", "2031-03-04")
    log = (project / "CHANGELOG.md").read_text()
    assert f"[9.9.0rc1]: {repo}/compare/v9.8.7...v9.9.0rc1" in log and "[9.8.7]: " in log
    assert release.notes(project, "9.9.0rc1") == "### Fixed\n\n- a bug\n"
    assert release.notes(project, "9.8.7").strip() == unreleased


def test_bump_writes_what_nbdev_export_would(project):
    "The `__version__` line is the one nbdev's put_version_in_init writes, so the export-drift test agrees."
    pytest.importorskip("nbdev")
    _cli(project, "bump", "9.8.7", "--date", "2031-02-03")
    init = project / "minitransformer" / "__init__.py"
    ours = init.read_bytes()
    subprocess.run([sys.executable, "-c", "from nbdev.config import update_version; update_version()"],
                   cwd=project, check=True, capture_output=True)
    assert init.read_bytes() == ours


def test_first_release_keeps_the_version(project):
    "The first release is the version settings.ini already has (0.1.0): bump accepts it once."
    current = _settings(project)["version"]
    if re.search(rf"^## \[{re.escape(current)}\]", (project / "CHANGELOG.md").read_text(), re.M):
        pytest.skip(f"{current} is already released")
    _cli(project, "bump", current, "--date", "2031-02-03")
    assert _settings(project)["version"] == current
    _cli(project, "check-tag", f"v{current}")


def test_latest_tag_is_the_newest_final_release(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]
    subprocess.run(git + ["init", "-q"], cwd=tmp_path, check=True)
    assert release.latest_tag(tmp_path) == ""
    subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", "x"], cwd=tmp_path, check=True)
    for t in ["v0.1.0", "v0.9.0", "v0.10.0", "v0.11.0rc1", "nightly"]:
        subprocess.run(git + ["tag", t], cwd=tmp_path, check=True)
    assert release.latest_tag(tmp_path) == "v0.10.0"


def test_licence_changelog_and_manifest(settings):
    licence = (ROOT / "LICENSE").read_text()
    assert settings["license"] == "apache2"
    assert "Apache License\n                           Version 2.0, January 2004" in licence
    assert "END OF TERMS AND CONDITIONS" in licence and "APPENDIX: How to apply the Apache License" in licence
    manifest = (ROOT / "MANIFEST.in").read_text().split()
    assert {"settings.ini", "LICENSE", "README.md", "CHANGELOG.md"} <= set(manifest)
    log = (ROOT / "CHANGELOG.md").read_text()
    assert "keepachangelog.com" in log and re.search(r"^## \[Unreleased\]$", log, re.M)
    assert re.search(r"^\[Unreleased\]: https://github\.com/", log, re.M)
    for v in re.findall(r"^## \[(\d[^\]]*)\]", log, re.M):  # released entries are dated and linked
        assert re.search(rf"^## \[{re.escape(v)}\] - \d{{4}}-\d\d-\d\d$", log, re.M), v
        assert re.search(rf"^\[{re.escape(v)}\]: https://", log, re.M), v
    if re.search(r"^## \[\d", log, re.M):  # the latest entry is the version in settings.ini
        assert re.search(r"^## \[(\d[^\]]*)\]", log, re.M).group(1) == settings["version"]


def _workflow(name: str) -> dict:
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    wf["on"] = wf.pop(True, wf.get("on"))  # YAML 1.1 reads the key `on` as True
    return wf


def test_release_workflow_publishes_by_trusted_publishing():
    text = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    wf = _workflow("release.yml")
    assert wf["on"]["push"]["tags"], "the release runs on version tags"
    jobs = wf["jobs"]
    publish = next(j for j in jobs.values() if any("pypa/gh-action-pypi-publish" in s.get("uses", "")
                                                      for s in j.get("steps", [])))
    assert publish["permissions"]["id-token"] == "write" and publish["environment"]["name"] == "pypi"
    assert not re.search(r"password:|PYPI_API_TOKEN|TWINE_PASSWORD", text), "trusted publishing needs no token"
    assert {"test", "dist"} <= set(publish["needs"])
    assert jobs["test"]["uses"] == "./.github/workflows/test.yml"
    book = "\n".join(s.get("run", "") for s in jobs["book"]["steps"])
    assert "release.py pin-book" in book and "make book" in book
    dests = [s["with"].get("destination_dir") for s in jobs["book"]["steps"] if "actions-gh-pages" in s.get("uses", "")]
    assert "${{ github.ref_name }}" in dests and all(
        s["with"]["keep_files"] is True for s in jobs["book"]["steps"] if "actions-gh-pages" in s.get("uses", ""))


def test_ci_runs_the_oldest_declared_torch(settings):
    wf = _workflow("test.yml")
    assert "workflow_call" in wf["on"], "the release workflow reuses the tests"
    job = wf["jobs"]["oldest-torch"]
    floor = next(r for r in settings["requirements"].split() if r.startswith("torch>="))
    steps = "\n".join(s.get("run", "") for s in job["steps"])
    assert "download.pytorch.org/whl/cpu" in steps and ">=" in floor and 'replace(">=", "==")' in steps
    setup = next(s for s in job["steps"] if "setup-python" in s.get("uses", ""))
    assert str(setup["with"]["python-version"]) == settings["min_python"], "and on the oldest declared Python"
