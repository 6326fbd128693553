"""torch.compile's openxla backends on our core (see dynamo_bridge).

torch registers ``openxla`` (AOT Autograd + our compiler) and ``openxla_eval`` in
``torch._dynamo.backends.torchxla``, which it imports lazily. ``install()`` (run at ``import
torch_xla``, importing nothing) adjusts ``openxla`` once that module is loaded: inference graphs
keep their in-place writes to inputs (an optimizer step's parameters and state) inside the graph,
where the compiled callable writes them back in C++, instead of AOT Autograd's Python ``copy_``
per tensor after the call.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys

_TARGET = "torch._dynamo.backends.torchxla"


def _configure(module) -> None:
    backend = getattr(module, "openxla", None)
    kwargs = getattr(backend, "kwargs", None)
    if isinstance(kwargs, dict):
        kwargs.setdefault("keep_inference_input_mutations", True)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)  # find the real module with the other finders
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_configure(module):
            exec_module(module)
            _configure(module)

        loader.exec_module = exec_and_configure
        return spec


def install() -> None:
    if _TARGET in sys.modules:
        _configure(sys.modules[_TARGET])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
