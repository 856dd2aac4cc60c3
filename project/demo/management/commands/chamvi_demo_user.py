"""Create (or reset) the demo superuser and print its credentials."""

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the demo superuser 'demo' and print its password."

    def handle(self, *args: Any, **options: Any) -> None:
        user, _ = get_user_model().objects.get_or_create(
            username="demo", defaults={"email": "demo@example.com"}
        )
        user.is_staff = user.is_superuser = True
        user.set_password("demo")
        user.save()
        self.stdout.write("Demo superuser: username 'demo', password 'demo' (log in at /admin/login/)")
