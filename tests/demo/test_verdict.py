"""The verdict: the frontier, the margins, the seed spread and the summary."""

import math

import pytest

from optax_gqc import study
from optax_gqc.demo import arms, plot, verdict

pytestmark = pytest.mark.slow


FRONTIER = [(1000, 1.80), (500, 1.90), (250, 2.00), (125, 2.15)]  # any order


def test_frontier_is_interpolated_linearly_in_log_steps():
  assert study.frontier_loss_at(FRONTIER, 500) == pytest.approx(1.90)
  assert study.frontier_loss_at(FRONTIER, math.sqrt(500 * 1000)) == pytest.approx(1.85)
  assert study.frontier_loss_at(FRONTIER, 125 * 2**0.25) == pytest.approx(2.15 - 0.15 / 4)
  assert study.frontier_loss_at(FRONTIER, 125) == pytest.approx(2.15)
  assert study.frontier_loss_at(FRONTIER, 124) is None  # no extrapolation
  assert study.frontier_loss_at(FRONTIER, 1001) is None
  assert study.frontier_loss_at(FRONTIER[:1], 1000) is None


def test_verdict_margin_position_and_the_control_bar():
  control = (1000, 1.80)
  points = {
      'better': (400, 1.81),  # frontier there: 1.90 - 0.10 * log(400/250)/log(2)
      'worse': (500, 2.00),
      'few': (100, 2.0),
      'many': (2000, 1.7),
  }
  v = verdict.verdict(FRONTIER, points, control)
  at = 2.00 - 0.10 * math.log(400 / 250) / math.log(2)
  assert v['better']['frontier_loss'] == pytest.approx(at)
  assert v['better']['margin'] == pytest.approx(at - 1.81)
  assert v['better']['position'] == 'below'
  assert v['better']['near_control'] and v['better']['step_ratio'] == pytest.approx(0.4)
  assert v['worse']['position'] == 'above' and v['worse']['margin'] == pytest.approx(-0.10)
  assert not v['worse']['near_control']  # 0.2 nats worse than the control
  for name in ('few', 'many'):
    assert v[name]['position'] == 'outside' and v[name]['margin'] is None
  assert not v['many']['near_control']  # better loss, but more steps than 0.6x
  lines = verdict.verdict_line(v).splitlines()
  assert len(lines) == 5 and 'nats, + is better' in lines[0]  # a heading, one line per arm
  assert lines[1].startswith('  better: below the frontier') and 'margin +0.' in lines[1]
  assert lines[2].startswith('  worse: above the frontier') and 'margin -0.100' in lines[2]
  assert 'outside the frontier' in lines[3] and 'meets' in lines[1] and 'misses' in lines[2]


def test_verdict_near_control_bar_is_inclusive_at_its_edges():
  v = verdict.verdict(FRONTIER, {'edge': (600, 1.82)}, (1000, 1.80))['edge']
  assert v['step_ratio'] == pytest.approx(0.6) and v['near_control']
  v = verdict.verdict(FRONTIER, {'slow': (606, 1.80)}, (1000, 1.80))['slow']
  assert not v['near_control']  # 0.61x, as printed


def test_below_the_frontier_needs_a_margin_beyond_the_seed_spread():
  arm = {'a': (500, 1.87)}  # 0.03 below the frontier
  one_seed = verdict.verdict(FRONTIER, arm, None)['a']  # within one seed's noise
  assert one_seed['position'] == 'on' and verdict.ONE_SEED_NOISE >= 0.03
  assert "within one seed's noise" in verdict.verdict_line({'a': one_seed})
  assert verdict.verdict(FRONTIER, {'b': (500, 1.85)}, None)['b']['position'] == 'below'
  assert verdict.verdict(FRONTIER, arm, None, spread=0.02)['a']['position'] == 'below'
  within = verdict.verdict(FRONTIER, arm, None, spread=0.05)['a']
  assert within['position'] == 'on' and within['margin'] == pytest.approx(0.03)
  assert within['step_ratio'] is None and not within['near_control']
  assert 'within the spread' in verdict.verdict_line({'a': within})


def test_each_bar_is_read_on_the_number_as_printed():
  # 2.00 - 1.97 is 0.030000000000000027 in floats: it read "below" with "margin +0.030" at the
  # 0.03 bar of one seed.
  v = verdict.verdict(FRONTIER, {'a': (250, 1.97)}, None)['a']
  assert v['margin'] > verdict.ONE_SEED_NOISE and f"{v['margin']:+.3f}" == '+0.030'
  assert v['position'] == 'on'
  v = verdict.verdict(FRONTIER, {'a': (500, 1.8698)}, None, spread=0.0298)['a']
  assert v['position'] == 'on'  # +0.030 against a spread printed as 0.030
  v = verdict.verdict(FRONTIER, {'a': (500, 1.8694)}, None, spread=0.0304)['a']
  assert v['position'] == 'below'  # +0.031 against 0.030
  # "0.60x the control's steps" and "+0.020 nats vs the control" missed the 0.6x / 0.02 bar.
  for arm in ((603, 1.80), (600, 1.8204)):
    v = verdict.verdict(FRONTIER, {'a': arm}, (1000, 1.80))['a']
    assert v['near_control'] and 'meets the' in verdict.verdict_line({'a': v})


def test_a_control_that_is_not_finite_gets_no_comparison():
  frontier = [(1000, math.nan), (500, 1.90), (250, 2.00)]
  v = verdict.verdict(frontier, {'a': (300, 1.80)}, (1000, math.nan))
  line = verdict.verdict_line(v)
  assert v['a']['position'] == 'below' and not v['a']['near_control']
  assert 'nan' not in line and "no comparison with the control's loss" in line


def test_frontier_points_are_the_fixed_arms_in_order_of_k():
  summaries = {
      'critical': {'steps': 300, 'val_loss': 1.7},
      'fixed4': {'steps': 250, 'val_loss': 2.0},
      'control': {'steps': 1000, 'val_loss': 1.8},
  }
  assert verdict.frontier_points(summaries) == [(1000, 1.8), (250, 2.0)]
  assert verdict.frontier_points({}) == []


def test_seed_spread_is_the_largest_range_of_an_arm_over_seeds():
  assert verdict.seed_spread({'a': [1.80, 1.83], 'b': [1.90, 1.85, 1.86]}) == pytest.approx(0.05)
  assert verdict.seed_spread({'a': [1.8], 'b': [1.9]}) is None
  # A diverged seed says nothing of the others' spread.
  assert verdict.seed_spread({'a': [math.nan, 1.80, 1.83]}) == pytest.approx(0.03)


def test_a_diverged_run_gets_no_verdict():
  # NaN fails both comparisons with the spread: it read as on the frontier.
  diverged = {'arm': (500, math.nan)}
  frontier = [*FRONTIER[:-1], (FRONTIER[-1][0], math.inf)]
  for v in (
      verdict.verdict(FRONTIER, diverged, (1000, 1.80))['arm'],
      verdict.verdict(frontier, {'arm': (200, 2.05)}, (1000, 1.80))['arm'],
  ):
    assert v['position'] == 'not finite'
    line = verdict.verdict_line({'arm': v})
    assert 'no verdict' in line and 'on the frontier' not in line and 'nan' not in line


def summary_run(seed, losses, initial=None):
  """A seed's run record, as ``run_arm`` returns its arms: ``{arm: (steps, loss)}``."""
  records = {
      a: {'summary': {'val_loss': v, 'steps': s, 'draws_per_step': 1000 / s}}
      for a, (s, v) in losses.items()
  }
  for a in records.values():
    a['summary'].update(num_forced=0, seconds=1.0, noise_scale=None)
    if initial is not None:
      a['summary']['initial_val_loss'] = initial
  return {'size': '8x1', 'seed': seed, 'arms': records}


def test_a_run_whose_loss_ends_no_lower_than_it_began_gets_no_verdict():
  # lr too high: every arm ended above its first evaluation (5.96), finite. It read as
  # "below the frontier: margin +1.06".
  blown = {'control': (184, 20.9), 'fixed2': (92, 14.2), 'fixed4': (46, 28.3)}
  run = summary_run(0, {**blown, 'critical': (23 * 3, 16.7)}, initial=5.96)
  (summary,) = verdict.summarize([run], ['control', 'fixed2', 'fixed4', 'critical'])
  v = summary['verdict']['critical']
  assert v['position'] == 'did not train' and v['untrained'] == ['control', 'fixed2', 'fixed4']
  assert v['frontier_loss'] is None and v['margin'] is None  # no number read off that frontier
  assert v['seed_margins'] == [None]
  row = next(r for r in verdict.table(summary) if r.startswith('critical'))
  assert row.split()[-3:-1] == ['-', '-']  # the table's frontier and margin columns
  line = summary['verdict_line'].splitlines()[1]
  assert 'no verdict' in line and 'below' not in line and 'lower --lr' in line
  # An arm that trained is not judged against a frontier that did not.
  run = summary_run(0, {**blown, 'critical': (69, 3.0)}, initial=5.96)
  (summary,) = verdict.summarize([run], ['control', 'fixed2', 'fixed4', 'critical'])
  assert summary['verdict']['critical']['position'] == 'did not train'
  # An adaptive arm that blew up beside a frontier that trained is judged: above it.
  trained = {'control': (184, 2.0), 'fixed2': (92, 2.1), 'fixed4': (46, 2.3)}
  run = summary_run(0, {**trained, 'critical': (69, 7.0)}, initial=5.96)
  (summary,) = verdict.summarize([run], ['control', 'fixed2', 'fixed4', 'critical'])
  assert summary['verdict']['critical']['position'] == 'above'


def test_a_seed_cut_short_is_left_out_of_the_summary():
  # Ctrl-C in seed 1 after its fixed arms: their means took seeds 0 and 1, the arm's seed 0.
  done = summary_run(0, {'control': (1000, 1.80), 'fixed2': (500, 1.90), 'critical': (700, 1.80)})
  cut = summary_run(1, {'control': (1000, 1.70), 'fixed2': (500, 1.85)})
  (summary,) = verdict.summarize([done, cut], ['control', 'fixed2', 'critical'])
  assert summary['seeds'] == [0] and summary['spread'] is None
  assert summary['arms']['control']['val_loss'] == pytest.approx(1.80)
  assert summary['verdict_line'].startswith('verdict (8x1, seed 0)')


def test_summary_averages_seeds_and_judges_against_their_spread(tmp_path):
  def run(seed, losses):
    records = {
        a: {'summary': {'val_loss': v, 'steps': s, 'draws_per_step': 1000 / s}}
        for a, (s, v) in losses.items()
    }
    for a in records.values():
      a['summary'].update(num_forced=0, seconds=1.0, noise_scale=None)
    return {'size': '8x1', 'seed': seed, 'arms': records}

  runs = [
      run(0, {'control': (1000, 1.80), 'fixed2': (500, 1.90), 'critical': (700, 1.80)}),
      run(1, {'control': (1000, 1.84), 'fixed2': (500, 1.90), 'critical': (700, 1.82)}),
  ]
  other = run(0, {'control': (1000, 2.0), 'fixed2': (500, 2.1), 'critical': (400, 2.0)})
  runs.append({**other, 'size': '4x1'})
  summary, small = verdict.summarize(runs, ['control', 'fixed2', 'critical'])
  assert (summary['size'], small['size']) == ('8x1', '4x1')
  assert small['spread'] is None and small['verdict']['critical']['position'] == 'outside'
  assert summary['seeds'] == [0, 1] and summary['spread'] == pytest.approx(0.04)
  assert summary['arms']['control']['val_loss'] == pytest.approx(1.82)
  v = summary['verdict']['critical']
  at = 1.90 - 0.08 * math.log(700 / 500) / math.log(2)
  assert v['frontier_loss'] == pytest.approx(at) and v['margin'] == pytest.approx(at - 1.81)
  assert v['position'] == ('below' if at - 1.81 > 0.04 else 'on')
  at0, at1 = (1.90 - d * math.log(700 / 500) / math.log(2) for d in (0.10, 0.06))
  assert v['seed_margins'] == [pytest.approx(at0 - 1.80), pytest.approx(at1 - 1.82)]
  assert summary['verdict_line'].startswith('verdict (8x1, seeds 0,1, spread 0.040)')
  assert 'caveat: the frontier runs at the learning rates swept at 96x3' in summary['verdict_line']
  for size in arms.FRONTIER_LR:
    swept = verdict.summarize([{**r, 'size': size} for r in runs[:2]], ['control', 'fixed2'])
    assert 'caveat' not in swept[0]['verdict_line']
  alone = [{**r, 'arms': {'critical': r['arms']['critical']}} for r in runs[:2]]
  assert 'caveat' not in verdict.summarize(alone, ['critical'])[0]['verdict_line']  # no frontier
  lines = verdict.table(summary)
  assert len(lines) == 2 + 3 + 1 and lines[-1].startswith('units: ')  # headings, arms, units
  plot.plot_study(runs, [summary, small], tmp_path / 'study.png')
  assert (tmp_path / 'study.png').stat().st_size > 0


def test_with_fewer_than_two_fixed_arms_there_is_no_frontier_to_judge_against():
  v = verdict.verdict([(1000, 1.8)], {'critical': (700, 1.8)}, control=(1000, 1.8))
  assert v['critical']['position'] == 'no frontier' and v['critical']['margin'] is None
  line = verdict.verdict_line(v).splitlines()[1]
  assert line.startswith('  critical: 700 optimizer steps; no frontier to compare with')
  assert 'none ran' in verdict.verdict_line({})
