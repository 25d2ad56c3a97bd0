"""Each top-level package imports on its own, and the layering holds (docs/design.md §8)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["aicf_tvm", "relax_passes", "schedules"])
def test_package_imports_in_a_fresh_interpreter(package):
    code = (
        f"import {package}, sys; "
        "driver = [m for m in ('aicf_tvm.driver.pipeline', 'aicf_tvm.driver.cli', 'aicf_tvm.driver.frontends') if m in sys.modules]; "
        "assert not driver, driver"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_core_does_not_import_passes_or_schedules():
    code = (
        "import sys, aicf_tvm; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('relax_passes', 'schedules')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
