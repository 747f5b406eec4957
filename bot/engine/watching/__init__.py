"""Watching running jobs: the tick, events, progress, recovery, growth, renewal, reconciling.

May import control/, outcome/, launching/, money/, record/ and the ground (bot/engine/*.py but service.py).
"""
