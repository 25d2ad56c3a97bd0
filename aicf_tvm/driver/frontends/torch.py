"""PyTorch import: ``torch.export``, our dtype canonicalization, then TVM's translator.

TVM's PyTorch frontend converts most ATen ops without PyTorch's type promotion: it emits
``cumsum`` of a bool tensor with no dtype (bool summed as bool: LLVM refuses the add),
``div`` of two int64 tensors as an int64 division (DeBERTa's ``log(abs_pos / mid)``), an
``int_tensor * 0.5`` with the scalar cast to int. PyTorch already decided every result
dtype, and the exported program records it (``node.meta["val"]``). ``canonicalize_dtypes``
makes each such operand's cast explicit in the FX graph (an ``aten._to_copy`` node, which
TVM translates to ``astype``), so the translator sees operands of the dtype PyTorch
computes in. It runs on the decomposed (core ATen) graph, the one TVM translates.
Before the decomposition, ``views_as_reshapes`` keeps a dynamic batch from breaking it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import tvm
from tvm import relax, tirx

from aicf_tvm.core.errors import UnsupportedModelError
from relax_passes.creation_ops import arange_form

from ..compile_cache import cache_for
from ..symbolic import rename_dims, torch_dim_names
from . import import_cache
from .common import first_line, normalize_import
from .int4 import linear_int4_call
from .torch_export import capture, trace
from .torch_indices import index_converters

if TYPE_CHECKING:
    import torch
    from torch.fx.node import Argument
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

# Ops that compute in their result dtype: every tensor operand not listed in _KEEP_ARGS is
# cast to it (PyTorch: an int or bool sum/cumsum accumulates in int64, true division and
# float math of integers give the default float dtype, a 0-dim float64 operand does not
# widen a float32 tensor).
_COMPUTE_IN_RESULT = frozenset(["add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "rsub.Tensor", "rsub.Scalar",
                                "mul.Tensor", "mul.Scalar", "div.Tensor", "div.Scalar", "div.Tensor_mode",
                                "remainder.Tensor", "remainder.Scalar", "fmod.Tensor", "fmod.Scalar",
                                "floor_divide.default", "pow.Tensor_Tensor", "pow.Tensor_Scalar", "maximum.default",
                                "minimum.default", "atan2.default", "where.self", "cumsum.default", "cumprod.default",
                                "sum.default", "sum.dim_IntList", "prod.default", "prod.dim_int", "exp.default",
                                "expm1.default", "log.default", "log2.default", "log10.default", "log1p.default",
                                "sqrt.default", "rsqrt.default", "reciprocal.default", "sin.default", "cos.default",
                                "tan.default", "tanh.default", "sigmoid.default", "erf.default", "asin.default",
                                "acos.default", "atan.default", "sinh.default", "cosh.default"])

# The condition of where stays bool.
_KEEP_ARGS = {"where.self": frozenset({0})}

# Comparisons give bool but compare in the operands' promoted dtype (int64 == 0.5 is a
# float comparison).
_COMPARISONS = frozenset(f"{op}.{variant}" for op in ("eq", "ne", "lt", "le", "gt", "ge")
                         for variant in ("Tensor", "Scalar"))


def _val(arg: Argument) -> torch.Tensor | None:
    import torch

    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _compute_dtype(node: torch.fx.Node) -> torch.dtype | None:
    """The dtype PyTorch computes ``node`` in, or None when it is not one of ours."""
    import torch

    name = getattr(node.target, "__name__", "")
    if name in _COMPUTE_IN_RESULT:
        out = _val(node)
        return None if out is None else out.dtype
    if name in _COMPARISONS and len(node.args) >= 2:
        operands = [_val(a) if isinstance(a, torch.fx.Node) else a for a in node.args[:2]]
        if any(o is None for o in operands):
            return None
        try:
            return torch.result_type(*operands)
        except (TypeError, RuntimeError):  # a symbolic scalar: leave the op to TVM
            return None
    return None


def canonicalize_dtypes(graph: torch.fx.Graph) -> int:
    """Insert the casts PyTorch's type promotion implies (see the module docstring) into an
    FX graph; returns how many were inserted.

    An op that computes in bool (``a == b`` of two masks, ``mask + mask``) computes in uint8
    instead, the result cast back to bool: TVM's LLVM codegen has no bool add or compare,
    and on 0/1 values uint8 arithmetic and order give the same bools.
    """
    import torch

    inserted = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        dtype = _compute_dtype(node)
        if dtype is None:
            continue
        if dtype == torch.bool:
            dtype = torch.uint8
            inserted += _result_back_to_bool(graph, node)
        keep = _KEEP_ARGS.get(getattr(node.target, "__name__", ""), frozenset())
        for i, arg in enumerate(node.args):
            val = _val(arg)
            if i in keep or val is None or val.dtype == dtype:
                continue
            with graph.inserting_before(node):
                cast = graph.call_function(torch.ops.aten._to_copy.default, (arg,), {"dtype": dtype})
            cast.meta["val"] = val.to(dtype)
            node.update_arg(i, cast)
            inserted += 1
    return inserted


def drop_empty_cat_inputs(graph: torch.fx.Graph) -> int:
    """Drop the 1-D empty inputs of ``aten.cat``; returns how many were dropped.

    PyTorch's ``cat`` skips a tensor of shape ``(0,)`` whatever the other inputs' rank (an
    empty key/value cache concatenated with the first step's keys is one); TVM's
    ``concat`` requires one rank. Skipping them is exactly what PyTorch computes."""
    import torch

    dropped = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.cat.default:
            continue
        tensors = list(node.args[0])
        kept = [t for t in tensors if not (_val(t) is not None and tuple(_val(t).shape) == (0,))]
        if len(kept) == len(tensors) or not kept:
            continue
        node.update_arg(0, kept)
        dropped += len(tensors) - len(kept)
    return dropped


def _result_back_to_bool(graph: torch.fx.Graph, node: torch.fx.Node) -> int:
    """Make ``node`` (bool-valued, computing in uint8 from now) feed its users through a cast
    back to bool; comparisons give bool anyway. Returns the casts inserted."""
    import torch

    val = _val(node)
    if val is None or getattr(node.target, "__name__", "") in _COMPARISONS:
        return 0
    with graph.inserting_after(node):
        back = graph.call_function(torch.ops.aten._to_copy.default, (node,), {"dtype": torch.bool})
    back.meta["val"] = val
    node.meta["val"] = val.to(torch.uint8)
    node.replace_all_uses_with(back, delete_user_cb=lambda user: user is not back)
    return 1


def _arange(node: torch.fx.Node, importer: ExportedProgramImporter) -> relax.Var:
    """TVM's translation of a constant ``arange``, typed with its true length
    (``relax_passes.creation_ops``): Relax types ``arange(6, -1, -1)`` with 9 elements, and
    a sum with the 7 it is made for fails in the translator. Symbolic ones are left to
    ``NormalizeCreationOps``, which knows the dims' bounds."""
    var = importer._arange(node)
    call = importer.block_builder.lookup_binding(var)
    if not isinstance(call, relax.Call) or not all(isinstance(a, (tirx.IntImm, tirx.FloatImm))
                                                   for a in call.args):
        return var
    fixed = arange_form(call, tvm.sym.Analyzer())  # the wrong binding is dead code now
    return var if fixed is None else importer.block_builder.emit(fixed)


def _linear_int4(node: torch.fx.Node, importer: ExportedProgramImporter) -> relax.Var:
    """``aicf::linear_int4(x, packed, scales)`` (``compile_causal_lm(weights="int4")``'s
    layers, ``aicf_tvm.driver.quantize_weights``): a call of ``schedules.cpu.linear_int4``'s
    kernel for its rows, the one-row GEMV when ``x`` has one row."""
    x, packed, scales = (importer.env[a] for a in node.args[:3])
    return importer.block_builder.emit(linear_int4_call(importer.block_builder, x, packed, scales))


def _linear_int4_q8(node: torch.fx.Node, importer: ExportedProgramImporter) -> relax.Var:
    """``aicf::linear_int4_q8(x, packed, scales)``: the same layer with ``x`` rounded to
    int8 per group first (``compile_causal_lm(activations="int8")``)."""
    x, packed, scales = (importer.env[a] for a in node.args[:3])
    return importer.block_builder.emit(linear_int4_call(importer.block_builder, x, packed, scales, True))


def _linear_int8_q8(node: torch.fx.Node, importer: ExportedProgramImporter) -> relax.Var:
    """``aicf::linear_int8_q8(x, packed, scales)``: an int8 weight with ``x`` rounded to
    int8 per group (``compile_causal_lm(weights="int8", activations="int8")``)."""
    x, packed, scales = (importer.env[a] for a in node.args[:3])
    return importer.block_builder.emit(linear_int4_call(importer.block_builder, x, packed, scales, True, bits=8))


_CONVERTERS = {name: _arange for name in ("arange.default", "arange.start", "arange.start_step")}
_CONVERTERS["linear_int4.default"] = _linear_int4
_CONVERTERS["linear_int4_q8.default"] = _linear_int4_q8
_CONVERTERS["linear_int8_q8.default"] = _linear_int8_q8


def from_torch(module: torch.nn.Module, example_args: Sequence[Any], dynamic_shapes: Any = None, *,
               cache: bool = True, cache_dir: str | os.PathLike | None = None) -> tvm.IRModule:
    """Import a ``torch.nn.Module`` through ``torch.export`` (needs the ``torch`` extra).

    ``dynamic_shapes`` is ``torch.export``'s argument, one entry per example argument, e.g.
    ``({1: torch.export.Dim("seq", max=512)},)``: those dims stay symbolic in the module,
    named as the ``Dim`` is, and their bounds become the function's ``tir_var_*_bound``
    (checked at every call). A branch on the value of the module's own tensors is
    specialized to its outcome, one on an input's values refused (see ``torch_export``).

    ``cache`` (on by default, in ``compile``'s cache folder; ``cache_dir`` moves it): a
    program ``torch.export`` traced before, to the last weight's byte, is read back from
    the import cache instead of decomposed and translated again (``import_cache``).
    """
    try:
        import torch
    except ImportError as err:
        raise UnsupportedModelError("from_torch needs PyTorch: pip install 'aicf-tvm[torch]'") from err
    from tvm.relax.frontend.torch import from_exported_program

    module = module.eval()
    store = cache_for(cache, cache_dir)
    with torch.no_grad():
        traced = trace(module, example_args, dynamic_shapes)
        key = None
        if store is not None and not isinstance(traced, Exception):
            key = import_cache.torch_key(traced, torch_dim_names(traced, dynamic_shapes))
            if key is not None and (hit := import_cache.get(store, key)) is not None:
                return hit
        ep = capture(module, example_args, dynamic_shapes, traced)
        if canonicalize_dtypes(ep.graph) + drop_empty_cat_inputs(ep.graph):
            ep.graph_module.recompile()
        try:
            mod = from_exported_program(ep, keep_params_as_input=False, unwrap_unit_return_tuple=True,
                                        run_ep_decomposition=False,
                                        custom_convert_map={**index_converters(), **_CONVERTERS})
        except Exception as err:
            text = first_line(err)
            missing = re.search(r"Unsupported function types? (\[.*?\])", text)
            if missing:
                raise UnsupportedModelError(f"{type(module).__name__}: PyTorch op(s) {missing.group(1)} "
                                            "not supported by TVM's PyTorch frontend") from err
            raise UnsupportedModelError(f"TVM's PyTorch frontend could not import {type(module).__name__}: "
                                        f"{text}") from err
    mod = normalize_import(rename_dims(mod, torch_dim_names(ep, dynamic_shapes)))
    if key is not None:
        import_cache.put(store, key, mod, background=True)
    return mod
