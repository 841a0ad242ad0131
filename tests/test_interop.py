"""The PyTorch bridge: conversions both ways, writing back, gradients, replay."""

import importlib
import sys

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_gqc

try:
  import torch
except ImportError:
  torch = None

if torch is not None:
  from optax_gqc.interop import torch as tshim

needs_torch = pytest.mark.skipif(torch is None, reason='needs torch')


def test_import_without_torch_says_how_to_install(monkeypatch):
  import optax_gqc.interop

  monkeypatch.setitem(sys.modules, 'torch', None)  # what a missing torch looks like
  monkeypatch.delitem(sys.modules, 'optax_gqc.interop.torch', raising=False)
  importlib.reload(optax_gqc.interop)  # the package itself needs no torch
  with pytest.raises(ImportError, match=r'pip install "optax-gqc\[torch\]"'):
    importlib.import_module('optax_gqc.interop.torch')


def _model(dtype):
  torch.manual_seed(0)
  return torch.nn.Sequential(
      torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3)).to(dtype)


def _bits(x):
  """Raw bits, so bf16 values compare exactly."""
  a = np.asarray(x)
  return a.view({2: np.int16, 4: np.int32}[a.dtype.itemsize])


@needs_torch
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_module_round_trip_keeps_names_dtypes_and_values(dtype):
  model = _model(getattr(torch, dtype))
  tree = tshim.params_to_jax(model)
  assert list(tree) == [name for name, _ in model.named_parameters()]
  for name, p in model.named_parameters():
    assert tree[name].dtype == jnp.dtype(dtype) and tree[name].shape == tuple(p.shape)
    np.testing.assert_array_equal(_bits(tree[name]), _bits(tshim.to_jax(p)))
    np.testing.assert_array_equal(
        _bits(tree[name]), p.detach().view(torch.int16 if dtype == 'bfloat16' else torch.int32))

  changed = {k: (2 * v + 1).astype(v.dtype) for k, v in tree.items()}
  tshim.load_into(model, changed)
  back = tshim.params_to_jax(model)
  for name in tree:
    assert back[name].dtype == jnp.dtype(dtype)
    np.testing.assert_array_equal(_bits(back[name]), _bits(changed[name]))


@needs_torch
def test_conversions_copy():
  t = torch.arange(6.0).reshape(2, 3)
  a = tshim.to_jax(t)
  t.add_(100.0)  # torch changes its tensor in place; the JAX array must not see it
  np.testing.assert_array_equal(np.asarray(a), np.arange(6.0).reshape(2, 3))
  back = tshim.to_torch(a)
  back.mul_(0.0)
  np.testing.assert_array_equal(np.asarray(a), np.arange(6.0).reshape(2, 3))
  # A transposed (non-contiguous) tensor keeps its logical layout.
  np.testing.assert_array_equal(np.asarray(tshim.to_jax(t.T)), t.numpy().T)
  tree = tshim.tree_to_torch({'a': jnp.ones(2, jnp.bfloat16), 'b': [jnp.zeros(3, jnp.int32)]})
  assert tree['a'].dtype == torch.bfloat16 and tree['b'][0].dtype == torch.int32


@needs_torch
def test_grads_to_jax_and_set_grads():
  model = _model(torch.float32)
  tree = tshim.params_to_jax(model)
  assert all(np.all(np.asarray(g) == 0) for g in tshim.grads_to_jax(model).values())  # no .grad

  model(torch.ones(2, 5)).sum().backward()
  grads = tshim.grads_to_jax(model)
  for name, p in model.named_parameters():
    np.testing.assert_array_equal(np.asarray(grads[name]), p.grad.numpy())

  new = {k: jnp.full(v.shape, 0.5, v.dtype) for k, v in tree.items()}
  tshim.set_grads(model, new)  # replaces
  assert all(torch.all(p.grad == 0.5) for p in model.parameters())

  seen = []
  model[0].weight.register_hook(lambda g: seen.append(float(g.norm())))
  tshim.set_grads(model, new, accumulate=True)  # adds through autograd, hooks run
  assert all(torch.all(p.grad == 1.0) for p in model.parameters())
  assert seen == [pytest.approx(0.5 * np.sqrt(20))]


@needs_torch
def test_set_grads_casts_to_the_parameter_dtype():
  model = _model(torch.bfloat16)
  grads = {k: jnp.ones(v.shape, jnp.float32) for k, v in tshim.params_to_jax(model).items()}
  tshim.set_grads(model, grads)
  assert all(p.grad.dtype == torch.bfloat16 for p in model.parameters())


@needs_torch
def test_load_into_and_set_grads_check_names_and_shapes():
  model = _model(torch.float32)
  tree = tshim.params_to_jax(model)
  missing = dict(tree)
  missing.pop('0.bias')
  with pytest.raises(KeyError, match='0.bias'):
    tshim.load_into(model, missing)
  with pytest.raises(KeyError, match='extra'):
    tshim.set_grads(model, {**tree, 'extra': jnp.ones(1)})
  with pytest.raises(ValueError, match='shape'):
    tshim.load_into(model, {**tree, '2.bias': jnp.ones(4)})


def _stream(n, shape=(3,)):
  rng = np.random.default_rng(0)
  return [{'w': jnp.asarray(rng.normal(size=shape).astype(np.float32))} for _ in range(n)]


@needs_torch
def test_replay_agrees_for_the_same_optimizer_and_finds_a_difference():
  params = {'w': jnp.ones(3)}
  stream = _stream(20)
  same = tshim.replay(
      lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
      optax.sgd(0.1, momentum=0.9), params, stream)
  assert len(same) == 20 and all(r.torch_stepped and r.optax_stepped for r in same)
  assert tshim.first_divergence(same) is None

  other = tshim.replay(
      lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
      optax.sgd(0.1, momentum=0.8), params, stream)
  d = tshim.first_divergence(other)
  assert d.index == 1 and d.what.startswith("param 'w'")  # step 0 has no momentum yet
  assert 'microbatch 1' in str(d)


@needs_torch
def test_replay_reports_step_decisions_and_statistics():
  params = {'w': jnp.ones(3)}
  # Ours accumulates two microbatches per step; a plain torch optimizer steps every time.
  records = tshim.replay(
      lambda ps: torch.optim.SGD(ps, lr=0.1), optax_gqc.sbc(optax.sgd(0.1), 2, 1),
      params, _stream(4))
  assert [r.optax_stepped for r in records] == [False, True, False, True]
  assert [r.optax_stats['num_draws'] for r in records] == [1, 0, 1, 0]
  assert records[0].torch_hyperparams['lr'] == 0.1
  d = tshim.first_divergence(records)
  assert (d.index, d.what, d.torch_value, d.optax_value) == (0, 'step', 'stepped', 'accumulated')


@needs_torch
def test_replay_passes_losses_to_both_sides():
  seen_torch = []

  def torch_step(optimizer, loss):
    seen_torch.append(loss)
    return optimizer.step()

  gate = optax_gqc.gates.Gate(
      init=lambda: {'loss': jnp.zeros([])},
      update=lambda stats, state, value: (value < 0.5, {'loss': value}),
  )
  losses = [0.9, 0.7, 0.4, 0.8]
  records = tshim.replay(
      lambda ps: torch.optim.SGD(ps, lr=0.1), optax_gqc.accumulate(optax.sgd(0.1), gate),
      {'w': jnp.ones(3)}, _stream(4), losses, torch_step=torch_step)
  assert seen_torch == losses
  assert [r.optax_stats['loss'] for r in records] == pytest.approx(losses)
  assert [r.optax_stepped for r in records] == [False, False, True, False]
  with pytest.raises(ValueError, match='losses ran out'):
    tshim.replay(lambda ps: torch.optim.SGD(ps, lr=0.1), optax.sgd(0.1),
                 {'w': jnp.ones(3)}, _stream(2), [1.0])
