"""GPU benchmark (issue #14): a GPT-2-small-shaped decoder and a ResNet-50-shaped CNN, trained with
the same model code on four backends:

  xla      torch_xla through us (PJRT_DEVICE as set: CUDA on a GPU machine, CPU for a dry run)
  eager    PyTorch eager on CUDA (on the CPU when CUDA is not available)
  compile  torch.compile(mode="max-autotune-no-cudagraphs") on CUDA (on the CPU when no CUDA)
  openxla  torch.compile(step, backend="openxla") through us: the whole step (forward, backward,
           optimizer) captured by Dynamo once, no lazy tracing per step (issue #13)

Per (model, backend): steady step time (ms), tokens/s or images/s, time of the first step (tracing +
compilation + run) and compile time (first step minus a steady step), peak device memory, and
host time per step (the Python time of forward+backward+optimizer before the sync/synchronize: for a
lazy-tensor backend the tracing cost, for eager the launch cost). Each configuration runs in its own
process under a time limit, so a hang or a long autotune cannot eat the whole budget: a configuration
that runs out of time is reported with status "timeout".

Fairness: the same batch, sequence length and dtype on every backend. Default dtype bf16 *weights*
(not autocast), AdamW(lr=1e-4) for GPT-2 and SGD+momentum for ResNet-50 (as each is usually trained).
On CUDA, AdamW/SGD use PyTorch's fastest eager form (fused=True) for eager and compile; on XLA the
optimizer is traced into the step graph (foreach form).

Usage:
  python bench/bench_gpu.py [--tiny] [--out FILE.json] [--budget-s 240] [--steps 10]
                            [--models gpt2,resnet50] [--backends xla,eager,openxla,compile]
  --tiny: small shapes for a CPU dry run (PJRT_DEVICE=CPU). Without it the shapes are GPT-2 small
  (12 layers, d=768, 12 heads, seq 1024, vocab 50257, batch 16) and ResNet-50 (224x224, batch 128).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULT_TAG = "BENCH_GPU_RESULT "

# ----------------------------------------------------------------------------------------- shapes
SHAPES = {
    False: {  # full size
        "gpt2": dict(vocab=50257, block=1024, d=768, heads=12, layers=12, batch=16),
        "resnet50": dict(layers=(3, 4, 6, 3), width=64, classes=1000, image=224, batch=128),
    },
    True: {  # --tiny
        "gpt2": dict(vocab=256, block=64, d=64, heads=4, layers=2, batch=2),
        "resnet50": dict(layers=(1, 1, 1, 1), width=8, classes=10, image=32, batch=4),
    },
}


# ---------------------------------------------------------------------------------------- models
def build_model(name: str, shape: dict):
    import torch.nn as nn
    import torch.nn.functional as F

    if name == "gpt2":
        sys.path.insert(0, os.path.join(REPO, "examples"))
        import models

        return models.GPT2(vocab=shape["vocab"], block=shape["block"], d=shape["d"], heads=shape["heads"],
                           layers=shape["layers"])

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * self.expansion
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.short = None
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)), inplace=True)
            out = F.relu(self.bn2(self.conv2(out)), inplace=True)
            out = self.bn3(self.conv3(out))
            out += x if self.short is None else self.short(x)
            return out.relu_()

    class ResNet50(nn.Module):
        def __init__(self, layers, width, classes):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width),
                                      nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1))
            blocks, cin = [], width
            for i, n in enumerate(layers):
                w = width * 2 ** i
                for j in range(n):
                    blocks.append(Bottleneck(cin, w, 2 if (j == 0 and i > 0) else 1))
                    cin = w * Bottleneck.expansion
            self.blocks = nn.Sequential(*blocks)
            self.head = nn.Linear(cin, classes)

        def forward(self, x):
            x = self.blocks(self.stem(x))
            return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))

    return ResNet50(shape["layers"], shape["width"], shape["classes"])


# ----------------------------------------------------------------------------------------- child
def child(cfg: dict) -> dict:
    """Runs one (model, backend) configuration in this process and returns its figures."""
    import resource

    import torch
    import torch.nn.functional as F

    model_name, backend, on_cuda = cfg["model"], cfg["backend"], cfg["cuda"]
    shape = SHAPES[cfg["tiny"]][model_name]
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32, "f16": torch.float16}[cfg["dtype"]]
    out = {"model": model_name, "backend": backend, "dtype": cfg["dtype"], "batch": shape["batch"]}

    is_xla = backend in ("xla", "openxla")
    if is_xla:
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.debug.metrics as met

        device = torch_xla.device()
        out["device"] = "xla:" + xm.xla_device_hw(device)
    else:
        device = torch.device("cuda" if on_cuda else "cpu")
        out["device"] = torch.cuda.get_device_name(0) if on_cuda else "cpu"

    torch.manual_seed(0)
    model = build_model(model_name, shape).to(dtype=dtype).to(device)
    if model_name == "gpt2":
        model.tie_weights()  # .to(xla) unties shared weights (see examples/models.py)
    model.train()
    fused = not is_xla and on_cuda
    if model_name == "gpt2":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if fused else {"foreach": True}))
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                              **({"fused": True} if fused else {"foreach": True}))
    fwd = model
    if backend == "compile":
        fwd = torch.compile(model, mode=cfg["compile_mode"])

    g = torch.Generator().manual_seed(1)
    b = shape["batch"]
    if model_name == "gpt2":
        t = shape["block"]
        x = torch.randint(0, shape["vocab"], (b, t), generator=g).to(device)
        y = torch.roll(x, -1, 1)
        items_per_step, unit = b * t, "tokens/s"

        def loss_fn():
            return fwd(x, y)[1]
    else:
        s = shape["image"]
        x = torch.randn(b, 3, s, s, generator=g).to(dtype=dtype).to(device)
        y = torch.randint(0, shape["classes"], (b,), generator=g).to(device)
        items_per_step, unit = b, "images/s"

        def loss_fn():
            return F.cross_entropy(fwd(x), y)

    def wait():
        if is_xla:
            xm.wait_device_ops()
        elif on_cuda:
            torch.cuda.synchronize()

    host_times = []

    def inner():
        loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    run_step = torch.compile(inner, backend="openxla") if backend == "openxla" else inner

    def step():
        t0 = time.perf_counter()
        loss = run_step()
        host_times.append(time.perf_counter() - t0)
        if backend == "xla":
            torch_xla.sync()
        return loss

    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    wait()
    t0 = time.perf_counter()
    loss = step()
    wait()
    out["first_step_s"] = time.perf_counter() - t0
    out["first_loss"] = float(loss.float().item())
    for _ in range(cfg["warmup"]):
        step()
    wait()
    warmup_s = time.perf_counter() - t0  # first step + warm-up steps (XLA compiles each new graph here)
    host_times.clear()
    n = cfg["steps"]
    t0 = time.perf_counter()
    for _ in range(n):
        loss = step()
    wait()
    dt = (time.perf_counter() - t0) / n
    out["last_loss"] = float(loss.float().item())
    out["step_ms"] = dt * 1000
    out["throughput"] = items_per_step / dt
    out["unit"] = unit
    out["compile_s"] = max(0.0, out["first_step_s"] - dt)
    out["host_ms_per_step"] = 1000 * sorted(host_times)[len(host_times) // 2]
    out["warmup_s"] = warmup_s
    if is_xla:
        data = met.metric_data("CompileTime")
        if data:  # (count, total ns, samples): XLA's compile time, every graph of the warm-up
            out["xla_compile_total_s"] = data[1] / 1e9
        out["uncached_compiles"] = int(met.counter_value("UncachedCompile") or 0)
    if is_xla and on_cuda:
        info = xm.get_memory_info(device)
        out["peak_mem_bytes"] = int(info.get("peak_bytes_used", 0))
        out["peak_mem_source"] = "PJRT memory stats (xm.get_memory_info)"
    if is_xla:
        out["fallback_ops"] = sorted(nm for nm in met.counter_names()
                                     if nm.startswith("aten::") and nm != "aten::_local_scalar_dense")
    elif on_cuda:
        out["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated())
        out["peak_mem_source"] = "torch.cuda.max_memory_allocated"
    if not on_cuda:  # every backend on the host: the process's own peak (XLA:CPU has no device stats)
        out["peak_mem_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        out["peak_mem_source"] = "process peak RSS"
    out["status"] = "ok"
    return out


# ---------------------------------------------------------------------------------------- parent
def run_config(cfg: dict, limit_s: float) -> dict:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    base = {"model": cfg["model"], "backend": cfg["backend"]}
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(cfg)], env=env,
                           capture_output=True, text=True, timeout=limit_s, cwd=REPO)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return {**base, "status": "timeout", "limit_s": round(limit_s, 1), "stderr_tail": tail[-1500:]}
    wall = time.perf_counter() - t0
    for line in p.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            res = json.loads(line[len(RESULT_TAG):])
            res["wall_s"] = round(wall, 2)
            return res
    return {**base, "status": "error", "returncode": p.returncode, "wall_s": round(wall, 2),
            "stderr_tail": (p.stderr or "")[-3000:]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="small shapes (CPU dry run)")
    ap.add_argument("--out", default=None, help="write the JSON here too")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 10; 3 with --tiny)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32", "f16"])
    ap.add_argument("--models", default="gpt2,resnet50")
    ap.add_argument("--backends", default="xla,eager,openxla,compile")
    ap.add_argument("--compile-mode", default="max-autotune-no-cudagraphs")
    ap.add_argument("--budget-s", type=float, default=300.0, help="wall-clock budget for all configurations")
    ap.add_argument("--config-cap-s", type=float, default=150.0, help="most seconds one configuration may take")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child is not None:
        res = child(json.loads(args.child))
        print(RESULT_TAG + json.dumps(res), flush=True)
        return res

    import torch  # parent: only to learn whether CUDA is there (no tensors made here)

    on_cuda = bool(torch.cuda.is_available())
    steps = args.steps if args.steps is not None else (3 if args.tiny else 10)
    models = [m for m in args.models.split(",") if m]
    backends = [b for b in args.backends.split(",") if b]
    for m in models:
        if m not in SHAPES[False]:
            ap.error(f"unknown model {m!r}; choose from {', '.join(SHAPES[False])}")
    for b in backends:
        if b not in ("xla", "eager", "compile", "openxla"):
            ap.error(f"unknown backend {b!r}; choose from xla, eager, openxla, compile")
    meta = {"torch": torch.__version__, "python": sys.version.split()[0], "cuda_available": on_cuda,
            "device": torch.cuda.get_device_name(0) if on_cuda else "cpu",
            "pjrt_device": os.environ.get("PJRT_DEVICE", "CPU"), "tiny": args.tiny, "dtype": args.dtype,
            "steps": steps, "warmup": args.warmup, "compile_mode": args.compile_mode,
            "shapes": {m: SHAPES[args.tiny][m] for m in models},
            "command": " ".join([os.path.basename(sys.executable), "bench/bench_gpu.py"] + list(argv or sys.argv[1:]))}
    deadline = time.perf_counter() + args.budget_s
    results = []
    # Order: xla (what we measure) and eager for every model first; torch.compile (max-autotune can
    # take minutes) last, so a short budget still gets the first figures of every model.
    order = [(m, b) for m in models for b in backends if b not in ("compile", "openxla")]
    order += [(m, b) for b in ("openxla", "compile") for m in models if b in backends]
    for m, b in order:
        if True:
            left = deadline - time.perf_counter()
            if left < 5:
                results.append({"model": m, "backend": b, "status": "skipped (bench budget spent)"})
                continue
            cfg = {"model": m, "backend": b, "cuda": on_cuda, "tiny": args.tiny, "dtype": args.dtype,
                   "steps": steps, "warmup": args.warmup, "compile_mode": args.compile_mode}
            res = run_config(cfg, min(args.config_cap_s, left))
            results.append(res)
            brief = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()
                     if k in ("model", "backend", "status", "step_ms", "throughput", "first_step_s",
                              "host_ms_per_step", "peak_mem_bytes")}
            print(json.dumps(brief), file=sys.stderr, flush=True)
    ratios = {}
    for m in models:
        by = {r["backend"]: r for r in results if r["model"] == m and r.get("status") == "ok"}
        if "xla" in by:
            for ref in ("eager", "compile"):
                if ref in by:
                    ratios[f"{m}: xla step time / {ref}"] = round(by["xla"]["step_ms"] / by[ref]["step_ms"], 3)
            if "openxla" in by:
                ratios[f"{m}: openxla step time / xla"] = round(by["openxla"]["step_ms"] / by["xla"]["step_ms"], 3)
                ratios[f"{m}: openxla host ms / xla"] = round(
                    by["openxla"]["host_ms_per_step"] / max(by["xla"]["host_ms_per_step"], 1e-9), 3)
    report = {"meta": meta, "results": results, "ratios": ratios}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return report


if __name__ == "__main__":
    main()
