"""A/B of the host all_reduce paths in the same 2-process pair, interleaved per iteration:
  plain      torch.distributed gloo all_reduce on a CPU tensor
  ours       xm.all_reduce (the two-rank send/recv exchange from the device buffer when >= 8 MB)
  ours_copy  xm.all_reduce with the exchange off (copy to staging + gloo all_reduce)
  ours_seg   the exchange in pieces of $SEG bytes per half (default 8 MB)

  .venv/bin/python bench/bench_allreduce_ab.py [MB,MB,...] [iters]     e.g. 1,16,64 20
"""
import os, sys, time, statistics, datetime, torch
def fn(index, sizes, iters, out):
    import torch.distributed as dist
    import torch_xla, torch_xla.core.xla_model as xm
    from torch_xla._internal import collectives as C
    dist.init_process_group("gloo")
    dev = torch_xla.device()
    lines = []
    for nbytes in sizes:
        n = nbytes//4
        cpu = torch.rand(n); x = cpu.to(dev); torch_xla.sync(wait=True)
        def ours():
            r = xm.all_reduce(xm.REDUCE_SUM, x); torch_xla.sync(wait=True)
        def ours_copy():
            C._PAIR_SUM = False
            try:
                r = xm.all_reduce(xm.REDUCE_SUM, x); torch_xla.sync(wait=True)
            finally:
                C._PAIR_SUM = True
        def ours_seg():
            C._PAIR_SEGMENT_BYTES = int(os.environ.get("SEG", 8 << 20))
            try:
                r = xm.all_reduce(xm.REDUCE_SUM, x); torch_xla.sync(wait=True)
            finally:
                C._PAIR_SEGMENT_BYTES = 1 << 62
        def plain():
            dist.all_reduce(cpu)
        fs = dict(plain=plain, ours=ours, ours_copy=ours_copy, ours_seg=ours_seg)
        for f in fs.values(): f(); f()
        T = {k: [] for k in fs}
        for it in range(iters):
            for k, f in fs.items():
                t0 = time.perf_counter(); f(); T[k].append(time.perf_counter()-t0)
        p = statistics.median(T["plain"])
        lines.append(f"{nbytes/2**20:8.3f}MB " + "  ".join(f"{k} {statistics.median(v)*1e3:7.3f}ms ({statistics.median(v)/p:.2f}x)" for k, v in T.items()))
    if index == 0:
        print("\n".join(lines), flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    import torch_xla.distributed.xla_multiprocessing as xmp
    os.environ["CPU_NUM_DEVICES"]="2"
    sizes = [int(float(s)*2**20) for s in sys.argv[1].split(",")] if len(sys.argv) > 1 else [4096, 16*2**20]
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    xmp.spawn(fn, args=(sizes, iters, None), nprocs=2, start_method="fork")
