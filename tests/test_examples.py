"""The examples run, learn, and count microbatches and optimizer steps as documented."""

import importlib.util
import pathlib
import subprocess
import sys
import types

import pytest

pytestmark = pytest.mark.slow

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / 'examples'
NUM_MICROBATCHES = 300


def load_example(name: str) -> types.ModuleType:
  spec = importlib.util.spec_from_file_location(f'examples_{name}', EXAMPLES / f'{name}.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize(
    'name, step_key',
    [
        ('flax_nnx', 'optimizer_step'),
        ('flax_linen', 'train_state_step'),
        pytest.param('fused_nnx', 'optimizer_step', marks=pytest.mark.slow),
    ],
)
def test_example_learns_and_counts_microbatches(name, step_key, capsys):
  result = load_example(name).main(num_microbatches=NUM_MICROBATCHES, log_every=100)
  out = capsys.readouterr().out
  logged = [line for line in out.splitlines() if line.startswith('microbatch ')]
  assert len(logged) == NUM_MICROBATCHES // 100  # the statistics were logged
  assert result['final_loss'] < 0.5 * result['initial_loss']
  assert result['final_accuracy'] > 0.8 > result['initial_accuracy']
  # The framework's step counter counts calls of update, one per microbatch ...
  assert result[step_key] == NUM_MICROBATCHES
  # ... while GNTS accumulated, so it took fewer optimizer steps.
  assert 0 < result['num_steps'] < NUM_MICROBATCHES


@pytest.mark.parametrize('name', ['flax_nnx', 'flax_linen', 'fused_nnx'])
def test_example_warns_when_a_counter_of_bad_input_grows(name, capsys):
  # Under jit a NaN schedule or gradient raises nothing: only the counters show it.
  warn = load_example(name).warn_if_stalled
  warn({'num_bad_hyperparams': 0, 'num_skipped': 0})
  assert capsys.readouterr().out == ''
  warn({'num_bad_hyperparams': 3, 'num_skipped': 1})
  out = capsys.readouterr().out
  assert 'WARNING: 3 microbatches' in out and '1 rejected' in out


@pytest.mark.parametrize('name', ['flax_nnx', 'flax_linen', 'fused_nnx', 'checkpointing'])
def test_example_help_says_what_it_runs_and_runs_nothing(name):
  # --help (or any flag) used to run the whole example.
  out = subprocess.run(
      [sys.executable, str(EXAMPLES / f'{name}.py'), '--help'],
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert out.returncode == 0 and out.stdout.startswith(f'usage: {name}.py')
  assert not any(x in out.stdout for x in ('test accuracy', 'held-out accuracy', 'bitwise'))
