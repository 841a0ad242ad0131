"""Every schedule of optax_gqc.schedules against torch-schedule-anything on [0, M]."""

import pytest

torch = pytest.importorskip('torch')
tsa = pytest.importorskip('torch_schedule_anything')

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from parity_common import tsa_values  # noqa: E402

from optax_gqc import schedules  # noqa: E402

pytestmark = pytest.mark.filterwarnings('ignore:Detected call of:UserWarning')

W, A, R = 2.5, 0.3, 7.0  # value after warmup, final value, inverse-warmup multiplier


# name: (ours(L, M, P), torch-schedule-anything's(optimizer, L, M, P)).
PAIRS = {
    'constant_with_warmup': (
        lambda L, M, P: schedules.constant_with_warmup(W, L),
        lambda opt, L, M, P: tsa.constant_with_warmup(opt, W, L),
    ),
    'constant_with_inverse_warmup': (
        lambda L, M, P: schedules.constant_with_inverse_warmup(W, L, R),
        lambda opt, L, M, P: tsa.constant_with_inverse_warmup(opt, W, L, R),
    ),
    'cosine_with_warmup': (
        lambda L, M, P: schedules.cosine_with_warmup(W, A, L, M),
        lambda opt, L, M, P: tsa.cosine_annealing_with_warmup(opt, W, A, L, M),
    ),
    'cosine_with_inverse_warmup': (
        lambda L, M, P: schedules.cosine_with_inverse_warmup(W, A, L, M, R),
        lambda opt, L, M, P: tsa.cosine_annealing_with_inverse_warmup(opt, W, A, L, M, R),
    ),
    'polynomial_with_warmup': (
        lambda L, M, P: schedules.polynomial_with_warmup(W, A, L, M, P),
        lambda opt, L, M, P: tsa.polynomial_schedule_with_warmup(opt, W, A, L, M, P),
    ),
    'polynomial_with_inverse_warmup': (
        lambda L, M, P: schedules.polynomial_with_inverse_warmup(W, A, L, M, P, R),
        lambda opt, L, M, P: tsa.polynomial_schedule_with_inverse_warmup(opt, W, A, L, M, P, R),
    ),
}

# torch-schedule-anything's fixed powers, ported as docs/migration.md says: the
# polynomial of power 1, 2 or 0.5 (the power argument P is not theirs).
for _name, _power in [('linear', 1.0), ('quadratic', 2.0), ('sqrt', 0.5)]:
  PAIRS[f'{_name}_with_warmup'] = (
      lambda L, M, P, q=_power: schedules.polynomial_with_warmup(W, A, L, M, q),
      lambda opt, L, M, P, n=_name: getattr(tsa, f'{n}_schedule_with_warmup')(opt, W, A, L, M),
  )
  PAIRS[f'{_name}_with_inverse_warmup'] = (
      lambda L, M, P, q=_power: schedules.polynomial_with_inverse_warmup(W, A, L, M, q, R),
      lambda opt, L, M, P, n=_name: getattr(tsa, f'{n}_schedule_with_inverse_warmup')(
          opt, W, A, L, M, R
      ),
  )
PAIRS['constant_schedule'] = (
    lambda L, M, P: lambda t: jnp.full(jnp.shape(t), W),
    lambda opt, L, M, P: tsa.constant_schedule(opt, W),
)


@pytest.mark.parametrize('warmup,total,power', [(20, 120, 2.0), (0, 50, 0.5), (15, 15, 3.0)])
@pytest.mark.parametrize('name', list(PAIRS))
def test_schedule_equals_torch_schedule_anything_up_to_the_end(name, warmup, total, power):
  ours, theirs = PAIRS[name]
  steps = np.arange(total + 1)
  expected = np.array(tsa_values(lambda opt: theirs(opt, warmup, total, power), total + 1))
  got = np.asarray(ours(warmup, total, power)(jnp.asarray(steps)), np.float64)
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6 * W * R)
