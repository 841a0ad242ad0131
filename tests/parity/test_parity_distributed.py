"""torch-gqc's ``distributed_mode`` on two gloo processes against the ports docs/migration.md gives.

torch.distributed needs a process per rank: the reference runs in a subprocess
of two ranks (bounded in time) and prints its decisions; the ports run here,
on the data-parallel mean gradient of the same global batch.
"""

import json
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_gqc
from tests import processes

pytest.importorskip('gradient_quality_control')
pytest.importorskip('torch_schedule_anything')
pytest.importorskip('torch.distributed')

WORLD = 2
NUM, DIM, BATCH = 24, 6, 4  # microbatches, features, examples per device
THRESHOLD, LOGICAL_BATCH, TARGET = 6.0, 24.0, 1.0

REFERENCE = r"""
import json, os, sys, warnings
warnings.filterwarnings('ignore')
import numpy as np, torch, torch.distributed as dist, torch.multiprocessing as mp

NUM, DIM, BATCH, THRESHOLD, LOGICAL_BATCH, TARGET, PORT = sys.argv[1:]
NUM, DIM, BATCH, PORT = int(NUM), int(DIM), int(BATCH), PORT
THRESHOLD, LOGICAL_BATCH, TARGET = float(THRESHOLD), float(LOGICAL_BATCH), float(TARGET)

def data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(NUM, 2, BATCH, DIM)).astype(np.float32)  # microbatch, rank, example
  y = x @ rng.normal(size=DIM).astype(np.float32) + 3 * rng.normal(size=(NUM, 2, BATCH))
  return x, y.astype(np.float32)

def worker(rank, queue):
  os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=PORT)
  dist.init_process_group('gloo', rank=rank, world_size=2)
  torch.set_num_threads(1)
  import gradient_quality_control as gqc, torch_schedule_anything as tsa
  x, y = data()
  out = {}
  # GNTS 'sharded' (FSDP): each rank holds half of the weights and sees the whole batch.
  w = [torch.nn.Parameter(torch.full((DIM // 2,), 0.1)) for _ in range(2)]
  gnts = gqc.OptimizerWrapperGNTS(
      torch.optim.SGD([w[rank]], lr=0.01), max_batch_draws=8, distributed_mode='sharded')
  schedule = tsa.constant_schedule(gnts, THRESHOLD, 'gradient_norm_threshold')
  out['gnts'] = []
  for i in range(NUM):
    err = torch.tensor(x[i].reshape(-1, DIM)) @ torch.cat(w) - torch.tensor(y[i].reshape(-1))
    torch.mean(err ** 2).backward()
    out['gnts'].append(bool(gnts.step()))
    schedule.step()
  # SBC 'replicated' (DDP): each rank a microbatch of BATCH examples, the mean gradient.
  p = torch.nn.Parameter(torch.full((DIM,), 0.1))
  sbc = gqc.OptimizerWrapperSBC(
      torch.optim.SGD([p], lr=0.01), physical_batch_size=BATCH, distributed_mode='replicated')
  schedule = tsa.constant_schedule(sbc, LOGICAL_BATCH, 'logical_batch_size')
  out['sbc'] = []
  for i in range(NUM):
    err = torch.tensor(x[i, rank]) @ p - torch.tensor(y[i, rank])
    g = torch.autograd.grad(torch.mean(err ** 2), p)[0]
    dist.all_reduce(g)
    g = g / 2
    p.grad = g if p.grad is None else p.grad + g
    out['sbc'].append(bool(sbc.step()))
    schedule.step()
  # GNR 'sharded': the global norm of one rescaled step.
  v = [torch.nn.Parameter(torch.arange(1.0, 4.0) + 3 * r) for r in range(2)]
  gnr = gqc.OptimizerWrapperGNR(torch.optim.SGD([v[rank]], lr=1.0), distributed_mode='sharded')
  tsa.constant_schedule(gnr, TARGET, 'target_gradient_norm')
  before = v[rank].detach().clone()
  (0.5 * (torch.cat(v) ** 2).sum()).backward()  # the gradient is the parameters
  gnr.step()
  sq = ((v[rank].detach() - before) ** 2).sum()
  dist.all_reduce(sq)
  out['gnr_step_norm'] = float(sq.sqrt())
  if rank == 0:
    queue.put(out)
  dist.destroy_process_group()

if __name__ == '__main__':
  ctx = mp.get_context('spawn')
  queue = ctx.Queue()
  ranks = [ctx.Process(target=worker, args=(r, queue)) for r in range(2)]
  for r in ranks:
    r.start()
  out = queue.get(timeout=120)
  for r in ranks:
    r.join(timeout=30)
  print(json.dumps(out))
"""


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  # A file, not -c: spawned ranks import the script's functions from it.
  script = tmp_path_factory.mktemp('reference') / 'reference.py'
  script.write_text(REFERENCE)
  args = [NUM, DIM, BATCH, THRESHOLD, LOGICAL_BATCH, TARGET, _free_port()]
  out = subprocess.run(
      [sys.executable, str(script), *map(str, args)],
      env=processes.cpu_env(1),
      capture_output=True,
      text=True,
      timeout=180,
      check=True,
  )
  return json.loads(out.stdout.strip().splitlines()[-1])


def _data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(NUM, WORLD, BATCH, DIM)).astype(np.float32)
  y = x @ rng.normal(size=DIM).astype(np.float32) + 3 * rng.normal(size=(NUM, WORLD, BATCH))
  # The global batch of each microbatch: every device's examples.
  return x.reshape(NUM, -1, DIM), y.astype(np.float32).reshape(NUM, -1)


def _steps(tx, params, loss):
  """Whether each microbatch stepped, on the global batch's gradient."""
  x, y = _data()
  state, stepped = tx.init(params), []
  update = jax.jit(tx.update)
  for i in range(NUM):
    before = int(state.num_steps)
    updates, state = update(jax.grad(loss)(params, x[i], y[i]), state, params)
    params = optax.apply_updates(params, updates)
    stepped.append(int(state.num_steps) > before)
  return stepped


def _gnts(threshold):
  halves = {'a': jnp.full(DIM // 2, 0.1), 'b': jnp.full(DIM // 2, 0.1)}

  def loss(p, x, y):
    return jnp.mean((x @ jnp.concatenate([p['a'], p['b']]) - y) ** 2)

  tx = optax_gqc.gnts(optax.sgd(0.01), threshold=threshold, max_draws=8)
  return _steps(tx, halves, loss)


def _sbc(microbatch_size):
  def loss(p, x, y):
    return jnp.mean((x @ p['w'] - y) ** 2)

  tx = optax_gqc.sbc(optax.sgd(0.01), LOGICAL_BATCH, microbatch_size, max_draws=64)
  return _steps(tx, {'w': jnp.full(DIM, 0.1)}, loss)


def test_sharded_gnts_takes_the_threshold_times_sqrt_of_the_devices(reference):
  assert _gnts(THRESHOLD * np.sqrt(WORLD)) == reference['gnts']
  assert _gnts(THRESHOLD) != reference['gnts']  # the factor matters on this stream


def test_replicated_sbc_takes_the_global_microbatch(reference):
  assert _sbc(WORLD * BATCH) == reference['sbc']
  assert _sbc(BATCH) != reference['sbc']


def test_sharded_gnr_takes_the_target_times_sqrt_of_the_devices(reference):
  params = {'a': jnp.arange(1.0, 4.0), 'b': jnp.arange(4.0, 7.0)}
  tx = optax_gqc.gnr(optax.sgd(1.0), target=TARGET * np.sqrt(WORLD))
  updates, _ = tx.update(params, tx.init(params))  # the gradient is the parameters
  np.testing.assert_allclose(optax.tree.norm(updates), reference['gnr_step_norm'], rtol=1e-6)
  assert reference['gnr_step_norm'] == pytest.approx(TARGET * np.sqrt(WORLD), rel=1e-6)
