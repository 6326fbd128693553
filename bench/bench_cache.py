"""Persistent compilation cache: the main job's time to first step and its compiles, cold vs warm.

Runs examples/train_gpt.py twice in fresh processes sharing one cache folder (the first fills it,
the second reads it) and prints time to first step, compile counts and the speed-up.
Usage: .venv/bin/python bench/bench_cache.py [--steps 20]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, {examples!r})
import train_gpt
import torch_xla.debug.metrics as met
stats = train_gpt.main(["--steps", {steps!r}, "--log-every", {steps!r}, "--cache-dir", {cache!r}])
print("STATS " + json.dumps({{
    "first_step_s": stats["first_step_s"],
    "process_to_first_step_s": stats["first_step_s"],
    "uncached": met.counter_value("UncachedCompile") or 0,
    "hits": met.counter_value("PersistentCacheHit") or 0,
    "misses": met.counter_value("PersistentCacheMiss") or 0,
    "wall_s": time.perf_counter() - t0,
}}))
"""


def run(cache: str, steps: int) -> dict:
    code = CHILD.format(examples=os.path.join(REPO, "examples"), steps=str(steps), cache=cache)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    if p.returncode != 0:
        sys.exit(p.stderr[-3000:])
    line = [l for l in p.stdout.splitlines() if l.startswith("STATS ")][-1]
    return json.loads(line[6:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        cold = run(cache, args.steps)
        warm = run(cache, args.steps)
    print(f"{'':6s} {'first step':>11s} {'process':>9s} {'compiles':>9s} {'cache hits':>11s}")
    for name, r in (("cold", cold), ("warm", warm)):
        print(f"{name:6s} {r['first_step_s']:10.2f}s {r['wall_s']:8.2f}s {r['uncached']:9d} {r['hits']:11d}")
    print(f"time to first step: warm/cold = {warm['first_step_s'] / cold['first_step_s']:.2f}x; "
          f"compiles {cold['uncached']} -> {warm['uncached']}")


if __name__ == "__main__":
    main()
