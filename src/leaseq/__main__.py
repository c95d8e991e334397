"""``python -m leaseq``: the ``leaseq`` command."""

from ._cli import main

if __name__ == "__main__":  # not when a spawned child process imports it
    main()
