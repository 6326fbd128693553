"""Out-of-place two-rank sums on CPU tensors with torch.distributed gloo (no XLA): which exchange
can replace "copy the device buffer to a staging buffer, then gloo's in-place all_reduce" when the
input must stay unchanged (xm.all_reduce of one tensor)? On the CPU plugin the device buffer is
host memory, so an out-of-place exchange can read it directly.

  .venv/bin/python bench/bench_allreduce_algos.py [--mb 16] [--iters 15] [--runs 3]

  inplace   gloo all_reduce on the input itself (the floor; mutates the input)
  copy_ar   copy into a staging buffer + gloo all_reduce (what the host collectives did)
  rs_ag     reduce_scatter_tensor(shard of staging, input) + all_gather_into_tensor(staging)
  ag_add    all_gather_into_tensor(2x buffer, input) + one local add
  pair      send my copy of the peer's half / recv the peer's copy of mine, add, swap the reduced
            halves (all posted at once; what collectives._pair_sum does)
Median ms per variant, interleaved in the same process pair; each result is checked bit-equal to
gloo's all_reduce.
"""
import argparse
import os
import random
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank, port, mb, iters, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    pg = dist.distributed_c10d._get_default_group()
    n = mb * (1 << 20) // 4
    x = torch.rand(n)
    x0 = x.clone()
    stage, part, big = torch.empty(n), torch.empty(n), torch.empty(2 * n)
    h = n // 2
    mine = slice(rank * h, (rank + 1) * h)
    theirs = slice((1 - rank) * h, (2 - rank) * h)
    peer = 1 - rank

    def inplace():
        x.copy_(x0)  # untimed below: restore (the in-place form destroys the input)
        t0 = time.perf_counter()
        pg.allreduce([x]).wait()
        return time.perf_counter() - t0, x

    def timed(fn):
        def run():
            t0 = time.perf_counter()
            out = fn()
            return time.perf_counter() - t0, out
        return run

    def copy_ar():
        stage.copy_(x0)
        pg.allreduce([stage]).wait()
        return stage

    def rs_ag():
        dist.reduce_scatter_tensor(stage[mine], x0)
        dist.all_gather_into_tensor(stage, stage[mine])
        return stage

    def ag_add():
        dist.all_gather_into_tensor(big, x0)
        torch.add(big[:n], big[n:], out=stage)
        return stage

    def pair():
        s = pg.send([x0[theirs]], peer, 0)
        r = pg.recv([part[:h]], peer, 0)
        b = pg.recv([stage[theirs]], peer, 1)
        r.wait()
        torch.add(x0[mine], part[:h], out=stage[mine])
        s2 = pg.send([stage[mine]], peer, 1)
        for w in (s, b, s2):
            w.wait()
        return stage

    variants = {"inplace": inplace, "copy_ar": timed(copy_ar), "rs_ag": timed(rs_ag), "ag_add": timed(ag_add),
                "pair": timed(pair)}
    ref = x0.clone()
    pg.allreduce([ref]).wait()
    times = {k: [] for k in variants}
    import warnings
    warnings.simplefilter("ignore")
    for it in range(iters + 2):
        for k, f in variants.items():
            pg.barrier().wait()
            dt, out = f()
            assert torch.equal(out, ref), k
            if it >= 2:
                times[k].append(dt)
    if rank == 0:
        q.put({k: statistics.median(v) * 1e3 for k, v in times.items()})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=16)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    runs = []
    for _ in range(a.runs):
        mp.spawn(_worker, args=(random.randint(20000, 40000), a.mb, a.iters, q), nprocs=2)
        runs.append(q.get())
    print(f"{a.mb} MB f32, 2 processes, median ms of each run ({a.runs} runs): median [min-max]")
    for k in runs[0]:
        v = sorted(r[k] for r in runs)
        print(f"  {k:8s} {statistics.median(v):8.2f} [{v[0]:.2f}-{v[-1]:.2f}]")


if __name__ == "__main__":
    main()
