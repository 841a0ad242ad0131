"""The main job: the demo's measurement, its verdict, its command line, and its gates."""

import argparse
import contextlib
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import optax_gqc
from optax_gqc import demo, gates, study
from optax_gqc.demo import arms, cli, data, job, model, plot, train, verdict

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def quick(tmp_path_factory):
  """One ``--quick`` run, shared: (payload, stdout, out folder)."""
  out = tmp_path_factory.mktemp('quick')
  stdout = io.StringIO()
  with contextlib.redirect_stdout(stdout):
    payload = demo.main(['--quick', '--no-progress', '--out', str(out)])
  return payload, stdout.getvalue(), out


# The measurement.


def test_quick_run_writes_the_frontier_the_critical_arm_and_a_verdict(quick):
  payload, stdout, out = quick
  for name in ('curves.png', 'results.json', 'table.txt'):
    assert (out / name).stat().st_size > 0
  saved = json.loads((out / 'results.json').read_text())
  assert list(saved['arms']) == ['control', 'fixed2', 'fixed4', 'critical']
  assert [p['arm'] for p in saved['frontier']] == ['control', 'fixed2', 'fixed4']
  count = saved['config']['count']
  for point, k in zip(saved['frontier'], (1, 2, 4), strict=True):
    assert point['steps'] == count // k
  assert set(saved['verdict']['32x1']) == {'critical'}
  assert saved['verdict_lines'][0].startswith('verdict (32x1, seed 0)')
  assert saved['verdict_lines'][0] in stdout and not saved['interrupted']
  table = (out / 'table.txt').read_text().splitlines()
  assert table[1].split()[:3] == ['arm', 'val', 'loss']
  assert [line.split()[0] for line in table[2:6]] == ['control', 'fixed2', 'fixed4', 'critical']
  assert payload['arms'].keys() == saved['arms'].keys()
  # The split of its time between compiling and training, summed over the arms.
  records = saved['arms'].values()
  assert saved['seconds']['compiling'] == pytest.approx(
      sum(a['summary']['compile_seconds'] for a in records)
  )
  assert saved['seconds']['training'] == pytest.approx(
      sum(a['summary']['seconds'] for a in records)
  )
  assert f"time: {saved['seconds']['training']:.0f} s training" in stdout


def test_quick_run_arms_share_microbatches_and_differ_in_when_they_step(quick):
  payload, _, _ = quick
  records = payload['arms']
  count = payload['config']['count']
  assert {a['summary']['tokens'] for a in records.values()} == {count * 8 * 32}
  for name, k in (('control', 1), ('fixed2', 2), ('fixed4', 4)):
    summary = records[name]['summary']
    assert summary['steps'] == count // k and summary['num_forced'] == 0
    assert summary['peak_lr'] == pytest.approx(arms.FRONTIER_LR['96x3'][k])  # 32x1: not swept
  critical = records['critical']
  assert critical['summary']['peak_lr'] == pytest.approx(4.2e-3)
  draws = critical['draws_per_step']  # the microbatches of every step add up
  assert len(draws) == critical['summary']['steps'] and sum(draws) <= count
  assert all(1 <= d <= 32 for d in draws) and max(draws) >= 2  # it probes the noise
  assert critical['trace'][-1]['target_batch_size'] >= 8  # at least one microbatch
  for arm in records.values():
    curve = arm['curve']
    assert len(curve) == 4 and curve[-1]['tokens'] == arm['summary']['tokens']
    assert np.all(np.diff([p['steps'] for p in curve]) > 0)
    assert curve[-1]['val_loss'] < arm['summary']['initial_val_loss'] - 1.0  # it learns


def test_quick_run_verdict_is_the_verdict_of_its_arms(quick):
  payload, _, _ = quick
  s = {a: r['summary'] for a, r in payload['arms'].items()}
  frontier = [(s[a]['steps'], s[a]['val_loss']) for a in ('control', 'fixed2', 'fixed4')]
  expected = verdict.verdict(
      frontier,
      {'critical': (s['critical']['steps'], s['critical']['val_loss'])},
      (s['control']['steps'], s['control']['val_loss']),
  )
  judged = dict(payload['verdict']['32x1']['critical'])
  assert judged.pop('seed_margins') == [judged['margin']]  # one seed: its own frontier
  assert judged == expected['critical']
  assert judged['position'] == ('below' if judged['margin'] > 0 else 'above')  # no spread


def test_demo_is_deterministic(quick, tmp_path):
  payload, _, _ = quick
  again = demo.main(['--quick', '--no-progress', '--arms', 'critical', '--out', str(tmp_path)])
  assert again['arms']['critical']['curve'] == payload['arms']['critical']['curve']
  assert (
      again['arms']['critical']['draws_per_step'] == payload['arms']['critical']['draws_per_step']
  )


def test_demo_trains_on_a_users_file(tmp_path):
  text = tmp_path / 'text.txt'
  text.write_text('the quick brown fox jumps over the lazy dog. ' * 2000)
  args = ['--quick', '--no-progress', '--arms', 'control', '--out', str(tmp_path / 'out')]
  payload = demo.main([*args, '--data', str(text)])
  assert payload['corpus_files'] == [str(text)]
  assert payload['arms']['control']['summary']['val_loss'] < 1.0  # easy, repetitive text


def test_load_corpus_reads_a_users_file_whole_or_the_stdlib_capped(tmp_path):
  text = tmp_path / 'text.txt'
  text.write_bytes(b'abc' * 10)
  tokens, source = data.load_corpus(str(text), 5)
  assert source == [str(text)] and tokens.dtype == np.int32
  assert tokens.tolist() == list(b'abc' * 10)
  tokens, source = data.load_corpus(None, 5000)
  assert len(tokens) == 5000 and source == data.stdlib_corpus(5000)[1]


@pytest.mark.parametrize('arm', ['control', 'fixed2', 'critical', 'seesaw'])
def test_a_block_is_bitwise_a_python_loop_of_steps(arm):
  spec = arms.ARMS[arm]
  setup = arms.Setup(microbatch=8, count=156, warmup=0.05, weight_decay=0.01)
  transformer = model.CharTransformer(32, 1, 4, 32, nnx.Rngs(0))  # the --quick model: cached
  graphdef, params = nnx.split(transformer, nnx.Param)
  knobs = arms.arm_knobs(spec, argparse.Namespace(lr=3e-3))
  state = arms.make_optimizer(spec, knobs, setup).init(params)
  knobs = train.as_arrays(knobs)
  batches = jax.random.randint(jax.random.key(1), (39, 8, 33), 0, 256, jnp.int32)

  def copy(tree):
    return jax.tree.map(jnp.copy, tree)

  program = train.compiled_block(spec, graphdef, setup, params, state, knobs, batches)
  block_params, block_state, block_losses, block_steps, _ = program(
      copy(params), copy(state), knobs, batches
  )
  step = jax.jit(train.train_step, static_argnums=(0, 1, 2), donate_argnums=(3, 4))
  losses, steps = [], []
  for batch in batches:
    params, state, loss, num_steps = step(
        arms.program_spec(spec), graphdef, setup, params, state, knobs, batch
    )
    losses.append(loss)
    steps.append(num_steps)

  def bits(tree):
    return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]

  assert bits(block_params) == bits(params)
  assert bits(block_state) == bits(state)
  assert bits(block_losses) == bits(jnp.stack(losses))
  assert bits(block_steps) == bits(jnp.stack(steps))
  if spec['kind'] == 'fixed':
    k = spec['k']
    assert np.array_equal(block_steps, np.arange(1, 40) // k)


def test_plan_cuts_the_budget_into_equal_blocks_evaluated_at_block_ends():
  p = train.plan(900_000, 512, 12, 50)  # 1757 microbatches
  assert (p.block, p.count) == (50, 1750)
  assert len(p.evals) == 12 and p.evals[-1] == p.count
  assert all(e % p.block == 0 for e in p.evals)
  assert np.all(np.diff(p.evals) > 0)
  small = train.plan(40_000, 256, 4, 50)  # 156 microbatches: 4 blocks of 39
  assert small == train.Plan(156, 39, (39, 78, 117, 156))


def test_study_runs_every_seed_and_writes_its_summary(quick, tmp_path):
  payload = demo.main(
      [
          '--study',  # at --quick's settings (--quick --study is refused)
          *('--tokens', '40000', '--corpus-bytes', '400000', '--context', '32', '--evals', '4'),
          '--no-progress',
          '--sizes',
          '32x1',
          '--arms',
          'control,fixed2,critical',
          '--out',
          str(tmp_path),
      ]
  )
  assert (tmp_path / 'study.png').stat().st_size > 0
  assert [(r['size'], r['seed']) for r in payload['runs']] == [('32x1', 0), ('32x1', 1)]
  (summary,) = payload['summary']
  losses = {
      a: [r['arms'][a]['summary']['val_loss'] for r in payload['runs']] for a in summary['arms']
  }
  assert summary['spread'] == pytest.approx(verdict.seed_spread(losses))
  assert summary['spread'] > 0  # the seeds differ
  assert payload['runs'][0]['arms']['critical']['curve'] == quick[0]['arms']['critical']['curve']
  text = (tmp_path / 'table.txt').read_text()
  assert 'seeds 0,1, seed spread' in text and summary['verdict_line'] in text


# The verdict.

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
  v = verdict.verdict(FRONTIER, {'slow': (601, 1.80)}, (1000, 1.80))['slow']
  assert not v['near_control']


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
  lines = verdict.table(summary)
  assert len(lines) == 2 + 3 + 1 and lines[-1].startswith('units: ')  # headings, arms, units
  plot.plot_study(runs, [summary, small], tmp_path / 'study.png')
  assert (tmp_path / 'study.png').stat().st_size > 0


# The command line.


BAD_INPUTS = [
    (['--data', '{tmp}/missing.txt'], '--data'),
    (['--data', '{tmp}/dir'], '--data'),
    (['--data', '{tmp}/empty.txt'], '--data'),
    (['--data', '{tmp}/tiny.txt'], '--data'),
    (['--data', '{tmp}/binary.bin'], '--data'),
    (['--data', '{tmp}/latin.bin'], '--data'),
    (['--microbatch', '0'], '--microbatch'),
    (['--dim', '0'], '--dim'),
    (['--heads', '5'], '--heads'),
    (['--sizes', '66x2'], '--heads'),
    (['--sizes', '64'], '--sizes'),
    (['--sizes', '64x2', '--dim', '64'], '--sizes'),
    (['--warmup', '2'], '--warmup'),
    (['--max-draws', '0'], '--max-draws'),
    (['--out', '{tmp}/file/sub'], '--out'),
    (['--out', '{tmp}/file'], '--out'),
    (['--lr', '-1'], '--lr'),
    (['--lr', 'nan'], '--lr'),
    (['--layers', '-1'], '--layers'),
    (['--evals', '-3'], '--evals'),
    (['--evals', '100000'], '--tokens'),
    (['--tokens', '100'], '--tokens'),
    (['--tokens', 'many'], '--tokens'),
    (['--context', '0'], '--context'),
    (['--context', '1'], '--context'),
    (['--quick', '--study'], '--study'),
    (['--tokens', str(10**15)], '--tokens'),
    (['--weight-decay', '-0.1'], '--weight-decay'),
    (['--corpus-bytes', '10'], '--corpus-bytes'),
    (['--arms', 'control,sgd'], '--arms'),
    (['--seeds', '0,a'], '--seeds'),
    (['--block', '0'], '--block'),
    (['--no-such-flag'], '--no-such-flag'),
]


@pytest.mark.parametrize(
    ('argv', 'flag'), BAD_INPUTS, ids=[' '.join(a).replace('{tmp}/', '') for a, _ in BAD_INPUTS]
)
def test_bad_input_is_a_one_line_error_naming_the_flag(argv, flag, tmp_path, capsys):
  (tmp_path / 'dir').mkdir()
  (tmp_path / 'empty.txt').write_bytes(b'')
  (tmp_path / 'tiny.txt').write_text('print(1)\n')
  (tmp_path / 'binary.bin').write_bytes(bytes(range(256)) * 40)
  (tmp_path / 'latin.bin').write_bytes(bytes(range(128, 256)) * 80)  # no NUL, not UTF-8
  (tmp_path / 'file').write_text('x')
  out = tmp_path / 'out'
  argv = [a.format(tmp=tmp_path) for a in argv]
  if '--out' not in argv:
    argv += ['--out', str(out)]
  with pytest.raises(SystemExit) as exit_info:
    demo.main(argv)
  assert exit_info.value.code == 2
  captured = capsys.readouterr()
  lines = captured.err.strip().splitlines()
  assert len(lines) == 1 and flag in lines[0] and 'Traceback' not in captured.err
  assert lines[0].startswith('python -m optax_gqc.demo: error: ')
  assert not captured.out and not out.exists()  # nothing run, nothing written


def test_bad_input_from_the_shell_has_no_traceback(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'optax_gqc.demo', '--heads', '5', '--out', str(tmp_path)],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert result.returncode == 2 and not result.stdout
  assert result.stderr.strip().splitlines() == [
      'python -m optax_gqc.demo: error: argument --heads: 5 heads do not divide the width 96 '
      '(--dim) (see --help)'
  ]


def test_explicit_flags_win_over_quick(tmp_path):
  out = ['--out', str(tmp_path)]
  args = cli.parse_args(['--quick', *out])
  assert (args.tokens, args.evals, args.dim) == (40_000, 4, 32)
  assert args.arms == ('control', 'fixed2', 'fixed4', 'critical')
  args = cli.parse_args(
      ['--quick', '--tokens', '50000', '--evals', '5', '--corpus-bytes', '500000', *out]
  )
  assert (args.tokens, args.evals, args.corpus_bytes, args.dim) == (50_000, 5, 500_000, 32)
  args = cli.parse_args(['--quick', '--arms', 'gnts', '--dim', '48', *out])
  assert args.arms == ('gnts',) and args.sizes == ((48, 1),)


def test_study_defaults_to_two_seeds_two_sizes_and_every_arm(tmp_path):
  out = ['--out', str(tmp_path)]
  args = cli.parse_args(['--study', *out])
  assert args.seeds == (0, 1) and args.sizes == ((96, 3), (64, 2))
  assert args.arms == tuple(arms.ARMS)
  args = cli.parse_args(['--study', '--seeds', '3', '--sizes', '32x1', *out])
  assert args.seeds == (3,) and args.sizes == ((32, 1),)


def test_help_lists_every_flag_with_help_default_and_choices(capsys):
  parser = cli.build_parser()
  for action in parser._actions:
    assert action.help, action.option_strings
  with pytest.raises(SystemExit) as exit_info:
    demo.main(['--help'])
  assert exit_info.value.code == 0
  text = ' '.join(capsys.readouterr().out.split())
  assert text.startswith('usage: python -m optax_gqc.demo')
  assert (
      'choices: control, fixed2, fixed3, fixed4, fixed8, critical, gnts, relative, seesaw, warmup'
      in text
  )
  for default in (cli.DEFAULT_TOKENS, 0.0042, './gqc-demo-out'):
    assert f'(default: {default})' in text


def test_quick_writes_to_its_own_folder_unless_told():
  assert cli.parse_args(['--quick']).out == './gqc-demo-quick-out'
  assert cli.parse_args([]).out == './gqc-demo-out'
  assert cli.parse_args(['--quick', '--out', 'here']).out == 'here'


def test_ctrl_c_keeps_the_arms_that_finished(quick, tmp_path, monkeypatch, capsys):
  finished = []
  real = job.run_arm

  def run_arm(name, *args):
    if finished:
      raise KeyboardInterrupt
    finished.append(name)
    return real(name, *args)

  monkeypatch.setattr(job, 'run_arm', run_arm)
  with pytest.raises(SystemExit) as exit_info:
    demo.main(['--quick', '--no-progress', '--arms', 'fixed2,critical', '--out', str(tmp_path)])
  assert exit_info.value.code == 130
  saved = json.loads((tmp_path / 'results.json').read_text())
  assert saved['interrupted'] and list(saved['arms']) == ['fixed2']
  assert (tmp_path / 'curves.png').stat().st_size > 0
  assert (tmp_path / 'table.txt').read_text().splitlines()[2].startswith('fixed2')
  assert 'interrupted' in capsys.readouterr().err


def test_ctrl_c_before_any_arm_finished_writes_nothing(tmp_path, monkeypatch, capsys):
  def interrupt(*args):
    raise KeyboardInterrupt

  monkeypatch.setattr(job, 'run_arm', interrupt)
  with pytest.raises(SystemExit) as exit_info:
    demo.main(['--quick', '--no-progress', '--out', str(tmp_path)])
  assert exit_info.value.code == 130
  assert not list(tmp_path.iterdir())
  assert 'nothing written' in capsys.readouterr().err


# The gnts arm's gate.


def test_relative_threshold_follows_the_microbatch_norms():
  tx = optax_gqc.accumulate(
      optax.sgd(0.0), gates.norm_below(0.5, relative=True, decay=0.0), max_draws=50
  )
  params = {'w': jnp.zeros(40)}
  state = tx.init(params)
  update = jax.jit(tx.update)
  for scale in (1.0, 100.0):  # the unit follows the gradients' scale
    steps_before = int(state.num_steps)
    draws = 0
    while int(state.num_steps) == steps_before:
      g = {'w': scale * jax.random.normal(jax.random.key(draws + int(scale)), (40,))}
      _, state = update(g, state, params)
      draws += 1
    stats = optax_gqc.statistics(state)
    # Pure noise: |mean| ~ |g| / sqrt(n), so a ratio of 0.5 needs about 4 draws.
    assert 3 <= draws <= 8
    assert float(stats['threshold']) == pytest.approx(0.5 * float(stats['grad_norm_ema']), rel=1e-6)
    assert float(stats['grad_norm_ema']) == pytest.approx(
        float(jnp.linalg.norm(g['w'])), rel=1e-6
    )  # beta 0: the latest microbatch norm


def test_relative_threshold_in_the_signal_dominated_regime_needs_the_valve():
  signal = jnp.ones(40)
  grads = [{'w': signal + 0.01 * jax.random.normal(jax.random.key(i), (40,))} for i in range(6)]
  params = {'w': jnp.zeros(40)}

  def steps(gate):
    tx = optax_gqc.accumulate(optax.sgd(0.0), gate, max_draws=6)
    state = tx.init(params)
    for g in grads:
      _, state = jax.jit(tx.update)(g, state, params)
    return int(state.num_steps), int(state.last_num_draws)

  relative = gates.norm_below(0.5, relative=True)
  assert steps(relative) == (1, 6)  # the mean cannot get shorter than the signal: max_draws
  assert steps(gates.any_of(relative, gates.relative_error_below(0.8))) == (3, 2)  # steps promptly


def test_frontier_lr_follows_the_sweep_scaled_by_lr_and_the_sqrt_rule_beyond_it(monkeypatch):
  args = argparse.Namespace(lr=8.4e-3)  # twice the swept k = 1 peak
  assert arms.frontier_lr(1, args) == pytest.approx(8.4e-3)
  assert arms.frontier_lr(8, args) == pytest.approx(2 * arms.FRONTIER_LR['96x3'][8])
  assert arms.frontier_lr(4, args, '64x2') == pytest.approx(2 * arms.FRONTIER_LR['64x2'][4])
  assert arms.frontier_lr(4, args, '32x1') == arms.frontier_lr(4, args)  # not swept: 96x3's
  assert arms.frontier_lr(16, args) == pytest.approx(8.4e-3 * 4)  # not swept: sqrt(16)
  monkeypatch.delitem(arms.FRONTIER_LR['96x3'], 4)
  assert arms.arm_knobs(arms.ARMS['fixed4'], args) == {'lr': pytest.approx(8.4e-3 * 2), 'k': 4}
  assert arms.arm_knobs(arms.ARMS['critical'], args) == {'lr': 8.4e-3}


def test_seesaw_batch_grows_as_the_learning_rate_decays():
  setup = arms.Setup(microbatch=8, count=1000, warmup=0.05, weight_decay=0.01)
  spec = arms.ARMS['seesaw']
  tx = arms.make_optimizer(spec, arms.arm_knobs(spec, argparse.Namespace(lr=4.2e-3)), setup)
  state = tx.init({'w': jnp.zeros(2)})
  update = jax.jit(tx.update)
  draws = []
  for _ in range(1000):
    _, state = update({'w': jnp.ones(2)}, state, {'w': jnp.zeros(2)})
    if int(state.num_draws) == 0:
      draws.append(int(state.last_num_draws))
  shape = arms.lr_schedule(1.0, setup)
  # Where the schedule is at a fraction c of its peak, a step takes ceil(1/c) draws.
  assert draws[:50] == [1] * 50  # warmup, then the top of the cosine
  assert max(draws) == spec['max_draws'] or max(draws) == math.ceil(1 / float(shape(999)))
  assert draws == sorted(draws)  # the batch only grows
  assert len(draws) < 0.5 * 1000  # about 0.4x the steps of one microbatch a step


def test_the_main_job_runs_a_frontier_of_four_and_the_study_every_arm():
  names = cli.parse_args([]).arms
  assert tuple(names) == ('control', 'fixed2', 'fixed3', 'fixed4', 'critical', 'gnts', 'seesaw')
  assert sum(arms.ARMS[a]['kind'] == 'fixed' for a in names) >= 4
  assert tuple(cli.parse_args(['--study']).arms) == tuple(arms.ARMS)
  assert tuple(cli.parse_args(['--study', '--arms', 'control,gnts']).arms) == ('control', 'gnts')
