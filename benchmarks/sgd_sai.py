"""State size and per-update cost of sgd_sai against AdamW and SGD with momentum.

All candidates run in one process on the same >= 5M float32 parameters, with
parameters and optimizer state donated, interleaved in rounds; the table gives
medians and ratios, since absolute times on a shared machine mean little.

    python benchmarks/sgd_sai.py [--json out.json] [--params 5_242_880]

Each timed call is one optimizer step: ``update`` plus ``optax.apply_updates``.
The g-SNR is taken during warm-up, so the timed steps are the steady state.
The extra row chains the momentum before the g-SNR scaling (the order of the
paper's pseudocode); sgd_sai scales first, which gives the same update.
"""

import argparse
import json
import sys

import jax
import optax
from _common import make_grads, make_params, measure, optimizer_step, ratio, tree_bytes
from _report import add_json_argument, positive_int

from optax_gqc import _sgd_sai


def momentum_first(learning_rate: float) -> optax.GradientTransformation:
  """The same update with the momentum chained before the g-SNR scaling."""
  return optax.chain(
      _sgd_sai._momentum(0.9),
      _sgd_sai.scale_by_gsnr(),
      optax.add_decayed_weights(1e-2),
      optax.scale_by_learning_rate(learning_rate),
  )


def candidates() -> dict[str, optax.GradientTransformation]:
  return {
      'optax_gqc sgd_sai(1e-3)': _sgd_sai.sgd_sai(1e-3),
      'sgd_sai, momentum before g-SNR': momentum_first(1e-3),
      'optax.sgd(1e-3, momentum=0.9)': optax.sgd(1e-3, momentum=0.9),
      'optax.adamw(1e-3)': optax.adamw(1e-3),
  }


def main(argv: list[str] | None = None) -> int:
  """Prints the table; returns 1 if a target fails, else 0."""
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n')[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  parser.add_argument('--params', type=positive_int, default=5_242_880, help='float32 parameters')
  parser.add_argument(
      '--rounds', type=positive_int, default=9, help='timed rounds; the median counts'
  )
  parser.add_argument('--iters', type=positive_int, default=20, help='updates per round')
  add_json_argument(parser)
  args = parser.parse_args(argv)

  params = make_params(args.params)
  n_params = sum(x.size for x in jax.tree.leaves(params))
  param_bytes = tree_bytes(params)
  cands = {name: optimizer_step(tx) for name, tx in candidates().items()}
  results = measure(cands, params, make_grads(params), args.rounds, args.iters)

  names = list(cands)
  ours, adamw = results[names[0]], results[names[3]]
  print(
      f'{n_params / 1e6:.2f}M float32 parameters ({param_bytes / 2**20:.1f} MiB), '
      f'{jax.devices()[0].platform}, median of {args.rounds} rounds of {args.iters} updates'
  )
  print(
      f"{'candidate':32s} {'state MiB':>10s} {'x adamw':>8s} {'ms/update':>10s} "
      f"{'x sgd-m':>8s} {'x adamw':>8s} {'temp MiB':>9s}"
  )
  for name in names:
    r = results[name]
    print(
        f"{name:32s} {r['state_bytes'] / 2**20:10.2f} "
        f"{r['state_bytes'] / adamw['state_bytes']:8.3f} {r['ms']:10.2f} "
        f'{ratio(results, name, names[2]):8.3f} '
        f"{ratio(results, name, names[3]):8.3f} {r['temp_bytes'] / 2**20:9.1f}"
    )
  state_ratio = ours['state_bytes'] / adamw['state_bytes']
  time_ratio = ratio(results, names[0], names[2])
  ratios = {
      'state_vs_adamw': state_ratio,
      'time_vs_sgd_momentum': time_ratio,
      'time_vs_adamw': ratio(results, names[0], names[3]),
  }
  targets = {
      'sgd_sai state <= 0.51x adamw': state_ratio <= 0.51,
      'sgd_sai update time <= 1.1x sgd(momentum=0.9)': time_ratio <= 1.1,
  }
  for (target, ok), value in zip(targets.items(), (state_ratio, time_ratio), strict=True):
    print(f"{'PASS' if ok else 'FAIL'}  {target} ({value:.3f})")
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(
          {
              'params': n_params,
              'device': jax.devices()[0].platform,
              'rounds': args.rounds,
              'iters': args.iters,
              'results': results,
              'ratios': ratios,
              'targets': targets,
          },
          f,
          indent=2,
      )
  return 0 if all(targets.values()) else 1


if __name__ == '__main__':
  sys.exit(main())
