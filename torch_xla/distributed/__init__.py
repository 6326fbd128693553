"""torch_xla.distributed: multi-device and multi-process training."""
