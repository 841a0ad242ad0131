"""Small numerical pieces shared across the package."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax


def count_if(count: jax.Array, flag: jax.Array) -> jax.Array:
  """``count + 1`` where ``flag``, stopping at its dtype's largest (no wrap)."""
  return jnp.where(flag, optax.safe_increment(count), count)


def widened(x: jax.Array) -> jax.Array:
  """``x`` in float32, or in complex64 where it is complex: what the norms are taken in."""
  return x.astype(jnp.complex64 if jnp.iscomplexobj(x) else jnp.float32)


def complex_for(dtype: Any, param: Any) -> Any:
  """``dtype``, made complex for a complex ``param``: a real one would drop its imaginary part."""
  if jnp.iscomplexobj(param) and not jnp.issubdtype(dtype, jnp.complexfloating):
    return jnp.promote_types(dtype, jnp.complex64)
  return dtype


def sq_abs(x: jax.Array) -> jax.Array:
  """``|x|^2`` in float32 (complex leaves included)."""
  x = widened(x)
  if jnp.iscomplexobj(x):
    return jnp.square(x.real) + jnp.square(x.imag)
  return jnp.square(x)


def power_of_two_near(top: jax.Array) -> jax.Array:
  """The float32 power of two ``s`` with ``top / s`` in [1, 2); 1 where ``top`` is 0 or not finite.

  Dividing by it is exact, and brings squares and fourth powers of numbers up
  to ``top`` into float32's range.
  """
  _, exponent = jnp.frexp(jnp.where(jnp.isfinite(top) & (top > 0), top, 1.0))
  return jnp.ldexp(jnp.ones([], jnp.float32), exponent - 1)


def varying_axes(x: Any) -> frozenset:
  """The manual mesh axes across which ``x`` varies, as JAX types it inside ``jax.shard_map``.

  Empty outside ``shard_map``, and inside it with ``check_vma=False``, where
  JAX does not track it.
  """
  typeof = getattr(jax, 'typeof', None)  # JAX >= 0.4.36
  aval = typeof(x) if typeof is not None else None
  vma = getattr(aval, 'vma', None)  # the name before JAX 0.10
  if vma is None:
    vma = getattr(getattr(aval, 'manual_axis_type', None), 'varying', frozenset())
  return frozenset(vma)


def axis_names(axis_name: Any) -> tuple[Any, ...]:
  """``axis_name`` as a tuple: one name, a tuple or list of names (as ``psum`` takes), or None."""
  if axis_name is None:
    return ()
  return tuple(axis_name) if isinstance(axis_name, tuple | list) else (axis_name,)


def tracks_varying(axes: tuple[Any, ...]) -> bool:
  """Whether JAX tracks how values vary across these bound axes (``check_vma=True``)."""
  return all(a in varying_axes(jax.lax.axis_index(a)) for a in axes)


def _sum_sq(leaves: list[Any]) -> jax.Array:
  # One reduction over the per-leaf sums, not a chain of scalar adds: XLA
  # copies a chain of cheap scalar ops into every fusion that reads its
  # result, which makes the program grow as leaves times consumers.
  if not leaves:
    return jnp.zeros([], jnp.float32)
  # abs is the identity on these sums (non-negative, or NaN, or +inf), and
  # keeps XLA from rewriting the sum of the stacked sums back into a chain.
  return jnp.sum(jnp.abs(jnp.stack([jnp.sum(sq_abs(x)) for x in leaves])))


def sq_norm(tree: Any, axis_name: Any = None) -> jax.Array:
  """Squared global L2 norm, summed in float32 whatever the leaves' dtype.

  With ``axis_name`` (a mapped axis or a tuple of them), the leaves are shards
  of a larger tree split across those axes (inside ``jax.shard_map``), and the
  local sums are ``psum``'d into the norm of the whole. Where JAX tracks how
  values vary across the axes (``shard_map``'s default ``check_vma=True``), a
  leaf that does not vary across one of them is replicated over it and
  counts once there; otherwise (``check_vma=False``, a named ``vmap``) every
  leaf counts as a shard.
  """
  leaves = jax.tree.leaves(tree)
  if axis_name is None:
    return _sum_sq(leaves)
  axes = axis_names(axis_name)
  if not tracks_varying(axes):
    return jax.lax.psum(_sum_sq(leaves), axis_name)
  groups = {}  # the named axes a leaf varies across -> those leaves
  for x in leaves:
    groups.setdefault(tuple(a for a in axes if a in varying_axes(x)), []).append(x)
  return sum(
      (jax.lax.psum(_sum_sq(g), over) if over else _sum_sq(g) for over, g in groups.items()),
      start=jnp.zeros([], jnp.float32),
  )


def rounded(tree: Any, zero: jax.Array) -> Any:
  """The leaves of ``tree`` as they are, through their bits plus a traced ``zero``.

  XLA on the CPU contracts a multiply that feeds an add in the same fused loop
  into one fused multiply-add, which rounds once where the two operations
  round twice. Adding an update to the parameters inside the loop that
  computes it would then differ in the last bit from adding the stored update
  (the Optax path). A round trip through the integer bits, plus a zero that
  the compiler cannot see (an int32 scalar that is 0 at run time), is an
  exact identity that no multiply can be contracted across. It costs an
  integer add per element in a loop that is bound by memory. Its derivative is
  the identity's, as the Optax path's.
  """

  def leaf(x):
    if jnp.iscomplexobj(x):
      return jax.lax.complex(leaf(x.real), leaf(x.imag))
    if not jnp.issubdtype(x.dtype, jnp.floating):
      return x
    return _through_bits(x, zero)

  return jax.tree.map(leaf, tree)


@jax.custom_jvp  # the identity's: JAX gives a bitcast to integers a zero derivative
def _through_bits(x: jax.Array, zero: jax.Array) -> jax.Array:
  bits = jnp.dtype(f'int{8 * x.dtype.itemsize}')
  raw = jax.lax.bitcast_convert_type(x, bits)
  return jax.lax.bitcast_convert_type(raw + zero.astype(bits), x.dtype)


@_through_bits.defjvp
def _through_bits_jvp(primals, tangents):
  return _through_bits(*primals), tangents[0]


def kept_cond(flag: jax.Array) -> jax.Array:
  """``flag`` through an optimization barrier, to return from a ``lax.cond`` branch.

  XLA's conditional simplifier replaces a two-way ``lax.cond`` whose branches
  hold only elementwise operations, reductions, reshapes, slices and tuples
  with a select between the two branches' results, so both branches run every
  time. An optimizer's update is such a branch: on the GPU the accumulation
  engine ran the inner optimizer on every microbatch and kept one result
  (XLA:CPU keeps the cond). A barrier is none of those, so a branch that
  returns one keeps its cond. It computes nothing at run time.
  """
  return jax.lax.optimization_barrier(flag)


def _identity(dtype: Any) -> np.ndarray:
  """The identity of ``_add_each`` in ``dtype``: -0.0, which keeps a zero's sign, 0, or False."""
  if jnp.issubdtype(dtype, jnp.complexfloating):
    return np.array(complex(-0.0, -0.0), dtype)
  return np.array(-0.0 if jnp.issubdtype(dtype, jnp.floating) else 0, dtype)


def _add_each(xs: tuple[jax.Array, ...], ys: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
  return tuple(x | y if x.dtype == jnp.bool_ else x + y for x, y in zip(xs, ys, strict=True))


def one_kernel(new: Any, old: Any = None) -> Any:
  """``new``, with its scalars (those it changed from ``old``) computed in one kernel.

  XLA on the CPU gives each scalar a program returns a kernel of its own, with
  its own copy of the scalar arithmetic the scalar reads, and compiles each
  apart, a few milliseconds apiece. Each scalar paired with the identity, and
  the pairs reduced in one variadic ``lax.reduce``, come out of one kernel,
  each in its own buffer and equal to itself bit for bit. The leaves that are
  ``old``'s own pass through, so that donated buffers stay in place, and so
  do the leaves that are not scalars, or weakly typed. ``new`` and ``old``
  share a structure.
  """
  leaves, treedef = jax.tree.flatten(new)
  olds = [None] * len(leaves) if old is None else treedef.flatten_up_to(old)
  # A reduction per set of varying manual axes (JAX's rule) and per precision
  # of float (XLA's); the ints and bools join a float's.
  groups = {}  # varying axes -> float dtype or None -> where the scalars are
  for i, (x, was) in enumerate(zip(leaves, olds, strict=True)):
    if x is not was and isinstance(x, jax.Array) and x.ndim == 0 and not x.aval.weak_type:
      inexact = jnp.issubdtype(x.dtype, jnp.inexact)
      groups.setdefault(varying_axes(x), {}).setdefault(x.dtype if inexact else None, []).append(i)
  for by_dtype in groups.values():
    others = by_dtype.pop(None, [])
    wheres = list(by_dtype.values()) or [[]]
    wheres[0] += others
    for where in wheres:
      if len(where) > 1:
        for i, y in zip(where, _packed(tuple(leaves[i] for i in where)), strict=True):
          leaves[i] = y
  return jax.tree.unflatten(treedef, leaves)


@jax.custom_jvp  # the identity's: JAX differentiates no reduction over ints
def _packed(xs: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
  ids = [_identity(x.dtype) for x in xs]
  pairs = [
      jax.lax.pad(jax.lax.broadcast(x, (1,)), i, [(0, 1, 0)]) for x, i in zip(xs, ids, strict=True)
  ]
  return tuple(jax.lax.reduce(pairs, ids, _add_each, (0,)))


@_packed.defjvp
def _packed_jvp(primals, tangents):
  return _packed(*primals), tangents[0]
