"""The job engine: from an accepted estimate to a finished adapter, with every dollar accounted for.

``service.Engine`` is a thin facade implementing ``api.EngineAPI`` (the chat layer's only entry point)
and the loop entry points (``tick``, ``reconcile``, ``resume_all``, ``daily_summary``,
``volume_reminders``); it builds one ``context.EngineContext`` and passes it to the modules below,
none of which imports the facade. One idea per module: ``jobstate`` (the states), ``states``
(transitions + audit), ``permissions`` (who may do what), ``jobs`` (create, approve, launch, stop),
``supervise`` (decide + apply, the tick), ``launch``, ``runner_events`` (pushed and pulled events into
the store), ``progress`` (pull), ``observe`` (provider observation), ``recovery``, ``finish``, ``spend``
(ledger), ``budgets``, ``reconcile``, ``reports`` (what people read back), ``volumes``, ``summary``,
``crash`` (named SIGKILL points for the crash test), ``events`` (the neutral stream out), ``views``
(rows to view models).
"""
