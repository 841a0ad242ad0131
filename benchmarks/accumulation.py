"""Per-microbatch cost of gated accumulation against MultiSteps and the floor.

All candidates run in one process on the same >= 5M float32 parameters, with
parameters and optimizer state donated, interleaved in rounds; the table gives
medians and ratios, since absolute times on a shared machine mean little.

    python benchmarks/accumulation.py [--json out.json] [--params 5_000_000]

Each timed call is one microbatch: ``update`` plus ``optax.apply_updates``.
Accumulating candidates take ``every`` microbatches per optimizer step, so a
cycle of ``every`` calls holds one step. Two floors:

- the *floor*: a bare "add to accumulator, take its global norm, reset when
  stepping" written as an Optax transformation, in the same update-and-apply
  step as the others (no optimizer, no gate, no statistics). It writes an
  update (zeros or the mean) and applies it, as every accumulator in an Optax
  loop must: this is what the targets compare with;
- the *raw floor*: the same pass with nothing returned or applied, the memory
  traffic of accumulating alone, shown for reference.
"""

import argparse
import json
import statistics as stats
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

import optax_gqc


def make_params(total: int) -> dict[str, jax.Array]:
  """Four square-ish matrices and their biases, ``total`` floats in all."""
  width = int((total / 4) ** 0.5)
  keys = jax.random.split(jax.random.key(0), 4)
  return {
      f'layer{i}': {
          'w': jax.random.normal(k, (width, width), jnp.float32) * 0.02,
          'b': jnp.zeros((width,), jnp.float32),
      }
      for i, k in enumerate(keys)
  }


def optimizer_step(tx: optax.GradientTransformation) -> Callable:
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  return step


def _accumulate_and_norm(state, grads, every):
  acc, n = state
  acc = jax.tree.map(lambda a, g: jnp.where(n == 0, g, a + g), acc, grads)
  norm = optax.tree.norm(acc)
  reset = (norm >= 0) & (n + 1 == every)  # the norm decides, so it is computed
  return acc, jnp.where(reset, 0, n + 1), reset


def _floor_init(params):
  return optax.tree.zeros_like(params), jnp.zeros([], jnp.int32)


def raw_floor_step(every: int) -> tuple[Callable, Callable]:
  """Add to the accumulator, take the global norm, reset: nothing returned."""

  def step(params, state, grads):
    acc, n, _ = _accumulate_and_norm(state, grads, every)
    return params, (acc, n)

  return _floor_init, step


def floor_transformation(every: int) -> optax.GradientTransformation:
  """The bare pass as an Optax transformation: the mean on a reset, else zeros."""

  def update(grads, state, params=None):
    del params
    acc, n, reset = _accumulate_and_norm(state, grads, every)
    updates = jax.lax.cond(
        reset,
        lambda a: jax.tree.map(lambda x: x / every, a),
        optax.tree.zeros_like,
        acc,
    )
    return updates, (acc, n)

  return optax.GradientTransformation(_floor_init, update)


def candidates(every: int) -> dict[str, tuple[Callable, Callable]]:
  adamw = optax.adamw(1e-3)
  gnts = optax_gqc.gnts(adamw, threshold=0.0, max_draws=every)
  multi = optax.MultiSteps(adamw, every)
  floor = floor_transformation(every)
  return {
      'floor (accumulate+norm+reset, as Optax)': (floor.init, optimizer_step(floor)),
      f'optax_gqc.gnts(adamw, 0.0, max_draws={every})': (gnts.init, optimizer_step(gnts)),
      f'optax.MultiSteps(adamw, {every})': (multi.init, optimizer_step(multi)),
      'optax.adamw (steps every microbatch)': (adamw.init, optimizer_step(adamw)),
      'raw floor (state only, nothing applied)': raw_floor_step(every),
  }


def measure(
    cands: dict[str, tuple[Callable, Callable]],
    params: Any,
    grads: list[Any],
    every: int,
    rounds: int,
    cycles: int,
) -> dict[str, dict[str, float]]:
  runs = {}
  for name, (init, step) in cands.items():
    p = jax.tree.map(jnp.copy, params)
    s = init(p)
    fn = jax.jit(step, donate_argnums=(0, 1))
    compiled = fn.lower(p, s, grads[0]).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    for i in range(every):  # warm up
      p, s = compiled(p, s, grads[i % len(grads)])
    jax.block_until_ready((p, s))
    runs[name] = {'compiled': compiled, 'p': p, 's': s, 'times': [], 'temp': temp}
  for _ in range(rounds):
    for run in runs.values():
      p, s, compiled = run['p'], run['s'], run['compiled']
      start = time.perf_counter()
      for i in range(cycles * every):
        p, s = compiled(p, s, grads[i % len(grads)])
      jax.block_until_ready((p, s))
      run['times'].append((time.perf_counter() - start) / (cycles * every))
      run['p'], run['s'] = p, s
  return {
      name: {'ms_per_microbatch': 1e3 * stats.median(r['times']), 'temp_bytes': r['temp']}
      for name, r in runs.items()
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--params', type=int, default=5_242_880)
  parser.add_argument('--every', type=int, default=8)
  parser.add_argument('--rounds', type=int, default=7)
  parser.add_argument('--cycles', type=int, default=3)
  parser.add_argument('--json', type=str, default=None)
  args = parser.parse_args()

  params = make_params(args.params)
  n_params = sum(x.size for x in jax.tree.leaves(params))
  param_bytes = 4 * n_params
  keys = jax.random.split(jax.random.key(1), 4)
  grads = [jax.tree.map(lambda x, k=k: jax.random.normal(k, x.shape) * 1e-3, params)
           for k in keys]
  cands = candidates(args.every)
  results = measure(cands, params, grads, args.every, args.rounds, args.cycles)

  names = list(cands)
  floor, ours, multi, adamw, raw = (results[n]['ms_per_microbatch'] for n in names)
  print(f'{n_params / 1e6:.2f}M float32 parameters, {jax.devices()[0].platform}, '
        f'one optimizer step every {args.every} microbatches, median of {args.rounds} rounds')
  print(f"{'candidate':48s} {'ms/microbatch':>14s} {'x floor':>8s} {'x adamw':>8s} "
        f"{'temp MiB':>9s} {'temp/params':>12s}")
  for name in names:
    r = results[name]
    print(f"{name:48s} {r['ms_per_microbatch']:14.2f} {r['ms_per_microbatch'] / floor:8.2f} "
          f"{r['ms_per_microbatch'] / adamw:8.2f} {r['temp_bytes'] / 2**20:9.1f} "
          f"{r['temp_bytes'] / param_bytes:12.2f}")
  ours_temp = results[names[1]]['temp_bytes']
  # Reductions keep a few row partial sums (under 0.1% of the parameters);
  # the bound is on param-sized buffers.
  targets = {
      'gnts <= 1.3x floor': ours / floor <= 1.3,
      'gnts <= 0.35x MultiSteps': ours / multi <= 0.35,
      'gnts temporaries <= one param-sized buffer': ours_temp <= 1.001 * param_bytes,
  }
  print(f'gnts / floor = {ours / floor:.3f}, gnts / MultiSteps = {ours / multi:.3f}, '
        f'gnts / raw floor = {ours / raw:.3f}')
  for target, ok in targets.items():
    print(f"{'PASS' if ok else 'FAIL'}  {target}")
  if args.json:
    with open(args.json, 'w') as f:
      json.dump({'params': n_params, 'every': args.every, 'results': results,
                 'targets': targets, 'device': jax.devices()[0].platform}, f, indent=2)


if __name__ == '__main__':
  main()
