"""IEEE float arithmetic in CPU kernels: no real-number algebra, no unasked-for contraction.

Two parts of TVM's CPU build treat float arithmetic as if it were real arithmetic:

* the TIR simplifier (``StmtSimplify`` in the lowering pipeline, and the constant folding
  of the expression builders) rewrites ``(x + y) - y`` to ``x``, ``x + y - x`` to ``y``,
  ``x - x`` and ``x * y - x * y`` to ``0`` and ``(x + c) - c`` to ``x``: wrong for
  rounding (the ``(x + 12582912) - 12582912`` rounding trick), overflow to inf, NaN and
  signed zeros.  One kernel per op never shows it; once a schedule inlines a chain of
  elementwise ops into one block, it does;
* contraction: ``LowerIntrin`` turns every float ``a * b + c`` into ``fma`` and TVM's LLVM
  target machine allows ``FPOpFusion::Fast``, so ``x - floor(x / y) * y`` (float
  ``floor_mod``) and ``a * b - a * b`` became one fused multiply-add: one rounding instead of
  two (``floor_mod(1e10, 3)`` gave 256, ``a * b - a * b`` at ``a = b = 3e38`` gave -inf).

``IEEEArithmetic`` runs last in ``aicf_tvm.driver.pipeline.schedule`` (and in the tuning
build), after the schedules, on kernels for LLVM targets.  It replaces each float32/float64
``+ - * /`` (and float ``floordiv``/``floormod``, spelled out as TVM lowers them) by a call
of an op of our own (``aicf.ieee_add`` ...) that the simplifier cannot look into; TVM's
``LowerIntrin``, the last pass before code generation, turns each call back into the plain
operation (``lower``), and a product into a product behind ``llvm.arithmetic.fence``, so
neither ``LowerIntrin``'s FMA rule nor LLVM's contraction can merge it into an add.

Contraction stays where the Emit's numeric contract allows it (docs/numerics.md): in the
multiply-accumulate update ``C = C + A * B`` of a reduction block of a dot-product Emit
(``CONTRACTING_KINDS``: matmul, einsum, convolutions, and the fused GEMM, convolution and
attention kernels), and in a kernel the GEMM or convolution rule scheduled, where the
product reads two distinct buffers (a matmul inside a generic group).  A matrix product is
defined as a sum of products in no stated order and
with no stated rounding of each product, as BLAS, MLAS and oneDNN compute it with FMA; a
graph's separate ``multiply`` and ``add``, or a ``sum`` of an elementwise product, each round.

Sound: each call lowers to exactly the operation it replaced, so the kernel computes what
the graph's ops compute, with one IEEE rounding per op; the fence changes no value.  Integer
arithmetic (indices) is left to the simplifier.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.ir import Expr
from tvm.ir import op as ir_op
from tvm.target import Target

from .gemm_analysis import strip_cast
from .llvm_pass import llvm_prim_func_pass, register_sealed_op

# Emits whose reduction blocks are dot products (docstring).
CONTRACTING_KINDS = frozenset({
    "matmul", "einsum", "conv1d", "conv2d", "conv3d", "conv1d_transpose", "conv2d_transpose",
    "conv3d_transpose", "fused_gemm_bias_act", "fused_conv2d_bias_act", "fused_attention",
})
SEALED_DTYPES = ("float32", "float64")
FENCE = "llvm.arithmetic.fence"

_NODES = {tirx.Add: "add", tirx.Sub: "sub", tirx.Mul: "mul", tirx.Div: "div"}
_OPS = {name: f"aicf.ieee_{name}" for name in _NODES.values()}


def _fenced(value: Expr) -> Expr:
    return tirx.call_llvm_pure_intrin(value.ty, FENCE, value)


def _lower(name: str):
    node = {v: k for k, v in _NODES.items()}[name]

    def lower(call: tirx.Call) -> Expr:
        value = node(call.args[0], call.args[1])  # the node itself: no constant folding
        return _fenced(value) if name == "mul" else value

    return lower


def _llvm_copysign(call: tirx.Call) -> Expr:
    return tirx.call_llvm_pure_intrin(call.ty, "llvm.copysign", call.args[0], call.args[1])


def _register() -> None:
    # TVM's vectorizer scalarizes a vector loop that calls an op without this flag and
    # leaves the loop to LLVM's loop vectorizer, which does not vectorize the fence.  isnan
    # and copysign (VectorizeMath's expansions, NaNExactComparisons) are one instruction
    # per lane: an unordered compare, LLVM's copysign (not libm's, TVM's default lowering).
    # nearbyint (what TVM lowers ``round`` to: round half to even) is one instruction per
    # vector; without the flag its sealed operand (a QDQ requantization's scale product)
    # was computed lane by lane.
    ir_op.register_op_attr("tirx.isnan", "TVectorizable", True)
    ir_op.register_op_attr("tirx.nearbyint", "TVectorizable", True)
    ir_op.register_op_attr("tirx.copysign", "TVectorizable", True)
    tirx.register_intrin_lowering("tirx.copysign", "llvm", f=_llvm_copysign, level=99)
    for name, op_name in _OPS.items():
        register_sealed_op(op_name, _lower(name))


_register()


def _is_sealed_dtype(expr: Expr) -> bool:
    return str(expr.ty).split("x")[0] in SEALED_DTYPES


def _call(name: str, a: Expr, b: Expr) -> Expr:
    return tirx.call_intrin(a.ty, _OPS[name], a, b)


def accumulated_products(func: tirx.PrimFunc, two_operands: bool = False) -> list[Expr]:
    """The updates ``C[i] + A * B`` (either operand order) of the reduction blocks of
    ``func``, and their products: where a dot product accumulates.  Both stay plain TIR:
    the GEMM rule's ``PrefetchNextPanel`` rewrites only a K loop that calls nothing.
    ``two_operands``: only where the product reads two distinct buffers, neither the
    accumulator, as the GEMM rule's matmul block does (``gemm_analysis
    .is_multiply_accumulate``), for a kernel the GEMM rule scheduled whose Emit is a generic
    group (``fused_reduce_epilogue``: a matmul with a SwiGLU epilogue); an RMS norm's
    ``acc + x * x`` there stays sealed."""
    found: list[Expr] = []

    def visit(node: s_tir.SBlock) -> None:
        if not any(iv.iter_type == tirx.IterVar.CommReduce for iv in node.iter_vars):
            return
        store = node.body
        if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tirx.Add):
            return
        for acc, prod in ((store.value.a, store.value.b), (store.value.b, store.value.a)):
            acc = strip_cast(acc)
            if (isinstance(acc, ir.TensorLoad) and acc.source.same_as(store.buffer)
                    and isinstance(prod, tirx.Mul)
                    and (not two_operands or _two_operands(prod, store.buffer))):
                found.extend([store.value, prod])

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, visit)])
    return found


def _two_operands(prod: tirx.Mul, acc: object) -> bool:
    a, b = strip_cast(prod.a), strip_cast(prod.b)
    return (isinstance(a, ir.TensorLoad) and isinstance(b, ir.TensorLoad)
            and not a.source.same_as(b.source)
            and not a.source.same_as(acc) and not b.source.same_as(acc))


def _gemm_scheduled(func: tirx.PrimFunc) -> bool:
    """Whether a GEMM or convolution rule scheduled ``func`` (or a record tuned from one):
    its anchor block was a matrix product."""
    rule = func.attrs.get("aicf.schedule") if func.attrs is not None else None
    return rule is not None and any(name in str(rule) for name in ("Gemm", "Conv"))


def _contracting(func: tirx.PrimFunc) -> bool:
    kind = func.attrs.get("aicf.kind") if func.attrs is not None else None
    return kind is not None and str(kind) in CONTRACTING_KINDS


def ieee_arithmetic(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its float arithmetic sealed (module docstring); the accumulated
    products of a dot-product Emit stay plain, free to contract."""
    if _contracting(func):
        keep = accumulated_products(func)
    elif _gemm_scheduled(func):
        keep = accumulated_products(func, two_operands=True)
    else:
        keep = []

    def binary(node: Expr) -> Expr:
        if not _is_sealed_dtype(node) or any(node.same_as(k) for k in keep):
            return node
        return _call(_NODES[type(node)], node.a, node.b)

    def floordiv(node: tirx.FloorDiv) -> Expr:
        if not _is_sealed_dtype(node):
            return node
        return tirx.floor(_call("div", node.a, node.b))

    def floormod(node: tirx.FloorMod) -> Expr:  # a - floor(a / b) * b, as LowerIntrin has it
        if not _is_sealed_dtype(node):
            return node
        quotient = tirx.floor(_call("div", node.a, node.b))
        return _call("sub", node.a, _call("mul", quotient, node.b))

    rules = [(t, binary) for t in _NODES] + [(tirx.FloorDiv, floordiv), (tirx.FloorMod, floormod)]
    return tvm_ffi.structural_map(func, rules)


def IEEEArithmetic(target: Target | None = None) -> tvm.transform.Pass:
    """PrimFunc pass applying ``ieee_arithmetic`` to the PrimFuncs compiled for an LLVM
    target (the PrimFunc's ``target`` attr, else ``target``, else ``with target:``)."""
    return llvm_prim_func_pass(ieee_arithmetic, target, "IEEEArithmetic")
