"""PJRT plugin discovery: which plugin .so serves which PJRT_DEVICE.

Pure Python on purpose: no torch import and no import of the C++ modules, so
it can be used (and tested) before anything heavy is loaded.

Environment:
  PJRT_DEVICE               CPU (default), CUDA (alias GPU) or TPU.
  PJRT_PLUGIN_LIBRARY_PATH  path of a plugin .so; overrides discovery for any
  TORCH_XLA_PLUGIN_PATH     device type (the first one set wins).
  TPU_LIBRARY_PATH          libtpu.so to use for TPU (the usual libtpu override).
  CPU_NUM_DEVICES           number of CPU devices (default 1, as upstream PyTorch/XLA).
  TORCH_XLA_CPU_PLUGIN      which installed CPU plugin: xla-cpu-pjrt (the default when
                            installed), lammps-jax-pjrt-cpu or fastatomstruct-xla-cpu, or the
                            path of a CPU plugin .so.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass

__all__ = ["plugin_for", "device_type_from_env", "cpu_device_count", "DEVICE_TYPES"]

_OVERRIDE_VARS = ("PJRT_PLUGIN_LIBRARY_PATH", "TORCH_XLA_PLUGIN_PATH")


@dataclass(frozen=True)
class _Candidate:
    module: str  # importable package holding the plugin
    filename: str  # the .so beside the package's __init__
    entry_point_group: str | None = None
    entry_point_name: str | None = None


@dataclass(frozen=True)
class _DeviceSpec:
    what: str  # for messages: "the PJRT CPU plugin"
    pip: str  # what to install
    candidates: tuple[_Candidate, ...]


_DEVICES: dict[str, _DeviceSpec] = {
    "CPU": _DeviceSpec(
        "the PJRT CPU plugin",
        "pip install xla-cpu-pjrt",
        (
            _Candidate("xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so", "xla_plugins", "xla_cpu_pjrt"),
            # XLA's CPU PJRT plugin built from jaxlib 0.11.2's XLA (PyPI: lammps-jax-pjrt-cpu);
            # used when selected with TORCH_XLA_CPU_PLUGIN, or when it is the only one installed.
            _Candidate("lammps_jax_pjrt_cpu", "pjrt_c_api_cpu_plugin.so"),
            # XLA's CPU PJRT plugin as built by zml/pjrt-artifacts (June 2026 XLA), repackaged
            # unmodified on PyPI as fastatomstruct-xla-cpu; selected with TORCH_XLA_CPU_PLUGIN.
            _Candidate("fastatomstruct_xla_cpu", "libpjrt_cpu.so"),
        ),
    ),
    "CUDA": _DeviceSpec(
        "a PJRT CUDA plugin",
        "pip install xla-cuda13-pjrt  (or: pip install jax-cuda13-pjrt)",
        (
            _Candidate("xla_plugins.xla_cuda13_pjrt", "xla_gpu_pjrt.so", "xla_plugins", "xla_cuda13_pjrt"),
            _Candidate("jax_plugins.xla_cuda13", "xla_cuda_plugin.so"),
        ),
    ),
    "TPU": _DeviceSpec(
        "the PJRT TPU plugin (libtpu)",
        "pip install libtpu",
        (_Candidate("libtpu", "libtpu.so"),),
    ),
}

_ALIASES = {"CPU": "CPU", "CUDA": "CUDA", "GPU": "CUDA", "TPU": "TPU"}

DEVICE_TYPES = tuple(_DEVICES)


def _override_path() -> tuple[str, str] | None:
    for var in _OVERRIDE_VARS:
        value = os.environ.get(var, "").strip()
        if value:
            return var, value
    return None


def _canonical(device_type: str) -> str:
    key = device_type.strip().upper()
    if key in _ALIASES:
        return _ALIASES[key]
    accepted = ", ".join(sorted(_ALIASES))
    raise ValueError(
        f"unknown PJRT_DEVICE {device_type!r}; accepted values: {accepted} "
        f"(or point {_OVERRIDE_VARS[0]} at a PJRT plugin .so for another device type)"
    )


def _package_dirs(module: str) -> list[str]:
    """Folders of `module` without importing it (parents may be imported: they are
    namespace packages for the plugin wheels)."""
    dirs: list[str] = []
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError, AttributeError):
        spec = None
    if spec is not None:
        if spec.submodule_search_locations:
            dirs.extend(spec.submodule_search_locations)
        elif spec.origin:
            dirs.append(os.path.dirname(spec.origin))
    # Plain scan as well (covers a broken/shadowed parent package).
    rel = os.path.join(*module.split("."))
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), rel)
        if os.path.isdir(candidate) and candidate not in dirs:
            dirs.append(candidate)
    return dirs


def _entry_point_module(group: str, name: str) -> str | None:
    try:
        for ep in importlib.metadata.entry_points(group=group):
            if ep.name == name:
                return ep.value.split(":")[0].strip()
    except Exception:  # broken metadata must not break discovery
        return None
    return None


def _locate(candidate: _Candidate) -> str | None:
    """Path of the candidate's plugin .so, or None when not installed."""
    modules = []
    if candidate.entry_point_group and candidate.entry_point_name:
        ep_module = _entry_point_module(candidate.entry_point_group, candidate.entry_point_name)
        if ep_module:
            modules.append(ep_module)
    if candidate.module not in modules:
        modules.append(candidate.module)
    for module in modules:
        for folder in _package_dirs(module):
            path = os.path.join(folder, candidate.filename)
            if os.path.isfile(path):
                return os.path.abspath(path)
    return None


def plugin_for(device_type: str | None = None) -> tuple[str, str]:
    """(plugin .so path, canonical device type) for `device_type` (default: PJRT_DEVICE).

    Raises ValueError for an unknown device type and RuntimeError, naming the
    package to install, when the plugin is missing.
    """
    if device_type is None or not str(device_type).strip():
        device_type = os.environ.get("PJRT_DEVICE", "").strip() or "CPU"
    override = _override_path()
    if override is not None:
        var, path = override
        if not os.path.isfile(path):
            raise RuntimeError(f"{var}={path!r} does not name an existing PJRT plugin file")
        key = device_type.strip().upper()
        return os.path.abspath(path), _ALIASES.get(key, key)

    canonical = _canonical(device_type)
    spec = _DEVICES[canonical]
    if canonical == "TPU":
        tpu_path = os.environ.get("TPU_LIBRARY_PATH", "").strip()
        if tpu_path:
            if not os.path.isfile(tpu_path):
                raise RuntimeError(f"TPU_LIBRARY_PATH={tpu_path!r} does not name an existing file")
            return os.path.abspath(tpu_path), canonical
    if canonical == "CPU":
        choice = os.environ.get("TORCH_XLA_CPU_PLUGIN", "").strip()
        if choice:
            return _chosen_cpu_plugin(choice), canonical
    for candidate in spec.candidates:
        path = _locate(candidate)
        if path is not None:
            return path, canonical
    raise RuntimeError(
        f"PJRT_DEVICE={canonical} needs {spec.what}: {spec.pip}"
        f" (or set {_OVERRIDE_VARS[0]} to the plugin .so)"
    )


# TORCH_XLA_CPU_PLUGIN names: the wheel (as pip spells it) -> its candidate.
_CPU_PLUGIN_NAMES = {"xla-cpu-pjrt": 0, "lammps-jax-pjrt-cpu": 1, "fastatomstruct-xla-cpu": 2}


def cpu_plugins() -> dict:
    """Installed CPU PJRT plugins: {wheel name: path of its .so}, in default-preference order."""
    out = {}
    for name, index in _CPU_PLUGIN_NAMES.items():
        path = _locate(_DEVICES["CPU"].candidates[index])
        if path is not None:
            out[name] = path
    return out


def _chosen_cpu_plugin(choice: str) -> str:
    """TORCH_XLA_CPU_PLUGIN: a wheel name from _CPU_PLUGIN_NAMES or a path of a plugin .so."""
    key = choice.lower().replace("_", "-")
    if key in _CPU_PLUGIN_NAMES:
        path = _locate(_DEVICES["CPU"].candidates[_CPU_PLUGIN_NAMES[key]])
        if path is None:
            raise RuntimeError(f"TORCH_XLA_CPU_PLUGIN={choice!r}: that plugin is not installed (pip install {key})")
        return path
    if os.path.isfile(choice):
        return os.path.abspath(choice)
    raise ValueError(f"TORCH_XLA_CPU_PLUGIN={choice!r}: expected one of {', '.join(_CPU_PLUGIN_NAMES)} "
                     "or the path of a PJRT CPU plugin .so")


def device_type_from_env() -> str:
    """Canonical device type from PJRT_DEVICE (default "CPU")."""
    value = os.environ.get("PJRT_DEVICE", "").strip() or "CPU"
    if _override_path() is not None:
        key = value.upper()
        return _ALIASES.get(key, key)
    return _canonical(value)


# CPU devices when CPU_NUM_DEVICES is unset: 1, upstream PyTorch/XLA's default. Not the plugin's own
# default (4 devices): XLA:CPU sizes its intra-op thread pool as max(cores, devices), so 4 devices on
# a 2-core machine ran every executable on 4 threads competing for 2 cores (issue #12: the
# GPT-2-style and ResNet-style steps took 0.82-0.92x the time with 1 or 2 devices).
DEFAULT_CPU_DEVICES = 1


def cpu_device_count() -> int:
    """CPU_NUM_DEVICES as an int; DEFAULT_CPU_DEVICES (1) when unset."""
    value = os.environ.get("CPU_NUM_DEVICES", "").strip()
    if not value:
        return DEFAULT_CPU_DEVICES
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"CPU_NUM_DEVICES={value!r} is not an integer") from None
    if count < 1:
        raise ValueError(f"CPU_NUM_DEVICES={value!r} must be a positive integer")
    if count > MAX_CPU_DEVICES:
        raise ValueError(
            f"CPU_NUM_DEVICES={count} is above the limit of {MAX_CPU_DEVICES}: the CPU plugin builds "
            "per-device runtime state when the client starts, and tens of thousands of devices make that "
            "start take practically forever (it looks like a hang). Use at most "
            f"{MAX_CPU_DEVICES} CPU devices.")
    return count


# More CPU devices than this are refused (see cpu_device_count).
MAX_CPU_DEVICES = 1024


def default_xla_flags() -> None:
    """XLA flags we need for eager's results, added to XLA_FLAGS unless the user set them.

    --xla_allow_excess_precision=false: eager rounds every bf16/f16 op's result to its dtype; by
    default XLA may keep intermediates in float32 (it removes f32->bf16->f32 round trips), which
    gives values no bf16 computation can produce. Set the flag yourself to choose otherwise.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_allow_excess_precision" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " --xla_allow_excess_precision=false").strip()


# Flags this package sets itself (default_xla_flags): known to every plugin we support.
_TRUSTED_XLA_FLAGS = frozenset({"xla_allow_excess_precision"})

# The probe's child process sets this so that it does not probe again.
_PROBE_ENV = "TXLA_XLA_FLAGS_PROBE"


def validate_xla_flags(plugin_path: str) -> None:
    """Raises ValueError naming any flag in XLA_FLAGS that the plugin does not know.

    XLA parses XLA_FLAGS when the client starts and aborts the whole process on an unknown flag.
    A name that occurs nowhere in the plugin's file (neither as a string nor as a field of XLA's
    DebugOptions descriptor) cannot be one of its flags: refused at once. A name that does occur is
    not proof (the file holds names of removed flags and fields that are no flag), and XLA also
    exits on a value it cannot parse, so the remaining flags are tried once in a child process that
    starts the client with them; the flags it accepts are cached per plugin file
    (~/.cache/torch_xla/xla_flags.json).
    """
    if os.environ.get(_PROBE_ENV) == "1":
        return
    tokens = []
    for token in os.environ.get("XLA_FLAGS", "").split():
        if not token.startswith("-"):
            continue
        name = token.lstrip("-").split("=", 1)[0]
        if name in _TRUSTED_XLA_FLAGS:
            continue
        tokens.append((token, name, name[2:] if name.startswith("no") else None))
    if not tokens:
        return
    import mmap

    def occurs(mm, name: str) -> bool:
        b = name.encode()
        return mm.find(b + b"\0") >= 0 or (len(b) < 128 and mm.find(b"\n" + bytes([len(b)]) + b + b"\x18") >= 0)

    try:
        with open(plugin_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            unknown = [t for t, name, alt in tokens if not occurs(mm, name) and (alt is None or not occurs(mm, alt))]
    except OSError:
        return  # cannot read the plugin: let XLA judge
    if unknown:
        raise ValueError(
            f"XLA_FLAGS has flag(s) unknown to the PJRT plugin {os.path.basename(plugin_path)}: "
            f"{', '.join(unknown)}. XLA would abort the process on them; remove them from XLA_FLAGS.")
    _probe_xla_flags(plugin_path, [t for t, _, _ in tokens])


def _probe_xla_flags(plugin_path: str, tokens) -> None:
    """Starts the client with these XLA_FLAGS in a child process (once per plugin file and flag);
    raises ValueError with XLA's own message when the child dies on them."""
    import hashlib
    import json
    import subprocess

    try:
        st = os.stat(plugin_path)
    except OSError:
        return
    key = hashlib.sha256(f"{os.path.realpath(plugin_path)}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    cache_dir = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torch_xla")
    cache_file = os.path.join(cache_dir, "xla_flags.json")
    try:
        with open(cache_file) as f:
            cache = json.load(f)
        if not isinstance(cache, dict):
            cache = {}
    except (OSError, ValueError):
        cache = {}
    known = set(cache.get(key, []))
    todo = [t for t in tokens if t not in known]  # whole tokens: XLA also exits on a value it cannot parse
    if not todo:
        return
    env = dict(os.environ)
    env[_PROBE_ENV] = "1"
    env["XLA_FLAGS"] = " ".join(todo + ["--xla_allow_excess_precision=false"])
    env.pop("LD_PRELOAD", None)
    code = ("import torch, torch_xla, torch_xla._internal.plugins as p\n"
            "p.default_xla_flags = lambda: None\n"
            "(torch.ones(2, device=torch_xla.device()) + 1).cpu()\n"
            "print('txla-flags-ok')\n")
    try:
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return  # cannot probe: let XLA judge
    if r.returncode == 0 and "txla-flags-ok" in r.stdout:
        cache[key] = sorted(known | set(todo))[-4096:]
        try:
            os.makedirs(cache_dir, exist_ok=True)
            tmp = f"{cache_file}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(cache, f)
            os.replace(tmp, cache_file)
        except OSError:
            pass
        return
    err = r.stderr.splitlines()
    lines = ([ln for ln in err if "Couldn't interpret" in ln or "Unknown flag" in ln]
             or [ln for ln in err if "XLA_FLAGS" in ln or "Check failed" in ln] or err[-1:])
    detail = lines[0].strip().split("] ", 1)[-1] if lines else f"exit status {r.returncode}"
    raise ValueError(
        f"XLA_FLAGS ({' '.join(todo)}) is refused by the PJRT plugin {os.path.basename(plugin_path)}, "
        f"which would abort the process: {detail}")


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={os.environ[name]!r}: expected true/false (or 1/0)")


def _env_fraction(*names: str):
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            try:
                f = float(value)
            except ValueError:
                raise ValueError(f"{name}={value!r} is not a number") from None
            if not 0.0 < f <= 1.0:
                raise ValueError(f"{name}={value!r} must be in (0, 1]")
            return f
    return None


def client_options(device_type: str) -> dict:
    """PJRT create options for the plugin of ``device_type`` (beyond CPU_NUM_DEVICES), from env.

    CUDA (names as upstream PyTorch/XLA and JAX spell them):
      * ``preallocate``: ``PJRT_ALLOCATOR_PREALLOCATE`` or ``XLA_PYTHON_CLIENT_PREALLOCATE``,
        default **false**, so torch's own CUDA tensors can live beside ours (the plugin's default
        would reserve most of the GPU at start-up).
      * ``memory_fraction``: ``PJRT_ALLOCATOR_FRACTION`` or ``XLA_PYTHON_CLIENT_MEM_FRACTION``.
      * ``allocator``: ``cuda_async`` with ``PJRT_ALLOCATOR_CUDA_ASYNC=1``.
      * ``visible_devices``: one process of a multi-process job started by ``torchrun`` (not by
        ``xmp.spawn``, whose children already see one GPU through CUDA_VISIBLE_DEVICES) sees only
        GPU ``LOCAL_RANK``; a single process sees the first ``GPU_NUM_DEVICES`` GPUs when that is set.
    Other device types: none.
    """
    if device_type != "CUDA":
        return {}
    opts: dict = {"preallocate": _env_bool("PJRT_ALLOCATOR_PREALLOCATE",
                                           _env_bool("XLA_PYTHON_CLIENT_PREALLOCATE", False))}
    fraction = _env_fraction("PJRT_ALLOCATOR_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
    if fraction is not None:
        opts["memory_fraction"] = fraction
    if _env_bool("PJRT_ALLOCATOR_CUDA_ASYNC", False):
        opts["allocator"] = "cuda_async"
    world = os.environ.get("WORLD_SIZE", "1").strip() or "1"
    spawned = os.environ.get("TORCH_XLA_SPAWNED") == "1"
    if world != "1" and not spawned and os.environ.get("LOCAL_RANK", "").strip():
        opts["visible_devices"] = [int(os.environ["LOCAL_RANK"])]
    elif os.environ.get("GPU_NUM_DEVICES", "").strip() and not spawned:
        n = int(os.environ["GPU_NUM_DEVICES"])
        if n < 1:
            raise ValueError(f"GPU_NUM_DEVICES={n} must be a positive integer")
        opts["visible_devices"] = list(range(n))
    return opts
