"""A random Relax program as plain data, its Relax module and its numpy meaning.

A ``Program`` is inputs plus a list of steps; each step names an op, the values it reads
(by index: inputs first, then earlier steps) and JSON-able params. Keeping the program as
data (not as a Relax module) lets hypothesis shrink it and lets the fuzz script print it.
The same step table builds the Relax module (``build_module``) and evaluates it in numpy
(``eval_numpy``, None where we have no numpy meaning, e.g. conv2d).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax, tirx

Shape = tuple  # ints, or "n" for the symbolic batch dim


@dataclass
class Step:
    op: str
    args: tuple[int, ...]
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Program:
    inputs: list[tuple[Shape, str]]
    steps: list[Step]
    outputs: tuple[int, ...]
    n: int = 3  # the run-time value of the symbolic dim "n"

    def __repr__(self) -> str:
        lines = [f"inputs={self.inputs!r}, n={self.n}"]
        lines += [f"  v{len(self.inputs) + i} = {s.op}{s.args} {s.params}" for i, s in enumerate(self.steps)]
        return "\n".join(lines + [f"  outputs={self.outputs}"])


def const_array(shape: Shape, seed: int, fill: str = "rand", dtype: str = "float32") -> np.ndarray:
    if fill == "zero":
        return np.zeros(shape, dtype)
    if fill == "one":
        return np.ones(shape, dtype)
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def random_inputs(prog: Program, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = [tuple(prog.n if d == "n" else d for d in s) for s, _ in prog.inputs]
    return [np.asarray(rng.standard_normal(s)).astype(dt) for s, (_, dt) in zip(shapes, prog.inputs)]


# --- Relax ------------------------------------------------------------------------------

def _const(arr: np.ndarray) -> relax.Constant:
    """A constant of the array's own dtype (``relax.const`` turns float64 into float32)."""
    return relax.const(arr, str(arr.dtype))


_UNARY_RELAX = {
    "relu": relax.op.nn.relu, "tanh": relax.op.tanh, "sigmoid": relax.op.sigmoid,
    "negative": relax.op.negative, "abs": relax.op.abs, "exp": relax.op.exp,
    "silu": relax.op.nn.silu, "gelu": relax.op.nn.gelu, "square": relax.op.square,
    "sqrt_abs": lambda x: relax.op.sqrt(relax.op.abs(x)),
    "clip": lambda x: relax.op.clip(x, -1.0, 1.5),
}
_BINARY_RELAX = {
    "add": relax.op.add, "subtract": relax.op.subtract, "multiply": relax.op.multiply,
    "maximum": relax.op.maximum, "minimum": relax.op.minimum,
}


def _relax_step(step: Step, v: list, dtype_of: Any) -> Any:
    op, p = step.op, step.params
    a = v[step.args[0]] if step.args else None
    if op in _UNARY_RELAX:
        return _UNARY_RELAX[op](a)
    if op in _BINARY_RELAX or op == "divide":
        b = v[step.args[1]] if len(step.args) > 1 else _const(const_array(**p["const"]))
        if p.get("swap"):
            a, b = b, a
        if op == "divide":  # a / (|b| + 1): no division by ~0
            one = _const(np.ones((), dtype_of(b)))
            return relax.op.divide(a, relax.op.add(relax.op.abs(b), one))
        return _BINARY_RELAX[op](a, b)
    if op in ("sum", "mean", "max"):
        return getattr(relax.op, op)(a, axis=p["axes"], keepdims=p["keepdims"])
    if op == "softmax":
        return relax.op.nn.softmax(a, axis=p["axis"])
    if op == "log_softmax":
        return relax.op.nn.log_softmax(a, axis=p["axis"])
    if op == "written_softmax":
        e = relax.op.exp(relax.op.subtract(a, relax.op.max(a, axis=[p["axis"]], keepdims=True)))
        return relax.op.divide(e, relax.op.sum(e, axis=[p["axis"]], keepdims=True))
    if op == "written_layernorm":
        mu = relax.op.mean(a, axis=[-1], keepdims=True)
        d = relax.op.subtract(a, mu)
        var = relax.op.mean(relax.op.multiply(d, d), axis=[-1], keepdims=True)
        return relax.op.divide(d, relax.op.sqrt(relax.op.add(var, relax.const(np.float32(1e-5)))))
    if op in ("layer_norm", "rms_norm"):
        k = p["k"]
        axes = list(range(-k, 0))
        gamma = _const(const_array(**p["gamma"]))
        if op == "rms_norm":
            return relax.op.nn.rms_norm(a, gamma, axes=axes, epsilon=1e-5)
        beta = _const(const_array(**p["beta"]))
        return relax.op.nn.layer_norm(a, gamma, beta, axes=axes, epsilon=1e-5)
    if op == "matmul":
        b = v[step.args[1]] if len(step.args) > 1 else _const(const_array(**p["const"]))
        if p.get("transpose_rhs"):
            rank = len(p["rhs_shape"])
            perm = list(range(rank - 2)) + [rank - 1, rank - 2]
            b = relax.op.permute_dims(b, perm)
        return relax.op.matmul(a, b)
    if op == "conv2d":
        w = v[step.args[1]] if len(step.args) > 1 else _const(const_array(**p["const"]))
        return relax.op.nn.conv2d(a, w, strides=p["strides"], padding=p["padding"], groups=p["groups"])
    if op == "permute_dims":
        return relax.op.permute_dims(a, p["perm"])
    if op == "reshape":
        return relax.op.reshape(a, [_dim(d, v) for d in p["shape"]])
    if op == "strided_slice":
        return relax.op.strided_slice(a, [p["axis"]], [p["begin"]], [p["end"]], [p["stride"]])
    if op == "squeeze":
        return relax.op.squeeze(a, [p["axis"]])
    if op == "expand_dims":
        return relax.op.expand_dims(a, p["axis"])
    if op == "broadcast_to":
        return relax.op.broadcast_to(a, [_dim(d, v) for d in p["shape"]])
    if op == "astype":
        return relax.op.astype(a, p["dtype"])
    if op == "slice_scatter":
        src = relax.op.strided_slice(a, [p["axis"]], [p["begin"]], [p["end"]], [1])
        src = relax.op.multiply(src, relax.const(np.float32(2.0)))
        return relax.op.slice_scatter(a, src, p["begin"], p["end"], 1, p["axis"])
    raise ValueError(f"unknown op {op}")


_N = tirx.Var("n", "int64")


def _dim(d: Any, v: Any) -> Any:
    return _N if d == "n" else int(d)


def build_module(prog: Program) -> tvm.IRModule:
    """The program as a Relax module with one dataflow block (``main``)."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType([_dim(d, None) for d in s], dt)) for i, (s, dt) in
              enumerate(prog.inputs)]
    with bb.function("main", params):
        with bb.dataflow():
            values: list = list(params)

            def dtype_of(e: Any) -> str:
                return str(e.ty.dtype)

            for step in prog.steps:
                values.append(bb.emit(_relax_step(step, values, dtype_of)))
            outs = [values[i] for i in prog.outputs]
            out = bb.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


# --- numpy -------------------------------------------------------------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])
_UNARY_NP = {
    "relu": lambda x: np.maximum(x, 0), "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "negative": np.negative, "abs": np.abs, "exp": np.exp, "square": np.square,
    "silu": lambda x: x / (1 + np.exp(-x)), "gelu": lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))),
    "sqrt_abs": lambda x: np.sqrt(np.abs(x)), "clip": lambda x: np.clip(x, -1.0, 1.5),
}
_BINARY_NP = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply,
    "maximum": np.maximum, "minimum": np.minimum,
}


def _np_step(step: Step, v: list, n: int) -> Any:
    op, p = step.op, step.params
    a = v[step.args[0]] if step.args else None
    if op in _UNARY_NP:
        return _UNARY_NP[op](a.astype(np.float64)).astype(a.dtype)
    if op in _BINARY_NP or op == "divide":
        b = v[step.args[1]] if len(step.args) > 1 else const_array(**p["const"])
        if p.get("swap"):
            a, b = b, a
        if op == "divide":
            return (a.astype(np.float64) / (np.abs(b) + 1)).astype(a.dtype)
        return _BINARY_NP[op](a, b)
    axes = p.get("axes")
    if op in ("sum", "mean", "max"):
        return getattr(np, op)(a, axis=tuple(axes), keepdims=p["keepdims"]).astype(a.dtype)
    if op in ("softmax", "written_softmax", "log_softmax"):
        x = a.astype(np.float64)
        e = np.exp(x - x.max(axis=p["axis"], keepdims=True))
        s = e / e.sum(axis=p["axis"], keepdims=True)
        return (np.log(s) if op == "log_softmax" else s).astype(a.dtype)
    if op in ("layer_norm", "rms_norm", "written_layernorm"):
        k = p.get("k", 1)
        ax = tuple(range(a.ndim - k, a.ndim))
        x = a.astype(np.float64)
        if op == "rms_norm":
            y = x / np.sqrt(np.mean(x * x, axis=ax, keepdims=True) + 1e-5)
            return (y * const_array(**p["gamma"])).astype(a.dtype)
        y = (x - x.mean(axis=ax, keepdims=True)) / np.sqrt(x.var(axis=ax, keepdims=True) + 1e-5)
        if op == "layer_norm":
            y = y * const_array(**p["gamma"]) + const_array(**p["beta"])
        return y.astype(a.dtype)
    if op == "matmul":
        b = v[step.args[1]] if len(step.args) > 1 else const_array(**p["const"])
        if p.get("transpose_rhs"):
            b = np.swapaxes(b, -1, -2)
        return np.matmul(a.astype(np.float64), b).astype(a.dtype)
    if op == "permute_dims":
        return np.transpose(a, p["perm"])
    if op in ("reshape", "broadcast_to"):
        shape = [n if d == "n" else d for d in p["shape"]]
        return np.reshape(a, shape) if op == "reshape" else np.broadcast_to(a, shape)
    if op == "strided_slice":
        idx = [slice(None)] * a.ndim
        idx[p["axis"]] = slice(p["begin"], p["end"], p["stride"])
        return a[tuple(idx)]
    if op == "squeeze":
        return np.squeeze(a, p["axis"])
    if op == "expand_dims":
        return np.expand_dims(a, p["axis"])
    if op == "astype":
        return a.astype(p["dtype"])
    if op == "slice_scatter":
        out = a.copy()
        idx = [slice(None)] * a.ndim
        idx[p["axis"]] = slice(p["begin"], p["end"])
        out[tuple(idx)] = a[tuple(idx)] * np.float32(2.0)
        return out
    return None  # conv2d: no numpy meaning here; the TVM reference covers it


def eval_numpy(prog: Program, inputs: list[np.ndarray]) -> list[np.ndarray] | None:
    values: list = list(inputs)
    for step in prog.steps:
        out = _np_step(step, values, prog.n)
        if out is None:
            return None
        values.append(np.asarray(out))
    return [values[i] for i in prog.outputs]
