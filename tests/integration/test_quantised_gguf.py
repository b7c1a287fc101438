"""minitransformer.quantised against the gguf package and the real SmolLM2 file: every block
kind dequantises bit for bit, the GGUF loader keeps the file's blocks in little memory and computes
the same, and files without block kinds are refused before anything is built."""

import pytest
import torch

from minitransformer.generation import generate
from minitransformer.quantised import QuantisedWeight, weight_bytes

from helpers import smollm2_gguf

gguf = pytest.importorskip("gguf")


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1"])
def test_each_block_kind_dequantises_as_gguf_bit_for_bit(kind):
    w = torch.randn(40, 96, generator=torch.Generator().manual_seed(3)) * 0.05
    w[3, :32] = 0.0  # a block of zeros: scale 0
    theirs = gguf.GGMLQuantizationType[kind.upper()]
    want = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(w.numpy(), theirs), theirs))
    weight = QuantisedWeight.from_float(w, kind)
    assert torch.equal(weight.dequantise(), want), f"{kind}: not gguf's blocks"
    rows = torch.tensor([5, 0, 39])
    assert torch.equal(weight.dequantise(rows), want[rows]), f"{kind}: a lookup of rows differs"


def test_the_files_blocks_dequantise_as_gguf_bit_for_bit():
    from minitransformer.gguf import read_gguf
    from minitransformer.quantised import weight_from_gguf
    _, tensors = read_gguf(smollm2_gguf())
    for name in ("blk.0.ffn_down.weight", "blk.29.attn_k.weight", "token_embd.weight"):
        t = tensors[name]
        weight = weight_from_gguf(t)
        rows = torch.arange(0, weight.shape[0], 97)
        want = gguf.quants.dequantize(t.data[rows.numpy()], t.tensor_type)
        assert torch.equal(weight.dequantise(rows), torch.from_numpy(want)), name


@pytest.mark.slow
def test_load_gguf_blocks_keeps_the_blocks_in_little_memory_and_computes_the_same():
    from minitransformer.gguf import load_gguf, read_gguf
    from minitransformer.quantised import load_gguf_blocks
    path = smollm2_gguf()
    blocks = load_gguf_blocks(path, max_len=64).model
    floats = load_gguf(path, max_len=64).model
    _, tensors = read_gguf(path)
    file_bytes = sum(int(t.n_bytes) for t in tensors.values())
    assert weight_bytes(blocks) <= 1.2 * file_bytes
    assert isinstance(blocks.head.weight, QuantisedWeight)
    assert blocks.head.weight is blocks.embed.tok.weight  # the Q8_0 table, once
    ids = torch.tensor([[1, 504, 3458, 314, 260, 3575, 30]])
    with torch.no_grad():
        for rows in (ids, ids[:, :1]):
            assert (blocks(rows) - floats(rows)).abs().max() < 1e-3
    assert generate(blocks, ids.tolist(), 6) == generate(floats, ids.tolist(), 6)


def test_load_gguf_blocks_refuses_bad_arguments(tmp_path):
    from minitransformer.quantised import load_gguf_blocks
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        load_gguf_blocks(tmp_path)
    with pytest.raises(TypeError, match="dtype"):  # before the path is looked at
        load_gguf_blocks(tmp_path / "missing.gguf", dtype=torch.int8)
    with pytest.raises(ValueError, match="max_len"):  # with the header's numbers
        load_gguf_blocks(smollm2_gguf(), max_len=0)


def test_each_gguf_format_matches_the_gguf_package():
    "Our BlockFormat of each GGUF type: gguf's weights a block, and its type by that name."
    from minitransformer.quantised import FORMATS
    for fmt in FORMATS.values():
        if fmt.gguf_type is not None:
            block, _ = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[fmt.gguf_type]]
            assert block == fmt.block, fmt


def test_k_quants_are_named_and_dequantised_and_a_file_of_floats_is_refused():
    "Decided from the tensor list alone: K-quants warned of by name, a file of floats refused."
    from types import SimpleNamespace
    from minitransformer.quantised import _check_has_blocks
    kinds = {k: SimpleNamespace(tensor_type=getattr(gguf.GGMLQuantizationType, k))
             for k in ("F32", "Q4_K", "Q6_K", "Q4_1")}
    file = SimpleNamespace(path="x.gguf", rules={k: (k, None) for k in kinds}, tensors=kinds)
    with pytest.warns(UserWarning, match=r"2 tensors of other kinds \(1 Q4_K, 1 Q6_K\) are "
                      r"dequantised to torch.float32"):
        _check_has_blocks(file, torch.float32)
    floats = SimpleNamespace(path="y.gguf", rules={"a": ("F32", None)}, tensors=kinds)
    with pytest.raises(ValueError, match=r"\['F32'\], none quantised"):
        _check_has_blocks(floats, torch.float32)
