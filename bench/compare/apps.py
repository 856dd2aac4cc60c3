from django.apps import AppConfig


class CompareConfig(AppConfig):
    """The comparison as a Django app: its agents.py holds the agents chamvi_runs executes."""

    name = "bench.compare"
    label = "bench_compare"
