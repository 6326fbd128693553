"""Differential random-program tester (issue #7, "never a wrong answer").

`generate(seed)` builds a small random PyTorch program (a list of source lines) from an integer seed;
`check(prog)` runs it twice -- on eager CPU and on `torch_xla.device()` (inputs are built on the CPU
and moved with `.to(d)`) -- and compares every tensor the program names: values (dtype-aware
tolerances, NaN positions, inf signs), shapes, dtypes and, where eager raises, the exception type
(we must raise the same type at that op or, at the latest, at the next sync()/read).

Generation runs each new line on eager CPU at once, so later ops are chosen for the real shapes and
dtypes, and the program stops at the first line eager rejects. A program is plain Python:
`prog.source()` prints a standalone repro script.

Variables whose name starts with `_` are not compared (e.g. unstable sort indices; a gather through
them is compared instead). Order-dependent ops (argmax, sort indices, floor, comparisons, casts to
integer ...) are only applied to "exact" tensors: inputs and what exact ops (views, indexing, copies,
abs/neg/clamp ...) make of them, so rounding differences never change an index or a boolean.
"""
from __future__ import annotations

import gc
import math
import random
import re
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

NAN, INF = float("nan"), float("inf")
FLOATS = ("float32", "bfloat16", "float16")
INTS = ("int64", "int32")
DTYPE_WEIGHTS = [("float32", 40), ("bfloat16", 12), ("float16", 12), ("int64", 14), ("int32", 10), ("bool", 12)]
DENORMAL = {"float32": 1e-40, "bfloat16": 1e-39, "float16": 3e-6, "float64": 1e-310}


def R(seed, shape, dtype, special=0):
    """Deterministic CPU input. Floats ~ N(0, 2); with special=1 about a quarter of the elements
    become nan/inf/-inf/-0.0/denormal/0. Ints in [-4, 4]; bools fair."""
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    shape = tuple(shape)
    if dt.is_floating_point:
        x = torch.randn(shape, generator=g) * 2
        n = x.numel()
        if special and n:
            k = max(1, n // 4)
            pos = torch.randint(0, n, (k,), generator=g)
            which = torch.randint(0, 6, (k,), generator=g)
            vals = torch.tensor([NAN, INF, -INF, -0.0, DENORMAL[dtype], 0.0], dtype=torch.float64)
            x = x.double()
            x.view(-1)[pos] = vals[which]
        return x.to(dt)
    if dt == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(-4, 5, shape, generator=g).to(dt)


def _isfloat(t):
    return t.dtype.is_floating_point


def _prod(s):
    p = 1
    for v in s:
        p *= v
    return p


def _lit(v):
    """Python literal of a scalar (nan/inf spelled as names the program namespace defines)."""
    if isinstance(v, bool):
        return repr(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v == 0 and math.copysign(1, v) < 0:
            return "-0.0"
    return repr(v)


@dataclass
class Step:
    code: str
    cat: str          # category, e.g. "binary", "view+inplace"
    op: str           # op name, e.g. "div", "unfold"
    outs: tuple = ()  # names this line defines (compared unless they start with "_")
    # (name, dtype) of values that went through a rounding bf16/f16 op (this line or an input's
    # lineage): a float32 copy of such a value is compared at that dtype's tolerance (eager's own
    # bf16/f16 kernels are within an ulp of the correctly rounded result, not bit-exact).
    lowp: tuple = ()
    # Names computed from unstable ones ("_" names: indices of ties in topk/kthvalue/unstable sort),
    # other than by gathering values through them: not compared either.
    unstable: tuple = ()


@dataclass
class Program:
    seed: int
    steps: list = field(default_factory=list)

    def names(self):
        out = []
        skip = {n for s in self.steps for n in s.unstable}
        for s in self.steps:
            for n in s.outs:
                if not n.startswith("_") and n not in out and n not in skip:
                    out.append(n)
        return out

    def lowp(self):
        out = {}
        for s in self.steps:
            for n, dt in s.lowp:
                out[n] = dt
        return out

    def body(self, indent="    "):
        return "\n".join(indent + s.code for s in self.steps)

    def source(self):
        names = self.names()
        return (
            "import torch, torch_xla\nimport torch.nn.functional as F\n"
            "from _fuzz import R  # tests/_fuzz.py (PYTHONPATH=tests)\n"
            "nan, inf = float('nan'), float('inf')\n\n"
            "def prog(d, sync):\n" + self.body() + "\n    return {" + ", ".join(f"{n!r}: {n}" for n in names) + "}\n\n"
            "cpu = prog(torch.device('cpu'), lambda: None)\n"
            "xla = prog(torch_xla.device(), torch_xla.sync)\n"
            "for k in cpu:\n    print(k, cpu[k], xla[k].cpu(), sep='\\n')\n"
        )


def namespace(device, sync):
    return {"torch": torch, "F": F, "R": R, "nan": NAN, "inf": INF, "d": device, "sync": sync}


class _Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)
        self.seed = seed
        self.prog = Program(seed)
        self.ns = namespace(torch.device("cpu"), lambda: None)
        self.meta = {}   # name -> dict(exact=bool, group=int, leaf=str|None)
        self.lowp = {}   # name -> bf16/f16 dtype its value was rounded in (see Step.lowp)
        self.unstable = set()  # see Step.unstable
        self.n = 0
        self.sub = 0     # counter for input seeds
        self.done = False
        self.raised = None
        self.drop_raise = 0.85  # chance that a line eager rejects is dropped instead of ending the program

    # ------------------------------------------------------------------ helpers
    def new(self, prefix="t"):
        self.n += 1
        return f"{prefix}{self.n}"

    def T(self, name):
        return self.ns[name]

    def tensors(self, pred=None):
        out = []
        for n, m in self.meta.items():
            t = self.ns.get(n)
            if isinstance(t, torch.Tensor) and (pred is None or pred(n, t, m)):
                out.append(n)
        return out

    def pick(self, pred=None):
        c = self.tensors(pred)
        if not c:
            return None
        # Prefer recent values: the program then chains instead of fanning out.
        w = [1 + i for i in range(len(c))]
        return self.r.choices(c, weights=w)[0]

    def exact(self, n):
        return self.meta[n]["exact"]

    def emit(self, code, cat, op, outs=(), exact=True, group=None, leaf=None):
        """Runs `code` on eager CPU; records it. On an eager exception the program ends here."""
        step = Step(code, cat, op, tuple(outs))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(code, self.ns)
        except Exception as e:  # noqa: BLE001 -- any eager error is an expected-raise program
            if self.r.random() < self.drop_raise:
                return False  # drop the line (eager checks before it writes) and go on
            self.prog.steps.append(step)
            self.done = True
            self.raised = type(e)
            return False
        self.prog.steps.append(step)
        for o in outs:
            if o in self.meta and group is None:
                continue
            self.meta[o] = {"exact": exact, "group": group if group is not None else self.n_group(), "leaf": leaf}
        step.lowp = tuple(self._lowp(code, outs, exact))
        step.unstable = tuple(self._unstable(code, op, outs))
        return True

    def _unstable(self, code, op, outs):
        names = [n for n in re.findall(r"[A-Za-z_]\w*", code) if n in self.meta and n not in outs]
        if op.endswith("_indices_gather") and not (names and (names[0].startswith("_") or names[0] in self.unstable)):
            # a stable source gathered through tie indices: equal values whichever tie was picked
            # (gathering the unstable indices themselves is not: seed 12071, kthvalue of an expand)
            return []
        if not any(n.startswith("_") or n in self.unstable for n in names):
            return []
        targets = list(outs)
        if not outs and names:  # in-place: the target and every view of it
            grp = self.meta.get(names[0], {}).get("group")
            targets = [n for n, m in self.meta.items() if m["group"] == grp]
        self.unstable.update(targets)
        return targets

    def _lowp(self, code, outs, exact):
        """(name, dtype) pairs this line makes low-precision: its outputs (for an in-place line, its
        target's group) when it rounds in bf16/f16 or reads a low-precision name; a gradient when
        any low-precision value exists (the backward pass went through it)."""
        names = [n for n in re.findall(r"[A-Za-z_]\w*", code) if n in self.meta and n not in outs]
        src = [self.lowp[n] for n in names if n in self.lowp]
        half = (torch.bfloat16, torch.float16)
        for n in list(names) + list(outs):
            t = self.ns.get(n)
            if not exact and isinstance(t, torch.Tensor) and t.dtype in half:
                src.append(t.dtype)
        if ".grad" in code and self.lowp:
            src.extend(self.lowp.values())
        if not src:
            return []
        targets = list(outs)
        if not outs and names:  # in-place: the target and every view of it
            grp = self.meta.get(names[0], {}).get("group")
            targets = [n for n, m in self.meta.items() if m["group"] == grp] or names[:1]
        dt = torch.bfloat16 if torch.bfloat16 in src else torch.float16
        for n in targets:
            if self.lowp.get(n) != torch.bfloat16:
                self.lowp[n] = dt
        return [(n, self.lowp[n]) for n in targets]

    _g = 0

    def n_group(self):
        self._g += 1
        return self._g

    def dtype(self):
        names, w = zip(*DTYPE_WEIGHTS)
        return self.r.choices(names, weights=w)[0]

    def shape(self, max_dims=4):
        nd = self.r.choices(range(max_dims + 1), weights=[8, 20, 30, 22, 10][: max_dims + 1])[0]
        return tuple(self.r.choices([0, 1, 1, 2, 3, 3, 4, 5], weights=[3, 8, 8, 20, 20, 10, 15, 10])[0]
                     for _ in range(nd))

    # ------------------------------------------------------------------ inputs
    def input(self, shape=None, dtype=None, layout=None, special=None, grad=None, name=None):
        r = self.r
        shape = self.shape() if shape is None else tuple(shape)
        dtype = dtype or self.dtype()
        isf = dtype in FLOATS
        special = (isf and r.random() < 0.3) if special is None else special
        if grad is None:
            grad = isf and r.random() < 0.25
        if layout is None:
            layout = r.choices(["c", "t", "step", "expand", "perm"], weights=[50, 15, 15, 10, 10])[0]
        self.sub += 1
        s = self.seed * 1000 + self.sub
        base, view = shape, ""
        nd = len(shape)
        if layout == "t" and nd >= 2:
            i, j = sorted(r.sample(range(nd), 2))
            base = list(shape)
            base[i], base[j] = base[j], base[i]
            view = f".transpose({i}, {j})"
        elif layout == "step" and nd >= 1:
            k = r.randrange(nd)
            st = r.choice([2, 3])
            base = list(shape)
            base[k] = shape[k] * st + r.randrange(st) if shape[k] else r.randrange(2)
            view = "[" + ", ".join([":"] * k + [f"::{st}"]) + "]"
        elif layout == "expand" and nd >= 1:
            base = [1 if r.random() < 0.5 else v for v in shape]
            lead = r.randrange(min(2, nd) + 1) if nd > 1 else 0
            base = base[lead:]
            view = f".expand({tuple(shape)})"
        elif layout == "perm" and nd >= 3:
            p = list(range(nd))
            r.shuffle(p)
            inv = [p.index(i) for i in range(nd)]
            base = [shape[p.index(i)] for i in range(nd)]  # base[p[i]] ... permute(inv) gives shape
            base = [0] * nd
            for i in range(nd):
                base[p[i]] = shape[i]
            view = f".permute({tuple(p)})"
            del inv
        else:
            layout = "c"
        name = name or self.new("x")
        make = f"R({s}, {tuple(base)}, {dtype!r}{', special=1' if special else ''}).to(d)"
        if grad:
            if view:
                leaf = name + "_leaf"
                ok = self.emit(f"{leaf} = {make}.requires_grad_()", "input", "input", [leaf], exact=True)
                g = self.meta[leaf]["group"] if ok else None
                ok = ok and self.emit(f"{name} = {leaf}{view}", "input", "input", [name], exact=True, group=g, leaf=leaf)
                if ok:
                    self.meta[leaf]["leaf"] = leaf
            else:
                ok = self.emit(f"{name} = {make}.requires_grad_()", "input", "input", [name], exact=True, leaf=name)
        else:
            ok = self.emit(f"{name} = {make}{view}", "input", "input", [name], exact=True)
        return name if ok else None

    def partner(self, x, allow_scalar=True):
        """Something to combine with tensor `x`: a broadcastable tensor (existing or new), a 0-dim
        tensor or a Python scalar. Returns (code, exact)."""
        r = self.r
        t = self.T(x)
        roll = r.random()
        if allow_scalar and roll < 0.3:
            if _isfloat(t) and r.random() < 0.5:
                v = r.choice([0.5, -1.5, 2.0, 3.3, 1e-3, NAN, INF, -INF, -0.0, 0.0, 1e-40, 70000.0])
            else:
                v = r.choice([0, 1, 2, -3, 7, True, False, 0.5, -2.25])
            return _lit(v), True
        if roll < 0.45:
            same = [n for n in self.tensors() if n != x and self._bcast(self.T(n).shape, t.shape)]
            if same:
                n = r.choice(same)
                return n, self.exact(n)
        s = list(t.shape)
        if roll < 0.55:
            s = []
        else:
            drop = r.randrange(len(s) + 1) if s and r.random() < 0.4 else 0
            s = s[drop:]
            s = [1 if r.random() < 0.3 else v for v in s]
            if r.random() < 0.15:
                s = [r.choice([1, 2]) for _ in range(r.randrange(1, 3))] + s
            if r.random() < 0.04 and s:  # not broadcastable (probably): eager raises
                s[r.randrange(len(s))] += 1
        dt = t.dtype.__str__().split(".")[1] if r.random() < 0.6 else self.dtype()
        n = self.input(shape=s, dtype=dt, grad=False, layout="c" if r.random() < 0.7 else None)
        return n, True

    @staticmethod
    def _bcast(a, b):
        try:
            torch.broadcast_shapes(a, b)
            return True
        except RuntimeError:
            return False

    def dim(self, t, allow_none=False):
        nd = t.dim()
        if allow_none and self.r.random() < 0.25:
            return None
        if nd == 0:
            return self.r.choice([0, -1])
        k = self.r.randrange(nd)
        return k - nd if self.r.random() < 0.3 else k


# ---------------------------------------------------------------------- op generators
UNARY_F = ["neg", "abs", "exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "relu", "reciprocal", "rsqrt",
           "floor", "ceil", "round", "trunc", "sign", "expm1", "log1p", "erf", "isnan", "isinf", "isfinite",
           "square", "frac", "nan_to_num", "signbit", "logical_not", "atan", "exp2", "log2", "sinh", "asin",
           "F.gelu", "F.silu", "F.softplus", "F.elu", "clamp", "bitwise_not", "sgn", "positive"]
UNARY_EXACT = {"neg", "abs", "relu", "isnan", "isinf", "isfinite", "signbit", "logical_not", "floor", "ceil",
               "round", "trunc", "sign", "clamp", "bitwise_not", "sgn", "positive", "nan_to_num"}
DISCONT = {"floor", "ceil", "round", "trunc", "sign", "signbit", "frac", "logical_not", "sgn"}


def op_unary(g):
    x = g.pick()
    if x is None:
        return
    t = g.T(x)
    ops = list(UNARY_F)
    if _isfloat(t) and not g.exact(x):
        ops = [o for o in ops if o not in DISCONT]
    op = g.r.choice(ops)
    out = g.new()
    if op == "clamp":
        lo = g.r.choice([None, -1, -0.5, 0, NAN])
        hi = g.r.choice([None, 1, 2.5, INF])
        args = ", ".join(f"{k}={_lit(v)}" for k, v in (("min", lo), ("max", hi)) if v is not None) or "min=0"
        code = f"{out} = {x}.clamp({args})"
    elif op.startswith("F."):
        code = f"{out} = {op}({x})"
    else:
        code = f"{out} = torch.{op}({x})"
    ex = g.exact(x) and (op in UNARY_EXACT or not _isfloat(t) and op in {"square"})
    g.emit(code, "unary", op, [out], exact=ex)


BINARY = ["+", "-", "*", "/", "//", "%", "**", "maximum", "minimum", "atan2", "eq", "ne", "lt", "le", "gt", "ge",
          "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "where",
          "div_floor", "div_trunc", "fmod", "add_alpha", "copysign", "fmax"]
BIN_DISCONT = {"//", "%", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
               "div_floor", "div_trunc", "fmod", "copysign"}
BIN_EXACT = {"maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
             "bitwise_and", "bitwise_or", "bitwise_xor", "where", "fmax"}


def op_binary(g):
    x = g.pick()
    if x is None:
        return
    y, yex = g.partner(x)
    if g.done:
        return
    ops = list(BINARY)
    both_exact = g.exact(x) and yex
    tx = g.T(x)
    ty = g.ns.get(y)
    anyf = _isfloat(tx) or (isinstance(ty, torch.Tensor) and _isfloat(ty)) or ("." in y or "nan" in y or "inf" in y)
    if anyf and not both_exact:
        ops = [o for o in ops if o not in BIN_DISCONT]
    op = g.r.choice(ops)
    a, b = (x, y) if g.r.random() < 0.75 else (y, x)
    scalar = y not in g.ns
    out = g.new()
    if op in ("+", "-", "*", "/", "//", "%", "**"):
        code = f"{out} = {a} {op} {b}"
    elif op == "where":
        c = g.pick(lambda n, t, m: t.dtype == torch.bool and m["exact"])
        if c is None:
            c = g.input(shape=tx.shape[g.r.randrange(tx.dim() + 1):], dtype="bool", grad=False)
            if c is None:
                return
        code = f"{out} = torch.where({c}, {x}, {y})"
    elif op == "div_floor":
        code = f"{out} = torch.div({a}, {b}, rounding_mode='floor')"
    elif op == "div_trunc":
        code = f"{out} = torch.div({a}, {b}, rounding_mode='trunc')"
    elif op == "add_alpha":
        code = f"{out} = torch.add({x}, {y}, alpha={g.r.choice([2, -1, 0.5])})"
    elif scalar and op in ("maximum", "minimum", "atan2", "fmax", "copysign", "logical_and", "logical_or",
                           "logical_xor"):
        code = f"{out} = torch.{op}({x}, torch.tensor({y}))"
    else:
        code = f"{out} = torch.{op}({a}, {b})"
    res_exact = both_exact and (op in BIN_EXACT or op in BIN_DISCONT)
    if not anyf and both_exact:
        res_exact = op not in ("/", "**", "atan2")
    g.emit(code, "binary", op, [out], exact=res_exact)


REDUCE = ["sum", "mean", "amax", "amin", "prod", "argmax", "argmin", "any", "all", "max", "min", "std", "var",
          "logsumexp", "norm", "count_nonzero", "nansum"]


def op_reduce(g):
    x = g.pick()
    if x is None:
        return
    t = g.T(x)
    ops = list(REDUCE)
    if not g.exact(x) and _isfloat(t):
        ops = [o for o in ops if o not in ("argmax", "argmin", "any", "all", "count_nonzero")]
    op = g.r.choice(ops)
    out = g.new()
    kd = g.r.random() < 0.4
    nd = t.dim()
    if g.r.random() < 0.3 and nd >= 2 and op in ("sum", "mean", "amax", "amin", "any", "all", "std", "var",
                                                  "logsumexp", "norm", "count_nonzero", "nansum"):
        dims = tuple(g.r.sample(range(nd), g.r.randrange(1, nd + 1)))
        dims = tuple(d - nd if g.r.random() < 0.3 else d for d in dims)
        dim = repr(dims)
    else:
        dm = g.dim(t, allow_none=True)
        dim = None if dm is None else repr(dm)
    ex = g.exact(x) and op in ("amax", "amin", "argmax", "argmin", "any", "all", "max", "min", "count_nonzero")
    if op in ("max", "min"):
        if dim is None:
            code = f"{out} = {x}.{op}()"
            return g.emit(code, "reduce", op, [out], exact=ex)
        idx = g.new("i") if g.exact(x) or not _isfloat(t) else "_" + g.new("i")
        code = f"{out}, {idx} = {x}.{op}({dim}{', keepdim=True' if kd else ''})"
        return g.emit(code, "reduce", op + "_dim", [out, idx], exact=ex)
    if op == "count_nonzero":
        code = f"{out} = torch.count_nonzero({x}{'' if dim is None else ', ' + dim})"
        return g.emit(code, "reduce", op, [out], exact=ex)
    args = []
    if dim is not None:
        args.append(dim)
        if kd:
            args.append("keepdim=True")
    elif op in ("logsumexp",):
        args.append(repr(tuple(range(nd))))
    if op == "sum" and g.r.random() < 0.15:
        args.append(f"dtype=torch.{g.r.choice(['float32', 'int64', 'float16'])}")
    if op in ("std", "var") and g.r.random() < 0.3:
        args.append("unbiased=False" if dim is None else "correction=0")
    if op == "norm" and g.r.random() < 0.4:
        args.insert(0, "p=" + g.r.choice(["1", "inf", "3"]))
        if dim is not None:
            args[1] = "dim=" + args[1]
    code = f"{out} = {x}.{op}({', '.join(args)})"
    g.emit(code, "reduce", op, [out], exact=ex)


def op_matmul(g):
    x = g.pick(lambda n, t, m: t.dim() >= 1)
    if x is None:
        return
    t = g.T(x)
    r = g.r
    dt = str(t.dtype).split(".")[1]
    if r.random() < 0.05:
        dt = g.dtype()
    k = t.shape[-1] + (1 if r.random() < 0.04 else 0)
    form = r.choice(["@", "matmul", "mm", "bmm", "mv", "dot"])
    if form == "mm" and t.dim() != 2 or form == "bmm" and t.dim() != 3 or form in ("mv",) and t.dim() != 2 \
            or form == "dot" and t.dim() != 1:
        form = "@"
    if t.dim() == 1 or form in ("mv", "dot"):
        ys = (k,) if form in ("mv", "dot") or r.random() < 0.4 else (k, r.randrange(0, 4))
    else:
        m = r.choice([0, 1, 2, 3, 4])
        ys = (k, m)
        if t.dim() >= 3 and r.random() < 0.6:
            ys = tuple(t.shape[:-2]) + ys if form == "bmm" or r.random() < 0.6 else (1,) + ys
        elif form == "bmm":
            ys = (t.shape[0],) + ys
    y = g.input(shape=ys, dtype=dt, layout=None)
    if y is None:
        return
    out = g.new()
    code = f"{out} = {x} @ {y}" if form == "@" else f"{out} = torch.{form}({x}, {y})"
    g.emit(code, "matmul", form, [out], exact=False)


def _factor_shape(r, n, nd):
    s = []
    for _ in range(nd - 1):
        divs = [v for v in range(1, n + 1) if n % v == 0] if n else [0, 1, 2]
        v = r.choice(divs)
        s.append(v)
        n = n // v if v else n
    s.append(n)
    r.shuffle(s)
    return s


def op_view(g):
    x = g.pick()
    if x is None:
        return
    t = g.T(x)
    r = g.r
    nd = t.dim()
    out = g.new("v")
    ops = ["view", "reshape", "transpose", "permute", "narrow", "select", "slice", "unsqueeze", "squeeze",
           "expand", "diagonal", "unfold", "flatten", "t", "split", "movedim", "index_int"]
    op = r.choice(ops)
    if nd == 0 and op in ("transpose", "narrow", "select", "slice", "diagonal", "split", "movedim", "index_int"):
        op = r.choice(["view", "unsqueeze", "expand", "unfold", "reshape"])
    if op in ("view", "reshape"):
        s = _factor_shape(r, t.numel(), r.randrange(0 if t.numel() == 1 else 1, 4))
        if s and r.random() < 0.3:
            s[r.randrange(len(s))] = -1
        if r.random() < 0.04:
            s = s + [2]
        code = f"{out} = {x}.{op}({tuple(s)})"
    elif op == "transpose":
        code = f"{out} = {x}.transpose({r.randrange(nd)}, {r.randrange(-nd, nd)})"
    elif op == "t":
        code = f"{out} = {x}.t()"
    elif op == "permute":
        p = list(range(nd))
        r.shuffle(p)
        code = f"{out} = {x}.permute{tuple(p) if nd != 1 else '(0,)'}"
    elif op == "movedim":
        code = f"{out} = {x}.movedim({r.randrange(nd)}, {r.randrange(nd)})"
    elif op == "narrow":
        dm = r.randrange(nd)
        n = t.shape[dm]
        st = r.randrange(n + 1)
        ln = r.randrange(n - st + 1)
        code = f"{out} = {x}.narrow({dm}, {st}, {ln})"
    elif op == "select":
        dm = r.randrange(nd)
        n = t.shape[dm]
        i = r.randrange(-n, n) if n else 0
        code = f"{out} = {x}.select({dm}, {i})"
    elif op == "index_int":
        n = t.shape[0]
        i = r.randrange(-n, n) if n else 0
        code = f"{out} = {x}[{i}]"
    elif op == "slice":
        parts = []
        for dm in range(r.randrange(1, nd + 1)):
            n = t.shape[dm]
            a = r.choice([None, 0, 1, -1, r.randrange(-n - 1, n + 2)])
            b = r.choice([None, n, -1, r.randrange(-n - 1, n + 2)])
            s = r.choice([None, 1, 2, 3])
            parts.append(f"{'' if a is None else a}:{'' if b is None else b}{'' if s is None else ':' + str(s)}")
        if r.random() < 0.2:
            parts.insert(r.randrange(len(parts) + 1), "None")
        if r.random() < 0.15:
            parts.insert(0, "...")
            parts = parts[: 1 + min(len(parts) - 1, nd)]
        code = f"{out} = {x}[{', '.join(parts)}]"
    elif op == "unsqueeze":
        code = f"{out} = {x}.unsqueeze({r.randrange(-nd - 1, nd + 1)})"
    elif op == "squeeze":
        code = f"{out} = {x}.squeeze({r.randrange(nd) if r.random() < 0.7 else ''})"
    elif op == "expand":
        s = [r.choice([v, 2, 3]) if v == 1 else (v if r.random() < 0.85 else -1) for v in t.shape]
        if r.random() < 0.4:
            s = [r.choice([1, 2])] + s
        code = f"{out} = {x}.expand({tuple(s)})"
    elif op == "diagonal":
        if nd < 2:
            code = f"{out} = {x}.diagonal()"
        else:
            d1, d2 = r.sample(range(nd), 2)
            code = f"{out} = {x}.diagonal({r.choice([0, 0, 1, -1, 2])}, {d1}, {d2})"
    elif op == "unfold":
        dm = r.randrange(nd) if nd else 0
        n = t.shape[dm] if nd else 1
        size = r.randrange(0, n + 1) if r.random() < 0.9 else n + 1
        code = f"{out} = {x}.unfold({dm}, {size}, {r.choice([1, 1, 2, 3])})"
    elif op == "flatten":
        code = f"{out} = {x}.flatten({'' if nd < 2 or r.random() < 0.5 else '1'})"
    else:  # split
        dm = r.randrange(nd)
        n = t.shape[dm]
        sz = r.randrange(1, n + 1) if n else 1
        k = r.randrange(-((n + sz - 1) // sz) if n else -1, max((n + sz - 1) // sz, 1))
        code = f"{out} = {x}.split({sz}, {dm})[{k}]"
    ok = g.emit(code, "view", op, [out], exact=g.exact(x), group=g.meta[x]["group"])
    if ok and g.r.random() < 0.75:
        op_inplace(g, target=out)


INPLACE = ["add_", "sub_", "mul_", "div_", "fill_", "zero_", "copy_", "clamp_", "neg_", "relu_", "exp_",
           "masked_fill_", "setitem", "index_fill_", "clamp_min_", "abs_"]


def op_inplace(g, target=None):
    r = g.r
    if target is None:
        target = g.pick(lambda n, t, m: not t.requires_grad or r.random() < 0.1)
    if target is None:
        return
    t = g.T(target)
    op = r.choice(INPLACE)
    src_exact = True
    if op in ("add_", "sub_", "mul_", "div_", "copy_"):
        y, src_exact = g.partner(target)
        if g.done:
            return
        if op == "copy_" and y not in g.ns:
            y = f"torch.tensor({y})"
        code = f"{target}.{op}({y})"
        ex = src_exact and op == "copy_"
    elif op == "fill_":
        v = r.choice([0, 1, -2, 0.5, NAN, -INF, True])
        code, ex = f"{target}.fill_({_lit(v)})", True
    elif op == "clamp_":
        code, ex = f"{target}.clamp_({_lit(r.choice([-1, 0, -0.5]))}, {_lit(r.choice([1, 2, 0.25]))})", True
    elif op == "clamp_min_":
        code, ex = f"{target}.clamp_min_(0)", True
    elif op in ("zero_", "neg_", "relu_", "exp_", "abs_"):
        code, ex = f"{target}.{op}()", op != "exp_"
    elif op == "masked_fill_":
        m = g.input(shape=t.shape[r.randrange(t.dim() + 1):], dtype="bool", grad=False, layout="c")
        if m is None:
            return
        code, ex = f"{target}.masked_fill_({m}, {_lit(r.choice([0, -1.5, NAN, 3]))})", True
    elif op == "index_fill_":
        if t.dim() == 0:
            code = f"{target}.index_fill_(0, torch.tensor([0]).to(d), 2)"
        else:
            dm = r.randrange(t.dim())
            n = t.shape[dm]
            idx = [r.randrange(n) for _ in range(r.randrange(3))] if n else []
            code = f"{target}.index_fill_({dm}, torch.tensor({idx}, dtype=torch.long).to(d), {_lit(r.choice([7, -0.5]))})"
        ex = True
    else:  # setitem
        if t.dim() == 0:
            code = f"{target}[...] = {_lit(r.choice([1, 2.5]))}"
        else:
            n = t.shape[0]
            key = r.choice(["int", "slice", "adv", "mask"])
            if key == "int" and n:
                k = str(r.randrange(-n, n))
            elif key == "adv" and n:
                k = f"torch.tensor({sorted(set(r.randrange(n) for _ in range(3)))}).to(d)"
            elif key == "mask":
                k = g.input(shape=t.shape[:r.randrange(1, t.dim() + 1)], dtype="bool", grad=False, layout="c")
                if k is None:
                    return
            else:
                k = f"{r.randrange(n + 1)}::{r.choice([1, 2])}"
            v = _lit(r.choice([0, 5, -1.25, NAN, 4]))
            code = f"{target}[{k}] = {v}"
        ex = True
    ok = g.emit(code, "inplace", op, [], exact=True)
    if ok:
        grp = g.meta[target]["group"]
        if not (ex and src_exact):
            for n, m in g.meta.items():
                if m["group"] == grp:
                    m["exact"] = False
        # Read the base of the view back in a later op sometimes.
        if r.random() < 0.4:
            bases = [n for n, m in g.meta.items() if m["group"] == grp and n != target]
            if bases:
                b = r.choice(bases)
                out = g.new()
                g.emit(f"{out} = {b} * 1", "read", "base*1", [out], exact=g.exact(b))


def _long_list(r, shape, lo, hi):
    if not shape:
        return r.randrange(lo, hi) if hi > lo else 0
    return [_long_list(r, shape[1:], lo, hi) for _ in range(shape[0])]


def _perm_index(r, shape, dim, n):
    """Nested list of `shape` whose entries along `dim` are distinct values in [0, n)."""
    import itertools
    idx = torch.zeros(shape, dtype=torch.long)
    other = [range(s) for i, s in enumerate(shape) if i != dim]
    for pos in itertools.product(*other):
        p = list(range(n))
        r.shuffle(p)
        for j in range(shape[dim]):
            full = list(pos)
            full.insert(dim, j)
            idx[tuple(full)] = p[j]
    return idx.tolist()


def op_index(g):
    x = g.pick()
    if x is None:
        return
    t = g.T(x)
    r = g.r
    nd = t.dim()
    out = g.new()
    op = r.choice(["adv", "adv2", "mask", "index_select", "gather", "take", "masked_fill", "basic",
                   "take_along_dim", "index_put", "scatter", "scatter_add", "scatter_reduce", "index_add",
                   "masked_select", "nonzero", "index_copy"])
    if nd == 0 and op not in ("mask", "masked_fill", "take", "nonzero", "masked_select"):
        op = r.choice(["mask", "masked_fill", "take"])
    bad = r.random() < 0.04
    ex = g.exact(x)
    if op == "adv":
        n = t.shape[0]
        ishape = g.shape(2)
        idx = _long_list(r, ishape, -n, n + (1 if bad else 0)) if n else _long_list(r, ishape, 0, 1 if bad else 0)
        if not n and not bad:
            ishape = (0,)
            idx = []
        pre = ":, " if nd >= 2 and r.random() < 0.3 else ""
        if pre:
            n1 = t.shape[1]
            idx = _long_list(r, ishape, -n1, n1) if n1 else []
        code = f"{out} = {x}[{pre}torch.tensor({idx}, dtype=torch.long).to(d)]"
    elif op == "adv2" and nd >= 2:
        k = r.randrange(1, 4)
        a = [r.randrange(t.shape[0]) if t.shape[0] else 0 for _ in range(k)]
        b = [r.randrange(t.shape[1]) if t.shape[1] else 0 for _ in range(k)]
        code = f"{out} = {x}[torch.tensor({a}).to(d), torch.tensor({b}).to(d)]"
        if not t.shape[0] or not t.shape[1]:
            code = f"{out} = {x}[torch.tensor([], dtype=torch.long).to(d), torch.tensor([], dtype=torch.long).to(d)]"
    elif op == "mask":
        k = r.randrange(nd + 1)
        ms = list(t.shape[:k])
        if bad and ms:
            ms[0] += 1
        m = g.pick(lambda n, tt, mm: tt.dtype == torch.bool and mm["exact"] and list(tt.shape) == ms) \
            if r.random() < 0.5 else None
        m = m or g.input(shape=ms, dtype="bool", grad=False, layout="c")
        if m is None:
            return
        code = f"{out} = {x}[{m}]"
    elif op == "masked_fill":
        m = g.input(shape=t.shape[r.randrange(nd + 1):], dtype="bool", grad=False, layout="c")
        if m is None:
            return
        code = f"{out} = {x}.masked_fill({m}, {_lit(r.choice([0, -1.5, NAN, 3, INF]))})"
    elif op == "take":
        n = t.numel()
        idx = _long_list(r, g.shape(2), -n, n) if n else []
        code = f"{out} = torch.take({x}, torch.tensor({idx}, dtype=torch.long).to(d))"
    elif op == "nonzero":
        code = f"{out} = torch.nonzero({x})"
    elif op == "masked_select":
        m = g.input(shape=t.shape[r.randrange(nd + 1):], dtype="bool", grad=False, layout="c")
        if m is None:
            return
        code = f"{out} = torch.masked_select({x}, {m})"
    elif op == "basic" or op == "adv2":
        parts = []
        for dm in range(r.randrange(1, nd + 1)):
            n = t.shape[dm]
            parts.append(r.choice([f"{r.randrange(n) if n else 0}:", "...", "None", ":", f"{r.randrange(-n, n) if n else 0}"]))
        if parts.count("...") > 1:
            parts = [p if p != "..." else ":" for p in parts]
            parts[0] = "..."
        code = f"{out} = {x}[{', '.join(parts)}]"
    else:
        dm = r.randrange(nd)
        n = t.shape[dm]
        if op == "index_select":
            k = r.choice([0, 1, 2, 3, 4])
            idx = [r.randrange(n) for _ in range(k)] if n else []
            if bad:
                idx.append(n)
            it = r.choice(["long", "long", "int32"])
            code = f"{out} = {x}.index_select({dm}, torch.tensor({idx}, dtype=torch.{it}).to(d))"
        elif op in ("gather", "take_along_dim"):
            ishape = [r.randrange(0, s + 1) if i != dm else r.randrange(0, 4) for i, s in enumerate(t.shape)]
            if op == "take_along_dim":
                ishape = [s if i != dm else ishape[i] for i, s in enumerate(t.shape)]
            idx = _long_list(r, ishape, 0, n + (1 if bad else 0)) if n else torch.zeros(ishape, dtype=torch.long).tolist()
            if n == 0 and ishape[dm]:
                ishape[dm] = 0
                idx = torch.zeros(ishape, dtype=torch.long).tolist()
            it = f"torch.tensor({idx}, dtype=torch.long).reshape({tuple(ishape)}).to(d)"
            code = f"{out} = torch.{op}({x}, {it}, {dm})" if op == "take_along_dim" else f"{out} = torch.gather({x}, {dm}, {it})"
        elif op in ("scatter", "scatter_add", "scatter_reduce"):
            ishape = [r.randrange(0, s + 1) for s in t.shape]
            idx = _perm_index(r, ishape, dm, n) if n else torch.zeros(ishape, dtype=torch.long).tolist()
            if op != "scatter":
                idx = _long_list(r, ishape, 0, n) if n else idx
            it = f"torch.tensor({idx}, dtype=torch.long).reshape({tuple(ishape)}).to(d)"
            dt = str(t.dtype).split(".")[1]
            src = g.input(shape=ishape, dtype=dt, grad=False, layout="c")
            if src is None:
                return
            if op == "scatter":
                code = f"{out} = torch.scatter({x}, {dm}, {it}, {src})"
            elif op == "scatter_add":
                code = f"{out} = torch.scatter_add({x}, {dm}, {it}, {src})"
            else:
                red = r.choice(["sum", "prod", "amax", "amin", "mean"])
                code = (f"{out} = torch.scatter_reduce({x}, {dm}, {it}, {src}, {red!r}, "
                        f"include_self={r.choice([True, False])})")
                ex = ex and red in ("amax", "amin")
            ex = ex and op == "scatter"
        elif op in ("index_put", "index_add", "index_copy"):
            k = r.randrange(0, n + 1) if n else 0
            idx = r.sample(range(n), k) if n else []
            acc = r.choice([True, False])
            if op == "index_add" or (op == "index_put" and acc):
                idx = [r.randrange(n) for _ in range(k)] if n else []
            dt = str(t.dtype).split(".")[1]
            if op == "index_put":
                vs = list(t.shape[1:])
                if r.random() < 0.3:
                    vs = vs[1:] if vs else []
                else:
                    vs = [len(idx)] + vs
                v = g.input(shape=vs, dtype=dt, grad=False, layout="c")
                if v is None:
                    return
                code = f"{out} = {x}.index_put((torch.tensor({idx}, dtype=torch.long).to(d),), {v}, accumulate={acc})"
                ex = ex and not acc
            else:
                vs = list(t.shape)
                vs[dm] = len(idx)
                v = g.input(shape=vs, dtype=dt, grad=False, layout="c")
                if v is None:
                    return
                code = f"{out} = {x}.{op}({dm}, torch.tensor({idx}, dtype=torch.long).to(d), {v})"
                ex = ex and op == "index_copy"
        else:
            return
    g.emit(code, "index", op, [out], exact=ex)


def op_sort(g):
    r = g.r
    x = g.pick(lambda n, t, m: m["exact"])
    if x is None:
        return
    t = g.T(x)
    out = g.new()
    dm = g.dim(t)
    op = r.choice(["sort", "argsort", "topk", "cumsum", "cumprod", "cummax", "msort", "logcumsumexp", "kthvalue"])
    if op == "sort":
        st = r.random() < 0.5
        idx = g.new("i") if st else "_" + g.new("i")
        code = f"{out}, {idx} = {x}.sort({dm}, descending={r.choice([True, False])}{', stable=True' if st else ''})"
        ok = g.emit(code, "sort", op, [out, idx], exact=True)
        if ok and not st:
            o2 = g.new()
            g.emit(f"{o2} = {x}.gather({dm}, {idx})", "sort", "sort_indices_gather", [o2], exact=True)
        return
    if op == "argsort":
        code = f"{out} = {x}.argsort({dm}, descending={r.choice([True, False])}, stable=True)"
        return g.emit(code, "sort", op, [out], exact=True)
    if op == "topk":
        n = t.shape[dm] if t.dim() else 1
        k = r.randrange(0, n + 1) if r.random() < 0.95 else n + 1
        idx = "_" + g.new("i")
        code = f"{out}, {idx} = {x}.topk({k}, {dm}, largest={r.choice([True, False])})"
        ok = g.emit(code, "sort", op, [out, idx], exact=True)
        if ok:
            o2 = g.new()
            g.emit(f"{o2} = {x}.gather({dm}, {idx})", "sort", "topk_indices_gather", [o2], exact=True)
        return
    if op == "cummax":
        idx = g.new("i")
        return g.emit(f"{out}, {idx} = {x}.cummax({dm})", "sort", op, [out, idx], exact=True)
    if op == "kthvalue":
        n = t.shape[dm] if t.dim() else 1
        idx = "_" + g.new("i")
        return g.emit(f"{out}, {idx} = {x}.kthvalue({r.randrange(1, n + 1) if n else 1}, {dm})", "sort", op,
                      [out, idx], exact=True)
    if op == "msort":
        return g.emit(f"{out} = torch.msort({x})", "sort", op, [out], exact=True)
    extra = f", dtype=torch.{r.choice(['float32', 'int64'])}" if op == "cumsum" and r.random() < 0.2 else ""
    g.emit(f"{out} = {x}.{op}({dm}{extra})", "cumsum", op, [out], exact=not _isfloat(t) and op != "logcumsumexp")


def op_norm(g):
    r = g.r
    x = g.pick()
    if x is None:
        return
    t = g.T(x)
    out = g.new()
    op = r.choice(["softmax", "log_softmax", "layer_norm", "normalize", "softmax_dtype"])
    dm = g.dim(t)
    if op == "softmax":
        code = f"{out} = {x}.softmax({dm})"
    elif op == "softmax_dtype":
        code = f"{out} = F.softmax({x}, {dm}, dtype=torch.float32)"
    elif op == "log_softmax":
        code = f"{out} = F.log_softmax({x}, {dm})"
    elif op == "normalize":
        code = f"{out} = F.normalize({x}, dim={dm})"
    else:
        k = r.randrange(0, t.dim() + 1)
        ns = tuple(t.shape[t.dim() - k:])
        dt = str(t.dtype).split(".")[1]
        args = ""
        if r.random() < 0.5 and dt in FLOATS:
            w = g.input(shape=ns, dtype=dt, layout="c", special=False)
            b = g.input(shape=ns, dtype=dt, layout="c", special=False)
            if w is None or b is None:
                return
            args = f", {w}, {b}"
        code = f"{out} = F.layer_norm({x}, {ns}{args})"
    g.emit(code, "norm", op, [out], exact=False)


def op_cast(g):
    r = g.r
    x = g.pick()
    if x is None:
        return
    t = g.T(x)
    dt = g.dtype()
    if _isfloat(t) and dt not in FLOATS:
        t = t.detach()
        fin = t.numel() == 0 or bool(torch.isfinite(t).all()) and float(t.abs().max()) < 2 ** 31
        if not g.exact(x) or (dt != "bool" and not fin):
            dt = r.choice(FLOATS)
    out = g.new()
    form = r.choice(["to", "method"])
    short = {"float32": "float", "bfloat16": "bfloat16", "float16": "half", "int64": "long", "int32": "int",
             "bool": "bool"}
    code = f"{out} = {x}.to(torch.{dt})" if form == "to" else f"{out} = {x}.{short[dt]}()"
    g.emit(code, "cast", f"{str(t.dtype)[6:]}->{dt}", [out], exact=g.exact(x))


OPS = [(op_unary, 16), (op_binary, 22), (op_reduce, 12), (op_matmul, 6), (op_view, 16), (op_inplace, 6),
       (op_index, 12), (op_sort, 6), (op_norm, 5), (op_cast, 6)]


def generate(seed: int) -> Program:
    g = _Gen(seed)
    r = g.r
    for _ in range(r.choice([1, 1, 2, 2, 3])):
        g.input()
        if g.done:
            return g.prog
    n_ops = r.randrange(3, 9)
    fns, w = zip(*OPS)
    tries = 0
    while n_ops > 0 and not g.done and tries < 40:
        tries += 1
        before = len(g.prog.steps)
        try:
            r.choices(fns, weights=w)[0](g)
        except (ValueError, IndexError, ZeroDivisionError, TypeError, KeyError, RuntimeError):
            pass  # the generator asked for something impossible here (e.g. a dim of a 0-dim tensor)
        if len(g.prog.steps) > before:
            n_ops -= 1
            if not g.done and r.random() < 0.12:
                g.emit("sync()", "sync", "sync", [])
    if not g.done:
        # Autograd: backward of a sum through whatever requires grad, then compare the grads.
        leaves = [m["leaf"] for m in g.meta.values() if m.get("leaf")]
        leaves = sorted(set(leaves), key=lambda s: (len(s), s))
        tgt = g.pick(lambda n, t, m: t.requires_grad and _isfloat(t))
        if leaves and tgt is not None:
            ok = g.emit(f"{tgt}.float().sum().backward()", "autograd", "backward", [])
            if ok:
                for lf in leaves:
                    if g.ns[lf].grad is not None:
                        g.emit(f"{lf}_grad = {lf}.grad", "autograd", "grad", [f"{lf}_grad"], exact=False)
    return g.prog


# ---------------------------------------------------------------------- running and comparing
@dataclass
class Outcome:
    values: dict            # name -> cpu tensor / python value
    error: tuple | None     # (step index or "read", exception type, message)


def _snap(v):
    if isinstance(v, torch.Tensor):
        return v.detach().cpu().clone()
    return v


def execute(prog: Program, device, sync=None) -> Outcome:
    is_xla = torch.device(device).type != "cpu"
    if is_xla:
        import torch_xla
        sync_fn = torch_xla.sync
    else:
        sync_fn = lambda: None  # noqa: E731
    ns = namespace(torch.device(device), sync_fn)
    err = None
    values = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, s in enumerate(prog.steps):
            try:
                exec(s.code, ns)
            except Exception as e:  # noqa: BLE001
                err = (i, type(e), str(e).split("\n")[0][:300])
                e.__traceback__ = None
                del e
                break
        try:
            if is_xla:
                sync_fn()
            for n in prog.names():
                if n in ns:
                    values[n] = _snap(ns[n])
        except Exception as e:  # noqa: BLE001
            if err is None:
                err = ("read", type(e), str(e).split("\n")[0][:300])
            e.__traceback__ = None
            del e
    ns.clear()
    return Outcome(values, err)


TOL = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (3e-2, 2e-2), torch.float16: (4e-3, 2e-3),
       torch.float64: (1e-7, 1e-9)}


def compare_values(e, x, lowp=None):
    """None if equal enough, else a short description. lowp: the bf16/f16 dtype whose rounding `e`
    went through (a float32/float64 value is then compared at that dtype's tolerance)."""
    if isinstance(e, torch.Tensor):
        if not isinstance(x, torch.Tensor):
            return f"type {type(x).__name__} != Tensor"
        if e.dtype != x.dtype:
            return f"dtype {x.dtype} != eager {e.dtype}"
        if e.shape != x.shape:
            return f"shape {tuple(x.shape)} != eager {tuple(e.shape)}"
        if e.numel() == 0:
            return None
        if e.dtype.is_floating_point or e.dtype.is_complex:
            ed, xd = e.double(), x.double()
            en, xn = torch.isnan(ed), torch.isnan(xd)
            if not torch.equal(en, xn):
                return "nan positions differ"
            ei, xi = torch.isinf(ed), torch.isinf(xd)
            if not torch.equal(ei, xi) or not torch.equal(ed[ei], xd[xi]):
                return "inf positions/signs differ"
            fin = ~(en | ei)
            if fin.any():
                rt, at = TOL[e.dtype]
                if lowp is not None and e.dtype in (torch.float32, torch.float64):
                    rt, at = TOL[lowp]
                ef, xf = ed[fin], xd[fin]
                scale = max(1.0, float(ef.abs().max()))
                bad = (ef - xf).abs() > at * scale + rt * ef.abs()
                if bad.any():
                    k = int(bad.nonzero()[0])
                    return f"values differ (e.g. eager {ef[k].item():.6g} vs {xf[k].item():.6g}, {int(bad.sum())} elements)"
            return None
        if not torch.equal(e, x):
            return "values differ"
        return None
    if e != x and not (isinstance(e, float) and math.isnan(e) and isinstance(x, float) and math.isnan(x)):
        return f"{x!r} != eager {e!r}"
    return None


@dataclass
class Mismatch:
    kind: str        # value | shape | dtype | nan | inf | xla_raises | no_raise | wrong_exc | poisoned
    detail: str
    step: int | None  # step index the mismatch is attributed to (None: unknown)


def _kind(msg):
    if msg.startswith("dtype"):
        return "dtype"
    if msg.startswith("shape"):
        return "shape"
    if msg.startswith("nan"):
        return "nan"
    if msg.startswith("inf"):
        return "inf"
    return "value"


# Programs eager runs whose result depends on its kernels' iteration order: we refuse them with a
# clear error (README, "Never a wrong answer"), which is not a mismatch.
DOCUMENTED_REFUSALS = ("writes in place into a tensor whose elements overlap in memory",
                       "share elements at different positions")


def check(prog: Program, device=None) -> list:
    """Runs `prog` on eager CPU and on the xla device; returns a list of Mismatch (empty: agree)."""
    import torch_xla
    device = device or torch_xla.device()
    ref = execute(prog, "cpu")
    got = execute(prog, device)
    out = []
    if ref.error is not None:
        ei, et, em = ref.error
        if got.error is None:
            out.append(Mismatch("no_raise", f"eager raised {et.__name__} at step {ei} ({em}); xla did not", ei))
        else:
            gi, gt, gm = got.error
            if gt is not et:
                out.append(Mismatch("wrong_exc", f"eager {et.__name__} at step {ei} ({em}); xla {gt.__name__} at "
                                                 f"step {gi} ({gm})", ei))
            elif gi != "read" and gi < ei:
                out.append(Mismatch("xla_raises", f"xla raised {gt.__name__} at step {gi} before eager's step {ei}: {gm}", gi))
    elif got.error is not None:
        gi, gt, gm = got.error
        if not any(d in str(gm) for d in DOCUMENTED_REFUSALS):
            out.append(Mismatch("xla_raises", f"xla raised {gt.__name__} at step {gi}: {gm}", gi if gi != "read" else None))
    else:
        lowp = prog.lowp()
        for n in prog.names():
            if n not in ref.values:
                continue
            msg = compare_values(ref.values[n], got.values.get(n), lowp.get(n))
            if msg:
                step = next((i for i, s in enumerate(prog.steps) if n in s.outs), None)
                out.append(Mismatch(_kind(msg), f"{n}: {msg}", step))
    gc.collect()
    try:
        torch_xla.sync()
    except Exception as e:  # noqa: BLE001
        out.append(Mismatch("poisoned", f"sync after the program raised {type(e).__name__}: {str(e)[:200]}", None))
        e.__traceback__ = None
    return out


def signature(mm: list) -> str:
    return ",".join(sorted({m.kind for m in mm}))


def _used_later(steps, i):
    import re
    later = "\n".join(s.code for s in steps[i + 1:])
    return any(re.search(r"\b" + re.escape(n) + r"\b", later) for n in steps[i].outs)


def minimize(prog: Program, mm: list, budget=30) -> tuple:
    """Shortest prefix that still mismatches the same way (starting at the step the first mismatch
    points to), then drops steps whose results nothing later uses. Returns (program, mismatches)."""
    sig = signature(mm)
    best, best_mm = prog, mm
    runs = 0
    marks = [m.step for m in mm if isinstance(m.step, int)]
    for k in range(min(marks) + 1 if marks else 1, len(prog.steps)):
        if runs >= budget:
            return best, best_mm
        p = Program(prog.seed, prog.steps[:k])
        runs += 1
        m = check(p)
        if m and signature(m) == sig:
            best, best_mm = p, m
            break
    changed = True
    while changed and runs < budget:
        changed = False
        i = len(best.steps) - 2
        while i >= 0 and runs < budget:
            if not _used_later(best.steps, i):
                cand = Program(best.seed, best.steps[:i] + best.steps[i + 1:])
                runs += 1
                m = check(cand)
                if m and signature(m) == sig:
                    best, best_mm, changed = cand, m, True
            i -= 1
    return best, best_mm


def culprit(prog: Program, mm: list) -> str:
    """Category/op of the step a (minimized) program's mismatch points to: the last non-sync step."""
    steps = [s for s in prog.steps if s.cat not in ("sync", "read")] or prog.steps
    s = steps[-1]
    return f"{s.cat}:{s.op}"


def report(prog: Program, mm: list) -> str:
    lines = [f"seed {prog.seed}: " + "; ".join(f"[{m.kind}] {m.detail}" for m in mm), prog.body("    ")]
    return "\n".join(lines)
