"""Helpers for scripts/gpu_check.sh (kept out of the shell script so they can be read and tested).

  python scripts/gpu_check_util.py opinfo-sample N     prints N test ids of tests/test_ops_opinfo.py, spread
                                                       evenly over the collected test_op cases (one a line)
  python scripts/gpu_check_util.py plugin-check FILE   starts the runtime on PJRT_DEVICE, checks the device kind,
                                                       memory info and bf16/f16/f32 results against eager CPU,
                                                       and writes the findings as JSON to FILE
  python scripts/gpu_check_util.py summary OUTDIR [WORKDIR]
                                                       merges WORKDIR/stages.tsv, WORKDIR/plugin_check.json,
                                                       WORKDIR/tests_*.log and OUTDIR/bench_gpu.json into
                                                       OUTDIR/gpu_check.json (WORKDIR defaults to OUTDIR)
"""
from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def opinfo_sample(n: int) -> list[str]:
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                        "tests/test_ops_opinfo.py"], cwd=REPO, capture_output=True, text=True)
    ids = [ln.strip() for ln in p.stdout.splitlines() if "::test_op[" in ln]
    if not ids:
        sys.stderr.write(p.stdout[-2000:] + p.stderr[-2000:])
        raise SystemExit("opinfo-sample: no test_op cases collected")
    if n >= len(ids):
        return ids
    step = len(ids) / n
    return [ids[int(i * step)] for i in range(n)]


def plugin_check(path: str) -> dict:
    t0 = time.perf_counter()
    out: dict = {"pjrt_device": os.environ.get("PJRT_DEVICE", "CPU")}
    try:
        import torch
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        dev = torch_xla.device()
        out["start_s"] = round(time.perf_counter() - t0, 3)
        out["device_hw"] = xm.xla_device_hw(dev)
        out["device_type"] = xr.device_type()
        out["device_count"] = torch_xla.device_count()
        out["memory_info"] = xm.get_memory_info(dev)
        checks = {}
        g = torch.Generator().manual_seed(0)
        for name, dt, tol in (("f32", torch.float32, 1e-4), ("bf16", torch.bfloat16, 2e-2), ("f16", torch.float16, 2e-3)):
            a = torch.randn(64, 64, generator=g).to(dt)
            b = torch.randn(64, 64, generator=g).to(dt)
            ref = torch.nn.functional.gelu(a @ b + 1).sum(0)
            got = torch.nn.functional.gelu(a.to(dev) @ b.to(dev) + 1).sum(0).cpu()
            err = float(((got.float() - ref.float()).abs() / (ref.float().abs() + 1)).max())
            checks[name] = {"dtype_ok": got.dtype == dt, "max_rel_err": err, "ok": got.dtype == dt and err < tol * 64}
        out["dtype_checks"] = checks
        out["ok"] = all(c["ok"] for c in checks.values())
        try:  # informational: does not change "ok"
            out["precision_probe"] = _precision_probe(dev)
        except Exception as e:
            out["precision_probe"] = {"error": f"{type(e).__name__}: {e}"}
    except Exception as e:  # the error is the finding
        out["ok"] = False
        out["error"] = f"{type(e).__name__}: {e}"
    out["wall_s"] = round(time.perf_counter() - t0, 3)
    with open(path, "w") as f:
        json.dump(out, f, indent=2, default=str)
    print(json.dumps(out, indent=2, default=str))
    return out


def _precision_probe(dev) -> dict:
    """f32 matmul/conv error against float64 at each mat_mul_precision, and matmul speed (f32, bf16):
    tells whether XLA uses TF32 at 'default' on this device (eager CUDA's matmuls do not by default)."""
    import torch
    import torch.nn.functional as F
    import torch_xla
    import torch_xla.backends as xb
    import torch_xla.core.xla_model as xm

    out: dict = {}
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(256, 2048, generator=g), torch.randn(2048, 256, generator=g)
    ref, scale = a.double() @ b.double(), a.double().abs() @ b.double().abs()
    x, w = torch.randn(4, 32, 16, 16, generator=g), torch.randn(32, 32, 3, 3, generator=g)
    cref = F.conv2d(x.double(), w.double(), padding=1)
    cscale = F.conv2d(x.double().abs(), w.double().abs(), padding=1)
    ad, bd, xd, wd = a.to(dev), b.to(dev), x.to(dev), w.to(dev)
    n = 4096 if torch.cuda.is_available() else 256
    big = {dt: (torch.randn(n, n, generator=g).to(dt).to(dev), torch.randn(n, n, generator=g).to(dt).to(dev))
           for dt in (torch.float32, torch.bfloat16)}
    old = xb.get_mat_mul_precision()
    try:
        for p in ("unset", "default", "high", "highest"):  # unset: the platform's choice (first: nothing set yet)
            if p != "unset":
                xb.set_mat_mul_precision(p)
            r = {"matmul_f32_err": float(((ad @ bd).cpu().double() - ref).abs().div(scale).max()),
                 "conv_f32_err": float((F.conv2d(xd, wd, padding=1).cpu().double() - cref).abs().div(cscale).max())}
            for dt, (p1, p2) in big.items():
                def run():
                    acc = p1 @ p2
                    for i in range(1, 8):
                        acc = acc + (p1 * (1 + i)) @ p2
                    torch_xla.sync()
                    xm.wait_device_ops()
                run()
                t0 = time.perf_counter()
                for _ in range(3):
                    run()
                dt_s = (time.perf_counter() - t0) / 24
                r[f"matmul_{n}_{str(dt).split('.')[-1]}_ms"] = round(dt_s * 1e3, 3)
                r[f"matmul_{n}_{str(dt).split('.')[-1]}_tflops"] = round(2 * n**3 / dt_s / 1e12, 1)
            out[p] = r
    finally:
        xb.set_mat_mul_precision(old)
    if torch.cuda.is_available():
        out["eager_cuda"] = {
            "allow_tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
            "allow_tf32_cudnn": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "matmul_f32_err": float(((a.cuda() @ b.cuda()).cpu().double() - ref).abs().div(scale).max()),
            "conv_f32_err": float((F.conv2d(x.cuda(), w.cuda(), padding=1).cpu().double() - cref).abs()
                                  .div(cscale).max())}
    return out


_COUNT = re.compile(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?|deselected|warnings?)")


def _pytest_counts(log: str) -> dict:
    text = open(log, errors="replace").read()
    lines = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|error|skipped)", ln)]
    counts: dict = {}
    if lines:
        for num, kind in _COUNT.findall(lines[-1]):
            counts[kind.rstrip("s") if kind.startswith("error") else kind] = int(num)
    if not lines:  # cut short (timeout): count pytest's progress characters instead
        progress = "".join(m.group(1) for m in re.finditer(r"^([.FEsxX]+)\s*(?:\[\s*\d+%\])?\s*$", text, re.M))
        counts = {"incomplete": True, "passed": progress.count("."), "failed": progress.count("F"),
                  "error": progress.count("E"), "skipped": progress.count("s")}
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)))
    if failed:
        counts["failed_ids"] = failed[:50]
    return counts


def summary(outdir: str, workdir: str | None = None) -> dict:
    workdir = workdir or outdir
    rep: dict = {"stages": [], "tests": {}, "plugin_check": None, "bench": None}
    tsv = os.path.join(workdir, "stages.tsv")
    if os.path.exists(tsv):
        for ln in open(tsv):
            parts = ln.rstrip("\n").split("\t")
            if len(parts) >= 4:
                rep["stages"].append({"stage": parts[0], "rc": int(parts[1]), "seconds": float(parts[2]),
                                      "limit_s": float(parts[3]), "timed_out": int(parts[1]) in (124, 137)})
    for log in sorted(glob.glob(os.path.join(workdir, "tests_*.log"))):
        rep["tests"][os.path.basename(log)[len("tests_"):-len(".log")]] = _pytest_counts(log)
    for key, name in (("plugin_check", "plugin_check.json"), ("bench", "bench_gpu.json")):
        p = os.path.join(workdir, name)
        if not os.path.exists(p):
            p = os.path.join(outdir, name)
        if os.path.exists(p):
            try:
                rep[key] = json.load(open(p))
            except ValueError as e:
                rep[key] = {"error": f"unreadable {name}: {e}"}
    rep["ok"] = bool(rep["stages"]) and all(s["rc"] == 0 for s in rep["stages"])
    with open(os.path.join(outdir, "gpu_check.json"), "w") as f:
        json.dump(rep, f, indent=2, default=str)
    return rep


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "opinfo-sample":
        print("\n".join(opinfo_sample(int(argv[1]))))
        return 0
    if len(argv) == 2 and argv[0] == "plugin-check":
        return 0 if plugin_check(argv[1]).get("ok") else 1
    if len(argv) in (2, 3) and argv[0] == "summary":
        rep = summary(argv[1], argv[2] if len(argv) == 3 else None)
        for s in rep["stages"]:
            print(f"  {s['stage']:<28} rc={s['rc']:<4} {s['seconds']:7.1f}s (limit {s['limit_s']:.0f}s)")
        for name, c in rep["tests"].items():
            print(f"  tests {name:<22} " + ", ".join(f"{k}={v}" for k, v in c.items() if k != "failed_ids"))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
