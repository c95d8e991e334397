"""Stateful property test: ``leaseq.Queue`` on a real database against a pure-Python model.

A Hypothesis ``RuleBasedStateMachine`` enqueues, claims, completes, renews, retries,
fails, reaps, replays and cancels jobs in two queues (one per ordering policy), moves
the database clock, and after every step compares each job row with the model.

Time model: the model clock only moves in multiples of 50 s, and every lease and
delay is 20 s past a multiple of 50 s, so a deadline is never within 20 s of "now"
(the real ``statement_timestamp()`` creeps forward by milliseconds between
statements). Deadlines that are equal in model time are ordered by the statement
that set them (``stamp``), which is the order of their real timestamps.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import leaseq
from leaseq import Claim, JobStatus, OrderingPolicy
from leaseq.testing import set_clock_offset

QUEUED, RUNNING, DONE = JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.DONE
FAILED, CANCELLED = JobStatus.FAILED, JobStatus.CANCELLED

QUEUES = ("q1", "q2")
QUEUE_LEASE = 120.0  # the queues' default lease
QUEUE_MAX_ATTEMPTS = 2  # the queues' default max_attempts

queue_names = st.sampled_from(["q1", "q1", "q2"])
leases = st.sampled_from([None, 70.0, 120.0])  # None: the queue's (claim) or the job's (renew)
enqueue_delays = st.sampled_from([None, 0, 70, 170])
retry_delays = st.sampled_from([None, 0.0, 70.0])  # None: backoff, configured to 0
clock_steps = st.sampled_from([50, 100, 300])
keys = st.sampled_from([None, None, "a", "b"])
seq_steps = st.one_of(st.none(), st.integers(-1, 2))  # None: no seq (stored as 0)
priorities = st.sampled_from([0, 0, 1])
max_attempts_choices = st.sampled_from([1, 1, 2, 3, None])  # None: the queue's default
enqueue_strategies = {
    "queue": queue_names,
    "count": st.sampled_from([1, 1, 2, 3]),
    "key": keys,
    "seq_step": seq_steps,
    "delay": enqueue_delays,
    "priority": priorities,
    "max_attempts": max_attempts_choices,
}
enqueue_arguments = st.fixed_dictionaries(enqueue_strategies)

# (model seconds, stamp): a point in time, ordered as the database orders it.
Instant = tuple[float, int]

SETTINGS = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass
class ModelJob:
    job_id: int
    queue: str
    payload: Any
    priority: int
    max_attempts: int
    key: str | None
    seq: int | None
    available: Instant
    available_at: datetime  # the exact value, read back when the model last changed it
    status: JobStatus = QUEUED
    attempts: int = 0
    lease_version: int = 0
    lease_until: Instant | None = None
    lease_until_at: datetime | None = None
    lease_seconds: float | None = None


@dataclass
class IssuedClaim:
    claim: Claim
    outcome: str | None = None  # what this claim committed: completed / retried / failed


class QueueMachine(RuleBasedStateMachine):
    def __init__(self, url: str, policy: OrderingPolicy) -> None:
        super().__init__()
        self.url = url
        self.schema = f"sm_{uuid.uuid4().hex[:16]}"
        other = OrderingPolicy.CONTINUE if policy is OrderingPolicy.BLOCK else OrderingPolicy.BLOCK
        self.policies = {"q1": policy, "q2": other}
        self.conn = psycopg.connect(url, autocommit=True)
        self.queue = leaseq.Queue(url, schema=self.schema, pool_size=2)
        try:
            self.queue.migrate()
            for name, ordering in self.policies.items():
                configured = self.queue.configure_queue(
                    name,
                    lease=QUEUE_LEASE,
                    max_attempts=QUEUE_MAX_ATTEMPTS,
                    backoff_base=0,
                    backoff_cap=0,
                    ordering_policy=ordering.value,
                )
                assert configured.ordering_policy is ordering
        except BaseException:
            self.teardown()
            raise
        self.now = 0.0
        self.stamp = 0
        self.jobs: dict[int, ModelJob] = {}
        self.claims: list[IssuedClaim] = []
        self.last_seq: dict[tuple[str, str], int] = {}
        self.payloads = 0

    def teardown(self) -> None:
        self.queue.close()
        try:
            self.conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        finally:
            self.conn.close()

    # -- the model ---------------------------------------------------------------

    def next_stamp(self) -> int:
        self.stamp += 1
        return self.stamp

    def db_clock(self) -> datetime:
        row = self.conn.execute(f'SELECT "{self.schema}".clock()').fetchone()
        assert row is not None
        value: datetime = row[0]
        return value

    def describe(self, job_id: int) -> str:
        return f"model now={self.now}: {self.jobs[job_id]}"

    def blocks_successors(self, job: ModelJob) -> bool:
        if job.status in (QUEUED, RUNNING):
            return True
        return job.status is FAILED and self.policies[job.queue] is OrderingPolicy.BLOCK

    def blocked(self, job: ModelJob) -> bool:
        """An earlier unfinished job of the same key (a failed one under 'block') exists."""
        if job.key is None:
            return False
        assert job.seq is not None
        return any(
            other.queue == job.queue
            and other.key == job.key
            and other.seq is not None
            and (other.seq, other.job_id) < (job.seq, job.job_id)
            and self.blocks_successors(other)
            for other in self.jobs.values()
        )

    def lease_expired(self, job: ModelJob) -> bool:
        assert job.status is RUNNING
        assert job.lease_until is not None
        return job.lease_until[0] <= self.now

    def is_live(self, claim: Claim) -> bool:
        job = self.jobs[claim.job_id]
        return (
            job.status is RUNNING
            and job.lease_version == claim.lease_version
            and not self.lease_expired(job)
        )

    def claimable(self, queue: str) -> tuple[list[ModelJob], list[ModelJob]]:
        """(expired leases, ready jobs) that a claim on ``queue`` may take, in claim order."""
        expired, ready = [], []
        for job in self.jobs.values():
            if job.queue != queue or job.attempts >= job.max_attempts or self.blocked(job):
                continue
            if job.status is RUNNING and self.lease_expired(job):
                expired.append(job)
            elif job.status is QUEUED and job.available[0] <= self.now:
                ready.append(job)
        expired.sort(key=lambda j: (j.lease_until, j.job_id))
        ready.sort(key=lambda j: (-j.priority, j.available, j.job_id))
        return expired, ready

    def release(self, job: ModelJob, status: JobStatus) -> None:
        job.status = status
        job.lease_until = job.lease_until_at = None

    def expect_lost(self, call: Callable[[], object], claim: Claim, operation: str) -> None:
        with pytest.raises(leaseq.LeaseLost) as info:
            call()
        lost = info.value
        assert (lost.job_id, lost.lease_version, lost.operation) == (
            claim.job_id,
            claim.lease_version,
            operation,
        )

    def pick_claim(self, data: st.DataObject, live: bool) -> IssuedClaim:
        pool = [issued for issued in self.claims if self.is_live(issued.claim)] if live else []
        return data.draw(st.sampled_from(pool or self.claims), label="claim")

    def pick_job(self, data: st.DataObject, prefer: tuple[JobStatus, ...], use: bool) -> ModelJob:
        pool = [job for job in self.jobs.values() if job.status in prefer] if use else []
        return data.draw(st.sampled_from(pool or list(self.jobs.values())), label="job")

    def new_seq(self, queue: str, key: str | None, step: int | None) -> int | None:
        if key is None or step is None:
            return None
        seq = self.last_seq.get((queue, key), 0) + step
        self.last_seq[queue, key] = max(seq, self.last_seq.get((queue, key), 0))
        return seq

    def new_payload(self) -> dict[str, int]:
        self.payloads += 1
        return {"n": self.payloads}

    def add_job(
        self,
        job_id: int,
        queue: str,
        payload: Any,
        *,
        priority: int,
        max_attempts: int | None,
        key: str | None,
        seq: int | None,
        delay: float | None,
        stamp: int,
    ) -> None:
        assert job_id not in self.jobs, f"job id {job_id} handed out twice"
        job = self.queue.get(job_id)
        # available_at is clock() + delay and created_at is statement_timestamp(), in one
        # statement: they differ by exactly the clock offset plus the delay.
        assert job.available_at - job.created_at == timedelta(seconds=self.now + (delay or 0))
        assert job.payload == payload
        self.jobs[job_id] = ModelJob(
            job_id=job_id,
            queue=queue,
            payload=payload,
            priority=priority,
            max_attempts=QUEUE_MAX_ATTEMPTS if max_attempts is None else max_attempts,
            key=key,
            seq=None if key is None else (seq or 0),
            available=(self.now + (delay or 0), stamp),
            available_at=job.available_at,
        )

    # -- rules ---------------------------------------------------------------------

    @initialize(data=st.data(), batches=st.integers(1, 4))
    def start_with_jobs(self, data: st.DataObject, batches: int) -> None:
        for _ in range(batches):
            self.enqueue(**data.draw(enqueue_arguments, label="enqueue"))

    @rule(**enqueue_strategies)
    def enqueue(
        self,
        *,
        queue: str,
        count: int,
        key: str | None,
        seq_step: int | None,
        delay: float | None,
        priority: int,
        max_attempts: int | None,
    ) -> None:
        """One job with enqueue(), or a batch with enqueue_many()."""
        seqs = [self.new_seq(queue, key, seq_step) for _ in range(count)]
        payloads = [self.new_payload() for _ in range(count)]
        options: dict[str, Any] = {
            "delay": delay, "priority": priority, "max_attempts": max_attempts, "key": key,
        }  # fmt: skip
        if count == 1:
            ids = [self.queue.enqueue(queue, payloads[0], seq=seqs[0], **options)]
        else:
            batch_seqs = None if seqs[0] is None else [seq or 0 for seq in seqs]
            ids = self.queue.enqueue_many(queue, payloads, seqs=batch_seqs, **options)
        stamp = self.next_stamp()
        assert len(ids) == count == len(set(ids))
        by_payload = {self.queue.get(job_id).payload["n"]: job_id for job_id in ids}
        for payload, seq in zip(payloads, seqs, strict=True):
            self.add_job(
                by_payload[payload["n"]], queue, payload, priority=priority,
                max_attempts=max_attempts, key=key, seq=seq, delay=delay, stamp=stamp,
            )  # fmt: skip

    @rule(queue=queue_names, limit=st.integers(1, 3), lease=leases)
    def claim(self, queue: str, limit: int, lease: float | None) -> None:
        expired, ready = self.claimable(queue)
        eligible = {job.job_id for job in expired + ready}
        expected = {job.job_id for job in (expired[:limit] + ready[:limit])[:limit]}
        claims = self.queue.claim(queue, limit=limit, lease=lease)
        stamp = self.next_stamp()
        got = [c.job_id for c in claims]
        assert len(got) == len(set(got)), f"a job was claimed twice in one call: {got}"
        assert len(got) <= limit
        for job_id in got:
            assert job_id in self.jobs, f"claimed unknown job {job_id}"
            assert job_id in eligible, f"claimed ineligible job: {self.describe(job_id)}"
        assert len(got) == min(limit, len(eligible)), f"claimed {got} of eligible {eligible}"
        assert set(got) == expected, f"claim order: got {got}, expected {sorted(expected)}"

        seconds = QUEUE_LEASE if lease is None else lease
        for c in claims:
            job = self.jobs[c.job_id]
            assert c.queue == queue
            assert (c.lease_version, c.attempts) == (job.lease_version + 1, job.attempts + 1)
            assert (c.max_attempts, c.key, c.seq) == (job.max_attempts, job.key, job.seq)
            assert c.payload == job.payload
            assert c.lease_seconds == seconds
            assert c.idempotency_key == f"{self.schema}:{c.job_id}"
            row = self.queue.get(c.job_id)
            assert row.lease_until == c.lease_until
            assert row.claimed_at is not None
            assert c.lease_until - row.claimed_at == timedelta(seconds=seconds)
            job.status = RUNNING
            job.attempts += 1
            job.lease_version += 1
            job.lease_until = (self.now + seconds, stamp)
            job.lease_until_at = c.lease_until
            job.lease_seconds = seconds
            self.claims.append(IssuedClaim(c))

    @precondition(lambda self: bool(self.claims))
    @rule(
        action=st.sampled_from(["complete", "renew", "retry", "fail"]),
        data=st.data(),
        live=st.booleans(),
        lease=leases,
        delay=retry_delays,
    )
    def work(
        self, action: str, data: st.DataObject, live: bool, lease: float | None,
        delay: float | None,
    ) -> None:  # fmt: skip
        """A worker's fenced write with a live claim (if ``live`` and there is one) or any."""
        issued = self.pick_claim(data, live)
        if action == "complete":
            self.complete(issued)
        elif action == "renew":
            self.renew(issued, lease)
        elif action == "retry":
            self.retry(issued, delay)
        else:
            self.fail(issued)

    @rule(seconds=clock_steps)
    def advance_clock(self, seconds: int) -> None:
        self.now += seconds
        set_clock_offset(self.queue, self.now)

    @rule(
        action=st.sampled_from(["reap", "replay", "cancel"]),
        data=st.data(),
        prefer=st.booleans(),
        limit=st.sampled_from([1, 2, 1000]),
    )
    def operate(self, action: str, data: st.DataObject, prefer: bool, limit: int) -> None:
        """An operator's reap, or replay/cancel of a job (preferring ones they apply to)."""
        if action == "reap":
            self.reap(limit)
        elif not self.jobs:
            with pytest.raises(leaseq.JobNotFound):
                getattr(self.queue, action)(1)
        elif action == "replay":
            self.replay(self.pick_job(data, (FAILED, CANCELLED), prefer))
        else:
            self.cancel(self.pick_job(data, (QUEUED, FAILED), prefer))

    # -- what each write must do ---------------------------------------------------

    def complete(self, issued: IssuedClaim) -> None:
        claim = issued.claim
        job = self.jobs[claim.job_id]
        if self.is_live(claim):
            self.queue.complete(claim)
            self.release(job, DONE)
            issued.outcome = "completed"
        elif job.status is DONE and job.lease_version == claim.lease_version:
            assert issued.outcome == "completed"
            self.queue.complete(claim)  # the completion committed already: accepted again
        else:
            self.expect_lost(lambda: self.queue.complete(claim), claim, "complete")

    def renew(self, issued: IssuedClaim, lease: float | None) -> None:
        claim = issued.claim
        job = self.jobs[claim.job_id]
        if not self.is_live(claim):
            self.expect_lost(lambda: self.queue.renew(claim, lease=lease), claim, "renew")
            return
        assert job.lease_seconds is not None
        seconds = job.lease_seconds if lease is None else lease
        before = self.db_clock()
        until = self.queue.renew(claim, lease=lease)
        after = self.db_clock()
        assert before <= until - timedelta(seconds=seconds) <= after
        job.lease_until = (self.now + seconds, self.next_stamp())
        job.lease_until_at = until
        job.lease_seconds = seconds

    def retry(self, issued: IssuedClaim, delay: float | None) -> None:
        claim = issued.claim
        job = self.jobs[claim.job_id]
        if self.is_live(claim):
            status = self.queue.retry(claim, delay=delay, error="boom")
            stamp = self.next_stamp()
            issued.outcome = "retried"
            if job.attempts >= job.max_attempts:
                assert status is FAILED, "a retry on the last attempt must fail the job"
                self.release(job, FAILED)
                return
            assert status is QUEUED
            self.release(job, QUEUED)
            row = self.queue.get(claim.job_id)
            entry = row.history[-1]
            assert entry["outcome"] == "retry"
            # The backoff is configured to 0, so no delay means "available now".
            seconds = delay or 0
            assert row.available_at - datetime.fromisoformat(entry["at"]) == timedelta(
                seconds=seconds
            )
            job.available = (self.now + seconds, stamp)
            job.available_at = row.available_at
        elif job.status is QUEUED and job.lease_version == claim.lease_version:
            # The retry committed already: accepted again, nothing changes. (retry.sql also
            # accepts a claim that was failed and then replayed, see the xfail test below.)
            assert self.queue.retry(claim, delay=delay) is QUEUED
        else:
            self.expect_lost(lambda: self.queue.retry(claim, delay=delay), claim, "retry")

    def fail(self, issued: IssuedClaim) -> None:
        claim = issued.claim
        job = self.jobs[claim.job_id]
        if self.is_live(claim):
            self.queue.fail(claim, "gave up")
            self.release(job, FAILED)
            issued.outcome = "failed"
            assert self.queue.get(claim.job_id).last_error == "gave up"
        else:
            self.expect_lost(lambda: self.queue.fail(claim, "late"), claim, "fail")

    def reap(self, limit: int) -> None:
        exhausted_queued = {
            job.job_id
            for job in self.jobs.values()
            if job.status is QUEUED and job.attempts >= job.max_attempts
        }
        expired_running = {
            job.job_id
            for job in self.jobs.values()
            if job.status is RUNNING
            and self.lease_expired(job)
            and job.attempts >= job.max_attempts
        }
        result = self.queue.reap(limit=limit)
        self.next_stamp()
        assert set(result.exhausted_queued) <= exhausted_queued, result
        assert set(result.expired_running) <= expired_running, result
        assert len(set(result.failed)) == len(result)
        assert len(result) == min(limit, len(exhausted_queued | expired_running))
        for job_id in result.failed:
            self.release(self.jobs[job_id], FAILED)

    def replay(self, job: ModelJob) -> None:
        changed = self.queue.replay(job.job_id)
        stamp = self.next_stamp()
        if job.status not in (FAILED, CANCELLED):
            assert changed is False, f"replayed a {job.status} job"
            return
        assert changed is True
        job.status = QUEUED
        job.attempts = 0
        job.available = (self.now, stamp)
        row = self.queue.get(job.job_id)
        assert row.history[-1]["outcome"] == "replayed"
        assert row.available_at == datetime.fromisoformat(row.history[-1]["at"])
        job.available_at = row.available_at

    def cancel(self, job: ModelJob) -> None:
        changed = self.queue.cancel(job.job_id)
        self.next_stamp()
        if job.status in (QUEUED, FAILED):
            assert changed is True
            job.status = CANCELLED
        else:
            assert changed is False, f"cancelled a {job.status} job"

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def every_job_matches_the_model(self) -> None:
        # One list_jobs per status instead of a get() per job: the same row decoding, and it
        # also proves that no job is missing, duplicated or in a second status.
        rows = {
            status: {job.job_id: job for job in self.queue.list_jobs(status, limit=10_000)}
            for status in JobStatus
        }
        for status, jobs in rows.items():
            expected = {job.job_id for job in self.jobs.values() if job.status is status}
            assert set(jobs) == expected, f"{status} jobs: database {sorted(jobs)}, model " + str(
                {job_id: self.jobs.get(job_id) for job_id in set(jobs) ^ expected}
            )
            for job in jobs.values():
                model = self.jobs[job.job_id]
                what = self.describe(job.job_id)
                found = f"database has attempts={job.attempts} lease_version={job.lease_version}"
                assert (job.attempts, job.lease_version) == (
                    model.attempts,
                    model.lease_version,
                ), f"{found}; {what}"
                assert (job.queue, job.key, job.seq, job.priority, job.max_attempts) == (
                    model.queue,
                    model.key,
                    model.seq,
                    model.priority,
                    model.max_attempts,
                ), what
                assert job.available_at == model.available_at, what
                assert job.lease_until == model.lease_until_at, what
                assert (job.finished_at is not None) == model.status.finished, what

    @invariant()
    def stats_match_the_model(self) -> None:
        stats = {s.queue: s for s in self.queue.stats()}
        assert set(stats) == set(QUEUES)
        for name in QUEUES:
            jobs = [job for job in self.jobs.values() if job.queue == name]
            counts = {status: sum(job.status is status for job in jobs) for status in JobStatus}
            assert stats[name].counts == counts
            expired = sum(job.status is RUNNING and self.lease_expired(job) for job in jobs)
            assert stats[name].expired_leases == expired


@pytest.mark.slow
@pytest.mark.parametrize("policy", list(OrderingPolicy))
def test_queue_matches_model(database_url: str, policy: OrderingPolicy) -> None:
    """q1 uses ``policy`` and q2 the other one, so a policy is also checked to be per queue."""
    run_state_machine_as_test(lambda: QueueMachine(database_url, policy), settings=SETTINGS)


@pytest.mark.xfail(
    strict=True,
    reason="retry.sql takes any queued job with the claim's lease_version for an already "
    "committed retry, so a claim that was failed and then replayed is not fenced off",
)
def test_stale_retry_after_fail_and_replay_is_lease_lost(queue: leaseq.Queue) -> None:
    job_id = queue.enqueue("jobs", {})
    (claim,) = queue.claim("jobs")
    queue.fail(claim, "gave up")
    assert queue.replay(job_id)
    with pytest.raises(leaseq.LeaseLost):
        queue.retry(claim, error="from a stale worker")
