"""The operator-scale report from fixed results: table rows, growth column, --json object."""

from __future__ import annotations

import json

from benchmarks._scale_report import Config, SizeResult, as_json, body


def result(jobs: int, scale: float, problems: list[str] | None = None) -> SizeResult:
    return SizeResult(
        jobs=jobs, pods=16, create_s=0.1 * scale, pods_exist_s=10.0 * scale,
        pods_running_s=10.5 * scale, jobs_running_s=11.0 * scale, replaced=jobs * 16 // 10,
        unanswered=0, repl_created=[0.2, 0.3, 0.4], repl_running=[0.5, 0.6, 1.5],
        peak_rss_mib=110.0 + jobs / 10, idle_rss_mib=100.0,
        cpu={"startup": 1.0, "create": 2.0 * scale, "idle_per_min": 0.2, "replace": 0.5,
             "total": 5.0 * scale},
        idle_window_s=120.0, idle_counts={("watch", "pods"): 1, ("get", "nodes"): 4},
        create_requests=26 * jobs, problems=problems or [],
    )  # fmt: skip


CFG = Config(jobs=[20, 200], pods=16, nodes=500, idle_s=120, settle_s=15, timeout_s=1200,
             fraction=0.1, seed=7)  # fmt: skip


def test_body_has_one_column_per_size_and_the_growth() -> None:
    text = body([result(20, 1.0), result(200, 10.0)], CFG)
    row = next(line for line in text.splitlines() if line.startswith("| all worker pods exist"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["all worker pods exist", "10.0 s", "100.0 s", "~x^1.00"]
    idle = next(line for line in text.splitlines() if line.startswith("| idle: requests/min"))
    assert "| 2.0 |" in idle  # 4 GETs in 120 s; the watch is counted apart
    assert "- none" in text


def test_problems_are_listed_per_size() -> None:
    text = body([result(20, 1.0, ["not every deleted pod was replaced"])], CFG)
    assert "- 20 jobs: not every deleted pod was replaced" in text


def test_json_holds_the_headline_figures() -> None:
    out = as_json([result(20, 1.0), result(200, 10.0)])
    json.dumps(out)  # serialisable as it stands
    first, last = out["sizes"]
    assert (first["jobs"], first["pods"], last["pods"]) == (20, 320, 3200)
    assert last["all_pods_exist_s"] == 100.0
    assert first["replacement_running_p50_s"] == 0.6
    assert first["idle_requests_per_min"] == 2.0
    assert last["cpu_s"]["create"] == 20.0
