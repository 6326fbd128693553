"""torch_xla.utils.serialization: save/load nested data whose tensors go to separate files.

``save(data, path)`` writes the structure of ``data`` to ``path`` with each tensor replaced by a
reference, and each tensor (moved to the CPU) to its own file in the folder ``path + ".tensors"``.
Large models can then be saved without holding a second full copy in one pickle. ``load(path)``
rebuilds the structure with CPU tensors. Every file is written to a temporary name and renamed.
"""
from __future__ import annotations

import os
import shutil
from typing import Any

import torch

from . import utils as _utils

_FORMAT = "torch_xla.utils.serialization/1"


class _TensorReference:
    def __init__(self, tid: int):
        self.tid = tid


def _tensors_dir(path: str) -> str:
    return path + ".tensors"


def _tensor_file(path: str, tid: int) -> str:
    return os.path.join(_tensors_dir(path), f"tensor_{tid}.pt")


def _atomic_torch_save(obj, path: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _should_write(master_only: bool, global_master: bool) -> bool:
    if not master_only:
        return True
    from torch_xla import runtime as xr
    return (xr.global_ordinal() if global_master else xr.local_ordinal()) == 0


def save(data: Any, path: str, master_only: bool = True, global_master: bool = False) -> None:
    """Saves ``data`` (nested lists/tuples/dicts/objects holding tensors) to ``path``.

    Args:
      data: the data to save; XLA tensors are copied to the CPU.
      path: the destination file; tensors go to the folder ``path + ".tensors"``.
      master_only: only the master ordinal writes (the others return at once).
      global_master: with ``master_only``, only the global master (else each host's master).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    if not _should_write(master_only, global_master):
        return
    tensors = []

    def to_ref(t):
        tensors.append(t)
        return _TensorReference(len(tensors) - 1)

    structure = _utils.for_each_instance_rewrite(data, lambda x: isinstance(x, torch.Tensor), to_ref)
    tdir = _tensors_dir(path)
    if os.path.isdir(tdir):
        shutil.rmtree(tdir)
    os.makedirs(tdir, exist_ok=True)
    for tid, t in enumerate(tensors):
        _atomic_torch_save(t.detach().cpu() if t.device.type != "cpu" else t.detach(), _tensor_file(path, tid))
    _atomic_torch_save({"format": _FORMAT, "count": len(tensors), "data": structure}, path)


def load(path: str) -> Any:
    """Loads what :func:`save` wrote to ``path``; tensors are CPU tensors."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no saved data at {path!r}")
    header = torch.load(path, weights_only=False)
    if not isinstance(header, dict) or header.get("format") != _FORMAT:
        raise ValueError(f"{path!r} was not written by torch_xla.utils.serialization.save")

    def from_ref(ref):
        tfile = _tensor_file(path, ref.tid)
        if not os.path.isfile(tfile):
            raise FileNotFoundError(f"tensor file {tfile!r} of {path!r} is missing")
        return torch.load(tfile, weights_only=True)

    return _utils.for_each_instance_rewrite(header["data"], lambda x: isinstance(x, _TensorReference), from_ref)
