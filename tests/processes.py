"""Test scripts in fresh Python processes with forced CPU devices, and the data they train on.

XLA reads ``--xla_force_host_platform_device_count`` when jax initializes, so a
test that needs several devices runs its script in a subprocess, bounded in
time. A script prints one JSON line last; the test asserts on it.
"""

import json
import os
import subprocess
import sys

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pythonpath() -> str:
  """``PYTHONPATH`` for a process that imports this checkout first, then what the run imports."""
  return os.pathsep.join([ROOT, *filter(None, [os.environ.get('PYTHONPATH')])])


def cpu_env(num_devices: int) -> dict[str, str]:
  """The environment of a process with ``num_devices`` CPU devices that imports this checkout."""
  return dict(
      os.environ,
      XLA_FLAGS=f'--xla_force_host_platform_device_count={num_devices}',
      JAX_PLATFORMS='cpu',
      PYTHONPATH=pythonpath(),
  )


def run_code(code: str, *, num_devices: int, timeout: float = 300) -> str:
  """Runs ``code`` with ``num_devices`` CPU devices; returns its stdout, failing on an error."""
  out = subprocess.run(
      [sys.executable, '-c', code],
      env=cpu_env(num_devices),
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=timeout,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


def run_script(script: str, *, num_devices: int = 8, timeout: float = 300) -> dict:
  """Runs ``script`` with ``num_devices`` CPU devices; returns the JSON of its last line."""
  return json.loads(
      run_code(script, num_devices=num_devices, timeout=timeout).strip().splitlines()[-1]
  )


def regression(num: int, batch: int, seed: int = 0) -> tuple[dict, jax.Array, jax.Array]:
  """A noisy linear regression near its optimum: params, and ``num`` microbatches (x, y).

  The microbatch gradients are mostly noise, so that their mean shortens as
  GNTS averages more of them. 'w' (16 x 8) has rows to shard across 8 devices.
  """
  k = jax.random.split(jax.random.key(seed), 5)
  w_star, b_star = jax.random.normal(k[0], (16, 8)), jax.random.normal(k[1], (8,))
  params = {'w': w_star + 0.05 * jax.random.normal(k[2], (16, 8)), 'b': b_star + 0.05}
  xs = jax.random.normal(k[3], (num, batch, 16))
  ys = xs @ w_star + b_star + jax.random.normal(k[4], (num, batch, 8))
  return params, xs, ys
