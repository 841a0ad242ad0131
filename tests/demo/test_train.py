"""The train program: a compiled block, and the plan of blocks."""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from optax_gqc.demo import arms, model, train

pytestmark = pytest.mark.slow


@pytest.mark.parametrize('arm', ['control', 'fixed2', 'critical', 'seesaw'])
def test_a_block_is_bitwise_a_python_loop_of_steps(arm):
  spec = arms.ARMS[arm]
  setup = arms.Setup(microbatch=8, count=156, warmup=0.05, weight_decay=0.01)
  transformer = model.CharTransformer(32, 1, 4, 32, nnx.Rngs(0))  # the --quick model: cached
  graphdef, params = nnx.split(transformer, nnx.Param)
  knobs = arms.arm_knobs(spec, argparse.Namespace(lr=3e-3))
  state = arms.make_optimizer(spec, knobs, setup).init(params)
  knobs = train.as_arrays(knobs)
  batches = jax.random.randint(jax.random.key(1), (39, 8, 33), 0, 256, jnp.int32)

  def copy(tree):
    return jax.tree.map(jnp.copy, tree)

  program = train.compiled_block(spec, graphdef, setup, params, state, knobs, batches)
  block_params, block_state, block_losses, block_steps, _ = program(
      copy(params), copy(state), knobs, batches
  )
  step = jax.jit(train.train_step, static_argnums=(0, 1, 2), donate_argnums=(3, 4))
  losses, steps = [], []
  for batch in batches:
    params, state, loss, num_steps = step(
        arms.program_spec(spec), graphdef, setup, params, state, knobs, batch
    )
    losses.append(loss)
    steps.append(num_steps)

  def bits(tree):
    return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]

  assert bits(block_params) == bits(params)
  assert bits(block_state) == bits(state)
  assert bits(block_losses) == bits(jnp.stack(losses))
  assert bits(block_steps) == bits(jnp.stack(steps))
  if spec['kind'] == 'fixed':
    k = spec['k']
    assert np.array_equal(block_steps, np.arange(1, 40) // k)


def test_plan_cuts_the_budget_into_equal_blocks_evaluated_at_block_ends():
  p = train.plan(900_000, 512, 12, 50)  # 1757 microbatches
  assert (p.block, p.count) == (50, 1750)
  assert len(p.evals) == 12 and p.evals[-1] == p.count
  assert all(e % p.block == 0 for e in p.evals)
  assert np.all(np.diff(p.evals) > 0)
  small = train.plan(40_000, 256, 4, 50)  # 156 microbatches: 4 blocks of 39
  assert small == train.Plan(156, 39, (39, 78, 117, 156))
