"""sealsync's one benchmark script: named benchmarks, each measured against a baseline.

    python bench/run.py [--quick] [--json] [--only PREFIX] [--n N] [--profile] [--dir DIR]

The machine is shared and noisy, so absolute figures mean little: each benchmark that has a
baseline names another line of the same run (`raw.*`: what plain sqlite3 and AES-GCM do with
no engine around them), and the figure to watch is the `ratio` of the two rates. Each line is
the best of a few repeats where a repeat is cheap.

A benchmark is a function registered with `@benchmark(name, needs=...)` that returns `Line`s;
`needs` names the benchmarks its baselines come from, so `--only replica.merge` also runs
`raw.upsert_aead`. Benchmarks check what they did (row counts, receipts) and raise
`BenchmarkError` otherwise: a benchmark that silently does nothing is worse than none.

`--profile` runs cProfile over the timed sections only and prints the top functions by
tottime to stderr (figures measured under the profiler are slower; compare ratios only
between runs without it).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness and benchmarks beside this file

import backup_bench  # noqa: F401  (registers the backup benchmarks)
import chat_bench  # noqa: F401  (registers the chat store's benchmarks)
import engine  # noqa: F401  (registers the replica's benchmarks, and the baselines)
import folder_bench  # noqa: F401  (registers the folder sync benchmark)
import relay_http  # noqa: F401  (registers the relay's HTTP benchmarks and their baseline)
import scale_bench  # noqa: F401  (registers a million records pushed and joined)
import sync_http  # noqa: F401  (registers the device-to-device sync benchmarks)
from harness import (
    FULL,
    PROFILE_TOP,
    QUICK,
    REGISTRY,
    Bench,
    BenchmarkError,
    Line,
    print_json,
    print_table,
    select,
    sizes_with_n,
)

# ---- command line ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (under 3 minutes)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument(
        "--only", action="append", default=[], metavar="PREFIX", help="run benchmarks by prefix"
    )
    parser.add_argument("--n", type=int, help="set every count to N (a tiny run, for tests)")
    parser.add_argument("--profile", action="store_true", help="cProfile the timed sections")
    parser.add_argument("--dir", type=Path, help="scratch folder parent (default: system temp)")
    args = parser.parse_args(argv)
    if args.n is not None and args.n < 2:
        parser.error("--n must be at least 2")
    unknown = [p for p in args.only if not any(name.startswith(p) for name in REGISTRY)]
    if unknown:
        parser.error(f"no benchmark starts with {unknown}; known: {', '.join(REGISTRY)}")
    return args


@contextmanager
def scratch_folder(parent: Path | None) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sealsync-bench-", dir=parent) as folder:
        yield Path(folder)


def run_benchmarks(prefixes: Sequence[str], bench: Bench) -> list[Line]:
    """Run the selected benchmarks; only those named by a prefix are profiled, not baselines."""
    lines: list[Line] = []
    for item in select(prefixes):
        print(f"running {item.name} ...", file=sys.stderr, flush=True)
        bench.profiling = not prefixes or item.name.startswith(tuple(prefixes))
        lines.extend(item.function(bench))
    return lines


def print_profile(profiler: cProfile.Profile) -> None:
    stats = pstats.Stats(profiler, stream=sys.stderr)
    stats.sort_stats("tottime").print_stats(PROFILE_TOP)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sizes = QUICK if args.quick else FULL
    if args.n is not None:
        sizes = sizes_with_n(sizes, args.n)
    profiler = cProfile.Profile() if args.profile else None
    with scratch_folder(args.dir) as folder:
        try:
            lines = run_benchmarks(args.only, Bench(sizes, folder, profiler))
        except BenchmarkError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    (print_json if args.json else print_table)(lines)
    if profiler is not None:
        print_profile(profiler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
