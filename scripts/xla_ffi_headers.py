"""Finds (and with --fetch, downloads once) the XLA headers the host-kernel path builds against.

Host kernels (ATen's CPU dots and convolutions run inside XLA:CPU executables as typed FFI custom
calls, see csrc/bridge/host_kernels.cc) need two headers that this repository never copies:

- ``xla/ffi/api/c_api.h``: XLA's FFI C API (handler signature, call frame). Shipped by the
  ``jaxlib`` wheel (``jaxlib/include``), which setup already installs.
- ``xla/pjrt/c/pjrt_c_api_ffi_extension.h``: the PJRT extension that registers an FFI handler with
  a plugin. No small wheel ships it; the ``tensorflow-cpu`` wheel does (``tensorflow/include``).
  With ``--fetch`` the wheel is downloaded once from PyPI (``pip download``), the two PJRT headers
  are extracted into a per-user cache folder (atomically: a temporary folder renamed into place)
  and the wheel is deleted.

Prints two lines: the jaxlib include folder and the PJRT extension include folder ("" when
missing). CMake builds the host-kernel path only when both are found; otherwise the build goes on
without it (XLA's own dots and convolutions) and says so.
"""
import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

TF_PACKAGE = "tensorflow-cpu==2.21.0"
MEMBERS = ("xla/pjrt/c/pjrt_c_api_ffi_extension.h", "xla/pjrt/c/pjrt_c_api.h")


def cache_dir():
    root = os.environ.get("TXLA_HEADER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torch_xla")
    return os.path.join(root, "xla-headers-" + TF_PACKAGE.replace("==", "-"))


def jaxlib_include():
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.submodule_search_locations:
        return ""
    inc = os.path.join(list(spec.submodule_search_locations)[0], "include")
    return inc if os.path.exists(os.path.join(inc, "xla/ffi/api/c_api.h")) else ""


def have(folder):
    return all(os.path.exists(os.path.join(folder, m)) for m in MEMBERS)


def fetch(folder):
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent) as tmp:
        dl = os.path.join(tmp, "wheel")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "-d", dl, TF_PACKAGE], check=True, stdout=sys.stderr)
        wheels = [f for f in os.listdir(dl) if f.endswith(".whl")]
        if not wheels:
            raise RuntimeError("pip download gave no wheel")
        out = os.path.join(tmp, "include")
        with zipfile.ZipFile(os.path.join(dl, wheels[0])) as z:
            for m in MEMBERS:
                dst = os.path.join(out, m)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                with z.open("tensorflow/include/" + m) as src, open(dst, "wb") as f:
                    shutil.copyfileobj(src, f)
        try:
            os.rename(out, folder)
        except OSError:
            if not have(folder):  # another build won the race only if it left a complete folder
                raise


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fetch", action="store_true", help="download the PJRT extension headers if missing")
    args = ap.parse_args()
    folder = cache_dir()
    if not have(folder) and args.fetch and os.environ.get("TXLA_HOST_KERNELS_BUILD", "1") != "0":
        try:
            fetch(folder)
        except Exception as e:  # offline or PyPI without the wheel: build without host kernels
            print(f"xla_ffi_headers: could not fetch {TF_PACKAGE}'s headers: {e}", file=sys.stderr)
    print(jaxlib_include())
    print(folder if have(folder) else "")


if __name__ == "__main__":
    main()
