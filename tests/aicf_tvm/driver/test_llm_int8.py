"""``compile_causal_lm(weights="int8")``: an explicit opt-in that rounds every linear
layer's weight to symmetric per-channel int8. Checked against a reference built in
PyTorch from numpy's rounding (``tests.helpers.rounded_copy``, not our quantizer):
the compiled prefill and decode logits and greedy tokens equal it; the weights are stored
once, as int8; the report lists every quantized layer with its error; the user's model is
untouched; the library says so after export and load. GPT-2 covers transformers'
``Conv1D`` layers."""

from __future__ import annotations

import re

import numpy as np
import pytest

import aicf_tvm
from aicf_tvm.driver.quantize_weights import quantize_int8
from aicf_tvm.runtime.deploy import manifest, read_metadata
from aicf_tvm.runtime.targets import resolve_target
from schedules.cpu.linear_int4 import has_q8
from tests import helpers
from tests.aicf_tvm.driver.test_llm import MAX_LENGTH, assert_like_model, build, prompts, reference
from tests.helpers import compile_quantized, constant_elements, relax_constants, rounded_copy, weight_decisions

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def _linears(model) -> int:
    return sum(isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D" for m in model.modules())


# one worker runs this module: its compiled models (module fixtures, 15-40 s each)
# are then built once, not once on each xdist worker that draws one of its tests
pytestmark = pytest.mark.xdist_group("llm_int8")


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def int8(request):
    model = build(request.param)
    return model, compile_quantized(model, "int8", MAX_LENGTH)


def test_quantize_int8_rounds_half_to_even_per_channel():
    w = torch.tensor([[0.5, -1.0, 127.0, 2.5], [0.0, 0.0, 0.0, 0.0], [1e-3, -2e-3, 3e-3, 0.0]])
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.tolist() == pytest.approx([1.0, 1.0, 3e-3 / 127])
    assert q[0].tolist() == [0, -1, 127, 2]  # 0.5 -> 0 and 2.5 -> 2: half to even
    assert q[1].tolist() == [0, 0, 0, 0] and q[2].tolist() == [42, -85, 127, 0]


def test_logits_and_tokens_equal_the_int8_rounded_model(int8):
    model, lm = int8
    ref = rounded_copy(model)
    ids = prompts(7, batch=1)
    with torch.no_grad():
        want = ref(input_ids=torch.from_numpy(ids)).logits[0].numpy()
        fp32 = model(input_ids=torch.from_numpy(ids)).logits[0].numpy()
    assert not np.allclose(want, fp32, rtol=1e-4, atol=1e-5)  # the rounding shows in the logits
    assert_like_model(lm, ref, want, ids)


def test_weights_are_stored_once_as_int8_and_each_layer_is_reported(int8):
    model, lm = int8
    consts = relax_constants(lm.model.lowered, lm.model.function_names)
    int8_elems, float_elems = constant_elements(consts, "int8"), constant_elements(consts, "float32")
    linear = sum(m.weight.numel() for m in model.modules()
                 if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D")
    assert linear <= int8_elems <= 1.1 * linear
    assert float_elems < 0.2 * linear + model.get_input_embeddings().weight.numel() + 4 * 256  # no float copies
    approx, errors = weight_decisions(lm, "int8")
    assert len(approx) == _linears(model) and len({d.members for d in approx}) == len(approx)
    assert all(0 < e < 0.05 for e in errors)
    assert lm.config.weights == "int8"


def test_int8_survives_export_and_load(int8, tmp_path):
    model, lm = int8
    path = tmp_path / "lm.so"
    lm.export_library(path)
    shown = manifest(read_metadata(path), path.name)  # aicf explain's text
    assert f"approximations ({_linears(model)}, opted into at compile time):" in shown
    assert re.search(r"weights_int8 lm_head: \[256x64\] weight per-channel symmetric int8: relative error", shown)
    assert "approximations opted into: approximate:weights_int8" in shown  # the summary line
    loaded = aicf_tvm.load(path)
    assert loaded.config.weights == "int8"
    ids = prompts(13)
    np.testing.assert_array_equal(loaded.generate(ids, max_new_tokens=4, stop_tokens=[]),
                                  lm.generate(ids, max_new_tokens=4, stop_tokens=[]))


def test_an_unknown_weight_format_is_refused():
    with pytest.raises(ValueError, match="weights='int3'"):
        aicf_tvm.compile_causal_lm(build("llama"), max_length=8, weights="int3")


def test_aicf_generate_with_int8_weights(tmp_path, capsys):
    """The default activations ("auto"): int8 where this CPU has AVX-512 VNNI, else float32;
    the tokens those of the model with numpy's rounding of the weights (and of every layer's
    input where int8), the choice on the status line."""
    from aicf_tvm.driver.cli import main

    model = build("llama")
    folder = tmp_path / "tiny-llama"
    model.save_pretrained(folder)
    q8 = has_q8(resolve_target("llvm"), 8)
    ref = helpers.round_linear_inputs(rounded_copy(model)) if q8 else rounded_copy(model)
    want = reference(ref, np.array([[5, 7, 9, 11]]), 6)[0].tolist()
    assert main(["generate", str(folder), "--prompt-ids", "5,7,9,11", "--max-new-tokens", "6",
                 "--max-length", "16", "--weights", "int8"]) == 0
    out = capsys.readouterr()
    assert out.out.strip().splitlines()[-1] == "ids: " + ",".join(map(str, want))
    assert f"(weights int8, activations {'int8' if q8 else 'float32'})" in out.err
