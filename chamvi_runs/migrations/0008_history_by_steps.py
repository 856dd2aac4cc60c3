# Histories are stored by parts from here on (store.histories): each step stores the messages it
# added, and a long history is written whole (Checkpoint.messages) only by an execution's first save
# and when the run leaves its worker. Checkpoint.messages keeps its meaning whenever no execution is
# under way, which is what processes of the previous release read; every new column is nullable.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chamvi_runs', '0007_conversation_control'),
    ]

    operations = [
        migrations.AlterField(
            model_name='checkpoint',
            name='messages',
            field=models.JSONField(help_text='The whole history after step whole_step (after step_index, when whole_step is null).'),
        ),
        migrations.AddField(
            model_name='checkpoint',
            name='whole_step',
            field=models.IntegerField(blank=True, help_text='The step after which ``messages`` is the whole history.', null=True),
        ),
        migrations.AddField(
            model_name='checkpoint',
            name='whole_length',
            field=models.PositiveIntegerField(blank=True, help_text='Messages in ``messages`` when it was written at whole_step.', null=True),
        ),
        migrations.AddField(
            model_name='checkpoint',
            name='length',
            field=models.PositiveIntegerField(blank=True, help_text='Messages in the whole history.', null=True),
        ),
        migrations.AddField(
            model_name='checkpoint',
            name='opening_length',
            field=models.PositiveIntegerField(blank=True, help_text="Messages before the run's first step (null: not known).", null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='base',
            field=models.ForeignKey(blank=True, db_constraint=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='chamvi_runs.run'),
        ),
        migrations.AddField(
            model_name='run',
            name='base_step',
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='replaces',
            field=models.ForeignKey(blank=True, db_constraint=False, help_text='The run this one regenerates or resends: the thread continues from this one.', null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='replaced_by', to='chamvi_runs.run'),
        ),
        migrations.AddField(
            model_name='step',
            name='messages',
            field=models.JSONField(blank=True, help_text="The messages this step added to the run's history, or their count when the whole history was written with it (the checkpoint holds them); null: written by a release that stored histories whole.", null=True),
        ),
    ]

