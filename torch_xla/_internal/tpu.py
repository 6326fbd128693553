"""torch_xla._internal.tpu: accelerator discovery read by launchers (PyTorch Lightning).

Pure Python and cheap: nothing here starts the runtime, so a launcher may call it and then fork.
On a TPU VM the values come from the environment (``TPU_ACCELERATOR_TYPE``, ``TPU_*`` bounds) and
the chips under ``/dev``; there is no metadata-server query. On CPU and GPU the same functions
return values describing that device, so code written for TPUs still gets sensible answers.
"""
from __future__ import annotations

import glob
import os
import re
from typing import Dict, List, Optional

from . import plugins as _plugins

def _device_type() -> Optional[str]:
    """The device type PJRT_DEVICE asks for, or None when PJRT_DEVICE is not set (no opt-in)."""
    if not os.environ.get("PJRT_DEVICE", "").strip():
        return None
    return _plugins.device_type_from_env()


def _tpu_chip_paths() -> List[str]:
    return sorted(set(glob.glob("/dev/accel*")) | set(glob.glob("/dev/vfio/[0-9]*")))


def _gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip()])
    return len(glob.glob("/proc/driver/nvidia/gpus/*"))


def num_available_chips() -> int:
    """Chips (or devices) of the selected type on this host, 0 without an explicit PJRT_DEVICE."""
    dt = _device_type()
    if dt is None:
        return 0
    if dt == "TPU":
        return len(_tpu_chip_paths())
    if dt == "CUDA":
        return int(os.environ.get("GPU_NUM_DEVICES", _gpu_count()))
    if dt == "CPU":
        return _plugins.cpu_device_count()
    return 0


def num_logical_cores_per_chip() -> int:
    """Devices per chip: 2 on TPU v2/v3, 1 elsewhere."""
    v = _tpu_version_or_none()
    return 2 if v is not None and v <= 3 else 1


def num_available_devices() -> int:
    """Devices of the selected type on this host (0 unless PJRT_DEVICE is set: a plain run is
    never taken for an accelerator run)."""
    return num_available_chips() * num_logical_cores_per_chip()


def num_local_processes() -> int:
    """Processes a launcher should start on this host (one per device)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", max(num_available_devices(), 1)))


def task_id() -> Optional[int]:
    v = os.environ.get("CLOUD_TPU_TASK_ID") or os.environ.get("TPU_WORKER_ID")
    return int(v) if v else None


def worker_id() -> int:
    return int(os.environ.get("TPU_WORKER_ID", "0"))


def _tpu_version_or_none() -> Optional[int]:
    if _device_type() != "TPU":
        return None
    acc = os.environ.get("TPU_ACCELERATOR_TYPE") or os.environ.get("ACCELERATOR_TYPE") or ""
    m = re.match(r"v(\d+)", acc.lower())
    return int(m.group(1)) if m else None


def version() -> int:
    """TPU generation (4 for v4, ...). Raises EnvironmentError when not running on a TPU."""
    v = _tpu_version_or_none()
    if v is None:
        raise EnvironmentError("not running on a TPU (PJRT_DEVICE is not TPU, or TPU_ACCELERATOR_TYPE "
                               "is not set): there is no TPU version")
    return v


def get_tpu_env() -> Dict[str, str]:
    """Accelerator description; on TPU from the ``TPU_*`` environment, elsewhere describing the
    device in use. Keys: ``ACCELERATOR_TYPE`` (e.g. "v4-8", "cpu-4", "cuda-1"), ``TYPE``
    ("V4", "CPU", "CUDA"), ``TPU_PROCESS_BOUNDS``, ``TPU_CHIPS_PER_PROCESS_BOUNDS``,
    ``WORKER_ID``, ``NUM_DEVICES``."""
    dt = _device_type() or "CPU"
    if dt == "TPU":
        acc = os.environ.get("TPU_ACCELERATOR_TYPE") or os.environ.get("ACCELERATOR_TYPE") or ""
        gen = acc.split("-")[0].upper() if acc else ""
        n = num_available_devices()
    else:
        n = num_available_devices() if _device_type() else _plugins.cpu_device_count()
        acc = f"{dt.lower()}-{n}"
        gen = dt
    return {
        "ACCELERATOR_TYPE": acc,
        "TYPE": gen,
        "TPU_PROCESS_BOUNDS": os.environ.get("TPU_PROCESS_BOUNDS", "1,1,1"),
        "TPU_CHIPS_PER_PROCESS_BOUNDS": os.environ.get("TPU_CHIPS_PER_PROCESS_BOUNDS", f"{max(n, 1)},1,1"),
        "WORKER_ID": str(worker_id()),
        "NUM_DEVICES": str(n),
    }
