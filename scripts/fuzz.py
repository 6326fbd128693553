#!/usr/bin/env python3
"""Differential fuzzing of torch_xla against eager CPU over any seed range (issue #7).

    .venv/bin/python scripts/fuzz.py --start 0 --count 2000 [--jobs 2] [--no-minimize] [--json out.jsonl]

Each seed is a random program from tests/_fuzz.py, run on eager CPU and on torch_xla.device().
Mismatching programs are minimized (shortest failing prefix, then single steps dropped) and
attributed to the op of their last step. Prints counts by mismatch kind and by category, then the
repro of each mismatch. Workers are subprocesses: a crash or a hang is reported for its seed and the
worker restarts after it.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def worker(seeds, minimize, budget, deadline):
    import torch_xla  # noqa: F401
    import _fuzz

    for seed in seeds:
        if deadline and time.time() > deadline:
            print("DEADLINE", flush=True)
            return
        print(f"START {seed}", flush=True)
        t0 = time.time()
        prog = _fuzz.generate(seed)
        mm = _fuzz.check(prog)
        rec = {"seed": seed, "ok": not mm, "steps": len(prog.steps), "cats": sorted({s.cat for s in prog.steps})}
        if mm:
            small, smm = _fuzz.minimize(prog, mm, budget) if minimize else (prog, mm)
            rec.update(kinds=sorted({m.kind for m in mm}), culprit=_fuzz.culprit(small, smm),
                       detail=[f"[{m.kind}] {m.detail}" for m in smm], repro=small.body(""),
                       full=prog.body(""))
        rec["secs"] = round(time.time() - t0, 2)
        print("RESULT " + json.dumps(rec), flush=True)


def run_worker(seeds, args, results, lock, hang_s=180):
    """Runs a worker subprocess over `seeds`; restarts it after a crash or hang."""
    todo = list(seeds)
    while todo:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--seeds", ",".join(map(str, todo)),
               "--budget", str(args.budget), "--deadline", str(args.deadline)] + ([] if args.minimize else ["--no-minimize"])
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
        current = [None, time.time()]

        def watchdog():
            while p.poll() is None:
                if current[0] is not None and time.time() - current[1] > hang_s:
                    p.kill()
                    return
                time.sleep(2)

        threading.Thread(target=watchdog, daemon=True).start()
        for line in p.stdout:
            if line.startswith("START "):
                current[0], current[1] = int(line.split()[1]), time.time()
            elif line.startswith("DEADLINE"):
                todo.clear()
            elif line.startswith("RESULT "):
                rec = json.loads(line[7:])
                with lock:
                    results.append(rec)
                    if args.progress and len(results) % 100 == 0:
                        print(f"... {len(results)} programs", file=sys.stderr, flush=True)
                todo.remove(rec["seed"])
                current[0] = None
        rc = p.wait()
        if current[0] is not None:
            seed = current[0]
            hung = time.time() - current[1] > hang_s
            with lock:
                results.append({"seed": seed, "ok": False, "kinds": ["hang" if hung else "crash"],
                                "culprit": "process:" + ("hang" if hung else f"rc={rc}"),
                                "detail": [f"worker {'hung' if hung else 'died with rc=' + str(rc)}"],
                                "repro": "", "full": ""})
            todo.remove(seed)
        elif rc != 0 and todo:
            break


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--no-minimize", dest="minimize", action="store_false")
    ap.add_argument("--budget", type=int, default=30, help="max re-runs when minimizing one program")
    ap.add_argument("--json", help="write one JSON record per program here")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--time-limit", type=float, default=0, help="stop starting programs after this many seconds")
    ap.add_argument("--deadline", type=float, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--seeds", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker([int(s) for s in args.seeds.split(",")], args.minimize, args.budget, args.deadline)

    t0 = time.time()
    args.deadline = t0 + args.time_limit if args.time_limit else 0
    seeds = list(range(args.start, args.start + args.count))
    results, lock = [], threading.Lock()
    threads = [threading.Thread(target=run_worker, args=(seeds[j::args.jobs], args, results, lock))
               for j in range(args.jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.sort(key=lambda r: r["seed"])
    if args.json:
        with open(args.json, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    bad = [r for r in results if not r["ok"]]
    by_kind = collections.Counter(k for r in bad for k in r["kinds"])
    by_cat = collections.Counter(r["culprit"] for r in bad)
    print(f"{len(results)} programs, {len(bad)} mismatching, {time.time() - t0:.0f}s")
    print("by kind:     " + ", ".join(f"{k}={v}" for k, v in by_kind.most_common()))
    print("by category:")
    for c, v in by_cat.most_common():
        print(f"  {v:5d}  {c}")
    for r in bad:
        print(f"\n=== seed {r['seed']} ({r['culprit']}): " + "; ".join(r["detail"]))
        print("\n".join("    " + ln for ln in r["repro"].splitlines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
