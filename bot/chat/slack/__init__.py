"""The Slack adapter: an AsyncApp whose listeners are grouped by surface (commands, actions, events).

Every listener is thin: ack first (Slack waits 3 s), then run the synchronous chat handler in a
worker thread, then reply (respond() to the response_url, or the Web API).

The app and its clients are in app.py; this package re-exports nothing, so app.py, which imports the
listener packages, is no import circle with it.
"""
