"""What enqueue and enqueue_many return: ids that also say whether a unique
enqueue found its job already there."""

from __future__ import annotations

from collections.abc import Iterable


class JobId(int):
    """The id ``enqueue`` returns: an ``int``, which also says whether a unique
    enqueue found the job already there (``existing``: nothing was inserted)."""

    existing: bool

    def __new__(cls, job_id: int, *, existing: bool = False) -> JobId:
        self = super().__new__(cls, job_id)
        self.existing = existing
        return self


class JobIds(list[int]):
    """The ids ``enqueue_many`` returns, in input order: a ``list``, which also
    says, per position, whether a unique enqueue found its job already there
    (``existing[i]``: nothing was inserted for payload i; its id is the holder's,
    which may be an earlier payload's of the same batch)."""

    existing: tuple[bool, ...]

    def __init__(self, job_ids: Iterable[int] = (), *, existing: Iterable[bool] | None = None):
        super().__init__(job_ids)
        self.existing = (False,) * len(self) if existing is None else tuple(existing)

    @property
    def inserted(self) -> list[int]:
        """The ids of the jobs this call inserted."""
        return [job_id for job_id, found in zip(self, self.existing, strict=True) if not found]
