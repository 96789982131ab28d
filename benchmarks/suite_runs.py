"""Where the suite's training runs spend their time, phase by phase: every run's summary.json
under a pytest base directory, summed by phase and by test.

    python benchmarks/suite_runs.py [/tmp/pytest-of-$USER/pytest-current] [--top 25]

Each run (command-line or in-process, a sweep's trial too) writes ``startup`` into its summary.json
(``training/driver/run.startup``): Python's start, Ray's, Spark's, the ETL, Ray Train's group start,
the workers' set-up, the stop. Summed over the suite they say what a lever on one phase is worth
(docs/benchmarks.md, issue 66). A run's directory is named by pytest after its test (``tmp_path``,
truncated at 30 characters), so the tests are told apart as pytest names their directories. A run
that failed before its summary leaves none and is not counted."""

from __future__ import annotations

import argparse
import getpass
import json
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

PHASES = ["python_start_s", "ray_start_s", "spark_start_s", "etl_s", "train_group_start_s",
          "worker_setup_s", "train_group_stop_s"]
# An in-process run's "python start" is the test process's age; a command's is seconds
IN_PROCESS_AGE_S = 120


@dataclass
class TestRuns:
    """One test directory's runs: how many, their total time, their worker groups' start."""

    runs: int = 0
    total_s: float = 0.0
    group_start_s: float = 0.0


def runs(base: Path) -> list[tuple[str, dict]]:
    """(the test's directory under ``base``, the summary) of every run under ``base``."""
    found = []
    for path in sorted(base.rglob("summary.json")):
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(summary, dict) and "total_s" in summary:
            found.append((path.relative_to(base).parts[0], summary))
    return found


def table(found: list[tuple[str, dict]], top: int) -> str:
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    by_test: dict[str, TestRuns] = defaultdict(TestRuns)
    for test, summary in found:
        phases = summary.get("startup") or {}
        for phase in PHASES:
            if phase == "python_start_s" and (phases.get(phase) or 0) > IN_PROCESS_AGE_S:
                continue  # an in-process run: the test process's age, not a start
            if phases.get(phase):
                totals[phase] += phases[phase]
                counts[phase] += 1
        row = by_test[test]
        row.runs += 1
        row.total_s += summary["total_s"]
        row.group_start_s += phases.get("train_group_start_s") or 0
    lines = [f"{len(found)} runs, {sum(s['total_s'] for _, s in found):,.0f} s in all "
             "(the driver's total_s: Ray's start to the end)", "",
             "| phase | runs | s | s a run |", "|---|---:|---:|---:|"]
    lines += [f"| {p.removesuffix('_s')} | {counts[p]} | {totals[p]:,.0f} | "
              f"{totals[p] / max(counts[p], 1):.1f} |" for p in PHASES]
    lines += ["", "| test directory | runs | total s | group start s |", "|---|---:|---:|---:|"]
    ranked = sorted(by_test.items(), key=lambda kv: -kv[1].total_s)[:top]
    lines += [f"| {test} | {r.runs} | {r.total_s:,.0f} | {r.group_start_s:,.0f} |"
              for test, r in ranked]
    return "\n".join(lines)


def main() -> None:
    default = Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}" / "pytest-current"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", nargs="?", type=Path, default=default)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(table(runs(args.base.resolve()), args.top))


if __name__ == "__main__":
    main()
