"""The command line: its flags, their defaults, and one-line errors."""

import subprocess
import sys
from pathlib import Path

import pytest

from optax_gqc import demo
from optax_gqc.demo import arms, cli

pytestmark = pytest.mark.slow


ROOT = Path(__file__).resolve().parents[2]


BAD_INPUTS = [
    (['--data', '{tmp}/missing.txt'], '--data'),
    (['--data', '{tmp}/dir'], '--data'),
    (['--data', '{tmp}/empty.txt'], '--data'),
    (['--data', '{tmp}/tiny.txt'], '--data'),
    (['--data', '{tmp}/binary.bin'], '--data'),
    (['--data', '{tmp}/latin.bin'], '--data'),
    (['--microbatch', '0'], '--microbatch'),
    (['--dim', '0'], '--dim'),
    (['--heads', '5'], '--heads'),
    (['--sizes', '66x2'], '--heads'),
    (['--sizes', '64'], '--sizes'),
    (['--sizes', '64x2', '--dim', '64'], '--sizes'),
    (['--warmup', '2'], '--warmup'),
    (['--max-draws', '0'], '--max-draws'),
    (['--max-draws', '1'], '--max-draws'),  # the arms it caps ran as the control, unsaid
    (['--max-draws', str(2**31)], '--max-draws'),  # was a traceback after two arms had run
    (['--seeds', str(10**20)], '--seeds'),
    (['--out', '{tmp}/file/sub'], '--out'),
    (['--out', '{tmp}/file'], '--out'),
    (['--out', '/proc'], '--out'),  # writable to os.access as root; the run failed at the end
    (['--lr', '-1'], '--lr'),
    (['--lr', 'nan'], '--lr'),
    (['--layers', '-1'], '--layers'),
    (['--evals', '-3'], '--evals'),
    (['--evals', '100000'], '--tokens'),
    (['--tokens', '100'], '--tokens'),
    (['--tokens', 'many'], '--tokens'),
    (['--context', '0'], '--context'),
    (['--context', '1'], '--context'),
    (['--quick', '--study'], '--study'),
    (['--tokens', str(10**15)], '--tokens'),
    (['--weight-decay', '-0.1'], '--weight-decay'),
    (['--corpus-bytes', '10'], '--corpus-bytes'),
    (['--arms', 'control,sgd'], '--arms'),
    (['--seeds', '0,a'], '--seeds'),
    (['--seeds', '0,0'], '--seeds'),  # ran one seed, and said "1 seeds" only in the header
    (['--arms', 'control,critical,control'], '--arms'),
    (['--sizes', '64x2,64X2'], '--sizes'),
    (['--block', '0'], '--block'),
    (['--sizes', '2147483648x1'], '--sizes'),  # past int32: accepted, then failed to build
    (['--sizes', '99999999999x1'], '--sizes'),  # blamed --heads
    (
        ['--sizes', '\u00b2x1'],
        'WIDTHxLAYERS',
    ),  # a digit to isdigit, not to int(): 'invalid _size_list'
    (['--quick', '--arms', 'control,,fixed2'], '--arms'),  # ran; '--seeds 0,,1' is refused
    (['--quick', '--arms', 'control,fixed2', '--max-draws', '8'], '--max-draws'),  # ignored
    (['--data', ''], 'an empty path'),  # '. is a directory'
    (['--out', ''], 'an empty path'),  # wrote into the working directory
    (['--no-such-flag'], '--no-such-flag'),
]


@pytest.mark.parametrize(
    ('argv', 'flag'), BAD_INPUTS, ids=[' '.join(a).replace('{tmp}/', '') for a, _ in BAD_INPUTS]
)
def test_bad_input_is_a_one_line_error_naming_the_flag(argv, flag, tmp_path, capsys):
  (tmp_path / 'dir').mkdir()
  (tmp_path / 'empty.txt').write_bytes(b'')
  (tmp_path / 'tiny.txt').write_text('print(1)\n')
  (tmp_path / 'binary.bin').write_bytes(bytes(range(256)) * 40)
  (tmp_path / 'latin.bin').write_bytes(bytes(range(128, 256)) * 80)  # no NUL, not UTF-8
  (tmp_path / 'file').write_text('x')
  out = tmp_path / 'out'
  argv = [a.format(tmp=tmp_path) for a in argv]
  if '--out' not in argv:
    argv += ['--out', str(out)]
  with pytest.raises(SystemExit) as exit_info:
    demo.main(argv)
  assert exit_info.value.code == 2
  captured = capsys.readouterr()
  lines = captured.err.strip().splitlines()
  assert len(lines) == 1 and flag in lines[0] and 'Traceback' not in captured.err
  assert lines[0].startswith('python -m optax_gqc.demo: error: ')
  assert not captured.out and not out.exists()  # nothing run, nothing written


def test_bad_input_from_the_shell_has_no_traceback(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'optax_gqc.demo', '--heads', '5', '--out', str(tmp_path)],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert result.returncode == 2 and not result.stdout
  assert result.stderr.strip().splitlines() == [
      'python -m optax_gqc.demo: error: argument --heads: 5 heads do not divide the width 96 '
      '(--dim) (see --help)'
  ]


def test_explicit_flags_win_over_quick(tmp_path):
  out = ['--out', str(tmp_path)]
  args = cli.parse_args(['--quick', *out])
  assert (args.tokens, args.evals, args.dim) == (40_000, 4, 32)
  assert args.arms == ('control', 'fixed2', 'fixed4', 'critical')
  args = cli.parse_args(
      ['--quick', '--tokens', '50000', '--evals', '5', '--corpus-bytes', '500000', *out]
  )
  assert (args.tokens, args.evals, args.corpus_bytes, args.dim) == (50_000, 5, 500_000, 32)
  args = cli.parse_args(['--quick', '--arms', 'gnts', '--dim', '48', *out])
  assert args.arms == ('gnts',) and args.sizes == ((48, 1),)


def test_study_defaults_to_two_seeds_two_sizes_and_every_arm(tmp_path):
  out = ['--out', str(tmp_path)]
  args = cli.parse_args(['--study', *out])
  assert args.seeds == (0, 1) and args.sizes == ((96, 3), (64, 2))
  assert args.arms == tuple(arms.ARMS)
  args = cli.parse_args(['--study', '--seeds', '3', '--sizes', '32x1', *out])
  assert args.seeds == (3,) and args.sizes == ((32, 1),)


def test_help_lists_every_flag_with_help_default_and_choices(capsys):
  parser = cli.build_parser()
  for action in parser._actions:
    assert action.help, action.option_strings
  with pytest.raises(SystemExit) as exit_info:
    demo.main(['--help'])
  assert exit_info.value.code == 0
  text = ' '.join(capsys.readouterr().out.split())
  assert text.startswith('usage: python -m optax_gqc.demo')
  assert (
      'choices: control, fixed2, fixed3, fixed4, fixed8, critical, gnts, relative, seesaw, warmup'
      in text
  )
  for default in (cli.DEFAULT_TOKENS, 0.0042, './gqc-demo-out'):
    assert f'(default: {default})' in text


def test_quick_writes_to_its_own_folder_unless_told():
  assert cli.parse_args(['--quick']).out == './gqc-demo-quick-out'
  assert cli.parse_args([]).out == './gqc-demo-out'
  assert cli.parse_args(['--quick', '--out', 'here']).out == 'here'


def test_the_main_job_runs_a_frontier_of_four_and_the_study_every_arm():
  names = cli.parse_args([]).arms
  assert tuple(names) == ('control', 'fixed2', 'fixed3', 'fixed4', 'critical', 'gnts', 'seesaw')
  assert sum(arms.ARMS[a]['kind'] == 'fixed' for a in names) >= 4
  assert tuple(cli.parse_args(['--study']).arms) == tuple(arms.ARMS)
  assert tuple(cli.parse_args(['--study', '--arms', 'control,gnts']).arms) == ('control', 'gnts')
