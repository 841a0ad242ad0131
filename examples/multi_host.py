"""GNTS over several processes (hosts): ``python examples/multi_host.py``.

Run as is, it starts 2 processes on this machine, each with 4 CPU devices,
that join one JAX runtime through ``jax.distributed.initialize`` on the
loopback address and train together over the global mesh of 8 devices. On a
real cluster, start one worker per host instead::

  python examples/multi_host.py --process-id 0 --num-processes 2 --coordinator host0:1234
  python examples/multi_host.py --process-id 1 --num-processes 2 --coordinator host0:1234

Multi-host training is jit SPMD over the global mesh: every process runs the
same program on global arrays, and XLA makes the gradient, and so every norm
GNTS reads, global. Each process feeds only its own slice of each batch
(``jax.make_array_from_process_local_data``), and every process takes the
same decisions: those of one device on the whole batch, which the launcher
runs too and checks them against (its exit status).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

NUM_MICROBATCHES, BATCH, THRESHOLD = 40, 64, 1.0


def data(seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
  """Linear regression near its optimum, the same on every process: params, inputs, targets."""
  rng = np.random.default_rng(seed)
  w_star, b_star = rng.normal(size=(16, 8)), rng.normal(size=8)
  params = {'w': w_star + 0.05 * rng.normal(size=(16, 8)), 'b': b_star + 0.05}
  x = rng.normal(size=(NUM_MICROBATCHES, BATCH, 16))
  y = x @ w_star + b_star + rng.normal(size=(NUM_MICROBATCHES, BATCH, 8))
  as_f32 = lambda a: a.astype(np.float32)  # noqa: E731
  return {k: as_f32(v) for k, v in params.items()}, as_f32(x), as_f32(y)


def train(process_id: int, num_processes: int, coordinator: str | None) -> dict:
  """One worker: joins the others, trains, and returns its decisions and parameters."""
  import jax  # imported here: the launcher sets XLA_FLAGS before jax starts

  if num_processes > 1:
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')  # for CPU devices
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=120,
    )
  import jax.numpy as jnp
  import optax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import optax_gqc

  mesh = jax.make_mesh((jax.device_count(),), ('data',))
  replicated, batch = NamedSharding(mesh, P()), NamedSharding(mesh, P('data'))
  params, x, y = data()
  # Replicated params from the same value on every process; no host holds
  # the others' devices.
  params = {
      k: jax.make_array_from_callback(v.shape, replicated, lambda i, v=v: v[i])
      for k, v in params.items()
  }
  tx = optax_gqc.gnts(optax.adam(3e-2), THRESHOLD, max_draws=8, microbatch_size=BATCH)

  def loss_fn(params, x, y):
    return jnp.mean(jnp.sum((x @ params['w'] + params['b'] - y) ** 2, -1)) / 2

  @jax.jit
  def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)  # the mean over the global batch
    params, opt_state = optax_gqc.update_and_apply(tx, grads, opt_state, params)
    return params, opt_state, loss

  opt_state = tx.init(params)
  local = slice(
      process_id * BATCH // num_processes, (process_id + 1) * BATCH // num_processes
  )  # this process's rows of every batch
  steps, norms = [], []
  for i in range(NUM_MICROBATCHES):
    xi = jax.make_array_from_process_local_data(batch, x[i, local], x.shape[1:])
    yi = jax.make_array_from_process_local_data(batch, y[i, local], y.shape[1:])
    params, opt_state, loss = train_step(params, opt_state, xi, yi)
    stats = optax_gqc.statistics(opt_state)  # replicated: every process reads its own copy
    steps.append(int(stats['num_steps'].addressable_data(0)))
    norms.append(float(stats['acc_norm'].addressable_data(0)))
  result = {
      'process_index': jax.process_index(),
      'process_count': jax.process_count(),
      'device_count': jax.device_count(),
      'local_device_count': jax.local_device_count(),
      'num_steps': steps,
      'acc_norms': norms,
      'final_loss': float(loss.addressable_data(0)),
      'params': {k: np.asarray(v.addressable_data(0)).tolist() for k, v in params.items()},
  }
  if num_processes > 1:
    jax.distributed.shutdown()
  return result


def launch(
    num_processes: int = 2, devices_per_process: int = 4, timeout: float = 180
) -> list[dict]:
  """Starts the workers on this machine with CPU devices; returns their results.

  All are killed as soon as one fails or the time runs out, so that no worker
  waits for a dead peer. The coordinator listens on 127.0.0.1 only.
  """
  devices = num_processes * devices_per_process
  if num_processes < 1 or devices_per_process < 1 or BATCH % devices:
    raise ValueError(
        f'{num_processes} processes of {devices_per_process} devices: the {devices} devices must '
        f'split the batch of {BATCH} examples evenly (e.g. 2 processes of 4 devices)'
    )
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  env = dict(
      os.environ,
      XLA_FLAGS=f'--xla_force_host_platform_device_count={devices_per_process}',
      JAX_PLATFORMS='cpu',
  )
  with tempfile.TemporaryDirectory() as tmp:
    logs = [open(f'{tmp}/{i}.log', 'w') for i in range(num_processes)]  # noqa: SIM115
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                os.path.abspath(__file__),
                f'--process-id={i}',
                f'--num-processes={num_processes}',
                f'--coordinator=127.0.0.1:{port}',
                f'--output={tmp}/{i}.json',
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for i, log in enumerate(logs)
    ]
    deadline = time.monotonic() + timeout
    try:
      while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
          break  # one failed: the others would wait for it
        time.sleep(0.1)
    finally:
      for p, log in zip(procs, logs, strict=True):
        if p.poll() is None:
          p.kill()
        p.wait()
        log.close()
    for i, p in enumerate(procs):
      if p.returncode != 0:
        with open(f'{tmp}/{i}.log') as log:
          raise RuntimeError(
              f'worker {i} exited with {p.returncode} (negative: killed, after '
              f'{timeout} s or a failed peer):\n{log.read()[-3000:]}'
          )
    results = []
    for i in range(num_processes):
      with open(f'{tmp}/{i}.json') as f:
        results.append(json.load(f))
  return results


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--process-id', type=int, help='run one worker (omit to launch locally)')
  parser.add_argument('--num-processes', type=int, default=2)
  parser.add_argument('--devices-per-process', type=int, default=4, help='CPU devices, locally')
  parser.add_argument('--coordinator', default=None, help='host:port of process 0')
  parser.add_argument('--output', default=None, help="a worker's result, as JSON")
  parser.add_argument('--timeout', type=float, default=180, help='seconds, locally')
  args = parser.parse_args()
  for flag in ('num_processes', 'devices_per_process'):
    if getattr(args, flag) < 1:
      parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
  if args.process_id is not None:
    result = train(args.process_id, args.num_processes, args.coordinator)
    if args.output:
      with open(args.output, 'w') as f:
        json.dump(result, f)
    print(f'process {result["process_index"]}: {result["num_steps"][-1]} optimizer steps')
    return 0
  try:
    results = launch(args.num_processes, args.devices_per_process, args.timeout)
  except ValueError as e:
    parser.error(str(e))
  # The reference: one process on one device, the whole batch.
  reference = launch(1, 1, args.timeout)[0]
  for r in results:
    print(
        f'process {r["process_index"]} of {r["process_count"]} ({r["local_device_count"]} of '
        f'{r["device_count"]} devices): {r["num_steps"][-1]} optimizer steps in '
        f'{NUM_MICROBATCHES} microbatches, final loss {r["final_loss"]:.3f}'
    )
  print(
      f'one process on one device: {reference["num_steps"][-1]} optimizer steps, final loss '
      f'{reference["final_loss"]:.3f}'
  )
  same = all(r['num_steps'] == reference['num_steps'] for r in results)  # after every microbatch
  print(f'every process took the same decisions as one device on the whole batch: {same}')
  return 0 if same else 1


if __name__ == '__main__':
  sys.exit(main())
