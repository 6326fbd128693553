"""Buffer donation at torch_xla.sync(): inputs a step overwrites (parameters, optimizer state,
running statistics) give their buffers to their new values, and a buffer something else still
references is never donated (its old value stays readable)."""
import os
import subprocess
import sys

import torch
import torch.nn as nn

import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met

DEV = torch_xla.device()


def _train(device, steps=4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 8, generator=g).to(device)
        y = torch.randint(0, 4, (32,), generator=g).to(device)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if device != "cpu":
            torch_xla.sync()
        losses.append(loss.item())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def test_training_with_donation_matches_eager():
    before = met.counter_value("InputOutputAliasCount") or 0
    ref_losses, ref_state = _train("cpu")
    losses, state = _train(DEV)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-5)
    for k in ref_state:
        torch.testing.assert_close(state[k], ref_state[k], rtol=1e-5, atol=1e-5, msg=lambda m: f"{k}: {m}")
    assert (met.counter_value("InputOutputAliasCount") or 0) > before, "parameters were not donated"


def test_shared_buffer_is_not_donated():
    a = torch.zeros(4, device=DEV)
    torch_xla.sync()
    b = a.clone()  # may share a's device buffer after the next sync
    torch_xla.sync()
    a.add_(1)
    torch_xla.sync()
    torch.testing.assert_close(b.cpu(), torch.zeros(4))
    torch.testing.assert_close(a.cpu(), torch.ones(4))


def test_old_values_readable_after_steps():
    w = torch.ones(3, device=DEV)
    torch_xla.sync()
    snapshot = w * 1  # pending, reads w's current buffer
    w.mul_(3)
    torch_xla.sync()  # snapshot is computed in the same graph before w's buffer is reused
    torch.testing.assert_close(snapshot.cpu(), torch.ones(3))
    torch.testing.assert_close(w.cpu(), torch.full((3,), 3.0))
    for _ in range(3):
        w.add_(1)
        xm.mark_step()
    torch.testing.assert_close(w.cpu(), torch.full((3,), 6.0))


def test_aliasing_shows_in_stablehlo_and_can_be_disabled():
    code = """
import torch, torch_xla, torch_xla.debug.metrics as met
d = torch_xla.device()
w = torch.ones(64, device=d); torch_xla.sync()
for _ in range(3):
    w.mul_(2); torch_xla.sync()
print("ALIAS", met.counter_value("InputOutputAliasCount") or 0, w.cpu()[0].item())
"""
    for env, expect in (({}, True), ({"XLA_ENABLE_PARAM_ALIASING": "0"}, False)):
        e = dict(os.environ, **env)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("ALIAS")][0].split()
        assert (int(line[1]) > 0) == expect, r.stdout
        assert float(line[2]) == 8.0
