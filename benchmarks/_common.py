"""What the benchmarks share: parameters, the training step, interleaved timing.

Every candidate is a pair ``(init, step)`` with ``step(params, state, grads) ->
(params, state)``. Each is compiled with parameters and state donated, warmed
up, then timed in rounds that interleave the candidates, so that a slow spell
of this shared machine hits them all alike. A ratio of two candidates is the
median over rounds of their ratio within each round (:func:`ratio`): the
machine's speed drifts between rounds and runs, and a round's candidates run
seconds apart.
"""

import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax


def make_params(total: int) -> dict[str, Any]:
  """Four square-ish float32 matrices and their biases, about ``total`` floats."""
  width = int((total / 4) ** 0.5)
  keys = jax.random.split(jax.random.key(0), 4)
  return {
      f'layer{i}': {
          'w': jax.random.normal(k, (width, width), jnp.float32) * 0.02,
          'b': jnp.zeros((width,), jnp.float32),
      }
      for i, k in enumerate(keys)
  }


def make_grads(params: Any, num: int = 4, scale: float = 1e-3) -> list[Any]:
  keys = jax.random.split(jax.random.key(1), num)
  return [jax.tree.map(lambda x, k=k: jax.random.normal(k, x.shape) * scale, params) for k in keys]


def tree_bytes(tree: Any) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def optimizer_step(tx: optax.GradientTransformation) -> tuple[Callable, Callable]:
  """``(init, step)`` for one ``update`` plus ``optax.apply_updates``."""

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  return tx.init, step


def hlo_size(text: str) -> dict[str, int]:
  """Instructions, fusions and conditionals of an optimized HLO module's text."""
  instructions = [line for line in text.splitlines() if re.match(r'\s+(ROOT )?%?[\w.-]+ = ', line)]
  return {
      'instructions': len(instructions),
      'fusions': sum(bool(re.search(r' fusion\(', line)) for line in instructions),
      'conditionals': sum(bool(re.search(r' conditional\(', line)) for line in instructions),
  }


def measure(
    cands: dict[str, tuple[Callable, Callable]],
    params: Any,
    grads: list[Any],
    rounds: int,
    calls: int,
    warmup: int = 3,
) -> dict[str, dict[str, float]]:
  """Each candidate's median milliseconds per call (and each round's), temporaries, state, conds."""
  runs = {}
  for name, (init, step) in cands.items():
    p = jax.tree.map(jnp.copy, params)
    s = init(p)
    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(p, s, grads[0]).compile()
    run = {
        'compiled': compiled,
        'times': [],
        'state_bytes': tree_bytes(s),
        'temp_bytes': compiled.memory_analysis().temp_size_in_bytes,
        'conditionals': hlo_size(compiled.as_text())['conditionals'],
    }
    for i in range(warmup):
      p, s = compiled(p, s, grads[i % len(grads)])
    run['p'], run['s'] = jax.block_until_ready((p, s))
    runs[name] = run
  for _ in range(rounds):
    for run in runs.values():
      p, s, compiled = run['p'], run['s'], run['compiled']
      start = time.perf_counter()
      for i in range(calls):
        p, s = compiled(p, s, grads[i % len(grads)])
      jax.block_until_ready((p, s))
      run['times'].append((time.perf_counter() - start) / calls)
      run['p'], run['s'] = p, s
  return {
      name: {
          'ms': 1e3 * statistics.median(r['times']),
          'round_ms': [1e3 * t for t in r['times']],
          'temp_bytes': r['temp_bytes'],
          'state_bytes': r['state_bytes'],
          'conditionals': r['conditionals'],
      }
      for name, r in runs.items()
  }


def ratio(results: dict[str, dict[str, Any]], name: str, base: str) -> float:
  """``name``'s time over ``base``'s: the median over rounds of their ratio within a round."""
  pairs = zip(results[name]['round_ms'], results[base]['round_ms'], strict=True)
  return statistics.median(a / b for a, b in pairs)
