"""torch_xla.utils: helpers PyTorch/XLA scripts import (utils, serialization, dlpack)."""
