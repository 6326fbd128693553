"""Structured control flow (csrc/ir/control_flow.*, torch_xla.experimental.fori_loop / scan): one
stablehlo.while per loop, results equal to eager running the same Python loop, clear errors for
bodies that change shapes or dtypes, gradients through scan."""

import pytest
import torch
import torch_xla
from torch_xla import _C
import torch_xla.debug.metrics as met
from torch_xla.experimental.fori_loop import fori_loop
from torch_xla.experimental.scan import scan
from torch._higher_order_ops.while_loop import while_loop, while_loop_op

DEV = torch_xla.device()


def _hlo(*ts):
    return _C._get_stablehlo(list(ts))


# ---- fori_loop
def test_fori_loop_addition_as_upstream():
    lower = torch.tensor(0, device=DEV)
    upper = torch.tensor(50, device=DEV)
    init_val = torch.tensor(1, dtype=torch.int32, device=DEV)
    i, res = fori_loop(upper, lower, lambda x: torch.add(x, 1), init_val)
    assert res.dtype == torch.int32 and res.shape == ()
    assert res.item() == 51 and i.item() == 0


def test_fori_loop_several_values_and_closure_matches_eager():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 4, generator=g)
    b = torch.randn(4, generator=g)
    x0 = torch.randn(3, 4, generator=g)
    acc0 = torch.zeros(3)

    def body(x, acc, w=w, b=b):
        x = torch.tanh(x @ w + b)
        return x, acc + x.sum(-1)

    x, acc = x0, acc0
    for _ in range(7):
        x, acc = body(x, acc)
    wx, bx = w.to(DEV), b.to(DEV)
    _, xx, accx = fori_loop(7, 0, lambda x, acc: body(x, acc, wx, bx), x0.to(DEV), acc0.to(DEV))
    torch.testing.assert_close(xx.cpu(), x)
    torch.testing.assert_close(accx.cpu(), acc)


def test_fori_loop_zero_trips_returns_inputs():
    v = torch.arange(3.0, device=DEV)
    i, r = fori_loop(2, 2, lambda x: x * 10, v)
    assert torch.equal(r.cpu(), torch.arange(3.0)) and i.item() == 0


def test_one_while_whatever_the_trip_count():
    v = torch.ones(5, device=DEV)
    _, small = fori_loop(3, 0, lambda x: x * 2 + 1, v)
    _, big = fori_loop(3000, 0, lambda x: x * 0.5 + 1, v)
    for t in (small, big):
        text = _hlo(t)
        assert text.count('"stablehlo.while"') == 1
    assert len(_hlo(big)) < 4000
    torch.testing.assert_close(big.cpu(), torch.full((5,), 2.0))
    ref = torch.ones(5)
    for _ in range(3):
        ref = ref * 2 + 1
    torch.testing.assert_close(small.cpu(), ref)


def test_same_loop_hits_the_compile_cache():
    def run(n):
        v = torch.full((4,), float(n), device=DEV)
        _, r = fori_loop(10, 0, lambda x: x * 3 - 2, v)
        return r.cpu()

    run(5)  # (0 and 1 are constants in the graph; other scalars are inputs)
    size = _C._compile_cache_size()
    out = run(7)
    assert _C._compile_cache_size() == size  # same structure: no new executable
    ref = torch.full((4,), 7.0)
    for _ in range(10):
        ref = ref * 3 - 2
    torch.testing.assert_close(out, ref)
    # a different body is a different graph
    v = torch.full((4,), 7.0, device=DEV)
    _, r = fori_loop(10, 0, lambda x: x * 3 + 2, v)
    r.cpu()
    assert _C._compile_cache_size() == size + 1


def test_nested_loops_read_outer_values():
    def outer(x, total):
        def inner(y):
            return y + x  # x: the outer loop's carried value
        _, s = fori_loop(3, 0, inner, torch.zeros_like(x))
        return x + 1, total + s

    x0 = torch.arange(4.0)
    _, x, total = fori_loop(5, 0, outer, x0.to(DEV), torch.zeros(4, device=DEV))
    ex, et = x0.clone(), torch.zeros(4)
    for _ in range(5):
        et = et + 3 * ex
        ex = ex + 1
    assert _hlo(total).count('"stablehlo.while"') == 2
    torch.testing.assert_close(x.cpu(), ex)
    torch.testing.assert_close(total.cpu(), et)


# ---- torch._higher_order_ops.while_loop
def test_while_loop_as_upstream_docs():
    def cond_fn(iteri, x):
        return iteri > 0

    def body_fn(iteri, x):
        return iteri - 1, torch.add(x, 1)

    i, res = while_loop(cond_fn, body_fn, (torch.tensor(10, device=DEV), torch.tensor(3, device=DEV)))
    assert res.item() == 13 and i.item() == 0


def test_while_loop_data_dependent_trip_count_matches_eager():
    def cond_fn(x, n):
        return x.sum() < 1000.0

    def body_fn(x, n):
        return x * 1.5 + 1, n + 1

    x0 = torch.tensor([1.0, 2.0, 3.0])
    ex, en = while_loop_op(cond_fn, body_fn, (x0, torch.tensor(0)), ())  # eager's dense kernel
    x, n = while_loop(cond_fn, body_fn, (x0.to(DEV), torch.tensor(0, device=DEV)))
    torch.testing.assert_close(x.cpu(), ex)
    assert n.item() == en.item()
    # the higher-order op called directly takes the same route
    x2, n2 = while_loop_op(cond_fn, body_fn, (x0.to(DEV), torch.tensor(0, device=DEV)), ())
    torch.testing.assert_close(x2.cpu(), ex)


def test_while_loop_pytree_carry():
    def cond_fn(state):
        return state["i"] < 4

    def body_fn(state):
        a, b = state["ab"]
        return ({"i": state["i"] + 1, "ab": (a + b, b * 2)},)

    init = {"i": torch.tensor(0, device=DEV), "ab": (torch.ones(2, device=DEV), torch.ones(2, device=DEV))}
    (state,) = while_loop(cond_fn, body_fn, (init,))
    a, b = torch.ones(2), torch.ones(2)
    for _ in range(4):
        a, b = a + b, b * 2
    torch.testing.assert_close(state["ab"][0].cpu(), a)
    torch.testing.assert_close(state["ab"][1].cpu(), b)


# ---- errors
def test_body_changing_shape_raises():
    with pytest.raises(ValueError, match=r"shape \(2,\).*carried value 1.*shape \(\)"):
        while_loop(lambda i, x: i > 0, lambda i, x: (i - 1, torch.stack([x, x])),
                   (torch.tensor(3, device=DEV), torch.tensor(1.0, device=DEV)))


def test_body_changing_dtype_raises():
    with pytest.raises(ValueError, match=r"dtype torch.float64.*dtype torch.float32"):
        fori_loop(3, 0, lambda x: x.double(), torch.ones(2, device=DEV))


def test_cond_must_return_bool_scalar():
    with pytest.raises(RuntimeError, match="boolean scalar"):
        while_loop(lambda x: x, lambda x: (x + 1,), (torch.tensor(1, device=DEV),))


def test_host_read_inside_body_raises():
    def body(x):
        if x.sum().item() > 0:  # a host read of a loop value
            return x
        return x

    with pytest.raises(RuntimeError, match="inside a loop body"):
        fori_loop(3, 0, body, torch.ones(2, device=DEV))
    # the session stays usable
    assert (torch.ones(2, device=DEV) * 2).sum().item() == 4.0


def test_index_checks_inside_a_loop_still_raise():
    table = torch.arange(5.0, device=DEV)

    def body(i, acc):
        return i + 1, acc + table[i.reshape(1)].sum()  # i reaches 5: out of bounds on the last trip

    with pytest.raises(IndexError):
        _, _, acc = fori_loop(6, 0, body, torch.tensor(0, device=DEV), torch.tensor(0.0, device=DEV))
        acc.cpu()
    _, _, acc = fori_loop(5, 0, body, torch.tensor(0, device=DEV), torch.tensor(0.0, device=DEV))
    assert acc.item() == 10.0


# ---- scan
def _rnn(c, x, w):
    h = torch.tanh(c @ w + x)
    return h, (h * 2).sum(-1)


def _eager_scan(fn, init, xs):
    c, ys = init, []
    for t in range(xs.shape[0]):
        c, y = fn(c, xs[t])
        ys.append(y)
    return c, torch.stack(ys)


def test_scan_forward_matches_eager():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(4, 4, generator=g)
    init, xs = torch.randn(3, 4, generator=g), torch.randn(6, 3, 4, generator=g)
    c, ys = _eager_scan(lambda c, x: _rnn(c, x, w), init, xs)
    wx = w.to(DEV)
    cx, ysx = scan(lambda c, x: _rnn(c, x, wx), init.to(DEV), xs.to(DEV))
    assert ysx.shape == ys.shape and ysx.dtype == ys.dtype
    assert _hlo(ysx).count('"stablehlo.while"') == 1
    torch.testing.assert_close(cx.cpu(), c)
    torch.testing.assert_close(ysx.cpu(), ys)


def test_scan_pytrees():
    def fn(carry, x):
        s, p = carry["sum"], carry["prod"]
        return {"sum": s + x["a"], "prod": p * x["b"]}, (s, x["a"] * 2)

    xs = {"a": torch.arange(12.0).reshape(4, 3), "b": torch.linspace(0.5, 2.0, 12).reshape(4, 3)}
    init = {"sum": torch.zeros(3), "prod": torch.ones(3)}
    c, ys = init, ([], [])
    for t in range(4):
        c, (y0, y1) = fn(c, {k: v[t] for k, v in xs.items()})
        ys[0].append(y0)
        ys[1].append(y1)
    cx, ysx = scan(fn, {k: v.to(DEV) for k, v in init.items()}, {k: v.to(DEV) for k, v in xs.items()})
    torch.testing.assert_close(cx["sum"].cpu(), c["sum"])
    torch.testing.assert_close(cx["prod"].cpu(), c["prod"])
    torch.testing.assert_close(ysx[0].cpu(), torch.stack(ys[0]))
    torch.testing.assert_close(ysx[1].cpu(), torch.stack(ys[1]))


def test_scan_gradients_match_eager():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(4, 4, dtype=torch.float64, generator=g)
    init, xs = torch.randn(3, 4, dtype=torch.float64, generator=g), torch.randn(5, 3, 4, dtype=torch.float64, generator=g)
    # eager, with the weight carried through xs-free closure (no grad needed for it)
    i1, x1 = init.clone().requires_grad_(), xs.clone().requires_grad_()
    c, ys = _eager_scan(lambda c, x: _rnn(c, x, w), i1, x1)
    (c.sum() + (ys ** 2).sum()).backward()
    wx = w.to(DEV)
    i2, x2 = init.to(DEV).requires_grad_(), xs.to(DEV).requires_grad_()
    cx, ysx = scan(lambda c, x: _rnn(c, x, wx), i2, x2)
    (cx.sum() + (ysx ** 2).sum()).backward()
    torch.testing.assert_close(i2.grad.cpu(), i1.grad)
    torch.testing.assert_close(x2.grad.cpu(), x1.grad)


def test_scan_weights_through_xs_get_gradients():
    # upstream's scan_layers pattern: per-layer weights stacked in xs
    g = torch.Generator().manual_seed(3)
    ws = torch.randn(3, 4, 4, dtype=torch.float64, generator=g)
    h0 = torch.randn(2, 4, dtype=torch.float64, generator=g)

    def layer(h, w):
        h = torch.relu(h @ w) + h
        return h, h.mean()

    w1, a1 = ws.clone().requires_grad_(), h0.clone().requires_grad_()
    c, ys = _eager_scan(layer, a1, w1)
    (c.square().sum() + ys.sum()).backward()
    w2, a2 = ws.to(DEV).requires_grad_(), h0.to(DEV).requires_grad_()
    cx, ysx = scan(layer, a2, w2)
    (cx.square().sum() + ysx.sum()).backward()
    torch.testing.assert_close(w2.grad.cpu(), w1.grad)
    torch.testing.assert_close(a2.grad.cpu(), a1.grad)


def test_scan_closure_tensor_requiring_grad_raises():
    w = torch.randn(4, 4, device=DEV, requires_grad=True)
    with pytest.raises(NotImplementedError, match="init or xs"):
        scan(lambda c, x: _rnn(c, x, w), torch.zeros(2, 4, device=DEV), torch.ones(3, 2, 4, device=DEV))
    with torch.no_grad():
        c, ys = scan(lambda c, x: _rnn(c, x, w), torch.zeros(2, 4, device=DEV), torch.ones(3, 2, 4, device=DEV))
    assert ys.shape == (3, 2)


def test_scan_errors():
    with pytest.raises(ValueError, match="carry"):
        scan(lambda c, x: (torch.cat([c, x]), x), torch.zeros(2, device=DEV), torch.ones(3, 2, device=DEV))
    with pytest.raises(ValueError, match="leading dimension"):
        scan(lambda c, x: (c, x), torch.zeros(2, device=DEV), (torch.ones(3, 2, device=DEV), torch.ones(4, 2, device=DEV)))
    with pytest.raises(ValueError, match="at least one element"):
        scan(lambda c, x: (c, x), torch.zeros(2, device=DEV), torch.ones(0, 2, device=DEV))


def test_loops_in_eager_mode():
    torch_xla.experimental.eager_mode(True)
    try:
        _, r = fori_loop(4, 0, lambda x: x * 2 + 1, torch.ones(3, device=DEV))
        c, ys = scan(lambda c, x: (c + x, c * x), torch.zeros(3, device=DEV), torch.ones(4, 3, device=DEV))
    finally:
        torch_xla.experimental.eager_mode(False)
    assert torch.equal(r.cpu(), torch.full((3,), 31.0))
    assert torch.equal(c.cpu(), torch.full((3,), 4.0))
    assert torch.equal(ys.cpu(), torch.arange(4.0).repeat_interleave(3).reshape(4, 3))
