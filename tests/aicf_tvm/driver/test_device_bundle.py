"""The device-check bundle's pieces (``scripts/gpu_bundle.py``, ``scripts/bundle_runner.py``)
on small models: the build host's reference is checked against numpy and the PyTorch
twin, and the runner's comparison passes our exported library and flags a wrong one.

The whole bundle (wheels, runtime, ``run.sh`` from a clean interpreter) is README's
"Device check"; this keeps the scripts from drifting away from the code they import.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest

import aicf_tvm
from aicf_tvm.driver.models import decoder_block
from scripts import bundle_models, bundle_runner

gpu_bundle = pytest.importorskip("scripts.gpu_bundle")


@pytest.fixture
def bundle_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for sub in ("models", "data"):
        (tmp_path / sub).mkdir()
    monkeypatch.setattr(bundle_runner, "HERE", tmp_path)
    return tmp_path


@pytest.mark.parametrize("which", ["decoder", "convnet"])
def test_bundled_model_passes_the_runner_and_a_wrong_reference_fails(bundle_dir: Path, which: str):
    pytest.importorskip("torch")
    streams = bundle_models.Streams()
    model = (bundle_models.transformer("decoder_block", partial(decoder_block, seq=16, hidden=64, heads=4), 4, streams)
             if which == "decoder" else bundle_models.convnet(streams, batch=1, size=16, stages=(8, 16)))
    entry = gpu_bundle.write_model(model, "llvm", bundle_dir)  # checks its reference vs numpy/torch
    check = bundle_runner.Check(entry, bundle_models.SEED)
    assert len(set(map(bundle_runner.digest, [[a] for a in check.arrays]))) == len(check.arrays)
    compiled = aicf_tvm.load(bundle_dir / entry["library"])
    outputs = bundle_runner._flat(compiled(*check.arrays))
    ok, worst = check.compare(outputs)
    assert ok and worst < 1e-4
    ref = bundle_dir / entry["reference"][0]["file"]
    want = np.load(ref)
    want.reshape(-1)[want.size // 2] += 0.5  # one element off
    np.save(ref, want)
    assert not check.compare(outputs)[0]
