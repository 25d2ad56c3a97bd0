"""ONNX import: input shapes (symbolic where the model says so), shape folding, TVM's frontend.

Input dims: a ``dim_value`` is static; a named ``dim_param`` becomes one ``tirx.Var`` per
name, shared by every input that names it (``batch`` of ``input_ids`` and of
``attention_mask`` is one size); an unnamed dynamic dim becomes a fresh var of its own
(two unnamed dims need not agree). ``shapes=`` pins any input's shape. The pinned shapes
are written into the graph before ``fold_shapes`` so that shape computations on them fold
to constants (see ``onnx_fold``).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import tvm
from tvm import relax, tirx

from ...errors import UnsupportedModelError
from .common import first_line, normalize_import
from .onnx_fold import fold_shapes

Dim = int | tirx.Var


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


def real_inputs(model: Any) -> list[Any]:
    """The graph inputs that are not initializers (old models list weights among inputs)."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def input_shapes(model: Any, shapes: Mapping[str, Sequence[int]] | None = None,
                 name: str = "<model>") -> dict[str, list[Dim]]:
    """Each real input's shape, dynamic dims as ``tirx.Var`` (module docstring); inputs of
    unknown rank and not pinned are left out (TVM's frontend gives them no static shape)."""
    inputs = real_inputs(model)
    unknown = sorted(set(shapes or {}) - {i.name for i in inputs})
    if unknown:
        raise UnsupportedModelError(f"{name}: shapes= names {', '.join(unknown)}, not an input; the inputs are: "
                                    f"{', '.join(i.name for i in inputs)}")
    named: dict[str, tirx.Var] = {}
    result: dict[str, list[Dim]] = {}
    for inp in inputs:
        tensor = inp.type.tensor_type
        if shapes and inp.name in shapes:
            pinned = [int(d) for d in shapes[inp.name]]
            if tensor.HasField("shape") and len(tensor.shape.dim) != len(pinned):
                raise UnsupportedModelError(f"{name}: input {inp.name} has rank {len(tensor.shape.dim)}, "
                                            f"shapes= gives {pinned}")
            result[inp.name] = pinned
        elif tensor.HasField("shape"):
            result[inp.name] = [
                d.dim_value if d.HasField("dim_value")
                else named.setdefault(d.dim_param, tirx.Var(d.dim_param, "int64")) if d.dim_param
                else tirx.Var(f"{inp.name}_dim{k}", "int64")
                for k, d in enumerate(tensor.shape.dim)
            ]
    return result


def _with_shapes(model: Any, shape_dict: Mapping[str, Sequence[Dim]]) -> Any:
    """A copy of ``model`` whose inputs carry the given shapes (vars as dim_params)."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    for inp in out.graph.input:
        if inp.name not in shape_dict:
            continue
        shape = inp.type.tensor_type.shape
        del shape.dim[:]
        for dim in shape_dict[inp.name]:
            if isinstance(dim, int):
                shape.dim.add().dim_value = dim
            else:
                shape.dim.add().dim_param = dim.name
    return out


def from_onnx(path_or_model: Any, shapes: Mapping[str, Sequence[int]] | None = None) -> tvm.IRModule:
    """Import an ONNX model (path, bytes or ``onnx.ModelProto``) with TVM's ONNX frontend,
    after ONNX shape inference and folding of shape subgraphs."""
    model, name = _load_onnx(path_or_model)
    shape_dict = input_shapes(model, shapes, name)
    prepared = fold_shapes(_with_shapes(model, shape_dict))
    _check_ops(prepared, name)
    try:
        mod = relax.frontend.onnx.from_onnx(prepared, shape_dict=shape_dict, keep_params_in_input=False)
    except Exception as err:  # noqa: BLE001 - the frontend raises many kinds
        raise UnsupportedModelError(f"{name}: the ONNX frontend failed: {type(err).__name__}: "
                                    f"{first_line(err)}") from err
    return normalize_import(mod)


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
