-- Which of these schedules have a tick due (no lock: a look before taking each).
SELECT s.name FROM {schema}.schedule AS s
WHERE s.name = ANY(%(names)s::text[]) AND s.next_tick <= {schema}.clock()
ORDER BY s.next_tick
