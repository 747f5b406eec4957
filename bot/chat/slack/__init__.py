"""The Slack adapter: an AsyncApp whose listeners are grouped by surface (commands, actions, events).

Every listener is thin: ack first (Slack waits 3 s), then run the synchronous chat handler in a
worker thread, then reply (respond() to the response_url, or the Web API).
"""

from bot.chat.slack.app import build_app, make_async_client, make_sync_client

__all__ = ["build_app", "make_async_client", "make_sync_client"]
