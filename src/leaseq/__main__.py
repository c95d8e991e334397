"""``python -m leaseq``: the ``leaseq`` command."""

from ._cli import main

main()
