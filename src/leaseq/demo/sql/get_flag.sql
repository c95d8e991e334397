SELECT coalesce((SELECT enabled FROM {schema}.demo_flag WHERE name = %(name)s), false)
