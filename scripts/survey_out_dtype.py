"""Survey of `out=` dtype parity (issue #7): every OpInfo op that supports out=, its first float32
samples, called with out= tensors of other dtypes on eager CPU and on XLA. Prints the calls whose
outcomes differ (one raises and the other does not, other exception types, other values) and a
summary line. `.venv/bin/python scripts/survey_out_dtype.py [--samples 2] [--verbose]`."""
import argparse
import sys
import time
import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db

import torch_xla

warnings.filterwarnings("ignore")
DEV = torch_xla.device()
OUT_DTYPES = (torch.int64, torch.float64, torch.bool, torch.float16)


def to(x, d):
    if isinstance(x, torch.Tensor):
        return x.detach().to(d)
    if isinstance(x, (list, tuple)):
        return type(x)(to(v, d) for v in x)
    if isinstance(x, dict):
        return {k: to(v, d) for k, v in x.items()}
    return x


def outs_like(r, dt, d):
    if isinstance(r, torch.Tensor):
        return torch.empty(r.shape, dtype=dt, device=d)
    return tuple(torch.empty(t.shape, dtype=dt if i == 0 else t.dtype, device=d) for i, t in enumerate(r))


def call(op, s, out, d):
    try:
        r = op.op(to(s.input, d), *to(s.args, d), **to(s.kwargs, d), out=out)
        # Both what the call returns and what it wrote into `out` (a composite that returns a fresh
        # tensor and leaves `out` unwritten returned the right value: linalg.matrix_rank).
        r = (r if isinstance(r, tuple) else (r,)) + (out if isinstance(out, tuple) else (out,))
        r = to(r, "cpu")
        return ("ok", r)
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e).split("\n")[0][:160])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    t0 = time.time()
    n = diff = refused_wrongly = unrepresentable = 0
    for op in op_db:
        if not op.supports_out or torch.float32 not in op.supported_dtypes("cpu"):
            continue
        try:
            samples = list(op.sample_inputs("cpu", torch.float32))[: a.samples]
        except Exception:  # noqa: BLE001
            continue
        for s in samples:
            try:
                ref = op.op(s.input, *s.args, **s.kwargs)
            except Exception:  # noqa: BLE001
                continue
            if not isinstance(ref, torch.Tensor) and not (
                    isinstance(ref, tuple) and all(isinstance(t, torch.Tensor) for t in ref)):
                continue
            try:
                to((s.input, s.args, s.kwargs), DEV)
            except NotImplementedError as ex:
                # Sparse inputs (sparse.sampled_addmm's CSR `input`) cannot be XLA tensors at all: the
                # call never reaches the op, so its out= check has nothing to compare.
                unrepresentable += len(OUT_DTYPES)
                print(f"SKIP {op.name}: its inputs cannot move to the XLA device ({str(ex)[:80]})")
                continue
            for dt in OUT_DTYPES:
                e = call(op, s, outs_like(ref, dt, "cpu"), "cpu")
                try:
                    g = call(op, s, outs_like(ref, dt, DEV), DEV)
                    torch_xla.sync()
                except Exception as ex:  # noqa: BLE001
                    g = (type(ex).__name__, str(ex)[:160])
                n += 1
                same = e[0] == g[0]
                if same and e[0] == "ok":
                    try:
                        er = e[1] if isinstance(e[1], tuple) else (e[1],)
                        gr = g[1] if isinstance(g[1], tuple) else (g[1],)
                        for x, y in zip(er, gr):
                            assert x.dtype == y.dtype and x.shape == y.shape
                            torch.testing.assert_close(y, x, equal_nan=True, atol=1e-3, rtol=1e-3)
                    except Exception:  # noqa: BLE001
                        same = False
                if not same:
                    diff += 1
                    refused_wrongly += e[0] == "ok" and g[0] != "ok"
                    print(f"DIFF {op.name}{'.' + op.variant_test_name if op.variant_test_name else ''} "
                          f"out={dt}: eager {e[0]} {e[1] if e[0] != 'ok' else ''} | xla {g[0]} "
                          f"{g[1] if g[0] != 'ok' else ''}")
                elif a.verbose:
                    print(f"same {op.name} out={dt}: {e[0]}")
    print(f"{n} calls, {diff} outcomes differ from eager, {refused_wrongly} of them accepted by eager and "
          f"refused here; {unrepresentable} calls skipped: inputs that cannot be XLA tensors "
          f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
