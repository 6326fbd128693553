"""Complex inputs against eager (issue #7): every OpInfo in torch's op_db, forward only.

Ops that eager supports in complex64: the OpInfo's complex64 samples run on eager CPU and on XLA;
values, dtypes and shapes must agree (NaNs equal). Ops that eager does not support in complex: their
float32 samples with every floating tensor made complex64 must raise on XLA as on eager (same
exception type) or, where eager accepts them after all, give its values. Ops are run in chunks in
subprocesses: an abort inside XLA (a compile CHECK) is reported for its op and the run goes on.

    .venv/bin/python scripts/survey_complex.py [--samples 3] [--filter NAME] [--chunk 25]
"""
import argparse
import json
import os
import subprocess
import sys
import warnings

warnings.filterwarnings("ignore")
SKIP_RANDOM = ("normal", "bernoulli", "multinomial", "rand", "randn", "randint", "uniform", "exponential",
               "geometric", "cauchy", "log_normal", "dropout", "empty", "new_empty", "empty_like", "empty_strided",
               "nn.functional.rrelu", "nn.functional.feature_alpha_dropout", "nn.functional.alpha_dropout",
               "_refs", "randint_like", "rand_like", "randn_like", "sparse")


def _name(op):
    return op.name + (("." + op.variant_test_name) if op.variant_test_name else "")


def _worker(names, nsamples):
    import torch
    import torch.utils._pytree as pytree
    import torch_xla
    from torch.testing._internal.common_methods_invocations import op_db
    dev = torch_xla.device()
    ops = {_name(op): op for op in op_db}
    c64 = torch.complex64

    def to(x, d, make_complex):
        if isinstance(x, torch.Tensor):
            if make_complex and x.is_floating_point():
                x = x.to(c64)
            return x.to(d)
        return x

    def run(op, s, d, make_complex):
        try:
            inp = pytree.tree_map(lambda x: to(x, d, make_complex), s.input)
            a = pytree.tree_map(lambda x: to(x, d, make_complex), s.args)
            k = pytree.tree_map(lambda x: to(x, d, make_complex), s.kwargs)
            out = op(inp, *a, **k)
            return ("ok", pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, out))
        except Exception as e:  # noqa: BLE001
            return (type(e).__name__, str(e).split("\n")[0][:160])

    def same(x, y):
        lx, ly = pytree.tree_leaves(x), pytree.tree_leaves(y)
        if len(lx) != len(ly):
            return f"{len(lx)} vs {len(ly)} results"
        for u, v in zip(lx, ly):
            if isinstance(u, torch.Tensor) != isinstance(v, torch.Tensor):
                return "result kinds differ"
            if not isinstance(u, torch.Tensor):
                continue
            if u.dtype != v.dtype or u.shape != v.shape:
                return f"{u.dtype}{tuple(u.shape)} vs {v.dtype}{tuple(v.shape)}"
            try:
                torch.testing.assert_close(v, u, equal_nan=True, rtol=1e-3, atol=1e-4)
            except AssertionError as e:
                return "values: " + str(e).split("\n")[1][:120] if "\n" in str(e) else "values"
        return None

    for name in names:
        op = ops[name]
        print(json.dumps({"op": name, "start": 1}), flush=True)
        supported = c64 in op.supported_dtypes("cpu")
        try:
            samples = list(op.sample_inputs("cpu", c64 if supported else torch.float32, requires_grad=False))
        except Exception as e:  # noqa: BLE001
            print(json.dumps({"op": name, "skip": f"samples: {e}"[:100]}), flush=True)
            continue
        step = max(1, len(samples) // nsamples)
        for i, s in enumerate(samples[::step][:nsamples]):
            ref = run(op, s, "cpu", not supported)
            got = run(op, s, dev, not supported)
            msg = None
            if ref[0] != got[0]:
                msg = f"eager {ref[0]}: {ref[1] if ref[0] != 'ok' else ''} / xla {got[0]}: {got[1] if got[0] != 'ok' else ''}"
            elif ref[0] == "ok":
                msg = same(ref[1], got[1])
            rec = {"op": name, "sample": i, "supported": supported}
            if msg:
                rec["mismatch"] = msg
            print(json.dumps(rec), flush=True)
        print(json.dumps({"op": name, "end": 1}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--filter", default="")
    p.add_argument("--chunk", type=int, default=25)
    p.add_argument("--worker", default=None)
    args = p.parse_args()
    if args.worker is not None:
        _worker(args.worker.split(","), args.samples)
        return
    from torch.testing._internal.common_methods_invocations import op_db
    names = [n for n in dict.fromkeys(_name(op) for op in op_db)
             if args.filter in n and not any(n.startswith(k) for k in SKIP_RANDOM)]
    todo = [names[i:i + args.chunk] for i in range(0, len(names), args.chunk)]
    mism, crashes, done = [], [], 0
    while todo:
        chunk = todo.pop(0)
        r = subprocess.run([sys.executable, __file__, "--worker", ",".join(chunk), "--samples", str(args.samples)],
                           capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        finished, started = set(), None
        for line in r.stdout.splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                if "start" in rec:
                    started = rec["op"]
                    continue
                if "end" in rec:
                    finished.add(rec["op"])
                    continue
                if "skip" in rec:
                    continue
                done += 1
                if "mismatch" in rec:
                    mism.append(rec)
                    print(f"MISMATCH {rec['op']} [{rec['sample']}] {'c64' if rec['supported'] else 'float->c64'}: "
                          f"{rec['mismatch']}", flush=True)
        if r.returncode != 0:
            bad = started if started and started not in finished else None
            tail = r.stderr.strip().splitlines()
            print(f"CRASH {bad or chunk} rc={r.returncode}: {[l for l in tail if 'F0000' in l or 'Error' in l][:1]}",
                  flush=True)
            crashes.append(bad or ",".join(chunk))
            rest = [n for n in chunk if n not in finished and n != bad]
            if rest:
                todo.insert(0, rest)
    print(f"{done} samples, {len(mism)} mismatching, {len(crashes)} crashing ops: {crashes}")


if __name__ == "__main__":
    main()
