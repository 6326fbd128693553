"""Composite kernels that build their result through views and in-place writes (issue #7: never a
wrong answer). Such a kernel, run at our dispatch key below functionalization, used to reach the CPU
fallback for its views, whose writes were lost: `F.affine_grid` returned zeros, `conv_tbc` and
`fft.fftfreq` wrong values. They now run under functionalization or on the CPU fallback
(csrc/bridge/bridge.cc, RegisterKernels). The cases come from a survey of the functional
CompositeExplicitAutograd ops that OpInfo does not cover."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_xla

D = torch_xla.device()
g = torch.Generator().manual_seed(0)
A = torch.randn(4, 5, generator=g)
B = torch.randn(3, 5, generator=g)
T2 = torch.tensor([[[1.0, 0.2, 0.1], [0.0, 0.9, -0.3]], [[0.5, -0.2, 0.0], [0.3, 1.1, 0.2]]])
T3 = torch.randn(2, 3, 4, generator=g)

CASES = {
    "affine_grid_2d": lambda dev: F.affine_grid(T2.to(dev), (2, 1, 2, 3), align_corners=False),
    "affine_grid_2d_aligned": lambda dev: F.affine_grid(T2.to(dev), (2, 3, 4, 5), align_corners=True),
    "affine_grid_3d": lambda dev: F.affine_grid(T3.to(dev), (2, 1, 2, 3, 2), align_corners=True),
    "euclidean_dist": lambda dev: torch._euclidean_dist(A.to(dev), B.to(dev)),
    "conv_tbc": lambda dev: torch.conv_tbc(A.reshape(2, 2, 5).to(dev), torch.ones(3, 5, 4).to(dev),
                                           torch.arange(4.).to(dev), 1),
    "hann_window": lambda dev: torch.hann_window(7, device=dev),
    "hamming_window": lambda dev: torch.hamming_window(8, periodic=False, device=dev),
    "blackman_window": lambda dev: torch.blackman_window(6, device=dev),
    "bartlett_window": lambda dev: torch.bartlett_window(9, device=dev),
    "kaiser_window": lambda dev: torch.kaiser_window(8, device=dev),
    "kaiser_window_beta": lambda dev: torch.kaiser_window(6, False, 5.0, device=dev),
    "fftfreq": lambda dev: torch.fft.fftfreq(7, device=dev),
    "fftfreq_d": lambda dev: torch.fft.fftfreq(8, d=0.5, device=dev),
    "rfftfreq": lambda dev: torch.fft.rfftfreq(8, d=0.5, device=dev),
    "stack": lambda dev: torch.ops.aten._stack([A.to(dev), A.flip(0).to(dev)], 1),
    "pdist": lambda dev: F.pdist(A.to(dev)),
    "pairwise_distance": lambda dev: F.pairwise_distance(A.to(dev), A.flip(0).to(dev)),
    "masked_scatter_backward": lambda dev: torch.ops.aten.masked_scatter_backward(A.to(dev), (A > 0).to(dev), [20]),
    "soft_margin_loss_backward": lambda dev: torch.ops.aten.soft_margin_loss_backward(
        torch.tensor(1.).to(dev), A.to(dev), A.sign().to(dev), 1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_composite_matches_eager(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = CASES[name]("cpu")
        got = CASES[name](D)
    assert got.device.type == "xla"
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_affine_grid_gradient_matches_eager():
    def run(dev):
        th = T2.clone().to(dev).requires_grad_(True)
        grid = F.affine_grid(th, (2, 1, 3, 4), align_corners=False)
        (grid * torch.linspace(-1, 1, 2).to(dev)).sum().backward()
        return grid.detach().cpu(), th.grad.cpu()
    (g1, d1), (g2, d2) = run(D), run("cpu")
    torch.testing.assert_close(g1, g2)
    torch.testing.assert_close(d1, d2)
