"""Methods as plug-ins of the training loop; importing this package registers them all."""

from explore_jax.methods import grpo
from explore_jax.methods.base import Method, ObservationPrompt, make_method, register_method, registered_methods

__all__ = ["Method", "ObservationPrompt", "grpo", "make_method", "register_method", "registered_methods"]
