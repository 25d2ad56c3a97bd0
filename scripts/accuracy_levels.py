"""Each numeric level's error against a float64 run of the same model, beside PyTorch float32's.

Usage: ``python -m scripts.accuracy_levels [MODEL ...] [--seq N] [--levels exact relaxed]``

The peers benchmark's models as the A/B scripts build them (``scripts.harness.ab_model``:
text models at 128 tokens, a 3-layer Qwen2-style decoder at 96), random weights from a
fixed seed.  The reference is PyTorch on the
model and inputs converted to float64 (``module.double()``).  Per model: PyTorch float32's
error and each level's (``aicf_tvm.compile(..., numerics=LEVEL)``), each the largest
``|y - y64|`` over the largest ``|y64|``, and each level's error over PyTorch's.
docs/numerics.md ("Numeric levels") holds the table and the rule it checks: a level
meets PyTorch's accuracy on a model when its error is at most 2x PyTorch float32's.
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


def _error(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(y.astype(np.float64) - ref).max() / np.abs(ref).max())


def _float64(tensors: tuple) -> tuple:
    return tuple(t.double() if t.is_floating_point() else t for t in tensors)


def measure(name: str, seq: int, levels: list[str]) -> dict[str, float] | None:
    """Errors of PyTorch float32 (``torch``) and of each level on ``name``; None when its
    output does not depend on its input."""
    import copy

    import torch

    import aicf_tvm

    model = ab_model(name, seq)
    with torch.no_grad():
        y32 = model.module(*model.inputs).numpy()
        if np.array_equal(y32, model.module(*model.other_inputs).numpy()):
            return None
        y64 = copy.deepcopy(model.module).double()(*_float64(model.inputs)).numpy()
    errors = {"torch": _error(y32, y64)}
    mod = aicf_tvm.from_torch(model.module, model.inputs)
    for level in levels:
        compiled = aicf_tvm.compile(mod, numerics=level, cache=False)
        errors[level] = _error(np.asarray(compiled(*[t.numpy() for t in model.inputs])), y64)
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=model_name, default=list(MODELS))
    parser.add_argument("--seq", type=int, default=128, help="the text models' length")
    parser.add_argument("--levels", nargs="+", default=["exact", "relaxed"])
    args = parser.parse_args()
    names = [m for n in args.models for m in ((*TRANSFORMERS, *CONVNETS, *CLASS) if n == "class" else (n,))]
    print(f"{'model':14s} {'torch f32':>10s} " + " ".join(f"{lv:>10s} {'x torch':>8s}" for lv in args.levels),
          flush=True)
    missed = []
    for name in names:
        errors = measure(name, args.seq, args.levels)
        if errors is None:
            print(f"{name:14s} skipped: two inputs give the same output", flush=True)
            continue
        cells = []
        for level in args.levels:
            ratio = errors[level] / errors["torch"]
            cells.append(f"{errors[level]:10.2e} {ratio:8.2f}")
            if ratio > WITHIN:
                missed.append(f"{name} at {level}")
        print(f"{name:14s} {errors['torch']:10.2e} " + " ".join(cells), flush=True)
    if missed:
        print(f"over {WITHIN}x PyTorch float32's error: {', '.join(missed)}")
        sys.exit(1)
    print(f"every level within {WITHIN}x PyTorch float32's error on every model")


if __name__ == "__main__":
    main()
