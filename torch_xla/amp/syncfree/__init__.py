"""torch_xla.amp.syncfree: optimizers whose ``step(found_inf=...)`` skips the update on the device.

``GradScaler`` passes ``found_inf`` (a one-element tensor, nonzero when a gradient had an inf or
NaN): the new parameters and optimizer state are selected with ``torch.where(found_inf == 0, new,
old)`` inside the graph, so no value is read on the host. Without ``found_inf`` they update as
their ``torch.optim`` counterparts (same hyperparameters, same results).
"""
from .sgd import SGD  # noqa: F401
from .adam import Adam  # noqa: F401
from .adamw import AdamW  # noqa: F401

__all__ = ["SGD", "Adam", "AdamW"]
