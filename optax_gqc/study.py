"""Does adaptive accumulation pay on *your* model? The frontier study.

Accumulating saves optimizer steps, not tokens: at a fixed token budget a
bigger batch costs loss, and the question for a gate is whether it buys more
loss per step saved than a fixed batch does. :func:`frontier_study` answers it
on a user's loss function, initial parameters and microbatches:

1. every arm trains on the same microbatches, in the same order, for the same
   tokens, with the learning rate a schedule of *microbatches* (tokens) for
   all arms (a warmup, then a cosine to a fraction of the peak), so that arms
   differ only in when they step;
2. the *frontier*: fixed batches of ``k`` microbatches per step, each ``k`` at
   its best peak learning rate from ``learning_rates``, chosen on each seed;
3. each adaptive arm at the control's (``k = 1``) best rate of the same seed:
   the rate a user who tuned the baseline already has;
4. an arm's *margin* on a seed is the frontier's validation loss at the arm's
   number of optimizer steps (linear in log steps between frontier points)
   minus the arm's loss: positive is below the frontier, better than a fixed
   batch with as many steps. Over seeds: the mean and a paired 95% t-interval.

Each arm compiles once: the peak learning rate and ``k`` are arguments of a
program that trains every rate of the grid side by side (``jax.vmap``), the
run in one ``lax.scan``. Meant for small models, or a small proxy of a big one.

Example:
  >>> import jax, jax.numpy as jnp, optax, optax_gqc
  >>> from optax_gqc import study
  >>> def loss_fn(w, batch):
  ...   x, y = batch
  ...   return jnp.mean((x @ w - y) ** 2)
  >>> def data(seed, count=64, size=4):
  ...   kx, kn = jax.random.split(jax.random.key(seed))
  ...   x = jax.random.normal(kx, (count, size, 3))
  ...   return x, x @ jnp.ones(3) + 0.5 * jax.random.normal(kn, (count, size))
  >>> result = study.frontier_study(
  ...     loss_fn, jnp.zeros(3), data, eval_batches=data(99, 4, 64),
  ...     arms={'gnts': optax_gqc.gnts},
  ...     learning_rates=(0.03, 0.1), ks=(1, 2, 4), seeds=(0, 1), evals=2)
  >>> sorted(result['arms'])
  ['gnts']
  >>> len(result['arms']['gnts']['margins'])  # one per seed
  2
"""

import functools
import math
import numbers
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_gqc import _checks, gates
from optax_gqc._accumulation import accumulate, update_and_apply
from optax_gqc._recipes import _static_args, schedule_by_microbatch
from optax_gqc._statistics import statistics
from optax_gqc._student_t import t_quantile

__all__ = [
    'fixed_batch',
    'frontier_loss_at',
    'frontier_study',
    'lr_schedule',
    'merge',
    'paired_interval',
    'plot',
    'summarize',
    'table',
]

# An arm: the inner optimizer -> the accumulation around it, e.g. optax_gqc.gnts.
Arm = Callable[[optax.GradientTransformation], Any]


def lr_schedule(peak: Any, count: int, warmup: float = 0.05, final: float = 0.1) -> optax.Schedule:
  """Linear warmup over ``warmup`` of ``count`` microbatches, then a cosine to ``final * peak``.

  A schedule of the microbatch count (tokens), the same for every arm.

  Args:
    peak: the peak learning rate, > 0 and finite; it may be traced.
    count: the microbatches in the run: the cosine ends there.
    warmup: the share of the run in warmup, in [0, 1): at least one
      microbatch where it is > 0, and none at 0.
    final: the rate at the end, as a fraction of ``peak``, >= 0.

  Returns:
    A schedule, a function of the microbatch count.
  """
  _checks.check_positive_int('count', count)
  _checks.check_positive('peak', peak, finite=True)  # a traced one passes
  _check_fractions(warmup, final)
  shape = optax.warmup_cosine_decay_schedule(
      0.0, 1.0, _warmup_count(warmup, count), max(count, 2), end_value=final
  )
  return lambda t: peak * shape(t)


def _warmup_count(warmup: float, count: int) -> int:
  """:func:`lr_schedule`'s warmup in microbatches: at least one where ``warmup`` > 0."""
  return max(int(warmup * count), warmup > 0)


def fixed_batch(k: Any) -> Arm:
  """The frontier's arm: a step on the mean of every ``k`` microbatches.

  Args:
    k: microbatches per step, >= 1; it may be traced.

  Returns:
    An arm: a function of the inner optimizer that returns the accumulation.
  """
  _checks.check_positive_int('k', k)  # a traced one passes
  return lambda inner: accumulate(
      inner, gates.from_function(lambda s: s.num_draws >= k), max_draws=None
  )


def _train_program(loss_fn, make_tx, count: int, evals: int):
  """``(params, batches, eval_batches, peak, k) -> (val losses, steps, forced, noise)``."""
  chunk = count // evals

  def eval_loss(params, eval_batches):
    return jnp.mean(jax.lax.map(lambda b: loss_fn(params, b), eval_batches))

  def train(params, batches, eval_batches, peak, k):
    tx = make_tx(peak, k)
    state = tx.init(params)

    def microbatch(carry, batch):
      params, state = carry
      grads = jax.grad(loss_fn)(params, batch)
      return update_and_apply(tx, grads, state, params), None

    def block(carry, block_batches):
      carry, _ = jax.lax.scan(microbatch, carry, block_batches)
      params, state = carry
      return carry, (eval_loss(params, eval_batches), statistics(state)['num_steps'])

    blocks = jax.tree.map(lambda x: x[: chunk * evals].reshape(evals, chunk, *x.shape[1:]), batches)
    (params, state), (losses, steps) = jax.lax.scan(block, (params, state), blocks)
    stats = statistics(state)
    return losses, steps, stats['num_forced'], stats['noise_scale']

  return jax.jit(jax.vmap(train, in_axes=(None, None, None, 0, 0)))


def frontier_loss_at(frontier: Sequence[tuple[float, float]], steps: float) -> float | None:
  """The frontier's loss at ``steps``: linear in log(steps) between its neighbours.

  Args:
    frontier: ``(steps, loss)`` points, in any order; of several at one
      step count, the lowest loss is the frontier's (a NaN only if all are).
    steps: where to read it.

  Returns:
    The interpolated loss; None outside the frontier's range of steps (no
    extrapolation) or with fewer than two step counts.

  Raises:
    ValueError: if a frontier point's step count is not positive and finite
      (its log is not defined); ``steps`` of 0 is outside the range (None).
  """
  frontier = list(frontier)  # a generator, read twice
  if not all(0 < s < math.inf for s, _ in frontier):  # NaN fails too
    raise ValueError(
        'frontier_loss_at reads step counts on a log scale: each frontier point must have '
        f'finite steps > 0, got {sorted(s for s, _ in frontier)!r} (leave out runs that never '
        'stepped)'
    )
  best = {}
  for s, loss in frontier:
    if s not in best or loss < best[s] or math.isnan(best[s]):
      best[s] = loss
  points = sorted(best.items())
  if len(points) < 2 or not points[0][0] <= steps <= points[-1][0]:
    return None
  for (s0, l0), (s1, l1) in zip(points, points[1:], strict=False):
    if s0 <= steps <= s1:
      w = (math.log(steps) - math.log(s0)) / (math.log(s1) - math.log(s0))
      return l0 + w * (l1 - l0)
  return None  # unreachable


def paired_interval(values: Sequence[float | None], confidence: float = 0.95) -> dict[str, Any]:
  """The mean of per-seed values and its two-sided t-interval.

  Args:
    values: one value per seed (a margin, paired with its seed's own
      frontier); None entries (outside the frontier) and entries that are
      not finite (a run that diverged) are left out.
    confidence: of the interval, in (0, 1): 0.95, not 95.

  Returns:
    ``mean``, ``low``, ``high`` (None with fewer than two values), ``min``
    and ``n``.

  Raises:
    ValueError: if ``confidence`` is not in (0, 1).
  """
  if not 0 < confidence < 1:
    raise ValueError(f'confidence must be in (0, 1), e.g. 0.95, got {confidence!r}')
  v = np.array([x for x in values if x is not None and math.isfinite(x)], np.float64)
  if not v.size:
    return {'mean': None, 'low': None, 'high': None, 'min': None, 'n': 0}
  mean = float(v.mean())
  if v.size < 2:
    return {'mean': mean, 'low': None, 'high': None, 'min': float(v.min()), 'n': 1}
  half = float(t_quantile(confidence, v.size - 1)) * float(v.std(ddof=1)) / math.sqrt(v.size)
  return {
      'mean': mean,
      'low': mean - half,
      'high': mean + half,
      'min': float(v.min()),
      'n': int(v.size),
  }


def _margin(frontier: Sequence[tuple[float, float]], run: dict[str, Any] | None) -> float | None:
  """The frontier's loss at the run's steps minus the run's: positive is better."""
  if run is None or not math.isfinite(run['val_loss']):
    return None
  at = frontier_loss_at(frontier, run['num_steps'])
  return None if at is None else at - run['val_loss']


def _summarize(per_seed: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
  """An arm's per-seed records, and their means and paired intervals."""

  def column(key):
    return [r[key] for r in per_seed]

  # Over the seeds the margin covers, as the table reports them together.
  ratios = [r['step_ratio'] for r in per_seed if r['margin'] is not None]
  return {
      'per_seed': list(per_seed),
      'margins': column('margin'),
      'best_margins': column('best_margin'),
      'step_ratios': column('step_ratio'),
      'margin': paired_interval(column('margin')),
      'best_margin': paired_interval(column('best_margin')),
      'step_ratio': float(np.mean(ratios)) if ratios else None,
  }


def merge(*results: Mapping[str, Any]) -> dict[str, Any]:
  """One study from studies of the same task and arms on different seeds (e.g. run apart).

  The studies must agree in their grid, microbatches and arms, and in the
  optimizer and its arguments (by name) and the schedule's shape, among
  those that record them (results saved by earlier versions do not).

  Args:
    *results: what :func:`frontier_study` returned (or its JSON, loaded).

  Returns:
    The study over all their seeds, as :func:`frontier_study` returns it.
  """
  meta = {}
  for key in (*_SHARED, *_SETTINGS):  # a setting from every study that records it
    values = [r[key] for r in results if key in _SHARED or key in r]
    if values:
      meta[key] = values[0]
    for value in values[1:]:
      if value != values[0]:
        raise ValueError(f'merge: the studies differ in {key}: {values[0]} vs {value}')
  meta['seeds'] = [s for r in results for s in r['seeds']]
  if len(set(meta['seeds'])) != len(meta['seeds']):
    raise ValueError(
        f"merge: the studies share seeds ({meta['seeds']}): a seed run twice gives the same "
        'runs, which the intervals would count as independent'
    )
  return summarize([run for r in results for run in r['runs']], meta)


# What studies to merge must share; the settings too where both record them (older don't).
_SHARED = ('learning_rates', 'ks', 'microbatches', 'arm_names')
_SETTINGS = ('optimizer', 'optimizer_kwargs', 'warmup', 'final_lr')


def _name(f: Any) -> str:
  """A function (or a partial of one) by name, as the study records it: no address.

  A number reads as its float (0 and 0.0 agree); another callable by its
  type's name. Functions are told apart by name alone, not by what they
  close over.
  """
  if isinstance(f, functools.partial):
    args = [*map(_name, f.args), *(f'{k}={_name(v)}' for k, v in sorted(f.keywords.items()))]
    return f"{_name(f.func)}({', '.join(args)})"
  if _checks.is_number(f) and np.ndim(f) == 0 and np.isrealobj(f):
    return repr(float(f))
  if callable(f):
    named = f if hasattr(f, '__qualname__') else type(f)  # an instance: its class
    return f'{named.__module__}.{named.__qualname__}'
  return repr(f)


def _per_seed(value: Any, seed: int) -> Any:
  return value(seed) if callable(value) else value


_RESERVED = ('fixed', 'frontier')  # the fixed runs' arm, and on_result's frontier


def _check_fractions(warmup: float, final: float, final_name: str = 'final') -> None:
  given = all(_checks.is_number(x) and np.ndim(x) == 0 for x in (warmup, final))  # not True
  if not (given and 0 <= warmup < 1 and 0 <= final < math.inf):
    raise ValueError(
        f'warmup must be a number in [0, 1) and {final_name} a finite number >= 0 (fractions of '
        f'the peak rate), got {warmup!r} and {final!r}'
    )


def _check_args(learning_rates, ks, seeds, evals, count, seeded, arm_names, warmup, final_lr):
  reserved = [name for name in arm_names if name in _RESERVED]
  if reserved:
    raise ValueError(f'arms may not be named {reserved}: the study names its own runs so')
  given = learning_rates and all(_checks.is_number(lr) for lr in learning_rates)  # not True
  as_trained = np.asarray(learning_rates, np.float32) if given else np.zeros(0)
  if not given or not np.all((as_trained > 0) & np.isfinite(as_trained)):
    raise ValueError(
        f'learning_rates must be positive finite numbers (in float32, as they train), got '
        f'{learning_rates!r}'
    )
  _check_fractions(warmup, final_lr, 'final_lr')
  if 1 not in ks or len(set(ks)) < 2:
    raise ValueError(
        f'ks must include 1, the control, and another k: a frontier of one point gives no '
        f'margin, got {ks!r}'
    )
  if not seeds:
    raise ValueError('seeds must name at least one seed')
  if len(set(seeds)) != len(seeds):
    raise ValueError(
        f'seeds must differ, got {seeds!r}: a seed run twice gives the same runs, which the '
        'intervals would count as independent'
    )
  if len(seeds) > 1 and not seeded:
    raise ValueError(
        f'seeds {seeds!r} would all train the same: params and microbatches are the same '
        'arrays for every seed (a function of the seed for eval_batches alone changes only '
        'what is measured, and the intervals would read it as independent training). Pass a '
        'function of the seed for params or microbatches, or one seed'
    )
  _checks.check_positive_int('evals', evals)
  if count < evals * max(ks):
    raise ValueError(
        f'{count} microbatches are too few for {evals} evaluations and k up to {max(ks)}: '
        'pass more microbatches, or fewer evals'
    )


def frontier_study(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    microbatches: Any,
    *,
    eval_batches: Any,
    arms: Mapping[str, Arm],
    learning_rates: Sequence[float],
    ks: Sequence[int] = (1, 2, 3, 4, 6, 8),
    seeds: Sequence[int] = (0, 1, 2),
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    optimizer_kwargs: Mapping[str, Any] | None = None,
    evals: int = 4,
    warmup: float = 0.05,
    final_lr: float = 0.1,
    on_result: Callable[[str, int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
  """Runs the fixed-batch frontier and adaptive ``arms`` on every seed; margins with intervals.

  Args:
    loss_fn: ``(params, batch) -> scalar loss`` of one microbatch.
    params: the initial parameters, or a function of the seed that returns them.
    microbatches: the training microbatches stacked on a leading axis (a
      pytree of arrays of shape ``[count, ...]``), or a function of the seed
      that returns them (as many for every seed). Every arm of a seed sees
      the same ones, in order: the first ``count - count % evals``, so that
      the evaluations are evenly spaced (the result's ``microbatches`` says
      how many).
    eval_batches: validation batches stacked on a leading axis (or a
      function of the seed): the validation loss is their mean loss.
    arms: the adaptive arms by name: functions of the inner optimizer that
      return the accumulation, e.g. ``optax_gqc.gnts`` or
      ``functools.partial(optax_gqc.gnts, ratio=0.5)``. The inner optimizer
      injects its learning rate, which follows the study's schedule of
      microbatches (:func:`optax_gqc.schedule_by_microbatch`). ``fixed`` and
      ``frontier`` are the study's own names, not an arm's.
    learning_rates: the grid of peak learning rates; every arm runs at each.
    ks: the frontier's microbatches per step; must include 1, the control.
      The margins read the frontier as straight lines in log steps between
      its points, and a frontier curves: points a factor of 2 apart flatter
      an arm between them (docs/study.md), hence 3 and 6 by default.
    seeds: the seeds; each has its own frontier. Several need ``params`` or
      ``microbatches`` to be a function of the seed: otherwise every seed
      would train the same, and the intervals would read copies as
      independent.
    optimizer: the optimizer factory, taking ``learning_rate``; built with
      ``optax.inject_hyperparams``.
    optimizer_kwargs: its other arguments (e.g. ``weight_decay``).
    evals: validation losses taken over the run (the last is the verdict's).
    warmup, final_lr: the shape of :func:`lr_schedule`: the share of the
      run in warmup, in [0, 1), and the final rate as a fraction of the
      peak, >= 0.
    on_result: called with ``(arm, seed, record)`` as each arm's runs on a
      seed finish (for progress, or to save as you go).

  Returns:
    A dict: ``runs`` (every run: arm, seed, lr, k, validation losses and
    steps at each evaluation, steps forced, noise scale), ``frontier`` (per
    seed, each ``k`` at its best rate), and ``arms``: for each adaptive arm,
    per seed ``margins`` (at the control's best rate), ``best_margins`` (at
    the arm's own best rate), ``step_ratios`` (its steps over the
    control's; None where its loss is not finite), their
    :func:`paired_interval` as ``margin`` and ``best_margin``, and
    ``step_ratio``, the mean ratio over the seeds with a margin; and the
    settings it ran with (``seeds``, ``learning_rates``, ``ks``,
    ``microbatches``, ``arm_names``, ``optimizer`` and ``optimizer_kwargs`` by
    name, ``warmup``, ``final_lr``), which :func:`merge` compares. A warning
    says when every seed gave the same frontier, to the bit.
  """
  optimizer_kwargs = dict(optimizer_kwargs or {})
  static = _static_args(optimizer_kwargs)  # masks and dtypes reach the optimizer as they are
  scheduled = [name for name, v in optimizer_kwargs.items() if callable(v) and name not in static]
  if scheduled:
    raise TypeError(
        f'optimizer_kwargs[{scheduled[0]!r}] is a function: inject_hyperparams would make it a '
        "schedule of each arm's optimizer steps, which its gate paces, so the arms would differ "
        'in more than when they step. Pass a constant (the study schedules the learning rate '
        'by the microbatch count); a mask is a function of the params, named ...mask'
    )
  if isinstance(seeds, numbers.Integral | str):
    raise TypeError(f'seeds is a sequence of seeds, e.g. (0, 1, 2), got {seeds!r}')
  # A NumPy array or a generator of seeds too; NumPy's integers as Python's, for the JSON.
  seeds = [int(s) if isinstance(s, numbers.Integral) else s for s in seeds]
  ks = tuple(ks)  # a generator, read twice
  for k in ks:  # before int() would make 1.9 the control
    _checks.check_positive_int('each k', k)
  ks = tuple(int(k) for k in ks)
  learning_rates = tuple(learning_rates)  # a generator, read twice
  lrs = np.asarray(learning_rates, np.float32)
  first = _per_seed(microbatches, seeds[0] if seeds else 0)
  given = jax.tree.leaves(first)[0].shape[0]
  seeded = any(callable(x) for x in (params, microbatches))  # seeds that train differently
  _check_args(learning_rates, ks, tuple(seeds), evals, given, seeded, list(arms), warmup, final_lr)
  count = given - given % evals  # evaluations evenly spaced: the rest is left out

  def program(arm):
    def make_tx(peak, k):
      inner = optax.inject_hyperparams(optimizer, static_args=static)(
          learning_rate=peak, **optimizer_kwargs
      )
      tx = (arm if arm is not None else fixed_batch(k))(inner)
      return schedule_by_microbatch(tx, learning_rate=lr_schedule(peak, count, warmup, final_lr))

    return _train_program(loss_fn, make_tx, count, evals)

  programs = {name: program(arm) for name, arm in arms.items()}
  fixed_program = program(None)
  grid_k = np.repeat(np.asarray(ks, np.int32), lrs.size)
  grid_lr = np.tile(lrs, len(ks))

  runs = []
  for seed in seeds:
    p0, val = _per_seed(params, seed), _per_seed(eval_batches, seed)
    data = first if seed == seeds[0] else _per_seed(microbatches, seed)
    if jax.tree.leaves(data)[0].shape[0] != given:
      raise ValueError(
          f'microbatches({seed!r}) gives {jax.tree.leaves(data)[0].shape[0]} microbatches and '
          f'microbatches({seeds[0]!r}) {given}: every seed trains on as many'
      )

    def record(name, values, lr, k, seed=seed):
      losses, steps, forced, noise = values
      return {
          'arm': name,
          'seed': seed,
          'lr': float(lr),
          'k': None if k is None else int(k),
          'val_losses': [float(x) for x in losses],
          'steps': [int(x) for x in steps],
          'val_loss': float(losses[-1]),
          'num_steps': int(steps[-1]),
          'num_forced': int(forced),
          'noise_scale': float(noise),
      }

    values = jax.device_get(fixed_program(p0, data, val, grid_lr, grid_k))
    runs += [
        record('fixed', [v[i] for v in values], lr, k)
        for i, (k, lr) in enumerate(zip(grid_k, grid_lr, strict=True))
    ]
    if on_result is not None:
      on_result('frontier', seed, _frontier(runs, seed))
    for name, prog in programs.items():
      values = jax.device_get(prog(p0, data, val, lrs, np.ones_like(lrs, np.int32)))
      runs += [record(name, [v[i] for v in values], lr, None) for i, lr in enumerate(lrs)]
      if on_result is not None:
        on_result(name, seed, _arm_on_seed(runs, name, seed))

  fixed = [[r['val_losses'] for r in runs if r['arm'] == 'fixed' and r['seed'] == s] for s in seeds]
  if len(seeds) > 1 and all(f == fixed[0] for f in fixed):
    warnings.warn(
        f'every seed of {list(seeds)} gave the same frontier, to the bit: a function of the seed '
        'that ignores it? The intervals read the seeds as independent',
        stacklevel=2,
    )
  return summarize(
      runs,
      {
          'seeds': list(seeds),
          'learning_rates': [float(x) for x in lrs],
          'ks': list(ks),
          'microbatches': int(count),
          'arm_names': list(arms),
          'optimizer': _name(optimizer),
          'optimizer_kwargs': {k: _name(v) for k, v in sorted(optimizer_kwargs.items())},
          'warmup': float(warmup),
          'final_lr': float(final_lr),
      },
  )


def _frontier(runs: Sequence[Mapping[str, Any]], seed: int) -> dict[int, Mapping[str, Any]]:
  """Each ``k``'s run at its best rate on ``seed``, of those that stepped: the seed's frontier."""
  best = {}
  for r in runs:
    if (
        r['arm'] == 'fixed'
        and r['seed'] == seed
        and r['num_steps'] > 0  # a run that never stepped has no place on the steps axis
        and math.isfinite(r['val_loss'])
    ):
      if r['k'] not in best or r['val_loss'] < best[r['k']]['val_loss']:
        best[r['k']] = r
  return dict(sorted(best.items()))


def _arm_on_seed(runs: Sequence[Mapping[str, Any]], name: str, seed: int) -> dict[str, Any]:
  """An adaptive arm on one seed: its margin at the control's best rate and at its own."""
  frontier = _frontier(runs, seed)
  points = [(r['num_steps'], r['val_loss']) for r in frontier.values()]
  control = frontier.get(1)
  rows = [r for r in runs if r['arm'] == name and r['seed'] == seed]
  at_control = next((r for r in rows if control and r['lr'] == control['lr']), None)
  finite = [r for r in rows if math.isfinite(r['val_loss'])]
  own_best = min(finite, key=lambda r: r['val_loss']) if finite else None
  return {
      'seed': seed,
      'margin': _margin(points, at_control),
      'best_margin': _margin(points, own_best),
      'val_loss': None if at_control is None else at_control['val_loss'],
      'steps': None if at_control is None else at_control['num_steps'],
      'step_ratio': (  # none for a run that diverged: its step count stopped, not saved
          None
          if at_control is None or control is None or not math.isfinite(at_control['val_loss'])
          else at_control['num_steps'] / control['num_steps']
      ),
      'best_lr': None if own_best is None else own_best['lr'],
  }


def summarize(runs: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> dict[str, Any]:
  """The study from its runs: each seed's frontier, each arm's margins and intervals.

  Args:
    runs: the ``runs`` of one or more studies of the same task.
    meta: ``seeds``, ``learning_rates``, ``ks``, ``microbatches`` and
      ``arm_names`` (the adaptive arms, in order), and optionally the
      settings :func:`frontier_study` records (``optimizer``,
      ``optimizer_kwargs``, ``warmup``, ``final_lr``).

  Returns:
    What :func:`frontier_study` returns.
  """
  seeds = list(meta['seeds'])
  frontier = {
      seed: {
          k: {'lr': r['lr'], 'steps': r['num_steps'], 'val_loss': r['val_loss']}
          for k, r in _frontier(runs, seed).items()
      }
      for seed in seeds
  }
  arms = {
      name: _summarize([_arm_on_seed(runs, name, seed) for seed in seeds])
      for name in meta['arm_names']
  }
  return {**meta, 'runs': list(runs), 'frontier': frontier, 'arms': arms}


def _fmt(x: float | None, spec: str = '+.3f') -> str:
  return '-' if x is None else format(x, spec)


def table(result: Mapping[str, Any], title: str = '') -> list[str]:
  """The study as text: the frontier per seed, then one line per adaptive arm.

  Args:
    result: what :func:`frontier_study` or :func:`merge` returned (or its
      JSON, loaded).
    title: a first line, if given.

  Returns:
    The lines, without line ends.

  Margins are in the loss's units (nats for a cross entropy): the frontier's
  loss at the arm's step count minus the arm's, so positive is better than a
  fixed batch with as many steps; ``[low, high]`` is the paired 95% interval
  over seeds; ``steps`` is the arm's optimizer steps over the control's. A
  frontier rate marked ``^`` (``v``) is the grid's largest (smallest): the
  frontier may be under-tuned there, and a wider grid would say (with a
  grid of one rate, a line says the same of every point). A
  seed where the arm has no margin (a loss that is not finite, or a step
  count outside the frontier's) is left out of the mean and the interval,
  and the line ends with how many seeds have one, e.g. ``(2 of 3 seeds)``,
  and with the own-best column's count where it differs.
  """
  lines = [title] if title else []
  ks = result['ks']
  lrs = result.get('learning_rates') or []
  edges = {max(lrs): '^', min(lrs): 'v'} if len(set(lrs)) > 1 else {}
  lines.append('frontier (val loss at best lr / lr):  ' + '  '.join(f'k={k}' for k in ks))
  marked = False
  for seed, f in result['frontier'].items():
    f = {int(k): v for k, v in f.items()}  # JSON keys are strings
    cells = [
        f"{f[k]['val_loss']:.4f}/{f[k]['lr']:.2g}{edges.get(f[k]['lr'], '')}" if k in f else '-'
        for k in ks
    ]
    marked |= any(f[k]['lr'] in edges for k in ks if k in f)
    lines.append(f'  seed {seed}: ' + '  '.join(cells))
  if marked:
    lines.append(
        "  ^ / v: the best rate is the grid's largest / smallest; one outside the grid may do "
        'better, so widen learning_rates there'
    )
  if len(set(lrs)) == 1:
    lines.append(
        '  one learning rate: no k is known to be at its best rate, and the margins may be '
        'against an under-tuned frontier; give learning_rates a grid'
    )
  lines.append(
      f"{'arm':16s} {'margin':>7s} {'95% interval':>17s} {'min seed':>8s} "
      f"{'own-best lr margin':>18s} {'steps':>6s}"
  )
  for name, a in result['arms'].items():
    m, b = a['margin'], a['best_margin']
    interval = '-' if m['low'] is None else f"[{m['low']:+.3f}, {m['high']:+.3f}]"
    missing = len(a['margins']) - m['n']
    steps = '-' if a['step_ratio'] is None else f"{a['step_ratio']:.2f}x"
    counts = f" ({m['n']} of {len(a['margins'])} seeds)" if missing else ''
    if b['n'] != m['n']:  # the own-best mean is over other seeds: say so
      counts += f" (own-best: {b['n']} of {len(a['margins'])})"
    lines.append(
        f"{name:16s} {_fmt(m['mean']):>7s} {interval:>17s} {_fmt(m['min']):>8s} "
        f"{_fmt(b['mean']):>18s} {steps:>6s}{counts}"
    )
  return lines


def plot(
    result: Mapping[str, Any], ax: Any = None, title: str = '', arms: Sequence[str] | None = None
) -> Any:
  """Draws the study on a matplotlib axis: each seed's frontier and where each arm lands.

  Every seed's frontier is a thin line of validation loss against optimizer
  steps (log scale), each adaptive arm a marker per seed at the control's
  rate; an arm below its seed's line did better than a fixed batch with as
  many steps. Needs matplotlib.

  Args:
    result: what :func:`frontier_study` returned.
    ax: the axis to draw on; a new figure's by default.
    title: the axis title.
    arms: the arms to draw, by name; all by default.

  Raises:
    ValueError: if an arm of ``arms`` is not in the study.

  Returns:
    The axis.
  """
  import matplotlib.pyplot as plt  # noqa: PLC0415 -- optional

  if ax is not None and not hasattr(ax, 'plot'):  # plot(result, 'x.png'): a path for the axis
    raise TypeError(
        f'ax must be a matplotlib axis, got {type(ax).__name__} {ax!r}: to save the figure, '
        "ax = plot(result); ax.figure.savefig('x.png')"
    )
  if ax is None:
    _, ax = plt.subplots(figsize=(6, 4))
  colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
  for i, frontier in enumerate(result['frontier'].values()):
    points = sorted((f['steps'], f['val_loss']) for f in frontier.values())
    ax.plot(
        *zip(*points, strict=True),
        color='0.4',
        lw=1,
        marker='.',
        label='fixed k' if i == 0 else None,
    )
  runs = result['runs']
  unknown = [name for name in arms or () if name not in result['arms']]
  if unknown:
    raise ValueError(f"plot: no arm {unknown} in the study, whose arms are {list(result['arms'])}")
  for j, name in enumerate(result['arms'] if arms is None else arms):
    xs, ys = [], []
    for seed, frontier in result['frontier'].items():
      lr = {int(k): v for k, v in frontier.items()}.get(1, {}).get('lr')  # JSON: str keys
      for r in runs:
        if r['arm'] == name and r['seed'] == int(seed) and r['lr'] == lr:
          xs.append(r['num_steps'])
          ys.append(r['val_loss'])
    ax.scatter(xs, ys, color=colors[j % len(colors)], zorder=3, label=name, s=18)
  ax.set_xscale('log')
  ax.set_xlabel('optimizer steps (same tokens)')
  ax.set_ylabel('validation loss')
  ax.set_title(title)
  if ax.get_legend_handles_labels()[0]:  # nothing drawn: no legend, and no warning
    ax.legend(fontsize=7)
  return ax
