"""Generation speed, side by side in one process: with and without the KV cache, per-token decode time as
the context grows, and against Hugging Face `transformers` GPT-2 of the same size (random weights, built
from a config: nothing is downloaded; the row is skipped when `transformers` is not installed).

    python bench/bench_generate.py [--device cpu] [--new-tokens 256] [--repeats 3] [--plot decode.png]

Model: 4 layers, d_model 256, 4 heads, vocabulary 5,000 (GPT-2-style: learned positions, pre-norm,
GELU (tanh), tied embeddings); prompt 16 tokens; greedy decoding, float32.
"""
import argparse
import statistics
import time

import torch

from common import sync, timed
from minitransformer.generation import generate
from minitransformer.model import GPT, GPTConfig


@torch.no_grad()
def decode_step_times(model, prompt, n_new, device) -> list[float]:
    "Seconds for each decode step (after a prefill), with the inputs `generate` gives the model."
    ids = torch.tensor([prompt], device=device)
    total = len(prompt) + n_new
    cache = model.make_cache(1, total)
    real = torch.ones(1, total, dtype=torch.bool, device=device)  # one prompt: no padding
    logits = model(ids, attention_mask=real[:, : len(prompt)], cache=cache)[:, -1]
    times = []
    for _ in range(n_new):
        nxt = logits.argmax(-1, keepdim=True)
        sync(device)
        t0 = time.perf_counter()
        n = len(cache) + 1
        logits = model(nxt, attention_mask=real[:, :n], cache=cache)[:, -1]
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--plot", default=None, help="save the per-token decode time plot to this PNG file")
    a = ap.parse_args()
    device = torch.device(a.device)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=5000, max_len=a.prompt + a.new_tokens, d_model=256, n_heads=4, n_layers=4,
                    activation="gelu_tanh")
    model = GPT(cfg).to(device).eval()
    prompt = list(range(10, 10 + a.prompt))
    print(f"device={device} threads={torch.get_num_threads()} torch={torch.__version__}; "
          f"4 layers, d_model 256, 4 heads, vocab 5000; prompt {a.prompt}, {a.new_tokens} new tokens")

    # 1. cached vs uncached (the same generate, use_cache on/off), alternating
    generate(model, [prompt], 8)  # warm-up
    cached, uncached = [], []
    for _ in range(a.repeats):
        cached.append(timed(lambda: generate(model, [prompt], a.new_tokens), device))
        uncached.append(timed(lambda: generate(model, [prompt], a.new_tokens, use_cache=False), device))
    tc, tu = statistics.median(cached), statistics.median(uncached)
    print(f"\n{'':<28}{'seconds':>9}{'tokens/s':>10}")
    print(f"{'ours, KV cache':<28}{tc:>9.2f}{a.new_tokens / tc:>10.1f}")
    print(f"{'ours, no cache':<28}{tu:>9.2f}{a.new_tokens / tu:>10.1f}")
    print(f"cache speed-up: {tu / tc:.1f}x  (target >= 5x)")

    # 2. per-token decode time against context length
    runs = [decode_step_times(model, prompt, a.new_tokens, device) for _ in range(a.repeats)]
    per_step = [statistics.median(col) for col in zip(*runs)]
    first, last = statistics.mean(per_step[:64]), statistics.mean(per_step[-64:])
    print(f"\ndecode step: first 64 tokens {1e3 * first:.2f} ms, last 64 {1e3 * last:.2f} ms, "
          f"ratio {last / first:.2f}  (target <= 1.5)")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.plot(range(a.prompt + 1, a.prompt + a.new_tokens + 1), [1e3 * t for t in per_step])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("ms per decode step")
        ax.set_ylim(bottom=0)
        ax.set_title("decode time per token with the KV cache")
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)
        print(f"plot saved to {a.plot}")

    # 3. against Hugging Face transformers' GPT-2 of the same size
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        print("\ntransformers is not installed: skipping the comparison with its GPT-2 (pip install transformers)")
        return
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=5000, n_positions=cfg.max_len, n_embd=256, n_layer=4, n_head=4,
                                    n_inner=1024, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                    bos_token_id=3, eos_token_id=3)).to(device).eval()
    hf_prompt = torch.tensor([prompt], device=device)
    hf_kw = dict(max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, do_sample=False, use_cache=True,
                 pad_token_id=0, attention_mask=torch.ones_like(hf_prompt))
    with torch.no_grad():
        hf.generate(hf_prompt, **{**hf_kw, "max_new_tokens": 8, "min_new_tokens": 8})
    ours, theirs = [], []
    for _ in range(a.repeats):
        ours.append(timed(lambda: generate(model, [prompt], a.new_tokens), device))
        with torch.no_grad():
            theirs.append(timed(lambda: hf.generate(hf_prompt, **hf_kw), device))
    to, th = statistics.median(ours), statistics.median(theirs)
    print(f"\n{'':<28}{'seconds':>9}{'tokens/s':>10}")
    print(f"{'ours, KV cache':<28}{to:>9.2f}{a.new_tokens / to:>10.1f}")
    print(f"{'transformers GPT-2, cache':<28}{th:>9.2f}{a.new_tokens / th:>10.1f}")
    print(f"ours / transformers tokens per second: {th / to:.2f}x  (target >= 1.0x)")


if __name__ == "__main__":
    main()
