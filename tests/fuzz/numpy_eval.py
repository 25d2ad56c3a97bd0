"""The numpy meaning of a ``Program``: an oracle independent of TVM.

Each op is computed in float64 from the operands and rounded to the step's dtype once,
so its result is the correctly rounded IEEE value up to float64 error: signed zeros,
infinities and NaN come out as IEEE says (which TVM's own build does not always honour,
see ``check.py``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .program import Program, Step, concrete_shape, const_array, index_array, output_indices

_erf = np.vectorize(math.erf, otypes=[np.float64])
_UNARY = {
    "relu": lambda x: np.maximum(x, 0), "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "negative": np.negative, "abs": np.abs, "exp": np.exp, "square": np.square,
    "silu": lambda x: x / (1 + np.exp(-x)), "gelu": lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))),
    "sqrt_abs": lambda x: np.sqrt(np.abs(x)), "clip": lambda x: np.clip(x, -1.0, 1.5),
    "reciprocal": lambda x: 1.0 / x,
}
_BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
    "minimum": np.minimum, "div": np.divide, "divide": lambda a, b: a / (np.abs(b) + 1),
}


def _f64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64)


def _operand(step: Step, v: list, key: str = "const") -> np.ndarray:
    return v[step.args[1]] if len(step.args) > 1 else const_array(**step.params[key])


def conv2d(x: np.ndarray, w: np.ndarray, strides: list[int], padding: list[int], groups: int) -> np.ndarray:
    """NCHW x OIHW, symmetric padding [ph, pw], in float64."""
    (sh, sw), (ph, pw) = strides, padding
    nb, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh, ow = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    xp = np.pad(_f64(x), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out = np.zeros((nb, o, oh, ow))
    og = o // groups
    for g in range(groups):
        xs, ws = xp[:, g * cg:(g + 1) * cg], _f64(w[g * og:(g + 1) * og])
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out


def batch_norm(x: np.ndarray, p: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TVM's meaning (topi.nn.batch_norm): ``training`` normalizes with the batch's own mean
    and biased variance and returns the momentum-updated moving stats; otherwise the moving
    stats normalize and come back unchanged."""
    axis = p["axis"] % x.ndim
    gamma, beta, mm, mv = (_f64(const_array(**p[k])) for k in ("gamma", "beta", "mean", "var"))
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    xf = _f64(x)
    if p["training"]:
        red = tuple(i for i in range(x.ndim) if i != axis)
        mean, var = xf.mean(axis=red), xf.var(axis=red)
        m = p["momentum"]
        new_mean, new_var = (1 - m) * mm + m * mean, (1 - m) * mv + m * var
    else:
        mean, var, new_mean, new_var = mm, mv, mm, mv
    out = (xf - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + p["eps"])
    if p["scale"]:
        out = out * gamma.reshape(shape)
    if p["center"]:
        out = out + beta.reshape(shape)
    return tuple(a.astype(x.dtype) for a in (out, new_mean, new_var))


def _norm(step: Step, a: np.ndarray) -> np.ndarray:
    op, p = step.op, step.params
    x = _f64(a)
    if op in ("softmax", "written_softmax", "log_softmax"):
        e = np.exp(x - x.max(axis=p["axis"], keepdims=True))
        s = e / e.sum(axis=p["axis"], keepdims=True)
        return np.log(s) if op == "log_softmax" else s
    ax = tuple(range(a.ndim - p.get("k", 1), a.ndim))
    if op == "rms_norm":
        return x / np.sqrt(np.mean(x * x, axis=ax, keepdims=True) + 1e-5) * const_array(**p["gamma"])
    y = (x - x.mean(axis=ax, keepdims=True)) / np.sqrt(x.var(axis=ax, keepdims=True) + 1e-5)
    if op == "layer_norm":
        y = y * const_array(**p["gamma"]) + const_array(**p["beta"])
    return y


def _along(idx: np.ndarray, axis: int, shape: tuple) -> tuple:
    """ONNX's *_elements addressing: element i of ``idx`` names position ``idx[i]`` along
    ``axis`` and i elsewhere (``idx`` may be smaller than the data in every dim)."""
    axis %= len(shape)
    where = list(np.indices(idx.shape, sparse=True))
    where[axis] = idx % shape[axis]
    return tuple(where)


def _index(step: Step, a: np.ndarray, v: list) -> np.ndarray:
    op, p = step.op, step.params
    idx = index_array(**p["indices"])
    if op == "gather_elements":
        return a[_along(idx, p["axis"], a.shape)]
    if op == "gather_nd":
        return a[tuple(np.moveaxis(idx, -1, 0))]
    if op == "take":
        return np.take(a, idx, axis=p["axis"], mode=p["mode"] if p["mode"] != "fast" else "raise")
    updates = _operand(step, v, "updates")
    out = _f64(a)
    if op == "scatter_elements":
        where = _along(idx, p["axis"], a.shape)
    else:
        where = tuple(np.moveaxis(idx, -1, 0))
    if p["reduction"] == "add":
        np.add.at(out, where, _f64(updates))
    else:
        out[where] = updates
    return out


def _view(step: Step, a: np.ndarray, n: int) -> np.ndarray:
    op, p = step.op, step.params
    if op == "permute_dims":
        return np.transpose(a, p["perm"])
    if op == "reshape":
        return np.reshape(a, concrete_shape(p["shape"], n))
    if op == "broadcast_to":
        return np.broadcast_to(a, concrete_shape(p["shape"], n))
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
    raise ValueError(f"unknown op {op}")


def _np_step(step: Step, v: list, n: int) -> Any:
    """The step's value: rounded to the dtype of its first operand unless it is a view or cast."""
    op, p = step.op, step.params
    a = v[step.args[0]]
    if op == "batch_norm":
        return batch_norm(a, p)
    if op == "item":
        return a[p["index"]]
    if op in _UNARY:
        out = _UNARY[op](_f64(a))
    elif op in _BINARY:
        b = _operand(step, v)
        x, y = (b, a) if p.get("swap") else (a, b)
        out = _BINARY[op](_f64(x), _f64(y))
    elif op in ("sum", "mean", "max"):
        out = getattr(np, op)(_f64(a), axis=tuple(p["axes"]), keepdims=p["keepdims"])
    elif op in ("softmax", "log_softmax", "written_softmax", "written_layernorm", "layer_norm", "rms_norm"):
        out = _norm(step, a)
    elif op == "matmul":
        b = _operand(step, v)
        out = np.matmul(_f64(a), _f64(np.swapaxes(b, -1, -2) if p.get("transpose_rhs") else b))
    elif op == "conv2d":
        w = _operand(step, v)
        if p.get("layout") == "NHWC":  # NHWC x HWIO: the same conv on transposed operands
            out = conv2d(a.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), p["strides"], p["padding"],
                         p["groups"]).transpose(0, 2, 3, 1)
        else:
            out = conv2d(a, w, p["strides"], p["padding"], p["groups"])
    elif op == "prelu":
        alpha = _operand(step, v, "alpha")
        shape = [1] * a.ndim
        shape[p["axis"]] = -1
        out = np.where(a > 0, _f64(a), _f64(a) * _f64(alpha).reshape(shape))
    elif op == "concat":
        out = np.concatenate([v[i] for i in step.args], axis=p["axis"])
    elif op in ("gather_elements", "gather_nd", "take", "scatter_elements", "scatter_nd"):
        out = _index(step, a, v)
    elif op == "slice_scatter":
        out = _f64(a)
        idx = [slice(None)] * a.ndim
        idx[p["axis"]] = slice(p["begin"], p["end"])
        out[tuple(idx)] = out[tuple(idx)] * 2.0
    else:
        return _view(step, a, n)
    return np.asarray(out).astype(a.dtype)


def eval_numpy(prog: Program, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The outputs, flattened depth first (as ``check.flatten`` flattens the builds')."""
    values: list = list(inputs)
    with np.errstate(all="ignore"):
        for step in prog.steps:
            values.append(_np_step(step, values, prog.n))
    return [np.asarray(values[i]) for i in output_indices(prog.outputs)]
