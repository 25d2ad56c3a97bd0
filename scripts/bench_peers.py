"""Ours against the engines a user would pick instead, on real ``transformers`` models.

Usage::

    python -m scripts.bench_peers [--models bert gpt2 llama vit resnet50 mobilenetv2 convnext]
                                  [--peers eager inductor ort openvino tvm ours]
                                  [--rounds 10] [--budget B [--time-budget S]] [--json bench_peers.json]

Run it as a user runs our compiler: a fresh process, no environment variable set for us.
Every peer gets the same thread count (``--threads``, default: the CPUs this process may
use) and the same inputs, in ONE process:

* ``eager``: PyTorch eager under ``torch.inference_mode``.
* ``inductor``: ``torch.compile`` (Inductor, ``freezing=True``).
* ``ort``: ONNX Runtime, CPU EP, every graph optimization, spinning off; on the model that
  ``torch.onnx.export`` writes.
* ``openvino``: OpenVINO CPU on the same ONNX file, ``INFERENCE_PRECISION_HINT=f32``,
  latency hint.
* ``tvm``: TVM's default Relax pipeline on the module ``aicf_tvm.from_torch`` imports
  (slow; not in the default peers).
* ``ours``: ``aicf_tvm.from_torch`` then ``aicf_tvm.compile(mod, target="llvm")`` (compiled, not
  loaded from the compile cache: ``cache=False``, so that the compile seconds are), called on
  numpy arrays, exactly the README's path. With ``--budget B``, also ``ours_tuned``:
  ``aicf_tvm.tune`` with B trials (and ``--time-budget S``: at most S seconds of search,
  ``aicf tune --time-budget``), then ``compile(database=...)``; its note says how many
  kernels kept a record and, from the timing inside the model, why the others did not
  (no record won the screening turns, or the winners did not make the call 2% faster).
  With ``--builds N``
  both are compiled N times and the rounds call the builds in turn: one build's speed is
  one draw of where its weights lie.

``--int8`` runs the quantized models users deploy instead (default models: BERT,
ResNet-50, MobileNetV2, and BERT dynamic-quantized, ``bert:dynamic``): each model's ONNX
file quantized by ONNX Runtime's ``quantize_static`` (QDQ, per-channel int8 weights,
uint8 activations, calibrated on 8 random input batches) or ``quantize_dynamic``
(``NAME:dynamic``); the peers are ONNX Runtime, OpenVINO and ours (``aicf_tvm.compile`` of
that file), all on the same file. Each output is compared with the float32 model's
(PyTorch eager): the note gives its relative L2 error, and ours is marked ``MISMATCH``
when its error exceeds 1.5x ONNX Runtime's + 0.01 (two int8 engines round differently at
every requantization, so each is judged against float32, not against each other).

Models have random weights (seeded); decoders get the all-ones attention mask a tokenizer
returns; batch-norm statistics are calibrated on random batches so the output depends on
the input (checked: two inputs must give two outputs). Every peer's output is checked
against PyTorch eager (``max|a-b| / max|ref| <= --tol``) and marked ``MISMATCH`` when not.
Timing is interleaved: each round calls every peer once per model in turn (after a pause
that lets the previous engine's spinning threads sleep), in an order shuffled each round
so that each peer runs right after each other peer about equally often: a neighbour that
steals a core hurts all peers alike. The median over rounds is reported. Printed per
model: latency of each peer, ratio ours/peer (of the medians, and ``paired``: the median
of the rounds' own ratios, steadier where the machine's speed drifts between rounds) and
compile seconds; then the geometric mean of each ratio of the medians. The JSON keeps every
round's time and the peer that ran just before it,
and under ``run`` where it ran: date, command, commit, CPU model and ISA flags, our target,
the peers' versions (``scripts/benchmarks_md.py`` turns such files into ``docs/benchmarks.md``).
"""

from __future__ import annotations

import argparse
import copy
import functools
import itertools
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scripts.harness import CLASS, CONVNETS, SEQ, SIZED, TRANSFORMERS, Model, build, model_name

PEERS = ("eager", "inductor", "ort", "openvino", "tvm", "ours")
DEFAULT_PEERS = ("eager", "inductor", "ort", "openvino", "ours")
INT8_MODELS = ("bert", "resnet50", "mobilenetv2", "bert:dynamic")
INT8_PEERS = ("ort", "openvino", "ours")
CALIBRATION_BATCHES = 8


def int8_name(text: str) -> str:
    """``NAME`` or ``NAME:dynamic`` (``--int8``: quantize_dynamic instead of quantize_static)."""
    name, _, how = text.partition(":")
    if how not in ("", "dynamic"):
        raise argparse.ArgumentTypeError(f"{text}: NAME or NAME:dynamic")
    return model_name(name) + (":dynamic" if how else "")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=None, type=int8_name,
                        help="names of " + ", ".join([*TRANSFORMERS, *CONVNETS, *CLASS]) + ", or class (all of "
                        "CLASS); a convnet at another image size: NAME@SIZE (" + ", ".join(SIZED) + ")")
    parser.add_argument("--peers", nargs="+", default=None, choices=PEERS,
                        help=f"default: {' '.join(DEFAULT_PEERS)} ({' '.join(INT8_PEERS)} with --int8)")
    parser.add_argument("--int8", action="store_true",
                        help="the models quantized by ONNX Runtime (QDQ; NAME:dynamic for quantize_dynamic), "
                        f"default models {' '.join(INT8_MODELS)}")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds (median)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="threads for every peer except ours (default: the CPUs this process may use)")
    parser.add_argument("--budget", type=int, default=0, help="tuning trials for ours_tuned (0: skip)")
    parser.add_argument("--time-budget", type=float, default=None, metavar="S",
                        help="with --budget: seconds ours_tuned's search may take (aicf tune --time-budget)")
    parser.add_argument("--builds", type=int, default=1,
                        help="compiles of ours (and ours_tuned), called in turn round by round")
    parser.add_argument("--tol", type=float, default=1e-3, help="max |a-b| / max |ref| allowed")
    parser.add_argument("--seq", type=int, default=SEQ, help="sequence length of the text models")
    parser.add_argument("--json", default="bench_peers.json", metavar="PATH",
                        help="write the results and where they were taken (default: bench_peers.json)")
    parser.add_argument("--work-dir", default=None, help="where ONNX files and tuning records go")
    args = parser.parse_args()
    if args.models is None:
        args.models = list(INT8_MODELS if args.int8 else TRANSFORMERS)
    if args.peers is None:
        args.peers = list(INT8_PEERS if args.int8 else DEFAULT_PEERS)
    if not args.int8 and any(":" in m for m in args.models):
        parser.error("NAME:dynamic needs --int8")
    if args.time_budget is not None and not args.budget:
        parser.error("--time-budget bounds the tuning of --budget B (give both)")
    if args.int8 and (set(args.peers) - set(INT8_PEERS) or args.budget):
        parser.error(f"--int8 runs {', '.join(INT8_PEERS)} on the quantized file, without tuning")
    return args


# ----------------------------------------------------------------------------- peers

Runner = Callable[[], np.ndarray]


@dataclass
class Peer:
    run: Runner
    compile_s: float
    note: str = ""
    times: list[float] = field(default_factory=list)
    after: list[str] = field(default_factory=list)  # the peer timed just before, per round
    paired: float = float("nan")  # the median over rounds of ours' time over this peer's


def _numpy(model: Model) -> list[np.ndarray]:
    return [t.numpy() for t in model.inputs]


def eager(model: Model, threads: int, work: Path) -> Runner:
    import torch

    def run() -> np.ndarray:
        with torch.inference_mode():
            return model.module(*model.inputs).numpy()

    return run


def inductor(model: Model, threads: int, work: Path) -> Runner:
    import torch
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    compiled = torch.compile(model.module)

    def run() -> np.ndarray:
        with torch.inference_mode():
            return compiled(*model.inputs).numpy()

    run()  # compiles
    return run


def onnx_file(model: Model, work: Path) -> Path:
    import torch

    path = work / f"{model.name}.onnx"
    if not path.exists():
        # a copy: the trace runs torch.jit.is_tracing() branches that store tensors in the
        # module (Swin's window_size), which every later peer would see
        with torch.no_grad():
            torch.onnx.export(copy.deepcopy(model.module), model.inputs, str(path), input_names=list(model.names),
                              output_names=["output"], opset_version=17, dynamo=False)
    return path


def quantized_file(model: Model, work: Path, dynamic: bool) -> Path:
    """The model's ONNX file quantized as a user does it with ONNX Runtime (module docstring)."""
    import torch
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    source = onnx_file(model, work)
    path = work / f"{model.name}-{'dynamic' if dynamic else 'qdq'}.onnx"
    if path.exists():
        return path
    if dynamic:
        quantize_dynamic(str(source), str(path), weight_type=QuantType.QInt8)
        return path
    gen = torch.Generator().manual_seed(2)

    def batch(k: int) -> dict[str, np.ndarray]:
        if k < 2:
            return dict(zip(model.names, _numpy(model) if k == 0 else [t.numpy() for t in model.other_inputs]))
        out = {}
        for name, t in zip(model.names, model.inputs):
            if t.is_floating_point():
                out[name] = torch.randn(t.shape, generator=gen).numpy()
            elif bool((t == 1).all()):  # an attention mask
                out[name] = t.numpy()
            else:  # token ids
                out[name] = torch.randint(0, int(t.max()) + 1, t.shape, generator=gen).numpy()
        return out

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([batch(k) for k in range(CALIBRATION_BATCHES)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    quantize_static(str(source), str(path), Batches(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return path


# the ONNX file ort, openvino and (with --int8) ours run: main sets it per model
model_file: Callable[[Model, Path], Path] = onnx_file


def _feeds(model: Model, names: set[str]) -> dict[str, np.ndarray]:
    """The model's inputs an engine's graph takes (an export may drop an unused one)."""
    return {n: a for n, a in zip(model.names, _numpy(model)) if n in names}


def ort_session(model: Model, path: Path, threads: int, profile_prefix: str | None = None) -> tuple[Any, dict]:
    """ONNX Runtime's session of the peer ``ort`` (module docstring) on ``path``, and its
    feeds; ``profile_prefix``: with its profiler on (``scripts/profile_peers.py``)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return sess, _feeds(model, {i.name for i in sess.get_inputs()})


def openvino_request(model: Model, path: Path, threads: int, perf_count: bool = False) -> tuple[Any, Any, dict]:
    """OpenVINO's compiled model of the peer ``openvino`` (module docstring) on ``path``, an
    infer request and its feeds; ``perf_count``: with ``PERF_COUNT`` on (``profile_peers``)."""
    import openvino as ov

    config = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_NUM_THREADS": threads}
    if perf_count:
        config["PERF_COUNT"] = True
    compiled = ov.Core().compile_model(str(path), "CPU", config)
    names = {n for port in compiled.inputs for n in port.get_names()}
    return compiled, compiled.create_infer_request(), _feeds(model, names)


def ort(model: Model, threads: int, work: Path) -> Runner:
    sess, feeds = ort_session(model, model_file(model, work), threads)
    return lambda: sess.run(None, feeds)[0]


def openvino(model: Model, threads: int, work: Path) -> Runner:
    compiled, request, feeds = openvino_request(model, model_file(model, work), threads)

    def run() -> np.ndarray:
        return np.array(request.infer(feeds)[compiled.outputs[0]])

    return run


def tvm_default(model: Model, threads: int, work: Path) -> Runner:
    import tvm
    from tvm import relax

    import aicf_tvm
    from aicf_tvm.runtime.targets import resolve_target

    target = resolve_target("llvm")
    mod = aicf_tvm.from_torch(model.module, model.inputs)
    ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in _numpy(model)]

    def run() -> np.ndarray:
        out = vm["main"](*args)
        return (out if hasattr(out, "numpy") else out[0]).numpy()

    return run


def _first(out: Any) -> np.ndarray:
    return out[0] if isinstance(out, (list, tuple)) else out


def ours(model: Model, threads: int, work: Path, database: str | None = None, builds: int = 1) -> Runner:
    """``builds`` compiles of the model, called in turn (each warmed up, each giving the
    first's output bits): where a build's weights lie moves its kernels (on 2 Zen 5 cores,
    four ResNet-50 builds in one process ran 22.9-24.7 ms), so one build is one draw."""
    import aicf_tvm

    # with --int8, the quantized ONNX file (model_file); else the module from_torch imports
    quantized = model_file is not onnx_file
    mod = str(model_file(model, work)) if quantized else aicf_tvm.from_torch(model.module, model.inputs)
    # cache=False: each build compiled (its compile seconds reported), none loaded from the cache
    compiled = [aicf_tvm.compile(mod, target="llvm", database=database, cache=False) for _ in range(builds)]
    args = _numpy(model)
    first = _first(compiled[0](*args))
    for other in compiled[1:]:
        if not np.array_equal(_first(other(*args)), first):
            raise RuntimeError("two builds of one model gave different outputs")
    turn = itertools.count()
    return lambda: _first(compiled[next(turn) % builds](*args))


def ours_tuned(model: Model, threads: int, work: Path, budget: int, builds: int = 1,
               time_budget: float | None = None) -> tuple[Runner, str]:
    import aicf_tvm

    mod = aicf_tvm.from_torch(model.module, model.inputs)
    tuning = work / f"tuning_{model.name}"
    start = time.perf_counter()
    result = aicf_tvm.tune(mod, target="llvm", work_dir=str(tuning), trials=budget, time_budget=time_budget)
    tune_s = time.perf_counter() - start
    won = sum(t.choice == "tuned" for t in result.tasks)
    limit = f", time budget {time_budget:.0f} s" if time_budget is not None else ""
    note = (f"budget {budget}{limit}: {result.measured} trials measured in {tune_s:.0f} s, "
            f"{won} of {len(result.tasks)} tuned kernels beat the default")
    if result.in_model:  # why the records that won alone were kept or not (``tune_model``)
        note += f"; {result.in_model}"
    if result.search_failed:  # MetaSchedule's search raised: those tasks kept what they measured
        note += f"; {len(result.search_failed)} task search(es) raised: " + " | ".join(result.search_failed)
    return ours(model, threads, work, database=str(tuning), builds=builds), note


BUILDERS: dict[str, Callable[..., Runner]] = {
    "eager": eager, "inductor": inductor, "ort": ort, "openvino": openvino, "tvm": tvm_default,
    "ours": ours,
}


# --------------------------------------------------------------------------- driver


def check(name: str, out: np.ndarray, ref: np.ndarray, tol: float) -> str:
    out = np.asarray(out)
    if out.shape != ref.shape:
        return f"MISMATCH shape {out.shape} vs {ref.shape}"
    err = float(np.max(np.abs(out.astype(np.float64) - ref))) / max(float(np.max(np.abs(ref))), 1e-30)
    return "" if err <= tol else f"MISMATCH rel err {err:.2e}"


def int8_error(out: np.ndarray, ref: np.ndarray) -> float:
    """Relative L2 error of an int8 engine's output against the float32 model's."""
    out = np.asarray(out, dtype=np.float64)
    return float(np.linalg.norm(out - ref) / max(float(np.linalg.norm(ref)), 1e-30)) if out.shape == ref.shape \
        else float("inf")


def judge_int8(peers: dict[str, Peer], errors: dict[str, float]) -> None:
    """Each int8 peer's note: its error against float32; ours a MISMATCH beyond ORT's (module docstring)."""
    for name, peer in peers.items():
        verdict = f"rel L2 err vs float32 {errors[name]:.4f}"
        if name == "ours" and "ort" in errors and errors[name] > 1.5 * errors["ort"] + 0.01:
            verdict = "MISMATCH " + verdict
        peer.note = "; ".join(n for n in (peer.note, verdict) if n)


def build_peers(model: Model, args: argparse.Namespace, work: Path) -> dict[str, Peer]:
    import torch

    with torch.inference_mode():
        ref = model.module(*model.inputs).numpy().astype(np.float64)
        other = model.module(*model.other_inputs).numpy()
    if np.array_equal(ref, other):
        raise SystemExit(f"{model.name}: two different inputs give the same output; the check "
                         "would prove nothing")
    peers: dict[str, Peer] = {}
    errors: dict[str, float] = {}
    names = list(args.peers) + (["ours_tuned"] if args.budget else [])
    for name in names:
        print(f"  building {name} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        note = ""
        try:
            if name == "ours_tuned":
                run, note = ours_tuned(model, args.threads, work, args.budget, args.builds, args.time_budget)
            elif name == "ours":
                run = ours(model, args.threads, work, builds=args.builds)
            else:
                run = BUILDERS[name](model, args.threads, work)
            out = run()
        except Exception as err:  # noqa: BLE001 - a peer that fails is reported, not fatal
            traceback.print_exc(file=sys.stderr)
            print(f"  {name}: FAILED ({type(err).__name__}: {str(err).splitlines()[0][:200]})",
                  file=sys.stderr)
            continue
        compile_s = time.perf_counter() - start
        if args.int8:
            errors[name] = int8_error(out, ref)
            peers[name] = Peer(run, compile_s, note)
            continue
        verdict = check(name, out, ref, args.tol)
        peers[name] = Peer(run, compile_s, "; ".join(n for n in (note, verdict) if n))
    if args.int8:
        judge_int8(peers, errors)
    return peers


def time_rounds(peers: dict[str, Peer], rounds: int) -> None:
    """One call of every peer per round, in an order shuffled each round (seeded): an
    engine's worker threads can keep spinning after it returns and slow whichever peer
    runs next, so each peer follows each other peer about equally often."""
    order = list(peers)
    for peer in peers.values():  # warm-up
        peer.run()
    shuffle, previous = random.Random(0).shuffle, order[-1]
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            peer = peers[name]
            time.sleep(0.05)  # let the previous engine's spinning worker threads go idle
            start = time.perf_counter()
            peer.run()
            peer.times.append(time.perf_counter() - start)
            peer.after.append(previous)
            previous = name


# ISA flags of /proc/cpuinfo that decide our kernels' tiles and the peers' paths
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve")


def run_info(target: str) -> dict[str, Any]:
    """Where and when this run took its numbers: what ``docs/benchmarks.md`` prints."""
    import datetime
    import platform
    import subprocess
    from importlib import metadata

    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                                  text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    cpu: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "cpu family", "model", "flags", "vendor_id") and key not in cpu:
                cpu[key] = value.strip()
    except OSError:
        pass
    flags = set(cpu.get("flags", "").split())
    versions = {}
    for dist in ("apache-tvm", "torch", "onnxruntime", "openvino", "transformers"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", "scripts.bench_peers", *sys.argv[1:]]),
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--",
                          "aicf_tvm", "relax_passes", "schedules")),
        "cpu": cpu.get("model name", platform.processor()),
        "cpu_family": cpu.get("cpu family", ""), "cpu_model": cpu.get("model", ""),
        "isa": [f for f in ISA_FLAGS if f in flags],
        "cpus": len(os.sched_getaffinity(0)),
        "target": target,
        "python": platform.python_version(),
        "versions": versions,
    }


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main() -> None:
    args = parse_args()
    args.models = [m for name in args.models for m in (CLASS if name == "class" else (name,))]
    import torch

    torch.set_num_threads(args.threads)
    import aicf_tvm
    from aicf_tvm.runtime.targets import describe, resolve_target

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_peers_"))
    work.mkdir(parents=True, exist_ok=True)
    target = describe(resolve_target("llvm"))
    mode = "int8 (ONNX Runtime's quantization); " if args.int8 else ""
    info = run_info(target)
    print(f"CPU {info['cpu']} (family {info['cpu_family']} model {info['cpu_model']}), ISA {' '.join(info['isa'])}")
    print(mode + f"target {target}; peers with {args.threads} thread(s); "
          f"TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS', 'unset')}; aicf_tvm {aicf_tvm.__file__}")
    results: dict[str, dict] = {}
    ratios: dict[str, list[float]] = {}
    global model_file
    for name in args.models:
        print(f"{name}:", file=sys.stderr, flush=True)
        base, _, how = name.partition(":")
        model = build(base, args.seq)
        if args.int8:
            model_file = functools.partial(quantized_file, dynamic=how == "dynamic")
        peers = build_peers(model, args, work)
        time_rounds(peers, args.rounds)
        medians = {p: statistics.median(peer.times) * 1e3 for p, peer in peers.items()}
        print(f"\n{name}")
        print(f"  {'peer':<11}{'ms':>10}{'ours/peer':>11}{'paired':>8}{'compile s':>11}  note")
        for p, peer in peers.items():
            ratio = medians["ours"] / medians[p] if "ours" in medians else float("nan")
            paired = (statistics.median(o / t for o, t in zip(peers["ours"].times, peer.times))
                      if "ours" in peers else float("nan"))
            if p != "ours" and "ours" in medians and not peer.note.startswith("MISMATCH"):
                ratios.setdefault(p, []).append(ratio)
            print(f"  {p:<11}{medians[p]:>10.2f}{ratio:>11.2f}{paired:>8.2f}{peer.compile_s:>11.1f}  {peer.note}")
            peer.paired = paired
        results[name] = {p: {"ms": medians[p], "compile_s": peers[p].compile_s, "note": peers[p].note,
                             "paired_ours_over": peers[p].paired,
                             "times_ms": [t * 1e3 for t in peers[p].times],
                             "after": peers[p].after} for p in peers}
    print("\ngeometric mean of ours/peer over " + ", ".join(args.models))
    summary = {p: geomean(v) for p, v in ratios.items()}
    for p, g in summary.items():
        print(f"  ours/{p:<10} {g:.2f}  ({len(ratios[p])} model(s))")
    Path(args.json).write_text(json.dumps({"run": run_info(target), "models": results, "geomean_ours_over": summary,
                                           "threads": args.threads, "rounds": args.rounds, "seq": args.seq,
                                           "int8": args.int8},
                                          indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
