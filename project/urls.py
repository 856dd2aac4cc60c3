import importlib.util

from django.contrib import admin
from django.contrib.auth.decorators import login_required
from django.urls import include, path
from django.views.generic import TemplateView

urlpatterns = [
    path("", TemplateView.as_view(template_name="home.html"), name="home"),
    path("admin/", admin.site.urls),
    path("chamvi/", include("chamvi_runs.urls")),
    # The chat page of docs/chat-client.md, as a site would write it.
    path(
        "example/chat/",
        login_required(TemplateView.as_view(template_name="example/chat.html")),
        name="example-chat",
    ),
]
if importlib.util.find_spec("prometheus_client") is not None:
    # Prometheus metrics (the ``metrics`` extra), for staff sessions and CHAMVI_METRICS_TOKEN.
    from chamvi_runs.metrics import metrics_view

    urlpatterns.append(path("metrics", metrics_view, name="metrics"))
