from django.apps import AppConfig


class BenchAgentsConfig(AppConfig):
    name = "bench.bench_agents"
    label = "bench_agents"
