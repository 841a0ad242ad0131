"""Decisions of the GNS, MHT and norm-test gates against float64 references of their rules."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

import optax_gqc
from optax_gqc import gates, schedules

PARAMS = {'w': jnp.zeros(6)}


def scaled_stream(scales, seed=0):
  """Gradients of chosen norms, in random directions (host arrays: slicing them costs nothing)."""
  keys = jax.random.split(jax.random.key(seed), len(scales))
  v = np.asarray(jax.vmap(lambda k: jax.random.normal(k, (6,)))(keys))
  v = np.asarray(scales, np.float32)[:, None] * v / np.linalg.norm(v, axis=1, keepdims=True)
  return [{'w': w} for w in v]


def decisions(tx, grads, losses=None):
  """Whether each microbatch stepped, and the last state: one jitted scan over the stream."""

  def body(state, x):
    g, loss = x
    kwargs = {} if losses is None else {'value': loss}
    _, new_state = tx.update(g, state, PARAMS, **kwargs)
    now, before = (optax_gqc.statistics(s)['num_steps'] for s in (new_state, state))
    return new_state, now > before

  stream = (
      jax.tree.map(lambda *xs: np.stack(xs), *grads),
      jnp.zeros(len(grads)) if losses is None else jnp.asarray(losses),
  )
  state, steps = jax.jit(lambda s, xs: jax.lax.scan(body, s, xs))(tx.init(PARAMS), stream)
  return [bool(x) for x in steps], state


def reference(rule, values, max_draws):
  """Replays a stepping rule over a list of per-microbatch values (the reference loop)."""
  out, history = [], []
  for t, v in enumerate(values):
    history.append(v)
    step = rule(history, t) or len(history) >= max_draws
    out.append(step)
    if step:
      history = []
  return out


def test_noise_ratio_gate_matches_torch_gqc_rule():
  rng = np.random.default_rng(0)
  norms = rng.uniform(0.5, 1.5, 300).astype(np.float32)
  grads = scaled_stream(norms)
  tol = lambda t: 0.02 + 0.001 * (t % 7)  # noqa: E731

  def rule(h, t):
    h = np.asarray(h, np.float64)
    if len(h) < 2:
      return False  # torch.var of one value is NaN
    return np.var(h, ddof=1) / (np.mean(h**2) + 1e-8) <= len(h) * tol(t)

  ours, _ = decisions(optax_gqc.gns(optax.sgd(0.1), tolerance=tol, max_draws=16), grads)
  ref = reference(rule, [float(np.linalg.norm(np.asarray(g['w']))) for g in grads], 16)
  assert ours == ref
  assert 0 < sum(ours) < len(ours)


def test_noise_ratio_and_norm_test_never_step_on_one_microbatch():
  grads = scaled_stream([1.0] * 5)
  for tx in (
      optax_gqc.gns(optax.sgd(0.1), tolerance=1e9),
      optax_gqc.norm_test_accumulation(optax.sgd(0.1), eta=1e9),
  ):
    assert decisions(tx, grads)[0] == [False, True, False, True, False]


def test_loss_interval_gate_matches_torch_gqc_rule():
  rng = np.random.default_rng(1)
  losses = (2.0 + 0.3 * rng.standard_normal(300)).astype(np.float32)
  conf = schedules.cosine_with_warmup(0.9, 0.9, 20, 300)
  error = schedules.cosine_with_warmup(0.08, 0.08, 20, 300)
  grads = scaled_stream(np.ones(300))
  running = []

  def rule(history, t):
    loss = float(history[-1])
    running.append(loss if not running else running[-1] * 0.99 + loss * 0.01)
    judged = np.asarray([running[-1]] + history, np.float64)
    mean = judged.mean()
    c, p = float(conf(t)), float(error(t))
    low, high = stats.t.interval(c, len(judged) - 1, loc=mean, scale=stats.sem(judged) + 1e-12)
    return not (low < mean * (1 - p) or high > mean * (1 + p))

  tx = optax_gqc.mht(optax.sgd(0.1), confidence=conf, percent_error=error, max_draws=32)
  ours, state = decisions(tx, grads, losses)
  ref = reference(rule, [float(x) for x in losses], 32)
  assert ours == ref
  assert 20 < sum(ours) < 290  # the warmup steps every time, then it accumulates
  stats_now = optax_gqc.statistics(state)
  assert float(stats_now['loss_ema']) == pytest.approx(running[-1], rel=1e-5)
  assert float(stats_now['confidence']) == pytest.approx(0.9)


def test_loss_interval_needs_the_loss():
  tx = optax_gqc.mht(optax.sgd(0.1), confidence=0.9, percent_error=0.1)
  with pytest.raises(ValueError, match='value=loss'):
    jax.jit(tx.update)({'w': jnp.ones(6)}, tx.init(PARAMS), PARAMS)


def test_norm_test_gate_matches_its_formula():
  rng = np.random.default_rng(2)
  signal = np.full(6, 0.3, np.float32)
  grads = [{'w': signal + rng.standard_normal(6).astype(np.float32)} for _ in range(300)]

  def rule(history, t):
    g = np.asarray(history, np.float64)
    n = len(g)
    if n < 2:
      return False
    mean = g.mean(0)
    trace = np.sum((g - mean) ** 2) / (n - 1)
    return trace / n <= 0.8**2 * np.sum(mean**2)

  ours, _ = decisions(
      optax_gqc.norm_test_accumulation(optax.sgd(0.1), eta=0.8, max_draws=40), grads
  )
  assert ours == reference(rule, [np.asarray(g['w']) for g in grads], 40)
  assert 5 < sum(ours) < 150


@pytest.mark.slow
def test_gns_and_mht_recipes_schedule_their_gates():
  grads = scaled_stream(np.ones(12))
  tx = optax_gqc.gns_with_cosine_schedule(1e-2, 0.1, 0.01, total_steps=12, warmup_steps=4)
  _, state = decisions(tx, grads)
  assert float(optax_gqc.statistics(state)['tolerance']) == pytest.approx(
      float(schedules.cosine_with_inverse_warmup(0.1, 0.01, 4, 12, 10.0)(11))
  )
  tx = optax_gqc.gns_default(1e-2, 0.05, total_steps=12, warmup_steps=4)
  _, state = decisions(tx, grads[:2])
  assert float(optax_gqc.statistics(state)['tolerance']) == pytest.approx(0.05 * (20 - 19 / 4))
  tx = optax_gqc.mht_with_warmup_schedule(1e-2, 0.95, 0.1, total_steps=12, warmup_steps=4)
  _, state = decisions(tx, grads[:3], losses=[1.0, 1.1, 0.9])
  stats_now = optax_gqc.statistics(state)
  assert float(stats_now['confidence']) == pytest.approx(0.95 * 2 / 4)
  assert float(stats_now['percent_error']) == pytest.approx(0.1 * 2 / 4)
  lr = float(optax.tree.get(state, 'hyperparams')['learning_rate'])
  assert lr == pytest.approx(float(schedules.cosine_with_warmup(1e-2, 0.0, 4, 12)(2)))


@pytest.mark.parametrize(
    'make, match',
    [
        (lambda: gates.noise_ratio_below(-1.0), 'tolerance'),
        (lambda: gates.loss_interval(0.9, -0.1), 'percent_error'),
        (lambda: gates.loss_interval(0.9, 0.1, decay=1.5), 'decay'),
        (lambda: gates.relative_error_below(float('nan')), 'eta'),
        (lambda: optax_gqc.noise_scale(decay=-0.1, axis_name='d'), 'decay'),
        (
            lambda: optax_gqc.accumulate(optax.sgd(1.0), gates.norm_below(1.0), noise_decay=1.0),
            'noise_decay',
        ),
    ],
)
def test_bad_arguments(make, match):
  with pytest.raises(ValueError, match=match):
    make()
