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
    before = (met.metric_data("InputOutputAliasCount") or (0, 0.0))[1]
    ref_losses, ref_state = _train("cpu")
    losses, state = _train(DEV)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-5)
    for k in ref_state:
        torch.testing.assert_close(state[k], ref_state[k], rtol=1e-5, atol=1e-5, msg=lambda m: f"{k}: {m}")
    assert (met.metric_data("InputOutputAliasCount") or (0, 0.0))[1] > before, "parameters were not donated"


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
print("ALIAS", int((met.metric_data("InputOutputAliasCount") or (0, 0.0))[1]), w.cpu()[0].item())
"""
    for env, expect in (({}, True), ({"XLA_ENABLE_PARAM_ALIASING": "0"}, False)):
        e = dict(os.environ, **env)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("ALIAS")][0].split()
        assert (int(line[1]) > 0) == expect, r.stdout
        assert float(line[2]) == 8.0


# ---- explicit donation: torch_xla._XLAC._set_buffer_donation and the buffer-donor config

import contextlib

import pytest

X = torch_xla._XLAC


@contextlib.contextmanager
def _donor_config(on):
    old = X._xla_get_enable_alias_with_buffer_donor_config()
    X._xla_set_enable_alias_with_buffer_donor_config(on)
    try:
        assert X._xla_get_enable_alias_with_buffer_donor_config() == on
        yield
    finally:
        X._xla_set_enable_alias_with_buffer_donor_config(old)


def _aliases():
    return (met.metric_data("InputOutputAliasCount") or (0, 0.0))[1]


def test_set_buffer_donation_marks_only_materialized_tensors():
    t = torch.randn(4, 2).to(DEV)
    before = met.counter_value("XlaSetBufferDonation") or 0
    assert X._get_buffer_donation(t) is False
    assert X._set_buffer_donation(t, True) is True
    assert X._get_buffer_donation(t) is True
    assert met.counter_value("XlaSetBufferDonation") == before + 1
    assert X._set_buffer_donation(t, False) is True and X._get_buffer_donation(t) is False
    pending = t + 1
    assert X._set_buffer_donation(pending, True) is False  # no buffer of its own yet
    with pytest.raises(ValueError):
        X._set_buffer_donation(torch.zeros(2), True)


def test_marked_buffer_is_donated_at_full_sync_and_never_read_again():
    t0 = torch.randn(4, 2, 2)
    t1 = torch.randn(4, 2, 2)
    a, b = t0.to(DEV), t1.to(DEV)
    torch_xla.sync()
    met.clear_all()
    assert X._set_buffer_donation(a, True)
    c = a + b       # a's buffer can become c's
    b += 2          # b's old buffer is donated as upstream's sync donates overwritten inputs
    torch_xla.sync(wait=True)
    assert _aliases() == 2.0
    torch.testing.assert_close(c.cpu(), t0 + t1)
    torch.testing.assert_close(b.cpu(), t1 + 2)
    # a gave its buffer away: it holds no value, and reading it raises clearly (never stale data).
    assert X._is_placecholder(a)
    with pytest.raises(RuntimeError, match="donated"):
        a.cpu()
    with pytest.raises(RuntimeError, match="donated"):
        (a * 2).cpu()


def test_view_of_donated_tensor_raises_at_its_sync():
    with _donor_config(True):
        a = torch.arange(8.0).to(DEV)
        torch_xla.sync()
        assert X._set_buffer_donation(a, True)
        half = a[:4] * 1       # pending, reads a's buffer; not part of the next sync
        out = a * 3
        X._xla_sync_multi([out], [str(DEV)], True, False)  # a's buffer goes to out
        torch.testing.assert_close(out.cpu(), torch.arange(8.0) * 3)
        with pytest.raises(RuntimeError, match="donated"):
            half.cpu()


@pytest.mark.parametrize("config", [True, False])
def test_sync_multi_donates_marked_buffers_only_with_config(config):
    with _donor_config(config):
        t0 = torch.randn(4, 2, 2)
        a, b = t0.to(DEV), torch.randn(4, 2, 2).to(DEV)
        torch_xla.sync()
        met.clear_all()
        assert X._set_buffer_donation(a, True)
        c = a + b
        b += 2
        X._xla_sync_multi([a, b, c], [str(DEV)], True, False)
        assert X._is_placecholder(a) == config
        assert _aliases() == (1.0 if config else 0.0)
        if not config:
            torch.testing.assert_close(a.cpu(), t0)


def test_inplace_marked_tensor_counts_once_and_flag_survives_noop_syncs():
    with _donor_config(True):
        t = torch.randn(4, 2, 2).to(DEV)
        torch_xla.sync()
        assert X._set_buffer_donation(t, True)
        torch_xla.sync()
        assert X._get_buffer_donation(t)  # nothing read it: still marked
        met.clear_all()
        ref = t.cpu()
        t *= 2
        X._xla_sync_multi([t], [str(DEV)], True, False)
        assert _aliases() == 1.0
        torch.testing.assert_close(t.cpu(), ref * 2)


def test_graph_hash_shows_marked_donor_only_under_config():
    x = torch.randn(5, 5).to(DEV)
    torch_xla.sync()
    res = torch.cos(x)
    h0 = X._get_graph_hash([res])
    assert X._set_buffer_donation(x, True)
    assert X._get_graph_hash([res]) == h0
    with _donor_config(True):
        assert X._get_graph_hash([res]) != h0
        assert "tf.aliasing_output" in X._get_xla_tensors_hlo([res])
    X._set_buffer_donation(x, False)


def test_cached_scalar_buffer_is_never_donated():
    t0 = torch.tensor(42.0, device=DEV)
    torch_xla.sync()
    t0.add_(1)
    torch_xla.sync()
    t1 = torch.tensor(42.0, device=DEV)
    torch_xla.sync()
    t1.add_(1)
    torch_xla.sync()
    assert t1.item() == 43.0 and t0.item() == 43.0
