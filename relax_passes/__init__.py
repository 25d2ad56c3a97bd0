"""Our Relax passes, one per module, usable in any TVM pipeline.

The order the compiler runs them in is listed once, in docs/pipeline.md ("The passes, in order").
"""

from .bound_shapes import BoundShapes
from .channels_first import ChannelsFirst
from .combine_int4_calls import CombineInt4Calls
from .combine_projections import CombineProjections
from .creation_ops import NormalizeCreationOps
from .eliminate_emits import EliminateEmits
from .fold_batch_norm import FoldBatchNorm
from .fold_constant_emits import FoldConstantEmits
from .fold_pad import FoldPadIntoConv
from .fuse_emits import FuseEmits
from .ieee_fold import FoldConstantIEEE
from .insert_emits import InsertEmits
from .lift_emits import LiftEmits
from .lower_emits import LowerEmits
from .materialize_emits import MaterializeEmits, MaterializeLayouts
from .normalize_indices import NormalizeIndices
from .propagate_contracts import PropagateContracts
from .sink_reshapes import SinkReshapes

__all__ = ["BoundShapes", "ChannelsFirst", "CombineInt4Calls", "CombineProjections", "EliminateEmits", "FoldBatchNorm",
           "FoldConstantEmits", "FoldConstantIEEE", "FoldPadIntoConv", "FuseEmits", "InsertEmits", "LiftEmits",
           "LowerEmits", "MaterializeEmits", "MaterializeLayouts", "NormalizeCreationOps", "NormalizeIndices",
           "PropagateContracts", "SinkReshapes"]
