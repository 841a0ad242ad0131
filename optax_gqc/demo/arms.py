"""The arms: how each builds its optimizer, at which peak learning rate.

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
"""

import argparse
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax.numpy as jnp
import optax

import optax_gqc
from optax_gqc import gates, study

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


class Setup(NamedTuple):
  """What a train program bakes in besides its arm: hashable, a key of the program cache."""

  microbatch: int  # sequences per microbatch
  count: int  # microbatches in the run: the length of the learning-rate schedule
  warmup: float  # share of the run in warmup
  weight_decay: float


def size_name(size: tuple[int, int]) -> str:
  """A model size ``(width, layers)`` as its name, e.g. ``'96x3'``: a key of :data:`FRONTIER_LR`."""
  return f'{size[0]}x{size[1]}'


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
    warm = study._warmup_count(setup.warmup, setup.count)  # as lr_schedule's
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
