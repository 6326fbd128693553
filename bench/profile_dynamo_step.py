"""Where the host CPU time of a torch.compile(backend="openxla") training step goes.

GPT-2-style model (examples/models.py, d=128, 2 layers), batch 2x8 (the device's compute is
negligible), AdamW foreach, `loss.backward(); opt.step()` inside the compiled step (three graphs:
forward, backward, optimizer). The step runs under cProfile with the calling thread's CPU clock
(the backward runs on the calling thread: torch.autograd.set_multithreading_enabled(False)), idle
device before each step; each function's own time is put in a bucket by where it lives:

- ours, C++: torch_xla._C._dynamo_* (bind inputs, launch, wrap results, write back)
- ours, Python: torch_xla/ (the compiled callable's Python around it)
- Dynamo: torch/_dynamo/ (frames, guards evaluated in C++ on entry are charged to the caller)
- AOT Autograd: torch/_functorch/ (runtime wrappers, the autograd.Function of the graph)
- autograd engine: torch/autograd/, Engine.run_backward, ones_like (backward's seed)
- optimizer: torch/optim/ (Optimizer.step's wrappers, zero_grad)
- other: the rest (torch/*, builtins)

cProfile's own overhead inflates the Python buckets; the per-call C++ time of our three graphs is
also measured without the profiler (median thread CPU time per call).

Usage: .venv/bin/python bench/profile_dynamo_step.py [--steps 300] [--top 0]
"""
import argparse
import cProfile
import os
import pstats
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

import torch  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla._C as C  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402
import models  # noqa: E402


def bucket(key):
    filename, _, name = key
    if filename == "~":
        if "_dynamo_" in name and "torch_xla" in name:
            return "ours, C++ (_C._dynamo_*)"
        if "run_backward" in name or "ones_like" in name:
            return "autograd engine"
        if "set_eval_frame" in name:
            return "Dynamo"
        if "_wait_device_ops" in name:
            return None
        return "other"
    if "/torch_xla/" in filename:
        return "ours, Python (torch_xla/)"
    for part, b in (("/torch/_dynamo/", "Dynamo"), ("/torch/_functorch/", "AOT Autograd"),
                    ("/torch/autograd/", "autograd engine"), ("/torch/optim/", "optimizer")):
        if part in filename:
            return b
    if filename.startswith("<") or filename == __file__ or "codegen" in filename:
        return "AOT Autograd" if "codegen" in filename else "step function (user code)"
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--top", type=int, default=0, help="also print the top N functions by own time")
    a = ap.parse_args()
    dev = torch_xla.device()
    torch.manual_seed(0)
    model = models.GPT2(vocab=256, block=64, d=128, heads=4, layers=2).to(dev)
    model.tie_weights()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randint(0, 256, (2, 8)).to(dev)
    y = torch.roll(x, -1, 1).to(dev)

    def step(x, y):
        loss = model(x, y)[1]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    f = torch.compile(step, backend="openxla")
    torch.autograd.set_multithreading_enabled(False)
    for _ in range(6):
        loss = f(x, y)
    loss.item()

    # Per graph, without the profiler.
    orig = C._dynamo_run
    per = {}

    def timed(h, args):
        t0 = time.thread_time_ns()
        r = orig(h, args)
        per.setdefault(h.name, []).append(time.thread_time_ns() - t0)
        return r

    C._dynamo_run = timed
    tot = []
    for _ in range(a.steps):
        xm.wait_device_ops()
        t0 = time.thread_time_ns()
        f(x, y)
        tot.append(time.thread_time_ns() - t0)
    C._dynamo_run = orig
    med = lambda v: sorted(v)[len(v) // 2] / 1e6  # noqa: E731
    print(f"step: {med(tot):.3f} ms host CPU (median of {a.steps}, no profiler)")
    for name, v in per.items():
        print(f"  _C._dynamo_run {name}: {med(v):.3f} ms")
    print(f"  three graph calls together: {sum(med(v) for v in per.values()):.3f} ms")

    pr = cProfile.Profile(time.thread_time)
    pr.enable()
    for _ in range(a.steps):
        xm.wait_device_ops()
        f(x, y)
    pr.disable()
    st = pstats.Stats(pr)
    buckets = {}
    for key, (cc, nc, tt, ct, callers) in st.stats.items():
        b = bucket(key)
        if b is not None:
            buckets[b] = buckets.get(b, 0.0) + tt
    total = sum(buckets.values())
    print(f"under cProfile: {total / a.steps * 1e3:.3f} ms per step (profiler overhead included)")
    for b, v in sorted(buckets.items(), key=lambda kv: -kv[1]):
        print(f"  {b:32s} {v / a.steps * 1e3:7.3f} ms  {100 * v / total:5.1f}%")
    others = sorted(((tt, key) for key, (cc, nc, tt, ct, callers) in st.stats.items() if bucket(key) == "other"),
                    reverse=True)[:6]
    print("  largest in other: " + "; ".join(f"{k[2] if k[0] == '~' else os.path.basename(k[0]) + ':' + k[2]} "
                                            f"{tt / a.steps * 1e3:.3f}" for tt, k in others))
    if a.top:
        st.sort_stats("tottime").print_stats(a.top)


if __name__ == "__main__":
    main()
