"""The models of a device-check bundle (``scripts/gpu_bundle.py``), weights as inputs.

Each model's weights are inputs of ``main`` with a recipe (``bundle_runner.generate``:
a stream of the bundle's seed, ``loc + scale * N(0, 1)``), so that the target host
rebuilds them instead of receiving them. The built-in layers have their bound weights
lifted back to inputs (``lift_weights``); the convnet and the Adam step take them as
inputs to begin with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from aicf_tvm.driver.optimizer import adam_function, adam_state
from scripts import bundle_runner as runner
from scripts.harness import HYPER, MLP_SHAPES

SEED = 0


@dataclass
class Bundled:
    """One model of the bundle: its Relax module (weights as inputs) and input recipe."""

    name: str
    mod: tvm.IRModule
    inputs: list[dict]  # {"name", "array"} shipped, or {"name", "shape", "loc", "scale"} generated
    twin: dict | None = None
    kind: str = "model"
    extra: dict = field(default_factory=dict)


class Streams:
    """Distinct generator streams for every generated array of the bundle."""

    def __init__(self) -> None:
        self.next = 0

    def spec(self, name: str, shape: tuple, loc: float = 0.0, scale: float = 1.0) -> dict:
        self.next += 1
        return {"name": name, "shape": [int(d) for d in shape], "dtype": "float32", "loc": loc,
                "scale": scale, "stream": self.next}


def _activation(shape: tuple, stream: int) -> np.ndarray:
    return np.random.default_rng([SEED, 1 << 30, stream]).standard_normal(shape).astype(np.float32)


def _key(value: np.ndarray) -> tuple:
    return value.shape, str(value.dtype), runner.digest([value])


@mutator
class _LiftWeights(PyExprMutator):
    """Replaces each constant whose bytes are a named weight by a variable of that name."""

    def __init__(self, names: dict[tuple, str]) -> None:
        super().__init__()
        self.names, self.vars = names, {}

    def visit_generic_const_(self, op: Any) -> Any:
        name = self.names.get(_key(op.value.numpy())) if hasattr(op.value, "numpy") else None
        if name is None:
            return op
        return self.vars.setdefault(name, relax.Var(name, op.ty))


def lift_weights(mod: tvm.IRModule, weights: dict[str, np.ndarray]) -> tuple[tvm.IRModule, list[str]]:
    """``main`` with its bound weights turned back into inputs after the original ones, in
    the order of ``weights``; returns the module and the lifted names."""
    names = {_key(v): n for n, v in weights.items()}
    if len(names) != len(weights):
        raise SystemExit("two weights have the same bytes: cannot tell them apart by value")
    func = mod["main"]
    lifter = _LiftWeights(names)
    body = lifter.visit_expr(func.body)
    lifted = [n for n in weights if n in lifter.vars]
    if len(lifted) != len(weights):
        raise SystemExit(f"weights not found as constants: {sorted(set(weights) - set(lifted))}")
    params = list(func.params) + [lifter.vars[n] for n in lifted]
    return tvm.IRModule({"main": relax.Function(params, body, func.ret_ty, func.is_pure, func.attrs)}), lifted


def transformer(name: str, build: Any, heads: int, streams: Streams) -> Bundled:
    """A built-in layer with its weights lifted to inputs, drawn as the model draws them
    (projections ~ N(0, 0.02²), norm scales ~ 1 + N(0, 0.02²))."""
    mod, weights = build(return_params=True)
    mod, names = lift_weights(mod, weights)
    x = mod["main"].params[0]
    inputs = [{"name": x.name, "array": _activation(tuple(int(d) for d in x.ty.shape.values), streams.next)}]
    inputs += [streams.spec(n, weights[n].shape, 1.0 if n.endswith("norm.weight") else 0.0, 0.02) for n in names]
    return Bundled(name, mod, inputs, {"kind": name, "args": {"heads": heads}})


def convnet(streams: Streams, batch: int = 8, size: int = 64, stages: tuple = (32, 64, 128)) -> Bundled:
    """``bundle_runner.convnet_twin`` in Relax, He-initialized, every weight an input."""
    bb = relax.BlockBuilder()
    ty = relax.TensorType
    x = relax.Var("x", ty((batch, 3, size, size), "float32"))
    params, inputs = [x], [{"name": "x", "array": _activation((batch, 3, size, size), streams.next)}]

    def weight(name: str, shape: tuple, scale: float) -> relax.Var:
        var = relax.Var(name, ty(shape, "float32"))
        params.append(var)
        inputs.append(streams.spec(name, shape, 0.0, scale))
        return var

    def conv(y: Any, name: str, cin: int, cout: int, stride: int = 1) -> Any:
        w = weight(f"{name}.weight", (cout, cin, 3, 3), float(np.sqrt(2.0 / (9 * cin))))
        b = weight(f"{name}.bias", (cout,), 0.01)
        y = relax.op.nn.conv2d(y, w, strides=stride, padding=1)
        return relax.op.add(y, relax.op.reshape(b, (1, cout, 1, 1)))

    relu = relax.op.nn.relu
    with bb.function("main"):  # the parameters are known once the body is built
        with bb.dataflow():
            y = bb.emit(relu(conv(x, "stem", 3, stages[0])))
            for i, width in enumerate(stages):
                inner = bb.emit(relu(conv(y, f"block{i}.conv1", width, width)))
                y = bb.emit(relu(relax.op.add(conv(inner, f"block{i}.conv2", width, width), y)))
                if i + 1 < len(stages):
                    y = bb.emit(relu(conv(y, f"down{i}", width, stages[i + 1], stride=2)))
            pooled = bb.emit(relax.op.mean(y, axis=[2, 3]))
            fc_w = weight("fc.weight", (10, stages[-1]), float(1 / np.sqrt(stages[-1])))
            fc_b = weight("fc.bias", (10,), 0.01)
            out = bb.emit_output(relax.op.add(relax.op.matmul(pooled, relax.op.permute_dims(fc_w)), fc_b))
        bb.emit_func_output(out, params=params)
    return Bundled("convnet", bb.get(), inputs, {"kind": "convnet", "args": {"stages": list(stages)}})


def adam(streams: Streams) -> Bundled:
    func = adam_function(MLP_SHAPES, **HYPER)
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    inputs = [streams.spec(f"param{i}", s) for i, s in enumerate(MLP_SHAPES)]
    inputs += [streams.spec(f"grad{i}", s) for i, s in enumerate(MLP_SHAPES)]
    inputs += [{"name": f"state{i}", "shape": list(a.shape), "dtype": str(a.dtype), "fill": a.flat[0].item()}
               for i, a in enumerate(adam_state(MLP_SHAPES))]
    return Bundled("adam_step", mod, inputs, kind="optimizer",
                   extra={"tensors": len(MLP_SHAPES), "hyper": {**HYPER, "betas": list(HYPER["betas"])}})


def arrays_of(model: Bundled) -> list[np.ndarray]:
    return [s["array"] if "array" in s else runner.generate(s, SEED) for s in model.inputs]
