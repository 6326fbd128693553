"""Structured loops on XLA tensors: ``fori_loop`` and ``torch._higher_order_ops.while_loop``.

Both become one ``stablehlo.while`` in the graph (our IR's While primitive, csrc/ir/control_flow.h):
the loop body is traced once, on placeholder tensors, and runs as a rolled loop on the device, so
the graph (and its compile time) does not grow with the trip count.

As upstream PyTorch/XLA's, these loops are for inference: their results do not carry gradients
(``torch_xla.experimental.scan.scan`` does). A body must keep every carried value's shape and
dtype; it cannot read a carried value on the host (``.item()``, ``print``) since the value only
exists while the loop runs.
"""
import torch
import torch.utils._pytree as pytree
from torch._C import DispatchKey
from torch._higher_order_ops.while_loop import while_loop_op

import torch_xla
from torch_xla import _C

__all__ = ['fori_loop', 'while_loop']


def _device_of(tensors):
  for t in tensors:
    if isinstance(t, torch.Tensor) and t.device.type == 'xla':
      return t.device
  return torch_xla.device()


def _as_carried(values, device, what):
  out = []
  for i, v in enumerate(values):
    if isinstance(v, torch.Tensor):
      if v.device.type != 'xla':
        raise ValueError(f'{what}: carried value {i} is on {v.device}; move it to the XLA device first')
      out.append(v)
    elif isinstance(v, bool) or not isinstance(v, (int, float)):
      raise TypeError(f'{what}: carried value {i} must be a tensor or a number, got {type(v).__name__}')
    else:
      out.append(torch.tensor(v, device=device))
  return out


def _check_pred(pred, what):
  if isinstance(pred, bool):
    return pred
  if not isinstance(pred, torch.Tensor) or pred.dtype != torch.bool or pred.dim() != 0:
    desc = (f'a tensor of shape {tuple(pred.shape)} and dtype {pred.dtype}'
            if isinstance(pred, torch.Tensor) else repr(pred))
    raise RuntimeError(f'{what}: cond_fn must return a boolean scalar tensor or a boolean, got {desc}')
  return pred


def _xla_while_loop(cond_fn, body_fn, carried_inputs, additional_inputs=(), what='while_loop', trace_grad=False):
  """Runs ``while cond_fn(*carried, *additional): carried = body_fn(*carried, *additional)`` as one
  stablehlo.while; ``carried_inputs`` is a flat sequence of tensors (or numbers). Returns the final
  carried values as a tuple. The body is traced without autograd unless ``trace_grad`` (scan's
  backward body computes gradients inside the loop)."""
  additional = tuple(additional_inputs or ())
  device = _device_of(list(carried_inputs) + list(additional))
  carried = _as_carried(list(carried_inputs), device, what)
  if not carried:
    raise ValueError(f'{what}: there must be at least one carried value')
  params = [_C._cf_parameter(i, t) for i, t in enumerate(carried)]
  mark = _C._cf_check_mark(carried[0])
  # Traced, never run op by op: in eager mode the body's ops are part of the loop (a compiled region).
  _C._enter_compiled_region()
  try:
    with torch.enable_grad() if trace_grad else torch.no_grad():
      pred = _check_pred(cond_fn(*params, *additional), what)
      if isinstance(pred, bool):
        pred = torch.tensor(pred, device=device)
      out = body_fn(*params, *additional)
    return _finish_while(carried, params, pred, out, mark, device, what)
  finally:
    _C._exit_compiled_region()


def _finish_while(carried, params, pred, out, mark, device, what):
  if isinstance(out, torch.Tensor):
    out = (out,)
  if not isinstance(out, (tuple, list)):
    raise TypeError(f'{what}: body_fn must return a tuple of tensors, got {type(out).__name__}')
  out = list(out)
  if len(out) != len(carried):
    raise ValueError(f'{what}: body_fn returned {len(out)} values for {len(carried)} carried values')
  out = [o.detach() if isinstance(o, torch.Tensor) else o for o in out]
  for i, (o, c) in enumerate(zip(out, carried)):
    if not isinstance(o, torch.Tensor):
      o = out[i] = torch.tensor(o, dtype=c.dtype, device=device)
    if o.shape != c.shape or o.dtype != c.dtype:
      raise ValueError(f'{what}: body_fn returned a tensor of shape {tuple(o.shape)} and dtype {o.dtype} for '
                       f'carried value {i}, which has shape {tuple(c.shape)} and dtype {c.dtype} (a loop body must '
                       'keep each carried value\'s shape and dtype)')
  return tuple(_C._cf_while(carried, params, pred, params, out, mark))


def fori_loop(upper, lower, body_fun, *input_value):
  """Runs ``body_fun`` ``upper - lower`` times on the carried values: each call receives the current
  values (``*input_value``) and returns the next ones (one tensor or a tuple of the same shapes and
  dtypes). Returns ``(remaining_iterations, *final_values)`` as upstream's: the first element is the
  loop counter, 0 after a loop that ran."""
  device = _device_of([upper, lower] + list(input_value))
  if isinstance(upper, torch.Tensor) or isinstance(lower, torch.Tensor):
    iteri = torch.as_tensor(upper, device=device) - torch.as_tensor(lower, device=device)
  else:
    iteri = torch.tensor(int(upper) - int(lower), device=device)
  n = len(input_value)

  def cond_fn(i, *values):
    return i.reshape(()) > 0 if i.dim() else i > 0

  def body_fn(i, *values):
    res = body_fun(*values)
    if isinstance(res, torch.Tensor):
      res = (res,)
    res = tuple(res)
    if len(res) != n:
      raise ValueError(f'fori_loop: body_fun returned {len(res)} values for {n} carried values')
    return (i - 1,) + res

  return _xla_while_loop(cond_fn, body_fn, (iteri,) + tuple(input_value), what='fori_loop')


@while_loop_op.py_impl(DispatchKey.XLA)
def while_loop(cond_fn, body_fn, carried_inputs, additional_inputs=None, **kwargs):
  """torch._higher_order_ops.while_loop on XLA tensors: one stablehlo.while."""
  return _xla_while_loop(cond_fn, body_fn, tuple(carried_inputs), tuple(additional_inputs or ()))


def _install_functionalize_route():
  # Our XLA tensors reach the op wrapped for functionalization (DispatchKey.Functionalize), where
  # torch's rule fake-traces the bodies (our tensors have no storage to fake). The traced While is
  # functional already, so XLA tensors go straight to it; everything else keeps torch's rule.
  original = while_loop_op.py_kernels.get(DispatchKey.Functionalize)
  if original is None or getattr(original, '_txla_route', False):
    return

  def route(cond_fn, body_fn, carried_inputs, additional_inputs, *args, **kwargs):
    flat = list(carried_inputs) + list(additional_inputs or ())
    if any(isinstance(t, torch.Tensor) and t.device.type == 'xla' for t in flat):
      return _xla_while_loop(cond_fn, body_fn, tuple(carried_inputs), tuple(additional_inputs or ()))
    return original(cond_fn, body_fn, carried_inputs, additional_inputs, *args, **kwargs)

  route._txla_route = True
  while_loop_op.py_kernels[DispatchKey.Functionalize] = route
  while_loop_op._dispatch_cache.clear()


_install_functionalize_route()

_torch_while_loop_module = __import__('torch._higher_order_ops.while_loop', fromlist=['while_loop'])
_torch_while_loop = _torch_while_loop_module.while_loop


def _while_loop_entry(cond_fn, body_fn, carried_inputs):
  # torch's while_loop runs the op through torch.compile; on XLA tensors we build the While directly
  # (same semantics: cond_fn(*carried) -> bool scalar, body_fn(*carried) -> same pytree).
  flat, spec = pytree.tree_flatten(carried_inputs)
  xla = any(isinstance(t, torch.Tensor) and t.device.type == 'xla' for t in flat)
  if not xla or torch.compiler.is_dynamo_compiling():
    return _torch_while_loop(cond_fn, body_fn, carried_inputs)
  if not callable(cond_fn) or not callable(body_fn):
    raise RuntimeError('Expect cond_fn and body_fn to be callable.')

  def flat_cond(*xs):
    return cond_fn(*pytree.tree_unflatten(list(xs), spec))

  def flat_body(*xs):
    out = body_fn(*pytree.tree_unflatten(list(xs), spec))
    out_flat, out_spec = pytree.tree_flatten(out)
    if out_spec != spec:
      raise RuntimeError(f'while_loop: body_fn returned {out_spec}, which does not match carried_inputs {spec}')
    return tuple(out_flat)

  res = _xla_while_loop(flat_cond, flat_body, flat)
  return pytree.tree_unflatten(list(res), spec)


_while_loop_entry.__doc__ = _torch_while_loop.__doc__
# `from torch._higher_order_ops.while_loop import while_loop` after this import gets the entry above.
_torch_while_loop_module.while_loop = _while_loop_entry
