import leaseq


def test_enqueue_claim_complete_round_trip(queue: leaseq.Queue) -> None:
    job_id = queue.enqueue("reports", {"report_id": "r-1"})
    (claim,) = queue.claim("reports")
    assert claim.job_id == job_id
    assert claim.payload == {"report_id": "r-1"}
    assert (claim.lease_version, claim.attempts) == (1, 1)
    queue.complete(claim)
    job = queue.get(job_id)
    assert job.status is leaseq.JobStatus.DONE
    assert job.finished_at is not None
    assert job.lease_until is None
