"""Out-of-range indices give eager's IndexError instead of XLA's silent clamping: rows add an
in-graph check whose result raises at the host read, or at the next sync when execution was async."""
import pytest
import torch
import torch.nn.functional as F

import torch_xla

DEV = torch_xla.device()


def _x():
    return torch.randn(5, 3).to(DEV)


CASES = {
    "index": lambda x: x[torch.tensor([1, 10], device=DEV)],
    "negative_index": lambda x: x[torch.tensor([-6], device=DEV)],
    "index_put": lambda x: x.index_put((torch.tensor([7], device=DEV),), torch.zeros(3, device=DEV)),
    "embedding": lambda x: F.embedding(torch.tensor([[7]], device=DEV), x),
    "cross_entropy_target": lambda x: F.cross_entropy(x, torch.tensor([0, 1, 2, 3, 9], device=DEV)),
    "gather": lambda x: torch.gather(x, 1, torch.tensor([[5]], device=DEV)),
    "scatter_add": lambda x: x.scatter_add(0, torch.tensor([[9, 0, 0]], device=DEV), torch.ones(1, 3, device=DEV)),
    "index_select": lambda x: x.index_select(0, torch.tensor([5], device=DEV)),
}


# Eager raises RuntimeError (not IndexError) for gather/scatter indices out of range.
RUNTIME_ERROR_CASES = {"gather", "scatter_add"}


@pytest.mark.parametrize("name", list(CASES))
def test_out_of_range_raises_index_error_at_read(name):
    x = _x()
    with pytest.raises(RuntimeError if name in RUNTIME_ERROR_CASES else IndexError, match="out of|Target"):
        CASES[name](x).cpu()
    # cpu raises too (eager's own message differs in wording, not in type)
    with pytest.raises((IndexError, RuntimeError)):
        CASES[name](x.cpu())
    # The runtime is usable afterwards.
    torch.testing.assert_close((x * 2).cpu(), x.cpu() * 2)


def test_out_of_range_raises_at_next_sync():
    x = _x()
    y = x[torch.tensor([99], device=DEV)] * 2
    torch_xla.sync()  # launches the step; the check's result is read later
    with pytest.raises(IndexError, match="out of bounds for dimension 0 with size 5"):
        torch_xla.sync()
    del y
    torch_xla.sync()  # reported once


def test_in_range_and_ignore_index_pass():
    x = _x()
    cpu = x.cpu()
    torch.testing.assert_close(x[torch.tensor([-1, 4], device=DEV)].cpu(), cpu[torch.tensor([-1, 4])])
    t = torch.tensor([0, 1, -100, 2, 1])
    torch.testing.assert_close(F.cross_entropy(x, t.to(DEV)).cpu(), F.cross_entropy(cpu, t))
    torch_xla.sync(wait=True)
