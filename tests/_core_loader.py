"""Load torch_xla's torch-free pieces without running torch_xla/__init__.py
(which imports torch).

load_core()    -> the torch_xla._core extension module
load_plugins() -> torch_xla._internal.plugins

The extension is looked up, in order, at $TORCH_XLA_CORE_PATH (a path to the
built _core*.so), then in every torch_xla/ folder on sys.path (an installed
wheel or an in-place build), then in this checkout's torch_xla/ folder.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import types

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _torch_xla_dirs() -> list[str]:
    dirs: list[str] = []
    try:
        spec = importlib.util.find_spec("torch_xla")  # finds, does not import
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        dirs.extend(spec.submodule_search_locations)
    for entry in sys.path:
        d = os.path.join(entry or os.getcwd(), "torch_xla")
        if os.path.isdir(d):
            dirs.append(d)
    dirs.append(os.path.join(_REPO, "torch_xla"))
    seen, out = set(), []
    for d in dirs:
        d = os.path.abspath(d)
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def _find_core() -> str:
    explicit = os.environ.get("TORCH_XLA_CORE_PATH")
    if explicit:
        if not os.path.isfile(explicit):
            raise ImportError(f"TORCH_XLA_CORE_PATH={explicit!r} is not a file")
        return explicit
    searched = _torch_xla_dirs()
    for d in searched:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(d, "_core" + suffix)
            if os.path.isfile(path):
                return path
    raise ImportError(
        "torch_xla._core is not built: no _core extension in " + ", ".join(searched) +
        " (build the project, or set TORCH_XLA_CORE_PATH to the built module)")


def load_core() -> types.ModuleType:
    name = "torch_xla._core"
    if name in sys.modules:
        return sys.modules[name]
    path = _find_core()
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module


def load_plugins() -> types.ModuleType:
    name = "torch_xla._internal.plugins"
    if name in sys.modules:
        return sys.modules[name]
    for d in [os.path.join(_REPO, "torch_xla")] + _torch_xla_dirs():
        path = os.path.join(d, "_internal", "plugins.py")
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
            return module
    raise ImportError("torch_xla/_internal/plugins.py not found")
