"""Model zoo: deterministic ``(module, example_inputs)`` factories for export tests."""

from etlab.models._export import MethodAsForward, export_zoo
from etlab.models.zoo import (
    DYNAMIC_SHAPES,
    METHOD_INPUTS,
    ZOO,
    make_cnn,
    make_cond,
    make_dynamic_batch,
    make_kv_cache_decoder,
    make_mlp,
    make_mobilenet_v2,
    make_transformer,
    make_two_methods,
)

__all__ = [
    "DYNAMIC_SHAPES",
    "METHOD_INPUTS",
    "ZOO",
    "MethodAsForward",
    "export_zoo",
    "make_cnn",
    "make_cond",
    "make_dynamic_batch",
    "make_kv_cache_decoder",
    "make_mlp",
    "make_mobilenet_v2",
    "make_transformer",
    "make_two_methods",
]
