"""XLA_USE_BF16 / XLA_USE_F16 (issue #11, set by Lightning's precision="bf16-true" / "16-true"):
float32 tensors are stored and computed in bf16 (f16) on the device, their dtype stays float32 and
they read back as float32 holding bf16 values. Read once per process, so each case runs in a
fresh interpreter."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

CODE = textwrap.dedent('''
    import torch, torch_xla
    import torch_xla.core.xla_model as xm
    d = torch_xla.device()
    x = torch.tensor([1.0, 1.0 / 3, 3.14159265, 1e-3, 70000.0])
    a = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))
    xd, ad = x.to(d), a.to(d)
    y = xd * 1.0001 + 0.1
    m = ad @ ad
    assert xd.dtype == torch.float32 and y.dtype == torch.float32 and m.dtype == torch.float32
    hlo = xm.get_stablehlo([y, m])
    low = torch.{low}
    print("HLO_LOW", ("x" + "{short}" + ">") in hlo and "xf32>" not in hlo)
    print("ROUNDTRIP", torch.equal(xd.cpu(), x.to(low).float()))
    yc, mc = y.cpu(), m.cpu()
    print("HOLDS_LOW", torch.equal(yc, yc.to(low).float()) and torch.equal(mc, mc.to(low).float()))
    ref = (a.to(low).float() @ a.to(low).float())
    print("CLOSE", bool((mc - ref).abs().max() < 0.1 * ref.abs().max()), bool((mc - a @ a).abs().max() > 1e-4))
    print("F64", torch.tensor([1.0 / 3], dtype=torch.float64, device=d).cpu().dtype)
    i = torch.tensor([2**20 + 1], device=d)
    print("INT", (i + 1).cpu().item())
''')


def _run(env_var, low, short):
    env = dict(os.environ)
    for k in ("XLA_USE_BF16", "XLA_USE_F16"):
        env.pop(k, None)
    env[env_var] = "1"
    r = subprocess.run([sys.executable, "-c", CODE.format(low=low, short=short)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-4000:]
    return dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())


def test_xla_use_bf16():
    out = _run("XLA_USE_BF16", "bfloat16", "bf16")
    assert out["HLO_LOW"] == "True"  # the graph computes in bf16
    assert out["ROUNDTRIP"] == "True"  # uploads narrow to bf16, reads widen to float32
    assert out["HOLDS_LOW"] == "True"
    assert out["CLOSE"] == "True True"  # a bf16 matmul: near the float32 one, not equal to it
    assert out["F64"] == "torch.float64"
    assert out["INT"] == str(2**20 + 2)  # integers are untouched


def test_xla_use_f16():
    out = _run("XLA_USE_F16", "float16", "f16")
    assert out["HLO_LOW"] == "True"
    assert out["HOLDS_LOW"] == "True"
    assert out["CLOSE"] == "True True"
