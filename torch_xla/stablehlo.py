"""torch_xla.stablehlo: export PyTorch programs to StableHLO, save them, load and run them again.

``exported_program_to_stablehlo(torch.export.export(model, args))`` runs the exported graph's aten
ops once on the XLA device (lazily: nothing executes) and lowers the result to one StableHLO
function ``main`` whose arguments are, in order: the program's parameters/buffers/constants that
the graph reads, its tensor user inputs (flattened as ``torch.export`` does), then any other
device data the graph reads (cached scalar inputs), saved with the program. The returned
:class:`StableHLOGraphModule` runs that StableHLO (compiled by XLA through PJRT) when called, and
``save(dir)`` / ``StableHLOGraphModule.load(dir)`` write and read it::

    dir/manifest.json                 format, function names
    dir/functions/forward.mlir        StableHLO text (MLIR generic form)
    dir/functions/forward.bytecode    the same program as MLIR bytecode (when jax/jaxlib is installed,
                                      or the only form with include_human_readable_text=False)
    dir/functions/forward.meta.json   argument / result signature, argument sources, pytree specs
    dir/functions/forward.constants.pt  extra device data the function reads
    dir/data/weights.pt               the parameters and buffers (``save_weights=True``)

The directory is written next to its destination and renamed into place. ``load`` runs the
text when present, else the bytecode (PJRT's compiler takes MLIR bytecode and StableHLO portable
artifacts as well as text). It also reads upstream PyTorch/XLA's ``save_as_stablehlo`` layout
(``functions/<name>.meta`` JSON, ``functions/<name>.bytecode``, ``data/<weight>`` and
``constants/<i>`` numpy files).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.utils._pytree as pytree

_FORMAT = "torch_xla.stablehlo/1"

__all__ = ["StableHLOExportOptions", "StableHLOGraphModule", "VariableSignature", "InputLocation",
           "StableHLOFunctionMeta", "exported_program_to_stablehlo", "save_as_stablehlo",
           "save_torch_model_as_stablehlo", "load"]


@dataclasses.dataclass
class StableHLOExportOptions:
    """Options of the export.

    Attributes:
      include_human_readable_text: also write the StableHLO text (``.mlir``) next to the bytecode;
        ``False`` writes the bytecode only (needs jax/jaxlib's MLIR bytecode writer).
      override_tracing_arguments: positional arguments to trace with instead of the exported
        program's example inputs.
      override_tracing_kwargs: keyword arguments to trace with.
      save_weights: write the parameters and buffers into the saved directory.
    """
    include_human_readable_text: bool = True
    override_tracing_arguments: Optional[Tuple[Any, ...]] = None
    override_tracing_kwargs: Optional[Dict[str, Any]] = None
    save_weights: bool = True


@dataclasses.dataclass
class VariableSignature:
    shape: List[int]
    dtype: str


@dataclasses.dataclass
class InputLocation:
    """Where a StableHLO argument comes from: ``parameter`` (``name`` in the state dict),
    ``input_arg`` (``position`` among the flattened user inputs) or ``constant`` (``position`` in
    the function's saved constants)."""
    type_: str
    position: int = -1
    name: str = ""


@dataclasses.dataclass
class StableHLOFunctionMeta:
    name: str
    input_signature: List[VariableSignature]
    output_signature: List[VariableSignature]
    input_locations: List[InputLocation]
    in_spec: str = ""   # pytree spec of (args, kwargs)
    out_spec: str = ""  # pytree spec of the user outputs
    num_user_outputs: int = 0
    mutated_buffers: List[str] = dataclasses.field(default_factory=list)  # state names, after user outputs

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d: dict) -> "StableHLOFunctionMeta":
        d = dict(d)
        d["input_signature"] = [VariableSignature(**v) for v in d["input_signature"]]
        d["output_signature"] = [VariableSignature(**v) for v in d["output_signature"]]
        d["input_locations"] = [InputLocation(**v) for v in d["input_locations"]]
        return StableHLOFunctionMeta(**d)


def _to_bytecode(text: str) -> bytes:
    """MLIR bytecode of StableHLO text (MLIR's bytecode writer from jax/jaxlib)."""
    try:
        import io
        from jax._src.interpreters import mlir as _jmlir
        from jax._src.lib.mlir import ir as _ir
    except ImportError as e:
        raise RuntimeError("StableHLO bytecode needs MLIR's bytecode writer from jax/jaxlib: "
                           "pip install jax jaxlib") from e
    buf = io.BytesIO()
    with _jmlir.make_ir_context():
        _ir.Module.parse(text).operation.write_bytecode(buf)
    return buf.getvalue()


def _to_text(program) -> str:
    """StableHLO text of a program held as text or MLIR bytecode (read back with jax/jaxlib's MLIR)."""
    if isinstance(program, str):
        return program
    try:
        from jax._src.interpreters import mlir as _jmlir
        from jax._src.lib.mlir import ir as _ir
    except ImportError as e:
        raise RuntimeError("this program was loaded from bytecode only; printing it as text needs jax/jaxlib's "
                           "MLIR: pip install jax jaxlib") from e
    with _jmlir.make_ir_context():
        return _ir.Module.parse(program).operation.get_asm(enable_debug_info=False)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _signature(t: torch.Tensor) -> VariableSignature:
    return VariableSignature(list(t.shape), _dtype_name(t.dtype))


class StableHLOGraphModule:
    """A program lowered to StableHLO: call it like the original module (runs the StableHLO on
    the XLA device), inspect it with ``get_stablehlo_text()``, save it with ``save(dir)``."""

    def __init__(self, functions: Dict[str, Tuple[StableHLOFunctionMeta, str, List[torch.Tensor]]],
                 state_dict: Optional[Dict[str, torch.Tensor]], default_method: str = "forward"):
        self._functions = functions
        self._state = {k: v.detach().cpu() for k, v in (state_dict or {}).items()}
        self._has_weights = state_dict is not None
        self._default_method = default_method
        self._device_cache: Dict[Tuple[str, int], torch.Tensor] = {}

    # ---- inspection
    def get_stablehlo_text(self, method_name: Optional[str] = None) -> str:
        return _to_text(self._function(method_name)[1])

    def get_stablehlo_bytecode(self, method_name: Optional[str] = None) -> bytes:
        program = self._function(method_name)[1]
        return program if isinstance(program, bytes) else _to_bytecode(program)

    def get_meta(self, method_name: Optional[str] = None) -> StableHLOFunctionMeta:
        return self._function(method_name)[0]

    @property
    def method_names(self) -> List[str]:
        return list(self._functions)

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """The weights and buffers (CPU tensors; buffers as updated by the calls so far)."""
        return {k: v.cpu() for k, v in self._state.items()}

    def _function(self, method_name: Optional[str]):
        name = method_name or self._default_method
        if name not in self._functions:
            raise KeyError(f"no StableHLO function {name!r}; available: {sorted(self._functions)}")
        return self._functions[name]

    # ---- running
    def __call__(self, *args, **kwargs):
        return self.call(self._default_method, *args, **kwargs)

    def call(self, method_name: str, *args, **kwargs):
        from torch_xla import _C
        import torch_xla
        meta, text, constants = self._function(method_name)
        flat, spec = pytree.tree_flatten((args, kwargs))
        if meta.in_spec and pytree.treespec_dumps(spec) != meta.in_spec:
            raise ValueError(f"{method_name}: the arguments' structure differs from the exported one "
                             f"(expected {meta.in_spec}, got {pytree.treespec_dumps(spec)})")
        device = None
        for v in flat:
            if isinstance(v, torch.Tensor) and v.device.type == "xla":
                device = v.device
                break
        if device is None:
            device = torch_xla.device()
        call_args = []
        for i, loc in enumerate(meta.input_locations):
            sig = meta.input_signature[i]
            if loc.type_ == "parameter":
                if loc.name not in self._state:
                    raise RuntimeError(f"{method_name}: weight {loc.name!r} is not available (the program was "
                                       "saved with save_weights=False)")
                t = self._on_device(("w:" + loc.name, device.index or 0), self._state[loc.name], device)
            elif loc.type_ == "constant":
                t = self._on_device((f"c:{method_name}:{loc.position}", device.index or 0), constants[loc.position],
                                    device)
            else:
                if loc.position >= len(flat) or not isinstance(flat[loc.position], torch.Tensor):
                    raise ValueError(f"{method_name}: argument {loc.position} must be a tensor")
                t = flat[loc.position]
                if t.device != device:
                    t = t.to(device)
            if list(t.shape) != list(sig.shape) or _dtype_name(t.dtype) != sig.dtype:
                raise ValueError(f"{method_name}: argument {i} ({loc.type_} {loc.name or loc.position}) must be "
                                 f"{sig.dtype}{sig.shape}, got {_dtype_name(t.dtype)}{list(t.shape)}")
            call_args.append(t)
        outs = _C._run_stablehlo(text, call_args, device.index or 0)
        user = outs[:meta.num_user_outputs]
        for name, value in zip(meta.mutated_buffers, outs[meta.num_user_outputs:]):
            # updated buffers stay on the device (no host read); state_dict() copies them back
            self._state[name] = value
            self._device_cache = {k: v for k, v in self._device_cache.items() if k[0] != "w:" + name}
            self._device_cache[("w:" + name, device.index or 0)] = value
        if not meta.out_spec:
            return list(user)
        return pytree.tree_unflatten(list(user), pytree.treespec_loads(meta.out_spec))

    def _on_device(self, key, cpu: torch.Tensor, device: torch.device) -> torch.Tensor:
        t = self._device_cache.get(key)
        if t is None:
            t = cpu.to(device)
            self._device_cache[key] = t
        return t

    # ---- saving
    def save(self, directory: str, options: Optional[StableHLOExportOptions] = None) -> None:
        """Writes the program into ``directory`` (replaced if it exists)."""
        options = options or StableHLOExportOptions()
        directory = os.path.abspath(os.fspath(directory))
        tmp = f"{directory}.tmp.{os.getpid()}"
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        os.makedirs(os.path.join(tmp, "functions"))
        os.makedirs(os.path.join(tmp, "data"))
        try:
            for name, (meta, program, constants) in self._functions.items():
                if isinstance(program, str) and options.include_human_readable_text:
                    with open(os.path.join(tmp, "functions", f"{name}.mlir"), "w") as f:
                        f.write(program)
                    try:
                        bytecode = _to_bytecode(program)
                    except RuntimeError:
                        bytecode = None  # no jax/jaxlib: the text is enough to run it again
                else:
                    bytecode = program if isinstance(program, bytes) else _to_bytecode(program)
                if bytecode is not None:
                    with open(os.path.join(tmp, "functions", f"{name}.bytecode"), "wb") as f:
                        f.write(bytecode)
                with open(os.path.join(tmp, "functions", f"{name}.meta.json"), "w") as f:
                    json.dump(meta.to_json(), f, indent=1)
                torch.save([c.cpu() for c in constants], os.path.join(tmp, "functions", f"{name}.constants.pt"))
            weights = options.save_weights and self._has_weights
            if weights:
                torch.save(self.state_dict(), os.path.join(tmp, "data", "weights.pt"))
            with open(os.path.join(tmp, "manifest.json"), "w") as f:
                json.dump({"format": _FORMAT, "functions": list(self._functions),
                           "default_method": self._default_method, "weights": bool(weights)}, f, indent=1)
            old = None
            if os.path.exists(directory):
                old = f"{directory}.old.{os.getpid()}"
                os.replace(directory, old)
            os.replace(tmp, directory)
            if old:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @staticmethod
    def load(directory: str) -> "StableHLOGraphModule":
        """Reads a program written by :meth:`save` / :func:`save_as_stablehlo`."""
        directory = os.fspath(directory)
        manifest_path = os.path.join(directory, "manifest.json")
        if not os.path.isfile(manifest_path):
            if os.path.isdir(os.path.join(directory, "functions")):
                return _load_upstream_layout(directory)
            raise FileNotFoundError(f"{directory!r} holds no saved StableHLO program (no manifest.json)")
        with open(manifest_path) as f:
            manifest = json.load(f)
        if manifest.get("format") != _FORMAT:
            raise ValueError(f"{directory!r}: unknown format {manifest.get('format')!r}")
        functions = {}
        for name in manifest["functions"]:
            base = os.path.join(directory, "functions", name)
            if os.path.isfile(base + ".mlir"):
                with open(base + ".mlir") as f:
                    program = f.read()
            elif os.path.isfile(base + ".bytecode"):
                with open(base + ".bytecode", "rb") as f:
                    program = f.read()
            else:
                raise FileNotFoundError(f"{directory!r}: function {name!r} has neither {name}.mlir nor {name}.bytecode")
            with open(base + ".meta.json") as f:
                meta = StableHLOFunctionMeta.from_json(json.load(f))
            constants = torch.load(base + ".constants.pt", weights_only=True)
            functions[name] = (meta, program, constants)
        state = None
        if manifest.get("weights"):
            state = torch.load(os.path.join(directory, "data", "weights.pt"), weights_only=True)
        return StableHLOGraphModule(functions, state, manifest.get("default_method", "forward"))


def _load_numpy(path: str) -> torch.Tensor:
    import numpy as np
    with open(path, "rb") as f:
        return torch.from_numpy(np.array(np.load(f, allow_pickle=False)))


def _load_upstream_layout(directory: str) -> StableHLOGraphModule:
    """Upstream PyTorch/XLA's save_as_stablehlo directory: functions/<name>.meta (JSON of its
    StableHLOFunctionMeta), functions/<name>.bytecode (and optionally .mlir), data/<weight name> and
    constants/<i> (numpy .npy files)."""
    fdir = os.path.join(directory, "functions")
    names = sorted(n[:-len(".meta")] for n in os.listdir(fdir) if n.endswith(".meta"))
    if not names:
        raise FileNotFoundError(f"{directory!r}: no functions/<name>.meta (neither this build's nor upstream's layout)")
    constants = []
    cdir = os.path.join(directory, "constants")
    if os.path.isdir(cdir):
        idx = sorted(int(n) for n in os.listdir(cdir) if n.isdigit())
        constants = [_load_numpy(os.path.join(cdir, str(i))) for i in idx]
    state = None
    ddir = os.path.join(directory, "data")
    if os.path.isdir(ddir):
        state = {n: _load_numpy(os.path.join(ddir, n)) for n in os.listdir(ddir)}
    functions = {}
    for name in names:
        with open(os.path.join(fdir, name + ".meta")) as f:
            m = json.load(f)

        def sig(v):
            return VariableSignature(list(v["shape"]), str(v["dtype"]))

        locs = [InputLocation(str(l["type_"]), int(l.get("position", -1)), str(l.get("name", "")))
                for l in m["input_locations"]]
        outs = [sig(v) for v in m["output_signature"]]
        meta = StableHLOFunctionMeta(name=m.get("name", name), input_signature=[sig(v) for v in m["input_signature"]],
                                     output_signature=outs, input_locations=locs, in_spec="",
                                     out_spec=m.get("output_pytree_spec") or "", num_user_outputs=len(outs))
        base = os.path.join(fdir, name)
        if os.path.isfile(base + ".bytecode"):
            with open(base + ".bytecode", "rb") as f:
                program = f.read()
        else:
            with open(base + ".mlir") as f:
                program = f.read()
        functions[name] = (meta, program, constants)
    default = "forward" if "forward" in functions else names[0]
    return StableHLOGraphModule(functions, state, default)


def load(directory: str) -> StableHLOGraphModule:
    return StableHLOGraphModule.load(directory)


def _example_inputs(exported_model, options: StableHLOExportOptions):
    if options.override_tracing_arguments is not None or options.override_tracing_kwargs is not None:
        return tuple(options.override_tracing_arguments or ()), dict(options.override_tracing_kwargs or {})
    example = getattr(exported_model, "example_inputs", None)
    if example is None:
        raise ValueError("the exported program carries no example inputs: pass "
                         "StableHLOExportOptions(override_tracing_arguments=...)")
    args, kwargs = example
    return tuple(args), dict(kwargs or {})


def exported_program_to_stablehlo(exported_model, options: Optional[StableHLOExportOptions] = None
                                  ) -> StableHLOGraphModule:
    """Lowers a ``torch.export.ExportedProgram`` to a :class:`StableHLOGraphModule`.

    The program is portable StableHLO: host kernels (this process's ATen CPU custom calls, see the
    README) are off while it is traced."""
    from torch_xla import _C
    kinds, reductions, norms = _C._host_kernels(), _C._host_reductions(), _C._host_norms()
    big_dots = _C._host_big_dots()
    _C._set_host_kernels(False, False)
    _C._set_host_reductions(False)
    _C._set_host_norms(False)
    _C._set_host_big_dots(False)
    try:
        return _exported_program_to_stablehlo(exported_model, options)
    finally:
        _C._set_host_kernels(*kinds)
        _C._set_host_reductions(reductions)
        _C._set_host_norms(norms)
        _C._set_host_big_dots(big_dots)


def _exported_program_to_stablehlo(exported_model, options):
    from torch.export import ExportedProgram
    from torch.export.graph_signature import InputKind, OutputKind
    from torch_xla import _C
    import torch_xla

    if not isinstance(exported_model, ExportedProgram):
        raise TypeError(f"expected a torch.export.ExportedProgram, got {type(exported_model).__name__}")
    options = options or StableHLOExportOptions()
    args, kwargs = _example_inputs(exported_model, options)
    # A functional graph: in-place updates (running statistics, counters) become outputs.
    exported_model = exported_model.run_decompositions({})
    device = torch_xla.device()
    flat_user, in_spec = pytree.tree_flatten((args, kwargs))
    sig = exported_model.graph_signature
    state = dict(exported_model.state_dict)
    constants_map = dict(exported_model.constants)

    placeholder_values = []
    xla_inputs: List[torch.Tensor] = []
    locations: List[InputLocation] = []
    user_i = 0
    state_for_save: Dict[str, torch.Tensor] = {}
    for spec in sig.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            src = state.get(spec.target) if spec.target in state else constants_map.get(spec.target)
            if not isinstance(src, torch.Tensor):
                raise NotImplementedError(f"exported input {spec.target!r} of kind {spec.kind.name} is not a tensor")
            t = src.detach().to(device)
            placeholder_values.append(t)
            xla_inputs.append(t)
            locations.append(InputLocation("parameter", name=spec.target))
            state_for_save[spec.target] = src.detach()
        elif spec.kind == InputKind.USER_INPUT:
            if user_i >= len(flat_user):
                raise ValueError("fewer tracing arguments than the exported program's user inputs")
            v = flat_user[user_i]
            if isinstance(v, torch.Tensor):
                t = v.detach().to(device)
                placeholder_values.append(t)
                xla_inputs.append(t)
                locations.append(InputLocation("input_arg", position=user_i))
            else:
                placeholder_values.append(v)
            user_i += 1
        else:
            raise NotImplementedError(f"exported inputs of kind {spec.kind.name} are not supported by this "
                                      "torch_xla build's StableHLO export")
    _C._sync(xla_inputs, True, "")

    outputs = exported_model.graph_module(*placeholder_values)
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    outputs = list(outputs)
    user_outs, mutated_names, mutated_values = [], [], []
    for spec, value in zip(sig.output_specs, outputs):
        if spec.kind == OutputKind.USER_OUTPUT:
            user_outs.append(value)
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            mutated_names.append(spec.target)
            mutated_values.append(value)
        else:
            raise NotImplementedError(f"exported outputs of kind {spec.kind.name} are not supported by this "
                                      "torch_xla build's StableHLO export")
    for i, o in enumerate(user_outs):
        if not isinstance(o, torch.Tensor):
            raise NotImplementedError(f"user output {i} is a {type(o).__name__}, not a tensor")
    _, out_spec = pytree.tree_flatten(
        pytree.tree_unflatten(user_outs, exported_model.call_spec.out_spec)
        if exported_model.call_spec.out_spec is not None else user_outs)

    text, used, extra = _C._stablehlo_export(user_outs + mutated_values, xla_inputs)
    # The function's arguments: the used inputs in order, then the extra device data.
    final_locations, input_signature = [], []
    for loc, t, u in zip(locations, xla_inputs, used):
        if u:
            final_locations.append(loc)
            input_signature.append(_signature(t))
    extra_cpu = [e.cpu() for e in extra]
    for i, e in enumerate(extra_cpu):
        final_locations.append(InputLocation("constant", position=i))
        input_signature.append(_signature(e))
    meta = StableHLOFunctionMeta(
        name="forward", input_signature=input_signature,
        output_signature=[_signature(o) for o in user_outs + mutated_values],
        input_locations=final_locations, in_spec=pytree.treespec_dumps(in_spec),
        out_spec=pytree.treespec_dumps(out_spec), num_user_outputs=len(user_outs), mutated_buffers=mutated_names)
    return StableHLOGraphModule({"forward": (meta, text, extra_cpu)}, state_for_save)


def save_as_stablehlo(exported_model, stablehlo_dir: str, options: Optional[StableHLOExportOptions] = None) -> None:
    """Lowers ``exported_model`` (a ``torch.export.ExportedProgram``) and saves it in ``stablehlo_dir``."""
    options = options or StableHLOExportOptions()
    exported_program_to_stablehlo(exported_model, options).save(stablehlo_dir, options)


def save_torch_model_as_stablehlo(torchmodel: torch.nn.Module, args, path: str,
                                  options: Optional[StableHLOExportOptions] = None) -> None:
    """``torch.export.export(torchmodel, args)`` then :func:`save_as_stablehlo` into ``path``."""
    if not isinstance(torchmodel, torch.nn.Module):
        raise TypeError(f"torchmodel must be a torch.nn.Module, got {type(torchmodel).__name__}")
    exported = torch.export.export(torchmodel, tuple(args))
    save_as_stablehlo(exported, path, options)
