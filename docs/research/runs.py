"""Runs arms given as a JSON list and appends one JSON line each to a results file.

    python docs/research/runs.py '[{"kind": "fixed", "k": 2, "lr": 4.2e-3, "seed": 1}]' out.jsonl

Kinds: fixed (k microbatches per step), critical (gates.critical_batch with
fraction f), gnts (relative ratio with the norm-test valve), sbc_warmup (linear
in tokens from 1 to k_end microbatches), pattern (steps of 2, 1, 1, 1
microbatches), seesaw (the batch grows as peak / lr(t), rounded up, or by
"rounding": "floor" / "round"). "sqrt": true scales each step by the square
root of the microbatches averaged; "seeded_val": true draws the validation
windows as rounds 1 to 3 did. It imports harness.py from its own folder.
"""

import json
import sys

import jax.numpy as jnp
from harness import lr_by_tokens, make_tx, run, setup

from optax_gqc import gates

MB = 8


def arm(spec, count):
  kind = spec['kind']
  lr = lr_by_tokens(spec['lr'], count)
  scale = jnp.sqrt if spec.get('sqrt') else None
  if kind == 'fixed':
    return make_tx(gates.batch_size_at_least(spec['k'] * MB, MB), lr, MB, max_draws=spec['k'])
  if kind == 'critical':
    g = gates.critical_batch(
        spec['f'],
        MB,
        probe_every=spec.get('probe', 4),
        min_batch_size=spec.get('min', 1) * MB,
        max_batch_size=spec.get('max', 32) * MB,
    )
    return make_tx(g, lr, MB, scale=scale)
  if kind == 'gnts':
    g = gates.any_of(
        gates.norm_below(spec.get('ratio', 0.5), relative=True),
        gates.relative_error_below(spec.get('eta', 0.8)),
    )
    return make_tx(g, lr, MB, max_draws=spec.get('max_draws', 32), scale=scale)
  if kind == 'sbc_warmup':
    # logical batch grows linearly in tokens from 1 to k_end microbatches
    k_end = spec['k_end']

    def sched(t):
      return MB * (1 + (k_end - 1) * jnp.minimum(t / (spec.get('ramp', 1.0) * count), 1.0))

    return make_tx(gates.batch_size_at_least(sched, MB), lr, MB, scale=scale)
  if kind == 'pattern':
    # steps of 2, 1, 1, 1 microbatches, as the critical gate's probes make them
    g = gates.from_function(lambda st: (st.num_draws >= 2) | ((st.num_microbatches % 5) >= 2))
    return make_tx(g, lr, MB, scale=scale)
  if kind == 'seesaw':
    # the batch replaces the lr decay: n(t) = peak / lr(t) after warmup, capped
    peak = spec['lr']
    cap = spec.get('cap', 16)
    rnd = {'ceil': lambda x: x, 'floor': jnp.floor, 'round': jnp.round}[
        spec.get('rounding', 'ceil')
    ]

    def sched(t):
      return MB * jnp.clip(rnd(peak / jnp.maximum(lr(t), 1e-12)), 1.0, cap)

    w = max(int(0.05 * count), 1)

    def sched2(t):
      return jnp.where(t < w, MB, sched(t))

    g = gates.batch_size_at_least(sched2, MB)
    if 'f' in spec:  # cap by the noise scale too: step when either rule is met
      g = gates.any_of(g, gates.critical_batch(spec['f'], MB, probe_every=4))
    return make_tx(g, lr, MB, scale=scale, max_draws=cap)
  raise ValueError(kind)


if __name__ == '__main__':
  specs = json.loads(sys.argv[1])
  out = sys.argv[2] if len(sys.argv) > 2 else 'results.jsonl'
  seed = 0
  cache = {}
  for spec in specs:
    seed = spec.get('seed', 0)
    size = spec.get('size', 'base')
    key = (seed, size, spec.get('seeded_val', False))
    if key not in cache:
      cache[key] = setup(seed=seed, seeded_val=spec.get('seeded_val', False))
    train, val, count = cache[key]
    dims = {
        'base': dict(dim=96, layers=3, heads=4),
        'small': dict(dim=64, layers=2, heads=4),
        'large': dict(dim=128, layers=4, heads=4),
    }[size]
    r = run(arm(spec, count), train, val, seed=seed, **dims)
    rec = {
        'spec': spec,
        'final': r['final'],
        'curve': r['curve'],
        'seconds': r['seconds'],
        'steps_trace': r['steps_trace'][::1],
        'fixed_val': True,
    }
    with open(out, 'a') as f:
      f.write(json.dumps(rec) + '\n')
    print(
        json.dumps(spec),
        '->',
        round(r['final']['val_loss'], 4),
        r['final']['steps'],
        'steps',
        round(r['seconds']),
        's',
        flush=True,
    )
