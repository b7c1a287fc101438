"""Map every test collected at one commit to one collected now, by function name and parameter id.

    python scripts/test_moves.py REV            # collect at REV (a temporary worktree) and now
    python scripts/test_moves.py BEFORE AFTER   # two saved `pytest --collect-only -q` listings

Moving tests between files changes their node ids (`tests/test_x.py::test_f[p]` becomes
`tests/unit/test_m.py::test_f[p]`) but neither the function's name nor its parameter id, so
the pair (name, parameter id) follows a test wherever it went. Prints each file's new home and
every test that has no counterpart: a test collected before and not now is lost (exit status 1);
one collected now and not before is new. Collection runs with MT_BROWSER_TESTS=1, so the browser
tests count.
"""
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE = re.compile(r"^(?P<file>[^:\s]+\.py)::(?:\w+::)?(?P<name>\w+)(?P<param>\[.*\])?$")


def collect(where: Path) -> list[str]:
    "The node ids pytest collects under `where`/tests."
    env = dict(os.environ, MT_BROWSER_TESTS="1")
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                          "--collect-only", "-q", "tests"], cwd=where, env=env,
                         capture_output=True, text=True)
    ids = [line for line in out.stdout.splitlines() if NODE.match(line)]
    if out.returncode != 0 or not ids:
        sys.exit(f"collection failed in {where}:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return ids


def collect_at(rev: str) -> list[str]:
    "The node ids collected in a temporary worktree of `rev`."
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT,
                       check=True, capture_output=True)
        try:
            return collect(tree)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                           check=True, capture_output=True)


def key(node_id: str) -> tuple[str, str]:
    m = NODE.match(node_id)
    return m["name"], m["param"] or ""


def main(argv: list[str]) -> int:
    if len(argv) == 1:
        before, after = collect_at(argv[0]), collect(ROOT)
    elif len(argv) == 2:
        before, after = (Path(a).read_text().splitlines() for a in argv)
        before = [b for b in before if NODE.match(b)]
        after = [a for a in after if NODE.match(a)]
    else:
        sys.exit(__doc__)
    old, new = Counter(map(key, before)), Counter(map(key, after))
    homes = defaultdict(Counter)  # old file -> new files of its tests
    new_files = defaultdict(list)
    for a in after:
        new_files[key(a)].append(NODE.match(a)["file"])
    for b in before:
        k = key(b)
        if new_files[k]:
            homes[NODE.match(b)["file"]][new_files[k][0]] += 1
    for f in sorted(homes):
        where = ", ".join(f"{n} -> {g}" for g, n in sorted(homes[f].items()))
        print(f"{f} ({sum(homes[f].values())}): {where}")
    lost = sorted(b for b in before if new[key(b)] < old[key(b)])
    added = sorted(a for a in after if new[key(a)] > old[key(a)])
    print(f"\nbefore: {len(before)} tests; now: {len(after)}; "
          f"lost: {len(lost)}; new: {len(added)}")
    for b in lost:
        print(f"  LOST {b}")
    for a in added:
        print(f"  NEW  {a}")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
