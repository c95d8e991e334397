"""The side-by-side harness's driver: plans, runs, checks and reports (bench/run.py)."""
