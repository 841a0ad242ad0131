"""The replay harness: one gradient stream through torch and optax_gqc side by side."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_gqc

torch = pytest.importorskip('torch')
from optax_gqc.interop import torch_replay  # noqa: E402


def _stream(n, shape=(3,)):
  rng = np.random.default_rng(0)
  return [{'w': jnp.asarray(rng.normal(size=shape).astype(np.float32))} for _ in range(n)]


def test_replay_agrees_for_the_same_optimizer_and_finds_a_difference():
  params = {'w': jnp.ones(3)}
  stream = _stream(20)
  same = torch_replay.replay(
      lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
      optax.sgd(0.1, momentum=0.9),
      params,
      stream,
  )
  assert len(same) == 20 and all(r.torch_stepped and r.optax_stepped for r in same)
  assert torch_replay.first_divergence(same) is None

  other = torch_replay.replay(
      lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
      optax.sgd(0.1, momentum=0.8),
      params,
      stream,
  )
  d = torch_replay.first_divergence(other)
  assert d.index == 1 and d.what.startswith("param 'w'")  # step 0 has no momentum yet
  assert 'microbatch 1' in str(d)


def test_replay_runs_both_sides_in_the_dtype_jax_gives():
  # NumPy's float64 is float32 to JAX while jax_enable_x64 is off: torch takes the same.
  params = {'w': np.array([1.0, 1 + 1e-9])}
  seen = []

  def torch_side(ps):
    seen.append(ps[0].dtype)
    return torch.optim.SGD(ps, lr=0.1)

  records = torch_replay.replay(torch_side, optax.sgd(0.1), params, [{'w': np.ones(2)}])
  assert seen == [torch.float32]
  assert torch_replay.first_divergence(records) is None


@pytest.mark.parametrize(
    'torch_w, optax_w, where',
    [
        ([1.0, np.inf], [1.0, np.inf], None),  # equal infinities agree
        ([1.0, np.inf], [5.0, np.inf], (1.0, 5.0)),  # an inf does not widen the tolerance
        ([np.inf, 1.0], [0.0, 1.0], (np.inf, 0.0)),
        ([-np.inf, 1.0], [np.inf, 1.0], (-np.inf, np.inf)),
        ([np.nan, 1.0], [np.nan, 1.0], None),
    ],
)
def test_first_divergence_compares_infinities_exactly(torch_w, optax_w, where):
  record = torch_replay.Record(
      0, None, True, True, {'w': np.array(torch_w)}, {'w': np.array(optax_w)}, {}, {}, {}, {}
  )
  d = torch_replay.first_divergence([record])
  assert (d if d is None else (d.torch_value, d.optax_value)) == where


@pytest.mark.parametrize(
    'kwargs, error, match',
    [
        ({'atol': True}, TypeError, 'atol must be a number, got bool'),  # read as 1.0
        ({'rtol': np.inf}, ValueError, 'rtol must be a finite number >= 0'),  # all agree
        ({'rtol': -1e-5}, ValueError, 'rtol must be a finite number >= 0'),
        ({'rtol': '1e-5'}, TypeError, 'rtol must be a number, got str'),
        ({'compare_params': 'no'}, TypeError, 'compare_params must be True or False'),
    ],
)
def test_first_divergence_refuses_tolerances_that_would_agree_on_anything(kwargs, error, match):
  record = torch_replay.Record(
      0, None, True, True, {'w': np.array([0.95])}, {'w': np.array([0.75])}, {}, {}, {}, {}
  )
  assert torch_replay.first_divergence([record]) is not None
  with pytest.raises(error, match=match):
    torch_replay.first_divergence([record], **kwargs)


def _stat_record(name, torch_value, optax_value, optax_name=None):
  optax_stats = {optax_name or name: optax_value}
  return torch_replay.Record(0, None, True, True, {}, {}, {name: torch_value}, optax_stats, {}, {})


def test_first_divergence_scales_the_scalar_tolerance_by_the_torch_value():
  def record(torch_value, optax_value):
    return _stat_record('last_grad_norm', torch_value, optax_value)

  # |1 - 2| > 0.5 * |torch| = 0.5: they differ; |2 - 1| <= 0.5 * 2: they agree.
  assert torch_replay.first_divergence([record(1.0, 2.0)], rtol=0.5, atol=0.0) is not None
  assert torch_replay.first_divergence([record(2.0, 1.0)], rtol=0.5, atol=0.0) is None


def test_first_divergence_compares_counts_exactly():
  # At the rtol bfloat16 wants, 150 and 149 microbatches agreed.
  for torch_name, optax_name in (('num_batches', 'num_microbatches'), ('num_draws', None)):
    d = torch_replay.first_divergence([_stat_record(torch_name, 150, 149, optax_name)], rtol=1e-2)
    assert d is not None and d.what.startswith(f"stat '{torch_name}")
  assert torch_replay.first_divergence([_stat_record('num_steps', 150, 150.0)], rtol=0) is None


def test_first_divergence_compares_shapes_and_names():
  # Broadcasting compared (3,) with (1, 3) as equal: a transformation adding an axis passed.
  def record(optax_params):
    return torch_replay.Record(0, None, True, True, {'w': np.ones(3)}, optax_params, {}, {}, {}, {})

  d = torch_replay.first_divergence([record({'w': np.ones((1, 3))})])
  assert (d.what, d.torch_value, d.optax_value) == ("param 'w' shape", (3,), (1, 3))
  d = torch_replay.first_divergence([record({'w': np.ones(1) * 2})])  # was an IndexError
  assert d.what == "param 'w' shape"
  d = torch_replay.first_divergence([record({})])  # was a KeyError
  assert (d.what, d.optax_value) == ("param 'w'", 'missing')
  d = torch_replay.first_divergence([record({'w': np.ones(3), 'extra': np.ones(1)})])
  assert (d.what, d.torch_value) == ("param 'extra'", 'missing')  # was left out
  scalar = torch_replay.Record(
      0, None, True, True, {'s': np.array(1.0)}, {'s': np.array(2.0)}, {}, {}, {}, {}
  )
  assert torch_replay.first_divergence([scalar]).what == "param 's'"  # was "param 's'[]"


def test_replay_gives_both_sides_the_gradient_in_the_parameter_dtype():
  # Torch took float32 gradients cast to float16, Optax as they were: the same Adam
  # diverged at microbatch 0.
  params = {'w': jnp.ones(3, jnp.float16)}
  stream = [{'w': jnp.full(3, 1e-8, jnp.float32)}] * 2
  records = torch_replay.replay(
      lambda ps: torch.optim.Adam(ps, lr=0.1, eps=1e-7), optax.adam(0.1, eps=1e-7), params, stream
  )
  assert torch_replay.first_divergence(records, rtol=1e-3) is None
  with pytest.raises(
      OverflowError, match=r"microbatch 0\['w'\] holds finite values beyond the largest float16"
  ):
    torch_replay.replay(
        lambda ps: torch.optim.SGD(ps, lr=0.1), optax.sgd(0.1), params, [{'w': jnp.full(3, 1e6)}]
    )


def test_replay_takes_torch_tensors_as_a_torch_user_has_them():
  # A model's parameters (which require grad) and gradients as torch tensors: the first raised
  # "Can't call numpy() on Tensor that requires grad", the second after torch had stepped.
  layer = torch.nn.Linear(3, 1)
  stream = _stream(6, (1, 3))

  def run(params, grads):
    return torch_replay.replay(
        lambda ps: torch.optim.SGD(ps, lr=0.1), optax.sgd(0.1), params, grads
    )

  as_torch = run(
      dict(layer.named_parameters()),
      [{'weight': torch.tensor(np.asarray(g['w'])), 'bias': torch.ones(1)} for g in stream],
  )
  as_jax = run(
      {n: jnp.asarray(p.detach().numpy()) for n, p in layer.named_parameters()},
      [{'weight': g['w'], 'bias': jnp.ones(1)} for g in stream],
  )
  assert torch_replay.first_divergence(as_torch) is None
  for a, b in zip(as_torch, as_jax, strict=True):
    assert all(np.array_equal(a.optax_params[k], b.optax_params[k]) for k in a.optax_params)
    assert all(np.array_equal(a.torch_params[k], b.torch_params[k]) for k in a.torch_params)


def test_replay_reports_step_decisions_and_statistics():
  params = {'w': jnp.ones(3)}
  # Ours accumulates two microbatches per step; a plain torch optimizer steps every time.
  records = torch_replay.replay(
      lambda ps: torch.optim.SGD(ps, lr=0.1),
      optax_gqc.sbc(optax.sgd(0.1), 2, 1),
      params,
      _stream(4),
  )
  assert [r.optax_stepped for r in records] == [False, True, False, True]
  assert [r.optax_stats['num_draws'] for r in records] == [1, 0, 1, 0]
  assert records[0].torch_hyperparams['lr'] == 0.1
  d = torch_replay.first_divergence(records)
  assert (d.index, d.what, d.torch_value, d.optax_value) == (0, 'step', 'stepped', 'accumulated')


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
  records = torch_replay.replay(
      lambda ps: torch.optim.SGD(ps, lr=0.1),
      optax_gqc.accumulate(optax.sgd(0.1), gate),
      {'w': jnp.ones(3)},
      _stream(4),
      losses,
      torch_step=torch_step,
  )
  assert seen_torch == losses
  assert [r.optax_stats['loss'] for r in records] == pytest.approx(losses)
  assert [r.optax_stepped for r in records] == [False, False, True, False]
  with pytest.raises(ValueError, match='losses ran out'):
    torch_replay.replay(
        lambda ps: torch.optim.SGD(ps, lr=0.1),
        optax.sgd(0.1),
        {'w': jnp.ones(3)},
        _stream(2),
        [1.0],
    )


def test_first_divergence_names_a_momentum_that_differs_before_the_params_do():
  params = {'w': np.linspace(-1.0, 1.0, 3).astype(np.float32)}
  records = torch_replay.replay(
      lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5),
      optax.inject_hyperparams(optax.sgd)(learning_rate=0.1, momentum=0.9),
      params,
      _stream(3),
  )
  found = torch_replay.first_divergence(records)
  assert (found.index, found.what) == (0, "hyperparam 'momentum'")
  assert (found.torch_value, found.optax_value) == pytest.approx((0.5, 0.9))


@pytest.mark.parametrize(
    'params, grads, error, match',
    [
        (
            {'layer': {'w': np.ones(2)}},
            [{'layer': {'w': np.ones(2)}}],
            TypeError,
            r"params\['layer'\] is dict, not an array",
        ),
        ([np.ones(2)], [[np.ones(2)]], TypeError, 'params must be a flat'),
        (
            {'w': np.ones(2), 'b': np.ones(1)},
            [{'w': np.ones(2), 'b': None}],
            TypeError,
            r"microbatch 0\['b'\] is None, not an array",
        ),
        (
            {'w': np.ones(2)},
            [{'w': np.ones(2), 'extra': np.ones(3)}],
            KeyError,
            r"microbatch 0: the names do not match .* unexpected \['extra'\]",
        ),
    ],
    ids=['nested', 'list', 'none_gradient', 'extra_gradient'],
)
def test_replay_names_the_entry_that_is_not_a_flat_dict_of_arrays(params, grads, error, match):
  with pytest.raises(error, match=match):
    torch_replay.replay(lambda ps: torch.optim.SGD(ps, lr=0.1), optax.sgd(0.1), params, grads)
