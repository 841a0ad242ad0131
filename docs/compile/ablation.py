"""Where a gnts train step's compile time goes: the engine with one piece taken out at a time.

A record of the experiments behind docs/benchmarks.md ("Where the compile time
goes"), not a benchmark: most variants are not correct optimizers. Each patches
one piece of ``optax_gqc._accumulation`` or ``optax_gqc._numerics`` for the
length of a measurement, then builds a fresh ``gnts(adamw)`` train step of
``benchmarks/compile.py`` and times its trace + compile, interleaved with
adamw's, the median of ``--rounds``. Run from the repository root:

    python docs/compile/ablation.py [--leaves 8 32] [--rounds 5] [--variants ...]
"""

import argparse
import contextlib
import functools
import statistics
import sys
import types

import jax
import jax.numpy as jnp

sys.path.insert(0, 'benchmarks')
import compile as bench  # noqa: E402  pylint: disable=g-import-not-at-top

from optax_gqc import _accumulation, _numerics  # noqa: E402  pylint: disable=g-import-not-at-top


def _count_only_acc_norm(state, stats, *args):
  del args
  return state._replace(acc_norm=stats.acc_norm)  # keeps the new sum's norm alive


def _plain_add(accumulator, updates, ok, fresh):
  del ok, fresh
  return jax.tree.map(lambda a, g: a + g, accumulator, updates)


def _no_norm(tree, axis_name=None):
  del tree, axis_name
  return jnp.zeros([], jnp.float32)


def _eval_shape_without_inner(f, *args):
  """The zero updates' shapes from the gradients', not from a trace of the inner optimizer."""
  if isinstance(f, functools.partial):
    return jax.tree.map(lambda g: jax.ShapeDtypeStruct(g.shape, g.dtype), args[0]), None
  return jax.eval_shape(f, *args)


def _sum_sq_concatenated(leaves):
  return jnp.sum(jnp.concatenate([jnp.ravel(_numerics.sq_abs(x)) for x in leaves]))


def _sum_sq_dot(leaves):
  def leaf(x):
    v = jnp.ravel(x)
    return jnp.dot(v, v, precision=jax.lax.Precision.HIGHEST)

  return jnp.sum(jnp.abs(jnp.stack([leaf(x) for x in leaves])))


# Variant -> (candidate of benchmarks/compile.py, {(module, attribute): replacement}).
VARIANTS = {
    'adamw': ('adamw', {}),
    'gnts': ('gnts', {}),
    'gnts_fused': ('gnts_fused', {}),
    'cond_floor': ('cond_floor', {}),
    # The bookkeeping after the cond (counters, running sums, noise-scale EMAs).
    'no_count': ('gnts', {(_accumulation, '_count'): _count_only_acc_norm}),
    # No squared norm at all (neither the gradient's nor the new sum's).
    'no_norms': ('gnts', {(_accumulation, 'sq_norm'): _no_norm}),
    # The accumulator written without the finiteness check's or the reset's select.
    'plain_add': ('gnts', {(_accumulation, '_add'): _plain_add}),
    # No check of the state at trace time (each traces gate.init and inner.init).
    'no_checks': ('gnts', {(_accumulation, 'check_state'): lambda *a, **k: None}),
    # No second trace of the inner optimizer for the zero updates' shapes.
    'no_second_trace': ('gnts', {(_accumulation, 'jax'): 'eval_shape'}),
    # The fused step's updates added to the parameters without _numerics.rounded
    # (not bitwise equal to the Optax path).
    'no_rounded': ('gnts_fused', {(_accumulation, 'rounded'): lambda tree, zero: tree}),
    # Each squared norm as one reduction over the concatenated leaves.
    'norms_concatenated': ('gnts', {(_numerics, '_sum_sq'): _sum_sq_concatenated}),
    # Each leaf's squared norm as a dot product with itself.
    'norms_dot': ('gnts', {(_numerics, '_sum_sq'): _sum_sq_dot}),
}


@contextlib.contextmanager
def patched(replacements):
  saved = {key: getattr(*key) for key in replacements}
  try:
    for (module, name), new in replacements.items():
      if new == 'eval_shape':  # a copy of the jax module with another eval_shape
        new = types.SimpleNamespace(**vars(jax))
        new.eval_shape = _eval_shape_without_inner
      setattr(module, name, new)
    yield
  finally:
    for (module, name), old in saved.items():
      setattr(module, name, old)


def once(variant, params):
  candidate, replacements = VARIANTS[variant]
  with patched(replacements):
    return bench.compile_once(candidate, params)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--leaves', type=int, nargs='+', default=[8, 32])
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--variants', nargs='+', default=list(VARIANTS), choices=list(VARIANTS))
  args = parser.parse_args(argv)
  variants = ['adamw', *[v for v in args.variants if v != 'adamw']]
  jax.config.update('jax_enable_compilation_cache', False)
  print(f"{'leaves':>6s} {'variant':20s} {'trace s':>8s} {'total s':>8s} {'x adamw':>8s} "
        f"{'HLO instr':>10s} {'fusions':>8s}")  # fmt: skip
  for n in args.leaves:
    params = jax.eval_shape(functools.partial(bench.make_params, n))
    for v in variants:  # untimed: what JAX builds once per process
      once(v, params)
    runs = {v: [] for v in variants}
    for _ in range(args.rounds):
      for v in variants:
        runs[v].append(once(v, params))
    total = {
        v: statistics.median(r['trace_s'] + r['compile_s'] for r in rs) for v, rs in runs.items()
    }
    for v, rs in runs.items():
      trace = statistics.median(r['trace_s'] for r in rs)
      print(
          f"{n:6d} {v:20s} {trace:8.3f} {total[v]:8.3f} {total[v] / total['adamw']:8.2f} "
          f"{rs[-1]['instructions']:10d} {rs[-1]['fusions']:8d}",
          flush=True,
      )


if __name__ == '__main__':
  main()
