"""The main job: the demo's measurement, end to end, and Ctrl-C."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from optax_gqc import demo
from optax_gqc.demo import arms, job, train, verdict

pytestmark = pytest.mark.slow


@pytest.fixture(scope='module')
def quick(tmp_path_factory):
  """One ``--quick`` run, shared: (payload, stdout, out folder)."""
  out = tmp_path_factory.mktemp('quick')
  stdout = io.StringIO()
  with contextlib.redirect_stdout(stdout):
    payload = demo.main(['--quick', '--no-progress', '--out', str(out)])
  return payload, stdout.getvalue(), out


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
  # And the job's wall time in all, of which the arms' is a part.
  seconds = saved['seconds']
  assert seconds['total'] > seconds['training'] + seconds['compiling']
  assert f"{seconds['total']:.0f} s in all" in stdout


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
  (tmp_path / 'study.png').write_bytes(b'an earlier --study run')
  again = demo.main(['--quick', '--no-progress', '--arms', 'critical', '--out', str(tmp_path)])
  assert not (tmp_path / 'study.png').exists()
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
  assert payload['arms_of'] == {'size': '32x1', 'seed': 0}
  assert payload['arms'] is payload['runs'][0]['arms']
  (summary,) = payload['summary']
  losses = {
      a: [r['arms'][a]['summary']['val_loss'] for r in payload['runs']] for a in summary['arms']
  }
  assert summary['spread'] == pytest.approx(verdict.seed_spread(losses))
  assert summary['spread'] > 0  # the seeds differ
  assert payload['runs'][0]['arms']['critical']['curve'] == quick[0]['arms']['critical']['curve']
  text = (tmp_path / 'table.txt').read_text()
  assert 'seeds 0,1, seed spread' in text and summary['verdict_line'] in text


def ctrl_c(*args):
  raise KeyboardInterrupt


def main_exits_130(argv):
  with pytest.raises(SystemExit) as exit_info:
    demo.main(argv)
  assert exit_info.value.code == 130


def test_ctrl_c_keeps_the_arms_that_finished(quick, tmp_path, monkeypatch, capsys):
  finished = []
  real = job.run_arm

  def run_arm(name, *args):
    if finished:
      raise KeyboardInterrupt
    finished.append(name)
    return real(name, *args)

  monkeypatch.setattr(job, 'run_arm', run_arm)
  main_exits_130(['--quick', '--no-progress', '--arms', 'fixed2,critical', '--out', str(tmp_path)])
  saved = json.loads((tmp_path / 'results.json').read_text())
  assert saved['interrupted'] and list(saved['arms']) == ['fixed2']
  assert (tmp_path / 'curves.png').stat().st_size > 0
  table = (tmp_path / 'table.txt').read_text()
  assert table.splitlines()[2].startswith('fixed2')
  assert 'interrupted: 1 of 2 arm runs finished' in table  # the file says it is partial
  assert 'interrupted' in capsys.readouterr().err


def test_ctrl_c_while_drawing_says_so_in_the_results(quick, tmp_path, monkeypatch, capsys):
  # It left a traceback and a results.json that read "interrupted": false.
  payload, _, _ = quick
  monkeypatch.setattr(job, 'run_arm', lambda name, *args: payload['runs'][0]['arms'][name])
  monkeypatch.setattr(job, 'plot_curves', ctrl_c)
  main_exits_130(['--quick', '--no-progress', '--out', str(tmp_path)])
  saved = json.loads((tmp_path / 'results.json').read_text())
  assert saved['interrupted'] and 'seconds' in saved
  captured = capsys.readouterr()
  assert 'curves.png not drawn' in captured.err
  assert 'the arm cut short' not in captured.out  # every arm finished


@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
def test_a_ctrl_c_that_python_drops_is_raised_at_the_next_check():
  # Python drops an exception raised in a __del__ or a garbage-collector callback (JAX
  # runs one as it traces): the demo went on, to exit 0, as if no Ctrl-C had come.
  class Dropped:

    def __del__(self):
      os.kill(os.getpid(), signal.SIGINT)

  # Python's own handler, as in a terminal (pytest run in the background starts ignoring it).
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    with job.ctrl_c_kept():
      train.check_ctrl_c()  # none yet
      Dropped()  # the handler's KeyboardInterrupt, raised in __del__, is dropped
      with pytest.raises(KeyboardInterrupt):
        train.check_ctrl_c()
    train.check_ctrl_c()  # cleared on the way out, and the handler given back
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # A background job's ignored SIGINT stays ignored (the demo died of the terminal's Ctrl-C).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with job.ctrl_c_kept():
      assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
  finally:
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_while_compiling_exits_130_from_the_shell(tmp_path):
  # XLA went on compiling in a thread of its own, and the interpreter's teardown
  # crashed under it: exit 139, "Segmentation fault".
  argv = ['--quick', '--no-progress', '--arms', 'critical', '--out', str(tmp_path)]
  env = {k: v for k, v in os.environ.items() if 'CACHE' not in k}  # compiled afresh, not read
  # python -m optax_gqc.demo, with Ctrl-C as in a terminal: a background job (CI's) starts
  # with SIGINT ignored.
  run = (
      'import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); '
      f"sys.argv = ['demo', *{argv!r}]; runpy.run_module('optax_gqc.demo', run_name='__main__')"
  )
  with subprocess.Popen(
      [sys.executable, '-c', run],
      env=env,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
  ) as proc:
    try:
      for line in proc.stderr:  # the compile starts
        if 'compiling' in line:
          break
      time.sleep(1.0)  # past the trace, into XLA's compile (about 2 s here)
      os.kill(proc.pid, signal.SIGINT)
      err = proc.stderr.read()
      assert proc.wait(timeout=120) == 130, err
    finally:
      proc.kill()
  assert 'interrupted' in err


def test_a_figure_that_fails_leaves_the_results(quick, tmp_path, monkeypatch, capsys):
  # Without matplotlib (flax from the examples extra), the figure came first and took the
  # table and results.json with it, after all the training.
  payload, _, _ = quick
  monkeypatch.setattr(job, 'run_arm', lambda name, *args: payload['runs'][0]['arms'][name])

  def no_matplotlib(*args):
    raise ModuleNotFoundError("No module named 'matplotlib'")

  monkeypatch.setattr(job, 'plot_curves', no_matplotlib)
  (tmp_path / 'curves.png').write_bytes(b'an earlier run')  # would read as this run's
  demo.main(['--quick', '--no-progress', '--out', str(tmp_path)])
  saved = json.loads((tmp_path / 'results.json').read_text())
  assert saved['verdict_lines'] == payload['verdict_lines'] and 'seconds' in saved
  assert (tmp_path / 'table.txt').read_text().splitlines()[2].startswith('control')
  assert not (tmp_path / 'curves.png').exists()
  captured = capsys.readouterr()
  assert 'could not draw' in captured.err and 'curves.png' not in captured.out.splitlines()[-1]


def test_ctrl_c_before_any_arm_finished_writes_nothing(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(job, 'run_arm', ctrl_c)
  main_exits_130(['--quick', '--no-progress', '--out', str(tmp_path)])
  assert not list(tmp_path.iterdir())
  assert 'nothing written' in capsys.readouterr().err
