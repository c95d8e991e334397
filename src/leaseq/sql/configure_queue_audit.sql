-- The audit row of a settings change (in the configure operation's transaction);
-- none for a call that names no setting, which changes nothing (it only shows them).
INSERT INTO {schema}.audit (at, actor, action, queue, detail)
SELECT {schema}.clock(), coalesce(%(actor)s::text, session_user::text), %(action)s::text,
       %(name)s::text, %(detail)s::jsonb
WHERE %(detail)s::jsonb <> '{}'::jsonb
