"""The job engine: from an accepted estimate to a finished adapter, with every dollar accounted for.

``service.Engine`` is a thin facade implementing ``api.EngineAPI`` (the chat layer's only entry point)
and the loop entry points (``tick``, ``reconcile``, ``resume_all``, ``daily_summary``,
``volume_reminders``); it builds one ``context.EngineContext`` and passes it to the rooms below, none of
which imports the facade. The rooms follow a job's path, each a folder whose ``__init__`` says in a line
what it owns and what it may import; a room imports the rooms below it and the ground, never one above
(tests/test_layers.py), top first:

- ``watching/``: Watching running jobs: the tick, events, progress, recovery, growth, renewal, reconciling.
- ``control/``: A job's life as people drive it: create, approve, launch, stop, resume, sweeps, compare.
- ``outcome/``: A run's end and what it leaves: finish, the Hub push, the billed card, calibration, charts.
- ``launching/``: From an accepted estimate to a rented host: offers, spec, staging, preflight, gates, the
  launch.
- ``money/``: Money as people read it: budgets and their alerts, volumes, summaries, reports, the dashboard.
- ``record/``: A job's record: its states and their one transition, its runs, the spend ledger, what it left.

The ground, here at top level: ``api``, ``context``, ``events``, ``permissions``, ``ids``, ``views``,
``crash``.
docs/ARCHITECTURE.md draws the tree with a line for every module.
"""
