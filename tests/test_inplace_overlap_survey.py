"""Issue #7: every in-place op refuses an operand overlapping the written-to tensor exactly where
eager CPU does. The survey (scripts/enum_inplace_overlap.py) calls each aten in-place overload
that has a written `self` and another tensor operand with a partially overlapping operand and with
`self` itself, on eager CPU and on XLA, and compares the outcomes."""
import importlib.util
import os

import pytest
import torch

import torch_xla

_PATH = os.path.join(os.path.dirname(__file__), "..", "scripts", "enum_inplace_overlap.py")


def _survey_module():
    spec = importlib.util.spec_from_file_location("enum_inplace_overlap", _PATH)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_every_inplace_overload_checks_overlap_as_eager():
    m = _survey_module()
    m.DEV = "cpu"
    cpu = m.survey()
    m.DEV = torch_xla.device()
    xla = m.survey()
    called = [k for k, v in cpu.items() if "skip" not in v]
    raising = [k for k in called if "OVL" in cpu[k].values()]
    assert len(called) >= 85 and len(raising) >= 70, (len(called), len(raising))  # the survey reaches them
    # set_ with a storage offset is refused here for another reason (see README, known gaps).
    diff = {k: (cpu[k], xla.get(k)) for k in called if cpu[k] != xla.get(k) and not k.startswith("set_.")}
    assert not diff, diff


@pytest.mark.parametrize("name", ["addr_", "_add_relu_", "bernoulli_", "_index_put_impl_"])
def test_added_inplace_overlap_checks(name):
    """The four overloads the survey found unchecked (values compared where eager accepts)."""
    def run(d):
        base = torch.tensor([0.5, 0.25, 0.75, 0.5, 0.125, 0.5], device=d)
        if name == "addr_":
            base[:4].view(2, 2).addr_(base[1:3], base[3:5])
        elif name == "_add_relu_":
            torch.ops.aten._add_relu_(base[:3], base[1:4])
        elif name == "bernoulli_":
            base[:3].bernoulli_(base[1:4])
        else:
            torch.ops.aten._index_put_impl_(base[:3], (torch.tensor([0, 1], device=d),), base[1:3])
        return base
    with pytest.raises(RuntimeError, match="refer to a single memory location") as e:
        run("cpu")
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        run(torch_xla.device())
