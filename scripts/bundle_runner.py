"""Runs a device-check bundle written by ``scripts/gpu_bundle.py`` (as ``DIR/runner.py``).

Needs only what the bundle carries (TVM's runtime, ``aicf_tvm``'s loader, numpy);
PyTorch when present. For each model in ``manifest.json``: load the library with
``aicf_tvm.load``, rebuild the weights from their seeds (and check their sha256 against
the build host's), run it, compare with the reference outputs computed on the build host,
then time it against the PyTorch twin in eager mode and under ``torch.compile`` (the Adam
step against ``torch.optim.Adam(fused=True)``). Prints a table; exits 1 on any mismatch
or error. PyTorch runs in plain float32 (no TF32), as ours does.

The weight recipe and the PyTorch twins are also used by ``gpu_bundle.py`` on the build
host: it checks the twins there against TVM's LLVM build.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
MASK_VALUE = float(np.finfo(np.float32).min)  # aicf_tvm.driver.models.MASK_VALUE


# --- weights from seeds (both hosts) ------------------------------------------------------------

def generate(spec: dict, seed: int) -> np.ndarray:
    """``loc + scale * N(0, 1)`` in float32 from stream ``spec["stream"]`` of ``seed``: the
    same bytes on every host (numpy's PCG64 and float32 ziggurat; no fused multiply-add).
    A ``fill`` spec is a constant array (an optimizer's initial state)."""
    if "fill" in spec:
        return np.full(tuple(spec["shape"]), spec["fill"], dtype=spec["dtype"])
    rng = np.random.default_rng([seed, spec["stream"]])
    z = rng.standard_normal(tuple(spec["shape"]), dtype=np.float32)
    return z * np.float32(spec["scale"]) + np.float32(spec["loc"])


def digest(arrays: Sequence[np.ndarray]) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def sample_indices(size: int, count: int, seed: int) -> np.ndarray:
    """Where a large output is compared (its reference is shipped only at these positions)."""
    return np.random.default_rng([seed, 1 << 20]).integers(0, size, min(count, size))


# --- PyTorch twins, written from each model's formulas -------------------------------------------

def _linear(torch: Any, x: Any, w: dict, prefix: str) -> Any:
    return torch.nn.functional.linear(x, w[f"{prefix}.weight"], w.get(f"{prefix}.bias"))


def _attention(torch: Any, x: Any, w: dict, heads: int, mask: Any = None) -> Any:
    batch, seq, hidden = x.shape
    d = hidden // heads

    def split(t: Any) -> Any:
        return t.reshape(batch, seq, heads, d).transpose(1, 2)

    q, k, v = (split(_linear(torch, x, w, f"attn.{p}_proj")) for p in "qkv")
    scores = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(d))
    if mask is not None:
        scores = scores + mask
    probs = torch.softmax(scores, dim=-1)
    return _linear(torch, (probs @ v).transpose(1, 2).reshape(batch, seq, hidden), w, "attn.o_proj")


def encoder_twin(torch: Any, w: dict, heads: int) -> Callable:
    """BERT post-norm: LN(x + Attn(x)), then LN(h + W2·gelu(W1·h)); erf GELU, eps 1e-12."""
    F = torch.nn.functional

    def norm(x: Any, prefix: str) -> Any:
        return F.layer_norm(x, x.shape[-1:], w[f"{prefix}.weight"], w[f"{prefix}.bias"], eps=1e-12)

    def forward(x: Any) -> Any:
        h = norm(x + _attention(torch, x, w, heads), "attn_norm")
        return norm(h + _linear(torch, F.gelu(_linear(torch, h, w, "fc1")), w, "fc2"), "ffn_norm")

    return forward


def decoder_twin(torch: Any, w: dict, heads: int) -> Callable:
    """LLaMA pre-norm: h = x + Attn(RMS(x)) (causal), out = h + down(silu(gate(RMS(h)))·up(RMS(h)))."""
    F = torch.nn.functional

    def rms(x: Any, prefix: str) -> Any:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w[f"{prefix}.weight"]

    def forward(x: Any) -> Any:
        seq = x.shape[1]
        upper = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        mask = torch.zeros(seq, seq, device=x.device).masked_fill(upper, MASK_VALUE)[None, None]
        h = x + _attention(torch, rms(x, "attn_norm"), w, heads, mask)
        n = rms(h, "ffn_norm")
        return h + _linear(torch, F.silu(_linear(torch, n, w, "gate_proj")) * _linear(torch, n, w, "up_proj"),
                           w, "down_proj")

    return forward


def convnet_twin(torch: Any, w: dict, stages: Sequence[int]) -> Callable:
    """stem conv; per stage a residual block (conv-relu-conv + x, relu), then a stride-2
    conv to the next width; global average pool; dense."""
    F = torch.nn.functional

    def conv(x: Any, name: str, stride: int = 1) -> Any:
        return F.conv2d(x, w[f"{name}.weight"], w[f"{name}.bias"], stride=stride, padding=1)

    def forward(x: Any) -> Any:
        y = F.relu(conv(x, "stem"))
        for i in range(len(stages)):
            y = F.relu(conv(F.relu(conv(y, f"block{i}.conv1")), f"block{i}.conv2") + y)
            if i + 1 < len(stages):
                y = F.relu(conv(y, f"down{i}", stride=2))
        return _linear(torch, y.mean(dim=(2, 3)), w, "fc")

    return forward


TWINS = {"encoder_layer": encoder_twin, "decoder_block": decoder_twin, "convnet": convnet_twin}


def torch_adam_step(torch: Any, params: Sequence[Any], grads: Sequence[Any], hyper: dict,
                    fused: bool) -> tuple[Callable, Any]:
    """One ``torch.optim.Adam`` step on ``params`` (updated in place) and the optimizer."""
    ps = [torch.nn.Parameter(p) for p in params]
    for p, g in zip(ps, grads):
        p.grad = g
    opt = torch.optim.Adam(ps, lr=hyper["lr"], betas=tuple(hyper["betas"]), eps=hyper["eps"],
                           weight_decay=hyper["weight_decay"], fused=fused)
    return opt.step, (ps, opt)


def adam_results(torch: Any, state: Any) -> list[np.ndarray]:
    """P, then M, then V of a torch Adam after its steps, in our output order (less the
    step counter and β powers)."""
    ps, opt = state
    ms = [opt.state[p]["exp_avg"] for p in ps]
    vs = [opt.state[p]["exp_avg_sq"] for p in ps]
    return [t.detach().cpu().numpy() for t in (*ps, *ms, *vs)]


# --- the run ---------------------------------------------------------------------------------------

def _median_ms(fn: Callable[[], Any], sync: Callable[[], None], number: int, repeat: int) -> float:
    fn()
    sync()
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        sync()
        runs.append((time.perf_counter() - start) / number * 1e3)
    return statistics.median(runs)


class Check:
    """One model: its inputs, our outputs, the comparison with the shipped reference."""

    def __init__(self, entry: dict, seed: int) -> None:
        self.entry, self.seed = entry, seed
        self.arrays = []
        generated = []
        for spec in entry["inputs"]:
            if "file" in spec:
                self.arrays.append(np.load(HERE / spec["file"]))
            else:
                self.arrays.append(generate(spec, seed))
                if "fill" not in spec:
                    generated.append(self.arrays[-1])
        if generated and digest(generated) != entry["weights_sha256"]:
            raise RuntimeError("weights rebuilt from their seeds differ from the build host's "
                               "(numpy's Generator changed?)")
        self.by_name = {s["name"]: a for s, a in zip(entry["inputs"], self.arrays)}

    def compare(self, outputs: Sequence[np.ndarray]) -> tuple[bool, float]:
        """(all close, max |diff|) of ``outputs`` against the reference."""
        ok, worst = True, 0.0
        rtol, atol = self.entry["rtol"], self.entry["atol"]
        for got, ref in zip(outputs, self.entry["reference"], strict=True):
            want = np.load(HERE / ref["file"])
            got = np.asarray(got).reshape(-1)[sample_indices(got.size, ref["sample"], self.seed)] \
                if "sample" in ref else np.asarray(got).reshape(want.shape)
            diff = np.abs(got.astype(np.float64) - want)
            worst = max(worst, float(np.nanmax(diff)) if diff.size else 0.0)
            ok &= bool(np.allclose(got, want, rtol=rtol, atol=atol))
        return ok, worst


def _flat(out: Any) -> list[np.ndarray]:
    if hasattr(out, "numpy"):
        return [out.numpy()]
    if isinstance(out, np.ndarray):
        return [out]
    return [a for o in out for a in _flat(o)]


def stage(what: str) -> None:
    """A progress mark: where a crash happened, when one does."""
    print(f"{what} ({time.strftime('%H:%M:%S')})", flush=True)


def run_model(entry: dict, seed: int, torch: Any, args: argparse.Namespace) -> dict:
    import tvm

    import aicf_tvm

    check = Check(entry, seed)
    model = aicf_tvm.load(HERE / entry["library"])
    stage("loaded")
    row: dict[str, Any] = {"name": entry["name"]}
    dev = model.device
    if entry["kind"] == "optimizer":
        n = entry["tensors"]
        tensors = [tvm.runtime.tensor(a, dev) for a in check.arrays]
        groups = (tuple(tensors[:n]), tuple(tensors[n:2 * n]), tuple(tensors[2 * n:]))
        ours = model.function("main")(*groups)  # updates P, M, V in place (donated)
        stage("ran")
        row["ok"], row["diff"] = check.compare(_flat(ours)[:n] + _flat(ours)[n + 3:])
        stage("compared")
        fresh = lambda: [tvm.runtime.tensor(a, dev) for a in check.arrays]
        t = fresh()
        timer = model.vm.time_evaluator("main", dev, number=args.number, repeat=args.repeat)
        row["ours"] = float(np.median(timer(tuple(t[:n]), tuple(t[n:2 * n]), tuple(t[2 * n:]),
                                            *model.weights_args).results)) * 1e3
    else:
        row["ok"], row["diff"] = check.compare(_flat(model(*check.arrays)))
        stage("ran and compared")
        row["ours"] = model.benchmark(*check.arrays, number=args.number, repeat=args.repeat) * 1e3
    stage("timed")
    if torch is not None:
        try:
            torch_peers(entry, check, torch, "cuda" if model.device.dlpack_device_type() == 2 else "cpu",
                        row, args)
        except Exception as err:  # noqa: BLE001 - a failing peer is reported, ours still counts
            row["torch_error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:120]}"
    return row


def torch_peers(entry: dict, check: Check, torch: Any, device: str, row: dict,
                args: argparse.Namespace) -> None:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if entry["kind"] == "optimizer":
        n, hyper = entry["tensors"], entry["hyper"]
        on_dev = [torch.from_numpy(a).to(device) for a in check.arrays]
        step, state = torch_adam_step(torch, [t.clone() for t in on_dev[:n]], on_dev[n:2 * n], hyper, fused=True)
        step()
        ok, diff = check.compare(adam_results(torch, state))
        row["twin_ok"], row["twin_diff"] = ok, diff
        step, _ = torch_adam_step(torch, [t.clone() for t in on_dev[:n]], on_dev[n:2 * n], hyper, fused=True)
        row["eager"] = _median_ms(step, sync, args.number, args.repeat)
        row["eager_label"] = "Adam(fused=True)"
        return
    w = {name: torch.from_numpy(a).to(device) for name, a in check.by_name.items()}
    twin = TWINS[entry["twin"]["kind"]](torch, w, **entry["twin"]["args"])
    x = w[entry["inputs"][0]["name"]]
    with torch.no_grad():
        out = twin(x)
        sync()
        row["twin_ok"], row["twin_diff"] = check.compare([out.cpu().numpy()])
        row["eager"] = _median_ms(lambda: twin(x), sync, args.number, args.repeat)
        if args.no_torch_compile:
            return
        try:
            compiled = torch.compile(twin)
            start = time.perf_counter()
            compiled(x)
            sync()
            row["compile_s"] = time.perf_counter() - start
            row["compiled"] = _median_ms(lambda: compiled(x), sync, args.number, args.repeat)
        except Exception as err:  # noqa: BLE001 - e.g. no C compiler / Triton on this host
            row["torch_error"] = f"torch.compile: {type(err).__name__}: {str(err).strip().splitlines()[0][:100]}"


def describe_device(target: str, torch: Any) -> str:
    import tvm

    if target == "cuda":
        from aicf_tvm.runtime.deploy import _cuda_available

        if not _cuda_available():
            return "no CUDA device visible to TVM's runtime"
        dev = tvm.cuda(0)
        text = f"{dev.device_name} (compute {dev.compute_version})"
    else:
        from aicf_tvm.runtime.threads import thread_count

        name = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
            else platform.processor()
        text = f"{name}, {thread_count()} TVM threads"
    if torch is not None:
        text += f"; torch {torch.__version__}" + (f" (CUDA {torch.version.cuda})" if target == "cuda" else "")
    return text


def _ms(value: float | None) -> str:
    return f"{value:9.3f}" if value is not None else f"{'-':>9s}"


def _ratio(peer: float | None, ours: float, width: int) -> str:
    return (f"{peer / ours:.2f}x" if peer else "-").rjust(width)


def print_table(rows: list[dict], header: bool = True) -> None:
    if header:
        print(f"\n{'model':15s} {'check':>9s} {'max|diff|':>10s} {'ours ms':>9s} {'eager ms':>9s} "
              f"{'compile ms':>10s} {'eager/ours':>10s} {'compile/ours':>12s}  twin")
    for r in rows:
        if "error" in r:
            print(f"{r['name']:15s} {'ERROR':>9s}  {r['error']}")
            continue
        eager, comp = r.get("eager"), r.get("compiled")
        twin = "-" if "twin_ok" not in r else f"{'ok' if r['twin_ok'] else 'MISMATCH'} {r['twin_diff']:.1e}"
        notes = "".join(f"  [{r[k]}]" for k in ("eager_label", "torch_error") if k in r)
        print(f"{r['name']:15s} {'ok' if r['ok'] else 'MISMATCH':>9s} {r['diff']:10.2e} {_ms(r['ours'])} "
              f"{_ms(eager)} {_ms(comp):>10s} {_ratio(eager, r['ours'], 10)} {_ratio(comp, r['ours'], 12)}"
              f"  {twin}{notes}")


ROW = "@@row "  # a child's result line: ROW + JSON


def run_child(entry: dict, argv: Sequence[str]) -> dict:
    """``entry`` run by a child process (``--one``), so that a crash (a segfault in a
    kernel launch, say) is that model's error row, not the end of the run."""
    cmd = [sys.executable, "-X", "faulthandler", str(Path(__file__).resolve()), *argv, "--one", entry["name"]]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    row = None
    for line in proc.stdout:
        if line.startswith(ROW):
            row = json.loads(line[len(ROW):])
        else:
            print(f"    | {line}", end="", flush=True)
    code = proc.wait()
    if row is None:
        how = f"signal {-code}" if code < 0 else f"exit {code}"
        row = {"name": entry["name"], "error": f"the child process died ({how}) before reporting: see its output"}
    return row


def run_one(manifest: dict, entry: dict, args: argparse.Namespace) -> dict:
    import aicf_tvm

    torch = None
    if not args.no_torch:
        try:
            import torch

            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        except ImportError:
            torch = None
    try:
        return run_model(entry, manifest["seed"], torch, args)
    except Exception as err:  # noqa: BLE001 - report and go on with the next model
        if not isinstance(err, aicf_tvm.AicfError):  # ours name the culprit in one line
            traceback.print_exc(limit=3)
        return {"name": entry["name"], "error": f"{type(err).__name__}: {str(err).strip()[:200]}"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=None, help="a subset of the bundle's models")
    parser.add_argument("--number", type=int, default=10, help="calls per timed run")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs (median)")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch peers")
    parser.add_argument("--no-torch-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: this model only
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    manifest = json.loads((HERE / "manifest.json").read_text())
    entries = [e for e in manifest["models"] if not args.models or e["name"] in args.models]
    if args.one is not None:
        entry = next(e for e in entries if e["name"] == args.one)
        print(ROW + json.dumps(run_one(manifest, entry, args)), flush=True)
        return 0
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            torch = None
    print(f"bundle   {manifest['target']} models built on {manifest['built_on']}")
    device = describe_device(manifest["target"], torch)
    print(f"device   {device}", flush=True)
    if device.startswith("no CUDA device"):
        return 1
    rows, failed = [], 0
    for entry in entries:
        start = time.perf_counter()
        row = run_child(entry, argv)
        failed += "error" in row or not row["ok"] or row.get("twin_ok") is False
        print(f"  {entry['name']}: done in {time.perf_counter() - start:.1f} s", flush=True)
        print_table([row], header=False)
        rows.append(row)
    print_table(rows)
    if failed:
        print(f"\n{failed} model(s) failed: see the table", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
