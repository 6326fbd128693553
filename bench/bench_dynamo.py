"""Host time per step and step time of the GPT-2-style model (examples/models.py, d=128, 2 layers,
batch 16x64, AdamW foreach; forward + backward + optimizer step): lazy tracing vs
torch.compile(backend="openxla") on XLA:CPU, and torch.compile (inductor) and eager on the CPU.
Each configuration runs in a fresh process.

- host ms/step (idle device): the device is idle before each step (xm.wait_device_ops()); the time
  from the call until it returns with the step enqueued (lazy: trace + torch_xla.sync()).
  XLA:CPU computes on the same two cores as the host, so this is the clean host cost.
- host ms/step (pipelined): the same span inside a loop that never waits (on a 2-core machine the
  device's threads compete with the host for the cores).
- step ms: wall time per step of the pipelined loop, until the last loss is read.
- host cpu ms: CPU time per step of the threads that run the host work (the calling thread and
  autograd's device threads, not XLA:CPU's compute threads), idle device: the host cost, much less
  sensitive to other jobs on a shared machine than wall time (a preempted thread accrues none).
- cpu ms: CPU time of the whole process (every thread: host and XLA:CPU's compute) per step of
  the idle-device loop; less sensitive to other jobs on the machine than wall time.
- lazy (no donation): XLA_ENABLE_PARAM_ALIASING=0. (Before issue #12's fix, a donating sync waited
  for its own step on XLA:CPU; TXLA_DONATION_SYNC_RELEASE=1 reproduces that.)

Usage: .venv/bin/python bench/bench_dynamo.py [--steps 20] [--warmup 5] [--no-inductor] [--layers 2]
       [--xla-only] [--batch 16] [--block 64] [--repeat 1] [--ab] [--ab-donate] [--func]
       [--allocator glibc,mimalloc] [--only TEXT]
(--batch 2 --block 8: the device's compute is negligible, so the host times are the host cost alone)
--allocator: the host allocator of the child processes (default glibc's malloc, whatever the caller
preloads); a comma-separated list runs every configuration with each, interleaved in fresh processes.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

CHILD = r"""
import json, sys, time
sys.path.insert(0, {examples!r})
import torch
mode, steps, warmup, layers, batch, block = {mode!r}, {steps}, {warmup}, {layers}, {batch}, {block}
xla = mode in ("lazy", "openxla", "openxla_func")
if xla:
    import torch_xla, torch_xla.debug.metrics as met, torch_xla.core.xla_model as xm
    device = torch_xla.device()
else:
    device = torch.device("cpu")
import models
torch.manual_seed(0)
model = models.GPT2(vocab=256, block=64, d=128, heads=4, layers=layers).to(device)
model.tie_weights()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
g = torch.Generator().manual_seed(0)
x = torch.randint(0, 256, (batch, block), generator=g).to(device)
y = torch.roll(x, -1, 1).to(device)

def step(x, y):
    loss = model(x, y)[1]
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss

if mode == "openxla_func":
    # The whole step as one graph: torch.func computes the gradients inside it, AdamW's update
    # (torch.optim.AdamW's formula, foreach=False) written out; no AOT Autograd, no autograd engine.
    from torch.func import functional_call, grad_and_value
    names = [n for n, _ in model.named_parameters()]
    P = [p.detach() for _, p in model.named_parameters()]
    M1 = [torch.zeros_like(p) for p in P]
    M2 = [torch.zeros_like(p) for p in P]
    T = torch.ones(())  # the step number, a CPU scalar as torch.optim keeps it
    lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 1e-2

    def loss_fn(ps, x, y):
        return functional_call(model, dict(zip(names, ps)), (x, y))[1]

    def fstep(P, M1, M2, T, x, y):
        grads, loss = grad_and_value(loss_fn)(P, x, y)
        with torch.no_grad():
            bc1, bc2 = 1 - b1 ** T, 1 - b2 ** T
            for p, g, m1, m2 in zip(P, grads, M1, M2):
                p.mul_(1 - lr * wd)
                m1.lerp_(g, 1 - b1)
                m2.mul_(b2).addcmul_(g, g, value=1 - b2)
                p.addcdiv_(m1, m2.sqrt() / bc2.sqrt() + eps, value=-lr / bc1)
        return loss

    cf = torch.compile(fstep, backend="openxla_eval")

    def f(x, y):
        loss = cf(P, M1, M2, T, x, y)
        T.add_(1)
        return loss
elif mode == "openxla":
    f = torch.compile(step, backend="openxla")
elif mode == "inductor":
    f = torch.compile(step)
else:
    f = step

def run():
    loss = f(x, y)
    if mode == "lazy":
        torch_xla.sync()
    return loss

def wait():
    if xla:
        xm.wait_device_ops()

import os, threading
def host_threads():
    tids = [threading.get_native_id()]
    for t in os.listdir("/proc/self/task"):
        try:
            if open(f"/proc/self/task/{{t}}/comm").read().startswith("pt_autograd"):
                tids.append(int(t))
        except OSError:
            pass
    return tids

def host_cpu_ns(tids):
    s = 0
    for t in tids:
        try:
            s += time.clock_gettime_ns(((~t) << 3) | 6)  # the thread's CPU-time clock (Linux)
        except OSError:
            pass
    return s

t0 = time.perf_counter()
for _ in range(warmup):
    loss = run()
loss.item()
warm_s = time.perf_counter() - t0
first_loss = loss.item()

# idle-device host time
host_idle = []
host_cpu = []
tids = host_threads()
p0 = time.process_time()
for _ in range(steps):
    wait()
    c0 = host_cpu_ns(tids)
    h0 = time.perf_counter()
    loss = run()
    host_idle.append(time.perf_counter() - h0)
    host_cpu.append(host_cpu_ns(tids) - c0)
loss.item()
wait()
cpu_ms = (time.process_time() - p0) / steps * 1e3
if xla:
    c0 = {{n: met.counter_value(n) for n in met.counter_names()}}
# pipelined loop
host = []
t0 = time.perf_counter()
for _ in range(steps):
    h0 = time.perf_counter()
    loss = run()
    host.append(time.perf_counter() - h0)
last = loss.item()
step_ms = (time.perf_counter() - t0) / steps * 1e3
out = {{"host_idle_ms": sorted(host_idle)[len(host_idle) // 2] * 1e3,
       "host_cpu_ms": sorted(host_cpu)[len(host_cpu) // 2] / 1e6,
       "host_ms": sorted(host)[len(host) // 2] * 1e3, "step_ms": step_ms, "cpu_ms": cpu_ms, "warmup_s": warm_s, "loss": last}}
if xla:
    c1 = {{n: met.counter_value(n) for n in met.counter_names()}}
    moved = {{n: v - c0.get(n, 0) for n, v in c1.items() if n.startswith(("xla::", "aten::")) and v != c0.get(n, 0)}}
    out["ops_traced_per_step"] = sum(moved.values()) / steps
    out["donated_buffers_per_step"] = ((c1.get("DynamoDonatedBuffers", 0) or 0) - (c0.get("DynamoDonatedBuffers", 0) or 0)) / steps
    moved_glue = {{n: v / steps for n, v in moved.items()}}
    out["ops_per_step_by_name"] = moved_glue
    out["compiles_in_loop"] = (c1.get("UncachedCompile", 0) or 0) - (c0.get("UncachedCompile", 0) or 0)
_maps = open("/proc/self/maps").read()
out["allocator"] = next((n for n in ("mimalloc", "jemalloc", "tcmalloc") if "lib" + n in _maps), "glibc")
print("RESULT " + json.dumps(out))
"""


def _allocator_env(env):
    """env with the allocator its TORCH_XLA_ALLOCATOR names preloaded (torch_xla/_allocator.py,
    loaded from the file so that this process does not import torch_xla)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_alloc", os.path.join(REPO, "torch_xla", "_allocator.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.child_env(env)


def run_child(mode, steps, warmup, layers, batch, block, env_extra=None, allocator="glibc"):
    code = CHILD.format(examples=os.path.join(REPO, "examples"), mode=mode, steps=steps, warmup=warmup,
                        layers=layers, batch=batch, block=block)
    env = dict(os.environ, **(env_extra or {}))
    env["TORCH_XLA_ALLOCATOR"] = allocator
    if allocator.lower() not in ("glibc", "0", "off", "none", "false"):
        env = _allocator_env(env)
    else:  # the C library's malloc, even if the caller's environment preloads another
        env["LD_PRELOAD"] = ":".join(p for p in env.get("LD_PRELOAD", "").split(":")
                                     if p and "malloc" not in os.path.basename(p))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{mode} failed:\n{r.stderr[-3000:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--layers", type=int, default=2, help="decoder blocks (host cost vs op count)")
    ap.add_argument("--xla-only", action="store_true", help="only the XLA:CPU configurations")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block", type=int, default=64, help="tokens per sequence (at most 64)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the configurations this many times, interleaved; report the median and range")
    ap.add_argument("--func", action="store_true",
                    help="also the whole step as one openxla_eval graph (torch.func.grad_and_value + AdamW written out)")
    ap.add_argument("--ab", action="store_true",
                    help="also openxla with the CPU part run eagerly (XLA_DYNAMO_PACK_CPU_SCALARS=0)")
    ap.add_argument("--ab-donate", action="store_true",
                    help="also openxla with weights not donated and kept as functionalization aliases "
                         "(XLA_DYNAMO_DONATE_WEIGHTS=0, the behaviour before)")
    ap.add_argument("--only", default="", help="run only the configurations whose label contains this text")
    ap.add_argument("--allocator", default="glibc",
                    help="host allocator(s) of the child processes, comma-separated (glibc, mimalloc, jemalloc, "
                         "tcmalloc, auto): each configuration runs with each, interleaved in fresh processes "
                         "(e.g. --allocator glibc,mimalloc)")
    a = ap.parse_args()
    allocators = [x.strip() for x in a.allocator.split(",") if x.strip()]
    configs = [("lazy", "lazy (XLA:CPU)", None),
               ("lazy", "lazy, no donation (XLA:CPU)", {"XLA_ENABLE_PARAM_ALIASING": "0"}),
               ("openxla", "torch.compile openxla (XLA:CPU)", None),
               ("eager", "eager CPU", None)]
    if not a.no_inductor:
        configs.insert(3, ("inductor", "torch.compile inductor (CPU)", None))
    if a.ab:
        configs.insert(3, ("openxla", "openxla, CPU part eager (XLA:CPU)", {"XLA_DYNAMO_PACK_CPU_SCALARS": "0"}))
    if a.ab_donate:
        configs.insert(3, ("openxla", "openxla, weights not donated (XLA:CPU)", {"XLA_DYNAMO_DONATE_WEIGHTS": "0"}))
    if a.func:
        configs.insert(3, ("openxla_func", "one graph: torch.func + openxla_eval", None))
    if a.xla_only:
        configs = [c for c in configs if c[0] in ("lazy", "openxla", "openxla_func")]
    if a.only:
        configs = [c for c in configs if a.only in c[1]]
    if len(allocators) > 1 or allocators[0] != "glibc":
        configs = [(mode, f"{label} [{alloc}]", env, alloc) for alloc in allocators for mode, label, env in configs]
    else:
        configs = [(mode, label, env, "glibc") for mode, label, env in configs]
    runs = {label: [] for _, label, _, _ in configs}
    for _ in range(a.repeat):
        for mode, label, env, alloc in configs:
            try:
                runs[label].append(run_child(mode, a.steps, a.warmup, a.layers, a.batch, a.block, env, alloc))
            except RuntimeError as e:
                runs[label].append({"error": str(e).splitlines()[-1]})
    results = {}
    for label, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            results[label] = rs[-1]
            continue
        r = dict(ok[len(ok) // 2])
        for k in ("host_idle_ms", "host_cpu_ms", "host_ms", "step_ms", "cpu_ms"):
            v = sorted(x[k] for x in ok)
            r[k] = v[len(v) // 2]
            r[k + "_range"] = [v[0], v[-1]]
        results[label] = r
    print(f"{'configuration':36s} {'host ms (idle)':>15s} {'host cpu ms':>12s} {'host ms (pipe)':>15s} {'step ms':>9s} "
          f"{'cpu ms':>8s} {'warm-up s':>10s} {'ops/step':>9s}")
    for label, r in results.items():
        if "error" in r:
            print(f"{label:36s} failed: {r['error']}")
            continue
        ops = r.get("ops_traced_per_step")
        print(f"{label:36s} {r['host_idle_ms']:15.2f} {r['host_cpu_ms']:12.2f} {r['host_ms']:15.2f} {r['step_ms']:9.2f} {r['cpu_ms']:8.2f} {r['warmup_s']:10.1f} "
              f"{'' if ops is None else f'{ops:9.0f}'}")
        if a.repeat > 1:
            rng = "  ".join(f"{r[k + '_range'][0]:.2f}-{r[k + '_range'][1]:.2f}" for k in ("host_idle_ms", "host_cpu_ms", "host_ms", "step_ms", "cpu_ms"))
            print(f"{'':36s} range over {a.repeat} runs: {rng}")
    for sfx, cname in [(s_, c_) for s_ in ([f" [{x}]" for x in allocators] if len(allocators) > 1 or allocators[0] != "glibc" else [""])
                       for c_ in ("torch.compile openxla (XLA:CPU)", "one graph: torch.func + openxla_eval")]:
        comp = results.get(cname + sfx)
        for lname in ("lazy (XLA:CPU)", "lazy, no donation (XLA:CPU)"):
            lazy = results.get(lname + sfx)
            if lazy and comp and "error" not in lazy and "error" not in comp:
                print(f"host time (idle device), {lname + sfx} / {cname}: {lazy['host_idle_ms'] / comp['host_idle_ms']:.1f}x; "
                      f"host cpu time: {lazy['host_cpu_ms'] / comp['host_cpu_ms']:.1f}x; "
                      f"step time {cname} / lazy: {comp['step_ms'] / lazy['step_ms']:.2f}")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
