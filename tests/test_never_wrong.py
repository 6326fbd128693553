"""Issue #7 regressions: each case once gave a silently wrong answer, accepted an invalid program,
lost data or hung. Every result is compared with eager CPU (values, NaN positions, signed zeros,
dtypes, shapes) and every error with eager's exception type."""
import copy
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_xla

DEV = torch_xla.device()
NAN, INF = float("nan"), float("inf")


def _expand_fill(d):
    t = torch.tensor([1.0, NAN, INF], device=d)
    t.expand(3).fill_(-3)
    return t


def _expand_empty_pow(d):
    x = torch.tensor([1.0, -0.0, INF, NAN], device=d)
    x.expand(4)[4:].pow_(2)
    return x


def _expand_bool_fill(d):
    x = torch.tensor([True, False], device=d)
    x.expand(2).fill_(True)
    return x


def _expand_overlap_fill(d):
    x = torch.zeros(3, device=d)
    x.expand(2, 3).fill_(1)
    return x


def _expand_row_fill(d):
    x = torch.ones(2, 1, device=d)
    x.expand(2, 3)[0].fill_(5)
    return x


def _unfold_mul(d):
    t = torch.arange(1.0, 7.0, device=d)
    t.unfold(0, 1, 2).mul_(10)
    return t


def _unfold_2d_fill(d):
    t = torch.arange(12.0, device=d).reshape(3, 4)
    t.unfold(1, 2, 2)[1].fill_(-0.0)
    return t


def _overlap_case(view, write):
    """Writes through a view whose elements overlap in memory: eager writes element after element,
    a base element keeps the last value written to any view element covering it."""
    def run(d):
        b = torch.arange(1.0, 6.0, device=d)
        write(view(b), d)
        return b
    return run


def _mask(d):
    return torch.tensor([[False, True, False], [False, False, False], [True, False, False]], device=d)


OVERLAP_CASES = {
    "expand_masked_fill_not_at_index0": lambda d: _expand_masked_fill(d),
    "expand_index_fill": lambda d: _expand_index_fill(d),
    "expand_slice_zero": lambda d: _expand_slice_zero(d),
    "expand_row_add_then_read": lambda d: _expand_row_add(d),
    "unfold_masked_fill": _overlap_case(lambda b: b.unfold(0, 3, 1), lambda v, d: v.masked_fill_(_mask(d), -1)),
    "unfold_setitem_mask": _overlap_case(lambda b: b.unfold(0, 3, 1), lambda v, d: v.__setitem__(_mask(d), -1.0)),
    "unfold_copy_last_wins": _overlap_case(lambda b: b.unfold(0, 3, 1),
                                           lambda v, d: v.copy_(torch.arange(9.0, device=d).view(3, 3) + 10)),
    "unfold_fill": _overlap_case(lambda b: b.unfold(0, 3, 1), lambda v, d: v.fill_(7)),
    "unfold_fill_negzero": _overlap_case(lambda b: b.unfold(0, 2, 1), lambda v, d: v[1:].fill_(-0.0)),
    "unfold_setitem_one": _overlap_case(lambda b: b.unfold(0, 3, 1), lambda v, d: v.__setitem__((1, 0), 100.0)),
    "as_strided_fill": _overlap_case(lambda b: b.as_strided((3, 2), (1, 1)), lambda v, d: v.fill_(3)),
    "unfold_no_overlap_mul": _overlap_case(lambda b: b.unfold(0, 2, 3), lambda v, d: v.mul_(10)),
    "expand_row_copy": lambda d: _expand_row_copy(d),
    "unfold_fill_twice": _overlap_case(lambda b: b.unfold(0, 3, 1), lambda v, d: (v.fill_(2), v[0].fill_(5))),
}


def _expand_masked_fill(d):
    b = torch.zeros(1, device=d)
    b.expand(3).masked_fill_(torch.tensor([False, True, False], device=d), 5)
    return b


def _expand_index_fill(d):
    b = torch.zeros(1, 1, device=d)
    b.expand(2, 3).index_fill_(1, torch.tensor([1], device=d), 5)
    return b


def _expand_slice_zero(d):
    b = torch.arange(1.0, 3.0, device=d)
    b.view(2, 1).expand(2, 3)[:, 1:].zero_()
    return b


def _expand_row_copy(d):
    b = torch.arange(4.0, device=d)
    e = b.expand(3, 4)
    e[2].copy_(torch.tensor([-1.0, -0.0, 7.0, 8.0], device=d))
    return torch.stack([b, e[0]])


def _expand_row_add(d):
    b = torch.arange(4.0, device=d)
    e = b.expand(3, 4)
    e[1].add_(1)
    return torch.stack([b, e[2]])


_OUT_OF_RANGE = [float("nan"), float("inf"), -float("inf"), 3e9, -3e9, 1e20, 2.7, -2.7, 300.0, -129.0, 1000.5,
                 -70000.0, -2147483648.0, 65504.0]


@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dst", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool])
def test_float_to_int_casts_out_of_range_as_eager(src, dst):
    """Out-of-range float -> int conversions: eager gives what x86's conversion instructions give
    (INT64_MIN/INT32_MIN for NaN, inf and too-large values; narrower types wrap through int32),
    XLA saturates: we give eager's values (also through cumsum's dtype= and sums)."""
    x = torch.tensor(_OUT_OF_RANGE).to(src)
    ref = x.to(dst)
    got = x.to(DEV).to(dst).cpu()
    assert torch.equal(ref, got), f"{src}->{dst}: eager {ref.tolist()} vs xla {got.tolist()}"
    if dst == torch.int64:
        torch.testing.assert_close(x.to(DEV).cumsum(0, dtype=dst).cpu(), x.cumsum(0, dtype=dst), rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:Use of .* on expanded tensors is deprecated")
@pytest.mark.parametrize("name", list(OVERLAP_CASES))
def test_writes_through_overlapping_views_match_eager(name):
    fn = OVERLAP_CASES[name]
    ref = fn("cpu")
    got = fn(DEV).cpu()
    assert torch.equal(ref, got) and ref.dtype == got.dtype, f"{name}: eager {ref} vs xla {got}"
    assert torch.equal(torch.signbit(ref), torch.signbit(got)), f"{name}: signed zeros differ: {ref} vs {got}"


@pytest.mark.parametrize("view", ["unfold", "as_strided", "unfold_after_fill"])
@pytest.mark.parametrize("op", ["mul_", "add_", "pow_", "addcmul_"])
def test_read_modify_write_through_overlapping_view_refused(view, op):
    """Eager computes these element after element, reading what it has just written (its result
    depends on its kernel's iteration order): we raise instead of giving other numbers."""
    b = torch.arange(1.0, 6.0, device=DEV)
    if view == "as_strided":
        v = b.as_strided((3, 2), (1, 1))
    else:
        v = b.unfold(0, 3, 1)
        if view == "unfold_after_fill":
            v.fill_(2)
    assert not v.is_contiguous() and v.stride() == ((1, 1) if view != "as_strided" else (1, 1))
    call = {"mul_": lambda: v.mul_(2), "add_": lambda: v.add_(torch.ones_like(v)), "pow_": lambda: v.pow_(2),
            "addcmul_": lambda: v.addcmul_(v.detach().clone(), v.detach().clone())}[op]
    with pytest.raises(RuntimeError, match="overlap in memory"):
        call()
        torch_xla.sync()
    assert torch.equal(b.cpu(), torch.full((5,), 2.0) if view == "unfold_after_fill" else torch.arange(1.0, 6.0))


CASES = {
    "expand_fill_keeps_inf_nan": _expand_fill,
    "expand_empty_slice_writes_nothing": _expand_empty_pow,
    "expand_bool_fill": _expand_bool_fill,
    "expand_overlapping_fill": _expand_overlap_fill,
    "expand_then_select_fill": _expand_row_fill,
    "unfold_gaps_untouched": _unfold_mul,
    "unfold_2d_fill": _unfold_2d_fill,
    "nan_times_false": lambda d: torch.tensor([NAN, INF, 2.0], device=d) * torch.tensor([False, False, True], device=d),
    "nan_times_mask_float": lambda d: torch.tensor([NAN, INF, 2.0], device=d) * torch.tensor([0, 0, 1], device=d).bool().float(),
    "f16_times_big_scalar": lambda d: torch.tensor([1e-3, 2.0], dtype=torch.float16, device=d) * 1e5,
    "f16_div_big_scalar": lambda d: torch.tensor([1e-3, 2.0], dtype=torch.float16, device=d) / 1e5,
    "bf16_add_small_scalar": lambda d: torch.tensor([1.0, 256.0], dtype=torch.bfloat16, device=d) + 1e-3,
    "softmax_0d_nan": lambda d: torch.softmax(torch.tensor(NAN, device=d), -1),
    "log_softmax_0d_nan": lambda d: torch.log_softmax(torch.tensor(NAN, device=d), -1),
    "softmax_0d_finite": lambda d: torch.softmax(torch.tensor(5.0, device=d), 0),
    "adaptive_pool_uneven_inf": lambda d: F.adaptive_avg_pool2d(torch.tensor([[[1, INF], [2, 3], [4, 5]]], device=d), (2, 1)),
    "adaptive_pool_uneven_values": lambda d: F.adaptive_avg_pool2d(
        torch.arange(70.0, device=d).reshape(1, 2, 7, 5).sin(), (3, 4)),
    "sign_nan_negzero": lambda d: torch.sign(torch.tensor([NAN, -0.0, -2.0, 3.0], device=d)),
    "pow_minus_half": lambda d: torch.pow(torch.tensor([-INF, -0.0, 4.0], device=d), -0.5),
    "pow_half_negzero": lambda d: torch.pow(torch.tensor([-0.0, 4.0], device=d), 0.5),
    "pow_three_minus_two": lambda d: torch.stack([torch.tensor([-2.0, INF], device=d) ** 3,
                                                  torch.tensor([-0.0, INF], device=d) ** -2]),
    "floor_div_inf": lambda d: torch.div(torch.tensor([-INF, INF], device=d), torch.tensor([2.0, -2.0], device=d),
                                         rounding_mode="floor"),
    "floor_div_by_inf": lambda d: torch.tensor([-3.0, 3.0, -0.0], device=d).div(INF, rounding_mode="floor"),
    "floor_div_values": lambda d: torch.div(torch.tensor([7.0, -7.0, 7.5, -0.0, 1.0], device=d),
                                            torch.tensor([2.0, 2.0, -2.5, 3.0, 0.0], device=d), rounding_mode="floor"),
    "empty_index_select": lambda d: torch.zeros(2, 0, device=d).index_select(1, torch.tensor([], dtype=torch.long, device=d)),
    "scalar_floordiv_tensor": lambda d: 7 // torch.arange(1, 4, device=d),
    # eager's integer zero-division checks run per element: nothing to divide, nothing raised
    "empty_int_remainder_by_zero": lambda d: torch.tensor([], dtype=torch.long, device=d) % 0,
    "empty_int_fmod_by_zero_tensor": lambda d: torch.fmod(torch.zeros(0, 2, dtype=torch.long, device=d),
                                                          torch.zeros(2, dtype=torch.long, device=d)),
    "empty_int_floordiv_by_zero": lambda d: torch.tensor([], dtype=torch.long, device=d) // 0,
    "empty_take_along_dim": lambda d: torch.take_along_dim(torch.zeros(0, device=d),
                                                           torch.tensor([], dtype=torch.long, device=d), 0),
    # argmin/argmax over a non-empty dimension of a tensor empty elsewhere: an empty result
    "argmin_empty_other_dim": lambda d: torch.zeros(0, 1, 5, 3, dtype=torch.int32, device=d).argmin(3, keepdim=True),
    "argmax_empty_other_dim": lambda d: torch.zeros(0, 3, device=d).argmax(1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_eager(name):
    fn = CASES[name]
    ref = fn("cpu")
    out = fn(DEV)
    assert out.device.type == "xla", f"{name}: result on {out.device}"
    got = out.cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape
    torch.testing.assert_close(got, ref, equal_nan=True, rtol=1e-3 if ref.dtype == torch.float16 else 1.3e-6,
                               atol=1e-5)
    if ref.is_floating_point():  # signed zeros and infinities too
        assert torch.equal(torch.signbit(got), torch.signbit(ref)), f"{name}: signs {got} vs {ref}"


def _inplace_broadcast(d):
    t = torch.ones(1, dtype=torch.long, device=d) * 7
    t %= torch.tensor([2, 3, 4, 5], device=d)
    return t


def _mask_shape(d):
    t = torch.zeros(3, 2, device=d)
    t[torch.tensor([[True]], device=d)] = 5.0
    return t


def _overlap_add(d):
    x = torch.zeros(3, device=d)
    x.expand(2, 3).add_(1)
    return x


def _int_neg_pow(d):
    return torch.tensor([2, 3], device=d) ** -1


def _inplace_int_div(d):
    x = torch.tensor([4, 6], device=d)
    x /= 2
    return x


def _li(d):
    return torch.tensor([1, 2, 3], device=d)


def _bo(d):
    return torch.tensor([True, False], device=d)


def _cross_device(d):
    if d == "cpu":
        raise RuntimeError("two devices")
    return torch.ones(2, device="xla:0") + torch.ones(2, device="xla:1")


ERRORS = {
    "layer_norm_int": (lambda d: F.layer_norm(_li(d), (3,)), NotImplementedError),
    "std_int": (lambda d: _li(d).std(), RuntimeError),
    "var_int": (lambda d: _li(d).var(), RuntimeError),
    "vector_norm_int": (lambda d: torch.linalg.vector_norm(_li(d)), RuntimeError),
    "topk_bool": (lambda d: _bo(d).topk(1), RuntimeError),
    "argmax_bool": (lambda d: _bo(d).argmax(), RuntimeError),
    "abs_bool": (lambda d: _bo(d).abs(), NotImplementedError),
    "dot_bool": (lambda d: _bo(d).dot(_bo(d)), NotImplementedError),
    "matmul_bool": (lambda d: _bo(d).view(1, 2) @ _bo(d).view(2, 1), NotImplementedError),
    "lerp_int": (lambda d: torch.lerp(_li(d), _li(d), 0.5), NotImplementedError),
    "addcdiv_int": (lambda d: torch.addcdiv(_li(d), _li(d), _li(d)), RuntimeError),
    "float_index": (lambda d: _li(d)[torch.tensor([0.0], device=d)], IndexError),
    "full_uint8_overflow": (lambda d: torch.full((2,), 300, dtype=torch.uint8, device=d), RuntimeError),
    "fill_f16_overflow": (lambda d: torch.ones(2, dtype=torch.float16, device=d).fill_(1e6), RuntimeError),
    "float_alpha_int_add": (lambda d: torch.add(_li(d), _li(d), alpha=0.5), RuntimeError),
    "int_mod_zero_scalar": (lambda d: _li(d) % 0, RuntimeError),
    "int_mod_zero_tensor": (lambda d: _li(d) % torch.tensor([1, 0, 1], device=d), RuntimeError),
    "int_div_trunc_zero": (lambda d: torch.div(_li(d), 0, rounding_mode="trunc"), RuntimeError),
    "int_floordiv_zero_tensor": (lambda d: _li(d) // torch.zeros(3, dtype=torch.long, device=d), RuntimeError),
    "maxpool_too_small": (lambda d: F.max_pool2d(torch.ones(1, 1, 2, 2, device=d), 3), RuntimeError),
    "avgpool_too_small": (lambda d: F.avg_pool2d(torch.ones(1, 1, 2, 2, device=d), 3), RuntimeError),
    "one_hot_out_of_range": (lambda d: F.one_hot(_li(d), 2), RuntimeError),
    "gather_out_of_range": (lambda d: _li(d).gather(0, torch.tensor([5], device=d)), RuntimeError),
    "scatter_out_of_range": (lambda d: _li(d).scatter(0, torch.tensor([5], device=d), _li(d)[:1]), RuntimeError),
    "empty_max": (lambda d: torch.zeros(0, device=d).max(), RuntimeError),
    "empty_argmax": (lambda d: torch.zeros(0, device=d).argmax(), IndexError),
    "empty_amax_dim": (lambda d: torch.zeros(0, 3, device=d).amax(0), IndexError),
    "empty_min_dim": (lambda d: torch.zeros(0, 3, device=d).min(0), IndexError),
    "softmax_int": (lambda d: torch.softmax(_li(d), 0), NotImplementedError),
    "pow_bool_bool": (lambda d: torch.pow(_bo(d), _bo(d)), NotImplementedError),
    "random_from_ge_to": (lambda d: torch.zeros(2, device=d).random_(5, 5), RuntimeError),
    "two_xla_devices": (_cross_device, RuntimeError),
    "inplace_broadcast_shape": (_inplace_broadcast, RuntimeError),
    "mask_shape_mismatch": (_mask_shape, IndexError),
    "inplace_internal_overlap": (_overlap_add, RuntimeError),
    "int_negative_power": (_int_neg_pow, RuntimeError),
    "inplace_result_cast": (_inplace_int_div, RuntimeError),
    # eager's index_select raises RuntimeError along dim 1 of a tensor of rank >= 2, IndexError otherwise
    "argmin_empty_reduced_dim": (lambda d: torch.zeros(0, 3, device=d).argmin(0), IndexError),
    "argmax_empty_no_dim": (lambda d: torch.zeros(0, 3, device=d).argmax(), IndexError),
    "masked_fill_nan_into_long": (lambda d: torch.zeros(3, dtype=torch.long, device=d).masked_fill_(
        torch.tensor([True, False, True], device=d), float("nan")), RuntimeError),
    "index_fill_overflow_uint8": (lambda d: torch.zeros(3, dtype=torch.uint8, device=d).index_fill_(
        0, torch.tensor([1], device=d), 300), RuntimeError),
    "dot_empty_bool": (lambda d: torch.dot(torch.zeros(0, dtype=torch.bool, device=d),
                                           torch.zeros(0, dtype=torch.bool, device=d)), NotImplementedError),
    "fmod_bool": (lambda d: torch.fmod(torch.ones(3, dtype=torch.bool, device=d),
                                       torch.ones(3, dtype=torch.bool, device=d)), NotImplementedError),
    "fmod_bool_scalar": (lambda d: torch.fmod(torch.ones(3, dtype=torch.bool, device=d), True), NotImplementedError),
    "remainder_bool": (lambda d: torch.remainder(torch.ones(3, dtype=torch.bool, device=d),
                                                 torch.ones(3, dtype=torch.bool, device=d)), NotImplementedError),
    "amin_empty_no_dim": (lambda d: torch.zeros(5, 0, 2, device=d).amin(), RuntimeError),
    "amax_empty_dim_1": (lambda d: torch.zeros(5, 0, 2, device=d).amax(1), IndexError),
    "bool_matmul_long": (lambda d: torch.zeros(2, 1, dtype=torch.bool, device=d) @ torch.zeros(
        1, 3, dtype=torch.long, device=d), RuntimeError),
    "bool_bmm_long": (lambda d: torch.bmm(torch.zeros(1, 2, 1, dtype=torch.bool, device=d),
                                          torch.zeros(1, 1, 3, dtype=torch.long, device=d)), NotImplementedError),
    "copy_into_expand": (lambda d: torch.zeros(1, device=d).expand(3).copy_(torch.ones(3, device=d)), RuntimeError),
    "index_select_dim1_out_of_range": (lambda d: torch.zeros(2, 3, device=d).index_select(
        1, torch.tensor([0, 5], device=d)), RuntimeError),
    "index_select_dim1_int64": (lambda d: torch.ones(1, 1, dtype=torch.long, device=d).index_select(
        -1, torch.tensor([0, 1], device=d)), RuntimeError),
    "index_select_dim0_out_of_range": (lambda d: torch.zeros(2, 3, device=d).index_select(
        0, torch.tensor([2], device=d)), IndexError),
    "index_select_dim2_out_of_range": (lambda d: torch.zeros(2, 3, 4, device=d).index_select(
        2, torch.tensor([9], device=d)), IndexError),
    # norms without an identity (ord < 0, inf) over an empty dimension or an empty tensor (fuzz 12793)
    "inf_norm_empty_dim": (lambda d: torch.zeros(0, 1, 0, device=d).norm(p=float("inf"), dim=2), RuntimeError),
    "neg_norm_empty_dim": (lambda d: torch.linalg.vector_norm(torch.zeros(2, 0, device=d), -1, -1), RuntimeError),
    "inf_norm_empty_tensor": (lambda d: torch.linalg.vector_norm(torch.zeros(0, 3, device=d), float("inf")),
                              RuntimeError),
    # bool floor division: eager's shape error before its dtype error (fuzz 12808)
    "bool_floordiv_shape_first": (lambda d: torch.ones(4, 3, dtype=torch.bool, device=d) // torch.ones(
        4, 2, dtype=torch.bool, device=d), RuntimeError),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_raises_as_eager(name):
    fn, exc = ERRORS[name]
    if name == "two_xla_devices" and torch_xla.device_count() < 2:
        pytest.skip("needs 2 devices of this process: tests/test_multi_device.py runs it with 4")
    with pytest.raises(exc):
        fn("cpu")
    with pytest.raises(exc):
        fn(DEV).cpu()
        torch_xla.sync()


def test_no_host_storage():
    x = torch.ones(2, device=DEV)
    with pytest.raises(RuntimeError, match="XLA tensor"):
        x.data_ptr()
    with pytest.raises(RuntimeError, match="XLA tensor"):
        x.untyped_storage()
    assert torch.ones(2).data_ptr() != 0


def test_cpu_indices_and_masks():
    base = torch.arange(6.0).view(2, 3)
    x = base.to(DEV)
    idx = torch.tensor([2, 0])
    torch.testing.assert_close(x[:, idx].cpu(), base[:, idx])
    mask = torch.tensor([True, False, True])
    torch.testing.assert_close(x[:, mask].cpu(), base[:, mask])
    y, yb = x.clone(), base.clone()
    y[:, mask] = 10.0
    yb[:, mask] = 10.0
    torch.testing.assert_close(y.cpu(), yb)


def test_index_error_names_op_and_line():
    t = torch.randn(5, device=DEV)
    t.index_select(0, torch.tensor([7], device=DEV))  # result never read
    with pytest.raises(IndexError, match=r"index_select.*test_never_wrong.py:\d+"):
        (t * 2).cpu()
    assert (t * 2).cpu().shape == (5,)  # raised once, the device keeps working


def test_empty_result_index_check_never_fires():
    t = torch.zeros(0, 3, device=DEV)
    out = t.index_select(1, torch.tensor([1, 2], device=DEV))
    assert out.cpu().shape == (0, 2)
    torch_xla.sync()


def _run(code, env=None, timeout=120):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=timeout)


def test_fork_after_start_raises_in_child():
    code = """
import os, sys, torch, torch_xla
d = torch_xla.device()
a = torch.ones(3, device=d); assert a.sum().item() == 3
pid = os.fork()
if pid == 0:
    try:
        (a + 1).cpu()
        os._exit(3)
    except RuntimeError as e:
        os._exit(0 if "fork" in str(e) else 4)
_, st = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(st))
"""
    r = _run(code, timeout=60)
    assert "child 0" in r.stdout, r.stdout + r.stderr


def test_cpu_num_devices_cap():
    r = _run("import torch, torch_xla; torch.ones(1, device=torch_xla.device())", {"CPU_NUM_DEVICES": "100000"})
    assert r.returncode != 0 and "ValueError" in r.stderr and "1024" in r.stderr, r.stderr[-500:]


def test_unknown_xla_flag_is_python_error():
    r = _run("""
import torch, torch_xla
try:
    torch.ones(1, device=torch_xla.device())
except ValueError as e:
    print("ValueError", e)
""", {"XLA_FLAGS": "--xla_this_flag_does_not_exist=1"})
    assert r.returncode == 0 and "xla_this_flag_does_not_exist" in r.stdout, r.stdout + r.stderr[-500:]


def test_xla_flag_whose_name_is_in_the_plugin_but_is_no_flag_is_python_error(tmp_path):
    """The plugin's file holds names of removed flags and DebugOptions fields that are no flag:
    XLA still aborts on them, so such a name is tried in a child process first (then cached)."""
    import torch_xla._internal.plugins as plugins
    path, _ = plugins.plugin_for(None)
    name = b"xla_cpu_disable_new_fusion_emitters"
    with open(path, "rb") as f:
        if name + b"\0" not in f.read():
            pytest.skip("this plugin's file does not hold that name")
    code = """
import torch, torch_xla
try:
    torch.ones(1, device=torch_xla.device())
except ValueError as e:
    print("ValueError", e)
"""
    env = {"XLA_FLAGS": "--xla_cpu_disable_new_fusion_emitters=true", "XDG_CACHE_HOME": str(tmp_path)}
    r = _run(code, env)
    assert r.returncode == 0 and "ValueError" in r.stdout and "Unknown flag" in r.stdout, r.stdout + r.stderr[-500:]
    # A real flag is probed once, then served from the cache.
    env = {"XLA_FLAGS": "--xla_cpu_use_thunk_runtime=true", "XDG_CACHE_HOME": str(tmp_path)}
    r = _run("import torch, torch_xla; print(torch.ones(2, device=torch_xla.device()).sum().item())", env)
    assert r.returncode == 0 and "2.0" in r.stdout, r.stderr[-500:]
    assert "--xla_cpu_use_thunk_runtime=true" in (tmp_path / "torch_xla" / "xla_flags.json").read_text()
    # A value XLA cannot parse (XLA prints its usage and exits).
    env = {"XLA_FLAGS": "--xla_cpu_use_thunk_runtime=maybe", "XDG_CACHE_HOME": str(tmp_path)}
    r = _run(code, env)
    assert r.returncode == 0 and "ValueError" in r.stdout and "interpret value maybe" in r.stdout, r.stdout + r.stderr[-500:]


def test_known_xla_flag_accepted():
    r = _run("import torch, torch_xla; print(torch.ones(2, device=torch_xla.device()).sum().item())",
             {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"})
    assert r.returncode == 0 and "2.0" in r.stdout, r.stderr[-500:]


def test_shift_operators():
    import torch_xla.debug.metrics as met

    a = torch.tensor([1, -8, 3, 255], dtype=torch.int32)
    b = torch.tensor([1, 2, 0, 3], dtype=torch.int32)
    for f in (lambda x, y: x << y, lambda x, y: x >> y, lambda x, y: x << 3, lambda x, y: x >> 1):
        torch.testing.assert_close(f(a.to(DEV), b.to(DEV)).cpu(), f(a, b))
    assert met.counter_value("xla::__lshift__") and met.counter_value("xla::__rshift__")


def test_new_lowerings_match_eager():
    import torch_xla.debug.metrics as met

    torch.manual_seed(0)
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    cases = [
        lambda d: torch.logsumexp(x.to(d), 1),
        lambda d: torch.logsumexp(torch.tensor([[-INF, -INF], [INF, 1.0]], device=d), 1),
        lambda d: F.mse_loss(x.to(d), y.to(d)),
        lambda d: F.softplus(x.to(d) * 10, beta=2, threshold=5),
        lambda d: torch.baddbmm(torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(1)).to(d),
                                torch.ones(2, 3, 5, device=d), torch.ones(2, 5, 4, device=d), beta=0.5, alpha=2),
        lambda d: torch.addmv(torch.ones(4, device=d), x.to(d), torch.ones(5, device=d)),
        lambda d: torch.zeros(3, 5, device=d).index_add(0, torch.tensor([0, 2, 0], device=d), torch.ones(3, 5, device=d), alpha=2),
        lambda d: F.interpolate(x.view(1, 4, 5).to(d), size=7, mode="nearest"),
        lambda d: torch.ops.aten.gelu_backward(torch.ones(3, dtype=torch.bfloat16, device=d), torch.randn(3, generator=torch.Generator().manual_seed(2)).to(d)),
    ]
    met.clear_counters()  # executed_fallback_ops() reads the counters: count only what runs here
    for i, f in enumerate(cases):
        ref, got = f("cpu"), f(DEV).cpu()
        assert ref.dtype == got.dtype, (i, ref.dtype, got.dtype)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5, equal_nan=True, msg=lambda m: f"case {i}: {m}")
    assert not [n for n in met.executed_fallback_ops() if any(k in n for k in ("logsumexp", "mse", "softplus", "baddbmm", "addmv", "index_add", "upsample", "gelu"))]


def test_arange_unsupported_range():
    with pytest.raises(RuntimeError, match="unsupported range"):
        torch.arange(-5, NAN)
    with pytest.raises(RuntimeError, match="unsupported range"):
        torch.arange(-5, NAN, device=DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_erf_and_gelu_special_values(dtype):
    """erf reaches exactly +-1 (XLA's f32 polynomial stops at 0.99999982), so gelu's tails are
    eager's: gelu(-20) = -0, gelu(-inf) = nan, gelu(+inf) = nan for f32/bf16 (inf for f64/f16)."""
    xs = torch.tensor([-INF, INF, -20.0, -14.14, 14.14, 0.0, 3.0, NAN, 3.9192, -4.0], dtype=dtype)
    for f in (torch.erf, F.gelu, lambda t: F.gelu(t, approximate="tanh")):
        ref, got = f(xs), f(xs.to(DEV)).cpu()
        assert torch.equal(ref.isnan(), got.isnan()), (f, ref, got)
        num = ~ref.isnan()
        assert torch.equal(ref.isinf(), got.isinf()) and torch.equal(ref.signbit()[num], got.signbit()[num]), (f, ref, got)
        torch.testing.assert_close(got, ref, equal_nan=True)
    big = torch.tensor([4.0, -5.0, 9.0, -14.14], dtype=dtype)
    assert torch.equal(torch.erf(big.to(DEV)).cpu(), torch.erf(big))  # exactly +-1


_I32 = torch.int32
_MIXED_MATMULS = {
    "bmm empty batch2": lambda d: torch.bmm(torch.ones(3, 4, 4, dtype=_I32, device=d), torch.ones(3, 4, 0, device=d)),
    "bmm empty batch1": lambda d: torch.bmm(torch.ones(3, 0, 4, device=d), torch.ones(3, 4, 5, dtype=_I32, device=d)),
    "bmm k=0": lambda d: torch.bmm(torch.ones(3, 4, 0, dtype=_I32, device=d), torch.ones(3, 0, 5, device=d)),
    "bmm nonempty": lambda d: torch.bmm(torch.ones(3, 4, 4, dtype=_I32, device=d), torch.ones(3, 4, 5, device=d)),
    "mm empty": lambda d: torch.mm(torch.ones(4, 4, dtype=_I32, device=d), torch.ones(4, 0, device=d)),
    "matmul 2d@3d empty": lambda d: torch.matmul(torch.ones(4, 4, dtype=_I32, device=d), torch.ones(2, 4, 0, device=d)),
    "matmul 3d@2d empty": lambda d: torch.matmul(torch.ones(2, 4, 4, dtype=_I32, device=d), torch.ones(4, 0, device=d)),
    "matmul 4d@3d empty": lambda d: torch.matmul(torch.ones(3, 2, 4, 4, dtype=_I32, device=d), torch.ones(2, 4, 0, device=d)),
}


@pytest.mark.parametrize("name", sorted(_MIXED_MATMULS))
def test_mixed_dtype_matmul_like_eager(name):
    """Eager's mm always refuses mixed dtypes; its bmm returns zeros in batch2's dtype when an
    operand is empty (no dtype check), else refuses (seed 1913)."""
    f = _MIXED_MATMULS[name]
    try:
        ref = f("cpu")
    except RuntimeError:
        with pytest.raises(RuntimeError):
            f(DEV).cpu()
        return
    got = f(DEV).cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape and torch.equal(got, ref)


_EXIT_AFTER_BACKWARD = """
import torch, torch_xla
x = torch.randn(5, 4, 3).to(torch_xla.device()).requires_grad_()
torch.erf(x).sum().backward()
print("ok", tuple(x.grad.shape))
"""


def test_exit_right_after_backward_is_clean():
    """A script that ends right after an XLA backward exits with 0: torch's autograd device thread
    may still hold the finished pass (and a Python object in it) while the interpreter finalizes,
    which aborted the process in about one run of four (exit code 134) before torch_xla drained
    the device threads at exit (torch_xla/_internal/autograd_exit.py)."""
    for _ in range(6):
        r = subprocess.run([sys.executable, "-c", _EXIT_AFTER_BACKWARD], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "ok (5, 4, 3)" in r.stdout, (r.returncode, r.stderr[-2000:])


def test_fallback_results_keep_eager_strides():
    """An op that runs on the CPU fallback (fmax) gives its results eager's layout for the real
    inputs, so reshape/flatten copy where eager copies (seed 1998: index_fill_ through
    t.flatten(1) wrote into t)."""
    def prog(d):
        x = torch.arange(60.0).reshape(5, 4, 3).to(d).transpose(0, 1)
        t = torch.fmax(x, torch.tensor(True).to(d))
        v = t.flatten(1)
        v.index_fill_(0, torch.tensor([2, 0]).to(d), 7)
        return t.stride(), t.cpu(), v.cpu()
    (rs, rt, rv), (gs, gt, gv) = prog("cpu"), prog(DEV)
    assert rs == gs
    assert torch.equal(rt, gt) and torch.equal(rv, gv)


_FUZZ_4000 = {
    # seeds 4225/4306: any bool operand of a subtraction raises (not only two bool tensors)
    "bool - 1": lambda d: torch.tensor([True, False], device=d) - 1,
    "1 - bool": lambda d: 1 - torch.tensor([True, False], device=d),
    "f - bool": lambda d: torch.ones(2, device=d) - torch.tensor([True, False], device=d),
    "f.sub_(True)": lambda d: torch.ones(2, device=d).sub_(True),
    "bool - bool": lambda d: torch.tensor([True], device=d) - torch.tensor([False], device=d),
    # seed 4202: addmv on bool
    "addmv bool": lambda d: torch.addmv(torch.ones(2, dtype=torch.bool, device=d), torch.ones(2, 3, dtype=torch.bool, device=d),
                                        torch.ones(3, dtype=torch.bool, device=d)),
    # seed 4372: f16 floor division rounds a Python scalar to f16 first (70000. -> inf -> nan)
    "70000 // f16": lambda d: torch.div(70000.0, torch.tensor([0.2191, 2.043, -4.77, -0.0, 1e-3], dtype=torch.float16, device=d),
                                        rounding_mode="floor"),
    "f16 // 3": lambda d: torch.div(torch.tensor([7.0, -7.5, 65504.0], dtype=torch.float16, device=d), 3, rounding_mode="floor"),
    # seed 4063: f16/bf16 norms accumulate in float32 and round once
    "f16 norm": lambda d: torch.tensor([[1.7588, -2.8242]], dtype=torch.float16, device=d).norm(2, 1, keepdim=True),
    "bf16 normalize": lambda d: F.normalize(torch.tensor([[1.7588, -2.8242, 0.3]], dtype=torch.bfloat16, device=d), dim=1),
    "f16 norm 3": lambda d: torch.linalg.vector_norm(torch.tensor([1.5, -2.25, 3.0], dtype=torch.float16, device=d), 3),
}


@pytest.mark.parametrize("name", sorted(_FUZZ_4000))
def test_fuzz_4000_cases_match_eager(name):
    f = _FUZZ_4000[name]
    try:
        ref = f("cpu")
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)):
            f(DEV).cpu()
        return
    got = f(DEV).cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert torch.equal(got.isnan(), ref.isnan()) and torch.equal(got[~got.isnan()], ref[~ref.isnan()]), (got, ref)


def test_a_failed_compile_costs_only_the_tensors_that_fail_alone():
    """Fault injection: the graph of a sync fails to compile; every tensor whose own graph compiles
    still gets its value, the failing one keeps the error as its reason, and later work goes on."""
    from torch_xla import _C
    x = torch.arange(6.0, device=DEV)
    torch_xla.sync()
    a = x.sin() + 1  # fine alone
    b = x.cos() * 2  # its graph has the cosine that "fails to compile"
    c = x * 3        # fine alone
    _C._inject_compile_failure('"stablehlo.cosine"')
    try:
        with pytest.raises(RuntimeError, match="injected compile failure"):
            torch_xla.sync()
    finally:
        _C._inject_compile_failure("")
    ref = torch.arange(6.0)
    torch.testing.assert_close(a.cpu(), ref.sin() + 1)
    torch.testing.assert_close(c.cpu(), ref * 3)
    with pytest.raises(RuntimeError, match="injected compile failure"):
        b.cpu()
    torch.testing.assert_close((x + 1).cpu(), ref + 1)  # the runtime carries on


def test_eager_error_order_layer_norm_of_empty_int_and_bitwise_shape_first():
    """Fuzz seeds 7283 and 7015: layer_norm of an (empty) integer tensor raises eager's
    NotImplementedError; bitwise_and of mismatched float tensors raises the shape error first."""
    x = torch.arange(9).view(3, 3)
    for v in (x, x[0:-3:1, :3:2]):
        with pytest.raises(NotImplementedError, match="LayerNormKernelImpl"):
            F.layer_norm(v, (v.shape[-1],))
        with pytest.raises(NotImplementedError, match="LayerNormKernelImpl"):
            F.layer_norm(v.to(DEV), (v.shape[-1],)).cpu()
    a, b = torch.rand(1, 2, 3, 5), torch.rand(2, 1)
    with pytest.raises(RuntimeError, match="must match the size of tensor b"):
        torch.bitwise_and(a, b)
    with pytest.raises(RuntimeError, match="must match the size of tensor b"):
        torch.bitwise_and(a.to(DEV), b.to(DEV)).cpu()


_OVERLAP = {  # fuzz seed 5165: eager's "some elements of the input tensor and the written-to tensor ..."
    "unfold mul_": lambda x: x[:2].unfold(0, 2, 1).mul_(x[:2]),
    "partial add_": lambda x: x[:3].add_(x[1:4]),
    "partial copy_": lambda x: x[1:].copy_(x[:5]),
    "partial through detach": lambda x: x[:3].mul_(x.detach()[1:4]),
    "partial through view": lambda x: x.view(2, 3)[0].add_(x[1:4]),
    "full index_add_": lambda x: x.index_add_(0, torch.arange(6, device=x.device), x),
    "partial scatter_": lambda x: x[:3].scatter_(0, torch.arange(3, device=x.device), x[1:4]),
    "self operand": lambda x: x.mul_(x),
    "same range, same strides": lambda x: x[:3].add_(x[0:3]),
    "disjoint": lambda x: x[:3].add_(x[3:]),
    "masked_fill_ (eager accepts)": lambda x: x[:3].masked_fill_(x[:3] > 1, x[1]),
    "0-dim operand elsewhere": lambda x: x[1:4].add_(x[0]),
}


@pytest.mark.parametrize("name", sorted(_OVERLAP))
def test_inplace_overlap_with_an_operand_as_eager(name):
    f = _OVERLAP[name]
    ref = torch.arange(1.0, 7.0)
    try:
        f(ref)
    except RuntimeError as e:
        assert "refer to a single memory location" in str(e)
        x = torch.arange(1.0, 7.0, device=DEV)
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            f(x)  # at the op, as eager
        torch.testing.assert_close(x.cpu(), torch.arange(1.0, 7.0))  # nothing was written
        return
    x = torch.arange(1.0, 7.0, device=DEV)
    f(x)
    torch.testing.assert_close(x.cpu(), ref)


def test_inplace_overlap_check_leaves_cpu_tensors_and_versions_alone():
    # The check replaces the ADInplaceOrView kernels of these ops: autograd's version counter must
    # still move, for CPU and XLA tensors alike.
    for d in ("cpu", DEV):
        x = torch.ones(3, device=d)
        v = x._version
        x.add_(torch.ones(3, device=d))
        x.index_put_((torch.tensor([0], device=d),), torch.tensor([5.0], device=d))
        assert x._version == v + 2
        w = torch.ones(3, device=d, requires_grad=True)
        y = w * 1
        y.mul_(torch.full((3,), 2.0, device=d))
        y.sum().backward()
        torch.testing.assert_close(w.grad.cpu(), torch.full((3,), 2.0))


@pytest.mark.parametrize("shape,dim,idx", [((4, 0), 0, [4]), ((4, 0), 0, [3]), ((4, 0), 0, [-1]), ((4, 0), 1, [0]),
                                           ((0, 3), 1, [3]), ((0, 3), 0, [0]), ((0,), 0, [0]), ((2, 0, 3), 0, [2]),
                                           ((2, 0, 3), 2, [3]), ((2, 0, 3), 1, [0]), ((3, 2), 0, [])])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_index_select_of_a_zero_element_source(shape, dim, idx, dtype):
    """Fuzz seed 5012: eager checks the indices even when nothing is gathered, at the op; a size-0
    1-D source failed to compile here."""
    def f(d):
        return torch.zeros(shape, dtype=dtype, device=d).index_select(dim, torch.tensor(idx, dtype=torch.long, device=d))
    try:
        ref = f("cpu")
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)):
            f(DEV)  # raises at the op: reading an empty result runs nothing
        return
    got = f(DEV).cpu()
    assert got.shape == ref.shape and got.dtype == ref.dtype
    torch_xla.sync()


def test_pow_zero_exponent_of_bool_and_kthvalue_of_bool():
    """Fuzz seeds 7806 (bool ** False failed to compile: eager fills ones) and 7950 (kthvalue of a
    bool tensor: eager's NotImplementedError)."""
    for e in (False, True, 0, 0.0):
        for x in (torch.tensor([True, False]), torch.tensor([NAN, -INF, 2.0])):
            ref = x ** e
            got = (x.to(DEV) ** e).cpu()
            assert got.dtype == ref.dtype
            torch.testing.assert_close(got, ref, equal_nan=True)
    with pytest.raises(NotImplementedError, match="kthvalue_cpu"):
        torch.tensor([True, False], device=DEV).kthvalue(1)


_OUT_CASES = {  # README "Known gaps" said these cast; eager checks the out= tensor's dtype
    "add float into long": lambda d: torch.add(torch.tensor([1.5], device=d), torch.tensor([1.0], device=d),
                                               out=torch.zeros(1, dtype=torch.long, device=d)),
    "mul by float scalar into int": lambda d: torch.mul(torch.tensor([1.5], device=d), 2,
                                                        out=torch.zeros(1, dtype=torch.int32, device=d)),
    "sin into long": lambda d: torch.sin(torch.tensor([1.5], device=d), out=torch.zeros(1, dtype=torch.long, device=d)),
    "add long into bool": lambda d: torch.add(torch.tensor([1], device=d), torch.tensor([1], device=d),
                                              out=torch.zeros(1, dtype=torch.bool, device=d)),
    "mm into long": lambda d: torch.mm(torch.ones(1, 1, device=d), torch.ones(1, 1, device=d),
                                       out=torch.zeros(1, 1, dtype=torch.long, device=d)),
    "cat into long": lambda d: torch.cat([torch.tensor([1.5], device=d)], out=torch.zeros(1, dtype=torch.long, device=d)),
    "where into long": lambda d: torch.where(torch.tensor([True], device=d), torch.tensor([1.5], device=d),
                                             torch.tensor([1.0], device=d), out=torch.zeros(1, dtype=torch.long, device=d)),
    "clamp into long": lambda d: torch.clamp(torch.tensor([1.5], device=d), 0, 1,
                                             out=torch.zeros(1, dtype=torch.long, device=d)),
    # accepted by eager: results into a wider or equal type
    "add long into float": lambda d: torch.add(torch.tensor([1], device=d), torch.tensor([2], device=d),
                                               out=torch.zeros(1, dtype=torch.float32, device=d)),
    "add float into f16": lambda d: torch.add(torch.tensor([1.5], device=d), torch.tensor([1.0], device=d),
                                              out=torch.zeros(1, dtype=torch.float16, device=d)),
    "eq into float": lambda d: torch.eq(torch.tensor([1.0, 2.0], device=d), 1.0, out=torch.zeros(2, device=d)),
    "sum float into long": lambda d: torch.sum(torch.tensor([1.5, 2.0], device=d), 0,
                                               out=torch.zeros((), dtype=torch.long, device=d)),
    "add int + python float into float": lambda d: torch.add(torch.tensor([1], device=d), 2.5,
                                                             out=torch.zeros(1, device=d)),
    "mul int by 0-dim cpu into float": lambda d: torch.mul(torch.tensor([3], device=d), torch.tensor(0.5),
                                                           out=torch.zeros(1, device=d)),
    "index_select long index": lambda d: torch.index_select(torch.tensor([1.5, 2.5], device=d), 0,
                                                            torch.tensor([1], device=d), out=torch.zeros(1, device=d)),
    "resized empty out": lambda d: torch.add(torch.tensor([1, 2], device=d), 1.5, out=torch.empty(0, device=d)),
    # eager demands out's dtype equal the one it computes (torch's Python meta kernels accepted a
    # safe cast): eager's own CPU kernel decides, on tiny stand-ins
    "neg into f64": lambda d: torch.neg(torch.tensor([1.5], device=d), out=torch.zeros(1, dtype=torch.float64, device=d)),
    "neg into f16": lambda d: torch.neg(torch.tensor([1.5], device=d), out=torch.zeros(1, dtype=torch.float16, device=d)),
    "neg into long": lambda d: torch.neg(torch.tensor([1.5], device=d), out=torch.zeros(1, dtype=torch.long, device=d)),
    "tril into f64": lambda d: torch.tril(torch.ones(2, 2, device=d), out=torch.zeros(2, 2, dtype=torch.float64, device=d)),
    "index_select into f64": lambda d: torch.index_select(torch.tensor([1.5, 2.5], device=d), 0,
                                                          torch.tensor([1], device=d),
                                                          out=torch.zeros(1, dtype=torch.float64, device=d)),
    "softmax into f64": lambda d: torch._softmax(torch.ones(3, device=d), 0, False,
                                                 out=torch.zeros(3, dtype=torch.float64, device=d)),
    "amax into f64": lambda d: torch.amax(torch.ones(2, 3, device=d), 0, out=torch.zeros(3, dtype=torch.float64, device=d)),
    "max.dim values into f64": lambda d: torch.max(torch.ones(2, 3, device=d), 0, out=(
        torch.zeros(3, dtype=torch.float64, device=d), torch.zeros(3, dtype=torch.long, device=d)))[0],
    "argmax into int32": lambda d: torch.argmax(torch.ones(2, 3, device=d), 0,
                                                out=torch.zeros(3, dtype=torch.int32, device=d)),
    "abs long into f64": lambda d: torch.abs(torch.tensor([-2], device=d), out=torch.zeros(1, dtype=torch.float64, device=d)),
    "slice_scatter into f64": lambda d: torch.slice_scatter(torch.ones(20, 20, 20, device=d), torch.ones(10, 20, 20, device=d),
                                                            0, 10, 20, out=torch.zeros(20, 20, 20, dtype=torch.float64, device=d)),
    "masked_select into f64": lambda d: torch.masked_select(torch.ones(3, device=d), torch.tensor([True, False, True], device=d),
                                                            out=torch.zeros(2, dtype=torch.float64, device=d)),
    "softmax.int into long": lambda d: torch.softmax(torch.ones(3, device=d), 0, out=torch.zeros(3, dtype=torch.long, device=d)),
    "add int8 + 300 into int8": lambda d: torch.add(torch.ones(2, dtype=torch.int8, device=d), 300,
                                                    out=torch.zeros(2, dtype=torch.int16, device=d)),
    "add int8 + 3 into int16": lambda d: torch.add(torch.ones(2, dtype=torch.int8, device=d), 3,
                                                   out=torch.zeros(2, dtype=torch.int16, device=d)),
    # accepted by eager: type-promoting ops cast into out
    "sin into f64": lambda d: torch.sin(torch.tensor([1.5], device=d), out=torch.zeros(1, dtype=torch.float64, device=d)),
    "sin long into f64": lambda d: torch.sin(torch.tensor([2], device=d), out=torch.zeros(1, dtype=torch.float64, device=d)),
    "add into f64": lambda d: torch.add(torch.tensor([1.5], device=d), 1, out=torch.zeros(1, dtype=torch.float64, device=d)),
    "cat into f64": lambda d: torch.cat([torch.tensor([1.5], device=d)], out=torch.zeros(1, dtype=torch.float64, device=d)),
    "sum into f64": lambda d: torch.sum(torch.tensor([1.5, 2.0], device=d), 0,
                                        out=torch.zeros((), dtype=torch.float64, device=d)),
    "normal into f64": lambda d: torch.normal(torch.zeros(3, device=d), 0.0,
                                              out=torch.zeros(3, dtype=torch.float64, device=d)),
}


@pytest.mark.parametrize("name", sorted(_OUT_CASES))
def test_out_dtype_checked_as_eager(name):
    """`torch.add(x, y, out=o)` with an `o` that cannot hold the result raised in eager and cast here
    (functionalization never ran the out= op's meta checks)."""
    f = _OUT_CASES[name]
    try:
        ref = f("cpu")
    except Exception as e:
        with pytest.raises(type(e)) as got:
            f(DEV).cpu()
        assert str(e).split("\n")[0] in str(got.value)  # eager's message
        with pytest.raises(type(e)):  # again: the verdict is cached per signature
            f(DEV).cpu()
        return
    got = f(DEV).cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape
    torch.testing.assert_close(got, ref)


def test_fuzz_9400_range_findings():
    """Seeds 9810, 10183, 9913, 10053 of the 9400-10399 run."""
    # gelu(+inf) of a one-element f32/bf16 tensor: eager's scalar path gives inf (its vectorized
    # path, for more elements, NaN)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for shape in ((), (1,), (1, 1), (3,), (9,)):
            x = torch.full(shape, INF, dtype=dt)
            torch.testing.assert_close(F.gelu(x.to(DEV)).cpu(), F.gelu(x), equal_nan=True)
    # backward of a 0-dim softmax/log_softmax: NaN for an infinite or NaN input, as eager
    for f in (F.softmax, F.log_softmax):
        for v in (INF, -INF, NAN, 2.0):
            grads = []
            for d in ("cpu", DEV):
                x = torch.tensor(v, device=d, requires_grad=True)
                f(x, -1).sum().backward()
                grads.append(x.grad.cpu())
            torch.testing.assert_close(grads[1], grads[0], equal_nan=True)
    # kthvalue of a 0-dim bool tensor returns it (eager's dtype check runs only for dim > 0)
    for d in ("cpu", DEV):
        v, i = torch.tensor(True, device=d).kthvalue(1, 0)
        assert v.item() is True and i.item() == 0
        with pytest.raises(NotImplementedError, match="kthvalue_cpu"):
            torch.tensor([True], device=d).kthvalue(1, 0)[0].cpu()
    # mv of a float matrix and a bf16 vector: eager's addmv dtype error
    for d in ("cpu", DEV):
        with pytest.raises(RuntimeError, match="addmv input tensors must have the same dtype, but got BFloat16, Float, "
                                               "and BFloat16"):
            torch.mv(torch.ones(2, 2, device=d), torch.ones(2, dtype=torch.bfloat16, device=d)).cpu()


@pytest.mark.parametrize("case", ["mm bool shape", "bmm bool shape", "matmul bool 1d shape", "dot 2d", "dot mixed",
                                  "dot sizes", "dot bool"])
def test_products_check_shapes_before_bool_as_eager(case):
    """Fuzz seeds 10454 and 10798: eager's shape (and dot's rank and dtype) errors come before its
    bool NotImplementedError; dot of a 2-D tensor and dot of mixed dtypes were accepted here."""
    b = dict(dtype=torch.bool)
    f = {
        "mm bool shape": lambda d: torch.ones(3, 1, device=d, **b) @ torch.ones(2, 2, device=d, **b),
        "bmm bool shape": lambda d: torch.bmm(torch.ones(1, 3, 1, device=d, **b), torch.ones(1, 2, 2, device=d, **b)),
        "matmul bool 1d shape": lambda d: torch.matmul(torch.ones(3, device=d, **b), torch.ones(4, device=d, **b)),
        "dot 2d": lambda d: torch.dot(torch.ones(3, 1, device=d), torch.ones(3, device=d)),
        "dot mixed": lambda d: torch.dot(torch.ones(3, device=d), torch.ones(3, dtype=torch.float64, device=d)),
        "dot sizes": lambda d: torch.dot(torch.ones(3, device=d), torch.ones(4, device=d)),
        "dot bool": lambda d: torch.dot(torch.ones(3, device=d, **b), torch.ones(3, device=d, **b)),
    }[case]
    with pytest.raises(Exception) as e:
        f("cpu")
    with pytest.raises(type(e.value)) as got:
        f(DEV).cpu()
    if case not in ("mm bool shape", "bmm bool shape"):  # those name the shapes in another format
        assert str(e.value).split("\n")[0] in str(got.value)


@pytest.mark.parametrize("shape,k", [((1, 1, 2, 2), 3), ((3, 2, 5), 3), ((2, 1, 2, 5), (3, 1))])
@pytest.mark.parametrize("pool", [F.max_pool2d, F.avg_pool2d])
def test_pool_output_too_small_message_as_eager(shape, k, pool):
    """Eager names every output size ("Calculated output size: (1x0x0)"), we said "(...)"."""
    with pytest.raises(RuntimeError) as e:
        pool(torch.zeros(shape), k)
    with pytest.raises(RuntimeError) as got:
        pool(torch.zeros(shape, device=DEV), k).cpu()
    assert str(e.value) in str(got.value)


def _raises_like_eager(f, exact=True):
    with pytest.raises(Exception) as ref:
        f("cpu")
    with pytest.raises(type(ref.value)) as got:
        r = f(DEV)
        r.cpu() if isinstance(r, torch.Tensor) else None
    if exact:
        assert str(ref.value).split("\n")[0] in str(got.value), (str(ref.value), str(got.value))
    return got.value


@pytest.mark.parametrize("case", ["gather", "gather negative", "gather first of two", "scatter", "scatter_add",
                                  "scatter_reduce", "index"])
def test_index_errors_name_the_bad_index_as_eager(case):
    """Out-of-range gather/scatter/index errors are in-graph checks: they now carry the first bad
    index (row-major), as eager's message does."""
    x = torch.arange(6.0).view(2, 3)
    f = {
        "gather": lambda d: torch.gather(x.to(d), 1, torch.tensor([[0, 5], [1, 2]], device=d)),
        "gather negative": lambda d: torch.gather(x.to(d), 0, torch.tensor([[0, -3], [1, 1]], device=d)),
        "gather first of two": lambda d: torch.gather(x.to(d), 1, torch.tensor([[0, 1], [7, 9]], device=d)),
        "scatter": lambda d: x.to(d).clone().scatter_(1, torch.tensor([[0, 7]], device=d), 1.0),
        "scatter_add": lambda d: x.to(d).clone().scatter_add_(0, torch.tensor([[0, 4]], device=d),
                                                              torch.ones(1, 2, device=d)),
        "scatter_reduce": lambda d: x.to(d).clone().scatter_reduce_(0, torch.tensor([[0, 4]], device=d),
                                                                    torch.ones(1, 2, device=d), "amax"),
        "index": lambda d: x.to(d)[torch.tensor([0, 5], device=d)],
    }[case]
    err = _raises_like_eager(f)
    assert "raised by the op at" in str(err)


def test_index_error_in_a_loop_body_names_the_index_as_eager():
    """A check carried through a loop carries the first failing iteration's bad index (the one eager's
    Python loop raises at): the message names it, as the top-level checks do."""
    from torch_xla.experimental.fori_loop import fori_loop
    x = torch.arange(3.0, device=DEV)

    def body(i, acc):
        return i + 1, acc + torch.gather(x, 0, (i + 4).reshape(1)).sum()

    with pytest.raises(RuntimeError, match="gather\\(\\): index 4 is out of bounds for dimension 0 with size 3"):
        _, _, acc = fori_loop(2, 0, body, torch.tensor(0, device=DEV), torch.tensor(0.0, device=DEV))
        acc.cpu()


def _loop_index_case(d, loop):
    """Iteration 0 reads index 1 (fine), iteration 1 index 5 (eager raises there), iteration 2 index 7."""
    x = torch.arange(3.0, device=d)

    def body(i, acc):
        idx = torch.where(i == 0, 1, 2 * i + 3)
        return i + 1, acc + torch.gather(x, 0, idx.reshape(1)).sum()

    i0, acc0 = torch.tensor(0, device=d), torch.tensor(0.0, device=d)
    if d == "cpu":
        i, acc = i0, acc0
        while i < 3:
            i, acc = body(i, acc)
        return acc
    if loop == "fori_loop":
        from torch_xla.experimental.fori_loop import fori_loop
        return fori_loop(3, 0, body, i0, acc0)[-1]
    from torch_xla.experimental.fori_loop import while_loop
    return while_loop(lambda i, acc: i < 3, body, (i0, acc0))[-1]


@pytest.mark.parametrize("loop", ["fori_loop", "while_loop"])
def test_loop_index_error_names_the_first_failing_iterations_index(loop):
    _raises_like_eager(lambda d: _loop_index_case(d, loop))


def test_loop_index_checks_that_hold_do_not_raise():
    from torch_xla.experimental.fori_loop import fori_loop
    x = torch.arange(3.0, device=DEV)

    def body(i, acc):
        return i + 1, acc + x[i.reshape(1)].sum() + torch.gather(x, 0, i.reshape(1)).sum()

    _, _, acc = fori_loop(3, 0, body, torch.tensor(0, device=DEV), torch.tensor(0.0, device=DEV))
    assert acc.cpu().item() == 6.0


@pytest.mark.parametrize("case", ["too large", "negative", "zero classes", "auto negative", "int32"])
def test_one_hot_errors_as_eager(case):
    f = {
        "too large": lambda d: F.one_hot(torch.tensor([0, 5], device=d), 3),
        "negative": lambda d: F.one_hot(torch.tensor([0, -1], device=d), 3),
        "zero classes": lambda d: F.one_hot(torch.tensor([1], device=d), 0),
        "auto negative": lambda d: F.one_hot(torch.tensor([0, -2], device=d)),
        "int32": lambda d: F.one_hot(torch.tensor([1], dtype=torch.int32, device=d), 3),
    }[case]
    _raises_like_eager(f)


def test_one_hot_values_as_eager():
    for idx, n in (([0, 2], 3), ([[1], [0]], -1), ([], 4), ([3, 3, 0], 5)):
        t = torch.tensor(idx, dtype=torch.long)
        ref = F.one_hot(t, n)
        got = F.one_hot(t.to(DEV), n).cpu()
        assert got.dtype == ref.dtype and got.shape == ref.shape
        assert torch.equal(got, ref)


@pytest.mark.parametrize("shape,kw", [((1, 1, 2, 5, 5), {}), ((1, 1, 5, 5, 2), {}), ((1, 2, 5, 5), {"padding": 1}),
                                      ((1, 1, 5, 2, 5), {"stride": 1})])
def test_avg_pool3d_input_smaller_than_kernel_as_eager(shape, kw):
    """eager's pool3d_shape_check: the input, padding aside, must hold the kernel."""
    _raises_like_eager(lambda d: F.avg_pool3d(torch.ones(shape, device=d), 3, **kw))


def test_set_storage_with_xla_source_raises_not_implemented():
    """x.set_(source, offset, size, stride) would alias source's storage, which XLA tensors do not
    have here: a clear NotImplementedError (it raised a storage-device error), and the suggested
    as_strided view gives eager's values, later writes to source included."""
    src = torch.arange(10.0)
    y = torch.empty(0)
    y.set_(src, 2, (2, 3), (3, 1))
    src.add_(1)
    xs = torch.arange(10.0, device=DEV)
    with pytest.raises(NotImplementedError, match="as_strided"):
        torch.empty(0, device=DEV).set_(xs, 2, (2, 3), (3, 1))
    v = xs.as_strided((2, 3), (3, 1), 2)
    xs.add_(1)
    assert torch.equal(v.cpu(), y)


@pytest.mark.parametrize("case", ["index_put", "index_put accumulate", "index", "index dim 1", "setitem",
                                  "empty index", "non-empty indexed dim"])
def test_index_into_a_dim_of_size_zero_as_eager(case):
    """Eager's AdvancedIndex raises `index is out of bounds for dimension with size 0` at the op when
    an indexed dim has size 0 and the index shape does not (fuzz seed 11856: no raise; `x[idx]` of a
    (0, 3) tensor failed to compile); an empty index, or an empty result elsewhere, is fine."""
    f = {
        "index_put": lambda d: torch.zeros(0, 1, 4, device=d).index_put((torch.tensor([1], device=d),),
                                                                       torch.ones(4, device=d)),
        "index_put accumulate": lambda d: torch.zeros(0, 1, 4, device=d).index_put(
            (torch.tensor([0], device=d),), torch.ones(4, device=d), accumulate=True),
        "index": lambda d: torch.zeros(0, 3, device=d)[torch.tensor([0], device=d)],
        "index dim 1": lambda d: torch.zeros(2, 0, device=d)[:, torch.tensor([0], device=d)],
        "setitem": lambda d: torch.zeros(0, 3, device=d).index_put_((torch.tensor([0], device=d),),
                                                                    torch.tensor(1.0, device=d)),
        "empty index": lambda d: torch.zeros(0, 1, 4, device=d).index_put(
            (torch.tensor([], dtype=torch.long, device=d),), torch.ones(4, device=d)),
        "non-empty indexed dim": lambda d: torch.zeros(3, 0, device=d).index_put((torch.tensor([5], device=d),),
                                                                                 torch.ones(0, device=d)),
    }[case]
    try:
        ref = f("cpu")
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)) as got:
            f(DEV).cpu()
        assert str(e) in str(got.value)
        return
    got = f(DEV).cpu()
    assert got.shape == ref.shape and got.dtype == ref.dtype


@pytest.mark.parametrize("shape", [(2,), (0,), ()])
def test_trunc_of_bool_raises_as_eager(shape):
    """fuzz seed 12143: `torch.trunc`/`torch.fix` of a bool tensor returned it; eager's kernel has no bool
    dtype (NotImplementedError), also for an empty tensor."""
    for f in (torch.trunc, torch.fix):
        _raises_like_eager(lambda d: f(torch.zeros(shape, dtype=torch.bool, device=d)))


def test_norms_of_empty_tensors_that_have_an_identity():
    """ord >= 0 norms of empty dimensions are 0 as in eager, and inf over a non-empty dimension of an
    empty tensor is an empty result (only the reduced dimensions must be non-empty)."""
    x = torch.zeros(0, 3)
    for fn in (lambda t: t.norm(p=2, dim=0), lambda t: torch.linalg.vector_norm(t, 0, 0),
               lambda t: torch.linalg.vector_norm(t, float("inf"), 1), lambda t: t.norm(p=1)):
        want, got = fn(x), fn(x.to(DEV)).cpu()
        assert got.shape == want.shape and torch.equal(got, want)


def test_dtype_conversion_keeps_a_dense_layout_so_reshape_copies_as_eager():
    """`.to(dtype)` of a transposed XLA tensor keeps its strides (memory_format=preserve), as eager: a
    reshape of it then copies, and writes into that copy leave the tensor alone (fuzz seed 15757)."""
    for conv in (lambda t: t.bfloat16().float(), lambda t: t.to(torch.float64), lambda t: t.double()):
        results = []
        for dev in ("cpu", DEV):
            x = torch.arange(6.0).reshape(3, 1, 2).to(dev).transpose(0, 2)
            y = conv(x)
            r = y.reshape(6)
            r.fill_(0.5)
            as_strided = y.as_strided((2, 2), (1, 2)).cpu()
            results.append((tuple(y.stride()), y.cpu(), r.cpu(), as_strided))
        (es, ey, er, ea), (xs, xy, xr, xa) = results
        assert xs == es
        assert torch.equal(xy, ey) and torch.equal(xr, er) and torch.equal(xa, ea)


def test_to_memory_format_strides_match_eager():
    x = torch.randn(2, 3, 4, 5)
    for mf in (torch.channels_last, torch.contiguous_format, torch.preserve_format):
        want = x.to(torch.float64, memory_format=mf)
        got = x.to(DEV).to(torch.float64, memory_format=mf)
        assert got.stride() == want.stride(), mf
        assert torch.equal(got.cpu(), want)
        cl = x.contiguous(memory_format=torch.channels_last)
        assert cl.to(DEV).to(torch.float64).stride() == cl.to(torch.float64).stride()


_C = torch.tensor([1 + 2j, -3 + 0.5j, 0.5 - 1j, 2 + 0j])
COMPLEX_REFUSED = {  # eager refuses these for complex inputs; XLA ordered complex numbers or crashed
    "maximum": lambda a: torch.maximum(a, a),
    "fmin": lambda a: torch.fmin(a, a.real),
    "clamp": lambda a: torch.clamp(a, 0, 1),
    "clamp_tensor": lambda a: torch.clamp(a.real, a, a),
    "remainder": lambda a: a % a,
    "fmod": lambda a: torch.fmod(a, 2),
    "hardtanh": lambda a: F.hardtanh(a),
    "relu": lambda a: torch.relu(a),
    "max": lambda a: a.max(),
    "amax": lambda a: a.amax(0),
    "argmax": lambda a: a.argmax(),
    "sort": lambda a: a.sort(),
    "topk": lambda a: a.topk(1),
    "lt": lambda a: a < a,
    "ge_scalar": lambda a: a >= 1,
    "floor": lambda a: a.floor(),
    "round": lambda a: a.round(),
    "sign": lambda a: a.sign(),
    "softmax": lambda a: a.softmax(0),
    "atan2": lambda a: torch.atan2(a, a),
    "erf": lambda a: torch.erf(a),
    "max_pool2d": lambda a: F.max_pool2d(a.reshape(1, 1, 2, 2), 2),
    "group_norm": lambda a: F.group_norm(a.reshape(1, 2, 2), 2),
}
COMPLEX_VALUES = {  # eager supports these for complex inputs; some lowerings gave wrong values
    "cosh": lambda a: torch.cosh(a),
    "asinh": lambda a: torch.asinh(a),
    "acosh": lambda a: torch.acosh(a),
    "isinf": lambda a: torch.isinf(a / 0),
    "lerp": lambda a: torch.lerp(a, a * 2, 0.3),
    "addmm": lambda a: torch.addmm(a.reshape(2, 2), a.reshape(2, 2), a.reshape(2, 2).t()),
    "logsumexp": lambda a: torch.logsumexp(a, 0),
    "var": lambda a: a.var(),
    "norm": lambda a: torch.linalg.vector_norm(a),
    "add_mul": lambda a: (a + 1j) * a.conj() - a / 2,
    "sum_mean": lambda a: a.sum() + a.mean(),
    "matmul": lambda a: a.reshape(2, 2) @ a.reshape(2, 2),
    "exp_log_sqrt": lambda a: a.exp() + a.log() + a.sqrt(),
    "index_cat": lambda a: torch.cat([a[[2, 0]], a.flip(0)]),
}


@pytest.mark.parametrize("name", sorted(COMPLEX_REFUSED))
def test_complex_inputs_eager_refuses_raise_as_eager(name):
    """Ops whose eager kernels have no complex version raise eager's exception (type and message);
    before, XLA ordered complex numbers by their real part or crashed compiling (survey_complex.py)."""
    fn = COMPLEX_REFUSED[name]
    with pytest.raises(Exception) as want:
        fn(_C.clone())
    with pytest.raises(type(want.value)) as got:
        fn(_C.to(DEV)).cpu()
    assert str(want.value).split("\n")[0] in str(got.value)


@pytest.mark.parametrize("name", sorted(COMPLEX_VALUES))
def test_complex_values_match_eager(name):
    fn = COMPLEX_VALUES[name]
    want = fn(_C.clone())
    got = fn(_C.to(DEV)).cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int64])
def test_pointwise_results_keep_eager_layout(dtype):
    """Results of pointwise ops take TensorIterator's layout as in eager, also where the meta kernel
    returns contiguous results (floor division of a transposed tensor, fuzz seed 18455): .view()
    accepts and refuses what eager does."""
    ops = {
        "div_floor": lambda t: torch.div(t, 0.5, rounding_mode="floor"),
        "floor_divide": lambda t: t // 2 if t.dtype != torch.bool else t.int() // 2,
        "copysign": lambda t: torch.copysign(t, t.float()),
        "where": lambda t: torch.where(t.contiguous() > 0, t, 1),
        "contiguous": lambda t: t.contiguous(),
        "clone_preserve": lambda t: t.clone(),
        "add": lambda t: t + t.contiguous(),
        "masked_fill": lambda t: t.masked_fill(t.contiguous() > 0, 1),  # eager: contiguous
        "add_expanded": lambda t: t.contiguous() + t[:1].expand(3, 2),
        "where_broadcast": lambda t: torch.where(t[:, :1] > 0, t[:1], t.contiguous()),
    }
    for name, fn in ops.items():
        res = []
        for dev in ("cpu", DEV):
            x = torch.arange(6).reshape(2, 3).to(dtype).to(dev).transpose(0, 1)
            r = fn(x)
            try:
                r.view(6)
                viewable = True
            except RuntimeError:
                viewable = False
            res.append((r.stride(), viewable, r.cpu()))
        (es, ev, er), (xs, xv, xr) = res
        assert xs == es and xv == ev, name
        assert torch.equal(xr, er), name


ALGSIMP = {  # compositions XLA's algebraic simplifier rewrote by real-number identities
    "log_pow": lambda x, y: torch.log(x ** 2.5),
    "log_pow_tensor": lambda x, y: torch.log(x ** y),
    "log_exp": lambda x, y: torch.log(torch.exp(x)),
    "exp_div_exp": lambda x, y: torch.exp(x) / torch.exp(y),
    "log_sqrt": lambda x, y: torch.log(torch.sqrt(x)),
    "sqrt_square_overflow": lambda x, y: torch.sqrt((x * 1e18) * (x * 1e18)),
    "pow_exp": lambda x, y: torch.exp(x) ** y,
    "div_div": lambda x, y: x * 1e20 / (y * 1e20) / (y * 1e20),
    "div_by_div": lambda x, y: x * 1e20 / ((y * 1e20) / (x * 1e20)),
    "div_div_scalar": lambda x, y: x * 1e30 / (y * 1e30) / 1e30,
    "div_div_inf": lambda x, y: x / 1e-40 / (y * float("inf")),
}


@pytest.mark.parametrize("name", sorted(ALGSIMP))
def test_compositions_are_not_rewritten_by_real_identities(name):
    """ln(pow(A,B)) became B*ln|A| (finite where eager gives nan for a negative A), ln(exp(A)) became
    A (eager: inf once exp overflows), sqrt(A*A) became |A| (eager: inf once A*A overflows), exp(A)/
    exp(B) became exp(A-B) (eager: inf/inf = nan), (A/B)/C became A/(B*C) and A/(B/C) became
    (A*C)/B (eager: no overflow of B*C, A*C; 1e30/1e30/1e30 gave 0). Fuzz seeds 21292, 42363."""
    x = torch.tensor([-4.0, -2.0, 0.0, 2.0, 100.0, 200.0, -200.0, float("inf"), float("nan"), 1e20, 3.0])
    y = torch.tensor([1.0, 2.0, 3.0, -10.0, 100.0, -100.0, 50.0, 1.0, 2.0, 3.0, 0.5])
    fn = ALGSIMP[name]
    want = fn(x, y)
    got = fn(x.to(DEV), y.to(DEV)).cpu()
    torch.testing.assert_close(got, want, equal_nan=True)


SIGNED_ZERO = {  # eager's choice at ties decides the sign of a zero result
    "maximum": lambda a, b: torch.maximum(a, b),
    "minimum": lambda a, b: torch.minimum(a, b),
    "fmax": lambda a, b: torch.fmax(a, b),
    "fmin": lambda a, b: torch.fmin(a, b),
    "clamp_min_tensor": lambda a, b: torch.clamp_min(a, b),
    "clamp_tensor": lambda a, b: torch.clamp(a, b, b + 1),
    "relu": lambda a, b: torch.relu(a),
    "relu6": lambda a, b: F.relu6(a),
    "hardtanh": lambda a, b: F.hardtanh(a, -0.0, 0.0),
    "clamp_scalar": lambda a, b: torch.clamp(a, -0.0, 0.0),
    "clamp_min_scalar": lambda a, b: torch.clamp_min(a, 0.0),
    "clamp_max_scalar": lambda a, b: torch.clamp_max(a, -0.0),
    "asinh": lambda a, b: torch.asinh(a),
}


@pytest.mark.parametrize("name", sorted(SIGNED_ZERO))
def test_signed_zeros_and_nans_as_eager(name):
    """maximum/minimum give their second operand at ties and the scalar clamps (relu, hardtanh) keep
    x, as eager's kernels: maximum(-0.0, 0.0) is +0.0 and relu(-0.0) is -0.0 (stablehlo.maximum gave
    the other zero); fmax keeps its first operand; asinh(-0.0) as eager."""
    vals = torch.tensor([-0.0, 0.0, 1.0, -1.0, 6.0, -6.0, math.inf, -math.inf, math.nan])
    a, b = vals.repeat_interleave(len(vals)), vals.repeat(len(vals))
    want = SIGNED_ZERO[name](a, b)
    got = SIGNED_ZERO[name](a.to(DEV), b.to(DEV)).cpu()
    torch.testing.assert_close(got, want, equal_nan=True)
    assert torch.equal(torch.signbit(got) & ~got.isnan(), torch.signbit(want) & ~want.isnan())


COPY_OF_VIEW = {
    "expand_copy": lambda x: torch.expand_copy(x[:1], (3, 4)),
    "permute_copy": lambda x: torch.permute_copy(x, (1, 0)),
    "diagonal_copy": lambda x: torch.diagonal_copy(x),
    "unsqueeze_copy": lambda x: torch.unsqueeze_copy(x.t(), 1),
    "narrow_copy": lambda x: torch.narrow_copy(x, 1, 1, 2),
    "split_copy": lambda x: torch.split_copy(x.t(), 2)[1],
    "unbind_copy": lambda x: torch.unbind_copy(x.t())[1],
    "permute_view": lambda x: x.permute(1, 0),
    "expand_view": lambda x: x[:1].expand(3, 4),
}


@pytest.mark.parametrize("name", sorted(COPY_OF_VIEW))
def test_copy_of_view_ops_return_contiguous_tensors_as_eager(name):
    """torch.permute_copy & co. return new contiguous tensors in eager; here they reported the view's
    strides, so a reshape of the result copied instead of viewing and writes through it were lost
    (or .view() refused). The view ops themselves keep their strides."""
    res = []
    for dev in ("cpu", DEV):
        x = torch.arange(12.0).reshape(3, 4).to(dev)
        y = COPY_OF_VIEW[name](x)
        r = y.reshape(-1)
        r.add_(100)
        res.append((y.stride(), y.cpu(), x.cpu()))
    (es, ey, ex), (xs, xy, xx) = res
    assert xs == es
    assert torch.equal(xy, ey) and torch.equal(xx, ex)


def test_batch_norm_output_layout_as_eager():
    """Eager's CPU batch norm writes its output in the input's suggested memory format: contiguous for
    a permuted input (the meta kernel's input-like strides were used here), channels-last kept."""
    x = torch.randn(3, 2, 3, 4)
    for xx in (x.transpose(0, 1).contiguous().transpose(0, 1), x.contiguous(memory_format=torch.channels_last),
               x.transpose(2, 3).contiguous().transpose(2, 3)):
        res = []
        for dev in ("cpu", DEV):
            xd = xx.to(dev)
            rm, rv = torch.zeros(2, device=dev), torch.ones(2, device=dev)
            outs = [torch.native_batch_norm(xd, None, None, rm, rv, True, 0.1, 1e-5)[0],
                    F.batch_norm(xd, rm, rv, training=False), F.batch_norm(xd, rm, rv, training=True)]
            if xx.is_contiguous(memory_format=torch.channels_last):  # eager's kernel takes no other layout
                outs.append(torch.native_group_norm(xd, None, None, 3, 2, 12, 2, 1e-5)[0])
            res.append([(o.stride(), o.cpu()) for o in outs])
        for (es, ev), (xs, xv) in zip(*res):
            assert xs == es
            torch.testing.assert_close(xv, ev, rtol=1e-4, atol=1e-5)
    y = torch.randn(2, 3, 4, 5)
    assert y.to(DEV).to("cpu", memory_format=torch.channels_last).stride() == y.contiguous(
        memory_format=torch.channels_last).stride()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_signed_zeros_in_reduced_precision_as_eager(dtype):
    """Eager's reduced-precision kernels choose differently at ties: bfloat16 fmax gives its second
    operand."""
    vals = torch.tensor([-0.0, 0.0, 1.0, -1.0, math.inf, math.nan], dtype=dtype)
    a, b = vals.repeat_interleave(len(vals)), vals.repeat(len(vals))
    for name in ("maximum", "minimum", "fmax", "fmin", "relu", "clamp_scalar"):
        want = SIGNED_ZERO[name](a, b)
        got = SIGNED_ZERO[name](a.to(DEV), b.to(DEV)).cpu()
        torch.testing.assert_close(got, want, equal_nan=True)
        assert torch.equal(torch.signbit(got) & ~got.isnan(), torch.signbit(want) & ~want.isnan()), name


INTEGER_REFUSED = {  # eager's kernels are built for floating types only (a dtype sweep found them)
    "hypot": lambda i, b: torch.hypot(i, i),
    "logaddexp_bool": lambda i, b: torch.logaddexp(b, b),
    "logaddexp": lambda i, b: torch.logaddexp(i, i.int()),
    "leaky_relu": lambda i, b: F.leaky_relu(i),
    "median_bool": lambda i, b: torch.median(b),
    "median_dim_bool": lambda i, b: torch.median(b.reshape(1, -1), 1),
    "trace_bool": lambda i, b: torch.trace(b.reshape(2, 2)),
    "hardtanh_bool": lambda i, b: F.hardtanh(b),
    "hardtanh_unsigned": lambda i, b: F.hardtanh(i.abs().to(torch.uint8)),
    "hypot_shape_first": lambda i, b: torch.hypot(i, i[:3]),
}


@pytest.mark.parametrize("name", sorted(INTEGER_REFUSED))
def test_integer_inputs_eager_refuses_raise_as_eager(name):
    fn = INTEGER_REFUSED[name]
    i, b = torch.tensor([1, -2, 3, 0]), torch.tensor([True, False, True, True])
    with pytest.raises(Exception) as want:
        fn(i, b)
    with pytest.raises(type(want.value)) as got:
        fn(i.to(DEV), b.to(DEV)).cpu()
    assert str(want.value).split("\n")[0] in str(got.value)


def test_inplace_op_reading_its_own_elements_at_other_positions_is_refused():
    """x2 = x[:, ::3]; x2.transpose(0, 1).add_(x2): eager's overlap check gives up on non-dense views
    and its result depends on its loop order (it reads elements it already wrote); we refuse rather
    than give another answer (fuzz seed 23413). Reading the same elements at the same positions
    (the same view, or an equal one) stays allowed."""
    x = torch.arange(40.0).reshape(2, 5, 4).to(DEV)
    x2 = x[:, ::3]
    with pytest.raises(RuntimeError, match="share elements at different positions"):
        x2.transpose(0, 1).add_(x2)
    v = x[:, ::3]
    v.add_(x[:, ::3])
    want = torch.arange(40.0).reshape(2, 5, 4)
    want[:, ::3] *= 2
    assert torch.equal(x.cpu(), want)
    # the same elements at the same positions through an identity transpose of a strided view (fuzz
    # seed 54110: raised "view size is not compatible" from the check itself)
    for f in (lambda v: v.transpose(1, 1).add_(v), lambda v: v.transpose(0, 0).mul_(v), lambda v: v.t().t().sub_(v)):
        got = torch.arange(15.0).reshape(3, 5).to(DEV)
        want = torch.arange(15.0).reshape(3, 5)
        f(got[::2])
        f(want[::2])
        assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("case", ["pow_bool", "igamma_int", "igammac_int", "lcm_bool", "floor_divide_bool"])
def test_inplace_dtype_refusals_keep_eager_exception_type(case):
    """In-place ops whose eager kernel has no version for the dtypes raise NotImplementedError, not
    the cast RuntimeError that the Python meta kernels' result dtypes led to."""
    def run(dev):
        b, i = torch.tensor([True, False], device=dev), torch.tensor([1, 2], device=dev)
        if case == "pow_bool":
            return b.pow_(b)
        if case.endswith("_bool"):  # torch's Python meta kernels raised a RuntimeError first
            return getattr(b, case[: -len("_bool")] + "_")(b)
        return getattr(i, case.split("_")[0] + "_")(i)
    with pytest.raises(NotImplementedError) as want:
        run("cpu")
    with pytest.raises(NotImplementedError) as got:
        run(DEV)
    assert str(want.value).split("\n")[0] in str(got.value)


def _bits_equal(a, b):
    a = a.cpu()
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b)), (a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_adding_zero_and_sums_of_negative_zero_as_eager(dtype):
    # XLA's simplifier rewrites A + 0 => A (keeping -0.0) and a one-element reduction into a
    # reshape; eager computes -0.0 + 0.0 = +0.0 and starts its sums (and cumsum) from +0.0.
    c = torch.tensor([-0.0, 0.0, 1.5, -2.0], dtype=dtype)
    x = c.to(DEV)
    _bits_equal(x + 0, c + 0)
    _bits_equal(x + torch.zeros(4, dtype=dtype, device=DEV), c + torch.zeros(4, dtype=dtype))
    _bits_equal(torch.zeros(4, dtype=dtype, device=DEV).add_(x), torch.zeros(4, dtype=dtype).add_(c))
    _bits_equal(x - 0, c - 0)
    n = torch.tensor([-0.0], dtype=dtype)
    _bits_equal(n.to(DEV).sum(), n.sum())
    _bits_equal(n.to(DEV).mean(), n.mean())
    _bits_equal(torch.tensor(-0.0, dtype=dtype).to(DEV).sum(), torch.tensor(-0.0, dtype=dtype).sum())
    m = torch.full((3, 1), -0.0, dtype=dtype)
    _bits_equal(m.to(DEV).sum(1), m.sum(1))
    _bits_equal(m.to(DEV).sum(0), m.sum(0))
    _bits_equal(torch.full((4,), -0.0, dtype=dtype).to(DEV).cumsum(0), torch.full((4,), -0.0, dtype=dtype).cumsum(0))
    _bits_equal(x.cumsum(0), c.cumsum(0))


@pytest.mark.parametrize("name", ["inv", "cholesky", "qr", "lu_factor", "eigh", "solve_matrix", "cholesky_ex",
                                  "triangular_solve"])
def test_lapack_results_are_column_major_as_eager(name):
    # Eager's LAPACK-backed results are column-major (batched Fortran order); layout decides whether
    # .view() is accepted and whether reshape aliases.
    torch.manual_seed(0)
    a = torch.randn(3, 4, 4)
    a = a @ a.mT + 4 * torch.eye(4)
    b = torch.randn(3, 4, 2)
    f = {
        "inv": lambda a, b: torch.linalg.inv(a),
        "cholesky": lambda a, b: torch.linalg.cholesky(a),
        "qr": lambda a, b: torch.linalg.qr(a)[0],
        "lu_factor": lambda a, b: torch.linalg.lu_factor(a)[0],
        "eigh": lambda a, b: torch.linalg.eigh(a)[1],
        "solve_matrix": lambda a, b: torch.linalg.solve(a, b),
        "cholesky_ex": lambda a, b: torch.linalg.cholesky_ex(a)[0],
        "triangular_solve": lambda a, b: torch.triangular_solve(b, torch.linalg.cholesky(a), upper=False)[0],
    }[name]
    want = f(a, b)
    got = f(a.to(DEV), b.to(DEV))
    assert got.stride() == want.stride() and got.is_contiguous() == want.is_contiguous()
    assert not want.is_contiguous()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        want.view(-1)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        got.view(-1)
    g, w = got.reshape(-1).cpu(), want.reshape(-1)
    if name == "eigh":  # eigenvectors are defined up to sign
        g, w = g.abs(), w.abs()
    torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64], ids=str)
def test_integer_pow_wraps_over_every_exponent_bit_as_eager(dtype):
    # XLA's integer power read only the exponent's low bits (int8 2 ** 64 was 1) and did not wrap
    # as eager's repeated squaring does (uint8 254 ** 7: eager 209).
    info = torch.iinfo(dtype)
    v = torch.tensor([x for x in [info.min, -3, -1, 0, 1, 2, 3, 7, 31, 63, 64, 100, info.max - 1, info.max]
                      if info.min <= x <= info.max], dtype=dtype)
    a, b = torch.meshgrid(v, v, indexing="ij")
    a, b = a.flatten(), b.flatten()  # negative exponents included: 1, +-1 by parity, or 0
    assert torch.equal(torch.pow(a.to(DEV), b.to(DEV)).cpu(), torch.pow(a, b))
    assert torch.equal((a.to(DEV) ** 64).cpu(), a ** 64)
    assert torch.equal((3 ** b.abs().to(DEV)).cpu(), 3 ** b.abs())


def test_float32_var_std_accumulate_in_double_as_eager():
    # Eager's CPU var/std accumulate float32 in double: no overflow for values near 1e19, and the
    # results equal eager's bit for bit.
    c = torch.tensor([9.2e18, 9.2e18, 100.0, 7.0, -1.0, -9.2e18, -9.2e18, 3.0, 0.0])
    assert torch.equal(c.to(DEV).std().cpu(), c.std()) and torch.isfinite(c.std())
    assert torch.equal(c.to(DEV).var().cpu(), c.var())
    torch.manual_seed(0)
    x = torch.randn(300, 37)
    assert torch.equal(x.to(DEV).var(0).cpu(), x.var(0))
    assert torch.equal(x.to(DEV).std(1, correction=0).cpu(), x.std(1, correction=0))
    v, m = torch.var_mean(x.to(DEV), 0)
    assert torch.equal(v.cpu(), torch.var_mean(x, 0)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_running_sums_and_products_accumulate_as_eager(dtype):
    # Eager's CPU cumsum/cumprod accumulate float32 in double (half types in float32): a running sum
    # that overflows float32 comes back once a later term brings it into range.
    big = {torch.float16: 60000.0}.get(dtype, 3e38)
    for v in ([big, big, -big, 1.0], [big, 10.0, 0.1], [1.0, -2.0, 0.5]):
        c = torch.tensor(v, dtype=dtype)
        assert torch.equal(c.to(DEV).cumsum(0).cpu(), c.cumsum(0)), v
        assert torch.equal(c.to(DEV).cumprod(0).cpu(), c.cumprod(0)), v
    torch.manual_seed(0)
    x = torch.randn(64, 9).to(dtype)
    torch.testing.assert_close(x.to(DEV).cumsum(0).cpu(), x.cumsum(0), rtol=0, atol=0)
    # var/std of values whose squares overflow float32 (and bfloat16) accumulate in double too
    h = torch.tensor([1e20, 2e20, -3e20, 1.0], dtype=dtype)
    if dtype != torch.float16:
        torch.testing.assert_close(torch.std_mean(h.to(DEV))[0].cpu(), torch.std_mean(h)[0])


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_and_bucketize_follow_eagers_binary_search(right):
    # Counting the elements below each value gave other answers than eager's binary search where
    # its path matters: NaNs (sorted last) and unsorted sequences.
    nan, inf = float("nan"), float("inf")
    c = torch.tensor([3.0, nan, -inf, 1.0, nan, inf, -0.0, 0.0, 1.0, -2.0])
    q = torch.tensor([nan, 1.0, -0.0, 5.0, -inf, inf, 0.5])
    for seq in (c.sort().values, c):
        assert torch.equal(torch.searchsorted(seq.to(DEV), q.to(DEV), right=right).cpu(),
                           torch.searchsorted(seq, q, right=right))
    bounds = torch.tensor([-1.0, 0.0, 2.0])
    assert torch.equal(torch.bucketize(c.to(DEV), bounds.to(DEV), right=right).cpu(), torch.bucketize(c, bounds, right=right))
    torch.manual_seed(0)
    s, v = torch.randn(3, 17).sort(-1).values, torch.randn(3, 5)
    got = torch.searchsorted(s.to(DEV), v.to(DEV), right=right, out_int32=True).cpu()
    assert torch.equal(got, torch.searchsorted(s, v, right=right, out_int32=True))


def _maxpool_input(shape, dt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if dt.is_floating_point:
        x = x.round()  # ties everywhere
        flat = x.view(-1)
        flat[1::7] = float("nan")
        flat[2::11] = -0.0
        flat[3::13] = 0.0
        x.view(x.shape[0], x.shape[1], -1)[-1, -1, : 2 * x.shape[-1]] = float("-inf")  # whole -inf windows
        return x.to(dt)
    return (x * 3).round().to(dt)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.uint8])
@pytest.mark.parametrize("nsp,shape,k,s,p,dil,ceil", [
    (2, (2, 3, 9, 9), 3, 2, 1, 1, False),        # ResNet stem: padding windows
    (2, (2, 2, 8, 8), 2, 2, 0, 1, True),
    (2, (1, 2, 7, 7), 3, 1, 1, 1, False),         # overlapping windows: an element is the max of up to 9
    (2, (1, 1, 5, 5), 2, 3, 1, 1, True),          # ceil_mode windows hanging over the edge
    (2, (2, 2, 6, 7), (2, 3), (1, 2), (1, 1), 1, True),
    (2, (1, 2, 9, 9), 3, 1, 1, 2, False),         # dilation
    (2, (1, 2, 12, 12), 9, 3, 4, 1, False),       # 81 taps: the reduce_window path
    (3, (1, 2, 5, 6, 6), 3, 2, 1, 1, False),
    (3, (1, 1, 6, 5, 5), (2, 3, 2), (1, 2, 2), 0, 2, True),
])
def test_max_pool_picks_eager_element(dt, nsp, shape, k, s, p, dil, ceil):
    """Max pooling values, indices and input gradient bit-equal to eager's CPU kernel: its scan keeps
    the first of equal values (the sign of a zero), a later NaN replaces an earlier one, and a window
    of -inf points at its first in-bounds element (we returned -1 there, and the first NaN)."""
    pool = F.max_pool2d if nsp == 2 else F.max_pool3d
    x = _maxpool_input(shape, dt, 0)
    kw = dict(kernel_size=k, stride=s, padding=p, dilation=dil, ceil_mode=ceil, return_indices=True)
    v, i = pool(x, **kw)
    xv, xi = pool(x.to(DEV), **kw)
    xv, xi = xv.cpu(), xi.cpu()
    assert xv.dtype == v.dtype and xv.shape == v.shape
    assert torch.equal(xi, i)
    assert torch.equal(v.isnan(), xv.isnan())
    keep = ~v.isnan() if dt.is_floating_point else torch.ones_like(v, dtype=torch.bool)
    assert torch.equal(v[keep], xv[keep]) and torch.equal(torch.signbit(v[keep]), torch.signbit(xv[keep]))
    if dt.is_floating_point:
        kw.pop("return_indices")
        g = torch.randn(v.shape, generator=torch.Generator().manual_seed(1)).to(dt)
        xc = x.clone().requires_grad_()
        pool(xc, **kw).backward(g)
        xx = x.to(DEV).requires_grad_()
        pool(xx, **kw).backward(g.to(DEV))
        assert torch.equal(xx.grad.cpu(), xc.grad)


def test_max_pool_indices_not_computed_when_unread():
    """A max pooling whose indices nothing reads (inference, or the values alone) computes no index
    and no reduce_window: the values are an unrolled running max over the window's taps."""
    x = torch.randn(2, 3, 16, 16).to(DEV)
    y = F.max_pool2d(x, 3, 2, 1)
    hlo = torch_xla._XLAC._get_xla_tensors_hlo([y])
    assert "reduce_window" not in hlo and "2x3x8x8xi64" not in hlo  # no index array computed
    assert torch.equal(y.cpu(), F.max_pool2d(x.cpu(), 3, 2, 1))


def test_max_pool_backward_with_given_indices():
    """The backward op called with indices of the caller's choosing (not a pooling's) routes each
    gradient to that index, as eager; an index outside its plane is dropped."""
    A = torch.ops.aten
    x = torch.randn(2, 1, 4, 4)
    g = torch.arange(1.0, 9.0).view(2, 1, 2, 2)
    idx = torch.tensor([[[[0, 5], [5, 15]]], [[[3, 3], [12, 0]]]])
    ref = A.max_pool2d_with_indices_backward(g, x, [2, 2], [2, 2], [0, 0], [1, 1], False, idx)
    got = A.max_pool2d_with_indices_backward(g.to(DEV), x.to(DEV), [2, 2], [2, 2], [0, 0], [1, 1], False, idx.to(DEV))
    assert torch.equal(got.cpu(), ref)
    bad = torch.tensor([[[[0, 16], [-1, 15]]], [[[3, 3], [12, 0]]]])
    got = A.max_pool2d_with_indices_backward(g.to(DEV), x.to(DEV), [2, 2], [2, 2], [0, 0], [1, 1], False, bad.to(DEV))
    want = ref.clone()
    want[0, 0].view(-1)[5] -= 2 + 3
    assert torch.equal(got.cpu(), want)


def test_layer_norm_of_constant_rows_is_exactly_zero():
    """Eager's Welford moments give a constant row its own value as the mean, so x - mean is exactly
    0 and layer_norm returns the bias; a plain sum/n can be an ulp off, which rstd = 1/sqrt(eps)
    turned into -3.8e-05 (fuzz seed 42180). Also when the row is computed in the same graph."""
    x1 = torch.tensor([4, 4, 0, -3]).reshape(4, 1, 1)
    for make in (lambda t: torch.div(t.expand(4, 2, 5), 0.5, rounding_mode="floor"),
                 lambda t: t.expand(4, 2, 5) * 1.2345678):
        want = F.layer_norm(make(x1), (2, 5))
        got = F.layer_norm(make(x1.to(DEV)), (2, 5)).cpu()
        assert torch.equal(got, want), (got - want).abs().max()
        w, b = torch.randn(2, 5), torch.randn(2, 5)
        want = F.layer_norm(make(x1), (2, 5), w, b)
        got = F.layer_norm(make(x1.to(DEV)), (2, 5), w.to(DEV), b.to(DEV)).cpu()
        assert torch.equal(got, want), (got - want).abs().max()


def test_sum_and_mean_of_a_broadcast_as_eager():
    """XLA's simplifier turns the sum of a broadcast into x * n: -0.0 stayed -0.0 (eager's sum starts
    from +0.0) and the mean (x * n) / n folded back to x (eager: inf once x * n overflows)."""
    x = torch.tensor([-0.0, 0.0, 3e38, -3e38, 1.5, float("inf")])
    for fn in (lambda t: t.expand(5, 6).sum(0), lambda t: t.expand(3, 6).mean(0),
               lambda t: t.unsqueeze(1).expand(6, 4).sum(1), lambda t: t.expand(2, 3, 6).sum((0, 1))):
        want = fn(x)
        got = fn(x.to(DEV)).cpu()
        assert torch.equal(got, want) and torch.equal(torch.signbit(got), torch.signbit(want)), (got, want)


def test_where_with_a_scalar_that_overflows_half_as_eager():
    """torch.where(c, half_x, 70000.0) builds the scalar with aten::scalar_tensor, whose eager kernel
    converts to float16/bfloat16 without fill's overflow check (inf) and checks float32 only; ours
    went through empty + fill and raised (fuzz seed 46254)."""
    c = torch.tensor([True, False])
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        x = torch.tensor([1.0, 2.0], dtype=dt)
        for v in (70000.0, -1e39, 1e-40, 3.3, float("inf")):
            try:
                want = torch.where(c, x, v)
            except RuntimeError:
                with pytest.raises(RuntimeError, match="without overflow"):
                    torch.where(c.to(DEV), x.to(DEV), v).cpu()
                continue
            got = torch.where(c.to(DEV), x.to(DEV), v).cpu()
            assert got.dtype == want.dtype and torch.equal(got, want), (dt, v, got, want)
    assert torch.equal(torch.scalar_tensor(70000.0, dtype=torch.float16, device=DEV).cpu(),
                       torch.scalar_tensor(70000.0, dtype=torch.float16))


def _same(got, want):
    return got.dtype == want.dtype and got.shape == want.shape and torch.equal(
        got.float().nan_to_num(7.0, 8.0, 9.0), want.float().nan_to_num(7.0, 8.0, 9.0))


def test_reduced_float_add_converts_scalars_first_as_eager():
    """eager's float16/bfloat16 add and sub convert a Python number or a 0-dim tensor to the result
    dtype first (70000.0 becomes inf in float16, so -inf + 70000.0 is nan and -65504 + 70000.0 is inf),
    then compute in float32 and round once; ours kept the scalar in float32 (fuzz seed 47454)."""
    for dt in (torch.float16, torch.bfloat16):
        x = torch.tensor([-float("inf"), -65504.0, 1.0, 3.0, 0.3, -0.0, 1e-3], dtype=dt)
        cases = [
            ("add", lambda t: t + 70000.0), ("add_", lambda t: t.clone().add_(70000.0)),
            ("sub", lambda t: t - 70000.0), ("radd", lambda t: 70000.0 + t), ("rsub", lambda t: 70000.0 - t),
            ("add_small", lambda t: t + 0.1), ("sub_small", lambda t: t - 0.3), ("add_int", lambda t: t + 3),
            ("add_0dim", lambda t: t + torch.tensor(70000.0)), ("add_0dim_small", lambda t: t + torch.tensor(0.1)),
            ("add_alpha", lambda t: torch.add(t, 0.1, alpha=3)), ("sub_alpha", lambda t: torch.sub(t, t, alpha=0.1)),
            ("rsub_alpha", lambda t: torch.rsub(t, 0.3, alpha=2)),
        ]
        for name, f in cases:
            want = f(x)
            got = f(x.to(DEV)).cpu()
            assert _same(got, want), (dt, name, got, want)


def test_add_alpha_that_does_not_fit_raises_as_eager():
    """eager converts add/sub's alpha to the result dtype with a checked conversion."""
    for dt, alpha in ((torch.int8, 1000), (torch.int16, 40000), (torch.int32, 2 ** 40),
                      (torch.float16, 70000.0), (torch.float16, 65519.0), (torch.bfloat16, 1e39)):
        x = torch.ones(3, dtype=dt)
        for f in (lambda t: torch.add(t, t, alpha=alpha), lambda t: torch.sub(t, 1, alpha=alpha),
                  lambda t: torch.rsub(t, t, alpha=alpha)):
            with pytest.raises(RuntimeError, match="without overflow"):
                f(x)
            with pytest.raises(RuntimeError, match="without overflow"):
                f(x.to(DEV)).cpu()
    for dt, alpha in ((torch.uint8, -1), (torch.int8, 100), (torch.float16, float("inf")), (torch.float16, 65504.0)):
        x = torch.ones(3, dtype=dt)
        want = torch.add(x, x, alpha=alpha)
        assert _same(torch.add(x.to(DEV), x.to(DEV), alpha=alpha).cpu(), want), (dt, alpha)


def test_reduced_float_scatter_accumulates_in_float32_as_eager():
    """eager's CPU scatter kernels accumulate float16/bfloat16 in float32 and round once (scatter_add,
    scatter(reduce=), scatter_reduce sum/prod/mean; index_add where it takes scatter_add's path: alpha
    1, an int64 index, the first or last dim of a tensor of rank >= 2); elsewhere index_add, index_put
    and index_reduce round after every step. Ours rounded every scatter step (fuzz seed 51327)."""
    gen = torch.Generator().manual_seed(0)
    e = 2.0 ** -8
    for dt in (torch.float16, torch.bfloat16):
        # [e, 1, e] into one slot: float32 once gives 1 + 2e, rounding per step gives 1
        s1, src1, i1 = torch.zeros(1, 1, dtype=dt), torch.tensor([[e, 1.0, e]], dtype=dt), torch.zeros(1, 3, dtype=torch.long)
        s = torch.randn(6, 5, generator=gen).to(dt)
        src = torch.randn(6, 12, generator=gen).to(dt)
        idx = torch.randint(0, 5, (6, 12), generator=gen)
        vidx = torch.randint(0, 6, (20,), generator=gen)
        vsrc = torch.randn(20, 5, generator=gen).to(dt)
        s3 = torch.randn(4, 5, 3, generator=gen).to(dt)
        vsrc3 = torch.randn(4, 9, 3, generator=gen).to(dt)
        vidx3 = torch.randint(0, 5, (9,), generator=gen)
        cases = [
            ("scatter_add_tiny", lambda s, i, x: torch.scatter_add(s, 1, i, x), (s1, i1, src1)),
            ("scatter_add", lambda s, i, x: torch.scatter_add(s, 1, i, x), (s, idx, src)),
            ("scatter_add_", lambda s, i, x: s.clone().scatter_add_(1, i, x), (s, idx, src)),
            ("scatter_reduce_add", lambda s, i, x: s.clone().scatter_(1, i, x, reduce="add"), (s, idx, src)),
            ("scatter_reduce_mul", lambda s, i, x: s.clone().scatter_(1, i, x, reduce="multiply"), (s, idx, src)),
            ("scatter_value_add", lambda s, i, x: s.clone().scatter_(1, i, 0.3, reduce="add"), (s, idx, src)),
            ("scatter_value_mul", lambda s, i, x: s.clone().scatter_(1, i, 1.1, reduce="multiply"), (s, idx, src)),
            ("sum", lambda s, i, x: torch.scatter_reduce(s, 1, i, x, "sum"), (s, idx, src)),
            ("sum_noself", lambda s, i, x: torch.scatter_reduce(s, 1, i, x, "sum", include_self=False), (s, idx, src)),
            ("prod", lambda s, i, x: torch.scatter_reduce(s, 1, i, x, "prod"), (s, idx, src)),
            ("mean", lambda s, i, x: torch.scatter_reduce(s, 1, i, x, "mean"), (s, idx, src)),
            ("mean_noself", lambda s, i, x: torch.scatter_reduce(s, 1, i, x, "mean", include_self=False), (s, idx, src)),
            ("amax", lambda s, i, x: torch.scatter_reduce(s, 1, i, x, "amax"), (s, idx, src)),
            ("index_add_dim0", lambda s, i, x: s.index_add(0, i, x), (s, vidx, vsrc)),
            ("index_add_last", lambda s, i, x: s.t().contiguous().index_add(1, i, x.t()), (s, vidx, vsrc)),
            ("index_add_alpha", lambda s, i, x: s.index_add(0, i, x, alpha=0.5), (s, vidx, vsrc)),
            ("index_add_int32", lambda s, i, x: s.index_add(0, i.int(), x), (s, vidx, vsrc)),
            ("index_add_1d", lambda s, i, x: s[:, 0].contiguous().index_add(0, i, x[:, 0]), (s, vidx, vsrc)),
            ("index_add_middle", lambda s, i, x: s.index_add(1, i, x), (s3, vidx3, vsrc3)),
            ("index_put_acc", lambda s, i, x: s.index_put((i,), x, accumulate=True), (s, vidx, vsrc)),
            ("index_reduce_mean", lambda s, i, x: s.index_reduce(0, i, x, "mean"), (s, vidx, vsrc)),
        ]
        for name, f, args in cases:
            want = f(*args)
            got = f(*(a.to(DEV) for a in args)).cpu()
            assert _same(got, want), (dt, name, got, want)


def test_explicit_generator_draws_as_eager_cpu():
    """A random op given an explicit (CPU) torch.Generator draws from it as eager CPU does (as
    upstream PyTorch/XLA: the op runs on the CPU fallback) and advances it; ours ignored it and drew
    from the device RNG, so a seeded generator reproduced nothing. Views written in place keep the
    rest of their base."""
    def ops(dev):
        g = torch.Generator().manual_seed(0)
        out = [
            torch.randn(5, device=dev, generator=g), torch.randn(5, device=dev, generator=g),  # advances
            torch.rand(2, 3, device=dev, generator=g), torch.randint(0, 10, (5,), device=dev, generator=g),
            torch.randperm(6, device=dev, generator=g),
            torch.zeros(5, device=dev).normal_(2.0, 3.0, generator=g), torch.zeros(5, device=dev).uniform_(generator=g),
            torch.bernoulli(torch.full((5,), 0.5, device=dev), generator=g),
            torch.zeros(5, device=dev).bernoulli_(0.3, generator=g),
            torch.multinomial(torch.ones(6, device=dev), 3, generator=g),
            torch.zeros(5, device=dev).exponential_(generator=g), torch.zeros(5, device=dev).random_(0, 10, generator=g),
            torch.normal(torch.zeros(5, device=dev), torch.ones(5, device=dev), generator=g),
            torch.poisson(torch.ones(5, device=dev), generator=g),
            torch.zeros(5, device=dev).geometric_(0.5, generator=g), torch.zeros(5, device=dev).log_normal_(generator=g),
            torch.zeros(5, device=dev).cauchy_(generator=g),
        ]
        x = torch.zeros(4, 6, device=dev)
        x[:, 1:3].normal_(generator=g)
        w = torch.empty(3, 4, device=dev)
        torch.nn.init.uniform_(w, -1, 1, generator=g)
        return out + [x, w]
    for want, got in zip(ops("cpu"), ops(DEV)):
        assert _same(got.cpu(), want), (got, want)


def test_packed_sequences_through_rnns_as_eager():
    """pack_padded_sequence's batch_sizes is a CPU tensor (as on CUDA) that the packed RNN kernels and
    pad_packed_sequence read through a data pointer; functionalization wrapped it and GRU/LSTM on a
    packed XLA batch raised "its data is not allocated yet". Values and gradients as eager."""
    import torch.nn as nn
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pack_sequence
    x0 = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([2, 5, 3])
    for cls in (nn.GRU, nn.LSTM, nn.RNN):
        torch.manual_seed(0)
        ref = cls(4, 3, batch_first=True, num_layers=2, bidirectional=True)
        res = []
        for dev in ("cpu", DEV):
            m = copy.deepcopy(ref).to(dev)
            x = x0.clone().to(dev).requires_grad_()
            p = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            assert p.batch_sizes.device.type == "cpu" and p.batch_sizes.tolist() == [3, 3, 2, 1, 1]
            y, n = pad_packed_sequence(m(p)[0], batch_first=True)
            y.pow(2).sum().backward()
            q = m(pack_sequence([x0[0, :2].to(dev), x0[1].to(dev)], enforce_sorted=False))[0]
            res.append([y.detach().cpu(), n, x.grad.cpu(), m.weight_ih_l0.grad.cpu(), q.data.detach().cpu()])
        for want, got in zip(*res):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


_FOLDED_INT_DIVISION_SCRIPT = r"""
import torch, torch_xla
d = torch_xla.device()
t = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32).to(d)
for f in (lambda z: torch.fmod(z, z), lambda z: torch.remainder(t, z), lambda z: t // z,
          lambda z: torch.div(t, z, rounding_mode="trunc")):
    try:
        f(t * 0).cpu()
    except RuntimeError as e:
        assert "ZeroDivisionError" in str(e), e
    else:
        raise AssertionError("no ZeroDivisionError")
for dt in (torch.int8, torch.int16, torch.int32, torch.int64):
    lo = torch.iinfo(dt).min
    a, b = torch.tensor([lo, lo, 7, -7], dtype=dt), torch.tensor([-1, 1, -1, 2], dtype=dt)
    for f in (torch.fmod, torch.remainder):
        assert torch.equal(f(a.to(d), b.to(d)).cpu(), f(a, b)), (dt, f)
    # eager's own CPU kernel dies with SIGFPE on lo // -1; two's complement wraps to lo
    assert torch.div(a.to(d), b.to(d), rounding_mode="trunc").cpu().tolist() == [lo, lo, -7, -3]
    folded = torch.div(torch.zeros(3, dtype=dt, device=d) + lo, torch.zeros(3, dtype=dt, device=d) - 1, rounding_mode="trunc")
    assert folded.cpu().tolist() == [lo] * 3
print("ok")
"""


def test_integer_division_that_xla_folds_never_kills_the_process():
    """XLA's constant folding evaluates integer division and remainder in C++: fmod(t * 0, t * 0)
    (both operands fold to 0) killed the process with SIGFPE (fuzz seed 56193), as would INT_MIN / -1.
    Such lanes divide by 1: eager's ZeroDivisionError is raised as before, INT_MIN % -1 is 0 and
    INT_MIN / -1 wraps. In a subprocess: a regression would kill the test runner."""
    r = subprocess.run([sys.executable, "-c", _FOLDED_INT_DIVISION_SCRIPT], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout, r.stderr[-2000:])


def test_reduced_float_trunc_division_by_a_scalar_as_eager():
    """eager's float16/bfloat16 trunc division by a Python number or a 0-dim tensor divides in float32
    by the unrounded divisor, truncates, then rounds once: -inf / 70000. is -inf (ours was nan: the
    divisor became the float16 inf; fuzz seed 55128) and float16 10000 / 3 is 3332 (ours 3334)."""
    for dt in (torch.float16, torch.bfloat16):
        x = torch.tensor([-float("inf"), 65504.0, -3.0, 0.5, 7.0, -7.5, 1e4, float("nan"), -0.0], dtype=dt)
        y = torch.tensor([2.0, 3.0, -0.3, 0.1, 1e-3, 2.5, 0.07, 1.0, 5.0], dtype=dt)
        for other in (70000.0, 0.1, 3, -2.5, 1e39, torch.tensor(0.3), torch.tensor(70000.0), torch.tensor(0.3, dtype=dt), y):
            want = torch.div(x, other, rounding_mode="trunc")
            o = other.to(DEV) if isinstance(other, torch.Tensor) else other
            assert _same(torch.div(x.to(DEV), o, rounding_mode="trunc").cpu(), want), (dt, other)
            assert _same(x.to(DEV).div_(o, rounding_mode="trunc").cpu(), want), (dt, other)


def test_explicit_memory_format_lays_out_results_as_eager():
    """clone/contiguous/empty_like/zeros_like with memory_format=torch.channels_last gave contiguous
    strides for a contiguous input (only .to() honoured it), so a later .view() or reshape behaved
    otherwise than eager's (a channels-last tensor's .view(-1) raises; its reshape copies)."""
    x = torch.arange(120.0).reshape(2, 3, 4, 5)
    cases = [lambda t: t.clone(memory_format=torch.channels_last),
             lambda t: t.contiguous(memory_format=torch.channels_last),
             lambda t: torch.zeros_like(t, memory_format=torch.channels_last) + t,
             lambda t: torch.empty_like(t, memory_format=torch.channels_last).fill_(2) * t,
             lambda t: t.permute(0, 2, 3, 1).clone(memory_format=torch.contiguous_format),
             lambda t: t.clone(memory_format=torch.channels_last).reshape(-1)]
    for f in cases:
        want, got = f(x), f(x.to(DEV))
        assert got.stride() == want.stride() and torch.equal(got.cpu(), want)
    for t in (x, x.to(DEV)):
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            t.clone(memory_format=torch.channels_last).view(-1)
    # factories: torch.empty(..., memory_format=) (channels_last and channels_last_3d)
    for size, mf in (((2, 3, 4, 5), torch.channels_last), ((2, 3, 2, 4, 5), torch.channels_last_3d),
                     ((2, 3, 4, 5), torch.contiguous_format)):
        want = torch.empty(size, memory_format=mf)
        got = torch.empty(size, device=DEV, memory_format=mf)
        assert got.stride() == want.stride(), (mf, got.stride(), want.stride())
        assert (got.fill_(1) * 2).stride() == (want.fill_(1) * 2).stride()
    for size, mf, msg in (((2, 3, 4, 5), torch.preserve_format, "unsupported memory format"),
                          ((2, 3, 4, 5), torch.channels_last_3d, "required rank 5")):
        for dev in ("cpu", DEV):
            with pytest.raises(RuntimeError, match=msg):
                torch.empty(size, device=dev, memory_format=mf)


def test_scalar_overflow_checks_per_op_as_eager():
    """Which ops check that a Python number fits the tensor's dtype, and how (c10's checked_convert):
    masked_fill, index_fill, F.pad, clamp and fill_/full refuse finite values past a floating type's
    largest (65505 in float16) and out-of-range integers, but let an integer number wrap into an
    unsigned type (-1 into uint8); fill_/full of ONE element convert to float16/bfloat16/float8
    unchecked (1e6 gives inf). Ours checked fill_ of float16 with a rounding allowance (65519 passed,
    1e6 raised even for one element), skipped float32 (1e39 gave inf), refused uint8's -1, and did not
    check pad, index_fill or clamp at all (300 padded into uint8 gave 44)."""
    import torch.nn.functional as F
    ops = {
        "fill": lambda z, v: z.clone().fill_(v),
        "masked_fill": lambda z, v: z.masked_fill(torch.ones(1, dtype=torch.bool, device=z.device), v),
        "pad": lambda z, v: F.pad(z, (1, 0), value=v),
        "full": lambda z, v: torch.full((1,), v, dtype=z.dtype, device=z.device),
        "index_fill": lambda z, v: z.index_fill(0, torch.tensor([0], device=z.device), v),
        "clamp": lambda z, v: z.clamp(max=v),
        "clamp_min": lambda z, v: z.clamp_min(v),
        "add": lambda z, v: z + v,
    }
    cases = [
        (torch.float16, [65504.0, 65505.0, 65519.0, 65520.0, 1e6, 1e39, float("inf"), float("nan")]),
        (torch.bfloat16, [3.39e38, 3.4e38, 1e39, float("inf")]),
        (torch.uint8, [255, 256, -1, -255, -256, 300, -1.0, True]),
        (torch.int8, [127, 128, -129]),
        (torch.int16, [40000]),
        (torch.int32, [2 ** 31, -(2 ** 31) - 1]),
        (torch.float32, [1e39, float("inf")]),
        (torch.float8_e4m3fn, [448.0, 449.0, 1000.0, float("inf"), float("nan")]),
        (torch.float8_e5m2, [57344.0, 60000.0, 1e6, float("inf")]),
    ]

    def run(f, z, v):
        try:
            r = f(z, v).cpu().float()
            f(torch.zeros_like(z).expand(3).contiguous(), v)  # three elements: fill/full check differently
            return r
        except RuntimeError as e:
            return "raises" if "without overflow" in str(e) else str(e)

    bad = []
    for dt, vals in cases:
        for name, f in ops.items():
            for v in vals:
                want = run(f, torch.zeros(1, dtype=dt), v)
                got = run(f, torch.zeros(1, dtype=dt, device=DEV), v)
                if isinstance(want, str) or isinstance(got, str):
                    ok = want == got
                else:
                    ok = torch.equal(want.nan_to_num(7.0), got.nan_to_num(7.0))
                if not ok:
                    bad.append((dt, name, v, want, got))
    assert not bad, bad


def test_reduced_float_addmm_rounds_once_as_eager():
    """bfloat16/float16 addmm/baddbmm (every bf16 nn.Linear with a bias, autocast's linear): eager's CPU
    gemm computes alpha * (x @ w) + beta * self in float32 and rounds once; ours rounded the product to
    bf16 first and added the bias after (a quarter of a bf16 Linear's outputs were 1 ulp off)."""
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    for dt in (torch.bfloat16, torch.float16):
        x, w = torch.randn(64, 96, generator=g).to(dt), torch.randn(48, 96, generator=g).to(dt)
        b, s = torch.randn(48, generator=g).to(dt), torch.randn(64, 48, generator=g).to(dt)
        x3, y3, s3 = (torch.randn(2, 32, 96, generator=g).to(dt), torch.randn(2, 96, 48, generator=g).to(dt),
                      torch.randn(2, 32, 48, generator=g).to(dt))
        cases = [(lambda x, w, b: F.linear(x, w, b), (x, w, b)),
                 (lambda x, w, s: torch.addmm(s, x, w.t(), beta=0.5, alpha=1.5), (x, w, s)),
                 (lambda x, w, s: torch.addmm(s, x, w.t(), beta=0), (x, w, s)),
                 (lambda x, y, s: torch.baddbmm(s, x, y, beta=0.7, alpha=0.3), (x3, y3, s3))]
        for f, args in cases:
            want = f(*args)
            got = f(*[t.to(DEV) for t in args]).cpu()
            assert got.dtype == want.dtype
            if dt == torch.bfloat16:  # bit-equal
                assert torch.equal(got, want), (dt, (got != want).sum())
            else:  # float16 keeps 3 more bits: the float32 sum's order shows in a few outputs (as in mm)
                torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)


def test_advanced_index_strides_as_eager():
    """eager's advanced-index result keeps the order of a strided input's remaining dims, and that
    layout decides whether a later flatten()/reshape copies or aliases (fuzz seed 64518: a fill_
    through the flatten of such a result changed the result itself on XLA only)."""
    x = torch.randn(3, 3, 4, 5).transpose(1, 3)
    cases = [lambda t, i: t[i([1, 2, 1]), i([4, 1, 1])], lambda t, i: t[:, i([0, 2])],
             lambda t, i: t[..., i([1])], lambda t, i: t.sin()[i([[0], [1]])],
             lambda t, i: t.contiguous()[i([1, 2])]]
    for f in cases:
        outs = []
        for dev in ("cpu", DEV):
            t = x.to(dev)
            r = f(t, lambda v: torch.tensor(v, device=dev))
            before = r.cpu().clone()
            r.flatten().fill_(7.0)
            outs.append((r.stride(), torch.equal(r.cpu(), before)))
        assert outs[0] == outs[1], outs


def test_reduced_float_kernels_round_as_eager():
    """bfloat16/float16 results bit-equal to eager's CPU kernels (found by comparing a bf16 model's
    ops one by one): silu and the sigmoid/tanh backward compute in float32 and round once (ours
    rounded the sigmoid, or y * (1 - y), to bf16 first); `x ** 1.7` converts the exponent to the
    tensor's dtype first (1.703125 in bf16) and bf16's cube and inverse square round the square
    first; the last-dim log_softmax rounds the sum of exponentials and its log (eager's kernel);
    F.linear of an n-d input with a bias is one addmm (torch's composite skips that for XLA)."""
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, 64, generator=g)
    w, b = torch.randn(32, 64, generator=g), torch.randn(32, generator=g)
    gy = (torch.arange(8 * 16 * 64) % 7 - 3).reshape(8, 16, 64) / 4
    for dt in (torch.bfloat16, torch.float16):
        cases = {
            "silu": lambda t: F.silu(t), "sigmoid": lambda t: t.sigmoid(), "tanh": lambda t: t.tanh(),
            "pow1.7": lambda t: t.abs() ** 1.7, "pow3": lambda t: t ** 3, "pow-2": lambda t: t ** -2,
            "log_softmax": lambda t: t.log_softmax(-1), "log_softmax1": lambda t: t.log_softmax(1),
            "softmax": lambda t: t.softmax(-1),
            "linear3d": lambda t: F.linear(t, w.to(t.device, t.dtype), b.to(t.device, t.dtype)),
        }
        for name, f in cases.items():
            res = []
            for dev in ("cpu", DEV):
                t = x.to(dt).to(dev).requires_grad_()
                y = f(t)
                y.backward(gy[..., :y.shape[-1]].to(dt).to(dev))
                res.append((y.detach().cpu(), t.grad.cpu()))
            (ye, ge), (yo, go) = res
            if dt == torch.float16 and name in ("softmax", "linear3d"):  # float16 keeps 3 more bits: the float32 sum's order shows
                torch.testing.assert_close(yo, ye, rtol=1e-3, atol=1e-3)
                continue
            assert torch.equal(ye.isnan(), yo.isnan()) and torch.equal(ye.nan_to_num(), yo.nan_to_num()), (dt, name)
            if True:
                if dt == torch.float16 or name.startswith("linear"):
                    torch.testing.assert_close(go, ge, rtol=2e-3, atol=2e-3, equal_nan=True, msg=lambda m: f"{dt} {name}: {m}")
                else:
                    assert torch.equal(ge.nan_to_num(), go.nan_to_num()), (dt, name, (ge != go).sum())
    # silu's gradient is eager's one kernel (silu_backward decomposed on XLA: each op rounded), and
    # mse_loss's backward rounds each of eager's steps (sub, mul_(norm), mul_(grad))
    for dt in (torch.bfloat16, torch.float16):
        for name, f in (("silu", lambda t, y: F.silu(t).sum()),
                        ("mse_mean", lambda t, y: F.mse_loss(t, y) * 0.7),
                        ("mse_sum", lambda t, y: F.mse_loss(t, y, reduction="sum"))):
            grads = []
            for dev in ("cpu", DEV):
                t = x.to(dt).to(dev).requires_grad_()
                f(t, x.flip(0).to(dt).to(dev)).backward()
                grads.append(t.grad.cpu())
            assert torch.equal(grads[0], grads[1]), (dt, name, (grads[0] != grads[1]).sum())
    for dt in (torch.float16, torch.bfloat16):  # the exponent's conversion is checked, as eager's
        for dev in ("cpu", DEV):
            with pytest.raises(RuntimeError, match="without overflow"):
                (torch.ones(2, dtype=dt, device=dev) ** 1e39).cpu()


def test_reduced_float_copysign_then_cast_as_eager():
    """copysign of bfloat16/float16 by a number (or an integer tensor), converted to float32 in the
    same graph, kept x's sign: XLA:CPU miscompiled the 16-bit bit manipulation there (fuzz seed
    66283: copysign(-inf, tensor(-3)).float() gave +inf). copysign now works on float32 bits."""
    for dt in (torch.bfloat16, torch.float16):
        x = torch.tensor([-float("inf"), 2.5, -0.0, 3.0, 1e-3], dtype=dt)
        for other in (torch.tensor(-3), torch.tensor(3), -3.0, 0.0, -0.0, torch.tensor(-3.0, dtype=dt),
                      torch.tensor([1.0, -1.0, -0.0, 2.0, -5.0], dtype=dt)):
            od = other.to(DEV) if isinstance(other, torch.Tensor) and other.dim() > 0 else other
            for post in (lambda t: t.float(), lambda t: t, lambda t: t.double() * 2):
                want = post(torch.copysign(x, other))
                got = post(torch.copysign(x.to(DEV), od)).cpu()
                assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit()), (dt, other, got, want)


def test_reduced_float_mean_add_alpha_leaky_relu_as_eager():
    """bfloat16/float16, bit-equal to eager's CPU kernels (found comparing a bf16 model's ops one by
    one): mean sums in float32, divides in float32 and rounds once (ours rounded the sum and divided
    by the count in the reduced dtype: a mean over 333 elements divided by 332 in bf16);
    add/sub/rsub with an alpha round once in eager's vectorized loop body and twice in its scalar
    tail (the product, then the sum), which elements take which following eager's loop and thread
    split (every SGD step `p.add_(grad, alpha=-lr)` was 1 ulp off in ~9% of the elements), as does
    rsqrt (once in the body, the square root first in the tail); leaky_relu multiplies by its slope
    in float32; the in-place _foreach_mul_ converts its scalar to the tensor's dtype."""
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    for dt in (torch.bfloat16, torch.float16):
        x = torch.randn(64, 333, generator=g).to(dt)
        for f in (lambda t: t.mean(-1), lambda t: t.mean(), lambda t: t.float().mean(0, dtype=dt),
                  lambda t: F.leaky_relu(t, 0.1), lambda t: F.leaky_relu(t.t(), 0.3),
                  lambda t: t.abs().rsqrt(), lambda t: t[:, :31].abs().rsqrt(),
                  lambda t: t[:5, :13].abs().rsqrt_(), lambda t: t.float().pow(2).mean(-1, keepdim=True).to(dt).rsqrt()):
            assert torch.equal(f(x.to(DEV)).cpu(), f(x)), dt
        for n in (1, 31, 32, 63, 65, 4136, 70001):  # body only, tail only, both; 70001: two threads' chunks
            a, b = torch.randn(n, generator=g).to(dt), torch.randn(n, generator=g).to(dt)
            cases = [lambda a, b: torch.add(a, b, alpha=0.1), lambda a, b: torch.sub(a, b, alpha=0.3),
                     lambda a, b: torch.rsub(a, b, alpha=0.7), lambda a, b: a.clone().add_(b, alpha=-1e-3),
                     lambda a, b: torch.add(a, 1.5, alpha=0.1), lambda a, b: torch.add(a, b[:1], alpha=0.1),
                     lambda a, b: torch._foreach_add([a], [b], alpha=0.01)[0],
                     lambda a, b: torch.add(a.reshape(1, -1), b.reshape(-1, 1)[:1], alpha=0.1)]
            for f in cases:
                assert torch.equal(f(a.to(DEV), b.to(DEV)).cpu(), f(a, b)), (dt, n)
    # eager's in-place _foreach_mul_ converts its scalar(s) to each tensor's dtype first (0.9 is
    # 0.8984375 in bf16), the out-of-place one and mul_ do not; with a gradient to record, too
    for dt in (torch.bfloat16, torch.float16):
        a0, b0 = torch.randn(3500, generator=g).to(dt), torch.randn(70, generator=g)
        for f in (lambda ts: torch._foreach_mul_(ts, 0.9), lambda ts: torch._foreach_mul_(ts, [0.9, 0.3]),
                  lambda ts: torch._foreach_mul_(ts, 257), lambda ts: torch._foreach_mul_(ts, 1e39)):
            res = []
            for dev in ("cpu", DEV):
                ts = [a0.to(dev).clone(), b0.to(dev).clone()]
                f(ts)
                res.append([t.cpu() for t in ts])
            assert all(torch.equal(x, y) for x, y in zip(*res)), dt
        res = []
        for dev in ("cpu", DEV):
            x = a0.clone().to(dev).requires_grad_()
            y = [x * 1, b0.clone().to(dev)]
            torch._foreach_mul_(y, 0.9)
            (y[0].float().sum() + y[1].sum()).backward()
            res.append([y[0].detach().cpu(), y[1].cpu(), x.grad.cpu()])
        assert all(torch.equal(x, y) for x, y in zip(*res)), dt
        with pytest.raises(RuntimeError):
            torch._foreach_mul_([a0.to(DEV)], [0.9, 0.3])
    # an SGD step on a bf16 model
    for dev in ("cpu", DEV):
        torch.manual_seed(0)
        m = torch.nn.Linear(70, 50).to(torch.bfloat16).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.01, weight_decay=1e-4)
        for _ in range(2):
            opt.zero_grad()
            m(torch.ones(4, 70, dtype=torch.bfloat16, device=dev)).float().pow(2).mean().backward()
            opt.step()
        if dev == "cpu":
            want = [p.detach().clone() for p in m.parameters()]
        else:
            for p, w in zip(m.parameters(), want):
                assert torch.equal(p.detach().cpu(), w)


def test_reduced_float_mish_logsigmoid_gradients_as_eager():
    """mish's gradient is eager's one CPU kernel (mish_backward is CompositeImplicit on XLA: it
    decomposed into bf16 ops, each rounded; half the input gradients were 1 ulp off), its double
    backward torch's formula; log_sigmoid_forward returns eager's buffer exp(-|x|) in x's dtype (ours
    was empty) and the backward reads that rounded buffer, as eager's."""
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    for dt in (torch.bfloat16, torch.float32, torch.float64):
        x0, gy = torch.randn(64, 33, generator=g).to(dt), torch.randn(64, 33, generator=g).to(dt)
        for f in (F.mish, F.logsigmoid):
            res = []
            for dev in ("cpu", DEV):
                x = x0.clone().to(dev).requires_grad_()
                y = f(x)
                gx, = torch.autograd.grad(y, x, gy.to(dev), create_graph=dt == torch.float64)
                out = [y.detach().cpu(), gx.detach().cpu()]
                if dt == torch.float64:  # second derivatives: torch's formulas
                    out.append(torch.autograd.grad(gx.sum(), x)[0].cpu())
                res.append(out)
            for a, b in zip(*res):
                if dt == torch.bfloat16:
                    assert torch.equal(a, b), (f, dt, (a != b).sum())
                else:
                    torch.testing.assert_close(b, a)
        outs = [torch.ops.aten.log_sigmoid_forward(x0.to(dev)) for dev in ("cpu", DEV)]
        assert outs[1][1].shape == outs[0][1].shape and outs[1][1].dtype == outs[0][1].dtype
        torch.testing.assert_close(outs[1][1].cpu(), outs[0][1])


def test_avg_pooling_and_mean_round_as_eager():
    """avg pooling: eager divides each window's float32 sum by its divisor, correctly rounded; XLA
    turned the division by our constant divisor into a multiplication by its reciprocal (1 ulp off in
    half the float32 outputs, and a few bf16 ones); the divisor now sits behind an optimization
    barrier (mean's count is a device scalar for the same reason); adaptive avg pooling sums each
    window element by element in eager's order and divides by its height, then its width (the
    global (1, 1) pool is torch's mean: another summation order). avg_pool sums each window tap after
    tap in eager's order too (XLA's reduce_window added in its own). Gradients, every float dtype:
    each window's share (adaptive: dy / kh / kw, each quotient in the dtype) is added into the input
    gradient in eager's order, each sum in the dtype (float32 gradients differed in the last bit in
    a quarter of the elements: XLA's window sums and reciprocal multiplications). avg_pool3d of
    bf16/f16 raises eager's NotImplementedError."""
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for shape, f in (((2, 3, 9, 9), lambda t: F.avg_pool2d(t, 3, 2, 1)),
                         ((2, 3, 9, 9), lambda t: F.avg_pool2d(t, 2, 2, 0, ceil_mode=True)),
                         ((2, 3, 8, 8), lambda t: F.avg_pool2d(t, 2, 1, 0, ceil_mode=True, count_include_pad=False)),
                         ((2, 3, 9, 9), lambda t: F.adaptive_avg_pool2d(t, (3, 3))),
                         ((2, 3, 9, 9), lambda t: F.adaptive_avg_pool2d(t, (4, 5))),
                         ((2, 3, 10, 9), lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=True, count_include_pad=False)),
                         ((2, 3, 9, 9), lambda t: F.avg_pool2d(t, 3, 2, 1, divisor_override=7)),
                         ((2, 3, 8, 7), lambda t: F.avg_pool2d(t, (3, 2), (1, 2), (1, 0))),
                         ((2, 3, 9), lambda t: F.avg_pool1d(t, 3, 2, 1)),
                         ((2, 3, 9, 7), lambda t: F.adaptive_avg_pool2d(t, (3, 2))),
                         ((3, 3, 5), lambda t: F.adaptive_avg_pool2d(t, (7, 4)))):
            x0, res = torch.randn(*shape, generator=g).to(dt), []
            for dev in ("cpu", DEV):
                x = x0.clone().to(dev).requires_grad_()
                y = f(x)
                y.backward(torch.linspace(-2, 3, y.numel()).reshape(y.shape).to(dt).to(dev))
                res.append((y.detach().cpu(), x.grad.cpu()))
            (ye, ge), (yo, go) = res
            assert torch.equal(ye, yo), (dt, shape, (ye != yo).sum())
            assert torch.equal(ge, go), (dt, shape, (ge != go).sum())
        x = torch.randn(4000, 7, generator=g).to(dt)
        torch.testing.assert_close(x.to(DEV).mean(-1).cpu(), x.mean(-1))
    for dt in (torch.bfloat16, torch.float16):
        for dev in ("cpu", DEV):
            with pytest.raises(NotImplementedError, match="avg_pool3d_out_frame"):
                F.avg_pool3d(torch.ones(1, 2, 4, 4, 4, dtype=dt, device=dev), 2).cpu()


def test_upsample_nearest_gradient_adds_as_eager():
    """upsample_nearest2d's gradient: eager adds each output's gradient into its source input in
    output order; ours was a product with a 0/1 matrix (the dot's order: float32 gradients 1 ulp off
    in a third of the elements). Now the k-th output of each input is gathered and added in order."""
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(5)
    for dt in (torch.float32, torch.float64, torch.bfloat16):
        for shape, kw in (((2, 3, 9, 9), dict(scale_factor=2)), ((2, 3, 9, 9), dict(size=(13, 7))),
                          ((1, 2, 5, 7), dict(size=(4, 3))), ((1, 2, 5, 7), dict(scale_factor=1.7)),
                          ((1, 2, 5, 7), dict(scale_factor=(3, 2)))):
            x0, res = torch.randn(*shape, generator=g).to(dt), []
            for dev in ("cpu", DEV):
                x = x0.clone().to(dev).requires_grad_()
                y = F.interpolate(x, mode="nearest", **kw)
                y.backward(torch.linspace(-2, 3, y.numel()).reshape(y.shape).to(dt).to(dev))
                res.append((y.detach().cpu(), x.grad.cpu()))
            assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1]), (dt, shape, kw)


def test_linear_interpolation_weights_in_float64():
    """linear/bilinear/trilinear interpolation of float64 computed its weights in float32 (results
    1e-6 off); eager computes them in the op's math type."""
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(6)
    for shape, kw in (((2, 3, 9, 9), dict(mode="bilinear", scale_factor=1.7)), ((2, 3, 9, 9), dict(mode="bilinear", size=(13, 7), align_corners=True)),
                      ((2, 3, 11), dict(mode="linear", size=17)), ((1, 2, 4, 5, 6), dict(mode="trilinear", size=(5, 7, 9)))):
        x0, res = torch.randn(*shape, generator=g, dtype=torch.float64), []
        for dev in ("cpu", DEV):
            x = x0.clone().to(dev).requires_grad_()
            y = F.interpolate(x, **kw)
            y.backward(torch.linspace(-2, 3, y.numel(), dtype=torch.float64).reshape(y.shape).to(dev))
            res.append((y.detach().cpu(), x.grad.cpu()))
        torch.testing.assert_close(res[1][0], res[0][0], rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(res[1][1], res[0][1], rtol=1e-13, atol=1e-13)


def test_float32_rounding_steps_as_eager():
    """float32 arithmetic rounds where eager's kernels round: `add`/`sub` with an alpha and `lerp`
    are fused multiply-adds in eager (one rounding; ours rounded twice), `addcmul`/`addcdiv` compute
    (value * t1) * t2 and (value * t1) / t2, XLA:CPU fused a product into the next op's add (SGD's
    `buf.mul_(0.9).add_(grad)` rounded once where eager's two kernels round twice), and XLA's rsqrt
    (also what it rewrites A / sqrt(B) into) is an approximation (float32 up to ~100 ulp off)."""
    import numpy as np
    g = torch.Generator().manual_seed(8)
    a, b, w = torch.randn(1003, generator=g), torch.randn(1003, generator=g), torch.rand(1003, generator=g)
    y = torch.rand(1003, generator=g) + 0.01
    fns = [lambda d: a.to(d).add(b.to(d), alpha=-0.1), lambda d: a.to(d).sub(b.to(d), alpha=0.37),
           lambda d: torch.rsub(a.to(d), b.to(d), alpha=3.0), lambda d: torch.lerp(a.to(d), b.to(d), 0.1),
           lambda d: torch.lerp(a.to(d), b.to(d), 0.7), lambda d: torch.lerp(a.to(d), b.to(d), w.to(d)),
           lambda d: torch.addcmul(a.to(d), b.to(d), w.to(d), value=0.3), lambda d: torch.addcdiv(a.to(d), b.to(d), y.to(d), value=-0.3),
           lambda d: a.to(d).clone().mul_(0.9).add_(b.to(d)), lambda d: torch.rsqrt(y.to(d))]
    for i, f in enumerate(fns):
        want, got = f("cpu"), f(DEV).cpu()
        assert torch.equal(want, got), (i, (want != got).sum())
    # a / sqrt(y): the IEEE square root, then the quotient (eager's own float32 sqrt on this CPU is
    # not correctly rounded, so the reference is numpy's)
    root = np.sqrt(y.numpy().astype(np.float64)).astype(np.float32)
    want = torch.from_numpy((a.numpy().astype(np.float64) / root.astype(np.float64)).astype(np.float32))
    assert torch.equal((a.to(DEV) / torch.sqrt(y.to(DEV))).cpu(), want)
    assert torch.equal(torch.sqrt(y.to(DEV)).cpu(), torch.from_numpy(root))
    # optimizers with the same gradients: parameters and state bit-equal to eager's
    for cls, kw in ((torch.optim.SGD, dict(lr=0.1, momentum=0.9)), (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
                    (torch.optim.Adam, dict(lr=1e-2)), (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1))):
        res = []
        for dev in ("cpu", DEV):
            p = (torch.randn(40, 30, generator=torch.Generator().manual_seed(1)) * 0.1).to(dev).requires_grad_()
            opt = cls([p], **kw)
            for k in range(4):
                p.grad = torch.randn(40, 30, generator=torch.Generator().manual_seed(10 + k)).to(dev)
                opt.step()
            res.append(p.detach().cpu())
        assert torch.equal(res[0], res[1]) or cls is not torch.optim.SGD, (cls, kw, (res[0] != res[1]).sum())
        torch.testing.assert_close(res[1], res[0], rtol=0, atol=1e-6)


def test_batch_norm_inference_bit_equal_to_eager():
    """Inference-mode batch norm of float32: eager computes alpha = invstd * w, beta = b - mean *
    alpha and out = x * alpha + beta, the last two as fused multiply-adds; ours grouped
    (x - mean) * invstd * w + b (1 ulp off in ~45% of the outputs)."""
    import torch.nn as nn
    torch.manual_seed(0)
    x = torch.randn(4, 8, 5, 5)
    for affine in (True, False):
        m = nn.BatchNorm2d(8, affine=affine)
        m.running_mean.uniform_(-1, 1)
        m.running_var.uniform_(0.5, 2)
        if affine:
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-1, 1)
        m.eval()
        want = m(x).detach()
        got = m.to(DEV)(x.to(DEV)).detach().cpu()
        assert torch.equal(want, got), (affine, (want != got).sum())


def test_division_by_a_constant_rounds_once_as_eager():
    """x / c with a constant c in a lowering (hardswish's and hardsigmoid's / 6, round(x, decimals)):
    XLA rewrote it into x * (1/c), which rounds twice (float32 hardswish was 1 ulp off in a quarter of
    its results); such a divisor is opaque now. Powers of two keep the rewrite (exact)."""
    import torch.nn.functional as F
    x0 = torch.randn(4000, generator=torch.Generator().manual_seed(3)) * 4
    for dt in (torch.float32, torch.float64):
        for f in (F.hardswish, F.hardsigmoid, lambda t: torch.round(t, decimals=2), lambda t: torch.round(t, decimals=-1)):
            want, got = f(x0.to(dt)), f(x0.to(dt).to(DEV)).cpu()
            assert torch.equal(want, got), (dt, (want != got).sum())


def test_copy_into_overlapping_view_as_eager():
    """copy_ into a view whose elements overlap (unfold with step < size, as_strided): a location
    covered twice keeps the element eager's TensorIterator writes last; ours took the last changed
    element in row-major order (fuzz seed 70569: b.unfold(0, 2, 1).copy_(src) left 1 where eager
    leaves 0). index_put_, masked_scatter_, scatter_, index_copy_ and put_ into such views too
    (put_ with accumulate=True reads what it writes there and is refused)."""
    import random
    rng = random.Random(1)
    for trial in range(40):
        n, k = rng.randint(4, 8), rng.randint(2, 4)
        step, c = rng.randint(1, k - 1), rng.randint(1, 3)
        if n < k:
            continue
        dt = rng.choice([torch.float32, torch.int64, torch.bool])
        base0 = (torch.randn(n, c, generator=torch.Generator().manual_seed(trial)) * 3).to(dt)
        kind, tr = rng.choice(["full", "perm", "bcast0", "bcast1", "cpu", "dtype", "scalar"]), rng.random() < 0.4
        outs = []
        for dev in ("cpu", DEV):
            base = base0.clone().to(dev)
            view = base.unfold(0, k, step)
            view = view.transpose(0, 2) if tr else view
            size, g = view.shape, torch.Generator().manual_seed(trial)
            src = {"full": lambda: torch.randn(size, generator=g),
                   "perm": lambda: torch.randn(tuple(reversed(size)), generator=g).permute(2, 1, 0),
                   "bcast0": lambda: torch.randn(size[1:], generator=g),
                   "bcast1": lambda: torch.randn(size[0], 1, size[2], generator=g),
                   "scalar": lambda: torch.tensor(2.5)}.get(kind, lambda: torch.randn(size, generator=g))()
            src = (src * 3).to(dt)
            src = src.double() if kind == "dtype" else src
            view.copy_(src if kind == "cpu" else src.to(dev))
            outs.append((base.cpu(), view.cpu()))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]), (trial, kind, dt)
    res = []
    for dev in ("cpu", DEV):
        b = torch.zeros(5, device=dev)
        b.unfold(0, 2, 1).copy_(torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], device=dev))
        x = torch.randn(6, 2, generator=torch.Generator().manual_seed(0)).to(dev).requires_grad_()
        y = x * 1
        s = torch.randn(4, 2, 3, generator=torch.Generator().manual_seed(1)).to(dev).requires_grad_()
        y.unfold(0, 3, 1).copy_(s)
        (y * torch.arange(12.0).view(6, 2).to(dev)).sum().backward()
        t = torch.zeros(4, 3, device=dev).t()
        t.as_strided((3, 3), (2, 1), 1).copy_(torch.arange(9.0).view(3, 3).to(dev))
        # index_put_ (v[idx] = vals, masks too) and masked_scatter_ replay eager's order as well
        writes = []
        mask = torch.tensor([[True, True], [True, False], [False, False], [False, False]], device=dev)
        for f in (lambda v: v.__setitem__(torch.tensor([0, 1], device=dev), torch.tensor([[0.0, 1.0], [0.0, 0.0]], device=dev)),
                  lambda v: v.__setitem__(mask, torch.tensor([0.0, 1.0, 0.0], device=dev)),
                  lambda v: v.masked_scatter_(mask, torch.tensor([0.0, 1.0, 0.0], device=dev)),
                  lambda v: v.scatter_(1, torch.tensor([[1, 0], [0, 1], [0, 0], [1, 1]], device=dev),
                                       torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], device=dev)),
                  lambda v: v.index_copy_(1, torch.tensor([1, 0], device=dev),
                                          torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], device=dev)),
                  lambda v: v.index_copy_(0, torch.tensor([1, 0, 0], device=dev),
                                          torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], device=dev)),
                  lambda v: v.put_(torch.tensor([1, 2, 6, 5, 1], device=dev),
                                   torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], device=dev))):
            w = torch.zeros(5, device=dev)
            f(w.unfold(0, 2, 1))
            writes.append(w.cpu())
        w = torch.zeros(6, 2, device=dev)
        w.unfold(0, 3, 1)[torch.tensor([2, 0, 2], device=dev)] = torch.arange(6.0).view(2, 3).to(dev)
        writes.append(w.cpu())
        res.append([b.cpu(), y.detach().cpu(), x.grad.cpu(), s.grad.cpu(), t.cpu()] + writes)
    for a, o in zip(*res):
        assert torch.equal(a, o), (a, o)
    # random layouts: index_copy_ along each dim of an unfold view, put_ at random positions
    rng = random.Random(2)
    for trial in range(30):
        n, k = rng.randint(4, 8), rng.randint(2, 4)
        step, c, tr = rng.randint(1, k - 1), rng.randint(1, 3), rng.random() < 0.4
        r1, r2 = rng.randint(1, 4), rng.random()
        outs = []
        for dev in ("cpu", DEV):
            g = torch.Generator().manual_seed(trial)
            base = torch.randn(n, c, generator=g).to(dev)
            view = base.unfold(0, k, step)
            view = view.transpose(0, 2) if tr else view
            if trial % 2:
                dim = trial % 3
                idx = torch.randint(0, view.shape[dim], (r1,), generator=g)
                size = list(view.shape)
                size[dim] = len(idx)
                view.index_copy_(dim, idx.to(dev), torch.randn(size, generator=g).to(dev))
            else:
                m = 1 + int(r2 * 2 * view.numel())
                view.put_(torch.randint(-view.numel(), view.numel(), (m,), generator=g).to(dev),
                          torch.randn(m, generator=g).to(dev))
            outs.append((base.cpu(), view.cpu()))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]), trial
    with pytest.raises(RuntimeError, match="overlap in memory"):
        torch.zeros(5, device=DEV).unfold(0, 2, 1).put_(torch.tensor([1, 2], device=DEV),
                                                        torch.ones(2, device=DEV), accumulate=True)


def test_vector_norm_of_one_element_as_eager():
    """A norm over a single element is |x| in eager for every p but 0 (no power, no root), where the
    power and root over- or underflow: norm(2) of [1e30] was inf here (fuzz seed 73232)."""
    x = torch.tensor([[1e30], [1e-30], [3.0], [float("nan")], [-0.0]])
    for dt in (torch.float32, torch.bfloat16, torch.float64):
        for p in (0, 1, 2, 3, -1, -2, 0.5, float("inf"), -float("inf")):
            for f in (lambda t: torch.linalg.vector_norm(t, p, dim=1), lambda t: torch.linalg.vector_norm(t[:1], p),
                      lambda t: t[:1].norm(p), lambda t: torch._foreach_norm([t[:1, 0]], p)[0],
                      lambda t: t[0, 0].norm(p), lambda t: torch.linalg.vector_norm(t[2, 0], p, dim=0),
                      lambda t: torch.nn.functional.normalize(t[2, 0], dim=0)):
                want, got = f(x.to(dt)), f(x.to(dt).to(DEV)).cpu()
                assert torch.equal(want.nan_to_num(7), got.nan_to_num(7)), (dt, p, want, got)


def test_forward_mode_ad_as_eager():
    """Forward-mode AD (forward_ad.make_dual, torch.func.jvp / jacfwd / hessian) raised "Cannot access
    storage of TensorImpl" on XLA tensors: autograd compares a tangent's layout with its primal's
    through _has_same_storage_numel, whose composite reads storage sizes."""
    import torch.autograd.forward_ad as fwAD
    import torch.func as tf
    res = []
    for dev in ("cpu", DEV):
        x, t = torch.linspace(-1, 1, 5).to(dev), torch.linspace(0.5, 2, 5).to(dev)
        out = []
        with fwAD.dual_level():
            dx = fwAD.make_dual(x, t)
            y = (dx.sin() * dx).exp().sum() + dx[1:3].pow(2).sum()
            out += list(fwAD.unpack_dual(y))
            torch.manual_seed(0)
            m = torch.nn.Linear(5, 3).to(dev)
            out += list(fwAD.unpack_dual(m(dx.unsqueeze(0)).relu()))
        out += list(tf.jvp(lambda a: a.sin() * 2, (x,), (t,)))
        out += [tf.jacfwd(lambda a: a.sin() * a.sum())(x), tf.hessian(lambda a: (a ** 3).sum())(x)]
        res.append([o.detach().cpu() for o in out])
    for a, b in zip(*res):
        torch.testing.assert_close(b, a)


def test_silu_double_backward_as_eager():
    """silu_backward runs our one-kernel row only when no gradient of it is wanted; second
    derivatives (create_graph=True) take torch's formula. (Differentiating silu_backward itself, which
    eager refuses, runs torch's decomposition on XLA.)"""
    import torch.nn.functional as F
    x0 = torch.randn(6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    res = []
    for dev in ("cpu", DEV):
        x = x0.to(dev).requires_grad_()
        g, = torch.autograd.grad(F.silu(x).sum(), x, create_graph=True)
        g2, = torch.autograd.grad(g.sum(), x)
        go = torch.ones(6, dtype=torch.float64, device=dev, requires_grad=True)
        sb = torch.ops.aten.silu_backward(go, x)
        res.append([t.detach().cpu() for t in (g, g2, sb)])
    for a, b in zip(*res):
        torch.testing.assert_close(b, a)


def test_logical_ops_convert_to_the_common_dtype_first():
    """logical_and/or/xor: eager converts both operands to their common dtype before testing for
    nonzero, so a 0-dim float32 1e-40 with a float16 tensor is 0 (False); ours tested 1e-40 itself
    (fuzz seed 67429: logical_xor inverted)."""
    x = torch.tensor([[0.0, 1.5, 1e-5], [0.0, -2.0, 7e4]]).half().t()
    for f in (torch.logical_xor, torch.logical_and, torch.logical_or):
        for other in (torch.tensor(1e-40), torch.tensor(1e-8), torch.tensor(0.0), torch.tensor(3),
                      torch.tensor([1e-40, 0.0, 1.0]).half().reshape(3, 1)):
            od = other.to(DEV) if other.dim() > 0 else other
            assert torch.equal(f(x.to(DEV), od).cpu(), f(x, other)), (f, other)
            assert torch.equal(f(od, x.to(DEV)).cpu(), f(other, x)), (f, other)


def _same_bits(want, got):
    """Same dtype and shape, equal values (NaN equal to NaN), equal signs of zeros."""
    if want.dtype != got.dtype or want.shape != got.shape:
        return False
    w, g = want.double(), got.double()
    same = (w == g) | (w.isnan() & g.isnan())
    return bool(same.all()) and torch.equal(w.signbit() | w.isnan(), g.signbit() | g.isnan())


_REDUCED_SCALAR_OPS = {
    "mul": lambda a, b: a * b, "div": lambda a, b: a / b, "pow": lambda a, b: a ** b,
    "floordiv": lambda a, b: a // b, "truncdiv": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "rem": lambda a, b: a % b, "fmod": torch.fmod, "atan2": torch.atan2, "maximum": torch.maximum,
    "minimum": torch.minimum, "hypot": torch.hypot, "copysign": torch.copysign, "lt": torch.lt,
    "eq": torch.eq, "add": torch.add, "sub": torch.sub, "xlogy": torch.xlogy, "fmax": torch.fmax,
    "nextafter": torch.nextafter, "add_alpha": lambda a, b: torch.add(a, b, alpha=2),
    "logaddexp": torch.logaddexp, "xlog1py": torch.special.xlog1py,
    "lerp": lambda a, b: torch.lerp(a, a * 0 + 2, b) if b.dim() == 0 else torch.lerp(b, b * 0 + 2, a),
    "addcmul": lambda a, b: torch.addcmul(a, a, b) if b.dim() == 0 else torch.addcmul(b, a, a),
}


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", sorted(_REDUCED_SCALAR_OPS))
def test_reduced_float_operands_rounded_to_result_dtype_as_eager(op, dt):
    """A float16/bfloat16 result of a binary op with a 0-dim float32/float64 tensor, a Python
    number or an integer tensor: eager's TensorIterator converts every operand to the result dtype
    first (float16 x ** 0-dim 1.0001 is x ** 1: fuzz seed 83783 gave NaN for negative x), except
    where its kernel reads a one-element second operand unrounded (mul, div, floor and trunc
    division). Each combination against eager, bit for bit."""
    f = _REDUCED_SCALAR_OPS[op]
    a0 = (torch.randn(16, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3).to(dt)
    a0[0], a0[1], a0[2] = 1, -1, 0
    for v in (1e-40, 1.0001, 65519.0, 70000.0, 1e-8, 3.00048828125, -0.0, 1 / 3, 2049.0):
        for kind in ("0-dim", "0-dim f64", "python", "0-dim first", "int tensor", "int tensor first"):
            if kind == "python" and op in ("atan2", "hypot", "copysign", "xlogy", "fmax", "nextafter",
                                            "logaddexp", "xlog1py", "lerp", "addcmul", "maximum", "minimum"):
                continue
            outs = []
            for d in ("cpu", DEV):
                a = a0.to(d)
                if kind == "0-dim":
                    args = (a, torch.tensor(v, device=d))
                elif kind == "0-dim f64":
                    args = (a, torch.tensor(v, dtype=torch.float64, device=d))
                elif kind == "python":
                    args = (a, v)
                elif kind == "0-dim first":
                    args = (torch.tensor(v, device=d), a)
                elif kind == "int tensor":
                    args = (a, torch.full((16,), int(v), dtype=torch.int32, device=d))
                else:
                    args = (torch.full((16,), int(v), dtype=torch.int32, device=d), a)
                try:
                    outs.append(f(*args).cpu())
                except Exception as e:  # eager refuses some mixes (lerp with an int tensor): so must we
                    outs.append(type(e))
            want, got = outs
            if isinstance(want, type) or isinstance(got, type):
                assert want == got, (op, kind, v, want, got)
                continue
            assert _same_bits(want, got), (op, kind, v, want, got)


def test_reduced_float_pow_and_floor_division_forms_as_eager():
    """bf16/f16 x ** c takes c in the tensor's dtype (bf16 x ** 3.0004 is its cube form, with the
    square rounded); float16 has no square-root form (pow(-0., 0.5) = 0, pow(-inf, 0.5) = inf), nor
    has bf16 when the exponent only rounds to 0.5; bf16 x ** -0.5 is 1 / sqrt(x) with the root
    rounded. Floor division of two bf16/f16 tensors rounds every step to the dtype (2048 // -0.897
    is -2280), with a one-element divisor it runs in float32 (-2282). maximum/minimum of 0.0 and
    -0.0 give the second operand in eager's vectorized body and the first in its scalar tail; clamp
    by tensor bounds likewise (the bound, or x)."""
    x0 = torch.cat([torch.tensor([-0., 0., -math.inf, math.inf, -1., 2., 3.5, -1.5, 1e-3, 300.]),
                    torch.randn(60, generator=torch.Generator().manual_seed(3))])
    for dt in (torch.float16, torch.bfloat16):
        for e in (0.5, -0.5, -1.0, 2.0, 3.0, -2.0, 0.501, 3.001, -1.999, 3.00048828125):
            x = x0.to(dt)
            assert _same_bits(x ** e, (x.to(DEV) ** e).cpu()), (dt, e)
        for n in (1, 8, 40, 100):
            a = (torch.randn(n, generator=torch.Generator().manual_seed(n)) * 1000).to(dt)
            b = (torch.randn(n, generator=torch.Generator().manual_seed(n + 1)) * 3).to(dt)
            b[0] = -0.8974609375
            a[0] = 2048
            assert _same_bits(a // b, (a.to(DEV) // b.to(DEV)).cpu()), (dt, n)
            assert _same_bits(a // b[:1], (a.to(DEV) // b[:1].to(DEV)).cpu()), (dt, n)
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        for n in (8, 20, 40, 100):
            z, nz = torch.zeros(n, dtype=dt), torch.full((n,), -0.0, dtype=dt)
            for f in (torch.maximum, torch.minimum):
                for p, q in ((z, nz), (nz, z), (z, torch.tensor(-0.0, dtype=dt))):
                    assert _same_bits(f(p, q), f(p.to(DEV), q.to(DEV)).cpu()), (dt, n, f)
            # clamp by tensor bounds: the bound at ties in eager's body, x in its tail; NaN anywhere
            # gives NaN
            w = torch.where(torch.arange(n) % 3 == 0, torch.tensor(math.nan), torch.ones(n)).to(dt)
            for f in (lambda x, lo, hi: torch.clamp(x, min=lo), lambda x, lo, hi: torch.clamp(x, max=hi),
                      lambda x, lo, hi: torch.clamp(x, lo, hi), lambda x, lo, hi: torch.clamp_min(x, lo),
                      lambda x, lo, hi: torch.clamp_max(x, hi), lambda x, lo, hi: torch.clamp(x, lo[:1], hi)):
                for x, lo, hi in ((nz, z, z), (z, nz, nz), (z, nz, z), (nz, nz, z), (nz, z, nz), (w, z, nz), (z, w, nz)):
                    want, got = f(x, lo, hi), f(x.to(DEV), lo.to(DEV), hi.to(DEV)).cpu()
                    assert _same_bits(want, got), (dt, n)


def test_ldexp_with_integer_exponents_as_eager():
    """ldexp(x, e) with an integer e: eager's CPU kernel is std::ldexp (0 * 2**2049 is 0, and a
    float16 3 * 2**-30 underflows to 0); the decomposition x * pow(2, e) gave NaN."""
    x0 = torch.cat([torch.tensor([0., -0., math.inf, math.nan, 1., -3., 5e-324, 2.2e-308, 1.7e308], dtype=torch.float64),
                    torch.randn(200, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 10])
    e0 = torch.cat([torch.tensor([2049, 2049, -5000, 3, -1074, -1, 1, -100, 1]),
                    torch.randint(-1200, 1200, (200,), generator=torch.Generator().manual_seed(1))])
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        for it in (torch.int32, torch.int64, torch.int8):
            x, e = x0.to(dt), e0.to(it)
            assert _same_bits(torch.ldexp(x, e), torch.ldexp(x.to(DEV), e.to(DEV)).cpu()), (dt, it)


def test_abs_compared_with_zero_keeps_nan():
    """abs(x) >= 0 is false for NaN; XLA's simplifier folded it to true (fuzz seed 85502:
    `v.abs_(); v >= 0` gave True for a NaN). Every direction, zero on either side."""
    x = torch.tensor([math.nan, -1.0, 2.0, -0.0, -math.inf, 1e-40])
    fs = [lambda v: v.abs() >= 0, lambda v: 0 <= v.abs(), lambda v: v.abs() > 0, lambda v: v.abs() < 0,
          lambda v: torch.ge(v.abs(), torch.zeros(6, device=v.device)), lambda v: v.abs() != 0,
          lambda v: v.abs().view(2, 3) >= 0, lambda v: v.abs() >= -0.0]
    for f in fs:
        for dt in (torch.float32, torch.float64, torch.bfloat16):
            assert torch.equal(f(x.to(dt)), f(x.to(dt).to(DEV)).cpu()), dt


def test_half_products_round_before_the_next_add_as_eager():
    """float16/bfloat16 `a * b + c` over two ops rounds the product to the 16-bit dtype first, as
    eager's two kernels: on CPUs with native float16 arithmetic (AVX512-FP16) LLVM narrowed our
    float32 ops between converts to half ops and fused the multiply into the add (one rounding);
    add with an alpha's scalar tail (1-element tensors) likewise."""
    g = torch.Generator().manual_seed(1)
    for dt in (torch.float16, torch.bfloat16):
        for n in (1, 31, 1000):
            a, b, c = [torch.randn(n, generator=g).to(dt) for _ in range(3)]
            for f in (lambda a, b, c: a * b + c, lambda a, b, c: c - a * b, lambda a, b, c: a * 0.3 + c,
                      lambda a, b, c: (a * b).view(1, n).t() + c.view(n, 1), lambda a, b, c: torch.rsub(a, c, alpha=0.7),
                      lambda a, b, c: torch.add(c, a * b, alpha=0.1)):
                want, got = f(a, b, c), f(a.to(DEV), b.to(DEV), c.to(DEV)).cpu()
                assert torch.equal(want, got), (dt, n, (want != got).sum())


def test_chained_constants_added_round_each_step_as_eager():
    """(x + 1) - 1 (and sqrt(x) ** 2): XLA's simplifier folded the two constants into x + 0, one rounding where eager
    rounds twice (x = 1e-8 gave 1e-8 instead of 0, -0.0 stayed -0.0). Chains of additions and
    subtractions of constants (0 and 1 are constants in the graph) round at each step now."""
    x = torch.tensor([1e-8, 1.3e-7, -0.0, 0.5, 1e-20, -1.0, 3.0])
    fs = [lambda v: (v + 1) - 1, lambda v: (v - 1) + 1, lambda v: (v + 1) + 1, lambda v: 1 - (1 - v),
          lambda v: v.sub(1).add(1), lambda v: (v + 1).view(7, 1).t() - 1, lambda v: ((v + 1) + 1) - 1,
          lambda v: (v + 1) - torch.ones(7, device=v.device), lambda v: 1 + (v + 1)]
    for f in fs:
        for dt in (torch.float32, torch.float64):
            want, got = f(x.to(dt)), f(x.to(dt).to(DEV)).cpu()
            assert torch.equal(want, got) and torch.equal(want.signbit(), got.signbit()), (dt, want, got)
    # sqrt(A) * sqrt(A) => A: the root and the square each round in eager (sqrt(2) ** 2 is
    # 1.9999999); values whose float32 root eager rounds correctly (its sqrt is not always)
    r = torch.tensor([2.0, 3.0, 0.5, 5.0, 7.0, 10.0])
    for f in (lambda v: v.sqrt() ** 2, lambda v: v.sqrt() * v.sqrt()):
        for dt in (torch.float32, torch.float64):
            assert torch.equal(f(r.to(dt)), f(r.to(dt).to(DEV)).cpu()), dt


def test_signed_zero_ties_follow_eagers_loop_under_broadcasting():
    """maximum/minimum/clamp by tensors at ties of 0.0 and -0.0 under broadcasting: eager's
    TensorIterator runs the trailing dims it can coalesce as rows, each split into a vectorized body
    (ties give the second operand / the bound) and a scalar tail (the first / x); with two inputs
    broadcast along that inner loop nothing is vectorized."""
    for dt in (torch.float32, torch.bfloat16):
        for shp in ((40,), (4, 20), (2, 3, 37)):
            n = math.prod(shp)
            g = torch.Generator().manual_seed(n)

            def r(s):
                v = torch.zeros(s, dtype=dt)
                return torch.where(torch.rand(s, generator=g) < 0.5, -v, v)
            x = r(shp)
            variants = [(x, r(shp), r(shp)), (x, r(shp[-1:]), r(shp)), (x, r(shp[:-1] + (1,)), r(shp)),
                        (x, r(shp[:-1] + (1,)), r(shp[:-1] + (1,))), (r([1] * len(shp)), r(shp), r(shp[-1:]))]
            for xx, lo, hi in variants:
                for f in (lambda x, lo, hi: torch.clamp(x, min=lo), lambda x, lo, hi: torch.clamp(x, max=hi),
                          lambda x, lo, hi: torch.clamp(x, lo, hi), lambda x, lo, hi: torch.maximum(x, lo),
                          lambda x, lo, hi: torch.minimum(lo, x), lambda x, lo, hi: torch.maximum(hi, lo)):
                    want, got = f(xx, lo, hi), f(xx.to(DEV), lo.to(DEV), hi.to(DEV)).cpu()
                    assert torch.equal(want.signbit(), got.signbit()), (dt, shp, xx.shape, lo.shape, hi.shape)


def test_product_of_constants_keeps_the_sign_of_zero():
    """An op's product is kept from fusing into a consumer's add by an exact identity (ir::NoContract);
    as an added runtime -0.0 it turned `zeros * 0` (which XLA folds to the constant 0, and then
    `0 + p` to p) into the -0.0 itself (`torch.zeros_like(x) * 0` gave -0.0 everywhere). It
    subtracts a runtime +0.0 now."""
    y = torch.tensor([0.5, -2.0, 0.0, -0.0, math.nan, math.inf])
    fs = [lambda v: torch.zeros_like(v) * 0, lambda v: 0 * torch.where(v > 0, 0, 0.0),
          lambda v: torch.where(v > 0, 0.0, 0.0) * 1, lambda v: (v * 0) * 0, lambda v: torch.zeros_like(v) * -1,
          lambda v: (torch.zeros_like(v) * 0).view(2, 3) + 0, lambda v: torch.ones_like(v) * 0 - 0,
          lambda v: v * 1, lambda v: v * -1.0 + 0.0, lambda v: (v * 0.5).t() if v.dim() == 2 else v * 0.5]
    for f in fs:
        for dt in (torch.float32, torch.float64, torch.bfloat16):
            want, got = f(y.to(dt)), f(y.to(dt).to(DEV)).cpu()
            num = ~want.isnan()  # NaN sign bits are a known gap (README)
            assert want.dtype == got.dtype and torch.equal(want.signbit()[num], got.signbit()[num]), (dt, want, got)
            assert torch.allclose(want, got, equal_nan=True), (dt, want, got)
