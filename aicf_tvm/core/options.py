"""CompileOptions: every setting of one compilation, passed to the passes and schedule
rules that read it (docs/design.md, "Options").

A frozen value, so one compilation cannot change another's settings: the pipeline
(``aicf_tvm.driver.pipeline``) hands it to the passes and rules that need a setting, as
TVM passes take their settings as arguments, instead of module globals, environment
variables or the enclosing ``with target:``.  The defaults are the default build; the
knobs after ``vector_math`` exist so that the A/B scripts (``scripts/ab_*.py``) can build
a rule's earlier form in the same process and measure what the rule gains.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .numerics import NUMERIC_LEVELS

CONV_REGISTER_TILES = ("held", "partial", "dividing")


def debug_from_env() -> bool:
    """Whether ``AICF_DEBUG`` asks for ``verify_contracts`` after every pass (the tests set it)."""
    return os.environ.get("AICF_DEBUG", "") not in ("", "0")


@dataclass(frozen=True)
class CompileOptions:
    """The settings of one compilation (None: the default named in the comment)."""

    # a tvm Target or its string; None: "llvm" for compile, the enclosing `with target:` in a pass
    target: Any = None
    # the numeric level (aicf_tvm.core.numerics, docs/numerics.md): "exact" computes what the
    # graph's op order does; "relaxed" lets exp/sigmoid/tanh run in float32 and softmax row sums
    # per vector lane, each such Emit listed in the report as an approximation
    numerics: str = "exact"
    # the candidate Emits FuseEmits tries; None: the library's (aicf_tvm.library)
    candidates: Sequence[Any] | None = None
    # tuning records (a work dir or database) that replace the default schedules
    database: Any = None
    # CPU threads the compiled model runs with; None: aicf_tvm.runtime.threads.thread_count
    threads: int | None = None
    # verify_contracts after every pipeline step: catches the pass that broke a contract
    verify_each_pass: bool = field(default_factory=debug_from_env)
    # float32 exp/erf/tanh/... as SIMD arithmetic, not one libm call per lane (False: measure it)
    vector_math: bool = True
    # constant GEMM operands packed at compile time, for a small M too (False: packed per call,
    # or read as stored by a small M)
    prepack_weights: bool = True
    # q/k/v projections of one input as one GEMM (relax_passes.CombineProjections)
    combine_projections: bool = True
    # a grouped-query attention's one-row matmuls per key/value head (relax_passes.GroupQueryHeads)
    group_query_heads: bool = True
    # a QDQ model's quantized convolutions in int32 as QLinearConv defines them, where the target
    # has an integer convolution (relax_passes.integer_qdq; False: the float graph as written)
    qdq_integer: bool = True
    # a constant operand whose elements share their bits passed as its one element (ImplicitBroadcasts)
    uniform_constants_as_scalars: bool = True
    # float + - * / kept from TIR's simplifier and FMA contraction (schedules.cpu.ieee_arith)
    ieee_arithmetic: bool = True
    # static reshapes legalized axis group by axis group, not by TOPI's flat index (legalize_reshape)
    static_reshapes_by_group: bool = True
    # padded M x N the by-area GEMM tile may cost over the least, for more accumulators (gemm_plan)
    gemm_area_slack: float = 1.10
    # kc the by-area GEMM plan keeps near: a 48-column B panel in half of a 48 KiB L1 (gemm_plan)
    gemm_kc_near_by_area: int = 128
    # GEMM column blocks split evenly over the cores, not the widest (gemm_plan.choose_nc)
    gemm_even_column_blocks: bool = True
    # the GEMM's row blocks parallel too where its column blocks split unevenly over the cores
    # (gemm_plan.plan_gemm: 3 column blocks on 2 cores keep one idle a third of the time)
    gemm_rows_for_balance: bool = True
    # the GEMM's next B panel prefetched inside its K loop (schedules.cpu.gemm_prefetch)
    gemm_prefetch_b_panels: bool = True
    # each K block of a float GEMM (each input-channel block of a blocked convolution) summed
    # from zero, then added to the output (schedules.cpu.gemm_prefetch): the error of a blocked
    # sum, not of one serial sum over K
    blocked_sums: bool = True
    # a GEMM whose K is one block: its tile's sums start in registers and its epilogue runs on
    # each register tile as it is done, in L1 (schedules.cpu.gemm: C is not zeroed and reread)
    gemm_tile_epilogue: bool = True
    # AVX2: a GEMM of several row blocks takes the register tile (4 x 3 vectors or 6 x 2) whose
    # accumulators, B vectors and broadcast fill the 16 registers, where K has several blocks or
    # the epilogue calls no math function (gemm_plan._full_register_tile)
    gemm_full_register_tile: bool = True
    # AVX2: a register tile with fewer sums than the FMA units need (a decode step's 1 row x 2
    # vectors) spans several packed B panels side by side (gemm_plan._row_panels)
    gemm_row_panels: bool = True
    # AVX2: attention's register tiles of 6 rows (12 accumulators beside the loaded vectors and
    # the broadcast), not 4 (attention_analysis.plan_attention)
    attention_full_register_tile: bool = True
    # vectors of keys per step of the softmax's exp loop: VectorizeMath's exp is a chain of ~50
    # instructions a vector that a loop of one vector per step waits on; two interleave two
    # chains (on one Zen 3 core an exp loop over 6016 floats in L1: 0.89x the time; four
    # vectors spilled, 1.56x) (schedules.cpu.attention._schedule_row_block)
    attention_exp_vectors: int = 2
    # attention's row max over whole vectors of keys, padded by repeated keys (whole_vectors.pad_max)
    attention_lane_max: bool = True
    # attention's parallel tile loop runs a head's row tiles in turn: its kᵀ and v stay in L2
    attention_head_major: bool = True
    # attention's q·kᵀ inside the softmax's tile loop, kᵀ packed in panels of a tile's keys
    attention_one_pass: bool = True
    # ... also at a constant key count of no whole register tiles (Whisper's 1500, ViT's 197):
    # q·kᵀ's keys in the tile split into whole tiles and a tail (schedules.cpu.attention._one_pass)
    attention_one_pass_tail: bool = True
    # kᵀ packed per head inside the tile when a tile holds all of a head's rows (decode)
    attention_pack_in_tile: bool = True
    # v packed per head in slices of p·v's register tile, each slice's keys contiguous, when
    # several row tiles read it (schedules.cpu.attention._pack_v)
    attention_pack_v: bool = True
    # attention's row tiles stop at the last key their mask leaves open, when a check per call
    # proves the masked keys add nothing (schedules.cpu.masked_keys)
    attention_skip_masked: bool = True
    # attention's unrolled row loops without the row tail's predicate where a tile is whole
    # (schedules.cpu.unswitch_rows)
    attention_unswitch_rows: bool = True
    # the blocked convolution's register tile: "held" (partial tiles in half the registers),
    # "partial" (the most FMAs per step) or "dividing" (columns dividing the width)
    conv_register_tile: str = "held"

    def __post_init__(self) -> None:
        if self.candidates is not None and not isinstance(self.candidates, tuple):
            object.__setattr__(self, "candidates", tuple(self.candidates))
        if self.numerics not in NUMERIC_LEVELS:
            raise ValueError(f"numerics={self.numerics!r}: not one of {', '.join(NUMERIC_LEVELS)}")
        if self.conv_register_tile not in CONV_REGISTER_TILES:
            raise ValueError(f"conv_register_tile={self.conv_register_tile!r}: not one of "
                             f"{', '.join(CONV_REGISTER_TILES)}")

    def updated(self, **settings: Any) -> CompileOptions:
        """These options with each setting given not None replaced (keyword arguments of
        the older API build options through it)."""
        return dataclasses.replace(self, **{k: v for k, v in settings.items() if v is not None})


def options_or_default(options: CompileOptions | None) -> CompileOptions:
    """``options``, or the default ones."""
    return CompileOptions() if options is None else options


__all__ = ["CONV_REGISTER_TILES", "CompileOptions", "debug_from_env", "options_or_default"]
