from django.apps import AppConfig


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"

    def ready(self) -> None:
        # A worker process a tracing test starts exports its spans to a file the test reads.
        from tests.support.tracing import to_file_if_asked

        to_file_if_asked()
