"""torch.compile(model, backend="openxla" / "openxla_eval") on our core.

torch registers both backends (``torch/_dynamo/backends/torchxla.py``): ``openxla_eval`` hands each
FX graph Dynamo captures to :func:`extract_compiled_graph` at its first call, with the real inputs;
``openxla`` does the same for the forward and backward graphs AOT Autograd makes of it.

Here each FX graph is traced once through the lazy core with the real inputs (placeholders are
the inputs' device data), the traced outputs are compiled once (through the normal graph cache,
persistent cache and ``PT_XLA_DEBUG`` reasons), and the result is a compiled callable
(``csrc/graph/dynamo.cc``): a later call binds the new inputs' buffers to the executable's
parameters and launches it. No tracing, no graph hashing per call. Inputs the graph writes in place
(BatchNorm's running statistics, optimizer state) get their new values as an in-place op would
give them; the device RNG seed is a parameter and a result, so dropout advances per call.

A new input signature (shapes, dtypes, values of non-tensor inputs) compiles a new executable and
keeps the old ones. A graph that cannot be captured (an op running on the CPU fallback, a host
read while tracing, a CPU tensor input) runs through lazy tracing at every call, with the reason
under ``PT_XLA_DEBUG=1``.
"""
from __future__ import annotations

import itertools
import operator
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .. import _C
from .._core import metrics as _met

_graph_ids = itertools.count()
_seen_guard_failures: Dict[Any, int] = {}


def _debug(msg: str):
    if _C._dynamo_debug_enabled():
        _C._dynamo_debug(msg)


def _fallback_counts() -> Dict[str, int]:
    return {n: _met.counter_value(n) for n in _met.counter_names() if n.startswith("aten::")}


def _signature(args: Sequence[Any]) -> Tuple:
    sig = []
    for a in args:
        if isinstance(a, torch.Tensor):
            sig.append((tuple(a.shape), a.dtype, a.device))
        else:
            sig.append((type(a).__name__, a))
    return tuple(sig)


def _describe_change(old: Tuple, new: Tuple) -> str:
    if len(old) != len(new):
        return f"{len(new)} inputs instead of {len(old)}"
    for i, (o, n) in enumerate(zip(old, new)):
        if o == n:
            continue
        if len(o) == 3 and len(n) == 3:
            if o[0] != n[0]:
                return f"input {i} shape {list(o[0])} -> {list(n[0])}"
            if o[1] != n[1]:
                return f"input {i} dtype {o[1]} -> {n[1]}"
            return f"input {i} device {o[2]} -> {n[2]}"
        return f"input {i} value {o[1]!r} -> {n[1]!r}"
    return "same inputs"


def _report_dynamo_recompiles():
    """PT_XLA_DEBUG: Dynamo's guard failures that led to the graph being compiled now."""
    try:
        from torch._dynamo.utils import guard_failures
    except Exception:  # pragma: no cover - torch without Dynamo
        return
    for code, reasons in list(guard_failures.items()):
        seen = _seen_guard_failures.get(code, 0)
        if len(reasons) > seen:
            where = f"{getattr(code, 'co_name', code)} ({getattr(code, 'co_filename', '?')}:" \
                    f"{getattr(code, 'co_firstlineno', '?')})"
            for r in reasons[seen:]:
                _debug(f"dynamo: recompiling {where} because a guard failed: {r}")
            _seen_guard_failures[code] = len(reasons)


def _fetch_attr(gm: torch.nn.Module, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _xla_attr_tensors(gm: torch.fx.GraphModule) -> List[torch.Tensor]:
    out, seen = [], set()
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            t = _fetch_attr(gm, n.target)
            if isinstance(t, torch.Tensor) and t.device.type == "xla" and id(t) not in seen:
                seen.add(id(t))
                out.append(t)
    return out


def _meta_value(n: torch.fx.Node):
    return n.meta.get("val", n.meta.get("example_value"))


def _on_cpu(v) -> bool:
    if isinstance(v, torch.Tensor):
        return v.device.type == "cpu"
    if isinstance(v, (list, tuple)):
        return len(v) > 0 and all(_on_cpu(x) for x in v)
    return False


def _cpu_nodes(gm: torch.fx.GraphModule, args: Sequence[Any]) -> set:
    """Nodes computed on the CPU alone: CPU tensor inputs and attributes, and ops whose every
    input is such a node and whose result is on the CPU (an optimizer's step counters and the
    bias corrections computed from them)."""
    cpu = set()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n, a in zip(placeholders, args):
        if isinstance(a, torch.Tensor) and a.device.type == "cpu":
            cpu.add(n)
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            t = _fetch_attr(gm, n.target)
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                cpu.add(n)
        elif n.op in ("call_function", "call_method"):
            ins = n.all_input_nodes
            if ins and all(i in cpu for i in ins) and _on_cpu(_meta_value(n)):
                cpu.add(n)
            elif not ins and _on_cpu(_meta_value(n)):
                cpu.add(n)
    return cpu


class _Partitioned:
    """An FX graph whose CPU part (ops on CPU tensors only) runs eagerly on the CPU at each call;
    its results the device part reads become that part's inputs (uploaded at each call)."""

    def __init__(self, gm: torch.fx.GraphModule, cpu: set, name: str):
        nodes = list(gm.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        cg, env = torch.fx.Graph(), {}
        self.cpu_inputs = []
        for i, n in enumerate(placeholders):
            if n in cpu:
                env[n] = cg.placeholder(n.name)
                self.cpu_inputs.append(i)
        for n in nodes:
            if n in cpu and n.op != "placeholder":
                env[n] = cg.node_copy(n, lambda m: env[m])
        needed = [n for n in nodes if n in cpu and any(u not in cpu for u in n.users)]
        cg.output(tuple(env[n] for n in needed))
        self.cpu_gm = torch.fx.GraphModule(gm, cg)
        xg, env2 = torch.fx.Graph(), {}
        self.xla_inputs = []
        for i, n in enumerate(placeholders):
            if n not in cpu:
                env2[n] = xg.placeholder(n.name)
                self.xla_inputs.append(i)
        for n in needed:
            env2[n] = xg.placeholder(n.name + "_from_cpu")
        for n in nodes:
            if n.op == "placeholder" or n in cpu:
                continue
            env2[n] = xg.node_copy(n, lambda m: env2[m])
        self.xla = CompiledGraph(torch.fx.GraphModule(gm, xg), name)

    def __call__(self, *args):
        cpu_vals = self.cpu_gm(*[args[i] for i in self.cpu_inputs])
        return self.xla(*[args[i] for i in self.xla_inputs], *cpu_vals)


def _is_copy_into(n: torch.fx.Node, targets: set) -> bool:
    return (n.op == "call_function" and n.target is torch.ops.aten.copy_.default
            and n.args[0] in targets and not n.users)


def _packable(gm: torch.fx.GraphModule, cpu: set, args: Sequence[Any]) -> bool:
    """Whether the CPU part can move into the device graph (see :class:`_Packed`): its CPU
    tensor inputs are 0-dim, its only side effects are ``copy_`` into those inputs (AOT
    Autograd's input mutations), and no graph output is a CPU value."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    cpu_ph = set()
    for n, a in zip(placeholders, args):
        if n in cpu:
            if not (isinstance(a, torch.Tensor) and a.dim() == 0 and not a.requires_grad):
                return False
            cpu_ph.add(n)
    if len(placeholders) != len(args) or not cpu_ph:
        return False
    for n in gm.graph.nodes:
        if n not in cpu or n.op == "placeholder":
            continue
        if n.op == "get_attr":
            return False  # a CPU constant: keep the general path
        if n.op == "call_method" and str(n.target).endswith("_"):
            return False
        if n.op == "call_function":
            schema = getattr(n.target, "_schema", None)
            if schema is not None and schema.is_mutable and not _is_copy_into(n, cpu_ph):
                return False
    out = next(n for n in gm.graph.nodes if n.op == "output")
    flat = []
    torch.fx.node.map_arg(out.args, flat.append)
    return not any(n in cpu for n in flat)


class _Packed:
    """An FX graph with a CPU part (an optimizer's ``step`` counters on the CPU and the bias
    corrections computed from them) that runs entirely on the device: the 0-dim CPU inputs are
    stacked into one CPU tensor per dtype, uploaded once per call (one transfer instead of one
    per value) and selected inside the executable, which also computes what the CPU part
    computed. The CPU inputs the graph writes (``step += 1``) are updated on the CPU by the
    smallest subgraph that computes their new values, with one ``_foreach_copy_``."""

    def __init__(self, gm: torch.fx.GraphModule, cpu: set, name: str, args: Sequence[Any]):
        nodes = list(gm.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        self.xla_inputs = [i for i, n in enumerate(placeholders) if n not in cpu]
        groups: Dict[torch.dtype, List[int]] = {}
        for i, n in enumerate(placeholders):
            if n in cpu:
                groups.setdefault(args[i].dtype, []).append(i)
        self.groups = list(groups.values())
        cpu_ph = {placeholders[i] for g in self.groups for i in g}
        copies = [n for n in nodes if n in cpu and _is_copy_into(n, cpu_ph)]
        # The device graph: the XLA inputs, then one packed tensor per dtype.
        xg, env = torch.fx.Graph(), {}
        for i in self.xla_inputs:
            env[placeholders[i]] = xg.placeholder(placeholders[i].name)
        for k, g in enumerate(self.groups):
            packed = xg.placeholder(f"packed_cpu_scalars_{k}")
            for j, i in enumerate(g):
                env[placeholders[i]] = xg.call_function(torch.ops.aten.select_copy.int, (packed, 0, j))
        skip = set(copies)
        for n in nodes:
            if n.op == "placeholder" or n in skip:
                continue
            env[n] = xg.node_copy(n, lambda m: env[m])
        self.xla = CompiledGraph(torch.fx.GraphModule(gm, xg), name)
        # The CPU writes: `step += c` for every counter becomes one in-place `_foreach_add_` per
        # constant (no new tensors, no copies); otherwise the ancestors of the copied values,
        # then one _foreach_copy_.
        self.cpu_inputs = [i for g in self.groups for i in g]
        self.mutate = None
        self.increments = _counter_increments(copies, cpu_ph, {n: i for i, n in enumerate(placeholders)})
        if self.increments is not None:
            _debug(f"dynamo graph '{name}': {len(copies)} CPU counters advance with "
                   f"{len(self.increments)} in-place _foreach_add_")
        elif copies:
            need, stack = set(), [c.args[1] for c in copies]
            while stack:
                m = stack.pop()
                if isinstance(m, torch.fx.Node) and m not in need:
                    need.add(m)
                    stack.extend(m.all_input_nodes)
            cg, env2 = torch.fx.Graph(), {}
            for i in self.cpu_inputs:
                env2[placeholders[i]] = cg.placeholder(placeholders[i].name)
            for n in nodes:
                if n in need and n.op != "placeholder":
                    env2[n] = cg.node_copy(n, lambda m: env2[m])
            cg.call_function(torch.ops.aten._foreach_copy_.default,
                             ([env2[c.args[0]] for c in copies], [env2[c.args[1]] for c in copies]))
            cg.output(None)
            # The generated forward, without nn.Module's call machinery (hooks) per call.
            self.mutate = torch.fx.GraphModule(gm, cg).forward

    def __call__(self, *args):
        # The stacking and the counters' increments in C++ (no dispatcher, no new tensors but the
        # packed ones); the torch ops when an argument or dtype is not one it handles.
        packed = _C._dynamo_pack_cpu_scalars(args, self.groups)
        if packed is None:
            packed = [torch.stack([args[i] for i in g]) for g in self.groups]
        out = self.xla(*[args[i] for i in self.xla_inputs], *packed)
        if self.increments is not None:
            if not _C._dynamo_add_cpu_scalars(args, self.increments):
                with torch.no_grad():
                    for positions, c in self.increments:
                        torch._foreach_add_([args[i] for i in positions], c)
        elif self.mutate is not None:
            self.mutate(*[args[i] for i in self.cpu_inputs])
        return out


_ADDS = (torch.ops.aten.add.Tensor, torch.ops.aten.add.Scalar)
_FOREACH_ADDS = (torch.ops.aten._foreach_add.Scalar,)


def _counter_increments(copies: List[torch.fx.Node], cpu_ph: set, position: Dict[torch.fx.Node, int]):
    """[(argument positions, c)] when every CPU write is ``copy_(s, s + c)`` (``s`` a 0-dim CPU
    input, ``c`` a number, the sum of ``s``'s dtype: an optimizer's ``step += 1``, foreach or
    not), so the writes are in-place adds; None otherwise."""
    if not copies:
        return None
    by_c: Dict[Any, List[int]] = {}
    seen = set()
    for cp in copies:
        dst, src = cp.args[0], cp.args[1]
        if dst in seen or not isinstance(src, torch.fx.Node) or src.op != "call_function":
            return None
        seen.add(dst)
        if src.target in _ADDS:
            if len(src.args) != 2 or src.kwargs or src.args[0] is not dst:
                return None
            c = src.args[1]
        elif src.target is operator.getitem:
            fa, k = src.args
            if not (isinstance(fa, torch.fx.Node) and fa.op == "call_function" and fa.target in _FOREACH_ADDS
                    and len(fa.args) == 2 and not fa.kwargs and isinstance(k, int)):
                return None
            lst = fa.args[0]
            if not isinstance(lst, (list, tuple)) or k >= len(lst) or lst[k] is not dst:
                return None
            c = fa.args[1]
        else:
            return None
        if isinstance(c, bool) or not isinstance(c, (int, float)):
            return None
        dv, sv = _meta_value(dst), _meta_value(src)
        if not (isinstance(dv, torch.Tensor) and isinstance(sv, torch.Tensor) and dv.dtype == sv.dtype
                and dst in cpu_ph):
            return None
        by_c.setdefault((type(c), c), []).append(position[dst])
    return [(positions, c) for (_, c), positions in by_c.items()]


class _Entry:
    __slots__ = ("handle", "spec", "is_list", "reason")

    def __init__(self, handle=None, spec=None, is_list=False, reason=""):
        self.handle = handle      # _C._DynamoGraph, or None: run through lazy tracing
        self.spec = spec          # output fix-ups, or None when every output is a computed tensor
        self.is_list = is_list
        self.reason = reason


class CompiledGraph:
    """The callable that replaces one FX graph: one executable per input signature."""

    def __init__(self, gm: torch.fx.GraphModule, name: str):
        self.gm = gm
        self.name = name
        self.entries: Dict[Tuple, _Entry] = {}
        self.last: Optional[_Entry] = None
        self.last_sig: Optional[Tuple] = None
        # XLA tensors the graph reads as attributes (Dynamo's static addresses: an optimizer's
        # parameters and state): inputs like the others, bound at each call, never baked in.
        self.attrs = tuple(_xla_attr_tensors(gm))

    def __call__(self, *args):
        e = self.last
        if self.attrs:
            args = args + self.attrs
        if e is not None and e.handle is not None:
            out = _C._dynamo_run(e.handle, args)
            if out is not None:
                return self._finish(e, out, args)
        return self._slow(args)

    @staticmethod
    def _finish(e: _Entry, out: list, args):
        if e.spec is not None:
            out = [out[v] if kind == 0 else (args[v] if kind == 1 else v) for kind, v in e.spec]
        return out if e.is_list else tuple(out)

    def _slow(self, args):
        sig = _signature(args)
        e = self.entries.get(sig)
        if e is None:
            if self.last_sig is not None:
                _debug(f"dynamo graph '{self.name}': compiling executable {len(self.entries) + 1} of this "
                       f"graph: {_describe_change(self.last_sig, sig)}")
            e = self._build(args)
            self.entries[sig] = e
            self.last, self.last_sig = e, sig
            if e.handle is not None:
                return self._first_run(e, args)
            return self._run_lazy(args)
        self.last, self.last_sig = e, sig
        if e.handle is None:
            return self._run_lazy(args)
        out = _C._dynamo_run(e.handle, args)
        if out is None:
            raise RuntimeError(f"internal: compiled graph '{self.name}' refused the inputs it was compiled for")
        return self._finish(e, out, args)

    def _run_lazy(self, args):
        n = len(args) - len(self.attrs)
        out = self.gm(*args[:n])
        # Run what it traced now (as a step would): nothing else syncs a compiled program.
        flat = out if isinstance(out, (list, tuple)) else (out,)
        ts = [t for t in list(flat) + list(args)
              if isinstance(t, torch.Tensor) and t.device.type == "xla"]
        if ts:
            _C._sync(ts, False, self.name)
        return out

    def _first_run(self, e: _Entry, args):
        out = _C._dynamo_run(e.handle, args)
        if out is None:
            raise RuntimeError(f"internal: compiled graph '{self.name}' refused its example inputs")
        return self._finish(e, out, args)

    def _lazy(self, reason: str) -> _Entry:
        _debug(f"dynamo graph '{self.name}' runs through lazy tracing at every call: {reason}")
        _met.increment_counter("DynamoLazyGraph", 1)
        return _Entry(None, reason=reason)

    def _build(self, args) -> _Entry:
        start = time.perf_counter_ns()
        # CPU tensor inputs are uploaded at each call; the trace sees them on the device.
        xla_dev = next((a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "xla"), None)
        if xla_dev is None:  # nothing on the device: the graph runs as it is (CPU, factories)
            return self._lazy("no input is an XLA tensor")
        if any(isinstance(a, torch.Tensor) and a.device.type == "cpu" and a.is_floating_point()
               and a.requires_grad for a in args):
            return self._lazy("a CPU tensor input requires grad")
        args = tuple(a.detach().to(xla_dev) if isinstance(a, torch.Tensor) and a.device.type == "cpu" else a
                     for a in args)
        try:
            trace = _C._dynamo_begin(list(args))
        except TypeError as err:  # a tensor on another device: its value would be baked in
            return self._lazy(str(err))
        fallbacks = _fallback_counts()
        eager = _C._eager_mode()  # eager mode would run each op of the trace: record them instead
        if eager:
            _C._set_eager_mode(False)
        _C._set_execution_forbidden(
            f"dynamo graph '{self.name}' reads a value on the host while it is traced")
        try:
            # In the caller's grad mode, not under no_grad: a graph may compute gradients itself
            # (torch.func.grad / grad_and_value inside an openxla_eval graph), which an outer
            # no_grad would turn into zeros. The traced outputs are only roots, never returned.
            outs = self.gm(*args[:len(args) - len(self.attrs)])
        except Exception as err:  # noqa: BLE001 - any failure: undo and run it lazily
            _C._set_execution_forbidden("")
            if eager:
                _C._set_eager_mode(True)
            _C._dynamo_restore(trace)
            return self._lazy(f"tracing failed ({type(err).__name__}: {err})")
        _C._set_execution_forbidden("")
        if eager:
            _C._set_eager_mode(True)
        new_fallbacks = sorted(n for n, v in _fallback_counts().items() if v != fallbacks.get(n))
        if new_fallbacks:
            _C._dynamo_restore(trace)
            return self._lazy("ops run on the CPU fallback: " + ", ".join(new_fallbacks))
        is_list = isinstance(outs, list)
        if not isinstance(outs, (list, tuple)):
            outs, is_list = (outs,), False  # pragma: no cover - FX graphs return sequences
        arg_pos = {id(a): i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
        tensors: List[torch.Tensor] = []
        spec = []
        plain = True
        for o in outs:
            if isinstance(o, torch.Tensor) and id(o) in arg_pos:
                spec.append((1, arg_pos[id(o)]))
                plain = False
            elif isinstance(o, torch.Tensor):
                spec.append((0, len(tensors)))
                tensors.append(o)
            else:
                spec.append((2, o))
                plain = False
        # Inputs that may donate their buffers to their new values when the graph writes them (a
        # call donates only the buffers its inputs hold alone): optimizer state and BatchNorm
        # statistics, and, in a wider executable tried first, tensors that require grad (`wide`:
        # weights updated by a compiled step; compiled only if one held its buffer alone when
        # the trace began; when one is shared at a call, e.g. by a pending lazy value, the call
        # donates the others alone, or nothing).
        may_donate = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and not a.requires_grad]
        wide = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
        try:
            handle = _C._dynamo_compile(trace, tensors, self.name, may_donate, wide)
        except Exception as err:  # noqa: BLE001
            _C._dynamo_restore(trace)
            return self._lazy(f"capture failed ({type(err).__name__}: {err})")
        # The trace wrote its (pending) results into the inputs it mutates and the RNG seed: put
        # the values back, the first run computes them.
        _C._dynamo_restore(trace)
        _C._add_time_sample("DynamoExtractCompiledGraphTime", float(time.perf_counter_ns() - start))
        _met.increment_counter("DynamoExtractCompiledGraph", 1)
        return _Entry(handle, None if plain else spec, is_list)


def extract_compiled_graph(xla_model: torch.fx.GraphModule, xla_args):
    """Returns the compiled callable for an FX graph (called by torch's openxla backends at the
    graph's first call, with its real inputs)."""
    _report_dynamo_recompiles()
    name = f"dynamo_{next(_graph_ids)}"
    _met.increment_counter("DynamoGraphs", 1)
    cpu = _cpu_nodes(xla_model, xla_args)
    n_ops = sum(n.op != "placeholder" for n in cpu)
    if (n_ops or len(cpu) > 1) and os.environ.get("XLA_DYNAMO_PACK_CPU_SCALARS", "1") != "0" \
            and _packable(xla_model, cpu, xla_args):
        n_in = sum(n.op == "placeholder" for n in cpu)
        _debug(f"dynamo graph '{name}': {n_in} CPU scalar inputs are uploaded as one tensor per call"
               + (f" and {n_ops} ops on them run in the device graph" if n_ops else ""))
        return _Packed(xla_model, cpu, name, xla_args)
    if n_ops:
        _debug(f"dynamo graph '{name}': {n_ops} ops on CPU tensors run "
               f"on the CPU at each call, their results are inputs of the compiled graph")
        return _Partitioned(xla_model, cpu, name)
    return CompiledGraph(xla_model, name)
