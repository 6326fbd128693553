"""torch.linalg.slogdet / logdet / slogdet on our IR (the _linalg_slogdet row, csrc/ops/rows_linalg.cc),
and det of exactly singular matrices (the _linalg_det row factors with the same rounded products).

Values against eager CPU, exactly singular matrices (sign 0, logabsdet -inf, as eager), NaN and
infinite entries, batches, 0 x 0 matrices, gradients; no CPU fallback."""
import pytest
import torch

import torch_xla
import torch_xla.debug.metrics as met

DEV = torch_xla.device()
NAN, INF = float("nan"), float("inf")


def _no_fallback():
    ops = [n for n in met.executed_fallback_ops() if n != "aten::_local_scalar_dense"]
    assert ops == [], ops


def _check(a, rtol=1e-5, atol=1e-5):
    es, el = torch.linalg.slogdet(a)
    met.clear_counters()
    gs, gl = torch.linalg.slogdet(a.to(DEV))
    gs, gl = gs.cpu(), gl.cpu()
    _no_fallback()
    assert gs.dtype == es.dtype and gl.dtype == el.dtype and gs.shape == es.shape and gl.shape == el.shape
    torch.testing.assert_close(gs, es, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(gl, el, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (5, 5), (4, 2, 2), (2, 3, 6, 6), (16, 16)])
def test_slogdet_full_rank(shape, dtype):
    torch.manual_seed(sum(shape))
    _check(torch.randn(shape, dtype=dtype))


SINGULAR = {
    "zero_matrix": torch.zeros(3, 3),
    "zero_row": torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [4.0, 5.0, 7.0]]),
    "zero_column": torch.tensor([[1.0, 0.0, 3.0], [2.0, 0.0, 1.0], [4.0, 0.0, 7.0]]),
    "duplicate_rows": torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [1.0, 2.0, 3.0]]),
    "multiple_row": torch.tensor([[1.0, 2.0], [2.0, 4.0]]),
    "rank_one_integers": torch.outer(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([4.0, 5.0, 6.0, 7.0])),
    "batch_mixed": torch.stack([torch.eye(3) * 2, torch.zeros(3, 3), torch.tensor(
        [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -3.0]])]),
}


@pytest.mark.parametrize("name", list(SINGULAR))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_slogdet_exactly_singular(name, dtype):
    a = SINGULAR[name].to(dtype)
    es, el = torch.linalg.slogdet(a)
    assert (es == 0).any() or name == "batch_mixed"
    _check(a)


def test_slogdet_special_values():
    for a in [torch.tensor([[NAN, 1.0], [2.0, 3.0]]), torch.tensor([[INF, 1.0], [2.0, 3.0]]),
              torch.tensor([[-2.0, 0.0], [0.0, 3.0]]), torch.tensor([[0.0, 1.0], [1.0, 0.0]])]:
        _check(a)


def test_slogdet_empty_and_logdet_det():
    _check(torch.zeros(0, 0))
    _check(torch.zeros(2, 0, 0))
    torch.manual_seed(1)
    a = torch.randn(3, 4, 4)
    met.clear_counters()
    torch.testing.assert_close(torch.logdet(a.to(DEV)).cpu(), torch.logdet(a), equal_nan=True, rtol=1e-5, atol=1e-5)
    s = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    torch.testing.assert_close(torch.logdet(s.to(DEV)).cpu(), torch.logdet(s))
    _no_fallback()


def test_slogdet_gradient():
    torch.manual_seed(2)
    a = torch.randn(2, 4, 4, dtype=torch.float64)

    def run(dev):
        x = a.to(dev).requires_grad_()
        s, l = torch.linalg.slogdet(x)
        (l * torch.tensor([1.0, -2.0], dtype=torch.float64, device=dev)).sum().backward()
        return x.grad.cpu()
    torch.testing.assert_close(run(DEV), run("cpu"), rtol=1e-9, atol=1e-9)


def test_slogdet_errors_match_eager():
    for bad, exc in [(torch.zeros(2, 3), RuntimeError), (torch.zeros(3), RuntimeError),
                     (torch.zeros(2, 2, dtype=torch.int64), RuntimeError)]:
        with pytest.raises(exc) as e_cpu:
            torch.linalg.slogdet(bad)
        with pytest.raises(exc) as e_xla:
            torch.linalg.slogdet(bad.to(DEV))
        assert str(e_cpu.value).split("\n")[0] == str(e_xla.value).split("\n")[0]


@pytest.mark.parametrize("name", list(SINGULAR))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_det_exactly_singular_is_eagers(name, dtype):
    """det of an exactly singular matrix is eager's exact zero (not a ~1e-8 residue)."""
    a = SINGULAR[name].to(dtype)
    met.clear_counters()
    got = torch.linalg.det(a.to(DEV)).cpu()
    _no_fallback()
    torch.testing.assert_close(got, torch.linalg.det(a), rtol=0, atol=0)
