"""torch_xla.utils.utils: small helpers of the classic PyTorch/XLA API."""
from __future__ import annotations

import contextlib
import copy
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from typing import Any, Callable, Iterable, List, Optional, Tuple, Union

_TRUE = ("1", "true", "yes", "on", "y", "t")
_FALSE = ("0", "false", "no", "off", "n", "f", "")


class TmpFolder:
    """A temporary folder, removed on exit: ``with TmpFolder() as path: ...``."""

    def __init__(self):
        self.name = tempfile.mkdtemp(prefix="torch_xla_")

    def __enter__(self) -> str:
        return self.name

    def __exit__(self, *exc):
        shutil.rmtree(self.name, ignore_errors=True)
        return False


class LazyProperty:
    """Value computed by ``gen_fn`` on the first ``.value`` access, then kept."""

    _UNSET = object()

    def __init__(self, gen_fn: Callable[[], Any]):
        self._gen_fn = gen_fn
        self._value = self._UNSET

    @property
    def value(self):
        if self._value is self._UNSET:
            self._value = self._gen_fn()
        return self._value


class Cleaner:
    """Calls ``func`` when the object is garbage collected."""

    def __init__(self, func: Callable[[], Any]):
        self.func = func

    def __del__(self):
        self.func()


class SampleGenerator:
    """Iterator returning ``data`` ``sample_count`` times (a fake data loader for benchmarks)."""

    def __init__(self, data: Any, sample_count: int):
        if not isinstance(sample_count, int) or sample_count < 0:
            raise ValueError(f"sample_count must be a non-negative int, got {sample_count!r}")
        self._data = data
        self._sample_count = sample_count
        self._count = 0

    def __iter__(self):
        return SampleGenerator(self._data, self._sample_count)

    def __len__(self) -> int:
        return self._sample_count

    def __next__(self):
        return self.next()

    def next(self):
        if self._count >= self._sample_count:
            raise StopIteration
        self._count += 1
        return self._data


class FnDataGenerator:
    """Iterator of ``count`` batches ``(data, func(data))`` where ``data = gen_tensor(batch_size, *dims)``."""

    def __init__(self, func: Callable, batch_size: int, gen_tensor: Callable, dims=None, count: int = 1):
        self._func = func
        self._batch_size = batch_size
        self._gen_tensor = gen_tensor
        self._dims = list(dims) if dims else [1]
        self._count = count
        self._emitted = 0

    def __iter__(self):
        return FnDataGenerator(self._func, self._batch_size, self._gen_tensor, dims=self._dims, count=self._count)

    def __len__(self) -> int:
        return self._count

    def __next__(self):
        return self.next()

    def next(self):
        if self._emitted >= self._count:
            raise StopIteration
        self._emitted += 1
        data = self._gen_tensor(self._batch_size, *self._dims)
        return data, self._func(data)


class DataWrapper:
    """Base class for objects holding tensors that device transfers should move.

    Subclasses return their tensors from ``get_tensors()`` and build a copy of themselves holding
    ``tensors`` (same order) in ``from_tensors()``; :func:`xm.send_cpu_data_to_device` and
    :func:`for_each_instance_rewrite` use both.
    """

    def get_tensors(self) -> List[Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement get_tensors()")

    def from_tensors(self, tensors: List[Any]) -> "DataWrapper":
        raise NotImplementedError(f"{type(self).__name__} must implement from_tensors()")


def as_list(t) -> list:
    """``t`` if it is a list, ``list(t)`` for a tuple, else ``[t]``."""
    if isinstance(t, list):
        return t
    if isinstance(t, tuple):
        return list(t)
    return [t]


def getenv_as(name: str, type: Callable = str, defval: Any = None) -> Any:
    """Environment variable ``name`` converted with ``type`` (``defval`` when unset).

    For ``bool``: 1/true/yes/on are True, 0/false/no/off/empty are False (case-insensitive).
    """
    value = os.environ.get(name)
    if value is None:
        return defval
    if type is bool:
        v = value.strip().lower()
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
        raise ValueError(f"environment variable {name}={value!r} is not a boolean (use 1/0, true/false)")
    try:
        return type(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"environment variable {name}={value!r} cannot be converted with "
                         f"{getattr(type, '__name__', type)}: {e}") from None


def check_env_flag(name: str, default: str = "") -> bool:
    return os.environ.get(name, default).strip().upper() in ("ON", "1", "YES", "TRUE", "Y")


def _selector(select_fn) -> Callable[[Any], bool]:
    if isinstance(select_fn, type) or (isinstance(select_fn, tuple) and all(isinstance(t, type) for t in select_fn)):
        types = select_fn
        return lambda v: isinstance(v, types)
    if not callable(select_fn):
        raise TypeError(f"select_fn must be a callable or a type, got {type(select_fn).__name__}")
    return select_fn


def _walk(value, select, fn, rewrite: bool, seen: dict):
    vid = id(value)
    if vid in seen:
        return seen[vid]
    if select(value):
        res = fn(value) if rewrite else (fn(value), value)[1]
        seen[vid] = res
        return res
    seen[vid] = value  # cycles end here (a cycle keeps the original object)
    if isinstance(value, dict):
        out = {k: _walk(v, select, fn, rewrite, seen) for k, v in value.items()}
        if rewrite:
            try:
                res = type(value)(out) if type(value) is not dict else out
            except TypeError:
                res = out
        else:
            res = value
    elif isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        items = [_walk(v, select, fn, rewrite, seen) for v in value]
        res = type(value)(*items) if rewrite else value
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = [_walk(v, select, fn, rewrite, seen) for v in value]
        res = type(value)(items) if rewrite else value
    elif isinstance(value, DataWrapper):
        tensors = value.get_tensors()
        items = [_walk(v, select, fn, rewrite, seen) for v in tensors]
        res = value.from_tensors(items) if rewrite else value
    elif hasattr(value, "__dict__") and not isinstance(value, type) and not callable(value) \
            and type(value).__module__ not in ("builtins",) and _is_plain_object(value):
        if rewrite:
            attrs = {k: _walk(v, select, fn, rewrite, seen) for k, v in vars(value).items()}
            if all(attrs[k] is v for k, v in vars(value).items()):
                res = value  # nothing inside changed: no copy
            else:
                res = copy.copy(value)
                for k, v in attrs.items():
                    setattr(res, k, v)
        else:
            for v in vars(value).values():
                _walk(v, select, fn, rewrite, seen)
            res = value
    else:
        res = value
    seen[vid] = res
    return res


def _is_plain_object(value) -> bool:
    # Objects whose attributes are data (dataclass-like); modules, tensors and the like are leaves.
    import torch
    return not isinstance(value, (torch.Tensor, torch.nn.Module, torch.device, torch.dtype))


def for_each_instance(value, select_fn, fn: Callable[[Any], Any]) -> None:
    """Calls ``fn(x)`` for every ``x`` in the nested structure ``value`` (lists, tuples, sets,
    dicts, namedtuples, :class:`DataWrapper` and plain objects' attributes) for which
    ``select_fn(x)`` is true (``select_fn`` may also be a type)."""
    _walk(value, _selector(select_fn), fn, False, {})


def for_each_instance_rewrite(value, select_fn, fn: Callable[[Any], Any]):
    """Copy of the nested structure ``value`` where each ``x`` with ``select_fn(x)`` true is
    replaced by ``fn(x)``; objects seen twice are rewritten once (aliasing is kept)."""
    return _walk(value, _selector(select_fn), fn, True, {})


def shape(inputs):
    """Nested structure of the sizes of the tensors in ``inputs`` (lists/tuples kept)."""
    if isinstance(inputs, (list, tuple)):
        return [shape(x) for x in inputs]
    if isinstance(inputs, dict):
        return {k: shape(v) for k, v in inputs.items()}
    size = getattr(inputs, "shape", None)
    if size is None:
        raise TypeError(f"shape() expects tensors (possibly nested in lists/tuples/dicts), got {type(inputs).__name__}")
    return list(size)


def flatten_nested_tuple(inputs) -> tuple:
    """Flattens nested tuples/lists into one tuple."""
    out = []

    def add(x):
        if isinstance(x, (tuple, list)):
            for y in x:
                add(y)
        else:
            out.append(x)

    add(inputs)
    return tuple(out)


def list_copy_append(ilist: list, item) -> list:
    out = list(ilist)
    out.append(item)
    return out


def null_print(*args, **kwargs):
    pass


def eprint(*args, **kwargs):
    print(*args, file=sys.stderr, **kwargs)


def get_print_fn(debug: Optional[bool] = None) -> Callable:
    if debug is None:
        debug = getenv_as("DEBUG", bool, defval=False)
    return eprint if debug else null_print


def timed(fn: Callable, msg: str = "", printfn: Callable = eprint):
    """Runs ``fn()`` and prints how long it took."""
    if printfn is None:
        printfn = get_print_fn()
    start = time.time()
    result = fn()
    printfn(f"{msg}{time.time() - start:.3f}s")
    return result


_DEVICE_RE = re.compile(r"^([A-Za-z_]+):(\d+)$")


def parse_xla_device(device: str) -> Optional[Tuple[str, int]]:
    """``"TPU:3"`` -> ``("TPU", 3)``, ``"xla:0"`` -> ``("xla", 0)``; None when not of that form."""
    if not isinstance(device, str):
        device = str(device)
    m = _DEVICE_RE.match(device.strip())
    if m is None:
        return None
    return m.group(1), int(m.group(2))


def get_free_tcp_ports(n: int = 1) -> List[int]:
    """``n`` distinct TCP ports free on this host right now."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("", 0))
            ports.append(s.getsockname()[1])
        return ports


def batch_size(sample_count: int, world_size: int) -> int:
    return sample_count // max(world_size, 1)
