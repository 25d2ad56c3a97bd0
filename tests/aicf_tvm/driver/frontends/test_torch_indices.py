"""Indices from data through ``from_torch`` (``aicf_tvm/driver/frontends/torch_indices.py``):
an index PyTorch refuses is an ``InputError`` naming it, never a row read from elsewhere.

PyTorch eager is the reference: ``embedding``, ``index_select`` and ``gather`` raise on any
index outside ``[0, n)``, advanced indexing (``x[idx]``) counts ``[-n, 0)`` from the end.
"""

from __future__ import annotations

import numpy as np
import pytest

import aicf_tvm
from aicf_tvm import InputError

from ....helpers import assert_matches_reference, torch_function

torch = pytest.importorskip("torch")


class Embed(torch.nn.Module):
    """Token and position embeddings (positions by ``arange``), then a projection."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = torch.nn.Embedding(100, 16), torch.nn.Embedding(32, 16)
        self.proj = torch.nn.Linear(16, 8)

    def forward(self, ids):
        return self.proj(self.tokens(ids) + self.positions(torch.arange(ids.shape[1])))


class Lookups(torch.nn.Module):
    """Advanced indexing (negative indices count from the end) and index_select/gather
    (they do not) of one table."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(6, 4))

    def forward(self, rows, picks, cols):
        return (self.table[rows] + torch.index_select(self.table, 0, picks)
                + torch.gather(self.table[:3], 1, cols))


@pytest.fixture(scope="module")
def embed():
    torch.manual_seed(0)
    module = Embed().eval()
    return module, aicf_tvm.compile(aicf_tvm.from_torch(module, (torch.tensor([[1, 2, 3, 4]]),)))


def test_embedding_in_range_matches_pytorch(embed):
    module, compiled = embed
    rng = np.random.default_rng(0)
    sets = [(rng.integers(0, 100, (1, 4)),) for _ in range(3)]
    assert_matches_reference(compiled, torch_function(module), sets, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [150, 10**9, 2**32 + 1, -1])
def test_embedding_of_an_id_pytorch_refuses_raises_naming_it(embed, bad):
    """PyTorch raises IndexError; the compiled model read a finite, wrong row (150: the row
    150 mod 100; 2**32 + 1: row 1 after TVM's int32 cast; -1: the last row)."""
    module, compiled = embed
    ids = np.array([[1, 2, bad, 4]])
    with pytest.raises(IndexError), torch.no_grad():
        module(torch.from_numpy(ids))
    with pytest.raises(InputError, match=rf"input ids: index {bad} at \[0, 2\] is out of range "
                                         r"\[0, 100\) of embedding of a float32 \[100, 16\]"):
        compiled(ids)


def test_no_fast_mode_warning_while_importing_and_compiling(capfd):
    """TVM warns "Fast mode segfaults when there are out-of-bounds indices" for each take it
    legalizes in fast mode (FoldConstant of the position table read it twice here, a decoder
    77 times); every take now reads checked or proven indices in clip mode."""
    torch.manual_seed(1)
    capfd.readouterr()
    aicf_tvm.compile(aicf_tvm.from_torch(Embed().eval(), (torch.tensor([[5, 6, 7]]),)))
    assert "Fast mode" not in capfd.readouterr().err


def test_negative_indices_follow_each_torch_op():
    torch.manual_seed(2)
    module = Lookups().eval()
    args = (torch.tensor([0, -1, 5]), torch.tensor([2, 0, 1]), torch.tensor([[0, 3, 1, 2]] * 3))
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(module, args))
    rng = np.random.default_rng(3)
    sets = [(rng.integers(-6, 6, 3), rng.integers(0, 6, 3), rng.integers(0, 4, (3, 4)))
            for _ in range(3)]
    assert_matches_reference(compiled, torch_function(module), sets, rtol=1e-6, atol=1e-6)
    rows, picks, cols = sets[0]
    bad_cols = cols.copy()
    bad_cols[0, 0] = -1
    cases = [((rows, np.array([2, -1, 1]), cols), r"input picks: index -1 at \[1\] is out of"),
             ((rows, picks, bad_cols), r"input cols: index -1 at \[0, 0\] is out of range \[0, 4"),
             ((np.array([0, -7, 1]), picks, cols), r"input rows: index -7 at \[1\] is out of")]
    for bad, message in cases:
        with pytest.raises((IndexError, RuntimeError)), torch.no_grad():
            module(*(torch.from_numpy(a) for a in bad))
        with pytest.raises(InputError, match=message):
            compiled(*bad)


class Indexing(torch.nn.Module):
    """``F.unfold`` (exported as advanced indexing by broadcast aranges), indices that
    broadcast against each other, and indices of axes that are not neighbours."""

    def forward(self, x, i, j):
        patches = torch.nn.functional.unfold(x, kernel_size=3, padding=1, stride=2)
        grid = x[:, :, i[:, None], j[None, :]]  # [1, 3, len(i), len(j)]
        apart = x[0].permute(1, 0, 2)[i, :, j]  # axes 0 and 2: the broadcast axis first, [len(i), 3]
        return patches.sum() + grid.sum(-1, keepdim=True) * apart.sum()


def test_advanced_indexing_with_broadcast_indices_matches_pytorch():
    """TVM's translator refused these index shapes (``F.unfold``: MobileViTV2, ConvBERT);
    negative indices count from the end, as in PyTorch, and one past the axis is named."""
    module = Indexing().eval()
    rng = np.random.default_rng(4)
    args = (torch.randn(1, 3, 7, 7), torch.tensor([0, -1, 2]), torch.tensor([1, 6, -3]))
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(module, args))
    sets = [(rng.standard_normal((1, 3, 7, 7)).astype("float32"), rng.integers(-7, 7, 3), rng.integers(-7, 7, 3))
            for _ in range(3)]
    assert_matches_reference(compiled, torch_function(module), sets, rtol=1e-5, atol=1e-5)
    x, _, j = sets[0]
    with pytest.raises(IndexError), torch.no_grad():
        module(torch.from_numpy(x), torch.tensor([0, 7, 1]), torch.from_numpy(j))
    with pytest.raises(InputError, match=r"input i: index 7 at \[1\] is out of range"):
        compiled(x, np.array([0, 7, 1]), j)


class MaskAssign(torch.nn.Module):
    """``y[x > 0] = 0.0`` (Longformer), an accumulating one, and a mask over the leading axes."""

    def forward(self, x):
        y = x * 2
        y[x > 0] = 0.0
        y = y.index_put((x < -1,), torch.tensor(1.5), accumulate=True)
        y[x.sum(-1) > 0] = -3.0
        return y


class MaskAssignValues(torch.nn.Module):
    def forward(self, x, v):
        y = x.clone()
        y[x > 0] = v
        return y


def test_boolean_mask_assignment_matches_pytorch():
    """TVM's translator takes integer indices only; one value per mask is a ``where``, a
    tensor of values (its shape depends on the data) is refused by name."""
    module = MaskAssign().eval()
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(module, (torch.randn(4, 5),)))
    rng = np.random.default_rng(5)
    sets = [(rng.standard_normal((4, 5)).astype("float32") * 2,) for _ in range(3)]
    assert_matches_reference(compiled, torch_function(module), sets, rtol=0, atol=0)
    x = -torch.ones(4, 5)
    x[0, :3] = 1.0  # three positive: three values
    with pytest.raises(aicf_tvm.UnsupportedModelError, match="shape that depends on the data"):
        aicf_tvm.from_torch(MaskAssignValues(), (x, torch.randn(3)))


class Windows(torch.nn.Module):
    """Overlapping windows by ``as_strided`` (Longformer's chunks), of a transposed view."""

    def forward(self, x):
        t = x.transpose(0, 1)  # [8, 4, 16] over [4, 8, 16]'s storage
        windows = t.as_strided((4, 3, 4, 16), (16, 128, 64, 1))
        return windows * 2 + x.as_strided((4, 16), (3, 1), 7).reshape(4, 1, 1, 16)  # with an offset


def test_strided_windows_match_pytorch():
    """TVM's translator takes only strides of a contiguous layout; overlapping windows read
    each element where PyTorch's storage has it (the same values)."""
    module = Windows().eval()
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(module, (torch.randn(4, 8, 16),)))
    rng = np.random.default_rng(6)
    sets = [(rng.standard_normal((4, 8, 16)).astype("float32"),) for _ in range(3)]
    assert_matches_reference(compiled, torch_function(module), sets, rtol=0, atol=0)
