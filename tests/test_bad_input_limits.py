"""Values inside their types' ranges that the database or a reader cannot keep:
a lease shorter than the database's microsecond, an integer longer than
Python decodes by default. Each is refused before anything is written."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from leaseq import InvalidArgument, InvalidJob, InvalidResult, JobStatus

from .clients import Client

# -- a lease the database keeps as none at all ------------------------------------------


@pytest.mark.parametrize("lease", [1e-9, 1e-7, 4e-7], ids=repr)
def test_a_lease_the_database_rounds_to_nothing_is_refused(client: Client, lease: float) -> None:
    """The database keeps times to the microsecond: a lease under half of one was
    taken (it is > 0) and stored as no lease at all. The claim's lease had ended
    before claim() returned, so the next claim took the same job again at once
    (two holders of one job), and a renewal "renewed" it to an end already past
    (every later write of the claim: LeaseLost)."""
    client.enqueue("reports", {})
    with pytest.raises(InvalidArgument, match="lease"):
        client.claim("reports", lease=lease)
    assert client.stats("reports")[0].counts[JobStatus.QUEUED] == 1
    (claim,) = client.claim("reports")
    with pytest.raises(InvalidArgument, match="lease"):
        client.renew(claim, lease=lease)
    with pytest.raises(InvalidArgument, match="lease"):
        client.renew_many([claim], lease=lease)
    with pytest.raises(InvalidArgument, match="lease"):
        client.configure_queue("reports", lease=lease)
    assert client.claim("reports") == []  # nobody took it over
    client.complete(claim)  # the claim still owns its job
    assert client.queue_settings("reports").lease == 60  # type: ignore[union-attr]


# -- integers that readers cannot decode --------------------------------------------------


class _RaisedIntDigits:
    """A producer process that raised Python's int digits limit (0: none), as an
    application doing big-number arithmetic does; readers keep the default."""

    def __enter__(self) -> None:
        self.old = sys.get_int_max_str_digits()
        sys.set_int_max_str_digits(0)

    def __exit__(self, *exc: object) -> None:
        sys.set_int_max_str_digits(self.old)


def test_an_integer_longer_than_readers_decode_is_refused_before_it_is_sent(
    client: Client,
) -> None:
    """A producer whose process decodes any int (sys.set_int_max_str_digits(0))
    could enqueue {"n": 10**5000}: jsonb takes it, and every reader with Python's
    default limit of 4300 digits failed with a raw ValueError: get(), and a
    claim, after its claim had committed, so the good jobs claimed beside the
    poisoned one were stranded as running until their leases ran out, and came
    back to do it again. It must be refused at enqueue (and as a result)."""
    huge: Any = 10**5000
    with _RaisedIntDigits():
        with pytest.raises(InvalidJob, match="digits"):
            client.enqueue("reports", {"n": huge})
        with pytest.raises(InvalidJob, match="digits"):
            client.enqueue_many("reports", [{"n": 1}, {"deep": [[-huge]]}])
        longest = client.enqueue("reports", {"n": 10**4299})  # 4300 digits: decodable
    (claim,) = client.claim("reports", limit=10)
    assert claim.job_id == longest
    assert claim.payload == {"n": 10**4299}
    with _RaisedIntDigits(), pytest.raises(InvalidResult, match="digits"):
        client.complete(claim, result={"n": huge})
    client.complete(claim, result={"n": 10**4299})
    assert client.result(claim.job_id) == {"n": 10**4299}
