"""A prototype, not kept: the accumulator stored as one stacked array per shape.

A record of the measurement behind docs/benchmarks.md ("The accumulator
stacked by shape"), not a benchmark and not part of the package:

    python docs/compile/stacked_accumulator.py [--leaves 8 32 128] [--rounds 3]
    python docs/compile/stacked_accumulator.py --kernels [--leaves 8 32]

Each candidate is the least of GNTS in one ``lax.cond``: a running sum, the
gradient's and the new sum's squared norms, the skip of a non-finite
microbatch, a norm gate (or 8 microbatches), and adamw on the mean in the
cond's step branch; no statistics, no checks. ``norms`` keeps the sum as the
engine does, a leaf per parameter. ``stacked`` keeps it as one array per
``(shape, dtype)``, the gradient's leaves stacked into it (one kernel per
group for the write and for each norm), and reads each leaf back for adamw at
its constant offset; ``stacked_dyn`` reads it back at an offset held in the
state, one int32 scalar per leaf, which XLA cannot fold into the kernel (every
layout carries those scalars, so that the three states differ in the sum alone). It
prints trace+compile of ``benchmarks/compile.py``'s train step for each, with
adamw, the bare cond and ``gnts`` (``--kernels``: the fusions and the distinct
kernels XLA emits).
"""

import argparse
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / 'benchmarks'))
import compile as bench  # noqa: E402  (benchmarks/compile.py)
from kernels import fusions_and_modules  # noqa: E402  (docs/compile/kernels.py)

from optax_gqc._numerics import kept_cond, sq_norm  # noqa: E402

EVERY = 8


def groups_of(tree):
  """The leaves' indices grouped by ``(shape, dtype)``, in order of first use."""
  groups = {}
  for i, x in enumerate(jax.tree.leaves(tree)):
    groups.setdefault((tuple(x.shape), jnp.dtype(x.dtype)), []).append(i)
  return list(groups.values())


def least_gnts_by_layout(inner, layout):
  """GNTS's least: ``layout`` is ``'norms'``, ``'stacked'`` or ``'stacked_dyn'``."""
  stacked = layout != 'norms'

  def init(params):
    leaves = jax.tree.leaves(params)
    if stacked:
      acc = [
          jnp.zeros((len(ix), *leaves[ix[0]].shape), leaves[ix[0]].dtype)
          for ix in groups_of(params)
      ]
    else:
      acc = optax.tree.zeros_like(params)
    offsets = tuple(jnp.asarray(i, jnp.int32) for i in range(len(leaves)))
    return jnp.zeros([], jnp.int32), acc, offsets, inner.init(params)

  def update(grads, state, params=None):
    count, acc, offsets, inner_state = state
    leaves, treedef = jax.tree.flatten(grads)
    groups = groups_of(grads)
    g = [jnp.stack([leaves[i] for i in ix]) for ix in groups] if stacked else grads
    g_sq = sq_norm(g)
    fresh = count == 0
    new = jax.tree.map(lambda a, x: jnp.where(fresh, x, a + x), acc, g)
    new = jax.tree.map(lambda n, a: jnp.where(jnp.isfinite(g_sq), n, a), new, acc)
    n = count + jnp.isfinite(g_sq).astype(jnp.int32)
    step = (sq_norm(new) > 0.01 * n**2 * g_sq) | (n >= EVERY)

    def mean(new):
      if not stacked:
        return jax.tree.map(lambda a: a / n, new)
      out = [None] * len(leaves)
      for ix, a in zip(groups, new, strict=True):
        for j, i in enumerate(ix):
          at = offsets[i] if layout == 'stacked_dyn' else j
          out[i] = jax.lax.dynamic_index_in_dim(a, at, keepdims=False) / n
      return treedef.unflatten(out)

    def do_step(new, inner_state, params):
      updates, inner_state = inner.update(mean(new), inner_state, params)
      return updates, inner_state, kept_cond(jnp.asarray(True))

    def do_accumulate(new, inner_state, params):
      return optax.tree.zeros_like(params), inner_state, jnp.asarray(False)

    updates, inner_state, stepped = jax.lax.cond(
        step, do_step, do_accumulate, new, inner_state, params
    )
    return updates, (jnp.where(stepped, 0, n), new, offsets, inner_state)

  return optax.GradientTransformation(init, update)


NAMES = ('adamw', 'cond_floor', 'norms', 'stacked', 'stacked_dyn', 'gnts')


def fresh_step(name, shape):
  if name in ('adamw', 'cond_floor', 'gnts'):
    return bench.fresh_step(name, shape)
  return bench.jitted_step(least_gnts_by_layout(optax.adamw(1e-3), name), False, shape)


def compile_once(name, shape):
  step, args = fresh_step(name, shape)
  with bench.gc_off():
    start = time.perf_counter()
    compiled = step.lower(*args).compile()
    seconds = time.perf_counter() - start
  return seconds, bench.hlo_size(compiled.as_text())


def timing(leaves, rounds):
  shapes = {n: jax.eval_shape(lambda n=n: bench.make_params(n)) for n in leaves}
  for n in leaves:  # the untimed round
    for name in NAMES:
      compile_once(name, shapes[n])
  times = {(n, name): [] for n in leaves for name in NAMES}
  sizes = {}
  for _ in range(rounds):
    for n in leaves:
      for name in NAMES:
        seconds, sizes[n, name] = compile_once(name, shapes[n])
        times[n, name].append(seconds)
  for n in leaves:
    adamw = statistics.median(times[n, 'adamw'])
    for name in NAMES:
      seconds, size = statistics.median(times[n, name]), sizes[n, name]
      print(
          f'{n:4d} leaves  {name:12s} {seconds:6.3f} s  {seconds / adamw:5.2f}x adamw  '
          f'{size["instructions"]:6d} instructions  {size["fusions"]:5d} fusions'
      )


def kernels(leaves):
  for n in leaves:
    shape = jax.eval_shape(lambda n=n: bench.make_params(n))
    for name in NAMES:
      fusions, emitted = fusions_and_modules(*fresh_step(name, shape))
      print(f'{n:4d} leaves  {name:12s} {fusions:5d} fusions  {emitted:3d} kernels')


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--leaves', type=int, nargs='+', default=None)
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--kernels', action='store_true')
  args = parser.parse_args(argv)
  if args.kernels:
    kernels(args.leaves or [8, 32])
  else:
    timing(args.leaves or [8, 32, 128], args.rounds)


if __name__ == '__main__':
  main()
