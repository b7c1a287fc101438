"""The package under the tools a PyTorch user reaches for: `torch.compile(model)` for
training (no eager call first), `train(..., compile=...)`, `torch.func` (vmap of grad of
functional_call), `torch.export`, forward hooks (module, model and a user's instance
`forward`) with eager and compiled `generate`, a compiled `generate` inside a hook,
several model variants and threads in one process, `copy.deepcopy` and `pickle`.

Where state matters (dynamo's caches, a first call), the check runs in a fresh Python
process. Tiny models; `backend="eager"` / `"aot_eager"` trace as torch.compile does
without generating code, and one inductor case (`train(compile=True)`) compiles for real."""

import copy
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

from minitransformer.generation import generate
from minitransformer.model import GPT, GPTConfig
from minitransformer.training import train

RECIPE = dict(position_encoding="rotary", norm="rmsnorm", activation="swiglu", bias=False,
              n_kv_heads=2)

PRELUDE = """
import torch
from minitransformer.model import GPT, GPTConfig
from minitransformer.generation import generate
from torch._dynamo.utils import counters
RECIPE = dict(position_encoding="rotary", norm="rmsnorm", activation="swiglu",
              bias=False, n_kv_heads=2)
def gpt(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=50, max_len=32, d_model=32, n_heads=4, n_layers=2) | kw
    return GPT(GPTConfig(**cfg))
def in_two_threads(work):
    "[work(0), work(1)], each called in a thread of its own at the same time."
    import threading
    got = [None, None]
    def run(i):
        got[i] = work(i)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread is stuck"
    return got
"""


def run(code: str, timeout: int = 240) -> str:
    "Run `code` (after PRELUDE) in a fresh Python process; return its stdout."
    env = dict(os.environ, PYTHONHASHSEED="0")
    done = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def gpt(seed=0, **kw) -> GPT:
    torch.manual_seed(seed)
    cfg = dict(vocab_size=50, max_len=32, d_model=32, n_heads=4, n_layers=2) | kw
    return GPT(GPTConfig(**cfg))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("kw", [{}, RECIPE], ids=["gpt-2 layout", "the recipe"])
def test_torch_compile_of_the_model_trains_from_the_first_step(backend, kw):
    "nanoGPT's pattern, compiled before any eager call: the losses of eager training."
    out = run(f"""
    def losses(compiled):
        model = gpt(**{kw!r}).train()
        net = torch.compile(model, backend={backend!r}) if compiled else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        out = []
        for step in range(3):
            ids = torch.randint(0, 50, (4, 9), generator=g)
            logits = net(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                     ids[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
        return out
    a = losses(True)
    b = losses(False)
    assert all(abs(x - y) < 1e-4 for x, y in zip(a, b)), (a, b)
    print("ok", a)
    """)
    assert out.startswith("ok")


@pytest.mark.slow
def test_train_compile_true_with_inductor():
    "train(compile=True): the model compiled by inductor for the steps, then eager."
    out = run("""
    import time
    from minitransformer.training import train
    def batch(step):
        g = torch.Generator().manual_seed(step)
        return (torch.randint(0, 50, (4, 9), generator=g),)
    def loss_fn(net, batch):
        ids, = batch
        logits = net(ids[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                 ids[:, 1:].flatten())
    logs = []
    for compile in (True, False):
        model = gpt(**RECIPE)
        start = time.perf_counter()
        log = train(model, batch, loss_fn, steps=3, lr=1e-2, warmup=0, log_every=0,
                    compile=compile)
        logs.append(log.losses)
        print(f"compile={compile}: {time.perf_counter() - start:.1f} s")
    a, b = logs
    assert len(a) == 3 and all(abs(x - y) < 1e-3 for x, y in zip(a, b)), (a, b)
    assert "forward" not in vars(model)  # the model itself is left as it was
    print("ok")
    """, timeout=500)
    assert out.rstrip().endswith("ok"), out


def test_vmap_of_grad_of_functional_call_gives_per_example_gradients():
    model = gpt(**RECIPE).eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    ids = torch.randint(0, 50, (3, 6), generator=torch.Generator().manual_seed(0))

    def loss(params, row):  # one example: (T,)
        logits = torch.func.functional_call(model, params, (row[None, :-1],))
        return torch.nn.functional.cross_entropy(logits[0], row[1:])

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, ids)
    for b in range(len(ids)):
        model.zero_grad()
        logits = model(ids[b : b + 1, :-1])
        torch.nn.functional.cross_entropy(logits[0], ids[b, 1:]).backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name][b], p.grad, atol=1e-5, rtol=1e-4)


def test_torch_export_of_a_gpt():
    model = gpt(**RECIPE).eval()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    program = torch.export.export(model, (ids,))
    other = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(other), model(other))


def test_hooks_and_a_users_forward_are_seen_by_eager_and_compiled_generate():
    "Compiled, the step is one graph: hooks run in it; one that breaks the graph is named."
    out = run("""
    model = gpt(**RECIPE).eval()
    seen = {"model": 0, "layer": 0, "head": 0}
    model.register_forward_hook(lambda *a: seen.__setitem__("model", seen["model"] + 1))
    hook = model.decoder.layers[1].register_forward_hook(
        lambda *a: seen.__setitem__("layer", seen["layer"] + 1))
    plain = model.head.forward

    def head(x):  # what accelerate's hooks install: an instance forward
        seen["head"] += 1
        return plain(x)

    model.head.forward = head
    eager = generate(model, [[1, 2, 3]], 5)
    assert seen == {"model": 5, "layer": 5, "head": 5}, seen
    compiled = generate(model, [[1, 2, 3]], 5, compile="eager")
    assert compiled == eager
    # the compiled steps run every hook, a layer's too, and the head's forward, each call
    assert seen == {"model": 10, "layer": 10, "head": 10}, seen
    hook.remove()
    breaks = model.decoder.layers[0].register_forward_hook(
        lambda *a: torch._dynamo.graph_break())  # a hook the step cannot hold
    try:
        generate(model, [[1, 2, 3]], 5, compile="eager")
        raise AssertionError("a graph break was accepted")
    except RuntimeError as e:
        assert "one graph" in str(e) and "decoder.layers.0" in str(e), e
        assert "compile=False" in str(e), e
    breaks.remove()
    assert vars(model.head)["forward"] is head  # the user's forward is still there
    print("ok")
    """)
    assert out.startswith("ok")


def test_a_compiled_generate_inside_a_hook_of_another():
    """A hook on the outer model's head runs a compiled generate on a second model: fine
    while the outer model decodes eagerly; compiled, its step cannot hold the hook's
    call, and the error names the head."""
    out = run("""
    outer, inner = gpt(0, **RECIPE).eval(), gpt(1).eval()
    want = generate(inner, [[4, 5]], 3)
    got = []
    outer.head.register_forward_hook(
        lambda *a: got.append(generate(inner, [[4, 5]], 3, compile="eager")))
    tokens = generate(outer, [[1, 2, 3]], 4)
    assert tokens == generate(gpt(0, **RECIPE).eval(), [[1, 2, 3]], 4)
    assert len(got) == 4 and all(g == want for g in got), (got, want)
    try:
        generate(outer, [[1, 2, 3]], 4, compile="eager")
        raise AssertionError("a generate inside the compiled step was accepted")
    except RuntimeError as e:
        assert "one graph" in str(e) and "hooked: head" in str(e), e
    print("ok")
    """, timeout=180)
    assert out.startswith("ok")


@pytest.mark.slow
def test_ten_model_variants_compile_in_one_process():
    "Each variant compiles (a graph of its own), and none decodes eagerly unseen."
    out = run("""
    variants = [dict(n_layers=n, **kw) for n in (1, 2) for kw in (
        {}, RECIPE, dict(RECIPE, n_kv_heads=4), dict(position_encoding="sinusoidal"),
        dict(norm="rmsnorm", activation="gelu_tanh"))]
    assert len(variants) == 10
    counters.clear()
    for i, kw in enumerate(variants):
        model = gpt(i, **kw).eval()
        before = counters["stats"]["unique_graphs"]
        assert generate(model, [[1, 2, 3]], 6, compile="eager") == generate(
            model, [[1, 2, 3]], 6), kw
        assert counters["stats"]["unique_graphs"] == before + 1, (kw, dict(counters))
    again = gpt(0, **variants[0]).eval()  # a model of a configuration seen before:
    before = counters["stats"]["unique_graphs"]  # its graph is reused
    assert generate(again, [[1, 2, 3]], 6, compile="eager") == generate(
        again, [[1, 2, 3]], 6)
    assert counters["stats"]["unique_graphs"] == before
    print("ok", counters["stats"]["unique_graphs"])
    """, timeout=400)
    assert out.startswith("ok 10"), out


def test_two_threads_generate_on_two_models():
    out = run("""
    models = [gpt(0, **RECIPE).eval(), gpt(1).eval()]
    want = [generate(m, [[1, 2, 3]], 8) for m in models]
    for compile in (False, "eager"):
        got = in_two_threads(lambda i: [generate(models[i], [[1, 2, 3]], 8, compile=compile)
                                        for _ in range(3)])
        assert got == [[w] * 3 for w in want], (compile, got, want)
    print("ok")
    """, timeout=300)
    assert out.startswith("ok")


def test_deepcopy_and_pickle_after_training_and_after_compiled_decoding():
    model = gpt(**RECIPE)

    def batch(step):
        return (torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(step)),)

    def loss_fn(net, batch):
        ids, = batch
        logits = net(ids[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())

    train(model, batch, loss_fn, steps=2, warmup=0, log_every=0)
    generate(model, [[1, 2]], 4, compile="eager")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        want = model(ids)
        for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            torch.testing.assert_close(other(ids), want, atol=0, rtol=0)
            assert generate(other, [[1, 2]], 4) == generate(model, [[1, 2]], 4)


def test_models_that_differ_only_in_a_setting_keep_their_own_tokens_compiled():
    """Two models of the same shapes and weights that differ only in a non-tensor setting
    (the activation, the rotary base): their compiled steps, called alternately and then from
    two threads after warm-up, give each model's eager tokens (the guards see the setting)."""
    out = run("""
    pairs = [(gpt(0, activation="gelu"), gpt(0, activation="relu")),
             (gpt(1, **RECIPE), gpt(1, **dict(RECIPE, rope_base=50.0)))]
    for a, b in pairs:
        b.load_state_dict(a.state_dict())
        a.eval(), b.eval()
        want = [generate(m, [[1, 2, 3]], 12) for m in (a, b)]
        assert want[0] != want[1], "the setting should change the tokens"
        for _ in range(2):  # alternately
            got = [generate(m, [[1, 2, 3]], 12, compile="eager") for m in (a, b)]
            assert got == want, (got, want)
        got = in_two_threads(lambda i: [generate((a, b)[i], [[1, 2, 3]], 12, compile="eager")
                                        for _ in range(3)])
        assert got == [[w] * 3 for w in want], (got, want)
    print("ok")
    """, timeout=300)
    assert out.startswith("ok")



@pytest.mark.slow
@pytest.mark.skipif(not torch.__version__.startswith("2.13"),
                    reason="pins what torch 2.13 computes")
@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "torch 2.13: inductor's gradients through a nested_compile_region that three or more "
    "layers reuse are wrong (one or two layers, or aot_eager: right), which is why the "
    "package compiles its layers without a region. An XPASS means torch fixed it."))
def test_inductor_gradients_through_a_region_reused_by_three_layers():
    class Block(torch.nn.Module):  # a residual block compiled once, reused by each layer
        def __init__(self):
            super().__init__()
            self.norm, self.linear = torch.nn.LayerNorm(16), torch.nn.Linear(16, 16)

        @torch.compiler.nested_compile_region
        def forward(self, x):
            return x + torch.tanh(self.linear(self.norm(x)))

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(Block() for _ in range(3))

    def loss(x):
        for b in blocks:
            x = b(x)
        return x.square().sum()

    x, params = torch.randn(4, 16), list(blocks.parameters())
    eager = torch.autograd.grad(loss(x), params)
    torch._dynamo.reset()
    compiled = torch.autograd.grad(torch.compile(loss, fullgraph=True)(x), params)
    worst = max((a - b).abs().max().item() for a, b in zip(eager, compiled))
    assert worst < 1e-4, f"largest gradient difference {worst:.3g}"
