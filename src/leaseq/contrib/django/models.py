"""No models: leaseq's tables are its own, created by its migrations (``manage.py
leaseq_migrate``, or ``manage.py migrate`` through the post_migrate hook of
:mod:`leaseq.contrib.django.apps`). The module exists so that Django sends this
app the post_migrate signal (it skips apps without a models module)."""
