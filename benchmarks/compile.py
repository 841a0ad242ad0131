"""Trace and compile time of one jitted train step, gated accumulation against Optax.

All candidates run in one process on the same narrow MLP, at a few depths
(counted in parameter leaves: a weight and a bias per layer), interleaved in
rounds; the table gives medians and ratios, since absolute times on a shared
machine mean little.

    python benchmarks/compile.py [--json out.json] [--leaves 8 32 128] [--rounds 3]

The step is the whole of a training step: the loss's gradient, the optimizer's
update and its application (the loss gate, ``loss_interval``, also gets the
loss, ``value=loss``), jitted with the parameters and the state donated.
Each measurement builds a fresh optimizer and a fresh step function, so that no
trace is reused, with JAX's persistent compilation cache off. *Trace* is
``jax.jit(step).lower(...)`` (tracing and lowering to StableHLO), *compile* is
``.compile()`` (XLA's optimization and code generation), both timed with
Python's garbage collector off. Beside each time the
size of the optimized program: its HLO instructions, fusions and conditionals
in ``compiled.as_text()``. A reference row, ``cond_floor``, is adamw in a bare
``lax.cond`` with an accumulator and nothing else (and, as in the engine, a
barrier that keeps the cond): what any accumulation that steps in one cond
compiles to here. A second, ``least_gnts``, is that cond stepping on GNTS's
relative test of the two squared norms, with the skip of a non-finite
microbatch and one counter: the least any GNTS compiles to here. Neither has
a target.

Targets, ratios within one run at every depth: ``gnts`` at most 1.5x
``optax.adamw``'s trace+compile time, on the Optax path and fused; every other
gate of the engine within 1.2x of ``gnts`` on the Optax path.

Exits with status 1 when a target fails.
"""

import argparse
import contextlib
import functools
import gc
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import optax
from _common import hlo_size
from _report import add_json_argument, finish, positive_int, print_targets
from jax.experimental.compilation_cache import compilation_cache

import optax_gqc
from optax_gqc._numerics import kept_cond, sq_norm

WIDTH = 16

LABELS = {
    'adamw': 'optax.adamw',
    'multisteps': 'optax.MultiSteps(adamw, 8)',
    'sbc': 'sbc(adamw, 8, 1)',
    'gnts': 'gnts(adamw), Optax path',
    'gnts_fused': 'gnts(adamw), fused update_and_apply',
    'critical': 'accumulate(adamw, critical_batch(0.5, 1))',
    'noise_ratio': 'noise_ratio_accumulation(adamw, 0.1)',
    'loss_interval': 'accumulate(adamw, loss_interval(0.95, 0.1))',
    'cond_floor': 'reference: adamw in a bare lax.cond, every 8',
    'least_gnts': 'reference: the least GNTS, on both norms',
}

# The candidates held to within GATE_RATIO of gnts on the Optax path.
GATES = ('sbc', 'critical', 'noise_ratio', 'loss_interval')
GNTS_RATIO = 1.5
GATE_RATIO = 1.2


def make_params(leaves: int) -> dict[str, Any]:
  """A narrow MLP of ``leaves // 2`` layers, each a ``WIDTH``-square weight and a bias."""
  keys = jax.random.split(jax.random.key(0), leaves // 2)
  return {
      f'layer{i:03d}': {
          'w': jax.random.normal(k, (WIDTH, WIDTH), jnp.float32) / WIDTH**0.5,
          'b': jnp.zeros((WIDTH,), jnp.float32),
      }
      for i, k in enumerate(keys)
  }


def loss_fn(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
  for layer in params.values():
    x = jnp.tanh(x @ layer['w'] + layer['b'])
  return jnp.mean(jnp.square(x - y))


def cond_floor(inner: optax.GradientTransformation, every: int) -> optax.GradientTransformation:
  """The least a cond-based accumulation compiles to: a sum, a count, ``inner`` in a cond.

  No norm, no gate, no statistics, no checks: what any accumulation that runs
  its optimizer in one ``lax.cond`` costs to compile on this backend. Not a
  usable optimizer, a reference row.
  """

  def init(params):
    return jnp.zeros([], jnp.int32), optax.tree.zeros_like(params), inner.init(params)

  def update(grads, state, params=None):
    count, acc, inner_state = state
    acc = jax.tree.map(lambda a, g: jnp.where(count == 0, g, a + g), acc, grads)
    step = count + 1 >= every

    def do_step(acc, inner_state, params):
      updates, inner_state = inner.update(
          jax.tree.map(lambda a: a / every, acc), inner_state, params
      )
      # The flag keeps the cond a cond on every backend, as in the engine.
      return updates, inner_state, kept_cond(jnp.asarray(True))

    def do_accumulate(acc, inner_state, params):
      return optax.tree.zeros_like(acc), inner_state, jnp.asarray(False)

    updates, inner_state, stepped = jax.lax.cond(
        step, do_step, do_accumulate, acc, inner_state, params
    )
    return updates, (jnp.where(stepped, 0, count + 1), acc, inner_state)

  return optax.GradientTransformation(init, update)


def least_gnts(
    inner: optax.GradientTransformation, max_draws: int, relative: bool, finite: bool = False
) -> optax_gqc.AccumulationTransformation:
  """The bare cond, stepping on GNTS's decision and on nothing else.

  With ``relative``, it steps when ``||mean|| <= 0.5 ||g||`` (both squared
  norms, as `gnts`'s relative threshold reads them); otherwise when ``||mean||
  <= 0.1``. With ``finite``, a microbatch with a non-finite norm is skipped.
  One counter, no statistics, no noise scale, no checks: the least any GNTS
  compiles to on this backend. Not a usable optimizer, a reference row. Like the
  engine, it has a fused path (:func:`optax_gqc.update_and_apply`), whose cond
  returns the new parameters.
  """

  def init(params):
    return jnp.zeros([], jnp.int32), optax.tree.zeros_like(params), inner.init(params)

  def step_fn(grads, state, params, apply):
    count, acc, inner_state = state
    grad_sq = sq_norm(grads)
    ok = jnp.isfinite(grad_sq) if finite else jnp.asarray(True)
    acc = jax.tree.map(lambda a, g: jnp.where(ok, jnp.where(count == 0, g, a + g), a), acc, grads)
    n = count + 1
    mean_sq = sq_norm(acc) / jnp.square(n.astype(jnp.float32))
    bound = 0.25 * grad_sq if relative else 0.01
    step = ok & ((mean_sq <= bound) | (n >= max_draws))

    def do_step(acc, inner_state, params):
      updates, inner_state = inner.update(jax.tree.map(lambda a: a / n, acc), inner_state, params)
      out = optax.apply_updates(params, updates) if apply else updates
      return out, inner_state, kept_cond(jnp.asarray(True))  # as in cond_floor

    def do_accumulate(acc, inner_state, params):
      return (params if apply else optax.tree.zeros_like(acc)), inner_state, jnp.asarray(False)

    out, inner_state, stepped = jax.lax.cond(step, do_step, do_accumulate, acc, inner_state, params)
    return out, (jnp.where(stepped, 0, jnp.where(ok, n, count)), acc, inner_state)

  return optax_gqc.AccumulationTransformation(
      init,
      lambda grads, state, params=None: step_fn(grads, state, params, apply=False),
      lambda grads, state, params: step_fn(grads, state, params, apply=True),
  )


def make_optimizer(name: str) -> tuple[optax.GradientTransformation, bool]:
  """A fresh ``(optimizer, fused)`` for a key of ``LABELS``."""
  adamw = optax.adamw(1e-3)
  gates = optax_gqc.gates
  if name == 'adamw':
    return adamw, False
  if name == 'multisteps':
    return optax.MultiSteps(adamw, 8).gradient_transformation(), False
  if name == 'sbc':
    return optax_gqc.sbc(adamw, 8, 1), False
  if name in ('gnts', 'gnts_fused'):
    return optax_gqc.gnts(adamw), name == 'gnts_fused'
  if name == 'critical':
    return optax_gqc.accumulate(adamw, gates.critical_batch(0.5, 1)), False
  if name == 'noise_ratio':
    return optax_gqc.noise_ratio_accumulation(adamw, 0.1), False
  if name == 'loss_interval':
    return optax_gqc.accumulate(adamw, gates.loss_interval(0.95, 0.1)), False
  if name == 'cond_floor':
    return cond_floor(adamw, 8), False
  if name == 'least_gnts':
    return least_gnts(adamw, 64, relative=True, finite=True), False
  raise ValueError(f'unknown candidate {name!r}')


def make_step(tx: optax.GradientTransformation, fused: bool, loss: bool = False) -> Callable:
  """A fresh train step: loss gradient, optimizer update, apply; with ``loss``, ``value=loss``."""

  def step(params, state, x, y):
    value, grads = jax.value_and_grad(loss_fn)(params, x, y)  # value: dead code unless read
    if fused:
      return optax_gqc.update_and_apply(tx, grads, state, params)
    updates, state = tx.update(grads, state, params, **({'value': value} if loss else {}))
    return optax.apply_updates(params, updates), state

  return step


def jitted_step(
    tx: optax.GradientTransformation, fused: bool, params: Any, loss: bool = False
) -> tuple[Callable, tuple]:
  """``tx``'s jitted train step, not yet traced, and the shapes to lower it on."""
  state = jax.eval_shape(tx.init, params)
  x = jax.ShapeDtypeStruct((8, WIDTH), jnp.float32)
  step = jax.jit(make_step(tx, fused, loss=loss), donate_argnums=(0, 1))
  return step, (params, state, x, x)


def fresh_step(name: str, params: Any) -> tuple[Callable, tuple]:
  """Candidate ``name``'s jitted train step, not yet traced, and the shapes to lower it on."""
  tx, fused = make_optimizer(name)
  return jitted_step(tx, fused, params, loss=name == 'loss_interval')


@contextlib.contextmanager
def gc_off() -> Iterator[None]:
  """Python's garbage collector off, after a collection, as ``timeit`` times.

  A full collection takes about 60 ms here, and would otherwise fall on
  whichever candidate happened to allocate past its threshold, round after round.
  """
  gc.collect()
  gc.disable()
  try:
    yield
  finally:
    gc.enable()


def compile_once(name: str, params: Any) -> dict[str, Any]:
  """Seconds to trace and to compile a fresh step (under :func:`gc_off`), and the program's size."""
  step, args = fresh_step(name, params)
  with gc_off():
    start = time.perf_counter()
    lowered = step.lower(*args)
    traced = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
  return {'trace_s': traced - start, 'compile_s': done - traced, **hlo_size(compiled.as_text())}


def measure(names: list[str], leaves: list[int], rounds: int) -> dict[int, dict[str, dict]]:
  """Median trace, compile and total seconds per depth and candidate, with HLO sizes.

  One untimed round first, so that what JAX builds once per process (the
  jitted pieces of ``jax.numpy``, say) counts for none of them.
  """
  shapes = {n: jax.eval_shape(functools.partial(make_params, n)) for n in leaves}
  for n in leaves:
    for name in names:
      compile_once(name, shapes[n])
  runs = {n: {name: [] for name in names} for n in leaves}
  for _ in range(rounds):
    for n in leaves:
      for name in names:
        runs[n][name].append(compile_once(name, shapes[n]))
  out = {}
  for n in leaves:
    out[n] = {}
    for name, rs in runs[n].items():
      out[n][name] = {
          'trace_s': statistics.median(r['trace_s'] for r in rs),
          'compile_s': statistics.median(r['compile_s'] for r in rs),
          'total_s': statistics.median(r['trace_s'] + r['compile_s'] for r in rs),
          **{k: rs[-1][k] for k in ('instructions', 'fusions', 'conditionals')},
      }
  return out


def evaluate_targets(results: dict[int, dict[str, dict]]) -> dict[str, bool]:
  """Each target, by name and depth: True where it is met."""
  targets = {}
  for n, r in results.items():
    total = {name: c['total_s'] for name, c in r.items()}
    for name in ('gnts', 'gnts_fused'):
      targets[f'{n} leaves: {name} <= {GNTS_RATIO}x adamw'] = (
          total[name] <= GNTS_RATIO * total['adamw']
      )
    for name in GATES:
      targets[f'{n} leaves: {name} <= {GATE_RATIO}x gnts'] = (
          total[name] <= GATE_RATIO * total['gnts']
      )
  return targets


def print_table(results: dict[int, dict[str, dict]]) -> None:
  print(
      f"{'leaves':>6s} {'candidate':44s} {'trace s':>8s} {'compile s':>10s} {'total s':>8s} "
      f"{'x adamw':>8s} {'x gnts':>7s} {'HLO instr':>10s} {'fusions':>8s} {'conds':>6s}"
  )
  for n, r in results.items():
    adamw, gnts = r['adamw']['total_s'], r['gnts']['total_s']
    for name, c in r.items():
      print(
          f"{n:6d} {LABELS[name]:44s} {c['trace_s']:8.3f} {c['compile_s']:10.3f} "
          f"{c['total_s']:8.3f} {c['total_s'] / adamw:8.2f} {c['total_s'] / gnts:7.2f} "
          f"{c['instructions']:10d} {c['fusions']:8d} {c['conditionals']:6d}"
      )


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n')[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  parser.add_argument(
      '--leaves',
      type=positive_int,
      nargs='+',
      default=[8, 32, 128],
      help='parameter leaves of the MLP (a weight and a bias per layer), one program each',
  )
  parser.add_argument(
      '--rounds', type=positive_int, default=3, help='fresh traces and compiles; the median counts'
  )
  add_json_argument(parser)
  args = parser.parse_args(argv)
  if any(n < 2 or n % 2 for n in args.leaves):
    parser.error('--leaves: each must be an even number >= 2 (a weight and a bias per layer)')

  # Compile every time. JAX decides on its persistent cache at a process's first compile
  # and keeps to it: reset, the next compile decides again, with the flag off.
  cache = jax.config.jax_enable_compilation_cache
  jax.config.update('jax_enable_compilation_cache', False)
  compilation_cache.reset_cache()
  try:
    results = measure(list(LABELS), args.leaves, args.rounds)
  finally:
    jax.config.update('jax_enable_compilation_cache', cache)
    compilation_cache.reset_cache()
  print(
      f'an MLP of width {WIDTH}, {jax.devices()[0].platform}, median of {args.rounds} rounds, '
      'each a fresh trace and compile'
  )
  print_table(results)
  targets = evaluate_targets(results)
  print_targets(targets)
  data = {
      'width': WIDTH,
      'rounds': args.rounds,
      'device': jax.devices()[0].platform,
      'results': {str(n): r for n, r in results.items()},
  }
  return finish(targets, args.json, data)


if __name__ == '__main__':
  sys.exit(main())
