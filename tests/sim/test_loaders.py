"""Trace loaders: formats, schema errors, enrichment rules, and the real public traces."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from warden.sim import enrich as rules
from warden.sim.enrich import enrich
from warden.sim.loaders import TraceError, detect_format, load_trace
from warden.sim.records import TraceJob

NATIVE_HEADER = "job_id,submit,num_gpus,duration"
PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster"
RFOLD_HEADER = "#job id,arrival time (sec),topology,shape,size,duration (sec)"
PAI_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
)


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text.lstrip("\n"))
    return path


def native(tmp_path: Path, *rows: str, header: str = NATIVE_HEADER) -> Path:
    return write(tmp_path, "\n".join([header, *rows]) + "\n")


# --- detection -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "row", "expected"),
    [
        (NATIVE_HEADER, "a,0,1,10", "native"),
        ("duration,num_gpus,submit,job_id,queue", "10,1,0,a,q", "native"),
        (PHILLY_HEADER, "2017-10-09 07:01:55,66.0,1,66.0,11cb48", "philly"),
        (RFOLD_HEADER, "0,0.0,CLOS,1,1,3613033.0", "philly-rfold"),
        (PAI_HEADER, "p0,12000,16384,1,1000,,LS,Running,0,100,0", "pai2023"),
    ],
)
def test_auto_detects_each_format_from_its_header(tmp_path: Path, header: str, row: str, expected: str) -> None:
    path = write(tmp_path, f"{header}\n{row}\n")
    assert detect_format(path) == expected
    trace = load_trace(path)
    assert trace.format == expected
    assert len(trace.jobs) == 1


def test_auto_detects_parquet_by_suffix(tmp_path: Path) -> None:
    assert detect_format(tmp_path / "t.parquet") == "native"


def test_an_unknown_header_names_the_native_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "id,when,gpus\n1,2,3\n")
    with pytest.raises(TraceError, match=r"cannot tell the trace format.*job_id,submit,num_gpus,duration"):
        load_trace(path)


def test_an_unknown_format_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="unknown format 'slurm'"):
        load_trace(native(tmp_path, "a,0,1,10"), format="slurm")


def test_an_empty_file_and_a_missing_file_are_trace_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="empty file"):
        load_trace(write(tmp_path, ""))
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "absent.csv")


# --- native schema -------------------------------------------------------------------------------


def test_native_required_columns_only_take_defaults_and_enrichment(tmp_path: Path) -> None:
    trace = load_trace(native(tmp_path, "a,0,16,7200"))
    (job,) = trace.jobs
    assert (job.job_id, job.submit, job.num_gpus, job.duration) == ("a", 0.0, 16, 7200.0)
    assert (job.queue, job.user, job.lease, job.cpu, job.memory, job.flavor) == ("default", "", None, 0, 0, None)
    assert (job.replicas, job.gpus_per_replica) == (1, 16)  # native: no gang rule
    assert job.tier == 3
    assert job.startup_seconds == 30 + 15 * 4
    assert job.resumable and job.checkpoint_interval in rules.CHECKPOINT_INTERVALS
    assert job.checkpoint_seconds == 90.0
    assert rules.RULE_TIER in trace.rules and rules.RULE_REPLICAS not in trace.rules


FULL_HEADER = (
    "job_id,submit,num_gpus,duration,queue,tier,user,replicas,gpus_per_replica,lease,"
    "checkpoint_interval,checkpoint_seconds,startup_seconds,resumable,cpu,memory,flavor"
)


def test_native_optional_columns_are_kept_as_given(tmp_path: Path) -> None:
    path = native(tmp_path, "a,5,16,600,vision,1,ann,2,8,3600,900,42,77,yes,4000,8192,H100", header=FULL_HEADER)
    trace = load_trace(path, seed=3)
    assert trace.jobs == (
        TraceJob(
            "a",
            0.0,
            16,
            600.0,
            queue="vision",
            tier=1,
            user="ann",
            replicas=2,
            gpus_per_replica=8,
            lease=3600.0,
            checkpoint_interval=900.0,
            checkpoint_seconds=42.0,
            startup_seconds=77.0,
            resumable=True,
            cpu=4000,
            memory=8192,
            flavor="H100",
            seq=0,
        ),
    )
    assert trace.rules == ()


def test_native_empty_cells_take_the_column_defaults(tmp_path: Path) -> None:
    path = native(tmp_path, "a,0,4,600,,,,,,,,,,,,,", header=FULL_HEADER)
    (job,) = load_trace(path).jobs
    assert job == TraceJob("a", 0.0, 4, 600.0, replicas=1, gpus_per_replica=4)


@pytest.mark.parametrize(
    ("cells", "replicas", "per"),
    [
        ("8,2,", 2, 4),
        ("8,,2", 4, 2),
        ("8,,", 1, 8),
    ],
)
def test_native_replicas_and_gpus_per_replica_complete_each_other(
    tmp_path: Path, cells: str, replicas: int, per: int
) -> None:
    path = native(tmp_path, f"a,0,{cells},60", header="job_id,submit,num_gpus,replicas,gpus_per_replica,duration")
    (job,) = load_trace(path).jobs
    assert (job.replicas, job.gpus_per_replica) == (replicas, per)


@pytest.mark.parametrize("text", ["true", "1", "YES", "True"])
def test_native_resumable_accepts_true_words(tmp_path: Path, text: str) -> None:
    (job,) = load_trace(native(tmp_path, f"a,0,1,60,{text}", header=NATIVE_HEADER + ",resumable")).jobs
    assert job.resumable is True


@pytest.mark.parametrize("text", ["false", "0", "no", "No"])
def test_native_resumable_accepts_false_words(tmp_path: Path, text: str) -> None:
    (job,) = load_trace(native(tmp_path, f"a,0,1,60,{text}", header=NATIVE_HEADER + ",resumable")).jobs
    assert job.resumable is False


def test_native_accepts_integral_floats_for_whole_numbers(tmp_path: Path) -> None:
    (job,) = load_trace(native(tmp_path, "a,0,8.0,60")).jobs
    assert job.num_gpus == 8


# Each case: the extra header columns, the bad data row, the column the error names.
MALFORMED = [
    ("", "b,1,abc,60", "num_gpus", "'abc' is not a whole number"),
    ("", "b,1,2.5,60", "num_gpus", "'2.5' is not a whole number"),
    ("", "b,1,0,60", "num_gpus", "'0' is below 1"),
    ("", "b,1,1,-5", "duration", "'-5' is negative"),
    ("", "b,1,1,ten", "duration", "'ten' is not a number"),
    ("", "b,1,1,nan", "duration", "'nan' is not a finite number"),
    ("", "b,-1,1,60", "submit", "'-1' is negative"),
    ("", ",1,1,60", "job_id", "missing value"),
    ("", "b,1,,60", "num_gpus", "missing value"),
    ("", "b,1,1", "duration", "missing value"),
    ("", "b,1,1,60,9", "fields", "'5' cells, but the header has 4 columns"),
    ("", "a,1,1,60", "job_id", "'a' repeats the job of line 2"),
    (",tier", "b,1,1,60,5", "tier", "'5' is not a tier (1..4)"),
    (",tier", "b,1,1,60,0", "tier", "'0' is not a tier (1..4)"),
    (",replicas,gpus_per_replica", "b,1,8,60,3,2", "replicas", "'3' x gpus_per_replica 2 is not num_gpus 8"),
    (",replicas", "b,1,8,60,3", "replicas", "'3' does not divide num_gpus 8"),
    (",gpus_per_replica", "b,1,8,60,3", "gpus_per_replica", "'3' does not divide num_gpus 8"),
    (",resumable", "b,1,1,60,maybe", "resumable", "'maybe' is not one of true/false/1/0/yes/no"),
    (",checkpoint_interval", "b,1,1,60,0", "checkpoint_interval", "'0' must be positive"),
    (",lease", "b,1,1,60,-1", "lease", "'-1' is negative"),
]


@pytest.mark.parametrize(("extra", "bad", "column", "problem"), MALFORMED)
def test_a_malformed_native_row_names_file_line_column_and_value(
    tmp_path: Path, extra: str, bad: str, column: str, problem: str
) -> None:
    fill = "," * extra.count(",")
    path = native(tmp_path, f"a,0,1,60{fill}", "", bad, f"c,2,1,60{fill}", header=NATIVE_HEADER + extra)
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    # The blank line 3 counts: the bad row is line 4 of the file.
    assert str(caught.value) == f"{path} line 4: {column}: {problem}"
    assert (caught.value.line, caught.value.column) == (4, column)


@pytest.mark.parametrize(("extra", "bad", "column", "problem"), MALFORMED)
def test_skip_invalid_counts_the_row_under_its_column(
    tmp_path: Path, extra: str, bad: str, column: str, problem: str
) -> None:
    fill = "," * extra.count(",")
    path = native(tmp_path, f"a,0,1,60{fill}", bad, f"c,2,1,60{fill}", header=NATIVE_HEADER + extra)
    trace = load_trace(path, skip_invalid=True)
    assert [j.job_id for j in trace.jobs] == ["a", "c"]
    assert trace.skipped == 1
    assert trace.skipped_reasons == {column: 1}


def test_skip_invalid_counts_several_reasons(tmp_path: Path) -> None:
    path = native(tmp_path, "a,0,x,60", "b,0,1,-1", "c,0,0,60", "d,0,1,60")
    trace = load_trace(path, skip_invalid=True)
    assert [j.job_id for j in trace.jobs] == ["d"]
    assert (trace.skipped, trace.skipped_reasons) == (3, {"num_gpus": 2, "duration": 1})


def test_a_missing_required_column_is_named(tmp_path: Path) -> None:
    path = native(tmp_path, "a,0,1", header="job_id,submit,num_gpus,queue")
    with pytest.raises(TraceError, match="missing required column 'duration'") as caught:
        load_trace(path, format="native")
    assert caught.value.column == "duration"


def test_an_unknown_native_column_is_an_error_with_a_hint(tmp_path: Path) -> None:
    path = native(tmp_path, "a,0,1,60,2", header=NATIVE_HEADER + ",teir")
    with pytest.raises(TraceError, match=r"unknown column 'teir' \(did you mean 'tier'\?\)") as caught:
        load_trace(path)
    assert caught.value.column == "teir"


def test_a_repeated_native_column_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="column 'queue' appears more than once"):
        load_trace(native(tmp_path, "a,0,1,60,x,y", header=NATIVE_HEADER + ",queue,queue"))


# --- Parquet -------------------------------------------------------------------------------------


def test_parquet_round_trip_matches_csv(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "job_id": ["a", "b", "c"],
            "submit": [10.0, 5.5, 10.0],
            "num_gpus": [16, 1, 4],
            "duration": [20000.0, 60.0, 3600.0],
            "tier": [2, None, 3],
            "resumable": [True, False, None],
            "replicas": [2, 1, None],
            "queue": ["vision", None, "nlp"],
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    csv_path = write(
        tmp_path,
        "job_id,submit,num_gpus,duration,tier,resumable,replicas,queue\n"
        "a,10.0,16,20000.0,2,true,2,vision\nb,5.5,1,60.0,,false,1,\n"
        "c,10.0,4,3600.0,3,,,nlp\n",
    )
    from_parquet = load_trace(tmp_path / "t.parquet", seed=7)
    assert from_parquet.format == "native"
    assert from_parquet.jobs == load_trace(csv_path, seed=7).jobs
    assert [j.job_id for j in from_parquet.jobs] == ["b", "a", "c"]
    assert from_parquet.jobs[1].gpus_per_replica == 8


def test_parquet_errors_name_the_row(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(
        pa.table({"job_id": ["a", "b"], "submit": [0.0, 1.0], "num_gpus": [1, 0], "duration": [1.0, 1.0]}),
        tmp_path / "t.parquet",
    )
    with pytest.raises(TraceError, match=r"t\.parquet row 2: num_gpus: '0' is below 1"):
        load_trace(tmp_path / "t.parquet")


def test_parquet_without_pyarrow_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(TraceError, match=r"reading Parquet needs pyarrow: pip install 'gpu-warden\[parquet\]'"):
        load_trace(tmp_path / "t.parquet")


# --- order, rebasing, limit ----------------------------------------------------------------------


def test_jobs_are_sorted_by_submit_then_file_order_and_rebased(tmp_path: Path) -> None:
    path = native(tmp_path, "late,300,1,60", "tie1,150,1,60", "first,100,1,60", "tie2,150,1,60")
    trace = load_trace(path)
    assert [(j.job_id, j.submit, j.seq) for j in trace.jobs] == [
        ("first", 0.0, 0),
        ("tie1", 50.0, 1),
        ("tie2", 50.0, 2),
        ("late", 200.0, 3),
    ]


def test_limit_keeps_the_first_jobs_by_submit_with_the_same_draws(tmp_path: Path) -> None:
    rows = [f"j{i},{(37 * i) % 101},1,{60 + 997 * i}" for i in range(60)]
    path = native(tmp_path, *rows)
    whole = load_trace(path, seed=5)
    head = load_trace(path, seed=5, limit=10)
    assert head.jobs == whole.jobs[:10]
    assert load_trace(path, limit=0).jobs == ()


# --- enrichment ----------------------------------------------------------------------------------


def mixed_jobs(count: int = 200) -> list[TraceJob]:
    """Short and long jobs of every size, so that every seeded draw matters somewhere."""
    sizes = (1, 2, 4, 8, 16, 24, 12)
    return [
        TraceJob(
            str(i),
            float(i),
            sizes[i % len(sizes)],
            float(300 + (i * 7919) % 40000),
            gpus_per_replica=sizes[i % len(sizes)],
            seq=i,
        )
        for i in range(count)
    ]


def test_enrichment_is_deterministic_for_a_seed_and_varies_with_it() -> None:
    jobs = mixed_jobs()
    first, rules_a = enrich(jobs, seed=1, format="philly-rfold")
    again, rules_b = enrich(jobs, seed=1, format="philly-rfold")
    other, _ = enrich(jobs, seed=2, format="philly-rfold")
    assert first == again and rules_a == rules_b
    assert [j.tier for j in first] != [j.tier for j in other]
    assert [j.checkpoint_interval for j in first] != [j.checkpoint_interval for j in other]
    assert {j.tier for j in first} == {2, 3, 4}


def test_loading_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    path = native(tmp_path, *(f"j{i},{i},{1 + i % 3},{100 + 400 * i}" for i in range(80)))
    assert load_trace(path, seed=9).jobs == load_trace(path, seed=9).jobs
    assert load_trace(path, seed=9).jobs != load_trace(path, seed=10).jobs


def test_enrichment_never_overwrites_given_native_columns(tmp_path: Path) -> None:
    header = NATIVE_HEADER + ",tier,startup_seconds,resumable,checkpoint_interval,checkpoint_seconds,queue"
    path = native(
        tmp_path, *(f"j{i},{i},{8 * (1 + i % 2)},{100 + 9000 * i},1,5,false,,0,q" for i in range(30)), header=header
    )
    for seed in range(4):
        trace = load_trace(path, seed=seed)
        assert {
            (j.tier, j.startup_seconds, j.resumable, j.checkpoint_interval, j.checkpoint_seconds, j.queue)
            for j in trace.jobs
        } == {(1, 5.0, False, None, 0.0, "q")}
        assert trace.rules == ()


def test_enrichment_of_jobs_leaves_given_fields_alone() -> None:
    jobs = [TraceJob("a", 0.0, 8, 99999.0, queue="vc1", tier=4, gpus_per_replica=8)]
    (job,), applied = enrich(jobs, seed=0, format="philly")
    assert (job.queue, job.tier) == ("vc1", 2)  # philly records the queue, not the tier
    (kept,), _ = enrich(jobs, seed=0, format="philly", given={"queue", "tier"})
    assert (kept.queue, kept.tier) == ("vc1", 4)
    assert rules.RULE_QUEUE not in applied


@pytest.mark.parametrize(
    ("gpus", "duration", "draw", "tier"),
    [
        (8, 4 * 3600, 0.0, 2),  # pre-training: large and long, whatever the draw
        (64, 10 * 3600, 0.99, 2),
        (8, 4 * 3600 - 1, 0.5, 3),  # large but not long enough
        (4, 10 * 3600, 0.0, 3),  # long but small
        (1, 3599, 0.19, 4),  # under one GPU-hour: the draw decides
        (1, 3599, 0.2, 3),
        (2, 1800, 0.0, 3),  # exactly one GPU-hour is not under it
    ],
)
def test_tier_rule(gpus: int, duration: float, draw: float, tier: int) -> None:
    assert rules.tier_for(gpus, duration, draw) == tier


@pytest.mark.parametrize(("gpus", "seconds"), [(1, 30.0), (2, 45.0), (8, 75.0), (128, 135.0), (2**20, 300.0)])
def test_startup_rule(gpus: int, seconds: float) -> None:
    assert rules.startup_for(gpus) == seconds


@pytest.mark.parametrize(
    ("gpus", "expected"), [(1, (1, 1)), (8, (1, 8)), (12, (1, 12)), (16, (2, 8)), (24, (3, 8)), (128, (16, 8))]
)
def test_replica_rule(gpus: int, expected: tuple[int, int]) -> None:
    assert rules.replicas_for(gpus) == expected


def test_checkpoint_rule() -> None:
    short, long_, huge = enrich(
        [
            TraceJob("s", 0.0, 4, 1799.0, gpus_per_replica=4),
            TraceJob("l", 1.0, 4, 1800.0, gpus_per_replica=4, seq=1),
            TraceJob("h", 2.0, 64, 9e5, gpus_per_replica=64, seq=2),
        ],
        seed=0,
        format="philly-rfold",
    )[0]
    assert (short.resumable, short.checkpoint_interval, short.checkpoint_seconds) == (False, None, 0.0)
    assert long_.resumable and long_.checkpoint_interval in (1800.0, 3600.0, 7200.0)
    assert long_.checkpoint_seconds == 30.0
    assert huge.checkpoint_seconds == 120.0
    assert (huge.replicas, huge.gpus_per_replica) == (8, 8)


def test_enrich_refuses_an_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown trace format"):
        enrich([], seed=0, format="slurm")


# --- Philly (Pollux) -----------------------------------------------------------------------------

PHILLY_ROWS = (
    "2017-10-09 07:01:55,66.0,1,66.0,vcA\n"
    "2017-10-09 06:13:03,2951.0,2,5902.0,vcB\n"
    "2017-10-09 06:13:03,20000.0,16,320000.0,vcZ\n"
)


def test_philly_maps_cluster_to_queue_and_rebases_utc_times(tmp_path: Path) -> None:
    path = write(tmp_path, PHILLY_HEADER + "\n" + PHILLY_ROWS + "\n")
    write(tmp_path, "vc,node num\nvcA,4\nvcB,2\nvcC,1\n", name="philly_vc_nodes.csv")
    trace = load_trace(path)
    assert [(j.job_id, j.submit, j.queue, j.num_gpus) for j in trace.jobs] == [
        ("1", 0.0, "vcB", 2),
        ("2", 0.0, "vcZ", 16),
        ("0", 48 * 60 + 52.0, "vcA", 1),
    ]
    assert trace.queues == {"vcA": 32.0, "vcB": 16.0, "vcC": 8.0, "vcZ": 0.0}
    assert any("(vcZ) get quota 0" in rule for rule in trace.rules)
    big = trace.jobs[1]
    assert (big.replicas, big.gpus_per_replica, big.tier) == (2, 8, 2)


def test_philly_takes_an_explicit_vc_file_and_has_no_quotas_without_one(tmp_path: Path) -> None:
    path = write(tmp_path, PHILLY_HEADER + "\n" + PHILLY_ROWS)
    assert load_trace(path).queues == {}
    vcs = write(tmp_path, "vc,node num\nvcA,1\n", name="vcs.csv")
    assert load_trace(path, vc_file=vcs).queues == {"vcA": 8.0, "vcB": 0.0, "vcZ": 0.0}


def test_vc_file_is_for_philly_only(tmp_path: Path) -> None:
    vcs = write(tmp_path, "vc,node num\nvcA,1\n", name="vcs.csv")
    with pytest.raises(TraceError, match="vc_file applies to philly traces only"):
        load_trace(native(tmp_path, "a,0,1,60"), vc_file=vcs)


def test_philly_bad_timestamp_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, PHILLY_HEADER + "\n" + PHILLY_ROWS + "yesterday,5.0,1,5.0,vcA\n")
    with pytest.raises(TraceError, match=r"line 5: timestamp: 'yesterday' is not a date-time"):
        load_trace(path)
    trace = load_trace(path, skip_invalid=True)
    assert (len(trace.jobs), trace.skipped_reasons) == (3, {"timestamp": 1})


# --- Philly (RFold) ------------------------------------------------------------------------------


def test_rfold_rejects_zero_durations_always_and_says_so(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        RFOLD_HEADER + "\n0,5.0,CLOS,1,1,100.0\n1,6.0,CLOS,1,1,0.0\n2,7.0,CLOS,2+2,4,50.0\n3,7.0,CLOS,1,1,0.0\n",
    )
    trace = load_trace(path)
    assert [(j.job_id, j.submit, j.num_gpus, j.queue) for j in trace.jobs] == [
        ("0", 0.0, 1, "default"),
        ("2", 2.0, 4, "default"),
    ]
    assert (trace.skipped, trace.skipped_reasons) == (2, {"duration": 2})
    assert any("rows with duration 0 are rejected, always (2 in this file" in r for r in trace.rules)


def test_rfold_negative_duration_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, RFOLD_HEADER + "\n0,5.0,CLOS,1,1,-1.0\n")
    with pytest.raises(TraceError, match=r"line 2: duration \(sec\): '-1.0' is negative"):
        load_trace(path)


# --- Alibaba PAI 2023 ----------------------------------------------------------------------------

PAI_ROWS = """
p0,12000,16384,1,1000,,LS,Running,0,1000,0
p1,6000,12288,1,460,V100M16|V100M32,BE,Running,10,500,20
p2,88000,327680,8,1000,,Guaranteed,Succeeded,30,4000,100
p3,4000,15258,1,220,,Burstable,Running,40,900,
p4,4000,15258,0,0,,BE,Running,50,900,50
p5,4000,15258,1,1000,,BE,Failed,60,,60
p6,4000,15258,1,1000,,BE,Failed,70,70,70
"""


def test_pai_maps_qos_times_fractions_and_resources(tmp_path: Path) -> None:
    path = write(tmp_path, PAI_HEADER + PAI_ROWS)
    trace = load_trace(path)
    by_id = {j.job_id: j for j in trace.jobs}
    assert {k: j.tier for k, j in by_id.items()} == {"p0": 1, "p1": 4, "p2": 2, "p3": 3}
    assert by_id["p1"].duration == 480.0  # deletion - scheduled
    assert by_id["p3"].duration == 860.0  # not scheduled: deletion - creation
    assert by_id["p1"].num_gpus == 1 and by_id["p1"].flavor == "V100M16|V100M32"
    assert by_id["p0"].flavor is None
    assert (by_id["p2"].num_gpus, by_id["p2"].replicas, by_id["p2"].gpus_per_replica) == (8, 1, 8)
    assert (by_id["p2"].cpu, by_id["p2"].memory) == (88000, 327680)
    assert (trace.skipped, trace.skipped_reasons) == (3, {"num_gpu": 1, "deletion_time": 1, "duration": 1})
    assert any(r.startswith("fractional GPUs: 2 pods") for r in trace.rules)
    assert rules.RULE_TIER not in trace.rules


def test_pai_unknown_qos_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, PAI_HEADER + "\np0,1,1,1,1000,,Gold,Running,0,10,0\n")
    with pytest.raises(TraceError, match=r"line 2: qos: 'Gold' is not one of LS, Guaranteed, Burstable, BE"):
        load_trace(path)


def test_pai_without_times_names_the_missing_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,1000\n")
    with pytest.raises(TraceError, match="missing required columns 'creation_time', 'deletion_time'"):
        load_trace(path)


# --- the real traces -----------------------------------------------------------------------------


def traces_dir() -> Path:
    env = os.environ.get("WARDEN_TRACES")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "traces"


def real(relative: str) -> Path:
    path = traces_dir() / relative
    if not path.is_file():
        pytest.skip(f"real trace {path} is absent (set WARDEN_TRACES to the shared/traces folder)")
    return path


def test_real_pollux_philly_trace() -> None:
    trace = load_trace(real("philly/pollux_philly.csv"))
    assert (trace.format, len(trace.jobs), trace.skipped) == ("philly", 82_247, 0)
    assert trace.jobs[0].submit == 0.0 and [j.seq for j in trace.jobs[:3]] == [0, 1, 2]
    quotas = {q: gpus for q, gpus in trace.queues.items() if gpus > 0}
    assert len(quotas) == 11 and quotas["6214e9"] == 64 * 8
    assert {j.queue for j in trace.jobs} <= trace.queues.keys()
    assert max(j.num_gpus for j in trace.jobs) == 128


def test_real_rfold_philly_trace() -> None:
    trace = load_trace(real("philly/rfold_philly_trace.csv"))
    # The file holds 111,549 data rows (ids 0..111548); 10 have duration 0.
    assert (trace.format, len(trace.jobs)) == ("philly-rfold", 111_549 - 10)
    assert (trace.skipped, trace.skipped_reasons) == (10, {"duration": 10})
    assert {j.queue for j in trace.jobs} == {"default"}


def test_real_vc_quotas() -> None:
    path = real("philly/philly_vc_nodes.csv")
    trace = load_trace(real("philly/pollux_philly.csv"), vc_file=path, limit=5)
    assert sum(1 for gpus in trace.queues.values() if gpus > 0) == 11
    assert sum(trace.queues.values()) == 352 * 8


def test_real_pai_default_pod_list() -> None:
    trace = load_trace(real("alibaba_pai_v2023/openb_pod_list_default.csv"))
    assert trace.format == "pai2023"
    assert len(trace.jobs) + trace.skipped == 8_152
    assert trace.skipped_reasons["num_gpu"] == 1_088
    tiers = Counter(j.tier for j in trace.jobs)
    assert set(tiers) == {1, 2, 3, 4}


def test_real_pai_multigpu50_lacks_times() -> None:
    with pytest.raises(TraceError, match="creation_time"):
        load_trace(real("alibaba_pai_v2023/openb_pod_list_multigpu50.csv"))


def test_without_enrichment_jobs_keep_the_bare_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "#job id,arrival time (sec),topology,shape,size,duration (sec)\n0,0.0,CLOS,1,16,7200.0\n1,5.0,CLOS,1,1,60.0\n",
    )
    bare = load_trace(path, enrich=False)
    assert len(bare.rules) < len(load_trace(path).rules) and bare.format == "philly-rfold"
    assert [(j.tier, j.startup_seconds, j.checkpoint_interval, j.replicas, j.gpus_per_replica) for j in bare.jobs] == [
        (3, 0.0, None, 1, 16),
        (3, 0.0, None, 1, 1),
    ]
    enriched = load_trace(path)
    assert enriched.rules and enriched.jobs[0].replicas == 2 and enriched.jobs[0].startup_seconds > 0
