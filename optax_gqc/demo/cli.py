"""The command line: the flags, their defaults and ranges, and the checks of the inputs."""

import argparse
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from optax_gqc.demo.arms import ARMS, FRONTIER
from optax_gqc.demo.data import stdlib_corpus

# The main job's arms: --study runs every arm of ARMS.
DEFAULT_ARMS = ('control', 'fixed2', 'fixed3', 'fixed4', 'critical', 'gnts', 'seesaw')

DEFAULT_TOKENS = 400_000
# --quick: these defaults, for the flags not given on the command line.
QUICK = {
    'out': './gqc-demo-quick-out',  # never the main job's folder
    'arms': ('control', 'fixed2', 'fixed4', 'critical'),
    'tokens': 40_000,
    'corpus_bytes': 400_000,
    'context': 32,
    'dim': 32,
    'layers': 1,
    'evals': 4,
}
STUDY_SEEDS = (0, 1)
MIN_CONTEXT = 4  # bytes per sequence: a shorter window gives attention next to nothing to read
# The microbatches are sampled before training: an int64 index per token while sampling
# and the int32 tokens kept, about 13 bytes per token at the peak (12.3 measured at context
# 64). --tokens is refused where that would pass this share of the machine's memory.
MAX_MEMORY_SHARE = 0.25
BYTES_PER_TOKEN = 13
MIN_MICROBATCHES = max(ARMS[a]['k'] for a in FRONTIER)  # so that every fixed arm steps


class _Parser(argparse.ArgumentParser):
  """Errors in one line, naming the flag; no usage block, no traceback."""

  def error(self, message):
    message = ' '.join(str(message).split())
    self.exit(2, f'{self.prog}: error: {message} (see --help)\n')


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
  """Shows every default but None and False (flags, and defaults said in the help)."""

  def _get_help_string(self, action):
    if action.default is None or action.default is False:
      return action.help
    return super()._get_help_string(action)


_INT32_MAX = 2**31 - 1  # the library's counts and the seeds are int32


def _int_at_least(low: int):
  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f'must be an integer, got {text!r}') from None
    if not low <= value <= _INT32_MAX:
      raise argparse.ArgumentTypeError(f'must be in [{low}, {_INT32_MAX}], got {value}')
    return value

  return parse


def _float_in(low: float, high: float, *, open_low: bool = False, open_high: bool = False):
  def parse(text: str) -> float:
    try:
      value = float(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f'must be a number, got {text!r}') from None
    too_low = value <= low if open_low else value < low
    too_high = value >= high if open_high else value > high
    if not math.isfinite(value) or too_low or too_high:
      interval = f"{'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
      raise argparse.ArgumentTypeError(f'must be in {interval}, got {text}')
    return value

  return parse


def _distinct(items: list, text: str, show=str) -> tuple:
  """``items`` as a tuple, refused where one repeats: a repeat is a typo, not a second run."""
  repeated = sorted({show(i) for i in items if items.count(i) > 1})
  if repeated:
    raise argparse.ArgumentTypeError(f"{', '.join(repeated)} given twice in {text!r}")
  return tuple(items)


def _arm_list(text: str) -> tuple[str, ...]:
  names = [a.strip() for a in text.split(',')]
  if '' in names:
    raise argparse.ArgumentTypeError(f'an empty arm name in {text!r} (ARM[,ARM...])')
  unknown = [a for a in names if a not in ARMS]
  if unknown:
    raise argparse.ArgumentTypeError(
        f"unknown arm {', '.join(map(repr, unknown)) or repr(text)} "
        f"(choose from {', '.join(ARMS)})"
    )
  return _distinct(names, text)


def _seed_list(text: str) -> tuple[int, ...]:
  try:
    seeds = [int(s) for s in text.split(',')]
  except ValueError:
    raise argparse.ArgumentTypeError(f'must be comma-separated integers, got {text!r}') from None
  if any(not 0 <= s <= _INT32_MAX for s in seeds):
    raise argparse.ArgumentTypeError(f'seeds must be in [0, {_INT32_MAX}], got {text!r}')
  return _distinct(seeds, text)


def _size_list(text: str) -> tuple[tuple[int, int], ...]:
  sizes = []
  for item in text.split(','):
    dim, _, layers = item.strip().lower().partition('x')
    numbers = (dim, layers)
    if not all(n.isascii() and n.isdigit() and 1 <= int(n) <= _INT32_MAX for n in numbers):
      raise argparse.ArgumentTypeError(
          f'must be comma-separated WIDTHxLAYERS, each in [1, {_INT32_MAX}] (e.g. 96x3,64x2), '
          f'got {item!r}'
      )
    sizes.append((int(dim), int(layers)))
  return _distinct(sizes, text, show=lambda size: f'{size[0]}x{size[1]}')


def build_parser(*, defaults: bool = True) -> argparse.ArgumentParser:
  """The command line; every flag has its help, default and range.

  With ``defaults=False`` no flag has a default, so parsing gives only the
  flags on the command line.
  """
  p = _Parser(
      prog='python -m optax_gqc.demo',
      description=(
          'Adaptive gradient accumulation against the fixed-batch frontier, on real text: '
          'every arm trains the same byte-level transformer on the same microbatches, and '
          'the verdict says whether an adaptive arm lands below the loss-against-steps curve '
          'of fixed batches of 1, 2, 3 and 4 microbatches (and 8 with --study).'
      ),
      epilog=(
          "The adaptive arms' knobs are the table ARMS in optax_gqc/demo/arms.py. "
          "The README's figures: python -m optax_gqc.demo --study --tokens 900000 --out docs/demo. "
          'Ctrl-C stops, keeps the arms that finished, and exits 130. See docs/demo.md.'
      ),
      formatter_class=_Formatter,
  )

  def add(*flags, default=None, **kwargs):
    p.add_argument(*flags, default=default if defaults else argparse.SUPPRESS, **kwargs)

  add(
      '--arms',
      type=_arm_list,
      default=','.join(DEFAULT_ARMS),
      metavar='ARM[,ARM...]',
      help=f"arms to run, comma-separated (--study: all); choices: {', '.join(ARMS)}",
  )
  add(
      '--tokens',
      metavar='N',
      type=_int_at_least(1),
      default=DEFAULT_TOKENS,
      help='token budget per arm, rounded down to whole blocks of microbatches',
  )
  add('--data', metavar='FILE', help='train on this text file instead of the stdlib')
  add(
      '--corpus-bytes',
      metavar='N',
      type=_int_at_least(1),
      default=3_000_000,
      help='bytes of the stdlib corpus to read',
  )
  add(
      '--microbatch', metavar='N', type=_int_at_least(1), default=8, help='sequences per microbatch'
  )
  add(
      '--context',
      metavar='N',
      type=_int_at_least(MIN_CONTEXT),
      default=64,
      help='bytes per sequence',
  )
  add('--dim', metavar='N', type=_int_at_least(1), default=96, help='model width')
  add('--layers', metavar='N', type=_int_at_least(1), default=3, help='transformer blocks')
  add(
      '--heads',
      metavar='N',
      type=_int_at_least(1),
      default=4,
      help='attention heads; must divide the width',
  )
  add(
      '--lr',
      metavar='X',
      type=_float_in(0, 1, open_low=True),
      default=4.2e-3,
      help='peak learning rate at one microbatch per step, and of the adaptive arms; the fixed '
      'arms scale the swept rates by lr / 4.2e-3 (frontier_lr)',
  )
  add(
      '--weight-decay',
      metavar='X',
      type=_float_in(0, 1, open_high=True),
      default=0.01,
      help="AdamW's weight decay",
  )
  add(
      '--warmup',
      metavar='X',
      type=_float_in(0, 1, open_high=True),
      default=0.05,
      help='share of the run in learning-rate warmup',
  )
  add(
      '--max-draws',
      metavar='N',
      type=_int_at_least(2),  # 1 would make each arm it caps step as the control does
      default=None,
      help='the most microbatches per step of the arms that have a limit (default: '
      "each arm's max_draws in ARMS: critical 32, gnts 64, relative 32, seesaw 16)",
  )
  add(
      '--evals',
      metavar='N',
      type=_int_at_least(1),
      default=12,
      help='validation-loss evaluations per arm',
  )
  add(
      '--block',
      metavar='N',
      type=_int_at_least(1),
      default=50,
      help='microbatches per compiled call (one lax.scan)',
  )
  add(
      '--seeds',
      type=_seed_list,
      default='0',
      metavar='SEED[,SEED...]',
      help='seeds of the model and the microbatch order (with --study: 0,1)',
  )
  add(
      '--sizes',
      type=_size_list,
      default=None,
      metavar='WxL[,WxL...]',
      help='model sizes, width x layers, in place of --dim and --layers (default: --dim x '
      '--layers; with --study, also two thirds the width and one layer fewer)',
  )
  add(
      '--out',
      metavar='DIR',
      default='./gqc-demo-out',
      help='folder for the table, JSON and figures',
  )
  add(
      '--quick',
      action='store_true',
      default=False,
      help='a tiny run (for tests): sets '
      + ', '.join(
          f"--{k.replace('_', '-')} {','.join(v) if isinstance(v, tuple) else v}"
          for k, v in QUICK.items()
      )
      + ' unless given',
  )
  add(
      '--study',
      action='store_true',
      default=False,
      help='every arm, seeds 0,1 and two model sizes; also writes study.png',
  )
  add('--no-progress', action='store_true', default=False, help='no progress bars')
  return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """Parses and checks the command line; a bad flag exits with a one-line error."""
  parser = build_parser()
  args = parser.parse_args(argv)
  given = set(vars(build_parser(defaults=False).parse_args(argv)))
  if args.quick:
    for dest, value in QUICK.items():
      if dest not in given:
        setattr(args, dest, value)
  if args.study and 'seeds' not in given:
    args.seeds = STUDY_SEEDS
  if args.study and args.quick:
    parser.error(
        'argument --study: not with --quick (a study of the tiny model says nothing); run '
        '--study alone, or --quick with --seeds 0,1 for a quick look at two seeds'
    )
  if args.study and 'arms' not in given:
    args.arms = tuple(ARMS)
  if args.sizes is None:
    args.sizes = ((args.dim, args.layers),)
    if args.study:
      small = (
          max(args.heads, 2 * args.dim // 3 // args.heads * args.heads),
          max(args.layers - 1, 1),
      )
      args.sizes = tuple(dict.fromkeys([*args.sizes, small]))
  elif {'dim', 'layers'} & given:
    parser.error('argument --sizes: give either --sizes or --dim/--layers')
  for dim, _ in args.sizes:
    if dim % args.heads:
      flag = '--sizes' if 'sizes' in given else '--dim'
      parser.error(f'argument --heads: {args.heads} heads do not divide the width {dim} ({flag})')
  if args.max_draws is not None and not any('max_draws' in ARMS[a] for a in args.arms):
    parser.error(
        f"argument --max-draws: none of the arms {','.join(args.arms)} has a limit to set "
        f"(those that have: {', '.join(a for a in ARMS if 'max_draws' in ARMS[a])})"
    )
  tokens_per_micro = args.microbatch * args.context
  need = max(args.evals, MIN_MICROBATCHES)
  if args.tokens // tokens_per_micro < need:
    parser.error(
        f'argument --tokens: {args.tokens} tokens make {args.tokens // tokens_per_micro} '
        f'microbatches of {args.microbatch} x {args.context}; need at least {need} '
        f'(--evals, and {MIN_MICROBATCHES} so that every fixed arm steps)'
    )
  memory = _memory_bytes()
  if memory and args.tokens * BYTES_PER_TOKEN > MAX_MEMORY_SHARE * memory:
    parser.error(
        f'argument --tokens: {args.tokens} tokens per arm take about '
        f'{args.tokens * BYTES_PER_TOKEN / 2**30:.1f} GiB before training (the microbatches '
        f"are sampled up front), over {MAX_MEMORY_SHARE:.0%} of this machine's "
        f'{memory / 2**30:.0f} GiB: pass at most '
        f'{int(MAX_MEMORY_SHARE * memory / BYTES_PER_TOKEN)}'
    )
  min_bytes = 10 * (args.context + 2)  # the held-out 10% must hold a window
  if args.data is None:
    available = len(stdlib_corpus(args.corpus_bytes)[0])
    if available < min_bytes:
      parser.error(
          f'argument --corpus-bytes: {available} bytes of stdlib source; need at least '
          f'{min_bytes} (10 x (--context + 2), for the held-out 10%), or give --data FILE'
      )
  elif not args.data:
    parser.error('argument --data: an empty path; give a text file')
  else:
    problem = _data_problem(Path(args.data), min_bytes)
    if problem:
      parser.error(f'argument --data: {problem}')
  problem = _out_problem(Path(args.out)) if args.out else 'an empty path; give a folder'
  if problem:
    parser.error(f'argument --out: {problem}')
  return args


def _memory_bytes() -> int | None:
  """This machine's physical memory, or None where the OS does not say."""
  try:
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  except (ValueError, OSError, AttributeError):
    return None


def _data_problem(path: Path, min_bytes: int) -> str | None:
  """Why ``path`` cannot be the training text, or None."""
  if not path.exists():
    return f'no such file: {path}'
  if path.is_dir():
    return f'{path} is a directory, not a text file'
  if not path.is_file():
    return f'{path} is not a regular file'
  try:
    data = path.read_bytes()
  except OSError as e:
    return f'cannot read {path}: {e.strerror or e}'
  if not data:
    return f'{path} is empty'
  if len(data) < min_bytes:
    return (
        f'{path} holds {len(data)} bytes; need at least {min_bytes} '
        '(10 x (--context + 2), for the held-out 10%)'
    )
  if b'\0' in data:
    return f'{path} looks binary (it holds NUL bytes); give a text file'
  invalid = len(data) - len(data.decode('utf-8', 'ignore').encode('utf-8'))
  if invalid > 0.05 * len(data):
    return f'{path} is not text: {invalid / len(data):.0%} of its bytes are not UTF-8'
  return None


def _out_problem(path: Path) -> str | None:
  """Why ``path`` cannot be the output folder (creating it if missing), or None."""
  if path.exists() and not path.is_dir():
    return f'{path} is a file, not a folder'
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    return f'cannot create {path}: {e.strerror or e}'
  try:  # a file written and removed: os.access says yes to root where writes fail (/sys)
    with tempfile.NamedTemporaryFile(dir=path):
      pass
  except OSError as e:
    return f'cannot write into {path}: {e.strerror or e}'
  return None
