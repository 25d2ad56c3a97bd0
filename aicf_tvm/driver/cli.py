"""The ``aicf`` command: demo, compile, run, explain, tune, bundle, generate.

Results go to stdout, progress to stderr. Exit code 0 on success; any error prints one
line (``aicf: error: ...``) and exits 1; ``--debug`` shows the full traceback instead.
Each command imports the compiler side (pipeline, frontends, explain, tuning) in its
body, so that ``aicf run`` works where TVM has only its runtime.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aicf_tvm.core.errors import AicfError, InputError, TuningError, UnsupportedModelError
from aicf_tvm.core.numerics import NUMERIC_LEVELS
from aicf_tvm.runtime.compiled import Kernel, Outputs, TensorSpec, flat_outputs, load
from aicf_tvm.runtime.deploy import is_library, manifest, read_metadata
from aicf_tvm.runtime.targets import describe, resolve_target
from aicf_tvm.runtime.threads import thread_count, use_threads

MODEL_HELP = "an ONNX file, a built-in model name (encoder_layer, ...), or package.module:function"
TARGET_HELP = "'llvm' (this CPU), 'cuda', or a JSON target dict such as '{\"kind\": \"llvm\", \"num-cores\": 4}'"


def _positive_int(text: str) -> int:
    """argparse type: an integer > 0 (argparse then prints its usage error, exit code 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def _shape_arg(text: str) -> tuple[str, list[int | str]]:
    """argparse type of ``--shape NAME=D0,D1,...``: each dim a size, a name (symbolic, one
    size per name across the inputs) or ``?`` (the model's own dim)."""
    name, sep, dims = text.partition("=")
    if not sep or not name or not dims:
        raise argparse.ArgumentTypeError(f"{text!r}: expected INPUT=D0,D1,... (a size, a dim name or ?)")
    out: list[int | str] = []
    for dim in dims.split(","):
        dim = dim.strip()
        if dim.isdigit():
            out.append(int(dim))
        elif dim == "?" or dim.isidentifier():
            out.append(dim)
        else:
            raise argparse.ArgumentTypeError(f"{text!r}: dim {dim!r} is neither a size, a name nor ?")
    return name, out


def _dim_arg(text: str) -> tuple[str, tuple[int | None, int | None]]:
    """argparse type of ``--dim NAME=LOW:HIGH`` (either side may be left out: ``seq=:512``)."""
    name, sep, span = text.partition("=")
    low, colon, high = span.partition(":")
    try:
        bounds = (int(low) if low else None, int(high) if high else None)
    except ValueError:
        bounds = None
    if not sep or not name.isidentifier() or not colon or bounds is None or bounds == (None, None) \
            or any(b is not None and b < 0 for b in bounds):
        raise argparse.ArgumentTypeError(f"{text!r}: expected DIM=LOW:HIGH with sizes >= 0, e.g. seq=1:512")
    return name, bounds


def _model_args(args: argparse.Namespace) -> dict[str, Any]:
    """``load_model``'s shapes= and bounds= from --shape and --dim (given once each)."""
    shapes: dict[str, list[int | str]] = {}
    for name, dims in args.shape or []:
        if name in shapes:
            raise InputError(f"--shape {name}: given twice")
        shapes[name] = dims
    bounds: dict[str, tuple[int | None, int | None]] = {}
    for name, span in args.dim or []:
        if name in bounds:
            raise InputError(f"--dim {name}: given twice")
        bounds[name] = span
    return {"shapes": shapes or None, "bounds": bounds or None}


def _status(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _sig(specs: Sequence[TensorSpec]) -> str:
    return ", ".join(f"{s.name}: {s.dtype}{list(s.shape)}" for s in specs)


def _kernel_table(kernels: Sequence[Kernel]) -> str:
    rows = [("#", "kernel", "Emit kind", "schedule")]
    rows += [(str(i), k.name, k.kind, k.schedule) for i, k in enumerate(kernels)]
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _as_list(out: Outputs) -> list[np.ndarray]:
    return flat_outputs(out)


def _cmd_demo(args: argparse.Namespace) -> int:
    import tvm
    from tvm import relax

    from .compiled import compiled_model
    from .models import BUILTIN_MODELS
    from .pipeline import compile as aicf_compile

    if args.model not in BUILTIN_MODELS:
        raise UnsupportedModelError(f"{args.model}: not a built-in model ({', '.join(sorted(BUILTIN_MODELS))})")
    target = resolve_target("llvm")
    mod = BUILTIN_MODELS[args.model]()
    _status(f"aicf: compiling {args.model} with AICF for {describe(target)} ...")
    start = time.perf_counter()
    ours = aicf_compile(mod, target, threads=args.threads)
    t_ours = time.perf_counter() - start
    _status("aicf: building the reference with TVM's default pipeline ...")
    start = time.perf_counter()
    ref_ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    t_ref = time.perf_counter() - start
    ref = compiled_model(ref_ex, target, mod["main"], threads=args.threads)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s.shape).astype(s.dtype) for s in ours.inputs]
    got, want = _as_list(ours(*inputs)), _as_list(ref(*inputs))
    diff = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want))
    if not all(np.allclose(g, w, rtol=args.rtol, atol=args.atol) for g, w in zip(got, want)):
        raise AicfError(f"{args.model}: outputs differ from TVM's default build (max |diff| {diff:.3g})")
    _status(f"aicf: timing ({args.repeat} runs each) ...")
    lat_ours = ours.benchmark(*inputs, number=1, repeat=args.repeat)
    lat_ref = ref.benchmark(*inputs, number=1, repeat=args.repeat)
    print(f"model    {args.model} ({_sig(ours.inputs)} -> {_sig(ours.outputs)})")
    print(f"target   {describe(target)}, {ours.threads} threads")
    print(f"check    outputs match TVM's default build: max |diff| {diff:.2e} "
          f"(rtol {args.rtol:g}, atol {args.atol:g})")
    print(f"compile  AICF {t_ours:.1f} s, TVM default {t_ref:.1f} s")
    print()
    print(ours.report.summary())
    print(f"kernels ({len(ours.kernels)} per inference):")
    print(_kernel_table(ours.kernels))
    print()
    print(f"latency (median of {args.repeat} runs)")
    print(f"  AICF          {lat_ours * 1e3:9.2f} ms")
    print(f"  TVM default   {lat_ref * 1e3:9.2f} ms")
    print(f"  speed-up      {lat_ref / lat_ours:9.2f}x")
    return 0


def _cmd_compile(args: argparse.Namespace) -> int:
    from .pipeline import compile as aicf_compile

    target = resolve_target(args.target)  # fail fast, before the import
    if args.database is not None and not Path(args.database).is_dir():
        raise TuningError(f"--database {args.database}: no such directory")
    if not Path(args.output).resolve().parent.is_dir():
        raise AicfError(f"-o {args.output}: directory {Path(args.output).parent} does not exist")
    # exported, not run here: no machine code for this process (warm_up)
    model = aicf_compile(args.model, target, database=args.database, warm_up=False, cache=not args.no_cache,
                         import_args=_model_args(args), numerics=args.numerics,
                         progress=lambda: _status(f"aicf: compiling {args.model} for {describe(target)} ..."))
    start = time.perf_counter()
    path = model.export(args.output)  # a copy of the cache's library when there is one
    if args.timings:
        from .pipeline import format_timings

        print(format_timings({**model.timings, "export": time.perf_counter() - start}))
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    print(f"target   {describe(target)}")
    print(f"inputs   {_sig(model.inputs)}")
    print(f"outputs  {_sig(model.outputs)}")
    print(model.report.summary())
    print(f"kernels: {len(model.kernels)} per inference")
    return 0


def _read_inputs(items: Sequence[str]) -> dict[str, np.ndarray]:
    named: dict[str, np.ndarray] = {}
    for item in items:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise InputError(f"--input {item}: expected NAME=FILE.npy")
        if name in named:
            raise InputError(f"--input {name}: given twice")
        if not os.path.isfile(file):
            raise InputError(f"--input {name}: {file}: no such file")
        try:
            named[name] = np.load(file, allow_pickle=False)
        except (ValueError, OSError) as err:  # numpy's message talks about pickles: not helpful
            raise InputError(f"--input {name}: {file}: not a .npy file (write it with numpy.save)") from err
    return named


def _cmd_run(args: argparse.Namespace) -> int:
    named = _read_inputs(args.input or [])
    model = load(args.library, device=args.device, threads=args.threads)
    outs = _as_list(model(**named))
    out_dir = Path(args.output) if args.output else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    for spec, value in zip(model.outputs, outs):
        line = f"{spec.name}: {value.dtype}{list(value.shape)}"
        if out_dir is not None:
            dest = out_dir / f"{spec.name}.npy"
            np.save(dest, value)
            line += f" -> {dest}"
        print(line)
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    if is_library(args.model):  # a compiled library: its manifest, read with TVM's runtime alone
        print(manifest(read_metadata(args.model), args.model))
        return 0
    from .explainer import explain, kernel_selection
    from .frontends import load_model
    from .pipeline import run_pipeline

    mod = load_model(args.model, **_model_args(args))
    report = None
    text = ""
    if not args.no_fusion:
        target = resolve_target(args.target)
        stages = run_pipeline(mod, target, until="schedule", database=args.database)
        report = stages.report
        text = "\n\n" + kernel_selection(stages.lowered, target)
    print(explain(mod, report) + text)
    return 0


def _cmd_bundle(args: argparse.Namespace) -> int:
    from .bundle import bundle

    run = bundle(args.library, args.folder)
    size = sum(f.stat().st_size for f in run.parent.rglob("*") if f.is_file())
    print(f"wrote {run.parent} ({size / 1e6:.0f} MB): {run} --input NAME=FILE.npy ... runs it with TVM's runtime alone")
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    try:
        from aicf_tvm.driver.tuning.run import tune
    except ModuleNotFoundError as err:
        if err.name not in (f"{__package__}.tuning", f"{__package__}.tuning.run"):
            raise
        raise TuningError("aicf tune: this installation has no aicf_tvm.driver.tuning.run module") from err

    target = resolve_target(args.target)
    result = tune(args.models, target=target, trials=args.trials, work_dir=args.work_dir, **_model_args(args),
                  runner_timeout=args.runner_timeout, rpc=args.rpc, key=args.key, workers=args.workers,
                  threads=args.threads, time_in_model=not args.kernel_times_only, time_budget=args.time_budget)
    if result is not None:
        print(result)
    return 0


def _token_ids(text: str) -> list[int]:
    """An ``argparse`` type: ``1,2,3`` -> [1, 2, 3]."""
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected token ids such as 1,2,3") from None
    if not ids:
        raise argparse.ArgumentTypeError("no token ids given")
    return ids


def _tokenizer(folder: str | None) -> Any:
    """The tokenizer saved in ``folder`` (None when there is none, or no folder)."""
    if folder is None or not os.path.isdir(folder):
        return None
    if not any(os.path.exists(os.path.join(folder, f)) for f in ("tokenizer.json", "tokenizer.model",
                                                                  "tokenizer_config.json", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def _cmd_generate(args: argparse.Namespace) -> int:
    from aicf_tvm.runtime.llm import CausalLM
    from aicf_tvm.runtime.llm import load as load_lm

    tokenizer = _tokenizer(args.tokenizer or (args.model if os.path.isdir(args.model) else None))
    if args.prompt is not None:
        if tokenizer is None:
            raise InputError(f"--prompt needs a tokenizer, and none was found in {args.tokenizer or args.model}; "
                             "give the ids with --prompt-ids 1,2,3 or a folder with --tokenizer")
        ids = tokenizer(args.prompt, return_tensors="np")["input_ids"].astype(np.int64)
    else:
        ids = np.asarray([args.prompt_ids], np.int64)
    need = ids.shape[1] + args.max_new_tokens
    if is_library(args.model):
        lm = load_lm(args.model, threads=args.threads)
        if not isinstance(lm, CausalLM):
            raise InputError(f"{args.model}: a library of a model that is no causal LM (write one with "
                             "`aicf generate MODEL_DIR --save LIB.so`)")
    else:
        from .llm import DEFAULT_MAX_LENGTH, compile_causal_lm

        max_length = args.max_length or max(DEFAULT_MAX_LENGTH, need)
        _status(f"compiling {args.model} for up to {max_length} tokens ...")
        start = time.perf_counter()
        lm = compile_causal_lm(args.model, max_length=max_length, target=args.target, threads=args.threads,
                               timings=args.timings, weights=args.weights, activations=args.activations)
        quantized = (f" (weights {lm.config.weights}, activations {lm.config.activations})"
                     if lm.config.weights != "float32" else "")
        _status(f"compiled in {time.perf_counter() - start:.1f} s{quantized}")
        if args.save:
            _status(f"wrote {lm.export_library(args.save)}")
    out = lm.generate(ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                      top_p=args.top_p, seed=args.seed, progress=sys.stderr.isatty())
    new = out[0, ids.shape[1]:]
    if tokenizer is not None:
        print(tokenizer.decode(out[0], skip_special_tokens=True))
    print("ids: " + ",".join(str(int(t)) for t in out[0]))
    t = lm.last_timings
    _status(f"prompt {ids.shape[1]} tokens, {len(new)} new: prefill {t['prefill_ms']:.1f} ms, "
            f"decode {t['decode_tokens_per_s']:.1f} tokens/s")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": _cmd_demo, "compile": _cmd_compile, "run": _cmd_run, "explain": _cmd_explain, "tune": _cmd_tune,
    "bundle": _cmd_bundle, "generate": _cmd_generate,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aicf", description="AICF on TVM: contract-driven fusion on TVM Relax.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on error")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show full tracebacks on error")
    common.add_argument("--threads", type=_positive_int, default=None, metavar="N",
                        help="CPU threads TVM runs with (default: TVM_NUM_THREADS, else every CPU "
                             "this process may use, at most the target's num-cores)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    shapes = argparse.ArgumentParser(add_help=False)
    shapes.add_argument("--shape", action="append", type=_shape_arg, metavar="INPUT=D0,D1,...",
                        help="an ONNX input's shape: each dim a size, a name (symbolic: one size per "
                             "name across the inputs) or ? (the model's); e.g. input_ids=1,seq")
    shapes.add_argument("--dim", action="append", type=_dim_arg, metavar="DIM=LOW:HIGH",
                        help="bounds of a symbolic dim, checked at every call (e.g. seq=1:512)")

    p = sub.add_parser("demo", parents=[common], help="compile a built-in model, check it against TVM, time both")
    p.add_argument("--model", default="encoder_layer", help="a built-in model (default: encoder_layer)")
    p.add_argument("--repeat", type=_positive_int, default=5, help="timed runs per build (default: 5)")
    p.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance of the check")
    p.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance of the check")

    p = sub.add_parser("compile", parents=[common, shapes], help="compile a model to a deployable shared library")
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("-o", "--output", required=True, help="the shared library to write (out.so)")
    p.add_argument("--target", default="llvm", help=TARGET_HELP)
    p.add_argument("--database", default=None, help="a MetaSchedule work dir from `aicf tune`")
    p.add_argument("--timings", action="store_true",
                   help="print the seconds of each phase: import, normalize, fuse, lower, schedule, codegen, "
                        "cache, export")
    p.add_argument("--no-cache", action="store_true",
                   help="compile even when the compile cache holds this model, and do not store it there "
                        "(the cache: $AICF_CACHE_DIR, else ~/.cache/aicf/compiled)")
    p.add_argument("--numerics", choices=NUMERIC_LEVELS, default="exact",
                   help="exact (default): what the graph's op order computes; relaxed: exp, sigmoid and tanh in "
                        "float32 (within 1.02 / 2.41 / 1.34 ulp) and attention's softmax sums per vector lane, "
                        "each such kernel listed as an approximation (docs/numerics.md)")

    p = sub.add_parser("bundle", parents=[common],
                       help="write a folder that runs a library with TVM's runtime alone (no install on the host)")
    p.add_argument("library", help="the .so written by `aicf compile`")
    p.add_argument("folder", help="the folder to write (new, or empty)")
    p = sub.add_parser("run", parents=[common], help="run a library written by `aicf compile` on .npy inputs")
    p.add_argument("library", help="the .so written by `aicf compile`")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="one per model input")
    p.add_argument("--output", default=None, metavar="DIR", help="write each output to DIR/NAME.npy")
    p.add_argument("--device", default=None, help="a TVM device such as cpu or cuda:0 (default: by target)")

    p = sub.add_parser("explain", parents=[common, shapes],
                       help="print the Emit table, contracts and fusion decisions of a model, "
                            "or the manifest of a compiled library (.so)")
    p.add_argument("model", help=MODEL_HELP + "; or a library written by `aicf compile`")
    p.add_argument("--no-fusion", action="store_true", help="only the Emit table (skip the fusion passes)")
    p.add_argument("--target", default="llvm", help=TARGET_HELP)
    p.add_argument("--database", default=None, metavar="DIR", help="a tuning work dir (`aicf tune`)")

    p = sub.add_parser("tune", parents=[common, shapes], help="tune the kernels of models with MetaSchedule")
    p.add_argument("models", nargs="+", metavar="MODEL", help=MODEL_HELP)
    p.add_argument("--target", default="llvm", help=TARGET_HELP)
    p.add_argument("--trials", type=_positive_int, default=64, help="measured candidates in all (default: 64)")
    p.add_argument("--time-budget", type=_positive_seconds, default=None, metavar="S",
                   help="seconds the run may take: the search two thirds of it (no task starts after that; "
                        "a later run with the same --work-dir continues), timing the records in the model the "
                        "rest (default: no limit)")
    p.add_argument("--work-dir", required=True, help="the tuning database directory")
    p.add_argument("--runner-timeout", type=_positive_seconds, default=60.0, metavar="S",
                   help="seconds one candidate may take to measure; one that crashes or runs longer "
                        "is recorded as failed and tuning goes on (default: 60)")
    p.add_argument("--rpc", default=None, metavar="HOST:PORT",
                   help="measure on the servers of this TVM RPC tracker (build here)")
    p.add_argument("--key", default=None, help="with --rpc: the key the servers registered under")
    p.add_argument("--workers", type=_positive_int, default=None,
                   help="with --rpc: measurements at once (default: one per registered server)")
    p.add_argument("--kernel-times-only", action="store_true",
                   help="choose each kernel by its time alone, without timing the best candidates "
                        "again inside the models (on by itself with --rpc and GPU targets)")

    p = sub.add_parser("generate", parents=[common],
                       help="generate text with a transformers causal LM (a local folder) or a library it was saved to")
    p.add_argument("model", help="a folder written by transformers' save_pretrained, or a library from --save")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", default=None, metavar="TEXT", help="the prompt (needs the folder's tokenizer)")
    prompt.add_argument("--prompt-ids", type=_token_ids, default=None, metavar="1,2,3", help="the prompt's token ids")
    p.add_argument("--max-new-tokens", type=_positive_int, default=32, metavar="N", help="tokens to generate (32)")
    p.add_argument("--max-length", type=_positive_int, default=None, metavar="L",
                   help="prompt + new tokens the library serves (default: 1024, or more if the call needs it)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; > 0: sample")
    p.add_argument("--top-k", type=int, default=0, help="sample among the K most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="sample among the tokens of probability mass P")
    p.add_argument("--seed", type=int, default=None, help="the sampling seed")
    p.add_argument("--tokenizer", default=None, metavar="DIR", help="a folder with the tokenizer (default: MODEL)")
    p.add_argument("--save", default=None, metavar="LIB.so", help="also write the compiled library here")
    p.add_argument("--target", default="llvm", help=TARGET_HELP)
    p.add_argument("--timings", action="store_true", help="print the seconds of each compile phase")
    p.add_argument("--weights", choices=("float32", "fp32", "int8", "int4"), default="float32",
                   help="int8: round every linear layer's weight to per-channel int8 (an approximation: "
                        "a quarter of the bytes a step reads; the report lists each layer's error); "
                        "int4: to int4 in groups of 32 (about 0.14 of the bytes)")
    p.add_argument("--activations", choices=("auto", "float32", "fp32", "int8"), default="auto",
                   help="int8 (with --weights int4 on AVX2 CPUs, --weights int8 on AVX-512 VNNI CPUs): also round "
                        "each layer's input to int8 in groups of 32, so the kernels sum in integers (a further "
                        "approximation, as llama.cpp, ONNX Runtime GenAI and OpenVINO compute at 4 and 8 bits); "
                        "auto (default): int8 with --weights int4/int8 where the CPU has those kernels, else float32")
    return parser


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    if isinstance(err, AicfError):
        return first
    return f"{type(err).__name__}: {first} (rerun with --debug for the traceback)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        use_threads(thread_count(args.threads))  # what TVM runs on this thread (constant folding too)
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print("aicf: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - one line for users, traceback with --debug
        if args.debug:
            traceback.print_exc()
        else:
            print(f"aicf: error: {_one_line(err)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
