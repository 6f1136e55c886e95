"""Methods as plug-ins of the training loop (the registry loads each method's module on first use).

Nothing here imports jax: actor processes unpickle prompt hooks from these modules.
"""

from explore_jax.methods.base import Method, ObservationPrompt, make_method, register_method, registered_methods

__all__ = ["Method", "ObservationPrompt", "make_method", "register_method", "registered_methods"]
