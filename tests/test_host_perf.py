"""Host-time work of issue #12 that must not change a result: the C++ meta kernels of the in-place
Scalar overloads (add_/sub_/mul_/div_ with a Python number, as the foreach optimizers call them) raise
eager's errors and give eager's values; donated steps stay correct while the launch is asynchronous;
a failed in-graph check of step N still raises at the sync of step N+1."""

from __future__ import annotations

import pytest
import torch

import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met


def _eager_error(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        return type(e), str(e)
    return None


@pytest.mark.parametrize("op,scalar,dtype", [
    ("mul_", 2.5, torch.float32), ("div_", 4.0, torch.float32), ("add_", 0.25, torch.float32),
    ("sub_", 3.0, torch.float32), ("mul_", 3, torch.int64), ("add_", 7, torch.int32),
    ("sub_", 2, torch.int64), ("mul_", 0.5, torch.bfloat16), ("add_", True, torch.float32),
])
def test_inplace_scalar_values(op, scalar, dtype):
    base = (torch.arange(12).reshape(3, 4) - 5).to(dtype)
    expect = getattr(base.clone(), op)(scalar)
    x = base.clone().to(torch_xla.device())
    out = getattr(x, op)(scalar)
    assert out is x
    torch.testing.assert_close(x.cpu(), expect)
    assert x.dtype == expect.dtype


def test_inplace_scalar_alpha():
    base = torch.arange(6.0).reshape(2, 3)
    for op in ("add_", "sub_"):
        expect = getattr(base.clone(), op)(2.0, alpha=3)
        x = base.clone().to(torch_xla.device())
        getattr(x, op)(2.0, alpha=3)
        torch.testing.assert_close(x.cpu(), expect)


_SCALAR_OPS = {"mul_": torch.ops.aten.mul_.Scalar, "div_": torch.ops.aten.div_.Scalar,
               "add_": torch.ops.aten.add_.Scalar, "sub_": torch.ops.aten.sub_.Scalar}
_ERROR_CASES = {
    "int_mul_float": (lambda d: torch.arange(4, device=d), "mul_", (1.5,), {}),
    "int_div": (lambda d: torch.arange(4, device=d), "div_", (2,), {}),
    "int_add_float": (lambda d: torch.arange(4, device=d), "add_", (0.5,), {}),
    "bool_sub": (lambda d: torch.ones(3, dtype=torch.bool, device=d), "sub_", (True,), {}),
    "int_sub_float_alpha": (lambda d: torch.arange(4, device=d), "sub_", (1.0,), {"alpha": 2}),
    "expanded_mul": (lambda d: torch.ones(3, 1, device=d).expand(3, 3), "mul_", (2.0,), {}),
    "expanded_add": (lambda d: torch.ones(1, 3, device=d).expand(4, 3), "add_", (1.0,), {}),
    "float_add_bool_alpha": (lambda d: torch.ones(3, dtype=torch.int64, device=d), "add_", (1,), {"alpha": 0.5}),
}


@pytest.mark.parametrize("case", sorted(_ERROR_CASES))
def test_inplace_scalar_overload_errors_match_eager(case):
    """aten::<op>_.Scalar (what torch._foreach_<op>_(tensors, number) calls per tensor): eager's
    exception type and message."""
    make, op, args, kwargs = _ERROR_CASES[case]
    eager = _eager_error(lambda: _SCALAR_OPS[op](make("cpu"), *args, **kwargs))
    assert eager is not None, f"{case}: eager does not raise"
    with pytest.raises(eager[0]) as info:
        _SCALAR_OPS[op](make(torch_xla.device()), *args, **kwargs)
        torch_xla.sync()
    assert str(info.value).split("\n")[0] == eager[1].split("\n")[0]


@pytest.mark.parametrize("case", sorted(_ERROR_CASES))
def test_inplace_python_number_errors_match_eager(case):
    """x.<op>_(number) (Python wraps the number into a tensor: the .Tensor overload): eager's
    exception type; the message names the same problem (a dtype cast that is not allowed may name
    Double where eager names Float: functionalization's meta replay does not keep the wrapped-number
    mark of the scalar)."""
    make, op, args, kwargs = _ERROR_CASES[case]
    eager = _eager_error(lambda: getattr(make("cpu"), op)(*args, **kwargs))
    assert eager is not None, f"{case}: eager does not raise"
    with pytest.raises(eager[0]) as info:
        getattr(make(torch_xla.device()), op)(*args, **kwargs)
        torch_xla.sync()
    normalize = lambda m: m.split("\n")[0].replace("Double", "Float")  # noqa: E731
    assert normalize(str(info.value)) == normalize(eager[1])


def test_foreach_scalar_ops_match_eager():
    dev = torch_xla.device()
    cpu = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2, 2)]
    xla = [t.to(dev) for t in cpu]
    for ts in (cpu, xla):
        torch._foreach_mul_(ts, 0.9)
        torch._foreach_add_(ts, 1e-3)
        torch._foreach_div_(ts, [2.0, 3.0, 4.0])
        torch._foreach_sub_(ts, 0.5)
    for a, b in zip(xla, cpu):
        torch.testing.assert_close(a.cpu(), b)


def _adamw_steps(device, steps=4):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, generator=g).to(device)
    y = torch.randint(0, 4, (32,), generator=g).to(device)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device != "cpu":
            torch_xla.sync()  # never waits: the next step is traced while this one runs
        losses.append(loss)
    return [l.item() for l in losses], [p.detach().cpu() for p in model.parameters()]


def test_donated_pipelined_steps_match_eager():
    met.clear_all()
    losses, params = _adamw_steps(torch_xla.device())
    ref_losses, ref_params = _adamw_steps("cpu")
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)
    for p, r in zip(params, ref_params):
        torch.testing.assert_close(p, r, rtol=1e-4, atol=1e-5)
    assert met.metric_data("InputOutputAliasCount")[1] > 0  # the steps did donate
    xm.wait_device_ops()


def test_failed_check_raises_at_next_sync_after_launch():
    dev = torch_xla.device()
    emb = torch.nn.Embedding(4, 2).to(dev)
    bad = emb(torch.tensor([0, 9], device=dev)).sum()
    torch_xla.sync()  # launches the step with the failing check
    nxt = torch.arange(3.0, device=dev) * 2
    with pytest.raises(IndexError):
        torch_xla.sync()  # this sync's graph is launched, then the earlier check is read
    torch.testing.assert_close(nxt.cpu(), torch.arange(3.0) * 2)  # ran despite the raise
    torch_xla.sync()  # reported once
    del bad


def test_fill_scalar_matches_eager():
    """fill_.Scalar's C++ meta kernel: fills any tensor as eager does (expanded views included)."""
    dev = torch_xla.device()
    for make in (lambda d: torch.zeros(2, 3, device=d), lambda d: torch.zeros(3, device=d)[::2],
                 lambda d: torch.zeros(4, dtype=torch.int32, device=d), lambda d: torch.zeros(2, 2, dtype=torch.bool, device=d)):
        a, b = make("cpu"), make(dev)
        a.fill_(3), b.fill_(3)
        torch.testing.assert_close(b.cpu(), a)
    x = torch.zeros(1, 3, device=dev)
    x.expand(4, 3).fill_(2.5)  # eager allows filling overlapping memory
    torch.testing.assert_close(x.cpu(), torch.full((1, 3), 2.5))
    q = torch.randn(2, 4, 8, 16)
    ref = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    out = torch.nn.functional.scaled_dot_product_attention(q.to(dev), q.to(dev), q.to(dev), is_causal=True)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-5)


# ---- The in-place meta checks remember the calls they accepted (TXLA_INPLACE_META_CACHE).
# Functionalization replays every in-place op on meta tensors, and for most ops the meta kernel is
# torch's Python reference (relu_ 300 us, clamp_ 1 ms a call): each accepted call's metadata is
# remembered, refused ones never are.

def _python_calls_in_refs(fn):
    """How many Python functions of torch's references/decompositions/prims `fn` enters."""
    import sys
    count = [0]

    def prof(frame, event, arg):
        if event == "call":
            f = frame.f_code.co_filename
            if "torch/_refs" in f or "torch/_decomp" in f or "torch/_prims" in f or "_meta_registrations" in f:
                count[0] += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count[0]


@pytest.mark.parametrize("op", ["relu_", "clamp_", "neg_", "tanh_", "hardtanh_", "sub_t"])
def test_repeated_inplace_op_skips_pythons_meta_kernel(op):
    d = torch_xla.device()
    calls = {"relu_": lambda t, o: t.relu_(), "clamp_": lambda t, o: t.clamp_(-1, 1), "neg_": lambda t, o: t.neg_(),
             "tanh_": lambda t, o: t.tanh_(), "hardtanh_": lambda t, o: torch.nn.functional.hardtanh(t, inplace=True),
             "sub_t": lambda t, o: t.sub_(o)}[op]
    base = torch.randn(4, 5)
    other = torch.randn(5)
    x, o = base.clone().to(d), other.to(d)
    calls(x, o)
    second = _python_calls_in_refs(lambda: calls(x, o))
    assert second == 0, f"{op}: {second} Python meta calls on a repeated call"
    torch.testing.assert_close(x.cpu(), calls(calls(base.clone(), other), other))


def test_inplace_meta_cache_keeps_every_refusal():
    """A refused call raises every time, and accepting one shape or dtype accepts nothing else."""
    d = torch_xla.device()
    a = torch.ones(3, 4, device=d)
    a.sub_(torch.ones(4, device=d))          # accepted: broadcast into self
    for _ in range(2):
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
            torch.ones(4, device=d).sub_(a)  # the same op, a shape it may not write
    i = torch.arange(4, device=d)
    i.relu_()                                # int relu_ is fine
    for _ in range(2):
        with pytest.raises(RuntimeError, match="Bool"):
            torch.ones(3, dtype=torch.bool, device=d).relu_()
    f = torch.zeros(4, device=d)
    f.clamp_(0.5, 1.5)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="can't be cast"):
            i.clamp_(torch.tensor(0.5, device=d), torch.tensor(1.5, device=d))
    # a strided (expanded) self: the overlap check still runs on every call
    e = torch.ones(1, 3, device=d).expand(4, 3)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="more than one element"):
            e.neg_()
    torch_xla.sync()
    torch.testing.assert_close(a.cpu(), torch.zeros(3, 4))
    torch.testing.assert_close(f.cpu(), torch.full((4,), 0.5))


def _last_lines_with_switch(code, var):
    """The last stdout line of `code` run in a fresh process with var=0 and with var=1."""
    import os
    import subprocess
    import sys
    outs = []
    for v in ("0", "1"):
        env = dict(os.environ, **{var: v})
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(r.stdout.strip().splitlines()[-1])
    return outs


def test_inplace_meta_cache_off_matches(tmp_path):
    """TXLA_INPLACE_META_CACHE=0 runs the meta kernel every call; values are the same."""
    code = ("import torch, torch_xla\n"
            "x = torch.arange(-3., 3.).to(torch_xla.device())\n"
            "for _ in range(3): x.relu_(); x.sub_(0.5); x.clamp_(-1, 2)\n"
            "print(x.cpu().tolist())\n")
    outs = _last_lines_with_switch(code, "TXLA_INPLACE_META_CACHE")
    x = torch.arange(-3., 3.)
    for _ in range(3):
        x.relu_(); x.sub_(0.5); x.clamp_(-1, 2)
    assert outs[0] == outs[1] == str(x.tolist())


def _mlp_step_on(dev, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(dev)
    x = torch.randn(5, 8).to(dev)
    loss = m(x).square().mean()
    loss.backward()
    return loss, [p.grad for p in m.parameters()]


def test_block_cache_blocks_cross_threads_and_outlive_their_thread():
    """IR nodes, tensor records and tensor impls come from per-thread block caches
    (util/block_cache.h): tensors traced on a thread that has exited, freed on another thread, and
    graphs built from both stay correct."""
    import threading
    dev = torch_xla.device()
    want_loss, want_grads = _mlp_step_on("cpu")
    made = []

    def worker():
        made.append(_mlp_step_on(dev))  # traced (not synced) on this thread, which then exits

    for _ in range(3):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    # The main thread syncs, reads and frees what the exited threads built.
    for loss, grads in made:
        torch.testing.assert_close(loss.cpu(), want_loss)
        for g, w in zip(grads, want_grads):
            torch.testing.assert_close(g.cpu(), w)
    made.clear()
    # And the other way round: built here, freed on a worker thread after use there.
    loss, grads = _mlp_step_on(dev)
    box = [loss, grads]

    def consume():
        torch.testing.assert_close(box[0].cpu(), want_loss)
        box.clear()

    t = threading.Thread(target=consume)
    t.start()
    t.join()
    assert not box
    loss, grads = _mlp_step_on(dev)  # blocks reused after all that
    torch.testing.assert_close(loss.cpu(), want_loss)


def test_block_cache_off_matches():
    """TXLA_BLOCK_CACHE=0 allocates every block with ::operator new; the same values."""
    code = ("import torch, torch_xla\n"
            "torch.manual_seed(0)\n"
            "m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))"
            ".to(torch_xla.device())\n"
            "opt = torch.optim.AdamW(m.parameters(), foreach=True)\n"
            "x = torch.randn(5, 8).to(torch_xla.device())\n"
            "for _ in range(3):\n"
            "    opt.zero_grad(); m(x).square().mean().backward(); opt.step(); torch_xla.sync()\n"
            "print([round(v, 6) for v in m[0].weight.cpu().flatten()[:6].tolist()])\n")
    outs = _last_lines_with_switch(code, "TXLA_BLOCK_CACHE")
    assert outs[0] == outs[1]
