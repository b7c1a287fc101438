"""Release helpers: the version lives in one place (settings.ini), the changelog in CHANGELOG.md.

    python scripts/release.py bump X.Y.Z [--date YYYY-MM-DD]
        settings.ini's version (and the `__version__` line nbdev_export writes into the package's
        __init__.py, so the export-drift test stays green) becomes X.Y.Z, and CHANGELOG.md's
        [Unreleased] section becomes the entry `## [X.Y.Z] - date`, under a new empty [Unreleased].
        X.Y.Z may equal the current version only for a version not yet in the changelog (the first
        release, 0.1.0, is already the version in settings.ini).
    python scripts/release.py pin-book vX.Y.Z
        Points the book at the tag: every chapter's Colab install cell (and any other
        `git+<repository>` install line in nbs/) installs from `git+<repository>@vX.Y.Z`, links into the
        repository at `/blob/main/` go to `/blob/vX.Y.Z/`, and _config.yml's repository.branch (which
        makes the Colab buttons) becomes the tag. Only those strings change: the notebooks stay
        byte-identical otherwise (outputs, metadata, formatting). The release workflow runs this on its
        own checkout before it builds the versioned book; main keeps pointing at main.
    python scripts/release.py check-tag vX.Y.Z
        Fails unless the tag is `v` + settings.ini's version, the package's __version__ agrees and
        CHANGELOG.md has a dated entry for it (the release workflow's first step).
    python scripts/release.py notes X.Y.Z        print that version's changelog entry (release notes)
    python scripts/release.py latest-tag         the newest final release tag (vX.Y.Z) of the repository

Every command takes `--root DIR` (default: this checkout), which the tests use on a temporary copy.
"""
import argparse
import datetime as dt
import json
import re
import subprocess
import sys
from configparser import ConfigParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLUMN = 88  # the book's code column (tests/book/test_chapters.py): longer lines scroll sideways
VERSION_RE = re.compile(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?")  # what a release may be called: 1.2.3, 1.2.3rc1
FINAL_RE = re.compile(r"\d+\.\d+\.\d+")


class ReleaseError(Exception):
    pass


def settings(root: Path) -> dict:
    cfg = ConfigParser(delimiters=["="])
    if not cfg.read(root / "settings.ini", encoding="utf-8"):
        raise ReleaseError(f"no settings.ini in {root}")
    return dict(cfg["DEFAULT"])


def version_key(v: str) -> tuple:
    "Sort key of VERSION_RE versions: 1.2.3rc1 < 1.2.3 < 1.2.4."
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:(a|b|rc)(\d+))?", v)
    if not m:
        raise ReleaseError(f"{v!r} is not a release version like 1.2.3 or 1.2.3rc1")
    major, minor, patch, pre, n = m.groups()
    return (int(major), int(minor), int(patch), {"a": 0, "b": 1, "rc": 2, None: 3}[pre], int(n or 0))


def tag_version(tag: str) -> str:
    if not (tag.startswith("v") and VERSION_RE.fullmatch(tag[1:])):
        raise ReleaseError(f"{tag!r} is not a release tag like v1.2.3")
    return tag[1:]


def _write(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8"))  # no newline translation: files keep their line endings


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8")


# ---------------------------------------------------------------------------------------------- bump
def _changelog_versions(text: str) -> list[str]:
    return re.findall(r"^## \[(\d[^\]]*)\]", text, re.MULTILINE)


def _repo_url(cfg: dict) -> str:
    return cfg["git_url"].removesuffix(".git").rstrip("/")


def bump_changelog(text: str, version: str, date: str, repo: str) -> str:
    head = re.search(r"^## \[Unreleased\][^\n]*\n", text, re.MULTILINE | re.IGNORECASE)
    if not head:
        raise ReleaseError("CHANGELOG.md has no '## [Unreleased]' section")
    nxt = re.compile(r"^## \[", re.MULTILINE).search(text, head.end())
    links = re.compile(r"^\[[^\]]+\]: ", re.MULTILINE).search(text, head.end())
    end = min(m.start() for m in (nxt, links) if m) if (nxt or links) else len(text)
    body = text[head.end():end].strip("\n")
    if not re.search(r"^\s*[-*] ", body, re.MULTILINE):
        raise ReleaseError("CHANGELOG.md's [Unreleased] section lists no changes: nothing to release")
    earlier = _changelog_versions(text)
    if version in earlier:
        raise ReleaseError(f"CHANGELOG.md already has an entry for {version}")
    entry = f"## [Unreleased]\n\n## [{version}] - {date}\n\n{body}\n\n"
    text = text[:head.start()] + entry + text[end:].lstrip("\n")

    # the link references at the bottom (Keep a Changelog): Unreleased compares with the new tag
    unreleased = f"[Unreleased]: {repo}/compare/v{version}...HEAD"
    this = (f"[{version}]: {repo}/compare/v{earlier[0]}...v{version}" if earlier
            else f"[{version}]: {repo}/releases/tag/v{version}")
    link_re = re.compile(r"^\[Unreleased\]: .*$", re.MULTILINE | re.IGNORECASE)
    if link_re.search(text):
        text = link_re.sub(lambda _: unreleased + "\n" + this, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + unreleased + "\n" + this + "\n"
    return text


def bump(root: Path, version: str, date: str | None = None) -> list[Path]:
    if not VERSION_RE.fullmatch(version):
        raise ReleaseError(f"{version!r} is not a release version like 1.2.3 or 1.2.3rc1")
    date = date or dt.date.today().isoformat()
    dt.date.fromisoformat(date)
    cfg = settings(root)
    current = cfg["version"]
    if version_key(version) < version_key(current):
        raise ReleaseError(f"{version} is older than the current version {current}")
    changelog = root / "CHANGELOG.md"
    log = _read(changelog)
    if version == current and version in _changelog_versions(log):
        raise ReleaseError(f"{version} is the current version and already released; bump to a newer one")

    ini = root / "settings.ini"
    text = _read(ini)
    new, n = re.subn(r"^(version\s*=\s*)\S+[ \t]*$", lambda m: m.group(1) + version, text, flags=re.MULTILINE)
    if n != 1:
        raise ReleaseError(f"settings.ini has {n} `version =` lines, expected one")
    new_log = bump_changelog(log, version, date, _repo_url(cfg))
    # what nbdev_export's put_version_in_init writes (nbdev.config.update_version): same regex, same line
    init = root / cfg["lib_path"] / "__init__.py"
    line = f'__version__ = "{version}"'
    code = _read(init) if init.exists() else ""
    code = (re.sub(r"^__version__\s*=.*$", line, code, flags=re.MULTILINE) if re.search(r"^__version__\s*=", code, re.MULTILINE)
            else line + "\n" + code)
    _write(ini, new)
    _write(changelog, new_log)
    _write(init, code)
    return [ini, init, changelog]


# ------------------------------------------------------------------------------------------ pin-book
def _pin_text(text: str, repo: str, tag: str) -> tuple[str, int]:
    "Pin `git+<repo>[@ref]` install specs and `<repo>/(blob|tree|raw)/main/` links to the tag."
    esc = re.escape(repo)
    text, a = re.subn(rf"git\+{esc}(?:\.git)?(?:@[\w.\-/]+)?(?![\w.\-/@])", f"git+{repo}@{tag}", text)
    text, b = re.subn(rf"(?<![\w+])({esc})/(blob|tree|raw)/main/", rf"\1/\2/{tag}/", text)
    return text, a + b


def _sources_only_differ(old: dict, new: dict) -> bool:
    "The notebooks are equal apart from cell sources (so no output, metadata or id changed)."
    strip = lambda nb: {**nb, "cells": [{k: v for k, v in c.items() if k != "source"} for c in nb["cells"]]}
    return strip(old) == strip(new) and len(old["cells"]) == len(new["cells"])


def pin_book(root: Path, tag: str, warn=print) -> list[Path]:
    tag_version(tag)
    cfg = settings(root)
    repo = _repo_url(cfg)
    nbs = root / cfg.get("nbs_path", "nbs")
    changed, unpinned, wide = [], [], []
    for path in sorted(nbs.glob("*.ipynb")):
        raw = _read(path)
        new, n = _pin_text(raw, repo, tag)
        old_nb, new_nb = json.loads(raw), json.loads(new)
        if not _sources_only_differ(old_nb, new_nb):
            raise ReleaseError(f"{path.name}: the repository URL also appears outside cell sources; "
                               "refusing to rewrite outputs or metadata")
        code = [c for c in new_nb["cells"] if c["cell_type"] == "code"]
        first = "".join(code[0]["source"]) if code else ""
        if "google.colab" in first and f"git+{repo}@{tag}" not in first:
            unpinned.append(path.name)
        wide += [f"{path.name} ({len(line)})" for c in code for line in "".join(c["source"]).splitlines()
                 if f"@{tag}" in line and len(line) > COLUMN]
        if new != raw:
            _write(path, new)
            changed.append(path)
    if unpinned:
        raise ReleaseError(f"the Colab install cell of {unpinned} does not install from git+{repo}")
    if wide:
        warn(f"warning: {len(wide)} pinned code lines are longer than the book's {COLUMN}-character column and "
             f"will scroll sideways in the {tag} book: {', '.join(wide)}. Give the URL a line of its own with "
             f"less indentation in those notebooks' Colab cells.")
    for path in sorted(nbs.glob("*.md")):
        raw = _read(path)
        new, _ = _pin_text(raw, repo, tag)
        if new != raw:
            _write(path, new)
            changed.append(path)

    # _config.yml: repository.branch makes the Colab (and repository) links; only that value changes
    conf = root / "_config.yml"
    text = _read(conf)
    m = re.search(r"^repository:[^\n]*\n((?:[ \t]+[^\n]*\n|[ \t]*\n)*)", text, re.MULTILINE)
    if not m:
        raise ReleaseError("_config.yml has no `repository:` section")
    block = m.group(1)
    new_block, n = re.subn(r"^([ \t]+branch:[ \t]*)(\S+)", lambda b: b.group(1) + tag, block, count=1, flags=re.MULTILINE)
    if n != 1:
        raise ReleaseError("_config.yml's repository section has no `branch:`")
    if new_block != block:
        _write(conf, text[:m.start(1)] + new_block + text[m.end(1):])
        changed.append(conf)
    return changed


# ----------------------------------------------------------------------------------- check-tag, notes
def notes(root: Path, version: str) -> str:
    text = _read(root / "CHANGELOG.md")
    head = re.search(rf"^## \[{re.escape(version)}\][^\n]*\n", text, re.MULTILINE)
    if not head:
        raise ReleaseError(f"CHANGELOG.md has no entry for {version}")
    nxt = re.compile(r"^(## \[|\[[^\]]+\]: )", re.MULTILINE).search(text, head.end())
    return text[head.end():nxt.start() if nxt else len(text)].strip("\n") + "\n"


def check_tag(root: Path, tag: str) -> str:
    version = tag_version(tag)
    cfg = settings(root)
    if cfg["version"] != version:
        raise ReleaseError(f"tag {tag} but settings.ini says version {cfg['version']}: "
                           f"run `python scripts/release.py bump {version}`, commit, and tag that commit")
    init = _read(root / cfg["lib_path"] / "__init__.py")
    if f'__version__ = "{version}"' not in init:
        raise ReleaseError(f"{cfg['lib_path']}/__init__.py's __version__ is not {version}: run `make export`")
    text = _read(root / "CHANGELOG.md")
    if not re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d\d-\d\d", text, re.MULTILINE):
        raise ReleaseError(f"CHANGELOG.md has no dated entry `## [{version}] - YYYY-MM-DD`")
    return version


def latest_tag(root: Path) -> str:
    "The newest final-release tag (pre-releases never become the book's root)."
    out = subprocess.run(["git", "tag", "--list", "v*"], cwd=root, capture_output=True, text=True, check=True).stdout
    finals = [t for t in out.split() if FINAL_RE.fullmatch(t[1:])]
    return max(finals, key=lambda t: version_key(t[1:]), default="")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Release helpers (see the module docstring).")
    ap.add_argument("--root", type=Path, default=ROOT, help="the project folder (default: this checkout)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("bump", help="set the version and turn [Unreleased] into the release's entry")
    p.add_argument("version")
    p.add_argument("--date", help="the release date (default: today), YYYY-MM-DD")
    sub.add_parser("pin-book", help="point the book's Colab cells and links at a tag").add_argument("tag")
    sub.add_parser("check-tag", help="the tag agrees with settings.ini and CHANGELOG.md").add_argument("tag")
    sub.add_parser("notes", help="print a version's changelog entry").add_argument("version")
    sub.add_parser("latest-tag", help="print the newest final release tag")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    try:
        if args.cmd == "bump":
            old = settings(root)["version"]
            for path in bump(root, args.version, args.date):
                print(f"updated {path.relative_to(root)}")
            print(f"version {old} -> {args.version}. Next: review `git diff`, run `make test`, then\n"
                  f"  git commit -am 'Release {args.version}' && git tag v{args.version} && "
                  f"git push origin main v{args.version}")
        elif args.cmd == "pin-book":
            changed = pin_book(root, args.tag, warn=lambda msg: print(msg, file=sys.stderr))
            print(f"pointed the book at {args.tag}: {len(changed)} files changed"
                  + "".join(f"\n  {p.relative_to(root)}" for p in changed))
        elif args.cmd == "check-tag":
            print(f"{args.tag} agrees with settings.ini, the package and CHANGELOG.md ({check_tag(root, args.tag)})")
        elif args.cmd == "notes":
            sys.stdout.write(notes(root, args.version))
        elif args.cmd == "latest-tag":
            print(latest_tag(root))
    except ReleaseError as e:
        print(f"release.py {args.cmd}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
