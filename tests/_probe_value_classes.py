"""Evidence that the out= probe's cache may key a Python number by its value class (issue #7):
over every aten out= overload whose inputs are tensors and Python numbers, eager's verdict on
an out= call (refused for out's dtype with message M, or not refused) is the same for every
value of each class csrc/bridge/out_dtype_check.cc's OutProbeValueClass() defines (read through
torch_xla._C._out_probe_value_class). Simulates the probe (ones/zeros stand-ins of shape (2,), an
alternative out dtype) on eager CPU. `.venv/bin/python tests/_probe_value_classes.py` runs all."""
import math

import torch

def _values():
    """Python numbers around every boundary the class could miss: the integer and floating types'
    ranges (and c10's wrap-around allowance for unsigned types), zero, +-1, fractions, NaN/inf."""
    edges = [0, 1, 2, 3, 7, 100, 127, 128, 129, 200, 254, 255, 256, 257, 1000, 32767, 32768, 32769, 65504,
             65505, 65535, 65536, 65537, 10 ** 6, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 40, 2 ** 53,
             2 ** 62, 2 ** 63 - 1]
    ints = sorted({s * e for e in edges for s in (1, -1)} | {-(2 ** 63)})
    floats = sorted({s * (e + f) for e in edges[:-2] for s in (1.0, -1.0) for f in (0.0, 0.5, 0.25)}
                    | {s * v for s in (1.0, -1.0) for v in (1e-30, 1e-8, 0.001, 0.3, 0.5, 0.999, 1.5, 65504.5,
                                                            65519.0, 65520.0, 3e38, 3.3895e38, 3.4e38, 3.5e38,
                                                            1e39, 1e300)})
    floats += [math.nan, math.inf, -math.inf, -0.0]
    return ints + floats + [True, False]


def classes(value_class):
    """{class: up to 3 representatives (first, middle, last)} of _values() under `value_class`
    (torch_xla._C._out_probe_value_class), integers and floats apart (the key has the category)."""
    groups = {}
    for v in _values():
        groups.setdefault((type(v).__name__, value_class(v)), []).append(v)
    return {k: (vs if len(vs) <= 3 else [vs[0], vs[len(vs) // 2], vs[-1]]) for k, vs in groups.items()}


IN_DTYPES = (torch.float32, torch.int64, torch.uint8, torch.bool)
OUT_DTYPES = (torch.float32, torch.int64, torch.uint8, torch.bool, torch.float16, torch.int8)
ALT_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.float16, torch.bfloat16)


def _overloads():
    """(packet overload, [argument kinds]) of every aten out= overload whose positional arguments are
    Tensors and Scalars (at least one of each), every other argument defaulted, one Tensor out."""
    found = []
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        base, _, ov = name[6:].partition(".")
        if not ov.endswith("out"):
            continue
        if "polynomial" in base:  # the number is a degree: the kernel loops n times (2**63 never ends)
            continue
        try:
            op = getattr(getattr(torch.ops.aten, base), ov)
        except (AttributeError, RuntimeError):
            continue
        kinds, ok = [], True
        for a in op._schema.arguments:
            t = str(a.type)
            if a.alias_info is not None and a.alias_info.is_write:
                if not a.kwarg_only or t != "Tensor":
                    ok = False
                kinds.append(("out", a.name))
            elif t == "Tensor" and not a.kwarg_only:
                kinds.append(("tensor", a.name))
            elif t == "number" or t == "Scalar":
                kinds.append(("scalar", a.name))
            elif a.has_default_value():
                continue
            else:
                ok = False
        if ok and sum(k == "out" for k, _ in kinds) == 1 and any(k == "scalar" for k, _ in kinds) \
                and any(k == "tensor" for k, _ in kinds):
            found.append((name[6:], op, kinds))
    return found


def _standin(dt):
    return torch.ones(2, dtype=dt) if dt.is_floating_point else torch.zeros(2, dtype=dt)


def _call(op, kinds, in_dt, out_dt, v):
    args, kw = [], {}
    for k, n in kinds:
        if k == "tensor":
            args.append(_standin(in_dt))
        elif k == "scalar":
            args.append(v)
        else:
            kw[n] = torch.empty(2, dtype=out_dt)
    try:
        op(*args, **kw)
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def verdict(op, kinds, in_dt, out_dt, v):
    a = _call(op, kinds, in_dt, out_dt, v)
    if a is None:
        return None
    for c in ALT_DTYPES:
        if c != out_dt and _call(op, kinds, in_dt, c, v) is None:
            return a
    return None


def differing_classes(value_class, names=None, in_dtypes=IN_DTYPES, out_dtypes=OUT_DTYPES):
    """[(overload, in dtype, out dtype, class, {value: verdict})] where a class's values disagree, and
    the number of (overload, dtypes, class) groups checked."""
    import warnings
    warnings.filterwarnings("ignore")
    groups_of = classes(value_class)
    bad, groups = [], 0
    for name, op, kinds in _overloads():
        if names is not None and name not in names:
            continue
        for in_dt in in_dtypes:
            for out_dt in out_dtypes:
                if out_dt == in_dt:
                    continue  # the check runs only when out's dtype differs from an input's
                for cls, reps in groups_of.items():
                    if len(reps) < 2:
                        continue
                    groups += 1
                    vs = {repr(r): verdict(op, kinds, in_dt, out_dt, r) for r in reps}
                    if len(set(vs.values())) > 1:
                        bad.append((name, in_dt, out_dt, cls, vs))
    return bad, groups


if __name__ == "__main__":
    import time

    from torch_xla import _C
    t0 = time.time()
    g = classes(_C._out_probe_value_class)
    print(len(_overloads()), "overloads,", len(_values()), "values in", len(g), "classes")
    bad, groups = differing_classes(_C._out_probe_value_class)
    for b in bad:
        print(b)
    print(f"{groups} groups (overload, input dtype, out dtype, class), {len(bad)} with differing verdicts "
          f"({time.time() - t0:.0f} s)")
