"""The test project's one app: an Order model, tasks, a leaseq handler."""
