-- Before the leader takes its lock: the server's end of this session probes a
-- silent client after 10 s idle, 5 s apart, 3 times, and gives up on data it
-- sent unacknowledged for 30 s (the worker's own keepalives, on the server's
-- side). The lock lives as long as this session does on the server, and the
-- server's defaults (the OS's: a first probe after 2 hours) kept the lock of a
-- leader whose host vanished (power lost, a network cut: no FIN, no RST) for
-- over 2 hours, with no other leader meanwhile. Ignored over a Unix socket.
SELECT set_config('tcp_keepalives_idle', '10', false),
       set_config('tcp_keepalives_interval', '5', false),
       set_config('tcp_keepalives_count', '3', false),
       set_config('tcp_user_timeout', '30000', false)
