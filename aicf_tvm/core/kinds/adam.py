"""The Adam kinds: ``adam_step`` (one parameter) and ``fused_adam_step`` (all of them, in place).

``adam_step`` reads the gradient G and the two bias-correction terms ``1 - β1^t`` and
``1 - β2^t`` (rank-0 tensors: they change every step) and updates the parameter P and
the moments M, V. Its contract says so with effects (P, M, V = ReadWrite, G = Read;
docs/design.md §3): the Emit may overwrite P, M and V, and whoever runs it must not read their
old values afterwards. ``fused_adam_step`` is the multi-tensor kernel: one PrimFunc
that updates every P, M, V in its own buffer (``call_tir_inplace``), legal only when
the written buffers are pairwise NoAlias with every other port.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from types import ModuleType

import numpy as np
from tvm import relax, tirx

from ..contract import ContractFacts, EmitContract, PortFacts
from ..emit import Emit, Interface, Port
from ..kinds.describe import type_shape
from ..lattice import (
    READ,
    READWRITE,
    WRITE,
    Alias,
    NumericFact,
)

ADAM_KINDS = ("adam_step", "fused_adam_step")
ADAM_PORTS = ("param", "grad", "m", "v", "bias1", "bias2")  # bias_i = 1 - beta_i ** step
WRITTEN = ("param", "m", "v")
OUT_OF = {"param": 0, "m": 1, "v": 2}  # output index of each updated port
ATTRS = ("lr", "beta1", "beta2", "one_minus_beta1", "one_minus_beta2", "eps", "weight_decay")
# Function attr by which a caller asserts its tensor inputs (tuples flattened) are pairwise
# distinct buffers, e.g. donated ones; ``compile_optimizer_step`` checks it at every call.
DISTINCT_INPUTS_ATTR = "aicf.distinct_inputs"
SMALL = 1 << 14  # below this many elements a parallel loop costs more than it saves
GPU_THREADS = 256  # threads per block of the GPU kernel


def adam_step_emit(param_ty: relax.TensorType, scalar_ty: relax.TensorType, attrs: dict[str, float],
                   asserted: ContractFacts | None = None) -> Emit:
    """The Emit of one parameter's update (the contract template of ADAM_STEP_CONTRACT)."""
    dtype, ndim = str(param_ty.dtype), int(param_ty.ndim)
    tys = {"param": param_ty, "grad": param_ty, "m": param_ty, "v": param_ty,
           "bias1": scalar_ty, "bias2": scalar_ty}
    inputs = tuple(Port(n, dtype, ndim if n not in ("bias1", "bias2") else 0) for n in ADAM_PORTS)
    outputs = tuple(Port(f"out.{j}", dtype, ndim) for j in range(3))
    provides = {n: PortFacts(effect=READWRITE if n in WRITTEN else READ, shape=type_shape(tys[n]))
                for n in ADAM_PORTS}
    for p in outputs:
        provides[p.name] = PortFacts(effect=WRITE, shape=type_shape(param_ty), numeric=NumericFact.exact(dtype))
    contract = EmitContract(provides=ContractFacts.of(provides))
    return Emit("adam_step", attrs, Interface(inputs, outputs), contract, asserted=asserted or ContractFacts())


def fused_emit(steps: Sequence[Emit], alias: dict[tuple[str, str], Alias]) -> Emit:
    """The fused Emit over ``steps`` (ports ``<port><k>``), with the proven alias facts."""
    inputs, outputs, provides = [], [], {}
    for k, step in enumerate(steps):
        for port in step.interface.inputs:
            inputs.append(Port(f"{port.name}{k}", port.dtype, port.ndim))
            provides[f"{port.name}{k}"] = step.contract.provides.port(port.name)
        for j, port in enumerate(step.interface.outputs):
            name = f"out.{3 * k + j}"
            outputs.append(Port(name, port.dtype, port.ndim))
            provides[name] = step.contract.provides.port(port.name)
    contract = EmitContract(provides=ContractFacts.of(provides, alias))
    return Emit("fused_adam_step", steps[0].attrs, Interface(tuple(inputs), tuple(outputs)), contract)


def adam_step_function(param_ty: relax.TensorType, scalar_ty: relax.TensorType, attrs: dict[str, float],
                       emit: Emit) -> relax.Function:
    """The private ``adam_step`` Emit function: the update written with Relax ops (pure)."""
    dtype = str(param_ty.dtype)
    params = [relax.Var(n, scalar_ty if n.startswith("bias") else param_ty) for n in ADAM_PORTS]
    p, g, m, v, b1, b2 = params
    c = {k: relax.const(float(attrs[k]), dtype) for k in ATTRS}
    op = relax.op
    bb = relax.BlockBuilder()
    with bb.function("adam_step", params, attrs={"Primitive": True, "aicf.emit": emit.to_attr()}, private=True):
        with bb.dataflow():
            if attrs["weight_decay"]:
                g = bb.emit(op.add(op.multiply(c["weight_decay"], p), g))
            m_new = bb.emit(op.add(op.multiply(c["beta1"], m), op.multiply(c["one_minus_beta1"], g)))
            v_new = bb.emit(op.add(op.multiply(c["beta2"], v), op.multiply(c["one_minus_beta2"], op.multiply(g, g))))
            denom = op.add(op.sqrt(op.divide(v_new, b2)), c["eps"])
            p_new = bb.emit(op.subtract(p, op.multiply(c["lr"], op.divide(op.divide(m_new, b1), denom))))
            out = bb.emit_output(relax.Tuple([p_new, m_new, v_new]))
        bb.emit_func_output(out)
    return bb.finalize()["adam_step"]


def fused_adam_kernel(shapes: Sequence[tuple[int, ...]], dtype: str, attrs: dict[str, float],
                      name: str = "fused_adam_step", gpu: bool = False) -> tirx.PrimFunc:
    """ONE PrimFunc updating every (P, M, V) in place; params per tensor: P, G, M, V, bias1, bias2.

    Each tensor is walked as a flat buffer over its own data (a view, no copy); M and V
    are stored first and P's update reads them back, as the Relax formula does. On the
    CPU a tensor's loop is parallel (from ``SMALL`` elements); with ``gpu`` it is bound to
    ``GPU_THREADS``-thread blocks, one launch per tensor (a loop left unbound would run on
    the host, on device memory).
    """
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    def c(key: str) -> tirx.FloatImm:
        return tirx.const(float(attrs[key]), dtype)

    with IRBuilder() as ib, T.prim_func():
        T.func_name(name)
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        args = [[T.arg(f"{n}{k}", T.Buffer(shape if not n.startswith("bias") else (), dtype))
                 for n in ADAM_PORTS] for k, shape in enumerate(shapes)]
        for shape, (p, g, m, v, b1, b2) in zip(shapes, args):
            n = int(np.prod(shape, dtype=np.int64))
            fp, fg, fm, fv = (T.decl_buffer((n,), dtype, data=b.data) for b in (p, g, m, v))
            with _flat_loop(T, n, gpu) as i:
                gi = fg[i] + c("weight_decay") * fp[i] if attrs["weight_decay"] else fg[i]
                T.buffer_store(fm, c("beta1") * fm[i] + c("one_minus_beta1") * gi, [i])
                T.buffer_store(fv, c("beta2") * fv[i] + c("one_minus_beta2") * (gi * gi), [i])
                step = (fm[i] / b1[()]) / (T.sqrt(fv[i] / b2[()]) + c("eps"))
                T.buffer_store(fp, fp[i] - c("lr") * step, [i])
    return ib.get()


@contextlib.contextmanager
def _flat_loop(T: ModuleType, n: int, gpu: bool) -> Iterator[tirx.Var]:
    """The loop over ``range(n)``: CPU-parallel, serial, or GPU blocks x threads with a guard."""
    if not gpu:
        with (T.parallel if n >= SMALL else T.serial)(0, n) as i:
            yield i
        return
    blocks = -(-n // GPU_THREADS)
    with T.thread_binding(0, blocks, "blockIdx.x") as bx, T.thread_binding(0, GPU_THREADS, "threadIdx.x") as tx:
        i = bx * GPU_THREADS + tx
        with T.If(i < n), T.Then():
            yield i


__all__ = ["ADAM_KINDS", "ADAM_PORTS", "ATTRS", "DISTINCT_INPUTS_ATTR", "WRITTEN", "adam_step_emit",
           "adam_step_function", "fused_adam_kernel", "fused_emit"]
