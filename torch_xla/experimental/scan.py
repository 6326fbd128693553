"""``scan``: a loop over the leading dimension of ``xs`` carrying a state, as upstream PyTorch/XLA's
``torch_xla.experimental.scan.scan`` (and ``jax.lax.scan``).

``fn(carry, x) -> (new_carry, y)`` is traced once and runs as one ``stablehlo.while`` (our IR's While
primitive), so the graph does not grow with the number of steps. ``init``/``xs`` and the results are
pytrees of tensors; the ``y`` of every step are stacked along a new leading dimension.

Autograd: gradients flow to ``init`` and ``xs`` (the backward pass is a second While running the
steps in reverse, recomputing each step's vjp from the saved carries). Tensors ``fn`` reads without
taking them through ``init`` or ``xs`` (a module's parameters in a closure) get no gradient: when such
a tensor requires grad, scan raises instead of dropping its gradient.
"""
import torch
import torch.utils._pytree as pytree

from torch_xla.experimental.fori_loop import _xla_while_loop

__all__ = ['scan']


def default_partition(*args, **kwargs):
  """Accepted for upstream compatibility: our backward recomputes each step from the saved carries,
  so there is no joint graph to partition."""
  raise NotImplementedError('scan: partition functions are not used by this implementation')


def _check_xs(xs_flat):
  if not xs_flat:
    raise ValueError('scan: xs must contain at least one tensor')
  for x in xs_flat:
    if not isinstance(x, torch.Tensor):
      raise TypeError(f'scan: every leaf of xs must be a tensor, got {type(x).__name__}')
    if x.dim() == 0:
      raise ValueError('scan: every tensor in xs needs a leading (scanned) dimension')
  n = xs_flat[0].shape[0]
  for x in xs_flat:
    if x.shape[0] != n:
      raise ValueError(f'scan: all tensors in xs must have the same leading dimension, got {n} and {x.shape[0]}')
  if n == 0:
    raise ValueError('scan: xs must have at least one element along the leading dimension')
  return n


def _step(index, x):
  return x.index_select(0, index.reshape(1)).squeeze(0)


def _put(buf, index, v):
  return buf.index_copy(0, index.reshape(1), v.unsqueeze(0))


def _trace_shapes(fn, init, xs_flat, xs_spec):
  """One abstract step on the device to learn y's structure, shapes and dtypes (nothing runs)."""
  x0 = pytree.tree_unflatten([x[0] for x in xs_flat], xs_spec)
  with torch.no_grad():
    carry, y = fn(init, x0)
  return carry, y


def _forward(fn, init_flat, init_spec, xs_flat, xs_spec, n, save_carries):
  """Returns (final carry leaves, ys leaves, carries [n, ...] leaves or [])."""
  device = xs_flat[0].device
  _, y0 = _trace_shapes(fn, pytree.tree_unflatten(list(init_flat), init_spec), xs_flat, xs_spec)
  y_flat, y_spec = pytree.tree_flatten(y0)
  for y in y_flat:
    if not isinstance(y, torch.Tensor):
      raise TypeError(f'scan: every leaf of y must be a tensor, got {type(y).__name__}')
  ys = [torch.zeros((n,) + tuple(y.shape), dtype=y.dtype, device=device) for y in y_flat]
  hist = [torch.zeros((n,) + tuple(c.shape), dtype=c.dtype, device=device) for c in init_flat] if save_carries else []
  nc, nx, ny = len(init_flat), len(xs_flat), len(ys)

  def cond(i, *rest):
    return i < n

  def body(i, *rest):
    carry = list(rest[:nc])
    xs_full = rest[nc:nc + nx]
    ys_buf = rest[nc + nx:nc + nx + ny]
    hist_buf = rest[nc + nx + ny:]
    x_t = pytree.tree_unflatten([_step(i, x) for x in xs_full], xs_spec)
    new_carry, y = fn(pytree.tree_unflatten(carry, init_spec), x_t)
    new_flat, new_spec = pytree.tree_flatten(new_carry)
    if new_spec != init_spec:
      raise ValueError(f'scan: fn returned a carry of structure {new_spec}, which does not match init {init_spec}')
    for k, (a, b) in enumerate(zip(new_flat, carry)):
      if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
        desc = f'shape {tuple(a.shape)} and dtype {a.dtype}' if isinstance(a, torch.Tensor) else type(a).__name__
        raise ValueError(f'scan: fn returned a carry leaf {k} of {desc}; init has shape {tuple(b.shape)} and dtype '
                         f'{b.dtype} (the carry must keep its shapes and dtypes)')
    y_fl, y_sp = pytree.tree_flatten(y)
    if y_sp != y_spec:
      raise ValueError('scan: fn returned ys of a different structure in different steps')
    for a, b in zip(y_fl, ys_buf):
      if a.shape != b.shape[1:] or a.dtype != b.dtype:
        raise ValueError(f'scan: fn returned y of shape {tuple(a.shape)} and dtype {a.dtype}, expected '
                         f'{tuple(b.shape[1:])} and {b.dtype}')
    new_ys = [_put(b, i, a) for a, b in zip(y_fl, ys_buf)]
    new_hist = [_put(h, i, c) for h, c in zip(hist_buf, carry)]
    return (i + 1, *new_flat, *xs_full, *new_ys, *new_hist)

  i0 = torch.tensor(0, dtype=torch.int64, device=device)
  out = _xla_while_loop(cond, body, (i0, *init_flat, *xs_flat, *ys, *hist), what='scan')
  final = list(out[1:1 + nc])
  ys_out = list(out[1 + nc + nx:1 + nc + nx + ny])
  hist_out = list(out[1 + nc + nx + ny:])
  return final, ys_out, y_spec, hist_out


def _backward(fn, init_spec, xs_flat, xs_spec, hist, g_carry, g_ys, n):
  """Reverse loop: per step t, the vjp of fn at (carry_t, x_t) with (g_carry, g_ys[t])."""
  device = xs_flat[0].device
  nc, nx, ny = len(g_carry), len(xs_flat), len(g_ys)
  g_xs = [torch.zeros_like(x) for x in xs_flat]

  def cond(i, *rest):
    return i >= 0

  def body(i, *rest):
    gc = list(rest[:nc])
    hist_b = rest[nc:2 * nc]
    xs_b = rest[2 * nc:2 * nc + nx]
    gys_b = rest[2 * nc + nx:2 * nc + nx + ny]
    gxs_b = rest[2 * nc + nx + ny:]
    carry_t = [_step(i, h).detach().requires_grad_(h.is_floating_point() or h.is_complex()) for h in hist_b]
    x_t = [_step(i, x).detach().requires_grad_(x.is_floating_point() or x.is_complex()) for x in xs_b]
    with torch.enable_grad():
      new_carry, y = fn(pytree.tree_unflatten(carry_t, init_spec), pytree.tree_unflatten(x_t, xs_spec))
    outs = pytree.tree_leaves(new_carry) + pytree.tree_leaves(y)
    grads_out = gc + [_step(i, g) for g in gys_b]
    pairs = [(o, g) for o, g in zip(outs, grads_out) if isinstance(o, torch.Tensor) and o.requires_grad]
    wrt = [t for t in carry_t + x_t if t.requires_grad]
    got = torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True) if pairs and wrt else []
    it = iter(got)
    grads = [next(it) if t.requires_grad else None for t in carry_t + x_t]
    new_gc = [g if g is not None else torch.zeros_like(c) for g, c in zip(grads[:nc], carry_t)]
    new_gxs = [gb if g is None else _put(gb, i, g) for g, gb in zip(grads[nc:], gxs_b)]
    return (i - 1, *new_gc, *hist_b, *xs_b, *gys_b, *new_gxs)

  i0 = torch.tensor(n - 1, dtype=torch.int64, device=device)
  out = _xla_while_loop(cond, body, (i0, *g_carry, *hist, *xs_flat, *g_ys, *g_xs), what='scan (backward)',
                        trace_grad=True)
  g_init = list(out[1:1 + nc])
  g_xs_out = list(out[1 + 2 * nc + nx + ny:])
  return g_init, g_xs_out


class _Scan(torch.autograd.Function):

  @staticmethod
  def forward(ctx, fn, init_spec, xs_spec, n, nc, *leaves):
    init_flat, xs_flat = list(leaves[:nc]), list(leaves[nc:])
    final, ys, y_spec, hist = _forward(fn, init_flat, init_spec, xs_flat, xs_spec, n, save_carries=True)
    ctx.fn, ctx.init_spec, ctx.xs_spec, ctx.n, ctx.nc, ctx.ny = fn, init_spec, xs_spec, n, nc, len(ys)
    ctx.y_spec = y_spec
    ctx.save_for_backward(*hist, *xs_flat)
    ctx.shapes = [(t.shape, t.dtype) for t in final + ys]
    ctx.mark_non_differentiable(*[t for t in final + ys if not (t.is_floating_point() or t.is_complex())])
    return tuple(final + ys)

  @staticmethod
  def backward(ctx, *grads):
    saved = ctx.saved_tensors
    hist, xs_flat = list(saved[:ctx.nc]), list(saved[ctx.nc:])
    device = xs_flat[0].device
    gs = [g if g is not None else torch.zeros(s, dtype=d, device=device) for g, (s, d) in zip(grads, ctx.shapes)]
    g_init, g_xs = _backward(ctx.fn, ctx.init_spec, xs_flat, ctx.xs_spec, hist, gs[:ctx.nc], gs[ctx.nc:], ctx.n)
    return (None, None, None, None, None, *g_init, *g_xs)


def _reads_grad_tensor(fn, init, xs_flat, xs_spec):
  """Whether fn's results require grad with init and xs detached: it reads a tensor that requires
  grad through its closure."""
  x0 = pytree.tree_unflatten([x[0].detach() for x in xs_flat], xs_spec)
  init_d = pytree.tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, init)
  with torch.enable_grad():
    carry, y = fn(init_d, x0)
  return any(isinstance(t, torch.Tensor) and t.requires_grad for t in pytree.tree_leaves((carry, y)))


def scan(fn, init, xs, partition_fn=default_partition, is_fn_pure=True):
  """Applies ``fn`` to each slice of ``xs`` along its leading dimension, carrying a state:

  .. code-block:: python

    carry = init
    ys = []
    for i in range(len(xs)):
      carry, y = fn(carry, xs[i])
      ys.append(y)
    return carry, torch.stack(ys)

  as one loop on the device. ``init``, ``xs`` and ``fn``'s results may be pytrees of tensors.
  ``partition_fn`` and ``is_fn_pure`` are accepted for upstream compatibility and not used.
  """
  init_flat, init_spec = pytree.tree_flatten(init)
  xs_flat, xs_spec = pytree.tree_flatten(xs)
  n = _check_xs(xs_flat)
  for c in init_flat:
    if not isinstance(c, torch.Tensor):
      raise TypeError(f'scan: every leaf of init must be a tensor, got {type(c).__name__}')
  if any(t.device.type != 'xla' for t in init_flat + xs_flat):
    raise ValueError('scan: init and xs must be XLA tensors')
  needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in init_flat + xs_flat)
  if torch.is_grad_enabled() and _reads_grad_tensor(fn, init, xs_flat, xs_spec):
    raise NotImplementedError(
        'scan: fn reads a tensor that requires grad without taking it through init or xs (e.g. a module '
        'parameter in a closure); its gradient would be lost. Pass it through xs or init, or run under '
        'torch.no_grad()')
  if needs_grad:
    out = _Scan.apply(fn, init_spec, xs_spec, n, len(init_flat), *init_flat, *xs_flat)
    final, ys = list(out[:len(init_flat)]), list(out[len(init_flat):])
    _, y0 = _trace_shapes(fn, init, xs_flat, xs_spec)
    y_spec = pytree.tree_flatten(y0)[1]
  else:
    final, ys, y_spec, _ = _forward(fn, init_flat, init_spec, xs_flat, xs_spec, n, save_carries=False)
  return pytree.tree_unflatten(final, init_spec), pytree.tree_unflatten(ys, y_spec)
