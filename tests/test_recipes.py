"""Tests of the torch-gqc recipe ports and scheduled_accumulation."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_gqc
from optax_gqc import schedules


def sgd_grads(num, seed=0):
  keys = jax.random.split(jax.random.key(seed), num)
  # Indexed: iterating over a key array compiles an unstack program per length.
  return [{'w': jax.random.normal(keys[i], (6,))} for i in range(num)]


def hyperparams_and_updates(tx, grads):
  params = {'w': jnp.zeros(6)}
  state = tx.init(params)
  update = jax.jit(tx.update)
  out = []
  for g in grads:
    updates, state = update(g, state, params)
    out.append((updates, state))
  return out


def test_gnts_recipe_uses_lr_and_threshold_of_the_microbatch():
  lr = 0.3
  tx = optax_gqc.gnts_with_cosine_schedule(
      lr,
      total_microbatches=40,
      warmup_microbatches=8,
      initial_threshold=1e3,
      final_threshold=1e3,
      optimizer=optax.sgd,
      weight_decay=None,
  )
  grads = sgd_grads(40)
  lr_at = schedules.constant_with_warmup(lr, 8)
  thr_at = schedules.cosine_with_inverse_warmup(1e3, 1e3, 8, 40, 10.0)
  for t, (g, (updates, state)) in enumerate(
      zip(grads, hyperparams_and_updates(tx, grads), strict=True)
  ):
    # the threshold is huge: a step on every microbatch, with the lr of that microbatch
    np.testing.assert_allclose(updates['w'], -float(lr_at(t)) * g['w'], rtol=1e-6, atol=1e-9)
    assert float(optax_gqc.statistics(state)['threshold']) == pytest.approx(float(thr_at(t)))


@pytest.mark.parametrize('conventional', [False, True])
def test_gnts_recipe_schedules_lr_and_weight_decay_per_microbatch(conventional):
  lr, wd = 1e-2, 0.1
  if conventional:
    tx = optax_gqc.gnts_with_cosine_schedule_conventional_lr(
        lr, total_microbatches=30, warmup_microbatches=5, weight_decay=wd
    )
    lr_at = schedules.cosine_with_warmup(lr, 0.0, 5, 30)
    wd_at = lambda t: wd  # noqa: E731
  else:
    tx = optax_gqc.gnts_with_cosine_schedule(lr, 30, 5, weight_decay=wd)
    lr_at = schedules.constant_with_warmup(lr, 5)
    wd_at = schedules.cosine_with_warmup(wd, 0.0, 5, 30)
  for t, (_, state) in enumerate(hyperparams_and_updates(tx, sgd_grads(30))):
    hyper = optax.tree.get(state, 'hyperparams')
    # float32 cosines, computed under jit and eagerly: equal to a few ulps of the base
    assert float(hyper['learning_rate']) == pytest.approx(float(lr_at(t)), abs=1e-6 * lr)
    assert float(hyper['weight_decay']) == pytest.approx(float(wd_at(t)), abs=1e-6 * wd)


@pytest.mark.parametrize('conventional', [False, True])
def test_sbc_recipe_grows_the_logical_batch(conventional):
  make = (
      optax_gqc.sbc_with_polynomial_schedule_conventional_lr
      if conventional
      else optax_gqc.sbc_with_polynomial_schedule
  )
  tx = make(
      1e-2,
      microbatch_size=4,
      initial_batch_size=8,
      final_batch_size=32,
      total_microbatches=60,
      warmup_microbatches=6,
      power=2.0,
  )
  batch_at = schedules.polynomial_with_warmup(8.0, 32.0, 6, 60, 2.0)
  draws, n = [], 0
  for t, (_, state) in enumerate(hyperparams_and_updates(tx, sgd_grads(60))):
    n += 1
    stats = optax_gqc.statistics(state)
    assert float(stats['logical_batch_size']) == pytest.approx(float(batch_at(t)))
    if n * 4 >= float(batch_at(t)):
      draws.append(n)
      n = 0
    assert int(stats['num_draws']) == n
  assert draws[:4] == [1] * 4 and max(draws) == 8  # early on every microbatch, then up to 32/4


@pytest.mark.parametrize('conventional', [False, True])
def test_gnr_recipe_rescales_and_schedules(conventional):
  lr = 0.5
  if conventional:
    tx = optax_gqc.gnr_with_cosine_schedule_conventional_lr(
        lr,
        initial_norm=2.0,
        final_norm=1.0,
        total_microbatches=20,
        warmup_microbatches=4,
        optimizer=optax.sgd,
        weight_decay=None,
    )
    lr_at = schedules.cosine_with_warmup(lr, 0.0, 4, 20)
  else:
    tx = optax_gqc.gnr_with_cosine_schedule(
        lr,
        initial_norm=2.0,
        final_norm=1.0,
        total_microbatches=20,
        warmup_microbatches=4,
        optimizer=optax.sgd,
        weight_decay=None,
    )
    lr_at = schedules.constant_with_warmup(lr, 4)
  norm_at = schedules.cosine_with_warmup(2.0, 1.0, 4, 20)
  for t, (updates, _) in enumerate(hyperparams_and_updates(tx, sgd_grads(20))):
    expected = float(lr_at(t)) * float(norm_at(t))
    assert float(optax.tree.norm(updates)) == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_recipes_reject_scheduled_base_values():
  with pytest.raises(TypeError, match='learning_rate'):
    optax_gqc.gnts_with_cosine_schedule(lambda t: 0.1, 100, 10)
  with pytest.raises(ValueError, match='weight_decay'):
    optax_gqc.gnts_with_cosine_schedule(0.1, 100, 10, weight_decay=-1.0)


# Every recipe: its arguments before the run's counts, and after them.
RECIPES = {
    'gnts': (optax_gqc.gnts_with_cosine_schedule, (1e-2,), {'max_draws': 3}),
    'gnts_conventional_lr': (
        optax_gqc.gnts_with_cosine_schedule_conventional_lr,
        (1e-2,),
        {'max_draws': 3},
    ),
    'gnr': (optax_gqc.gnr_with_cosine_schedule, (1e-2, 2.0, 1.0), {}),
    'gnr_conventional_lr': (
        optax_gqc.gnr_with_cosine_schedule_conventional_lr,
        (1e-2, 2.0, 1.0),
        {},
    ),
    'sbc': (optax_gqc.sbc_with_polynomial_schedule, (1e-2, 4, 8, 16), {}),
    'sbc_conventional_lr': (
        optax_gqc.sbc_with_polynomial_schedule_conventional_lr,
        (1e-2, 4, 8, 16),
        {},
    ),
    'gns': (optax_gqc.gns_with_cosine_schedule, (1e-2, 0.1, 0.05), {'microbatch_size': 4}),
    'gns_default': (optax_gqc.gns_default, (1e-2, 0.1), {'microbatch_size': 4}),
    'mht': (optax_gqc.mht_with_warmup_schedule, (1e-2, 0.9, 0.1), {'max_draws': 3}),
}


@pytest.mark.parametrize('name', sorted(RECIPES))
def test_every_recipe_has_torch_adamws_weight_decay_by_default(name):
  # torch-gqc's factories wrap a torch AdamW, whose default weight decay is 0.01 (optax.adamw's is
  # 1e-4): the scheduled ones warm it up and anneal it, the others keep it constant.
  make, args, kwargs = RECIPES[name]
  scheduled = name in ('gnts', 'gnr', 'sbc')
  tx = make(*args, 20, 4, **kwargs)
  params = {'w': jnp.zeros(6)}
  state = tx.init(params)
  update = jax.jit(tx.update)
  for t, g in enumerate(sgd_grads(20)):
    _, state = update(g, state, params, value=1.0)
    wd = float(optax.tree.get(state, 'hyperparams')['weight_decay'])
    expected = schedules.cosine_with_warmup(0.01, 0.0, 4, 20)(t) if scheduled else 0.01
    assert wd == pytest.approx(float(expected), rel=1e-6, abs=1e-9)
  # None passes no weight decay: an optimizer without one, such as optax.sgd.
  tx = make(*args, 20, 4, **kwargs, optimizer=optax.sgd, weight_decay=None)
  assert 'weight_decay' not in optax.tree.get(tx.init(params), 'hyperparams')
  with pytest.raises(TypeError, match='weight_decay=None'):
    make(*args, 20, 4, **kwargs, optimizer=optax.sgd)


@pytest.mark.parametrize('name', ['max_draws', 'microbatch_size', 'skip_nonfinite'])
def test_a_gnr_recipe_given_an_accumulations_argument_says_gnr_has_none(name):
  with pytest.raises(TypeError, match=f"{name} is an accumulation's argument.*A GNR recipe"):
    optax_gqc.gnr_with_cosine_schedule(1e-3, 1.0, 0.5, 100, 10, **{name: 8})


def test_an_accumulating_recipe_given_noise_decay_names_scheduled_accumulation():
  with pytest.raises(TypeError, match=r'keep noise_decay at 0.99.*scheduled_accumulation'):
    optax_gqc.gnts_with_cosine_schedule(1e-3, 1000, 100, noise_decay=0.999)


def _params_after(tx, grads):
  params = {'w': jnp.linspace(-1.0, 1.0, 6)}
  state = tx.init(params)
  update = jax.jit(tx.update)
  out = []
  for g in grads:
    updates, state = update(g, state, params, value=jnp.sum(g['w'] ** 2))
    params = optax.apply_updates(params, updates)
    out.append(params['w'])
  return np.stack(out)


def _program(tx):
  """``tx``'s state and traced update on a fixed input: equal programs give equal numbers."""
  params = {'w': jnp.zeros(6)}
  state = tx.init(params)
  closed = jax.make_jaxpr(tx.update)(params, state, params, value=1.0)
  return state, str(closed.jaxpr), closed.consts


@pytest.mark.parametrize('name', sorted(RECIPES))
def test_the_former_names_of_the_counts_build_the_same_recipe(name):
  make, args, kwargs = RECIPES[name]
  by_position = make(*args, 20, 4, **kwargs)
  by_name = make(*args, total_microbatches=20, warmup_microbatches=4, **kwargs)
  by_alias = make(*args, total_steps=20, warmup_steps=4, **kwargs)
  mixed = make(*args, 20, warmup_steps=4, **kwargs)
  # The same init state and the same traced program, constants included, as by position.
  state, jaxpr, consts = _program(by_position)
  for tx in (by_name, by_alias, mixed):
    got_state, got_jaxpr, got_consts = _program(tx)
    chex.assert_trees_all_equal(got_state, state)
    assert got_jaxpr == jaxpr
    chex.assert_trees_all_equal(got_consts, consts)
  # The schedules end at the count however it was passed: a shorter run anneals sooner.
  grads = [{'w': g['w'] + 0.3} for g in sgd_grads(24, seed=5)]
  assert not np.array_equal(
      _params_after(make(*args, total_steps=10, warmup_steps=4, **kwargs), grads),
      _params_after(by_position, grads),
  )


@pytest.mark.parametrize('name', sorted(RECIPES))
def test_a_count_passed_under_both_names_raises(name):
  make, args, kwargs = RECIPES[name]
  with pytest.raises(TypeError, match='total_microbatches and total_steps are one argument'):
    make(*args, 20, 4, total_steps=20, **kwargs)
  with pytest.raises(TypeError, match='warmup_microbatches and warmup_steps are one argument'):
    make(*args, total_microbatches=20, warmup_microbatches=4, warmup_steps=4, **kwargs)


@pytest.mark.parametrize('name', sorted(RECIPES))
def test_a_missing_count_is_named_with_its_alias(name):
  make, args, kwargs = RECIPES[name]
  with pytest.raises(TypeError, match=r'missing the argument total_microbatches .*total_steps'):
    make(*args, warmup_microbatches=4, **kwargs)
  with pytest.raises(TypeError, match=r'missing the argument warmup_microbatches .*warmup_steps'):
    make(*args, total_steps=20, **kwargs)


def test_a_bad_count_is_named_as_it_was_passed():
  make = optax_gqc.gnts_with_cosine_schedule
  with pytest.raises(ValueError, match='^total_microbatches must be an int >= 0, got 2.5'):
    make(1e-2, 2.5, 1)
  with pytest.raises(ValueError, match='^total_steps must be an int >= 0, got 2.5'):
    make(1e-2, total_steps=2.5, warmup_steps=1)
  with pytest.raises(ValueError, match='^warmup_microbatches must be an int >= 0, got -1'):
    make(1e-2, 10, -1)
  with pytest.raises(ValueError, match='Pass warmup_microbatches <= total_microbatches$'):
    make(1e-2, 10, 11)
  with pytest.raises(ValueError, match='Pass warmup_steps <= total_microbatches$'):
    make(1e-2, 10, warmup_steps=11)


def test_scheduled_accumulation_follows_microbatches_not_steps():
  lr_at = lambda t: 0.1 * (t + 1.0)  # noqa: E731
  tx = optax_gqc.scheduled_accumulation(
      optax.sgd,
      optax_gqc.gates.batch_size_at_least(2, 1),
      {'learning_rate': lr_at},
      max_draws=4,
      microbatch_size=1,
  )
  grads = sgd_grads(6)
  out = hyperparams_and_updates(tx, grads)
  for t, (updates, _) in enumerate(out):
    if t % 2 == 1:  # steps on microbatches 1, 3, 5 with the lr of that microbatch
      mean = (grads[t - 1]['w'] + grads[t]['w']) / 2
      np.testing.assert_allclose(updates['w'], -lr_at(t) * mean, rtol=1e-5)
    else:
      assert not np.any(np.asarray(updates['w']))
  assert int(optax_gqc.statistics(out[-1][1])['num_steps']) == 3


# Every accumulation recipe, with the engine arguments it forwards.
def accumulation_recipes(**engine):
  return {
      'gnts': optax_gqc.gnts_with_cosine_schedule(1e-2, 20, 4, microbatch_size=4, **engine),
      'gnts_conventional_lr': optax_gqc.gnts_with_cosine_schedule_conventional_lr(
          1e-2, 20, 4, microbatch_size=4, **engine
      ),
      'sbc': optax_gqc.sbc_with_polynomial_schedule(1e-2, 4, 8, 16, 20, 4, **engine),
      'sbc_conventional_lr': optax_gqc.sbc_with_polynomial_schedule_conventional_lr(
          1e-2, 4, 8, 16, 20, 4, **engine
      ),
      'gns': optax_gqc.gns_with_cosine_schedule(
          1e-2, 0.1, 0.05, 20, 4, microbatch_size=4, **engine
      ),
      'gns_default': optax_gqc.gns_default(1e-2, 0.1, 20, 4, microbatch_size=4, **engine),
      'mht': optax_gqc.mht_with_warmup_schedule(1e-2, 0.9, 0.1, 20, 4, microbatch_size=4, **engine),
      'scheduled_accumulation': optax_gqc.scheduled_accumulation(
          optax.adamw,
          optax_gqc.gates.norm_below(0.5),
          {'learning_rate': lambda t: 1e-2},
          microbatch_size=4,
          **engine,
      ),
  }


RECIPE_NAMES = sorted(accumulation_recipes())


@pytest.mark.parametrize('name', RECIPE_NAMES)
def test_recipes_forward_the_engine_arguments(name):
  tx = accumulation_recipes(accumulator_dtype=jnp.bfloat16, skip_nonfinite=False)[name]
  params = {'w': jnp.zeros(6)}
  state = tx.init(params)
  assert state.accumulator['w'].dtype == jnp.bfloat16
  # The noise scale is reported in examples: the SBC recipes pass their microbatch size.
  assert int(optax_gqc.statistics(state)['microbatch_size']) == 4
  nan = {'w': jnp.full(6, jnp.nan)}
  _, state = jax.jit(tx.update)(nan, state, params, value=1.0)
  assert int(optax_gqc.statistics(state)['num_skipped']) == 0  # skip_nonfinite=False


@pytest.mark.parametrize('name', sorted(accumulation_recipes()))
def test_recipes_scale_their_steps_by_draws_when_asked(name):
  # Forced steps of 2 microbatches (max_draws=2): scale_by_draws=lambda n: 0 * n
  # zeroes every update, None (the default) leaves them as they are.
  grads = {'w': jnp.full(6, 1.0)}
  params = {'w': jnp.zeros(6)}
  for scale, moved in ((None, True), (lambda n: 0 * n, False)):
    tx = accumulation_recipes(max_draws=2, scale_by_draws=scale)[name]
    state = tx.init(params)
    total = jnp.zeros(6)
    for _ in range(4):
      updates, state = jax.jit(tx.update)(grads, state, params, value=1.0)
      total = total + updates['w']
    assert int(state.num_steps) >= 1
    assert bool(jnp.any(total != 0)) == moved, scale


def bf16_recipes():
  return {
      **accumulation_recipes(),
      'gnr': optax_gqc.gnr_with_cosine_schedule(1e-2, 2.0, 1.0, 20, 4),
      'gnr_conventional_lr': optax_gqc.gnr_with_cosine_schedule_conventional_lr(
          1e-2, 2.0, 1.0, 20, 4
      ),
  }


@pytest.mark.parametrize('name', sorted(bf16_recipes()))
def test_recipes_train_bf16_params_without_nan(name):
  # inject_hyperparams would keep the hyperparameters in the params' dtype,
  # where adamw's b2=0.999 rounds to 1 and its update is NaN.
  tx = bf16_recipes()[name]
  params = start = {'w': jnp.linspace(-1.0, 1.0, 6).astype(jnp.bfloat16)}
  update = jax.jit(tx.update)
  state = tx.init(params)
  for g in sgd_grads(12):
    updates, state = update(
        jax.tree.map(lambda x: x.astype(jnp.bfloat16), g), state, params, value=1.0
    )
    assert all(np.isfinite(np.asarray(u, np.float32)).all() for u in jax.tree.leaves(updates))
    params = optax.apply_updates(params, updates)
  hyper = optax.tree.get(state, 'hyperparams')
  assert hyper['b2'].dtype == jnp.float32 and float(hyper['b2']) == pytest.approx(0.999)
  # The float32 b1 would make adamw's bf16 mu float32: a retrace, and lax.scan fails.
  init = tx.init(start)
  assert jax.tree.map(lambda x: x.dtype, state) == jax.tree.map(lambda x: x.dtype, init)
  assert params['w'].dtype == jnp.bfloat16
  assert np.any(np.asarray(params['w'] != start['w']))  # it trained


def _decay_matrices(params):
  return jax.tree.map(lambda x: x.ndim > 1, params)


def _gnr_recipe(**kw):
  return optax_gqc.gnr_with_cosine_schedule(0.1, 1.0, 1.0, 100, 0, **kw)


@pytest.mark.parametrize(
    'make',
    [
        lambda **kw: optax_gqc.scheduled_accumulation(
            optax.adamw,
            optax_gqc.gates.batch_size_at_least(1, 1),
            {'learning_rate': lambda t: 0.1},
            **kw,
        ),
        lambda **kw: optax_gqc.sbc_with_polynomial_schedule(
            0.1, 1, 1.0, 1.0, total_microbatches=100, warmup_microbatches=0, **kw
        ),
        _gnr_recipe,
    ],
    ids=['scheduled_accumulation', 'sbc_recipe', 'gnr_recipe'],
)
def test_an_optimizer_argument_given_as_a_function_reaches_the_optimizer(make):
  # inject_hyperparams takes any function for a schedule: adamw's mask, a
  # function of the params, would be called on the step count.
  params = {'w': jnp.ones((2, 2)), 'b': jnp.ones(2)}
  zero = jax.tree.map(jnp.zeros_like, params)  # only the weight decay moves the params
  tx = make(weight_decay=0.5, mask=_decay_matrices, mu_dtype=jnp.bfloat16)
  state = tx.init(params)
  assert optax.tree.get(state, 'mu')['w'].dtype == jnp.bfloat16
  for _ in range(3):
    updates, state = jax.jit(tx.update)(zero, state, params)
    params = optax.apply_updates(params, updates)
  assert np.all(np.asarray(params['w']) < 1.0)  # decayed
  np.testing.assert_array_equal(params['b'], np.ones(2))  # masked out
  # Another function would be a schedule of the optimizer's steps, as inject_hyperparams makes
  # it: in an accumulation, whose steps the gate paces, it is refused (the recipes say their
  # schedules follow the microbatches). gnr steps on every microbatch: both clocks are one.
  b1 = lambda count: jnp.where(count < 2, 0.5, 0.25)  # noqa: E731
  if make is _gnr_recipe:
    tx = make(b1=b1)
    state = tx.init(params)
    for _ in range(3):
      _, state = jax.jit(tx.update)(zero, state, params)
    assert float(optax.tree.get(state, 'hyperparams')['b1']) == 0.25
  else:
    with pytest.raises(TypeError, match=r"b1 is a function.*hyperparams \({'b1': schedule}\)"):
      make(b1=b1)


def test_scheduled_accumulation_passes_what_static_args_names_as_it_is():
  # A function that is no schedule (here, what the optimizer does to each update) reaches the
  # optimizer unchanged when static_args names it, as in optax.inject_hyperparams.
  def sign_sgd(learning_rate, transform):
    return optax.chain(
        optax.stateless(lambda u, _: jax.tree.map(transform, u)), optax.sgd(learning_rate)
    )

  params, g = {'w': jnp.zeros(2)}, {'w': jnp.array([3.0, -0.5])}
  with pytest.raises(TypeError, match=r"transform is a function.*static_args=\('transform',\)"):
    optax_gqc.scheduled_accumulation(
        sign_sgd, optax_gqc.gates.batch_size_at_least(1, 1), {}, transform=jnp.sign
    )
  with pytest.raises(ValueError, match=r"static_args names \['transfrom'\]"):
    optax_gqc.scheduled_accumulation(
        sign_sgd,
        optax_gqc.gates.batch_size_at_least(1, 1),
        {},
        static_args='transfrom',
        transform=jnp.sign,
    )
  tx = optax_gqc.scheduled_accumulation(
      sign_sgd,
      optax_gqc.gates.batch_size_at_least(1, 1),
      {'learning_rate': lambda t: jnp.where(t < 1, 1.0, 0.5)},
      static_args='transform',
      transform=jnp.sign,
  )
  state = tx.init(params)
  for lr in (1.0, 0.5):
    updates, state = jax.jit(tx.update)(g, state, params)
    np.testing.assert_array_equal(updates['w'], [-lr, lr])


def _run_params(tx, grads, before=None):
  """Parameters after each microbatch of the fused path; ``before`` edits the state first."""
  params, state = {'w': jnp.zeros(6)}, tx.init({'w': jnp.zeros(6)})

  @jax.jit
  def step(params, state, g):
    if before is not None:
      state = before(state)
    return optax_gqc.update_and_apply(tx, g, state, params)

  out = []
  for g in grads:
    params, state = step(params, state, g)
    out.append(params['w'])
  return np.stack(out), state


def test_schedules_in_tokens_run_through_gnts_as_scheduled_accumulation_does():
  # The documented recipe: gnts around an injected adamw, its learning rate
  # a schedule of microbatches, equals scheduled_accumulation with gnts's gate.
  schedule = optax.warmup_cosine_decay_schedule(0.0, 0.1, 5, 80)
  grads = [{'w': 3.0 * g['w'] + 1.0} for g in sgd_grads(80, seed=3)]  # B ~ 9 microbatches
  reference = optax_gqc.scheduled_accumulation(
      optax.adamw,
      optax_gqc.gates.critical_batch(0.5, 1, min_batch_size=2),
      {'learning_rate': schedule},
      scale_by_draws=jnp.sqrt,
  )
  inner = optax.inject_hyperparams(optax.adamw)(learning_rate=schedule(0))
  recipe = optax_gqc.schedule_by_microbatch(optax_gqc.gnts(inner), learning_rate=schedule)
  by_hand = optax_gqc.gnts(inner)  # the same, written out before each update

  def set_lr(state):
    return optax.tree.set(
        state, learning_rate=schedule(optax.tree.get(state, 'num_microbatches')).astype(jnp.float32)
    )

  want, want_state = _run_params(reference, grads)
  for tx, before in ((recipe, None), (by_hand, set_lr)):
    got, state = _run_params(tx, grads, before)
    np.testing.assert_array_equal(got, want)
    assert int(state.num_steps) == int(want_state.num_steps) < 40  # it accumulated
  # The learning rate of the last step is the schedule's at its microbatch.
  assert float(optax.tree.get(state, 'learning_rate')) == pytest.approx(float(schedule(79)))


def test_a_fixed_batch_schedule_in_tokens_is_a_schedule_of_steps():
  # With k microbatches per step, step j runs at microbatch k (j + 1) - 1: a
  # schedule of microbatches is the schedule of steps j -> s(k (j + 1) - 1).
  k, schedule = 4, optax.cosine_decay_schedule(0.1, 64)
  grads = sgd_grads(64, seed=4)
  inner = optax.inject_hyperparams(optax.adamw)(learning_rate=schedule(0))
  tokens = optax_gqc.schedule_by_microbatch(optax_gqc.sbc(inner, k, 1), learning_rate=schedule)
  steps = optax_gqc.sbc(optax.adamw(lambda j: schedule(k * (j + 1) - 1)), k, 1)
  got, _ = _run_params(tokens, grads)
  want, _ = _run_params(steps, grads)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)  # float32 rounding of the rate


def test_schedule_by_microbatch_needs_an_injected_hyperparameter():
  with pytest.raises(TypeError, match='takes an accumulation'):
    optax_gqc.schedule_by_microbatch(optax.adamw(0.1), learning_rate=lambda t: 0.1)
  with pytest.raises(TypeError, match='must be a schedule'):
    optax_gqc.schedule_by_microbatch(optax_gqc.gnts(optax.adamw(0.1)), learning_rate=0.1)
  tx = optax_gqc.schedule_by_microbatch(
      optax_gqc.gnts(optax.adamw(0.1)), learning_rate=lambda t: 0.1
  )
  params = {'w': jnp.zeros(2)}
  with pytest.raises(ValueError, match='inject_hyperparams'):
    tx.update(params, tx.init(params), params)
  # An integer placeholder (learning_rate=0) would hold the schedule as int32: 0.
  inner = optax.inject_hyperparams(optax.adamw)(learning_rate=0)
  tx = optax_gqc.schedule_by_microbatch(optax_gqc.gnts(inner), learning_rate=lambda t: 3e-3)
  with pytest.raises(TypeError, match=r"holds 'learning_rate' as int32.*learning_rate=0.0"):
    tx.update(params, tx.init(params), params)
  # A gate's hyperparameter: the gate takes the schedule, not inject_hyperparams.
  tx = optax_gqc.schedule_by_microbatch(
      optax_gqc.gnts(optax.adamw(0.1), threshold=0.1), threshold=lambda t: 0.1
  )
  with pytest.raises(ValueError, match=r"'threshold' is the gate's.* threshold=schedule \(to gnts"):
    tx.update(params, tx.init(params), params)


def test_schedule_by_microbatch_of_a_hyperparameter_the_inner_optimizer_schedules_raises():
  inner = optax.inject_hyperparams(optax.sgd)(learning_rate=optax.constant_schedule(0.1))
  tx = optax_gqc.schedule_by_microbatch(optax_gqc.sbc(inner, 2, 1), learning_rate=lambda t: 0.1)
  params = {'w': jnp.zeros(2)}
  with pytest.raises(ValueError, match=r"schedules 'learning_rate' itself.*give it a constant"):
    tx.update(params, tx.init(params), params)
  # Named in static_args, the rate is kept out of the state: the message says so.
  static = optax.inject_hyperparams(optax.sgd, static_args=('learning_rate',))(learning_rate=0.1)
  tx = optax_gqc.schedule_by_microbatch(optax_gqc.sbc(static, 2, 1), learning_rate=lambda t: 0.1)
  with pytest.raises(ValueError, match="leave 'learning_rate' out of its static_args"):
    tx.update(params, tx.init(params), params)


def test_schedule_by_microbatch_around_a_recipe_of_the_same_hyperparameter_raises():
  # The recipe's own schedule is written after the outer one, which it would overwrite.
  recipe = optax_gqc.gnts_with_cosine_schedule(1e-3, 100, 10)
  with pytest.raises(ValueError, match='learning_rate already follow a schedule'):
    optax_gqc.schedule_by_microbatch(recipe, learning_rate=lambda t: 0.5)
  twice = optax_gqc.schedule_by_microbatch(
      optax_gqc.gnts(optax.inject_hyperparams(optax.adamw)(learning_rate=0.1, b1=0.9)),
      learning_rate=lambda t: 0.1,
  )
  with pytest.raises(ValueError, match='learning_rate already'):
    optax_gqc.schedule_by_microbatch(twice, learning_rate=lambda t: 0.2)
  # Another hyperparameter, outside a recipe that leaves it alone, is scheduled.
  tx = optax_gqc.schedule_by_microbatch(twice, b1=lambda t: 0.5 + 0.0 * t)
  params = {'w': jnp.zeros(2)}
  _, state = jax.jit(tx.update)(params, tx.init(params), params)
  hyper = optax.tree.get(state, 'hyperparams')
  assert float(hyper['b1']) == 0.5 and float(hyper['learning_rate']) == pytest.approx(0.1)


@pytest.mark.parametrize('name', sorted(RECIPES))
def test_torch_gqc_names_of_the_arguments_name_their_ports(name):
  make, args, kwargs = RECIPES[name]
  with pytest.raises(
      TypeError, match="max_batch_draws is torch-gqc's name: its port here is max_draws"
  ):
    make(*args, 20, 4, **kwargs, max_batch_draws=8)
  # Before the missing count: torch-gqc's count names reach no argument of the port.
  with pytest.raises(TypeError, match='its port here is total_microbatches'):
    make(*args, num_training_steps=20, warmup_microbatches=4, **kwargs)


@pytest.mark.parametrize('x64', [False, True])
@pytest.mark.parametrize('written', [0.5, 1, jnp.float32(0.5)])
def test_a_scheduled_hyperparameter_written_as_a_python_number_is_overwritten(written, x64):
  # docs/checkpointing.md: optax.tree.set(opt_state, weight_decay=0.5); a Python
  # number has no dtype, and was taken for an injected schedule's state.
  with jax.enable_x64(x64):
    params, zero = {'w': jnp.ones(2)}, {'w': jnp.zeros(2)}
    tx = optax_gqc.gnts_with_cosine_schedule_conventional_lr(
        0.1, 100, 0, max_draws=1, weight_decay=0.0, initial_threshold=0.0, final_threshold=0.0
    )
    state = tx.init(params)
    dtype = optax.tree.get(state, 'weight_decay').dtype
    state = optax.tree.set(state, weight_decay=written)
    updates, state = tx.update(zero, state, params)  # eager: the Python number reaches the check
    np.testing.assert_array_equal(updates['w'], 0.0)  # the recipe's weight decay, 0, not 0.5
    assert optax.tree.get(state, 'weight_decay').dtype == dtype  # init's
    # Under x64 a plain inject_hyperparams keeps a float64 rate, as its init does.
    inner = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3)
    tx = optax_gqc.schedule_by_microbatch(
        optax_gqc.sbc(inner, 2, 1), learning_rate=optax.constant_schedule(1e-3)
    )
    state = tx.init(params)
    dtype = optax.tree.get(state, 'learning_rate').dtype
    _, state = tx.update(zero, optax.tree.set(state, learning_rate=float(written)), params)
    assert optax.tree.get(state, 'learning_rate').dtype == dtype


def test_a_bfloat16_hyperparameter_is_refused_with_the_dtype_that_fixes_it():
  # inject_hyperparams gives bfloat16 params bfloat16 hyperparameters: Adam's b2
  # rounds to 1 and the first step is NaN, with nothing counted.
  params = {'w': jnp.ones(3, jnp.bfloat16)}
  grads = {'w': jnp.full(3, 0.5, jnp.bfloat16)}
  schedule = optax.constant_schedule(1e-2)

  def make(**kwargs):
    inner = optax.inject_hyperparams(optax.adamw, **kwargs)(learning_rate=1e-2)
    return optax_gqc.schedule_by_microbatch(optax_gqc.sbc(inner, 1, 1), learning_rate=schedule)

  tx = make()
  with pytest.raises(TypeError, match=r"holds 'learning_rate' as bfloat16.*hyperparam_dtype"):
    tx.update(grads, tx.init(params), params)
  tx = make(hyperparam_dtype=jnp.float32)
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  assert bool(jnp.all(jnp.isfinite(updates['w'].astype(jnp.float32))))


@pytest.mark.parametrize(
    'schedule',
    [optax.constant_schedule(1), lambda t: jnp.where(t < 2, 1, 0)],
    ids=['constant_int', 'piecewise_int'],
)
def test_an_integer_schedule_schedules_a_float_hyperparameter(schedule):
  # inject_hyperparams kept an int32 first value as an int32, which then refused the schedule.
  tx = optax_gqc.scheduled_accumulation(
      optax.sgd, optax_gqc.gates.batch_size_at_least(1, 1), {'learning_rate': schedule}
  )
  params = {'w': jnp.zeros(3)}
  state = tx.init(params)
  steps = []
  for _ in range(3):
    updates, state = jax.jit(tx.update)({'w': jnp.ones(3)}, state, params)
    steps.append(float(updates['w'][0]))
  assert optax.tree.get(state, 'learning_rate').dtype == jnp.float32
  assert steps[:2] == [-1.0, -1.0] and steps[2] == float(-schedule(2))
