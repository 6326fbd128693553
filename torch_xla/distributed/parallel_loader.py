"""torch_xla.distributed.parallel_loader: background upload of the next batches.

``ParallelLoader`` runs two daemon threads: one iterates the wrapped (CPU) loader into a bounded
queue (``loader_prefetch_size``), one uploads those batches to the devices, round robin, into a
bounded queue per device (``device_prefetch_size``). The training loop takes device batches from
``per_device_loader(device)``, which calls ``torch_xla.sync()`` before handing out each batch
(every ``batches_per_execution`` batches) and once at the end, as PyTorch/XLA does, so a step's
graph runs while the next batches are being uploaded. An exception in either thread is raised in
the training loop at the batch where it happened.

``host_to_device_transfer_threads`` is accepted; one upload thread serves all devices (batches keep
their order). ``input_sharding`` (SPMD, after ``torch_xla.runtime.use_spmd()``): a
``torch_xla.distributed.spmd.ShardingSpec`` applied to every tensor of a batch whose rank matches
it, or a dict of them keyed like the batch; each tensor is uploaded straight into its shards.
"""
from __future__ import annotations

import queue
import sys
import threading
from typing import Any, List, Optional

import torch

_END = object()


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


def _to_device(data, device):
    if isinstance(data, torch.Tensor):
        return data.to(device)
    if isinstance(data, dict):
        items = [(k, _to_device(v, device)) for k, v in data.items()]
        try:
            return type(data)(items)
        except TypeError:
            return dict(items)
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_to_device(v, device) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_to_device(v, device) for v in data)
    return data


def _to_device_sharded(data, device, sharding):
    """As _to_device, uploading each tensor into the shards of its ShardingSpec (tensors whose rank
    the spec does not fit are replicated)."""
    if isinstance(data, torch.Tensor):
        if sharding is not None and not isinstance(sharding, dict) and sharding.can_apply(data):
            return sharding.upload(data)
        return data.to(device)
    if isinstance(data, dict):
        items = [(k, _to_device_sharded(v, device, sharding.get(k) if isinstance(sharding, dict) else sharding))
                 for k, v in data.items()]
        try:
            return type(data)(items)
        except TypeError:
            return dict(items)
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_to_device_sharded(v, device, sharding) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_to_device_sharded(v, device, sharding) for v in data)
    return data


class PerDeviceLoader:
    """Iterator over one device's batches of a :class:`ParallelLoader`."""

    def __init__(self, loader: "ParallelLoader", device):
        self._loader = loader
        self._device = torch.device(device)
        self._batches_per_sync = max(1, int(loader.batches_per_execution))
        self._since_sync = self._batches_per_sync  # sync before the first batch too
        self._finished = False

    def __iter__(self):
        return self

    def __next__(self):
        return self.next()

    def __del__(self):  # a loop left early stops the loader's threads
        try:
            self._loader._done.set()
        except Exception:
            pass

    def __len__(self):
        return self._loader.per_device_samples()

    def next(self):
        import torch_xla
        if self._finished:
            raise StopIteration
        if self._since_sync >= self._batches_per_sync:
            self._since_sync = 0
            torch_xla.sync()
        item = self._loader._next_item(self._device)
        if item is _END:
            self._finished = True
            if self._since_sync:
                torch_xla.sync()
            self._loader.close()
            raise StopIteration
        self._since_sync += 1
        return item


class ParallelLoader:
    """Wraps an existing PyTorch DataLoader with background data upload to ``devices``.

    Args:
      cpu_loader: the loader to wrap (anything iterable; ``len()`` used when available).
      devices: the XLA devices the batches go to (round robin).
      batchdim: the batch dimension (kept for compatibility).
      batches_per_execution: batches per graph execution (``torch_xla.sync()`` every that many).
      loader_prefetch_size: CPU batches read ahead.
      device_prefetch_size: device batches uploaded ahead, per device.
      host_to_device_transfer_threads: accepted; one upload thread is used.
      input_sharding: SPMD input sharding (a ``ShardingSpec``, or a dict of them for dict batches).
    """

    def __init__(self, cpu_loader, devices, batchdim: int = 0, batches_per_execution: int = 1,
                 loader_prefetch_size: int = 16, device_prefetch_size: int = 8,
                 host_to_device_transfer_threads: int = 1, input_sharding=None):
        if input_sharding is not None:
            from torch_xla import _C
            from .spmd import ShardingSpec
            if not _C._is_spmd():
                raise RuntimeError("ParallelLoader(input_sharding=...) needs SPMD mode: call "
                                   "torch_xla.runtime.use_spmd() first")
            specs = input_sharding.values() if isinstance(input_sharding, dict) else [input_sharding]
            for spec in specs:
                if not isinstance(spec, ShardingSpec):
                    raise TypeError(f"input_sharding must be a ShardingSpec (or a dict of them), got {type(spec).__name__}")
        self._input_sharding = input_sharding
        if isinstance(devices, (str, torch.device)):
            devices = [devices]
        self._cpu_loader = cpu_loader
        self._devices = [torch.device(d) for d in devices]
        if not self._devices:
            raise ValueError("ParallelLoader needs at least one device")
        self._batchdim = batchdim
        self.batches_per_execution = batches_per_execution
        self._done = threading.Event()
        self._cpu_queue: "queue.Queue" = queue.Queue(maxsize=max(1, int(loader_prefetch_size)))
        self._queues = {d: queue.Queue(maxsize=max(1, int(device_prefetch_size))) for d in self._devices}
        self._threads = [
            threading.Thread(target=self._read_loop, name="torch_xla-loader", daemon=True),
            threading.Thread(target=self._upload_loop, name="torch_xla-upload", daemon=True),
        ]
        for t in self._threads:
            t.start()

    # -- threads -------------------------------------------------------------------------------

    def _put(self, q: "queue.Queue", item) -> bool:
        while not self._done.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _read_loop(self):
        try:
            for batch in self._cpu_loader:
                if not self._put(self._cpu_queue, batch):
                    return
            self._put(self._cpu_queue, _END)
        except BaseException as e:  # reaches the training loop
            self._put(self._cpu_queue, _Failure(e))

    def _upload_loop(self):
        i = 0
        n = len(self._devices)
        while not self._done.is_set():
            try:
                item = self._cpu_queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is _END or isinstance(item, _Failure):
                for q in self._queues.values():
                    self._put(q, item)
                return
            device = self._devices[i % n]
            try:
                moved = _to_device(item, device) if self._input_sharding is None else \
                    _to_device_sharded(item, device, self._input_sharding)
            except BaseException as e:
                for q in self._queues.values():
                    self._put(q, _Failure(e))
                return
            if not self._put(self._queues[device], moved):
                return
            i += 1

    # -- consumer side -------------------------------------------------------------------------

    def _next_item(self, device):
        q = self._queues.get(torch.device(device))
        if q is None:
            raise ValueError(f"{device} is not one of this loader's devices {self._devices}")
        while True:
            try:
                item = q.get(timeout=0.5)
                break
            except queue.Empty:
                if not any(t.is_alive() for t in self._threads):
                    return _END
        if isinstance(item, _Failure):
            self.close()
            raise item.exc
        return item

    def per_device_loader(self, device) -> PerDeviceLoader:
        """The iterator over ``device``'s batches."""
        return PerDeviceLoader(self, device)

    def per_device_samples(self) -> int:
        return len(self._cpu_loader) // len(self._devices)

    def close(self):
        """Stops the background threads (idempotent)."""
        self._done.set()
        for q in [self._cpu_queue, *self._queues.values()]:
            try:
                while True:
                    q.get_nowait()
            except queue.Empty:
                pass
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)

    def __del__(self):
        try:
            self._done.set()
        except Exception:
            pass


class MpDeviceLoader:
    """Wraps an existing PyTorch DataLoader with background data upload (one device per process).

    Each iteration builds a :class:`ParallelLoader` over ``loader`` for ``device`` and iterates its
    per-device loader. ``dataset`` and ``batch_sampler`` read through to the wrapped loader and may
    be replaced (Lightning does); the wrapped loader is ``_loader``.

    Args:
      loader: the torch.utils.data.DataLoader to wrap.
      device: the XLA device the batches go to.
      kwargs: named arguments for the ParallelLoader constructor.
    """

    def __init__(self, loader, device, **kwargs):
        self._loader = loader
        self._device = device
        self._parallel_loader_kwargs = kwargs
        self._overrides = {}

    def __iter__(self):
        parallel_loader = ParallelLoader(self._loader, [self._device], **self._parallel_loader_kwargs)
        return parallel_loader.per_device_loader(self._device)

    def __len__(self):
        return len(self._loader)

    @property
    def dataset(self):
        if "dataset" in self._overrides:
            return self._overrides["dataset"]
        return getattr(self._loader, "dataset", None)

    @dataset.setter
    def dataset(self, value):
        self._overrides["dataset"] = value

    @property
    def batch_sampler(self):
        if "batch_sampler" in self._overrides:
            return self._overrides["batch_sampler"]
        return getattr(self._loader, "batch_sampler", None)

    @batch_sampler.setter
    def batch_sampler(self, value):
        self._overrides["batch_sampler"] = value
