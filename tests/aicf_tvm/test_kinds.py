"""The kind registry covers every op of the light ONNX models and built-in models."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from aicf_tvm import emit_of, verify_contracts
from aicf_tvm.explainer import emit_calls, lift_and_propagate
from aicf_tvm.frontends import from_onnx
from aicf_tvm.kinds import OPAQUE_RULE, rule_for
from aicf_tvm.lattice import Effect
from aicf_tvm.models import BUILTIN_MODELS
from relax_passes import LiftEmits

from ..conftest import LIGHT_MODELS, light_model_path


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


def test_pointwise_excludes_ops_tied_to_their_input_shape():
    """prelu is registered broadcast but applies its slope along ``axis``; dropout returns
    a pair; softmax and layer_norm reduce along axes. Only the others may cross a reshape."""
    from aicf_tvm.kinds.describe import is_pointwise

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
