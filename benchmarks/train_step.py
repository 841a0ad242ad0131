"""Training step per microbatch of a small transformer: optax_gqc in JAX against torch-gqc.

One process, one decoder-only transformer written twice (``_transformer.py``:
same architecture, shapes and weights on both sides, checked by their loss),
the same microbatches of tokens, and the same number of CPU threads. Each
timed call is one microbatch: forward, backward and the optimizer. The
accumulating candidates step AdamW once every ``--every`` microbatches: GNTS
with threshold 0 and ``max_draws = every`` (so its gate never opens and every
step is forced), on both sides, and ``optax.MultiSteps``; plain AdamW steps on
every microbatch. Candidates run in interleaved rounds (their order rotates
from round to round, with a short pause between them so that one
framework's idle threads do not spin through the next one's timing), and the
table gives medians and ratios.

    python benchmarks/train_step.py [--json out.json] [--threads N] [--breakdown]

``--breakdown`` adds the forward and backward passes alone on each side, to
tell the frameworks' own speed from that of the optimizers.

JAX steps are jitted with the parameters and optimizer state donated. torch
follows torch-gqc's protocol: one ``backward`` and one ``wrapper.step()`` per
microbatch (the wrapper averages the summed ``.grad`` and steps AdamW at the
k-th). Threads: ``torch.set_num_threads(N)``; XLA gets
``--xla_cpu_multi_thread_eigen`` and ``intra_op_parallelism_threads=N``,
and, for N below the cores at hand, the process is pinned to N cores, which
both libraries size their pools by. ``OMP_WAIT_POLICY=PASSIVE`` (the default
of ``--omp-wait-policy``) keeps torch's OpenMP threads from busy-waiting: on
a machine shared with other jobs, active waiting made torch's step many times
slower, which would flatter JAX. Both sides run on the CPU: JAX is held to
it (``JAX_PLATFORMS=cpu``, unless the variable is set) on a machine with a GPU
too, as torch's side is.

Exits with status 1 when the target (gnts fused <= 0.7x torch-gqc per
microbatch) fails, or when a candidate did not step once every ``--every``.
"""

import argparse
import math
import os
import statistics
import sys
import time

from _report import add_json_argument, finish, non_negative_int, positive_int, print_targets

TARGET = 0.7  # gnts fused, per microbatch, as a fraction of torch-gqc

LABELS = {
    'jax_adamw': 'JAX optax.adamw (steps every microbatch)',
    'jax_multisteps': 'JAX optax.MultiSteps(adamw, k)',
    'gnts_optax': 'JAX optax_gqc.gnts, Optax path',
    'gnts_fused': 'JAX optax_gqc.gnts, fused update_and_apply',
    'torch_adamw': 'torch AdamW (steps every microbatch)',
    'torch_gqc': 'torch-gqc OptimizerWrapperGNTS(AdamW)',
}
# With --breakdown: the forward and backward passes alone, no optimizer.
BREAKDOWN = {
    'jax_grads': 'JAX forward+backward only',
    'torch_grads': 'torch forward+backward only',
}
ACCUMULATING = ('jax_multisteps', 'gnts_optax', 'gnts_fused', 'torch_gqc')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n')[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  parser.add_argument('--width', type=positive_int, default=256, help='model width')
  parser.add_argument('--layers', type=positive_int, default=8, help='transformer blocks')
  parser.add_argument('--heads', type=positive_int, default=4, help='attention heads')
  parser.add_argument('--context', type=positive_int, default=64, help='tokens per sequence')
  parser.add_argument('--microbatch', type=positive_int, default=4, help='sequences per microbatch')
  parser.add_argument('--vocab', type=positive_int, default=256, help='vocabulary size')
  parser.add_argument(
      '--every', type=positive_int, default=8, help='microbatches per optimizer step'
  )
  parser.add_argument(
      '--rounds', type=positive_int, default=4, help='timed rounds; the median counts'
  )
  parser.add_argument(
      '--warmup',
      type=non_negative_int,
      default=None,
      help='microbatches before timing (default: --every, so that each candidate has stepped)',
  )
  parser.add_argument(
      '--cycles', type=positive_int, default=1, help='steps per candidate per round'
  )
  parser.add_argument(
      '--threads',
      type=positive_int,
      default=len(os.sched_getaffinity(0)),
      help='CPU threads of each side',
  )
  parser.add_argument(
      '--omp-wait-policy',
      default='PASSIVE',
      help="OMP_WAIT_POLICY for torch's OpenMP pool; '' leaves it unset",
  )
  parser.add_argument('--settle', type=float, default=0.2, help='seconds between candidates')
  parser.add_argument(
      '--breakdown', action='store_true', help='also time forward+backward alone on each side'
  )
  add_json_argument(parser)
  args = parser.parse_args(argv)
  if not 0 <= args.settle < math.inf:  # time.sleep(inf) failed after the compiles
    parser.error(f'--settle must be finite and >= 0 seconds, got {args.settle}')
  if args.width % args.heads:
    parser.error(f'--width ({args.width}) must be a multiple of --heads ({args.heads})')
  return args


def set_threads(threads: int, omp_wait_policy: str) -> dict[str, str]:
  """Sets both libraries' thread counts, and JAX to the CPU; before jax and torch are imported."""
  if 'jax' in sys.modules or 'torch' in sys.modules:
    raise RuntimeError('set_threads must run before jax and torch are imported')
  cores = sorted(os.sched_getaffinity(0))
  if threads < len(cores):
    os.sched_setaffinity(0, cores[:threads])
  multi = 'false' if threads == 1 else 'true'
  xla = f'--xla_cpu_multi_thread_eigen={multi} intra_op_parallelism_threads={threads}'
  os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {xla}".strip()
  if omp_wait_policy:
    os.environ['OMP_WAIT_POLICY'] = omp_wait_policy
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')  # torch's side runs on the CPU
  return {
      'cores': f'{len(os.sched_getaffinity(0))} of {len(cores)}',
      'XLA_FLAGS': os.environ['XLA_FLAGS'],
      'OMP_WAIT_POLICY': os.environ.get('OMP_WAIT_POLICY', '(unset)'),
  }


def evaluate_targets(ms: dict[str, float], steps_ok: dict[str, bool]) -> dict[str, bool]:
  """The targets by name, True where met: the speed goal, and the same work on every side."""
  targets = {
      f'gnts fused <= {TARGET}x torch-gqc per microbatch': ms['gnts_fused']
      <= TARGET * ms['torch_gqc']
  }
  targets['every accumulator stepped once every k microbatches'] = all(steps_ok.values())
  return targets


class JaxRunner:
  """One JAX candidate: a jitted step with parameters and state donated."""

  def __init__(self, init, step, params, batches, count_steps):
    import jax
    import jax.numpy as jnp

    self._jax = jax
    self.params = jax.tree.map(jnp.copy, params)
    self.state = init(self.params)
    self.loss = None
    self.batches = batches
    self.count_steps = count_steps
    self.compiled = (
        jax.jit(step, donate_argnums=(0, 1)).lower(self.params, self.state, batches[0]).compile()
    )

  def run(self, i: int) -> None:
    self.params, self.state, self.loss = self.compiled(
        self.params, self.state, self.batches[i % len(self.batches)]
    )

  def sync(self) -> None:
    self._jax.block_until_ready((self.params, self.state, self.loss))

  def num_steps(self, microbatches: int) -> int:
    return self.count_steps(self.state, microbatches)


class TorchRunner:
  """One torch candidate: backward, then ``step()`` of an optimizer or a torch-gqc wrapper."""

  def __init__(self, model, optimizer, batches, zero_grad: bool, count_steps):
    self.model, self.optimizer, self.batches = model, optimizer, batches
    self.zero_grad, self.count_steps = zero_grad, count_steps

  def run(self, i: int) -> None:
    loss = self.model(self.batches[i % len(self.batches)])
    loss.backward()
    if self.optimizer is not None:
      self.optimizer.step()
    if self.zero_grad:  # torch-gqc zeroes the gradients itself after a step
      self.model.zero_grad()

  def sync(self) -> None:
    pass  # torch on the CPU is synchronous

  def num_steps(self, microbatches: int) -> int:
    return self.count_steps(microbatches)


def make_runners(cfg, every: int, breakdown: bool = False, num_batches: int = 4) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  import torch
  from _transformer import check_same_model, init_params, loss_fn, tokens, torch_model
  from gradient_quality_control import OptimizerWrapperGNTS

  import optax_gqc

  params = init_params(cfg)
  data = tokens(cfg, num_batches)
  check_same_model(cfg, params, torch_model(cfg, params), data[0])
  jax_batches = [jnp.asarray(b) for b in data]
  torch_batches = [torch.from_numpy(b.astype(np.int64)) for b in data]

  # torch.optim.AdamW's defaults, on both sides (optax.adamw's weight decay is 1e-4).
  adamw = optax.adamw(1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)
  gnts = optax_gqc.gnts(adamw, threshold=0.0, max_draws=every)
  grad_fn = jax.value_and_grad(loss_fn)

  def optax_path(tx):
    def step(params, state, batch):
      loss, grads = grad_fn(params, batch, cfg.heads)
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state, loss

    return tx.init, step

  def fused(tx):
    def step(params, state, batch):
      loss, grads = grad_fn(params, batch, cfg.heads)
      params, state = optax_gqc.update_and_apply(tx, grads, state, params)
      return params, state, loss

    return tx.init, step

  def gnts_steps(state, microbatches):
    return int(optax_gqc.statistics(state)['num_steps'])

  multisteps = optax.MultiSteps(adamw, every).gradient_transformation()
  runners = {
      'jax_adamw': JaxRunner(*optax_path(adamw), params, jax_batches, lambda s, m: m),
      'jax_multisteps': JaxRunner(
          *optax_path(multisteps), params, jax_batches, lambda s, m: int(s.gradient_step)
      ),
      'gnts_optax': JaxRunner(*optax_path(gnts), params, jax_batches, gnts_steps),
      'gnts_fused': JaxRunner(*fused(gnts), params, jax_batches, gnts_steps),
  }

  def torch_adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01)

  model = torch_model(cfg, params)
  runners['torch_adamw'] = TorchRunner(
      model, torch_adamw(model), torch_batches, zero_grad=True, count_steps=lambda m: m
  )
  model = torch_model(cfg, params)
  wrapper = OptimizerWrapperGNTS(torch_adamw(model), max_batch_draws=every)
  for group in wrapper.optimizer.param_groups:
    group['gradient_norm_threshold'] = 0.0  # never met: a step every `every` microbatches
  runners['torch_gqc'] = TorchRunner(
      model, wrapper, torch_batches, zero_grad=False, count_steps=lambda m: wrapper.num_steps
  )
  if breakdown:
    # The gradients come out as the (donated) state: computed, written, not used.
    def grads_only(params, state, batch):
      loss, grads = grad_fn(params, batch, cfg.heads)
      return params, grads, loss

    runners['jax_grads'] = JaxRunner(
        optax.tree.zeros_like, grads_only, params, jax_batches, lambda s, m: 0
    )
    runners['torch_grads'] = TorchRunner(
        torch_model(cfg, params), None, torch_batches, zero_grad=True, count_steps=lambda m: 0
    )
  return runners


def measure(runners, rounds: int, calls: int, warmup: int, settle: float) -> dict[str, list]:
  """Seconds per microbatch of each runner, one entry per round, in rotating order."""
  for runner in runners.values():
    for i in range(warmup):
      runner.run(i)
    runner.sync()
  times = {name: [] for name in runners}
  names = list(runners)
  for r in range(rounds):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      runner = runners[name]
      time.sleep(settle)
      start = time.perf_counter()
      for i in range(calls):
        runner.run(i)
      runner.sync()
      times[name].append((time.perf_counter() - start) / calls)
  return times


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  threads = set_threads(args.threads, args.omp_wait_policy)
  import jax
  import torch

  torch.set_num_threads(args.threads)
  from _transformer import Config

  cfg = Config(
      vocab=args.vocab,
      context=args.context,
      width=args.width,
      layers=args.layers,
      heads=args.heads,
      microbatch=args.microbatch,
  )
  print(
      f'{cfg.num_params() / 1e6:.2f}M float32 parameters: width {cfg.width}, {cfg.layers} layers, '
      f'{cfg.heads} heads, context {cfg.context}, vocabulary {cfg.vocab}; microbatch '
      f'{cfg.microbatch} sequences ({cfg.microbatch * cfg.context} tokens); '
      f'one AdamW step every {args.every} microbatches'
  )
  print(
      f'threads: {args.threads} each (torch.get_num_threads() = {torch.get_num_threads()}, '
      f"cores {threads['cores']}, XLA_FLAGS={threads['XLA_FLAGS']!r}, "
      f"OMP_WAIT_POLICY={threads['OMP_WAIT_POLICY']}); jax {jax.__version__} on "
      f'{jax.devices()[0].platform}, torch {torch.__version__}'
  )
  runners = make_runners(cfg, args.every, args.breakdown)
  calls = args.cycles * args.every
  if args.warmup is None:  # torch's AdamW makes its state, and the cond's step branch first runs
    args.warmup = args.every
  times = measure(runners, args.rounds, calls, warmup=args.warmup, settle=args.settle)
  microbatches = args.warmup + args.rounds * calls
  steps = {name: runner.num_steps(microbatches) for name, runner in runners.items()}
  # GNTS with threshold 0 and MultiSteps step at the every-th microbatch of each cycle.
  steps_ok = {name: steps[name] == microbatches // args.every for name in ACCUMULATING}

  ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
  print(f'median of {args.rounds} rounds of {calls} microbatches per candidate')
  print(
      f"{'candidate':44s} {'ms/microbatch':>14s} {'range':>15s} {'x torch-gqc':>12s} "
      f"{'x jax adamw':>12s} {'steps/microbatches':>19s}"
  )
  for name, t in times.items():
    spread = f'{1e3 * min(t):.0f}-{1e3 * max(t):.0f}'
    steps_taken = f'{steps[name]}/{microbatches}' if name in LABELS else '-'
    print(
        f'{ {**LABELS, **BREAKDOWN}[name]:44s} {ms[name]:14.1f} {spread:>15s} '
        f"{ms[name] / ms['torch_gqc']:12.2f} {ms[name] / ms['jax_adamw']:12.2f} "
        f'{steps_taken:>19s}'
    )
  print(
      f"gnts fused / torch-gqc = {ms['gnts_fused'] / ms['torch_gqc']:.3f}, "
      f"gnts fused / gnts Optax path = {ms['gnts_fused'] / ms['gnts_optax']:.3f}, "
      f"torch AdamW / JAX adamw = {ms['torch_adamw'] / ms['jax_adamw']:.3f}"
  )
  if args.breakdown:
    print(
        'beyond forward+backward, per microbatch: '
        f"JAX gnts fused {ms['gnts_fused'] - ms['jax_grads']:.1f} ms, "
        f"JAX gnts Optax path {ms['gnts_optax'] - ms['jax_grads']:.1f} ms, "
        f"torch-gqc {ms['torch_gqc'] - ms['torch_grads']:.1f} ms; forward+backward "
        f"JAX / torch = {ms['jax_grads'] / ms['torch_grads']:.3f}"
    )
  targets = evaluate_targets(ms, steps_ok)
  print_targets(targets)
  data = {
      'config': vars(args),
      'params': cfg.num_params(),
      'threads': threads,
      'ms_per_microbatch': ms,
      'seconds_per_microbatch': times,  # each round's
      'steps': steps,
      'microbatches': microbatches,
  }
  return finish(targets, args.json, data)


if __name__ == '__main__':
  sys.exit(main())
