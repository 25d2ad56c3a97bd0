"""``CausalLM``: a compiled decoder's generation loop over its in-place KV cache.

The library holds two step functions over one copy of the weights: ``main`` (any number
of new tokens: prefill) and ``decode`` (exactly one: matrix-vector kernels), each

    (ids: int64[1, new], mask: int64[1, total], cache_0, ..., cache_{2L-1})
        -> (logits: float32[1, 1, vocab], cache_0, ..., cache_{2L-1})

``total`` = the tokens already cached + ``prompt``; ``mask`` is all ones and carries
``total`` as its shape. Each cache is ``[1, kv heads, max_length + 1, head dim]``
(key, value, key, value, ... per layer), allocated once per sequence and donated to
every call: the function writes the new rows into it in place (``cache_write`` Emits,
``relax_passes.cache_in_place``) and returns the same buffers. Only the last position's
logits are computed (a prompt's other positions never reach the LM head). One sequence
per call is the fast path (decode is a matrix-vector product per weight); the rows of
a batch run one after another, each over its own cache.

Runs with TVM's runtime alone (``aicf_tvm.load`` of an exported library gives a
``CausalLM`` back in a process without TVM's compiler).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import tvm

from aicf_tvm.core.errors import DeployError, InputError

from .compiled import CompiledModel
from .compiled import load as load_model

# metadata key of an exported CausalLM (deploy.metadata_of writes CompiledModel.extra_metadata)
LLM_KEY = "llm"
# the function of one new token per call (``main`` takes any number)
DECODE = "decode"


@dataclass(frozen=True)
class LMConfig:
    """What the generation loop needs to know of the compiled decoder."""

    model_type: str  # transformers' name of the family ("llama", "gpt2", ...)
    max_length: int  # prompt + generated tokens, at most
    vocab_size: int
    cache_shapes: tuple[tuple[int, int], ...]  # (kv heads, head dim) of each cache tensor, in order
    eos_token_ids: tuple[int, ...] = ()
    dtype: str = "float32"
    weights: str = "float32"  # how the linear layers' weights are stored: "float32", "int8" or "int4"
    activations: str = "float32"  # "int8": the int4 layers' inputs rounded to int8 per group

    def to_json(self) -> dict:
        return {"model_type": self.model_type, "max_length": self.max_length,
                "vocab_size": self.vocab_size, "cache_shapes": [list(s) for s in self.cache_shapes],
                "eos_token_ids": list(self.eos_token_ids), "dtype": self.dtype, "weights": self.weights,
                "activations": self.activations}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LMConfig:
        return cls(str(data["model_type"]), int(data["max_length"]),
                   int(data["vocab_size"]), tuple((int(h), int(d)) for h, d in data["cache_shapes"]),
                   tuple(int(t) for t in data.get("eos_token_ids", ())), str(data.get("dtype", "float32")),
                   str(data.get("weights", "float32")), str(data.get("activations", "float32")))

    @property
    def cache_rows(self) -> int:
        """Rows each cache holds: one more than ``max_length`` (a slice ending at the last
        row would make ``torch.export`` specialize the total length to it)."""
        return self.max_length + 1


@dataclass
class Sampling:
    """How ``generate`` picks each token: greedy at ``temperature`` 0, else a draw from the
    softmax of ``logits / temperature`` restricted to the ``top_k`` most likely tokens
    (0: all) and to the smallest set whose probability reaches ``top_p``."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        if self.temperature < 0 or not np.isfinite(self.temperature):
            raise InputError(f"temperature={self.temperature}: must be a finite number >= 0")
        if self.top_k < 0:
            raise InputError(f"top_k={self.top_k}: must be >= 0 (0 keeps every token)")
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(f"top_p={self.top_p}: must be in (0, 1]")
        self.rng = np.random.default_rng(self.seed)

    def pick(self, logits: np.ndarray) -> np.ndarray:
        """One token per row of ``logits`` [batch, vocab]."""
        if self.temperature == 0.0:
            return logits.argmax(axis=-1).astype(np.int64)
        out = np.empty(len(logits), np.int64)
        for row, x in enumerate(logits.astype(np.float64) / self.temperature):
            order = np.argsort(-x, kind="stable")
            if self.top_k:
                order = order[: self.top_k]
            p = np.exp(x[order] - x[order[0]])
            p /= p.sum()
            if self.top_p < 1.0:
                keep = int(np.searchsorted(np.cumsum(p), self.top_p)) + 1
                order, p = order[:keep], p[:keep] / p[:keep].sum()
            out[row] = order[self.rng.choice(len(order), p=p)]
        return out


class CausalLM:
    """Prefill, decode and ``generate`` over one compiled decoder (module docstring).

    ``prefill(ids)`` starts new sequences (one per row) and returns the logits of their
    last position; ``decode(tokens)`` appends one token per row and returns the next
    logits. ``generate`` runs both. The cache lives in this object: one batch of
    sequences at a time, not thread-safe (each thread its own ``CausalLM``, which
    ``clone`` gives cheaply: it shares the library).
    """

    def __init__(self, model: CompiledModel, config: LMConfig) -> None:
        self.model = model
        self.config = config
        model.extra_metadata[LLM_KEY] = config.to_json()
        self._caches: list[list[tvm.runtime.Tensor]] = []  # per sequence: its cache tensors
        self._ones: tvm.runtime.Tensor | None = None  # [1, max_length] ones: each step's mask is a view
        self._has_decode: bool | None = None  # whether the library has the decode function (asked once)
        self.length = 0  # tokens cached per sequence
        self.last_timings: dict[str, float] = {}  # of the last generate: prefill_ms, decode_tokens_per_s

    def __repr__(self) -> str:
        c = self.config
        return (f"<CausalLM {c.model_type}: {len(c.cache_shapes) // 2} layers, vocab {c.vocab_size}, "
                f"max_length {c.max_length}{' from ' + self.model.path if self.model.path else ''}>")

    def clone(self) -> CausalLM:
        """Another generation state over the same library (for another thread)."""
        return CausalLM(self.model, self.config)

    # -- the loop a caller may run itself -------------------------------------------------
    def prefill(self, input_ids: npt.ArrayLike) -> np.ndarray:
        """Start one sequence per row of ``input_ids`` [batch, prompt] (or [prompt]); returns
        the logits of each row's last position, float32 [batch, vocab]."""
        ids = self._ids(input_ids, "input_ids")
        batch, prompt = ids.shape
        if prompt == 0:
            raise InputError("input_ids: the prompt is empty")
        self._check_room(prompt, prompt)
        self._new_caches(batch)
        self.length = 0
        return self._step(ids)

    def decode(self, token_ids: npt.ArrayLike) -> np.ndarray:
        """Append one token per sequence (``token_ids`` [batch] or [batch, 1]); returns the
        next logits, float32 [batch, vocab]."""
        if not self._caches:
            raise InputError("decode before prefill: start the sequences with prefill(input_ids)")
        ids = np.asarray(token_ids)
        ids = self._ids(ids.reshape(-1, 1) if ids.ndim <= 1 else ids, "token_ids")
        n = len(self._caches)
        if ids.shape != (n, 1):
            raise InputError(f"token_ids: shape {list(ids.shape)}, but the prefill started {n} sequences: "
                             f"expected [{n}] or [{n}, 1]")
        return self._step(ids)

    def _ids(self, value: npt.ArrayLike, name: str) -> np.ndarray:
        ids = np.asarray(value)
        if ids.ndim == 1:
            ids = ids[None, :]
        if ids.ndim != 2:
            raise InputError(f"{name}: shape {list(ids.shape)}, expected [batch, tokens]")
        if not np.issubdtype(ids.dtype, np.integer):
            raise InputError(f"{name}: dtype {ids.dtype}, expected integer token ids")
        if ids.size and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            bad = int(ids[(ids < 0) | (ids >= self.config.vocab_size)][0])
            raise InputError(f"{name}: token id {bad} is outside the vocabulary [0, {self.config.vocab_size})")
        return np.ascontiguousarray(ids, dtype=np.int64)

    def _check_room(self, new: int, total: int) -> None:
        if total > self.config.max_length:
            raise InputError(f"{total} tokens ({total - new} cached + {new} new) exceed max_length "
                             f"{self.config.max_length}; compile with a larger max_length")

    def _new_caches(self, batch: int) -> None:
        """A cache per sequence; kept from the last prefill when the batch is as large (no
        zeroing: attention reads only rows [0, total), each written before it is read)."""
        dev, rows = self.model.device, self.config.cache_rows
        while len(self._caches) < batch:
            self._caches.append([tvm.runtime.empty((1, h, rows, d), self.config.dtype, dev)
                                 for h, d in self.config.cache_shapes])
        del self._caches[batch:]

    def _step(self, ids: np.ndarray) -> np.ndarray:
        new = ids.shape[1]
        total = self.length + new
        self._check_room(new, total)
        dev, vm = self.model.device, self.model.vm
        if self._ones is None:  # the mask of every step: a view of its first total columns
            self._ones = tvm.runtime.tensor(np.ones((1, self.config.max_length), np.int64), dev)
        mask = self._ones._create_view((1, total))
        if self._has_decode is None:  # a library written before the decode function had main alone
            self._has_decode = bool(vm.module.implements_function(DECODE))
        step = self.model.function(DECODE if new == 1 and self._has_decode else "main")
        logits = []
        for row, cache in enumerate(self._caches):
            out = step(tvm.runtime.tensor(ids[row:row + 1], dev), mask, *cache)
            self._caches[row] = list(out[1:])  # the same buffers: written in place
            logits.append(out[0].numpy().reshape(1, -1))
        self.length = total
        return logits[0] if len(logits) == 1 else np.concatenate(logits)

    # -- generation ----------------------------------------------------------------------------
    def generate(self, input_ids: npt.ArrayLike, max_new_tokens: int = 32, *, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 stop_tokens: Iterable[int] | None = None,
                 progress: bool | Callable[[int, int], None] = False) -> np.ndarray:
        """The prompts followed by up to ``max_new_tokens`` tokens each: int64
        [batch, prompt + new]. Greedy by default; ``temperature`` > 0 samples (``Sampling``)
        from ``seed``. A row that produced a stop token (default: the model's EOS ids)
        is padded with it while others go on; generation ends when every row stopped.
        ``progress=True`` prints tokens/s to stderr; a callable gets (done, total)."""
        if max_new_tokens < 0:
            raise InputError(f"max_new_tokens={max_new_tokens}: must be >= 0")
        sampling = Sampling(temperature, top_k, top_p, seed)
        ids = self._ids(input_ids, "input_ids")
        stops = set(self.config.eos_token_ids if stop_tokens is None else (int(t) for t in stop_tokens))
        self._check_room(max_new_tokens, ids.shape[1] + max_new_tokens)
        out = [ids]
        if max_new_tokens == 0:
            return ids
        start = time.perf_counter()
        logits = self.prefill(ids)
        prefill_s = time.perf_counter() - start
        done = np.zeros(len(ids), bool)
        report = _progress(progress, max_new_tokens)
        tick = time.perf_counter()
        for step in range(max_new_tokens):
            token = sampling.pick(logits)
            if step:  # a finished row repeats its stop token
                token = np.where(done, out[-1][:, 0], token)
            out.append(token[:, None])
            done |= np.fromiter((int(t) in stops for t in token), bool, len(token))
            report(step + 1)
            if step + 1 == max_new_tokens or done.all():
                break
            logits = self.decode(token)
        decode_s = time.perf_counter() - tick
        steps = len(out) - 2  # decode calls made
        self.last_timings = {"prefill_ms": prefill_s * 1e3,
                             "decode_tokens_per_s": steps / decode_s if steps and decode_s > 0 else 0.0}
        report(None)
        return np.concatenate(out, axis=1)

    # -- deployment ----------------------------------------------------------------------------
    def export_library(self, path: str | os.PathLike) -> Path:
        """Write the library (its metadata records the ``LMConfig``); ``aicf_tvm.load`` of it
        gives a ``CausalLM`` back."""
        return self.model.export(path)


def _progress(progress: bool | Callable[[int, int], None], total: int) -> Callable[[int | None], None]:
    if callable(progress):
        return lambda done: None if done is None else progress(done, total)
    if not progress:
        return lambda done: None
    start = time.perf_counter()

    def report(done: int | None) -> None:
        if done is None:
            print(file=sys.stderr)
            return
        rate = done / max(time.perf_counter() - start, 1e-9)
        print(f"\rgenerating: {done}/{total} tokens ({rate:.1f} tokens/s)", end="", file=sys.stderr, flush=True)

    return report


def load(path: str | os.PathLike, device: Any = None, threads: int | None = None) -> CompiledModel | CausalLM:
    """The model of a library written by ``CompiledModel.export`` (a ``CompiledModel``) or by
    ``CausalLM.export_library`` (a ``CausalLM``); runs with TVM's runtime alone."""
    model = load_model(path, device=device, threads=threads)
    spec = (model.metadata or {}).get(LLM_KEY)
    if spec is None:
        return model
    try:
        config = LMConfig.from_json(spec)
    except (KeyError, TypeError, ValueError) as err:
        raise DeployError(f"{path}: incomplete LLM metadata ({type(err).__name__}: {err})") from err
    return CausalLM(model, config)


def cache_shapes_of(shapes: Sequence[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    """(kv heads, head dim) of each [batch, heads, rows, dim] cache shape."""
    return tuple((int(s[1]), int(s[3])) for s in shapes)


__all__ = ["DECODE", "LLM_KEY", "CausalLM", "LMConfig", "Sampling", "cache_shapes_of", "load"]
