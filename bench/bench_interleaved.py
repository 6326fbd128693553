"""Side-by-side comparison of configurations (environment settings, CPU plugins, eager CPU) on the
MLP, GPT-2-style and ResNet-style training steps, with interleaved rounds: each round runs every
(model, configuration) once, each in a fresh process, so load changes on a shared machine hit all
configurations alike. Reports the median over rounds and the [min-max] spread.

Per run (fresh process, `--warmup` steps first):
- host ms (idle): wall time from the start of a step until torch_xla.sync() returns (trace +
  launch), with the device idle before the step (xm.wait_device_ops()); median of `--steps`.
- host cpu ms: the same span in CPU time of the host's threads: the process's CPU time while
  tracing (autograd traces an XLA backward on its device thread, not the caller's; the device is
  idle), plus the calling thread's in torch_xla.sync(). Other jobs on the machine inflate it much
  less than wall time. (Before the eighteenth session this column was the calling thread's CPU
  time alone, which left the backward's tracing out: ~1.3 ms of the GPT-2-style step.)
- step ms: wall time per step of `--steps` steps in a loop that never waits, until the last loss is
  read (eager CPU: the same loop without XLA).
- peak MB: the process's peak RSS.

Models (examples/models.py): mlp = MLP 784-1024-1024-10, batch 128, SGD momentum; gpt2 =
GPT-2-style d=128, 2 layers, batch 16x64, AdamW foreach; resnet = ResNet-style width 32, batch 32,
SGD momentum.

Usage:
  .venv/bin/python bench/bench_interleaved.py [--rounds 5] [--steps 20] [--warmup 5]
      [--models mlp,gpt2,resnet] [--config NAME[:VAR=VALUE[,VAR=VALUE...]] ...]
A configuration named `eager` runs eager PyTorch on the CPU, one named `jax` the MLP step under
jax.jit on jaxlib's XLA:CPU (MLP only); PYTHON=<interpreter> runs that
configuration with another interpreter (e.g. a venv holding another build, for before/after). Default configurations: `default`
(this build as installed) and `eager`. Examples:
  --config default --config "no-donation:XLA_ENABLE_PARAM_ALIASING=0"
  --config default --config "lammps:TORCH_XLA_CPU_PLUGIN=lammps-jax-pjrt-cpu" --config eager
  --config default --config "mimalloc:TORCH_XLA_ALLOCATOR=mimalloc" --config eager
      --config "eager-mimalloc:TORCH_XLA_ALLOCATOR=mimalloc"   (a fast host allocator preloaded)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

CHILD = r"""
import json, os, sys, time, resource
sys.path.insert(0, {examples!r})
import torch, torch.nn as nn, torch.nn.functional as F
mode, model_name, steps, warmup = {mode!r}, {model!r}, {steps}, {warmup}
xla = mode == "xla"
if xla:
    import torch_xla, torch_xla.core.xla_model as xm, torch_xla.debug.metrics as met
    device = torch_xla.device()
else:
    device = torch.device("cpu")
import models
torch.manual_seed(0)
g = torch.Generator().manual_seed(0)
if model_name == "gpt2":
    model = models.GPT2(vocab=256, block=64, d=int(os.environ.get("BENCH_GPT2_D", "128")), heads=4, layers=2).to(device)
    model.tie_weights()
    x = torch.randint(0, 256, (16, 64), generator=g); y = torch.roll(x, -1, 1)
    x, y = x.to(device), y.to(device)
    loss_fn = lambda: model(x, y)[1]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
elif model_name == "resnet":
    model = models.ResNet(width=32).to(device)
    x = torch.randn(32, 3, 32, 32, generator=g).to(device); y = torch.randint(0, 10, (32,), generator=g).to(device)
    loss_fn = lambda: F.cross_entropy(model(x), y)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
else:
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10)).to(device)
    x = torch.randn(128, 784, generator=g).to(device); y = torch.randint(0, 10, (128,), generator=g).to(device)
    loss_fn = lambda: F.cross_entropy(model(x), y)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

def trace():
    loss = loss_fn(); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    return loss

def step():
    loss = trace()
    if xla:
        torch_xla.sync()
    return loss

def wait():
    if xla:
        xm.wait_device_ops()

for _ in range(warmup):
    loss = step()
loss.item()
wall, cpu = [], []
for _ in range(steps):
    wait()
    # CPU of the host's threads: the whole process while tracing (autograd runs an XLA backward on
    # its device thread, not this one; the device is idle), then this thread's in the sync (the
    # plugin's threads start running the step there)
    w0, p0 = time.perf_counter(), time.process_time()
    loss = trace()
    p1, c1 = time.process_time(), time.thread_time()
    if xla:
        torch_xla.sync()
    wall.append(time.perf_counter() - w0); cpu.append((p1 - p0) + (time.thread_time() - c1))
loss.item(); wait()
t0 = time.perf_counter()
for _ in range(steps):
    loss = step()
last = loss.item()
step_ms = (time.perf_counter() - t0) / steps * 1e3
med = lambda v: sorted(v)[len(v) // 2] * 1e3
out = {{"host_ms": med(wall), "host_cpu_ms": med(cpu), "step_ms": step_ms, "loss": last,
       "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}
if xla:
    out["compiles"] = met.counter_value("UncachedCompile") or 0
    from torch_xla._internal import plugins
    out["plugin"] = plugins.plugin_for("CPU")[0]
maps = open("/proc/self/maps").read()
out["alloc"] = next((a for a in ("mimalloc", "jemalloc", "tcmalloc") if "lib" + a in maps), "glibc")
print("RESULT " + json.dumps(out))
"""


# The MLP step in JAX (jax.jit on jaxlib's own XLA:CPU, parameters and momentum donated): the
# `jax` configuration (MLP only). host ms = dispatch of one jitted step with the device idle.
JAX_CHILD = r"""
import json, os, sys, time, resource
import jax
sys.path.insert(0, {bench!r})
from jax_mlp_step import make
steps, warmup = {steps}, {warmup}
f, ps, bufs, x, y = make()
for _ in range(warmup):
    ps, bufs, loss = f(ps, bufs, x, y)
loss.block_until_ready()
wall, cpu = [], []
for _ in range(steps):
    w0, c0 = time.perf_counter(), time.thread_time()
    ps, bufs, loss = f(ps, bufs, x, y)
    wall.append(time.perf_counter() - w0); cpu.append(time.thread_time() - c0)
    loss.block_until_ready()
t0 = time.perf_counter()
for _ in range(steps):
    ps, bufs, loss = f(ps, bufs, x, y)
last = float(loss)
step_ms = (time.perf_counter() - t0) / steps * 1e3
med = lambda v: sorted(v)[len(v) // 2] * 1e3
print("RESULT " + json.dumps({{"host_ms": med(wall), "host_cpu_ms": med(cpu), "step_ms": step_ms, "loss": last,
      "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "plugin": "jaxlib " + jax.__version__}}))
"""


def parse_config(spec):
    name, _, rest = spec.partition(":")
    env = {}
    # KEY=VALUE pairs separated by commas; a comma not followed by KEY= belongs to the value
    # (TORCH_XLA_HOST_KERNELS=conv,tdot).
    for kv in filter(None, re.split(r",(?=[A-Za-z_][A-Za-z0-9_]*=)", rest)):
        k, _, v = kv.partition("=")
        env[k] = v
    return name, env


def _allocator_env(env):
    import importlib.util
    spec = importlib.util.spec_from_file_location("_alloc", os.path.join(REPO, "torch_xla", "_allocator.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.child_env(env)  # honours env's TORCH_XLA_ALLOCATOR


def run_child(model, name, env, steps, warmup):
    mode = "cpu" if name.split("-")[0] == "eager" else "xla"  # "eager-NAME:VAR=..." too
    if name == "jax":
        if model != "mlp":
            return {"error": "the jax configuration runs the MLP only"}
        code = JAX_CHILD.format(bench=HERE, steps=steps, warmup=warmup)
    else:
        code = CHILD.format(examples=os.path.join(REPO, "examples"), mode=mode, model=model, steps=steps,
                            warmup=warmup)
    full_env = dict(os.environ, **env)
    if "TORCH_XLA_ALLOCATOR" in env:  # "alloc:TORCH_XLA_ALLOCATOR=mimalloc": preload it, as xmp.spawn does
        full_env = _allocator_env(full_env)
    python = full_env.pop("PYTHON", sys.executable)  # another build's interpreter (before/after)
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, env=full_env,
                       cwd=tempfile.gettempdir())  # not the repo: its torch_xla/ would shadow PYTHON's build
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (r.stderr.strip().splitlines() or ["no output"])[-1][:300]}


def fmt(values):
    if not values:
        return "-"
    return f"{statistics.median(values):7.2f} [{min(values):.1f}-{max(values):.1f}]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--models", default="mlp,gpt2,resnet")
    ap.add_argument("--config", action="append", default=None)
    ap.add_argument("--json", help="also write the raw results here")
    a = ap.parse_args()
    configs = [parse_config(c) for c in (a.config or ["default", "eager"])]
    models = a.models.split(",")
    results = {(m, n): [] for m in models for n, _ in configs}
    for r in range(a.rounds):
        for m in models:
            for n, env in configs:
                res = run_child(m, n, env, a.steps, a.warmup)
                results[(m, n)].append(res)
                print(f"round {r + 1}/{a.rounds} {m:6s} {n:14s} " +
                      (res["error"] if "error" in res else
                       f"host {res['host_ms']:.2f} ms (cpu {res['host_cpu_ms']:.2f}), step {res['step_ms']:.2f} ms"),
                      file=sys.stderr, flush=True)
    print(f"\n{a.rounds} interleaved rounds, {a.steps} steps each; median [min-max] over rounds")
    print(f"{'model':7s} {'configuration':16s} {'host ms (idle)':>22s} {'host cpu ms':>22s} {'step ms':>22s} "
          f"{'peak MB':>8s} {'compiles':>8s}")
    for m in models:
        base = None
        for n, _ in configs:
            rs = [r for r in results[(m, n)] if "error" not in r]
            if not rs:
                print(f"{m:7s} {n:16s} failed: {results[(m, n)][0].get('error')}")
                continue
            step = statistics.median(r["step_ms"] for r in rs)
            base = base or step
            host = [r["host_ms"] for r in rs] if n.split("-")[0] != "eager" else []
            cpu = [r["host_cpu_ms"] for r in rs] if n.split("-")[0] != "eager" else []
            print(f"{m:7s} {n:16s} {fmt(host):>22s} {fmt(cpu):>22s} {fmt([r['step_ms'] for r in rs]):>22s} "
                  f"{statistics.median(r['peak_mb'] for r in rs):8.0f} {str(rs[0].get('compiles', '-')):>8s}"
                  f"   step {step / base:.2f}x of {configs[0][0]}")
    plugins_used = sorted({f"{n}: {r['plugin']}" for (m, n), rs in results.items() for r in rs if r.get("plugin")})
    print("plugins: " + "; ".join(plugins_used))
    allocs = sorted({f"{n}: {r['alloc']}" for (m, n), rs in results.items() for r in rs if r.get("alloc")})
    print("host allocators: " + "; ".join(allocs))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({f"{m}|{n}": v for (m, n), v in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
