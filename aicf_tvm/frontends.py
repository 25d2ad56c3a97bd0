"""Model import: ONNX files, PyTorch modules, Relax modules, built-in example models.

Every importer returns a Relax IRModule with a pure ``main`` whose parameters are the
model's real inputs (weights bound as constants), normalized by ``FoldConstant`` and
``DeadCodeElimination`` so weights computed from constants arrive as constants.
"""

from __future__ import annotations

import importlib
import os
import re
from typing import Any, Mapping, Sequence

import tvm
from tvm import relax

from .errors import UnsupportedModelError
from .symbolic import rename_dims, torch_dim_names


def _normalize(mod: tvm.IRModule) -> tvm.IRModule:
    from relax_passes.bound_shapes import BoundShapes

    # bounds first: a shape left unknown by inference cannot be folded or legalized
    seq = tvm.transform.Sequential([BoundShapes(), relax.transform.FoldConstant(),
                                    relax.transform.DeadCodeElimination()])
    return seq(mod)


def _load_onnx(path_or_model: Any):
    import onnx

    if not isinstance(path_or_model, (str, os.PathLike, bytes)):
        if not isinstance(path_or_model, onnx.ModelProto):
            raise UnsupportedModelError(
                f"cannot import a {type(path_or_model).__name__}: give an ONNX file, bytes or ModelProto, "
                "a built-in model name, or a tvm.IRModule (a PyTorch module: aicf_tvm.from_torch(module, args))")
        return path_or_model, "<in-memory model>"
    if isinstance(path_or_model, bytes):
        try:
            return onnx.load_from_string(path_or_model), "<bytes>"
        except Exception as err:  # noqa: BLE001 - onnx raises DecodeError subclasses
            raise UnsupportedModelError(f"the given bytes are not an ONNX model ({err})") from err
    path = os.fspath(path_or_model)
    if not os.path.exists(path):
        raise UnsupportedModelError(f"{path}: no such file")
    try:
        return onnx.load(path), path
    except Exception as err:  # noqa: BLE001
        raise UnsupportedModelError(f"{path}: not an ONNX model ({type(err).__name__}: {err})") from err


def from_onnx(path_or_model: Any, shapes: Mapping[str, Sequence[int]] | None = None) -> tvm.IRModule:
    """Import an ONNX model (path, bytes or ``onnx.ModelProto``) with TVM's ONNX frontend."""
    model, name = _load_onnx(path_or_model)
    inits = {i.name for i in model.graph.initializer}
    real = [i for i in model.graph.input if i.name not in inits]
    shape_dict, dtype_dict = {}, {}
    for inp in real:
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in
                inp.type.tensor_type.shape.dim]
        if shapes and inp.name in shapes:
            dims = list(shapes[inp.name])
        shape_dict[inp.name] = dims
    _check_ops(model, name)
    try:
        mod = relax.frontend.onnx.from_onnx(model, shape_dict=shape_dict, keep_params_in_input=False)
    except Exception as err:  # noqa: BLE001 - the frontend raises many kinds
        raise UnsupportedModelError(f"{name}: the ONNX frontend failed: {type(err).__name__}: {err}") from err
    del dtype_dict
    return _normalize(mod)


def _check_ops(model: Any, name: str) -> None:
    """Name the first node whose operator TVM's ONNX frontend does not convert."""
    from tvm.relax.frontend.onnx import onnx_frontend

    table = onnx_frontend._get_convert_map()
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in table:
            raise UnsupportedModelError(
                f"{name}: operator {node.domain + '.' if node.domain else ''}{node.op_type} "
                f"(node {node.name or '<unnamed>'}) is not supported by TVM's ONNX frontend"
            )


def from_torch(module: Any, example_args: Sequence[Any], dynamic_shapes: Any = None) -> tvm.IRModule:
    """Import a ``torch.nn.Module`` through ``torch.export`` (needs the ``torch`` extra).

    ``dynamic_shapes`` is ``torch.export``'s argument, one entry per example argument, e.g.
    ``({1: torch.export.Dim("seq", max=512)},)``: those dims stay symbolic in the module and
    their bounds become the function's ``tir_var_upper_bound`` (checked at every call).
    """
    try:
        import torch
    except ImportError as err:
        raise UnsupportedModelError("from_torch needs PyTorch: pip install 'aicf-tvm[torch]'") from err
    from tvm.relax.frontend.torch import from_exported_program

    module = module.eval()
    with torch.no_grad():
        try:
            ep = torch.export.export(module, tuple(example_args), dynamic_shapes=dynamic_shapes)
        except Exception as err:  # noqa: BLE001 - torch.export's many error types
            raise UnsupportedModelError(f"torch.export could not capture {type(module).__name__}: "
                                        f"{_first_line(err)}") from err
        try:
            mod = from_exported_program(ep, keep_params_as_input=False, unwrap_unit_return_tuple=True)
        except Exception as err:  # noqa: BLE001 - the frontend asserts on unknown ops
            text = _first_line(err)
            missing = re.search(r"Unsupported function types? (\[.*?\])", text)
            if missing:
                raise UnsupportedModelError(f"{type(module).__name__}: PyTorch op(s) {missing.group(1)} "
                                            "not supported by TVM's PyTorch frontend") from err
            raise UnsupportedModelError(f"TVM's PyTorch frontend could not import {type(module).__name__}: "
                                        f"{text}") from err
    return _normalize(rename_dims(mod, torch_dim_names(ep, dynamic_shapes)))


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0][:300] if lines else type(err).__name__


def load_model(spec: Any) -> tvm.IRModule:
    """A Relax module from: an IRModule; an ``nn.Module`` spec; an ONNX path;
    a built-in model name; or ``package.module:function`` returning an IRModule."""
    if isinstance(spec, tvm.IRModule):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        return from_onnx(spec)
    text = os.fspath(spec)
    from . import models

    if text in models.BUILTIN_MODELS:
        return models.BUILTIN_MODELS[text]()
    if text.endswith(".onnx") or os.path.exists(text):
        return from_onnx(text)
    if ":" in text:
        mod_name, _, attr = text.partition(":")
        try:
            obj = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as err:
            raise UnsupportedModelError(f"{text}: cannot import ({err})") from err
        obj = obj() if callable(obj) else obj
        if not isinstance(obj, tvm.IRModule):
            raise UnsupportedModelError(f"{text}: returned {type(obj).__name__}, not a tvm.IRModule")
        return obj
    known = ", ".join(sorted(models.BUILTIN_MODELS))
    raise UnsupportedModelError(f"{text}: no such file, and not a built-in model ({known})")
