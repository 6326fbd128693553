"""torch_xla.distributed: multi-process data parallel (xla_multiprocessing, parallel_loader)."""
