-- The schema's clock (clock(): the server's time plus a test's offset).
SELECT {schema}.clock()
