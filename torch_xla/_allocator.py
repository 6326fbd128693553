"""The host memory allocator for processes that trace XLA graphs.

Lazy tracing makes many small, short-lived host allocations per op (IR nodes, tensor wrappers,
Python objects); glibc's malloc spends a large part of a step's host time consolidating and
splitting its bins. mimalloc (pip: ``cmeel-mimalloc``, MIT) or jemalloc/tcmalloc (Debian packages)
cut the GPT-2-style training step's host CPU time by about a third (README, *Host allocator*).

An allocator can only be chosen when a process starts (``LD_PRELOAD``), so:
- processes we start (``xmp.spawn`` / ``torch_xla.launch`` with the spawn or forkserver start
  method) get it through ``LD_PRELOAD`` automatically when one is installed;
- for the main process: ``LD_PRELOAD=$(python -m torch_xla._allocator) python train.py``
  (``scripts/train.sh`` does this).

``TORCH_XLA_ALLOCATOR`` chooses: unset or ``auto`` (the first installed of mimalloc, jemalloc,
tcmalloc), ``mimalloc`` / ``jemalloc`` / ``tcmalloc`` (that one; an error if it is not installed),
a path to an allocator's ``.so``, or ``glibc`` / ``0`` (leave the C library's malloc).
"""
import os
import sys
import sysconfig

__all__ = ["library", "active", "child_env", "preloaded_children"]

_SYSTEM_LIBS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/lib/aarch64-linux-gnu")
_NAMES = {
    "mimalloc": ("libmimalloc.so.3", "libmimalloc.so.2", "libmimalloc.so"),
    "jemalloc": ("libjemalloc.so.2",),
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"),
}
_OFF = ("glibc", "0", "off", "none", "false")


def _candidates(name):
    dirs = []
    if name == "mimalloc":  # the cmeel-mimalloc wheel installs into <site-packages>/cmeel.prefix/lib
        roots = [sysconfig.get_paths().get("purelib", ""), sysconfig.get_paths().get("platlib", "")]
        roots += [p for p in sys.path if p.endswith("site-packages")]
        dirs += [os.path.join(r, "cmeel.prefix", "lib") for r in roots if r]
    dirs += list(_SYSTEM_LIBS)
    for d in dirs:
        for f in _NAMES[name]:
            yield os.path.join(d, f)


def _find(name):
    for path in _candidates(name):
        if os.path.isfile(path):
            return path
    return None


def library(choice=None):
    """The allocator library ``choice`` (default: $TORCH_XLA_ALLOCATOR) asks for (a path), or None
    for glibc's malloc."""
    choice = (os.environ.get("TORCH_XLA_ALLOCATOR", "auto") if choice is None else choice).strip()
    if choice.lower() in _OFF:
        return None
    if choice.lower() in ("", "auto"):
        for name in _NAMES:
            path = _find(name)
            if path:
                return path
        return None
    if choice.lower() in _NAMES:
        path = _find(choice.lower())
        if path is None:
            hint = {"mimalloc": "pip install cmeel-mimalloc", "jemalloc": "apt-get install libjemalloc2",
                    "tcmalloc": "apt-get install libtcmalloc-minimal4"}[choice.lower()]
            raise ValueError(f"TORCH_XLA_ALLOCATOR={choice}: no {choice} library found ({hint}), or set "
                             f"TORCH_XLA_ALLOCATOR=glibc")
        return path
    if os.path.sep in choice:
        if not os.path.isfile(choice):
            raise ValueError(f"TORCH_XLA_ALLOCATOR={choice}: no such file")
        return choice
    raise ValueError(f"TORCH_XLA_ALLOCATOR={choice!r}: expected auto, mimalloc, jemalloc, tcmalloc, glibc or the "
                     f"path of an allocator library")


def active():
    """The allocator this process runs on: 'mimalloc', 'jemalloc', 'tcmalloc' or 'glibc'."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return "glibc"
    for name in _NAMES:
        if f"lib{name}" in maps:
            return name
    return "glibc"


def child_env(env=None):
    """``env`` (default: os.environ) with the allocator added to LD_PRELOAD for a new process."""
    env = dict(os.environ if env is None else env)
    path = library(env.get("TORCH_XLA_ALLOCATOR"))  # else this process's setting
    if path is None:
        return env
    current = env.get("LD_PRELOAD", "")
    if path not in current.split(":") and os.path.basename(path) not in current:
        env["LD_PRELOAD"] = f"{path}:{current}" if current else path
    return env


class preloaded_children:
    """Context manager: processes started inside it (spawn/forkserver) preload the allocator."""

    def __enter__(self):
        self._old = os.environ.get("LD_PRELOAD")
        new = child_env().get("LD_PRELOAD")
        if new is not None:
            os.environ["LD_PRELOAD"] = new
        return self

    def __exit__(self, *exc):
        if self._old is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = self._old
        return False


if __name__ == "__main__":
    # `LD_PRELOAD=$(python -m torch_xla._allocator) python train.py`: prints the path, or nothing.
    try:
        print(library() or "")
    except ValueError as e:
        print(f"torch_xla._allocator: {e}", file=sys.stderr)
        sys.exit(2)
