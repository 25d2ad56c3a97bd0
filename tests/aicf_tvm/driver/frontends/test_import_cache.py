"""The import cache (``aicf_tvm/driver/frontends/import_cache.py``): ``from_torch`` of a
module traced before reads its module back (structurally equal, not decomposed again,
its weights mapped from the entry); a changed weight, forward, shape or dim name misses;
a corrupt entry is imported again with a warning; ``cache=False`` writes nothing."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import tvm_ffi

import aicf_tvm
from aicf_tvm.driver.compile_cache import CompileCache
from aicf_tvm.driver.frontends import import_cache, torch_export

torch = pytest.importorskip("torch")


class Block(torch.nn.Module):
    """layer_norm(gelu(x @ w1 + b1) @ w2 + b2 + x), or with relu."""

    def __init__(self, act: str = "gelu") -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(7)
        self.up = torch.nn.Linear(32, 96)
        self.down = torch.nn.Linear(96, 32)
        self.norm = torch.nn.LayerNorm(32)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        self.act = act

    def forward(self, x):
        h = self.up(x)
        h = torch.nn.functional.gelu(h) if self.act == "gelu" else torch.relu(h)
        return self.norm(self.down(h) + x)


def _import(*args, **kwargs):
    """``from_torch``, its entry written (``import_cache.wait``)."""
    mod = aicf_tvm.from_torch(*args, **kwargs)
    import_cache.wait()
    return mod


def _x(seed: int, rows: int = 6) -> torch.Tensor:
    return torch.randn(rows, 32, generator=torch.Generator().manual_seed(seed))


def _entries(root: Path) -> list[Path]:
    return sorted(root.glob("*.import"))


def _check_against_float64(mod, module: torch.nn.Module, rows: int = 6) -> None:
    model = aicf_tvm.compile(mod, cache=False)
    outs = []
    for seed in (1, 2):
        x = _x(seed, rows)
        with torch.no_grad():
            ref = module.double()(x.double()).numpy()
            module.float()
        got = np.asarray(model(x.numpy()))
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        outs.append(got)
    assert not np.array_equal(*outs)  # two inputs, two outputs


def test_a_second_import_reads_the_first_ones_module_back(tmp_path, monkeypatch):
    module = Block()
    first = _import(module, (_x(0),), cache_dir=tmp_path)
    [entry] = _entries(tmp_path)
    weights = sum(p.numel() for p in module.parameters()) * 4
    assert entry.stat().st_size >= weights  # the weights are in the entry, after the module

    def no_decomposition(*args, **kwargs):
        raise AssertionError("decomposed again")

    monkeypatch.setattr(torch_export, "_decomposed", no_decomposition)
    second = _import(module, (_x(0),), cache_dir=tmp_path)
    assert tvm_ffi.structural_equal(second, first)
    assert tvm_ffi.structural_hash(second) == tvm_ffi.structural_hash(first)  # compile's cache key
    entry.unlink()  # trimmed by another process: the mapping stays valid
    _check_against_float64(second, module)


def test_a_changed_weight_forward_shape_or_dim_name_misses(tmp_path):
    module = Block()
    _import(module, (_x(0),), cache_dir=tmp_path)
    with torch.no_grad():
        module.down.weight[3, 5] += 0.25  # one weight of one layer
    changed = _import(module, (_x(0),), cache_dir=tmp_path)
    _check_against_float64(changed, module)
    relu = Block("relu")  # the same parameters, another forward
    _check_against_float64(_import(relu, (_x(0),), cache_dir=tmp_path), relu)
    _check_against_float64(_import(relu, (_x(0, rows=3),), cache_dir=tmp_path), relu, rows=3)
    for name in ("rows", "tokens"):
        dims = ({0: torch.export.Dim(name, max=64)},)
        mod = _import(relu, (_x(0),), dims, cache_dir=tmp_path)
        assert name in mod["main"].script()
    assert len(_entries(tmp_path)) == 6
    again = _import(relu, (_x(0),), ({0: torch.export.Dim("tokens", max=64)},), cache_dir=tmp_path)
    assert "tokens" in again["main"].script() and len(_entries(tmp_path)) == 6


@pytest.mark.parametrize("damage", ["weight byte", "cut", "header byte", "not an entry"])
def test_a_corrupt_entry_is_imported_again_with_a_warning(tmp_path, damage):
    module = Block()
    first = _import(module, (_x(0),), cache_dir=tmp_path)
    [entry] = _entries(tmp_path)
    data = bytearray(entry.read_bytes())
    if damage == "weight byte":
        data[-100] ^= 0x40
    elif damage == "cut":
        del data[-5000:]
    elif damage == "header byte":
        data[200] ^= 0x01
    else:
        data = bytearray(b"\x7fELF" + bytes(100))
    entry.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="is unusable"):
        again = _import(module, (_x(0),), cache_dir=tmp_path)
    assert tvm_ffi.structural_equal(again, first)
    [rewritten] = _entries(tmp_path)
    assert rewritten.read_bytes() != bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _import(module, (_x(0),), cache_dir=tmp_path)


def test_no_cache_writes_nothing_and_entries_are_trimmed_with_libraries(tmp_path):
    module = Block()
    _import(module, (_x(0),), cache=False, cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())
    _import(module, (_x(0),), cache_dir=tmp_path)
    _import(Block("relu"), (_x(0),), cache_dir=tmp_path)
    older, newer = sorted(_entries(tmp_path), key=lambda p: p.stat().st_mtime_ns)
    store = CompileCache(tmp_path, limit=newer.stat().st_size)
    assert set(store.entries()) == {older, newer}
    store.trim()
    assert store.entries() == [newer]


def test_a_module_whose_weight_another_function_holds_is_not_written(tmp_path):
    from tvm import relax
    from tvm.script import ir as I
    from tvm.script import relax as R

    w = np.arange(2048, dtype=np.float32).reshape(32, 64)

    @I.ir_module
    class Mod:
        @R.function(private=True)
        def helper(x: R.Tensor((4, 32), "float32")) -> R.Tensor((4, 64), "float32"):
            return R.matmul(x, R.const(w))

        @R.function
        def main(x: R.Tensor((4, 32), "float32")) -> R.Tensor((4, 64), "float32"):
            cls = Mod
            return cls.helper(x)

    assert isinstance(Mod["helper"], relax.Function)
    assert import_cache.put(CompileCache(tmp_path), "k", Mod) is False and not any(tmp_path.iterdir())
