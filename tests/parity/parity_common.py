"""Shared pieces of the parity suite: gradient streams, optimizers on both sides, checks."""

import functools

import pytest

torch = pytest.importorskip('torch')
pytest.importorskip('gradient_quality_control')
pytest.importorskip('torch_schedule_anything')

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from optax_gqc.interop.torch_replay import first_divergence  # noqa: E402

# The models here are tiny: torch's thread pool would only contend with XLA's
# for the few cores (and its idle threads spin), slowing both sides down.
torch.set_num_threads(1)

SHAPES = {'w': (8, 6), 'b': (6,), 'v': (5,)}
NUM_MICROBATCHES = 300
RTOL = 1e-5

# Explicit, equal hyperparameters: the libraries' defaults differ (torch AdamW
# weight_decay=0.01, optax.adamw 1e-4). Chosen to keep two float32 artifacts of
# the inner optimizers themselves out of the comparison, each a drift of about
# 7e-6 over 300 AdamW steps: torch multiplies the params by 1 - lr * wd rounded
# to float32 (exact here: lr * wd = 2^-12), and optax's bias correction
# 1 - b2^t, in float32, loses digits to cancellation when b2 = 0.999.
LR, WEIGHT_DECAY, BETAS, EPS = 2.0**-7, 2.0**-5, (0.9, 0.99), 1e-8
SGD_LR, MOMENTUM = 5e-2, 0.9


def torch_adamw(params):
  return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)


def torch_sgd(params):
  return torch.optim.SGD(params, lr=SGD_LR, momentum=MOMENTUM)


ADAMW_KWARGS = {'b1': BETAS[0], 'b2': BETAS[1], 'eps': EPS}
OPTAX_ADAMW = optax.adamw(LR, weight_decay=WEIGHT_DECAY, **ADAMW_KWARGS)
OPTAX_SGD = optax.sgd(SGD_LR, momentum=MOMENTUM)
INNER = {'adamw': (torch_adamw, OPTAX_ADAMW), 'sgd': (torch_sgd, OPTAX_SGD)}


@functools.cache
def initial_params(seed=1):
  rng = np.random.default_rng(seed)
  return {k: jnp.asarray(rng.normal(size=s).astype(np.float32)) for k, s in SHAPES.items()}


@functools.cache
def noisy_stream(n=NUM_MICROBATCHES, seed=0, signal=1.0, noise=3.0):
  """Microbatch gradients g_i = s + e_i, ||s|| = signal, E||e_i||^2 = noise^2.

  The mean of n of them has norm about sqrt(signal^2 + noise^2 / n): it shrinks
  with accumulation toward the signal, as real gradients do, so a norm
  threshold between the two opens the gate after a varying number of draws.
  """
  rng = np.random.default_rng(seed)
  dim = sum(int(np.prod(s)) for s in SHAPES.values())
  direction = {k: rng.normal(size=s) for k, s in SHAPES.items()}
  scale = signal / np.sqrt(sum(np.sum(v**2) for v in direction.values()))
  return tuple(
      {
          k: jnp.asarray(
              (direction[k] * scale + rng.normal(size=s) * noise / np.sqrt(dim)).astype(np.float32)
          )
          for k, s in SHAPES.items()
      }
      for _ in range(n)
  )


def tsa_values(make, num_steps):
  """The values of a torch-schedule-anything schedule at steps 0..num_steps-1.

  ``make(optimizer)`` builds it on a dummy optimizer whose lr is 1, so the
  value read from the param group is the schedule's multiplier.
  """
  optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
  schedule = make(optimizer)
  values = []
  for _ in range(num_steps):
    values.append(optimizer.param_groups[0]['lr'])
    schedule.step()
  return values


def assert_parity(records, **kwargs):
  """Same decision at every microbatch; stats, hyperparams and params within RTOL."""
  kwargs.setdefault('rtol', RTOL)
  kwargs.setdefault('atol', 0.0)
  divergence = first_divergence(records, **kwargs)
  assert divergence is None, str(divergence)


def assert_reported(records, names):
  """Both sides report each ``torch_name: optax_name`` pair (so it was compared)."""
  last = records[-1]
  for t_name, o_name in names.items():
    assert t_name in last.torch_stats, f'torch does not report {t_name!r}'
    assert o_name in last.optax_stats, f'optax_gqc does not report {o_name!r}'


def draws_per_step(records):
  """Microbatches averaged at each optimizer step, from the torch side."""
  draws, n = [], 0
  for r in records:
    n += 1
    if r.torch_stepped:
      draws.append(n)
      n = 0
  return draws


def max_param_error(records):
  """Largest |torch - optax| over a leaf, relative to the leaf's largest entry."""
  return max(
      float(np.max(np.abs(t - r.optax_params[k])) / np.max(np.abs(t)))
      for r in records
      for k, t in r.torch_params.items()
  )
