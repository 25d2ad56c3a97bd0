"""``compile_causal_lm``: a transformers ``*ForCausalLM`` compiled into a ``CausalLM``.

The model is exported by ``torch.export`` as two step functions, ``main`` and ``decode``
(the signature is in ``aicf_tvm.runtime.llm``; ``compile_steps`` builds them into one
library), with the model's own attention code: its KV cache is a
transformers ``Cache`` whose layers (``_WriteLayer``) write the step's keys and values
into a preallocated ``[1, heads, max_length + 1, dim]`` tensor with
``slice_scatter`` and hand attention the rows ``[0, total)``. The imported function
donates those tensors (``aicf.donated_inputs``), so ``relax_passes.cache_in_place`` writes
the rows in place, and the slice to ``total`` joins the fused attention as a view: no
cache byte is copied per step. ``logits_to_keep=1``: only the last position reaches
the LM head.

Any decoder whose attention goes through transformers' ``Cache.update`` works this way;
before it is returned, the compiled model is checked against the PyTorch model on a
probe prompt and one decode step, and a family that disagrees (or cannot be exported) is
refused by name.
"""

from __future__ import annotations

import copy
import inspect
import os
import sys
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm

from aicf_tvm.core.errors import AicfError, UnsupportedModelError
from aicf_tvm.core.kinds.cache import DONATED_INPUTS_ATTR
from aicf_tvm.core.options import CompileOptions, options_or_default
from aicf_tvm.core.report import Decision, FusionReport
from aicf_tvm.runtime.compiled import CompiledModel
from aicf_tvm.runtime.llm import DECODE, CausalLM, LMConfig, cache_shapes_of
from aicf_tvm.runtime.targets import resolve_target
from relax_passes.creation_ops import NormalizeCreationOps

from .compiled import compiled_model, signature_of
from .frontends import from_torch
from .merge import merge_functions
from .pipeline import _Clock, build, format_timings, run_pipeline
from .quantize_weights import QuantizedLayer, check_weights, inputs_not_rounded, quantize_linears, resolve_activations

if TYPE_CHECKING:
    import torch

DEFAULT_MAX_LENGTH = 1024
# a probe's logits agree with PyTorch's to this (float32 sums in another order)
PROBE_RTOL, PROBE_ATOL = 1e-3, 1e-4
PROBE_PROMPT = 5
# int8 activations: the logits' distance from PyTorch's, at most this times the inputs' rounding's own effect
PROBE_ROUNDING_FACTOR = 2.0
CALIBRATION_TOKENS = 32


def _write_layer_class() -> type:
    """The cache layer class (transformers is imported only when a model is compiled)."""
    import torch
    from transformers.cache_utils import CacheLayerMixin

    class _WriteLayer(CacheLayerMixin):
        """One layer's keys or values: rows ``[past, past + new)`` of a preallocated tensor."""

        is_sliding = False
        is_compileable = True

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, past: Any) -> None:
            super().__init__()
            self.keys, self.values, self.past = keys, values, past
            self.is_initialized = True

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            pass

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            end = self.past + key_states.shape[2]
            self.keys = torch.slice_scatter(self.keys, key_states, 2, self.past, end)
            self.values = torch.slice_scatter(self.values, value_states, 2, self.past, end)
            return self.keys[:, :, :end], self.values[:, :, :end]

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.past + query_length, 0

        def get_seq_length(self) -> int:
            return self.past

        def get_max_length(self) -> int:
            return self.keys.shape[2]

    return _WriteLayer


def _cache_keyword(model: torch.nn.Module) -> str:
    """The forward's name for the KV cache: ``cache`` (transformers 5.2x) or ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _returned_cache(out: Any) -> Any:
    return getattr(out, "cache", None) or getattr(out, "past_key_values", None)


def _step_module(model: torch.nn.Module) -> torch.nn.Module:
    import torch
    from transformers.cache_utils import Cache

    layer_class = _write_layer_class()
    keyword = _cache_keyword(model)

    class Step(torch.nn.Module):
        """ids, mask (its length: the total), the caches -> last logits and the caches."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor, mask: torch.Tensor, *kv: torch.Tensor) -> tuple:
            past = mask.shape[1] - ids.shape[1]
            layers = [layer_class(kv[2 * i], kv[2 * i + 1], past) for i in range(len(kv) // 2)]
            out = self.model(input_ids=ids, **{keyword: Cache(layers=layers)}, use_cache=True, logits_to_keep=1)
            return (out.logits, *[t for layer in layers for t in (layer.keys, layer.values)])

    return Step().eval()


def load_causal_lm(model: Any) -> torch.nn.Module:
    """``model`` itself, or the transformers model saved in the folder ``model`` names."""
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isdir(path):
            raise UnsupportedModelError(f"{path}: not a folder (expected a transformers model saved with "
                                        f"save_pretrained: config.json and the weights)")
        try:
            import torch
            from transformers import AutoModelForCausalLM
        except ImportError as err:
            raise UnsupportedModelError("compile_causal_lm needs transformers and PyTorch: "
                                        "pip install 'aicf-tvm[llm]'") from err
        try:
            return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        except Exception as err:
            raise UnsupportedModelError(f"{path}: transformers could not load a causal LM from it: "
                                        f"{str(err).strip().splitlines()[0]}") from err
    return model


def _cache_shapes(model: torch.nn.Module) -> list[tuple[int, ...]]:
    """[batch, heads, tokens, dim] of each layer's keys and values after one token."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.zeros(1, 1, dtype=torch.long), use_cache=True)
    layers = getattr(_returned_cache(out), "layers", None)
    if not layers:
        raise UnsupportedModelError(f"{type(model).__name__}: its forward returned no per-layer KV cache")
    shapes = []
    for i, layer in enumerate(layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(keys, torch.Tensor) or keys.ndim != 4 or values is None or values.ndim != 4:
            raise UnsupportedModelError(
                f"{type(model).__name__}: layer {i} keeps a {type(layer).__name__} cache, not keys and values "
                f"of shape [batch, heads, tokens, dim] (recurrent or linear-attention layers are not supported)")
        shapes += [tuple(keys.shape), tuple(values.shape)]
    return shapes


def export_step(model: torch.nn.Module, shapes: list[tuple[int, ...]], max_length: int,
                tokens: int | None = None) -> Any:
    """The step function as a Relax module (``from_torch``): ``tokens`` new tokens per call,
    or any number up to ``max_length`` (None)."""
    import torch

    kv = [torch.zeros(1, h, max_length + 1, d) for _, h, _, d in shapes]
    ids = torch.zeros(1, tokens or 3, dtype=torch.long)
    mask = torch.ones(1, 5, dtype=torch.long)
    total = torch.export.Dim("total", min=1, max=max_length)
    prompt = {} if tokens else {1: torch.export.Dim("prompt", min=1, max=max_length)}
    # not cached: the steps' library is not (compile_steps), and an import entry would only
    # write the weights once more per step
    return from_torch(_step_module(model), (ids, mask, *kv),
                      dynamic_shapes=(prompt, {1: total}, tuple({} for _ in kv)), cache=False)


def compile_steps(steps: dict[str, tvm.IRModule], target: Any, *, options: CompileOptions | None = None,
                  threads: int | None = None) -> CompiledModel:
    """One library of the step functions (each module's ``main``, named by its key; "main"
    first), their caches donated: each runs the pipeline up to its scheduled kernels; the
    kernels of the others are renamed ``<name>_<kernel>``, equal constants become one
    (``merge_functions``), and the whole builds once.  A weight is stored once when every
    function holds it in the same layout: as stored, or packed at compile time by a GEMM
    plan that does not depend on the rows (a one-token step packs as a prompt does,
    ``gemm_plan._one_strip``); the report says per function how many bytes it shares."""
    options = options_or_default(options).updated(target=target, threads=threads)
    tgt = resolve_target("llvm" if options.target is None else options.target)
    options = options.updated(target=tgt)
    report, timings, merged, main, others = FusionReport(), {}, None, None, {}
    for fname, mod in steps.items():
        func = mod["main"]
        mod["main"] = func.with_attr(DONATED_INPUTS_ATTR, [p.name for p in func.params[2:]])
        mod = NormalizeCreationOps()(mod)
        stages = run_pipeline(mod, report=report, until="schedule", options=options)
        for phase, secs in stages.timings.items():
            timings[phase] = timings.get(phase, 0.0) + secs
        if merged is None:
            merged, main = stages.lowered, mod["main"]
        else:
            others[fname] = signature_of(mod["main"])
            merged, shared, own = merge_functions(merged, stages.lowered, fname)
            report.add(Decision("materialize:shared_constants", (fname,), True, benefit=shared,
                                note=f"{shared / 1e6:.1f} MB of constants stored once with the functions "
                                     f"before it, {own / 1e6:.1f} MB its own"))
    clock = _Clock(timings)
    executable = clock("codegen", build, merged, tgt)
    model = compiled_model(executable, tgt, main, report=report, lowered=merged, threads=options.threads,
                           functions=others)
    model.timings = timings
    return model


def compile_causal_lm(model: Any, max_length: int = DEFAULT_MAX_LENGTH, target: Any = "llvm", *,
                      threads: int | None = None,
                      options: CompileOptions | None = None, timings: bool = False,
                      check: bool = True, weights: str = "float32", activations: str = "auto") -> CausalLM:
    """Compile a transformers ``*ForCausalLM`` (or the folder it was saved in) for generation
    of up to ``max_length`` tokens (prompt + new). The step function takes one sequence
    (batch 1, the fast path); a ``CausalLM`` runs the rows of a batch one after another.

    ``check`` compares the compiled model's logits with PyTorch's on a probe prompt and
    one decode step and refuses the model (``UnsupportedModelError``) when they differ.
    ``weights="int8"`` (an opt-in approximation, ``quantize_weights``): every linear layer
    computes with its weight rounded to per-channel int8, stored and read as int8; the
    report lists each layer and its error on a calibration prompt, and ``check`` compares
    with the PyTorch model so quantized (the user's model is not changed). ``weights="int4"``
    likewise with symmetric int4 in groups of 32, read packed by the int4 kernels
    (``schedules.cpu.linear_int4``; CPU targets only), int8 where a layer's shape does not fit them.
    ``activations="int8"`` (with ``weights="int4"`` on x86 CPUs with AVX2, with ``"int8"`` on
    CPUs with AVX-512 VNNI) also rounds each quantized layer's input to int8 in groups of 32,
    and its kernels sum in integers: a further approximation, in the report and in
    ``check``'s PyTorch model alike. ``activations="auto"`` (the default) takes it with
    quantized weights where the target has those kernels, as llama.cpp, ONNX Runtime GenAI
    and OpenVINO do at 4 and 8 bits, and float32 inputs elsewhere (``lm.config.activations``
    says which); ``"float32"`` keeps the layers' inputs float32 everywhere.
    ``timings`` prints the compile phases (load, export, ... codegen)."""
    if max_length < 2:
        raise ValueError(f"max_length={max_length}: need max_length >= 2")
    weights = check_weights(weights)
    resolved = resolve_target(target if target is not None else "llvm")
    if weights == "int4" and resolved.kind.name != "llvm":
        raise ValueError(f"weights='int4' runs on CPU targets (llvm) only, not {target!r}: its kernels are "
                         f"written for CPU vectors; use weights='int8' or 'float32'")
    activations = resolve_activations(activations, weights, resolved)
    clock = _Clock()
    model = clock("load", load_causal_lm, model)
    config = model.config
    name = f"{type(model).__name__} ({getattr(config, 'model_type', '?')})"
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(f"{name}: an encoder-decoder model; compile_causal_lm takes decoders")
    model = model.float().eval()
    shapes = clock("load", _cache_shapes, model)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    quantized: list[QuantizedLayer] = []
    if weights != "float32":
        model = copy.deepcopy(model)
        quantized = clock("quantize", quantize_linears, model, weights, _calibration_ids(vocab), activations)
    try:
        steps = {function: clock("export", export_step, model, shapes, max_length, tokens)
                 for function, tokens in (("main", None), (DECODE, 1))}
    except AicfError as err:
        raise UnsupportedModelError(f"{name}: cannot be compiled for generation: {err}") from err
    compiled = compile_steps(steps, target, options=options, threads=threads)
    compiled.timings = {**clock.timings, **compiled.timings}
    for layer in quantized:
        compiled.report.add(layer.decision())
    if timings:
        print(format_timings(compiled.timings), file=sys.stderr)
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(config, "eos_token_id", None)
    eos_ids = tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos]))
    lm = CausalLM(compiled, LMConfig(str(getattr(config, "model_type", type(model).__name__)), max_length,
                                     vocab, cache_shapes_of(shapes), eos_ids, weights=weights,
                                     activations=activations))
    if check:
        _check_against_torch(lm, model, name)
    return lm


def _calibration_ids(vocab: int) -> Any:
    """The calibration prompt of weight quantization: random token ids (seeded)."""
    import torch

    return torch.from_numpy(np.random.default_rng(1).integers(0, vocab, (1, CALIBRATION_TOKENS)))


def _check_against_torch(lm: CausalLM, model: torch.nn.Module, name: str) -> None:
    """The compiled prefill and one decode step agree with PyTorch's logits on a probe.

    With int8 activations the rounding of each layer's input is a step function: where our
    kernels' other order of additions moves an input across a rounding boundary, one
    quantum moves, and the next layers' inputs then cross boundaries of their own. Past a
    few layers the two computations are two roundings of the same model, as far apart as
    the rounding's own effect. There the logits agree when they are at most
    ``PROBE_ROUNDING_FACTOR`` times as far from PyTorch's as PyTorch's are from the same
    model with its inputs not rounded (a wrong kernel is off by the logits' own size)."""
    import torch

    vocab = lm.config.vocab_size
    prompt = min(PROBE_PROMPT, lm.config.max_length - 1)
    ids = np.random.default_rng(0).integers(0, vocab, (1, prompt + 1))
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids)).logits[0, -2:].numpy()
    noise = None
    if lm.config.activations == "int8":
        with torch.no_grad(), inputs_not_rounded(model):
            noise = np.linalg.norm(want - model(input_ids=torch.from_numpy(ids)).logits[0, -2:].numpy(), axis=1)
    got = [lm.prefill(ids[:, :prompt])[0], lm.decode(ids[:, prompt])[0]]
    for step, (g, w) in enumerate(zip(got, want)):
        if np.allclose(g, w, rtol=PROBE_RTOL, atol=PROBE_ATOL):
            continue
        if noise is not None and np.linalg.norm(g - w) <= PROBE_ROUNDING_FACTOR * noise[step]:
            continue
        err = float(np.max(np.abs(g - w)))
        raise UnsupportedModelError(
            f"{name}: the compiled {'prefill' if step == 0 else 'decode step'} disagrees with PyTorch on a "
            f"probe prompt (max |difference| {err:.3g} in the logits); this family is not supported")


__all__ = ["DEFAULT_MAX_LENGTH", "compile_causal_lm", "load_causal_lm"]
