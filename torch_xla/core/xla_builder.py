"""Build XLA computations from Python (upstream PyTorch/XLA's ``torch_xla.core.xla_builder``).

Upstream wraps ``xla::XlaOp`` handles of an XlaBuilder. Here an :class:`Op` wraps a lazy tensor on
an XLA device: every builder method records the equivalent aten op into our IR, so a computation
built with this module is traced, fused, cached and compiled like any other graph (to StableHLO, by
XLA). Elementwise operators follow XLA's semantics where they differ from torch's (``Rem`` is C's
``fmod``, shifts are logical on unsigned types, integer division truncates); operands may also
broadcast as in torch, a superset of XLA's equal-shape rule. What is not provided raises
``NotImplementedError`` naming the method.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

import torch

__all__ = ["Type", "Shape", "Op", "Builder", "Computation", "create_builder", "create_computation",
           "get_computation_hlo", "mkop", "mkparam"]


class _NotProvided(AttributeError, NotImplementedError):
    """A builder method this implementation does not provide (still an AttributeError for hasattr)."""


class Type:
    F32 = "f32"
    F64 = "f64"
    BF16 = "bf16"
    F16 = "f16"
    U8 = "u8"
    S8 = "s8"
    U16 = "u16"
    S16 = "s16"
    U32 = "u32"
    S32 = "s32"
    U64 = "u64"
    S64 = "s64"
    C64 = "c64"
    C128 = "c128"
    PRED = "pred"


_TORCH = {
    Type.F32: torch.float32, Type.F64: torch.float64, Type.BF16: torch.bfloat16, Type.F16: torch.float16,
    Type.U8: torch.uint8, Type.S8: torch.int8, Type.S16: torch.int16, Type.S32: torch.int32,
    Type.S64: torch.int64, Type.C64: torch.complex64, Type.C128: torch.complex128, Type.PRED: torch.bool,
    Type.U16: getattr(torch, "uint16", None), Type.U32: getattr(torch, "uint32", None),
    Type.U64: getattr(torch, "uint64", None),
}
_XLA = {v: k for k, v in _TORCH.items() if v is not None}


def _dtype(t):
    if isinstance(t, torch.dtype):
        return t
    d = _TORCH.get(t)
    if d is None:
        raise ValueError(f"xla_builder: unknown or unsupported element type {t!r}")
    return d


class Shape:
    """An XLA shape: ``{'type': 'f32', 'sizes': (2, 3)}`` (a tuple shape is a list of those)."""

    def __init__(self, shape):
        self._shape = shape

    @classmethod
    def create(cls, dtype, sizes, dynamic_dimensions=None):
        d = {"type": str(dtype), "sizes": tuple(sizes)}
        if dynamic_dimensions is not None:
            d["dynamic_dimensions"] = tuple(dynamic_dimensions)
        return cls(d)

    @property
    def shape(self):
        return self._shape

    def is_tuple(self):
        return isinstance(self._shape, (list, tuple))

    def tuple_size(self):
        assert self.is_tuple()
        return len(self._shape)

    def tuple_shape(self, index):
        assert self.is_tuple()
        return self._shape[index]

    def is_dynamic(self):
        return not self.is_tuple() and "dynamic_dimensions" in self._shape

    def as_scalar(self):
        return Shape.create(self.dtype, ())

    @property
    def rank(self):
        return len(self.sizes)

    @property
    def sizes(self):
        assert not self.is_tuple()
        return tuple(self._shape["sizes"])

    @property
    def dynamic_dimensions(self):
        return None if self.is_tuple() else self._shape.get("dynamic_dimensions")

    @property
    def dtype(self):
        assert not self.is_tuple()
        return self._shape["type"]

    def __repr__(self):
        return f"Shape({self._shape!r})"


class Builder:
    """The builder an :class:`Op` belongs to: the device its values live on."""

    def __init__(self, name="", device=None):
        import torch_xla
        self.name = name
        self.device = device if device is not None else torch_xla.device()


def create_builder(name):
    return Builder(name)


def _unwrap(x):
    return x.op if isinstance(x, Op) else x


class Op:
    """A value of a computation being built (upstream: a wrapped ``xla::XlaOp``)."""

    def __init__(self, op, builder=None):
        if isinstance(op, Op):
            op = op.op
        if not isinstance(op, (torch.Tensor, tuple)):
            raise TypeError(f"xla_builder.Op wraps a tensor on an XLA device (or a tuple of Ops), got {type(op)}")
        self.op = op
        self._builder = builder

    # ---- shape and builder
    def shape(self):
        if isinstance(self.op, tuple):
            return Shape([o.shape().shape for o in self.op])
        dt = _XLA.get(self.op.dtype)
        return Shape.create(dt, self.op.shape)

    def builder(self):
        if self._builder is None:
            dev = self.op.device if isinstance(self.op, torch.Tensor) else self.op[0].builder().device
            self._builder = Builder(device=dev)
        return self._builder

    def build(self, name):
        return Computation(name, lambda: self, ())

    def _new(self, t):
        return Op(t, self._builder)

    # ---- elementwise binary (XLA names in comments)
    def _bin(self, rhs, fn):
        return self._new(fn(self.op, _unwrap(rhs)))

    def __add__(self, rhs):
        return self._bin(rhs, torch.add)

    def __sub__(self, rhs):
        return self._bin(rhs, torch.sub)

    def __mul__(self, rhs):
        return self._bin(rhs, torch.mul)

    def __matmul__(self, rhs):  # Dot
        return self._bin(rhs, torch.matmul)

    def __truediv__(self, rhs):  # Div: integer division truncates in XLA
        a, b = self.op, _unwrap(rhs)
        if not a.dtype.is_floating_point and not a.dtype.is_complex:
            return self._new(torch.div(a, b, rounding_mode="trunc"))
        return self._new(a / b)

    def __pow__(self, rhs):
        return self._bin(rhs, torch.pow)

    def __mod__(self, rhs):  # Rem: the sign of the dividend, as C's fmod
        return self._bin(rhs, torch.fmod)

    def __neg__(self):
        return self._new(-self.op)

    def __not__(self):  # Not (upstream's name; Python's `~` is __invert__)
        return self.__invert__()

    def __invert__(self):
        return self._new(torch.logical_not(self.op) if self.op.dtype == torch.bool else torch.bitwise_not(self.op))

    def __and__(self, rhs):
        return self._bin(rhs, torch.bitwise_and)

    def __or__(self, rhs):
        return self._bin(rhs, torch.bitwise_or)

    def __xor__(self, rhs):
        return self._bin(rhs, torch.bitwise_xor)

    def __eq__(self, rhs):  # noqa: D105  (XLA's Eq: an Op, not a bool)
        return self._bin(rhs, torch.eq)

    def __ne__(self, rhs):
        return self._bin(rhs, torch.ne)

    def __le__(self, rhs):
        return self._bin(rhs, torch.le)

    def __lt__(self, rhs):
        return self._bin(rhs, torch.lt)

    def __ge__(self, rhs):
        return self._bin(rhs, torch.ge)

    def __gt__(self, rhs):
        return self._bin(rhs, torch.gt)

    def __lshift__(self, rhs):
        return self._bin(rhs, torch.bitwise_left_shift)

    def __rshift__(self, rhs):
        return self._bin(rhs, torch.bitwise_right_shift)

    __hash__ = object.__hash__

    def max(self, rhs):
        return self._bin(rhs, torch.maximum)

    def min(self, rhs):
        return self._bin(rhs, torch.minimum)

    def atan2(self, rhs):
        return self._bin(rhs, torch.atan2)

    # ---- elementwise unary
    def _un(self, fn):
        return self._new(fn(self.op))

    def abs(self): return self._un(torch.abs)
    def exp(self): return self._un(torch.exp)
    def expm1(self): return self._un(torch.expm1)
    def log(self): return self._un(torch.log)
    def log1p(self): return self._un(torch.log1p)
    def sqrt(self): return self._un(torch.sqrt)
    def rsqrt(self): return self._un(torch.rsqrt)
    def tanh(self): return self._un(torch.tanh)
    def sin(self): return self._un(torch.sin)
    def cos(self): return self._un(torch.cos)
    def tan(self): return self._un(torch.tan)
    def asin(self): return self._un(torch.asin)
    def acos(self): return self._un(torch.acos)
    def atan(self): return self._un(torch.atan)
    def sinh(self): return self._un(torch.sinh)
    def cosh(self): return self._un(torch.cosh)
    def erf(self): return self._un(torch.erf)
    def erfc(self): return self._un(torch.erfc)
    def erfinv(self): return self._un(torch.erfinv)
    def floor(self): return self._un(torch.floor)
    def ceil(self): return self._un(torch.ceil)
    def round(self): return self._un(torch.round)
    def sign(self): return self._un(torch.sign)
    def logistic(self): return self._un(torch.sigmoid)
    def is_finite(self): return self._un(torch.isfinite)
    def imag(self): return self._un(torch.imag)
    def real(self): return self._un(torch.real)
    def conj(self): return self._un(torch.conj_physical)

    def clamp(self, min_value, max_value):
        return self._new(torch.clamp(self.op, _unwrap(min_value), _unwrap(max_value)))

    # ---- shapes
    def reshape(self, sizes, dimensions=None, inferred_dimension=None):
        x = self.op.permute(*dimensions) if dimensions is not None else self.op
        return self._new(x.reshape(tuple(sizes)))

    def dynamic_reshape(self, sizes):
        return self.reshape(sizes)

    def broadcast(self, sizes):  # new major dimensions
        return self._new(self.op.expand(*tuple(sizes), *self.op.shape).clone())

    def broadcast_in_dim(self, sizes, dimensions):
        sizes = tuple(sizes)
        view = [1] * len(sizes)
        for src, dst in enumerate(dimensions):
            view[dst] = self.op.shape[src]
        return self._new(self.op.reshape(view).expand(sizes).clone())

    def slice(self, start_indices, limit_indices, strides=None):
        strides = strides or [1] * len(start_indices)
        idx = tuple(slice(a, b, s) for a, b, s in zip(start_indices, limit_indices, strides))
        return self._new(self.op[idx].clone())

    def slice_in_dim(self, start_index, limit_index, dimno, stride=1):
        idx = [slice(None)] * self.op.dim()
        idx[dimno] = slice(start_index, limit_index, stride)
        return self._new(self.op[tuple(idx)].clone())

    def dynamic_slice(self, start_indices, slice_sizes):
        x = self.op
        for d, (s, n) in enumerate(zip(start_indices, slice_sizes)):
            s = _unwrap(s)
            s = s.clamp(0, x.shape[d] - n) if isinstance(s, torch.Tensor) else min(max(int(s), 0), x.shape[d] - n)
            idx = (s + torch.arange(n, device=x.device)) if isinstance(s, torch.Tensor) else \
                torch.arange(s, s + n, device=x.device)
            x = x.index_select(d, idx.reshape(-1))
        return self._new(x)

    def dynamic_update_slice(self, update, start_indices):
        x, u = self.op.clone(), _unwrap(update)
        grids = []
        for d, s in enumerate(start_indices):
            s = _unwrap(s)
            n = u.shape[d]
            s = s.clamp(0, x.shape[d] - n) if isinstance(s, torch.Tensor) else min(max(int(s), 0), x.shape[d] - n)
            grids.append((s + torch.arange(n, device=x.device)) if isinstance(s, torch.Tensor)
                         else torch.arange(s, s + n, device=x.device))
        mesh = torch.meshgrid(*[g.reshape(-1) for g in grids], indexing="ij")
        x[mesh] = u
        return self._new(x)

    def transpose(self, permutation):
        return self._new(self.op.permute(*permutation).clone())

    def cast(self, to_type):  # Convert
        return self._new(self.op.to(_dtype(to_type)))

    def bitcast(self, to_type):  # BitcastConvert (same bit width)
        return self._new(self.op.view(_dtype(to_type)).clone())

    def pad(self, value, config):
        """config: one (low, high, interior) per dimension."""
        x, v = self.op, _unwrap(value)
        for d, (lo, hi, interior) in enumerate(config):
            if interior:
                n = x.shape[d]
                shape = list(x.shape)
                shape[d] = n + (n - 1) * interior if n else 0
                out = torch.empty(shape, dtype=x.dtype, device=x.device).fill_(v if not isinstance(v, torch.Tensor) else 0)
                if isinstance(v, torch.Tensor):
                    out = out + v
                idx = [slice(None)] * x.dim()
                idx[d] = slice(0, None, interior + 1)
                out[tuple(idx)] = x
                x = out
        pads = []
        for lo, hi, _ in reversed(list(config)):
            pads += [lo, hi]
        fill = float(v.item()) if isinstance(v, torch.Tensor) else v
        return self._new(torch.nn.functional.pad(x, pads, value=fill))

    def concat_in_dim(self, ops, dimension):
        return self._new(torch.cat([self.op] + [_unwrap(o) for o in ops], dimension))

    def dot(self, rhs):
        return self._bin(rhs, torch.matmul)

    def dot_general(self, rhs, dimension_numbers, precision_config=None):
        """dimension_numbers: ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))."""
        from torch_xla import _XLAC
        (lc, rc), (lb, rb) = dimension_numbers
        return self._new(_XLAC._xla_dot_general(self.op, _unwrap(rhs), (tuple(lc), tuple(rc)),
                                               (tuple(lb), tuple(rb))))

    def get_tuple_element(self, index):
        if not isinstance(self.op, tuple):
            raise ValueError("get_tuple_element on a non-tuple Op")
        return self.op[index]

    # ---- reductions: the computation must be one binary op of its two parameters
    _REDUCERS = {"add": (torch.sum, torch.add), "mul": (torch.prod, torch.mul),
                 "max": (torch.amax, torch.maximum), "min": (torch.amin, torch.minimum),
                 "and": (torch.all, torch.logical_and), "or": (torch.any, torch.logical_or)}

    def _reducer(self, computation):
        kind = _probe_binary(computation)
        if kind not in self._REDUCERS:
            raise NotImplementedError("xla_builder.Op.reduce: the computation must be one of add, mul, max, min, "
                                      "and, or of its two parameters")
        return self._REDUCERS[kind]

    def reduce(self, init_value, computation, dimensions):
        red, comb = self._reducer(computation)
        x = self.op
        dims = tuple(dimensions)
        if red is torch.prod:
            out = x
            for d in sorted(dims, reverse=True):
                out = torch.prod(out, d)
        elif red in (torch.all, torch.any):
            out = x
            for d in sorted(dims, reverse=True):
                out = red(out, d)
        else:
            out = red(x, dim=dims) if dims else x
        return self._new(comb(out, _unwrap(init_value)).to(x.dtype))

    def reduce_all(self, init_value, computation):
        return self.reduce(init_value, computation, range(self.op.dim()))

    def sum(self, dimensions=None, keep_dims=False):
        dims = tuple(range(self.op.dim())) if dimensions is None else tuple(dimensions)
        return self._new(torch.sum(self.op, dim=dims, keepdim=keep_dims))

    def mean(self, dimensions=None, keep_dims=False):
        dims = tuple(range(self.op.dim())) if dimensions is None else tuple(dimensions)
        return self._new(torch.mean(self.op, dim=dims, keepdim=keep_dims))

    def zeros_like(self):
        return self._new(torch.zeros_like(self.op))

    # ---- control flow (both branches are pure: evaluated, then selected)
    def mkconditional(self, ops, true_fn, false_fn):
        t = true_fn(*ops)
        f = false_fn(*ops)
        pred = self.op
        if isinstance(t, (tuple, list)):
            return Op(tuple(Op(torch.where(pred, _unwrap(a), _unwrap(b))) for a, b in zip(t, f)))
        return self._new(torch.where(pred, _unwrap(t), _unwrap(f)))

    def mkwhile(self, *args, **kwargs):
        raise NotImplementedError("xla_builder.Op.mkwhile: use torch_xla.experimental.fori_loop / "
                                  "torch._higher_order_ops.while_loop, which lower to stablehlo.while")

    # ---- constants
    @classmethod
    def scalar(cls, builder, value, dtype=None):
        dt = _dtype(dtype) if dtype is not None else None
        return cls(torch.tensor(value, dtype=dt, device=builder.device), builder)

    @classmethod
    def zero(cls, builder, dtype=None):
        return cls.scalar(builder, 0, dtype=dtype or Type.F32)

    @classmethod
    def one(cls, builder, dtype=None):
        return cls.scalar(builder, 1, dtype=dtype or Type.F32)

    @classmethod
    def constant(cls, builder, value):
        t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
        return cls(t.to(builder.device), builder)

    @classmethod
    def iota(cls, builder, shape, iota_dimension):
        shape = shape if isinstance(shape, Shape) else Shape(shape)
        sizes = shape.sizes
        r = torch.arange(sizes[iota_dimension], device=builder.device, dtype=_dtype(shape.dtype))
        view = [1] * len(sizes)
        view[iota_dimension] = sizes[iota_dimension]
        return cls(r.reshape(view).expand(sizes).clone(), builder)

    @classmethod
    def tuple(cls, ops, builder=None):
        return cls(tuple(o if isinstance(o, Op) else Op(o) for o in ops), builder)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        raise _NotProvided(f"xla_builder.Op.{name} is not provided by this implementation")


# Op.select is both an instance method (pred.select(a, b)) and a class method (Op.select(p, a, b)).
class _SelectDescriptor:
    def __get__(self, obj, objtype=None):
        if obj is None:
            return lambda pred, on_true, on_false: Op(torch.where(_unwrap(pred), _unwrap(on_true), _unwrap(on_false)))
        return lambda on_true, on_false: obj._new(torch.where(obj.op, _unwrap(on_true), _unwrap(on_false)))


Op.select = _SelectDescriptor()


class _Probe:
    """Records which binary operator a reduction computation applies to its two parameters."""

    def __init__(self, tag):
        self.tag = tag

    def _rec(self, kind, other):
        if isinstance(other, _Probe) and {self.tag, other.tag} == {"a", "b"}:
            return _ProbeResult(kind)
        return _ProbeResult(None)

    def __add__(self, o): return self._rec("add", o)
    def __mul__(self, o): return self._rec("mul", o)
    def __and__(self, o): return self._rec("and", o)
    def __or__(self, o): return self._rec("or", o)
    def max(self, o): return self._rec("max", o)
    def min(self, o): return self._rec("min", o)

    def __getattr__(self, name):
        raise NotImplementedError(f"xla_builder: reduction computations may only combine their two parameters "
                                  f"with +, *, &, |, max or min (got .{name})")


class _ProbeResult:
    def __init__(self, kind):
        self.kind = kind


def _probe_binary(computation):
    try:
        r = computation(_Probe("a"), _Probe("b"))
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001
        raise NotImplementedError(f"xla_builder: unsupported reduction computation ({e})") from e
    return r.kind if isinstance(r, _ProbeResult) else None


def mkop(name, ops, **kwargs):
    raise NotImplementedError(f"xla_builder.mkop({name!r}): use the Op methods (this implementation records aten "
                              f"ops into its IR, not raw XLA builder calls)")


def mkparam(builder, param_no, shape):
    shape = shape if isinstance(shape, Shape) else Shape(shape)
    return Op(torch.zeros(shape.sizes, dtype=_dtype(shape.dtype), device=builder.device), builder)


class Computation:
    """A built computation: ``fn`` applied to parameters of ``shapes``."""

    def __init__(self, name, fn, shapes):
        self.name = name
        self._fn = fn
        self.shapes = tuple(s if isinstance(s, Shape) else Shape(s) for s in shapes)

    def __call__(self, *tensors, **kwargs):
        builder = Builder(self.name, tensors[0].device if tensors else None)
        out = self._fn(*[Op(t, builder) for t in tensors], **kwargs)
        if isinstance(out, Op) and isinstance(out.op, tuple):
            return tuple(o.op for o in out.op)
        if isinstance(out, (tuple, list)):
            return tuple(_unwrap(o) for o in out)
        return _unwrap(out)


def create_computation(name, fn, shapes, **kwargs):
    comp = Computation(name, lambda *ops: fn(*ops, **kwargs), shapes)
    return comp


def get_computation_hlo(computation):
    """The computation as StableHLO text (this implementation emits StableHLO, not HLO)."""
    import torch_xla
    from torch_xla import _XLAC
    dev = torch_xla.device()
    params = [torch.zeros(s.sizes, dtype=_dtype(s.dtype), device=dev) for s in computation.shapes]
    out = computation(*params)
    outs = list(out) if isinstance(out, tuple) else [out]
    return _XLAC._get_xla_tensors_hlo(outs)
