"""Periodic jobs across the autumn's repeated hour: a downtime, or a late pass,
over a wall-clock time that happens twice still enqueues the latest tick owed
(the README's promise), never the repeated pass, which has no tick."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import leaseq
from leaseq._worker.scheduler import Scheduler

from .conftest import AsyncClock
from .test_periodic import _jobs_by_tick


async def _now(queue: leaseq.AsyncQueue) -> datetime:
    return await queue._run(queue._store.clock_now())


async def _move_clock_to(queue: leaseq.AsyncQueue, clock: AsyncClock, at: datetime) -> None:
    await clock.advance((at - await _now(queue)).total_seconds())


async def test_a_downtime_across_the_repeated_autumn_hour_still_enqueues_the_latest_tick(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock, schema: str
) -> None:
    """README: "When no worker looked for longer than a tick's interval ..., the
    latest missed tick is enqueued". An hourly schedule in New York, 1 November
    2026 (01:00 happens twice: 05:00 and 06:00 UTC). No worker looks from 04:59
    UTC to 06:05 UTC (01:05 EST): the tick of 01:00 EDT (05:00 UTC) is the latest
    one (01:00 EST, the repeated pass, has none), and must get its job. It was
    skipped and counted instead: the catch-up window's jump landed on the
    repeated 01:00 EST, which is no tick, and walked past the real one."""
    app = leaseq.App(schema=schema)
    app.periodic("hourly", queue="ticks", cron="0 * * * *", tz="America/New_York")
    scheduler = Scheduler(aqueue, app.schedules)
    await _move_clock_to(aqueue, aclock, datetime(2026, 11, 1, 4, 59, 30, tzinfo=UTC))
    await scheduler.run_once()  # declares it: next tick 05:00 UTC (01:00 EDT)
    (declared,) = await aqueue.schedules()
    assert declared.next_tick == datetime(2026, 11, 1, 5, tzinfo=UTC)
    await _move_clock_to(aqueue, aclock, datetime(2026, 11, 1, 6, 5, tzinfo=UTC))
    assert await scheduler.run_once() == 1
    assert await _jobs_by_tick(aqueue) == Counter({"hourly@2026-11-01T05:00:00+00:00": 1})
    (info,) = await aqueue.schedules()
    assert (info.enqueued, info.skipped) == (1, 0)
    assert info.next_tick == datetime(2026, 11, 1, 7, tzinfo=UTC)  # 02:00 EST


async def test_a_nightly_job_survives_a_downtime_over_the_repeated_hour(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock, schema: str
) -> None:
    """The same with the README's own example, a nightly report at 02:30 Paris
    time, on 25 October 2026 (02:30 happens at 00:30 and at 01:30 UTC). Workers
    down from 00:29 to 02:30 UTC (a deploy over the night): the night's report
    was never enqueued, and nothing said so but a skipped count."""
    app = leaseq.App(schema=schema)
    app.periodic(
        "nightly", queue="ticks", cron="30 2 * * *", tz="Europe/Paris", payload={"kind": "n"}
    )
    scheduler = Scheduler(aqueue, app.schedules)
    await _move_clock_to(aqueue, aclock, datetime(2026, 10, 25, 0, 29, tzinfo=UTC))
    await scheduler.run_once()
    await _move_clock_to(aqueue, aclock, datetime(2026, 10, 25, 2, 30, tzinfo=UTC))
    assert await scheduler.run_once() == 1
    assert await _jobs_by_tick(aqueue) == Counter({"nightly@2026-10-25T00:30:00+00:00": 1})


def test_a_catch_up_window_starting_in_the_repeated_hour_keeps_the_latest_tick() -> None:
    """The tick arithmetic behind the two tests above, with a catch-up window: a
    tick every 20 minutes in New York, first owed 05:20 UTC (01:20 EDT), looked at
    06:26 UTC (01:26 EST) with catch_up=600. The ticks owed are 01:20 and 01:40
    EDT (their repeats in EST have none): 01:40 EDT is the latest and must be
    enqueued, 01:20 skipped. Nothing was enqueued, both were counted skipped."""
    schedule = leaseq.App().periodic(
        "s", queue="q", cron="*/20 * * * *", tz="America/New_York", catch_up=600
    )
    first = datetime(2026, 11, 1, 5, 20, tzinfo=UTC)
    due = schedule.due(first, datetime(2026, 11, 1, 6, 26, 16, tzinfo=UTC))
    assert due.enqueue == (datetime(2026, 11, 1, 5, 40, tzinfo=UTC),)
    assert due.skipped == 1
    assert due.next_tick == datetime(2026, 11, 1, 7, tzinfo=UTC)  # 02:00 EST


def test_a_minute_long_gap_at_the_fall_back_keeps_the_last_tick_of_the_first_pass() -> None:
    """Not only long downtimes: a cron of every minute, the worker's pass due at
    05:59 UTC (01:59 EDT) late by 90 s (a restart, a blocked event loop): at
    06:00:30 UTC (01:00:30 EST) the 01:59 EDT tick is the latest one owed and
    must be enqueued. It was skipped, and the next tick is an hour later
    (02:00 EST: the repeated hour has none), so the schedule ran nothing for an
    hour and more."""
    schedule = leaseq.App().periodic("m", queue="q", cron="* * * * *", tz="America/New_York")
    first = datetime(2026, 11, 1, 5, 59, tzinfo=UTC)
    due = schedule.due(first, datetime(2026, 11, 1, 6, 0, 30, tzinfo=UTC))
    assert (due.enqueue, due.skipped) == ((first,), 0)
    assert due.next_tick == datetime(2026, 11, 1, 7, tzinfo=UTC)


async def test_a_downtime_over_the_spring_gap_counts_the_ticks_it_skipped(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock, schema: str
) -> None:
    """A minutely cron in the hour the spring skips (02:xx, Paris, 31 March
    2024) ticks once for that day, at 03:00. The count of a downtime's skipped
    ticks took that hour, as the cron's own, for a whole hour of ticks: 119
    skipped where 60 were (README: counted hour by hour, exact under 1,000)."""
    app = leaseq.App(schema=schema)
    schedule = app.periodic("minutely-at-2", queue="ticks", cron="* 2 * * *", tz="Europe/Paris")
    scheduler = Scheduler(aqueue, app.schedules)
    await _move_clock_to(aqueue, aclock, datetime(2024, 3, 30, 12, tzinfo=UTC))
    await scheduler.run_once()  # declared
    await _move_clock_to(aqueue, aclock, datetime(2024, 4, 1, 12, tzinfo=UTC))  # two days down
    await scheduler.run_once()
    (info,) = await aqueue.schedules()
    owed = 0
    for tick in schedule._ticks(datetime(2024, 3, 30, 12, tzinfo=UTC)):
        if tick > datetime(2024, 4, 1, 12, tzinfo=UTC):
            break
        owed += 1
    assert owed == 1 + 60  # 03:00 on the 31st, then 02:00-02:59 on 1 April
    assert info.enqueued + info.skipped == owed, (info.enqueued, info.skipped)


async def test_two_zones_spring_gaps_count_each_schedules_own_skipped_ticks(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock, schema: str
) -> None:
    """The same cron in Paris and in London, two days down over the spring gap
    of 29 March 2026. London's 01:xx does not exist that day: its two ticks are
    one, at 02:00 BST, the same instant as Paris's 03:00 CEST, an hour the cron
    ticks in there. Each schedule's enqueued and skipped ticks must add up to
    the ticks it owed, whatever the other schedule of the process computed
    first (London's count took Paris's hour for its own: one tick too many)."""
    app = leaseq.App(schema=schema)
    cron = "0,30 1,3 * * *"
    declared = [
        app.periodic(f"at-1-and-3-{zone}", queue="ticks", cron=cron, tz=f"Europe/{zone}")
        for zone in ("Paris", "London")
    ]
    scheduler = Scheduler(aqueue, app.schedules)
    start, end = datetime(2026, 3, 27, 12, tzinfo=UTC), datetime(2026, 3, 31, 12, tzinfo=UTC)
    await _move_clock_to(aqueue, aclock, start)
    await scheduler.run_once()  # declared
    await _move_clock_to(aqueue, aclock, end)  # days down
    await scheduler.run_once()
    infos = {info.name: info for info in await aqueue.schedules()}
    for schedule in declared:
        owed = 0
        for tick in schedule._ticks(start):
            if tick > end:
                break
            owed += 1
        info = infos[schedule.name]
        assert info.enqueued + info.skipped == owed, (schedule.tz, info.enqueued, info.skipped)
