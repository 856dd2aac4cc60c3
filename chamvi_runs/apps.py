import importlib.util

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


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
