"""The Flax NNX bridge: the fused step leaves model and optimizer as nnx.Optimizer.update does."""

import importlib
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_gqc

nnx = pytest.importorskip('flax.nnx')  # an optional dependency

from optax_gqc.interop import nnx as gqc_nnx  # noqa: E402


def mlp(seed=0):
  rngs = nnx.Rngs(seed)
  return nnx.Sequential(nnx.Linear(6, 16, rngs=rngs), nnx.tanh, nnx.Linear(16, 3, rngs=rngs))


def loss_fn(model, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def microbatches(num, seed=0):
  rng = np.random.default_rng(seed)
  return [
      (rng.normal(size=(8, 6)).astype(np.float32), rng.integers(0, 3, size=8)) for _ in range(num)
  ]


def train_step(fused, with_loss):
  @nnx.jit
  def step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    extra_args = {'value': loss} if with_loss else {}
    if fused:
      gqc_nnx.update(optimizer, model, grads, **extra_args)
    else:
      optimizer.update(model, grads, **extra_args)

  return step


CASES = {
    'gnts': (lambda: optax_gqc.gnts(optax.adamw(0.02), threshold=0.5, max_draws=4), False),
    'mht_value_loss': (lambda: optax_gqc.mht(optax.adam(0.02), 0.9, 0.02, max_draws=4), True),
    'not_an_accumulation': (lambda: optax.adamw(0.02), False),
}


@pytest.mark.parametrize(
    'name',
    [
        # The t quantile of the loss gate takes a while to compile.
        pytest.param(name, marks=pytest.mark.slow) if name.startswith('mht') else name
        for name in sorted(CASES)
    ],
)
def test_fused_update_equals_optimizer_update_bitwise_under_nnx_jit(name):
  make_tx, with_loss = CASES[name]
  ref_model, model = mlp(), mlp()
  ref_opt = nnx.Optimizer(ref_model, make_tx(), wrt=nnx.Param)
  opt = nnx.Optimizer(model, make_tx(), wrt=nnx.Param)
  ref_step, step = train_step(False, with_loss), train_step(True, with_loss)
  kernel0 = np.asarray(model.layers[0].kernel[...])
  for x, y in microbatches(32):
    ref_step(ref_model, ref_opt, x, y)
    step(model, opt, x, y)
    chex.assert_trees_all_equal(nnx.state(model, nnx.Param), nnx.state(ref_model, nnx.Param))
    chex.assert_trees_all_equal(nnx.as_pure(opt.opt_state), nnx.as_pure(ref_opt.opt_state))
  assert int(opt.step[...]) == int(ref_opt.step[...]) == 32
  assert not np.array_equal(model.layers[0].kernel[...], kernel0)
  if name != 'not_an_accumulation':
    stats = optax_gqc.statistics(opt.opt_state)
    assert 0 < int(stats['num_steps']) < 32  # both branches ran
    jax.tree.map(np.testing.assert_array_equal, optax_gqc.statistics(opt), stats)
    # nnx.state keeps each state as a mapping of its fields, without its type.
    for kept in (nnx.state(opt), nnx.to_pure_dict(nnx.state(opt))):
      with pytest.raises(TypeError, match='optimizer.opt_state'):
        optax_gqc.statistics(kept)


@pytest.mark.parametrize('fused', [True, False], ids=['gqc_nnx.update', 'optimizer.update'])
def test_the_fused_update_writes_no_zero_update(fused):
  # What tells the fused path from the Optax path, which equals it in value:
  # a param-sized buffer for the updates (1 MiB here) that only the latter has.
  model = nnx.Linear(512, 512, use_bias=False, rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax_gqc.gnts(optax.sgd(0.1), threshold=0.5), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))

  def step(state, grad):
    model, optimizer = nnx.merge(graphdef, state)
    grads = jax.tree.map(lambda _: grad, nnx.state(model, nnx.Param))
    if fused:
      gqc_nnx.update(optimizer, model, grads)
    else:
      optimizer.update(model, grads)
    return nnx.state((model, optimizer))

  compiled = jax.jit(step, donate_argnums=0).lower(state, jnp.ones((512, 512))).compile()
  temporaries = compiled.memory_analysis().temp_size_in_bytes / (512 * 512 * 4)
  if fused:
    assert temporaries < 0.05
  else:
    assert temporaries > 0.95


def test_import_without_flax_says_how_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, 'flax', None)  # what a missing flax looks like
  monkeypatch.delitem(sys.modules, 'optax_gqc.interop.nnx', raising=False)
  with pytest.raises(ImportError, match='pip install flax'):
    importlib.import_module('optax_gqc.interop.nnx')


def test_gradients_unlike_the_optimizer_params_raise():
  model = mlp()
  optimizer = nnx.Optimizer(model, optax_gqc.gnts(optax.sgd(0.1), 0.5), wrt=nnx.Param)
  other = nnx.Linear(6, 3, rngs=nnx.Rngs(0))
  grads = nnx.grad(lambda m: jnp.sum(m(jnp.ones((1, 6)))))(other)
  with pytest.raises(ValueError, match='does not match the params'):
    gqc_nnx.update(optimizer, model, grads)


@pytest.mark.parametrize('fused', [True, False], ids=['fused', 'optimizer_update'])
def test_pure_gradients_are_told_to_keep_their_variables(fused):
  model = mlp()
  optimizer = nnx.Optimizer(model, optax_gqc.gnts(optax.sgd(0.1), 0.5), wrt=nnx.Param)
  grads = nnx.as_pure(nnx.grad(lambda m: jnp.sum(m(jnp.ones((1, 6)))))(model))
  with pytest.raises(ValueError, match=r'holds no arrays: with Flax NNX, pass the State'):
    (gqc_nnx.update if fused else lambda o, m, g: o.update(m, g))(optimizer, model, grads)


def test_an_optimizer_over_every_variable_names_the_rng_key():
  model = nnx.Sequential(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), nnx.Dropout(0.1, rngs=nnx.Rngs(1)))
  with pytest.raises(TypeError, match=r"param .*\['key'\].* is a PRNG key.*wrt=nnx.Param"):
    nnx.Optimizer(model, optax_gqc.gnts(optax.sgd(0.1)), wrt=nnx.Variable)


def test_the_model_and_the_optimizer_swapped_raise():
  model = mlp()
  optimizer = nnx.Optimizer(model, optax_gqc.gnts(optax.sgd(0.1)), wrt=nnx.Param)
  grads = nnx.grad(lambda m: jnp.sum(m(jnp.ones((1, 6)))))(model)
  with pytest.raises(TypeError, match=r'\(optimizer, model, grads\).*Sequential'):
    gqc_nnx.update(model, optimizer, grads)


def test_the_loss_by_position_is_told_to_go_by_keyword():
  model = mlp()
  optimizer = nnx.Optimizer(model, optax_gqc.mht(optax.sgd(0.1), 0.9, 0.05), wrt=nnx.Param)
  grads = nnx.grad(lambda m: jnp.sum(m(jnp.ones((1, 6)))))(model)
  with pytest.raises(TypeError, match=r'update takes the loss as a keyword, value=loss'):
    gqc_nnx.update(optimizer, model, grads, 1.0)  # torch's step(loss)
  gqc_nnx.update(optimizer, model, grads, value=1.0)
  assert int(optax_gqc.statistics(optimizer.opt_state)['num_microbatches']) == 1
