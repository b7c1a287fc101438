"""The package's top level (its front door) without a real model file: `mt.__all__` is the
committed list, and importing it loads no optional library; `load` reads a package checkpoint (dtype, device,
eval mode) and refuses bad arguments before reading anything; `main` ends with status 2 and one
line on stderr naming a source it cannot use (`--debug`: the traceback)."""

import pytest
import torch

from minitransformer.checkpoints import save_checkpoint
import minitransformer as mt
from minitransformer import load, main

from helpers import gguf_file, tiny


@pytest.fixture
def checkpoint(tmp_path):
    model = tiny(40)
    return model, save_checkpoint(model, tmp_path / "tiny.safetensors")


def test_load_reads_a_package_checkpoint_in_any_dtype(checkpoint):
    model, path = checkpoint
    loaded = load(path)
    assert loaded.tokenizer is None and not loaded.model.training
    assert loaded.source == str(path)
    for (n, a), (_, b) in zip(model.state_dict().items(), loaded.model.state_dict().items()):
        assert torch.equal(a, b), n
    half = load(str(path), dtype=torch.bfloat16, device="cpu")
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16}



def test_dtype_auto_keeps_what_each_source_stores(checkpoint, tmp_path):
    model, _ = checkpoint
    half = save_checkpoint(model.to(torch.bfloat16), tmp_path / "half.safetensors")
    assert {p.dtype for p in load(half, dtype="auto").model.parameters()} == {torch.bfloat16}
    pytest.importorskip("gguf")
    floats = gguf_file(tmp_path / "f32.gguf")  # its matrices in F32
    assert load(floats, dtype="auto").model.embed.tok.weight.dtype == torch.float32
    from minitransformer.lora import save_folder
    folder = tmp_path / "folder"
    save_folder(load(floats).model, folder)
    config = folder / "config.json"
    config.write_text(config.read_text().replace('"float32"', '"bfloat16"'))
    assert '"bfloat16"' in config.read_text()
    got = load(folder, dtype="auto").model
    assert {p.dtype for p in got.parameters()} == {torch.bfloat16}
    from minitransformer.gguf import load_gguf
    from minitransformer.quantised import load_gguf_blocks
    blocks = gguf_file(tmp_path / "q8.gguf", blocks=True)  # F32 matrices beside Q8_0 ones
    for loader in (load_gguf, load_gguf_blocks):  # the loaders take "auto" themselves
        assert loader(blocks, dtype="auto").model.embed.tok.weight.dtype == torch.float32
    with pytest.raises(TypeError, match=r"torch.float32 \(or 'auto': as stored\), got"):
        load(floats, dtype="float16")

def test_load_refuses_bad_arguments_before_reading(checkpoint, tmp_path):
    _, path = checkpoint
    with pytest.raises(TypeError, match="source must be a path"):
        load(3)
    with pytest.raises(ValueError, match="keep_blocks=True keeps a GGUF file's blocks"):
        load(path, keep_blocks=True)
    with pytest.raises(ValueError, match="keep_blocks must be True or False"):
        load(path, keep_blocks=1)
    with pytest.raises((TypeError, ValueError), match="dtype"):
        load(path, dtype=torch.int8)
    with pytest.raises(ValueError, match="a checkpoint's max_len is its saved config's: pass none"):
        load(path, max_len=16)
    with pytest.raises(FileNotFoundError, match="no-such.gguf"):
        load(tmp_path / "no-such.gguf")


def test_main_names_a_source_it_cannot_use_in_one_line(checkpoint, tmp_path, capsys):
    _, path = checkpoint
    for argv, why in ((["chat", str(tmp_path / "gone.gguf")], "no GGUF file"),
                      (["generate", str(path), "Hi"], "cannot write text")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and argv[1] in err and why in err, err
        assert "Traceback" not in err
    with pytest.raises(ValueError, match="cannot write text"):
        main(["generate", str(path), "Hi", "--debug"])
    with pytest.raises(SystemExit) as e:  # argparse: a usage error
        main(["talk", str(path)])
    assert e.value.code == 2


TOP_LEVEL = ["load", "main", "GPT", "GPTConfig", "Transformer", "TransformerConfig", "TextEncoder",
             "TextEncoderConfig", "Pretrained", "generate", "train", "add_lora", "save_adapter",
             "load_adapter", "quantise", "save_checkpoint", "load_checkpoint"]


def test_the_top_level_is_the_committed_list_and_imports_no_optional_library():
    import subprocess
    import sys
    assert mt.__all__ == TOP_LEVEL
    assert all(getattr(mt, name) is not None for name in mt.__all__)
    probe = ("import sys, minitransformer; print([m for m in ('tokenizers', 'jinja2', 'gguf', "
             "'huggingface_hub', 'matplotlib', 'transformers', 'ipywidgets') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def _loaders():
    from minitransformer.checkpoints import load_checkpoint
    from minitransformer.gguf import load_gguf, load_pretrained
    from minitransformer.pretrained import load_folder
    from minitransformer.quantised import load_gguf_blocks
    return {load: "x.gguf", load_checkpoint: "x.safetensors", load_folder: ".",
            load_gguf: "x.gguf", load_gguf_blocks: "x.gguf", load_pretrained: "x.gguf"}


def test_every_loader_has_one_dtype_default_and_takes_the_same_values(tmp_path):
    """dtype="auto" by default everywhere; a floating-point torch.dtype or "auto" accepted, and
    anything else (None, a dtype's name, an integer dtype) refused before a file is read."""
    import inspect
    for loader, source in _loaders().items():
        assert inspect.signature(loader).parameters["dtype"].default == "auto", loader
        for bad in (None, "float16", torch.int8):
            with pytest.raises(TypeError, match=r"dtype must be a floating-point torch.dtype"):
                loader(tmp_path / source, dtype=bad)


def test_keep_blocks_keeps_the_blocks_it_runs_and_dequantises_the_rest_naming_them(tmp_path):
    "A file with Q5_0 matrices (as K-quants are: blocks this package does not keep)."
    pytest.importorskip("gguf")
    from minitransformer.gguf import load_gguf
    from minitransformer.quantised import QuantisedWeight
    path = gguf_file(tmp_path / "mixed.gguf", blocks=True, ffn="Q5_0")
    with pytest.warns(UserWarning, match=r"its 4 tensors of other kinds \(4 Q5_0\) are "
                      r"dequantised to torch.float32"):
        kept = load(path, keep_blocks=True).model
    layer = kept.decoder.layers[0]
    assert isinstance(layer.self_attn.qkv.q_proj.weight, QuantisedWeight)  # Q8_0: kept
    assert not isinstance(layer.ff.w1.weight, QuantisedWeight)  # Q5_0: floats
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():  # the same numbers as the file read wholly as floats
        torch.testing.assert_close(kept(ids), load_gguf(path).model(ids))
    floats = gguf_file(tmp_path / "f32.gguf")
    with pytest.raises(ValueError, match="none quantised: there are no blocks to keep"):
        load(floats, keep_blocks=True)


def test_importing_the_package_leaves_the_compiler_unloaded():
    "torch._dynamo (about two seconds) is imported where a compile is asked for, not before."
    import subprocess
    import sys
    probe = "import sys, minitransformer; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False", out.stdout
