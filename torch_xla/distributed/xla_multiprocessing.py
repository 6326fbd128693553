"""torch_xla.distributed.xla_multiprocessing: one process per device.

``spawn(fn, args)`` starts one process per local device with torch.multiprocessing; each child
sees exactly one device (``torch_xla.device()`` is ``xla:0``) and gets the world in the usual
environment variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
MASTER_PORT). The parent hosts the job's TCPStore (rendezvous, key-value exchange, gloo
bootstrap); the children connect to it as torchrun workers connect to their agent's store.

Several hosts: start ``spawn`` once per host with ``TORCH_XLA_NUM_HOSTS``, ``TORCH_XLA_HOST_INDEX``
and the same ``MASTER_ADDR``/``MASTER_PORT`` everywhere; host 0's parent hosts the store there.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Optional

from torch_xla._internal import world as _world

_START_METHODS = ("spawn", "fork", "forkserver")


def _devices_per_host() -> int:
    """Devices of this host, without starting the runtime where possible (fork needs that)."""
    from torch_xla import _C
    from torch_xla._internal import plugins
    kind = plugins.device_type_from_env()
    if _C._client_started():
        return _C._device_count()
    if kind == "CPU":
        return plugins.cpu_device_count()
    for var in (f"{kind}_NUM_DEVICES", "GPU_NUM_DEVICES" if kind == "CUDA" else ""):
        if var and os.environ.get(var, "").strip():
            return int(os.environ[var])
    return _C._device_count()  # starts this process's runtime (not allowed before a fork)


def _child_env(local_index: int, nprocs: int, info: dict) -> dict:
    host = info["host_index"]
    env = {
        "RANK": str(host * nprocs + local_index),
        "WORLD_SIZE": str(info["num_hosts"] * nprocs),
        "LOCAL_RANK": str(local_index),
        "LOCAL_WORLD_SIZE": str(nprocs),
        "GROUP_RANK": str(host),
        "MASTER_ADDR": info["master_addr"],
        "MASTER_PORT": str(info["master_port"]),
        # The store is the parent's: connect as a client, like torchrun's workers.
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
        _world.SPAWNED_VAR: "1",
        "PJRT_LOCAL_PROCESS_COUNT": str(nprocs),
    }
    env.update(_one_device_env(info["device_type"], local_index, nprocs))
    return env


# Process bounds of one-chip-per-process TPU jobs on one host, by chips per host.
_TPU_PROCESS_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}
_TPU_BASE_PORT = 8476


def _one_device_env(device_type: str, local_index: int, nprocs: int) -> dict:
    """Environment that makes the plugin of a spawned child see exactly its own device.

    CPU: ``CPU_NUM_DEVICES=1``. CUDA: ``CUDA_VISIBLE_DEVICES`` narrowed to the child's GPU (the
    ``local_index``-th of the parent's visible ones), so the plugin's client, NCCL and torch's own
    CUDA all see that one GPU, as ``xla:0``. TPU: libtpu's one-chip-per-process variables
    (visible chip, 1x1x1 chips per process, the host's process bounds and one port per process).
    """
    if device_type == "CPU":
        return {"CPU_NUM_DEVICES": "1"}
    if device_type == "CUDA":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else []
        if ids and len(ids) < nprocs:
            raise ValueError(f"CUDA_VISIBLE_DEVICES={visible!r} names {len(ids)} GPU(s) but {nprocs} processes "
                             "are being started (one per GPU)")
        return {"CUDA_VISIBLE_DEVICES": ids[local_index] if ids else str(local_index), "GPU_NUM_DEVICES": "1"}
    if device_type == "TPU":
        if nprocs not in _TPU_PROCESS_BOUNDS:
            raise ValueError(f"one process per TPU chip needs 1, 2, 4 or 8 chips on the host, got {nprocs}")
        ports = [str(_TPU_BASE_PORT + i) for i in range(nprocs)]
        return {
            "TPU_VISIBLE_CHIPS": str(local_index),
            "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
            "TPU_PROCESS_BOUNDS": _TPU_PROCESS_BOUNDS[nprocs],
            "TPU_PROCESS_PORT": ports[local_index],
            "TPU_PROCESS_ADDRESSES": ",".join(f"localhost:{p}" for p in ports),
        }
    return {}


def _exit_with_parent():
    """A child whose launcher died exits within a second, even when its main thread is blocked in
    a collective (torch.multiprocessing only sends SIGINT, which waits for the main thread).

    The parent is the launcher (spawn, fork) or the forkserver, which exits with the launcher."""
    import threading
    import time

    parent_pid = os.getppid()
    if parent_pid == 1:  # already orphaned
        os._exit(1)

    def watch():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(1)
    threading.Thread(target=watch, name="torch_xla-parent-watch", daemon=True).start()


def _mp_entry(local_index: int, fn: Callable, args: tuple, nprocs: int, info: dict):
    _exit_with_parent()
    os.environ.update(_child_env(local_index, nprocs, info))
    _world.tune_host_malloc()
    if not os.environ.get("OMP_NUM_THREADS"):
        # As torchrun does: the processes share the host's cores, so each takes its share for
        # torch's own CPU kernels (host-side work of the collectives, the data loader).
        import torch
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // nprocs))
    fn(int(os.environ["RANK"]), *args)


def _run_single(fn, args):
    fn(0, *args)
    return None


def spawn(fn: Callable, args: tuple = (), nprocs: Optional[int] = None, join: bool = True, daemon: bool = False,
          start_method: str = "spawn") -> Any:
    """Enables multi processing based replication.

    Args:
      fn: called in every process as ``fn(index, *args)``, index being the global ordinal.
      args: the arguments for fn.
      nprocs: None (one process per local device) or 1 (``fn`` runs in this process); any other
        value must equal the device count, else ValueError.
      join: whether to wait for the processes (and raise the first failure with its traceback).
      daemon: the processes' daemon flag.
      start_method: ``spawn`` (default), ``fork`` (only before this process started the XLA
        runtime) or ``forkserver``.

    Returns:
      The torch.multiprocessing ProcessContext when ``join`` is False (``.processes``,
      ``.join()``), else None.
    """
    from torch_xla import _C
    import torch.multiprocessing as mp
    if start_method not in _START_METHODS:
        raise ValueError(f"start_method must be one of {', '.join(_START_METHODS)}, got {start_method!r}")
    if nprocs is not None and (not isinstance(nprocs, int) or isinstance(nprocs, bool)):
        raise ValueError(f"nprocs must be None or an int, got {nprocs!r}")
    if nprocs == 1:
        return _run_single(fn, args)
    if os.environ.get(_world.SPAWNED_VAR) == "1":
        raise RuntimeError("xmp.spawn called inside a process started by xmp.spawn")
    count = _devices_per_host()
    if nprocs is None:
        nprocs = count
    elif nprocs != count:
        raise ValueError(f"xmp.spawn: nprocs={nprocs} but this host has {count} device(s); pass nprocs=None "
                         f"(one process per device) or 1, or set CPU_NUM_DEVICES={nprocs}")
    if nprocs == 1:
        return _run_single(fn, args)
    if start_method == "fork" and _C._client_started():
        raise RuntimeError("xmp.spawn(start_method='fork') needs a parent that has not started the XLA runtime "
                           "(this process already used an XLA device); use start_method='spawn', or create "
                           "no XLA tensors before spawning")
    from torch_xla._internal import plugins
    num_hosts = _world._env_int("TORCH_XLA_NUM_HOSTS", 1)
    host_index = _world._env_int("TORCH_XLA_HOST_INDEX", 0)
    if num_hosts < 1 or not 0 <= host_index < num_hosts:
        raise ValueError(f"TORCH_XLA_HOST_INDEX={host_index} must be in [0, TORCH_XLA_NUM_HOSTS={num_hosts})")
    import torch.distributed as dist
    store = None
    if num_hosts == 1:
        addr = "127.0.0.1"
        store = dist.TCPStore(addr, 0, None, True, _world.timeout_delta(), wait_for_workers=False)
        port = store.port
    else:
        addr = os.environ.get("MASTER_ADDR", "").strip()
        port = os.environ.get("MASTER_PORT", "").strip()
        if not addr or not port:
            raise ValueError("multi-host xmp.spawn (TORCH_XLA_NUM_HOSTS > 1) needs MASTER_ADDR and MASTER_PORT")
        port = int(port)
        if host_index == 0:
            store = dist.TCPStore(addr, port, None, True, _world.timeout_delta(),
                                  wait_for_workers=False)
    info = {"host_index": host_index, "num_hosts": num_hosts, "master_addr": addr, "master_port": port,
            "device_type": plugins.device_type_from_env()}
    from torch_xla import _allocator
    # Spawned children start on a fast host allocator when one is installed (README, *Host allocator*).
    preload = _allocator.preloaded_children() if start_method != "fork" else contextlib.nullcontext()
    with preload:
        context = mp.start_processes(_mp_entry, args=(fn, tuple(args), nprocs, info), nprocs=nprocs, join=False,
                                     daemon=daemon, start_method=start_method)
    context._torch_xla_store = store  # the store lives as long as the context
    if not join:
        return context
    try:
        while not context.join():
            pass
    finally:
        for p in context.processes:  # never leave a child behind
            if p.is_alive():
                p.kill()
            p.join()
    return None
