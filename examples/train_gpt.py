"""Train the small character GPT of examples/gpt.py on the tiny corpus.

    python examples/train_gpt.py [--steps 300] [--batch-size 16] [--lr 3e-3]
                                 [--seed 0] [--device xla|cpu] [--log-every 20]

On the default "xla" device every step is traced lazily and cut into one graph
by torch_xla.sync(); after the first few steps the same graph should be reused
from the compile cache, so the number of compilations must stay flat. The run
reports that, together with throughput and the metrics report.
With --device cpu, torch_xla is never imported (plain eager PyTorch).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt  # noqa: E402

try:
    from tqdm import tqdm
except ImportError:  # plain loop without a progress bar
    tqdm = None

WARMUP_STEPS = 5  # steps excluded from the throughput figure (they include compilation)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["xla", "cpu"], default="xla")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--corpus", default=gpt.DEFAULT_CORPUS)
    p.add_argument("--cache-dir", default=None,
                   help="persistent compilation cache folder (torch_xla.runtime.initialize_cache)")
    p.add_argument("--sample", type=int, default=0,
                   help="after training, print this many sampled characters (generated on the CPU)")
    return p.parse_args(argv)


def _counter(met, name: str) -> int:
    v = met.counter_value(name)
    return int(v) if v is not None else 0


def _compile_stats(met) -> dict:
    data = met.metric_data("CompileTime")  # (count, total_ns, samples) or None
    return {
        "CompileTime": int(data[0]) if data is not None else 0,
        "UncachedCompile": _counter(met, "UncachedCompile"),
        "CachedCompile": _counter(met, "CachedCompile"),
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    assert args.steps > 0 and args.log_every > 0

    # --- device setup: torch_xla is imported only for the xla device.
    on_xla = args.device == "xla"
    if on_xla:
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.debug.metrics as met
        import torch_xla.runtime as xr

        if args.cache_dir:
            xr.initialize_cache(args.cache_dir)
        device = torch_xla.device()
    else:
        device = torch.device("cpu")

    # --- data and model (built on the CPU, then moved).
    _, vocab, data = gpt.load_corpus(args.corpus)
    torch.manual_seed(args.seed)
    model = gpt.make_model(len(vocab)).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)  # CPU data stream, device-independent
    block = model.cfg.block_size
    print(f"device={device} params={model.num_params():,} vocab={len(vocab)} corpus={data.numel():,} chars "
          f"steps={args.steps} batch={args.batch_size} block={block}")

    def wait():  # make timestamps honest: XLA executes asynchronously
        if on_xla:
            xm.wait_device_ops()

    losses: list[tuple[int, float]] = []  # (step, loss) at log points
    warmup = min(WARMUP_STEPS, args.steps - 1)  # keep at least one timed step
    compiles_after_warmup = None
    t_start = time.perf_counter()
    t_timed = t_start
    first_step_s = None

    steps = range(args.steps)
    bar = tqdm(steps, desc="train", dynamic_ncols=True) if tqdm is not None else None
    for step in bar if bar is not None else steps:
        x, y = gpt.get_batch(data, args.batch_size, block, gen)
        x, y = x.to(device), y.to(device)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if on_xla:
            torch_xla.sync()  # cut the traced step into one graph and launch it

        if step == 0:
            wait()
            first_step_s = time.perf_counter() - t_start
        if step + 1 == warmup:  # end of warm-up: start the clock, snapshot compiles
            wait()
            t_timed = time.perf_counter()
            if on_xla:
                compiles_after_warmup = _counter(met, "UncachedCompile")

        if step == 0 or (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            lv = loss.item()  # forces execution; only at log points (after sync: just a transfer)
            losses.append((step + 1, lv))
            if bar is not None:
                bar.set_postfix(loss=f"{lv:.4f}")
            else:
                print(f"step {step + 1:5d}  loss {lv:.4f}", flush=True)

    wait()
    t_end = time.perf_counter()
    if bar is not None:
        bar.close()

    # --- report.
    wall = t_end - t_start
    timed_steps = args.steps - warmup
    tokens_per_s = timed_steps * args.batch_size * block / max(t_end - t_timed, 1e-9)
    vals = [v for _, v in losses]
    k = max(1, min(10, len(vals) // 2))  # first/last k logged losses, non-overlapping
    first_avg, last_avg = sum(vals[:k]) / k, sum(vals[-k:]) / k
    print(f"final loss: {vals[-1]:.4f}  (step {losses[-1][0]})")
    print(f"mean of first {k} logged losses: {first_avg:.4f}  vs last {k}: {last_avg:.4f}")
    print(f"throughput: {tokens_per_s:,.0f} tokens/s over {timed_steps} steps "
          f"(excluding {warmup} warm-up steps); total wall time {wall:.2f} s")

    compiles = None
    if on_xla:
        compiles = _compile_stats(met)
        compiles["UncachedCompile_after_warmup"] = compiles_after_warmup
        print(f"compiles: CompileTime count={compiles['CompileTime']}  "
              f"UncachedCompile={compiles['UncachedCompile']}  CachedCompile={compiles['CachedCompile']}")
        if compiles_after_warmup is not None and compiles["UncachedCompile"] == compiles_after_warmup:
            print(f"compiles stayed FLAT after warm-up: UncachedCompile {compiles_after_warmup} "
                  f"after step {warmup} -> {compiles['UncachedCompile']} at the end")
        else:
            print(f"WARNING: compiles did NOT stay flat after warm-up: UncachedCompile "
                  f"{compiles_after_warmup} after step {warmup} -> {compiles['UncachedCompile']} at the end")
        print(met.short_metrics_report())

    if args.sample > 0:  # sample on a CPU copy of the model: the context length varies per step
        cpu_model = gpt.make_model(len(vocab))
        cpu_model.load_state_dict({k_: v.cpu() for k_, v in model.state_dict().items()})
        cpu_model.eval()
        start = vocab.encode("\n").view(1, 1)
        out = cpu_model.generate(start, args.sample, generator=torch.Generator().manual_seed(args.seed))
        print("--- sample ---\n" + vocab.decode(out[0].tolist()))

    return {
        "losses": vals,
        "loss_steps": [s for s, _ in losses],
        "final_loss": vals[-1],
        "first_avg": first_avg,
        "last_avg": last_avg,
        "tokens_per_s": tokens_per_s,
        "wall_s": wall,
        "first_step_s": first_step_s,
        "compiles": compiles,
    }


if __name__ == "__main__":
    main()
    sys.exit(0)
