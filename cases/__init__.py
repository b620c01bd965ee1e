"""The case catalog: one module per named family (catalog order).

Each family module has ``FAMILY`` (the ID prefix), a docstring saying which
real defects it exists to catch, and ``cases()`` returning its cases.
:mod:`harness.catalog` collects them; ``pytest cases/`` runs them.
"""

FAMILY_MODULES = (
    "allgather_shape",
    "mixed_precision",
    "channels_last",
    "module_config",
    "process_group",
    "numerics",
    "degenerate",
    "training_loop",
    "ddp",
    "fsdp",
    "validation",
    "activation_checkpoint",
    "double_backward",
    "autocast",
    "script",
    "join",
    "conversion",
    "compile",
    "cuda_graph",
    "private_ops",
    "scale",
    "search_found",
    "no_group",
    "inference",
)
