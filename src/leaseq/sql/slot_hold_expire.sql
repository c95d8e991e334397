-- Drop the slot holds that have ended (migration 0015): nothing reads them any
-- more. Run with the reaper, each maintenance round.
DELETE FROM {schema}.slot_hold AS h WHERE h.until <= {schema}.clock()
