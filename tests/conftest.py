from configparser import ConfigParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def settings():
    "The [DEFAULT] section of settings.ini."
    cfg = ConfigParser(delimiters=["="])
    cfg.read(ROOT / "settings.ini", encoding="utf-8")
    return cfg["DEFAULT"]


def chapter_notebooks() -> list[Path]:
    "Every notebook in nbs/, in book order."
    return sorted(p for p in (ROOT / "nbs").glob("*.ipynb"))
