"""Create (or reset) the demo superuser and print its credentials; ``--migrate`` migrates first,
in the same process (``make demo``: one Django start-up less before the first page)."""

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the demo superuser 'demo' and print its password."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--migrate", action="store_true", help="Apply the migrations first.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["migrate"]:
            call_command("migrate", interactive=False, verbosity=options["verbosity"])
        user, _ = get_user_model().objects.get_or_create(
            username="demo", defaults={"email": "demo@example.com"}
        )
        user.is_staff = user.is_superuser = True
        user.set_password("demo")
        user.save()
        self.stdout.write("Demo superuser: username 'demo', password 'demo' (log in at /admin/login/)")
