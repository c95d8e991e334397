-- Operator actions, newest first, one page (keyset on audit_id).
SELECT a.audit_id, a.at, a.actor, a.db_role, a.action, a.queue, a.job_ids, a.detail
FROM {schema}.audit AS a
WHERE (%(queue)s::text IS NULL OR a.queue = %(queue)s::text)
  AND (%(before)s::bigint IS NULL OR a.audit_id < %(before)s::bigint)
ORDER BY a.audit_id DESC
LIMIT %(limit)s
