"""torch_xla.core.xla_builder / xla_op_registry (issue #8): ops built from Python on our IR, with
values against eager CPU."""
import pytest
import torch

import torch_xla
import torch_xla.core.xla_builder as xb
import torch_xla.core.xla_op_registry as xor

D = torch_xla.device()
g = torch.Generator().manual_seed(0)
A = torch.randn(2, 3, generator=g)
B = torch.randn(2, 3, generator=g)


def _x(*ts):
    return [t.to(D) for t in ts]


@pytest.mark.parametrize("name,fn,want", [
    ("add", lambda x, y: x + y, A + B),
    ("sub", lambda x, y: x - y, A - B),
    ("mul", lambda x, y: x * y, A * B),
    ("div", lambda x, y: x / y, A / B),
    ("max", lambda x, y: x.max(y), torch.maximum(A, B)),
    ("exp_tanh", lambda x, y: x.exp() + y.tanh(), A.exp() + B.tanh()),
    ("select", lambda x, y: (x > y).select(x, y), torch.where(A > B, A, B)),
    ("select_cls", lambda x, y: xb.Op.select(x < y, x, y), torch.where(A < B, A, B)),
    ("matmul", lambda x, y: x @ y.transpose([1, 0]), A @ B.t()),
    ("cast", lambda x, y: (x * 10).cast(xb.Type.S32), (A * 10).to(torch.int32)),
])
def test_registered_ops_match_eager(name, fn, want):
    op = xor.register(name, fn)
    got = op(*_x(A, B))
    assert got.device.type == "xla" and got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want)


def test_integer_rem_and_division_follow_xla():
    a, b = torch.tensor([7, -7, 7, -7]), torch.tensor([2, 2, -2, -2])
    rem = xor.register("rem", lambda x, y: x % y)
    div = xor.register("div", lambda x, y: x / y)
    assert rem(*_x(a, b)).cpu().tolist() == [1, -1, 1, -1]  # C fmod: the dividend's sign
    assert div(*_x(a, b)).cpu().tolist() == [3, -3, -3, 3]  # truncating


def test_conditional_with_kwargs():
    def fn(k, x, y, k0=None):
        c = k > xb.Op.scalar(k.builder(), k0, dtype=xb.Type.S64)
        return c.mkconditional((x, y), lambda x, y: x + y, lambda x, y: x - y)
    op = xor.register("cond", fn)
    k = torch.tensor(3)
    torch.testing.assert_close(op(*_x(k, A, B), k0=2).cpu(), A + B)
    torch.testing.assert_close(op(*_x(k, A, B), k0=5).cpu(), A - B)


def test_reductions_shapes_and_slices():
    red = xor.register("red", lambda x: x.reduce(xb.Op.scalar(x.builder(), 1.5), lambda p, q: p + q, [1]))
    torch.testing.assert_close(red(*_x(A)).cpu(), A.sum(1) + 1.5)
    mx = xor.register("mx", lambda x: x.reduce_all(xb.Op.scalar(x.builder(), -1e9), lambda p, q: p.max(q)))
    torch.testing.assert_close(mx(*_x(A)).cpu(), A.max())
    bid = xor.register("bid", lambda x: x.broadcast_in_dim([4, 2, 3], [1, 2]))
    assert torch.equal(bid(*_x(A)).cpu(), A.expand(4, 2, 3))
    sl = xor.register("sl", lambda x: x.slice([0, 1], [2, 3], [1, 2]))
    assert torch.equal(sl(*_x(A)).cpu(), A[:, 1:3:2])
    ds = xor.register("ds", lambda x, i: x.dynamic_slice([i, xb.Op.scalar(x.builder(), 1, xb.Type.S64)], [1, 2]))
    assert torch.equal(ds(*_x(A, torch.tensor(1))).cpu(), A[1:2, 1:3])
    dus = xor.register("dus", lambda x, u: x.dynamic_update_slice(u, [0, 1]))
    assert torch.equal(dus(*_x(A, torch.ones(2, 2))).cpu(), torch.cat([A[:, :1], torch.ones(2, 2)], 1))
    pad = xor.register("pad", lambda x: x.pad(xb.Op.scalar(x.builder(), 0.0), [(1, 0, 1), (0, 2, 0)]))
    want = torch.zeros(4, 5)
    want[1, :3], want[3, :3] = A[0], A[1]
    assert torch.equal(pad(*_x(A)).cpu(), want)
    io = xor.register("iota", lambda x: x + xb.Op.iota(x.builder(), xb.Shape.create(xb.Type.F32, (2, 3)), 1))
    torch.testing.assert_close(io(*_x(A)).cpu(), A + torch.arange(3.))


def test_shapes_tuples_hlo_and_errors():
    op = xb.Op(A.to(D))
    assert op.shape().sizes == (2, 3) and op.shape().dtype == xb.Type.F32 and op.shape().rank == 2
    tup = xor.register("tup", lambda x, y: xb.Op.tuple((x + y, x * y)))
    s, p = tup(*_x(A, B))
    torch.testing.assert_close(s.cpu(), A + B)
    torch.testing.assert_close(p.cpu(), A * B)
    comp = xb.create_computation("c", lambda x, y: (x * y).exp(), [xb.Shape.create(xb.Type.F32, (2, 3))] * 2)
    assert "stablehlo.exponential" in xb.get_computation_hlo(comp)
    assert not hasattr(op, "no_such_method")
    with pytest.raises(NotImplementedError, match="no_such_method"):
        op.no_such_method()
    with pytest.raises(NotImplementedError, match="reduction"):
        xor.register("bad", lambda x: x.reduce(xb.Op.scalar(x.builder(), 0.0), lambda p, q: p - q, [0]))(*_x(A))
    with pytest.raises(TypeError, match="XLA device"):
        xor.register("cpu", lambda x: x)(A)
