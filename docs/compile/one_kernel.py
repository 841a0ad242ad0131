"""The engine's train step compiled with and without ``one_kernel``, in one process.

A record of the measurement behind docs/benchmarks.md ("The state's scalars
out of one kernel"), not a benchmark:

    python docs/compile/one_kernel.py [--leaves 8 32 128] [--rounds 5]

The engine computes the scalars it returns (its counters, running sums, EMAs
and the gate's state) and the statistics its gate reads each in one variadic
reduction (``_numerics.one_kernel``). Here ``benchmarks/compile.py``'s
candidates compile with it, and with it replaced by the identity (the program
the engine compiled to before it), interleaved in each round; adamw is the
baseline, as in ``compile.py``. Prints the median trace + compile seconds, their
ratio to adamw's, and then, from one more compile each, the fusions and the kernels
XLA emits (as ``kernels.py modules`` counts them).
"""

import argparse
import functools
import pathlib
import statistics
import sys

import jax

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / 'benchmarks'))
import compile as bench  # noqa: E402  (benchmarks/compile.py)
import kernels  # noqa: E402  (docs/compile/kernels.py, beside this file)

from optax_gqc import _accumulation  # noqa: E402

PACKED = _accumulation.one_kernel
NAMES = ('adamw', 'multisteps', 'gnts', 'gnts_fused', 'loss_interval')


def without(name: str) -> bool:
  return name.endswith(' without')


def fresh(name: str) -> str:
  """``name``'s candidate in compile.py, with one_kernel in place or replaced by the identity."""
  _accumulation.one_kernel = (lambda new, old=None: new) if without(name) else PACKED
  return name.removesuffix(' without')


def seconds(name: str, params) -> float:
  timed = bench.compile_once(fresh(name), params)
  return timed['trace_s'] + timed['compile_s']


def size(name: str, params) -> tuple[int, int]:
  """The fusions of the compiled step, and the kernels XLA emits for it."""
  return kernels.fusions_and_modules(*bench.fresh_step(fresh(name), params))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--leaves', type=int, nargs='+', default=[8, 32, 128])
  parser.add_argument('--rounds', type=int, default=5)
  args = parser.parse_args(argv)
  names = [m for n in NAMES for m in ([n] if n in ('adamw', 'multisteps') else [n + ' without', n])]
  shapes = {n: jax.eval_shape(functools.partial(bench.make_params, n)) for n in args.leaves}
  runs = {(n, name): [] for n in args.leaves for name in names}
  for r in range(args.rounds + 1):  # the first round is untimed
    for n in args.leaves:
      for name in names:
        t = seconds(name, shapes[n])
        if r:
          runs[n, name].append(t)
  print(f'trace + compile, median of {args.rounds} rounds; the fusions and kernels of one more')
  for n in args.leaves:
    base = statistics.median(runs[n, 'adamw'])
    for name in names:
      median = statistics.median(runs[n, name])
      fusions, kernels = size(name, shapes[n])
      label = bench.LABELS[name.removesuffix(' without')] + (', without' if without(name) else '')
      print(
          f'{n:4d} leaves  {label:52s} {median:6.3f} s  {median / base:5.2f}x adamw'
          f'  {fusions:5d} fusions  {kernels:3d} kernels'
      )


if __name__ == '__main__':
  main()
