"""Helpers shared by the test modules: gradient streams, a jitted run, what XLA makes of a cond."""

import re

import jax
import jax.numpy as jnp
import optax

PARAMS = {'w': jnp.arange(12.0).reshape(3, 4) / 10, 'b': jnp.ones(4)}


def grad_stream(num, seed=0, scale=1.0, params=PARAMS):
  """Random microbatch gradients shaped like ``params``."""
  keys = jax.random.split(jax.random.key(seed), num)
  # Indexed: iterating over a key array compiles an unstack program per length.
  return [
      jax.tree.map(lambda p, k=keys[i]: scale * jax.random.normal(k, p.shape, p.dtype), params)
      for i in range(num)
  ]


def division_rtol() -> float:
  """The relative tolerance of a golden value a float32 division away: 0 on the CPU.

  XLA:CPU's float32 division is correctly rounded, so there the value is exact;
  XLA:GPU's is not (on an H100, 12000 / 500 gave 24.000002), so elsewhere it
  may be an ulp or two off.
  """
  return 0.0 if jax.default_backend() == 'cpu' else 4 * float(jnp.finfo(jnp.float32).eps)


def run(tx, grads, params=PARAMS, apply=True, **extra_args):
  """Runs ``tx`` under jit over ``grads``; returns per-call updates, states, params."""
  update = jax.jit(tx.update)
  state = tx.init(params)
  out = []
  for g in grads:
    updates, state = update(g, state, params, **extra_args)
    if apply:
      params = optax.apply_updates(params, updates)
    out.append((updates, state, params))
  return out


# XLA's conditional simplifier replaces a two-way cond with a select between its
# branches' results when every instruction of both branches is elementwise or
# one of _CHEAP (xla/service/conditional_simplifier.cc). Calls are inlined first.
# It also keeps a cond with a branch that returns a lone parameter array, which
# is not modelled here: the engine's branches return tuples.
_CHEAP = set('broadcast concatenate dynamic-slice get-tuple-element reduce reshape pad'.split())
_CHEAP |= {'parameter', 'slice', 'tuple', 'constant'}
_ELEMENTWISE = set(
    'abs add and atan2 bitcast-convert cbrt ceil clamp compare complex convert copy cosine divide'
    ' erf exponential exponential-minus-one floor imag is-finite log log-plus-one logistic'
    ' maximum minimum multiply negate not or popcnt power real remainder round-nearest-afz'
    ' round-nearest-even rsqrt select shift-left shift-right-arithmetic shift-right-logical sign'
    ' sine sqrt subtract tan tanh xor'.split()
)


def _opcode(instruction: str) -> str:
  """The opcode of one line of HLO text: ``name = type opcode(operands), ...``."""
  rest = instruction.split(' = ', 1)[1]
  if rest.startswith('('):  # a tuple type, which holds spaces
    depth = 0
    for i, c in enumerate(rest):
      depth += {'(': 1, ')': -1}.get(c, 0)
      if depth == 0:
        return rest[i + 1 :].split('(', 1)[0].strip()
  return rest.split(' ', 1)[1].split('(', 1)[0]


def selectable_conds(fn, *args) -> list[bool]:
  """For each cond of ``fn``'s program, whether XLA's simplifier may make it a select."""
  computations, name = {}, None
  for line in jax.jit(fn).lower(*args).as_text(dialect='hlo').splitlines():
    if line.endswith('{') and not line.startswith(' '):
      name = line.removeprefix('ENTRY ').split(' ', 1)[0]
      computations[name] = []
    elif line.startswith('}'):
      name = None
    elif name and ' = ' in line:
      computations[name].append(line.strip())

  def opcodes(computation: str) -> set[str]:
    found = set()
    for line in computations[computation]:
      if _opcode(line) == 'call':
        found |= opcodes(re.search(r'to_apply=([\w.-]+)', line).group(1))
      else:
        found.add(_opcode(line))
    return found

  conds = [
      line for lines in computations.values() for line in lines if _opcode(line) == 'conditional'
  ]
  result = []
  for line in conds:
    branches = re.findall(r'[\w.-]+', re.search(r'branch_computations=\{([^}]*)\}', line).group(1))
    used = set().union(*(opcodes(b) for b in branches))
    result.append(len(branches) == 2 and used <= _CHEAP | _ELEMENTWISE)
  return result
