"""Adaptive accumulation against the fixed-batch frontier: ``python -m optax_gqc.demo``.

A small byte-level transformer (Flax NNX) learns Python source code: by
default the top-level modules of the running interpreter's standard library
(``<stdlib>/*.py``, sorted by name, the first ``--corpus-bytes``), so the data
is on every machine and nothing is downloaded; ``--data FILE`` trains on your
own text. The last 10% is held out for validation.

Every arm sees the same microbatches in the same order, at the same token
budget, with AdamW inside and the same learning-rate schedule of *tokens* (5%
warmup, then a cosine to a tenth of the peak): arms differ only in when they
step. The arms are the rows of :data:`ARMS`:

- the fixed-batch frontier: ``control`` steps on every microbatch; ``fixed2``,
  ``fixed3``, ``fixed4`` and ``fixed8`` on the mean of k microbatches, each at
  its own peak learning rate, :func:`frontier_lr` (a sweep found the same peak
  best for k = 1, 2 and 4);
- adaptive arms, at the k = 1 learning rate with each step scaled by the square
  root of the microbatches it averaged: ``critical`` (a batch of a fraction of
  the measured noise scale), ``gnts`` (the library's default,
  ``optax_gqc.gnts(inner)``: a batch of half the noise scale, at least two
  microbatches, its own step scaling), ``relative`` (0.1.0's scale-free
  gate, study only), and two
  scheduled batch warmups: ``seesaw`` (the batch grows as the learning rate
  decays, Seesaw's rule) and ``warmup`` (linear in tokens, 1 to 8 microbatches).

Fewer optimizer steps at the same tokens usually cost loss. The fixed arms
draw that trade-off as a curve of validation loss against optimizer steps; an
adaptive arm earns its gate if it lands *below* the curve. :func:`verdict`
interpolates the frontier at the arm's step count and says by how much.
``--study`` repeats the measurement over two seeds and two model sizes, and
counts an arm below the frontier only by more than the seed-to-seed spread.

Writes ``table.txt``, ``results.json`` and ``curves.png`` (with ``--study``
also ``study.png``) into ``--out``. See ``docs/demo.md``.
"""

import argparse
import functools
import json
import math
import os
import sys
import sysconfig
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import optax_gqc
from optax_gqc import gates, study
from optax_gqc.study import frontier_loss_at

VOCAB = 256  # bytes

# The arms, one row each: ``kind`` says how the gate is built (make_optimizer),
# the other entries are its knobs. Edit the knobs here.
ARMS: dict[str, dict[str, Any]] = {
    'control': {'kind': 'fixed', 'k': 1},
    'fixed2': {'kind': 'fixed', 'k': 2},
    'fixed3': {'kind': 'fixed', 'k': 3},
    'fixed4': {'kind': 'fixed', 'k': 4},
    'fixed8': {'kind': 'fixed', 'k': 8},
    'critical': {'kind': 'critical', 'fraction': 0.5, 'max_draws': 32, 'scale_by_draws': 'sqrt'},
    'gnts': {'kind': 'gnts', 'max_draws': 64},  # optax_gqc.gnts(inner): the library default
    'relative': {'kind': 'relative', 'ratio': 0.5, 'eta': 0.8, 'max_draws': 32},  # 0.1.0's
    'seesaw': {'kind': 'seesaw', 'max_draws': 16, 'scale_by_draws': 'sqrt'},
    'warmup': {'kind': 'warmup', 'start': 1, 'end': 8, 'scale_by_draws': 'sqrt'},
}
FRONTIER = tuple(a for a, spec in ARMS.items() if spec['kind'] == 'fixed')  # the fixed arms
# The main job's arms: --study runs every arm of ARMS.
DEFAULT_ARMS = ('control', 'fixed2', 'fixed3', 'fixed4', 'critical', 'gnts', 'seesaw')

# Peak learning rates of the fixed arms by model size (width x layers) and k,
# from sweeps at 900k tokens with the default --lr (docs/research.md): at 96x3
# the best of 3 or 4 values for each k, the same for k = 1, 2 and 4 (k = 3,
# between them, was not swept); at 64x2 the best of 4 for k >= 2 (k = 1 within
# 0.001 nats of its best). A size not listed takes the default model's rates,
# and its verdict says so; a k not listed follows the square-root rule.
FRONTIER_LR: dict[str, dict[int, float]] = {
    '96x3': {1: 4.2e-3, 2: 4.2e-3, 3: 4.2e-3, 4: 4.2e-3, 8: 6e-3},
    '64x2': {1: 4.2e-3, 2: 8.5e-3, 3: 8.5e-3, 4: 8.5e-3, 8: 1.2e-2},
}
SWEPT_LR = 4.2e-3  # the --lr of those sweeps: the rates scale by --lr / SWEPT_LR
DEFAULT_SIZE = '96x3'  # the default model, whose rates serve a size not swept

# Knobs passed to the train program as arrays rather than baked in as
# constants, by kind: the fixed arms then share one compiled program.
ARRAY_KNOBS = {'fixed': ('k',)}

SCALE_BY_DRAWS = {None: None, 'sqrt': jnp.sqrt}

# The verdict's bar for "as good as the control with fewer steps" (see verdict).
NEAR_CONTROL_NATS = 0.02
# With one seed there is no spread to measure: a margin within this many nats
# counts as on the frontier (the suite's per-seed margins of one arm on this
# task spread over about that much; docs/study.md).
ONE_SEED_NOISE = 0.03
FEW_STEPS_RATIO = 0.6

DEFAULT_TOKENS = 400_000
# --quick: these defaults, for the flags not given on the command line.
QUICK = {
    'out': './gqc-demo-quick-out',  # never the main job's folder
    'arms': ('control', 'fixed2', 'fixed4', 'critical'),
    'tokens': 40_000,
    'corpus_bytes': 400_000,
    'context': 32,
    'dim': 32,
    'layers': 1,
    'evals': 4,
}
STUDY_SEEDS = (0, 1)
MIN_CONTEXT = 4  # bytes per sequence: a shorter window gives attention next to nothing to read
# The microbatches are sampled before training, about 9 bytes per token (int64 window
# starts and the uint8 bytes): --tokens is refused where that would pass this share of
# the machine's memory.
MAX_MEMORY_SHARE = 0.25
BYTES_PER_TOKEN = 9
VAL_BATCHES, VAL_SEQUENCES = 8, 32  # the validation windows, the same for every seed
VAL_SEED = 12345
MIN_MICROBATCHES = max(ARMS[a]['k'] for a in FRONTIER)  # so that every fixed arm steps


# Data and model.


def stdlib_corpus(max_bytes: int) -> tuple[bytes, list[str]]:
  """The running interpreter's top-level stdlib modules, sorted by name, capped."""
  root = Path(sysconfig.get_paths()['stdlib'])
  chunks, names, size = [], [], 0
  for path in sorted(root.glob('*.py')):
    data = path.read_bytes()
    chunks.append(data)
    names.append(path.name)
    size += len(data)
    if size >= max_bytes:
      break
  return b''.join(chunks)[:max_bytes], names


def sample_batches(tokens: np.ndarray, count: int, size: int, context: int, seed: int):
  """``count`` microbatches of ``size`` windows of ``context + 1`` bytes."""
  rng = np.random.default_rng(seed)
  starts = rng.integers(0, len(tokens) - context - 1, size=(count, size))
  return tokens[starts[..., None] + np.arange(context + 1)]


class Block(nnx.Module):

  def __init__(self, dim: int, heads: int, rngs: nnx.Rngs):
    self.norm1 = nnx.LayerNorm(dim, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=dim, decode=False, rngs=rngs)
    self.norm2 = nnx.LayerNorm(dim, rngs=rngs)
    self.up = nnx.Linear(dim, 4 * dim, rngs=rngs)
    self.down = nnx.Linear(4 * dim, dim, rngs=rngs)

  def __call__(self, x, mask):
    x = x + self.attn(self.norm1(x), mask=mask)
    return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))


class CharTransformer(nnx.Module):
  """A decoder-only transformer over bytes."""

  def __init__(self, dim: int, layers: int, heads: int, context: int, rngs: nnx.Rngs):
    self.embed = nnx.Embed(VOCAB, dim, rngs=rngs)
    self.position = nnx.Param(0.02 * jax.random.normal(rngs.params(), (context, dim)))
    self.blocks = nnx.List([Block(dim, heads, rngs) for _ in range(layers)])
    self.norm = nnx.LayerNorm(dim, rngs=rngs)
    self.head = nnx.Linear(dim, VOCAB, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens) + self.position[: tokens.shape[-1]]
    mask = nnx.make_causal_mask(tokens)
    for block in self.blocks:
      x = block(x, mask)
    return self.head(self.norm(x))


def loss_fn(model, batch):
  """Mean next-byte cross entropy (nats) over windows of ``context + 1`` bytes."""
  logits = model(batch[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()


def param_loss(params, graphdef, batch):
  """:func:`loss_fn` as a pure function of the parameters split out of the model."""
  return loss_fn(nnx.merge(graphdef, params), batch)


@functools.partial(jax.jit, static_argnums=1)
def eval_loss(params, graphdef, batches):
  return jnp.mean(jax.vmap(lambda b: param_loss(params, graphdef, b))(batches))


# The arms' optimizers.


class Setup(NamedTuple):
  """What a train program bakes in besides its arm: hashable, a key of the program cache."""

  microbatch: int  # sequences per microbatch
  count: int  # microbatches in the run: the length of the learning-rate schedule
  warmup: float  # share of the run in warmup
  weight_decay: float


def frontier_lr(k: int, args: argparse.Namespace, size: str = DEFAULT_SIZE) -> float:
  """The peak learning rate of the fixed arm of ``k`` microbatches per step.

  :data:`FRONTIER_LR` of the model ``size`` (the default model's for a size
  not swept) where a sweep has set it (at 900k tokens, with the default
  ``--lr``; other settings may want their own sweep), scaled by ``--lr`` /
  :data:`SWEPT_LR`; otherwise the square-root rule for Adam, ``--lr``
  times sqrt(k): a mean over ``k`` times the examples has
  ``k`` times less gradient variance, which allows a step sqrt(k) times longer
  (Malladi et al, `On the SDEs and Scaling Rules for Adaptive Gradient
  Algorithms <https://arxiv.org/abs/2205.10287>`_, 2022).
  """
  rates = FRONTIER_LR.get(size, FRONTIER_LR[DEFAULT_SIZE])
  if k in rates:
    return rates[k] * args.lr / SWEPT_LR
  return args.lr * math.sqrt(k)


def arm_knobs(
    spec: Mapping[str, Any], args: argparse.Namespace, size: str = DEFAULT_SIZE
) -> dict[str, Any]:
  """An arm's knobs that its train program takes as arrays: the peak lr and :data:`ARRAY_KNOBS`."""
  lr = frontier_lr(spec['k'], args, size) if spec['kind'] == 'fixed' else spec.get('lr', args.lr)
  return {'lr': lr, **{name: spec[name] for name in ARRAY_KNOBS.get(spec['kind'], ())}}


def program_spec(spec: Mapping[str, Any]) -> tuple:
  """The spec without its array knobs, as sorted items: what a compiled program bakes in."""
  skip = {'lr', *ARRAY_KNOBS.get(spec['kind'], ())}
  return tuple(sorted((k, v) for k, v in spec.items() if k not in skip))


def lr_schedule(peak, setup: Setup) -> optax.Schedule:
  """Warmup, then a cosine to a tenth of ``peak``, over the run's microbatches (tokens)."""
  return study.lr_schedule(peak, setup.count, setup.warmup, final=0.1)


def make_optimizer(
    spec: Mapping[str, Any], knobs: Mapping[str, Any], setup: Setup
) -> optax_gqc.AccumulationTransformation:
  """The optimizer of an arm: its gate, built from ``spec``, behind the shared recipe.

  Args:
    spec: a row of :data:`ARMS`.
    knobs: the arm's :func:`arm_knobs`: numbers, or arrays inside the train
      program.
    setup: the run.

  Returns:
    The accumulation, called once per microbatch.
  """
  kind, mb = spec['kind'], setup.microbatch
  if kind == 'fixed':
    gate, max_draws = gates.batch_size_at_least(knobs['k'] * mb, mb), knobs['k']
  elif kind == 'critical':
    gate = gates.critical_batch(
        spec['fraction'], microbatch_size=mb, probe_every=spec.get('probe_every', 4)
    )
    max_draws = spec['max_draws']
  elif kind == 'gnts':  # the library's default, exactly as a user writes it
    inner = optax.inject_hyperparams(optax.adamw, hyperparam_dtype=jnp.float32)(
        learning_rate=knobs['lr'], weight_decay=setup.weight_decay
    )
    return optax_gqc.schedule_by_microbatch(
        optax_gqc.gnts(inner, max_draws=spec['max_draws'], microbatch_size=mb),
        learning_rate=lr_schedule(knobs['lr'], setup),
    )
  elif kind == 'relative':
    gate = gates.any_of(
        gates.norm_below(spec['ratio'], relative=True), gates.relative_error_below(spec['eta'])
    )
    max_draws = spec['max_draws']
  elif kind == 'seesaw':
    # The batch grows as the learning rate decays (Meterez et al. 2025): where
    # the schedule is at a fraction c of its peak, step on 1/c microbatches
    # (and, with scale_by_draws, sqrt(1/c) times the step) instead of on one
    # microbatch with a step c times the peak. One microbatch during warmup.
    shape = lr_schedule(1.0, setup)
    warm = max(int(setup.warmup * setup.count), 1)
    max_draws = spec['max_draws']
    gate = gates.batch_size_at_least(
        lambda t: mb * jnp.where(t < warm, 1.0, jnp.minimum(1.0 / shape(t), max_draws)), mb
    )
  elif kind == 'warmup':  # the logical batch grows linearly in tokens
    start, end, count = spec['start'], spec['end'], setup.count
    gate = gates.batch_size_at_least(
        lambda t: mb * (start + (end - start) * jnp.minimum(t / count, 1.0)), mb
    )
    max_draws = end
  else:
    raise ValueError(f'unknown arm kind {kind!r}')
  # The learning rate is a schedule of the microbatch count (tokens), not of
  # the optimizer steps, whose pace the gate decides.
  return optax_gqc.scheduled_accumulation(
      optax.adamw,
      gate,
      {'learning_rate': lr_schedule(knobs['lr'], setup)},
      max_draws=max_draws,
      microbatch_size=mb,
      scale_by_draws=SCALE_BY_DRAWS[spec.get('scale_by_draws')],
      weight_decay=setup.weight_decay,
  )


# The train program: a block of microbatches in one call.


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


# Running the arms.


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
  knobs = arm_knobs(spec, args, _size_name(size))
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


# The verdict.


def seed_spread(losses: Mapping[str, Sequence[float]]) -> float | None:
  """The seed-to-seed spread: the largest range (max - min) of an arm's final loss.

  Args:
    losses: each arm's final validation loss, one per seed.

  Returns:
    The maximum over arms of ``max - min`` over seeds (with two seeds,
    ``|seed0 - seed1|``); None when no arm has two seeds.
  """
  ranges = [max(v) - min(v) for v in losses.values() if len(v) >= 2]
  return max(ranges) if ranges else None


def verdict(
    frontier: Sequence[tuple[float, float]],
    arms: Mapping[str, tuple[float, float]],
    control: tuple[float, float] | None,
    spread: float | None = None,
) -> dict[str, dict[str, Any]]:
  """Where each arm lands against the fixed-batch frontier, and against the control.

  Args:
    frontier: ``(steps, loss)`` of the fixed arms.
    arms: ``(steps, loss)`` of the arms to judge, by name.
    control: ``(steps, loss)`` of the control, or None.
    spread: the seed-to-seed spread (:func:`seed_spread`), None with one seed.

  Returns:
    For each arm: ``frontier_loss`` (:func:`frontier_loss_at` the arm's
    steps, None outside the frontier), ``margin`` (frontier minus arm:
    positive is below the frontier, better), ``position``: ``below`` or
    ``above`` when ``|margin|`` exceeds the spread (:data:`ONE_SEED_NOISE`
    with one seed), ``on``
    within it, ``outside`` the frontier's range; ``step_ratio`` (the arm's
    steps over the control's) and ``near_control``: whether the arm is within
    :data:`NEAR_CONTROL_NATS` of the control's loss with at most
    :data:`FEW_STEPS_RATIO` times its steps.
  """
  out = {}
  for name, (steps, loss) in arms.items():
    at = frontier_loss_at(frontier, steps)
    margin = None if at is None else at - loss
    bar = ONE_SEED_NOISE if spread is None else spread
    if margin is None:
      position = 'outside'
    elif margin > bar:
      position = 'below'
    elif margin < -bar:
      position = 'above'
    else:
      position = 'on'
    ratio = None if control is None else steps / control[0]
    near = (
        control is not None and loss <= control[1] + NEAR_CONTROL_NATS and ratio <= FEW_STEPS_RATIO
    )
    out[name] = {
        'steps': steps,
        'val_loss': loss,
        'frontier_loss': at,
        'margin': margin,
        'position': position,
        'spread': spread,
        'step_ratio': ratio,
        'vs_control': None if control is None else loss - control[1],
        'near_control': near,
    }
  return out


def verdict_line(verdicts: Mapping[str, Mapping[str, Any]], label: str = '') -> str:
  """The verdict: a heading, then one line per arm.

  One sign convention throughout: a margin is the frontier's loss at the
  arm's step count minus the arm's, in nats, so positive is better than a
  fixed batch with as many optimizer steps; ``vs control`` is the arm's loss
  minus the control's, so positive is worse.
  """
  if not verdicts:
    return f'verdict{label}: no adaptive arm finished'
  lines = [
      f"verdict{label}: margin = frontier loss at the arm's steps - arm loss (nats, + is better)"
  ]
  for name, v in verdicts.items():
    steps = f"{v['steps']:.0f} optimizer steps"
    if v['position'] == 'outside':
      where = f'outside the frontier at {steps}'
    elif v['position'] == 'on':
      noise = 'the spread' if v['spread'] is not None else "one seed's noise"
      where = f"on the frontier at {steps}: margin {v['margin']:+.3f}, within {noise}"
    else:
      where = f"{v['position']} the frontier at {steps}: margin {v['margin']:+.3f}"
    if v['step_ratio'] is not None:
      where += (
          f"; {v['step_ratio']:.2f}x the control's steps, {v['vs_control']:+.3f} nats vs the "
          f"control ({'meets' if v['near_control'] else 'misses'} the "
          f'{NEAR_CONTROL_NATS} nats / {FEW_STEPS_RATIO}x bar)'
      )
    lines.append(f'  {name}: {where}')
  return '\n'.join(lines)


def _margin(arms: Mapping[str, Any], name: str) -> float | None:
  """An arm's margin below the frontier of the fixed arms run beside it."""
  s = {a: r['summary'] for a, r in arms.items()}
  frontier = [(s[a]['steps'], s[a]['val_loss']) for a in FRONTIER if a in s]
  at = frontier_loss_at(frontier, s[name]['steps'])
  return None if at is None else at - s[name]['val_loss']


def summarize(runs: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> list[dict[str, Any]]:
  """Per model size: each arm's mean over seeds, the spread, the frontier and the verdict.

  The verdict is taken on the means, against the seed spread; each adaptive
  arm's verdict also lists ``seed_margins``, its margin in every seed against
  that seed's own frontier (a paired view the spread does not need).
  """
  out = []
  for size in dict.fromkeys(r['size'] for r in runs):
    group = [r for r in runs if r['size'] == size]
    finished = [a for a in arms if any(a in r['arms'] for r in group)]
    per_arm, losses = {}, {}
    for a in finished:
      summaries = [r['arms'][a]['summary'] for r in group if a in r['arms']]
      losses[a] = [s['val_loss'] for s in summaries]
      per_arm[a] = {
          'val_loss': float(np.mean(losses[a])),
          'val_loss_range': float(np.ptp(losses[a])) if len(summaries) > 1 else None,
          'steps': float(np.mean([s['steps'] for s in summaries])),
          'draws_per_step': float(np.mean([s['draws_per_step'] for s in summaries])),
          'num_forced': float(np.mean([s['num_forced'] for s in summaries])),
          'seconds': float(np.mean([s['seconds'] for s in summaries])),
          'noise_scale': _mean_or_none([s['noise_scale'] for s in summaries]),
          'seeds': [r['seed'] for r in group if a in r['arms']],
      }
    spread = seed_spread(losses)
    frontier = [(per_arm[a]['steps'], per_arm[a]['val_loss']) for a in FRONTIER if a in per_arm]
    control = (
        (per_arm['control']['steps'], per_arm['control']['val_loss'])
        if 'control' in per_arm
        else None
    )
    judged = {
        a: (per_arm[a]['steps'], per_arm[a]['val_loss']) for a in finished if a not in FRONTIER
    }
    verdicts = verdict(frontier, judged, control, spread)
    for a, v in verdicts.items():  # each seed's margin against its own frontier
      v['seed_margins'] = [_margin(r['arms'], a) for r in group if a in r['arms']]
    seeds = sorted({r['seed'] for r in group})
    label = f" ({size}, seed{'s' if len(seeds) > 1 else ''} {','.join(map(str, seeds))}"
    label += f', spread {spread:.3f})' if spread is not None else ')'
    out.append(
        {
            'size': size,
            'seeds': seeds,
            'arms': per_arm,
            'spread': spread,
            'frontier': [
                {'arm': a, 'steps': per_arm[a]['steps'], 'val_loss': per_arm[a]['val_loss']}
                for a in FRONTIER
                if a in per_arm
            ],
            'verdict': verdicts,
            'verdict_line': verdict_line(verdicts, label)
            + (
                ''
                if size in FRONTIER_LR
                else '\n  caveat: the frontier runs at the learning rates swept at '
                f'{DEFAULT_SIZE}, which may not be the best at this size (docs/research.md)'
            )
            + (
                ''
                if len(seeds) > 1
                else '\n  note: one seed. Margins smaller than the seed-to-seed spread of this '
                f'task ({ONE_SEED_NOISE} to 0.1 nats) say little on their own; the suite '
                'measures them over seeds with intervals: python benchmarks/suite.py '
                '(docs/study.md)'
            ),
        }
    )
  return out


def _mean_or_none(values: Sequence[float | None]) -> float | None:
  values = [v for v in values if v is not None]
  return float(np.mean(values)) if values else None


def table(summary: Mapping[str, Any]) -> list[str]:
  """The table of one model size: every arm (means over seeds), against the frontier.

  ``B_simple`` is the arm's final noise-scale estimate, in sequences: unbiased
  from the fixed arms, whose decision to step reads no gradient.
  """
  seeds = summary['seeds']
  lines = [
      f"model {summary['size']}, seed{'s' if len(seeds) > 1 else ''} "
      f"{','.join(map(str, seeds))}"
      + (f", seed spread {summary['spread']:.3f} nats" if summary['spread'] is not None else ''),
      f"{'arm':9s} {'val loss':>8s} {'range':>6s} {'opt steps':>9s} {'mb/step':>7s} "
      f"{'forced':>6s} {'B_simple':>8s} {'frontier':>8s} {'margin':>7s} {'wall s':>6s}",
  ]
  for name, a in summary['arms'].items():
    v = summary['verdict'].get(name)
    if v is None:
      at, margin = '-', '-'
    elif v['frontier_loss'] is None:
      at, margin = 'outside', '-'
    else:
      at, margin = f"{v['frontier_loss']:.4f}", f"{v['margin']:+.4f}"
    spread = '-' if a['val_loss_range'] is None else f"{a['val_loss_range']:.4f}"
    noise = '-' if a['noise_scale'] is None else f"{a['noise_scale']:.0f}"
    lines.append(
        f"{name:9s} {a['val_loss']:8.4f} {spread:>6s} {a['steps']:9.0f} "
        f"{a['draws_per_step']:7.2f} {a['num_forced']:6.0f} {noise:>8s} {at:>8s} {margin:>7s} "
        f"{a['seconds']:6.0f}"
    )
  lines.append(
      'units: losses, range and margin in nats (margin = frontier - arm: + is better); '
      'mb/step = microbatches per optimizer step; B_simple in sequences; wall s = seconds '
      'training'
  )
  return lines


# Figures.


def _colors(names: Sequence[str]) -> dict[str, Any]:
  import matplotlib

  blues = matplotlib.colormaps['Blues']
  out = {a: blues(0.4 + 0.6 * i / (len(FRONTIER) - 1)) for i, a in enumerate(FRONTIER)}
  others = [a for a in names if a not in FRONTIER]
  out.update({a: f'C{i + 1}' for i, a in enumerate(others)})
  return out


def _log_axis(axis) -> None:
  """A log scale labelled in plain numbers (100, 200), not powers of ten."""
  from matplotlib import ticker

  axis.axes.set(**{f'{axis.axis_name}scale': 'log'})
  axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f'{v:g}'))
  axis.set_minor_formatter(
      ticker.FuncFormatter(lambda v, _: f'{v:g}' if f'{v:g}'[0] in '25' else '')
  )


def _frontier_axis(ax, arms: Mapping[str, Any], colors, label: bool = True, **style) -> None:
  """Final loss against optimizer steps: the frontier as a line, the other arms as points."""
  points = [
      (arms[a]['summary']['steps'], arms[a]['summary']['val_loss']) for a in FRONTIER if a in arms
  ]
  if points:
    s, v = zip(*sorted(points), strict=True)
    ax.plot(s, v, '-', color='C0', lw=1.5, label='fixed-batch frontier' if label else None, **style)
  for name, r in arms.items():
    marker = 's' if name in FRONTIER else 'o'
    ax.plot(
        r['summary']['steps'],
        r['summary']['val_loss'],
        marker,
        color=colors[name],
        ms=7,
        label=name if label else None,
        **style,
    )
  _log_axis(ax.xaxis)
  ax.set(xlabel='optimizer steps (log)', ylabel='final validation loss (nats/byte)')


def _over_tokens(ax, points, key: str, **style) -> None:
  """Plots ``key`` of the points that have it against their tokens."""
  points = [p for p in points if p.get(key) is not None]
  ax.plot([p['tokens'] for p in points], [p[key] for p in points], **style)


def plot_curves(run: Mapping[str, Any], path: Path) -> None:
  """The figure of one run: the frontier, the curves, the batch and the noise scale."""
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  arms = run['arms']
  colors = _colors(list(arms))
  fig, axes = plt.subplots(2, 2, figsize=(13, 9))
  ax = axes[0, 0]
  _frontier_axis(ax, arms, colors)
  ax.set_title('final loss against optimizer steps')
  ax.legend(fontsize=8)
  ax = axes[0, 1]
  for name, r in arms.items():
    marker = '.' if name in FRONTIER else 'o'
    _over_tokens(ax, r['curve'], 'val_loss', marker=marker, color=colors[name], ms=4, label=name)
  ax.set(xlabel='tokens', ylabel='validation loss (nats/byte)', title='validation loss')
  ax.legend(fontsize=8)
  ax = axes[1, 0]
  first = next(iter(arms.values()))['summary']
  tokens_per_micro = first['tokens'] / first['microbatches']
  for name, r in arms.items():
    draws = np.asarray(r.get('draws_per_step', []), np.float64)
    if not len(draws):
      continue
    at = np.cumsum(draws) * tokens_per_micro
    ax.plot(at, draws, '.', color=colors[name], ms=2, alpha=0.25)
    window = max(len(draws) // 25, 1)
    smooth = np.convolve(draws, np.ones(window) / window, mode='valid')
    ax.plot(at[window - 1 :], smooth, color=colors[name], lw=2, label=name)
  ax.set(
      xlabel='tokens', ylabel='microbatches per step', title='adaptive arms: microbatches per step'
  )
  if ax.lines:
    ax.legend(fontsize=8)
  ax = axes[1, 1]
  for name, r in arms.items():
    if name == 'control':
      continue
    style = '-' if name in FRONTIER else '--'
    _over_tokens(ax, r['trace'], 'noise_scale', ls=style, color=colors[name], lw=1, label=name)
  if 'critical' in arms:
    trace = arms['critical']['trace']
    color = colors['critical']
    _over_tokens(ax, trace, 'target_batch_size', color=color, lw=2.5, label='critical: target')
  ax.set(
      xlabel='tokens',
      ylabel='sequences',
      title='noise scale B_simple and the critical target batch',
  )
  if ax.lines:
    _log_axis(ax.yaxis)
    ax.legend(fontsize=7)
  fig.suptitle(f"model {run['size']}, seed {run['seed']}")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_study(runs: Sequence[Mapping[str, Any]], summaries, path: Path) -> None:
  """One panel per model size: every seed's frontier and arms, and their means."""
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(summaries), figsize=(6.5 * len(summaries), 4.8), squeeze=False)
  for ax, summary in zip(axes[0], summaries, strict=True):
    group = [r for r in runs if r['size'] == summary['size']]
    colors = _colors(list(summary['arms']))
    for r in group:
      _frontier_axis(ax, r['arms'], colors, label=False, alpha=0.35)
    means = {a: {'summary': s} for a, s in summary['arms'].items()}
    _frontier_axis(ax, means, colors)
    ax.set_title(
        f"model {summary['size']}: seeds {','.join(map(str, summary['seeds']))} "
        '(faint) and their mean'
    )
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# The command line.


class _Parser(argparse.ArgumentParser):
  """Errors in one line, naming the flag; no usage block, no traceback."""

  def error(self, message):
    message = ' '.join(str(message).split())
    self.exit(2, f'{self.prog}: error: {message} (see --help)\n')


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
  """Shows every default but None and False (flags, and defaults said in the help)."""

  def _get_help_string(self, action):
    if action.default is None or action.default is False:
      return action.help
    return super()._get_help_string(action)


def _int_at_least(low: int):
  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f'must be an integer, got {text!r}') from None
    if value < low:
      raise argparse.ArgumentTypeError(f'must be >= {low}, got {value}')
    return value

  return parse


def _float_in(low: float, high: float, *, open_low: bool = False, open_high: bool = False):
  def parse(text: str) -> float:
    try:
      value = float(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f'must be a number, got {text!r}') from None
    too_low = value <= low if open_low else value < low
    too_high = value >= high if open_high else value > high
    if not math.isfinite(value) or too_low or too_high:
      interval = f"{'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
      raise argparse.ArgumentTypeError(f'must be in {interval}, got {text}')
    return value

  return parse


def _arm_list(text: str) -> tuple[str, ...]:
  names = [a.strip() for a in text.split(',') if a.strip()]
  unknown = [a for a in names if a not in ARMS]
  if unknown or not names:
    raise argparse.ArgumentTypeError(
        f"unknown arm {', '.join(map(repr, unknown)) or repr(text)} "
        f"(choose from {', '.join(ARMS)})"
    )
  return tuple(dict.fromkeys(names))


def _seed_list(text: str) -> tuple[int, ...]:
  try:
    seeds = [int(s) for s in text.split(',')]
  except ValueError:
    raise argparse.ArgumentTypeError(f'must be comma-separated integers, got {text!r}') from None
  if any(s < 0 for s in seeds):
    raise argparse.ArgumentTypeError(f'seeds must be >= 0, got {text!r}')
  return tuple(dict.fromkeys(seeds))


def _size_list(text: str) -> tuple[tuple[int, int], ...]:
  sizes = []
  for item in text.split(','):
    dim, _, layers = item.strip().lower().partition('x')
    if not (dim.isdigit() and layers.isdigit() and int(dim) >= 1 and int(layers) >= 1):
      raise argparse.ArgumentTypeError(
          f'must be comma-separated WIDTHxLAYERS, each >= 1 (e.g. 96x3,64x2), got {item!r}'
      )
    sizes.append((int(dim), int(layers)))
  return tuple(dict.fromkeys(sizes))


def build_parser(*, defaults: bool = True) -> argparse.ArgumentParser:
  """The command line; every flag has its help, default and range.

  With ``defaults=False`` no flag has a default, so parsing gives only the
  flags on the command line.
  """
  p = _Parser(
      prog='python -m optax_gqc.demo',
      description=(
          'Adaptive gradient accumulation against the fixed-batch frontier, on real text: '
          'every arm trains the same byte-level transformer on the same microbatches, and '
          'the verdict says whether an adaptive arm lands below the loss-against-steps curve '
          'of fixed batches of 1, 2, 3 and 4 microbatches (and 8 with --study).'
      ),
      epilog=(
          "The adaptive arms' knobs are the table ARMS in optax_gqc/demo.py. "
          "The README's figures: python -m optax_gqc.demo --study --tokens 900000 --out docs/demo. "
          'Ctrl-C stops, keeps the arms that finished, and exits 130. See docs/demo.md.'
      ),
      formatter_class=_Formatter,
  )

  def add(*flags, default=None, **kwargs):
    p.add_argument(*flags, default=default if defaults else argparse.SUPPRESS, **kwargs)

  add(
      '--arms',
      type=_arm_list,
      default=','.join(DEFAULT_ARMS),
      metavar='ARM[,ARM...]',
      help=f"arms to run, comma-separated (--study: all); choices: {', '.join(ARMS)}",
  )
  add(
      '--tokens',
      metavar='N',
      type=_int_at_least(1),
      default=DEFAULT_TOKENS,
      help='token budget per arm, rounded down to whole blocks of microbatches',
  )
  add('--data', metavar='FILE', help='train on this text file instead of the stdlib')
  add(
      '--corpus-bytes',
      metavar='N',
      type=_int_at_least(1),
      default=3_000_000,
      help='bytes of the stdlib corpus to read',
  )
  add(
      '--microbatch', metavar='N', type=_int_at_least(1), default=8, help='sequences per microbatch'
  )
  add(
      '--context',
      metavar='N',
      type=_int_at_least(MIN_CONTEXT),
      default=64,
      help='bytes per sequence',
  )
  add('--dim', metavar='N', type=_int_at_least(1), default=96, help='model width')
  add('--layers', metavar='N', type=_int_at_least(1), default=3, help='transformer blocks')
  add(
      '--heads',
      metavar='N',
      type=_int_at_least(1),
      default=4,
      help='attention heads; must divide the width',
  )
  add(
      '--lr',
      metavar='X',
      type=_float_in(0, 1, open_low=True),
      default=4.2e-3,
      help='peak learning rate at one microbatch per step, and of the adaptive arms; the fixed '
      'arms scale the swept rates by lr / 4.2e-3 (frontier_lr)',
  )
  add(
      '--weight-decay',
      metavar='X',
      type=_float_in(0, 1, open_high=True),
      default=0.01,
      help="AdamW's weight decay",
  )
  add(
      '--warmup',
      metavar='X',
      type=_float_in(0, 1, open_high=True),
      default=0.05,
      help='share of the run in learning-rate warmup',
  )
  add(
      '--max-draws',
      metavar='N',
      type=_int_at_least(1),
      default=None,
      help="the most microbatches per step of the critical and gnts arms (default: each arm's "
      'max_draws in ARMS, 32)',
  )
  add(
      '--evals',
      metavar='N',
      type=_int_at_least(1),
      default=12,
      help='validation-loss evaluations per arm',
  )
  add(
      '--block',
      metavar='N',
      type=_int_at_least(1),
      default=50,
      help='microbatches per compiled call (one lax.scan)',
  )
  add(
      '--seeds',
      type=_seed_list,
      default='0',
      metavar='SEED[,SEED...]',
      help='seeds of the model and the microbatch order (with --study: 0,1)',
  )
  add(
      '--sizes',
      type=_size_list,
      default=None,
      metavar='WxL[,WxL...]',
      help='model sizes, width x layers, in place of --dim and --layers (default: --dim x '
      '--layers; with --study, also two thirds the width and one layer fewer)',
  )
  add(
      '--out',
      metavar='DIR',
      default='./gqc-demo-out',
      help='folder for the table, JSON and figures',
  )
  add(
      '--quick',
      action='store_true',
      default=False,
      help='a tiny run (for tests): sets '
      + ', '.join(
          f"--{k.replace('_', '-')} {','.join(v) if isinstance(v, tuple) else v}"
          for k, v in QUICK.items()
      )
      + ' unless given',
  )
  add(
      '--study',
      action='store_true',
      default=False,
      help='every arm, seeds 0,1 and two model sizes; also writes study.png',
  )
  add('--no-progress', action='store_true', default=False, help='no progress bars')
  return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """Parses and checks the command line; a bad flag exits with a one-line error."""
  parser = build_parser()
  args = parser.parse_args(argv)
  given = set(vars(build_parser(defaults=False).parse_args(argv)))
  if args.quick:
    for dest, value in QUICK.items():
      if dest not in given:
        setattr(args, dest, value)
  if args.study and 'seeds' not in given:
    args.seeds = STUDY_SEEDS
  if args.study and args.quick:
    parser.error(
        'argument --study: not with --quick (a study of the tiny model says nothing); run '
        '--study alone, or --quick with --seeds 0,1 for a quick look at two seeds'
    )
  if args.study and 'arms' not in given:
    args.arms = tuple(ARMS)
  if args.sizes is None:
    args.sizes = ((args.dim, args.layers),)
    if args.study:
      small = (
          max(args.heads, 2 * args.dim // 3 // args.heads * args.heads),
          max(args.layers - 1, 1),
      )
      args.sizes = tuple(dict.fromkeys([*args.sizes, small]))
  elif {'dim', 'layers'} & given:
    parser.error('argument --sizes: give either --sizes or --dim/--layers')
  for dim, _ in args.sizes:
    if dim % args.heads:
      flag = '--sizes' if 'sizes' in given else '--dim'
      parser.error(f'argument --heads: {args.heads} heads do not divide the width {dim} ({flag})')
  tokens_per_micro = args.microbatch * args.context
  need = max(args.evals, MIN_MICROBATCHES)
  if args.tokens // tokens_per_micro < need:
    parser.error(
        f'argument --tokens: {args.tokens} tokens make {args.tokens // tokens_per_micro} '
        f'microbatches of {args.microbatch} x {args.context}; need at least {need} '
        f'(--evals, and {MIN_MICROBATCHES} so that every fixed arm steps)'
    )
  memory = _memory_bytes()
  if memory and args.tokens * BYTES_PER_TOKEN > MAX_MEMORY_SHARE * memory:
    parser.error(
        f'argument --tokens: {args.tokens} tokens per arm take about '
        f'{args.tokens * BYTES_PER_TOKEN / 2**30:.1f} GiB before training (the microbatches '
        f"are sampled up front), over {MAX_MEMORY_SHARE:.0%} of this machine's "
        f'{memory / 2**30:.0f} GiB: pass at most '
        f'{int(MAX_MEMORY_SHARE * memory / BYTES_PER_TOKEN)}'
    )
  min_bytes = 10 * (args.context + 2)  # the held-out 10% must hold a window
  if args.data is None:
    available = len(stdlib_corpus(args.corpus_bytes)[0])
    if available < min_bytes:
      parser.error(
          f'argument --corpus-bytes: {available} bytes of stdlib source; need at least '
          f'{min_bytes} (10 x (--context + 2), for the held-out 10%), or give --data FILE'
      )
  else:
    problem = _data_problem(Path(args.data), min_bytes)
    if problem:
      parser.error(f'argument --data: {problem}')
  problem = _out_problem(Path(args.out))
  if problem:
    parser.error(f'argument --out: {problem}')
  return args


def _memory_bytes() -> int | None:
  """This machine's physical memory, or None where the OS does not say."""
  try:
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  except (ValueError, OSError, AttributeError):
    return None


def _data_problem(path: Path, min_bytes: int) -> str | None:
  """Why ``path`` cannot be the training text, or None."""
  if not path.exists():
    return f'no such file: {path}'
  if path.is_dir():
    return f'{path} is a directory, not a text file'
  if not path.is_file():
    return f'{path} is not a regular file'
  try:
    data = path.read_bytes()
  except OSError as e:
    return f'cannot read {path}: {e.strerror or e}'
  if not data:
    return f'{path} is empty'
  if len(data) < min_bytes:
    return (
        f'{path} holds {len(data)} bytes; need at least {min_bytes} '
        '(10 x (--context + 2), for the held-out 10%)'
    )
  if b'\0' in data:
    return f'{path} looks binary (it holds NUL bytes); give a text file'
  invalid = len(data) - len(data.decode('utf-8', 'ignore').encode('utf-8'))
  if invalid > 0.05 * len(data):
    return f'{path} is not text: {invalid / len(data):.0%} of its bytes are not UTF-8'
  return None


def _out_problem(path: Path) -> str | None:
  """Why ``path`` cannot be the output folder (creating it if missing), or None."""
  if path.exists() and not path.is_dir():
    return f'{path} is a file, not a folder'
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    return f'cannot create {path}: {e.strerror or e}'
  if not os.access(path, os.W_OK):
    return f'cannot write into {path}'
  return None


# The main job.


def load_corpus(args: argparse.Namespace) -> tuple[np.ndarray, list[str]]:
  if args.data:
    text, source = Path(args.data).read_bytes(), [args.data]
  else:
    text, source = stdlib_corpus(args.corpus_bytes)
  return np.frombuffer(text, np.uint8).astype(np.int32), source


def _size_name(size: tuple[int, int]) -> str:
  return f'{size[0]}x{size[1]}'


def run_all(args, data, run_plan, runs: list) -> None:
  """Every size, seed and arm, appending to ``runs`` as arms finish (so Ctrl-C keeps them)."""
  split = int(0.9 * len(data))
  val = sample_batches(data[split:], VAL_BATCHES * VAL_SEQUENCES, 1, args.context, VAL_SEED)
  val = jnp.asarray(val.reshape(VAL_BATCHES, VAL_SEQUENCES, -1), jnp.int32)
  for size in args.sizes:
    model = CharTransformer(size[0], size[1], args.heads, args.context, nnx.Rngs(0))
    parameters = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    for seed in args.seeds:
      train = sample_batches(data[:split], run_plan.count, args.microbatch, args.context, seed)
      print(f'model {_size_name(size)} ({parameters / 1e6:.2f}M parameters), seed {seed}')
      run = {'size': _size_name(size), 'parameters': parameters, 'seed': seed, 'arms': {}}
      runs.append(run)
      for name in args.arms:
        spec = dict(ARMS[name])
        if args.max_draws is not None and 'max_draws' in spec:
          spec['max_draws'] = args.max_draws
        run['arms'][name] = run_arm(name, spec, args, size, seed, train, val, run_plan)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Runs the demo; returns what it writes to ``results.json``."""
  args = parse_args(argv)
  out = Path(args.out)
  runs: list[dict[str, Any]] = []
  interrupted, source, run_plan = False, [], None
  try:
    data, source = load_corpus(args)
    tokens_per_micro = args.microbatch * args.context
    run_plan = plan(args.tokens, tokens_per_micro, args.evals, args.block)
    print(
        f'{len(data) / 1e6:.2f} MB of text ({len(source)} files); {len(args.arms)} arms x '
        f'{len(args.seeds)} seeds x {len(args.sizes)} sizes; {run_plan.count} microbatches of '
        f'{args.microbatch} x {args.context} bytes per arm ({run_plan.count * tokens_per_micro} '
        f'tokens), in blocks of {run_plan.block}'
    )
    run_all(args, data, run_plan, runs)
  except KeyboardInterrupt:  # the arm cut short was never added
    interrupted = True
    runs = [r for r in runs if r['arms']]
  if not runs:
    print('interrupted: no arm finished, nothing written', file=sys.stderr)
    raise SystemExit(130)

  summaries = summarize(runs, args.arms)
  lines = []
  for s in summaries:
    lines += [*table(s), s['verdict_line'], '']
  first = runs[0]
  payload = {
      'config': {**vars(args), 'count': run_plan.count, 'block': run_plan.block},
      'corpus_files': source,
      'interrupted': interrupted,
      'arms': first['arms'],
      'frontier': summaries[0]['frontier'],
      'verdict': {s['size']: s['verdict'] for s in summaries},
      'verdict_lines': [s['verdict_line'] for s in summaries],
      'summary': summaries,
      'runs': runs,
      'device': jax.devices()[0].platform,
  }
  arm_summaries = [a['summary'] for r in runs for a in r['arms'].values()]
  train_s = sum(a['seconds'] for a in arm_summaries)
  compile_s = sum(a['compile_seconds'] for a in arm_summaries)
  payload['seconds'] = {'training': train_s, 'compiling': compile_s}
  plot_curves(first, out / 'curves.png')
  written = ['table.txt', 'results.json', 'curves.png']
  if args.study:
    plot_study(runs, summaries, out / 'study.png')
    written.append('study.png')
  (out / 'results.json').write_text(json.dumps(payload, indent=1))
  (out / 'table.txt').write_text('\n'.join(lines))
  print('\n' + '\n'.join(lines[:-1]))
  print(
      f'time: {train_s:.0f} s training, {compile_s:.0f} s compiling (and the first evaluation): '
      f'{compile_s / max(train_s + compile_s, 1e-9):.0%} compiling'
  )
  print(f"wrote {', '.join(str(out / w) for w in written)}")
  if interrupted:
    print(
        f'interrupted: kept the arms that finished ({sum(len(r["arms"]) for r in runs)})',
        file=sys.stderr,
    )
    raise SystemExit(130)
  return payload


if __name__ == '__main__':
  main()
