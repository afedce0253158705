"""What `describe` shows beyond the database rows: the save-does-not-fit-the-grace warning."""

from __future__ import annotations

from types import SimpleNamespace

from warden.server.views import warnings


def _attempt(**kw: object) -> SimpleNamespace:
    base = dict(number=1, ended_at=None, started_at=1000.0, startup_s=20.0, last_checkpoint_at=1400.0,
                sigterm_save_s=None)
    return SimpleNamespace(**{**base, **kw})


JOB = SimpleNamespace(attempt=1, gpus=4, replicas=2)


def test_a_save_longer_than_the_grace_warns_with_the_work_a_preemption_would_lose() -> None:
    [text] = warnings(JOB, [_attempt(sigterm_save_s=300.0)], now=1700.0, grace=120.0)
    # 8 GPUs × 300 s since the last checkpoint = 40 GPU-minutes.
    assert "300 s" in text and "120 s" in text and "40.0 GPU-minutes" in text


def test_no_warning_when_the_save_fits_or_is_unknown_or_the_attempt_ended() -> None:
    assert warnings(JOB, [_attempt(sigterm_save_s=60.0)], now=1700.0, grace=120.0) == []
    assert warnings(JOB, [_attempt()], now=1700.0, grace=120.0) == []
    assert warnings(JOB, [_attempt(sigterm_save_s=300.0, ended_at=1600.0)], now=1700.0, grace=120.0) == []
