"""Why a job is pending (DESIGN §4.5): one primary reason, a plain sentence, machine details.

Every reason class is exercised, including the variants with optional fields unset.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from warden.engine import reasons as R
from warden.engine.reasons import REASON_CODES, Reason

SAMPLES: list[Reason] = [
    R.QuotaExceeded("vision", "gpu", 16, 4),
    R.BorrowingLimit("language", "gpu:h100", 8, 2),
    R.InsufficientCapacity("gpu", 16, 8),
    R.InsufficientCapacity("gpu:h100", 16, 8, reserved_at=1_000.0),
    R.Fragmented("pack", 8, 12, 4),
    R.Fragmented("block", 32, 40, 16, reserved_at=7_200.0),
    R.WaitingForLease(("v1", "v2"), 3_700.0),
    R.PreemptionWouldNotPay(("v1",), 7_200.0, 1_060.0),
    R.PreemptionWouldNotPay(("v1", "v2"), 7_200.0, 1_060.0, reserved_at=1_060.0),
    R.WaitingForGrace(("v1",), 1_120.0),
    R.WaitingForGrace(("v1", "v2"), None),
    R.Reserved("big", 1_000.0),
    R.Reserved("big", None),
    R.Claimed("lender"),
    R.Position(3, "head"),
    R.AwaitingApproval(2),
    R.ThrashBackoff(50.0),
    R.UnknownQueue("nope"),
    R.QuotaExceeded("vision", "gpu", 4, 2, 30, 32, 1_840.0, "812", 4),
    R.BorrowingLimit("language", "gpu", 8, 2, 40, 42, None, None, 4),
    R.InsufficientCapacity("gpu", 16, 8, reservations=1, unreserved="taken"),
    R.InsufficientCapacity("gpu", 16, 8, reservations=0, unreserved="taken"),
    R.InsufficientCapacity("gpu", 16, 8, unreserved="no_forecast"),
    R.Fragmented("pack", 8, 12, 4, any_fits=True),
    R.Fragmented("any", 8, 12, 4, split_gpus=4),
    R.WaitingForLease(("v1", "v2"), 3_700.0, "lease", "v2", 2_700.0),
    R.WaitingForLease(("v1",), 700.0, "efficiency", "v1", 0.0, 60.0, False, 5.0, 0.9),
    R.WaitingForLease(("v1",), 700.0, "efficiency", "v1", 0.0, 30.0, True, 0.0, 0.95),
    R.WaitingForLease(
        ("v1",), 900.0, "efficiency", "v1", 0.0, 60.0, False, 30.0, 0.9, checkpoint_measured=False, save_measured=False
    ),
    R.WaitingForLease(
        ("v1",), 700.0, "efficiency", "v1", 0.0, 10.9, True, 15.8, 0.75, checkpoint_measured=False, save_measured=True
    ),
    R.WaitingForLease(("v1",), 800.0, "efficiency", "v1", 0.0, 10.9, True, 47.4, 0.75, checkpoint_measured=True),
    R.WaitingForLease(("v1",), 88_400.0, "thrash_budget", "v1", 0.0, thrash_count=3, thrash_window_s=86_400.0),
    R.Reserved("big", 1_000.0, backfill_s=540.0),
    R.UnknownQueue("nope", ("a", "b")),
]


def _reason_classes() -> list[type[Reason]]:
    found: list[type[Reason]] = []
    todo = list(Reason.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    # `slots=True` rebuilds each dataclass: keep the classes the module actually exports.
    return sorted({c for c in found if getattr(R, c.__name__, None) is c}, key=lambda c: c.__name__)


def _id(r: Reason) -> str:
    return f"{r.code}-{SAMPLES.index(r)}"


def test_codes_are_unique() -> None:
    assert len(REASON_CODES) == len(set(REASON_CODES))
    classes = _reason_classes()
    assert len({c.code for c in classes}) == len(classes)


def test_every_reason_class_is_listed_and_sampled() -> None:
    classes = _reason_classes()
    assert {c.code for c in classes} == set(REASON_CODES)
    assert {type(r) for r in SAMPLES} == set(classes)


def test_design_reasons_are_all_present() -> None:
    design = {
        "QuotaExceeded",
        "BorrowingLimit",
        "InsufficientCapacity",
        "Fragmented",
        "WaitingForLease",
        "WaitingForGrace",
        "Reserved",
        "Position",
        "AwaitingApproval",
        "ThrashBackoff",
    }
    assert design <= set(REASON_CODES)


@pytest.mark.parametrize("cls", _reason_classes(), ids=lambda c: c.__name__)
def test_code_is_the_class_name(cls: type[Reason]) -> None:
    assert cls.code == cls.__name__


@pytest.mark.parametrize("r", SAMPLES, ids=_id)
def test_message_is_one_plain_sentence(r: Reason) -> None:
    m = r.message
    assert isinstance(m, str) and m.strip() == m and len(m) > 10
    assert m.endswith(".")
    assert not m[0].islower()  # starts like a sentence (a capital or a number)
    assert "\n" not in m
    assert ". " not in m[:-1] and not m.endswith("..")  # no second sentence


@pytest.mark.parametrize("r", SAMPLES, ids=_id)
def test_message_names_the_details_a_person_needs(r: Reason) -> None:
    m = r.message
    for f in dataclasses.fields(r):
        value = getattr(r, f.name)
        if isinstance(value, str):
            assert value.replace("_", " ") in m or value in m, (f.name, m)
        elif isinstance(value, int) and not isinstance(value, bool):
            assert str(value) in m, (f.name, m)
        elif isinstance(value, tuple):
            for item in value:
                assert str(item) in m, (f.name, m)


@pytest.mark.parametrize("r", SAMPLES, ids=_id)
def test_to_dict_has_code_message_and_json_details(r: Reason) -> None:
    d = r.to_dict()
    assert set(d) == {"code", "message", "details"}
    assert d["code"] == r.code and d["message"] == r.message
    assert set(d["details"]) == {f.name for f in dataclasses.fields(r)}
    text = json.dumps(d, allow_nan=False)
    assert json.loads(text) == d


@pytest.mark.parametrize("r", SAMPLES, ids=_id)
def test_details_hold_the_field_values_with_tuples_as_lists(r: Reason) -> None:
    details = r.details()
    for f in dataclasses.fields(r):
        value = getattr(r, f.name)
        if isinstance(value, tuple):
            assert details[f.name] == list(value) and isinstance(details[f.name], list)
        else:
            assert details[f.name] == value


def test_details_is_a_fresh_dict_each_time() -> None:
    r = R.WaitingForLease(("v1",), 10.0)
    r.details()["victims"].append("x")
    assert r.details()["victims"] == ["v1"]


def test_reasons_are_values() -> None:
    assert R.Position(2, "h") == R.Position(2, "h")
    assert hash(R.WaitingForGrace(("a",), None)) == hash(R.WaitingForGrace(("a",), None))
    with pytest.raises(dataclasses.FrozenInstanceError):
        R.Position(2, "h").n = 3  # type: ignore[misc]


def test_optional_times_change_the_message() -> None:
    assert "reserved" not in R.InsufficientCapacity("gpu", 16, 8).message
    assert "t=1000s" in R.InsufficientCapacity("gpu", 16, 8, reserved_at=1_000.0).message
    assert "t=1120s" in R.WaitingForGrace(("v1",), 1_120.0).message
    assert "unknown" in R.WaitingForGrace(("v1",), None).message


@pytest.mark.parametrize("r", SAMPLES, ids=_id)
def test_a_stored_reason_is_rebuilt_from_its_code_and_details(r: Reason) -> None:
    stored = json.loads(json.dumps(r.to_dict()))
    assert R.from_dict({"code": stored["code"], "details": stored["details"]}) == r


def test_a_row_stored_before_a_field_existed_takes_its_default() -> None:
    old = {"code": "WaitingForLease", "details": {"victims": ["v1"], "earliest_at": 10.0}}
    assert R.from_dict(old) == R.WaitingForLease(("v1",), 10.0)


@pytest.mark.parametrize(
    "stored",
    [
        {"code": "Held", "details": {"by": "warden"}},
        {"code": "Position", "details": {"n": 3}},
        {"code": "Position", "details": {"n": 3, "ahead_by": "h", "other": 1}},
        {"code": "Reserved"},
        {"code": "Position", "details": {"n": 3, "ahead_by": "h", "unknown": 1}},
    ],
)
def test_what_cannot_be_rebuilt_is_none_or_ignores_unknown_keys(stored: dict[str, object]) -> None:
    rebuilt = R.from_dict(stored)
    if stored["code"] == "Position" and "ahead_by" in stored.get("details", {}):  # type: ignore[operator]
        assert rebuilt == R.Position(3, "h")
    else:
        assert rebuilt is None


@pytest.mark.parametrize("r", SAMPLES, ids=_id)
def test_render_writes_every_time_through_the_writer(r: Reason) -> None:
    m = r.render(R.virtual_times(600.0))
    assert "t=" not in m.replace("(in ", "").replace(" ago)", "") or "(" in m
    for f in dataclasses.fields(r):
        value = getattr(r, f.name)
        if f.name in ("earliest_at", "eta", "due", "until", "frees_at", "reserved_at") and value is not None:
            assert f"t={value:.0f}s (" in m, (f.name, m)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (4.25, "4.2s"),
        (45, "45s"),
        (90, "1m30s"),
        (540, "9m"),
        (3_600, "1h"),
        (7_500, "2h5m"),
        (97_200, "1d3h"),
        (2 * 86_400 + 4 * 3_600 + 59, "2d4h"),
    ],
)
def test_span_says_durations_in_the_short_form(seconds: float, text: str) -> None:
    assert R.span(seconds) == text


def test_relative_says_in_ago_or_now() -> None:
    assert R.relative(1_540.0, 1_000.0) == "in 9m"
    assert R.relative(1_000.0, 1_180.0) == "3m ago"
    assert R.relative(1_000.4, 1_000.0) == "now"


def test_the_efficiency_floor_sentence_does_not_say_the_lease_is_over() -> None:
    """The floor is what holds the victim; its lease may still run (15 s into a 30 s lease): the
    sentence says the lease ends before the floor lifts, never that it is over."""
    why = R.WaitingForLease(
        victims=("7",),
        earliest_at=900.0,
        rule="efficiency",
        victim="7",
        lease_s=30.0,
        startup_s=60.0,
        startup_measured=True,
        checkpoint_s=30.0,
        checkpoint_measured=True,
        min_efficiency=0.9,
    )
    assert "its lease of 30s ends before that, but with its measured startup of 1m" in why.message
    assert "is over" not in why.message
