"""Re-execute chapter notebooks in place so their committed outputs are fresh.

Usage: python scripts/execute_nbs.py [nbs/NAME.ipynb ...]   (default: every notebook in nbs/)

Each notebook is first cleaned with nbdev's cleaner (stray metadata, ids), then run top to bottom
in a fresh kernel with nbclient, which also saves the widgets' state so the book can show them.
Execution counts are kept: nbval refuses cells that have outputs but no count.
"""
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbdev.clean import clean_nb
from nbdev.config import get_config

ROOT = Path(__file__).resolve().parent.parent


def execute(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    cfg = get_config()
    clean_nb(nb, allowed_cell_metadata_keys=cfg.get("allowed_cell_metadata_keys", "").split(),
             clean_ids=cfg.get("clean_ids", "True") == "True")  # nbdev_clean's rules (keeps cell tags)
    nb = nbformat.from_dict(nb)
    start = time.perf_counter()
    NotebookClient(nb, timeout=900, kernel_name="python3", record_timing=False,
                   store_widget_state=True, resources={"metadata": {"path": str(path.parent)}}).execute()
    if not _has_widgets(nb):
        nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    return time.perf_counter() - start


def _has_widgets(nb) -> bool:
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    return bool(state.get("state"))


def main(args: list[str]) -> None:
    get_config()  # fail early outside the project
    paths = [Path(a) for a in args] or sorted((ROOT / "nbs").glob("*.ipynb"))
    for p in paths:
        print(f"executing {p} ...", flush=True)
        print(f"  done in {execute(p):.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
