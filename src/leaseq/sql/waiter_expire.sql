-- Drop the wake-up entries past their expiry: those of workers that ended without
-- leaving (killed, or cut off from the database longer than an entry lives), and
-- the day of notifications migration 0020 gave workers of older versions. Run
-- with the reaper, each maintenance round. Until then a stale entry costs only
-- notifications no one reads.
UPDATE {schema}.queue AS q
SET waiting = (SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}'::jsonb)
               FROM jsonb_each(q.waiting) AS e
               WHERE (e.value)::double precision >= extract(epoch FROM {schema}.clock()))
WHERE q.waiting <> '{}'::jsonb
  AND EXISTS (SELECT 1 FROM jsonb_each(q.waiting) AS e
              WHERE (e.value)::double precision < extract(epoch FROM {schema}.clock()))
