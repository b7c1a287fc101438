"""pytest's configuration for the three suites.

tests/unit/test_<module>.py holds the unit and property tests of minitransformer.<module>
(tests/unit/fuzz/ its fuzz cases), tests/integration/ what needs real models, reference
libraries, several processes, hostile files or a GPU, and tests/book/ the chapters, their
claims and the built book. Each test gets its suite's marker from its folder; `slow`, `gpu` and
`browser` are set by the tests themselves (pyproject.toml registers all six)."""
from configparser import ConfigParser

import pytest
import torch

from helpers import DEVICE, ROOT

SUITES = ("unit", "integration", "book")

# the tests marked `gpu` compare with float32 on the CPU: no TensorFloat-32 on CUDA
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def pytest_collection_modifyitems(config, items):
    "Mark each test with its suite; skip the `gpu` tests where MT_DEVICE names a missing GPU."
    no_device = DEVICE.type == "cuda" and not torch.cuda.is_available()
    for item in items:
        parts = item.path.relative_to(ROOT / "tests").parts
        if parts[0] not in SUITES:
            raise pytest.UsageError(f"{item.nodeid}: tests live in tests/{{{','.join(SUITES)}}}/")
        item.add_marker(getattr(pytest.mark, parts[0]))
        if no_device and item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason="MT_DEVICE=cuda but no CUDA device"))


@pytest.fixture(scope="session")
def settings():
    "The [DEFAULT] section of settings.ini."
    cfg = ConfigParser(delimiters=["="])
    cfg.read(ROOT / "settings.ini", encoding="utf-8")
    return cfg["DEFAULT"]
