"""The least a GNTS step compiles to, built up a piece at a time to the engine's.

A record of the measurement behind docs/benchmarks.md ("What the algorithm
costs, and what the engine's state costs"), not a benchmark: the steps
between the bare cond and the engine (``benchmarks/compile.py``'s
``least_gnts``, whose cond has returned a flag through a barrier, as the
engine's does, since it moved there) are not usable optimizers (no
statistics, no noise scale, no checks).
Each candidate is ``benchmarks/compile.py``'s train step, on the Optax path or
fused, compiled fresh and interleaved in rounds with adamw's; the table gives
the median trace + compile time of ``--rounds`` (after one untimed round) and
its ratio to adamw's. Run from the repository root:

    python docs/compile/minimal.py [--leaves 8 32] [--rounds 5]
"""

import argparse
import functools
import pathlib
import statistics
import sys
import time

import jax
import optax

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / 'benchmarks'))
import compile as bench  # noqa: E402  (benchmarks/compile.py)

import optax_gqc  # noqa: E402


def adamw() -> optax.GradientTransformation:
  return optax.adamw(1e-3)


def _minimal_with_skip() -> optax_gqc.AccumulationTransformation:
  return bench.least_gnts(adamw(), 64, relative=True, finite=True)


def _gnts() -> optax.GradientTransformation:
  return bench.make_optimizer('gnts')[0]


# name: (the optimizer, whether the step goes through update_and_apply)
CANDIDATES = {
    'optax.adamw': (adamw, False),
    'adamw in a bare cond, every 8': (lambda: bench.cond_floor(adamw(), 8), False),
    "+ the mean's norm: ||mean|| <= 0.1": (
        lambda: bench.least_gnts(adamw(), 64, relative=False),
        False,
    ),
    "+ the gradient's: ||mean|| <= 0.5 ||g||": (
        lambda: bench.least_gnts(adamw(), 64, relative=True),
        False,
    ),
    '+ the skip of a non-finite microbatch': (_minimal_with_skip, False),
    'the engine: accumulate(adamw, norm_below(0.1))': (
        lambda: optax_gqc.accumulate(adamw(), optax_gqc.gates.norm_below(0.1)),
        False,
    ),
    'gnts(adamw), its default gate': (_gnts, False),
    'fused: the minimal step, with the skip': (_minimal_with_skip, True),
    'fused: gnts(adamw)': (_gnts, True),
}


def compile_seconds(make, fused: bool, params) -> tuple[float, int, int]:
  """Trace + compile seconds of a fresh train step with ``make()``, its instructions and fusions."""
  step, args = bench.jitted_step(make(), fused, params)
  with bench.gc_off():
    start = time.perf_counter()
    compiled = step.lower(*args).compile()
    seconds = time.perf_counter() - start
  size = bench.hlo_size(compiled.as_text())
  return seconds, size['instructions'], size['fusions']


def table(candidates, leaves: list[int], rounds: int) -> None:
  """Prints each of ``candidates`` (name: ``(make, fused)``, adamw's first) against adamw's."""
  jax.config.update('jax_enable_compilation_cache', False)
  for n in leaves:
    params = jax.eval_shape(functools.partial(bench.make_params, n))
    for make, fused in candidates.values():  # untimed: what JAX builds once per process
      compile_seconds(make, fused, params)
    times = {name: [] for name in candidates}
    sizes = {}
    for _ in range(rounds):
      for name, (make, fused) in candidates.items():
        seconds, *sizes[name] = compile_seconds(make, fused, params)
        times[name].append(seconds)
    adamw_s = statistics.median(times['optax.adamw'])
    for name in candidates:
      seconds = statistics.median(times[name])
      print(
          f'{n:4d} leaves  {name:48s} {seconds:.3f} s  {seconds / adamw_s:5.2f}x adamw  '
          f'{sizes[name][0]:6d} instructions  {sizes[name][1]:5d} fusions',
          flush=True,
      )


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--leaves', type=int, nargs='+', default=[8, 32])
  parser.add_argument('--rounds', type=int, default=5)
  args = parser.parse_args(argv)
  table(CANDIDATES, args.leaves, args.rounds)


if __name__ == '__main__':
  main()
