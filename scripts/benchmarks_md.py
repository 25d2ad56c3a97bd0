"""Write ``docs/benchmarks.md`` (and the README's results table) from the benchmarks' JSON.

Usage::

    python -m scripts.benchmarks_md                      # every docs/benchmarks/*.json
    python -m scripts.benchmarks_md --add bench_peers.json [...] [--note TEXT]   # copy runs in first
    python -m scripts.benchmarks_md --check              # exit 1 if a page is out of date

The inputs are what ``scripts/bench_peers.py --json PATH`` writes: per model and peer the
median milliseconds, the check against PyTorch eager (``note``), and under ``run`` where
the numbers were taken (date, command, commit, CPU model and ISA flags, our target, the
peers' versions). ``--add`` copies such a file to
``docs/benchmarks/<date>-<mcpu>-<models>.json``.

Runs of one day, commit and target form one table; the latest of each vector ISA
(AVX-512, AVX2, ...) is "current" and also goes into the block between
``<!-- benchmarks:begin -->`` and ``<!-- benchmarks:end -->`` in README.md; older ones
are listed below, newest first. Each table prints ours in ms,
then ours/peer for every peer (under 1: ours is faster), geometric means over the models
whose outputs matched (per input file, and over the table), and the command that produced
each file.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "benchmarks"
PAGE = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
BEGIN, END = "<!-- benchmarks:begin -->", "<!-- benchmarks:end -->"

# column order and names of bench_peers.py's peers
PEER_NAMES = {"eager": "eager", "inductor": "torch.compile", "ort": "ONNX Runtime", "openvino": "OpenVINO",
              "tvm": "TVM default", "ours_tuned": "ours tuned"}


@dataclass
class Run:
    """One JSON file of ``bench_peers.py``."""

    path: Path
    data: dict[str, Any]

    @property
    def info(self) -> dict[str, Any]:
        return self.data.get("run", {})

    @property
    def day(self) -> str:
        return str(self.info.get("date", ""))[:10] or self.path.stem[:10]

    @property
    def key(self) -> tuple[str, str, str]:
        return self.day, str(self.info.get("commit", "?")), str(self.info.get("target", "?"))

    @property
    def models(self) -> dict[str, dict[str, Any]]:
        return self.data.get("models", {})


@dataclass
class Group:
    """Runs of one day, commit and target: one table."""

    runs: list[Run] = field(default_factory=list)

    @property
    def info(self) -> dict[str, Any]:
        return self.runs[0].info

    def peers(self) -> list[str]:
        seen = {p for run in self.runs for model in run.models.values() for p in model}
        return [p for p in PEER_NAMES if p in seen]


def isa_summary(flags: list[str]) -> str:
    have = set(flags)
    if "avx512f" in have:
        extras = [name for flag, name in (("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16"),
                                          ("avx512_fp16", "FP16"), ("amx_tile", "AMX")) if flag in have]
        return "AVX-512" + (f" ({', '.join(extras)})" if extras else "")
    for flag, name in (("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"), ("sve", "SVE"), ("asimd", "NEON")):
        if flag in have:
            return name
    return "unknown ISA"


def mcpu(target: str) -> str:
    found = re.search(r"mcpu=(\S+)", target)
    return found.group(1) if found else "cpu"


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def ratio(model: dict[str, Any], peer: str) -> tuple[float | None, bool]:
    """ours/peer of the medians, and whether the peer's output matched PyTorch eager."""
    if "ours" not in model or peer not in model:
        return None, True
    return model["ours"]["ms"] / model[peer]["ms"], not str(model[peer].get("note", "")).startswith("MISMATCH")


def table(group: Group) -> list[str]:
    peers = group.peers()
    head = ["model", "ours ms", *(f"ours / {PEER_NAMES[p]}" for p in peers)]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    mismatched = []
    everywhere: dict[str, list[float]] = {p: [] for p in peers}
    for run in group.runs:
        per_peer: dict[str, list[float]] = {p: [] for p in peers}
        for name, model in run.models.items():
            if "ours" not in model:
                lines.append(f"| {name} | failed | " + " | ".join("-" for _ in peers) + " |")
                continue
            cells = [name, f"{model['ours']['ms']:.1f}"]
            if str(model["ours"].get("note", "")).startswith("MISMATCH"):
                cells[1] += " (mismatch)"
                mismatched.append(f"{name}: ours {model['ours']['note']}")
            for p in peers:
                value, ok = ratio(model, p)
                if value is None:
                    cells.append("-")
                    continue
                cells.append(f"{value:.2f}" + ("" if ok else " (mismatch)"))
                if ok:
                    per_peer[p].append(value)
                    everywhere[p].append(value)
                else:
                    mismatched.append(f"{name}: {p} {model[p]['note']}")
            lines.append("| " + " | ".join(cells) + " |")
        if len(run.models) > 1 and len(group.runs) > 1:
            lines.append(geomean_row("geomean", per_peer))
    models = sum(len(run.models) for run in group.runs)
    if models > 1:
        lines.append(geomean_row(f"geomean of {models}" if len(group.runs) > 1 else "geomean", everywhere))
    lines += [f"\n(mismatch: {m})" for m in mismatched]
    return lines


def geomean_row(label: str, ratios: dict[str, list[float]]) -> str:
    cells = [label, ""] + [f"{geomean(v):.2f}" if v else "-" for v in ratios.values()]
    return "| " + " | ".join(f"**{c}**" if c and c != "-" else c for c in cells) + " |"


def caption(group: Group) -> list[str]:
    info = group.info
    cpu = info.get("cpu", "unknown CPU")
    family = f"family {info['cpu_family']} model {info['cpu_model']}, " if info.get("cpu_model") else ""
    dirty = " (with uncommitted changes)" if info.get("dirty") else ""
    versions = ", ".join(f"{k} {v}" for k, v in info.get("versions", {}).items())
    lines = [(f"**{group.runs[0].day}**, {cpu} ({family}{isa_summary(info.get('isa', []))}, "
              f"{info.get('cpus', '?')} CPUs), target `{info.get('target', '?')}`, "
              f"commit `{info.get('commit', '?')}`{dirty}.")]
    if versions:
        lines.append(f"Peers: {versions}.")
    notes = list(dict.fromkeys(run.info["note"] for run in group.runs if run.info.get("note")))
    if notes:
        lines += ["", *notes]
    return lines


MODELS_ARG = re.compile(r" --models((?: [^-\s]\S*)+)")


def commands(group: Group) -> list[str]:
    """The commands that wrote the group's files; runs that differ only in ``--models`` as
    one loop."""
    cmds = [re.sub(r" --json \S+", "", run.info.get("command") or "python -m scripts.bench_peers ...")
            for run in group.runs]
    models = [MODELS_ARG.search(cmd) for cmd in cmds]
    if len(cmds) > 1 and all(models) and len({MODELS_ARG.sub(" --models $M", c) for c in cmds}) == 1:
        names = " ".join(m.group(1).strip() for m in models)
        return [f"    for M in {names}; do", f"        {MODELS_ARG.sub(' --models $M', cmds[0])}", "    done"]
    return [f"    {cmd}" for cmd in cmds]


def is_peers_run(data: Any) -> bool:
    """Whether a JSON file is a ``bench_peers.py`` run (the folder also holds other
    benchmarks' JSON: ``bench_compile.py`` rows, ``sweep_models.py`` lists)."""
    return isinstance(data, dict) and isinstance(data.get("run"), dict) and isinstance(data.get("models"), dict)


def load_groups(paths: list[Path]) -> list[Group]:
    groups: dict[tuple[str, str, str], Group] = {}
    loaded = [(path, json.loads(path.read_text())) for path in paths]
    runs = [Run(path, data) for path, data in loaded if is_peers_run(data)]
    for run in sorted(runs, key=lambda r: (str(r.info.get("date", "")), r.path.name)):
        groups.setdefault(run.key, Group()).runs.append(run)
    return sorted(groups.values(), key=lambda g: (g.runs[0].day, str(g.info.get("date", ""))), reverse=True)


def isa_class(group: Group) -> str:
    """The vector ISA the group's kernels were built for ("AVX-512", "AVX2", ...)."""
    return isa_summary(group.info.get("isa", [])).split(" (")[0]


def current_groups(groups: list[Group]) -> tuple[list[Group], list[Group]]:
    """(the newest day's groups of each ISA class on its newest target, newest first; the
    others): a rule tuned on one class of machine is shown beside its result on the other,
    and a day's runs at two commits (the transformers, then the convnets) both."""
    newest: dict[str, tuple[str, str]] = {}
    for group in groups:
        newest.setdefault(isa_class(group), (group.runs[0].day, group.runs[0].key[2]))
    chosen = [g for g in groups if (g.runs[0].day, g.runs[0].key[2]) == newest[isa_class(g)]]
    return chosen, [g for g in groups if not any(g is c for c in chosen)]


def readme_block(groups: list[Group]) -> str:
    lines = [BEGIN, ""]
    for group in groups:
        lines += [*caption(group)[:1], "", *table(group), ""]
    lines += [("Ours in ms, then ours/peer (under 1: ours is faster), median of the rounds; every output "
               "checked against PyTorch eager; the newest run of each vector ISA. How it was run, and "
               "earlier runs: [docs/benchmarks.md](docs/benchmarks.md)."), "", END]
    return "\n".join(lines)


def page(groups: list[Group]) -> str:
    currents, older = current_groups(groups)
    lines = [
        "# Benchmarks",
        "",
        "<!-- generated by scripts/benchmarks_md.py from docs/benchmarks/*.json: edit those, not this -->",
        "",
        "Ours (`aicf_tvm.from_torch` + `aicf_tvm.compile(mod, target=\"llvm\")`, untuned) against the",
        "engines a user would pick instead, on `transformers` models at their default configs with random",
        "weights, measured by `scripts/bench_peers.py` in one process: every peer gets the same threads",
        "and inputs, its output is checked against PyTorch eager, and timing is interleaved in an order",
        "shuffled each round; each cell is the ratio of medians over the rounds (under 1: ours is",
        "faster). Models: BERT-base, GPT-2 small and a 4-layer GQA LLaMA at 128 tokens (the all-ones",
        "mask a tokenizer returns), ViT-B/16 at 224 px, ResNet-50, MobileNetV2 and ConvNeXt at 224 px",
        "(batch-norm calibrated on random batches); `--help` lists more.",
        "",
        "These are 2-core slices of shared cloud VMs: absolute times move by 10-30% between runs and",
        "a neighbour's load shows in single rounds (the JSON keeps every round's time and the peer that",
        "ran just before it), so compare ratios within one table. The dated lab notebook of earlier",
        "runs, A/B comparisons of single rules, tuning and per-kernel profiles is",
        "[benchmarks-history.md](benchmarks-history.md).",
        "",
        "## Current",
        "",
        "The newest run on each vector ISA.",
        "",
    ]
    for current in currents:
        lines += [
            *caption(current),
            "",
            *table(current),
            "",
            "Produced by (`pip install -e \".[bench]\"`; from the repository root at that commit):",
            "",
            *commands(current),
            "",
        ]
    lines += [
        "## Regenerate",
        "",
        "    for M in bert gpt2 llama vit resnet50 mobilenetv2 convnext; do",
        "        python -m scripts.bench_peers --models $M --peers eager ort openvino ours --rounds 9 \\",
        "            --json /tmp/bench-$M.json",
        "    done",
        "    python -m scripts.benchmarks_md --add /tmp/bench-*.json --note \"How the runs were taken.\"",
        "",
        "A few minutes in all on 2 cores. `--add` copies each JSON to",
        "`docs/benchmarks/<date>-<mcpu>-<models>.json`; the script then rewrites this page and the",
        "README's table from every file there (`--check` only says whether they are up to date). Run",
        "the benchmark alone on the machine: another process's threads slow each engine differently,",
        "and one process per model keeps a noisy moment to one row. `--peers` may add",
        "`inductor` (`torch.compile`, minutes of compiling per model) and `tvm` (TVM's default",
        "pipeline, slow); `--budget B` adds `ours_tuned` ([tuning.md](tuning.md)).",
        "",
        "## Other benchmark scripts",
        "",
        "- `scripts/bench_dynamic.py`: one dynamic compile against one compile per shape and ONNX Runtime.",
        "- `scripts/profile_kernels.py MODEL [--in-model]`: every kernel of a model timed, ranked.",
        "- `scripts/kernel_count.py`: kernels per inference, ours against TVM's default build.",
        "- `scripts/roofline.py`: our fused GEMM against numpy's matmul.",
        "- `scripts/bench.py`: the older harness over the onnx wheel's light models, against TVM's pipelines.",
        "- `scripts/ab_*.py`: one rule against its absence in one process, output bits compared.",
        "- `scripts/bench_transcendental.py`, `scripts/sweep_vector_math.py`: [numerics.md](numerics.md).",
    ]
    if older:
        lines += ["", "## Earlier runs", ""]
        for group in older:
            lines += [*caption(group), "", *table(group), "", *commands(group), ""]
    return "\n".join(lines).rstrip() + "\n"


def add(path: Path, note: str = "") -> Path:
    data = json.loads(path.read_text())
    if "models" not in data:
        raise SystemExit(f"{path}: not a bench_peers.py JSON (no 'models')")
    info = data.get("run")
    if not info:
        raise SystemExit(f"{path}: no 'run' section (written by an older bench_peers.py): date, CPU and "
                         "commit unknown")
    models = "-".join(list(data["models"])[:4]) + ("-etc" if len(data["models"]) > 4 else "")
    dest = RUNS / f"{info['date'][:10]}-{mcpu(info.get('target', ''))}-{models}.json"
    if dest.exists() and json.loads(dest.read_text()).get("run", {}).get("date") != info["date"]:
        # another run of the same day, target and models: kept beside it, not written over
        dest = dest.with_name(f"{dest.stem}-{str(info.get('commit', 'run'))[:7]}.json")
    RUNS.mkdir(parents=True, exist_ok=True)
    if note:
        info["note"] = note
        dest.write_text(json.dumps(data, indent=1) + "\n")
    else:
        shutil.copyfile(path, dest)
    print(f"added {dest.relative_to(ROOT)}")
    return dest


def with_readme_block(text: str, block: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} block to replace")
    return text[:start] + block + text[end + len(END):]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path, help="JSON files (default: docs/benchmarks/*.json)")
    parser.add_argument("--add", nargs="+", type=Path, default=[], metavar="JSON",
                        help="copy these bench_peers.py outputs into docs/benchmarks/ first")
    parser.add_argument("--note", default="",
                        help="with --add: a sentence printed under the table's caption (how the run was taken)")
    parser.add_argument("--out", type=Path, default=PAGE, help="the page to write (default: docs/benchmarks.md)")
    parser.add_argument("--readme", default=str(README),
                        help="the README whose table block to replace ('': leave it alone)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is out of date")
    args = parser.parse_args()
    for path in args.add:
        add(path, args.note)
    paths = args.runs or sorted(RUNS.glob("*.json"))
    if not paths:
        raise SystemExit(f"no benchmark JSON given and none in {RUNS.relative_to(ROOT)}")
    groups = load_groups(paths)
    outputs = {args.out: page(groups)}
    if args.readme:
        readme = Path(args.readme)
        outputs[readme] = with_readme_block(readme.read_text(), readme_block(current_groups(groups)[0]))
    stale = [path for path, text in outputs.items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path}: out of date; run python -m scripts.benchmarks_md", file=sys.stderr)
        sys.exit(1 if stale else 0)
    for path in stale:
        path.write_text(outputs[path])
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
