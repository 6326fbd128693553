"""as_strided_copy / as_strided_scatter lowered on our IR (csrc/ops/rows_as_strided.cc).

Every case is compared with eager CPU (values, dtype, shape); the lowered cases must not reach the
CPU fallback; overlapping writes (eager writes them in its own order) stay on the fallback and still
match eager; bad maps raise eager's errors."""
import pytest
import torch

import torch_xla
import torch_xla.debug.metrics as met

DEV = torch_xla.device()


def _as_strided_ops():
    return [n for n in met.executed_fallback_ops() if "as_strided" in n]


def _check(fn, *inputs, fallback_ok=False):
    expected = fn(*inputs)
    met.clear_counters()
    got = fn(*[t.to(DEV) for t in inputs])
    got_cpu = got.cpu()
    assert got_cpu.dtype == expected.dtype and got_cpu.shape == expected.shape, (got_cpu.shape, expected.shape)
    torch.testing.assert_close(got_cpu, expected, rtol=0, atol=0, equal_nan=True)
    if not fallback_ok:
        assert _as_strided_ops() == [], met.executed_fallback_ops()


# (base shape, size, stride, offset)
MAPS = {
    "contiguous_block": ((24,), (2, 3), (3, 1), 0),
    "block_with_offset": ((24,), (3, 4), (4, 1), 7),
    "flat_with_offset": ((24,), (5,), (1,), 19),
    "strided_1d": ((24,), (4,), (5,), 2),
    "row_stride_gap": ((30,), (3, 4), (10, 1), 3),       # rows of a padded matrix
    "column_step": ((30,), (3, 2), (10, 3), 1),          # nested, two strided levels
    "three_levels": ((64,), (2, 3, 2), (30, 8, 3), 1),   # pads the top level (reads past the last row)
    "transposed_map": ((24,), (4, 3), (1, 4), 0),        # not in stride order
    "size_one_dims": ((24,), (1, 3, 1, 2), (100, 4, 7, 1), 5),
    "scalar_element": ((24,), (), (), 11),
    "non_nested": ((24,), (2, 2), (3, 2), 1),            # positions 1, 3, 4, 6: a gather
    "non_nested_3d": ((40,), (2, 3, 2), (7, 3, 5), 0),
    "whole_2d_base": ((4, 6), (6, 4), (1, 6), 0),        # a transposed read of a 2-D base
    "zero_size": ((24,), (0, 3), (3, 1), 4),
    "zero_size_dim_last": ((24,), (3, 0), (1, 1), 0),
}
OVERLAPPING_READS = {
    "overlap_windows": ((10,), (4, 3), (2, 1), 0),      # unfold-like windows
    "overlap_equal_strides": ((10,), (3, 2), (1, 1), 1),
    "broadcast_stride0": ((10,), (3, 2), (0, 2), 1),
    "broadcast_all": ((10,), (2, 3), (0, 0), 4),
}


@pytest.mark.parametrize("name", list(MAPS) + list(OVERLAPPING_READS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_as_strided_copy_matches_eager(name, dtype):
    shape, size, stride, off = {**MAPS, **OVERLAPPING_READS}[name]
    base = torch.arange(int(torch.tensor(shape).prod())).reshape(shape).to(dtype)
    _check(lambda b: torch.as_strided_copy(b, size, stride, off), base)


@pytest.mark.parametrize("name", list(MAPS) + list(OVERLAPPING_READS))
def test_as_strided_view_read_matches_eager(name):
    shape, size, stride, off = {**MAPS, **OVERLAPPING_READS}[name]
    base = torch.randn(shape)
    _check(lambda b: b.as_strided(size, stride, off) * 2 + 1, base)


def test_as_strided_copy_default_offset_and_bool():
    base = torch.tensor([True, False, False, True, True, False])
    _check(lambda b: torch.as_strided_copy(b, (2, 2), (1, 3)), base)


@pytest.mark.parametrize("name", list(MAPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_as_strided_scatter_matches_eager(name, dtype):
    shape, size, stride, off = MAPS[name]
    base = torch.arange(int(torch.tensor(shape).prod())).reshape(shape).to(dtype)
    src = (-1 - torch.arange(int(torch.tensor(size).prod()) if size else 1)).reshape(size).to(torch.float64)
    _check(lambda b, s: torch.as_strided_scatter(b, s, size, stride, off), base, src)


def test_as_strided_scatter_default_offset():
    _check(lambda b, s: torch.as_strided_scatter(b, s, (3,), (2,)), torch.zeros(7), torch.tensor([1.0, 2.0, 3.0]))


def test_as_strided_on_permuted_dense_input():
    """A transposed CPU tensor moved with .to() keeps its strides: its storage is the untransposed
    matrix, as in eager."""
    def fn(t):
        return torch.as_strided_copy(t, (2, 3), (1, 4), 1)

    def scat(t):
        return torch.as_strided_scatter(t, -torch.ones(2, 3, device=t.device), (2, 3), (1, 4), 1)
    for f in (fn, scat):
        cpu = torch.arange(12.0).reshape(3, 4).t()
        expected = f(cpu)
        met.clear_counters()
        xt = torch.arange(12.0).reshape(3, 4).t().to(DEV)
        assert xt.stride() == cpu.stride()
        got = f(xt)
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
        assert _as_strided_ops() == [], met.executed_fallback_ops()


def test_as_strided_scatter_overlapping_writes_match_eager():
    """Overlapping maps: eager writes element after element; such calls run eager's kernel (fallback)."""
    _check(lambda b, s: torch.as_strided_scatter(b, s, (3, 2), (1, 1)), torch.zeros(6),
           torch.arange(6.0).reshape(3, 2), fallback_ok=True)
    _check(lambda b, s: torch.as_strided_scatter(b, s, (2, 3), (2, 1), 1), torch.zeros(9),
           torch.arange(6.0).reshape(2, 3), fallback_ok=True)


@pytest.mark.parametrize("args,exc,msg", [
    (((3, 2), (0, 1), 0), RuntimeError, "more than one element of the written-to tensor"),
    (((3, 2), (2, 1), 1), RuntimeError, "out of bounds for storage"),
    (((3, 2), (2, -1), 1), RuntimeError, "Negative strides"),
])
def test_as_strided_scatter_errors_match_eager(args, exc, msg):
    src = torch.ones(3, 2)
    with pytest.raises(exc, match=msg):
        torch.as_strided_scatter(torch.zeros(6), src, *args)
    with pytest.raises(exc, match=msg):
        torch.as_strided_scatter(torch.zeros(6, device=DEV), src.to(DEV), *args)
        torch_xla.sync()


def test_as_strided_scatter_size_mismatch():
    with pytest.raises(RuntimeError, match="expected src to have a size equal to the slice of self"):
        torch.as_strided_scatter(torch.zeros(6, device=DEV), torch.ones(2, 2, device=DEV), (3, 2), (2, 1))


def test_as_strided_copy_errors_match_eager():
    for args, msg in [(((3, 2), (2, 1), 1), "out of bounds for storage"), (((3,), (-1,), 0), "Negative strides")]:
        with pytest.raises(RuntimeError, match=msg):
            torch.as_strided_copy(torch.zeros(6), *args)
        with pytest.raises(RuntimeError, match=msg):
            torch.as_strided_copy(torch.zeros(6, device=DEV), *args).cpu()


@pytest.mark.parametrize("size,stride,off", [((2, 3), (3, 1), 2), ((3, 2), (4, 2), 1), ((2, 2), (3, 2), 0),
                                             ((4,), (5,), 3)])
def test_writes_through_as_strided_views(size, stride, off):
    def fn(b):
        b = b.clone()
        v = b.as_strided(size, stride, off)
        v.mul_(10).add_(1)
        return b
    _check(fn, torch.arange(24.0))


def test_bucket_view_pattern():
    """DDP's reducer: a flat bucket, each gradient written through an as_strided view of it."""
    shapes = [(4, 3), (4,), (2, 5, 2), (1,)]

    def fn(*grads):
        bucket = torch.zeros(sum(g.numel() for g in grads), dtype=grads[0].dtype, device=grads[0].device)
        off = 0
        views = []
        for g in grads:
            v = bucket.as_strided(g.shape, g.stride(), off)
            v.copy_(g)
            views.append(v)
            off += g.numel()
        bucket.div_(2)
        return torch.cat([bucket] + [v.reshape(-1) * 3 for v in views])
    _check(fn, *[torch.randn(s) for s in shapes])


@pytest.mark.parametrize("size,stride,off", [((2, 3), (3, 1), 2), ((3, 2), (4, 2), 1), ((2, 2), (3, 2), 0),
                                             ((4, 3), (2, 1), 0), ((3, 2), (0, 2), 1), ((0, 2), (1, 1), 0)])
def test_gradient_through_as_strided(size, stride, off):
    """as_strided's backward (as_strided_scatter of zeros and index sums for overlapping views)."""
    torch.manual_seed(0)
    base = torch.randn(12)
    w = torch.randn(size)

    def run(dev):
        x = base.to(dev).detach().requires_grad_()
        y = torch.sin(x).as_strided(size, stride, off)
        (y * w.to(dev)).sum().backward()
        return x.grad.cpu()
    expected = run("cpu")
    got = run(DEV)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_forced_fallback_env_matches(tmp_path):
    """TORCH_XLA_AS_STRIDED_FALLBACK=1 (the A/B switch of bench/bench_ddp.py) sends the calls to the
    CPU fallback, with the same results."""
    import subprocess
    import sys
    code = ("import torch, torch_xla, torch_xla.debug.metrics as met\n"
            "b = torch.arange(24.0, device=torch_xla.device())\n"
            "r = torch.as_strided_scatter(b, torch.ones(2, 3, device=b.device), (2, 3), (4, 1), 5)\n"
            "print(r.cpu().tolist(), [n for n in met.executed_fallback_ops() if 'as_strided' in n])\n")
    env = dict(__import__("os").environ, TORCH_XLA_AS_STRIDED_FALLBACK="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    expected = torch.as_strided_scatter(torch.arange(24.0), torch.ones(2, 3), (2, 3), (4, 1), 5)
    assert out.stdout.strip() == f"{expected.tolist()} ['aten::as_strided_scatter']"
