"""Who am I in a multi-process job, and the job's key-value store.

The world is described by the usual torch.distributed environment variables, set by
``xmp.spawn`` for its children or by ``torchrun``:

  RANK, WORLD_SIZE             global index of this process and number of processes
  LOCAL_RANK, LOCAL_WORLD_SIZE index on this host and processes on this host
  GROUP_RANK                   index of this host (torchrun's node rank)
  MASTER_ADDR, MASTER_PORT     where the TCPStore of the job listens

Rendezvous and key-value exchange go through torch.distributed's TCPStore (obtained with
``torch.distributed.rendezvous("env://")``, which also knows torchrun's agent store); no socket
code of our own. Nothing here starts the XLA runtime; ``torch.distributed`` is imported lazily.

Timeouts: ``TORCH_XLA_COLLECTIVE_TIMEOUT_S`` (alias ``XLA_COLLECTIVE_TIMEOUT``), seconds, default
1800, bounds every collective, rendezvous and the initial connection to the store.
"""
from __future__ import annotations

import datetime
import os
import threading
from typing import List, Optional, Sequence, Tuple

DEFAULT_TIMEOUT_S = 1800.0
_TIMEOUT_VARS = ("TORCH_XLA_COLLECTIVE_TIMEOUT_S", "XLA_COLLECTIVE_TIMEOUT")

# Set by xmp.spawn in its children (the parent hosts the TCPStore).
SPAWNED_VAR = "TORCH_XLA_SPAWNED"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def world_size() -> int:
    return max(1, _env_int("WORLD_SIZE", 1))


def rank() -> int:
    return _env_int("RANK", 0)


def local_rank() -> int:
    return _env_int("LOCAL_RANK", 0)


def local_world_size() -> int:
    return max(1, _env_int("LOCAL_WORLD_SIZE", _env_int("PJRT_LOCAL_PROCESS_COUNT", 1)))


def host_index() -> int:
    return _env_int("GROUP_RANK", _env_int("TORCH_XLA_HOST_INDEX", 0))


def is_multiprocess() -> bool:
    """True when this process is one of several (spawned children, torchrun workers)."""
    return world_size() > 1 or os.environ.get(SPAWNED_VAR) == "1"


def timeout_s() -> float:
    for var in _TIMEOUT_VARS:
        value = os.environ.get(var, "").strip()
        if value:
            try:
                t = float(value)
            except ValueError:
                raise ValueError(f"{var}={value!r} is not a number of seconds") from None
            if t <= 0:
                raise ValueError(f"{var}={value!r} must be positive")
            return t
    return DEFAULT_TIMEOUT_S


def timeout_delta() -> datetime.timedelta:
    return datetime.timedelta(seconds=timeout_s())


class CollectiveTimeoutError(TimeoutError):
    """A collective or rendezvous waited longer than the timeout (or a peer went away).

    ``tag`` names the operation, ``missing`` lists the global ranks that did not arrive.
    """

    def __init__(self, message: str, tag: str = "", missing: Sequence[int] = ()):
        super().__init__(message)
        self.tag = tag
        self.missing = list(missing)


_malloc_tuned = False


def tune_host_malloc():
    """Keeps freed large host blocks in the heap (glibc ``mallopt``: no mmap below 1 GiB, trim
    only above 2 GiB) in a process of a multi-process job. Host collectives copy whole gradient
    buffers to and from the device every step; with glibc's defaults each copy of a large buffer
    maps fresh pages and page-faults through all of them (64 MB upload: 80-115 ms -> 13-29 ms on
    this project's VM). ``TORCH_XLA_HOST_MALLOC_TUNING=0`` leaves malloc alone. Idempotent."""
    global _malloc_tuned
    if _malloc_tuned or os.environ.get("TORCH_XLA_HOST_MALLOC_TUNING", "1").strip() == "0":
        return
    _malloc_tuned = True
    try:
        import ctypes
        import ctypes.util
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 1 << 30)
        libc.mallopt(m_trim_threshold, 1 << 31)
    except (OSError, AttributeError):  # not glibc
        pass


_store = None
_store_lock = threading.Lock()


def store():
    """The job's key-value store (a torch.distributed Store), connected on first use."""
    global _store
    with _store_lock:
        if _store is None:
            if world_size() == 1:
                import torch.distributed as dist
                _store = dist.HashStore()
            else:
                missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
                if missing:
                    raise RuntimeError(
                        f"WORLD_SIZE={world_size()} but {', '.join(missing)} is not set: start the job with "
                        "torch_xla.distributed.xla_multiprocessing.spawn, torch_xla.launch or torchrun")
                import torch.distributed as dist
                try:
                    s, _, _ = next(dist.rendezvous("env://", rank=rank(), world_size=world_size(),
                                                   timeout=timeout_delta()))
                except Exception as e:  # connection refused / timed out
                    raise CollectiveTimeoutError(
                        f"rank {rank()} could not reach the job's TCPStore at "
                        f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} within "
                        f"{timeout_s():g} s: {e}", "store") from e
                _store = dist.PrefixStore("torch_xla/", s)
                tune_host_malloc()
        return _store


def validate_groups(groups, size: Optional[int] = None) -> Optional[List[List[int]]]:
    """Checks that ``groups`` (a list of lists of global ranks) partitions range(world size).

    Returns the groups as lists of ints (None stays None). Raises ValueError otherwise.
    """
    if groups is None:
        return None
    n = world_size() if size is None else size
    if not isinstance(groups, (list, tuple)) or not groups:
        raise ValueError(f"groups must be a non-empty list of lists of ranks, got {groups!r}")
    out: List[List[int]] = []
    seen = set()
    for g in groups:
        if not isinstance(g, (list, tuple)) or not g:
            raise ValueError(f"each group must be a non-empty list of ranks, got {g!r} in {groups!r}")
        members = []
        for r in g:
            if not isinstance(r, int) or isinstance(r, bool):
                raise ValueError(f"group members must be ints, got {r!r} in {groups!r}")
            if r < 0 or r >= n:
                raise ValueError(f"rank {r} in groups {groups!r} is outside the world (world size {n})")
            if r in seen:
                raise ValueError(f"rank {r} appears twice in groups {groups!r}")
            seen.add(r)
            members.append(r)
        out.append(members)
    if len(seen) != n:
        missing = sorted(set(range(n)) - seen)
        raise ValueError(f"groups {groups!r} do not cover the world (world size {n}): ranks {missing} are in no group")
    return out


class Group(tuple):
    """A tuple of global ranks (this rank's group) that also knows the whole partition it came
    from (``partition``: every group, as tuples), which in-graph collectives need."""

    partition: Tuple[Tuple[int, ...], ...]

    def __new__(cls, members, partition):
        g = super().__new__(cls, members)
        g.partition = tuple(tuple(p) for p in partition)
        return g


def my_group(groups) -> Tuple[int, ...]:
    """The (validated) group holding this rank, as a :class:`Group` of global ranks; the world if None."""
    g = validate_groups(groups)
    if g is None:
        everyone = tuple(range(world_size()))
        return Group(everyone, (everyone,))
    me = rank()
    for members in g:
        if me in members:
            return Group(members, g)
    raise ValueError(f"rank {me} is in none of the groups {groups!r}")  # unreachable after validation
