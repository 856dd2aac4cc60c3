import importlib.util

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (a package of it missing: no)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


class ChamviRunsConfig(AppConfig):
    name = "chamvi_runs"
    verbose_name = "Agent runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, checks_deploy  # noqa: F401  (register the system checks)

        # Like admin.py: every installed app's agents.py defines and registers its agents.
        autodiscover_modules("agents")
        if importlib.util.find_spec("prometheus_client") is not None:
            # The ``metrics`` extra is installed: count what the engine signals.
            from . import metrics

            metrics.connect()
        if _installed("opentelemetry.trace"):
            # The ``otel`` extra (or any OpenTelemetry API the site has): trace what the engine
            # signals, to the site's tracer provider (none configured: the API's no-op).
            from . import tracing

            tracing.connect()
