"""Each numeric level's error against a float64 run of the same model, beside PyTorch float32's.

Usage: ``python -m scripts.accuracy_levels [MODEL ...] [--seq N] [--levels exact relaxed]``

The peers benchmark's models as the A/B scripts build them (``scripts.harness.ab_model``:
text models at 128 tokens, a 3-layer Qwen2-style decoder at 96), random weights from a
fixed seed, each run on its two input sets.  The reference is PyTorch on the model and
inputs converted to float64 (``module.double()``).  Two errors per engine, each the larger
over the two inputs: ``norm``, ``||y - y64|| / ||y64||`` (the normwise relative error), and
``peak``, the largest ``|y - y64|`` over the largest ``|y64|`` (one element's extreme:
noisier).  Printed: PyTorch float32's errors, and each level's
(``aicf_tvm.compile(..., numerics=LEVEL)``) as a multiple of PyTorch's.
docs/numerics.md ("Numeric levels") holds the table and the rule it checks: a level
meets PyTorch's accuracy on a model when its normwise error is at most 2x PyTorch float32's.
Exits 1 when a level misses that on some model.  Two different inputs must give different
outputs (a random-init model can ignore its input), else the model is skipped as uncheckable.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from scripts.harness import CLASS, CONVNETS, TRANSFORMERS, ab_model, model_name

MODELS = ("bert", "gpt2", "llama", "vit", "distilbert", "qwen2", "whisper", "swin", *CONVNETS, "efficientnet",
          "regnet")
WITHIN = 2.0  # a level meets PyTorch's accuracy when its error is at most this times PyTorch float32's


def _errors(ys: list[np.ndarray], refs: list[np.ndarray]) -> tuple[float, float]:
    """(norm, peak) errors of ``ys`` against ``refs``, each the larger over the inputs."""
    norm = max(float(np.linalg.norm(y.astype(np.float64) - r) / np.linalg.norm(r)) for y, r in zip(ys, refs))
    peak = max(float(np.abs(y.astype(np.float64) - r).max() / np.abs(r).max()) for y, r in zip(ys, refs))
    return norm, peak


def _float64(tensors: tuple) -> tuple:
    return tuple(t.double() if t.is_floating_point() else t for t in tensors)


def measure(name: str, seq: int, levels: list[str]) -> dict[str, tuple[float, float]] | None:
    """(norm, peak) errors of PyTorch float32 (``torch``) and of each level on ``name``;
    None when its output does not depend on its input."""
    import copy

    import torch

    import aicf_tvm

    model = ab_model(name, seq)
    feeds = [model.inputs, model.other_inputs]
    with torch.no_grad():
        y32 = [model.module(*inputs).numpy() for inputs in feeds]
        if np.array_equal(*y32):
            return None
        double = copy.deepcopy(model.module).double()
        y64 = [double(*_float64(inputs)).numpy() for inputs in feeds]
    errors = {"torch": _errors(y32, y64)}
    mod = aicf_tvm.from_torch(model.module, model.inputs)
    for level in levels:
        compiled = aicf_tvm.compile(mod, numerics=level, cache=False)
        ys = [np.asarray(compiled(*[t.numpy() for t in inputs])) for inputs in feeds]
        errors[level] = _errors(ys, y64)
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=model_name, default=list(MODELS))
    parser.add_argument("--seq", type=int, default=128, help="the text models' length")
    parser.add_argument("--levels", nargs="+", default=["exact", "relaxed"])
    args = parser.parse_args()
    names = [m for n in args.models for m in ((*TRANSFORMERS, *CONVNETS, *CLASS) if n == "class" else (n,))]
    print(f"{'model':14s} {'torch norm':>10s} {'peak':>9s} "
          + " ".join(f"{lv + ' norm':>13s} {'peak':>5s}" for lv in args.levels) + "   (levels: x torch)", flush=True)
    missed = []
    for name in names:
        errors = measure(name, args.seq, args.levels)
        if errors is None:
            print(f"{name:14s} skipped: two inputs give the same output", flush=True)
            continue
        norm, peak = errors["torch"]
        cells = []
        for level in args.levels:
            ratio = errors[level][0] / norm
            cells.append(f"{ratio:13.2f} {errors[level][1] / peak:5.2f}")
            if ratio > WITHIN:
                missed.append(f"{name} at {level}")
        print(f"{name:14s} {norm:10.2e} {peak:9.2e} " + " ".join(cells), flush=True)
    if missed:
        print(f"over {WITHIN}x PyTorch float32's error: {', '.join(missed)}")
        sys.exit(1)
    print(f"every level within {WITHIN}x PyTorch float32's error on every model")


if __name__ == "__main__":
    main()
