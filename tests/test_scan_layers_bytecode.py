"""torch_xla.experimental.scan_layers (values and gradients against an eager loop over the layers)
and StableHLO bytecode reload (_XLAC._run_stablehlo with MLIR bytecode and a StableHLO portable
artifact; StableHLOGraphModule saved with bytecode only; upstream's save_as_stablehlo layout)."""
import json
import os

import numpy as np
import pytest
import torch
import torch.nn as nn

import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met

DEV = torch_xla.device()


class _Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.register_buffer("shift", torch.randn(d))

    def forward(self, x):
        return x + torch.tanh(self.norm(self.lin(x))) + self.shift


def test_scan_layers_values_and_gradients():
    from torch_xla.experimental.scan_layers import scan_layers
    torch.manual_seed(0)
    layers = nn.ModuleList([_Block(6) for _ in range(5)])
    x0 = torch.randn(3, 6)
    # eager reference
    x = x0.clone().requires_grad_(True)
    h = x
    for l in layers:
        h = l(h)
    h.pow(2).sum().backward()
    ref_out = h.detach()
    ref_grads = [p.grad.clone() for p in layers.parameters()]
    # on XLA, through one loop
    lx = nn.ModuleList([_Block(6) for _ in range(5)])
    lx.load_state_dict(layers.state_dict())
    lx = lx.to(DEV)
    xx = x0.to(DEV).requires_grad_(True)
    met.clear_counters()
    out = scan_layers(lx, xx)
    out.pow(2).sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xx.grad.cpu(), x.grad, rtol=1e-4, atol=1e-5)
    for p, g in zip(lx.parameters(), ref_grads):
        torch.testing.assert_close(p.grad.cpu(), g, rtol=1e-4, atol=1e-5)
    assert [n for n in met.executed_fallback_ops() if n != "aten::_local_scalar_dense"] == []
    # one While in the graph, not one copy of the block per layer
    with torch.no_grad():
        y = scan_layers(lx, x0.to(DEV))
    text = xm.get_stablehlo([y])
    assert text.count("stablehlo.while") == 1
    torch.testing.assert_close(y.cpu(), ref_out, rtol=1e-5, atol=1e-5)


def test_scan_layers_edge_cases():
    from torch_xla.experimental.scan_layers import scan_layers
    x = torch.randn(2, 4, device=DEV)
    assert scan_layers([], x) is x
    out = scan_layers([nn.ReLU(), nn.Tanh()], x)  # stateless layers: a plain loop
    torch.testing.assert_close(out.cpu(), torch.tanh(torch.relu(x.cpu())))
    with pytest.raises(ValueError, match="layer 1"):
        scan_layers([nn.Linear(4, 4).to(DEV), nn.Linear(4, 4, bias=False).to(DEV)], x)
    with pytest.raises(ValueError, match="layer 1"):
        scan_layers([nn.Linear(4, 4).to(DEV), nn.Linear(4, 4).double().to(DEV)], x)
    with pytest.raises(TypeError):
        scan_layers([lambda t: t], x)


_TEXT = ('module @m {\n  func.func public @main(%arg0: tensor<3xf32>, %arg1: tensor<3xf32>) -> (tensor<3xf32>) {\n'
         '    %0 = stablehlo.multiply %arg0, %arg1 : tensor<3xf32>\n'
         '    %1 = stablehlo.add %0, %arg0 : tensor<3xf32>\n'
         '    return %1 : tensor<3xf32>\n  }\n}\n')


def _bytecode(text):
    from torch_xla.stablehlo import _to_bytecode
    return _to_bytecode(text)


def test_run_stablehlo_bytecode_and_portable_artifact():
    pytest.importorskip("jax")
    X = torch_xla._XLAC
    a, b = torch.arange(3.0).to(DEV), torch.full((3,), 2.0).to(DEV)
    want = torch.arange(3.0) * 2 + torch.arange(3.0)
    bc = _bytecode(_TEXT)
    assert bc[:4] == b"ML\xefR"
    (out,) = X._run_stablehlo(bc, [a, b])
    torch.testing.assert_close(out.cpu(), want)
    (out,) = X._run_stablehlo(bytearray(bc), [a, b])
    torch.testing.assert_close(out.cpu(), want)
    # a StableHLO portable artifact (versioned VHLO bytecode, as jax.export writes it)
    from jax._src.lib.mlir.dialects import hlo
    art = hlo.serialize_portable_artifact_str(_TEXT, hlo.get_minimum_version())
    assert isinstance(art, bytes) and art != bc
    (out,) = X._run_stablehlo(art, [a, b])
    torch.testing.assert_close(out.cpu(), want)
    with pytest.raises(RuntimeError):
        X._run_stablehlo(b"ML\xefR garbage", [a, b])
    with pytest.raises(TypeError):
        X._run_stablehlo(123, [a, b])


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.register_buffer("scale", torch.tensor([1.0, 2.0, 3.0]))

    def forward(self, x):
        return torch.relu(self.fc(x)) * self.scale


def test_stablehlo_graph_module_bytecode_only(tmp_path):
    pytest.importorskip("jax")
    from torch_xla import stablehlo as sh
    torch.manual_seed(0)
    m = _Net()
    x = torch.randn(2, 4)
    ep = torch.export.export(m, (x,))
    path = str(tmp_path / "bc")
    sh.save_as_stablehlo(ep, path, sh.StableHLOExportOptions(include_human_readable_text=False))
    files = sorted(os.listdir(os.path.join(path, "functions")))
    assert "forward.bytecode" in files and "forward.mlir" not in files
    g = sh.StableHLOGraphModule.load(path)
    assert isinstance(g.get_stablehlo_bytecode(), bytes)
    assert "stablehlo.dot_general" in g.get_stablehlo_text() or "stablehlo.dot" in g.get_stablehlo_text()
    x2 = torch.randn(2, 4)
    out = g(x2.to(DEV))
    torch.testing.assert_close(out.cpu(), m(x2).detach(), rtol=1e-5, atol=1e-5)
    # the default save writes both forms; load prefers the text
    path2 = str(tmp_path / "both")
    sh.save_as_stablehlo(ep, path2)
    assert {"forward.bytecode", "forward.mlir"} <= set(os.listdir(os.path.join(path2, "functions")))
    out2 = sh.StableHLOGraphModule.load(path2)(x2)
    torch.testing.assert_close(out2.cpu(), m(x2).detach(), rtol=1e-5, atol=1e-5)


def test_load_upstream_layout(tmp_path):
    """A directory in upstream PyTorch/XLA 2.9's save_as_stablehlo layout, written by hand here:
    functions/forward.meta (JSON), functions/forward.bytecode, data/<name>, constants/<i> (.npy)."""
    pytest.importorskip("jax")
    from torch_xla import stablehlo as sh
    torch.manual_seed(0)
    m = _Net()
    x = torch.randn(2, 4)
    g = sh.exported_program_to_stablehlo(torch.export.export(m, (x,)))
    meta = g.get_meta()
    path = tmp_path / "upstream"
    (path / "functions").mkdir(parents=True)
    (path / "data").mkdir()
    (path / "constants").mkdir()
    for name, t in m.state_dict().items():
        with open(path / "data" / name, "wb") as f:
            np.save(f, t.numpy())
    consts = g._function(None)[2]
    for i, c in enumerate(consts):
        with open(path / "constants" / str(i), "wb") as f:
            np.save(f, c.numpy())
    up_meta = {
        "name": "forward", "stablehlo_version": "1.0.0",
        "input_signature": [{"shape": s.shape, "dtype": s.dtype, "dynamic_dims": []} for s in meta.input_signature],
        "output_signature": [{"shape": s.shape, "dtype": s.dtype, "dynamic_dims": []} for s in meta.output_signature],
        "input_locations": [{"type_": l.type_, "position": l.position, "name": l.name} for l in meta.input_locations],
        "unused_inputs": [], "input_pytree_spec": None, "output_pytree_spec": None,
    }
    (path / "functions" / "forward.meta").write_text(json.dumps(up_meta))
    (path / "functions" / "forward.bytecode").write_bytes(g.get_stablehlo_bytecode())
    loaded = sh.StableHLOGraphModule.load(str(path))
    x2 = torch.randn(2, 4)
    out = loaded(x2.to(DEV))
    assert isinstance(out, list) and len(out) == 1  # no output spec saved: the flat list, as upstream
    torch.testing.assert_close(out[0].cpu(), m(x2).detach(), rtol=1e-5, atol=1e-5)
