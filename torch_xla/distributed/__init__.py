"""torch_xla.distributed: multi-device and multi-process training (xla_multiprocessing, parallel_loader, spmd)."""
