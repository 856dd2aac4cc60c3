from django.urls import path

from .agui import views as agui_views
from .web import views_api, views_pages, views_stream

app_name = "chamvi_runs"

urlpatterns = [
    path("api/runs/", views_api.runs, name="api-runs"),
    path("api/runs/<str:run_id>/", views_api.run_detail, name="api-run"),
    path("api/runs/<str:run_id>/stream/", views_stream.run_stream, name="api-run-stream"),
    path("api/runs/<str:run_id>/cancel/", views_api.run_cancel, name="api-run-cancel"),
    path("api/runs/<str:run_id>/input/", views_api.run_input, name="api-run-input"),
    path("api/runs/<str:run_id>/regenerate/", views_api.run_regenerate, name="api-run-regenerate"),
    path("api/runs/<str:run_id>/resend/", views_api.run_resend, name="api-run-resend"),
    # A thread is any name, slashes included.
    path("api/threads/<path:thread>/", views_api.thread_detail, name="api-thread"),
    path("api/approvals/<str:approval_id>/approve/", views_api.approval_approve, name="api-approve"),
    path("api/approvals/<str:approval_id>/deny/", views_api.approval_deny, name="api-deny"),
    path("api/approvals/<str:approval_id>/answer/", views_api.approval_answer, name="api-answer"),
    # AG-UI front ends (the agui extra): start, follow and decide runs of <agent>.
    path("agui/<str:agent>/", agui_views.run_agent, name="agui-run"),
    path("approvals/", views_pages.approvals, name="approvals"),
    path("runs/<str:run_id>/", views_pages.run_page, name="run"),
    # A thread is any name, slashes included, as on its websocket (routing.py).
    path("threads/<path:thread>/", views_pages.thread_page, name="thread"),
]
