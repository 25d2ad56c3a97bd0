"""Dynamic dims through ``from_torch(..., dynamic_shapes=...)``: one module, every length."""

from __future__ import annotations

import numpy as np
import pytest

import aicf_tvm

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
