"""``CombineInt4Calls``: the int4 (and int8-activation) kernel calls of one input become
one call of a kernel for all their outputs, read through slices. Checked on the tiny
LLaMA of ``compile_causal_lm(weights=...)``: q/k/v and gate/up combine in both step
functions (the prompt's flattened input and the decode step's own), other layers stay
apart, and the logits and greedy tokens equal the uncombined build's bit for bit
(``CompileOptions(combine_projections=False)``), for every form on this CPU."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from aicf_tvm.core.options import CompileOptions
from aicf_tvm.driver.frontends.int4 import linear_int4_call
from aicf_tvm.runtime.targets import resolve_target
from relax_passes.combine_int4_calls import CombineInt4Calls
from schedules.cpu.linear_int4 import GROUP, KERNEL_FORMS, has_q8, pack_int4, with_outputs
from tests.aicf_tvm.driver.test_llm import build, prompts

pytest.importorskip("transformers")
HOST = resolve_target("llvm")
FORMS = [("int4", "float32")]
FORMS += [("int4", "int8")] if has_q8(HOST) else []
FORMS += [("int8", "int8")] if has_q8(HOST, 8) else []


def _module(widths: list[int], k: int, same_input: bool) -> tvm.IRModule:
    """``main(x, y)``: one int4 layer of ``widths[i]`` outputs per width, each over ``x``
    (or, when not ``same_input``, the second over ``y``)."""
    rng = np.random.default_rng(len(widths) + k)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 1, k], "float32"))
    y = relax.Var("y", relax.TensorType([1, 1, k], "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            outs = []
            for i, n in enumerate(widths):
                packed, scales = pack_int4(rng.integers(-8, 8, (n, k)), rng.uniform(0.1, 1, (n, k // GROUP))
                                           .astype(np.float16))
                source = x if same_input or i != 1 else y
                outs.append(bb.emit(linear_int4_call(bb, source, relax.const(packed, "int32"),
                                                     relax.const(scales, "float16"))))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


def _calls(mod: tvm.IRModule) -> list[str]:
    return [gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]


def test_calls_of_one_input_become_one_kernel_with_slices():
    combine = CombineInt4Calls(KERNEL_FORMS, with_outputs)
    out = combine(relax.transform.ConvertToDataflow()(_module([64, 128, 64], 64, True)))
    assert _calls(out) == ["gemv_int4_64x64_x3_256"]
    assert _calls(combine(out)) == _calls(out)  # nothing left to combine
    apart = combine(relax.transform.ConvertToDataflow()(_module([64, 128, 64], 64, False)))
    assert sorted(_calls(apart)) == ["gemv_int4_128x64", "gemv_int4_64x64_x2_128"]  # y's layer stays apart


@pytest.fixture(scope="module")
def model():
    return build("llama")


@pytest.mark.parametrize(("weights", "activations"), FORMS)
def test_the_combined_build_equals_the_uncombined_bit_for_bit(model, weights, activations):
    import aicf_tvm

    lms = {combine: aicf_tvm.compile_causal_lm(model, max_length=24, weights=weights, activations=activations,
                                               options=CompileOptions(combine_projections=combine))
           for combine in (True, False)}
    calls = {combine: [k.name for k in lm.model.kernels if k.schedule == "hand-written"] for combine, lm in lms.items()}
    assert any("_x3_" in n for n in calls[True]) and any("_x2_" in n for n in calls[True])  # q/k/v, gate/up
    assert not any("_x" in n for n in calls[False])
    layers = len(model.model.layers)
    assert len(calls[False]) - len(calls[True]) == 2 * 3 * layers  # 3 calls a layer fewer, in both functions
    ids = prompts(29, batch=1)
    for combine, lm in lms.items():
        lms[combine] = (lm.prefill(ids[:, :4]), lm.decode(ids[:, 4]), lm.decode(ids[:, 5]))
    for got, want in zip(lms[True], lms[False], strict=True):
        np.testing.assert_array_equal(got, want)
