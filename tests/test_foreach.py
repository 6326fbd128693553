"""Foreach ops (issue #12, host time): `torch._foreach_*` on xla tensors is one dispatch per list
(csrc/ops/rows_foreach.cc), not one per tensor, with eager CPU's values, dtypes and errors."""
import pytest
import torch

import torch_xla
import torch_xla.debug.metrics as met

D = torch_xla.device()


def _lists(dtype=torch.float32, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(4, 3), (5,), ()][:n]
    if dtype.is_floating_point:
        return [torch.randn(s, generator=g).to(dtype) for s in shapes]
    return [torch.randint(-5, 6, s, generator=g).to(dtype) for s in shapes]


def _x(ts):
    return [t.to(D) for t in ts]


def _same(got, want, dtype=None):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.device.type == "xla"
        tol = dict(rtol=1.6e-2, atol=1e-2) if b.dtype in (torch.bfloat16, torch.float16) else dict(rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(a.cpu(), b, equal_nan=True, **tol)


CASES = [
    # (name, builder(lists, scalars) -> args)
    ("_foreach_add.Scalar", lambda a, b, c: (a, 2.5)),
    ("_foreach_add.ScalarList", lambda a, b, c: (a, [1.0, -2.0, 0.5])),
    ("_foreach_add.List", lambda a, b, c: (a, b)),
    ("_foreach_add.List_alpha", lambda a, b, c: (a, b, dict(alpha=-0.5))),
    ("_foreach_sub.Scalar", lambda a, b, c: (a, 1.5)),
    ("_foreach_sub.List", lambda a, b, c: (a, b, dict(alpha=2))),
    ("_foreach_mul.Scalar", lambda a, b, c: (a, 0.9)),
    ("_foreach_mul.ScalarList", lambda a, b, c: (a, [2.0, 3.0, -1.0])),
    ("_foreach_mul.List", lambda a, b, c: (a, b)),
    ("_foreach_div.Scalar", lambda a, b, c: (a, 3.0)),
    ("_foreach_div.ScalarList", lambda a, b, c: (a, [2.0, 4.0, -8.0])),
    ("_foreach_div.List", lambda a, b, c: (a, b)),
    ("_foreach_maximum.List", lambda a, b, c: (a, b)),
    ("_foreach_minimum.Scalar", lambda a, b, c: (a, 0.1)),
    ("_foreach_clamp_min.Scalar", lambda a, b, c: (a, -0.2)),
    ("_foreach_pow.Scalar", lambda a, b, c: (a, 2.0)),
    ("_foreach_lerp.Scalar", lambda a, b, c: (a, b, 0.3)),
    ("_foreach_lerp.List", lambda a, b, c: (a, b, c)),
    ("_foreach_addcmul.Scalar", lambda a, b, c: (a, b, c, dict(value=0.25))),
    ("_foreach_addcmul.ScalarList", lambda a, b, c: (a, b, c, [0.5, -1.0, 2.0])),
    ("_foreach_addcdiv.Scalar", lambda a, b, c: (a, b, c, dict(value=-0.1))),
    ("_foreach_addcdiv.ScalarList", lambda a, b, c: (a, b, c, [0.5, -1.0, 2.0])),
    ("_foreach_sqrt", lambda a, b, c: ([t.abs() for t in a],)),
    ("_foreach_neg", lambda a, b, c: (a,)),
    ("_foreach_reciprocal", lambda a, b, c: (a,)),
    ("_foreach_exp", lambda a, b, c: (a,)),
    ("_foreach_abs", lambda a, b, c: (a,)),
    ("_foreach_sign", lambda a, b, c: (a,)),
]


def _call(fn, args):
    kw = args[-1] if args and isinstance(args[-1], dict) else {}
    pos = args[:-1] if kw else args
    return fn(*pos, **kw)


def _to(args, f):
    out = []
    for a in args:
        if isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
            out.append(f(a))
        else:
            out.append(a)
    return tuple(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_foreach_functional_and_inplace_match_eager(name, dtype):
    build = dict(CASES)[name]
    a, b, c = _lists(dtype, seed=1), _lists(dtype, seed=2), [t.abs() + 0.5 for t in _lists(dtype, seed=3)]
    args = build(a, b, c)
    base = name.split(".")[0]
    want = _call(getattr(torch, base), args)
    got = _call(getattr(torch, base), _to(args, _x))
    _same(got, want)
    # in place, through functionalization
    inplace = getattr(torch, base + "_", None)
    if inplace is None:
        return
    cpu_args = _to(args, lambda l: [t.clone() for t in l])
    xla_args = _to(args, _x)
    _call(inplace, cpu_args)
    _call(inplace, xla_args)
    _same(xla_args[0], cpu_args[0])


def test_one_dispatch_per_list():
    a, b = _x(_lists(n=3)), _x(_lists(n=3, seed=5))
    torch_xla.sync()
    before_fe, before_add = met.counter_value("xla::_foreach_add") or 0, met.counter_value("xla::add") or 0
    torch._foreach_add_(a, b, alpha=0.5)
    assert (met.counter_value("xla::_foreach_add") or 0) == before_fe + 1
    assert (met.counter_value("xla::add") or 0) == before_add  # no per-tensor dispatch
    torch_xla.sync()


def test_integer_lists_and_promotion():
    a = _lists(torch.int64)
    _same(torch._foreach_add(_x(a), 2), torch._foreach_add(a, 2))
    _same(torch._foreach_mul(_x(a), 0.5), torch._foreach_mul(a, 0.5))  # int * float -> float
    assert torch._foreach_mul(_x(a), 0.5)[0].dtype == torch.float32
    _same(torch._foreach_div(_x(a), 2), torch._foreach_div(a, 2))


def test_errors_match_eager():
    a, b = _lists(), _lists(n=2)
    with pytest.raises(RuntimeError) as e_cpu:
        torch._foreach_add(a, b)
    with pytest.raises(RuntimeError) as e_xla:
        torch._foreach_add(_x(a), _x(b))
    assert "same number of" in str(e_cpu.value) and "same number of" in str(e_xla.value)
    ints = _lists(torch.int64)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch._foreach_add_(ints, 0.5)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch._foreach_add_(_x(ints), 0.5)


def test_list_with_a_cpu_scalar_uses_the_per_tensor_kernel():
    a = _lists()
    cpu_scalar = torch.tensor(3.0)
    xs = _x(a[:2]) + [cpu_scalar.clone()]
    want = torch._foreach_add(a[:2] + [cpu_scalar], 1.0)
    got = torch._foreach_add(xs, 1.0)
    assert got[2].device.type == "cpu" and got[0].device.type == "xla"
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w)


def test_foreach_norm_and_clip_grad_norm():
    a = _lists(seed=7)
    _same(torch._foreach_norm(_x(a)), torch._foreach_norm(a))
    _same(torch._foreach_norm(_x(a), 1), torch._foreach_norm(a, 1))
    ps_cpu = [torch.nn.Parameter(t.clone()) for t in a]
    ps_xla = [torch.nn.Parameter(t.to(D)) for t in a]
    for p, q in zip(ps_cpu, ps_xla):
        p.grad = p.detach() * 3
        q.grad = q.detach() * 3
    # torch lists no foreach support for xla devices (as with upstream), so the default path is per tensor
    n_cpu = torch.nn.utils.clip_grad_norm_(ps_cpu, 1.0)
    n_xla = torch.nn.utils.clip_grad_norm_(ps_xla, 1.0)
    torch.testing.assert_close(n_xla.cpu(), n_cpu)
    _same([q.grad for q in ps_xla], [p.grad for p in ps_cpu])


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_foreach_optimizers_match_eager(opt):
    def run(device):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to(device)
        o = (torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True) if opt == "adamw"
             else torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-3,
                                  foreach=True))
        x = torch.randn(4, 8).to(device)
        for _ in range(4):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
            if device != "cpu":
                torch_xla.sync()
        return [p.detach().cpu() for p in m.parameters()]
    for p, q in zip(run(D), run("cpu")):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
