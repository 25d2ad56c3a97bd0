"""Dynamic dims through ``from_torch(..., dynamic_shapes=...)``: one module, every length."""

from __future__ import annotations

import numpy as np
import pytest

import aicf_tvm

from ...helpers import last_hidden_state

torch = pytest.importorskip("torch")

TARGET = {"kind": "llvm", "num-cores": 2}


class TinyEncoder(torch.nn.Module):
    """Token + position embeddings (the table sliced to the sequence), a Linear, a norm."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(50, 16)
        self.positions = torch.nn.Embedding(64, 16)
        self.register_buffer("position_ids", torch.arange(64).unsqueeze(0), persistent=False)
        self.proj = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, ids):
        pos = self.positions(self.position_ids[:, : ids.shape[1]])
        return self.norm(torch.nn.functional.gelu(self.proj(self.tokens(ids) + pos)))


@pytest.fixture(scope="module")
def dynamic_model():
    torch.manual_seed(0)
    module = TinyEncoder().eval()
    seq = torch.export.Dim("seq", min=1, max=64)
    example = torch.randint(0, 50, (2, 8))
    mod = aicf_tvm.from_torch(module, (example,), dynamic_shapes=({1: seq},))
    return module, aicf_tvm.compile(mod, target=TARGET)


def test_the_dim_keeps_its_name_and_bounds(dynamic_model):
    _, compiled = dynamic_model
    assert compiled.inputs[0].shape == (2, "seq")
    assert compiled.dim_bounds == {"seq": [1, 64]}


@pytest.mark.parametrize("length", [1, 7, 8, 33, 64])
def test_one_module_matches_pytorch_at_every_length(dynamic_model, length):
    module, compiled = dynamic_model
    rng = np.random.default_rng(length)
    ids = rng.integers(0, 50, (2, length))
    other = rng.integers(0, 50, (2, length))
    with torch.no_grad():
        ref = module(torch.from_numpy(ids)).numpy()
        assert not np.allclose(ref, module(torch.from_numpy(other)).numpy())
    np.testing.assert_allclose(compiled(ids), ref, rtol=1e-4, atol=1e-5)


def test_a_length_beyond_the_bound_is_refused(dynamic_model):
    _, compiled = dynamic_model
    with pytest.raises(aicf_tvm.InputError, match=r"input ids: dim seq = 65 is outside its bounds \[1, 64\]"):
        compiled(np.zeros((2, 65), "int64"))


def test_the_bounds_survive_export(dynamic_model, tmp_path):
    module, compiled = dynamic_model
    loaded = aicf_tvm.load(compiled.export(tmp_path / "dyn.so"))
    ids = np.random.default_rng(3).integers(0, 50, (2, 20))
    with torch.no_grad():
        np.testing.assert_allclose(loaded(ids), module(torch.from_numpy(ids)).numpy(), rtol=1e-4, atol=1e-5)
    with pytest.raises(aicf_tvm.InputError, match="outside its bounds"):
        loaded(np.zeros((2, 65), "int64"))


class MergedHeads(torch.nn.Module):
    """GPT-2's attention shape: heads split by a view, ``scaled_dot_product_attention``,
    merged back and viewed as rows for the output projection."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, 2, 16).transpose(1, 2) for z in self.qkv(x).split(32, dim=2))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).contiguous().view(-1, 32)).view(b, t, 32)


def test_merged_heads_with_a_dynamic_batch_match_pytorch():
    """With batch and length dynamic, the decomposed attention's strides made the merged
    heads' ``view`` fail inside ``run_decompositions``; the import retargets views to
    reshapes (same values without mutation), and one module serves every shape."""
    torch.manual_seed(1)
    module = MergedHeads().eval()
    dims = {0: torch.export.Dim("batch", min=1, max=4), 1: torch.export.Dim("seq", min=1, max=32)}
    rng = np.random.default_rng(5)
    example = torch.from_numpy(rng.standard_normal((2, 5, 32)).astype(np.float32))
    mod = aicf_tvm.from_torch(module, (example,), dynamic_shapes=(dims,))
    compiled = aicf_tvm.compile(mod, target=TARGET)
    assert compiled.inputs[0].shape == ("batch", "seq", 32)
    for batch, seq in ((1, 1), (3, 7), (4, 32)):
        x = rng.standard_normal((batch, seq, 32)).astype(np.float32)
        with torch.no_grad():
            want = module(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(compiled(x), want, rtol=1e-4, atol=1e-5)


def test_gpt2_with_a_dynamic_batch_and_length_matches_pytorch():
    """GPT-2 (all-ones mask) with ``batch`` and ``seq`` dynamic: its exported graph holds a
    ``detach_`` (no data written) besides the merged heads' ``view``; one module serves
    every (batch, seq) in the bounds."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(2)
    cfg = transformers.GPT2Config(vocab_size=60, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    inner = transformers.GPT2Model(cfg).eval()

    dims = {0: torch.export.Dim("batch", min=1, max=4), 1: torch.export.Dim("seq", min=1, max=64)}
    rng = np.random.default_rng(6)
    example = (torch.from_numpy(rng.integers(0, 60, (2, 5))), torch.ones((2, 5), dtype=torch.int64))
    wrapped = last_hidden_state(inner)
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(wrapped, example, dynamic_shapes=(dims, dims)), target=TARGET)
    for batch, seq in ((1, 1), (3, 17)):
        ids, mask = rng.integers(0, 60, (batch, seq)), np.ones((batch, seq), np.int64)
        with torch.no_grad():
            want = wrapped(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        np.testing.assert_allclose(compiled(ids, mask), want, rtol=1e-4, atol=1e-5)


class MasksAndPositions(torch.nn.Module):
    """What decoders build from the sequence length: causal and banded masks of -inf/NaN
    (``triu``/``tril`` of ``full``), reversed and strided positions (a descending
    ``arange``), position ids from a mask (``cumsum``) and a running product (integers:
    PyTorch's float scans accumulate in double)."""

    def forward(self, x, mask):
        n = x.shape[1]
        causal = torch.triu(torch.full((n, n), float("-inf")), 1)
        band = torch.tril(torch.full((n, n), float("nan")), -2)
        reversed_positions = torch.arange(n - 1, -1, -1, dtype=torch.float32)
        strided = torch.arange(n - 1, -1, -2)
        position_ids = torch.cumsum(mask, dim=1) * mask - 1
        return (x.unsqueeze(-1) + causal, band + x[0], x + reversed_positions, strided,
                position_ids, torch.cumprod(mask + 1, dim=1))


def test_masks_and_positions_over_a_dynamic_length_match_pytorch():
    """Each crashed: the -inf ``full`` in TVM's legalization (TypeError), a descending
    ``arange`` typed with ``n + 2`` elements, a scan over ``seq`` with ``seq`` undefined in
    its kernel, and ``tril`` below the diagonal wrote before its output."""
    seq = torch.export.Dim("seq", min=4, max=64)  # export specializes the strided arange below 4
    rng = np.random.default_rng(8)
    example = (torch.ones(2, 6), torch.ones(2, 6, dtype=torch.int64))
    mod = aicf_tvm.from_torch(MasksAndPositions(), example, dynamic_shapes=({1: seq}, {1: seq}))
    compiled = aicf_tvm.compile(mod, target=TARGET)
    for length in (4, 5, 19):
        x = rng.uniform(0.5, 1.5, (2, length)).astype(np.float32)
        mask = (rng.uniform(size=(2, length)) > 0.3).astype(np.int64)
        wants = MasksAndPositions()(torch.from_numpy(x), torch.from_numpy(mask))
        for k, (got, want) in enumerate(zip(compiled(x, mask), wants)):
            np.testing.assert_array_equal(np.asarray(got), want.numpy(),
                                          err_msg=f"output {k}, seq={length}")


def test_llama_decode_step_over_a_dynamic_cache_matches_pytorch():
    """A LLaMA decode step (2 layers, hidden 64, grouped-query heads) with the past keys and
    values an input of dynamic length ``past``: ``repeat_kv``'s views name ``past`` while
    attention's inputs are ``past + 1`` long, so the fused attention takes ``past`` as a
    ``tir_vars`` shape (relax_passes/group_rewrite.py); this failed with "undefined
    symbolic variables" in ``build_group_function``."""
    transformers = pytest.importorskip("transformers")
    from transformers.cache_utils import DynamicCache

    torch.manual_seed(4)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(cfg).eval()

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids, kv):  # kv: [layers, 2, batch, kv heads, past, head dim]
            cache = DynamicCache()
            for i in range(cfg.num_hidden_layers):
                cache.update(kv[i, 0], kv[i, 1], i)
            out = self.model(input_ids=ids, past_key_values=cache, use_cache=True)
            layers = out.past_key_values.layers
            return out.logits, torch.stack([torch.stack([layer.keys, layer.values]) for layer in layers])

    step = Step().eval()
    example = (torch.tensor([[3]]), torch.randn(2, 2, 1, 2, 5, 16))
    mod = aicf_tvm.from_torch(step, example, dynamic_shapes=({}, {4: torch.export.Dim.DYNAMIC}))
    compiled = aicf_tvm.compile(mod, target=TARGET)
    assert [k.kind for k in compiled.kernels].count("fused_attention") == 2
    rng = np.random.default_rng(9)
    for past in (3, 12):
        ids = rng.integers(0, 256, (1, 1))
        kv = rng.standard_normal((2, 2, 1, 2, past, 16)).astype(np.float32)
        with torch.no_grad():
            want = step(torch.from_numpy(ids), torch.from_numpy(kv))
            other = step(torch.from_numpy(ids), torch.from_numpy(-kv))
        assert not np.allclose(want[0].numpy(), other[0].numpy())
        for got, ref in zip(compiled(ids, kv), want):
            np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-5)
