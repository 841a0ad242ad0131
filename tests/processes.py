"""Test scripts in fresh Python processes: forced CPU devices, several processes on the loopback.

XLA reads ``--xla_force_host_platform_device_count`` when jax initializes, so a
test that needs several devices runs its script in a subprocess. Each script
prints one JSON line last; the test asserts on it. Every process is bounded in
time and killed on failure; nothing listens beyond 127.0.0.1.
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_env(num_devices: int) -> dict[str, str]:
  """The environment of a process with ``num_devices`` CPU devices that imports this checkout."""
  return dict(
      os.environ,
      XLA_FLAGS=f'--xla_force_host_platform_device_count={num_devices}',
      JAX_PLATFORMS='cpu',
      PYTHONPATH=ROOT,
  )


def run_script(script: str, *, num_devices: int = 8, timeout: float = 300) -> dict:
  """Runs ``script`` with ``num_devices`` CPU devices; returns the JSON of its last line."""
  out = subprocess.run(
      [sys.executable, '-c', script],
      env=cpu_env(num_devices),
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=timeout,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])
