"""Chapter 13 is a chapter of one idea, the training loop: `train`'s machinery
is folded, and the teaching of resuming a run and of a step that goes wrong lives in the appendix
*Checkpoints*; the warm-up experiment rests on three seeds, and the prose claims no time."""

import re

from helpers import ROOT, cell_printed as _output, cell_source as _src, notebook_cells as _cells


CH13 = ROOT / "nbs" / "13_training.ipynb"

APPENDIX = ROOT / "nbs" / "92_checkpoints.ipynb"

# All cells, markdown included. `train`'s machinery (the log's clock, the run's state, SingleProcess,
# the argument checks) is exported into the same module from the appendix, where it is folded.
MAX_LINES = 750

MAX_OWN_LINES = 470  # the lines that are not exported code


def _exported(cell) -> bool:
    return cell["cell_type"] == "code" and re.search(r"^\s*#\|\s*export", _src(cell), re.M) is not None


def _markdown(path) -> str:
    return "\n".join(_src(c) for c in _cells(path) if c["cell_type"] == "markdown")


def test_chapter_13_is_short():
    cells = _cells(CH13)
    total = sum(len(c["source"]) for c in cells)
    own = sum(len(c["source"]) for c in cells if not _exported(c))
    assert total <= MAX_LINES, f"chapter 13 has {total} source lines (at most {MAX_LINES})"
    assert own <= MAX_OWN_LINES, f"chapter 13 has {own} lines besides its exported code"


def test_trains_machinery_lives_in_the_appendix_and_exports_into_training():
    "Exported from the appendix into `minitransformer.training`, folded; the chapter imports it."
    moved = ("class _Clock", "class SingleProcess", "def _check_train")
    for name in moved:
        assert not any(_exported(c) and name in _src(c) for c in _cells(CH13)), name
        (cell,) = [c for c in _cells(APPENDIX) if _exported(c) and name in _src(c)]
        assert _src(cell).startswith("#| export training\n"), name
        assert "hide-cell" in cell["metadata"].get("tags", []), name
    import minitransformer.training as training
    assert {"SingleProcess", "train", "TrainLog"} <= set(training.__all__)
    (cell,) = [c for c in _cells(APPENDIX) if _exported(c) and "def resume_run" in _src(c)]
    assert _src(cell).startswith("#| export\n")  # a run's state: the checkpoints' job


def test_train_and_its_machinery_are_folded():
    "`train` is shown as the sketch plus a list of additions; its code is folded."
    for c in _cells(CH13):
        if _exported(c) and re.search(r"^(def train\(|class SingleProcess|class TrainLog)",
                                      _src(c), re.M):
            tags = set(c.get("metadata", {}).get("tags", []))
            assert tags & {"hide-cell", "hide-input"}, f"not folded: {_src(c)[:60]!r}"
    assert "def train_sketch(" in "".join(_src(c) for c in _cells(CH13) if c["cell_type"] == "code")


def test_warmup_table_covers_three_seeds():
    (cell,) = [c for c in _cells(CH13) if c["cell_type"] == "code" and "def warmup_run" in _src(c)]
    assert "for seed in range(3)" in _src(cell)
    rows = re.findall(r"^(.+?)\s+loss (\d\.\d+) ± (\d\.\d+); reads the context: (\d) of 3 seeds$",
                      _output(cell), re.M)
    assert len(rows) == 3, f"the warm-up table has {len(rows)} rows: {_output(cell)!r}"
    table = {name: (float(mean), int(reads)) for name, mean, _, reads in rows}
    stalled = [name for name, (_, reads) in table.items() if reads == 0]
    assert stalled == ["post-norm, no warm-up"], table
    # the prose: the stalled model stays above 3.1, the other two end below 2.9
    md = _markdown(CH13)
    assert "three seeds" in md and "above 3.1" in md and "below 2.9" in md
    assert table["post-norm, no warm-up"][0] > 3.1
    assert all(mean < 2.9 for name, (mean, _) in table.items() if name != "post-norm, no warm-up")


def test_prose_claims_no_time():
    "Run times differ between machines: the prose gives none (the logs print them)."
    md = re.sub(r"`[^`]*`", "", _markdown(CH13))  # code spans (`max_seconds`) are names
    md = md.replace("written ten minutes apart", "")  # the 2017 paper's checkpoints, not a run here
    found = re.findall(r"\b(?:minutes?|seconds?|hours?)\b", md, re.I)
    assert not found, f"chapter 13's prose gives times: {found}"


def test_claims_without_an_experiment_are_gone():
    assert "showed works best" not in _markdown(CH13)


def test_resume_and_nonfinite_demos_live_in_the_appendix():
    shown13 = "\n".join(_src(c) for c in _cells(CH13) if c["cell_type"] == "code" and not _exported(c))
    code92 = "\n".join(_src(c) for c in _cells(APPENDIX) if c["cell_type"] == "code")
    for demo in ("resume=True", "KeyboardInterrupt", 'float("nan")', 'on_nonfinite="skip"'):
        assert demo not in shown13, f"chapter 13 still runs the demo with {demo}"
        assert demo in code92, f"the appendix lacks the demo with {demo}"
    md13, md92 = _markdown(CH13), _markdown(APPENDIX)
    assert "Resuming a run" not in md13 and "## Resuming a run" in md92
    assert "## A step that goes wrong" in md92
    assert "appendix *Checkpoints* explains resuming" in md13  # the pointer


def test_processes_are_chapter_14s_subject():
    prose = re.sub(r"^Next: \[.*\]\(.*\)\.$", "", _markdown(CH13), flags=re.M)  # (a title)
    found = re.findall(r"\bprocesses\b", prose, re.I)
    assert len(found) <= 1, f"chapter 13's prose says 'processes' {len(found)} times"
