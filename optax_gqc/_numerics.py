"""Small numerical pieces shared across the package."""

from typing import Any

import jax
import jax.numpy as jnp


def _sq_abs(x: jax.Array) -> jax.Array:
  """``|x|^2`` in float32 (complex leaves included)."""
  if jnp.iscomplexobj(x):
    x = x.astype(jnp.complex64)
    return jnp.square(x.real) + jnp.square(x.imag)
  return jnp.square(x.astype(jnp.float32))


def sq_norm(tree: Any, axis_name: Any = None) -> jax.Array:
  """Squared global L2 norm, summed in float32 whatever the leaves' dtype.

  With ``axis_name``, the leaves are shards of a larger tree split across that
  mapped axis (inside ``jax.shard_map``), and the local sums are ``psum``'d
  into the norm of the whole.
  """
  total = sum(
      (jnp.sum(_sq_abs(x)) for x in jax.tree.leaves(tree)), start=jnp.zeros([], jnp.float32)
  )
  return total if axis_name is None else jax.lax.psum(total, axis_name)


def rounded(tree: Any, zero: jax.Array) -> Any:
  """The leaves of ``tree`` as they are, through their bits plus a traced ``zero``.

  XLA on the CPU contracts a multiply that feeds an add in the same fused loop
  into one fused multiply-add, which rounds once where the two operations
  round twice. Adding an update to the parameters inside the loop that
  computes it would then differ in the last bit from adding the stored update
  (the Optax path). A round trip through the integer bits, plus a zero that
  the compiler cannot see (an int32 scalar that is 0 at run time), is an
  exact identity that no multiply can be contracted across. It costs an
  integer add per element in a loop that is bound by memory.
  """

  def leaf(x):
    if jnp.iscomplexobj(x):
      return jax.lax.complex(leaf(x.real), leaf(x.imag))
    if not jnp.issubdtype(x.dtype, jnp.floating):
      return x
    bits = jnp.dtype(f'int{8 * x.dtype.itemsize}')
    raw = jax.lax.bitcast_convert_type(x, bits)
    return jax.lax.bitcast_convert_type(raw + zero.astype(bits), x.dtype)

  return jax.tree.map(leaf, tree)
