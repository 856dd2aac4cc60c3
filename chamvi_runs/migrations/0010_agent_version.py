# The version of its agent each run started with (SPEC §14). A database default: processes of the
# previous release keep inserting runs without it during the deploy.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chamvi_runs', '0009_child_runs'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='agent_version',
            field=models.CharField(blank=True, db_default='', default='', help_text='The version of its agent the run started with (SPEC §14).', max_length=64),
        ),
    ]
