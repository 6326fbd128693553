from .eager import eager_mode, is_eager_mode, eager_mode_context  # noqa: F401
