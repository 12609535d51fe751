"""`p4bs eval objective` (eval/p4bs_eval/objective.py) on a synthetic folder: three fixed
buffers whose loss, queueing delay and FCT are known, so which buffer f picks at each
exchange rate of loss for delay, and which the short flows prefer, are known too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from p4bs_cli.main import main

# buffer ms -> (loss, queueing delay ms, short flows' median FCT ms): more buffer, less loss,
# more delay, slower short flows
BUFFERS = {4: (0.02, 2.0, 150.0), 15: (0.01, 12.0, 200.0), 200: (0.001, 180.0, 900.0)}


def row(buffer_ms: int, repeat: int, policy: str | None = None) -> dict[str, Any]:
    loss, delay_ms, fct = BUFFERS[buffer_ms]
    noise = 0.001 * (repeat - 1.5)  # two repeats averaging to the table
    f = -(0.5 * loss / 0.01 + 0.5 * delay_ms / 50)
    return {
        "point": "flows=20",
        "values": {"flows": 20},
        "policy": policy or f"fixed:{buffer_ms}ms",
        "repeat": repeat,
        "f_mean": f + noise,
        "loss_mean": loss,
        "fct_p50_ms": fct + 10 * noise,
    }


def folder(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    (tmp_path / "scenario.json").write_text(
        json.dumps(
            {
                "name": "tiny",
                "link_settings": {"sla": {"max_queue_delay": "50ms", "max_loss": 0.01}},
            }
        )
    )
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_f_picks_by_its_exchange_rate_and_the_short_flows_prefer_the_smallest(
    tmp_path: Path, capsys: Any
) -> None:
    """Cost in ms: 4 ms 2% * rate + 2, 15 ms 1% * rate + 12, 200 ms 0.1% * rate + 180. At the
    SLA's 50 ms per 1% (p-hat 1%, d-hat 50 ms, equal weights) 15 ms costs 62 against 102 and
    185: f picks 15 ms; at 5 ms per 1%, 4 ms (12 against 17); the short flows want 4 ms."""
    rows = [row(b, r) for b in BUFFERS for r in (1, 2)]
    rows.append({**row(15, 1, policy="loss-delay-fit"), "values": {"flows": 20}})  # not fixed
    run_dir = folder(tmp_path, rows)
    assert main(["eval", "objective", str(run_dir), "--rates", "5"]) == 0
    text = (run_dir / "objective.md").read_text()
    assert capsys.readouterr().out.strip() == text.strip()
    lines = {line.split(" |")[0]: line for line in text.splitlines() if line.startswith("| ")}
    assert lines["| 4 ms"] == "| 4 ms | 2 | 2.00% | 2.0 | 150 | 102.0 | **12.0** |"
    assert lines["| 15 ms"] == "| 15 ms | 2 | 1.00% | 12.0 | 200 | **62.0** | 17.0 |"
    assert lines["| 200 ms"].startswith("| 200 ms | 2 | 0.10% | 180.0 | 900 | 185.0 |")
    assert "prefers 4 ms; f picks it at 5 ms per 1% of loss." in text


def test_a_folder_without_fixed_buffers_or_with_a_bad_rate_is_refused(tmp_path: Path) -> None:
    run_dir = folder(tmp_path, [row(15, 1, policy="loss-delay-fit")])
    assert main(["eval", "objective", str(run_dir)]) == 2
    assert not (run_dir / "objective.md").exists()
    run_dir = folder(tmp_path, [row(15, 1)])
    assert main(["eval", "objective", str(run_dir), "--rates", "0"]) == 2
    assert main(["eval", "objective", str(tmp_path / "missing")]) == 2
