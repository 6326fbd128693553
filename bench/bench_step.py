"""Training-step time of the demo GPT: lazy XLA device vs eager CPU.

    python bench/bench_step.py [--device xla|cpu] [--batch-size 16] [--warmup 5] [--steps 20]

One step = get_batch (CPU) + transfer + forward + backward + AdamW step, and on
xla torch_xla.sync() (graph cut and launch). Each device gets `--warmup`
untimed steps, then `--steps` timed ones; on xla the clock is stopped only after
xm.wait_device_ops() so asynchronous execution is fully counted.
With --device cpu only the eager CPU figure is printed and torch_xla is never imported.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import gpt  # noqa: E402


def run(device, data, vocab_size, args, sync=None, wait=None, on_warmup_done=None) -> float:
    """Returns ms/step over the timed steps. `sync` cuts the graph after each step,
    `wait` blocks until the device is idle, `on_warmup_done` is called after warm-up."""
    torch.manual_seed(args.seed)  # same weights and data on every device
    model = gpt.make_model(vocab_size).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    block = model.cfg.block_size

    def step():
        x, y = gpt.get_batch(data, args.batch_size, block, gen)
        _, loss = model(x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if sync is not None:
            sync()
        return loss

    for _ in range(args.warmup):
        loss = step()
    loss.item()  # make sure warm-up work (including compilation) is finished
    if wait is not None:
        wait()
    if on_warmup_done is not None:
        on_warmup_done()

    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    if wait is not None:
        wait()
    ms = (time.perf_counter() - t0) / args.steps * 1e3
    print(f"  final loss {loss.item():.4f}")
    return ms


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["xla", "cpu"], default="xla")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    assert args.warmup >= 1 and args.steps >= 1

    _, vocab, data = gpt.load_corpus()
    print(f"demo GPT, batch={args.batch_size}, warm-up {args.warmup} steps, timed {args.steps} steps")

    if args.device != "cpu":
        # Import before any backward: autograd sizes its per-device thread pool at the first
        # backward, from the device types registered at that moment.
        import torch_xla  # noqa: F401
    print("eager CPU:")
    cpu_ms = run(torch.device("cpu"), data, len(vocab), args)
    print(f"  {cpu_ms:8.2f} ms/step")
    result = {"cpu_ms_per_step": cpu_ms}
    if args.device == "cpu":
        return result

    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    def uncached() -> int:
        return int(met.counter_value("UncachedCompile") or 0)

    after_warmup = {}
    print("xla:")
    xla_ms = run(torch_xla.device(), data, len(vocab), args, sync=torch_xla.sync, wait=xm.wait_device_ops,
                 on_warmup_done=lambda: after_warmup.setdefault("uncached", uncached()))
    compile_data = met.metric_data("CompileTime")
    n_compiles = int(compile_data[0]) if compile_data is not None else 0
    cached = int(met.counter_value("CachedCompile") or 0)
    print(f"  {xla_ms:8.2f} ms/step")
    print(f"  compiles: CompileTime count={n_compiles}  UncachedCompile {after_warmup['uncached']} after "
          f"warm-up -> {uncached()} at the end ({'flat' if uncached() == after_warmup['uncached'] else 'NOT flat'})"
          f"  CachedCompile={cached}")
    print(f"ratio: xla step takes {xla_ms / cpu_ms:.2f}x the eager CPU step")
    result.update(xla_ms_per_step=xla_ms, ratio=xla_ms / cpu_ms, compiles=n_compiles,
                  uncached_after_warmup=after_warmup["uncached"], uncached_end=uncached(), cached=cached)
    return result


if __name__ == "__main__":
    main()
