"""Every exception class our packages define derives from ``AicfError`` (``aicf_tvm/core/errors.py``),
so that ``except AicfError`` catches whatever we raise on purpose."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from aicf_tvm.core.errors import AicfError, DeployError, TuningError

PACKAGES = ("aicf_tvm", "relax_passes", "schedules")


def our_modules() -> list[str]:
    names = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        names.append(package)
        names += [info.name for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}.")]
    return sorted(names)


def exception_classes(module_name: str) -> list[type]:
    module = importlib.import_module(module_name)
    return [obj for obj in vars(module).values()
            if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == module_name]


def test_the_walk_sees_the_packages_and_their_errors():
    """The walk reaches every layer (an empty walk would pass the check below vacuously)."""
    modules = our_modules()
    assert {"aicf_tvm.core.errors", "aicf_tvm.driver.tuning.run", "relax_passes.lower_emits",
            "schedules.tuning.tasks"} <= set(modules)
    assert AicfError in exception_classes("aicf_tvm.core.errors")


def test_every_exception_class_of_our_modules_derives_from_aicf_error():
    outside = [f"{cls.__module__}.{cls.__qualname__}" for name in our_modules()
               for cls in exception_classes(name) if not issubclass(cls, AicfError)]
    assert not outside, f"derive these from AicfError (or a subclass in aicf_tvm/core/errors.py): {outside}"


@pytest.mark.parametrize(("module", "name", "bases"), [
    ("aicf_tvm.runtime.cuda_binary", "CarriedBinaryError", (DeployError, RuntimeError)),
    ("schedules.tuning.tasks", "TuningFailed", (TuningError, RuntimeError)),
    ("schedules.tuning.tasks", "SearchFailed", (TuningError, RuntimeError)),
    ("schedules.tuning.remote", "RemoteError", (TuningError, RuntimeError)),
])
def test_errors_outside_errors_py_keep_their_builtin_base(module, name, bases):
    """They were plain RuntimeErrors before joining the tree: callers that catch
    RuntimeError still catch them."""
    cls = getattr(importlib.import_module(module), name)
    assert all(issubclass(cls, base) for base in bases)
