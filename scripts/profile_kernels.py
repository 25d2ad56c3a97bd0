"""Time every kernel of a compiled model on its own: ``python -m scripts.profile_kernels MODEL``.

MODEL is anything ``aicf_tvm.load_model`` takes (a built-in name, an ONNX path), the
name of a light ONNX model shipped with the ``onnx`` wheel (``squeezenet``,
``shufflenet``, ...), or ``hf:NAME`` for a ``transformers`` model of
``scripts/bench_peers.py`` (``hf:gpt2``, ``hf:llama``, ``hf:resnet50``, ...; ``--seq``).
Each distinct PrimFunc the model calls is built alone for the same
target and timed with TVM's ``time_evaluator`` on random arguments of its parameter
shapes; the table lists kernels by total time (time per call x calls per inference) with
their kind, chosen schedule and share of the sum.

``--in-model`` also times every kernel call inside the compiled model (a VM instrument
around each call, the median of ``--runs`` calls of the model on random inputs) and
prints each kernel's time per call there beside its time alone: a kernel alone runs
again and again on the same operands, hot in the caches, while in the model its
weights and inputs come from wherever the previous kernels left them.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np
import tvm
from tvm import tirx

import aicf_tvm
from aicf_tvm.driver.tuning.in_models import kernel_seconds, model_inputs
from aicf_tvm.runtime.threads import use_threads
from relax_passes.lower_emits import kernel_calls
from scripts import harness


def resolve(model: str, seq: int):
    if model.startswith("hf:"):  # the same model, weights and inputs as bench_peers
        built = harness.build(model[3:], seq)
        return aicf_tvm.from_torch(built.module, built.inputs)
    import onnx

    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{model}.onnx"
    return str(light) if light.exists() else model


def random_args(func: tirx.PrimFunc, device) -> list:
    rng = np.random.default_rng(0)
    out = []
    for p in func.params:
        shape = [int(d) for d in p.ty.shape]
        dtype = str(p.ty.dtype)
        data = rng.standard_normal(shape) if dtype.startswith("float") else rng.integers(0, 2, shape)
        out.append(tvm.runtime.tensor(data.astype(dtype), device))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--seq", type=int, default=128, help="sequence length of hf: text models")
    parser.add_argument("--in-model", action="store_true",
                        help="also time each kernel's calls inside the model (module docstring)")
    parser.add_argument("--runs", type=int, default=15, help="model calls timed with --in-model")
    args = parser.parse_args()
    # cache=False: the compile's stages (a library from the cache has none)
    compiled = aicf_tvm.compile(resolve(args.model, args.seq), target=args.target, cache=False)
    calls = collections.Counter(kernel_calls(compiled.lowered["main"]))
    kinds = {k.name: (k.kind, k.schedule) for k in compiled.kernels}
    device = tvm.cpu()
    use_threads(compiled.threads)  # the kernels alone, with the threads the model runs with
    rows = []
    for name, count in calls.items():
        func = compiled.lowered[name].with_attr("global_symbol", "kernel")
        if any(not isinstance(d, tirx.IntImm) for p in func.params for d in getattr(p.ty, "shape", ())):
            continue  # symbolic extents (an index check kernel): timed in the model only
        lib = tvm.compile(tvm.IRModule({"kernel": func}), target=compiled.target)
        timer = lib.jit().time_evaluator("kernel", device, number=5, repeat=3, min_repeat_ms=20)
        secs = float(np.median(timer(*random_args(func, device)).results))
        rows.append((secs * count, secs, count, name))
    total = sum(r[0] for r in rows)
    in_model, whole = time_in_model(compiled, calls, args.runs) if args.in_model else ({}, None)
    extra = f" {'in model':>9s} {'x':>5s}" if in_model else ""
    print(f"{'kernel':40s} {'kind':24s} {'schedule':12s} {'calls':>5s} {'ms/call':>9s} {'share':>6s}{extra}")
    for t, secs, count, name in sorted(rows, reverse=True)[: args.top]:
        kind, schedule = kinds.get(name, ("?", "?"))
        extra = f" {in_model[name] * 1e3:9.3f} {in_model[name] / secs:5.2f}" if name in in_model else ""
        print(f"{name:40s} {kind:24s} {schedule:12s} {count:5d} {secs * 1e3:9.3f} {t / total:6.1%}{extra}")
    print(f"sum of kernel times: {total * 1e3:.2f} ms over {sum(calls.values())} calls")
    if in_model:
        inside = sum(in_model[name] * count for name, count in calls.items() if name in in_model)
        print(f"in the model: the kernels' calls {inside * 1e3:.2f} ms, a whole call {whole * 1e3:.2f} ms "
              f"(medians of {args.runs} calls)")


def time_in_model(compiled, calls: collections.Counter, runs: int) -> tuple[dict[str, float], float | None]:
    """Each kernel's median seconds per call inside ``compiled`` (instrumented calls), and
    the median seconds of a whole uninstrumented call; nothing when an input dim is symbolic."""
    inputs = model_inputs(compiled.lowered)
    if inputs is None:
        print("--in-model: the model has a symbolic input dim; pass a static model", file=sys.stderr)
        return {}, None
    for _ in range(3):  # load the code, allocate the storage, wake the threads
        compiled(*inputs)
    per_run: dict[str, list[float]] = collections.defaultdict(list)
    whole = []
    for _ in range(runs):
        spent: dict[str, float] = collections.defaultdict(float)
        kernel_seconds(compiled, inputs, {name: name for name in calls}, spent)
        for name, secs in spent.items():
            per_run[name].append(secs / calls[name])
        begin = time.perf_counter()
        compiled(*inputs)
        whole.append(time.perf_counter() - begin)
    return {name: float(np.median(v)) for name, v in per_run.items()}, float(np.median(whole))


if __name__ == "__main__":
    main()
