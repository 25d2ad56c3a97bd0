"""The compile cache: a model compiled once is loaded, not compiled, the next time.

``compile`` looks a module up by a key made of everything that decides the library it
builds: the module (TVM's structural hash, which covers every constant's bytes), the
target as resolved (its CPU and features), the options that change code, and the
versions of TVM, tvm-ffi and ours (the digest of our source files too, so a changed
rule never reuses a stale build). A hit is the library an earlier compile exported,
loaded with ``aicf_tvm.load`` (its digest checked); a miss compiles and exports into the
cache. An ONNX file given by path is also keyed by its bytes and import arguments, so a
hit skips the import too. A PyTorch module's import has entries of its own, keyed by
the program ``torch.export`` traced (``frontends.import_cache``): ``from_torch`` of a
module imported before reads the module back instead of decomposing and translating it.
Each kernel's schedule and code have entries of their own (``KernelCache``), which
models sharing a layer's shapes share.

Where: ``$AICF_CACHE_DIR``, else ``$XDG_CACHE_HOME/aicf/compiled``, else
``~/.cache/aicf/compiled``; ``compile(cache_dir=...)`` moves it, ``compile(cache=False)``
or ``aicf compile --no-cache`` skips it, ``AICF_CACHE_DIR=off`` switches it off. Size:
``$AICF_CACHE_MAX_GB`` (default 8); past it, the least recently used entries go.

Safe with concurrent writers: an entry is written to a temporary name in the cache
folder and renamed into place (atomic on POSIX): a reader sees a whole library or none,
and two writers of one key write the same library. A corrupt or unreadable entry (cut
short, modified, from another CPU) is removed with a warning and the model compiled
again: an entry is never used unless it loads and its digest matches.

Not cached: targets this machine cannot run (CUDA, another CPU: an entry is checked by
loading it), builds with a tuning database or custom candidates (their records and rules
are the caller's).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi
from tvm_ffi.serialization import from_json_graph_str, to_json_graph_str

from aicf_tvm.core.emit import plain
from aicf_tvm.core.errors import AicfError
from aicf_tvm.core.options import CompileOptions
from aicf_tvm.core.version import __version__
from aicf_tvm.runtime.compiled import CompiledModel, load
from aicf_tvm.runtime.cpu_features import is_x86, unrunnable_here

FORMAT = 1
SUFFIX = ".so"
KERNEL = ".kernel"
CODE = ".ll"
# a library; an imported module (frontends.import_cache); a kernel's schedule; its code
SUFFIXES = (SUFFIX, ".import", KERNEL, CODE)
_PACKAGES = ("aicf_tvm", "relax_passes", "schedules")
_code: str | None = None


def default_dir() -> Path | None:
    """The cache folder the environment names (module docstring); None when it is off."""
    env = os.environ.get("AICF_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in ("", "0", "off", "none") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "aicf" / "compiled"


def max_bytes() -> int:
    try:
        return int(float(os.environ.get("AICF_CACHE_MAX_GB", "8")) * 2**30)
    except ValueError as err:
        raise AicfError(f"AICF_CACHE_MAX_GB={os.environ['AICF_CACHE_MAX_GB']!r}: not a number") from err


def code_digest() -> str:
    """SHA-256 of our compiler's source files (names and bytes), once per process."""
    global _code
    if _code is None:
        root = Path(__file__).resolve().parents[2]
        digest = hashlib.sha256()
        for package in _PACKAGES:
            for path in sorted((root / package).rglob("*.py")):
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
        _code = digest.hexdigest()
    return _code


def cacheable(options: CompileOptions, target: tvm.target.Target) -> bool:
    """Whether ``compile`` uses the cache: a CPU target that runs here (an entry is checked
    by loading it), without a tuning database or custom candidates."""
    if options.database is not None or options.candidates is not None or target.kind.name != "llvm":
        return False
    spec = plain(target.export())
    return is_x86(spec) == is_x86({}) and not unrunnable_here(spec)


def _options_json(options: CompileOptions) -> dict:
    skip = {"target", "database", "candidates", "threads", "verify_each_pass"}  # no effect on the library's code
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.name not in skip}


def versions() -> dict[str, str]:
    """What an entry was made by: our version and source digest, TVM's and tvm-ffi's."""
    return {"aicf": __version__, "code": code_digest(), "tvm": tvm.__version__, "tvm_ffi": tvm_ffi.__version__}


def digest_of(material: Mapping[str, Any]) -> str:
    """An entry name: the SHA-256 of ``material`` as sorted JSON."""
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def key(what: Mapping[str, Any], options: CompileOptions, target: tvm.target.Target) -> str:
    """The entry name for a module or file described by ``what`` built with ``options`` for
    ``target``."""
    spec = json.dumps(target.export(), sort_keys=True, default=str)
    return digest_of({"format": FORMAT, **versions(), "target": spec, "options": _options_json(options), **what})


def module_key(mod: tvm.IRModule, options: CompileOptions, target: tvm.target.Target) -> str:
    return key({"module": str(tvm_ffi.structural_hash(mod))}, options, target)


def file_key(path: str | os.PathLike, import_args: Mapping[str, Any], options: CompileOptions,
             target: tvm.target.Target) -> str:
    """The key of an ONNX file by its bytes and the arguments it is imported with."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return key({"file": digest.hexdigest(), "import": json.dumps(import_args, sort_keys=True, default=str)},
               options, target)


class CompileCache:
    """A folder of exported libraries, one per key (module docstring)."""

    def __init__(self, root: str | os.PathLike, limit: int | None = None) -> None:
        self.root = Path(root)
        self.limit = max_bytes() if limit is None else limit

    def path(self, name: str, suffix: str = SUFFIX) -> Path:
        return self.root / f"{name}{suffix}"

    def get(self, name: str, threads: int | None = None) -> CompiledModel | None:
        """The entry ``name`` loaded, or None; a corrupt entry is removed with a warning."""
        path = self.path(name)
        if not path.is_file():
            return None
        try:
            model = load(path, threads=threads)
        except FileNotFoundError:  # removed by another process meanwhile
            return None
        except AicfError as err:
            warnings.warn(f"aicf compile cache: {path} is unusable ({err}); compiling again", stacklevel=3)
            path.unlink(missing_ok=True)
            return None
        used(path)
        return model

    def put(self, name: str, model: CompiledModel) -> Path | None:
        """Export ``model`` as entry ``name`` (atomically), then trim the folder to the
        size limit; None (with a warning) when the folder cannot be written."""
        return self.write(name, SUFFIX, model.export)

    def write(self, name: str, suffix: str, fill: Callable[[str], None], trim: bool = True) -> Path | None:
        """Entry ``name`` of kind ``suffix`` written by ``fill(path)`` under a temporary
        name and renamed into place (module docstring), then (with ``trim``) the folder
        trimmed to its limit; None (with a warning) when the folder cannot be written."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{name[:16]}-", suffix=suffix, dir=self.root)
            os.close(fd)
        except OSError as err:
            warnings.warn(f"aicf compile cache: cannot write in {self.root} ({err}); not cached", stacklevel=4)
            return None
        try:
            fill(tmp)
            os.replace(tmp, self.path(name, suffix))
        finally:
            Path(tmp).unlink(missing_ok=True)
        if trim:
            self.trim(keep=name)
        return self.path(name, suffix)

    def entries(self) -> list[Path]:
        """Every entry: libraries, the imported modules of ``frontends.import_cache``, and
        the kernels' schedules and code (``KernelCache``)."""
        if not self.root.is_dir():
            return []
        return [p for p in self.root.iterdir() if p.suffix in SUFFIXES and not p.name.startswith(".")]

    def trim(self, keep: str | None = None) -> None:
        """Remove the least recently used entries until the folder fits the limit."""
        sized = []
        for p in self.entries():
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            sized.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in sized)
        for _, size, p in sorted(sized, key=lambda e: e[0]):
            if total <= self.limit:
                break
            if p.stem == keep:
                continue
            p.unlink(missing_ok=True)
            total -= size


class KernelCache:
    """The schedules of kernels, one entry per distinct kernel (``schedules.ScheduleMemo``).

    A kernel is the unscheduled PrimFunc LowerEmits makes of one Emit: its computation,
    shapes and dtypes, and in its attributes the Emit's kind, attributes, interface and
    contract. The key is its structural hash with the target, the options that change code
    and the versions (``key``); an entry holds the kernel and its scheduled form, and is
    used only when the kernel in it is structurally equal to the one asked for. The rules
    read nothing else (not the model around the kernel), so a model that shares a layer's
    shapes with one compiled before (RoBERTa after BERT) takes its schedules from here.
    Their code likewise (``get_code``/``put_code``): each LLVM module of a CPU build
    (``pipeline.build_in_parts``: a kernel, or a few of a model of many) is kept as the
    LLVM IR TVM's code generator made and optimized, keyed by the module (its kernels as
    they were scheduled and finalized, their names included), the target, the build's
    PassContext and the versions; a hit is that IR read back by LLVM (``load_module`` of
    a ``.ll``: the target's CPU and features are in it), which the JIT and the export turn
    into machine code as they do a module built here.
    Entries are written without trimming the folder (they are small; the library written
    after them trims it), and a damaged one is removed with a warning and made again.
    """

    MAGIC = b"AICF-KERNEL"

    def __init__(self, store: CompileCache, options: CompileOptions) -> None:
        self.store, self.options = store, options
        self.writable = True

    def get(self, func: tvm.tirx.PrimFunc, target: tvm.target.Target) -> tvm.tirx.PrimFunc | None:
        path = self.store.path(self._name(func, target), KERNEL)
        body = self._read(path, b"", "scheduling again")
        if body is None:
            return None
        try:
            entry = json.loads(body)
            kernel, scheduled = (from_json_graph_str(entry[k]) for k in ("kernel", "scheduled"))
        except (ValueError, KeyError, RuntimeError) as err:
            self._unusable(path, err, "scheduling again")
            return None
        if not tvm_ffi.structural_equal(kernel, func):  # another kernel of the same hash
            return None
        used(path)
        return scheduled

    def put(self, func: tvm.tirx.PrimFunc, target: tvm.target.Target, scheduled: tvm.tirx.PrimFunc) -> None:
        body = json.dumps({"kernel": to_json_graph_str(func), "scheduled": to_json_graph_str(scheduled)}).encode()
        self._write(self._name(func, target), KERNEL, b"", lambda path: Path(path).write_bytes(body))

    def get_code(self, part: tvm.IRModule, target: tvm.target.Target,
                 context: tvm.transform.PassContext) -> tvm.runtime.Module | None:
        """The LLVM module built before from ``part`` (class docstring), or None."""
        path = self.store.path(self._code_name(part, target, context), CODE)
        if self._read(path, b"; ", "building again") is None:  # "; ": a comment to LLVM's parser
            return None
        try:
            lib = tvm.runtime.load_module(str(path))
        except Exception as err:  # noqa: BLE001 - LLVM's parser: any failure is an unusable entry
            self._unusable(path, (str(err).strip().splitlines() or [type(err).__name__])[0], "building again")
            return None
        used(path)
        return lib

    def put_code(self, part: tvm.IRModule, target: tvm.target.Target, context: tvm.transform.PassContext,
                 lib: tvm.runtime.Module) -> None:
        if lib.kind == "llvm":  # LLVM IR, by the suffix
            self._write(self._code_name(part, target, context), CODE, b"; ", lib.write_to_file)

    def _name(self, func: tvm.tirx.PrimFunc, target: tvm.target.Target) -> str:
        return key({"kernel": str(tvm_ffi.structural_hash(func))}, self.options, target)

    def _code_name(self, part: tvm.IRModule, target: tvm.target.Target, context: tvm.transform.PassContext) -> str:
        config = {str(k): str(v) for k, v in context.config.items()}
        return key({"code": str(tvm_ffi.structural_hash(part)), "opt_level": int(context.opt_level),
                    "config": config}, self.options, target)

    def _read(self, path: Path, lead: bytes, then: str) -> bytes | None:
        """The body of the entry at ``path`` (after its line ``lead MAGIC sha256``), None
        where there is none or it does not match its digest (removed, with a warning)."""
        try:
            data = path.read_bytes()
        except OSError:  # none, or a folder that cannot be read (the library's write says so)
            return None
        head, _, body = data.partition(b"\n")
        if head != lead + self.MAGIC + b" " + hashlib.sha256(body).hexdigest().encode():
            self._unusable(path, "modified or cut", then)
            return None
        return body

    def _write(self, name: str, suffix: str, lead: bytes, fill: Callable[[str], None]) -> None:
        """Entry ``name`` of kind ``suffix``: what ``fill(path)`` writes, after the line
        ``lead MAGIC sha256`` of it; no more writes once the folder refused one (one warning)."""
        if not self.writable:
            return

        def framed(path: str) -> None:
            fill(path)
            body = Path(path).read_bytes()
            Path(path).write_bytes(lead + self.MAGIC + b" " + hashlib.sha256(body).hexdigest().encode() + b"\n"
                                   + body)

        self.writable = self.store.write(name, suffix, framed, trim=False) is not None

    @staticmethod
    def _unusable(path: Path, why: object, then: str) -> None:
        warnings.warn(f"aicf compile cache: {path} is unusable ({why}); {then}", stacklevel=5)
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def used(path: Path) -> None:
    """Mark an entry recently used: trimmed last."""
    try:
        os.utime(path)
    except OSError:
        pass


def cache_for(cache: bool, cache_dir: str | os.PathLike | None) -> CompileCache | None:
    """The cache ``compile(cache=..., cache_dir=...)`` uses, or None."""
    if not cache:
        return None
    root = Path(cache_dir) if cache_dir is not None else default_dir()
    return None if root is None else CompileCache(root)


__all__ = ["CompileCache", "KernelCache", "cache_for", "cacheable", "code_digest", "default_dir", "digest_of",
           "file_key", "module_key", "used", "versions"]
