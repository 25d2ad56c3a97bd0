"""The kind registry covers every op of the light ONNX models and built-in models, and
puts every op whose kernel FuseTIR cannot merge in a category that is never fused."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, s_tir

import aicf_tvm
from aicf_tvm import KindRegistrationError, emit_of, verify_contracts
from aicf_tvm.core.emit_table import emit_calls
from aicf_tvm.core.kinds import OPAQUE_RULE, registered_ops, registry, rule_for, table
from aicf_tvm.core.kinds.registry import (
    BROADCAST,
    ELEMENTWISE,
    EXTERN,
    INJECTIVE,
    REDUCTION,
    SCAN,
    register,
)
from aicf_tvm.core.lattice import Effect
from aicf_tvm.driver.explainer import lift_and_propagate
from aicf_tvm.driver.frontends import from_onnx
from aicf_tvm.driver.models import BUILTIN_MODELS
from relax_passes import LiftEmits
from relax_passes.generic_groups import ANCHORS as _ANCHORS
from relax_passes.generic_groups import CHAINABLE as _CHAINABLE

from ...conftest import LIGHT_MODELS, light_model_path


def _opaque(mod: tvm.IRModule) -> list[str]:
    return [f"{v.name} <- {e.op}" for v, _, e in emit_calls(mod) if e.kind == "opaque"]


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_onnx_model_lifts_with_no_opaque_emit(name):
    mod = lift_and_propagate(from_onnx(light_model_path(name)))
    verify_contracts(mod)
    assert emit_calls(mod), "no Emit was lifted"
    assert _opaque(mod) == []


@pytest.mark.parametrize("name", ["encoder_layer", "decoder_block"])
def test_builtin_model_lifts_with_no_opaque_emit(name):
    mod = lift_and_propagate(BUILTIN_MODELS[name]())
    verify_contracts(mod)
    kinds = {e.kind for _, _, e in emit_calls(mod)}
    assert {"matmul", "softmax", "permute_dims", "reshape"} <= kinds
    assert ("layer_norm" in kinds) if name == "encoder_layer" else ({"rms_norm", "silu"} <= kinds)
    assert _opaque(mod) == []


def test_unknown_op_lifts_opaque_with_weakest_contract():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.unique(x, sorted=True))  # no registry entry
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = LiftEmits()(bb.get())
    [(_, _, emit)] = emit_calls(mod)
    assert rule_for("relax.unique") is OPAQUE_RULE
    assert emit.kind == "opaque" and emit.op == "relax.unique"
    for port in emit.interface.port_names():
        facts = emit.contract.provides.port(port)
        assert facts.effect == Effect.top()
        assert facts.numeric.is_top()
    verify_contracts(mod)


def test_single_function_per_identical_emit():
    mod = lift_and_propagate(BUILTIN_MODELS["encoder_layer_small"]())
    funcs = [gv for gv, f in mod.functions_items() if isinstance(f, relax.Function) and emit_of(f)]
    assert len(funcs) < len(emit_calls(mod))  # the four q/k/v/o projections share functions


def _var(shape, dtype="float32", name="x"):
    return relax.Var(name, relax.TensorType(shape, dtype))


_X, _U = _var((4, 6)), _var((4, 6), name="u")
_IDX = _var((4, 6), "int64", "idx")
# one call per op whose TOPI kernel indexes by data, reduces, sorts or scatters: the ops
# whose lowering may be te.extern / ir_builder code rather than a te.compute
_SAMPLES = {
    "concat": lambda: relax.op.concat([_X, _U], axis=0),
    "split": lambda: relax.op.split(_X, 2, axis=1),
    "take": lambda: relax.op.take(_X, _var((3,), "int64", "t"), axis=0),
    "tile": lambda: relax.op.tile(_X, [2, 1]),
    "repeat": lambda: relax.op.repeat(_X, 2, axis=0),
    "flip": lambda: relax.op.flip(_X, axis=0),
    "nn.pad": lambda: relax.op.nn.pad(_X, [1, 1, 1, 1]),
    "layout_transform": lambda: relax.op.layout_transform(_X, index_map=lambda a, b: (b, a)),
    "gather_elements": lambda: relax.op.gather_elements(_X, _IDX, axis=0),
    "gather_nd": lambda: relax.op.gather_nd(_X, _var((2, 2), "int64", "nd")),
    "scatter_elements": lambda: relax.op.scatter_elements(_X, _IDX, _U, axis=0),
    "scatter_nd": lambda: relax.op.scatter_nd(_X, _var((2, 1), "int64", "nd"), _var((2, 6), name="upd")),
    "stack": lambda: relax.op.stack([_X, _U], axis=0),
    "one_hot": lambda: relax.op.one_hot(_var((4,), "int64", "i"), 1.0, 0.0, 5, -1),
    "tril": lambda: relax.op.tril(_X),
    "triu": lambda: relax.op.triu(_X),
    "image.resize2d": lambda: relax.op.image.resize2d(_var((1, 2, 4, 4)), (8, 8)),
    "collapse_sum_to": lambda: relax.op.collapse_sum_to(_X, relax.ShapeExpr([1, 6])),
    "collapse_sum_like": lambda: relax.op.collapse_sum_like(_X, _var((1, 6), name="like")),
    "index_tensor": lambda: relax.op.index_tensor(_X, relax.Tuple([_var((3,), "int64", "i")])),
    **{name: (lambda name=name: getattr(relax.op, name)(_X, axis=1))
       for name in ("sum", "mean", "max", "min", "prod", "variance", "std", "argmax", "argmin", "median",
                    "cumsum", "cumprod", "sort", "argsort")},
    "topk": lambda: relax.op.topk(_X, k=2, axis=1),
}
# TVM 0.27's legalization of pixel_shuffle calls topi.nn.pixel_shuffle, which it lacks
_NOT_LEGALIZED = {"relax.nn.pixel_shuffle"}


def _extern_blocks(func: tvm.tirx.PrimFunc) -> list[str]:
    """Blocks TOPI's te.extern / ir_builder code leaves: no iteration variables and no
    declared reads or writes (an opaque body FuseTIR cannot merge), other than the root."""
    found: list[str] = []

    def on_block(block) -> None:
        if block.name_hint != "root" and not (block.iter_vars or block.reads or block.writes):
            found.append(block.name_hint)

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, on_block)])
    return found


def test_every_indexing_reducing_or_sorting_op_has_a_lowering_sample():
    categories = {INJECTIVE, REDUCTION, SCAN, EXTERN}
    registered = {op for op, rule in registered_ops().items() if rule.category in categories}
    assert registered - _NOT_LEGALIZED == {f"relax.{name}" for name in _SAMPLES}


@pytest.mark.parametrize("name", sorted(_SAMPLES))
def test_op_whose_kernel_is_extern_code_is_never_fused(name):
    """FuseTIR merges te.compute kernels only; an extern-built one (scatter's ir_builder,
    median's argsort) in a fused group fails the build (``Inconsistent buffers``)."""
    call = _SAMPLES[name]()
    bb = relax.BlockBuilder()
    with bb.function("main", sorted(relax.analysis.free_vars(call), key=lambda v: v.name)):
        with bb.dataflow():
            out = bb.emit_output(call)
        bb.emit_func_output(out)
    with tvm.target.Target({"kind": "llvm"}):
        mod = tvm.transform.Sequential([relax.backend.DispatchSortScan(), relax.transform.LegalizeOps()])(bb.get())
    extern = [b for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc) for b in _extern_blocks(f)]
    category = rule_for(f"relax.{name}").category
    assert not (extern and category in _CHAINABLE | _ANCHORS), (
        f"{name}: its kernel is extern code (blocks {extern}) but category {category!r} lets it join a fused group")


def test_pointwise_excludes_ops_tied_to_their_input_shape():
    """prelu is registered broadcast but applies its slope along ``axis``; dropout returns
    a pair; softmax and layer_norm reduce along axes. Only the others may cross a reshape."""
    from aicf_tvm.core.kinds.describe import is_pointwise

    x = relax.Var("x", relax.TensorType((2, 3, 4), "float32"))
    c = relax.const(0.5, "float32")
    vec = relax.const(np.ones(4, "float32"))
    pointwise = [relax.op.nn.relu(x), relax.op.add(x, c), relax.op.astype(x, "float16"),
                 relax.op.nn.leakyrelu(x, 0.1), relax.op.clip(x, 0.0, 1.0)]
    tied = [relax.op.nn.prelu(x, relax.const(np.ones(3, "float32")), axis=1),
            relax.op.nn.dropout(x, 0.5), relax.op.nn.softmax(x, axis=1),
            relax.op.nn.layer_norm(x, vec, vec, axes=[-1])]
    bb = relax.BlockBuilder()
    assert [is_pointwise(bb.normalize(e)) for e in pointwise] == [True] * len(pointwise)
    assert [is_pointwise(bb.normalize(e)) for e in tied] == [False] * len(tied)


@pytest.fixture
def scratch_registry(monkeypatch):
    """A copy of the registry that registrations in the test may change."""
    rule_for("relax.add")  # the table is loaded
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


@pytest.mark.usefixtures("scratch_registry")
def test_register_refuses_an_op_registered_twice():
    """A second entry for an op would silently replace the first (the table once held
    einsum and sort twice, in two categories)."""
    with pytest.raises(KindRegistrationError, match=r"relax\.add is registered twice"):
        register("relax.add", ELEMENTWISE)
    assert rule_for("relax.add").category == BROADCAST


@pytest.mark.usefixtures("scratch_registry")
def test_register_refuses_a_kind_name_already_taken():
    """Emits, ``verify_contracts`` and the report name kinds, not ops: two ops of one
    kind name would be indistinguishable."""
    with pytest.raises(KindRegistrationError, match=r"kind 'add' of relax\.my_add .* relax\.add"):
        register("relax.my_add", BROADCAST, kind="add")
    with pytest.raises(KindRegistrationError, match="kind 'opaque'"):
        register("relax.my_op", ELEMENTWISE, kind="opaque")
    assert rule_for("relax.my_add") is OPAQUE_RULE and rule_for("relax.my_op") is OPAQUE_RULE


def test_table_registers_each_op_once(monkeypatch):
    """Importing the table into an empty registry succeeds (a duplicate would raise) and
    gives the registry every process sees."""
    loaded = registered_ops()
    monkeypatch.setattr(registry, "_REGISTRY", {})
    importlib.reload(table)
    assert registry._REGISTRY == loaded


def _arg_reductions(source: relax.Expr, planes: tuple) -> tvm.IRModule:
    """argmax and argmin with keepdims over several axes (negative ones included) of a
    ReLU of ``source(x)``, one output per (op, axis)."""
    bb = relax.BlockBuilder()
    x = _var(planes)
    with bb.function("main", [x]):
        with bb.dataflow():
            act = bb.emit(relax.op.nn.relu(bb.emit(source(x))))
            outs = [bb.emit(getattr(relax.op, op)(act, axis=axis, keepdims=True))
                    for op in ("argmax", "argmin") for axis in (1, 2, -1, -3)]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("blocked", [False, True], ids=["NCHW", "NCHW16c"])
def test_arg_reductions_keeping_dims_match_the_unoptimized_build(blocked):
    """argmax/argmin name one axis (an int, not a list): the layout transfer of a reduction
    that keeps its dims iterated over it and raised TypeError."""
    from aicf_tvm.core.kinds.layouts import blocking_map

    from ...conftest import run_vm

    source = (lambda x: relax.op.layout_transform(x, blocking_map(16))) if blocked else (lambda x: x + x)
    mod = _arg_reductions(source, (1, 32, 6, 8))
    data = np.random.default_rng(7).standard_normal((1, 32, 6, 8)).astype("float32")
    got = aicf_tvm.compile(mod, target="llvm")(data)
    logical = data.reshape(1, 2, 16, 6, 8).transpose(0, 1, 3, 4, 2) if blocked else data + data
    for k, (g, want) in enumerate(zip(got, run_vm(mod, data))):
        op, axis = ("argmax", "argmin")[k // 4], (1, 2, -1, -3)[k % 4]
        np.testing.assert_array_equal(np.asarray(g), want, err_msg=f"{op} axis={axis}")
        ref = np.expand_dims(getattr(np, op)(np.maximum(logical, 0), axis=axis), axis)
        np.testing.assert_array_equal(want, ref, err_msg=f"{op} axis={axis}: numpy")
