"""LLM generation on the CPU, ours against the engines users pick, in ONE process.

The model: a LLaMA-style ``LlamaForCausalLM`` (hidden 1024, 4 layers, 16 heads / 4 KV
heads, intermediate 2816, vocab 32000: 110M parameters, 442 MB fp32) with random weights
(seed 0), saved once to ``--folder`` with a 32000-piece sentencepiece tokenizer trained
on generated text (every converter wants one; no model hub here). Each engine gets the
same token ids (a ``--prompt``-token prompt), generates ``--new`` tokens greedily at batch
1 on the same thread count (``aicf_tvm.runtime.threads.thread_count``), and its tokens
must equal transformers' greedy ``generate`` (an engine that differs is reported, not
timed as a peer). Engines:

* ``eager``: transformers ``generate``;
* ``llamacpp``: llama.cpp through ``llama-cpp-python``, the weights converted to GGUF f32
  by the ``convert_hf_to_gguf.py`` its source distribution ships (``--llamacpp-src``);
* ``ortgenai``: ONNX Runtime GenAI, its model builder's fp32 CPU export of the folder;
* ``openvino``: OpenVINO GenAI on the folder exported by ``optimum-cli export openvino
  --weight-format fp32`` (``--optimum-cli``: optimum-intel lives in a venv of its own);
  prefix caching off;
* ``ours``: ``aicf_tvm.compile_causal_lm`` (compile time printed too).

Printed: prefill ms and decode tokens/s (median of ``--rounds``), decode as a fraction of
the memory-bandwidth limit (bytes a decode step reads, weights and KV cache at the
mean past length, over the read bandwidth of a 2-thread sum over 1 GiB measured here),
ours / peer ratios (time: < 1 means ours is faster), the CPU's ISA and a note where a
step's bytes are under twice the L3 (part of them can then stay cached between steps, and
an engine pass the limit); ``--json`` writes it.

    python -m scripts.bench_llm [--peers eager llamacpp ortgenai openvino ours] [--prompt 128] [--new 64]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

CONFIG = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 16,
          "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 4096,
          "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
PEERS = ("eager", "llamacpp", "ortgenai", "openvino", "ours")
DEFAULT_FOLDER = Path.home() / ".cache" / "aicf" / "bench-llm" / "llama-110m"


# ---------------------------------------------------------------------------------- the model

def make_folder(folder: Path) -> None:
    """The random-weight model and a sentencepiece tokenizer, saved once."""
    if (folder / "config.json").exists() and (folder / "tokenizer.json").exists():
        return
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    model.save_pretrained(folder)
    if not (folder / "tokenizer.model").exists():
        _train_tokenizer(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    # transformers turns tokenizer.model into tokenizer.json (needs protobuf)
    transformers.AutoTokenizer.from_pretrained(folder).save_pretrained(folder)


def _train_tokenizer(folder: Path) -> None:
    """A 32000-piece BPE sentencepiece model of generated words (a few minutes)."""
    import sentencepiece as spm

    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, rng.integers(2, 9))) for _ in range(60000)]
    text = folder / "corpus.txt"
    text.write_text("\n".join(" ".join(rng.choice(words, 12)) for _ in range(40000)))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(folder / "tokenizer"),
                                   vocab_size=CONFIG["vocab_size"], model_type="bpe", bos_id=1, eos_id=2,
                                   unk_id=0, pad_id=-1, num_threads=2, minloglevel=2)
    text.unlink()
    (folder / "tokenizer.vocab").unlink(missing_ok=True)


def bytes_per_token(past: float, weights: str = "fp32") -> float:
    """Bytes one decode step reads: every weight but the embedding table (one row of it),
    and the keys and values of ``past`` tokens (float32). ``int8``: the linear layers' weights
    one byte each, with a float32 scale per output channel; ``int4``: half a byte each, with a
    float32 scale per group of 32."""
    c = CONFIG
    h, inter, layers, vocab = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    head = h // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * head
    linear = layers * (h * h * 2 + h * kv * 2 + 3 * h * inter) + vocab * h
    columns = layers * (h * 2 + kv * 2 + inter * 2 + h) + vocab
    floats = layers * 2 * h + h + h + 2 * layers * kv * past  # norms, one embedding row, the cache
    if weights == "int8":
        return linear + 4.0 * (columns + floats)
    if weights == "int4":
        return linear / 2 + 4.0 * (linear / 32 + floats)
    return 4.0 * (linear + floats)


def read_bandwidth(threads: int) -> float:
    """Bytes/s of a ``threads``-thread sum over 1 GiB (best of 7)."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(256 * 1024 * 1024)
    return 2**30 / min(_seconds(x.sum) for _ in range(7))


def l3_bytes() -> int:
    """The last-level cache the first CPU sees (sysfs), 0 where it does not say."""
    try:
        size = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
    except OSError:
        return 0
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(size[:-1]) * units[size[-1]] if size[-1:] in units else int(size)


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ---------------------------------------------------------------------------------- engines
# Each returns a runner: () -> (tokens [new], prefill seconds, decode seconds for new - 1 tokens).

def eager_runner(folder: Path, prompt: np.ndarray, new: int, threads: int):
    import torch
    import transformers

    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.from_numpy(prompt)

    def run():
        with torch.no_grad():
            t1 = _seconds(lambda: model.generate(ids, max_new_tokens=1, do_sample=False, eos_token_id=None))
            start = time.perf_counter()
            out = model.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=None)
            total = time.perf_counter() - start
        return out[0, prompt.shape[1]:].numpy(), t1, total - t1

    return run


def ours_runner(folder: Path, prompt: np.ndarray, new: int, threads: int, weights: str = "fp32",
                activations: str = "auto"):
    import aicf_tvm

    start = time.perf_counter()
    lm = aicf_tvm.compile_causal_lm(str(folder), max_length=prompt.shape[1] + new, threads=threads,
                                    weights=weights, activations=activations)
    print(f"  ours: compiled in {time.perf_counter() - start:.1f} s (activations {lm.config.activations})",
          flush=True)

    deployment(lm)

    def run():
        out = lm.generate(prompt, max_new_tokens=new, stop_tokens=[])
        t = lm.last_timings
        return out[0, prompt.shape[1]:], t["prefill_ms"] / 1e3, (new - 1) / t["decode_tokens_per_s"]

    run.activations = lm.config.activations  # what "auto" chose on this CPU
    return run


LOAD_TIME = """
import sys, time
import numpy as np
import tvm, aicf_tvm
from aicf_tvm.runtime import compiled, llm, deploy  # imports done before the clock starts
start = time.perf_counter()
if sys.argv[2] == "tvm":
    tvm.runtime.load_module(sys.argv[1])
else:
    aicf_tvm.load(sys.argv[1]).model.vm
print(time.perf_counter() - start)
"""


def deployment(lm) -> None:
    """Library size against the weights' bytes, and load time (the weights mapped, their
    digests checked) beside TVM's own ``load_module`` of the library, which loads its code
    alone (fresh processes, imports done first, best of 3 each)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = lm.export_library(Path(tmp) / "lm.so")
        weights = bytes_per_token(0) + 4 * CONFIG["vocab_size"] * CONFIG["hidden_size"]  # + the embedding
        times = {how: min(float(subprocess.run([sys.executable, "-c", LOAD_TIME, str(path), how], check=True,
                                               capture_output=True, text=True).stdout.split()[-1])
                          for _ in range(3)) for how in ("tvm", "aicf")}
        print(f"  ours: library {path.stat().st_size / 1e6:.1f} MB = {path.stat().st_size / weights:.2f}x the "
              f"weights; load {times['aicf']:.2f} s with the weights mapped (tvm.runtime.load_module of "
              f"the code alone {times['tvm']:.2f} s)", flush=True)


def llamacpp_runner(folder: Path, prompt: np.ndarray, new: int, threads: int, src: Path | None,
                    weights: str = "fp32"):
    from llama_cpp import Llama

    outtype = {"fp32": "f32", "int8": "q8_0", "int4": "q4_0"}[weights]
    gguf = folder.parent / (folder.name + f"-{outtype}.gguf")
    if not gguf.exists():
        # q4_0 is llama.cpp's quantizer's (llama_model_quantize) from the f32 file; the
        # converter writes f32 and q8_0 itself
        source = gguf if outtype != "q4_0" else folder.parent / (folder.name + "-f32.gguf")
        if not source.exists():
            script = _find_converter(src)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(script.parent / d) for d in ("", "gguf-py"))}
            subprocess.run([sys.executable, str(script), str(folder), "--outtype", source.stem.rsplit("-", 1)[1],
                            "--outfile", str(source)], check=True, env=env, capture_output=True)
        if source != gguf:
            import llama_cpp

            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
            params.nthread = threads
            if llama_cpp.llama_model_quantize(str(source).encode(), str(gguf).encode(), params) != 0:
                raise OSError(f"llama_model_quantize failed on {source}")
    llm = Llama(model_path=str(gguf), n_ctx=prompt.shape[1] + new + 8, n_threads=threads,
                n_threads_batch=threads, n_batch=prompt.shape[1], verbose=False)
    tokens = prompt[0].tolist()

    def run():
        llm.reset()
        start = time.perf_counter()
        llm.eval(tokens)
        out = [int(np.argmax(llm._ctx.get_logits()[: CONFIG["vocab_size"]]))]
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(new - 1):
            llm.eval([out[-1]])
            out.append(int(np.argmax(llm._ctx.get_logits()[: CONFIG["vocab_size"]])))
        return np.array(out), prefill, time.perf_counter() - start

    return run


def _find_converter(src: Path | None) -> Path:
    """``convert_hf_to_gguf.py`` of llama.cpp: in ``src`` (an unpacked llama-cpp-python
    source distribution or a llama.cpp checkout), with its ``conversion/`` and ``gguf-py/``."""
    for root in [p for p in (src,) if p is not None]:
        for cand in (root / "convert_hf_to_gguf.py", root / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"):
            if cand.exists():
                return cand
    raise SystemExit("llamacpp: give --llamacpp-src, the unpacked llama-cpp-python sdist "
                     "(pip download --no-binary :all: --no-deps llama-cpp-python) or a llama.cpp checkout")


def ortgenai_runner(folder: Path, prompt: np.ndarray, new: int, threads: int, weights: str = "fp32"):
    import onnxruntime_genai as og

    out_dir = folder.parent / (folder.name + f"-ortgenai-{weights}")
    if not (out_dir / "genai_config.json").exists():
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o",
                        str(out_dir), "-p", weights, "-e", "cpu"], check=True, capture_output=True)
    config = json.loads((out_dir / "genai_config.json").read_text())
    session = config["model"]["decoder"].setdefault("session_options", {})
    session["intra_op_num_threads"] = threads
    session["inter_op_num_threads"] = 1
    (out_dir / "genai_config.json").write_text(json.dumps(config, indent=1))
    model = og.Model(str(out_dir))
    ids = prompt[0].astype(np.int32)

    def run():
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=prompt.shape[1] + new, do_sample=False)
        gen = og.Generator(model, params)
        start = time.perf_counter()
        gen.append_tokens(ids)  # the prompt's forward pass
        gen.generate_next_token()  # picks the first new token (after append_tokens, the last prompt token)
        out = [int(gen.get_next_tokens()[0])]
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        while len(out) < new:
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
        return np.array(out), prefill, time.perf_counter() - start

    return run


def openvino_runner(folder: Path, prompt: np.ndarray, new: int, threads: int, optimum_cli: str,
                    weights: str = "fp32"):
    import openvino as ov
    import openvino_genai as ov_genai

    out_dir = folder.parent / (folder.name + f"-openvino-{weights}")
    if not (out_dir / "openvino_model.xml").exists():
        # int4: every layer, symmetric, groups of 32 (our recipe; NNCF's default keeps some
        # layers in int8 and groups of 128)
        recipe = ["--sym", "--group-size", "32", "--ratio", "1.0"] if weights == "int4" else []
        subprocess.run([optimum_cli, "export", "openvino", "--model", str(folder), "--task",
                        "text-generation-with-past", "--weight-format", weights, *recipe, str(out_dir)],
                       check=True, capture_output=True)
    sched = ov_genai.SchedulerConfig()
    sched.enable_prefix_caching = False
    # fp32 all through: on CPUs with bf16 or AMX the plugin computes in bf16 unless told, and
    # keeps the KV cache in 8 bits
    props = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32",
             "scheduler_config": sched}
    pipe = ov_genai.LLMPipeline(str(out_dir), "CPU", props)
    config = ov_genai.GenerationConfig()
    config.max_new_tokens, config.min_new_tokens, config.do_sample = new, new, False
    ids = ov.Tensor(prompt.astype(np.int64))

    def run():
        res = pipe.generate(ids, config)
        metrics = res.perf_metrics
        ttft, tpot = metrics.get_ttft().mean / 1e3, metrics.get_tpot().mean / 1e3
        return np.array(res.tokens[0]), ttft, tpot * (new - 1)

    return run


# ---------------------------------------------------------------------------------- main

def isa() -> str:
    from aicf_tvm.runtime import cpu_features
    from aicf_tvm.runtime.targets import resolve_target

    flags = cpu_features.isa_flags()
    best = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"
    return f"{best}, mcpu={resolve_target('llvm').attrs.get('mcpu', '?')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--folder", type=Path, default=DEFAULT_FOLDER)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    parser.add_argument("--new", type=int, default=64, help="generated tokens (default 64)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--llamacpp-src", type=Path, default=None)
    parser.add_argument("--optimum-cli", default=shutil.which("optimum-cli") or "optimum-cli")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--weights", choices=("fp32", "int8", "int4"), default="fp32",
                        help="the weights every engine but eager runs: int8 is llama.cpp q8_0, ORT GenAI "
                             "int8 (MatMulNBits), OpenVINO int8 weight compression, ours weights='int8'; "
                             "int4 is llama.cpp q4_0, ORT GenAI int4, OpenVINO int4 (symmetric, groups of "
                             "32), ours weights='int4'; "
                             "eager stays float32, the reference the tokens are compared with")
    parser.add_argument("--activations", choices=("auto", "float32", "int8"), default="auto",
                        help="ours' activations: int8 (with --weights int4 or int8) rounds each layer's input to "
                             "int8 in groups of 32, as ORT GenAI's int4 CPU kernels (accuracy level 4), "
                             "OpenVINO's dynamic quantization and llama.cpp's q8_0 / q4_0 do; auto (default, "
                             "compile_causal_lm's): int8 with quantized weights where the CPU has the kernels")
    args = parser.parse_args()

    from aicf_tvm.runtime.threads import thread_count

    threads = thread_count()
    make_folder(args.folder)
    prompt = np.random.default_rng(0).integers(3, CONFIG["vocab_size"], (1, args.prompt))
    bandwidth = read_bandwidth(threads)
    step_bytes = bytes_per_token(args.prompt + args.new / 2, args.weights)
    limit = step_bytes / bandwidth
    l3 = l3_bytes()
    print(f"CPU: {isa()}, {threads} threads; read bandwidth {bandwidth / 1e9:.1f} GB/s; a decode step reads "
          f"{step_bytes / 1e6:.1f} MB ({args.weights} weights) -> limit {limit * 1e3:.2f} ms/token", flush=True)
    if step_bytes < 2 * l3:  # the limit counts every byte from memory; the L3 can keep part of them
        print(f"  the L3 holds {l3 / 2**20:.0f} MiB: part of a step's bytes can stay in it between steps, so an "
              f"engine can pass the memory limit", flush=True)
    makers = {"eager": lambda: eager_runner(args.folder, prompt, args.new, threads),
              "ours": lambda: ours_runner(args.folder, prompt, args.new, threads, args.weights, args.activations),
              "llamacpp": lambda: llamacpp_runner(args.folder, prompt, args.new, threads, args.llamacpp_src,
                                                  args.weights),
              "ortgenai": lambda: ortgenai_runner(args.folder, prompt, args.new, threads, args.weights),
              "openvino": lambda: openvino_runner(args.folder, prompt, args.new, threads, args.optimum_cli,
                                                  args.weights)}
    runners, reference = {}, None
    for name in ["eager", *[p for p in args.peers if p != "eager"]]:
        try:
            runners[name] = makers[name]()
        except (ImportError, OSError, subprocess.CalledProcessError, SystemExit) as err:
            print(f"  {name}: skipped ({type(err).__name__}: {str(err).strip().splitlines()[-1][:200]})", flush=True)
    rows = {}
    for _ in range(args.rounds):  # engines in turn, each round: drifts of the machine hit all alike
        for name, run in runners.items():
            tokens, prefill, decode = run()
            rows.setdefault(name, {"prefill": [], "decode": [], "tokens": tokens})
            rows[name]["prefill"].append(prefill)
            rows[name]["decode"].append(decode)
    reference = rows["eager"]["tokens"]
    table = {}
    for name, r in rows.items():
        same = bool(np.array_equal(r["tokens"][: len(reference)], reference))
        if not same:
            k = int(np.argmax(np.asarray(r["tokens"][: len(reference)]) != reference))
            print(f"  {name}: tokens differ from eager's from new token {k} on", flush=True)
        prefill_ms = statistics.median(r["prefill"]) * 1e3
        per_token = statistics.median(r["decode"]) / (args.new - 1)
        agree = float(np.mean(np.asarray(r["tokens"][: len(reference)]) == reference))
        table[name] = {"tokens_equal_eager": same, "top1_agreement": round(agree, 3),
                       "prefill_ms": round(prefill_ms, 2),
                       "decode_tokens_per_s": round(1 / per_token, 1),
                       "fraction_of_limit": round(limit / per_token, 3)}
    activations = getattr(runners.get("ours"), "activations", args.activations)
    print(f"\nweights: {args.weights}, ours' activations: {activations} (eager: float32, the reference)")
    print(f"{'engine':10} {'tokens':8} {'top-1':>6} {'prefill ms':>10} {'decode tok/s':>12} {'of limit':>9}")
    for name, r in table.items():
        print(f"{name:10} {'equal' if r['tokens_equal_eager'] else 'DIFFER':8} {r['top1_agreement']:6.0%} "
              f"{r['prefill_ms']:10.1f} {r['decode_tokens_per_s']:12.1f} {r['fraction_of_limit']:9.0%}")
    if "ours" in table:
        print("\nours / peer (time; < 1: ours faster):")
        for name, r in table.items():
            if name != "ours":
                o = table["ours"]
                print(f"  {name:10} prefill {o['prefill_ms'] / r['prefill_ms']:.2f}  "
                      f"decode {r['decode_tokens_per_s'] / o['decode_tokens_per_s']:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"isa": isa(), "threads": threads, "prompt": args.prompt, "new": args.new,
                                         "weights": args.weights, "ours_activations": activations,
                                         "bandwidth_gb_s": round(bandwidth / 1e9, 2), "l3_mib": l3 / 2**20,
                                         "limit_ms_per_token": round(limit * 1e3, 3), "engines": table}, indent=1))


if __name__ == "__main__":
    main()
