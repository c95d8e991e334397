-- The audit row of a settings change (in the configure operation's transaction).
INSERT INTO {schema}.audit (at, actor, action, queue, detail)
VALUES ({schema}.clock(), coalesce(%(actor)s::text, session_user::text), %(action)s::text,
        %(name)s::text, %(detail)s::jsonb)
