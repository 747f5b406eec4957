"""The job engine: from an accepted estimate to a finished adapter, with every dollar accounted for.

``service.Engine`` implements ``api.EngineAPI`` (the chat layer's only entry point) and the loop
entry points (``tick``, ``reconcile``, ``resume_all``, ``daily_summary``, ``volume_reminders``).
One idea per module: ``states`` (transitions + audit), ``launch``, ``monitor`` (push/pull events,
provider status), ``recovery``, ``finish``, ``spend`` (ledger), ``budgets``, ``reconcile``,
``volumes``, ``summary``, ``crash`` (named SIGKILL points for the crash test), ``events`` (the
neutral stream out), ``views`` (rows to view models).
"""
