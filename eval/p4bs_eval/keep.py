"""`p4bs eval keep`: the part of a run folder worth committing, copied into another folder as
its runs finish, so that a long evaluation's results are in the repository before the
machine that ran them is gone.

What is kept: scenario.json, report.md, every complete row of results.jsonl (each run's
figures), and per run that finished without an error the three files the analyses read
after the fact, in the run folder's layout: link_metrics.jsonl and decisions.jsonl gzipped
(`p4bs eval surfaces` and `detection` read them so) and traffic/timeline.json. About 25 kB
a run of 120 s, against ~10 MB for the folder (its senders' TCP state, the router's queue
samples, the loop's logs: raw, and left out). `p4bs eval run --resume` needs only
scenario.json and results.jsonl, so a kept folder's two files in a new folder resume it."""

from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

GZIPPED = ("link_metrics.jsonl", "decisions.jsonl")
COPIED = ("traffic/timeline.json",)


class KeepError(ValueError):
    """A folder `keep` cannot copy from; the message says why."""


@dataclass(frozen=True)
class Kept:
    rows: int  # complete rows of results.jsonl, failed runs' included
    runs_added: int  # runs whose files this call copied
    incomplete: tuple[str, ...] = ()  # lines not kept whole: bad rows, runs without files


def keep(run_dir: Path, out: Path) -> Kept:
    """Copies what is kept of `run_dir` into `out`; a run already there is not copied again
    (a finished run's files do not change), so each call costs only the new runs."""
    if not (run_dir / "scenario.json").is_file():
        raise KeepError(f"{run_dir}: no scenario.json (not a folder of `p4bs eval run`)")
    text = (run_dir / "results.jsonl").read_text() if (run_dir / "results.jsonl").exists() else ""
    # A row being written while we read has no newline yet: it comes with the next call.
    rows = [line for line in text.splitlines(keepends=True) if line.endswith("\n")]
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run_dir / "scenario.json", out / "scenario.json")
    if (run_dir / "report.md").is_file():
        shutil.copyfile(run_dir / "report.md", out / "report.md")
    added, incomplete = 0, []
    for number, line in enumerate(rows, 1):
        where = _run_of(line)
        if where is None:
            incomplete.append(f"{run_dir / 'results.jsonl'}: line {number} is not a run's row")
            continue
        if not where:  # a failed run: its row only
            continue
        source, kept = run_dir / where, out / where
        if (kept / COPIED[-1]).exists():  # copied last: its presence means the run is whole
            continue
        missing = [n for n in GZIPPED + COPIED if not (source / n).is_file()]
        if missing:  # its row is kept; the others' files are not held up by it
            incomplete.append(f"{source}: a finished run without {', '.join(missing)}")
            continue
        kept.mkdir(parents=True, exist_ok=True)
        for name in GZIPPED:
            with (source / name).open("rb") as raw, gzip.open(kept / f"{name}.gz", "wb") as packed:
                shutil.copyfileobj(raw, packed)
        for name in COPIED:
            (kept / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, kept / name)
        added += 1
    # Rows last: a reader never finds a row whose run's files are not there yet.
    (out / "results.jsonl").write_text("".join(rows))
    return Kept(len(rows), added, tuple(incomplete))


def _run_of(line: str) -> str | None:
    """A row's run folder, relative and inside the run folder ("" for a failed run, whose
    files are not kept); None for a line that is not a run's row."""
    try:
        row = json.loads(line)
        where = row["run_dir"]
        failed = "error" in row
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(where, str) or not where:
        return None
    path = PurePosixPath(where)
    if path.is_absolute() or ".." in path.parts:
        return None
    return "" if failed else where
