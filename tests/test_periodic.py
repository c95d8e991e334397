"""Periodic jobs: exactly one job per tick, whatever the number of workers and
restarts; missed ticks caught up within a window, the rest skipped and counted;
a paused queue keeps the bookkeeping but gets no job; DST handled."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner

import leaseq
from leaseq._cli import cli
from leaseq._worker.scheduler import Scheduler
from leaseq._worker.schedules import Schedule

from .conftest import AsyncClock


def _app(schema: str, **declarations: dict[str, Any]) -> leaseq.App:
    app = leaseq.App(schema=schema)
    for name, options in declarations.items():
        app.periodic(name, **{"queue": "ticks", **options})
    return app


async def _jobs_by_tick(queue: leaseq.AsyncQueue) -> Counter[str]:
    """How many jobs each tick has (its idempotency key names schedule and tick)."""
    async with queue.connection() as conn:
        rows = await (
            await conn.execute(
                f'SELECT idempotency_key FROM "{queue.schema}".job WHERE queue = %s', ("ticks",)
            )
        ).fetchall()
    return Counter(str(row[0]) for row in rows)


def _tick(name: str, at: datetime) -> str:
    return f"{name}@{at.astimezone(UTC).isoformat()}"


async def _now(queue: leaseq.AsyncQueue) -> datetime:
    return await queue._run(queue._store.clock_now())


async def _past_the_next_tick(queue: leaseq.AsyncQueue, clock: AsyncClock, ticks: int = 1) -> None:
    """Move the clock half a second past the schedule's ``ticks``-th due tick
    (of one `every=60` schedule): exactly that many ticks are due, whatever
    the real time a pass takes (a step of 61 s may cross two tick times)."""
    (info,) = await queue.schedules()
    target = info.next_tick + timedelta(seconds=60 * (ticks - 1) + 0.5)
    await clock.advance((target - await _now(queue)).total_seconds())


async def test_concurrent_schedulers_enqueue_each_tick_once(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock, database_url: str, schema: str
) -> None:
    """Three workers' schedulers pass at the same moments, over 30 ticks of 5
    schedules: every tick has exactly one job, none is missing."""
    # catch_up: the clock moves 10 s per pass plus the real time a pass takes, so
    # on a slow machine a pass may see two ticks due (a "downtime" of a tick);
    # within the catch-up window both get their job, and none may be missing.
    app = _app(
        schema,
        **{f"s{n}": {"every": 10, "payload": {"n": n}, "catch_up": 60} for n in range(5)},
    )
    queues = [leaseq.AsyncQueue(database_url, schema=schema) for _ in range(3)]
    try:
        schedulers = [Scheduler(q, app.schedules) for q in queues]
        await asyncio.gather(*(s.run_once() for s in schedulers))  # declares them
        start = await _now(aqueue)
        for _ in range(30):
            await aclock.advance(10)
            before_pass = await _now(aqueue)
            await asyncio.gather(*(s.run_once() for s in schedulers))
        after_pass = await _now(aqueue)
    finally:
        for q in queues:
            await q.close()
    jobs = await _jobs_by_tick(aqueue)
    assert set(jobs.values()) == {1}, [k for k, v in jobs.items() if v > 1]
    infos = {s.name: s for s in await aqueue.schedules()}

    def ticks(schedule: Schedule, until: datetime) -> set[str]:
        found, tick = set(), schedule.next_after(start)
        while tick <= until:
            found.add(_tick(schedule.name, tick))
            tick = schedule.next_after(tick)
        return found

    for schedule in app.schedules.values():
        got = {k for k in jobs if k.startswith(f"{schedule.name}@")}
        # Every tick up to the last pass has its job; none is later than the last pass.
        assert ticks(schedule, before_pass) <= got <= ticks(schedule, after_pass)
        assert len(got) >= 30
        assert (infos[schedule.name].enqueued, infos[schedule.name].skipped) == (len(got), 0)


async def test_after_a_downtime_only_the_latest_tick_runs_by_default(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock, schema: str
) -> None:
    app = _app(schema, latest={"every": 60}, window={"every": 60, "catch_up": 185})
    scheduler = Scheduler(aqueue, app.schedules)
    await scheduler.run_once()
    # What the downtime is measured from: the first tick the schedules still owe,
    # as they say (a declaration may straddle a tick time on a slow machine, and
    # that tick's job then belongs to the first pass, not to the downtime).
    declared = {s.name: s for s in await aqueue.schedules()}
    assert declared["latest"].next_tick == declared["window"].next_tick  # both every 60 s
    first_owed = declared["latest"].next_tick.timestamp()
    jobs_before = await _jobs_by_tick(aqueue)
    await aclock.advance(10 * 60 + 1)  # ten ticks or so went by with no worker
    after = (await _now(aqueue)).timestamp()
    # The ticks are the multiples of 60 s since the epoch.
    missed = list(range(int(first_owed), int(after) + 1, 60))
    recent = [t for t in missed if t >= after - 185]
    assert await scheduler.run_once() == 1 + len(recent)
    jobs = await _jobs_by_tick(aqueue) - jobs_before  # the jobs of the downtime's ticks
    assert sum(1 for k in jobs if k.startswith("latest@")) == 1
    assert _tick("latest", datetime.fromtimestamp(missed[-1], UTC)) in jobs
    assert {k for k in jobs if k.startswith("window@")} == {
        _tick("window", datetime.fromtimestamp(t, UTC)) for t in recent
    }
    infos = {s.name: s for s in await aqueue.schedules()}

    def counted(name: str) -> tuple[int, int]:
        """What the pass after the downtime enqueued and skipped of one schedule."""
        now, then = infos[name], declared[name]
        return now.enqueued - then.enqueued, now.skipped - then.skipped

    assert counted("latest") == (1, len(missed) - 1)
    assert counted("window") == (len(recent), len(missed) - len(recent))
    assert await scheduler.run_once() == 0  # nothing more is due


async def test_a_paused_queue_keeps_the_bookkeeping_and_gets_no_job(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock, schema: str
) -> None:
    app = _app(schema, nightly={"every": 60})
    scheduler = Scheduler(aqueue, app.schedules)
    await scheduler.run_once()
    await aqueue.configure_queue("ticks", paused=True)
    await _past_the_next_tick(aqueue, aclock)
    assert await scheduler.run_once() == 0
    (info,) = await aqueue.schedules()
    assert (info.enqueued, info.paused_ticks, info.queue_paused) == (0, 1, True)
    assert info.last_tick is not None
    await aqueue.configure_queue("ticks", paused=False)
    await _past_the_next_tick(aqueue, aclock)
    assert await scheduler.run_once() == 1  # the next tick only: no burst of old ones
    (info,) = await aqueue.schedules()
    assert (info.enqueued, info.paused_ticks, info.queue_paused) == (1, 1, False)


async def test_a_restart_keeps_the_bookkeeping_and_a_new_spec_starts_over(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock, schema: str
) -> None:
    await Scheduler(aqueue, _app(schema, s={"every": 60}).schedules).run_once()
    await aclock.advance(61)
    # A restarted worker (a new scheduler) finds the due tick and runs it.
    assert await Scheduler(aqueue, _app(schema, s={"every": 60}).schedules).run_once() == 1
    await aclock.advance(120)
    # Declared anew with another spec: its old ticks mean nothing, it starts over.
    changed = Scheduler(aqueue, _app(schema, s={"every": 3600}).schedules)
    assert await changed.run_once() == 0
    (info,) = await aqueue.schedules()
    assert (info.spec, info.enqueued) == ("every 3600", 1)
    assert info.next_tick > await _now(aqueue)


async def test_a_worker_of_an_older_spec_leaves_a_redeclared_schedule_alone(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock, schema: str
) -> None:
    """A rolling deploy: the new version declared `every 300` while an old worker
    (`every 60`) still runs. The old one must not handle the row with its own
    spec: it computed no tick of the new one, advanced the row past it, and the
    tick was lost with nothing counted."""
    old = Scheduler(aqueue, _app(schema, s={"every": 60}).schedules)
    await old.run_once()  # declares every 60
    new = Scheduler(aqueue, _app(schema, s={"every": 300}).schedules)
    await new.run_once()  # redeclares: every 300, from its next tick
    (info,) = await aqueue.schedules()
    await aclock.advance((info.next_tick - await _now(aqueue)).total_seconds() + 0.5)
    assert await old.run_once() == 0  # not its spec any more
    (still,) = await aqueue.schedules()
    assert still.next_tick == info.next_tick  # left due, for a worker of its spec
    assert await new.run_once() == 1
    assert await _jobs_by_tick(aqueue) == Counter({_tick("s", info.next_tick): 1})


async def test_a_full_queue_leaves_the_tick_due(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The tick is tried again at each pass, and the full queue is said once while
    it lasts: every pass (twice a second, in every worker) logged it again."""
    app = _app(schema, s={"every": 60, "catch_up": 600})
    await aqueue.configure_queue("ticks", max_queued_jobs=1)
    await aqueue.enqueue("ticks", {"filler": True})
    scheduler = Scheduler(aqueue, app.schedules)
    await scheduler.run_once()
    await _past_the_next_tick(aqueue, aclock)
    with caplog.at_level(logging.INFO, logger="leaseq.worker"):
        for _ in range(3):
            assert await scheduler.run_once() == 0
        (info,) = await aqueue.schedules()
        assert info.enqueued == 0
        (claim,) = await aqueue.claim("ticks")
        await aqueue.complete(claim)
        assert await scheduler.run_once() == 1
    (info,) = await aqueue.schedules()
    assert (info.enqueued, info.skipped) == (1, 0)
    said = [r.getMessage() for r in caplog.records if r.name == "leaseq.worker"]
    assert len([m for m in said if "tick stays due" in m]) == 1, said
    assert said[-1] == "schedule s: enqueues again"


async def test_a_schedule_its_queue_refuses_is_said_and_the_others_go_on(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its payload is over its queue's limit: the database refuses each tick. The
    scheduler (every worker runs every schedule) must not end with it."""
    app = leaseq.App(schema=schema)
    app.periodic("big", queue="reports", every=60, payload={"text": "x" * 100})
    app.periodic("small", queue="ticks", every=60)
    await aqueue.configure_queue("reports", max_payload_bytes=16)
    scheduler = Scheduler(aqueue, app.schedules)
    await scheduler.run_once()
    for _ in range(2):
        await aclock.advance(61)
        assert await scheduler.run_once() == 1  # the small one's tick
    infos = {info.name: info for info in await aqueue.schedules()}
    assert (infos["small"].enqueued, infos["big"].enqueued) == (2, 0)
    refusals = [r for r in caplog.records if "schedule big" in r.getMessage()]
    assert len(refusals) == 1  # said once, not at every pass
    assert refusals[0].levelname == "ERROR"
    await aqueue.configure_queue("reports", max_payload_bytes=1000)
    await aclock.advance(61)
    assert await scheduler.run_once() == 2  # its tick was left due: it runs now


async def test_a_worker_with_a_refused_schedule_keeps_running(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)
    app.periodic("big", queue="reports", every=1, payload={"text": "x" * 100})
    await aqueue.configure_queue("reports", max_payload_bytes=16)

    @app.task("emails")
    async def email(job: leaseq.JobContext) -> None:
        pass

    worker = leaseq.Worker(app, dsn=database_url, poll_interval=0.1)
    running = asyncio.create_task(worker.run())
    job_id = await aqueue.enqueue("emails", {})
    await asyncio.sleep(2.5)  # several passes, each refused
    assert not running.done(), running.exception()
    assert (await aqueue.get(job_id)).status is leaseq.JobStatus.DONE
    worker.request_stop()
    await asyncio.wait_for(running, 30)


async def test_a_queue_filling_up_during_a_catch_up_keeps_the_ticks_before(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock, schema: str
) -> None:
    """Three ticks due after a downtime, room for two: the two oldest get their
    jobs, the third stays due (not skipped, not lost) and gets its job once
    there is room."""
    app = _app(schema, s={"every": 60, "catch_up": 600})
    await aqueue.configure_queue("ticks", max_queued_jobs=2)
    scheduler = Scheduler(aqueue, app.schedules)
    await scheduler.run_once()
    (info,) = await aqueue.schedules()
    first = info.next_tick
    await _past_the_next_tick(aqueue, aclock, ticks=3)
    ticks = [first + timedelta(seconds=60 * n) for n in range(3)]
    assert await scheduler.run_once() == 2
    assert set(await _jobs_by_tick(aqueue)) == {_tick("s", t) for t in ticks[:2]}
    (info,) = await aqueue.schedules()
    assert (info.enqueued, info.skipped, info.next_tick) == (2, 0, ticks[2])
    assert await scheduler.run_once() == 0  # still full
    (claim, _) = await aqueue.claim("ticks", limit=2)
    await aqueue.complete(claim)
    assert await scheduler.run_once() == 1
    assert await _jobs_by_tick(aqueue) == Counter({_tick("s", t): 1 for t in ticks})
    (info,) = await aqueue.schedules()
    assert (info.enqueued, info.skipped) == (3, 0)
    assert info.next_tick > await _now(aqueue)


async def test_jobs_carry_their_declaration(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock, schema: str
) -> None:
    app = _app(schema, s={"every": 60, "payload": {"report": "daily"}, "priority": 5})
    scheduler = Scheduler(aqueue, app.schedules)
    await scheduler.run_once()
    await aclock.advance(61)
    await scheduler.run_once()
    (claim,) = await aqueue.claim("ticks")
    assert claim.payload == {"report": "daily"}
    assert claim.idempotency_key.startswith("s@")
    job = await aqueue.get(claim.job_id)
    assert job.priority == 5


async def test_schedules_are_listed_by_the_cli(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = _app(schema, nightly={"cron": "0 2 * * *", "tz": "Europe/Paris"})
    await Scheduler(aqueue, app.schedules).run_once()
    runner = CliRunner()
    result = await asyncio.to_thread(
        runner.invoke,
        cli,
        ["schedules", "--json", "--database-url", database_url, "--schema", schema],
    )
    assert result.exit_code == 0, result.output
    (listed,) = json.loads(result.output)
    assert (listed["name"], listed["spec"], listed["tz"], listed["last_tick"]) == (
        "nightly",
        "cron 0 2 * * *",
        "Europe/Paris",
        None,
    )
    next_tick = datetime.fromisoformat(listed["next_tick"])
    assert next_tick.astimezone(UTC).hour in (0, 1)  # 02:00 in Paris, by its offset
    table = await asyncio.to_thread(
        runner.invoke, cli, ["schedules", "--database-url", database_url, "--schema", schema]
    )
    assert "nightly" in table.output
    # What the README says it lists: the ticks enqueued, skipped and paused.
    header = next(line for line in table.output.splitlines() if "next tick" in line)
    assert header.split()[-3:] == ["enqueued", "skipped", "paused"]


async def test_a_removed_schedule_is_gone_with_its_bookkeeping_and_ticks_no_more(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock, schema: str
) -> None:
    app = _app(schema, old={"every": 60}, kept={"every": 60})
    scheduler = Scheduler(aqueue, app.schedules)
    await scheduler.run_once()
    first = min(s.next_tick for s in await aqueue.schedules())  # the same for both
    await aclock.advance((first - await _now(aqueue)).total_seconds() + 0.5)
    assert await scheduler.run_once() == 2  # one tick each
    before = await _jobs_by_tick(aqueue)

    assert await aqueue.remove_schedule("old", actor="ops") is True
    assert [s.name for s in await aqueue.schedules()] == ["kept"]
    (entry, *_) = await aqueue.audit_log(queue="ticks")
    assert (entry.action, entry.actor) == ("remove_schedule", "ops")
    assert entry.detail["schedule"] == "old"
    async with aqueue.connection() as conn:
        ticks = await (
            await conn.execute(f'SELECT schedule FROM "{schema}".schedule_tick')
        ).fetchall()
    assert {row[0] for row in ticks} == {"kept"}  # no tick row of it is left behind
    # A worker still running with it declared ticks only the schedule that is left.
    await aclock.advance(60)
    assert await scheduler.run_once() == 1
    after = await _jobs_by_tick(aqueue)
    new_ticks = set(after) - set(before)
    assert len(new_ticks) == 1
    assert next(iter(new_ticks)).startswith("kept@")
    assert before.keys() <= after.keys()  # the jobs it enqueued stay
    assert await aqueue.remove_schedule("old") is False  # gone already: nothing written
    assert len(await aqueue.audit_log(queue="ticks")) == 1

    # Declared again (a worker started with it): from its next tick, no old one again.
    again = Scheduler(aqueue, _app(schema, old={"every": 60}).schedules)
    assert await again.run_once() == 0
    info = {s.name: s for s in await aqueue.schedules()}["old"]
    assert (info.enqueued, info.last_tick) == (0, None)
    assert info.next_tick > await _now(aqueue)


@pytest.mark.parametrize("name", ["", "a\x00b", "x" * 129, "\udc80", 7])
async def test_a_bad_schedule_name_is_refused_and_writes_nothing(
    aqueue: leaseq.AsyncQueue, schema: str, name: Any
) -> None:
    await Scheduler(aqueue, _app(schema, s={"every": 60}).schedules).run_once()
    with pytest.raises(leaseq.InvalidArgument, match="schedule name"):
        await aqueue.remove_schedule(name)
    with pytest.raises(leaseq.InvalidArgument, match="schedule name"):
        leaseq.App().periodic(name, queue="ticks", every=60)
    assert [s.name for s in await aqueue.schedules()] == ["s"]
    assert await aqueue.audit_log() == []


async def test_a_schedule_is_removed_by_the_cli(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    await Scheduler(aqueue, _app(schema, nightly={"every": 60}).schedules).run_once()
    runner = CliRunner()
    arguments = ["remove-schedule", "nightly", "--database-url", database_url, "--schema", schema]
    removed = await asyncio.to_thread(runner.invoke, cli, arguments)
    assert removed.exit_code == 0, removed.output
    assert "removed schedule 'nightly'" in removed.output
    assert await aqueue.schedules() == []
    again = await asyncio.to_thread(runner.invoke, cli, arguments)
    assert again.exit_code != 0
    assert "no schedule 'nightly'" in again.output


# -- the schedule's own arithmetic ------------------------------------------------


def _declare(**options: Any) -> Schedule:
    app = leaseq.App()
    return app.periodic("s", **{"queue": "q", **options})


def _ticks(schedule: Schedule, start: datetime, end: datetime) -> list[datetime]:
    found, tick = [], schedule.next_after(start)
    while tick <= end:
        found.append(tick)
        tick = schedule.next_after(tick)
    return found


def test_a_daily_cron_ticks_once_on_each_dst_transition_day() -> None:
    """Paris, 2026: 29 March has no 02:30, 25 October has it twice. One tick each day."""
    schedule = _declare(cron="30 2 * * *", tz="Europe/Paris")
    paris = ZoneInfo("Europe/Paris")
    for day in (datetime(2026, 3, 29, tzinfo=paris), datetime(2026, 10, 25, tzinfo=paris)):
        ticks = _ticks(schedule, day - timedelta(seconds=1), day + timedelta(days=1))
        assert len(ticks) == 1, ticks
    spring = _ticks(
        schedule, datetime(2026, 3, 29, tzinfo=paris), datetime(2026, 3, 29, 12, tzinfo=paris)
    )
    assert spring[0].astimezone(paris).strftime("%H:%M") == "03:00"  # the first after
    autumn = _ticks(
        schedule, datetime(2026, 10, 25, tzinfo=paris), datetime(2026, 10, 25, 12, tzinfo=paris)
    )
    assert autumn[0] == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # its first occurrence, CEST


def test_the_hour_skipped_in_spring_ticks_as_cron_does() -> None:
    """Paris, 29 March 2026, 02:00 CET is 03:00 CEST. An hour field that names
    the skipped hour gets one tick for it, at 03:00; a schedule of every hour
    has none there and stays one real hour apart."""
    paris = ZoneInfo("Europe/Paris")
    night = (datetime(2026, 3, 29, 0, 45, tzinfo=paris), datetime(2026, 3, 29, 4, 1, tzinfo=paris))

    def wall_clock(cron: str) -> list[str]:
        return [
            t.astimezone(paris).strftime("%H:%M")
            for t in _ticks(_declare(cron=cron, tz="Europe/Paris"), *night)
        ]

    assert wall_clock("30 2 * * *") == ["03:00"]
    assert wall_clock("30 1-3 * * *") == ["01:30", "03:00", "03:30"]
    assert wall_clock("30 * * * *") == ["01:30", "03:30"]
    hourly = _ticks(_declare(cron="30 * * * *", tz="Europe/Paris"), *night)
    assert hourly[1] - hourly[0] == timedelta(hours=1)


def test_hourly_ticks_keep_their_wall_clock_through_dst() -> None:
    schedule = _declare(cron="0 * * * *", tz="America/New_York")
    ny = ZoneInfo("America/New_York")
    ticks = _ticks(
        schedule, datetime(2026, 11, 1, tzinfo=ny), datetime(2026, 11, 1, 23, 59, tzinfo=ny)
    )
    # 01:00 happens twice on 1 November 2026 in New York: it ticks once.
    assert [t.astimezone(ny).hour for t in ticks] == list(range(1, 24))


def test_every_is_aligned_on_the_epoch_so_workers_agree() -> None:
    schedule = _declare(every=300)
    tick = schedule.next_after(datetime(2026, 1, 1, 10, 2, 17, tzinfo=UTC))
    assert tick == datetime(2026, 1, 1, 10, 5, tzinfo=UTC)


@pytest.mark.parametrize("every", [1.1, 1.3, 2.7, 7.77])
def test_a_fractional_interval_always_moves_on(every: float) -> None:
    """Each tick strictly after the last (rounded to the microsecond, one came back
    to itself: the schedule stayed due, and skipped the ticks it never moved to)."""
    schedule = _declare(every=every)
    tick = datetime(2026, 1, 1, tzinfo=UTC)
    for _ in range(2000):
        following = schedule.next_after(tick)
        assert tick < following <= tick + timedelta(seconds=every + 1e-5)
        tick = following


def test_a_changed_interval_is_a_changed_spec() -> None:
    """Else a worker would keep the old interval's next tick."""
    assert _declare(every=1_000_000).spec != _declare(every=1_000_001).spec
    assert _declare(every=60).spec == "every 60"  # short where exact, as before
    assert _declare(every=1.5).spec == "every 1.5"


def test_catch_up_counts_what_it_skips() -> None:
    schedule = _declare(every=1, catch_up=2.5)
    first = datetime(2026, 1, 1, tzinfo=UTC)
    due = schedule.due(first, first + timedelta(seconds=100, milliseconds=500))
    assert len(due.enqueue) == 3  # 98, 99, 100
    assert due.skipped == 101 - 3
    assert due.next_tick == first + timedelta(seconds=101)


@pytest.mark.parametrize("every", [4 / 3, 7 / 3, 1.1, 2.7])
def test_an_interval_not_whole_microseconds_counts_every_tick_it_skips(every: float) -> None:
    """Every tick owed is enqueued or counted as skipped, never neither. The jump
    over the ticks before the window landed on (not just before) a tick whose
    time, rounded to the microsecond, is not a whole number of them: that tick
    was not walked, nor counted (4/3 s, 08:57:34.666667 to 08:57:40: 4 skipped,
    3 counted)."""
    schedule = _declare(every=every)
    start = datetime(2026, 1, 23, 8, 57, 30, tzinfo=UTC)
    for step in range(300):
        first = schedule.next_after(start + timedelta(seconds=step * 0.37))
        now = first + timedelta(seconds=step * 0.731)
        walked = _ticks(schedule, first - timedelta(microseconds=1), now)
        due = schedule.due(first, now)
        assert due.enqueue == (walked[-1],), (first, now)
        assert due.skipped == len(walked) - 1, (first, now)


def test_a_cron_catch_up_counts_what_it_skips() -> None:
    """Near: each skipped tick counted. Far (ten days of a tick a second): the
    latest tick enqueued, the skipped ones counted (estimated past a bound, from
    the spacing of the ticks counted: exact for a cron of even spacing)."""
    first = datetime(2026, 1, 1, tzinfo=UTC)
    near = _declare(cron="* * * * * */5", catch_up=12).due(first, first + timedelta(seconds=149))
    assert near.enqueue == tuple(first + timedelta(seconds=s) for s in (140, 145))
    assert near.skipped == 28  # 0, 5, ..., 135
    assert near.next_tick == first + timedelta(seconds=150)
    far = _declare(cron="* * * * * *").due(first, first + timedelta(days=10, milliseconds=500))
    assert far.enqueue == (first + timedelta(days=10),)
    assert far.skipped == 10 * 86400
    assert far.next_tick == first + timedelta(days=10, seconds=1)


@pytest.mark.parametrize(
    ("cron", "tz", "since", "days"),
    [
        # business hours, every 10 s
        ("* 9-17 * * mon-fri */10", "Europe/Paris", datetime(2026, 3, 2, 7, 3, tzinfo=UTC), 9),
        # through a spring forward and a fall back
        ("* * * * *", "Europe/Paris", datetime(2026, 3, 28, tzinfo=UTC), 2),
        ("* * * * *", "Europe/Paris", datetime(2026, 10, 24, tzinfo=UTC), 2),
        ("30 2 * * *", "Europe/Paris", datetime(2026, 3, 20, tzinfo=UTC), 20),
        ("*/7 * * * *", "Australia/Lord_Howe", datetime(2026, 4, 1, tzinfo=UTC), 10),
        ("*/5 * * * *", "Asia/Kolkata", datetime(2026, 1, 1, tzinfo=UTC), 3),
        ("15 0 * * *", "America/Santiago", datetime(2026, 8, 20, tzinfo=UTC), 40),
    ],
)
def test_a_cron_far_behind_counts_each_tick_it_skips(
    cron: str, tz: str, since: datetime, days: int
) -> None:
    """Counted hour by hour, not tick by tick: the count is the number of ticks
    the schedule has there (this test walks them all)."""
    schedule = _declare(cron=cron, tz=tz)
    first = schedule.next_after(since)
    now = first + timedelta(days=days)
    walked = _ticks(schedule, first - timedelta(microseconds=1), now)
    due = schedule.due(first, now)
    assert due.enqueue == (walked[-1],)
    assert due.skipped == len(walked) - 1


def test_a_cron_a_year_behind_extrapolates_its_count() -> None:
    """Past a thousand hours counted, the rest is extrapolated at the rate counted."""
    schedule = _declare(cron="*/2 * * * *")
    first = datetime(2026, 1, 1, tzinfo=UTC)
    due = schedule.due(first, first + timedelta(days=400, seconds=30))
    assert due.enqueue == (first + timedelta(days=400),)
    assert abs(due.skipped - 400 * 720) <= 2


def test_a_long_catch_up_window_is_enqueued_over_several_passes() -> None:
    """Three hours of a tick a second within the window: a pass takes 1,000 of
    them, in order, and the next pass goes on from the first one it left."""
    schedule = _declare(cron="* * * * * *", catch_up=4 * 3600)
    first = datetime(2026, 1, 1, tzinfo=UTC)
    now = first + timedelta(hours=3)
    due = schedule.due(first, now)
    assert due.enqueue == tuple(first + timedelta(seconds=s) for s in range(1000))
    assert (due.skipped, due.next_tick) == (0, first + timedelta(seconds=1000))
    following = schedule.due(due.next_tick, now)
    assert following.enqueue[0] == first + timedelta(seconds=1000)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "cron or every"),
        ({"cron": "0 2 * * *", "every": 60}, "cron or every"),
        ({"cron": "not a cron"}, "not a cron expression"),
        ({"cron": "0 0 30 2 *"}, "schedule .s.: "),  # 30 February never comes
        ({"cron": "0 0 31 4 *"}, "schedule .s.: "),
        ({"cron": "* * * * * * *"}, "not a cron expression"),  # 7 fields
        # croniter's R draws the field anew at each computation: workers disagree.
        ({"cron": "R * * * *"}, "random field"),
        ({"cron": "r(0-5) 3 * * *"}, "random field"),
        ({"cron": "0 0 * * R"}, "random field"),
        ({"every": 0.5}, "at least 1 second"),
        ({"every": 60, "tz": "Mars/Olympus"}, "unknown time zone"),
        # the host's own zone: workers on hosts of other zones disagree on the ticks
        ({"cron": "0 2 * * *", "tz": "localtime"}, "each host's own"),
        ({"cron": "0 2 * * *", "tz": "posixrules"}, "each host's own"),
        ({"every": 60, "payload": {1, 2}}, "JSON"),
        ({"every": 60, "catch_up": -1}, "catch_up"),
    ],
)
def test_a_bad_declaration_is_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(leaseq.InvalidArgument, match=message):
        _declare(**options)


def test_names_with_an_r_are_no_random_field() -> None:
    _declare(cron="0 6 * APR FRI")  # (a month and a day that hold an R)


def test_a_schedule_name_is_declared_once() -> None:
    app = leaseq.App()
    app.periodic("s", queue="q", every=60)
    with pytest.raises(leaseq.InvalidArgument, match="already declared"):
        app.periodic("s", queue="q", every=60)


async def test_a_long_downtime_of_a_dense_cron_does_not_stall_the_worker(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """A worker that finds a schedule of one tick a second ten days behind (no
    worker ran meanwhile) handles it without stalling its other work: it walked
    each of the 864,000 missed ticks on its event loop, for half a minute, and a
    job running meanwhile missed its renewals and lost its lease (its only
    attempt failed). Its job must complete, and the skipped ticks be counted."""
    await aqueue.configure_queue("work", lease=2)
    app = _app(schema, dense={"cron": "* * * * * *"})
    started = asyncio.Event()

    @app.task("work")
    async def long_job(job: leaseq.JobContext) -> None:
        started.set()
        await asyncio.sleep(4)  # two leases long: it lives on its renewals

    worker = leaseq.Worker(app, dsn=database_url, poll_interval=0.1, maintenance=False)
    running = asyncio.create_task(worker.run())
    try:
        while not await aqueue.schedules():
            await asyncio.sleep(0.05)  # the worker declared the schedule
        job_id = await aqueue.enqueue("work", {}, max_attempts=1)
        await asyncio.wait_for(started.wait(), 10)
        async with aqueue.connection() as conn:  # ten days with no worker
            await conn.execute(
                f"UPDATE \"{schema}\".schedule SET next_tick = next_tick - interval '10 days'"
            )
        await asyncio.wait_for(aqueue.wait_result(job_id, timeout=30), 40)
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, 30)
    job = await aqueue.get(job_id)
    assert (job.status, job.attempts) == (leaseq.JobStatus.DONE, 1)
    (info,) = await aqueue.schedules()
    assert info.skipped >= 10 * 86400 - 10  # each tick of the ten days but the latest
