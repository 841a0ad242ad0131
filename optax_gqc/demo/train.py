"""The train program: each arm's microbatches in compiled blocks of one ``lax.scan``."""

import argparse
import math
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import optax_gqc
from optax_gqc.demo.arms import Setup, arm_knobs, make_optimizer, program_spec, size_name
from optax_gqc.demo.model import CharTransformer, eval_loss, param_loss


def train_step(spec_items, graphdef, setup, params, opt_state, knobs, batch):
  """One microbatch: the gradient, then the fused update-and-apply.

  ``spec_items`` is :func:`program_spec` of the arm. Returns ``(params,
  opt_state, loss, num_steps)``, the steps taken so far.
  """
  tx = make_optimizer(dict(spec_items), knobs, setup)
  loss, grads = jax.value_and_grad(param_loss)(params, graphdef, batch)
  params, opt_state = optax_gqc.update_and_apply(tx, grads, opt_state, params)
  return params, opt_state, loss, opt_state.num_steps


def train_block(spec_items, graphdef, setup, params, opt_state, knobs, batches):
  """:func:`train_step` over a stack of microbatches, in one ``lax.scan``.

  Returns ``(params, opt_state, losses, num_steps, stats)``: the loss and the
  steps taken after each microbatch, and :func:`optax_gqc.statistics` at the
  end of the block.
  """

  def body(carry, batch):
    params, opt_state, loss, num_steps = train_step(
        spec_items, graphdef, setup, *carry, knobs, batch
    )
    return (params, opt_state), (loss, num_steps)

  (params, opt_state), (losses, num_steps) = jax.lax.scan(body, (params, opt_state), batches)
  return params, opt_state, losses, num_steps, optax_gqc.statistics(opt_state)


_PROGRAMS: dict[Any, Any] = {}  # compiled train blocks, by everything they bake in

# Set by the demo's Ctrl-C handler (job.ctrl_c_kept): Python drops a KeyboardInterrupt
# raised inside a garbage-collector callback, which JAX's tracing runs often.
CTRL_C = threading.Event()


def check_ctrl_c() -> None:
  """Raises the Ctrl-C that came since the handler was installed, if Python dropped it."""
  if CTRL_C.is_set():
    raise KeyboardInterrupt


def compiled_block(spec, graphdef, setup, params, opt_state, knobs, batches, on_compile=None):
  """:func:`train_block` compiled ahead of time (once per key), params and state donated."""
  spec_items = program_spec(spec)
  key = (spec_items, graphdef, setup, batches.shape, batches.dtype)
  if key not in _PROGRAMS:
    if on_compile is not None:
      on_compile()
    block = jax.jit(train_block, static_argnums=(0, 1, 2), donate_argnums=(3, 4))
    _PROGRAMS[key] = block.lower(
        spec_items, graphdef, setup, params, opt_state, knobs, batches
    ).compile()
  return _PROGRAMS[key]


def as_arrays(knobs: Mapping[str, Any]) -> dict[str, jax.Array]:
  return {
      k: jnp.asarray(v, jnp.int32 if isinstance(v, int) else jnp.float32) for k, v in knobs.items()
  }


class Plan(NamedTuple):
  """How a run cuts its microbatches: whole blocks, evaluated at block ends."""

  count: int  # microbatches per arm
  block: int  # microbatches per compiled call
  evals: tuple[int, ...]  # microbatch counts after which the validation loss is taken


def plan(tokens: int, tokens_per_microbatch: int, evals: int, block: int) -> Plan:
  """The budget rounded down to whole blocks, with ``evals`` evaluations at block ends.

  The block shrinks so that there are at least ``evals`` of them; every block
  has the same length, so each arm's program compiles once.
  """
  available = tokens // tokens_per_microbatch
  block = max(min(block, available // evals), 1)
  blocks = available // block
  ends = sorted({block * round(j * blocks / evals) for j in range(1, evals + 1)})
  return Plan(block * blocks, block, tuple(ends))


def run_arm(
    name: str,
    spec: Mapping[str, Any],
    args: argparse.Namespace,
    size: tuple[int, int],
    seed: int,
    train: np.ndarray,
    val: jax.Array,
    run_plan: Plan,
) -> dict[str, Any]:
  """Trains one arm on ``train`` (microbatches) and returns its record."""
  from tqdm.auto import tqdm

  setup = Setup(args.microbatch, run_plan.count, args.warmup, args.weight_decay)
  model = CharTransformer(size[0], size[1], args.heads, args.context, nnx.Rngs(seed))
  graphdef, params = nnx.split(model, nnx.Param)
  knobs = arm_knobs(spec, args, size_name(size))
  opt_state = make_optimizer(spec, knobs, setup).init(params)
  knobs = as_arrays(knobs)
  tokens_per_micro = args.microbatch * args.context
  block = run_plan.block

  def batches(i):
    return jnp.asarray(train[i * block : (i + 1) * block], jnp.int32)

  # Compile (and evaluate once) before the progress bar starts its clock.
  start = time.perf_counter()
  program = compiled_block(
      spec,
      graphdef,
      setup,
      params,
      opt_state,
      knobs,
      batches(0),
      on_compile=lambda: print(f'{name}: compiling', file=sys.stderr, flush=True),
  )
  initial_loss = float(eval_loss(params, graphdef, val))
  compile_seconds = time.perf_counter() - start
  check_ctrl_c()

  start = time.perf_counter()
  curve, trace, num_steps = [], [], []
  bar = tqdm(
      total=run_plan.count,
      desc=f'{name:8s}',
      unit='microbatch',
      mininterval=1.0,
      disable=args.no_progress,
      file=sys.stderr,
  )
  with bar:
    for i in range(run_plan.count // block):
      check_ctrl_c()
      params, opt_state, losses, steps, stats = program(params, opt_state, knobs, batches(i))
      losses, steps, stats = jax.device_get((losses, steps, stats))
      num_steps.append(steps)
      done = (i + 1) * block
      point = {
          'tokens': done * tokens_per_micro,
          'steps': int(steps[-1]),
          'train_loss': float(np.mean(losses)),
          'noise_scale': _finite(stats['noise_scale']),
      }
      if 'target_batch_size' in stats:
        point['target_batch_size'] = _finite(stats['target_batch_size'])
      trace.append(point)
      if done in run_plan.evals:
        curve.append(
            {
                'tokens': done * tokens_per_micro,
                'microbatches': done,
                'steps': int(steps[-1]),
                'val_loss': float(eval_loss(params, graphdef, val)),
            }
        )
      bar.set_postfix(loss=f"{point['train_loss']:.3f}", steps=point['steps'], refresh=False)
      bar.update(block)
  seconds = time.perf_counter() - start

  # The microbatches each step averaged, from where the step count went up.
  stepped = np.flatnonzero(np.diff(np.concatenate(num_steps), prepend=0) > 0)
  draws = np.diff(stepped, prepend=-1).tolist()
  final = curve[-1]
  noise = trace[-1]['noise_scale']
  summary = {
      'arm': name,
      'val_loss': final['val_loss'],
      'initial_val_loss': initial_loss,
      'tokens': run_plan.count * tokens_per_micro,
      'microbatches': run_plan.count,
      'steps': final['steps'],
      'draws_per_step': run_plan.count / max(final['steps'], 1),
      'num_forced': int(stats['num_forced']),
      'noise_scale': noise,
      'peak_lr': float(knobs['lr']),
      'seconds': seconds,
      'compile_seconds': compile_seconds,
  }
  print(
      f"{name}: val loss {final['val_loss']:.4f}, {final['steps']} steps, "
      f"{summary['draws_per_step']:.2f} microbatches per step, {seconds:.0f} s "
      f'(+{compile_seconds:.0f} s compiling)',
      flush=True,
  )
  record = {'spec': dict(spec), 'summary': summary, 'curve': curve, 'trace': trace}
  if spec['kind'] != 'fixed':
    record['draws_per_step'] = draws
  return record


def _finite(x) -> float | None:
  x = float(x)
  return x if math.isfinite(x) else None
