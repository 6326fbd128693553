"""Issue #12 item 3 (leaner graphs): the optimized HLO of the same MLP training step, ours vs JAX's,
op counts side by side.

Each configuration runs in a fresh process with XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_as_text":
XLA (the PJRT plugin for ours, jaxlib's XLA for JAX) writes the module after its optimization
passes; we count the instructions of its entry computation and of the fusions it calls, by opcode.

Step: MLP 784-1024-1024-10, batch 128, cross entropy, SGD momentum 0.9 (parameters and momentum
buffers updated in place: donated by both). Configurations:
- ours (XLA dots): torch_xla lazy step + torch_xla.sync(), the default (an MLP has no convolution);
- ours (host dots): TORCH_XLA_HOST_KERNELS=all (dots are `custom-call`s to ATen's GEMM);
- jax: jax.jit of the same math (jax.grad, optax-free SGD momentum), donate_argnums.

Usage: .venv/bin/python bench/bench_hlo_ops.py [--keep DIR]
"""
import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

OURS = r"""
import torch, torch.nn as nn, torch.nn.functional as F, torch_xla
d = torch_xla.device()
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(d)
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(128, 784).to(d); y = torch.randint(0, 10, (128,)).to(d)
for _ in range(3):
    loss = F.cross_entropy(m(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    torch_xla.sync()
loss.item()
"""

JAX = r"""
import sys
sys.path.insert(0, {bench!r})
from jax_mlp_step import make
f, ps, bufs, x, y = make()
for _ in range(3):
    ps, bufs, loss = f(ps, bufs, x, y)
float(loss)
""".format(bench=HERE)

CONFIGS = [
    ("ours (XLA dots)", OURS, {"TORCH_XLA_HOST_KERNELS": "0"}, "SyncTensorsGraph"),
    ("ours (host dots)", OURS, {"TORCH_XLA_HOST_KERNELS": "all"}, "SyncTensorsGraph"),
    ("jax", JAX, {"JAX_PLATFORMS": "cpu"}, "jit_step"),
]

INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*.+?\s([a-z][a-z0-9\-]*)\(", re.M)


def parse_computations(text):
    """{name: [opcodes]} and the entry computation's name."""
    comps, entry, cur = {}, None, None
    for line in text.splitlines():
        m = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if m and not line.startswith(" "):
            cur = m.group(2)
            comps[cur] = []
            if m.group(1):
                entry = cur
            continue
        if cur is None or line.strip() in ("}", ""):
            continue
        mi = INSTR.match(line)
        if mi:
            comps[cur].append((mi.group(1), line))
    return comps, entry


def count_ops(text):
    comps, entry = parse_computations(text)
    top = collections.Counter(op for op, _ in comps.get(entry, []))
    inner = collections.Counter()
    for op, line in comps.get(entry, []):
        if op == "fusion":
            m = re.search(r"calls=%?([\w.\-]+)", line)
            if m:
                inner.update(o for o, _ in comps.get(m.group(1), []))
    return top, inner


def step_module(folder, name):
    """The training step's module: the last (steady-state) one named `name`."""
    files = sorted(glob.glob(os.path.join(folder, f"module_*.{name}.*after_optimizations.txt")))
    return files[-1] if files else None


def run(name, code, env, module, keep):
    if keep:
        os.makedirs(keep, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="hlo_", dir=keep)
    e = dict(os.environ, **env)
    e["XLA_FLAGS"] = (e.get("XLA_FLAGS", "") + f" --xla_dump_to={folder} --xla_dump_hlo_as_text").strip()
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        print(f"{name}: failed\n{r.stderr[-2000:]}")
        return None
    path = step_module(folder, module)
    if path is None:
        print(f"{name}: no optimized module dumped in {folder}")
        return None
    return count_ops(open(path).read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", help="folder for the dumps (default: temporary)")
    args = ap.parse_args()
    results = {}
    for name, code, env, module in CONFIGS:
        r = run(name, code, env, module, args.keep)
        if r:
            results[name] = r
    if not results:
        return
    interesting = ["fusion", "custom-call", "dot", "convolution", "copy", "transpose", "convert", "broadcast",
                   "reduce", "parameter", "tuple", "get-tuple-element", "bitcast"]
    names = list(results)
    print("\nOptimized HLO of the MLP training step: instructions of the entry computation "
          "(in fusions: instructions inside the fusions it calls)")
    print(f"{'opcode':<22}" + "".join(f"{n:>24}" for n in names))
    ops = sorted(set().union(*[set(t) | set(i) for t, i in results.values()]),
                 key=lambda o: (o not in interesting, interesting.index(o) if o in interesting else 0, o))
    for op in ops:
        cells = []
        for n in names:
            top, inner = results[n]
            cells.append(f"{top.get(op, 0)} (in fusions {inner.get(op, 0)})")
        print(f"{op:<22}" + "".join(f"{c:>24}" for c in cells))
    print(f"{'total (entry)':<22}" + "".join(f"{sum(results[n][0].values()):>24}" for n in names))


if __name__ == "__main__":
    main()
