# DRAFT (to be exported from nbs/18_quantised.ipynb)
from __future__ import annotations

import math

import numpy as np

import torch
import torch.nn.functional as F
from torch import nn

from .checks import check_choice, check_module
from .checks import is_integer_tensor
from .embeddings import TokenEmbedding, check_token_ids
from .lora import LoRALinear

__all__ = ['KINDS', 'BLOCK', 'GGUF_KINDS', 'QuantisedLinear', 'QuantisedEmbedding', 'pack',
           'quantise', 'weight_bytes']

# %%
BLOCK = 32  # weights per block in the GGUF formats
# kind -> (bits of a code, has a minimum)
KINDS = {"int8": (8, False), "q8_0": (8, False), "q4_0": (4, False), "q4_1": (4, True)}
GGUF_KINDS = {8: "q8_0", 2: "q4_0", 3: "q4_1"}  # llama.cpp's type ids


def _unpack(words: torch.Tensor, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """The codes in int32 `words` (..., W, O) as `dtype` (..., 32 // bits, W, O): code
    k of a word sits in bits k·bits onwards; 8-bit codes are signed, 4-bit ones 0..15."""
    k = torch.arange(32 // bits, device=words.device, dtype=torch.int32)[:, None, None]
    w = words[..., None, :, :]  # (..., 1, W, O)
    if bits == 4:
        return ((w >> 4 * k) & 15).to(dtype)
    return ((w << 24 - 8 * k) >> 24).to(dtype)  # shift left, then back with the sign


def _in_order(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Blocks of `x` (..., nb, 32) as (..., nb, 32 // bits, W), matching `_unpack`:
    byte u of word t holds weight 4t + u (8-bit), or weights 4t + u and 16 + 4t + u in
    its low and high nibble (4-bit: llama.cpp's order), its codes 2u and 2u + 1."""
    if bits == 8:
        return x.unflatten(-1, (-1, 4)).transpose(-1, -2)  # (..., nb, byte, word)
    halves = x.unflatten(-1, (2, 4, 4))  # (..., nb, nibble, word, byte)
    return halves.permute(*range(halves.dim() - 3), -1, -3, -2).flatten(-3, -2)


class QuantisedLinear(nn.Module):
    """A linear layer `y = x Wᵀ (+ b)` whose weight `(O, C)` is kept as blocks of integer
    codes, each block with a float scale d (and for q4_1 a minimum m): weight = d·q + m.
    Kinds: "int8" (one block per row, 8-bit), "q8_0" (blocks of 32, 8-bit), "q4_0" and
    "q4_1" (blocks of 32, 4-bit, q4_0's codes standing for -8..7). The codes are packed
    into int32 words laid out `(nb, W, O)`: one word of every output row side by side,
    so that the product reads whole vectors of words and converts them in registers."""

    def __init__(self, kind: str, words: torch.Tensor, scales: torch.Tensor,
                 mins: torch.Tensor | None = None, bias: torch.Tensor | None = None):
        super().__init__()
        _check_blocks(kind, words, scales, mins, bias)
        self.kind, self.bits = kind, KINDS[kind][0]
        nb, W, O = words.shape  # blocks per row, words per block, output rows
        self.block = W * 32 // self.bits  # weights per block
        self.in_features, self.out_features = nb * self.block, O
        self.register_buffer("words", words)  # (nb, W, O) int32: the codes
        self.register_buffer("scales", scales)  # (nb, O) float: d
        self.register_buffer("mins", mins)  # (nb, O) float: m (q4_1), else None
        self.register_buffer("bias", bias)  # (O,) or None

    @property
    def dtype(self) -> torch.dtype:
        "The float dtype the layer computes in: its scales'."
        return self.scales.dtype

    def _offsets(self) -> torch.Tensor | None:
        "m of every block: q4_1's minimums; q4_0's -8·d (code c stands for c - 8)."
        return -8 * self.scales if self.kind == "q4_0" else self.mins

    def dequantise(self, columns: torch.Tensor | None = None) -> torch.Tensor:
        """The float weight `(O, C)` the blocks stand for, d·q + m in the scales' dtype;
        or only the rows `columns` of it (an embedding lookup)."""
        words, d, m = self.words, self.scales, self._offsets()
        if columns is not None:  # pick the output rows first: (nb, W, n)
            words, d = words[..., columns], d[:, columns]
            m = None if m is None else m[:, columns]
        q = _unpack(words, self.bits, self.dtype)  # (nb, codes a word, W, n)
        w = q * d[:, None, None]
        if m is not None:
            w = w + m[:, None, None]
        if self.bits == 8:  # (nb, byte, word) -> weight 4·word + byte
            w = w.transpose(1, 2)
        else:  # (nb, byte, nibble, word) -> weight 16·nibble + 4·word + byte
            w = w.unflatten(1, (4, 2)).permute(0, 2, 3, 1, 4)
        return w.flatten(0, -2).T  # (n, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features or not x.dtype.is_floating_point:
            _check_input(self, x)
        rows = x.numel() // self.in_features
        if rows > 8:  # a long prompt: the weight once as floats, then one matmul
            return F.linear(x, self.dequantise().to(x.dtype), self.bias)
        xb = x.reshape(rows, -1, self.block)  # (N, nb, 32)
        X = _in_order(xb, self.bits)  # (N, nb, codes a word, W)
        q = _unpack(self.words, self.bits, x.dtype)  # (nb, codes a word, W, O)
        dots = sum((X[..., k, :, None] * q[:, k]).sum(2)  # (N, nb, O): Σ x·q in
                   for k in range(q.shape[1]))  # each block, a sum per code of a word
        y = dots * self.scales.to(x.dtype)
        m = self._offsets()
        if m is not None:  # Σ_j (d q_j + m) x_j = d Σ q_j x_j + m Σ x_j
            y = y + m.to(x.dtype) * xb.sum(-1)[..., None]
        y = y.sum(1)  # (N, O)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    @classmethod
    def from_float(cls, weight: torch.Tensor, kind: str = "int8",
                   bias: torch.Tensor | None = None) -> QuantisedLinear:
        "Round a float weight `(O, C)` to `kind`'s blocks (llama.cpp's reference rounding)."
        return cls(kind, *_quantise_weight(weight, kind), bias=bias)

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, kind={self.kind!r}, "
                f"bias={self.bias is not None}")


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes `(O, nb, bytes)` as llama.cpp stores them (uint8 pairs of nibbles, or int8)
    → the int32 words `(nb, W, O)` of `QuantisedLinear`: the same bits, regrouped."""
    words = codes.contiguous().view(torch.int32)  # (O, nb, W): 4 bytes a word
    return words.permute(1, 2, 0).contiguous()


def _check_blocks(kind, words, scales, mins, bias) -> None:
    check_choice(kind, "kind", tuple(KINDS))
    bits, has_min = KINDS[kind]
    if not (isinstance(words, torch.Tensor) and words.dim() == 3
            and words.dtype == torch.int32):
        raise TypeError(f"words must be a (blocks, words, out) int32 tensor, got "
                        f"{getattr(words, 'dtype', type(words).__name__)} of shape "
                        f"{tuple(getattr(words, 'shape', ()))}")
    nb, W, O = words.shape
    if kind != "int8" and W * 32 // bits != BLOCK:
        raise ValueError(f"{kind} blocks hold {BLOCK} weights; words have {W} a block")
    if kind == "int8" and nb != 1:
        raise ValueError(f"int8 keeps one block per row; words have {nb}")
    for name, t in (("scales", scales), ("mins", mins)):
        if t is None and (name == "scales" or has_min):
            raise ValueError(f"kind {kind!r} needs {name}")
        if t is not None and (not isinstance(t, torch.Tensor) or not t.is_floating_point()
                              or tuple(t.shape) != (nb, O)):
            raise ValueError(f"{name} must be a float tensor of shape {(nb, O)}, got "
                             f"{t!r:.80}")
    if mins is not None and not has_min:
        raise ValueError(f"kind {kind!r} has no minimums")
    if mins is not None and mins.dtype != scales.dtype:
        raise TypeError(f"mins ({mins.dtype}) and scales ({scales.dtype}) must share "
                        f"a dtype")
    if bias is not None and (not isinstance(bias, torch.Tensor)
                             or tuple(bias.shape) != (O,)):
        raise ValueError(f"bias must be a tensor of shape ({O},)")


def _check_input(layer: QuantisedLinear, x) -> None:
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise TypeError(f"x must be a float tensor, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() == 0 or x.shape[-1] != layer.in_features:
        raise ValueError(f"x must end in {layer.in_features} features, got shape "
                         f"{tuple(x.shape)}")


def _round_half_away(v: torch.Tensor) -> torch.Tensor:
    "C's roundf (llama.cpp's rounding): halves away from zero, as `gguf` computes it."
    a = v.abs()
    whole = a.floor()
    return torch.sign(v) * (whole + (2 * (a - whole)).floor())


def _quantise_weight(weight: torch.Tensor, kind: str) -> tuple:
    "(words, scales, mins) of `weight` rounded to `kind` as llama.cpp's reference does."
    check_choice(kind, "kind", tuple(KINDS))
    if not (isinstance(weight, torch.Tensor) and weight.dim() == 2
            and weight.is_floating_point()):
        raise TypeError(f"weight must be a 2-d float tensor, got {weight!r:.80}")
    O, C = weight.shape
    size = C if kind == "int8" else BLOCK
    if C % size or C % 4:
        raise ValueError(f"{kind} needs rows of a multiple of {size} weights (and of 4); "
                         f"this weight has {C}")
    w = weight.detach().float().reshape(O, -1, size)  # (O, nb, size)
    mins = None
    if kind == "q4_1":  # codes 0..15 from the block's minimum to its maximum
        low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
        d = (high - low) / 15
        q = torch.trunc((w - low) * torch.where(d == 0, 0, 1 / d) + 0.5).clamp(0, 15)
        mins = low[..., 0].half().float()  # float16 in the file
    elif kind == "q4_0":  # the value of largest magnitude maps to code 0 (-8)
        d = w.gather(-1, w.abs().argmax(-1, keepdim=True)) / -8
        q = torch.trunc(w * torch.where(d == 0, 0, 1 / d) + 8.5).clamp(0, 15)
    else:  # the value of largest magnitude maps to ±127
        d = w.abs().amax(-1, keepdim=True) / 127
        q = _round_half_away(w * torch.where(d == 0, 0, 1 / d))
    d = d[..., 0] if kind == "int8" else d[..., 0].half().float()  # file: float16
    if KINDS[kind][0] == 4:  # two codes a byte: weight j low, weight 16 + j high
        q = q.to(torch.uint8)
        codes = q[..., :16] | (q[..., 16:] << 4)
    else:
        codes = q.to(torch.int8)
    to = lambda t: None if t is None else t.T.to(weight.dtype).contiguous()
    return pack(codes, KINDS[kind][0]), to(d), to(mins)


class QuantisedEmbedding(nn.Module):
    """Token ids `(..., T)` → vectors `(..., T, C)`: rows of a `QuantisedLinear`'s
    weight, dequantised as they are looked up (the same table can be the tied head)."""

    def __init__(self, table: QuantisedLinear, padding_idx: int | None = None,
                 scale: bool = False):
        super().__init__()
        if not isinstance(table, QuantisedLinear):
            raise TypeError(f"table must be a QuantisedLinear, got {type(table).__name__}")
        self.table, self.padding_idx, self.scale = table, padding_idx, scale
        self.vocab_size, self.d_model = table.out_features, table.in_features

    def forward(self, ids: torch.Tensor, name: str = "token ids") -> torch.Tensor:
        if not (isinstance(ids, torch.Tensor) and is_integer_tensor(ids)):
            check_token_ids(ids, self.vocab_size, name)  # raises: not integer ids
        try:
            x = self.table.dequantise(ids.flatten())  # (n, C)
        except IndexError:  # an id outside the table: say which (values read now)
            check_token_ids(ids, self.vocab_size, name)
            raise
        x = x.reshape(*ids.shape, self.d_model)  # (..., T, C)
        return x * math.sqrt(self.d_model) if self.scale else x


def _tied_embeddings(model: nn.Module) -> dict[int, str]:
    "{id of a weight: the name of the TokenEmbedding that holds it}."
    return {id(m.weight): n for n, m in model.named_modules()
            if isinstance(m, TokenEmbedding)}


def quantise(model: nn.Module, kind: str = "int8", skip=()) -> nn.Module:
    """Replace every `nn.Linear` of `model` (but those whose names end in one of `skip`)
    by a `QuantisedLinear` of `kind`, in place; a head tied to the token embedding
    becomes one quantised table that both use. LoRA layers must be merged first."""
    check_module(model)
    check_choice(kind, "kind", tuple(KINDS))
    unmerged = [n for n, m in model.named_modules()
                if isinstance(m, LoRALinear) and not m.merged]
    if unmerged:
        raise ValueError(f"{len(unmerged)} LoRA layers are not merged (e.g. "
                         f"{unmerged[0]}): merge_lora(model) first, then quantise")
    targets = [(n, m) for n, m in model.named_modules()
               if isinstance(m, (nn.Linear, LoRALinear))
               and not n.rsplit(".", 1)[-1] in skip]
    if kind != "int8":
        odd = [n for n, m in targets if m.in_features % BLOCK]
        if odd:
            raise ValueError(f"{kind} needs inputs of a multiple of {BLOCK}: {odd[0]} "
                             f"has {model.get_submodule(odd[0]).in_features}")
    embeddings = _tied_embeddings(model)
    with torch.no_grad():
        for name, m in targets:
            layer = QuantisedLinear.from_float(m.weight, kind, m.bias)
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent), leaf, layer)
            if id(m.weight) in embeddings:  # tied: the embedding reads the same blocks
                emb_name = embeddings[id(m.weight)]
                emb = model.get_submodule(emb_name)
                owner, _, leaf = emb_name.rpartition(".")
                setattr(model.get_submodule(owner), leaf,
                        QuantisedEmbedding(layer, emb.padding_idx, emb.scale))
    return model


def weight_bytes(model: nn.Module) -> int:
    "Bytes of `model`'s parameters and buffers, each storage counted once."
    check_module(model)
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = (t.untyped_storage().data_ptr(), t.device)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


# %% loading a GGUF file's blocks
_BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20}  # d (f16) [, m (f16)], codes


def _half(b: torch.Tensor, start: int) -> torch.Tensor:
    "The float16 stored in bytes `start`, `start+1` of every block, as float32."
    return b[..., start:start + 2].contiguous().view(torch.float16)[..., 0].float()


def layer_from_gguf(t, rows=None,  # a gguf tensor record of a block kind
                    dtype: torch.dtype = torch.float32) -> QuantisedLinear:
    """A GGUF matrix kept in its blocks: codes copied from the file's bytes as they are,
    scales and minimums from float16 to `dtype` (exact for float32). `rows`, if given,
    reorders the matrix's rows — whole rows of blocks, so exactly."""
    kind = GGUF_KINDS[int(t.tensor_type)]
    raw = torch.from_numpy(np.array(t.data, dtype=np.uint8))  # (out, bytes per row)
    if rows is not None:
        raw = rows(raw)
    b = raw.reshape(len(raw), -1, _BLOCK_BYTES[kind])  # (out, nb, bytes per block)
    scales = _half(b, 0).T.to(dtype).contiguous()  # (nb, O)
    mins = _half(b, 2).T.to(dtype).contiguous() if kind == "q4_1" else None
    codes = b[..., 4 if kind == "q4_1" else 2:]  # (O, nb, 16 or 32) bytes
    return QuantisedLinear(kind, pack(codes, KINDS[kind][0]), scales, mins)


def gguf_blocks_model(config, rules: dict, tensors: dict, dequantise,
                      dtype: torch.dtype = torch.float32) -> nn.Module:
    """Our `GPT` from a GGUF file's tensors (`rules` already checked): every matrix the
    file stores in a block kind we compute with becomes a `QuantisedLinear` of those
    blocks (a tied embedding and head: one table both use); the rest (norms, other
    kinds) is read as floats by `dequantise`. No float copy of a blocked matrix."""
    from .model import GPT
    with torch.device("meta"):
        model = GPT(config)
    layers, state = {}, {}
    for name, (src, how) in rules.items():
        owner_name, _, leaf = name.rpartition(".")
        owner, t = model.get_submodule(owner_name), tensors[src]
        if (leaf == "weight" and int(t.tensor_type) in GGUF_KINDS
                and isinstance(owner, (nn.Linear, TokenEmbedding))):
            if src not in layers:
                layers[src] = layer_from_gguf(t, how, dtype)
            layer = layers[src]
            parent, _, child = owner_name.rpartition(".")
            new = (QuantisedEmbedding(layer, owner.padding_idx, owner.scale)
                   if isinstance(owner, TokenEmbedding) else layer)
            setattr(model.get_submodule(parent), child, new)
        else:
            value = dequantise(t)
            state[name] = (how(value) if how is not None else value).to(dtype)
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_weights and isinstance(model.head, nn.Linear):  # a float table
        model.head.weight = model.embed.tok.weight
    left = [k for k, v in model.state_dict().items() if v.is_meta]
    assert not left, f"tensors left unread: {left[:5]}"
    return model
