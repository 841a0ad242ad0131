"""SGD-SaI: SGD with momentum, each leaf's step scaled once by its gradient SNR.

The learning rate of every parameter leaf is scaled at initialisation by the
gradient signal-to-noise ratio (g-SNR) of that leaf's first gradient, and the
scale is then kept for the whole run. The optimizer state is one param-sized
momentum buffer plus a few scalars per leaf: half the state of AdamW at the same dtypes.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_gqc import _checks
from optax_gqc._numerics import complex_for, power_of_two_near, sq_abs, widened


class ScaleByGsnrState(NamedTuple):
  """State of :func:`scale_by_gsnr`. Every field has its final shape from ``init``."""

  # Per leaf, a bool scalar: the leaf's g-SNR has been taken (from its first
  # non-zero updates) and is fixed from then on.
  computed: Any
  # Per leaf, a float32 scalar: the factor applied to the leaf's updates, its
  # g-SNR divided by ``normalizer``; 0 until ``computed``.
  gsnr: Any
  # float32: what every raw g-SNR is divided by. 1 without ``normalize``; with
  # it, 0 until the first update that takes any g-SNR, then the largest raw
  # g-SNR taken by that update, fixed from then on.
  normalizer: jax.Array


class SgdSaiMomentumState(NamedTuple):
  """State of the momentum inside :func:`sgd_sai`."""

  count: jax.Array  # int32: updates seen; the first one starts the average.
  mu: optax.Updates  # the running average of the g-SNR-scaled gradients.


def _leaf_gsnr(u: jax.Array, eps: Any) -> tuple[jax.Array, jax.Array]:
  """The float32 g-SNR of one leaf, and whether the leaf can give one (finite, non-zero).

  Taken on the leaf divided by a power of two near its largest modulus: the
  same bits as on the leaf itself wherever those squares are in float32's
  range, and no square overflows or flushes to zero where they are not (a
  first gradient of 1e20, or of 1e-25). A leaf that is not finite waits, as
  a zero one does. Two passes: the mean, as the largest entry plus the mean
  offset from it (a reduction, where a first entry would slice a sharded
  leaf), then the spread about it. A constant leaf gets its own value as the
  mean, hence a spread of exactly zero, which marks it degenerate (g-SNR 1).
  A complex leaf takes the modulus in both, about its complex mean, as
  ``torch.std`` does (its reference is the largest real part and the largest
  imaginary part).
  """
  x = widened(u).ravel()
  if x.size == 0:
    return jnp.ones([], jnp.float32), jnp.zeros([], bool)
  top = jnp.max(jnp.abs(x))
  usable = jnp.isfinite(top) & (top > 0)
  scale = power_of_two_near(top)
  x = x / scale  # exact: a power of two
  if x.size < 2:  # no spread is defined for one element
    return jnp.ones([], jnp.float32), usable
  norm = jnp.sqrt(jnp.sum(sq_abs(x)))
  ref = jnp.max(x.real)
  if jnp.iscomplexobj(x):
    ref = jax.lax.complex(ref, jnp.max(x.imag))
  center = ref + jnp.mean(x - ref)  # exactly the entries' value when they are equal
  std = jnp.sqrt(jnp.sum(sq_abs(x - center)) / (x.size - 1))
  gsnr = jnp.where(std > 0, norm / (std + jnp.asarray(eps, jnp.float32) / scale), 1.0)
  return gsnr.astype(jnp.float32), usable


def scale_by_gsnr(eps: float = 1e-8, normalize: bool = False) -> optax.GradientTransformation:
  r"""Scales each leaf by the g-SNR of the first non-zero updates it receives.

  For a leaf :math:`p` with :math:`n` entries whose updates :math:`u_p` are
  non-zero for the first time, the gradient signal-to-noise ratio is

  .. math::

    \mathrm{gsnr}_p = \frac{\|u_p\|_2}{\sigma(u_p) + \epsilon}, \qquad
    \sigma(u) = \sqrt{\frac{1}{n - 1} \sum_{i=1}^{n} (u_i - \bar u)^2},

  computed in float32 whatever the leaves' dtype, stored in the state, and
  never recomputed: from then on every update of the leaf is multiplied by it,
  :math:`u_p \leftarrow \mathrm{gsnr}_p \, u_p`. A leaf whose updates are
  still all zero has no g-SNR yet (its factor is 0, which changes nothing) and
  takes it from its first non-zero updates.

  Degenerate leaves get :math:`\mathrm{gsnr}_p = 1`: those with one entry (no
  spread is defined) and those whose first non-zero updates are constant
  (:math:`\sigma = 0`). The ratio is then undefined or infinite rather than
  merely large, since a single number, or :math:`n` equal ones, carry no
  measure of noise; any finite stand-in is a convention, and 1 is the neutral
  one: the leaf takes its updates unscaled (plain SGD with momentum in
  :func:`sgd_sai`), whatever ``eps`` and the gradient's scale. It is also the
  smallest g-SNR of any leaf with spread, since
  :math:`\|u\|^2 = (n - 1)\sigma^2 + n \bar u^2` gives
  :math:`\|u\| / \sigma \ge \sqrt{n - 1} \ge 1`: a degenerate leaf never
  steps faster than a measured one (up to ``eps``). Constancy is tested
  exactly: the spread is taken about a mean that is exactly the entries'
  value when they are equal, so equal entries give :math:`\sigma = 0`
  exactly, not the rounding noise of a float32 mean. Updates that are not
  finite are not taken: the leaf waits for finite ones, as for non-zero ones.

  With ``normalize``, every g-SNR is divided by the largest one taken by the
  first update that takes any (the paper's pseudocode), so the largest factor
  is 1 (set as 1, not computed as a quotient, which XLA:GPU may round below).
  A leaf that takes its g-SNR later is divided by the same number, so no
  factor changes once set (and a late one may exceed 1).

  Args:
    eps: added to :math:`\sigma` in the denominator; must be positive and finite.
    normalize: divide every g-SNR by the largest one.

  Returns:
    A :class:`optax.GradientTransformation`. The per-leaf factors are in the
    state's ``gsnr`` field (``optax.tree.get(state, 'gsnr')``).

  Example:
    >>> import jax.numpy as jnp, optax_gqc
    >>> tx = optax_gqc.scale_by_gsnr()
    >>> state = tx.init({'w': jnp.zeros(4)})
    >>> u, state = tx.update({'w': jnp.array([1.0, 2.0, 3.0, 4.0])}, state)
    >>> print(f"{float(state.gsnr['w']):.4f}")  # sqrt(30) / std([1, 2, 3, 4])
    4.2426
    >>> u, state = tx.update({'w': jnp.array([1.0, 0.0, 0.0, 0.0])}, state)
    >>> print(u['w'])  # scaled by the first g-SNR, not recomputed
    [4.2426405 0.        0.        0.       ]

  References:
    Xu et al, `No More Adam: Learning Rate Scaling at Initialization is All You
    Need <https://arxiv.org/abs/2412.11768>`_, 2024
  """
  _checks.check_positive('eps', eps, finite=True)
  _checks.check_bool('normalize', normalize)
  return _scale_by_gsnr(eps, normalize)


def _scale_by_gsnr(eps: float, normalize: bool, dtype: Any | None = None):
  """:func:`scale_by_gsnr`, its scaled updates in at least ``dtype``.

  :func:`sgd_sai` passes its ``mu_dtype``: a float16 gradient times its g-SNR
  then reaches a float32 momentum without overflowing float16 on the way.
  """

  dtype = None if dtype is None else jax.dtypes.canonicalize_dtype(dtype)

  def out_dtype(u):
    return u.dtype if dtype is None else jnp.promote_types(u.dtype, dtype)

  def init_fn(params):
    return ScaleByGsnrState(
        # A leaf of no elements never gets a non-zero gradient: nothing to wait
        # for, and no g-SNR (NaN, which the report leaves out).
        computed=jax.tree.map(lambda p: jnp.asarray(jnp.size(p) == 0), params),
        gsnr=jax.tree.map(
            lambda p: jnp.full([], jnp.nan if jnp.size(p) == 0 else 0.0, jnp.float32), params
        ),
        normalizer=jnp.asarray(0.0 if normalize else 1.0, jnp.float32),
    )

  def update_fn(updates, state, params=None):
    del params
    updates = jax.tree.map(jnp.asarray, updates)  # a Python float too, as optax.sgd takes
    for path, u in jax.tree_util.tree_leaves_with_path(updates):
      _checks.check_inexact(f'the gradient {jax.tree_util.keystr(path)}', u, 'its g-SNR')
    leaves, treedef = jax.tree.flatten(updates)
    done = treedef.flatten_up_to(state.computed)
    old = treedef.flatten_up_to(state.gsnr)

    def keep():
      return done, old, state.normalizer

    def take():  # runs only until every leaf has its g-SNR
      stats = [_leaf_gsnr(u, eps) for u in leaves]
      new = [~c & nonzero for c, (_, nonzero) in zip(done, stats, strict=True)]
      normalizer = state.normalizer
      divisor = 1.0
      if normalize:
        largest = jnp.max(
            jnp.stack([jnp.where(n, r, 0.0) for n, (r, _) in zip(new, stats, strict=True)])
        )
        normalizer = jnp.where(normalizer > 0, normalizer, largest)
        divisor = jnp.where(normalizer > 0, normalizer, 1.0)
      gsnr = [
          jnp.where(n, jnp.where(r == divisor, 1.0, r / divisor), g).astype(jnp.float32)
          for n, (r, _), g in zip(new, stats, old, strict=True)
      ]
      computed = [c | n for c, n in zip(done, new, strict=True)]
      return computed, gsnr, normalizer

    if leaves:
      all_done = jnp.all(jnp.stack(done))
      done, gsnr, normalizer = jax.lax.cond(all_done, keep, take)
    else:
      gsnr, normalizer = old, state.normalizer
    # A leaf that waits gives zeros: its g-SNR of 0 times a NaN gradient would be NaN.
    updates = treedef.unflatten(
        [
            jnp.where(c, s * u, 0).astype(out_dtype(u))
            for u, s, c in zip(leaves, gsnr, done, strict=True)
        ]
    )
    return updates, ScaleByGsnrState(
        computed=treedef.unflatten(done),
        gsnr=treedef.unflatten(gsnr),
        normalizer=normalizer,
    )

  return optax.GradientTransformation(init_fn, update_fn)


def _momentum(decay: Any, mu_dtype: Any | None = None) -> optax.GradientTransformation:
  r"""Exponential moving average started at the first updates, not at zero.

  :math:`m_1 = u_1`, then :math:`m_t = \mu m_{t-1} + (1 - \mu) u_t`, kept in
  ``mu_dtype`` (by default the params' dtype; complex for a complex leaf,
  whose imaginary part a real ``mu_dtype`` would drop).
  """
  mu_dtype = None if mu_dtype is None else jax.dtypes.canonicalize_dtype(mu_dtype)

  def zeros(p):
    return jnp.zeros_like(p, dtype=None if mu_dtype is None else complex_for(mu_dtype, p))

  def init_fn(params):
    return SgdSaiMomentumState(count=jnp.zeros([], jnp.int32), mu=jax.tree.map(zeros, params))

  def update_fn(updates, state, params=None):
    del params
    first = state.count == 0

    def average(u, m):
      return jnp.where(first, u, decay * m + (1 - decay) * u).astype(m.dtype)

    mu = jax.tree.map(average, updates, state.mu)
    return mu, SgdSaiMomentumState(count=optax.safe_increment(state.count), mu=mu)

  return optax.GradientTransformation(init_fn, update_fn)


def sgd_sai(
    learning_rate: optax.ScalarOrSchedule,
    momentum: float = 0.9,
    *,
    weight_decay: optax.ScalarOrSchedule = 1e-2,
    eps: float = 1e-8,
    mask: Any | None = None,
    normalize: bool = False,
    mu_dtype: Any | None = None,
) -> optax.GradientTransformationExtraArgs:
  r"""SGD with momentum whose per-leaf step sizes are set once, by the g-SNR.

  SGD-SaI (SGD with learning-rate Scaling at Initialization). Each parameter
  leaf :math:`p` gets a fixed factor :math:`s_p`, the g-SNR of its first
  non-zero gradient (see :func:`scale_by_gsnr`), and then with learning rate
  :math:`\eta_t`, momentum :math:`\mu` and weight decay :math:`\lambda`:

  .. math::

    \begin{align*}
      m_1 &= g_1, \qquad m_t = \mu\, m_{t-1} + (1 - \mu)\, g_t, \\
      \theta_t &= (1 - \eta_t \lambda)\, \theta_{t-1}
        - \eta_t\, s_p\, m_t.
    \end{align*}

  It is ``optax.chain(scale_by_gsnr(eps, normalize), momentum,
  optax.add_decayed_weights(weight_decay, mask),
  optax.scale_by_learning_rate(learning_rate))``. As :math:`s_p` is constant,
  scaling before the momentum gives the same update; the buffer holds
  :math:`s_p m_t`, and the g-SNR is read from the raw gradient. Once every
  leaf has its g-SNR, its reductions are skipped (a ``jax.lax.cond``) and a
  step costs about the element-wise work of :func:`optax.sgd` with momentum
  (under ``jax.vmap``, an ensemble, the cond becomes selects and the
  reductions run on every step). A leaf whose gradient is always zero (a
  parameter the loss does not use) never gets one, and keeps every leaf's reductions running
  (``statistics(state)['num_pending_gsnr']`` counts such leaves): leave it out
  of the optimizer, e.g. ``optax.partition`` with ``optax.set_to_zero()``. The
  state is one param-sized buffer (in ``mu_dtype``) and a few scalars per
  leaf, half the state of :func:`optax.adamw` with its moments in the same
  dtype (a float32 ``mu_dtype`` for float16 params is the size of the default
  ``adamw``'s state, which keeps float16 moments there); the g-SNR is part of
  it, so it survives a save and restore.

  Differences from the reference: the PyTorch ``SGD_sai`` (``sgd-sai`` 1.0.3)
  is matched step for step where it is well defined (up to float32 rounding:
  it multiplies the parameters by :math:`1 - \eta\lambda` rounded to float32,
  where this subtracts :math:`\eta\lambda\theta`), and ours differs in five
  cases.

  * A one-element leaf (its standard deviation is NaN, read as 0) or one whose
    first gradient is constant (0, or float32 rounding noise) gets up to
    :math:`\|g\| / \epsilon` in the reference, :math:`10^8` for a
    one-element gradient of 1, and the parameter explodes. Ours gives such a leaf
    g-SNR 1, plain SGD with momentum; :func:`scale_by_gsnr` explains why.
  * ``momentum=0`` raises in the reference (its buffer is never made); here it
    is plain g-SNR-scaled SGD with decoupled weight decay.
  * A leaf whose first gradient is all zero gets g-SNR 0 in the reference and
    never moves again but for the decay. Here it takes its g-SNR from its
    first non-zero gradient. Its momentum still starts at the first step, so
    it rises from zero: :math:`m = (1 - \mu) g` on that gradient.
  * The reference keeps "g-SNR done" outside its ``state_dict``, so a resumed
    run recomputes the g-SNR from a mid-training gradient. Here it is part of
    the state.
  * A first gradient with a NaN gives the reference a NaN g-SNR (every later
    update NaN), one with an Inf an infinite g-SNR (the parameters go to
    inf); here the leaf waits for a finite one, and its momentum starts as an
    all-zero leaf's does (above) if the step counter has moved on. One whose
    float32 squares overflow (entries from about 1e19) or all underflow
    gives the reference an infinite or zero norm; here the g-SNR is the
    formula's (taken on the leaf divided by a power of two).

  ``normalize=True`` divides every g-SNR by the largest (the paper's
  pseudocode; the reference does not).

  Args:
    learning_rate: :math:`\eta`, a constant or an :class:`optax.Schedule`.
    momentum: :math:`\mu \in [0, 1)`, the decay of the moving average.
    weight_decay: :math:`\lambda`, decoupled: parameters shrink by
      :math:`\eta_t \lambda` per step. A constant or a schedule.
    eps: added to the standard deviation in the g-SNR; must be positive and finite.
    mask: which leaves decay, as in :func:`optax.add_decayed_weights`: a tree
      of bools shaped like (a prefix of) the params, or a function of the
      params returning one; not a bare bool (under
      :func:`optax.inject_hyperparams` a function arrives as one: list
      ``mask`` in its ``static_args``).
    normalize: divide every g-SNR by the largest one.
    mu_dtype: dtype of the momentum buffer; by default the params' dtype. A
      real one is made complex for complex leaves.
      The g-SNR is always computed and kept in float32. A wider ``mu_dtype``
      also holds the gradient times its g-SNR on its way into the buffer: with
      float16 params, pass ``jnp.float32`` (a g-SNR of 1e3 times a gradient of
      70 overflows float16, while the reference, which applies the g-SNR to
      the step, does not).

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`; it needs ``params`` in
    ``update``. Works under :func:`optax.inject_hyperparams` and ``jax.jit``;
    injected values are not checked, as Optax's own optimizers do not check
    theirs (a momentum above 1, or a NaN learning rate, diverges), and no
    counter records them.

  Example:
    >>> import jax, jax.numpy as jnp, optax, optax_gqc
    >>> tx = optax_gqc.sgd_sai(learning_rate=1e-2, momentum=0.9, weight_decay=0.0)
    >>> params = {'w': jnp.array([1.0, 2.0, 3.0]), 'b': jnp.array([0.5])}
    >>> state = tx.init(params)
    >>> grads = {'w': jnp.array([0.3, -0.1, 0.2]), 'b': jnp.array([0.4])}
    >>> updates, state = jax.jit(tx.update)(grads, state, params)
    >>> params = optax.apply_updates(params, updates)
    >>> gsnr = optax.tree.get(state, 'gsnr')  # 1 for the one-element 'b'
    >>> print({k: round(float(v), 4) for k, v in gsnr.items()})
    {'b': 1.0, 'w': 1.7974}
    >>> print(params['b'])  # 0.5 - 1e-2 * 1 * 0.4
    [0.496]

  References:
    Xu et al, `No More Adam: Learning Rate Scaling at Initialization is All You
    Need <https://arxiv.org/abs/2412.11768>`_, 2024
  """
  _checks.check_scalar_or_schedule('learning_rate', learning_rate, finite=True)
  _checks.check_unit_interval('momentum', momentum)
  _checks.check_scalar_or_schedule('weight_decay', weight_decay, finite=True)
  _checks.check_positive('eps', eps, finite=True)
  _checks.check_bool('normalize', normalize)
  _checks.check_float_dtype('mu_dtype', mu_dtype)
  if isinstance(mask, str | bytes):  # a name pattern, as in some torch param-group code
    raise TypeError(
        f'mask must be a tree of bools shaped like the params, or a function of the params, '
        f'got the string {mask!r}: select by a function, e.g. no decay on vectors, '
        'mask=lambda params: jax.tree.map(lambda p: p.ndim > 1, params)'
    )
  if isinstance(mask, bool | int | float | np.generic | jax.Array | np.ndarray):
    # A number, or an array (jnp.array([0.])), would be a one-leaf mask for the
    # whole tree: all or nothing decays.
    # It is also what optax.inject_hyperparams passes for a function: its value at the step count.
    raise TypeError(
        f'mask must be a tree of bools shaped like the params, or a function of the params, '
        f'got {mask!r} (pass weight_decay=0 for no decay, or mask=None to decay every leaf). '
        'A function under ' + _checks.INJECTED_FUNCTION.format(name='mask')
    )
  return optax.chain(
      _scale_by_gsnr(eps, normalize, mu_dtype),
      _momentum(momentum, mu_dtype),
      optax.add_decayed_weights(weight_decay, mask),
      optax.scale_by_learning_rate(learning_rate),
  )


def gsnr_report(s: ScaleByGsnrState) -> dict[str, jax.Array]:
  """What ``statistics`` logs of the g-SNR: its range over the leaves that have it."""
  computed = [jnp.asarray(c) for c in jax.tree.leaves(s.computed)]
  if not computed:  # no parameters
    nan = jnp.full([], jnp.nan, jnp.float32)
    return {'gsnr_min': nan, 'gsnr_max': nan, 'num_pending_gsnr': jnp.zeros([], jnp.int32)}
  computed = jnp.stack(computed)
  gsnr = jnp.stack([jnp.asarray(g) for g in jax.tree.leaves(s.gsnr)])
  has = computed & ~jnp.isnan(gsnr)  # a leaf of no elements has none
  some = jnp.any(has)
  return {
      'gsnr_min': jnp.where(some, jnp.min(jnp.where(has, gsnr, jnp.inf)), jnp.nan),
      'gsnr_max': jnp.where(some, jnp.max(jnp.where(has, gsnr, -jnp.inf)), jnp.nan),
      'num_pending_gsnr': jnp.sum(~computed, dtype=jnp.int32),
  }


def momentum_report(s: SgdSaiMomentumState) -> dict[str, jax.Array]:
  """What ``statistics`` logs of SGD-SaI's momentum: its count of steps."""
  return {'num_microbatches': s.count, 'num_steps': s.count}
