"""Per-microbatch cost of gated accumulation against MultiSteps and the floors.

All candidates run in one process on the same >= 5M float32 parameters, with
parameters and optimizer state donated, interleaved in rounds; the table gives
medians and ratios, since absolute times on a shared machine mean little.

    python benchmarks/accumulation.py [--json out.json] [--params 5_242_880]

Each timed call is one microbatch. Accumulating candidates take ``every``
microbatches per optimizer step, so a cycle of ``every`` calls holds one
step. Two paths:

- the *Optax path*: ``update`` plus ``optax.apply_updates``, as every Optax
  loop calls an optimizer. An accumulator must then write an update (zeros,
  or the step) and add it to the parameters on every microbatch;
- the *fused path*: ``optax_gqc.update_and_apply``, whose ``lax.cond``
  returns the new parameters: on a microbatch that only accumulates, they
  pass through unread.

Two floors:

- the *floor*: a bare "add to accumulator, take its global norm, reset when
  stepping" written as an Optax transformation, on the Optax path (no
  optimizer, no gate, no statistics): what the Optax-path targets compare with;
- the *raw floor*: the same pass with nothing returned or applied, the memory
  traffic of accumulating alone: what the fused targets compare with.

Exits with status 1 when a target fails.
"""

import argparse
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from _common import make_grads, make_params, measure, optimizer_step, ratio, tree_bytes
from _report import add_json_argument, finish, positive_int, print_targets

import optax_gqc


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


def gate_candidates(every: int) -> dict[str, tuple[Callable, Callable]]:
  """Each gate in the engine, set never to open: all step every ``every`` microbatches."""
  adamw = optax.adamw(1e-3)
  gates = optax_gqc.gates

  def with_loss(tx):  # MHT reads the loss: a scalar that varies with the microbatch
    def step(params, state, grads):
      loss = 1.0 + grads['layer0']['b'][0]
      updates, state = tx.update(grads, state, params, value=loss)
      return optax.apply_updates(params, updates), state

    return tx.init, step

  def engine(gate):
    return optax_gqc.accumulate(adamw, gate, max_draws=every, microbatch_size=16)

  return {
      'norm_below (GNTS), with noise-scale statistics': optimizer_step(
          engine(gates.norm_below(0.0))
      ),
      'noise_ratio_below (GNS)': optimizer_step(engine(gates.noise_ratio_below(0.0))),
      'norm_test (Byrd / AdAdaGrad)': optimizer_step(engine(gates.relative_error_below(0.0))),
      'loss_interval (MHT), value=loss': with_loss(engine(gates.loss_interval(0.95, 0.0))),
      'any_of(norm_below, norm_test)': optimizer_step(
          engine(gates.any_of(gates.norm_below(0.0), gates.relative_error_below(0.0)))
      ),
  }


def fused_step(tx: optax_gqc.AccumulationTransformation) -> tuple[Callable, Callable]:
  """``(init, step)`` for ``optax_gqc.update_and_apply``."""

  def step(params, state, grads):
    return optax_gqc.update_and_apply(tx, grads, state, params)

  return tx.init, step


LABELS = {
    'floor': 'floor (accumulate+norm+reset, as Optax)',
    'gnts': 'gnts(adamw), Optax path',
    'fused': 'gnts(adamw), fused update_and_apply',
    'multisteps': 'optax.MultiSteps(adamw)',
    'adamw': 'optax.adamw (steps every microbatch)',
    'raw_floor': 'raw floor (state only, nothing applied)',
}


def candidates(every: int) -> dict[str, tuple[Callable, Callable]]:
  """The candidates of the main table, by the keys of ``LABELS``."""
  adamw = optax.adamw(1e-3)
  gnts = optax_gqc.gnts(adamw, threshold=0.0, max_draws=every)  # steps every `every`
  return {
      'floor': optimizer_step(floor_transformation(every)),
      'gnts': optimizer_step(gnts),
      'fused': fused_step(gnts),
      'multisteps': optimizer_step(optax.MultiSteps(adamw, every).gradient_transformation()),
      'adamw': optimizer_step(adamw),
      'raw_floor': raw_floor_step(every),
  }


# Reductions keep a few row partial sums, well under 1% of the parameters: a
# buffer as large as one of the four weight matrices is 25%.
PARAM_SIZED = 0.01


def evaluate_targets(results: dict[str, dict[str, float]], param_bytes: int) -> dict[str, bool]:
  """Each target of the main table, by name: True where it is met."""
  temp = {name: r['temp_bytes'] for name, r in results.items()}
  return {
      'gnts <= 1.3x floor': ratio(results, 'gnts', 'floor') <= 1.3,
      'gnts <= 0.35x MultiSteps': ratio(results, 'gnts', 'multisteps') <= 0.35,
      'gnts temporaries <= one param-sized buffer': temp['gnts'] <= 1.001 * param_bytes,
      'fused <= 1.5x raw floor': ratio(results, 'fused', 'raw_floor') <= 1.5,
      'fused <= 0.6x one adamw step': ratio(results, 'fused', 'adamw') <= 0.6,
      'fused: no param-sized temporary': temp['fused'] < PARAM_SIZED * param_bytes,
      # XLA may compile a cond of elementwise branches to a select of both.
      'gnts and fused step in a compiled cond': all(
          results[name]['conditionals'] >= 1 for name in ('gnts', 'fused')
      ),
  }


def evaluate_gate_targets(gate_results: dict[str, dict[str, float]], param_bytes: int):
  """The gate table's targets: no gate costs much more than the norm gate."""
  base = next(iter(gate_results))
  worst = max(ratio(gate_results, name, base) for name in gate_results)
  base_temp = gate_results[base]['temp_bytes']
  extra_temp = max(r['temp_bytes'] - base_temp for r in gate_results.values())
  return {
      'every gate <= 1.05x the norm gate': worst <= 1.05,
      'no gate adds a param-sized temporary': extra_temp < PARAM_SIZED * param_bytes,
  }


def print_main_table(results, param_bytes: int, every: int) -> None:
  print(
      f"{'candidate (one step every ' + str(every) + ' microbatches)':44s} "
      f"{'ms/microbatch':>14s} {'x raw floor':>12s} {'x floor':>8s} {'x adamw':>8s} "
      f"{'temp MiB':>9s} {'temp/params':>12s} {'conds':>6s}"
  )
  for name, r in results.items():
    print(
        f"{LABELS[name]:44s} {r['ms']:14.2f} {ratio(results, name, 'raw_floor'):12.2f} "
        f"{ratio(results, name, 'floor'):8.2f} {ratio(results, name, 'adamw'):8.2f} "
        f"{r['temp_bytes'] / 2**20:9.1f} "
        f"{r['temp_bytes'] / param_bytes:12.3f} {r['conditionals']:6d}"
    )


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n')[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  parser.add_argument(
      '--params',
      type=positive_int,
      default=5_242_880,
      help='float32 parameters; the targets are set for millions: far'
      " below, fixed costs (the launches, the scalars, a reduction's partial sums) fail them",
  )
  parser.add_argument('--every', type=positive_int, default=8, help='microbatches per step')
  parser.add_argument(
      '--rounds', type=positive_int, default=7, help='timed rounds; the median counts'
  )
  parser.add_argument(
      '--cycles',
      type=positive_int,
      default=3,
      help='optimizer steps timed per round, each of --every microbatches',
  )
  add_json_argument(parser)
  args = parser.parse_args(argv)

  params = make_params(args.params)
  n_params = sum(x.size for x in jax.tree.leaves(params))
  param_bytes = tree_bytes(params)
  calls = args.cycles * args.every
  results = measure(
      candidates(args.every), params, make_grads(params), args.rounds, calls, warmup=args.every
  )
  print(
      f'{n_params / 1e6:.2f}M float32 parameters, {jax.devices()[0].platform}, '
      f'median of {args.rounds} rounds of {calls} microbatches; a ratio is the median of its '
      'ratio within each round'
  )
  print_main_table(results, param_bytes, args.every)
  pairs = [('gnts', 'floor'), ('gnts', 'multisteps'), ('fused', 'raw_floor')]
  pairs += [('fused', 'adamw'), ('fused', 'gnts')]
  print(', '.join(f'{a} / {b} = {ratio(results, a, b):.3f}' for a, b in pairs))
  targets = evaluate_targets(results, param_bytes)
  print_targets(targets)

  gate_cands = gate_candidates(args.every)
  gate_results = measure(
      gate_cands, params, make_grads(params), args.rounds, calls, warmup=args.every
  )
  base = next(iter(gate_cands))
  print(
      f"\n{'gate, Optax path (one step every ' + str(args.every) + ' microbatches)':48s} "
      f"{'ms/microbatch':>14s} {'x norm gate':>12s} {'temp MiB':>9s}"
  )
  for name, r in gate_results.items():
    print(
        f"{name:48s} {r['ms']:14.2f} {ratio(gate_results, name, base):12.3f} "
        f"{r['temp_bytes'] / 2**20:9.1f}"
    )
  gate_targets = evaluate_gate_targets(gate_results, param_bytes)
  print_targets(gate_targets)
  targets.update(gate_targets)
  data = {
      'params': n_params,
      'every': args.every,
      'rounds': args.rounds,
      'cycles': args.cycles,
      'device': jax.devices()[0].platform,
      'results': results,
      'gates': gate_results,
      # What the targets read: each the median of the within-round ratios.
      'ratios': {f'{a} / {b}': ratio(results, a, b) for a, b in pairs},
      'gate_ratios': {name: ratio(gate_results, name, base) for name in gate_results},
  }
  return finish(targets, args.json, data)


if __name__ == '__main__':
  sys.exit(main())
