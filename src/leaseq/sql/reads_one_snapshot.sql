-- Whether this transaction reads from one snapshot (see _steps.enqueue).
SELECT current_setting('transaction_isolation') IN ('repeatable read', 'serializable')
