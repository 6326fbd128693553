"""A clean exit after backward passes on XLA tensors.

torch (2.13) stashes a Python object (a ``contextvars`` context) in the thread-local state that
every backward pass captures; an XLA backward pass runs on autograd's device thread for that
device, and that thread may drop the last reference to the finished pass a moment after
``backward()`` has returned. When the script ends in that moment, the thread needs the GIL of an
interpreter that is already finalizing, Python ends the thread with a forced unwind, and the
process aborts ("terminate called without an active exception", exit code 134) although every
result was right. (CUDA tensors take the same path; CPU ones run on the calling thread.)

At exit we therefore run one tiny backward pass per XLA device thread straight through the
engine (no stashed object): the device thread takes it only after it has finished, and released,
the previous one. Nothing is compiled or executed (the pass only records lazy ops).
"""
from __future__ import annotations

import os


def _device_threads() -> list:
    """Indices of autograd's device threads in this process (threads named pt_autograd_N)."""
    out = []
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    name = f.read().strip()
            except OSError:
                continue
            if name.startswith("pt_autograd_") and name[len("pt_autograd_"):].isdigit():
                out.append(int(name[len("pt_autograd_"):]))
    except OSError:
        pass
    return sorted(set(out))


def drain() -> None:
    """Waits until autograd's XLA device threads have released their finished backward passes."""
    try:
        from torch_xla import _C
        if not _C._client_started():
            return
        threads = _device_threads()
        if not threads:
            return
        import torch
        from torch.autograd import Variable
        n = _C._device_count()
        for index in threads:
            if index >= n:
                continue
            x = torch.zeros((), device=torch.device("xla", index), requires_grad=True)
            y = x * 2
            Variable._execution_engine.run_backward((y,), (torch.ones((), device=y.device),), False, False, (),
                                                    True, True)
    except Exception:  # noqa: BLE001 - best effort at exit: never turn a clean exit into an error
        pass
