# The agent versions of the processes that execute runs (SPEC §14). A new table only: processes of
# the previous release neither read nor write it during the deploy.

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chamvi_runs', '0010_agent_version'),
    ]

    operations = [
        migrations.CreateModel(
            name='WorkerVersion',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('worker', models.CharField(help_text='The process: host:pid:nonce.', max_length=200)),
                ('agent', models.CharField(max_length=200)),
                ('version', models.CharField(max_length=64)),
                ('started_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('seen_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), help_text='When the process last said it is alive (every HEARTBEAT_SECONDS).')),
                ('live_until', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), help_text='It is live until then (LEASE_SECONDS after it last said so), unless it stopped.')),
                ('stopped_at', models.DateTimeField(blank=True, help_text='When the process stopped cleanly; empty while it runs or if it died.', null=True)),
            ],
            options={
                'verbose_name': 'worker version',
                'indexes': [models.Index(fields=['agent', 'version'], name='chamvi_workerversion_agent')],
                'constraints': [models.UniqueConstraint(fields=('worker', 'agent'), name='chamvi_worker_agent_unique')],
            },
        ),
    ]
