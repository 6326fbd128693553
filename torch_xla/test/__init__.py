"""torch_xla.test: helpers of PyTorch/XLA test and example scripts."""
