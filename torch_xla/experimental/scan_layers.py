"""``scan_layers``: run a sequence of structurally identical layers as one loop, as upstream
PyTorch/XLA's ``torch_xla.experimental.scan_layers.scan_layers``.

The layers' parameters and buffers are stacked along a new leading dimension and fed to
:func:`torch_xla.experimental.scan.scan` as ``xs``; the step calls the first layer with the i-th
slice (``torch.func.functional_call``), so the graph (and the compile time) does not grow with the
number of layers. Gradients reach every layer's own parameters through the stacking.
"""
from typing import Iterable

import torch
import torch.utils._pytree as pytree

from torch_xla.experimental.scan import default_partition, scan

__all__ = ['scan_layers']


def _weights(layer: torch.nn.Module):
  d = dict(layer.named_parameters())
  d.update(dict(layer.named_buffers()))
  return d


def scan_layers(layers: Iterable[torch.nn.Module], input_data, partition_fn=default_partition,
                is_layer_pure=False):
  """Equivalent to::

    for layer in layers:
      input_data = layer(input_data)
    return input_data

  as one ``stablehlo.while``. Every layer must have the same parameter and buffer names, shapes and
  dtypes, take one input and return an output of the input's structure, shapes and dtypes.
  ``partition_fn`` and ``is_layer_pure`` are accepted for upstream compatibility (the backward
  recomputes each step, see ``scan``). Buffers updated in place by a layer (e.g. batch norm running
  statistics) are not written back.
  """
  layers = list(layers)
  if not layers:
    return input_data
  for i, l in enumerate(layers):
    if not isinstance(l, torch.nn.Module):
      raise TypeError(f'scan_layers: layer {i} is a {type(l).__name__}, not a torch.nn.Module')
  weights = [_weights(l) for l in layers]
  first = weights[0]
  for i, w in enumerate(weights[1:], 1):
    if w.keys() != first.keys():
      raise ValueError(f'scan_layers: layer {i} has parameters/buffers {sorted(w)} but layer 0 has {sorted(first)}')
    for k in first:
      if w[k].shape != first[k].shape or w[k].dtype != first[k].dtype:
        raise ValueError(f'scan_layers: {k!r} of layer {i} is {w[k].dtype}{list(w[k].shape)}, layer 0 has '
                         f'{first[k].dtype}{list(first[k].shape)}')
  if not first:  # nothing to stack: a plain loop over the same (stateless) computation
    for l in layers:
      input_data = l(input_data)
    return input_data
  stacked = {k: torch.stack([w[k] for w in weights]) for k in first}
  layer0 = layers[0]

  def step(carry, xs):
    out = torch.func.functional_call(layer0, xs, (carry,), strict=True)
    return out, ()

  final, _ = scan(step, input_data, stacked)
  return final
