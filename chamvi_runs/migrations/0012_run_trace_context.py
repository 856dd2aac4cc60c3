# Where a run came from, for its executions' traces (SPEC §15). Nullable: processes of the
# previous release keep inserting runs without it during the deploy.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chamvi_runs', '0011_worker_versions'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='trace_context',
            field=models.JSONField(blank=True, help_text='Where the run came from, for every execution to carry on (the W3C trace context of the caller that started it, with OpenTelemetry: chamvi_runs.tracing).', null=True),
        ),
    ]
