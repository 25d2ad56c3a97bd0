"""``compile_causal_lm`` and ``CausalLM``: greedy tokens equal transformers' own
``generate`` on small random decoders of three families (2 layers), up to the cache's
bound; the cache written in place (the report's ``cache_write`` decisions, the caller's
buffers); bounds errors; sampling from a seed; export and load in a fresh process, also
where TVM has only its runtime."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

import aicf_tvm
from aicf_tvm import InputError, UnsupportedModelError
from aicf_tvm.driver.bundle import write_runtime_site
from aicf_tvm.runtime.deploy import manifest, read_metadata
from aicf_tvm.runtime.llm import CausalLM
from tests.aicf_tvm.runtime.test_deploy_runtime_only import run_on_target_host

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

PROMPT, NEW = 6, 19
MAX_LENGTH = PROMPT + NEW  # the last decode step fills the cache to its bound
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256}


def build(family: str):
    torch.manual_seed({"llama": 0, "qwen2": 1, "gpt2": 2}[family])
    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)).eval()
    if family == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SMALL)).eval()
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=256)
    return transformers.GPT2LMHeadModel(cfg).eval()


# one worker runs this module: its compiled models (module fixtures, 15-40 s each)
# are then built once, not once on each xdist worker that draws one of its tests
pytestmark = pytest.mark.xdist_group("llm")


@pytest.fixture(scope="module", params=["llama", "qwen2", "gpt2"])
def compiled(request):
    model = build(request.param)
    return model, aicf_tvm.compile_causal_lm(model, max_length=MAX_LENGTH)


def reference(model, prompt: np.ndarray, new: int) -> np.ndarray:
    with torch.no_grad():
        return model.generate(torch.from_numpy(prompt), max_new_tokens=new, do_sample=False,
                              eos_token_id=None, pad_token_id=0).numpy()


def prompts(seed: int, batch: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 256, (batch, PROMPT))


def assert_like_model(lm, ref, want: np.ndarray, ids: np.ndarray) -> None:
    """``lm``'s prefill of ``ids``' first 3 tokens and its decode of the rest give ``want``
    (``ref``'s logits of ``ids``), and its greedy tokens are ``ref``'s."""
    np.testing.assert_allclose(lm.prefill(ids[:, :3])[0], want[2], rtol=1e-4, atol=1e-4)
    for k in range(3, PROMPT):
        np.testing.assert_allclose(lm.decode(ids[:, k])[0], want[k], rtol=1e-4, atol=1e-4)
    ids = prompts(11)
    np.testing.assert_array_equal(lm.generate(ids, max_new_tokens=8, stop_tokens=[]), reference(ref, ids, 8))


def test_greedy_tokens_equal_transformers_up_to_the_bound(compiled):
    model, lm = compiled
    ids = prompts(5)
    want = reference(model, ids, NEW + 1)
    assert not np.array_equal(want[0, PROMPT:], want[1, PROMPT:])  # the rows' inputs matter
    got = lm.generate(ids, max_new_tokens=NEW, stop_tokens=[])
    assert got.dtype == np.int64 and got.shape == (2, MAX_LENGTH)
    np.testing.assert_array_equal(got, want[:, :MAX_LENGTH])
    # one more step fills the cache to max_length: its token is transformers' next one
    np.testing.assert_array_equal(lm.decode(got[:, -1]).argmax(-1), want[:, MAX_LENGTH])
    assert lm.length == MAX_LENGTH
    with pytest.raises(InputError, match="exceed max_length"):
        lm.decode(want[:, MAX_LENGTH])


def test_prefill_and_decode_logits_match_pytorch(compiled):
    model, lm = compiled
    ids = prompts(7, batch=1)
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids)).logits[0].numpy()
    np.testing.assert_allclose(lm.prefill(ids[:, :3])[0], want[2], rtol=1e-4, atol=1e-5)
    for k in range(3, PROMPT):
        np.testing.assert_allclose(lm.decode(ids[:, k])[0], want[k], rtol=1e-4, atol=1e-5)


def test_the_cache_is_written_in_place(compiled):
    _, lm = compiled
    writes = [d for d in lm.model.report.decisions if d.candidate == "cache_write"]
    assert len(writes) == 2 * 2 and all(d.accepted for d in writes)  # keys and values of 2 layers
    assert all("0 cache bytes copied per call" in d.note for d in writes)
    lm.prefill(prompts(3, batch=1))
    before = [t for t in lm._caches[0]]
    lm.decode([4])
    assert all(a.same_as(b) for a, b in zip(before, lm._caches[0]))  # the buffers the call was given


def test_the_functions_store_each_weight_once(compiled):
    """Both step functions prepack their GEMM weights alike (one packed layout per weight,
    q/k/v combined in both): the decode function's constants are the prompt function's
    objects, all but a few bytes of its own."""
    model, lm = compiled
    shared = [d for d in lm.model.report.decisions if d.candidate == "materialize:shared_constants"]
    assert [d.members for d in shared] == [("decode",)]
    own = float(re.search(r"([0-9.]+) MB its own", shared[0].note).group(1)) * 1e6
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert shared[0].benefit >= 0.9 * weights and own <= 0.01 * weights
    assert any(d.candidate == "materialize:layout_transform" and d.accepted for d in lm.model.report.decisions)


def test_each_function_of_the_library_runs_with_its_own_checks(compiled):
    """The module serves both step functions: ``call(name, ...)`` checks the inputs against
    that function's own signature (decode takes one token) and runs it; the logits of a
    prompt then one decode step, called so, match PyTorch's."""
    model, lm = compiled
    m = lm.model
    assert m.function_names == ["main", "decode"]
    main, decode = m.signature("main"), m.signature("decode")
    assert main.inputs[0].shape[1] == "prompt" and decode.inputs[0].shape == (1, 1)
    ids = prompts(11, batch=1)
    caches = [np.zeros((1, h, lm.config.cache_rows, d), np.float32) for h, d in lm.config.cache_shapes]
    out = m.call("main", ids[:, :5], np.ones((1, 5), np.int64), *caches)
    step = m.call("decode", ids[:, 5:6], np.ones((1, 6), np.int64), *out[1:])
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids[:, :6])).logits[0].numpy()
    np.testing.assert_allclose(np.asarray(out[0]).reshape(-1), want[4], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(step[0]).reshape(-1), want[5], rtol=1e-4, atol=1e-5)
    with pytest.raises(InputError, match=r"input ids: shape \[1, 2\], expected \[1, 1\]"):
        m.call("decode", ids[:, 4:6], np.ones((1, 7), np.int64), *out[1:])
    with pytest.raises(InputError, match="it has: main, decode"):
        m.call("prefill", ids)


def test_bad_calls_are_refused(compiled):
    _, lm = compiled
    with pytest.raises(InputError, match="exceed max_length"):
        lm.generate(prompts(1), max_new_tokens=NEW + 1)
    with pytest.raises(InputError, match="outside the vocabulary"):
        lm.prefill([[1, 2, 256]])
    with pytest.raises(InputError, match="expected integer"):
        lm.prefill(np.ones((1, 3), np.float32))
    with pytest.raises(InputError, match="empty"):
        lm.prefill(np.zeros((1, 0), np.int64))
    fresh = lm.clone()
    with pytest.raises(InputError, match="decode before prefill"):
        fresh.decode([1])
    fresh.prefill(prompts(2))
    with pytest.raises(InputError, match="2 sequences"):
        fresh.decode([1, 2, 3])
    with pytest.raises(InputError, match="top_p"):
        lm.generate(prompts(1), max_new_tokens=2, temperature=1.0, top_p=0.0)


def test_sampling_is_reproducible_from_its_seed(compiled):
    _, lm = compiled
    ids = prompts(11)
    a = lm.generate(ids, max_new_tokens=8, temperature=1.5, top_k=50, top_p=0.95, seed=3, stop_tokens=[])
    b = lm.generate(ids, max_new_tokens=8, temperature=1.5, top_k=50, top_p=0.95, seed=3, stop_tokens=[])
    c = lm.generate(ids, max_new_tokens=8, temperature=1.5, top_k=50, top_p=0.95, seed=4, stop_tokens=[])
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    greedy = lm.generate(ids, max_new_tokens=8, stop_tokens=[])
    np.testing.assert_array_equal(lm.generate(ids, max_new_tokens=8, temperature=1.0, top_k=1, seed=0,
                                              stop_tokens=[]), greedy)


def test_stop_tokens_end_a_row_and_pad_it(compiled):
    model, lm = compiled
    ids = prompts(5)
    full = reference(model, ids, 8)
    stop = int(full[0, PROMPT + 2])  # row 0's third new token
    got = lm.generate(ids, max_new_tokens=8, stop_tokens=[stop])
    first = PROMPT + int(np.argmax(full[0, PROMPT:] == stop))
    np.testing.assert_array_equal(got[0, :first + 1], full[0, :first + 1])
    assert (got[0, first:] == stop).all()
    row1_stop = np.flatnonzero(full[1, PROMPT:] == stop)
    end = PROMPT + (row1_stop[0] + 1 if row1_stop.size else 8)
    np.testing.assert_array_equal(got[1, :end], full[1, :end])


def test_an_encoder_decoder_is_refused_by_name():
    cfg = transformers.T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=2, vocab_size=64, d_kv=16)
    with pytest.raises(UnsupportedModelError, match="encoder-decoder"):
        aicf_tvm.compile_causal_lm(transformers.T5ForConditionalGeneration(cfg), max_length=8)


LOAD_PROBE = r"""
import json, sys
import numpy as np
import aicf_tvm, tvm
lm = aicf_tvm.load(sys.argv[1])
ids = np.array(json.loads(sys.argv[2]), np.int64)
print(json.dumps({"type": type(lm).__name__, "tokens": lm.generate(ids, max_new_tokens=5, stop_tokens=[]).tolist(),
                  "runtime_only": bool(getattr(tvm.base, "_RUNTIME_ONLY", False)),
                  "compiler": "tvm_compiler" in getattr(tvm.base, "_LOADED_LIBS", [])}))
"""


def test_export_and_load_in_a_fresh_process(tmp_path):
    model = build("llama")
    lm = aicf_tvm.compile_causal_lm(model, max_length=16)
    path = lm.export_library(tmp_path / "lm.so")
    ids = prompts(9, batch=1).tolist()
    want = lm.generate(np.array(ids), max_new_tokens=5, stop_tokens=[]).tolist()
    np.testing.assert_array_equal(want, reference(model, np.array(ids), 5))
    done = subprocess.run([sys.executable, "-c", LOAD_PROBE, str(path), json.dumps(ids)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["type"] == "CausalLM" and report["tokens"] == want
    site = tmp_path / "runtime_site"
    write_runtime_site(site)
    done = run_on_target_host(site, "-c", LOAD_PROBE, str(path), json.dumps(ids))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["runtime_only"] and not report["compiler"] and report["tokens"] == want
    loaded = aicf_tvm.load(path)
    assert isinstance(loaded, CausalLM) and loaded.model.function_names == ["main", "decode"]
    assert loaded.model.signature("decode").to_json() == lm.model.signature("decode").to_json()
    shown = manifest(read_metadata(path), str(path))
    assert "functions: main, decode" in shown and "function decode:\n  inputs:\n    ids: int64[1, 1]" in shown


def word_tokenizer(folder) -> None:
    """A tokenizer of 256 words ``t0`` ... ``t255`` saved in ``folder`` (no hub here)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(256)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(folder)


def test_aicf_generate_on_a_model_folder_and_its_library(tmp_path, capsys):
    from aicf_tvm.driver.cli import main

    model = build("llama")
    folder = tmp_path / "tiny-llama"
    model.save_pretrained(folder)
    word_tokenizer(folder)
    want = reference(model, np.array([[5, 7, 9, 11]]), 6)[0].tolist()
    lib = tmp_path / "tiny.so"
    assert main(["generate", str(folder), "--prompt", "t5 t7 t9 t11", "--max-new-tokens", "6",
                 "--max-length", "16", "--save", str(lib)]) == 0
    out, err = capsys.readouterr()
    text, ids = out.strip().splitlines()[-2:]
    assert ids == "ids: " + ",".join(map(str, want))
    assert text == " ".join(f"t{i}" for i in want)
    assert "prefill" in err and "tokens/s" in err
    assert main(["generate", str(lib), "--prompt-ids", "5,7,9,11", "--max-new-tokens", "6"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "ids: " + ",".join(map(str, want))
    assert main(["generate", str(lib), "--prompt", "t5", "--max-new-tokens", "2"]) == 1
    assert "--prompt needs a tokenizer" in capsys.readouterr().err


def test_the_decode_attention_packs_keys_per_head_with_the_same_bits():
    """``CompileOptions.attention_pack_in_tile``: the decode step's one query row per head
    gets kᵀ packed inside its head's tile; the logits are the same bits as with the pack
    of every head first."""
    model = build("llama")
    lms = {flag: aicf_tvm.compile_causal_lm(model, max_length=40, check=False,
                                            options=aicf_tvm.CompileOptions(attention_pack_in_tile=flag))
           for flag in (True, False)}
    kernels = {flag: lm.model.lowered.script() for flag, lm in lms.items()}
    assert kernels[True] != kernels[False]
    ids = prompts(13, batch=1)
    for k in range(PROMPT, PROMPT + 8):
        logits = [lm.prefill(ids) if k == PROMPT else lm.decode([k]) for lm in lms.values()]
        np.testing.assert_array_equal(logits[0], logits[1])
