"""`p4bs eval keep` (eval/p4bs_eval/keep.py): what it copies of a run folder, that the
analyses read the kept folder as they read the run folder, and that a second call adds
only the runs finished since."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_eval_detection import write_folder
from test_offline import sweep_folder

from p4bs_cli.main import main
from p4bs_eval.keep import KeepError, keep
from p4bs_eval.runner import keep_after_run
from p4bs_eval.surface_file import surfaces


def test_a_kept_folder_is_small_and_detection_reads_it_as_the_run_folder(tmp_path: Path) -> None:
    run_dir, kept = tmp_path / "run", tmp_path / "kept"
    run_dir.mkdir()
    write_folder(run_dir)
    (run_dir / "runs" / "base" / "ldf" / "r0" / "traffic" / "ss.jsonl").write_text("{}\n" * 100)
    assert main(["eval", "keep", str(run_dir), str(kept)]) == 0
    files = sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file())
    assert files == [
        "results.jsonl",
        "runs/base/fixed/r0/decisions.jsonl.gz",
        "runs/base/fixed/r0/link_metrics.jsonl.gz",
        "runs/base/fixed/r0/traffic/timeline.json",
        "runs/base/ldf/r0/decisions.jsonl.gz",
        "runs/base/ldf/r0/link_metrics.jsonl.gz",
        "runs/base/ldf/r0/traffic/timeline.json",
        "scenario.json",
    ]  # the raw samples (ss.jsonl) left out
    assert main(["eval", "detection", str(run_dir)]) == 0
    assert main(["eval", "detection", str(kept)]) == 0
    from_run = json.loads((run_dir / "detection.json").read_text())
    from_kept = json.loads((kept / "detection.json").read_text())
    assert from_kept["detectors"] == from_run["detectors"]
    assert from_kept["detectors"]["traffic"]["loss-delay-fit"]["changes"]["n60"]["detected"] == 1


def test_surfaces_from_a_kept_folder_are_those_of_the_run_folder(tmp_path: Path) -> None:
    run_dir = sweep_folder(tmp_path / "run", (2, 16), 20)
    for run in (run_dir / "runs").iterdir():
        (run / "decisions.jsonl").write_text("")
    keep(run_dir, tmp_path / "kept")
    assert not (tmp_path / "kept" / "runs" / "b2" / "link_metrics.jsonl").exists()
    from_run, from_kept = surfaces(run_dir), surfaces(tmp_path / "kept")
    assert from_kept["flows=50"].runs == from_run["flows=50"].runs
    assert [len(r) for r in from_kept["flows=50"].runs[25_000]] == [16]


def test_keep_again_adds_only_new_runs_and_leaves_out_an_unfinished_row(tmp_path: Path) -> None:
    run_dir, kept = tmp_path / "run", tmp_path / "kept"
    run_dir.mkdir()
    write_folder(run_dir)
    results = run_dir / "results.jsonl"
    first, second = results.read_text().splitlines(keepends=True)
    results.write_text(first + second.rstrip("\n"))  # the second row half written
    assert keep(run_dir, kept).rows == 1
    assert not (kept / "runs" / "base" / "ldf").exists()
    assert (kept / "results.jsonl").read_text() == first
    results.write_text(first + second + json.dumps({"policy": "bdp", "error": "X: y"}) + "\n")
    again = keep(run_dir, kept)
    assert (again.rows, again.runs_added) == (3, 1)  # the failed run's row, not its files
    assert (kept / "runs" / "base" / "ldf" / "r0" / "traffic" / "timeline.json").exists()
    assert keep(run_dir, kept).runs_added == 0
    # Lines that are not a run's row, or name a folder outside the run folder, are named and
    # passed over; nothing is copied from or to outside it.
    outside = tmp_path / "elsewhere"
    (outside / "traffic").mkdir(parents=True)
    for name in ("link_metrics.jsonl", "decisions.jsonl", "traffic/timeline.json"):
        (outside / name).write_text("{}\n")
    hostile = ["not json", json.dumps({"policy": "x"}), json.dumps({"run_dir": "../elsewhere"})]
    results.write_text(first + "".join(line + "\n" for line in hostile))
    again = keep(run_dir, kept)
    assert [p.rsplit(": ", 1)[1] for p in again.incomplete] == ["line 2 is not a run's row"] + [
        f"line {n} is not a run's row" for n in (3, 4)
    ]
    assert not list(outside.rglob("*.gz"))  # where kept/../elsewhere would have been written


def test_keep_refuses_a_folder_that_is_not_a_run_folder_and_names_a_run_without_its_files(
    tmp_path: Path,
) -> None:
    with pytest.raises(KeepError, match=r"no scenario\.json"):
        keep(tmp_path / "nothing", tmp_path / "kept")
    (tmp_path / "run").mkdir()
    write_folder(tmp_path / "run")
    (tmp_path / "run" / "runs" / "base" / "fixed" / "r0" / "decisions.jsonl").unlink()
    assert main(["eval", "keep", str(tmp_path / "run"), str(tmp_path / "kept")]) == 1
    kept = keep(tmp_path / "run", tmp_path / "kept")
    (problem,) = kept.incomplete
    assert problem.endswith("fixed/r0: a finished run without decisions.jsonl")
    # The other run and every row are kept all the same.
    assert (tmp_path / "kept" / "runs" / "base" / "ldf" / "r0" / "traffic").is_dir()
    assert (tmp_path / "kept" / "results.jsonl").read_text().count("\n") == 2


def test_after_a_run_what_could_not_be_kept_is_said_and_nothing_raised(tmp_path: Path) -> None:
    said: list[str] = []
    keep_after_run(tmp_path / "nothing", tmp_path / "kept", said.append)
    (line,) = said
    assert line.startswith(f"not kept: keep into {tmp_path / 'kept'} failed: ") and (
        "no scenario.json" in line
    )
