"""Run on the web host once its database is migrated: an operator with an API token and a browser
session. Prints them as JSON for the test."""

import json

import django

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.test import Client  # noqa: E402

from chamvi_runs.web.auth import create_token  # noqa: E402

user = get_user_model().objects.create_superuser("ops", "ops@example.com", "ops")
browser = Client()
browser.force_login(user)
print(
    json.dumps(
        {
            "token": create_token(user, "multihost")[1],
            "cookie": f"sessionid={browser.cookies['sessionid'].value}",
        }
    )
)
