"""Where does a PJRT plugin crash? Runs small stages, each in its own process (faulthandler on), from
the torch-free runtime up to torch_xla, and reruns the first stage that dies of a signal under
cuda-gdb (or gdb) for a native backtrace of every thread.

  python scripts/gpu_diag.py OUTDIR [--device CUDA] [--stages A,B,C,D]

  A  torch_xla._core alone (no torch in the process): client, upload + download, compile + execute
  B  the same after `import torch` (torch's CUDA libraries loaded first)
  C  torch_xla step by step: device, upload, download, an op + sync, the StableHLO text of the op
  D  the StableHLO text that C wrote, compiled and run through torch_xla._core alone

Writes OUTDIR/diag.log (everything) and OUTDIR/diag.json (each stage's exit code and last step).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CORE = r"""
import os, sys, time
sys.path.insert(0, os.path.join({repo!r}, "tests"))
if {with_torch}:
    import torch
    print("STEP torch imported", torch.__version__, torch.cuda.is_available(), flush=True)
import numpy as np
from _core_loader import load_core, load_plugins
rt = load_core().runtime
plugins = load_plugins()
path, canon = plugins.plugin_for({device!r})
opts = plugins.client_options(canon)
print("STEP plugin", path, canon, opts, flush=True)
if canon == "CUDA":
    sys.path.insert(0, {repo!r})
    from torch_xla._internal import cuda_libs
    cuda_libs.preload()
    print("STEP cuda libs preloaded", flush=True)
c = rt.Client.create(path, -1 if canon != "CPU" else 1, canon, opts)
print("STEP client", c.platform_name(), c.platform_version(), c.api_version(), c.num_devices(), c.device_kind(0), flush=True)
a = np.arange(6, dtype=np.float32).reshape(2, 3)
b = c.to_device(a)
print("STEP uploaded", flush=True)
b.await_ready()
print("STEP upload ready", flush=True)
print("STEP downloaded", b.to_numpy().tolist(), flush=True)
mlir = {mlir!r}
if mlir is None:
    t = "tensor<2x3xf32>"
    mlir = ("module @m {{ func.func public @main(%a: " + t + ", %b: " + t + ") -> " + t + " {{ "
            "%0 = \"stablehlo.add\"(%a, %b) : (" + t + ", " + t + ") -> " + t + "  \"func.return\"(%0) : (" + t + ") -> () }} }}")
    args = [b, c.to_device(a)]
else:
    mlir = open(mlir).read()
    args = None
print("STEP compiling", len(mlir), "chars", flush=True)
exe = c.compile(mlir)
print("STEP compiled; outputs", exe.num_outputs(), flush=True)
if args is None:
    print("STEP (compile only: the program's arguments are unknown here)", flush=True)
else:
    (out,) = c.execute(exe, args)
    print("STEP executed", flush=True)
    out.await_ready()
    print("STEP result", out.to_numpy().tolist(), flush=True)
print("STAGE OK", flush=True)
"""

_TORCH_XLA = r"""
import os, sys, time
import torch
print("STEP torch", torch.__version__, "cuda", torch.cuda.is_available(), flush=True)
import torch_xla, torch_xla.core.xla_model as xm
from torch_xla._internal import plugins
print("STEP XLA_FLAGS", os.environ.get("XLA_FLAGS"), flush=True)
dev = torch_xla.device()
print("STEP device", dev, xm.xla_device_hw(dev), flush=True)
t = torch.arange(4.0).to(dev)
print("STEP uploaded", flush=True)
print("STEP downloaded", t.cpu().tolist(), flush=True)
u = t * 2 + 1
text = xm.get_stablehlo([u])
open({mlir_out!r}, "w").write(text)
print("STEP stablehlo written", len(text), "chars", flush=True)
torch_xla.sync()
print("STEP synced", flush=True)
print("STEP result", u.cpu().tolist(), flush=True)
w = torch.ones(3, 3, device=dev) @ torch.ones(3, 3, device=dev)
print("STEP matmul", w.cpu().tolist(), flush=True)
print("STAGE OK", flush=True)
"""


def stage_source(name: str, device: str, outdir: str) -> str:
    mlir_file = os.path.join(outdir, "stage_c.mlir")
    if name == "A":
        return _CORE.format(repo=REPO, with_torch=False, device=device, mlir=None)
    if name == "B":
        return _CORE.format(repo=REPO, with_torch=True, device=device, mlir=None)
    if name == "C":
        return _TORCH_XLA.format(mlir_out=mlir_file)
    if name == "D":
        return _CORE.format(repo=REPO, with_torch=False, device=device, mlir=mlir_file)
    raise SystemExit(f"unknown stage {name}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--device", default=os.environ.get("PJRT_DEVICE", "CUDA"))
    ap.add_argument("--stages", default="A,B,C,D")
    ap.add_argument("--timeout", type=float, default=40)
    ap.add_argument("--gdb-timeout", type=float, default=90)
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    log = open(os.path.join(args.outdir, "diag.log"), "w")

    def say(*parts):
        text = " ".join(str(p) for p in parts)
        print(text, flush=True)
        log.write(text + "\n")
        log.flush()

    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1", PJRT_DEVICE=args.device,
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    report, crashed = {}, None
    for name in [s for s in args.stages.split(",") if s]:
        if name == "D" and not os.path.exists(os.path.join(args.outdir, "stage_c.mlir")):
            say(f"=== stage D skipped: stage C wrote no StableHLO")
            continue
        src = stage_source(name, args.device, args.outdir)
        t0 = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, "-c", src], env=env, cwd=REPO, capture_output=True, text=True,
                               timeout=args.timeout)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc = "timeout"
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        dt = time.perf_counter() - t0
        steps = [ln for ln in out.splitlines() if ln.startswith("STEP")]
        say(f"=== stage {name}: rc={rc} in {dt:.1f}s")
        say(out.rstrip())
        say("--- stderr (last 4000 chars)")
        say(err[-4000:].rstrip())
        report[name] = {"rc": rc, "seconds": round(dt, 1), "last_step": steps[-1] if steps else None,
                        "ok": "STAGE OK" in out}
        if crashed is None and isinstance(rc, int) and rc < 0:
            crashed = (name, src)
    if crashed is not None:
        name, src = crashed
        gdb = shutil.which("cuda-gdb") or shutil.which("gdb")
        if gdb is None:
            say("=== no cuda-gdb/gdb: no native backtrace")
        else:
            script = os.path.join(args.outdir, f"stage_{name}.py")
            with open(script, "w") as f:
                f.write(src)
            cmd = [gdb, "-q", "-batch", "-ex", "set pagination off", "-ex", "set confirm off",
                   "-ex", "handle SIGPIPE nostop noprint", "-ex", "run", "-ex", "bt 60",
                   "-ex", "info registers rip", "-ex", "x/6i $pc-12",
                   "-ex", "thread apply all bt 25", "--args", sys.executable, script]
            say(f"=== stage {name} under {os.path.basename(gdb)}")
            t0 = time.perf_counter()
            try:
                p = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=args.gdb_timeout)
                text = p.stdout + "\n--- stderr\n" + p.stderr[-3000:]
            except subprocess.TimeoutExpired as e:
                text = "TIMEOUT\n" + (e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""))
            say(f"(gdb {time.perf_counter() - t0:.1f}s)")
            # the backtrace is what matters: drop the thread-creation chatter
            say("\n".join(ln for ln in text.splitlines() if not ln.startswith("[New Thread")
                          and not ln.startswith("[Thread ") and "exited" not in ln)[-60000:])
            report["gdb_stage"] = name
    with open(os.path.join(args.outdir, "diag.json"), "w") as f:
        json.dump(report, f, indent=2)
    say(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
