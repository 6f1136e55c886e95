"""explore_jax: reinforcement learning of exploring LLM agents in JAX."""
