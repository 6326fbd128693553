"""Device memory figures for xm.get_memory_info."""
from __future__ import annotations

import resource
import threading
from typing import Dict, Optional

_peak_used = 0
_lock = threading.Lock()


def _pjrt_stats(index: int) -> Optional[Dict[str, int]]:
    """The plugin's PJRT_Device_MemoryStats, or None where it does not report them (XLA:CPU)."""
    from torch_xla import _C
    fn = getattr(_C, "_memory_stats", None)
    if fn is None:
        return None
    stats = fn(index)
    return dict(stats) if stats else None


def _host_meminfo() -> Dict[str, int]:
    info: Dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":"):
                info[parts[0][:-1]] = int(parts[1])  # kB
    return info


def memory_info(index: int) -> Dict[str, int]:
    global _peak_used
    from torch_xla import _C
    _C._check_device(index)
    stats = _pjrt_stats(index)
    if stats is not None and "bytes_in_use" in stats:
        used = int(stats["bytes_in_use"])
        limit = int(stats.get("bytes_limit", 0))
        peak = int(stats.get("peak_bytes_in_use", used))
        return {"bytes_used": used, "bytes_limit": limit, "peak_bytes_used": peak,
                "kb_free": max(0, limit - used) // 1024, "kb_total": limit // 1024}
    try:
        info = _host_meminfo()
        total_kb = info["MemTotal"]
        free_kb = info.get("MemAvailable", info.get("MemFree", 0))
    except (OSError, KeyError, ValueError) as e:
        raise RuntimeError(f"get_memory_info: the {_C._device_type()} plugin reports no memory statistics and "
                           f"host memory could not be read: {e}") from None
    used = (total_kb - free_kb) * 1024
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kB
    with _lock:
        _peak_used = max(_peak_used, used, rss_peak)
        peak = _peak_used
    return {"bytes_used": used, "bytes_limit": total_kb * 1024, "peak_bytes_used": peak,
            "kb_free": free_kb, "kb_total": total_kb}
