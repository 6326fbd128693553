"""issue #7, out= refusals the first probe missed (scripts/survey_out_dtype.py): out= tensor lists,
linalg ops whose ones/zeros stand-ins eager rejects for another reason, out= ops that also write a
positional argument (batch norm's running stats), and the values of those batch norm out= calls."""
import pytest
import torch

import torch_xla

DEV = torch_xla.device()


def _lu(d):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 3, generator=g)
    lu, piv = torch.linalg.lu_factor(a)
    b = torch.randn(3, 2, generator=g)
    return lu.to(d), piv.to(d), b.to(d)


def _ldl(d):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 3, generator=g)
    ld, piv = torch.linalg.ldl_factor(a @ a.T + torch.eye(3))
    return ld.to(d), piv.to(d), torch.randn(3, 2, generator=g).to(d)


def _e(shape, dt, d):
    return torch.empty(shape, dtype=dt, device=d)


_CASES = {
    "unbind_copy into long": lambda d, dt: torch.unbind_copy(torch.ones(3, 4, device=d), 0,
                                                             out=[_e(4, dt, d) for _ in range(3)]),
    "split_with_sizes_copy into f16": lambda d, dt: torch.split_with_sizes_copy(
        torch.ones(3, 4, device=d), [1, 2], 0, out=[_e((1, 4), dt, d), _e((2, 4), dt, d)]),
    "split_copy into f64": lambda d, dt: torch.split_copy(torch.ones(4, device=d), 2,
                                                          out=[_e(2, dt, d), _e(2, dt, d)]),
    "linalg.lu_solve into f64": lambda d, dt: torch.linalg.lu_solve(*_lu(d), out=_e((3, 2), dt, d)),
    "lu_solve into f16": lambda d, dt: torch.lu_solve(_lu(d)[2], *_lu(d)[:2], out=_e((3, 2), dt, d)),
    "lu_unpack into f64": lambda d, dt: torch.lu_unpack(*_lu(d)[:2], out=(
        _e((3, 3), dt, d), _e((3, 3), torch.float32, d), _e((3, 3), torch.float32, d))),
    "ldl_solve into f64": lambda d, dt: torch.linalg.ldl_solve(*_ldl(d), out=_e((3, 2), dt, d)),
    "lstsq into long": lambda d, dt: torch.linalg.lstsq(
        torch.eye(2, 3, device=d) + 1, torch.ones(2, 3, device=d), driver="gels", out=(
            _e((3, 3), dt, d), _e(0, torch.float32, d), _e(0, torch.long, d), _e(0, torch.float32, d))),
    "_native_batch_norm_legit into long": lambda d, dt: torch.ops.aten._native_batch_norm_legit.out(
        torch.ones(2, 3, device=d), None, None, torch.zeros(3, device=d), torch.ones(3, device=d), True, 0.1,
        1e-5, out=_e((2, 3), dt, d), save_mean=_e(3, torch.float32, d), save_invstd=_e(3, torch.float32, d)),
}
_BAD = {"unbind_copy into long": torch.long, "split_with_sizes_copy into f16": torch.float16,
        "split_copy into f64": torch.float64, "linalg.lu_solve into f64": torch.float64,
        "lu_solve into f16": torch.float16, "lu_unpack into f64": torch.float64,
        "ldl_solve into f64": torch.float64, "lstsq into long": torch.long,
        "_native_batch_norm_legit into long": torch.long}


def _first(r):
    return r[0] if isinstance(r, (tuple, list)) else r


@pytest.mark.parametrize("name", sorted(_CASES))
def test_missed_out_refusals_raise_as_eager(name):
    f, bad = _CASES[name], _BAD[name]
    if name == "split_copy into f64":  # eager's composite copies (casts) into each out: accepted
        outs = {}
        for d in ("cpu", DEV):
            outs[d] = [torch.empty(2, dtype=bad, device=d) for _ in range(2)]
            torch.split_copy(torch.arange(4.0, device=d), 2, out=outs[d])
        for a, b in zip(outs["cpu"], outs[DEV]):
            assert b.dtype == a.dtype
            torch.testing.assert_close(b.cpu(), a)
        return
    with pytest.raises(Exception) as ref:
        f("cpu", bad)
    with pytest.raises(type(ref.value)) as got:
        r = f(DEV, bad)
        _first(r).cpu() if r is not None else torch_xla.sync()
    assert str(ref.value).split("\n")[0] in str(got.value), (str(ref.value), str(got.value))


@pytest.mark.parametrize("name", sorted(_CASES))
def test_same_calls_with_the_right_dtype_give_eager_values(name):
    """The probe refuses only the dtype: the same calls into float32 outs are accepted, eager's values."""
    f = _CASES[name]
    ref, got = f("cpu", torch.float32), f(DEV, torch.float32)
    if ref is None:  # unbind_copy/split_copy out= return nothing
        return
    ref = ref if isinstance(ref, (tuple, list)) else (ref,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    for x, y in zip(ref, got):
        assert x.dtype == y.dtype and x.shape == y.shape
        torch.testing.assert_close(y.cpu(), x, equal_nan=True)


def test_list_outs_get_eager_values():
    x = torch.arange(12.0).view(3, 4)
    outs = {d: [torch.empty(4, device=d) for _ in range(3)] for d in ("cpu", DEV)}
    for d in outs:
        torch.unbind_copy(x.to(d), 0, out=outs[d])
    for a, b in zip(outs["cpu"], outs[DEV]):
        torch.testing.assert_close(b.cpu(), a)


@pytest.mark.parametrize("op", ["_native_batch_norm_legit", "_batch_norm_with_update"])
def test_batch_norm_out_writes_every_output_and_running_stat(op):
    """torch's generated Functionalize kernels of these out= ops assigned the results to the written
    arguments in the wrong order: `out` got save_invstd, `running_mean` the normalized input."""
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)) * 3 + 1
    res = {}
    for d in ("cpu", DEV):
        rm, rv = torch.zeros(3, device=d), torch.ones(3, device=d)
        o, sm, si = torch.empty(4, 3, device=d), torch.empty(3, device=d), torch.empty(3, device=d)
        v = rm._version
        if op == "_native_batch_norm_legit":
            torch.ops.aten._native_batch_norm_legit.out(x.to(d), None, None, rm, rv, True, 0.1, 1e-5, out=o,
                                                        save_mean=sm, save_invstd=si)
        else:
            torch.ops.aten._batch_norm_with_update.out(x.to(d), None, None, rm, rv, 0.1, 1e-5, out=o, save_mean=sm,
                                                       save_invstd=si, reserve=torch.empty(0, dtype=torch.uint8,
                                                                                           device=d))
        assert rm._version > v
        res[d] = [t.cpu() for t in (o, sm, si, rm, rv)]
    for a, b in zip(res["cpu"], res[DEV]):
        assert a.shape == b.shape
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_probe_runs_once_for_a_changing_python_number():
    """The verdict cache keys a Python number by its value class, not its value: a decaying learning
    rate added into a float64 out= pays the eager probe once, not at every step."""
    import torch_xla.debug.metrics as met
    x, o = torch.ones(8, device=DEV), torch.empty(8, dtype=torch.float64, device=DEV)
    before = met.counter_value("OutDtypeProbe") or 0
    lr = 0.1
    for _ in range(50):
        lr *= 0.97
        torch.add(x, lr, out=o)
    assert (met.counter_value("OutDtypeProbe") or 0) - before <= 1
    torch.testing.assert_close(o.cpu(), torch.ones(8, dtype=torch.float64) + torch.tensor(lr, dtype=torch.float32))


@pytest.mark.parametrize("case", ["int 0 then 3", "int 3 then 0", "float 2.5 then nan", "uint8 300 then 3",
                                  "neg pow"])
def test_value_class_keys_keep_value_dependent_outcomes(case):
    """Values of different classes get their own verdicts (zero, NaN, overflow, sign): the second call of
    each pair has eager's outcome whatever the first call cached."""
    i64 = lambda d: torch.tensor([4, 5], device=d)  # noqa: E731
    f = {
        "int 0 then 3": [lambda d: torch.remainder(i64(d), 0, out=torch.empty(2, device=d)),
                         lambda d: torch.remainder(i64(d), 3, out=torch.empty(2, device=d))],
        "int 3 then 0": [lambda d: torch.remainder(i64(d), 3, out=torch.empty(2, device=d)),
                         lambda d: torch.remainder(i64(d), 0, out=torch.empty(2, device=d))],
        "float 2.5 then nan": [lambda d: torch.mul(i64(d), 2.5, out=torch.empty(2, dtype=torch.long, device=d)),
                               lambda d: torch.mul(i64(d), float("nan"), out=torch.empty(2, dtype=torch.long, device=d))],
        "uint8 300 then 3": [lambda d: torch.add(torch.ones(2, dtype=torch.uint8, device=d), 300,
                                                 out=torch.empty(2, device=d)),
                             lambda d: torch.add(torch.ones(2, dtype=torch.uint8, device=d), 3,
                                                 out=torch.empty(2, device=d))],
        "neg pow": [lambda d: torch.pow(i64(d), 2, out=torch.empty(2, device=d)),
                    lambda d: torch.pow(i64(d), -2, out=torch.empty(2, device=d))],
    }[case]
    for g in f:
        try:
            ref = g("cpu")
        except Exception as e:  # noqa: BLE001
            with pytest.raises(type(e)) as got:
                g(DEV).cpu()
            assert str(e).split("\n")[0] in str(got.value)
            continue
        got = g(DEV).cpu()
        assert got.dtype == ref.dtype
        torch.testing.assert_close(got, ref, equal_nan=True)


def test_eager_verdicts_are_constant_within_each_value_class():
    """The evidence behind the value-class key (tests/_probe_value_classes.py; the full run over all 109
    out= overloads with a Scalar argument is `python tests/_probe_value_classes.py`): for the common
    arithmetic out= overloads, every value of a class gets the same eager verdict (refused with the same
    message, or not refused)."""
    import sys, os
    sys.path.insert(0, os.path.dirname(__file__))
    import _probe_value_classes as pvc
    common = ("add.out", "add.Scalar_out", "sub.out", "mul.Scalar_out", "div.Scalar_out", "pow.Tensor_Scalar_out",
              "remainder.Scalar_out", "fmod.Scalar_out", "floor_divide.Scalar_out", "clamp_min.out",
              "clamp_max.out", "eq.Scalar_out", "lt.Scalar_out", "bitwise_and.Scalar_out", "lerp.Scalar_out",
              "addcmul.out", "fill.Scalar_out", "masked_fill.Scalar_out", "hardtanh.out", "threshold.out",
              "leaky_relu.out", "rsub.Scalar_out", "float_power.Tensor_Scalar_out", "copysign.Scalar_out")
    from torch_xla import _C
    bad, groups = pvc.differing_classes(_C._out_probe_value_class, names=common, in_dtypes=(torch.float32, torch.int64, torch.uint8),
                                        out_dtypes=(torch.int64, torch.uint8, torch.float16, torch.bool))
    assert groups > 500 and not bad, bad[:5]


@pytest.mark.parametrize("kw", [{}, {"atol": 0.1}, {"atol": 0.1, "rtol": 0.0}, {"hermitian": True}, {"tol": 0.1},
                                {"atol_t": 0.5}])
@pytest.mark.parametrize("dt", [torch.int64, torch.float64, torch.float16, torch.int32, torch.bool])
def test_matrix_rank_out_is_written_as_eager(kw, dt):
    """torch.linalg.matrix_rank(x, out=o) left `o` unwritten on XLA (the composite rebinds its reference
    to `out` for tensor subclasses): the survey's "matrix_rank tolerance" was this wrong value."""
    g = torch.Generator().manual_seed(2)
    a = torch.randn(3, 4, 4, generator=g)
    a[1, :, 0] = 0  # rank 3
    a = a + a.transpose(1, 2) if kw.get("hermitian") else a

    def f(d):
        k = dict(kw)
        if "atol_t" in k:
            k["atol"] = torch.tensor(k.pop("atol_t"), device=d)
        o = torch.full((3,), 7, dtype=dt, device=d)
        r = torch.linalg.matrix_rank(a.to(d), **k, out=o)
        return o, r

    try:
        ref, rr = f("cpu")
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)) as got:
            f(DEV)[0].cpu()
        assert str(e) in str(got.value)
        return
    got, gr = f(DEV)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    torch.testing.assert_close(got.cpu(), ref)
    torch.testing.assert_close(gr.cpu(), rr)


@pytest.mark.parametrize("found_inf", [0.0, 1.0])
def test_amp_update_scale_out_writes_out_and_growth_tracker(found_inf):
    """Same ordering bug in torch's generated Functionalize kernel: `out` received the growth
    tracker's new value and the tracker the new scale. Eager's out= kernel writes `out` only (the
    tracker keeps its value although the schema marks it written): matched."""
    res = {}
    for dev in ("cpu", DEV):
        s = torch.tensor(4.0, device=dev)
        gt = torch.tensor(1, dtype=torch.int32, device=dev)
        out = torch.empty((), device=dev)
        torch.ops.aten._amp_update_scale.out(s, gt, torch.tensor(found_inf, device=dev), 2.0, 0.5, 2, out=out)
        res[str(dev)] = (out.cpu(), gt.cpu(), s.cpu())
    for x, y in zip(res["cpu"], res[str(DEV)]):
        assert x.dtype == y.dtype
        torch.testing.assert_close(y, x, rtol=0, atol=0)


def test_rrelu_with_noise_out_writes_out_and_noise():
    """rrelu_with_noise.out: `out` holds the activation and `noise` the drawn slopes (they were swapped).
    The random stream differs from eager's, so the relation between them is checked: eager's rule
    out = x * noise with noise = 1 where x > 0 and in [lower, upper] where x <= 0."""
    x = torch.tensor([1.5, -2.0, 0.0, -0.5, 3.0, -1.0, -4.0, 2.0], device=DEV)
    noise = torch.zeros(8, device=DEV)
    out = torch.empty(8, device=DEV)
    torch.ops.aten.rrelu_with_noise.out(x, noise, 0.1, 0.3, True, None, out=out)
    xc, nc, oc = x.cpu(), noise.cpu(), out.cpu()
    pos = xc > 0
    assert (nc[pos] == 1).all()
    assert ((nc[~pos] >= 0.1) & (nc[~pos] <= 0.3)).all()
    torch.testing.assert_close(oc, xc * nc)
    # eval mode: a fixed slope, noise untouched (eager writes nothing into it)
    n2 = torch.full((8,), 7.0, device=DEV)
    o2 = torch.empty(8, device=DEV)
    torch.ops.aten.rrelu_with_noise.out(x, n2, 0.1, 0.3, False, None, out=o2)
    ne, oe = torch.full((8,), 7.0), torch.empty(8)
    torch.ops.aten.rrelu_with_noise.out(xc, ne, 0.1, 0.3, False, None, out=oe)
    torch.testing.assert_close(o2.cpu(), oe)
    torch.testing.assert_close(n2.cpu(), ne)


def test_fused_moving_avg_obs_fq_helper_out_as_eager():
    """out0/out1 were swapped with the running statistics; eager's out= kernel writes the outs only."""
    res = {}
    for dev in ("cpu", DEV):
        torch.manual_seed(0)
        x = torch.randn(4, 3).to(dev)
        on = torch.tensor([1], dtype=torch.long, device=dev)
        stats = [torch.tensor([float("inf")], device=dev), torch.tensor([-float("inf")], device=dev),
                 torch.tensor([1.0], device=dev), torch.tensor([0], dtype=torch.int32, device=dev)]
        o0, o1 = torch.empty(4, 3, device=dev), torch.empty(4, 3, dtype=torch.bool, device=dev)
        torch.ops.aten._fused_moving_avg_obs_fq_helper.out(x, on, on, *stats, 0.01, 0, 255, 0, False, False,
                                                           out0=o0, out1=o1)
        res[str(dev)] = [t.cpu() for t in [o0, o1] + stats]
    for a, b in zip(res["cpu"], res[str(DEV)]):
        assert a.dtype == b.dtype
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def _pair(v, d):
    return [torch.full((2, 3), float(v), device=d), torch.full((4,), float(v) + 1, device=d)]


def _assert_same(res):
    """res: {"cpu": [tensors], "xla:0": [tensors]}: same count, shapes, dtypes and values."""
    assert len(res["cpu"]) == len(res[str(DEV)])
    for x, y in zip(res["cpu"], res[str(DEV)]):
        assert x.shape == y.shape and x.dtype == y.dtype
        torch.testing.assert_close(y, x)


def _fused_calls():
    """(name, overload, args builder, kwargs builder) for every fused optimizer out= overload."""
    calls = []
    for ov in ("out", "tensor_lr_out"):
        def lr(d, ov=ov):
            return 0.1 if ov == "out" else torch.tensor(0.1, device=d)
        for name in ("_fused_adam", "_fused_adamw"):
            for ams in (False, True):
                calls.append((name, ov, lambda d, L, ams=ams: [L(1, d), L(0.5, d), L(0.1, d), L(0.2, d),
                                                               L(0.3, d) if ams else [],
                                                               [torch.tensor(1.0, device=d), torch.tensor(3.0, device=d)]],
                              lambda d, ams=ams, lr=lr: dict(lr=lr(d), beta1=0.9, beta2=0.99, weight_decay=0.01,
                                                             eps=1e-8, amsgrad=ams, maximize=False)))
        calls.append(("_fused_sgd", ov, lambda d, L: [L(1, d), L(0.5, d), L(0.3, d)],
                      lambda d, lr=lr: dict(weight_decay=0.01, momentum=0.9, lr=lr(d), dampening=0.0,
                                            nesterov=False, maximize=False, is_first_step=False)))
        calls.append(("_fused_adagrad", ov, lambda d, L: [L(1, d), L(0.5, d), L(0.3, d),
                                                          [torch.tensor(1.0, device=d), torch.tensor(3.0, device=d)]],
                      lambda d, lr=lr: dict(lr=lr(d), lr_decay=0.0, weight_decay=0.01, eps=1e-10, maximize=False)))
    return calls


@pytest.mark.parametrize("case", _fused_calls(), ids=lambda c: f"{c[0]}.{c[1]}")
def test_fused_optimizer_out_writes_out_only_as_eager(case):
    """torch's generated Functionalize kernels of the fused optimizers' out= overloads raised its
    internal assert or gave `out` the gradients and the optimizer state the new parameters. Eager
    writes `out` (the new parameters) and leaves every argument as it was: matched."""
    name, ov, args, kwargs = case

    res = {}
    for dev in ("cpu", DEV):
        a = args(dev, _pair)
        out = [torch.empty(0, device=dev), torch.empty(4, device=dev)]
        getattr(getattr(torch.ops.aten, name), ov)(*a, **kwargs(dev), out=out)
        res[str(dev)] = [o.cpu() for o in out] + [t.cpu() for lst in a for t in lst]
    _assert_same(res)


def test_fused_optimizer_out_dtype_error_as_eager():
    for dev in ("cpu", DEV):
        p = [torch.ones(3, device=dev)]
        with pytest.raises(RuntimeError, match="Expected out tensor to have dtype float, but got double instead"):
            torch.ops.aten._fused_sgd.out(p, [torch.ones(3, device=dev)], [torch.ones(3, device=dev)],
                                          weight_decay=0.0, momentum=0.9, lr=0.1, dampening=0.0, nesterov=False,
                                          maximize=False, is_first_step=False,
                                          out=[torch.empty(3, dtype=torch.float64, device=dev)])


def test_amp_foreach_unscale_out_writes_out_only_as_eager():
    """`_amp_foreach_non_finite_check_and_unscale.out`: `out` got found_inf's value and found_inf the
    unscaled gradients. Eager writes the unscaled gradients to `out` and leaves found_inf alone."""
    res = {}
    for dev in ("cpu", DEV):
        g = [torch.tensor([1.0, float("inf"), 2.0], device=dev), torch.tensor([4.0], device=dev)]
        fi = torch.zeros((), device=dev)
        out = [torch.empty(3, device=dev), torch.empty(0, device=dev)]
        torch.ops.aten._amp_foreach_non_finite_check_and_unscale.out(g, fi, torch.tensor(0.5, device=dev), out=out)
        res[str(dev)] = [o.cpu() for o in out] + [t.cpu() for t in g] + [fi.cpu()]
    _assert_same(res)


@pytest.mark.parametrize("case", _fused_calls(), ids=lambda c: f"{c[0]}_.{c[1]}")
def test_fused_optimizer_inplace_as_eager(case):
    """The in-place fused optimizers: `_fused_adam_` with an empty max_exp_avg_sqs (no amsgrad) hit
    torch's functionalization assert, `_fused_sgd_`/`_fused_adagrad_` had no meta kernel."""
    name, ov, args, kwargs = case

    res = {}
    for dev in ("cpu", DEV):
        a = args(dev, _pair)
        op = getattr(torch.ops.aten, name + "_")
        (op.default if ov == "out" else op.tensor_lr)(*a, **kwargs(dev))
        res[str(dev)] = [t.cpu() for lst in a for t in lst]
    _assert_same(res)
