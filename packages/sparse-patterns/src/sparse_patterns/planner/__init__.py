"""The MMInference planner's parts, one concern a module: ``context`` (a layer's shared inputs),
``group`` (:class:`GroupPlan`, what each group planner returns), ``static``,
``vertical_slash``, ``grid``, ``boundary`` (one module per kind of head) and ``assemble`` (a
layer's groups into one ``BlockPlan``). The entry points are ``sparse_patterns.plan_layer`` and
``sparse_patterns.mminference_attention``."""

from .context import LayerContext, normalize_head_configs
from .group import GroupPlan

__all__ = ["GroupPlan", "LayerContext", "normalize_head_configs"]
