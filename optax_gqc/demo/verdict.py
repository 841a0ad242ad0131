"""The verdict: where each adaptive arm lands against the fixed-batch frontier.

Fewer optimizer steps at the same tokens usually cost loss. The fixed arms
draw that trade-off as a curve of validation loss against optimizer steps; an
adaptive arm earns its gate if it lands *below* the curve. :func:`verdict`
interpolates the frontier at the arm's step count and says by how much.
``--study`` repeats the measurement over two seeds and two model sizes, and
counts an arm below the frontier only by more than the seed-to-seed spread.
"""

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from optax_gqc.demo.arms import DEFAULT_SIZE, FRONTIER, FRONTIER_LR
from optax_gqc.study import frontier_loss_at

# The verdict's bar for "as good as the control with fewer steps" (see verdict).
NEAR_CONTROL_NATS = 0.02
# With one seed there is no spread to measure: a margin within this many nats
# counts as on the frontier (the suite's per-seed margins of one arm on this
# task spread over about that much; docs/study.md).
ONE_SEED_NOISE = 0.03
FEW_STEPS_RATIO = 0.6


def seed_spread(losses: Mapping[str, Sequence[float]]) -> float | None:
  """The seed-to-seed spread: the largest range (max - min) of an arm's final loss.

  Args:
    losses: each arm's final validation loss, one per seed.

  Returns:
    The maximum over arms of ``max - min`` over seeds (with two seeds,
    ``|seed0 - seed1|``), of the finite losses; None when no arm has two.
  """
  finite = [[x for x in v if math.isfinite(x)] for v in losses.values()]
  ranges = [max(v) - min(v) for v in finite if len(v) >= 2]
  return max(ranges) if ranges else None


def verdict(
    frontier: Sequence[tuple[float, float]],
    arms: Mapping[str, tuple[float, float]],
    control: tuple[float, float] | None,
    spread: float | None = None,
    untrained: Sequence[str] = (),
) -> dict[str, dict[str, Any]]:
  """Where each arm lands against the fixed-batch frontier, and against the control.

  Args:
    frontier: ``(steps, loss)`` of the fixed arms.
    arms: ``(steps, loss)`` of the arms to judge, by name.
    control: ``(steps, loss)`` of the control, or None.
    spread: the seed-to-seed spread (:func:`seed_spread`), None with one seed.
    untrained: the fixed arms whose loss did not fall below their first
      evaluation's (training blew up): with no frontier to trust, no arm is
      judged. (An adaptive arm that blew up is judged: above the frontier.)

  Returns:
    For each arm: ``frontier_loss`` (:func:`frontier_loss_at` the arm's
    steps; None outside the frontier, with no frontier, or where it did not
    train), ``margin`` (frontier minus arm:
    positive is below the frontier, better), ``position``: ``below`` or
    ``above`` when ``|margin|`` exceeds the spread (:data:`ONE_SEED_NOISE`
    with one seed), ``on`` within it, ``outside`` the frontier's range, ``no
    frontier`` with fewer than two fixed arms, ``not finite`` where the arm's
    loss or the frontier's there is not (a run diverged), ``did not train``
    where a fixed arm is ``untrained``; ``step_ratio`` (the arm's steps over the
    control's) and ``near_control``: whether the arm is within
    :data:`NEAR_CONTROL_NATS` of the control's loss with at most
    :data:`FEW_STEPS_RATIO` times its steps. Each bar is read on the number
    as :func:`verdict_line` prints it (margins, spreads and nats to 3
    decimals, the ratio of steps to 2).
  """
  out = {}
  for name, (steps, loss) in arms.items():
    # A frontier that did not train, or of one arm, is no yardstick: no number read off it.
    at = None if untrained or len(frontier) < 2 else frontier_loss_at(frontier, steps)
    margin = None if at is None else at - loss
    bar = ONE_SEED_NOISE if spread is None else spread
    if untrained:
      position = 'did not train'
    elif len(frontier) < 2:
      position = 'no frontier'
    elif margin is None:
      position = 'outside'
    elif not math.isfinite(margin):
      position = 'not finite'
    # Each bar is read on the number as the verdict line prints it: no "below ... +0.030" at a
    # bar of 0.03, nor "0.60x the control's steps" that misses the 0.6x bar.
    elif round(margin, 3) > round(bar, 3):
      position = 'below'
    elif round(margin, 3) < -round(bar, 3):
      position = 'above'
    else:
      position = 'on'
    ratio = None if control is None else steps / control[0]
    near = (
        control is not None
        and round(loss - control[1], 3) <= NEAR_CONTROL_NATS
        and round(ratio, 2) <= FEW_STEPS_RATIO
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
        'untrained': list(untrained),
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
    return f'verdict{label}: no adaptive arm to judge (none ran, or none finished)'
  lines = [
      f"verdict{label}: margin = frontier loss at the arm's steps - arm loss (nats, + is better)"
  ]
  for name, v in verdicts.items():
    steps = f"{v['steps']:.0f} optimizer steps"
    if v['position'] == 'no frontier':
      where = f'{steps}; no frontier to compare with (it takes two fixed arms or more)'
    elif v['position'] == 'outside':
      where = f'outside the frontier at {steps}'
    elif v['position'] == 'not finite':
      where = f"no verdict at {steps}: its loss or the frontier's is not finite (a run diverged)"
    elif v['position'] == 'did not train':
      where = (
          f"no verdict at {steps}: {', '.join(v['untrained'])} ended no lower than at the "
          'first evaluation (training blew up; try a lower --lr)'
      )
    elif v['position'] == 'on':
      noise = 'the spread' if v['spread'] is not None else "one seed's noise"
      where = f"on the frontier at {steps}: margin {v['margin']:+.3f}, within {noise}"
    else:
      where = f"{v['position']} the frontier at {steps}: margin {v['margin']:+.3f}"
    if v['step_ratio'] is not None and v['position'] not in ('not finite', 'did not train'):
      meets = 'meets' if v['near_control'] else 'misses'
      where += f"; {v['step_ratio']:.2f}x the control's steps, " + (
          f"{v['vs_control']:+.3f} nats vs the control ({meets} the {NEAR_CONTROL_NATS} nats / "
          f'{FEW_STEPS_RATIO}x bar)'
          if math.isfinite(v['vs_control'])
          else "no comparison with the control's loss (its loss or the arm's is not finite)"
      )
    lines.append(f'  {name}: {where}')
  return '\n'.join(lines)


def frontier_points(summaries: Mapping[str, Mapping[str, Any]]) -> list[tuple[float, float]]:
  """The frontier: ``(steps, val_loss)`` of the fixed arms among ``summaries``, by arm name."""
  return [(summaries[a]['steps'], summaries[a]['val_loss']) for a in FRONTIER if a in summaries]


def _margin(arms: Mapping[str, Any], name: str) -> float | None:
  """An arm's margin below the frontier of the fixed arms run beside it."""
  s = {a: r['summary'] for a, r in arms.items()}
  at = frontier_loss_at(frontier_points(s), s[name]['steps'])
  return None if at is None else at - s[name]['val_loss']


def summarize(runs: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> list[dict[str, Any]]:
  """Per model size: each arm's mean over seeds, the spread, the frontier and the verdict.

  The verdict is taken on the means, against the seed spread; each adaptive
  arm's verdict also lists ``seed_margins``, its margin in every seed against
  that seed's own frontier (a paired view the spread does not need). Only the
  seeds in which every arm finished count (a run cut short would otherwise
  average the frontier over more seeds than the arm it judges).
  """
  out = []
  for size in dict.fromkeys(r['size'] for r in runs):
    group = [r for r in runs if r['size'] == size]
    finished = [a for a in arms if any(a in r['arms'] for r in group)]
    group = [r for r in group if all(a in r['arms'] for a in finished)] or group[:1]
    finished = [a for a in finished if a in group[0]['arms']]
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
    frontier = frontier_points(per_arm)
    control = (
        (per_arm['control']['steps'], per_arm['control']['val_loss'])
        if 'control' in per_arm
        else None
    )
    judged = {
        a: (per_arm[a]['steps'], per_arm[a]['val_loss']) for a in finished if a not in FRONTIER
    }
    untrained = [  # fixed arms that ended no lower than at the first evaluation, in some seed
        a
        for a in finished
        if a in FRONTIER
        and any(
            not r['arms'][a]['summary']['val_loss']
            < r['arms'][a]['summary'].get('initial_val_loss', math.inf)
            for r in group
        )
        and all(math.isfinite(r['arms'][a]['summary']['val_loss']) for r in group)
    ]
    verdicts = verdict(frontier, judged, control, spread, untrained)
    for a, v in verdicts.items():  # each seed's margin against its own frontier, if it trained
      v['seed_margins'] = [
          None if untrained else _margin(r['arms'], a) for r in group if a in r['arms']
      ]
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
                if size in FRONTIER_LR or not any(a in per_arm for a in FRONTIER)
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
    if v is None or v['position'] in ('no frontier', 'did not train'):
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
