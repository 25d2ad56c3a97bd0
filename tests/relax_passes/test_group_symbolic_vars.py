"""A fused group whose body names a symbolic var of the caller that its inputs only have in
an expression (``past`` where the keys are ``past + 1`` long) takes it as TVM's FuseOps
passes such vars: a last parameter ``tir_vars: R.Shape([past])``, the call giving
``R.shape([past])`` (relax_passes/group_rewrite.py ``build_group_function``)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import aicf_tvm
from aicf_tvm import emit_of, verify_contracts
from aicf_tvm.core.emit_graph import EmitGraph, port_args, tir_vars_arg
from aicf_tvm.core.propagation import analysis_of
from aicf_tvm.core.report import FusionReport
from aicf_tvm.driver.explainer import explain
from aicf_tvm.driver.pipeline import normalize, optimize, run_pipeline
from aicf_tvm.driver.symbolic import with_dim_bounds
from aicf_tvm.driver.tuning.run import lower_for_tuning
from aicf_tvm.runtime.targets import resolve_target
from relax_passes import LiftEmits, PropagateContracts
from relax_passes.bound_shapes import bounds_of
from relax_passes.fusion_planner import FusionPlanner
from relax_passes.group_rewrite import Group, drop_unused_emits, rewrite_block, with_blocks
from schedules.tuning.symbolic import kernel_bindings
from schedules.tuning.tasks import extract_tasks, symbolic_dims
from tests.helpers import relax_main

from ..conftest import run_vm

TARGET = {"kind": "llvm", "num-cores": 2}
F32 = "float32"
# GroupQueryHeads would drop repeat_kv's views from a one-row step (they name ``past``):
# these tests keep them, as a prompt's attention (several rows) has them
UNGROUPED = aicf_tvm.CompileOptions(group_query_heads=False)


def decode_attention(doubled: bool = False) -> tvm.IRModule:
    """One decode step of grouped-query attention (4 query heads, 2 kv heads) over a cache
    of ``past`` entries, as LLaMA's ``repeat_kv`` writes it: the keys and values are
    ``past + 1`` long (``2 * past`` when ``doubled``), and the views that repeat the kv
    heads name ``past`` in their target shapes, so LiftEmits leaves them in main."""
    past = tirx.Var("past", "int64")
    new = past if doubled else 1
    length = past + new
    q = relax.Var("q", relax.TensorType([1, 4, 1, 16], F32))
    k_new, v_new = (relax.Var(n, relax.TensorType([1, 2, new, 16], F32)) for n in ("k_new", "v_new"))
    k_past, v_past = (relax.Var(n, relax.TensorType([1, 2, past, 16], F32)) for n in ("k_past", "v_past"))

    def heads(bb, cache, fresh):
        x = bb.emit(relax.op.concat([cache, fresh], axis=2))
        x = bb.emit(relax.op.expand_dims(x, [2]))
        x = bb.emit(relax.op.broadcast_to(x, relax.ShapeExpr([1, 2, 2, length, 16])))
        return bb.emit(relax.op.reshape(x, relax.ShapeExpr([1, 4, length, 16])))

    def body(bb, q, k_new, v_new, k_past, v_past):
        k, v = heads(bb, k_past, k_new), heads(bb, v_past, v_new)
        s = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))))
        s = bb.emit(relax.op.multiply(s, relax.const(0.25, F32)))
        return relax.op.matmul(bb.emit(relax.op.nn.softmax(s, axis=-1)), v)

    return relax_main([q, k_new, v_new, k_past, v_past], body)


def reference(q, k_new, v_new, k_past, v_past) -> np.ndarray:
    """numpy: the heads repeated, softmax(q k^T / 4) v."""
    k = np.repeat(np.concatenate([k_past, k_new], 2), 2, axis=1)
    v = np.repeat(np.concatenate([v_past, v_new], 2), 2, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) * 0.25
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def inputs(rng: np.random.Generator, past: int, doubled: bool) -> list[np.ndarray]:
    new = past if doubled else 1
    shapes = [(1, 4, 1, 16), (1, 2, new, 16), (1, 2, new, 16), (1, 2, past, 16), (1, 2, past, 16)]
    return [rng.standard_normal(s).astype(F32) for s in shapes]


def optimized(mod: tvm.IRModule) -> tvm.IRModule:
    out = optimize(normalize(mod, UNGROUPED), FusionReport())
    verify_contracts(out)
    return out


def calls_of(mod: tvm.IRModule, kind: str) -> list[relax.Call]:
    return [b.value for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, relax.GlobalVar)
            and emit_of(mod[b.value.op]) is not None and emit_of(mod[b.value.op]).kind == kind]


@pytest.mark.parametrize("doubled", [False, True], ids=["past+1", "2*past"])
def test_the_group_takes_the_var_as_a_last_shape_parameter(doubled):
    mod = optimized(decode_attention(doubled))
    (call,) = calls_of(mod, "fused_attention")
    func = mod[call.op]
    assert isinstance(func.params[-1].ty, relax.ShapeType)
    assert all(isinstance(p.ty, relax.TensorType) for p in func.params[:-1])
    assert [str(d) for d in tir_vars_arg(call).values] == ["past"]
    assert len(port_args(call)) == len(emit_of(func).interface.inputs) == len(call.args) - 1
    assert not relax.analysis.free_symbolic_vars(func)
    assert relax.analysis.check_well_formed(mod)


def test_the_shape_argument_has_no_port_and_no_fact():
    mod = optimized(decode_attention())
    (call,) = calls_of(mod, "fused_attention")
    emit = emit_of(mod[call.op])
    ports = {name for name, _ in emit.contract.provides.ports}
    assert ports == {p.name for p in emit.interface.inputs + emit.interface.outputs}
    assert analysis_of(mod).sites[call.op]  # the site was analyzed, its shape argument skipped


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "ungrouped"])
@pytest.mark.parametrize("doubled", [False, True], ids=["past+1", "2*past"])
def test_compiled_matches_numpy_at_two_lengths(doubled, grouped):
    options = None if grouped else UNGROUPED
    compiled = aicf_tvm.compile(decode_attention(doubled), target=TARGET, options=options)
    assert ("fused_attention", "Attention") in [(k.kind, k.schedule) for k in compiled.kernels]
    rng = np.random.default_rng(5)
    for past in (3, 11):
        args, other = inputs(rng, past, doubled), inputs(rng, past, doubled)
        want, want_other = reference(*args), reference(*other)
        assert not np.allclose(want, want_other)
        np.testing.assert_allclose(compiled(*args), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(compiled(*other), want_other, rtol=1e-5, atol=1e-6)


def test_the_kernel_takes_the_var_as_a_scalar_and_its_ports_keep_their_buffers():
    kernels = run_pipeline(decode_attention(), resolve_target("llvm"), until="kernels", options=UNGROUPED).kernels
    (name,) = [gv.name_hint for gv, f in kernels.functions_items()
               if isinstance(f, tirx.PrimFunc) and f.attrs is not None
               and f.attrs.get("aicf.kind") == "fused_attention"]
    func = kernels[name]
    scalars = [p.name for p in func.params if not isinstance(p.ty, tirx.BufferType)]
    assert scalars == ["past"]
    abi = [dict(a) for a in func.attrs["aicf.abi"] if "scalar" not in a]
    assert [a["port"] for a in abi] == ["k", "v", "q", "out"]
    assert abi[-1]["align"] == 64  # the output buffer's, not the scalar's
    assert symbolic_dims(func) == ["past"]  # a tuning task only with bindings; kernel_bindings gives none


def test_explain_lists_the_vars_the_emit_takes():
    mod = optimized(decode_attention())
    row = next(line for line in explain(mod).splitlines() if "fused_attention" in line)
    assert row.rstrip().endswith("tir_vars: past  [exact/float32/det/rne]")


def test_a_second_group_inlines_the_call_and_takes_the_vars_again():
    """A later round that groups the fused call with its consumer: the call's shape
    argument binds the callee's var, which is the caller's again in the new group."""
    mod = optimized(decode_attention())
    main = mod["main"]
    (block,) = main.body.blocks
    (binding,) = block.bindings[-1:]
    out = relax.DataflowVar("o", binding.var.ty)
    twice = relax.Var("twice", binding.var.ty)
    bindings = [*block.bindings[:-1], relax.VarBinding(out, binding.value),
                relax.VarBinding(twice, relax.op.multiply(out, relax.const(2.0, F32)))]
    mod["main"] = relax.Function(main.params, relax.SeqExpr([relax.DataflowBlock(bindings)], twice),
                                 main.ret_ty, main.is_pure, main.attrs)
    mod = PropagateContracts()(LiftEmits()(relax.transform.Normalize()(mod)))
    graph = EmitGraph(mod, mod["main"].body.blocks[0])
    planner = FusionPlanner(graph, analysis_of(mod), (), FusionReport())
    members = [len(graph.nodes) - 2, len(graph.nodes) - 1]
    assert [graph.nodes[i].emit.kind for i in members] == ["fused_attention", "multiply"]
    group = Group(members, "regrouped", make_emit=planner._generic_emit("fused_elementwise"))
    bb = relax.BlockBuilder(mod)
    with_blocks(bb, mod, "main", [rewrite_block(bb, graph, [group])])
    regrouped = PropagateContracts()(drop_unused_emits(bb.get()))
    verify_contracts(regrouped)
    (call,) = calls_of(regrouped, "fused_elementwise")
    assert [str(d) for d in tir_vars_arg(call).values] == ["past"]
    assert not calls_of(regrouped, "fused_attention")
    rng = np.random.default_rng(7)
    for past in (2, 9):
        args = inputs(rng, past, False)
        np.testing.assert_allclose(run_vm(regrouped, *args)[0], 2 * reference(*args), rtol=1e-5, atol=1e-6)


def test_tuning_leaves_the_kernel_to_its_default_schedule():
    """Tuning times kernels on tensors alone: one with a scalar parameter gets no
    bindings and no task, and keeps its default schedule (no error)."""
    target = resolve_target("llvm")
    lowered = lower_for_tuning(with_dim_bounds(decode_attention(), {"past": (1, 64)}), target, UNGROUPED)
    (name,) = [gv.name_hint for gv, f in lowered.functions_items()
               if isinstance(f, tirx.PrimFunc) and any(isinstance(p.ty, tvm.ir.PrimType) for p in f.params)]
    found = kernel_bindings(lowered, bounds_of(lowered["main"]))
    assert name not in found
    tasks = extract_tasks([("m", lowered)], target, bindings={("m", k): b for k, b in found.items()})
    assert all(("m", name) not in t.uses for t in tasks)
