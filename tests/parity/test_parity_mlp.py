"""A real model: one MLP in PyTorch and in Flax NNX, trained side by side with GNTS."""

import pytest

torch = pytest.importorskip('torch')
gqc = pytest.importorskip('gradient_quality_control')
datasets = pytest.importorskip('sklearn.datasets')

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import parity_common  # noqa: E402, F401  (one torch thread)
from flax import nnx  # noqa: E402

import optax_gqc  # noqa: E402
from optax_gqc.interop.torch import params_to_jax  # noqa: E402

MICROBATCH, THRESHOLD, MAX_DRAWS, NUM_STEPS = 16, 0.5, 16, 50
LR, WEIGHT_DECAY = 1e-2, 1e-2


class TorchMLP(torch.nn.Module):

  def __init__(self):
    super().__init__()
    self.fc1 = torch.nn.Linear(64, 32)
    self.fc2 = torch.nn.Linear(32, 10)

  def forward(self, x):
    return self.fc2(torch.tanh(self.fc1(x)))


class NnxMLP(nnx.Module):

  def __init__(self, rngs: nnx.Rngs):
    self.fc1 = nnx.Linear(64, 32, rngs=rngs)
    self.fc2 = nnx.Linear(32, 10, rngs=rngs)

  def __call__(self, x):
    return self.fc2(jnp.tanh(self.fc1(x)))


@nnx.jit
def nnx_step(model, optimizer, x, y):
  def loss_fn(model):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

  loss, grads = nnx.value_and_grad(loss_fn)(model)
  optimizer.update(model, grads)
  return loss, optax_gqc.statistics(optimizer.opt_state)['num_steps']


def _microbatches():
  """Shuffled microbatches of the 1797 digits, epoch after epoch."""
  x, y = datasets.load_digits(return_X_y=True)
  x, y = (x / 16.0).astype(np.float32), y.astype(np.int64)
  rng = np.random.default_rng(0)
  while True:
    order = rng.permutation(len(x))
    for i in range(len(x) // MICROBATCH):
      batch = order[i * MICROBATCH : (i + 1) * MICROBATCH]
      yield x[batch], y[batch]


@pytest.fixture(autouse=True)
def float32_matmuls():
  """Float32 matmuls, as torch's: on a GPU JAX defaults to TF32 (docs/differences.md)."""
  with jax.default_matmul_precision('highest'):
    yield


def test_mlp_on_digits_trains_the_same_with_gnts():
  torch.manual_seed(0)
  torch_model = TorchMLP()
  model = NnxMLP(nnx.Rngs(0))
  weights = params_to_jax(torch_model)  # torch's initial weights, copied through the shim
  for name in ('fc1', 'fc2'):
    layer = getattr(model, name)
    layer.kernel[...] = weights[f'{name}.weight'].T  # torch keeps (out, in)
    layer.bias[...] = weights[f'{name}.bias']

  adamw = {'lr': LR, 'betas': (0.9, 0.999), 'eps': 1e-8, 'weight_decay': WEIGHT_DECAY}
  wrapper = gqc.OptimizerWrapperGNTS(
      torch.optim.AdamW(torch_model.parameters(), **adamw), max_batch_draws=MAX_DRAWS
  )
  for group in wrapper.param_groups:
    group['gradient_norm_threshold'] = THRESHOLD
  optimizer = nnx.Optimizer(
      model,
      optax_gqc.gnts(
          optax.adamw(LR, b1=0.9, b2=0.999, eps=1e-8, weight_decay=WEIGHT_DECAY),
          THRESHOLD,
          max_draws=MAX_DRAWS,
      ),
      wrt=nnx.Param,
  )

  losses, draws, n = [], [], 0
  steps_before = 0
  for i, (x, y) in enumerate(_microbatches()):
    torch_loss = torch.nn.functional.cross_entropy(
        torch_model(torch.from_numpy(x)), torch.from_numpy(y)
    )
    torch_loss.backward()
    torch_stepped = wrapper.step()
    loss, num_steps = nnx_step(model, optimizer, jnp.asarray(x), jnp.asarray(y))
    stepped = int(num_steps) > steps_before
    steps_before = int(num_steps)
    assert stepped == torch_stepped, f'microbatch {i}: torch {torch_stepped}, nnx {stepped}'
    losses.append((torch_loss.item(), float(loss)))
    n += 1
    if stepped:
      draws.append(n)
      n = 0
    if wrapper.num_steps == NUM_STEPS:
      break

  torch_losses, nnx_losses = np.array(losses).T
  np.testing.assert_allclose(nnx_losses, torch_losses, rtol=0, atol=1e-4)
  assert torch_losses[-20:].mean() < 0.5 * torch_losses[:20].mean()  # it learned
  assert len(set(draws)) >= 5  # the gate opened after varying numbers of microbatches
  final = params_to_jax(torch_model)
  np.testing.assert_allclose(model.fc1.kernel[...], final['fc1.weight'].T, rtol=0, atol=1e-4)
  np.testing.assert_allclose(model.fc2.kernel[...], final['fc2.weight'].T, rtol=0, atol=1e-4)
