"""Compile time of ``python -m optax_gqc.demo --quick``'s train program, against plain adamw.

A record of the measurement behind docs/benchmarks.md ("The main job"), not a
benchmark. It compiles the train block of the control, critical and gnts
arms, as ``--quick`` sets them up (with ``--default-model``, as the main job
does: its default model), and the same block with ``optax.adamw``
stepping on every microbatch and no accumulation: how much of the demo's
compile time the engine adds to the model's own. Fresh functions each round,
median of the rounds after the first:

    python docs/compile/demo_quick.py [--rounds 4] [--default-model] [--opt-level N]
    python docs/compile/demo_quick.py --concurrent [--rounds 4] [--default-model]

``--opt-level N`` compiles with XLA's ``xla_backend_optimization_level`` at N
(the default is 2 on the CPU), and also times a call of each compiled block,
on 8 microbatches: what a lower level saves in compile and costs in training.
``--concurrent`` lowers the three arms' blocks, then compiles them one after
another, and lowers them afresh and compiles them at once, in a thread each
(XLA's compile releases Python's lock): whether the demo would wait less by
compiling its arms' programs together up front.
"""

import argparse
import concurrent.futures
import statistics
import time

import jax
import optax
from flax import nnx

from optax_gqc.demo import arms, cli, train
from optax_gqc.demo.model import CharTransformer, param_loss


def plain_block(graphdef, params, opt_state, batches):
  """The train block with adamw on every microbatch: the model's forward and backward alone."""
  tx = optax.adamw(1e-3)

  def body(carry, batch):
    params, opt_state = carry
    loss, grads = jax.value_and_grad(param_loss)(params, graphdef, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  return jax.lax.scan(body, (params, opt_state), batches)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=4)
  parser.add_argument('--default-model', action='store_true', help="the main job's model")
  how = parser.add_mutually_exclusive_group()
  how.add_argument('--opt-level', type=int, help="XLA's backend optimization level")
  how.add_argument('--concurrent', action='store_true', help='the arms compiled at once')
  options = parser.parse_args(argv)
  level = options.opt_level
  compiler_options = None if level is None else {'xla_backend_optimization_level': level}
  rounds = options.rounds
  args = cli.parse_args([] if options.default_model else ['--quick'])
  setup = arms.Setup(args.microbatch, 1200, args.warmup, args.weight_decay)
  model = CharTransformer(args.dim, args.layers, args.heads, args.context, nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  batches = jax.random.randint(jax.random.key(0), (8, args.microbatch, args.context + 1), 0, 256)

  def adamw():
    state = optax.adamw(1e-3).init(params)
    block = jax.jit(lambda *a: plain_block(*a), static_argnums=0)  # a fresh function
    return block.lower(graphdef, params, state, batches), (params, state, batches)

  def arm(name):
    spec = dict(arms.ARMS[name])
    knobs = arms.arm_knobs(spec, args, arms.size_name((args.dim, args.layers)))
    state = arms.make_optimizer(spec, knobs, setup).init(params)
    block = jax.jit(lambda *a: train.train_block(*a), static_argnums=(0, 1, 2))
    inputs = (params, state, train.as_arrays(knobs), batches)
    return block.lower(arms.program_spec(spec), graphdef, setup, *inputs), inputs

  programs = {
      'adamw': adamw,
      'control': lambda: arm('control'),
      'critical': lambda: arm('critical'),
      'gnts': lambda: arm('gnts'),
  }
  if options.concurrent:
    concurrent_compiles(programs, ['control', 'critical', 'gnts'], rounds)
    return
  seconds = {name: [] for name in programs}
  calls = {name: [] for name in programs}
  for _ in range(rounds):
    for name, lower in programs.items():
      start = time.perf_counter()
      lowered, inputs = lower()
      compiled = lowered.compile(compiler_options)
      seconds[name].append(time.perf_counter() - start)
      if level is not None:
        for _ in range(5):
          start = time.perf_counter()
          jax.block_until_ready(compiled(*inputs))
          calls[name].append(time.perf_counter() - start)
  for name, s in seconds.items():
    line = f'{name:9s} {statistics.median(s[1:]):6.2f} s trace + compile'
    if level is not None:
      line += f', {statistics.median(calls[name]) * 1e3:5.1f} ms a call'
    print(f'{line}  (rounds: {[round(x, 2) for x in s]})')


def concurrent_compiles(programs, names, rounds):
  """Compile seconds of the arms' blocks one after another, and all at once in threads."""
  seconds = {'one after another': [], 'at once': []}
  with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
    for _ in range(rounds):
      for how in seconds:
        lowered = [programs[name]()[0] for name in names]
        start = time.perf_counter()
        if how == 'at once':
          list(pool.map(lambda x: x.compile(), lowered))
        else:
          for x in lowered:
            x.compile()
        seconds[how].append(time.perf_counter() - start)
  for how, s in seconds.items():
    print(
        f"{', '.join(names)} {how:17s} {statistics.median(s[1:]):6.2f} s compile"
        f'  (rounds: {[round(x, 2) for x in s]})'
    )


if __name__ == '__main__':
  main()
