"""Two processes on the loopback train as one: examples/multi_host.py, run as users run it.

Each run starts fresh processes with CPU devices (``launch``): 2 processes of
4 devices that join through ``jax.distributed.initialize`` on 127.0.0.1, and,
to compare, one process of 8 devices and one of 1. Every process is killed
after 180 s or as soon as a peer fails.
"""

import importlib.util
import time

import numpy as np
import pytest

from tests import processes

pytestmark = pytest.mark.slow


def load_example():
  spec = importlib.util.spec_from_file_location(
      'examples_multi_host', f'{processes.ROOT}/examples/multi_host.py'
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope='module')
def example():
  return load_example()


@pytest.fixture(scope='module')
def runs(example):
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv('PYTHONPATH', processes.pythonpath())  # the workers import this checkout
    return {
        layout: example.launch(*layout, timeout=180)
        for layout in [(2, 4), (1, 8), (1, 1)]  # (processes, devices per process)
    }


def test_two_processes_form_one_runtime_of_8_devices(runs):
  two = runs[2, 4]
  assert [r['process_index'] for r in two] == [0, 1]
  for r in two:
    assert (r['process_count'], r['device_count'], r['local_device_count']) == (2, 8, 4)
  assert (runs[1, 8][0]['device_count'], runs[1, 1][0]['device_count']) == (8, 1)


def test_reference_run_is_decided_by_the_gate_away_from_its_threshold(runs, example):
  one = runs[1, 1][0]
  draws = np.diff(np.flatnonzero(np.diff(one['num_steps'], prepend=0)), prepend=-1)
  assert one['num_steps'][-1] >= 8 and len(set(draws)) > 1
  assert np.min(np.abs(np.asarray(one['acc_norms']) - example.THRESHOLD)) > 1e-3


@pytest.mark.parametrize('process', [0, 1])
@pytest.mark.parametrize('reference', [(1, 8), (1, 1)])
def test_each_process_decides_as_one_process(runs, process, reference):
  run, ref = runs[2, 4][process], runs[reference][0]
  assert run['num_steps'] == ref['num_steps']  # after every microbatch
  for name, value in ref['params'].items():
    np.testing.assert_allclose(run['params'][name], value, rtol=1e-5, atol=1e-6)
  assert run['final_loss'] == pytest.approx(ref['final_loss'], rel=1e-5)


def test_workers_past_their_time_are_killed(example, monkeypatch):
  monkeypatch.setenv('PYTHONPATH', processes.pythonpath())
  start = time.monotonic()
  with pytest.raises(RuntimeError, match=r'worker 0 exited with -9'):
    example.launch(2, 4, timeout=1)  # too short to start jax
  assert time.monotonic() - start < 30


@pytest.mark.parametrize('layout', [(3, 4), (2, 3), (0, 4)])
def test_a_layout_that_cannot_split_the_batch_is_refused_before_any_worker_starts(example, layout):
  # A ValueError from launch itself: the workers would fail with JAX's IndivisibleError.
  with pytest.raises(ValueError, match='must split the batch of 64 examples evenly'):
    example.launch(*layout)


@pytest.mark.parametrize(
    'steps, status',
    [
        ([[1, 2], [1, 2]], 0),
        ([[1, 2], [1, 1]], 1),
        # Agreeing with each other, as one SPMD program's copies always do, and not with
        # one device on the whole batch (each process fed the same rows): it passed.
        ([[1, 1], [1, 1]], 1),
    ],
)
def test_the_launcher_exits_on_its_verdict(example, monkeypatch, capsys, steps, status):
  def run(steps, i=0, processes=2, devices=4):
    return {
        'process_index': i,
        'process_count': processes,
        'local_device_count': devices,
        'device_count': processes * devices,
        'num_steps': steps,
        'final_loss': 1.0,
    }

  fake = [run(s, i) for i, s in enumerate(steps)]
  reference = [run([1, 2], processes=1, devices=1)]
  monkeypatch.setattr(example, 'launch', lambda n, d, t: reference if n == 1 else fake)
  monkeypatch.setattr('sys.argv', ['multi_host.py'])
  assert example.main() == status
  assert f'as one device on the whole batch: {not status}' in capsys.readouterr().out


@pytest.mark.parametrize('flag', ['--num-processes', '--devices-per-process'])
def test_the_example_refuses_no_processes_or_devices(example, flag, monkeypatch, capsys):
  # Was: "0 processes of 4 devices: the 0 devices must split the batch".
  monkeypatch.setattr(example, 'launch', lambda *a: pytest.fail('launched'))
  monkeypatch.setattr('sys.argv', ['multi_host.py', flag, '0'])
  with pytest.raises(SystemExit) as exit_info:
    example.main()
  assert exit_info.value.code == 2
  assert f'{flag} must be at least 1, got 0' in capsys.readouterr().err
