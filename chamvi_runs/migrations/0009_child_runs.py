# Child runs (SPEC §13): a run started by a tool call of another run, and the parent's wait for it.
# Every new column is nullable or has a database default, and the constraints only accept more:
# processes of the previous release keep inserting runs and wait points as they did.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chamvi_runs', '0008_history_by_steps'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='waitpoint',
            name='chamvi_waitpoint_decision_valid',
        ),
        migrations.RemoveConstraint(
            model_name='waitpoint',
            name='chamvi_waitpoint_kind_valid',
        ),
        migrations.AddField(
            model_name='run',
            name='depth',
            field=models.PositiveSmallIntegerField(db_default=0, default=0, help_text='Delegations above this run: 0 for a run nobody delegated.'),
        ),
        migrations.AddField(
            model_name='run',
            name='parent',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='children', to='chamvi_runs.run'),
        ),
        migrations.AddField(
            model_name='run',
            name='parent_position',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='parent_step',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='waitpoint',
            name='child',
            field=models.ForeignKey(blank=True, help_text='The child run a wait of kind child waits for.', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='chamvi_runs.run'),
        ),
        migrations.AlterField(
            model_name='waitpoint',
            name='decision',
            field=models.CharField(blank=True, choices=[('approved', 'Approved'), ('denied', 'Denied'), ('expired', 'Expired'), ('cancelled', 'Cancelled'), ('answered', 'Answered'), ('failed', 'Failed')], max_length=10, null=True),
        ),
        migrations.AlterField(
            model_name='waitpoint',
            name='kind',
            field=models.CharField(choices=[('approval', 'Approval'), ('input', 'Input'), ('child', 'Child')], default='approval', max_length=20),
        ),
        migrations.AddConstraint(
            model_name='run',
            constraint=models.UniqueConstraint(condition=models.Q(('parent__isnull', False)), fields=('parent', 'parent_step', 'parent_position'), name='chamvi_run_one_child_per_call'),
        ),
        migrations.AddConstraint(
            model_name='waitpoint',
            constraint=models.CheckConstraint(condition=models.Q(('decision__isnull', True), ('decision__in', ['approved', 'denied', 'expired', 'cancelled', 'answered', 'failed']), _connector='OR'), name='chamvi_waitpoint_decision_valid'),
        ),
        migrations.AddConstraint(
            model_name='waitpoint',
            constraint=models.CheckConstraint(condition=models.Q(('kind__in', ['approval', 'input', 'child'])), name='chamvi_waitpoint_kind_valid'),
        ),
    ]
