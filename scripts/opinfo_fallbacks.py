"""Which aten ops still run on the CPU fallback when PyTorch's OpInfo samples run on XLA.

For every OpInfo in torch's op_db (float32 where supported, else its first dtype), the first
``--samples`` samples run on the XLA device; the ``aten::`` fallback counters that grew are
recorded per OpInfo. Prints each fallback op with the OpInfos that hit it, most common first.
Host reads (aten::_local_scalar_dense) are left out. Usage:

    .venv/bin/python scripts/opinfo_fallbacks.py [--samples 2] [--filter NAME]
"""
import argparse
import collections
import sys
import warnings

import torch
import torch.utils._pytree as pytree
import torch_xla
import torch_xla.debug.metrics as met
from torch.testing._internal.common_methods_invocations import op_db

warnings.filterwarnings("ignore")


def _to(x, dev):
    return x.to(dev) if isinstance(x, torch.Tensor) else x


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--filter", default="")
    args = p.parse_args()
    dev = torch_xla.device()
    hits = collections.defaultdict(set)
    errors = {}
    for op in op_db:
        name = op.name + (("." + op.variant_test_name) if op.variant_test_name else "")
        if args.filter and args.filter not in name:
            continue
        dtypes = op.supported_dtypes("cpu")
        dtype = torch.float32 if torch.float32 in dtypes else (sorted(dtypes, key=str)[0] if dtypes else None)
        if dtype is None:
            continue
        try:
            samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[: args.samples]
        except Exception as e:  # noqa: BLE001
            errors[name] = f"samples: {e}"
            continue
        for s in samples:
            before = {n: met.counter_value(n) for n in met.counter_names() if n.startswith("aten::")}
            try:
                inp = pytree.tree_map(lambda x: _to(x, dev), s.input)
                a = pytree.tree_map(lambda x: _to(x, dev), s.args)
                k = pytree.tree_map(lambda x: _to(x, dev), s.kwargs)
                out = op(inp, *a, **k)
                for t in pytree.tree_leaves(out):
                    if isinstance(t, torch.Tensor) and t.device.type == "xla":
                        t.cpu()
            except Exception as e:  # noqa: BLE001
                errors[name] = f"{type(e).__name__}: {str(e)[:120]}"
            for n in met.counter_names():
                if n.startswith("aten::") and n != "aten::_local_scalar_dense" and met.counter_value(n) != before.get(n):
                    hits[n].add(name)
    for n, names in sorted(hits.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f"{n}\t{len(names)}\t{' '.join(sorted(names))}")
    print(f"# {len(hits)} fallback ops; {len(errors)} OpInfos raised on XLA", file=sys.stderr)
    for n, e in sorted(errors.items()):
        print(f"# error {n}: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
