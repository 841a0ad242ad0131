"""What XLA:CPU's compile time follows: kernels, and the engine's per-leaf norms.

A record of the measurements behind docs/benchmarks.md ("Where XLA:CPU spends
the compile"), not a benchmark. Six modes:

    python docs/compile/kernels.py compile NAME [--leaves 8] [--reps 10]
    python docs/compile/kernels.py norms [--leaves 8 32] [--rounds 7]
    python docs/compile/kernels.py modules [NAME ...] [--leaves 8 32]
    python docs/compile/kernels.py scalars [--outputs 1 10 20] [--rounds 5]
    python docs/compile/kernels.py trace [NAME ...] [--leaves 8 32 128] [--rounds 7]
    python docs/compile/kernels.py ops [NAME ...] [--leaves 32 64]

``compile`` lowers ``reps + 1`` fresh train steps of ``benchmarks/compile.py``'s
candidate NAME, then compiles them, the first untimed, and prints the wall and
CPU seconds per compile: run it under ``perf record -F 999 -g`` and read
``perf report --children`` for the phases. ``norms`` compiles a step that only
writes a float32 accumulator of the MLP's leaves, then the same step with the
gradient's squared norm, then with the new sum's too, then with both norms
as a dot product of each flattened leaf with itself, then as one sum over all
the leaves' squares concatenated, then with each leaf's two sums out of one
variadic reduction, and prints the median compile time and the
fusions of each. ``modules`` counts the LLVM
modules XLA emits for a candidate's step (its dump's optimized ``.ll`` files)
beside its fusions: fusions that compute the same thing share one. ``scalars``
compiles a toy step with ``--outputs`` scalar results, each a few ops with a
division, returned as separate arrays, stacked into one vector
(``jnp.stack``), summed into one vector from padded copies (``jnp.pad``), or
returned as separate arrays out of one variadic reduction (``one_kernel``, as
the engine returns its state's scalars). ``trace`` times the two halves of
``compile.py``'s trace column apart, for the candidates NAME: ``jax.jit(step).trace``
(Python tracing the step into a jaxpr) and ``.lower()`` (the jaxpr to StableHLO),
with the garbage collector off. ``ops`` counts the instructions of each opcode
in the optimized program of each candidate NAME (those inside fusions
included), at two depths, and prints what each leaf adds: the difference over
the difference in leaves.
"""

import argparse
import collections
import functools
import pathlib
import re
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / 'benchmarks'))
import compile as bench  # noqa: E402  (benchmarks/compile.py)

from optax_gqc._numerics import one_kernel, sq_norm  # noqa: E402


def compile_many(name: str, leaves: int, reps: int) -> None:
  shape = jax.eval_shape(functools.partial(bench.make_params, leaves))
  lowered = []
  for _ in range(reps + 1):
    step, args = bench.fresh_step(name, shape)
    lowered.append(step.lower(*args))
  lowered[0].compile()
  wall, cpu = time.perf_counter(), time.process_time()
  for low in lowered[1:]:
    low.compile()
  wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
  print(f'{name}, {leaves} leaves: {wall / reps:.3f} s wall, {cpu / reps:.3f} s CPU per compile')


def write(acc, g, fresh):
  return jax.tree.map(lambda a, b: jnp.where(fresh, b, a + b), acc, g)


VARIANTS = {
    'the accumulator write': write,
    "+ the gradient's squared norm": lambda acc, g, fresh: (write(acc, g, fresh), sq_norm(g)),
    "+ the new sum's": lambda acc, g, fresh: (
        (new := write(acc, g, fresh)),
        sq_norm(g),
        sq_norm(new),
    ),
    'both as dot products': lambda acc, g, fresh: (
        (new := write(acc, g, fresh)),
        dot_sq_norm(g),
        dot_sq_norm(new),
    ),
    'both over one concatenation': lambda acc, g, fresh: (
        (new := write(acc, g, fresh)),
        concat_sq_norm(g),
        concat_sq_norm(new),
    ),
    'both in one reduction per leaf': lambda acc, g, fresh: (
        (new := write(acc, g, fresh)),
        *paired_sq_norms(g, new),
    ),
}


def dot_sq_norm(tree):
  """The squared norm as a dot product of each flattened leaf with itself, the dots summed."""
  flat = [x.reshape(-1) for x in jax.tree.leaves(tree)]
  dots = [jax.lax.dot(x, x, precision=jax.lax.Precision.HIGHEST) for x in flat]
  return jnp.sum(jnp.abs(jnp.stack(dots)))


def concat_sq_norm(tree):
  """The squared norm as one sum over the squares of every leaf, flattened and concatenated."""
  return jnp.sum(jnp.concatenate([jnp.square(x.reshape(-1)) for x in jax.tree.leaves(tree)]))


def paired_sq_norms(a_tree, b_tree):
  """Both squared norms, each leaf's pair of sums out of one variadic reduction."""

  def pair(a, b):
    a, b = jnp.square(a.astype(jnp.float32)), jnp.square(b.astype(jnp.float32))
    zero = jnp.zeros([], jnp.float32)
    add = lambda x, y: (x[0] + y[0], x[1] + y[1])  # noqa: E731
    return jax.lax.reduce((a, b), (zero, zero), add, tuple(range(a.ndim)))

  sums = [pair(a, b) for a, b in zip(jax.tree.leaves(a_tree), jax.tree.leaves(b_tree), strict=True)]
  return tuple(jnp.sum(jnp.abs(jnp.stack([s[i] for s in sums]))) for i in (0, 1))


def norms(leaves: list[int], rounds: int) -> None:
  for n in leaves:
    shape = jax.eval_shape(functools.partial(bench.make_params, n))
    flag = jax.ShapeDtypeStruct((), jnp.bool_)
    times = {name: [] for name in VARIANTS}
    for r in range(rounds):
      for name, fn in VARIANTS.items():
        step = jax.jit(lambda *a, fn=fn: fn(*a), donate_argnums=0)  # fresh: no reuse
        low = step.lower(shape, shape, flag)
        start = time.perf_counter()
        compiled = low.compile()
        if r:  # the first round is untimed
          times[name].append(time.perf_counter() - start)
        fusions = bench.hlo_size(compiled.as_text())['fusions']
        if r == rounds - 1:
          seconds = statistics.median(times[name])
          print(f'{n:4d} leaves  {name:32s} {seconds:.3f} s  {fusions} fusions')


def fusions_and_modules(step, args) -> tuple[int, int]:
  """The fusions of ``step`` compiled on ``args``, and the LLVM modules XLA emits for them."""
  with tempfile.TemporaryDirectory() as dump:
    compiled = step.lower(*args).compile(compiler_options={'xla_dump_to': dump})
    emitted = len(list(pathlib.Path(dump).glob('*.ir-with-opt.ll')))
  return bench.hlo_size(compiled.as_text())['fusions'], emitted


def modules(names: list[str], leaves: list[int]) -> None:
  for n in leaves:
    shape = jax.eval_shape(functools.partial(bench.make_params, n))
    for name in names:
      fusions, emitted = fusions_and_modules(*bench.fresh_step(name, shape))
      print(f'{n:4d} leaves  {bench.LABELS[name]:48s} {fusions:5d} fusions  {emitted:3d} modules')


def scalar_outputs(num: int, pack: str):
  """A step of ``num`` scalar results from a matrix's squared norm, packed as ``pack``."""

  def step(x, s):
    norm = jnp.sum(x * x)
    outs = [jnp.where(norm > i, s[i] * 1.5 + norm, s[i] - i) / (norm + i + 1) for i in range(num)]
    if pack == 'separate':
      return tuple(outs)
    if pack == 'stack':
      return jnp.stack(outs)
    if pack == 'reduce':
      return one_kernel(tuple(outs), tuple(s))
    return sum(jnp.pad(o[None], (i, num - 1 - i)) for i, o in enumerate(outs))

  return step


def scalars(outputs: list[int], rounds: int) -> None:
  x = jax.ShapeDtypeStruct((bench.WIDTH, bench.WIDTH), jnp.float32)
  for num in outputs:
    s = jax.ShapeDtypeStruct((num,), jnp.float32)
    for pack in ('separate', 'stack', 'pad', 'reduce'):
      times = []
      for _ in range(rounds + 1):
        low = jax.jit(scalar_outputs(num, pack)).lower(x, s)  # fresh: no reuse
        start = time.perf_counter()
        compiled = low.compile()
        times.append(time.perf_counter() - start)
      fusions = bench.hlo_size(compiled.as_text())['fusions']
      print(f'{num:3d} outputs  {pack:8s} {statistics.median(times[1:]):.3f} s  {fusions} fusions')


def trace(names: list[str], leaves: list[int], rounds: int) -> None:
  for n in leaves:
    shape = jax.eval_shape(functools.partial(bench.make_params, n))
    times = {name: ([], []) for name in names}
    for r in range(rounds + 1):
      for name in names:
        step, args = bench.fresh_step(name, shape)
        with bench.gc_off():  # as compile.py times
          start = time.perf_counter()
          traced = step.trace(*args)
          middle = time.perf_counter()
          traced.lower()
        if r:  # the first round is untimed
          times[name][0].append(middle - start)
          times[name][1].append(time.perf_counter() - middle)
    for name, (traces, lowers) in times.items():
      print(
          f'{n:4d} leaves  {bench.LABELS[name]:48s} trace {statistics.median(traces) * 1e3:4.0f} ms'
          f'  lower {statistics.median(lowers) * 1e3:4.0f} ms'
      )


def opcodes(name: str, leaves: int) -> collections.Counter:
  """The optimized program's instructions of candidate ``name`` at ``leaves``, by opcode."""
  step, args = bench.fresh_step(name, jax.eval_shape(functools.partial(bench.make_params, leaves)))
  # `%name = type opcode(`, the type a shape, or a tuple of shapes in parentheses.
  instruction = re.compile(r'\s+(?:ROOT )?%?[\w.-]+ = (?:\(.*?\)|\S+) ([\w-]+)\(')
  text = step.lower(*args).compile().as_text()
  return collections.Counter(m[1] for m in map(instruction.match, text.splitlines()) if m)


def ops(names: list[str], leaves: tuple[int, int]) -> None:
  (low, high), width = leaves, 12
  per_leaf = {}
  for name in names:
    small, large = opcodes(name, low), opcodes(name, high)
    per_leaf[name] = {op: (large[op] - small[op]) / (high - low) for op in small | large}
    per_leaf[name]['(all)'] = (large.total() - small.total()) / (high - low)
  print(f'instructions per leaf, from {low} to {high} leaves')
  print(f"{'opcode':20s}" + ''.join(f'{name:>{width}s}' for name in names))
  for op in sorted(set().union(*per_leaf.values())):
    row = [per_leaf[name].get(op, 0.0) for name in names]
    if any(abs(x) >= 0.05 for x in row):
      print(f'{op:20s}' + ''.join(f'{x:{width}.2f}' for x in row))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  sub = parser.add_subparsers(dest='mode', required=True)
  one = sub.add_parser('compile')
  one.add_argument('name', choices=sorted(bench.LABELS))
  one.add_argument('--leaves', type=int, default=8)
  one.add_argument('--reps', type=int, default=10)
  toy = sub.add_parser('norms')
  toy.add_argument('--leaves', type=int, nargs='+', default=[8, 32])
  toy.add_argument('--rounds', type=int, default=7)
  mods = sub.add_parser('modules')
  mods.add_argument(
      'names', nargs='*', metavar='NAME', help='of benchmarks/compile.py; all of them if none'
  )
  mods.add_argument('--leaves', type=int, nargs='+', default=[8, 32])
  scal = sub.add_parser('scalars')
  scal.add_argument('--outputs', type=int, nargs='+', default=[1, 10, 20])
  scal.add_argument('--rounds', type=int, default=5)
  split = sub.add_parser('trace')
  split.add_argument(
      'names', nargs='*', metavar='NAME', help='of benchmarks/compile.py; all of them if none'
  )
  split.add_argument('--leaves', type=int, nargs='+', default=[8, 32, 128])
  split.add_argument('--rounds', type=int, default=7)
  count = sub.add_parser('ops')
  count.add_argument(
      'names', nargs='*', metavar='NAME', help='of benchmarks/compile.py; all of them if none'
  )
  count.add_argument('--leaves', type=int, nargs=2, default=[32, 64])
  args = parser.parse_args(argv)
  if args.mode == 'compile':
    compile_many(args.name, args.leaves, args.reps)
  elif args.mode == 'norms':
    norms(args.leaves, args.rounds)
  elif args.mode == 'modules':
    modules(args.names or list(bench.LABELS), args.leaves)
  elif args.mode == 'trace':
    trace(args.names or list(bench.LABELS), args.leaves, args.rounds)
  elif args.mode == 'ops':
    ops(args.names or list(bench.LABELS), tuple(args.leaves))
  else:
    scalars(args.outputs, args.rounds)


if __name__ == '__main__':
  main()
