"""PyTorch/XLA's module name for the Dynamo bridge (torch's openxla backends import it)."""
from .._dynamo.dynamo_bridge import CompiledGraph, extract_compiled_graph  # noqa: F401
