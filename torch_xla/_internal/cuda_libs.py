"""CUDA libraries for the PJRT CUDA plugin.

The official plugins (jax-cuda13-pjrt's xla_cuda_plugin.so, xla-cuda13-pjrt's xla_gpu_pjrt.so) load
cuBLAS, cuDNN, cuFFT, NCCL, ... by soname at run time. pip installs those libraries in the `nvidia.*`
wheels (nvidia/cu13/lib, nvidia/cudnn/lib, ...), which are not on the loader's search path; JAX
preloads them before it starts the plugin, and so do we: a library loaded once (RTLD_GLOBAL) is found
by its soname afterwards. `import torch` (a CUDA build) loads most of them already; loading them again
is harmless. Libraries not installed are skipped: the plugin then names what it misses.
"""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import sys

# The sonames XLA's GPU backend opens (CUDA 13 wheels; the CUDA 12 names as well for a cu12 plugin).
_SONAMES = (
    "libcudart.so.13", "libcudart.so.12", "libnvrtc.so.13", "libnvrtc.so.12",
    "libcublasLt.so.13", "libcublas.so.13", "libcublasLt.so.12", "libcublas.so.12",
    "libcupti.so.13", "libcupti.so.12", "libcusparse.so.12", "libcusolver.so.12", "libcusolver.so.11",
    "libcufft.so.12", "libcufft.so.11", "libnccl.so.2", "libnvshmem_host.so.3", "libcudnn.so.9",
)

_loaded: dict[str, str] = {}


def _nvidia_lib_dirs() -> list[str]:
    roots: list[str] = []
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        roots.extend(spec.submodule_search_locations)
    for entry in sys.path:
        cand = os.path.join(entry or os.getcwd(), "nvidia")
        if os.path.isdir(cand) and cand not in roots:
            roots.append(cand)
    dirs: list[str] = []
    for root in roots:
        for d in sorted(glob.glob(os.path.join(root, "*", "lib"))):
            if d not in dirs:
                dirs.append(d)
    return dirs


def preload() -> dict[str, str]:
    """Loads the CUDA libraries found in the installed nvidia.* wheels; returns {soname: path} loaded."""
    dirs = _nvidia_lib_dirs()
    for soname in _SONAMES:
        if soname in _loaded:
            continue
        for d in dirs:
            path = os.path.join(d, soname)
            if os.path.isfile(path):
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    continue
                _loaded[soname] = path
                break
    return dict(_loaded)
