"""Money as people read it: budgets and their alerts, volumes, summaries, reports, the dashboard.

May import record/ and the ground (bot/engine/*.py but service.py).
"""
