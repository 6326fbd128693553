"""Where a training step's time goes, with XLA:CPU's JIT-compiled kernels named.

`perf` shows XLA:CPU's compiled fusions as anonymous "[JIT]" addresses. XLA registers every object
file it loads with LLVM's GDB JIT interface (`__jit_debug_descriptor` in the plugin: a linked list
of in-memory ELF images whose sections carry their load addresses), so after warm-up this script
walks that list, reads each image's function symbols and writes /tmp/perf-<pid>.map, which perf
uses to name JIT samples (fusion names as in XLA's optimized HLO, `--xla_dump_to`). Then it runs
steps for `--seconds` under `perf record -p <pid> -g` and prints the share of samples per library
and per kernel. Unnamed JIT addresses are other JIT code (oneDNN's convolution kernels, called by
the host kernels).

Usage: .venv/bin/python bench/profile_xla_kernels.py [--model mlp|gpt2|resnet] [--seconds 8] [--top 25]
Needs `perf` (Debian: linux-perf) allowed to profile this process (perf_event_paranoid <= 1, or root).
Run with the fast allocator as the benchmarks do: LD_PRELOAD=$(.venv/bin/python -m torch_xla._allocator).
"""
import argparse
import ctypes
import os
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))


def _mapped_base(path):
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and os.path.realpath(parts[5]) == real and int(parts[2], 16) == 0:
                return int(parts[0].split("-")[0], 16)
    raise RuntimeError(f"{path} is not mapped in this process")


def _symbol_value(path, name):
    out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        p = line.split()
        if len(p) == 3 and p[2] == name:
            return int(p[0], 16)
    raise RuntimeError(f"{name} not found in {path} (a plugin without LLVM's GDB JIT listener)")


def _elf_functions(img):
    """(address, size, name) of the function symbols of an in-memory ELF64 image whose section
    headers hold load addresses (what LLVM's GDB registration hands over)."""
    if img[:4] != b"\x7fELF":
        return []
    shoff, = struct.unpack_from("<Q", img, 0x28)
    shentsize, shnum, _ = struct.unpack_from("<HHH", img, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", img, shoff + i * shentsize) for i in range(shnum)]
    out = []
    for (_, typ, _, _, off, size, link, _, _, _) in secs:
        if typ != 2:  # SHT_SYMTAB
            continue
        stroff = secs[link][4]
        for j in range(size // 24):
            st_name, st_info, _, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", img, off + j * 24)
            if (st_info & 0xF) != 2 or st_shndx == 0 or st_shndx >= len(secs):  # STT_FUNC, defined
                continue
            end = img.index(b"\0", stroff + st_name)
            out.append((secs[st_shndx][3] + st_value, st_size, img[stroff + st_name:end].decode(errors="replace")))
    return out


def write_perf_map(plugin_path):
    """Writes /tmp/perf-<pid>.map for the plugin's JIT-compiled kernels; returns (path, count)."""
    desc = _mapped_base(plugin_path) + _symbol_value(plugin_path, "__jit_debug_descriptor")
    _, _, _, entry = struct.unpack("<IIQQ", ctypes.string_at(desc, 24))
    funcs = []
    while entry:
        nxt, _, symfile, size = struct.unpack("<QQQQ", ctypes.string_at(entry, 32))
        funcs += _elf_functions(ctypes.string_at(symfile, size))
        entry = nxt
    path = f"/tmp/perf-{os.getpid()}.map"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for addr, size, name in funcs:
            if addr:
                f.write(f"{addr:x} {max(size, 1):x} {name}\n")
    os.replace(tmp, path)
    return path, len(funcs)


def _step_fn(model):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch_xla
    import models
    d = torch_xla.device()
    torch.manual_seed(0)
    if model == "resnet":
        m = models.ResNet(width=32).to(d)
        x, y = torch.randn(32, 3, 32, 32).to(d), torch.randint(0, 10, (32,)).to(d)
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        loss_fn = lambda: F.cross_entropy(m(x), y)
    elif model == "mlp":
        m = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(d)
        x, y = torch.randn(128, 784).to(d), torch.randint(0, 10, (128,)).to(d)
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        loss_fn = lambda: F.cross_entropy(m(x), y)
    else:
        m = models.GPT2(vocab=256, block=64, d=128, heads=4, layers=2).to(d)
        m.tie_weights()
        g = torch.Generator().manual_seed(0)
        xx = torch.randint(0, 256, (16, 64), generator=g)
        x, y = xx.to(d), torch.roll(xx, -1, 1).to(d)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=True)
        loss_fn = lambda: m(x, y)[1]

    def step():
        loss = loss_fn()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch_xla.sync()
    return step


def _report(data, sort, top, dso=None):
    cmd = ["perf", "report", "-i", data, "--no-children", "-g", "none", "--sort", sort, "--stdio"]
    if dso:
        cmd += ["--dso", dso]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    rows = [l for l in out.splitlines() if l.strip() and not l.startswith("#") and "%" in l.split()[0]]
    return [r.rstrip()[:150] for r in rows[:top]]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2", choices=["mlp", "gpt2", "resnet"])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--data", default="/tmp/profile_xla_kernels.data")
    args = ap.parse_args()
    import torch_xla.core.xla_model as xm
    step = _step_fn(args.model)
    for _ in range(5):
        step()
    xm.wait_device_ops()
    # The PJRT plugin this process loaded: the mapped library that holds LLVM's JIT descriptor.
    mapped = sorted({os.path.realpath(l.split()[5]) for l in open("/proc/self/maps")
                     if len(l.split()) >= 6 and l.split()[5].endswith(".so")})
    plugin = next(p for p in mapped if "pjrt" in os.path.basename(p).lower() or "xla_cpu" in os.path.basename(p))
    path, n = write_perf_map(plugin)
    print(f"{n} JIT kernels named in {path} (plugin {plugin})", flush=True)
    perf = subprocess.Popen(["perf", "record", "-q", "-o", args.data, "-F", "1999", "-g", "-p", str(os.getpid())],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)
    t0, steps = time.time(), 0
    while time.time() - t0 < args.seconds:
        step()
        xm.wait_device_ops()
        steps += 1
    elapsed = time.time() - t0
    perf.send_signal(2)
    perf.wait()
    print(f"{args.model}: {steps} steps, {elapsed / steps * 1e3:.1f} ms/step (device idle between steps)")
    print("\nshare of samples by library:")
    print("\n".join(_report(args.data, "dso", 12)))
    print("\nby thread name:")
    print("\n".join(_report(args.data, "comm", 6)))
    print(f"\ntop {args.top} kernels and functions:")
    print("\n".join(_report(args.data, "dso,sym", args.top)))


if __name__ == "__main__":
    main()
