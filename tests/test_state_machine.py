"""Stateful property test: each client on a real database against a pure-Python model.

It runs once per leg (``client_class``): ``leaseq.Queue``, and ``leaseq.AsyncQueue``
behind the blocking adapter of ``tests/clients.py``; the model and its invariants
are the same for both.

A Hypothesis ``RuleBasedStateMachine`` enqueues, claims, completes, renews, retries,
fails, releases, reaps, replays and cancels jobs in two queues (one per ordering
policy). Fenced writes use live, superseded and expired claims, one at a time and in
batches, and are resent as after an ambiguous commit. It moves the database clock, and
after every step compares every job row (and the queue stats) with the model.

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

from .clients import Client, set_clock_offset

QUEUED, RUNNING, DONE = JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.DONE
FAILED, CANCELLED = JobStatus.FAILED, JobStatus.CANCELLED

QUEUES = ("q1", "q2")
QUEUE_LEASE = 120.0  # the queues' default lease
QUEUE_MAX_ATTEMPTS = 2  # the queues' default max_attempts

queue_names = st.sampled_from(["q1", "q1", "q2"])
# Leases and delays are 20 s past a multiple of 50 s, clock steps are multiples of 50 s.
# A None lease is the queue's (claim) or the job's current one (renew).
leases = st.sampled_from([None, 70.0, 120.0, 270.0])
enqueue_delays = st.sampled_from([None, 0, 70, 170])
retry_delays = st.sampled_from([None, 0.0, 70.0])  # None: backoff, configured to 0
clock_steps = st.sampled_from([50, 50, 100, 300])
keys = st.sampled_from([None, "a", "a", "b"])
seq_steps = st.one_of(st.none(), st.integers(-1, 2))  # None: no seq (stored as 0)
priorities = st.sampled_from([0, 0, 1])
max_attempts_choices = st.sampled_from([1, 1, 2, 3, None])  # None: the queue's default
enqueue_strategies: dict[str, st.SearchStrategy[Any]] = {
    "queue": queue_names,
    "count": st.sampled_from([1, 1, 2, 3]),
    "key": keys,
    "seq_step": seq_steps,
    "delay": enqueue_delays,
    "priority": priorities,
    "max_attempts": max_attempts_choices,
}
enqueue_arguments = st.fixed_dictionaries(enqueue_strategies)
worker_actions = st.sampled_from(["complete", "renew", "retry", "retry", "fail", "fail", "release"])
# live: owns its job; superseded: a newer claim (or a replay) moved the job's lease_version on;
# same_version: not live but nothing moved the version on (its lease expired, or its job was
# completed, retried, failed or released with it); any: uniformly from all claims.
claim_kinds = st.sampled_from(["live", "live", "superseded", "same_version", "any"])

# (model seconds, stamp): a point in time, ordered as the database orders it.
Instant = tuple[float, int]

SETTINGS = settings(
    max_examples=40,
    stateful_step_count=40,
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
    outcome: str | None = None  # what this claim committed: completed/retried/failed/released
    retried_to: JobStatus | None = None  # the status its committed retry left the job in

    def __repr__(self) -> str:  # what Hypothesis prints for a drawn claim
        return f"<claim of job {self.claim.job_id} v{self.claim.lease_version}: {self.outcome}>"


LOST = "LeaseLost"  # a fenced write's result when the claim no longer owns its job


class QueueMachine(RuleBasedStateMachine):
    def __init__(self, client_class: type[Client], url: str, policy: OrderingPolicy) -> None:
        super().__init__()
        self.url = url
        self.schema = f"sm_{uuid.uuid4().hex[:16]}"
        other = OrderingPolicy.CONTINUE if policy is OrderingPolicy.BLOCK else OrderingPolicy.BLOCK
        self.policies = {"q1": policy, "q2": other}
        self.conn = psycopg.connect(url, autocommit=True)
        self.client = client_class(url, schema=self.schema, pool_size=2)
        try:
            self.client.migrate()
            for name, ordering in self.policies.items():
                configured = self.client.configure_queue(
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
        self.last_written: list[IssuedClaim] = []  # the claims of the latest fenced write
        self.last_seq: dict[tuple[str, str], int] = {}
        self.payloads = 0

    def teardown(self) -> None:
        self.client.close()
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

    def blocked(self, job: ModelJob) -> bool:
        """The contract's per-key rule, stated as the requirement (not as the claim's SQL):
        a queued job of a key waits while any job of its key runs (expired or not), and
        while an earlier job of its key is queued, or failed under 'block'. A running job
        whose lease expired is its key's running job: it is recovered, unless an earlier
        job of its key is queued (behind_an_earlier_job)."""
        if job.key is None or job.status is RUNNING:
            return False
        assert job.seq is not None
        for other in self.jobs.values():
            if other.queue != job.queue or other.key != job.key or other is job:
                continue
            if other.status is RUNNING:
                return True
            assert other.seq is not None
            earlier = (other.seq, other.job_id) < (job.seq, job.job_id)
            failed_blocks = self.policies[job.queue] is OrderingPolicy.BLOCK
            if earlier and (other.status is QUEUED or (other.status is FAILED and failed_blocks)):
                return True
        return False

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

    def end_lease(self, job: ModelJob, status: JobStatus) -> None:
        job.status = status
        job.lease_until = job.lease_until_at = None

    def claim_kind(self, issued: IssuedClaim) -> str:
        if self.is_live(issued.claim):
            return "live"
        if self.jobs[issued.claim.job_id].lease_version > issued.claim.lease_version:
            return "superseded"
        return "same_version"

    def pick_claims(self, data: st.DataObject, kind: str, batch: bool) -> list[IssuedClaim]:
        """One claim, or 1-3 claims of distinct jobs: of ``kind`` if there are any."""
        pool = [i for i in self.claims if kind == "any" or self.claim_kind(i) == kind]
        pool = pool or self.claims
        if not batch:
            return [data.draw(st.sampled_from(pool), label="claim")]
        unique = st.lists(
            st.sampled_from(pool), min_size=1, max_size=3, unique_by=lambda i: i.claim.job_id
        )
        return data.draw(unique, label="claims")

    def pick_job(self, data: st.DataObject, applies: tuple[JobStatus, ...], kind: str) -> ModelJob:
        """A job that the operation applies to, or one it must refuse, or any job."""
        pool = [
            job
            for job in self.jobs.values()
            if kind == "any" or (job.status in applies) == (kind == "applies")
        ]
        ids = sorted(job.job_id for job in pool or self.jobs.values())
        return self.jobs[data.draw(st.sampled_from(ids), label="job")]

    def fenced(
        self,
        operation: str,
        issued: list[IssuedClaim],
        single: Callable[[Claim], object] | None,
        many: Callable[[list[Claim]], list[tuple[Claim, Any]]],
        batch: bool,
    ) -> list[object]:
        """Run a fenced write with the single-claim form (which raises LeaseLost) or, in a
        batch step or without one, the batch form (which reports it); return each claim's
        result, LOST for a lost lease."""
        claims = [i.claim for i in issued]
        if single is not None and not batch:
            try:
                return [single(claims[0])]
            except leaseq.LeaseLost as exc:
                lost = exc
            assert (lost.job_id, lost.lease_version, lost.operation) == (
                claims[0].job_id,
                claims[0].lease_version,
                operation,
            )
            return [LOST]
        results = many(claims)
        assert [claim for claim, _ in results] == claims, "batch results out of order"
        return [LOST if result is None or result is False else result for _, result in results]

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
        job = self.client.get(job_id)
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

    @initialize(data=st.data(), batches=st.integers(1, 4), limit=st.integers(1, 3))
    def start_with_jobs(self, data: st.DataObject, batches: int, limit: int) -> None:
        """Jobs and a first claim, so that workers have something to do from the start."""
        for _ in range(batches):
            self.enqueue(**data.draw(enqueue_arguments, label="enqueue"))
        self.claim(data=data, steer=True, limit=limit, lease=data.draw(leases, label="lease"))

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
            "delay": delay,
            "priority": priority,
            "max_attempts": max_attempts,
            "key": key,
        }
        if count == 1:
            ids = [self.client.enqueue(queue, payloads[0], seq=seqs[0], **options)]
        else:
            batch_seqs = None if seqs[0] is None else [seq or 0 for seq in seqs]
            ids = self.client.enqueue_many(queue, payloads, seqs=batch_seqs, **options)
        stamp = self.next_stamp()
        assert len(ids) == count == len(set(ids))
        by_payload = {self.client.get(job_id).payload["n"]: job_id for job_id in ids}
        for payload, seq in zip(payloads, seqs, strict=True):
            self.add_job(
                by_payload[payload["n"]],
                queue,
                payload,
                priority=priority,
                max_attempts=max_attempts,
                key=key,
                seq=seq,
                delay=delay,
                stamp=stamp,
            )

    @rule(
        data=st.data(),
        steer=st.sampled_from([True, True, False]),
        limit=st.integers(1, 3),
        lease=leases,
    )
    def claim(self, data: st.DataObject, steer: bool, limit: int, lease: float | None) -> None:
        """Claim from a queue, one with claimable jobs if ``steer`` and there is one."""
        useful = [name for name in QUEUES if any(self.claimable(name))] if steer else []
        queue = data.draw(st.sampled_from(useful) if useful else queue_names, label="queue")
        claims = self.client.claim(queue, limit=limit, lease=lease)
        got = [c.job_id for c in claims]
        assert len(got) == len(set(got)), f"a job was claimed twice in one call: {got}"
        assert len(got) <= limit
        by_id = {c.job_id: c for c in claims}
        seconds = QUEUE_LEASE if lease is None else lease
        # The call as the contract has it: recovered leases first, then ready jobs in
        # claim order, as many as the limit allows. A recovered lease that is no
        # longer its key's earliest unfinished job (an earlier one committed while it
        # ran) is not recovered: it is queued again behind that job, which becomes
        # eligible, and the call claims once more for the room it left.
        room, taken = limit, []
        for _ in range(2):
            expired, ready = self.claimable(queue)
            eligible = {job.job_id for job in expired + ready}
            picked = (expired[:room] + ready[:room])[:room]
            requeued = [job for job in picked if self.behind_an_earlier_job(job)]
            stamp = self.next_stamp()
            for job in picked:
                if job in requeued:
                    assert job.job_id not in by_id, (
                        f"recovered out of key order: {self.describe(job.job_id)}"
                    )
                    self.requeue(job, stamp)
                    continue
                assert job.job_id in by_id, (
                    f"claimed {got} of eligible {eligible}, not {job.job_id}"
                )
                self.claimed(by_id[job.job_id], job, seconds, stamp)
                taken.append(job.job_id)
            room = limit - len(taken)
            if not requeued or room == 0:
                break
        assert sorted(got) == sorted(taken), f"claimed {got}, expected {sorted(taken)}"

    def behind_an_earlier_job(self, job: ModelJob) -> bool:
        """A running job of a key whose earlier job (by seq) is queued: that one
        committed while this ran, and is the key's earliest unfinished job."""
        return job.status is RUNNING and any(
            other.queue == job.queue
            and other.key == job.key
            and other.status is QUEUED
            and (other.seq, other.job_id) < (job.seq, job.job_id)
            for other in self.jobs.values()
            if job.key is not None
        )

    def requeue(self, job: ModelJob, stamp: int) -> None:
        """A recovered lease put back: queued again, its crashed attempt counted,
        its lease version moved on (the dead worker's claim is fenced out)."""
        job.status = QUEUED
        job.lease_version += 1
        job.lease_until, job.lease_until_at = None, None
        job.available = (self.now, stamp)
        row = self.client.get(job.job_id)
        assert row.history[-1]["outcome"] == "lease_expired", row.history
        assert "requeued" in row.history[-1], row.history
        job.available_at = row.available_at

    def claimed(self, c: Claim, job: ModelJob, seconds: float, stamp: int) -> None:
        assert not self.blocked(job), f"claimed before its key's turn: {self.describe(job.job_id)}"
        assert c.queue == job.queue
        assert (c.lease_version, c.attempts) == (job.lease_version + 1, job.attempts + 1)
        assert (c.max_attempts, c.key, c.seq) == (job.max_attempts, job.key, job.seq)
        assert c.payload == job.payload
        assert c.lease_seconds == seconds
        assert c.idempotency_key == f"{self.schema}:{c.job_id}"
        row = self.client.get(c.job_id)
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
        action=worker_actions,
        data=st.data(),
        kind=claim_kinds,
        batch=st.sampled_from([False, False, True]),
        lease=leases,
    )
    def work(
        self, action: str, data: st.DataObject, kind: str, batch: bool, lease: float | None
    ) -> None:
        """A worker's fenced write with one claim of ``kind`` (if there is one), or with the
        batch form and 1-3 claims of distinct jobs."""
        self.write(action, self.pick_claims(data, kind, batch), data, lease, batch=batch)

    @precondition(lambda self: bool(self.last_written))
    @rule(action=worker_actions, data=st.data(), lease=leases)
    def follow_up(self, action: str, data: st.DataObject, lease: float | None) -> None:
        """The next write with the claims of the latest one: the same write again (a resend
        after an ambiguous commit) or another one (a worker that did not see its answer)."""
        issued = self.last_written
        self.write(action, issued, data, lease, batch=len(issued) > 1)

    def write(
        self,
        action: str,
        issued: list[IssuedClaim],
        data: st.DataObject,
        lease: float | None,
        *,
        batch: bool,
    ) -> None:
        self.last_written = issued
        if action == "complete":
            self.complete(issued, batch)
        elif action == "renew":
            self.renew(issued, lease, batch)
        elif action == "retry":
            delays = [data.draw(retry_delays, label="delay") for _ in issued]
            self.retry(issued, delays, batch)
        elif action == "fail":
            self.fail(issued, batch)
        else:
            self.release(issued)

    @rule(seconds=clock_steps)
    def advance_clock(self, seconds: int) -> None:
        self.now += seconds
        set_clock_offset(self.client, self.now)

    @rule(
        action=st.sampled_from(["reap", "replay", "cancel", "replay_failed"]),
        data=st.data(),
        kind=st.sampled_from(["applies", "applies", "refused", "any"]),
        limit=st.sampled_from([1, 2, 1000]),
    )
    def operate(self, action: str, data: st.DataObject, kind: str, limit: int) -> None:
        """An operator's reap, or replay/cancel of a job (of ``kind`` if there is one)."""
        if action == "reap":
            self.reap(limit)
        elif action == "replay_failed":
            self.replay_failed(data.draw(queue_names, label="queue"))
        elif not self.jobs:
            with pytest.raises(leaseq.JobNotFound):
                getattr(self.client, action)(1)
        elif action == "replay":
            self.replay(self.pick_job(data, (FAILED, CANCELLED), kind))
        else:
            self.cancel(self.pick_job(data, (QUEUED, FAILED), kind))

    # -- what each write must do ---------------------------------------------------

    def complete(self, issued: list[IssuedClaim], batch: bool) -> None:
        results = self.fenced(
            "complete", issued, self.client.complete, self.client.complete_many, batch
        )
        for item, result in zip(issued, results, strict=True):
            claim, job = item.claim, self.jobs[item.claim.job_id]
            if self.is_live(claim):
                assert result is not LOST, f"live claim lost: {self.describe(job.job_id)}"
                self.end_lease(job, DONE)
                item.outcome = "completed"
            elif job.status is DONE and job.lease_version == claim.lease_version:
                # This claim's completion committed already: accepted again, no change.
                assert item.outcome == "completed"
                assert result is not LOST, "a repeated completion must be accepted"
            else:
                assert result is LOST, f"stale complete accepted: {self.describe(job.job_id)}"

    def renew(self, issued: list[IssuedClaim], lease: float | None, batch: bool) -> None:
        before = self.db_clock()
        results = self.fenced(
            "renew",
            issued,
            lambda claim: self.client.renew(claim, lease=lease),
            lambda claims: self.client.renew_many(claims, lease=lease),
            batch,
        )
        after = self.db_clock()
        stamp = self.next_stamp()
        for item, result in zip(issued, results, strict=True):
            claim, job = item.claim, self.jobs[item.claim.job_id]
            if not self.is_live(claim):
                assert result is LOST, f"stale renew accepted: {self.describe(job.job_id)}"
                continue
            assert isinstance(result, datetime), f"live claim lost: {self.describe(job.job_id)}"
            assert job.lease_seconds is not None
            seconds = job.lease_seconds if lease is None else lease
            assert before <= result - timedelta(seconds=seconds) <= after
            job.lease_until = (self.now + seconds, stamp)
            job.lease_until_at = result
            job.lease_seconds = seconds

    def retry(self, issued: list[IssuedClaim], delays: list[float | None], batch: bool) -> None:
        results = self.fenced(
            "retry",
            issued,
            lambda claim: self.client.retry(claim, delay=delays[0], error="boom"),
            lambda claims: self.client.retry_many(
                claims, delays=delays, errors=["boom"] * len(claims)
            ),
            batch,
        )
        stamp = self.next_stamp()
        for item, result, delay in zip(issued, results, delays, strict=True):
            claim, job = item.claim, self.jobs[item.claim.job_id]
            if self.is_live(claim):
                item.outcome = "retried"
                if job.attempts >= job.max_attempts:
                    assert result is FAILED, "a retry on the last attempt must fail the job"
                    item.retried_to = FAILED
                    self.end_lease(job, FAILED)
                    continue
                assert result is QUEUED, f"got {result}: {self.describe(job.job_id)}"
                item.retried_to = QUEUED
                self.end_lease(job, QUEUED)
                row = self.client.get(claim.job_id)
                entry = row.history[-1]
                assert entry["outcome"] == "retry"
                # The backoff is configured to 0, so no delay means "available now".
                seconds = delay or 0
                at = datetime.fromisoformat(entry["at"])
                assert row.available_at - at == timedelta(seconds=seconds)
                job.available = (self.now + seconds, stamp)
                job.available_at = row.available_at
            elif item.outcome == "retried":
                # This claim's retry committed already (the job may have moved on since):
                # a resend is answered with what that retry did, and changes nothing.
                assert result is item.retried_to, "a repeated retry must be accepted"
            else:
                # Includes a claim that was released: its job is queued under the claim's
                # lease_version too, but no retry of it ever committed.
                assert result is LOST, f"stale retry accepted: {self.describe(job.job_id)}"

    def fail(self, issued: list[IssuedClaim], batch: bool) -> None:
        results = self.fenced(
            "fail",
            issued,
            lambda claim: self.client.fail(claim, "gave up"),
            lambda claims: self.client.fail_many(claims, ["gave up"] * len(claims)),
            batch,
        )
        for item, result in zip(issued, results, strict=True):
            claim, job = item.claim, self.jobs[item.claim.job_id]
            if self.is_live(claim):
                assert result is not LOST, f"live claim lost: {self.describe(job.job_id)}"
                self.end_lease(job, FAILED)
                item.outcome = "failed"
                assert self.client.get(claim.job_id).last_error == "gave up"
            elif item.outcome == "failed":
                # This claim's fail committed already: a resend is accepted, changes nothing.
                assert result is not LOST, "a repeated fail must be accepted"
            else:
                assert result is LOST, f"stale fail accepted: {self.describe(job.job_id)}"

    def release(self, issued: list[IssuedClaim]) -> None:
        results = self.fenced("release", issued, None, self.client.release_many, batch=True)
        stamp = self.next_stamp()
        for item, result in zip(issued, results, strict=True):
            claim, job = item.claim, self.jobs[item.claim.job_id]
            if not self.is_live(claim) and item.outcome == "released":
                # This claim's release committed already: a resend is accepted, changes nothing.
                assert result is True, "a repeated release must be accepted"
                continue
            if not self.is_live(claim):
                assert result is LOST, f"stale release accepted: {self.describe(job.job_id)}"
                continue
            assert result is True, f"live claim lost: {self.describe(job.job_id)}"
            item.outcome = "released"
            self.end_lease(job, QUEUED)
            job.attempts = max(job.attempts - 1, 0)  # an interrupted attempt does not count
            job.available = (self.now, stamp)
            row = self.client.get(job.job_id)
            assert row.history[-1]["outcome"] == "released"
            assert row.available_at == datetime.fromisoformat(row.history[-1]["at"])
            job.available_at = row.available_at

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
        result = self.client.reap(limit=limit)
        self.next_stamp()
        assert set(result.exhausted_queued) <= exhausted_queued, result
        assert set(result.expired_running) <= expired_running, result
        assert len(set(result.failed)) == len(result)
        assert len(result) == min(limit, len(exhausted_queued | expired_running))
        for job_id in result.failed:
            self.end_lease(self.jobs[job_id], FAILED)

    def replay(self, job: ModelJob) -> None:
        changed = self.client.replay(job.job_id)
        stamp = self.next_stamp()
        if job.status not in (FAILED, CANCELLED):
            assert changed is False, f"replayed a {job.status} job"
            return
        assert changed is True
        self.replayed(job, stamp)

    def replay_failed(self, queue: str) -> None:
        failed = [job for job in self.jobs.values() if job.queue == queue and job.status is FAILED]
        replayed = self.client.replay_failed(queue)
        stamp = self.next_stamp()
        assert replayed == sorted(job.job_id for job in failed)
        for job in failed:
            self.replayed(job, stamp)

    def replayed(self, job: ModelJob, stamp: int) -> None:
        job.status = QUEUED
        job.attempts = 0
        # The fencing token moves on, so no claim from before the replay owns the job.
        job.lease_version += 1
        job.available = (self.now, stamp)
        row = self.client.get(job.job_id)
        assert row.history[-1]["outcome"] == "replayed"
        assert row.available_at == datetime.fromisoformat(row.history[-1]["at"])
        job.available_at = row.available_at

    def cancel(self, job: ModelJob) -> None:
        changed = self.client.cancel(job.job_id)
        self.next_stamp()
        if job.status in (QUEUED, FAILED):
            assert changed is True
            job.status = CANCELLED
        else:
            assert changed is False, f"cancelled a {job.status} job"

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def every_job_matches_the_model(self) -> None:
        # Every row as stored, in one query (the rules read jobs through queue.get()).
        rows = self.conn.execute(
            "SELECT job_id, status, attempts, lease_version, queue, ordering_key, ordering_seq,"
            " priority, max_attempts, available_at, lease_until, finished_at"
            f' FROM "{self.schema}".job ORDER BY job_id'
        ).fetchall()
        assert [row[0] for row in rows] == sorted(self.jobs), "jobs appeared or vanished"
        for row in rows:
            (
                job_id,
                status,
                attempts,
                version,
                queue,
                key,
                seq,
                priority,
                max_attempts,
                available_at,
                lease_until,
                finished_at,
            ) = row
            model = self.jobs[job_id]
            what = self.describe(job_id)
            assert (JobStatus(status), attempts, version) == (
                model.status,
                model.attempts,
                model.lease_version,
            ), f"database has {status}, attempts={attempts}, lease_version={version}; {what}"
            assert (queue, key, seq, priority, max_attempts) == (
                model.queue,
                model.key,
                model.seq,
                model.priority,
                model.max_attempts,
            ), what
            assert available_at == model.available_at, what
            assert lease_until == model.lease_until_at, what
            assert (finished_at is not None) == model.status.finished, what

    @invariant()
    def never_two_running_jobs_of_one_key(self) -> None:
        """The requirement itself, read from the table, independent of the model."""
        rows = self.conn.execute(
            "SELECT queue, ordering_key, count(*)"
            f" FROM \"{self.schema}\".job WHERE status = 'running' AND ordering_key IS NOT NULL"
            " GROUP BY queue, ordering_key HAVING count(*) > 1"
        ).fetchall()
        assert rows == [], f"two running jobs of one key: {rows}"

    @invariant()
    def stats_match_the_model(self) -> None:
        stats = {s.queue: s for s in self.client.stats()}
        assert set(stats) == set(QUEUES)
        for name in QUEUES:
            jobs = [job for job in self.jobs.values() if job.queue == name]
            counts = {status: sum(job.status is status for job in jobs) for status in JobStatus}
            assert stats[name].counts == counts
            expired = sum(job.status is RUNNING and self.lease_expired(job) for job in jobs)
            assert stats[name].expired_leases == expired


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("policy", list(OrderingPolicy))
def test_queue_matches_model(
    client_class: type[Client], database_url: str, policy: OrderingPolicy
) -> None:
    """q1 uses ``policy`` and q2 the other one, so a policy is also checked to be per queue."""
    run_state_machine_as_test(
        lambda: QueueMachine(client_class, database_url, policy), settings=SETTINGS
    )


def test_stale_retry_after_fail_and_replay_is_lease_lost(client: Client) -> None:
    job_id = client.enqueue("jobs", {})
    (claim,) = client.claim("jobs")
    client.fail(claim, "gave up")
    assert client.replay(job_id)
    with pytest.raises(leaseq.LeaseLost):
        client.retry(claim, error="from a stale worker")
    assert client.get(job_id).lease_version == claim.lease_version + 1


def test_retry_with_a_released_claim_is_lease_lost(client: Client) -> None:
    job_id = client.enqueue("jobs", {})
    (claim,) = client.claim("jobs")
    assert client.release_many([claim]) == [(claim, True)]
    with pytest.raises(leaseq.LeaseLost):
        client.retry(claim, error="from a worker that let the job go")
    assert client.get(job_id).history[-1]["outcome"] == "released"
