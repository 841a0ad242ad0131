"""A catalogue of misuses a new user would try, and what each gives.

At construction and at the first trace, a misuse raises an error that names
the argument and the fix. At run time under ``jax.jit``, where nothing can
raise, a bad value has a documented safe behaviour and is counted in
``statistics``. Parameters that were silently wrong before and now simply
work (complex, float64, bf16 with float32 gradients) are tested in
test_accumulation_dtypes.py.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_gqc
from optax_gqc import gates
from tests._helpers import grad_stream

PARAMS = {'w': jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), 'b': jnp.ones(3)}


def injected_gnts(**kwargs):
  return optax.inject_hyperparams(optax_gqc.gnts)(sgd(), 0.5, **kwargs).init(PARAMS)


def grads(num, seed=0):
  return grad_stream(num, seed, params=PARAMS)


def run_stats(tx, num=6, values=None, state_hook=None):
  """Runs ``tx`` under jit; returns statistics after each microbatch."""
  update = jax.jit(tx.update)
  state = tx.init(PARAMS)
  out = []
  for i, g in enumerate(grads(num)):
    if state_hook is not None:
      state = state_hook(i, state)
    extra = {} if values is None else {'value': values[i]}
    _, state = update(g, state, PARAMS, **extra)
    out.append(jax.tree.map(np.asarray, optax_gqc.statistics(state)))
  return out


def sgd():
  return optax.sgd(0.1)


INT_PARAMS = {'w': jnp.ones(3), 'i': jnp.array(3)}


def first_update(tx, grads=None, state=None, params=PARAMS, **extra_args):
  """Traces ``tx.update`` once, under jit, with a fresh state unless one is given."""
  state = tx.init(params) if state is None else state
  g = jax.tree.map(jnp.ones_like, params) if grads is None else grads
  return jax.jit(tx.update)(g, state, params, **extra_args)


def python_if_schedule(t):
  return 0.5 if t < 100 else 0.1  # a Python if on the traced step count


# ---------------------------------------------------------------------------
# At construction: each raises the error, and its message names the argument
# (first pattern) and the fix (second pattern).

AT_CONSTRUCTION = {
    # a gate that a bound of 0 and no max_draws keep closed for good
    'gnts threshold 0 with no max_draws': (
        lambda: optax_gqc.gnts(sgd(), threshold=0.0, max_draws=None),
        ValueError,
        'threshold=0 with max_draws=None',
        r'Give threshold > 0, or a max_draws',
    ),
    'gns tolerance 0 with no max_draws': (
        lambda: optax_gqc.gns_default(1e-3, 0.0, 300, 30, max_draws=None),
        ValueError,
        'tolerance=0 with max_draws=None',
        r'Give tolerance > 0',
    ),
    'gnts recipe annealed to 0 with no max_draws': (
        lambda: optax_gqc.gnts_with_cosine_schedule(
            1e-3, 300, 30, final_threshold=0.0, max_draws=None
        ),
        ValueError,
        'final_threshold=0 with max_draws=None',
        r'stop stepping',
    ),
    'noise_ratio_accumulation tolerance 0 with no max_draws': (
        lambda: optax_gqc.noise_ratio_accumulation(sgd(), 0.0, max_draws=None),
        ValueError,
        'tolerance=0 with max_draws=None',
        r'Give tolerance > 0',
    ),
    'gnts threshold 0 as a NumPy number with no max_draws': (
        lambda: optax_gqc.gnts(sgd(), threshold=np.float32(0.0), max_draws=None),
        ValueError,
        'threshold=0 with max_draws=None',
        r'Give threshold > 0',
    ),
    'gnts threshold that float32 rounds to 0 with no max_draws': (
        lambda: optax_gqc.gnts(sgd(), threshold=1e-50, max_draws=None),
        ValueError,
        r'threshold=1e-50 \(0 in float32\) with max_draws=None',
        r'Give threshold > 0',
    ),
    'gnts threshold and eta 0 with no max_draws': (
        lambda: optax_gqc.gnts(sgd(), threshold=0.0, eta=0.0, max_draws=None),
        ValueError,
        'threshold=0 and eta=0 with max_draws=None',
        r'Give threshold or eta > 0',
    ),
    'norm test eta 0 with no max_draws': (
        lambda: optax_gqc.norm_test_accumulation(sgd(), 0.0, max_draws=None),
        ValueError,
        'eta=0 with max_draws=None',
        r'Give eta > 0',
    ),
    'mht percent_error 0 with no max_draws': (
        lambda: optax_gqc.mht(sgd(), 0.9, 0.0, max_draws=None),
        ValueError,
        'percent_error=0 with max_draws=None',
        r'Give percent_error > 0',
    ),
    'mht recipe percent_error 0 with no max_draws': (
        lambda: optax_gqc.mht_with_warmup_schedule(1e-3, 0.9, 0.0, 300, 30, max_draws=None),
        ValueError,
        'percent_error=0 with max_draws=None',
        r'Give percent_error > 0',
    ),
    # constants that float32, which the gates compute in, takes out of their domain
    'mht confidence that float32 rounds to 1': (
        lambda: optax_gqc.mht(sgd(), 1 - 1e-9, 0.1),
        ValueError,
        r'confidence must be in \[0, 1\), got 0.999999999 \(1.0 in float32\)',
        r'in float32',
    ),
    'noise_decay that float32 rounds to 1': (
        lambda: optax_gqc.accumulate(sgd(), gates.norm_below(0.1), noise_decay=1 - 1e-9),
        ValueError,
        r'noise_decay must be in \[0, 1\)',
        r'\(1.0 in float32\)',
    ),
    'critical fraction that float32 rounds to 0': (
        lambda: optax_gqc.gnts(sgd(), fraction=1e-50),
        ValueError,
        'fraction must be > 0',
        r'\(0.0 in float32\)',
    ),
    'gnr target that float32 rounds to inf': (
        lambda: optax_gqc.gnr(sgd(), 1e39),
        ValueError,
        'target must be finite',
        r'\(inf in float32\)',
    ),
    # inner and gate
    'optimizer factory as inner': (
        lambda: optax_gqc.gnts(optax.adamw, 0.5),
        TypeError,
        'inner',
        r"got the function 'adamw'.*inner=optax.adamw\(1e-3\)",
    ),
    'factory as sbc inner': (
        lambda: optax_gqc.sbc(optax.adam, 8, 1),
        TypeError,
        'inner',
        r'call it with its hyperparameters',
    ),
    'string as inner': (
        lambda: optax_gqc.accumulate('adam', gates.norm_below(0.5)),
        TypeError,
        'inner',
        r'such as optax.adamw\(1e-3\)',
    ),
    'factory as gnr inner': (
        lambda: optax_gqc.gnr(optax.adamw, 1.0),
        TypeError,
        'inner',
        r'call it',
    ),
    'string as gate': (
        lambda: optax_gqc.accumulate(sgd(), 'norm'),
        TypeError,
        'gate',
        r'gates.norm_below',
    ),
    'function as gate': (
        lambda: optax_gqc.accumulate(sgd(), lambda s: s.num_draws >= 2),
        TypeError,
        'gate',
        r'gates.from_function',
    ),
    'transformation as gate': (
        lambda: optax_gqc.accumulate(sgd(), sgd()),
        TypeError,
        'gate',
        r'gates.norm_below',
    ),
    'non-gate in any_of': (
        lambda: gates.any_of(gates.norm_below(1.0), 3),
        TypeError,
        'any_of',
        r'gates such as gates.norm_below',
    ),
    'empty all_of': (lambda: gates.all_of(), ValueError, 'all_of', r'all_of\(gate_a, gate_b\)'),
    'non-callable rule': (
        lambda: gates.from_function(3),
        TypeError,
        'rule',
        'a function of DrawStats',
    ),
    # max_draws
    'max_draws 0': (
        lambda: optax_gqc.gnts(sgd(), 0.5, max_draws=0),
        ValueError,
        'max_draws',
        r'>= 1, or max_draws=None',
    ),
    'max_draws float': (
        lambda: optax_gqc.gnts(sgd(), 0.5, max_draws=2.5),
        TypeError,
        'max_draws',
        r'pass an integer max_draws >= 1',
    ),
    'max_draws bool': (
        lambda: optax_gqc.gnts(sgd(), 0.5, max_draws=True),
        TypeError,
        'max_draws',
        r'pass an integer',
    ),
    'max_draws 2**31': (
        lambda: optax_gqc.gnts(sgd(), 0.5, max_draws=2**31),
        ValueError,
        'max_draws',
        r'below 2\*\*31.*pass at most 2147483647, or max_draws=None',
    ),
    'gnts noise-following without max_draws': (
        lambda: optax_gqc.gnts(sgd(), max_draws=None),
        ValueError,
        'max_draws',
        r'stop stepping for good. Give max_draws',
    ),
    'gnts noise-following with max_draws=1': (
        lambda: optax_gqc.gnts(sgd(), max_draws=np.int64(1)),
        ValueError,
        'max_draws',
        r'every step would be forced.*Give max_draws >= 2',
    ),
    'sbc infinite batch without max_draws': (
        lambda: optax_gqc.sbc(sgd(), float('inf'), 8),
        ValueError,
        'logical_batch_size',
        r'no batch reaches it.*Pass a finite logical_batch_size',
    ),
    'sbc batch under one microbatch': (  # MultiSteps' k, kept as examples
        lambda: optax_gqc.sbc(sgd(), 4, 32),
        ValueError,
        r'logical_batch_size \(4\) is under one microbatch of 32 examples',
        r'Pass k \* microbatch_size for a step every k microbatches',
    ),
    'sbc batch under one microbatch given as an array': (
        lambda: optax_gqc.sbc(sgd(), 4, jnp.asarray(32)),
        ValueError,
        r'logical_batch_size \(4\) is under one microbatch of 32 examples',
        r'Pass k \* microbatch_size',
    ),
    'batch_size_at_least of 0': (
        lambda: gates.batch_size_at_least(0, 8),
        ValueError,
        r'logical_batch_size \(0\)',
        r'microbatch_size itself for every one',
    ),
    'sbc infinite batch with max_draws': (
        lambda: optax_gqc.sbc(sgd(), float('inf'), 8, max_draws=4),
        ValueError,
        'logical_batch_size',
        r'no batch reaches it.*Pass a finite logical_batch_size',
    ),
    # inject_hyperparams takes a function or a dtype for a schedule (it raises at init).
    'scale_by_draws injected as a schedule': (
        lambda: injected_gnts(scale_by_draws=jnp.sqrt),
        TypeError,
        'scale_by_draws',
        r"static_args=\('scale_by_draws',\)",
    ),
    'sgd_sai mu_dtype injected as a schedule': (
        lambda: optax.inject_hyperparams(optax_gqc.sgd_sai)(0.1, mu_dtype=jnp.bfloat16).init(
            PARAMS
        ),
        TypeError,
        'mu_dtype',
        r"static_args=\('mu_dtype',\)",
    ),
    'accumulator_dtype injected as a schedule': (
        lambda: injected_gnts(accumulator_dtype=jnp.float32),
        TypeError,
        'accumulator_dtype',
        r"static_args=\('accumulator_dtype',\)",
    ),
    'sbc max_draws below its batch': (
        lambda: optax_gqc.sbc(sgd(), 800, 8, max_draws=64),
        ValueError,
        'max_draws',
        r'max_draws >= 100, or max_draws=None',
    ),
    # microbatch_size
    'negative microbatch_size': (
        lambda: optax_gqc.gnts(sgd(), 0.5, microbatch_size=-1),
        ValueError,
        'microbatch_size',
        r'>= 1',
    ),
    'sbc microbatch_size 0': (
        lambda: optax_gqc.sbc(sgd(), 8, 0),
        ValueError,
        'microbatch_size',
        r'>= 1',
    ),
    'float microbatch_size': (
        lambda: gates.batch_size_at_least(8, 2.5),
        TypeError,
        'microbatch_size',
        r'pass an integer',
    ),
    # accumulator and flags
    'int32 accumulator': (
        lambda: optax_gqc.gnts(sgd(), 0.5, accumulator_dtype=jnp.int32),
        ValueError,
        'accumulator_dtype',
        r'truncate \(an accumulator, the mean.*jnp.float32',
    ),
    'float16 accumulator': (
        lambda: optax_gqc.gnts(sgd(), 0.5, accumulator_dtype=jnp.float16),
        ValueError,
        'accumulator_dtype float16 is too narrow',
        r'accumulator_dtype=None \(float32\), or jnp.bfloat16',
    ),
    'float64 accumulator without x64': (  # JAX would make it float32
        lambda: optax_gqc.sbc(sgd(), 2, 1, accumulator_dtype=jnp.float64),
        ValueError,
        'accumulator_dtype float64 needs 64-bit JAX',
        r"jax.config.update\('jax_enable_x64', True\), or pass accumulator_dtype=None",
    ),
    'complex128 accumulator without x64': (
        lambda: optax_gqc.sbc(sgd(), 2, 1, accumulator_dtype=jnp.complex128),
        ValueError,
        'accumulator_dtype complex128 needs 64-bit JAX',
        r'accumulator_dtype=None',
    ),
    'float8_e8m0fnu accumulator': (  # float32's range, no mantissa
        lambda: optax_gqc.gnts(sgd(), 0.5, accumulator_dtype=jnp.float8_e8m0fnu),
        ValueError,
        'accumulator_dtype float8_e8m0fnu has 0 mantissa bits',
        r'accumulator_dtype=None',
    ),
    'accumulator_dtype not a dtype': (
        lambda: optax_gqc.gnts(sgd(), 0.5, accumulator_dtype='high'),
        TypeError,
        'accumulator_dtype',
        r'jnp.float32',
    ),
    'skip_nonfinite string': (
        lambda: optax_gqc.gnts(sgd(), 0.5, skip_nonfinite='yes'),
        TypeError,
        'skip_nonfinite',
        r'True or False',
    ),
    'noise_decay 1': (
        lambda: optax_gqc.accumulate(sgd(), gates.norm_below(0.5), noise_decay=1.0),
        ValueError,
        'noise_decay',
        r'\[0, 1\)',
    ),
    'scale_by_draws a number': (
        lambda: optax_gqc.accumulate(sgd(), gates.norm_below(0.5), scale_by_draws=2.0),
        TypeError,
        'scale_by_draws',
        'jnp.sqrt',
    ),
    'from_function rule of two arguments': (
        lambda: gates.from_function(lambda stats, state: stats.num_draws >= 2),
        TypeError,
        'rule must take one argument, the DrawStats',
        r'lambda s: s.num_draws >= 4',
    ),
    'scale_by_draws of two arguments': (
        lambda: optax_gqc.sbc(sgd(), 2, 1, scale_by_draws=lambda n, m: n),
        TypeError,
        r'scale_by_draws must take one argument, n: missing a required argument',
        'jnp.sqrt',
    ),
    # gate hyperparameters
    'threshold as a string': (
        lambda: optax_gqc.gnts(sgd(), '0.5'),
        TypeError,
        'threshold',
        r'pass a float',
    ),
    'negative threshold': (
        lambda: optax_gqc.gnts(sgd(), -0.1),
        ValueError,
        'threshold',
        r'>= 0',
    ),
    'nan threshold': (
        lambda: optax_gqc.gnts(sgd(), float('nan')),
        ValueError,
        'threshold',
        r'>= 0',
    ),
    'negative ratio': (
        lambda: optax_gqc.gnts(sgd(), ratio=-0.5),
        ValueError,
        'ratio',
        r'>= 0',
    ),
    'ratio as a string': (
        lambda: optax_gqc.gnts(sgd(), ratio='half'),
        TypeError,
        'ratio',
        r'pass a float',
    ),
    'array threshold': (
        lambda: optax_gqc.gnts(sgd(), jnp.ones(2)),
        ValueError,
        'threshold',
        r'pass one number',
    ),
    'non-scalar schedule': (
        lambda: optax_gqc.gnts(sgd(), lambda t: jnp.ones(2) * t),
        ValueError,
        'threshold',
        r'return one number per step count',
    ),
    'schedule with a Python if': (
        lambda: optax_gqc.gnts(sgd(), python_if_schedule),
        TypeError,
        'threshold',
        r'jnp.where instead of if',
    ),
    'schedule returning a string': (
        lambda: optax_gqc.gnts(sgd(), lambda t: 'high'),
        TypeError,
        'threshold',
        r'jnp functions',
    ),
    'mht confidence 95': (
        lambda: optax_gqc.mht(sgd(), 95, 0.05),
        ValueError,
        'confidence',
        r'\[0, 1\)',
    ),
    'mht negative percent_error': (
        lambda: optax_gqc.mht(sgd(), 0.9, -0.05),
        ValueError,
        'percent_error',
        r'>= 0',
    ),
    'negative logical batch': (
        lambda: optax_gqc.sbc(sgd(), -8, 4),
        ValueError,
        'logical_batch_size',
        r'>= 0',
    ),
    'negative tolerance': (
        lambda: optax_gqc.gns(sgd(), -0.1),
        ValueError,
        'tolerance',
        r'>= 0',
    ),
    'negative eta': (
        lambda: optax_gqc.norm_test_accumulation(sgd(), -1.0),
        ValueError,
        'eta',
        r'>= 0',
    ),
    'relative decay 1.5': (
        lambda: gates.norm_below(0.5, relative=True, decay=1.5),
        ValueError,
        'decay',
        r'\[0, 1\)',
    ),
    'critical fraction 0': (
        lambda: gates.critical_batch(0.0, 4),
        ValueError,
        'fraction',
        r'> 0',
    ),
    'critical max below min': (
        lambda: gates.critical_batch(0.5, 4, max_batch_size=2),
        ValueError,
        'max_batch_size',
        r'>= min_batch_size',
    ),
    'critical max below two microbatches': (
        lambda: gates.critical_batch(0.5, 4, max_batch_size=6),
        ValueError,
        'max_batch_size',
        r'at least two microbatches \(8\)',
    ),
    'critical bootstrap 1': (
        lambda: gates.critical_batch(0.5, 4, bootstrap_draws=1),
        ValueError,
        'bootstrap_draws',
        r'>= 2',
    ),
    # the other transformations
    'gnr negative target': (
        lambda: optax_gqc.gnr(sgd(), -1.0),
        ValueError,
        'target',
        r'>= 0',
    ),
    'gnr infinite target': (  # every update would be zero
        lambda: optax_gqc.gnr(sgd(), float('inf')),
        ValueError,
        'target',
        r'finite',
    ),
    'scale_to_norm string': (
        lambda: optax_gqc.scale_to_norm('1'),
        TypeError,
        'target',
        r'pass a float',
    ),
    'noise_scale decay 1.5': (
        lambda: optax_gqc.noise_scale(1.5, axis_name='data'),
        ValueError,
        'decay',
        r'\[0, 1\)',
    ),
    'sgd_sai momentum 1': (
        lambda: optax_gqc.sgd_sai(0.1, momentum=1.0),
        ValueError,
        'momentum',
        r'\[0, 1\)',
    ),
    'sgd_sai eps 0': (lambda: optax_gqc.sgd_sai(0.1, eps=0.0), ValueError, 'eps', r'> 0'),
    # the recipes
    'recipe warmup longer than the run': (
        lambda: optax_gqc.gnts_with_cosine_schedule(1e-3, total_steps=10, warmup_steps=100),
        ValueError,
        'warmup_steps',
        r'Pass warmup_steps <= total_steps',
    ),
    'recipe with an optimizer instance': (
        lambda: optax_gqc.sbc_with_polynomial_schedule(
            1e-3, 4, 8, 16, 100, 10, optimizer=optax.adamw(1e-3)
        ),
        TypeError,
        'optimizer',
        r'Pass the function itself',
    ),
    'recipe weight decay for sgd': (
        lambda: optax_gqc.gnts_with_cosine_schedule(1e-3, 100, 10, optimizer=optax.sgd),
        TypeError,
        "optimizer sgd takes no argument 'weight_decay'",
        r'weight_decay=None',
    ),
    'recipe scheduled learning rate': (
        lambda: optax_gqc.gnr_with_cosine_schedule(lambda t: 0.1, 1.0, 0.5, 100, 10),
        TypeError,
        'learning_rate',
        r'Pass one value',
    ),
    'recipe negative threshold': (
        lambda: optax_gqc.gnts_with_cosine_schedule(1e-3, 100, 10, initial_threshold=-1.0),
        ValueError,
        'initial_threshold',
        r'>= 0',
    ),
    'recipe confidence 95': (
        lambda: optax_gqc.mht_with_warmup_schedule(1e-3, 95, 0.1, 100, 10),
        ValueError,
        'confidence',
        r'\[0, 1\)',
    ),
    'recipe fractional total_microbatches': (
        lambda: optax_gqc.gns_default(1e-3, 0.1, 100.5, 10),
        ValueError,
        'total_microbatches',
        r'an int >= 0',
    ),
    'recipe fractional total_steps': (
        lambda: optax_gqc.gns_default(1e-3, 0.1, total_steps=100.5, warmup_steps=10),
        ValueError,
        'total_steps',
        r'an int >= 0',
    ),
    'recipe run length given twice': (
        lambda: optax_gqc.gns_default(1e-3, 0.1, 100, 10, total_steps=100),
        TypeError,
        'total_microbatches and total_steps',
        r'pass one of them',
    ),
    'scheduled_accumulation constant': (
        lambda: optax_gqc.scheduled_accumulation(
            optax.sgd, gates.norm_below(0.5), {'learning_rate': 0.1}
        ),
        TypeError,
        r"hyperparams\['learning_rate'\]",
        r'pass a constant as a keyword argument',
    ),
    'scheduled_accumulation unknown argument': (
        lambda: optax_gqc.scheduled_accumulation(
            optax.sgd, gates.norm_below(0.5), {'lr': lambda t: 0.1}
        ),
        TypeError,
        "takes no argument 'lr'",
        r'schedule only arguments that it takes',
    ),
    # Values that trained wrongly: inf, a dtype taken for a schedule, strings for flags.
    'inf eps': (
        lambda: optax_gqc.sgd_sai(0.1, eps=float('inf')),
        ValueError,
        'eps',
        r'finite and > 0',
    ),
    'inf eps of scale_by_gsnr': (
        lambda: optax_gqc.scale_by_gsnr(eps=float('inf')),
        ValueError,
        'eps',
        r'finite',
    ),
    'inf learning rate of sgd_sai': (
        lambda: optax_gqc.sgd_sai(float('inf')),
        ValueError,
        'learning_rate',
        r'finite',
    ),
    'inf initial norm of a recipe': (
        lambda: optax_gqc.gnr_with_cosine_schedule(
            1e-3, float('inf'), 0.1, total_microbatches=10, warmup_microbatches=2
        ),
        ValueError,
        'initial_norm',
        r'finite',
    ),
    'inf batch of a recipe': (
        lambda: optax_gqc.sbc_with_polynomial_schedule(
            1e-3, 8, float('inf'), 64, total_microbatches=10, warmup_microbatches=2
        ),
        ValueError,
        'initial_batch_size',
        r'finite',
    ),
    'function for a recipe number it does not schedule': (
        lambda: optax_gqc.sbc_with_polynomial_schedule(
            1e-3, 8, 8, 64, total_microbatches=10, warmup_microbatches=2, power=lambda t: 2.0
        ),
        TypeError,
        'power',
        r'Pass one value',
    ),
    'function for a number that is not scheduled': (
        lambda: gates.norm_below(0.5, relative=True, decay=lambda t: 0.9),
        TypeError,
        'decay',
        r'must be a number, got a function: it is not scheduled',
    ),
    'NumPy bool for a number': (
        lambda: gates.batch_size_at_least(np.True_, 8),
        TypeError,
        'logical_batch_size',
        r'got bool np.True_',
    ),
    'recipe given the optimizer first (torch order)': (
        lambda: optax_gqc.gnts_with_cosine_schedule(optax.adamw(1e-3), 1000, 50),
        TypeError,
        'learning_rate must be a number, got the transformation',
        r'optimizer=optax.adamw',
    ),
    'recipe given a string for a number': (
        lambda: optax_gqc.gnts_with_cosine_schedule('1e-3', 1000, 50),
        TypeError,
        'learning_rate must be a number',
        r"got str '1e-3'",
    ),
    'JAX bool array for a number': (
        lambda: optax_gqc.gnts(sgd(), jnp.array(True)),
        TypeError,
        'threshold',
        r'must be a number or a schedule',
    ),
    'schedule that returns a bool': (
        lambda: gates.norm_below(lambda t: t >= 1),
        ValueError,
        'threshold',
        r'numeric scalar, got shape \(\) of bool',
    ),
    'dtype for a schedule': (
        lambda: optax_gqc.mht(sgd(), jnp.float32, 0.05),
        TypeError,
        'confidence',
        r'got the dtype',
    ),
    'string for relative': (
        lambda: gates.norm_below(0.5, relative='False'),
        TypeError,
        'relative',
        r'True or False',
    ),
    'string for normalize': (
        lambda: optax_gqc.sgd_sai(0.1, normalize='False'),
        TypeError,
        'normalize',
        r'True or False',
    ),
    'bfloat16 hyperparam_dtype': (
        lambda: optax_gqc.scheduled_accumulation(
            optax.adamw,
            gates.norm_below(0.5),
            {'learning_rate': lambda t: 1e-3},
            hyperparam_dtype=jnp.bfloat16,
        ),
        ValueError,
        'hyperparam_dtype bfloat16 is too narrow',
        r'Pass hyperparam_dtype=jnp.float32',
    ),
    'a hyperparameter scheduled and constant': (
        lambda: optax_gqc.scheduled_accumulation(
            optax.adamw, gates.norm_below(0.5), {'learning_rate': lambda t: 1e-3}, learning_rate=0.1
        ),
        ValueError,
        'learning_rate both scheduled in hyperparams and passed as a constant',
        r'not both',
    ),
    'integer hyperparam_dtype': (
        lambda: optax_gqc.scheduled_accumulation(
            optax.sgd,
            gates.norm_below(0.5),
            {'learning_rate': lambda t: 0.1},
            hyperparam_dtype=jnp.int32,
        ),
        ValueError,
        'hyperparam_dtype',
        r'floating-point',
    ),
    "concrete array microbatch_size other than the gate's": (
        lambda: optax_gqc.accumulate(
            sgd(), gates.batch_size_at_least(64, 32), microbatch_size=jnp.array(16)
        ),
        ValueError,
        'microbatch_size=16',
        r'give it once, to the gate',
    ),
    'function as gnts microbatch_size': (
        lambda: optax_gqc.gnts(sgd(), microbatch_size=lambda t: 8),
        TypeError,
        'microbatch_size',
        r'pass an integer microbatch_size >= 1',
    ),
    'gnts microbatch_size of 2**30': (
        lambda: optax_gqc.gnts(sgd(), microbatch_size=2**30),
        ValueError,
        'microbatch_size',
        r'below 2\*\*30',
    ),
    'gnts NumPy int32 microbatch_size of 2**30': (
        lambda: optax_gqc.gnts(sgd(), microbatch_size=np.int32(2**30)),
        ValueError,
        'microbatch_size',
        r'below 2\*\*30',
    ),
    'NumPy probe_every over int32': (
        lambda: gates.critical_batch(0.5, 4, probe_every=np.int64(2**31)),
        ValueError,
        'probe_every',
        r'below 2\*\*31',
    ),
    'NaN big batch': (
        lambda: optax_gqc.noise_scale_estimates(8, 7.25, float('nan'), 1.78125),
        ValueError,
        'big_batch=nan',
        r'positive, finite',
    ),
    'stacked gradients of different lengths': (
        lambda: optax_gqc.sampling.norm_test({'w': jnp.ones((8, 3)), 'b': jnp.ones((4, 4))}, 0.5),
        ValueError,
        'leading axis',
        r"'b': 4",
    ),
    'noise_scale without an axis': (
        lambda: optax_gqc.noise_scale(axis_name=None),
        ValueError,
        'axis_name',
        r'noise scale of an accumulation',
    ),
    'an anneal with no end': (
        lambda: optax_gqc.schedules.cosine_with_warmup(1.0, 0.0, 10, None),
        ValueError,
        'total_steps',
        r'int >= 0, got None',
    ),
    'a NaN schedule value': (
        lambda: optax_gqc.schedules.constant_with_warmup(float('nan'), 10),
        ValueError,
        'value',
        r'finite',
    ),
    'a string schedule value': (
        lambda: optax_gqc.schedules.cosine_with_warmup('abc', 0.0, 10, 100),
        TypeError,
        'peak_value',
        r'must be a number',
    ),
}


# ---------------------------------------------------------------------------
# At the first trace of update (under jit, before anything runs).


def nnx_opt_state_update():
  """A hand-written step given an nnx.Optimizer's opt_state, whose leaves are Variables."""
  from flax import nnx

  model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
  tx = optax_gqc.gnts(sgd())
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  params = nnx.state(model, nnx.Param)
  grads = jax.tree.map(jnp.ones_like, params)
  return optax_gqc.update_and_apply(tx, grads, optimizer.opt_state, params)


def chained_state_restored_without_a_target():
  from flax import serialization

  tx = optax.chain(optax.clip_by_global_norm(1.0), optax_gqc.gnts(sgd()))
  state = serialization.msgpack_restore(serialization.to_bytes(tx.init(PARAMS)))
  return first_update(tx, state=state)


AT_FIRST_TRACE = {
    'a scheduled name the inner optimizer does not inject': (
        lambda: first_update(
            optax_gqc.schedule_by_microbatch(
                optax_gqc.sbc(optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3), 2, 1),
                learning_rte=lambda t: 1e-3,
            )
        ),
        ValueError,
        "no injected hyperparameter 'learning_rte'; it injects b1, b2, eps, eps_root, "
        'learning_rate, weight_decay',
        r'Schedule one of those',
    ),
    'a chained state restored without a target': (
        chained_state_restored_without_a_target,
        TypeError,
        r"state is the str '1', .*\. A chain whose state was restored without a target",
        r'restore it onto a target, jax.eval_shape\(tx.init, params\)',
    ),
    "an nnx.Optimizer's opt_state": (
        nnx_opt_state_update,
        TypeError,
        'the state holds Flax NNX Variables',
        r'optimizer.update\(model, grads\), or optax_gqc.interop.nnx.update',
    ),
    'traced microbatch_size of the default gnts': (
        lambda: first_update(
            optax.inject_hyperparams(
                lambda microbatch_size: optax_gqc.gnts(sgd(), microbatch_size=microbatch_size)
            )(microbatch_size=8)
        ),
        TypeError,
        'concrete microbatch_size',
        r"static_args=\('microbatch_size',\)",
    ),
    'scale_by_draws returning an array': (
        lambda: first_update(
            optax_gqc.sbc(sgd(), 2, 1, scale_by_draws=lambda n: jnp.stack([n, n]))
        ),
        ValueError,
        'scale_by_draws',
        r'must return a real scalar.*shape \(2,\)',
    ),
    'scale_by_draws returning a string': (
        lambda: first_update(optax_gqc.sbc(sgd(), 2, 1, scale_by_draws=lambda n: 'sqrt')),
        ValueError,
        r"scale_by_draws must return a real scalar.*returned str 'sqrt'",
        'jnp.sqrt',
    ),
    'the loss by position to update (torch step(loss))': (
        lambda: optax_gqc.mht(sgd(), 0.9, 0.05).update(
            PARAMS, optax_gqc.mht(sgd(), 0.9, 0.05).init(PARAMS), PARAMS, 1.0
        ),
        TypeError,
        'update takes the loss as a keyword',
        'value=loss',
    ),
    'the loss by position to update_and_apply': (
        lambda: optax_gqc.update_and_apply(
            optax_gqc.mht(sgd(), 0.9, 0.05),
            PARAMS,
            optax_gqc.mht(sgd(), 0.9, 0.05).init(PARAMS),
            PARAMS,
            1.0,
        ),
        TypeError,
        'update_and_apply takes the loss as a keyword',
        'value=loss',
    ),
    'the loss by position to a recipe': (
        lambda: (r := optax_gqc.mht_with_warmup_schedule(1e-3, 0.9, 0.05, 100, 10)).update(
            PARAMS, r.init(PARAMS), PARAMS, 1.0
        ),
        TypeError,
        'update takes the loss as a keyword',
        'value=loss',
    ),
    'state of the inner optimizer': (
        lambda: first_update(optax_gqc.gnts(sgd(), 0.5), state=sgd().init(PARAMS)),
        TypeError,
        'state',
        r'tx.init\(params\)',
    ),
    'params passed as the state': (
        lambda: first_update(optax_gqc.gnts(sgd(), 0.5), state=PARAMS),
        TypeError,
        'state is a dict',
        r'tx.init\(params\)',
    ),
    'state of the inner optimizer, to a recipe': (
        lambda: first_update(
            optax_gqc.sbc_with_polynomial_schedule(0.1, 1, 2.0, 4.0, 20, 2),
            state=sgd().init(PARAMS),
        ),
        TypeError,
        'state',
        r'tx.init\(params\)',
    ),
    'a state restored without a target': (
        lambda: first_update(
            optax_gqc.gnts(sgd(), 0.5), state=optax_gqc.gnts(sgd(), 0.5).init(PARAMS)._asdict()
        ),
        TypeError,
        'state is a dict',
        r'restore it onto a target, jax.eval_shape\(tx.init, params\)',
    ),
    'a float0 gradient of an integer leaf': (
        lambda: first_update(
            optax_gqc.sbc(sgd(), 2, 1),
            grads=jax.grad(lambda p: jnp.sum(p['w'] ** 2), allow_int=True)(INT_PARAMS),
            params=INT_PARAMS,
        ),
        TypeError,
        r"gradient \['i'\] is float0",
        'leave integer leaves out of the tree that jax.grad differentiates',
    ),
    'update before init': (
        lambda: optax_gqc.gnts(sgd(), 0.5).update(PARAMS, None, PARAMS),
        TypeError,
        'state is None',
        r'tx.init\(params\)',
    ),
    'gradients unlike the params': (
        lambda: first_update(optax_gqc.gnts(sgd(), 0.5), grads={'w': PARAMS['w']}),
        ValueError,
        'gradient tree',
        r'jax.grad of the loss with respect to them',
    ),
    'gradient of another shape': (
        lambda: first_update(
            optax_gqc.gnts(sgd(), 0.5), grads={'w': PARAMS['w'], 'b': jnp.ones(5)}
        ),
        ValueError,
        r"gradient \['b'\]",
        r'params given to init had \(3,\): pass gradients of those params',
    ),
    'integer gradients': (
        lambda: first_update(
            optax_gqc.sbc(sgd(), 2, 1), grads=jax.tree.map(lambda p: jnp.ones(p.shape, int), PARAMS)
        ),
        TypeError,
        r"gradient \['b'\] has dtype int32",
        r'Cast it to a float',
    ),
    'complex gradients of real params': (
        lambda: first_update(
            optax_gqc.sbc(sgd(), 2, 1), grads=jax.tree.map(lambda p: p * 1j, PARAMS)
        ),
        TypeError,
        r"gradient \['b'\] is complex",
        r'initialize with the complex params',
    ),
    'mht without the loss': (
        lambda: first_update(optax_gqc.mht(sgd(), 0.9, 0.05)),
        ValueError,
        'loss',
        r'value=loss',
    ),
    'mht with per-example losses': (
        lambda: first_update(optax_gqc.mht(sgd(), 0.9, 0.05), value=jnp.ones(8)),
        ValueError,
        r'value must be the scalar loss',
        r'value=loss.mean\(\)',
    ),
    'injected array threshold': (
        lambda: injected_threshold(jnp.ones(2)),
        ValueError,
        'threshold',
        r'one number',
    ),
    'gate rule returning a float': (
        lambda: first_update(
            optax_gqc.accumulate(sgd(), gates.from_function(lambda s: s.acc_norm))
        ),
        TypeError,
        'gate',
        r'boolean scalar.*stats.acc_norm <= 0.5',
    ),
    'float rule inside any_of': (
        lambda: first_update(
            optax_gqc.accumulate(
                sgd(),
                gates.any_of(gates.norm_below(1.0), gates.from_function(lambda s: s.acc_norm)),
            )
        ),
        TypeError,
        'from_function: rule',
        r'boolean scalar.*got float32.*stats.acc_norm <= 0.5',
    ),
    'int rule inside all_of': (
        lambda: first_update(
            optax_gqc.accumulate(sgd(), gates.all_of(gates.from_function(lambda s: 1)))
        ),
        TypeError,
        'from_function: rule',
        r'boolean scalar.*got int32',
    ),
    'rule of shape (1,) inside any_of': (
        lambda: first_update(
            optax_gqc.accumulate(
                sgd(),
                gates.any_of(
                    gates.norm_below(1.0), gates.from_function(lambda s: jnp.ones(1, bool))
                ),
            )
        ),
        TypeError,
        'from_function: rule',
        r'shape \(1,\).*jnp.all or jnp.any',
    ),
    'gate returning a float inside any_of': (
        lambda: first_update(
            optax_gqc.accumulate(
                sgd(),
                gates.any_of(
                    gates.norm_below(1.0),
                    optax_gqc.Gate(lambda: {}, lambda s, st, **_: (s.acc_norm, st)),
                ),
            )
        ),
        TypeError,
        r'any_of: gate 1 of its 2 \(counting from 0\)',
        r'boolean scalar.*stats.acc_norm <= 0.5',
    ),
    'state of an accumulation with another gate': (
        lambda: first_update(
            optax_gqc.gnts(sgd(), 0.5), state=optax_gqc.sbc(sgd(), 2, 1).init(PARAMS)
        ),
        TypeError,
        r'state does not belong to this transformation: its gate state holds the entries '
        r'\(logical_batch_size, num_bad_hyperparams\)',
        r'tx.init\(params\)',
    ),
    'state of the default gnts, to sbc': (
        lambda: first_update(optax_gqc.sbc(sgd(), 2, 1), state=optax_gqc.gnts(sgd()).init(PARAMS)),
        TypeError,
        'state does not belong to this transformation',
        r'tx.init\(params\)',
    ),
    'state of an accumulation around another optimizer': (
        lambda: first_update(
            optax_gqc.gnts(optax.adam(0.1), 0.5), state=optax_gqc.gnts(sgd(), 0.5).init(PARAMS)
        ),
        TypeError,
        r'state does not belong to this transformation: its inner state is \(EmptyState, '
        r'EmptyState\), but this inner optimizer keeps \(ScaleByAdamState',
        r'tx.init\(params\)',
    ),
    'state of a plain accumulation, to a recipe': (
        lambda: first_update(
            optax_gqc.sbc_with_polynomial_schedule(0.1, 1, 2.0, 4.0, 20, 2),
            state=optax_gqc.sbc(sgd(), 2, 1).init(PARAMS),
        ),
        TypeError,
        'state does not belong to this transformation: its inner state',
        r'tx.init\(params\)',
    ),
    'gradients as Python floats': (
        lambda: optax_gqc.gnts(sgd(), 0.5).update(
            {'w': 1.0, 'b': 1.0}, optax_gqc.gnts(sgd(), 0.5).init(PARAMS), PARAMS
        ),
        TypeError,
        r"gradient \['b'\] is a float \(1.0\), not an array",
        r'jnp.asarray',
    ),
    'a bare float as the gradient': (
        lambda: optax_gqc.sbc(sgd(), 2, 1).update(
            1.0, optax_gqc.sbc(sgd(), 2, 1).init(jnp.ones(3)), jnp.ones(3)
        ),
        TypeError,
        r'accumulate: the gradient is a float',
        r'pass arrays',
    ),
    'mht with a string loss': (
        lambda: optax_gqc.mht(sgd(), 0.9, 0.05).update(
            PARAMS, optax_gqc.mht(sgd(), 0.9, 0.05).init(PARAMS), PARAMS, value='x'
        ),
        TypeError,
        r"value must be the scalar loss of the microbatch, a real number, got str 'x'",
        r'value=loss',
    ),
    'gate changing its state': (
        lambda: first_update(
            optax_gqc.accumulate(
                sgd(), optax_gqc.Gate(lambda: {}, lambda s, st, **_: (s.num_draws >= 2, {'n': 1}))
            )
        ),
        TypeError,
        r'structure of gate.init\(\): PyTreeDef\(\{\}\), got PyTreeDef\(\{\'n\': \*\}\)',
        r'keep the entries of gate.init\(\)',
    ),
    'gate returning its decision alone': (
        lambda: first_update(
            optax_gqc.accumulate(
                sgd(), optax_gqc.Gate(lambda: {}, lambda s, st, **_: s.num_draws > 1)
            )
        ),
        TypeError,
        r'gate: update must return a pair \(decision, state\)',
        r'the decision first',
    ),
    'gate returning its state first': (
        lambda: first_update(
            optax_gqc.accumulate(
                sgd(),
                optax_gqc.Gate(
                    lambda: {'n': jnp.zeros([])}, lambda s, st, **_: (st, s.num_draws >= 2)
                ),
            )
        ),
        TypeError,
        r'gate: update must return a pair \(decision, state\)',
        r'the decision first',
    ),
    'gate changing a dtype': (
        lambda: first_update(
            optax_gqc.accumulate(
                sgd(),
                optax_gqc.Gate(
                    lambda: {'n': jnp.zeros([], jnp.int32)},
                    lambda s, st, **_: (s.num_draws >= 2, {'n': s.acc_norm}),
                ),
            )
        ),
        TypeError,
        r"gate: update returned the state entry \['n'\] as float32\[\]",
        r'where gate.init\(\) has int32\[\]; .* cast new values to their dtypes',
    ),
    'inner optimizer that needs params': (
        lambda: jax.jit(optax_gqc.gnts(optax.adamw(0.1), 1e9).update)(
            PARAMS, optax_gqc.gnts(optax.adamw(0.1), 1e9).init(PARAMS)
        ),
        ValueError,
        'params',
        r'passing `params`',
    ),
    'noise_scale outside a mapped axis': (
        lambda: optax_gqc.noise_scale(axis_name='data').update(
            PARAMS, optax_gqc.noise_scale(axis_name='data').init(PARAMS)
        ),
        NameError,
        "axis_name 'data'",
        r'call update inside jax.shard_map',
    ),
}


def injected_threshold(value):
  tx = optax.inject_hyperparams(optax_gqc.gnts)(sgd(), threshold=0.5)
  state = tx.init(PARAMS)
  state.hyperparams['threshold'] = value
  return first_update(tx, state=state)


RAISING = {
    **{f'construction: {k}': v for k, v in AT_CONSTRUCTION.items()},
    **{f'first trace: {k}': v for k, v in AT_FIRST_TRACE.items()},
}


@pytest.mark.parametrize('case', sorted(RAISING))
def test_misuse_raises_naming_the_argument_and_the_fix(case):
  make, error, argument, fix = RAISING[case]
  with pytest.raises(error) as info:
    make()
  message = str(info.value)
  assert re.search(argument, message), message
  assert re.search(fix, message), message


@pytest.mark.parametrize(
    'value, hint',
    [(jnp.array(3), True), (np.int64(3), False), (np.int8(-1), False), (jnp.array(-2), False)],
)
def test_a_count_suggests_int_only_where_it_mends_the_value(value, hint):
  # np.int64(3) is accepted; int(x) of a negative count is still negative.
  if not hint and value >= 0:
    assert gates.critical_batch(0.5, 1, probe_every=value).microbatch_size == 1
    return
  with pytest.raises(ValueError, match='probe_every must be an int >= 0') as info:
    gates.critical_batch(0.5, 1, probe_every=value)
  assert ('pass int(x)' in str(info.value)) == hint


@pytest.mark.parametrize(
    'make',
    [
        lambda: optax_gqc.gnts(sgd(), threshold=0.0, eta=0.5, max_draws=None),  # eta opens it
        lambda: optax_gqc.mht(sgd(), 0.0, 0.0, max_draws=None),  # an empty interval: it opens
        # inject_hyperparams builds it at init from the schedule's first value, 0
        lambda: optax.inject_hyperparams(optax_gqc.gnts)(
            sgd(), threshold=optax.linear_schedule(0.0, 5.0, 4), max_draws=None
        ),
        lambda: optax.inject_hyperparams(optax_gqc.norm_test_accumulation)(
            sgd(), eta=optax.linear_schedule(0.0, 5.0, 4), max_draws=None
        ),
        lambda: optax.inject_hyperparams(optax_gqc.mht)(
            sgd(), 0.5, percent_error=optax.linear_schedule(0.0, 5.0, 4), max_draws=None
        ),
    ],
)
def test_a_bound_of_0_beside_one_that_opens_the_gate_is_accepted_and_steps(make):
  tx = make()
  params = {'w': jnp.zeros(2)}
  state = tx.init(params)
  for i in range(6):
    g = {'w': jnp.array([1.0, 1.0 + 0.1 * (i % 2)])}
    _, state = jax.jit(tx.update)(g, state, params, value=1.0 + 0.1 * i)
  assert int(optax_gqc.statistics(state)['num_steps']) >= 1


# ---------------------------------------------------------------------------
# Run time: nothing can raise under jit. A hyperparameter out of its domain
# closes the gate that reads it (max_draws then forces the steps, counted in
# num_forced) and counts in num_bad_hyperparams.


# gate(hyperparameter schedule), a value that opens it on every microbatch or two, bad values
BAD_AT_RUN_TIME = {
    'norm_below': (lambda v: gates.norm_below(v), 1e9, [np.nan, -1.0]),
    'norm_below_relative': (lambda v: gates.norm_below(v, relative=True), 1e9, [np.nan, -0.5]),
    'batch_size_at_least': (
        lambda v: gates.batch_size_at_least(v, 1),
        1.0,
        [np.nan, -8.0, np.inf],
    ),
    'critical_batch': (
        lambda v: gates.critical_batch(v, 1, max_batch_size=2),
        1.0,
        [np.nan, 0.0, -1.0],
    ),
    'noise_ratio_below': (lambda v: gates.noise_ratio_below(v), 1e9, [np.nan, -1.0]),
    'relative_error_below': (lambda v: gates.relative_error_below(v), 1e9, [np.nan, -1.0]),
    'loss_confidence': (lambda v: gates.loss_interval(v, 1e9), 0.5, [np.nan, 1.0, 95.0, -0.1]),
    'loss_percent_error': (lambda v: gates.loss_interval(0.5, v), 1e9, [np.nan, -0.1]),
}


LOSSES = [1.0] * 6  # constant: the loss gate's interval is tight at once


@functools.cache
def gate_update(name):
  """One jitted microbatch per gate, its hyperparameter an argument: one program for every value."""
  make = BAD_AT_RUN_TIME[name][0]

  def accumulation(value):
    # A schedule that returns the value: out of its domain, it reaches the gate at run time.
    return optax_gqc.accumulate(optax.sgd(0.1), make(lambda t: value), max_draws=3)

  @jax.jit
  def update(g, state, value, loss):
    _, state = accumulation(value).update(g, state, PARAMS, value=loss)
    return state, optax_gqc.statistics(state)

  return accumulation, update


def run_gate(name, v):
  """``run_stats`` of the accumulation with gate ``name`` at the constant hyperparameter ``v``."""
  accumulation, update = gate_update(name)
  value = jnp.float32(v)
  state = accumulation(value).init(PARAMS)
  out = []
  for g, loss in zip(grads(len(LOSSES)), LOSSES, strict=True):
    state, stats = update(g, state, value, loss)
    out.append(jax.tree.map(np.asarray, stats))
  return out


@pytest.mark.parametrize('name', sorted(BAD_AT_RUN_TIME))
def test_a_good_value_opens_the_gate(name):
  _, good, _ = BAD_AT_RUN_TIME[name]
  out = run_gate(name, good)
  assert int(out[-1]['num_steps']) >= 3 and int(out[-1]['num_forced']) == 0
  assert int(out[-1]['num_bad_hyperparams']) == 0


@pytest.mark.parametrize(
    'name, bad',
    [(name, bad) for name, (_, _, bads) in sorted(BAD_AT_RUN_TIME.items()) for bad in bads],
)
def test_a_bad_value_at_run_time_closes_the_gate_and_is_counted(name, bad):
  out = run_gate(name, bad)
  assert [int(s['num_steps']) for s in out] == [0, 0, 1, 1, 1, 2]  # forced by max_draws
  assert int(out[-1]['num_forced']) == 2
  assert [int(s['num_bad_hyperparams']) for s in out] == [1, 2, 3, 4, 5, 6]


def test_a_schedule_that_turns_nan_mid_run_is_counted_while_it_lasts():
  threshold = lambda t: jnp.where((t >= 2) & (t < 5), jnp.nan, 1e9)  # noqa: E731
  out = run_stats(optax_gqc.gnts(optax.sgd(0.1), threshold, max_draws=2), num=7)
  assert [int(s['num_steps']) for s in out] == [1, 2, 2, 3, 3, 4, 5]
  assert [int(s['num_bad_hyperparams']) for s in out] == [0, 0, 1, 2, 3, 3, 3]
  assert int(out[-1]['num_forced']) == 1  # microbatch 3; 4 steps only when 5 reopens it


def test_an_injected_nan_threshold_is_counted_and_forced():
  tx = optax.inject_hyperparams(optax_gqc.gnts)(optax.sgd(0.1), threshold=1e9, max_draws=2)

  def poison(i, state):
    if i == 2:
      state.hyperparams['threshold'] = jnp.asarray(jnp.nan)
    return state

  out = run_stats(tx, num=6, state_hook=poison)
  assert [int(s['num_steps']) for s in out] == [1, 2, 2, 3, 3, 4]
  assert int(out[-1]['num_forced']) == 2
  assert int(out[-1]['num_bad_hyperparams']) == 4
  assert np.isnan(out[-1]['threshold'])


def test_an_injected_max_draws_below_one_steps_every_microbatch_and_is_counted():
  tx = optax.inject_hyperparams(optax_gqc.gnts)(optax.sgd(0.1), threshold=0.0, max_draws=4)

  def zero(i, state):
    state.hyperparams['max_draws'] = jnp.asarray(0 if i >= 2 else 4, jnp.int32)
    return state

  out = run_stats(tx, num=5, state_hook=zero)
  assert [int(s['num_steps']) for s in out] == [0, 0, 1, 2, 3]
  assert [int(s['num_bad_hyperparams']) for s in out] == [0, 0, 1, 2, 3]
  assert int(out[2]['last_num_draws']) == 3 and int(out[-1]['last_num_draws']) == 1


def test_an_injected_nan_noise_decay_keeps_the_estimates_and_is_counted():
  tx = optax.inject_hyperparams(optax_gqc.accumulate)(
      optax.sgd(0.1), gates.batch_size_at_least(2, 1)
  )

  def poison(i, state):
    if i == 4:
      state.hyperparams['noise_decay'] = jnp.asarray(jnp.nan)
    return state

  ref = run_stats(tx, num=6)  # the same program, its state left alone
  out = run_stats(tx, num=6, state_hook=poison)
  for name in ('grad_sq_norm_est', 'trace_cov_est'):
    assert float(out[3][name]) == float(ref[3][name])
    # The step at microbatch 5 folds no estimate: the estimates stay as they were.
    assert float(out[-1][name]) == float(out[3][name])
    assert float(ref[-1][name]) != float(ref[3][name])
  assert int(out[-1]['num_bad_hyperparams']) == 2 and int(ref[-1]['num_bad_hyperparams']) == 0


@pytest.mark.parametrize('bad', [jnp.nan, 1.0, 1.5])
def test_an_injected_gate_decay_outside_its_range_keeps_the_ema_and_is_counted(bad):
  # The EMA took it (a NaN, a frozen or an exploding average), and nothing counted it.
  def relative(inner, decay):
    return optax_gqc.accumulate(
        inner, gates.norm_below(1e9, relative=True, decay=decay), max_draws=2
    )

  for factory, ema, values in (
      (optax_gqc.mht, 'loss_ema', [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]),
      (relative, 'grad_norm_ema', None),
  ):
    kwargs = {'confidence': 0.5, 'percent_error': 0.5, 'max_draws': 2} if values else {}
    tx = optax.inject_hyperparams(factory)(optax.sgd(0.1), decay=0.5, **kwargs)

    def poison(i, state):
      state.hyperparams['decay'] = jnp.asarray(bad if i in (2, 3) else 0.5)
      return state

    out = run_stats(tx, num=6, values=values, state_hook=poison)
    assert float(out[3][ema]) == float(out[1][ema]) != float(out[4][ema])
    assert [int(s['num_bad_hyperparams']) for s in out] == [0, 0, 1, 2, 2, 2]
    assert int(out[3]['num_forced']) == 1  # microbatches 2 and 3: closed, then forced


def test_an_injected_microbatch_size_below_one_closes_the_gate_and_is_counted():
  # With 0 no step came again (sbc has no max_draws by default), and nothing counted it.
  tx = optax.inject_hyperparams(optax_gqc.sbc)(
      optax.sgd(0.1), logical_batch_size=4, microbatch_size=2, max_draws=4
  )

  def zero(i, state):
    state.hyperparams['microbatch_size'] = jnp.asarray(0 if i >= 2 else 2, jnp.int32)
    return state

  out = run_stats(tx, num=6, state_hook=zero)
  assert [int(s['num_steps']) for s in out] == [0, 1, 1, 1, 1, 2]
  assert [int(s['num_bad_hyperparams']) for s in out] == [0, 0, 1, 2, 3, 4]
  assert int(out[-1]['num_forced']) == 1


def test_sbc_with_no_max_draws_waits_out_a_nan_batch_size():
  # With no max_draws nothing forces a step: the accumulation waits until the
  # schedule is valid again, and counts the wait.
  batch = lambda t: jnp.where(t < 3, jnp.nan, 1.0)  # noqa: E731
  out = run_stats(optax_gqc.sbc(optax.sgd(0.1), batch, 1), num=5)
  assert [int(s['num_steps']) for s in out] == [0, 0, 0, 1, 2]
  assert int(out[3]['last_num_draws']) == 4
  assert int(out[-1]['num_bad_hyperparams']) == 3


def test_a_nan_loss_with_finite_gradients_is_rejected_by_the_loss_gate():
  # Constant losses: the interval is tight at once, a step on every microbatch.
  # A NaN loss is left out: it neither blocks the gate until max_draws (as it
  # would if it entered the loss EMA) nor opens it.
  tx = optax_gqc.mht(optax.sgd(0.1), confidence=0.9, percent_error=0.1, max_draws=20)
  out = run_stats(tx, num=5, values=[1.0, jnp.nan, 1.0, jnp.inf, 1.0])
  assert [int(s['num_steps']) for s in out] == [1, 1, 2, 2, 3]
  assert [int(s['last_num_draws']) for s in out][-1] == 2
  assert int(out[-1]['num_skipped_losses']) == 2
  assert int(out[-1]['num_forced']) == 0 and int(out[-1]['num_skipped']) == 0
  assert float(out[-1]['loss_ema']) == 1.0


def test_only_nan_losses_keep_the_loss_gate_closed_until_max_draws():
  tx = optax_gqc.mht(optax.sgd(0.1), confidence=0.9, percent_error=0.1, max_draws=3)
  out = run_stats(tx, num=3, values=[jnp.nan] * 3)
  assert [int(s['num_steps']) for s in out] == [0, 0, 1]
  assert int(out[-1]['num_forced']) == 1 and int(out[-1]['num_skipped_losses']) == 3


# ---------------------------------------------------------------------------
# Inputs that were silently wrong.


def test_float16_gradients_accumulate_in_float32_and_keep_the_params_finite():
  # Four microbatches of 4e4 sum past float16's 65504; the float32 accumulator
  # holds them and the mean, 4e4, is a float16 again.
  params = {'w': jnp.zeros(3, jnp.float16)}
  tx = optax_gqc.sbc(optax.sgd(1.0), 4, 1)
  state = tx.init(params)
  update = jax.jit(tx.update)
  for _ in range(4):
    updates, state = update({'w': jnp.full(3, 4e4, jnp.float16)}, state, params)
  assert int(state.num_steps) == 1 and int(state.num_skipped) == 0
  np.testing.assert_array_equal(np.asarray(updates['w'], np.float32), -4e4)


@functools.cache
def relative_norm_scan():
  """The relative-threshold accumulation, and one jitted scan of it over a stacked stream."""
  tx = optax_gqc.accumulate(optax.sgd(0.1), gates.norm_below(0.5, relative=True), max_draws=64)

  def body(state, g):
    _, state = tx.update(g, state, PARAMS)
    return state, state.num_steps

  return tx, jax.jit(lambda state, stream: jax.lax.scan(body, state, stream))


def relative_norm_steps(first_zero, num=300, seed=1):
  tx, scan = relative_norm_scan()
  stream = grads(num, seed)
  if first_zero:
    stream[0] = jax.tree.map(jnp.zeros_like, stream[0])
  state, steps = scan(tx.init(PARAMS), jax.tree.map(lambda *xs: jnp.stack(xs), *stream))
  return [int(x) for x in steps], state


def test_a_zero_first_microbatch_does_not_hold_the_relative_threshold():
  # Pure noise: the mean of n microbatches is about 1/sqrt(n) of one, so the
  # gate opens after about 4. A zero first microbatch used to seed the unit
  # at 0, step on the zero gradient, then keep the gate shut for hundreds of
  # microbatches (max_draws forced every step).
  ref, _ = relative_norm_steps(first_zero=False)
  steps, state = relative_norm_steps(first_zero=True)
  assert steps[0] == 0  # no step on the zero gradient
  assert ref[-1] >= 40
  assert abs(steps[-1] - ref[-1]) <= 0.1 * ref[-1], (steps[-1], ref[-1])
  assert int(state.num_forced) <= 2


def test_a_relative_threshold_waits_while_every_norm_is_zero():
  tx = optax_gqc.accumulate(optax.sgd(0.1), gates.norm_below(0.5, relative=True), max_draws=3)
  zeros = jax.tree.map(jnp.zeros_like, PARAMS)
  out = []
  state = tx.init(PARAMS)
  for _ in range(4):
    _, state = jax.jit(tx.update)(zeros, state, PARAMS)
    out.append((int(state.num_steps), int(state.num_forced)))
  assert out == [(0, 0), (0, 0), (1, 1), (1, 1)]


def test_sbc_with_no_max_draws_stops_stepping_on_a_schedule_that_stays_nan():
  # Documented (docs/robustness.md): nothing forces a step, and only the
  # counter says why no step comes; a max_draws bounds the wait.
  batch = lambda t: jnp.where(t < 2, 1.0, jnp.nan)  # noqa: E731
  out = run_stats(optax_gqc.sbc(optax.sgd(0.1), batch, 1), num=6)
  assert [int(s['num_steps']) for s in out] == [1, 2, 2, 2, 2, 2]
  assert int(out[-1]['num_bad_hyperparams']) == 4 and int(out[-1]['num_draws']) == 4
  out = run_stats(optax_gqc.sbc(optax.sgd(0.1), batch, 1, max_draws=2), num=6)
  assert [int(s['num_steps']) for s in out] == [1, 2, 2, 3, 3, 4]
  assert int(out[-1]['num_forced']) == 2


def test_torch_tensors_raise_naming_the_conversion():
  torch = pytest.importorskip('torch')
  tx = optax_gqc.gnts(sgd(), 0.5)
  with pytest.raises(TypeError, match=r"param \['w'\] is a torch tensor: convert it first"):
    tx.init({'w': torch.ones(3)})
  grads = {'w': torch.ones(2, 3), 'b': torch.ones(3)}
  with pytest.raises(TypeError, match=r"gradient \['b'\] is a torch tensor.*to_jax"):
    tx.update(grads, tx.init(PARAMS), PARAMS)
  gnr = optax_gqc.gnr(sgd(), 1.0)
  with pytest.raises(TypeError, match=r'is a torch tensor.*grads_to_jax'):
    gnr.update(grads, gnr.init(PARAMS))
