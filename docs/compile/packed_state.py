"""A prototype, not kept: every scalar leaf of an optimizer's state packed in one vector per dtype.

A record of the measurement behind docs/benchmarks.md ("Where XLA:CPU spends
the compile"), not a benchmark and not part of the package:

    python docs/compile/packed_state.py [--leaves 8 32] [--rounds 3]

``packed(tx)`` keeps ``tx``'s arrays as they are and stores its scalars as one
vector per dtype, written as a sum of padded copies (``jnp.pad``), which XLA
fuses into one kernel; ``update`` reads them back by indexing (and traces
``tx.init`` under ``jax.eval_shape`` for the state's structure, which its trace
time includes: 0.003 s at 8 leaves, 0.01 s at 32). It prints
trace+compile of ``benchmarks/compile.py``'s train step for adamw, ``gnts`` and
``gnts`` packed, with the bare cond for reference.
"""

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / 'benchmarks'))
import compile as bench  # noqa: E402  (benchmarks/compile.py)


def pack(state):
  """``(arrays, {dtype: vector})``: the non-scalar leaves, and the scalars packed."""
  leaves = jax.tree.leaves(state)
  scalars = {}
  for leaf in leaves:
    if jnp.ndim(leaf) == 0:
      scalars.setdefault(jnp.result_type(leaf).name, []).append(leaf)
  vectors = {}
  for name, group in scalars.items():
    group = [jnp.asarray(s, jnp.int32) if name == 'bool' else s for s in group]
    k = len(group)
    vectors[name] = sum(jnp.pad(jnp.reshape(s, (1,)), (i, k - 1 - i)) for i, s in enumerate(group))
  return [leaf for leaf in leaves if jnp.ndim(leaf) != 0], vectors


def unpack(packed, like):
  """The state of structure ``like`` back from :func:`pack`'s output."""
  arrays, vectors = packed
  leaves, treedef = jax.tree.flatten(like)
  arrays, seen, out = iter(arrays), dict.fromkeys(vectors, 0), []
  for leaf in leaves:
    if jnp.ndim(leaf) != 0:
      out.append(next(arrays))
      continue
    name = jnp.result_type(leaf).name
    value = vectors[name][seen[name]]
    seen[name] += 1
    out.append(value.astype(bool) if name == 'bool' else value)
  return jax.tree.unflatten(treedef, out)


def packed(tx: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
  def init(params):
    return pack(tx.init(params))

  def update(updates, state, params=None, **extra_args):
    like = jax.eval_shape(tx.init, params if params is not None else updates)
    updates, new_state = tx.update(updates, unpack(state, like), params, **extra_args)
    return updates, pack(new_state)

  return optax.GradientTransformationExtraArgs(init, update)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--leaves', type=int, nargs='+', default=[8, 32])
  parser.add_argument('--rounds', type=int, default=3)
  args = parser.parse_args(argv)
  make_optimizer = bench.make_optimizer

  def with_packed(name):
    if name == 'gnts_packed':
      return packed(make_optimizer('gnts')[0]), False
    return make_optimizer(name)

  bench.make_optimizer = with_packed
  names = ['adamw', 'gnts', 'gnts_packed', 'cond_floor']
  results = bench.measure(names, args.leaves, args.rounds)
  for n in args.leaves:
    base = results[n]['adamw']['total_s']
    for name in names:
      r = results[n][name]
      print(
          f"{n:4d} leaves  {name:12s} trace {r['trace_s']:.3f} s  compile {r['compile_s']:.3f} s"
          f"  {r['total_s'] / base:.2f}x adamw  {r['fusions']} fusions"
      )


if __name__ == '__main__':
  main()
