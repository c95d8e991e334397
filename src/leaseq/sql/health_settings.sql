-- The server settings table health depends on: whether autovacuum runs at all
-- (it needs track_counts), and the timeout that would end a forgotten
-- idle-in-transaction session.
SELECT current_setting('autovacuum')::boolean,
       current_setting('track_counts')::boolean,
       current_setting('idle_in_transaction_session_timeout'),
       current_setting('server_version_num')::integer
