"""The dashboard's pure parts: formatting, secret masking, the filter and
settings parsers, the chart's geometry, the shared cache's single flight."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

import leaseq
from leaseq._secret_fields import MASK, SecretMask
from leaseq._timeline import timeline
from leaseq.web.data import SharedCache
from leaseq.web.forms import JobFilter, payload_filter, seconds
from leaseq.web.views import age, chart, duration, retention, size

from .test_web_fixtures import AppFactory, Browser, Jobs, jobs, make_app

__all__ = ["jobs", "make_app"]  # fixtures, used by name


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "—"),
        (0.4, "0s"),
        (42, "42s"),
        (200, "3m 20s"),
        (7500, "2h 5m"),
        (3 * 86400 + 4 * 3600, "3d 4h"),
        (-12, "-12s"),
    ],
)
def test_age(value: float | None, shown: str) -> None:
    assert age(value) == shown


def test_duration_and_size() -> None:
    assert duration(0.0123) == "12 ms"
    assert duration(1.5) == "1.5 s"
    assert duration(125) == "2m 5s"
    assert size(512) == "512 B"
    assert size(1536) == "1.5 KiB"
    assert size(3 * 1024 * 1024) == "3.0 MiB"


def test_secret_fields_are_masked_at_any_depth() -> None:
    mask = SecretMask()
    payload = {
        "customer": "acme",
        "DB-Password": "x",
        "nested": [{"apiKey": "y", "ok": 1}, {"client_secret": "z"}],
        "Authorization": "Bearer q",
        "accessToken": "t",
        "private-key": "k",
        "credentials": {"user": "u"},
    }
    assert mask.mask(payload) == {
        "customer": "acme",
        "DB-Password": MASK,
        "nested": [{"apiKey": MASK, "ok": 1}, {"client_secret": MASK}],
        "Authorization": MASK,
        "accessToken": MASK,
        "private-key": MASK,
        "credentials": MASK,
    }
    assert SecretMask(["customer"]).mask({"customer": "acme", "password": "p"}) == {
        "customer": MASK,
        "password": "p",
    }


def test_payload_filter() -> None:
    mask = SecretMask()
    assert payload_filter("customer:acme n:5 flag:true address.city:'New York'", mask) == {
        "customer": "acme",
        "n": 5,
        "flag": True,
        "address": {"city": "New York"},
    }
    assert payload_filter("", mask) is None
    for bad in ("customer", ":x", "auth.token:abc", "'unclosed"):
        with pytest.raises(leaseq.InvalidArgument):
            payload_filter(bad, mask)
    # A field named twice (whatever the order): the later one silently replaced
    # the earlier, and a bulk replay then took jobs the filter shown does not match.
    for twice in ("customer:acme customer:globex", "region.x:1 region:us", "region:us region.x:1"):
        with pytest.raises(leaseq.InvalidArgument, match="given twice"):
            payload_filter(twice, mask)


@pytest.mark.parametrize(
    ("typed", "document"),
    [
        ("zip:01234", {"zip": "01234"}),  # JSON writes no leading zero: a string
        ('zip:"75001"', {"zip": "75001"}),
        ("zip:'75001'", {"zip": "75001"}),
        ('"zip:75001"', {"zip": "75001"}),  # the value inside the quotes too
        ('zip:""', {"zip": ""}),
        ("n:-00 m:1.50 k:-0", {"n": "-00", "m": 1.5, "k": 0}),
        ('flag:"true" gone:null', {"flag": "true", "gone": None}),
        ('note:"say \\"hi\\"" a\\ b:c', {"note": 'say "hi"', "a b": "c"}),
    ],
)
def test_payload_filter_values_are_strings_when_quoted(typed: str, document: object) -> None:
    """Quoting makes a value a string; unquoted, only what JSON would write as a
    number, boolean or null is one."""
    assert payload_filter(typed, SecretMask()) == document


@pytest.mark.parametrize("typed", ['"unclosed', "a:b\\", "n:" + "9" * 5000])
def test_a_payload_filter_that_cannot_be_read_is_an_invalid_argument(typed: str) -> None:
    with pytest.raises(leaseq.InvalidArgument, match="payload filter"):
        payload_filter(typed, SecretMask())


@pytest.mark.parametrize(
    "value", [1_000_000.0, 1234.5678, 0.1 + 0.2, 1e16, 1e-5, 90.0, 5400.0, 86400.0, 3.1536e9]
)
def test_settings_are_shown_exactly_in_a_form_the_settings_form_reads(value: float) -> None:
    """No exponent and no rounding: what the form shows, it reads back as it was."""
    shown = retention(value)
    assert "e" not in shown
    assert seconds(shown, "x") == value


def test_job_filter_round_trips_in_a_query() -> None:
    found = JobFilter.read({"queue": "reports", "state": "failed", "payload": "customer:acme"})
    again = JobFilter.read(dict(pair.split("=") for pair in found.query().split("&")))
    assert again.queue == "reports"
    assert found.query(before=42).endswith("before=42")
    with pytest.raises(leaseq.InvalidArgument):
        JobFilter.read({"state": "lost"})


def test_durations() -> None:
    assert seconds("90s", "x") == 90
    assert seconds("2h", "x") == 7200
    assert seconds("1.5", "x") == 1.5
    assert seconds("never", "x", forever=True) is None
    with pytest.raises(leaseq.InvalidArgument, match="not a duration"):
        seconds("never", "lease")


def test_chart_stacks_failed_on_done() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    minutes = [
        leaseq.ActivityMinute(start + timedelta(minutes=i), done, failed)
        for i, (done, failed) in enumerate([(0, 0), (3, 1), (1, 0)])
    ]
    drawn = chart(minutes, width=30, height=42)
    assert (drawn.peak, drawn.done, drawn.failed) == (4, 4, 1)
    empty, full, small = drawn.bars
    assert empty.done_height == empty.failed_height == 0
    assert full.done_height + full.failed_height == 40  # the peak fills the height (less 2)
    assert full.failed_y + full.failed_height == full.done_y  # failed sits on done
    assert small.x == 20
    assert full.label == "00:01 UTC: 3 done, 1 failed"


async def test_the_cache_loads_once_for_many_readers_and_forgets_failures() -> None:
    now = [0.0]
    cache = SharedCache(2.0, clock=lambda: now[0])
    loads = 0

    async def load() -> int:
        nonlocal loads
        loads += 1
        await asyncio.sleep(0.01)
        return loads

    assert await asyncio.gather(*(cache.get("k", load) for _ in range(50))) == [1] * 50
    assert await cache.get("k", load) == 1  # still fresh
    now[0] = 2.5
    assert await cache.get("k", load) == 2  # expired: loaded again

    async def broken() -> int:
        raise leaseq.TransientError("away")

    with pytest.raises(leaseq.TransientError):
        await cache.get("b", broken)
    assert await cache.get("b", load) == 3  # the failure was not kept


async def test_the_cache_keeps_a_bounded_number_of_entries() -> None:
    """One entry per distinct ``?queue=`` value must not pile up for ever: expired
    entries go when another is added, and at most ``max_entries`` are kept, the
    oldest out first."""
    now = [0.0]
    cache = SharedCache(2.0, clock=lambda: now[0], max_entries=50)

    async def load() -> int:
        return 1

    for n in range(120):
        await cache.get(("failed_groups", f"nosuch{n}"), load)
    assert len(cache) == 50
    assert ("failed_groups", "nosuch119") in cache
    assert ("failed_groups", "nosuch69") not in cache  # the oldest went first
    now[0] = 2.5  # every entry expired
    await cache.get(("stats",), load)
    assert len(cache) == 1


async def test_secret_fields_option(make_app: AppFactory, jobs: Jobs) -> None:
    http = Browser(make_app(secret_fields=("customer",)))
    try:
        page = (await http.get(f"/jobs/{jobs.secret}")).text
    finally:
        await http.close()
    assert "acme" not in page


async def test_a_load_nobody_waits_for_any_more_is_cancelled() -> None:
    """One reader of many going away leaves the load to the others; once the last
    one is gone, the load is cancelled (it would hold the pool for nothing) and
    the next reader starts a new one."""
    cache = SharedCache(2.0)
    started: list[asyncio.Event] = []
    cancelled: list[int] = []

    async def load() -> int:
        started.append(asyncio.Event())
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(len(started))
            raise
        return 0  # pragma: no cover - never set

    readers = [asyncio.ensure_future(cache.get("k", load)) for _ in range(2)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    readers[0].cancel()
    await asyncio.gather(readers[0], return_exceptions=True)
    await asyncio.sleep(0)
    assert (cache.loading, cancelled) == (1, [])
    readers[1].cancel()
    await asyncio.gather(readers[1], return_exceptions=True)
    await asyncio.sleep(0)
    assert (cache.loading, cancelled) == (0, [1])

    async def quick() -> int:
        return 7

    assert await cache.get("k", quick) == 7


def _job_with_history(*history: dict[str, object], **fields: object) -> leaseq.Job:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    values: dict[str, object] = {
        "job_id": 1,
        "queue": "q",
        "payload": {},
        "payload_bytes": 2,
        "status": leaseq.JobStatus.QUEUED,
        "priority": 0,
        "available_at": now,
        "lease_until": None,
        "lease_version": 0,
        "attempts": 0,
        "max_attempts": 20,
        "key": None,
        "seq": None,
        "idempotency_key": "k",
        "last_error": None,
        "history": history,
        "created_at": now,
        "claimed_at": None,
        "finished_at": None,
    }
    return leaseq.Job(**{**values, **fields})  # type: ignore[arg-type]


def test_a_timeline_whose_oldest_entry_is_a_replay_counts_the_runs_before_it() -> None:
    """The history keeps the newest 50 entries; when the oldest kept one is a replay,
    its attempt (the attempts of the budget it ended) tells how many runs came
    before: the next run is numbered after them."""
    at = datetime(2025, 1, 2, tzinfo=UTC)
    replay = {"outcome": "replayed", "attempt": 20, "at": at, "previous_status": "failed"}
    run = {"outcome": "retry", "attempt": 1, "at": at, "claimed_at": at, "lease_version": 22}
    history = (replay, *([run] * 49))
    texts = [event.text for event in timeline(_job_with_history(*history, attempts=49))]
    assert texts[1] == (
        "at least 20 earlier runs not kept (a job's history keeps its newest 50 entries)"
    )
    assert texts[2] == "replayed"
    assert texts[3] == "run 21 claimed, lease version 22"
    assert texts[-1] == "queued: claimable from here on"
    assert "run 69: failed, retried later" in texts
    # A history that lost nothing (fewer than 50 entries) says nothing of the kind.
    assert not [t for t in (e.text for e in timeline(_job_with_history(run))) if "kept" in t]
