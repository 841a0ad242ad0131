"""SGD-SaI against the PyTorch reference, sgd-sai's SGD_sai, step by step."""

import pytest

torch = pytest.importorskip('torch')
sgd_sai_ref = pytest.importorskip('sgd_sai')

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import parity_common as pc  # noqa: E402

from optax_gqc._sgd_sai import sgd_sai  # noqa: E402
from optax_gqc.interop.torch_replay import replay  # noqa: E402

SHAPES = {'matrix': (8, 6), 'vector': (6,), 'cube': (3, 4, 2), 'pair': (2,)}
NUM_STEPS = 200


def _stream(seed=0):
  """Gradients with a per-leaf signal (so every leaf has its own g-SNR) plus noise."""
  rng = np.random.default_rng(seed)
  signal = {k: rng.normal(size=s) for k, s in SHAPES.items()}
  return [
      {
          k: jnp.asarray((0.5 * signal[k] + rng.normal(size=s)).astype(np.float32))
          for k, s in SHAPES.items()
      }
      for _ in range(NUM_STEPS)
  ]


@pytest.mark.parametrize('lr,momentum,weight_decay', [(1e-2, 0.9, 1e-2), (3e-3, 0.5, 0.1)])
def test_sgd_sai_matches_the_reference(lr, momentum, weight_decay):
  rng = np.random.default_rng(1)
  params = {k: jnp.asarray(rng.normal(size=s).astype(np.float32)) for k, s in SHAPES.items()}
  records = replay(
      lambda ps: sgd_sai_ref.SGD_sai(
          ps, lr=lr, momentum=momentum, eps=1e-8, weight_decay=weight_decay
      ),
      sgd_sai(lr, momentum=momentum, weight_decay=weight_decay, eps=1e-8),
      params,
      _stream(),
  )
  assert len(records) == NUM_STEPS
  pc.assert_parity(records)  # every parameter after every step, within 1e-5
  moved = {k: np.max(np.abs(records[-1].optax_params[k] - params[k])) for k in SHAPES}
  assert min(moved.values()) > 0.05  # every leaf trained, none stuck


def test_a_torch_run_resumes_here_from_its_state_as_docs_migration_says():
  # docs/migration.md: mu is the g-SNR times torch's momentum_buffer, gsnr is
  # torch's, every leaf computed, count the steps taken.
  import contextlib
  import io

  import jax
  import optax

  from optax_gqc.interop.torch import to_jax

  grads = _stream(seed=2)[:6]
  rng = np.random.default_rng(3)
  start = {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
  torch_params = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in start.items()}
  opt = sgd_sai_ref.SGD_sai(list(torch_params.values()), lr=1e-2, weight_decay=1e-2)

  def torch_steps(gs):
    for g in gs:
      for k, p in torch_params.items():
        p.grad = torch.tensor(np.asarray(g[k]))
      with contextlib.redirect_stdout(io.StringIO()):
        opt.step()

  torch_steps(grads[:3])
  saved = [opt.state[p] for p in torch_params.values()]
  gsnr = {k: to_jax(s['gsnr']) for k, s in zip(torch_params, saved, strict=True)}
  buffer = {k: to_jax(s['momentum_buffer']) for k, s in zip(torch_params, saved, strict=True)}
  params = {k: to_jax(p.detach()) for k, p in torch_params.items()}
  tx = sgd_sai(1e-2, weight_decay=1e-2)
  fresh = tx.init(params)
  state = (
      fresh[0]._replace(computed=jax.tree.map(lambda _: jnp.asarray(True), gsnr), gsnr=gsnr),
      fresh[1]._replace(
          count=jnp.asarray(3, jnp.int32), mu={k: gsnr[k] * buffer[k] for k in buffer}
      ),
      *fresh[2:],
  )
  for g in grads[3:]:
    updates, state = tx.update(g, state, params)
    params = optax.apply_updates(params, updates)
  torch_steps(grads[3:])
  for k, p in torch_params.items():
    np.testing.assert_allclose(params[k], p.detach().numpy(), atol=1e-6)
