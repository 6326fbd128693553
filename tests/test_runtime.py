"""Tests of the PJRT runtime layer (torch_xla._core.runtime) and plugin discovery.

No torch here: the extension and plugins.py are loaded without running
torch_xla/__init__.py (see _core_loader.py).
"""

import os

import numpy as np
import pytest

from _core_loader import load_core, load_plugins

_core = load_core()
rt = _core.runtime
plugins = load_plugins()


def _cpu_plugin_path():
    path, canonical = plugins.plugin_for("CPU")
    assert canonical == "CPU"
    return path


@pytest.fixture(scope="module")
def client():
    return rt.Client.create(_cpu_plugin_path())


@pytest.fixture(scope="module")
def client2():
    return rt.Client.create(_cpu_plugin_path(), cpu_device_count=2)


def _binary(op, shape, ty):
    t = f"tensor<{'x'.join(map(str, shape))}{'x' if shape else ''}{ty}>"
    return (
        f"module @m {{ func.func public @main(%a: {t}, %b: {t}) -> {t} {{ "
        f'%0 = "stablehlo.{op}"(%a, %b) : ({t}, {t}) -> {t}  '
        f'"func.return"(%0) : ({t}) -> () }} }}'
    )


ADD_2x3 = _binary("add", (2, 3), "f32")


# ----------------------------------------------------------------- client


def test_client_basics(client):
    assert client.platform_name() == "cpu"
    assert isinstance(client.platform_version(), str)
    major, minor = client.api_version()
    assert major == 0 and minor > 0
    assert client.num_devices() >= 1
    assert client.device_kind(0)
    assert client.device_id(0) == 0
    with pytest.raises(IndexError):
        client.device_id(client.num_devices())


def test_missing_plugin_path_names_the_path():
    with pytest.raises(RuntimeError, match="/no/such/dir/plugin.so"):
        rt.Client.create("/no/such/dir/plugin.so")


def test_not_a_plugin():
    not_a_plugin = _core.__file__  # a shared object without GetPjrtApi
    with pytest.raises(RuntimeError, match="GetPjrtApi") as info:
        rt.Client.create(not_a_plugin)
    assert not_a_plugin in str(info.value)


# ------------------------------------------------------------ round trips

SHAPES = [(), (0,), (2, 0, 3), (5,), (2, 3), (2, 3, 4)]
DTYPES = [
    (np.float16, "f16"),
    (np.float32, "f32"),
    (np.float64, "f64"),
    (np.int8, "i8"),
    (np.int16, "i16"),
    (np.int32, "i32"),
    (np.int64, "i64"),
    (np.uint8, "ui8"),
    (np.uint16, "ui16"),
    (np.uint32, "ui32"),
    (np.uint64, "ui64"),
    (np.bool_, "i1"),
    (np.complex64, "complex<f32>"),
    (np.complex128, "complex<f64>"),
]


def _sample(dtype, shape):
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == np.bool_:
        return (np.arange(n) % 3 == 0).reshape(shape)
    if np.issubdtype(dtype, np.complexfloating):
        return (np.arange(n) - 1.5j * np.arange(n)).astype(dtype).reshape(shape)
    if np.issubdtype(dtype, np.signedinteger):
        return (np.arange(n) * 7 - 11).astype(dtype).reshape(shape)
    return (np.arange(n) * 3 + 1).astype(dtype).reshape(shape)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype,name", DTYPES, ids=[n for _, n in DTYPES])
def test_round_trip(client, dtype, name, shape):
    host = _sample(dtype, shape)
    buf = client.to_device(host)
    assert buf.type_name() == name
    assert buf.dims() == list(shape)
    back = buf.to_numpy()
    assert back.dtype == host.dtype
    assert back.shape == host.shape
    np.testing.assert_array_equal(back, host)
    assert buf.to_bytes() == host.tobytes()


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_bf16(client, shape):
    values = (np.arange(int(np.prod(shape, dtype=np.int64))) * 0.5 - 2).astype(np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)  # exact in bf16
    buf = client.to_device_raw(bits.tobytes(), "bf16", list(shape))
    assert buf.type_name() == "bf16"
    assert buf.dims() == list(shape)
    raw = buf.to_bytes()
    assert raw == bits.tobytes()
    restored = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(restored, values)
    with pytest.raises(TypeError, match="to_bytes"):
        buf.to_numpy()


def test_to_device_raw_size_mismatch(client):
    with pytest.raises(ValueError):
        client.to_device_raw(b"\x00" * 3, "bf16", [2])


def test_non_contiguous_and_byte_swapped(client):
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(client.to_device(host.T).to_numpy(), host.T)
    swapped = host.astype(host.dtype.newbyteorder(">"))
    np.testing.assert_array_equal(client.to_device(swapped).to_numpy(), host)


def test_scalars_and_lists(client):
    np.testing.assert_array_equal(client.to_device(np.float32(3)).to_numpy(), np.float32(3))
    buf = client.to_device([1, 2, 3])
    assert buf.dims() == [3]
    np.testing.assert_array_equal(buf.to_numpy(), [1, 2, 3])


def test_unsupported_dtype(client):
    with pytest.raises(TypeError):
        client.to_device(np.array(["a", "b"]))


def test_buffer_keeps_client_alive():
    c = rt.Client.create(_cpu_plugin_path())
    buf = c.to_device(np.arange(4, dtype=np.int32))
    del c
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(4, dtype=np.int32))


# ------------------------------------------------------- compile + execute


def test_compile_and_execute_add(client):
    exe = client.compile(ADD_2x3)
    assert exe.num_outputs() == 1
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((2, 3), 0.25, dtype=np.float32)
    (out,) = client.execute(exe, [client.to_device(a), client.to_device(b)])
    assert out.dims() == [2, 3] and out.type_name() == "f32"
    np.testing.assert_array_equal(out.to_numpy(), a + b)


@pytest.mark.parametrize("op,ty,dtype,ref", [
    ("multiply", "i32", np.int32, np.multiply),
    ("subtract", "f64", np.float64, np.subtract),
    ("and", "i1", np.bool_, np.logical_and),
])
def test_elementwise_ops(client, op, ty, dtype, ref):
    exe = client.compile(_binary(op, (4,), ty).encode())  # bytes are accepted too
    a = _sample(dtype, (4,))
    b = _sample(dtype, (4,))[::-1].copy()
    (out,) = client.execute(exe, [client.to_device(a), client.to_device(b)])
    np.testing.assert_array_equal(out.to_numpy(), ref(a, b))


def test_multiple_outputs(client):
    mlir = (
        "module @m { func.func public @main(%a: tensor<3xf32>) -> (tensor<3xf32>, tensor<3xf32>) { "
        '%0 = "stablehlo.add"(%a, %a) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>  '
        '%1 = "stablehlo.multiply"(%a, %a) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>  '
        '"func.return"(%0, %1) : (tensor<3xf32>, tensor<3xf32>) -> () } }'
    )
    exe = client.compile(mlir)
    assert exe.num_outputs() == 2
    a = np.array([1, 2, 3], dtype=np.float32)
    s, p = client.execute(exe, [client.to_device(a)])
    np.testing.assert_array_equal(s.to_numpy(), a + a)
    np.testing.assert_array_equal(p.to_numpy(), a * a)


def test_invalid_stablehlo_raises_with_compiler_message(client):
    bad = (
        "module @m { func.func public @main() -> tensor<f32> { "
        '%0 = "stablehlo.no_such_op"() : () -> tensor<f32>  "func.return"(%0) : (tensor<f32>) -> () } }'
    )
    with pytest.raises(RuntimeError, match="stablehlo.no_such_op"):
        client.compile(bad)
    with pytest.raises(RuntimeError, match="compile"):
        client.compile("this is not MLIR")


def test_wrong_argument_count_and_shape(client):
    exe = client.compile(ADD_2x3)
    a = client.to_device(np.zeros((2, 3), np.float32))
    with pytest.raises(RuntimeError, match="expected 2"):
        client.execute(exe, [a])
    with pytest.raises(RuntimeError):
        client.execute(exe, [a, client.to_device(np.zeros((3, 3), np.float32))])
    # still usable afterwards
    (out,) = client.execute(exe, [a, a])
    np.testing.assert_array_equal(out.to_numpy(), np.zeros((2, 3), np.float32))


def test_serialize_deserialize(client):
    exe = client.compile(ADD_2x3)
    data = client.serialize(exe)
    assert isinstance(data, bytes) and len(data) > 0
    exe2 = client.deserialize(data)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    (out,) = client.execute(exe2, [client.to_device(a), client.to_device(a)])
    np.testing.assert_array_equal(out.to_numpy(), a + a)


# --------------------------------------------------------- compile options


def test_encode_compile_options_minimal():
    assert rt.encode_compile_options() == b"\x1a\x04\x20\x01\x28\x01"
    assert rt.encode_compile_options(1, 1) == b"\x1a\x04\x20\x01\x28\x01"


def test_encode_compile_options_device_assignment():
    # build options: num_replicas=2, num_partitions=1, device_assignment {
    #   replica_count=2, computation_count=1, computation_devices { replica_device_ids: [0, 1] } }
    expected = bytes.fromhex("1a10" "2002" "2801" "4a0a" "0802" "1001" "1a04" "0a020001")
    assert rt.encode_compile_options(2, 1, [[0], [1]]) == expected
    # spmd flag is field 6
    assert rt.encode_compile_options(1, 2, use_spmd_partitioning=True) == bytes.fromhex("1a06200128023001")
    with pytest.raises(ValueError):
        rt.encode_compile_options(2, 1, [[0]])
    with pytest.raises(ValueError):
        rt.encode_compile_options(0, 1)


# ----------------------------------------------------------- two devices


def test_two_cpu_devices(client2):
    assert client2.num_devices() == 2
    assert [client2.device_id(i) for i in range(2)] == [0, 1]
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b1 = client2.to_device(a, device_index=1)
    assert b1.device_id() == 1
    np.testing.assert_array_equal(b1.to_numpy(), a)

    # An executable for device 1 is compiled with device_assignment {{1}}.
    exe = client2.compile(ADD_2x3, device_assignment=[[client2.device_id(1)]])
    (out,) = client2.execute(exe, [b1, b1], device_index=1)
    assert out.device_id() == 1
    np.testing.assert_array_equal(out.to_numpy(), a + a)

    # Serialized executables keep their device assignment.
    exe2 = client2.deserialize(client2.serialize(exe))
    (out2,) = client2.execute(exe2, [b1, b1], device_index=1)
    assert out2.device_id() == 1

    # The CPU plugin refuses to run a device-0 executable on device 1: an error, not an abort.
    exe0 = client2.compile(ADD_2x3)
    with pytest.raises(RuntimeError):
        client2.execute(exe0, [b1, b1], device_index=1)


def test_execute_replicated(client2):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    exe = client2.compile(ADD_2x3, num_replicas=2, device_assignment=[[0], [1]])
    args = [[client2.to_device(a, d), client2.to_device(a * (d + 1), d)] for d in range(2)]
    outs = client2.execute_replicated(exe, args, [0, 1])
    assert len(outs) == 2
    for d, (out,) in enumerate(outs):
        assert out.device_id() == d
        np.testing.assert_array_equal(out.to_numpy(), a + a * (d + 1))


# -------------------------------------------------------------- plugins.py


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("PJRT_DEVICE", "PJRT_PLUGIN_LIBRARY_PATH", "TORCH_XLA_PLUGIN_PATH",
                "TPU_LIBRARY_PATH", "CPU_NUM_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_plugins_default_is_cpu(clean_env):
    assert plugins.device_type_from_env() == "CPU"
    path, canonical = plugins.plugin_for(None)
    assert canonical == "CPU"
    assert os.path.isfile(path) and path.endswith("xla_cpu_pjrt.so")


def test_plugins_cpu_resolves(clean_env):
    clean_env.setenv("PJRT_DEVICE", "cpu")
    assert plugins.device_type_from_env() == "CPU"
    path, canonical = plugins.plugin_for("cpu")
    assert canonical == "CPU" and os.path.isfile(path)


def test_plugins_unknown_device(clean_env):
    clean_env.setenv("PJRT_DEVICE", "FOO")
    with pytest.raises(ValueError, match="FOO") as info:
        plugins.device_type_from_env()
    assert "CPU" in str(info.value)
    with pytest.raises(ValueError, match="FOO"):
        plugins.plugin_for("FOO")


def test_plugins_missing_cuda(clean_env):
    clean_env.setattr(plugins, "_locate", lambda candidate: None)
    clean_env.setenv("PJRT_DEVICE", "GPU")
    assert plugins.device_type_from_env() == "CUDA"
    with pytest.raises(RuntimeError, match="pip install"):
        plugins.plugin_for("GPU")
    with pytest.raises(RuntimeError, match="pip install libtpu"):
        plugins.plugin_for("TPU")


def test_plugins_override(clean_env, tmp_path):
    so = tmp_path / "my_plugin.so"
    so.write_bytes(b"")
    clean_env.setenv("PJRT_PLUGIN_LIBRARY_PATH", str(so))
    clean_env.setenv("PJRT_DEVICE", "neuron")
    assert plugins.device_type_from_env() == "NEURON"
    assert plugins.plugin_for("neuron") == (str(so), "NEURON")
    clean_env.delenv("PJRT_PLUGIN_LIBRARY_PATH")
    clean_env.setenv("TORCH_XLA_PLUGIN_PATH", str(tmp_path / "missing.so"))
    with pytest.raises(RuntimeError, match="missing.so"):
        plugins.plugin_for("CPU")


def test_plugins_cpu_device_count(clean_env):
    assert plugins.cpu_device_count() == 1 == plugins.DEFAULT_CPU_DEVICES
    clean_env.setenv("CPU_NUM_DEVICES", "4")
    assert plugins.cpu_device_count() == 4
    for bad in ("two", "0", "-3"):
        clean_env.setenv("CPU_NUM_DEVICES", bad)
        with pytest.raises(ValueError, match="CPU_NUM_DEVICES"):
            plugins.cpu_device_count()


def test_client_create_options_reach_the_plugin():
    """Named create options travel to the plugin as typed PJRT values (the CPU plugin reads
    cpu_device_count from them and ignores names it doesn't know)."""
    assert rt.Client.create(_cpu_plugin_path(), options={"no_such_option": [1, 2], "s": "x",
                                                         "f": 0.5, "b": True}).num_devices() >= 1
    with pytest.raises(TypeError, match="list value must hold ints"):
        rt.Client.create(_cpu_plugin_path(), options={"visible_devices": [1.5]})
    c = rt.Client.create(_cpu_plugin_path(), options={"cpu_device_count": 3})
    assert c.num_devices() == 3


def test_cuda_client_options_from_env(clean_env):
    for var in ("PJRT_ALLOCATOR_PREALLOCATE", "XLA_PYTHON_CLIENT_PREALLOCATE", "PJRT_ALLOCATOR_FRACTION",
                "XLA_PYTHON_CLIENT_MEM_FRACTION", "PJRT_ALLOCATOR_CUDA_ASYNC", "WORLD_SIZE", "LOCAL_RANK",
                "TORCH_XLA_SPAWNED", "GPU_NUM_DEVICES"):
        clean_env.delenv(var, raising=False)
    assert plugins.client_options("CPU") == {}
    assert plugins.client_options("CUDA") == {"preallocate": False}  # torch's CUDA tensors fit beside ours
    clean_env.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
    clean_env.setenv("PJRT_ALLOCATOR_PREALLOCATE", "1")
    clean_env.setenv("GPU_NUM_DEVICES", "2")
    assert plugins.client_options("CUDA") == {"preallocate": True, "memory_fraction": 0.5,
                                              "visible_devices": [0, 1]}
    clean_env.setenv("WORLD_SIZE", "4")  # a torchrun worker sees its own GPU
    clean_env.setenv("LOCAL_RANK", "3")
    assert plugins.client_options("CUDA")["visible_devices"] == [3]
    clean_env.setenv("TORCH_XLA_SPAWNED", "1")  # xmp.spawn narrowed CUDA_VISIBLE_DEVICES already
    assert "visible_devices" not in plugins.client_options("CUDA")
    clean_env.setenv("PJRT_ALLOCATOR_FRACTION", "1.5")
    with pytest.raises(ValueError, match="PJRT_ALLOCATOR_FRACTION"):
        plugins.client_options("CUDA")


def test_cpu_plugin_choice(clean_env, tmp_path):
    clean_env.delenv("TORCH_XLA_CPU_PLUGIN", raising=False)
    installed = plugins.cpu_plugins()
    assert "xla-cpu-pjrt" in installed  # scripts/setup.sh installs it: the default
    assert plugins.plugin_for("CPU")[0] == installed["xla-cpu-pjrt"]
    clean_env.setenv("TORCH_XLA_CPU_PLUGIN", "xla_cpu_pjrt")
    assert plugins.plugin_for("CPU")[0] == installed["xla-cpu-pjrt"]
    so = tmp_path / "my_cpu_plugin.so"
    so.write_bytes(b"")
    clean_env.setenv("TORCH_XLA_CPU_PLUGIN", str(so))
    assert plugins.plugin_for("CPU") == (str(so), "CPU")
    clean_env.setenv("TORCH_XLA_CPU_PLUGIN", "no-such-plugin")
    with pytest.raises(ValueError, match="TORCH_XLA_CPU_PLUGIN"):
        plugins.plugin_for("CPU")
    for other in ("lammps-jax-pjrt-cpu", "fastatomstruct-xla-cpu"):
        if other not in installed:
            clean_env.setenv("TORCH_XLA_CPU_PLUGIN", other)
            with pytest.raises(RuntimeError, match="not installed"):
                plugins.plugin_for("CPU")
