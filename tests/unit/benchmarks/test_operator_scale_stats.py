"""The operator-scale benchmark's pure parts: request classes, /proc parsing, pairing."""

from __future__ import annotations

import pytest

from benchmarks._scale_stats import (
    Request,
    classify,
    count_by,
    cpu_seconds,
    format_counts,
    growth,
    parse_log,
    per_minute,
    replacement_latencies,
    status_kib,
)


@pytest.mark.parametrize(
    ("method", "target", "want"),
    [
        ("GET", "/api/v1/namespaces/ns/pods?labelSelector=a%3Db", ("list", "pods")),
        ("GET", "/api/v1/namespaces/ns/pods?watch=true&resourceVersion=5", ("watch", "pods")),
        ("GET", "/api/v1/namespaces/ns/pods/p-0", ("get", "pods")),
        ("POST", "/api/v1/namespaces/ns/pods", ("create", "pods")),
        ("DELETE", "/api/v1/namespaces/ns/pods/p-0", ("delete", "pods")),
        ("DELETE", "/api/v1/namespaces/ns/pods", ("deletecollection", "pods")),
        ("POST", "/api/v1/namespaces/ns/events", ("create", "events")),
        (
            "PATCH",
            "/apis/torchflex.io/v1alpha1/namespaces/ns/elasticjobs/j/status",
            ("patch", "torchflex.io/elasticjobs/status"),
        ),
        (
            "GET",
            "/apis/torchflex.io/v1alpha1/namespaces/ns/elasticjobs?watch=1",
            ("watch", "torchflex.io/elasticjobs"),
        ),
        ("GET", "/api/v1/nodes?watch=true", ("watch", "nodes")),
        ("PUT", "/api/v1/nodes/n1", ("update", "nodes")),
        ("GET", "/api/v1/namespaces/ns", ("get", "namespaces")),
        ("GET", "/api/v1/namespaces", ("list", "namespaces")),
        ("GET", "/apis?timeout=32s", ("get", "/apis")),
        ("GET", "/version", ("get", "/version")),
    ],
)
def test_classify_uses_the_api_servers_vocabulary(
    method: str, target: str, want: tuple[str, str]
) -> None:
    assert classify(method, target) == want


def test_parse_log_skips_malformed_lines() -> None:
    text = "1.5 GET /api/v1/pods\nnot a line\n2.0 POST /api/v1/namespaces/a/pods\nx GET /y\n"
    assert parse_log(text) == [
        Request(1.5, "GET", "/api/v1/pods"),
        Request(2.0, "POST", "/api/v1/namespaces/a/pods"),
    ]


def test_counts_and_rates_over_a_window() -> None:
    reqs = [
        Request(0.5, "GET", "/api/v1/namespaces/a/pods"),  # before the window
        Request(1.0, "GET", "/api/v1/namespaces/a/pods?watch=true"),
        Request(2.0, "PATCH", "/apis/torchflex.io/v1alpha1/namespaces/a/elasticjobs/j"),
        Request(3.0, "PATCH", "/apis/torchflex.io/v1alpha1/namespaces/a/elasticjobs/k"),
        Request(31.0, "GET", "/api/v1/namespaces/a/pods"),  # after
    ]
    counts = count_by(reqs, 1.0, 31.0)
    assert counts == {("watch", "pods"): 1, ("patch", "torchflex.io/elasticjobs"): 2}
    assert per_minute(counts, 30.0, watches=False) == pytest.approx(4.0)
    assert per_minute(counts, 30.0, watches=True) == pytest.approx(2.0)
    assert format_counts(counts) == "patch torchflex.io/elasticjobs x2, watch pods x1"
    assert format_counts({}) == "none"
    with pytest.raises(ValueError):
        per_minute(counts, 0, watches=False)


def test_cpu_seconds_reads_utime_and_stime_past_a_spaced_name() -> None:
    # Fields 14 and 15 (utime, stime) = 250 and 50 ticks.
    fields = ["S", "1", "2", "3", "0", "-1", "4194560", "10", "0", "0", "0", "250", "50"]
    line = "1234 (torchflex op) " + " ".join(fields + ["0"] * 30)
    assert cpu_seconds(line, 100) == pytest.approx(3.0)


def test_status_kib_reads_a_field() -> None:
    text = "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n"
    assert status_kib(text, "VmHWM") == 204800
    assert status_kib(text, "VmRSS") == 102400
    with pytest.raises(ValueError):
        status_kib(text, "VmSwap")


def test_replacements_pair_in_time_order_per_job() -> None:
    deletions = {"a": [10.0, 10.1], "b": [10.2]}
    arrivals = {"a": [10.6, 10.3, 9.0], "b": []}
    lat, missing = replacement_latencies(deletions, arrivals)
    assert sorted(round(x, 3) for x in lat) == [0.3, 0.5]
    assert missing == 1


def test_growth_exponent_between_the_ends() -> None:
    assert growth([20, 200], [1.0, 10.0]) == "~x^1.00"
    assert growth([20, 50, 200], [5.0, 5.0, 5.0]) == "~x^0.00"
    assert growth([20], [1.0]) == "n/a"


def test_growth_ignores_missing_values() -> None:
    assert growth([20, 200], [float("nan"), 5.0]) == "n/a"
    assert (
        growth([20, 100, 200], [2.0, 4.0, float("nan")])
        == f"~x^{1 / 1.6094379124341003 * 0.6931471805599453:.2f}"
    )
