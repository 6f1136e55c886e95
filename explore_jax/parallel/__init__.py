"""Meshes and logical-axis sharding rules."""

from explore_jax.parallel.mesh import AXES, make_mesh
from explore_jax.parallel.sharding import DEFAULT_RULES, constrain, logical_to_spec, named_sharding, tree_shardings

__all__ = ["AXES", "DEFAULT_RULES", "constrain", "logical_to_spec", "make_mesh", "named_sharding", "tree_shardings"]
