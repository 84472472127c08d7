#!/usr/bin/env python3
"""The end of the test command's output: how many Rust and Python tests ran, how long each phase
took, each test binary's time and the ten slowest tests. It reads what scripts/test.sh left in
target/: nextest's JUnit report, the logs of the benchmarks and doc examples, pytest's JUnit
reports and the phase times."""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

TARGET = Path(__file__).resolve().parent.parent / "target"


def junit(path: Path) -> list[tuple[str, str, float]]:
    """(suite, test, seconds) for each test case of a JUnit report."""
    cases = []
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for case in suite.iter("testcase"):
            cases.append((suite.get("name", "?"), case.get("name", "?"), float(case.get("time", 0))))
    return cases


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def libtest_passed(path: Path) -> int:
    """The tests a `cargo test` log says passed."""
    text = read(path)
    return sum(int(n) for n in re.findall(r"test result: ok\. (\d+) passed", text))


def main() -> int:
    rust = junit(TARGET / "nextest/default/junit.xml")
    python: list[tuple[str, str, float]] = []
    for report in sorted(TARGET.glob("pytest-*.xml")):
        name = "python:" + report.stem.removeprefix("pytest-")
        python += [(name, test, t) for _, test, t in junit(report)]
    doc = libtest_passed(TARGET / "test-doc.log")
    benches = len(re.findall(r"Running benches/", read(TARGET / "test-benches.log")))
    print("\n== Summary ==")
    print(f"Rust tests: {len(rust) + doc} ({len(rust)} under nextest, {doc} doc examples), "
          f"and {benches} benchmarks run once each")
    print(f"Python tests: {len(python)}")
    phases = TARGET / "test-phases.txt"
    if phases.exists():
        print("\nEach phase (s):")
        for line in phases.read_text().splitlines():
            seconds, name = line.split(" ", 1)
            print(f"  {int(seconds):5d}  {name}")
    per_binary: dict[str, list[float]] = defaultdict(list)
    for suite, _, t in rust + python:
        per_binary[suite].append(t)
    print("\nEach test binary: tests, the sum of their times and the longest (s):")
    for suite, times in sorted(per_binary.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {sum(times):7.1f}  {max(times):6.1f}  {len(times):4d}  {suite}")
    print("\nThe ten slowest tests (s):")
    for suite, test, t in sorted(rust + python, key=lambda c: -c[2])[:10]:
        print(f"  {t:6.1f}  {suite} {test}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
