"""minitransformer.generation: cached generation writes the tokens of recomputation (batched,
padded, grouped, sampled, compiled), a failed step leaves the model as it was, the arguments are
checked, and a decoded token costs few Python calls and no host read. Tests marked `gpu` run on
MT_DEVICE (scripts/gpu_check.py sets it to cuda)."""

import copy
import pickle
import warnings

import pytest
import torch
from torch._dynamo.utils import counters
from torch.overrides import TorchFunctionMode

from minitransformer import generation
from minitransformer.generation import GenerationCache, generate, read_bandwidth, sample_next
from minitransformer.kv_cache import DecoderCache
from minitransformer.model import GPT, GPTConfig, Transformer, TransformerConfig

from helpers import (
    DEVICE,
    GPT_KINDS,
    READS,
    RECIPE,
    counted,
    device_gpt,
    device_seq2seq,
    small_gpt,
    smollm2_shaped_gpt,
)


def test_static_cache_with_left_padding_and_a_whole_attention_mask():
    model = small_gpt(**RECIPE)
    prompts = [[5, 6, 7, 8, 9], [3, 4], [10, 11, 12]]
    eager = generate(model, prompts, 12)
    torch.manual_seed(0)
    # the same rows through the static cache (the path compile=... uses, without compiling)
    ids = torch.zeros(3, 17, dtype=torch.long)
    real = torch.zeros(3, 17, dtype=torch.bool)
    for b, r in enumerate(prompts):
        ids[b, 5 - len(r) : 5], real[b, 5 - len(r) : 5] = torch.tensor(r), True
    pos = (torch.arange(17)[None] - (5 - torch.tensor([len(r) for r in prompts]))[:, None])
    pos = pos.clamp(min=0)
    cache, out = model.make_cache(3, 17, static=True), [[], [], []]
    with torch.no_grad():
        logits = model(ids[:, :5], attention_mask=real, positions=pos[:, :5], cache=cache)
        for t in range(5, 17):
            nxt = logits[:, -1].argmax(-1)
            for b in range(3):
                out[b].append(int(nxt[b]))
            ids[:, t], real[:, t] = nxt, True
            if t < 16:
                logits = model(ids[:, t : t + 1], attention_mask=real,
                               positions=pos[:, t : t + 1], cache=cache)
    assert out == eager


# ------------------------------------------------------------------ torch.compile
def graphs() -> int:
    return counters["stats"]["unique_graphs"]


def test_compiled_generation_writes_the_eager_tokens_in_one_graph():
    model = small_gpt(**dict(RECIPE, n_kv_heads=2), n_layers=3, max_len=200)
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13]]
    eager = generate(model, prompts, 16)
    torch._dynamo.reset()
    counters.clear()
    assert generate(model, prompts, 16, compile="eager") == eager
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert graphs() == 1, dict(counters["stats"])  # the step: one flat graph
    for n in (5, 30, 1, 0, 59):  # other lengths, a cache of 64 slots: nothing more compiled
        assert generate(model, prompts, n, compile="eager") == generate(model, prompts, n)
    assert graphs() == 1, dict(counters["stats"])
    assert generate(model, prompts, 60, compile="eager") == generate(model, prompts, 60)
    assert graphs() == 2, dict(counters["stats"])  # 65 tokens: a cache of 128 slots
    assert generate(model, prompts, 120, compile="eager") == generate(model, prompts, 120)
    assert graphs() == 2, dict(counters["stats"])
    one = [[4, 5, 6]]  # B = 1: a shape of its own (every shape is static)
    assert generate(model, one, 9, compile="eager") == generate(model, one, 9)
    assert graphs() == 3, dict(counters["stats"])
    assert all("forward" not in vars(m) for m in model.modules())  # nothing assigned


def _greedy(model, ids, memory, source_mask, kw):
    "The compiled step, choosing greedily."
    return generation._choosing_step(model, ids, memory, source_mask, kw,
                                     (0.0, None, None, None))


def test_the_compiled_step_is_one_flat_graph_writing_at_a_device_slot():
    """No nested region, no guard on the cache's length: the step at another slot reuses the
    graph, each layer writes its keys and values by one index_copy_ each, and the host
    length is the caller's (it does not move)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    model = small_gpt(**dict(RECIPE, n_kv_heads=2), n_layers=3)
    backend = CompileCounterWithBackend("eager")
    cache = model.make_cache(1, 12, static=True)
    step = torch.compile(_greedy, backend=backend, dynamic=False,
                         fullgraph=True)  # (fullgraph: raises at a graph break)
    real = torch.zeros(1, 12, dtype=torch.bool)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        model(ids[:, :3], cache=cache)
        real[:, :3] = True
        got = []
        for t in range(3, 6):
            real[:, t] = True
            kw = dict(positions=torch.tensor([[t]]), cache=cache,
                      cache_position=torch.tensor([t]), attention_mask=real)
            got.append(step(model, ids[:, t : t + 1].clone(), None, None, kw))
            assert len(cache) == 3  # the caller keeps the length
        want = model(ids)[:, 3:6].argmax(-1)[0]
    assert backend.frame_count == 1 and len(backend.graphs) == 1
    assert torch.equal(torch.cat(got), want)
    graph, = backend.graphs
    targets = [n.target for n in graph.graph.nodes]
    assert torch.ops.higher_order.invoke_subgraph not in targets
    writes = [t for t in targets if "index_copy" in str(t)]
    assert len(writes) == 2 * 3, writes


_COMPARES = {"lt", "le", "gt", "ge", "eq", "ne", "assert", "assert_async", "assert_scalar",
             "check", "check_is_size", "sym_constrain_range", "isin"}


def _traced_step(n_layers: int):
    "The compiled greedy step's graph (dynamo's, before inductor) for a model of n_layers."
    from torch._dynamo.testing import CompileCounterWithBackend
    model = small_gpt(**dict(RECIPE, n_kv_heads=2), n_layers=n_layers)
    backend = CompileCounterWithBackend("eager")
    cache = model.make_cache(1, 8, static=True)
    step = torch.compile(_greedy, backend=backend, dynamic=False, fullgraph=True)
    kw = dict(positions=torch.tensor([[2]]), cache=cache, cache_position=torch.tensor([2]),
              attention_mask=torch.ones(1, 8, dtype=torch.bool))
    with torch.no_grad():
        step(model, torch.tensor([[3]]), None, None, kw)
    graph, = backend.graphs
    return graph.graph


def test_the_traced_steps_layers_compare_nothing_and_assert_nothing():
    "Comparisons and asserts (the mask's, a check's) are made once a step, not per layer."
    def compares(graph):
        names = [getattr(n.target, "__name__", str(n.target)).strip("_").split(".")[-1]
                 for n in graph.nodes if n.op in ("call_function", "call_method")]
        return sorted(n for n in names if n in _COMPARES)
    one, three = compares(_traced_step(1)), compares(_traced_step(3))
    assert one == three, (one, three)  # nothing more for two more layers
    assert len(one) <= 2, one  # the slot mask's arange <= slot (and the argmax's none)


def test_a_step_that_raises_leaves_the_model_as_it_was(monkeypatch):
    model = small_gpt()

    def broken(*args, **kwargs):
        raise RuntimeError("a step failed")

    monkeypatch.setattr(generation, "_sample", broken)
    with pytest.raises(RuntimeError, match="a step failed"):
        generate(model, [[1, 2]], 4, compile="eager")
    assert all("forward" not in vars(m) for m in model.modules())


def test_compiled_generation_of_a_one_token_prompt_compiles_one_graph():
    "The prompt step runs eagerly even when it is one token long (no second graph)."
    model = small_gpt(**dict(RECIPE, n_kv_heads=2))
    torch._dynamo.reset()
    counters.clear()
    assert generate(model, [[4]], 6, compile="eager") == generate(model, [[4]], 6)
    assert graphs() == 1, dict(counters["stats"])


def test_compiled_generation_with_a_lora_head():
    from minitransformer.lora import add_lora
    model = small_gpt(tie_weights=False)
    add_lora(model, ["head"], r=2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora" in name:
                p.normal_(0, 0.5)
    prompts = [[1, 2, 3]]
    assert generate(model, prompts, 8, compile="eager") == generate(model, prompts, 8)


@pytest.mark.reduced_precision
def test_static_cache_under_autocast():
    "Autocast computes keys in bfloat16; the float32 static buffers take them cast."
    model = small_gpt()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        cache = model.make_cache(1, 8, static=True)
        model(ids, cache=cache)
        assert len(cache) == 4
        out = generate(model, [[1, 2, 3]], 4, compile="eager")
    assert len(out[0]) == 4


def test_compiled_encoder_decoder_generation():
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(src_vocab_size=30, tgt_vocab_size=30, max_len=32,
                                      d_model=32, n_heads=4)).eval()
    src, prompts = [[3, 4, 5, 6], [7, 8]], [[1], [1, 2]]
    eager = generate(m, prompts, 10, source=src)
    torch._dynamo.reset()
    counters.clear()
    assert generate(m, prompts, 10, source=src, compile="eager") == eager
    assert not counters["graph_break"], dict(counters["graph_break"])
    # one graph of the step (the cross-attention caches are inputs); other target lengths
    # reuse it
    assert generate(m, prompts, 4, source=src, compile="eager") == generate(
        m, prompts, 4, source=src)
    assert graphs() == 1, dict(counters["stats"])


def test_read_bandwidth_is_a_positive_rate():
    assert read_bandwidth(2**20, 3) > 0
    with pytest.raises(ValueError, match="n_bytes"):
        read_bandwidth(2)
    with pytest.raises(ValueError, match="repeats"):
        read_bandwidth(2**20, 1.5)


def test_compile_arguments_are_checked():
    model = small_gpt()
    with pytest.raises(ValueError, match="compile"):
        generate(model, [[1, 2]], 3, compile="no-such-backend")
    with pytest.raises(ValueError, match="use_cache"):
        generate(model, [[1, 2]], 3, compile=True, use_cache=False)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", range(len(GPT_KINDS)))
def test_gpt_greedy_tokens_same_with_without_cache_batched_or_alone(kind):
    model = device_gpt(10 + kind, **GPT_KINDS[kind])
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15], [16, 17, 18, 19, 20, 21, 22, 23, 24, 25]]
    cached = generate(model, prompts, 30)
    assert cached == generate(model, prompts, 30, use_cache=False)
    assert cached == [generate(model, [p], 30)[0] for p in prompts]


@pytest.mark.gpu
def test_encoder_decoder_tokens_same_with_without_cache_batched_or_alone():
    model = device_seq2seq(3, True)
    sources = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
    prompts = [[2], [2, 7], [2]]
    cached = generate(model, prompts, 25, source=sources)
    assert cached == generate(model, prompts, 25, source=sources, use_cache=False)
    assert cached == [generate(model, [p], 25, source=[s])[0] for p, s in zip(prompts, sources)]


def test_a_set_of_stop_ids_and_a_callback_that_streams_the_new_tokens():
    "A row stops at the first of its stop ids; the callback sees each step's new ids, in order."
    model = small_gpt()
    prompts = [[5, 6], [7, 8, 9]]
    greedy = generate(model, prompts, 12)
    first = greedy[0][4]  # row 0 stops before its 5th token; row 1 at the first of the set
    stops = {first, greedy[1][2]}
    seen = []
    got = generate(model, prompts, 12, stop_token=stops, callback=seen.append)
    cut = [next((i for i, t in enumerate(row) if t in stops), len(row)) for row in greedy]
    assert got == [row[:c] for row, c in zip(greedy, cut)]
    assert [[s[b] for s in seen if s[b] is not None] for b in range(2)] == got  # in order
    assert all(len(s) == 2 and any(t is not None for t in s) for s in seen)
    streamed = []
    alone = generate(model, [[5, 6]], 6, callback=lambda new: streamed.append(new[0]))
    assert streamed == alone[0] == greedy[0][:6]  # without stop ids, every token
    with pytest.raises(TypeError, match="callback must be callable"):
        generate(model, [[5, 6]], 3, callback="print")
    with pytest.raises(ValueError, match="stop_token must be an int"):
        generate(model, [[5, 6]], 3, stop_token={1, "2"})


@pytest.mark.gpu
def test_sampling_is_reproducible_and_stops():
    model = device_gpt(1)
    a = generate(model, [[5, 6], [7]], 20, temperature=1.0, top_k=10, generator=torch.Generator(DEVICE).manual_seed(3))
    b = generate(model, [[5, 6], [7]], 20, temperature=1.0, top_k=10, generator=torch.Generator(DEVICE).manual_seed(3))
    assert a == b
    greedy = generate(model, [[5, 6]], 20)[0]
    stopped = generate(model, [[5, 6]], 20, stop_token=greedy[3])[0]
    assert stopped == greedy[: greedy.index(greedy[3])]


@pytest.mark.parametrize("encoding", ["rotary", "learned"])
def test_a_grouped_gpt_decodes_the_same_with_and_without_its_smaller_cache(encoding):
    torch.manual_seed(1)
    cfg = GPTConfig(vocab_size=30, max_len=40, d_model=48, n_heads=6, n_kv_heads=2,
                    n_layers=2, position_encoding=encoding, activation="swiglu",
                    norm="rmsnorm", bias=False)
    model = GPT(cfg).eval()
    cache = model.make_cache(2)
    assert cache.self_attn[0].k.shape == (2, 2, 40, 8)  # only the 2 K/V heads
    assert cache.nbytes == 2 * 2 * 2 * 2 * 40 * 8 * 4
    prompts = [[3, 4, 5, 6], [7, 8]]
    cached = generate(model, prompts, 12)
    assert cached == generate(model, prompts, 12, use_cache=False)
    alone = [generate(model, [p], 12)[0] for p in prompts]
    assert cached == alone


@pytest.mark.timeout(60)
def test_sampling_refuses_a_nan_temperature():
    with pytest.raises(ValueError, match="temperature"):
        sample_next(torch.randn(2, 5), temperature=float("nan"))


@pytest.mark.timeout(60)
def test_read_bandwidth_refuses_more_than_memory_before_allocating():
    from minitransformer.generation import read_bandwidth
    with pytest.raises(ValueError, match="n_bytes"):
        read_bandwidth(n_bytes=10**13)


def _per_token(model, prompts):
    "Calls into the package (by name) and host reads per decoded token, eager."
    generate(model, prompts, 2)  # warm-up
    c4, r4 = counted(lambda: generate(model, prompts, 4), by_name=True)
    c12, r12 = counted(lambda: generate(model, prompts, 12), by_name=True)
    return c12 - c4, (r12 - r4) / 8  # (8 tokens' calls)


@pytest.mark.parametrize("prompts", [[[1, 2, 3, 4, 5]], [[1, 2, 3, 4, 5], [6, 7]]],
                         ids=["batch 1", "batch 2, padded"])
def test_a_decoded_token_costs_few_python_calls_and_no_host_read(prompts):
    """Per layer ≤ 12 calls into the package; no host read; at model level ≤ 10 check
    calls (batch 1: with padding, the padding mask's own checks come on top)."""
    six, reads = _per_token(smollm2_shaped_gpt(6), prompts)
    two, _ = _per_token(smollm2_shaped_gpt(2), prompts)
    per_layer = (six.total() - two.total()) / 8 / 4
    checks = sum(n for (file, name), n in six.items()
                 if "check" in name or file == "checks.py") / 8
    print(f"per decoded token: {six.total() / 8:.0f} Python calls into the package "
          f"({per_layer:.0f} per layer, {checks:.0f} checks), {reads:.0f} host read(s)")
    assert reads == 0, f"{reads} host reads per decoded token"  # (the tokens: at the end)
    assert per_layer <= 12, f"{per_layer} Python calls into the package per layer"
    assert checks <= (10 if len(prompts) == 1 else 17), f"{checks} check calls per token"


def test_with_a_stop_token_a_decoded_token_costs_one_read():
    model = smollm2_shaped_gpt()
    prompts = [[1, 2, 3, 4, 5]]
    r4 = counted(lambda: generate(model, prompts, 4, stop_token=300))[1]
    r12 = counted(lambda: generate(model, prompts, 12, stop_token=300))[1]
    assert (r12 - r4) / 8 == 1  # the token: whether its row stopped


def test_non_finite_logits_are_refused():
    with pytest.raises(ValueError, match="finite largest score"):
        sample_next(torch.tensor([[0.0, float("nan")]]), temperature=0)
    with pytest.raises(ValueError, match="finite largest score"):
        sample_next(torch.full((1, 3), float("-inf")), temperature=0.7)
    model = smollm2_shaped_gpt(1)
    with torch.no_grad():
        model.head.weight.fill_(float("nan"))
    for stop_token in (None, 7):  # read at the end, or at every step
        with pytest.raises(ValueError, match="finite largest score"):
            generate(model, [[1, 2]], 3, stop_token=stop_token)


def test_compiled_generation_up_to_the_models_length():
    "Prompt + new tokens - 1 = max_len (the last token is never fed back): the cache holds max_len."
    model = small_gpt(**RECIPE)  # max_len 48
    prompts = [[1, 2, 3], [4, 5]]
    assert generate(model, prompts, 46, compile="eager") == generate(model, prompts, 46)


# The decoding state held once, as gpt-fast and torchtune hold it: the caches set up once and
# reused through a GenerationCache (the same memory, call after call, and no new graph), the
# newest ids, their positions and the write slot advanced on the device, and nothing read back
# per token but the token itself; what is refused on the way, and what the compile limit does.

BUILT = {torch.tensor, torch.as_tensor}  # a tensor made from Python values


class Counting(TorchFunctionMode):
    "Counts host reads (a device sync on CUDA) and tensors built from Python values."

    def __init__(self):
        super().__init__()
        self.reads = self.built = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.reads += func in READS
        self.built += func in BUILT
        return func(*args, **(kwargs or {}))


def counts(fn) -> tuple[int, int]:
    with Counting() as c:
        fn()
    return c.reads, c.built


def pointers(held: GenerationCache) -> list[int]:
    "Where every buffer a step reads or writes lives: what a CUDA graph holds on to."
    kv = [t.data_ptr() for c in held.kv.self_attn for t in (c.k, c.v)]
    return kv + [t.data_ptr() for t in (held.ids, held.positions, held.slot)]


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
@pytest.mark.parametrize("compile", [False, "eager"], ids=["eager", "compiled"])
def test_nothing_is_read_back_per_token_but_the_token(compile, temperature):
    model, held = smollm2_shaped_gpt(2), GenerationCache()
    prompts = [[1, 2, 3, 4, 5], [6, 7]]  # padded: the masks' path too

    def run(n, **kw):
        g = torch.Generator().manual_seed(0)
        return generate(model, prompts, n, temperature=temperature, compile=compile,
                        cache=held, generator=g, **kw)

    run(4)  # (the compiled step's graph, made outside the counting)
    (r4, b4), (r12, b12) = counts(lambda: run(4)), counts(lambda: run(12))
    assert (r4, r12) == (1, 1), "one read a call: the tokens, at the end"
    assert b12 == b4, f"{b12 - b4} tensors built from Python in 8 more steps"
    s4, s12 = counts(lambda: run(4, stop_token=300))[0], counts(
        lambda: run(12, stop_token=300))[0]  # (an id the vocabulary of 256 never gives)
    assert s12 - s4 == 8, "with a stop id: one read a token, the token"


def test_three_compiled_calls_share_one_cache_its_memory_and_its_graph():
    model, held = smollm2_shaped_gpt(2), GenerationCache()
    first = generate(model, [[1, 2, 3]], 8, compile="eager", cache=held)
    where, graphs = pointers(held), counters["stats"]["unique_graphs"]
    second = generate(model, [[4, 5, 6, 7]], 8, compile="eager", cache=held)
    third = generate(model, [[1, 2, 3]], 20, compile="eager", cache=held)  # 64 slots too
    assert pointers(held) == where, "the caches and the step's inputs were made anew"
    assert counters["stats"]["unique_graphs"] == graphs, "a later call compiled a graph"
    assert third[0][:8] == first[0]  # nothing of the last call's state is left over
    assert second == generate(model, [[4, 5, 6, 7]], 8)  # as a fresh eager call


def test_a_call_that_does_not_fit_makes_the_cache_anew():
    model, held = smollm2_shaped_gpt(2), GenerationCache()
    generate(model, [[1, 2, 3]], 8, cache=held)
    where = pointers(held)
    two = generate(model, [[1, 2, 3], [4, 5]], 8, cache=held)  # another batch size
    assert pointers(held) != where and held.kv.self_attn[0].k.shape[0] == 2
    assert two == generate(model, [[1, 2, 3], [4, 5]], 8)
    model.double()  # another dtype: made again, not refused
    assert generate(model, [[1, 2, 3]], 8, cache=held) == generate(model, [[1, 2, 3]], 8)
    assert held.kv.self_attn[0].k.dtype == torch.float64
    held.free()
    assert held.kv is None and "None" in repr(held)


def test_one_decoding_per_cache_at_a_time():
    model, held = smollm2_shaped_gpt(1), GenerationCache()

    def again(new):  # a second decoding on the same cache while the first runs
        generate(model, [[1]], 2, cache=held)

    with pytest.raises(RuntimeError, match="one decoding per cache"):
        generate(model, [[1, 2]], 3, cache=held, callback=again)
    assert generate(model, [[1, 2]], 3, cache=held)  # (released after the error)
    for twin in (copy.deepcopy(held), pickle.loads(pickle.dumps(held))):
        assert isinstance(twin, GenerationCache) and twin.kv is None  # fresh, empty


def test_generate_refuses_a_cache_it_cannot_use():
    model = smollm2_shaped_gpt(1)
    with pytest.raises(TypeError, match="GenerationCache"):
        generate(model, [[1, 2]], 3, cache=model.make_cache(1))
    with pytest.raises(ValueError, match="use_cache=False"):
        generate(model, [[1, 2]], 3, cache=GenerationCache(), use_cache=False)


def test_a_static_cache_longer_than_max_len_is_refused():
    model = small_gpt(max_len=16)
    cache = DecoderCache.for_decoder(model.decoder, 1, 32, static=True)  # 32 > 16
    with pytest.raises(ValueError, match="longer than the model's max_len 16"):
        model(torch.tensor([[1]]), cache=cache, cache_position=torch.tensor([20]))


def test_past_the_compile_limit_the_step_runs_eagerly_with_one_warning(monkeypatch):
    model = smollm2_shaped_gpt(1)
    monkeypatch.setattr(generation, "_RECOMPILE_LIMIT", 1)
    generation._compiled_step.cache_clear()
    torch._dynamo.reset()  # (the graphs of earlier tests count towards the limit)
    try:
        generate(model, [[1, 2]], 4, compile="eager")  # the one graph
        with pytest.warns(UserWarning, match="run eagerly"):
            two = generate(model, [[1, 2], [3, 4]], 4, compile="eager")  # a second
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once
            generate(model, [[1, 2], [3, 4]], 4, compile="eager")
        assert two == generate(model, [[1, 2], [3, 4]], 4)
    finally:
        generation._compiled_step.cache_clear()
        torch._dynamo.reset()


@pytest.mark.parametrize("compile", ["eager", True], ids=["traced", "inductor"])
def test_compiled_sampling_draws_the_eager_tokens_for_a_seed(compile):
    """Temperature, top-k and top-p run inside the compiled step, on noise drawn from the
    user's generator before it: the tokens eager sampling draws from the same seed."""
    model = small_gpt(**RECIPE)
    prompts = [[1, 2, 3], [4, 5]]

    def run(how, seed=5):
        return generate(model, prompts, 16, temperature=0.9, top_k=20, top_p=0.9,
                        compile=how, generator=torch.Generator().manual_seed(seed))

    eager = run(False)
    assert run(compile) == eager and run(compile, seed=6) == run(False, seed=6)
    assert eager != run(False, seed=6)  # (the seed matters: not a greedy run)


def _op_names(graph) -> set:
    "The names of the calls in a traced graph (functions, methods, operators)."
    return {n.target if isinstance(n.target, str) else
            getattr(n.target, "__name__", str(n.target)).strip("_").split(".")[-1]
            for n in graph.nodes if n.op in ("call_function", "call_method")}


def test_the_sampled_step_holds_the_filters_and_the_race_and_draws_nothing():
    """The compiled step's graph divides by the temperature, filters (top-k, top-p),
    turns scores into probabilities and runs the race on the noise it is given: no
    random draw inside, and no multinomial (a host synchronisation on CUDA)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    model, backend = small_gpt(**RECIPE), CompileCounterWithBackend("eager")
    cache = model.make_cache(1, 8, static=True)
    torch._dynamo.reset()  # (generate may have compiled the step with another backend)
    step = torch.compile(generation._choosing_step, backend=backend, dynamic=False,
                         fullgraph=True)
    kw = dict(positions=torch.tensor([[2]]), cache=cache, cache_position=torch.tensor([2]),
              attention_mask=torch.ones(1, 8, dtype=torch.bool))
    noise = torch.empty(1, 40).exponential_(generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        step(model, torch.tensor([[3]]), None, None, kw,
             generation._choice(0.8, 5, 0.9, noise, noise.device))
    names = _op_names(backend.graphs[0].graph)
    assert {"topk", "sort", "cumsum", "softmax", "truediv", "argmax"} <= names, names
    drawn = {"multinomial", "exponential_", "exponential", "rand", "rand_like", "randn",
             "randint", "uniform_", "bernoulli", "normal_"}
    assert not names & drawn, names & drawn


def test_another_temperature_or_top_p_compiles_no_new_graph():
    "The temperature and top-p enter the compiled step as tensors: one graph serves all."
    model = small_gpt(**RECIPE)
    run = lambda t, p: generate(model, [[1, 2, 3]], 6, temperature=t, top_p=p,
                                compile="eager", generator=torch.Generator().manual_seed(0))
    run(0.7, 0.9)
    graphs = counters["stats"]["unique_graphs"]
    run(1.3, 0.5)
    run(0.2, 0.95)
    assert counters["stats"]["unique_graphs"] == graphs, dict(counters["stats"])
