"""``compile_causal_lm(weights="int4")``: an explicit opt-in that rounds every linear
layer's weight to symmetric int4 in groups of 32 (outputs padded to the kernels' block of
64). Checked against a reference built in PyTorch from numpy's rounding
(``tests.helpers.rounded_copy(..., "int4")``, not our quantizer): the compiled prefill
and decode logits and greedy tokens equal it; the weights are stored once, packed at half
a byte each; the report lists every layer with its form and error; the library says so
after export and load. LLaMA's key/value projections (32 outputs) are padded to 64, and
so is the head of a GPT-2 of 300 tokens; GPT-2 covers transformers' ``Conv1D`` layers and a tied
head. A layer of 48 inputs takes the int8 form. ``activations="int8"`` (with int4 weights,
and with int8 ones where the CPU has AVX-512 VNNI) against the same reference with numpy's
rounding of every layer's input."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import aicf_tvm
from aicf_tvm.driver.quantize_weights import quantize_int4, resolve_activations, unpack_int4
from aicf_tvm.runtime.deploy import manifest, read_metadata
from aicf_tvm.runtime.targets import resolve_target
from schedules.cpu.linear_int4 import has_q8, pack_int4
from tests.aicf_tvm.driver.test_llm import MAX_LENGTH, SMALL, assert_like_model, build, prompts, reference
from tests.helpers import (
    compile_quantized,
    constant_elements,
    relax_constants,
    round_linear_inputs,
    rounded_copy,
    weight_decisions,
)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def _linear_shapes(model) -> list[tuple[int, int]]:
    """[out, in] of every linear layer."""
    return [tuple(m.weight.shape) if isinstance(m, torch.nn.Linear) else tuple(m.weight.shape)[::-1]
            for m in model.modules() if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"]


def _forms(model) -> dict[str, int]:
    """Linear layers by the form they take: int4 where the inputs make whole groups."""
    forms = {"int4": 0, "int8": 0}
    for _, inputs in _linear_shapes(model):
        forms["int8" if inputs % 32 else "int4"] += 1
    return forms


def _build(family: str):
    if family == "gpt2":  # a head of 300 tokens: padded to 320 rows for the kernels
        torch.manual_seed(2)
        cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=300, n_positions=256)
        return transformers.GPT2LMHeadModel(cfg).eval()
    return build(family)


# one worker runs this module: its compiled models (module fixtures, 15-40 s each)
# are then built once, not once on each xdist worker that draws one of its tests
pytestmark = pytest.mark.xdist_group("llm_int4")


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def int4(request):
    model = _build(request.param)
    return model, compile_quantized(model, "int4", MAX_LENGTH)


def test_quantize_int4_rounds_each_group_by_its_own_scale():
    w = torch.zeros(64, 64)
    w[0, :32] = torch.linspace(-3.5, 3.5, 32)  # max 3.5: scale 0.5
    w[0, 32:] = 0.001 * torch.arange(32)  # a group of its own: scale 0.031 / 7
    w[1, 5] = -7.0
    v, scale = quantize_int4(w)
    assert v.dtype == torch.int8 and scale.dtype == torch.float16 and scale.shape == (64, 2)
    assert float(scale[0, 0]) == 0.5 and float(scale[1, 0]) == 1.0 and float(scale[2, 0]) == 1.0  # zeros: 1
    assert float(scale[0, 1]) == pytest.approx(0.031 / 7, rel=1e-3)
    want = np.clip(np.rint(np.linspace(-3.5, 3.5, 32, dtype=np.float32) / 0.5), -7, 7)
    assert v[0, :32].tolist() == want.tolist()  # 0.25 / 0.5 -> 0: half to even
    assert v[1].tolist() == [0] * 5 + [-7] + [0] * 58


def test_the_scales_stay_float32_when_one_is_no_normal_float16():
    w = torch.zeros(64, 32)
    w[0, 0], w[1, 0] = 1e-6, 1e6  # below float16's normal range, and above its largest value
    _, scale = quantize_int4(w)
    assert scale.dtype == torch.float32 and float(scale[0, 0]) == pytest.approx(1e-6 / 7)


def test_packing_and_unpacking_give_back_every_weight():
    rng = np.random.default_rng(3)
    v = rng.integers(-8, 8, (128, 96))
    scale = rng.uniform(0.5, 2.0, (128, 3)).astype(np.float16)
    packed, scales = pack_int4(v, scale)
    assert packed.dtype == np.int32 and packed.shape == (2, 12, 64) and scales.shape == (2, 3, 64)
    want = v * np.repeat(scale.astype(np.float32), 32, axis=1)
    got = unpack_int4(torch.from_numpy(packed), torch.from_numpy(scales)).numpy()
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_logits_and_tokens_equal_the_int4_rounded_model(int4):
    model, lm = int4
    ref = rounded_copy(model, "int4")
    ids = prompts(7, batch=1)
    with torch.no_grad():
        want = ref(input_ids=torch.from_numpy(ids)).logits[0].numpy()
        int8 = rounded_copy(model)(input_ids=torch.from_numpy(ids)).logits[0].numpy()
    assert not np.allclose(want, int8, rtol=1e-3, atol=1e-4)  # int4's rounding shows in the logits
    assert_like_model(lm, ref, want, ids)


def test_weights_are_stored_once_packed_and_each_layer_is_reported(int4):
    model, lm = int4
    forms = _forms(model)
    consts = relax_constants(lm.model.lowered, lm.model.function_names)
    packed, int8_elems, float_elems = (constant_elements(consts, t) for t in ("int32", "int8", "float32"))
    padded = sum(-(-out // 64) * 64 * inputs for out, inputs in _linear_shapes(model))
    assert forms["int8"] == 0 and packed * 8 == padded  # eight weights a word, each weight once
    assert int8_elems == 0
    assert float_elems < 0.2 * padded + model.get_input_embeddings().weight.numel() + 4 * 256  # no float copies
    for form, count in forms.items():
        approx, errors = weight_decisions(lm, form)
        assert len(approx) == count and len({d.members for d in approx}) == count
        assert all(0 < e < 0.3 for e in errors)
    assert lm.config.weights == "int4"


def test_int4_survives_export_and_load(int4, tmp_path):
    model, lm = int4
    path = tmp_path / "lm.so"
    lm.export_library(path)
    shown = manifest(read_metadata(path), path.name)
    head = model.get_output_embeddings().weight.shape[0]
    assert f"weights_int4 lm_head: [{head}x64] weight symmetric int4 in groups of 32: relative error" in shown
    loaded = aicf_tvm.load(path)
    assert loaded.config.weights == "int4"
    ids = prompts(13)
    np.testing.assert_array_equal(loaded.generate(ids, max_new_tokens=4, stop_tokens=[]),
                                  lm.generate(ids, max_new_tokens=4, stop_tokens=[]))


def test_aicf_generate_with_int4_weights(tmp_path, capsys):
    """The default activations ("auto"): int8 where this CPU has AVX2, else float32; the
    tokens those of the model with numpy's rounding of the weights (and of every layer's
    input where int8), the choice on the status line."""
    from aicf_tvm.driver.cli import main

    model = build("llama")
    folder = tmp_path / "tiny-llama"
    model.save_pretrained(folder)
    q8 = has_q8(resolve_target("llvm"))
    ref = round_linear_inputs(rounded_copy(model, "int4")) if q8 else rounded_copy(model, "int4")
    want = reference(ref, np.array([[5, 7, 9, 11]]), 6)[0].tolist()
    assert main(["generate", str(folder), "--prompt-ids", "5,7,9,11", "--max-new-tokens", "6",
                 "--max-length", "16", "--weights", "int4"]) == 0
    out = capsys.readouterr()
    assert out.out.strip().splitlines()[-1] == "ids: " + ",".join(map(str, want))
    assert f"(weights int4, activations {'int8' if q8 else 'float32'})" in out.err


def test_int4_on_a_gpu_target_is_refused_before_any_work():
    with pytest.raises(ValueError, match="weights='int4' runs on CPU targets"):
        aicf_tvm.compile_causal_lm(build("llama"), max_length=8, target={"kind": "cuda", "arch": "sm_90"},
                                   weights="int4")


def test_a_layer_of_inputs_that_make_no_whole_group_takes_int8():
    cfg = dict(SMALL, hidden_size=48, num_attention_heads=4, num_key_value_heads=2)  # 48 inputs
    torch.manual_seed(4)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).eval()
    lm = aicf_tvm.compile_causal_lm(model, max_length=MAX_LENGTH, weights="int4", activations="float32")
    forms = _forms(model)
    assert forms["int4"] == 2 and forms["int8"] > 0  # the down projections (128 inputs) are int4
    assert len(weight_decisions(lm, "int4")[0]) == forms["int4"]
    fallback, _ = weight_decisions(lm, "int8")
    assert len(fallback) == forms["int8"] and all("int4 groups need inputs a multiple of 32" in d.note
                                                  for d in fallback)
    ids = prompts(17)
    np.testing.assert_array_equal(lm.generate(ids, max_new_tokens=6, stop_tokens=[]),
                                  reference(rounded_copy(model, "int4"), ids, 6))


@pytest.mark.parametrize(("weights", "form"), [
    pytest.param("int4", "symmetric int4 in groups of 32", marks=pytest.mark.skipif(
        not has_q8(resolve_target("llvm")), reason="int8 activations with int4 weights need AVX2")),
    pytest.param("int8", "per-channel symmetric int8", marks=pytest.mark.skipif(
        not has_q8(resolve_target("llvm"), 8), reason="int8 activations with int8 weights need AVX-512 VNNI"))])
def test_int8_activations_equal_the_model_with_numpy_rounded_inputs(tmp_path, weights, form):
    """``activations="int8"``: every quantized layer's input rounded to int8 in groups of 32
    (by numpy in the reference: ``round_linear_inputs``, with numpy's rounding of the
    weights), the prompt's and the decode step's kernels summing in integers (int4 weights;
    int8 ones in the kernels' 8-bit form); logits and greedy tokens equal the reference,
    each layer is reported as ``approximate:activations_int8``, and the library keeps the
    setting through export and load."""
    model = build("llama")
    lm = compile_quantized(model, weights, MAX_LENGTH, activations="int8")
    ref = round_linear_inputs(rounded_copy(model, weights))
    ids = prompts(19, batch=1)
    with torch.no_grad():
        want = ref(input_ids=torch.from_numpy(ids)).logits[0].numpy()
        float_inputs = rounded_copy(model, weights)(input_ids=torch.from_numpy(ids)).logits[0].numpy()
    assert not np.allclose(want, float_inputs, rtol=1e-4, atol=1e-4)  # the inputs' rounding shows
    assert_like_model(lm, ref, want, ids)
    assert lm.config.activations == "int8" and lm.config.weights == weights
    found = [d for d in lm.model.report.decisions if d.candidate == "approximate:activations_int8"]
    assert len(found) == len(_linear_shapes(model)) == _forms(model)["int4"]
    assert all(f"{form}, input rounded to int8 in groups of 32" in d.note for d in found)
    plans = {k.plan for k in lm.model.kernels if k.schedule == "hand-written"}  # aicf explain's kernel table
    assert any(p.startswith(f"{weights} weights, int8 activations") and "rows a task" in p for p in plans)
    assert any(p.startswith(f"{weights} weights, int8 activations") and "passes of" in p for p in plans)
    loaded = aicf_tvm.load(lm.export_library(tmp_path / "lm.so"))
    assert loaded.config.activations == "int8"
    np.testing.assert_array_equal(loaded.generate(ids[:, :5], max_new_tokens=4, stop_tokens=[]),
                                  lm.generate(ids[:, :5], max_new_tokens=4, stop_tokens=[]))


def test_int8_activations_are_refused_without_quantized_weights_or_the_isa():
    with pytest.raises(ValueError, match="activations='int8' goes with weights='int4' or 'int8'"):
        aicf_tvm.compile_causal_lm(build("llama"), max_length=8, weights="float32", activations="int8")
    with pytest.raises(ValueError, match="needs an x86 CPU with AVX2"):
        aicf_tvm.compile_causal_lm(build("llama"), max_length=8, weights="int4", activations="int8",
                                   target={"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64"})
    with pytest.raises(ValueError, match="needs an x86 CPU with AVX-512 VNNI"):  # Zen 3: AVX2, no VNNI
        aicf_tvm.compile_causal_lm(build("llama"), max_length=8, weights="int8", activations="int8",
                                   target={"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3"})
    with pytest.raises(ValueError, match="activations='int16'"):
        aicf_tvm.compile_causal_lm(build("llama"), max_length=8, weights="int4", activations="int16")


@pytest.mark.parametrize(("mcpu", "weights", "want"), [
    ("znver4", "int4", "int8"), ("znver4", "int8", "int8"),  # AVX-512 VNNI
    ("znver3", "int4", "int8"), ("znver3", "int8", "float32"),  # AVX2: int8 weights would saturate vpmaddubsw
    ("x86-64", "int4", "float32"), ("x86-64", "int8", "float32"),  # no AVX2
    ("znver4", "float32", "float32")])
def test_auto_activations_are_int8_where_the_cpu_has_the_kernels(mcpu, weights, want):
    """``activations="auto"`` (the default): int8 with quantized weights on the CPUs whose
    integer kernels exist, float32 elsewhere; an explicit choice is kept (or refused)."""
    target = resolve_target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu})
    assert resolve_activations("auto", weights, target) == want
    assert resolve_activations("float32", weights, target) == "float32"
    assert resolve_activations("fp32", weights, target) == "float32"
    cuda = resolve_target({"kind": "cuda", "arch": "sm_90"})
    assert resolve_activations("auto", "int8", cuda) == "float32"
    assert inspect.signature(aicf_tvm.compile_causal_lm).parameters["activations"].default == "auto"


@pytest.mark.parametrize("weights", ["int4", "int8"])
def test_the_reference_rounds_inputs_and_inputs_not_rounded_undoes_it(weights):
    """``quantize_linears(..., activations="int8")``'s PyTorch model equals transformers'
    with numpy-rounded weights and inputs; inside ``inputs_not_rounded`` it equals the one
    with rounded weights only, and after it rounds again (what ``check`` compares with)."""
    import copy

    from aicf_tvm.driver.quantize_weights import inputs_not_rounded, quantize_linears

    model = build("llama")
    ids = torch.from_numpy(prompts(23, batch=1))
    quantized = copy.deepcopy(model)
    quantize_linears(quantized, weights, ids, "int8")
    with torch.no_grad():
        want = round_linear_inputs(rounded_copy(model, weights))(input_ids=ids).logits.numpy()
        weights_only = rounded_copy(model, weights)(input_ids=ids).logits.numpy()
        np.testing.assert_allclose(quantized(input_ids=ids).logits.numpy(), want, rtol=1e-4, atol=1e-5)
        with inputs_not_rounded(quantized):
            np.testing.assert_allclose(quantized(input_ids=ids).logits.numpy(), weights_only, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(quantized(input_ids=ids).logits.numpy(), want, rtol=1e-4, atol=1e-5)
    assert not np.allclose(want, weights_only, rtol=1e-4, atol=1e-5)
