-- Start the demo from scratch: its tables and leaseq's schema go.
DROP SCHEMA IF EXISTS {schema} CASCADE
