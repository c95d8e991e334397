"""Framework integrations, each on leaseq's public API and an optional extra:
``leaseq.contrib.sqlalchemy`` (``pip install leaseq[sqlalchemy]``) and
``leaseq.contrib.django`` (``pip install leaseq[django]``)."""
