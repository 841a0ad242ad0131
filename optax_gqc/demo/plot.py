"""The demo's figures (matplotlib): the frontier, the curves, the batch and the noise scale."""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from optax_gqc.demo.arms import FRONTIER
from optax_gqc.demo.verdict import frontier_points


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
  points = frontier_points({a: r['summary'] for a, r in arms.items()})
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
