"""Step time and peak memory of the GPT-2-style and ResNet-style models (examples/models.py) on
XLA:CPU against eager CPU, in one run. Each configuration runs in a fresh process so its peak RSS
(resource.getrusage ru_maxrss of the child) is its own.

Usage: .venv/bin/python bench/bench_models.py [--steps 20] [--warmup 5]
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

CHILD = r"""
import json, sys, time, resource
sys.path.insert(0, {examples!r})
import torch, torch.nn.functional as F
device_kind, model_name, steps, warmup = {device!r}, {model!r}, {steps}, {warmup}
if device_kind == "xla":
    import torch_xla, torch_xla.debug.metrics as met
    device = torch_xla.device()
else:
    device = torch.device("cpu")
import models
torch.manual_seed(0)
if model_name == "gpt2":
    model = models.GPT2(vocab=256, block=64, d=128, heads=4, layers=2).to(device)
    model.tie_weights()
    x = torch.randint(0, 256, (16, 64)); y = torch.roll(x, -1, 1)
    loss_fn = lambda: model(x.to(device), y.to(device))[1]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
else:
    model = models.ResNet(width=32).to(device)
    x = torch.randn(32, 3, 32, 32); y = torch.randint(0, 10, (32,))
    loss_fn = lambda: F.cross_entropy(model(x.to(device)), y.to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
def step():
    loss = loss_fn(); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    if device_kind == "xla":
        torch_xla.sync()
    return loss
for _ in range(warmup):
    step()
if device_kind == "xla":
    import torch_xla.core.xla_model as xm; xm.wait_device_ops()
t0 = time.perf_counter()
for _ in range(steps):
    loss = step()
loss.item()
dt = (time.perf_counter() - t0) / steps
out = {{"ms": dt * 1000, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}
if device_kind == "xla":
    out["compiles"] = met.counter_value("UncachedCompile") or 0
    out["fallbacks"] = [n for n in met.counter_names() if n.startswith("aten::") and n != "aten::_local_scalar_dense"]
print("RESULT " + json.dumps(out))
"""


def run(device, model, steps, warmup):
    code = CHILD.format(examples=os.path.join(REPO, "examples"), device=device, model=model, steps=steps, warmup=warmup)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    if p.returncode != 0:
        sys.exit(p.stderr[-3000:])
    return json.loads([l for l in p.stdout.splitlines() if l.startswith("RESULT ")][-1][7:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    print(f"{'model':8s} {'device':6s} {'ms/step':>9s} {'peak RSS':>10s} {'compiles':>9s}  fallbacks")
    for model in ("gpt2", "resnet"):
        res = {d: run(d, model, args.steps, args.warmup) for d in ("cpu", "xla")}
        for d, r in res.items():
            print(f"{model:8s} {d:6s} {r['ms']:9.2f} {r['peak_mb']:8.0f}MB {str(r.get('compiles', '-')):>9s}  "
                  f"{r.get('fallbacks', '-')}")
        print(f"{model:8s} ratio  time xla/cpu = {res['xla']['ms'] / res['cpu']['ms']:.2f}x, "
              f"peak memory xla/cpu = {res['xla']['peak_mb'] / res['cpu']['peak_mb']:.2f}x")


if __name__ == "__main__":
    main()
