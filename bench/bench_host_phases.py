"""Host time per phase of the GPT-2-style training step (issue #12): calling-thread CPU ms of the
forward, backward, optimizer step and sync, and minor page faults, median of N steps after 10
warm-up steps, with the device idle before each step (xm.wait_device_ops outside the timed part).

    N=150 .venv/bin/python bench/bench_host_phases.py
    LD_PRELOAD=.venv/lib/python3.11/site-packages/cmeel.prefix/lib/libmimalloc.so N=150 .venv/bin/python bench/bench_host_phases.py

Fresh processes vary a lot on a shared 2-core machine: compare builds or allocators in
alternating runs and report the medians of several rounds.
"""
import os, sys, time, statistics, resource
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import torch, torch_xla
import torch_xla.core.xla_model as xm
from models import GPT2
torch.manual_seed(0)
dev = torch_xla.device()
m = GPT2(vocab=256, block=64, d=128, heads=4, layers=2).to(dev)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=True)
x = torch.randint(0, 256, (16, 64)).to(dev)
N = int(os.environ.get("N", "60"))
ph = {k: [] for k in ("fwd", "bwd", "opt", "sync", "step", "minflt")}
T = time.thread_time
for i in range(N + 10):
    xm.wait_device_ops()
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = T(); opt.zero_grad(set_to_none=True); _, l = m(x, x); t1 = T()
    l.backward(); t2 = T(); opt.step(); t3 = T(); torch_xla.sync(); t4 = T()
    r1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    if i >= 10:
        for k, v in zip(("fwd", "bwd", "opt", "sync", "step"), (t1-t0, t2-t1, t3-t2, t4-t3, t4-t0)):
            ph[k].append(v * 1e3)
        ph["minflt"].append(r1 - r0)
print(" ".join(f"{k}={statistics.median(v):.2f}" for k, v in ph.items()), "loss", float(l.detach()))
