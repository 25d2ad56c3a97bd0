"""Model import: ONNX files, PyTorch modules, Relax modules, built-in example models.

Every importer returns a Relax IRModule with a pure ``main`` whose parameters are the
model's real inputs (weights bound as constants), normalized by ``FoldConstant``,
``NormalizeIndices`` (every gather reads in bounds) and ``DeadCodeElimination`` so weights
computed from constants arrive as constants.

In front of TVM's frontends sits our own import layer, built on their extension points:
``torch`` canonicalizes the exported program to PyTorch's type promotion before TVM
translates it (``torch_export`` captures it, also where a branch reads the module's own
tensors); ``onnx`` runs ONNX shape inference and folds shape subgraphs to constants,
and keeps named dynamic dims symbolic.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import tvm

from aicf_tvm.core.errors import UnsupportedModelError

from .. import models
from ..symbolic import with_dim_bounds
from .onnx import from_onnx
from .torch import from_torch

if TYPE_CHECKING:
    from .onnx import OnnxModel

    # a model as ``load_model`` takes it: see its docstring
    ModelLike = tvm.IRModule | OnnxModel

__all__ = ["from_onnx", "from_torch", "is_onnx_file", "load_model"]


def load_model(spec: ModelLike, shapes: Mapping[str, Sequence[int | str]] | None = None,
               bounds: Mapping[str, tuple[int | None, int | None]] | None = None) -> tvm.IRModule:
    """A Relax module from: an IRModule; an ``nn.Module`` spec; an ONNX path;
    a built-in model name; or ``package.module:function`` returning an IRModule.

    ``shapes`` sets input shapes of an ONNX model (``from_onnx``); ``bounds`` bounds the
    symbolic dims of any of them (``aicf_tvm.driver.symbolic.with_dim_bounds``)."""
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, (str, tvm.IRModule)) or (isinstance(spec, str) and _is_onnx(spec)):
        return from_onnx(spec, shapes, bounds)
    if shapes:
        raise UnsupportedModelError(f"{spec if isinstance(spec, str) else 'the module'}: input shapes can be "
                                    "set for ONNX models only (the others fix their own)")
    return with_dim_bounds(_load_other(spec), bounds or {})


def _is_onnx(text: str) -> bool:
    return text not in models.BUILTIN_MODELS and (text.endswith(".onnx") or os.path.exists(text))


def is_onnx_file(spec: str | os.PathLike) -> bool:
    """Whether ``load_model`` reads ``spec`` as an ONNX file, and the file is there."""
    text = os.fspath(spec)
    return _is_onnx(text) and os.path.isfile(text)


def _load_other(spec: tvm.IRModule | str) -> tvm.IRModule:
    """An IRModule, a built-in model or ``package.module:function`` (``load_model``)."""
    if isinstance(spec, tvm.IRModule):
        return spec
    text = spec
    if text in models.BUILTIN_MODELS:
        return models.BUILTIN_MODELS[text]()
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
