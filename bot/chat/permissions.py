"""The chat layer asks the engine's permissions policy (bot/engine/permissions.py) before it calls."""

from bot.engine.permissions import Decision, Permissions

__all__ = ["Decision", "Permissions"]
