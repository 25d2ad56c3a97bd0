"""A ``Program`` as a Relax module: one dataflow block in ``main``, one binding per step.

Constants with the same spec are one ``relax.Constant`` (so a program can use a weight in
two roles, ``x @ W + W``); a step's value may be a tuple (batch_norm), read by ``item``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import tvm
from tvm import relax, tirx

from .program import Program, Step, const_array, index_array

_N = tirx.Var("n", "int64")


def _dim(d: Any) -> Any:
    return _N if d == "n" else int(d)


class _Consts:
    """One ``relax.Constant`` per distinct spec."""

    def __init__(self) -> None:
        self._made: dict[str, relax.Constant] = {}

    def __call__(self, spec: dict) -> relax.Constant:
        key = json.dumps(spec, sort_keys=True)
        if key not in self._made:
            arr = const_array(**spec)
            self._made[key] = relax.const(arr, str(arr.dtype))  # relax.const alone makes f64 f32
        return self._made[key]

    def index(self, spec: dict) -> relax.Constant:
        arr = index_array(**spec)
        return relax.const(arr, str(arr.dtype))


def _scalar(value: float, like: Any) -> relax.Constant:
    return relax.const(np.array(value, str(like.ty.dtype)), str(like.ty.dtype))


_UNARY: dict[str, Callable[[Any], Any]] = {
    "relu": relax.op.nn.relu, "tanh": relax.op.tanh, "sigmoid": relax.op.sigmoid,
    "negative": relax.op.negative, "abs": relax.op.abs, "exp": relax.op.exp,
    "silu": relax.op.nn.silu, "gelu": relax.op.nn.gelu, "square": relax.op.square,
    "sqrt_abs": lambda x: relax.op.sqrt(relax.op.abs(x)),
    "clip": lambda x: relax.op.clip(x, -1.0, 1.5),
    "reciprocal": lambda x: relax.op.divide(_scalar(1.0, x), x),
}
_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": relax.op.add, "subtract": relax.op.subtract, "multiply": relax.op.multiply,
    "maximum": relax.op.maximum, "minimum": relax.op.minimum, "div": relax.op.divide,
    # a / (|b| + 1): a division that stays finite on ordinary inputs
    "divide": lambda a, b: relax.op.divide(a, relax.op.add(relax.op.abs(b), _scalar(1.0, b))),
}


def _operand(step: Step, v: list, consts: _Consts, key: str = "const") -> Any:
    """The second operand: a value when the step reads two, else the constant ``key``."""
    return v[step.args[1]] if len(step.args) > 1 else consts(step.params[key])


def _norm(step: Step, a: Any, consts: _Consts) -> Any:
    op, p = step.op, step.params
    if op in ("softmax", "log_softmax"):
        return getattr(relax.op.nn, op)(a, axis=p["axis"])
    if op == "written_softmax":
        e = relax.op.exp(relax.op.subtract(a, relax.op.max(a, axis=[p["axis"]], keepdims=True)))
        return relax.op.divide(e, relax.op.sum(e, axis=[p["axis"]], keepdims=True))
    if op == "written_layernorm":
        mu = relax.op.mean(a, axis=[-1], keepdims=True)
        d = relax.op.subtract(a, mu)
        var = relax.op.mean(relax.op.multiply(d, d), axis=[-1], keepdims=True)
        return relax.op.divide(d, relax.op.sqrt(relax.op.add(var, _scalar(1e-5, a))))
    axes = list(range(-p["k"], 0))
    if op == "rms_norm":
        return relax.op.nn.rms_norm(a, consts(p["gamma"]), axes=axes, epsilon=1e-5)
    return relax.op.nn.layer_norm(a, consts(p["gamma"]), consts(p["beta"]), axes=axes, epsilon=1e-5)


def _linear(step: Step, a: Any, v: list, consts: _Consts) -> Any:
    p = step.params
    b = _operand(step, v, consts)
    if step.op == "conv2d":
        nhwc = p.get("layout") == "NHWC"  # then the weight is HWIO
        return relax.op.nn.conv2d(a, b, strides=p["strides"], padding=p["padding"], groups=p["groups"],
                                  data_layout="NHWC" if nhwc else "NCHW", kernel_layout="HWIO" if nhwc else "OIHW")
    if p.get("transpose_rhs"):
        rank = len(p["rhs_shape"])
        b = relax.op.permute_dims(b, list(range(rank - 2)) + [rank - 1, rank - 2])
    return relax.op.matmul(a, b)


def _view(step: Step, a: Any) -> Any:
    op, p = step.op, step.params
    if op == "permute_dims":
        return relax.op.permute_dims(a, p["perm"])
    if op == "reshape":
        return relax.op.reshape(a, [_dim(d) for d in p["shape"]])
    if op == "broadcast_to":
        return relax.op.broadcast_to(a, [_dim(d) for d in p["shape"]])
    if op == "strided_slice":
        return relax.op.strided_slice(a, [p["axis"]], [p["begin"]], [p["end"]], [p["stride"]])
    if op == "squeeze":
        return relax.op.squeeze(a, [p["axis"]])
    if op == "expand_dims":
        return relax.op.expand_dims(a, p["axis"])
    if op == "astype":
        return relax.op.astype(a, p["dtype"])
    raise ValueError(f"unknown op {op}")


def _index(step: Step, a: Any, v: list, consts: _Consts) -> Any:
    op, p = step.op, step.params
    idx = consts.index(p["indices"])
    if op == "gather_elements":
        return relax.op.gather_elements(a, idx, axis=p["axis"])
    if op == "gather_nd":
        return relax.op.gather_nd(a, idx)
    if op == "take":
        return relax.op.take(a, idx, axis=p["axis"], mode=p["mode"])
    updates = _operand(step, v, consts, "updates")
    if op == "scatter_elements":
        return relax.op.scatter_elements(a, idx, updates, axis=p["axis"], reduction=p["reduction"])
    return relax.op.scatter_nd(a, idx, updates, reduction=p["reduction"])


def _relax_step(step: Step, v: list, consts: _Consts) -> Any:
    op, p = step.op, step.params
    a = v[step.args[0]]
    if op in _UNARY:
        return _UNARY[op](a)
    if op in _BINARY:
        b = _operand(step, v, consts)
        return _BINARY[op](*((b, a) if p.get("swap") else (a, b)))
    if op in ("sum", "mean", "max"):
        return getattr(relax.op, op)(a, axis=p["axes"], keepdims=p["keepdims"])
    if op in ("softmax", "log_softmax", "written_softmax", "written_layernorm", "layer_norm", "rms_norm"):
        return _norm(step, a, consts)
    if op in ("matmul", "conv2d"):
        return _linear(step, a, v, consts)
    if op == "batch_norm":
        stats = [consts(p[k]) for k in ("gamma", "beta", "mean", "var")]
        return relax.op.nn.batch_norm(a, *stats, axis=p["axis"], epsilon=p["eps"], center=p["center"],
                                      scale=p["scale"], momentum=p["momentum"], training=p["training"])
    if op == "item":
        return relax.TupleGetItem(a, p["index"])
    if op == "prelu":
        return relax.op.nn.prelu(a, _operand(step, v, consts, "alpha"), axis=p["axis"])
    if op == "concat":
        return relax.op.concat([v[i] for i in step.args], axis=p["axis"])
    if op in ("gather_elements", "gather_nd", "take", "scatter_elements", "scatter_nd"):
        return _index(step, a, v, consts)
    if op == "slice_scatter":
        src = relax.op.strided_slice(a, [p["axis"]], [p["begin"]], [p["end"]], [1])
        src = relax.op.multiply(src, _scalar(2.0, a))
        return relax.op.slice_scatter(a, src, p["begin"], p["end"], 1, p["axis"])
    return _view(step, a)


def _nest(outputs: Any, values: list) -> Any:
    if isinstance(outputs, int):
        return values[outputs]
    return relax.Tuple([_nest(o, values) for o in outputs])


def build_module(prog: Program) -> tvm.IRModule:
    """The program as a Relax module with one dataflow block (``main``)."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType([_dim(d) for d in s], dt)) for i, (s, dt) in
              enumerate(prog.inputs)]
    consts = _Consts()
    with bb.function("main", params):
        with bb.dataflow():
            values: list = list(params)
            for step in prog.steps:
                values.append(bb.emit(_relax_step(step, values, consts)))
            outs = prog.outputs if not isinstance(prog.outputs, int) else (prog.outputs,)
            out = bb.emit_output(_nest(outs[0], values) if len(outs) == 1 else _nest(outs, values))
        bb.emit_func_output(out)
    return bb.get()
