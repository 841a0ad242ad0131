"""XLA:CPU's compile of a train step, by phase, from ``perf report``.

A record of the measurement behind docs/benchmarks.md ("Where the compile goes
at 128 leaves"), not a benchmark. For each candidate NAME of
``benchmarks/compile.py``:

    perf record -F 999 -g -o NAME.data \\
        python docs/compile/kernels.py compile NAME --leaves 128 --reps 5
    perf report -i NAME.data --children --sort symbol --stdio -g none > NAME.txt

then ``python docs/compile/phases.py NAME.txt ...`` prints the CPU seconds per
compile spent under each phase's function (its "children" share of the samples,
over the ``reps + 1`` compiles of the run: give ``--compiles`` if ``--reps``
was not 5). The lowering's Python is in the samples too, and in no phase. The
first row is XLA's compile call on the calling thread; LLVM's code generation
runs on threads of its own, the last row.
"""

import argparse
import pathlib
import re

PHASES = (
    ('the compile call, LLVM aside', 'xla::PjRtCpuClient::CompileAndLoad'),
    ('StableHLO to HLO', 'xla::MlirToXlaComputation'),
    ('HLO passes', 'xla::cpu::CpuCompiler::RunHloPasses'),
    ('  of which copy insertion', 'xla::CopyInsertion::RunImpl'),
    ('  of which the verifier', 'xla::HloVerifier::RunImpl'),
    ('buffer assignment', 'xla::BufferAssigner::Run'),
    ('fusion emitters (MLIR)', 'xla::cpu::FusionCompiler::Compile'),
    ('LLVM to machine code', 'xla::cpu::IrCompiler::operator()'),
)


def seconds_by_symbol(report: str, compiles: int) -> dict[str, float]:
  """CPU seconds per compile under each symbol of a ``perf report --children``."""
  total, seconds = None, {}
  for line in report.splitlines():
    if line.startswith('# Event count'):
      total = int(re.search(r'(\d+)', line).group(1))  # nanoseconds of cpu-clock
    m = re.match(r'\s+([\d.]+)%\s+[\d.]+%\s+\[.\]\s+(\S+)', line)
    if m and total and m.group(2) not in seconds:
      seconds[m.group(2)] = float(m.group(1)) / 100 * total / 1e9 / compiles
  return seconds


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('reports', nargs='+', type=pathlib.Path)
  parser.add_argument('--compiles', type=int, default=6)
  args = parser.parse_args()
  runs = {p.stem: seconds_by_symbol(p.read_text(), args.compiles) for p in args.reports}
  print(f"{'CPU s per compile':30s}" + ''.join(f'{name:>14s}' for name in runs))
  for label, symbol in PHASES:
    print(f'{label:30s}' + ''.join(f'{s.get(symbol, 0.0):14.3f}' for s in runs.values()))


if __name__ == '__main__':
  main()
