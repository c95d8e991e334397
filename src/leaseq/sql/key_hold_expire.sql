-- Drop the key holds that have ended (migration 0013): nothing reads them any
-- more. Run with the reaper, each maintenance round.
DELETE FROM {schema}.key_hold AS h WHERE h.until <= {schema}.clock()
