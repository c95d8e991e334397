-- Start counting a queue's unfinished jobs that are not counted yet (all of
-- them when a limit is first set; stragglers from racing enqueues after that).
WITH marked AS (
    UPDATE {schema}.job AS j
    SET counted = true
    FROM {schema}.queue AS q
    WHERE q.name = %(name)s
      AND q.counts_backlog
      AND j.queue = q.name
      AND j.status IN ('queued', 'running')
      AND NOT j.counted
    RETURNING j.payload_bytes
)
INSERT INTO {schema}.backlog AS b (queue, shard, jobs, bytes)
SELECT %(name)s, 0, count(*), coalesce(sum(marked.payload_bytes), 0)
FROM marked
HAVING count(*) > 0
ON CONFLICT (queue, shard)
DO UPDATE SET jobs = b.jobs + excluded.jobs, bytes = b.bytes + excluded.bytes
