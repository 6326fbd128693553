"""Reading XLA tensors to the host on the CPU plugin (issue #9, host collectives): a ready buffer of
the CPU plugin is host memory, so `.cpu()`, `_C._to_host_into` and the host collectives copy it on
the calling thread (counter `HostReadInPlace`) instead of through PJRT_Buffer_ToHostBuffer.
`TORCH_XLA_DIRECT_HOST_READ=0` turns that off. Values must be the same either way, for every dtype
and shape, for computed, uploaded and adopted (zero-copy) buffers.
"""
import os
import subprocess
import sys

import pytest
import torch

import torch_xla
import torch_xla.debug.metrics as met
from torch_xla import _C

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool, torch.complex64]
SHAPES = [(), (0,), (7,), (3, 5), (2, 3, 4)]


def _sample(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 100).to(dtype)
    return torch.randint(-100 if dtype is not torch.uint8 else 0, 100, shape, generator=g).to(dtype)


def _reads():
    return met.counter_value("HostReadInPlace") or 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_uploaded_and_computed_values_read_back_exactly(dtype):
    dev = torch_xla.device()
    for shape in SHAPES:
        c = _sample(dtype, shape)
        x = c.to(dev)
        assert torch.equal(x.cpu(), c), shape
        # computed in a graph: a permuted / broadcast result is materialized dense by XLA
        if len(shape) >= 2:
            y, ref = x.transpose(0, 1) + 0 if dtype is not torch.bool else x.transpose(0, 1).clone(), c.transpose(0, 1)
        else:
            y, ref = (x.flip(0) if len(shape) else x.clone()), (c.flip(0) if len(shape) else c)
        torch_xla.sync()
        out = y.cpu()
        assert out.dtype == ref.dtype and out.shape == ref.shape and torch.equal(out, ref), shape


def test_reads_go_through_host_memory_on_the_cpu_plugin():
    dev = torch_xla.device()
    x = torch.arange(1000, dtype=torch.float32).to(dev) * 2
    before = _reads()
    assert torch.equal(x.cpu(), torch.arange(1000, dtype=torch.float32) * 2)  # pending: runs, then reads
    assert _reads() == before + 1
    # into an existing buffer (what the host collectives use), and an adopted (zero-copy) buffer
    out = torch.empty(1000)
    _C._to_host_into(x, out)
    assert torch.equal(out, torch.arange(1000, dtype=torch.float32) * 2)
    staged = _C._pooled_empty(1000, torch.float32).copy_(torch.linspace(-1, 1, 1000))
    ref = staged.clone()
    adopted = _C._from_cpu_adopt(staged, 0)
    del staged
    assert torch.equal(adopted.cpu(), ref)
    assert _reads() == before + 3


def test_a_failed_computation_still_raises_on_read():
    dev = torch_xla.device()
    x = torch.arange(4).to(dev)
    idx = torch.tensor([7]).to(dev)
    with pytest.raises(IndexError, match="out of bounds"):
        x[idx].cpu()  # out of range: eager raises; the read must raise too, not return garbage


def test_switched_off_reads_the_same_values(tmp_path):
    code = (
        "import torch, torch_xla, torch_xla.debug.metrics as met\n"
        "x = (torch.arange(24, dtype=torch.float32).reshape(2, 3, 4).to(torch_xla.device()) * 3).permute(2, 0, 1)\n"
        "torch_xla.sync()\n"
        "assert torch.equal(x.cpu(), (torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) * 3).permute(2, 0, 1))\n"
        "print('reads', met.counter_value('HostReadInPlace') or 0)\n")
    env = dict(os.environ, TORCH_XLA_DIRECT_HOST_READ="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "reads 0" in r.stdout, r.stderr[-2000:]
