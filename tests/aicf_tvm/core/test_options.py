"""CompileOptions (aicf_tvm/core/options.py): a frozen value whose defaults are the default
build; ``updated`` is how the older keyword arguments build options."""

from __future__ import annotations

import dataclasses

import pytest

from aicf_tvm import CompileOptions
from aicf_tvm.core.options import options_or_default


def test_options_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        CompileOptions().gemm_area_slack = 1.0  # type: ignore[misc]


def test_updated_replaces_only_the_settings_given():
    """None means "not given": a keyword argument left at None keeps the options' own."""
    base = CompileOptions(threads=2, combine_projections=False)
    assert base.updated(threads=None, target="llvm") == CompileOptions(target="llvm", threads=2,
                                                                       combine_projections=False)
    assert base.updated(combine_projections=True).combine_projections


def test_verify_each_pass_defaults_to_aicf_debug(monkeypatch):
    monkeypatch.setenv("AICF_DEBUG", "1")
    assert CompileOptions().verify_each_pass
    monkeypatch.setenv("AICF_DEBUG", "0")
    assert not CompileOptions().verify_each_pass
    monkeypatch.delenv("AICF_DEBUG")
    assert not options_or_default(None).verify_each_pass


def test_candidates_become_a_tuple():
    assert CompileOptions(candidates=[]).candidates == ()


def test_an_unknown_register_tile_form_is_rejected():
    with pytest.raises(ValueError, match="conv_register_tile='widest'"):
        CompileOptions(conv_register_tile="widest")
