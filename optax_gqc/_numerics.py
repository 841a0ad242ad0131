"""Small numerical pieces shared across the package."""

from typing import Any

import jax
import jax.numpy as jnp


def sq_norm(tree: Any) -> jax.Array:
  """Squared global L2 norm, summed in float32 whatever the leaves' dtype."""
  leaves = jax.tree.leaves(tree)
  return sum(
      (jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves),
      start=jnp.zeros([], jnp.float32),
  )
