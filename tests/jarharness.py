"""Running a small Java harness (tests/java) against the metrics job's functions jar, which
`make build` makes: compiled with the jar and PyFlink's jars (Flink's Row, functions, metrics,
shaded Jackson and slf4j) on the class path, then run on a text input."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pyflink
import pytest

from p4bs import paths


def run_harness(
    source: Path, main_class: str, args: list[str], lines: list[str], work: Path
) -> str:
    """`main_class` (of `source`, compiled into `work`) run with `args` on `lines` as its
    standard input; its standard output."""
    jar = paths.flink_functions_jar()
    if not jar.is_file():
        pytest.fail(f"{jar} is missing: run make build")
    flink = Path(pyflink.__file__).parent / "lib" / "*"
    javac = ["javac", "-Xlint:all", "-Werror", "--release", "17", "-cp", f"{jar}:{flink}"]
    subprocess.run([*javac, "-d", str(work), str(source)], check=True)
    ran = subprocess.run(
        ["java", "-cp", f"{jar}:{work}:{flink}", main_class, *args],
        input="".join(line + "\n" for line in lines),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return ran.stdout
